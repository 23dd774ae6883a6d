//! Builders for the SCSI commands sliver's tools send, and parsers for their answers.
//!
//! Each builder returns an [`OutgoingCommand`] ready for [`crate::Session::submit`], so a load
//! generator can queue many of them; the blocking helpers on [`crate::Session`] wrap the same
//! builders.

use crate::Error;

/// One SCSI command as handed to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingCommand {
    /// The CDB, at most 16 bytes.
    pub cdb: Vec<u8>,
    /// Data-Out (writes); empty for none.
    pub data_out: Vec<u8>,
    /// Expected Data-In length (reads); 0 for none.
    pub data_in_len: u32,
    /// LUN; `None` = the LUN of the session's URL.
    pub lun: Option<u64>,
}

impl OutgoingCommand {
    /// A command without data transfer.
    pub fn new(cdb: Vec<u8>) -> Self {
        Self {
            cdb,
            data_out: Vec::new(),
            data_in_len: 0,
            lun: None,
        }
    }
    pub fn with_data_out(mut self, data: Vec<u8>) -> Self {
        self.data_out = data;
        self
    }
    pub fn with_data_in(mut self, len: u32) -> Self {
        self.data_in_len = len;
        self
    }
    pub fn on_lun(mut self, lun: u64) -> Self {
        self.lun = Some(lun);
        self
    }
}

/// The operation codes and service actions, as the target defines them.
pub use sliver_scsi::cdb::opcode;

fn lba_len_cdb(op: u8, byte1: u8, lba: u64, len: u32) -> Vec<u8> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = op;
    cdb[1] = byte1;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&len.to_be_bytes());
    cdb
}

fn byte_len(blocks: u32, block_size: u32) -> Result<u32, Error> {
    blocks.checked_mul(block_size).ok_or_else(|| {
        Error::Invalid(format!(
            "{blocks} blocks of {block_size} bytes exceed 4 GiB"
        ))
    })
}

pub fn test_unit_ready() -> OutgoingCommand {
    OutgoingCommand::new(vec![opcode::TEST_UNIT_READY, 0, 0, 0, 0, 0])
}

/// INQUIRY; `page` = Some(code) for a VPD page.
pub fn inquiry(page: Option<u8>, alloc: u16) -> OutgoingCommand {
    let mut cdb = vec![opcode::INQUIRY, 0, 0, 0, 0, 0];
    if let Some(p) = page {
        cdb[1] = 1;
        cdb[2] = p;
    }
    cdb[3..5].copy_from_slice(&alloc.to_be_bytes());
    OutgoingCommand::new(cdb).with_data_in(u32::from(alloc))
}

/// READ(16) of `blocks` blocks at `lba`.
pub fn read16(lba: u64, blocks: u32, block_size: u32) -> Result<OutgoingCommand, Error> {
    let len = byte_len(blocks, block_size)?;
    Ok(OutgoingCommand::new(lba_len_cdb(opcode::READ_16, 0, lba, blocks)).with_data_in(len))
}

/// WRITE(16) of `data` (whole blocks) at `lba`; `fua` forces unit access.
pub fn write16(
    lba: u64,
    data: Vec<u8>,
    block_size: u32,
    fua: bool,
) -> Result<OutgoingCommand, Error> {
    if block_size == 0 || !data.len().is_multiple_of(block_size as usize) {
        return Err(Error::Invalid(format!(
            "write of {} bytes is not a whole number of {block_size}-byte blocks",
            data.len()
        )));
    }
    let blocks = u32::try_from(data.len() / block_size as usize)
        .map_err(|_| Error::Invalid("write too large for one command".into()))?;
    let byte1 = if fua { 0x08 } else { 0 };
    Ok(OutgoingCommand::new(lba_len_cdb(opcode::WRITE_16, byte1, lba, blocks)).with_data_out(data))
}

/// UNMAP of the given (lba, blocks) ranges, one block descriptor each.
pub fn unmap(ranges: &[(u64, u32)]) -> Result<OutgoingCommand, Error> {
    if ranges.is_empty() {
        return Err(Error::Invalid("UNMAP needs at least one range".into()));
    }
    let descriptors = ranges.len() * 16;
    let total = 8 + descriptors;
    let total16 = u16::try_from(total)
        .map_err(|_| Error::Invalid(format!("{} UNMAP descriptors are too many", ranges.len())))?;
    let mut param = vec![0u8; total];
    param[0..2].copy_from_slice(&(total16 - 2).to_be_bytes());
    param[2..4].copy_from_slice(&(descriptors as u16).to_be_bytes());
    for (i, (lba, blocks)) in ranges.iter().enumerate() {
        let d = &mut param[8 + i * 16..8 + (i + 1) * 16];
        d[0..8].copy_from_slice(&lba.to_be_bytes());
        d[8..12].copy_from_slice(&blocks.to_be_bytes());
    }
    let mut cdb = vec![0u8; 10];
    cdb[0] = opcode::UNMAP;
    cdb[7..9].copy_from_slice(&total16.to_be_bytes());
    Ok(OutgoingCommand::new(cdb).with_data_out(param))
}

/// WRITE SAME(16) of one block of `pattern` over `blocks` blocks; `unmap` sets the UNMAP bit.
pub fn write_same16(lba: u64, blocks: u32, pattern: Vec<u8>, unmap: bool) -> OutgoingCommand {
    let byte1 = if unmap { 0x08 } else { 0 };
    OutgoingCommand::new(lba_len_cdb(opcode::WRITE_SAME_16, byte1, lba, blocks))
        .with_data_out(pattern)
}

/// SYNCHRONIZE CACHE(16); `blocks` = 0 means up to the end of the medium.
pub fn synchronize_cache16(lba: u64, blocks: u32) -> OutgoingCommand {
    OutgoingCommand::new(lba_len_cdb(opcode::SYNCHRONIZE_CACHE_16, 0, lba, blocks))
}

pub fn read_capacity16() -> OutgoingCommand {
    let mut cdb = lba_len_cdb(opcode::SERVICE_ACTION_IN_16, 0, 0, 32);
    cdb[1] = opcode::SA_READ_CAPACITY_16;
    OutgoingCommand::new(cdb).with_data_in(32)
}

/// GET LBA STATUS starting at `lba`, with room for `alloc` bytes of answer.
pub fn get_lba_status(lba: u64, alloc: u32) -> OutgoingCommand {
    let mut cdb = lba_len_cdb(opcode::SERVICE_ACTION_IN_16, 0, lba, alloc);
    cdb[1] = opcode::SA_GET_LBA_STATUS;
    OutgoingCommand::new(cdb).with_data_in(alloc)
}

/// Range descriptors (LBA, NUMBER OF LOGICAL BLOCKS) of the token commands.
fn token_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut d = Vec::with_capacity(ranges.len() * 16);
    for &(lba, blocks) in ranges {
        d.extend_from_slice(&lba.to_be_bytes());
        d.extend_from_slice(&blocks.to_be_bytes());
        d.extend_from_slice(&[0; 4]);
    }
    d
}

/// The parameter list of POPULATE TOKEN and WRITE USING TOKEN: a `header_len`-byte header whose
/// first two bytes (DATA LENGTH, the bytes after it) and last two (RANGE DESCRIPTOR LIST LENGTH)
/// are filled in here, then the range descriptors. The caller sets its command's own header
/// fields in between.
fn token_parameter_list(header_len: usize, ranges: &[(u64, u32)]) -> Result<Vec<u8>, Error> {
    let r = token_ranges(ranges);
    let mut p = vec![0u8; header_len];
    let len = u16::try_from(header_len - 2 + r.len())
        .map_err(|_| Error::Invalid(format!("{} ranges are too many", ranges.len())))?;
    p[0..2].copy_from_slice(&len.to_be_bytes());
    // Cannot truncate: DATA LENGTH, which is larger, fitted in a u16.
    p[header_len - 2..header_len].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    Ok(p)
}

/// A THIRD-PARTY COPY OUT CDB (EXTENDED COPY family) with a parameter list.
fn third_party_copy_out(
    action: u8,
    list_id: u32,
    param: Vec<u8>,
) -> Result<OutgoingCommand, Error> {
    let len =
        u32::try_from(param.len()).map_err(|_| Error::Invalid("parameter list too long".into()))?;
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x83;
    cdb[1] = action;
    cdb[6..10].copy_from_slice(&list_id.to_be_bytes());
    cdb[10..14].copy_from_slice(&len.to_be_bytes());
    Ok(OutgoingCommand::new(cdb).with_data_out(param))
}

/// POPULATE TOKEN for `ranges` ((lba, blocks)) with an inactivity timeout in seconds (0: the
/// copy manager's default) and the copy manager's choice of ROD type.
pub fn populate_token(
    list_id: u32,
    ranges: &[(u64, u32)],
    inactivity_secs: u32,
) -> Result<OutgoingCommand, Error> {
    let mut p = token_parameter_list(16, ranges)?;
    p[4..8].copy_from_slice(&inactivity_secs.to_be_bytes());
    third_party_copy_out(0x10, list_id, p)
}

/// WRITE USING TOKEN: write `ranges` from the data `token` represents, starting `offset`
/// blocks into it.
pub fn write_using_token(
    list_id: u32,
    token: &[u8],
    offset: u64,
    ranges: &[(u64, u32)],
) -> Result<OutgoingCommand, Error> {
    if token.len() != 512 {
        return Err(Error::Invalid(format!(
            "a ROD token is 512 bytes, not {}",
            token.len()
        )));
    }
    let mut p = token_parameter_list(536, ranges)?;
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..528].copy_from_slice(token);
    third_party_copy_out(0x11, list_id, p)
}

/// RECEIVE ROD TOKEN INFORMATION for `list_id`.
pub fn receive_rod_token_information(list_id: u32) -> OutgoingCommand {
    const ALLOC: u32 = 1024;
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x84;
    cdb[1] = 0x07;
    cdb[2..6].copy_from_slice(&list_id.to_be_bytes());
    cdb[10..14].copy_from_slice(&ALLOC.to_be_bytes());
    OutgoingCommand::new(cdb).with_data_in(ALLOC)
}

/// RECEIVE ROD TOKEN INFORMATION parameter data, the fields a copy needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RodTokenInformation {
    /// The command it reports on: 0x10 POPULATE TOKEN, 0x11 WRITE USING TOKEN.
    pub service_action: u8,
    /// 0x01 done, 0x02 failed, 0x10/0x11 in progress.
    pub copy_status: u8,
    /// TRANSFER COUNT, in logical blocks.
    pub transfer_blocks: u64,
    /// The sense data of a failed command.
    pub sense: Vec<u8>,
    /// The token a POPULATE TOKEN made.
    pub token: Option<Vec<u8>>,
}

impl RodTokenInformation {
    pub fn parse(d: &[u8]) -> Result<Self, Error> {
        let short = || {
            Error::Protocol(format!(
                "RECEIVE ROD TOKEN INFORMATION data of {} bytes",
                d.len()
            ))
        };
        if d.len() < 36 {
            return Err(short());
        }
        if d[15] != 0xf1 {
            return Err(Error::Protocol(format!(
                "transfer count units {:#x}, not blocks",
                d[15]
            )));
        }
        let field = d[13] as usize;
        let sense_len = (d[14] as usize).min(field);
        let sense = d.get(32..32 + sense_len).ok_or_else(short)?.to_vec();
        let at = 32 + field;
        let descriptors = d
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(short)?;
        let token = if descriptors >= 514 {
            Some(d.get(at + 6..at + 6 + 512).ok_or_else(short)?.to_vec())
        } else {
            None
        };
        Ok(RodTokenInformation {
            service_action: d[4],
            copy_status: d[5],
            transfer_blocks: u64::from_be_bytes(d[16..24].try_into().map_err(|_| short())?),
            sense,
            token,
        })
    }
}

/// READ CAPACITY(16) parameter data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub last_lba: u64,
    pub block_size: u32,
    /// Logical blocks per physical block exponent.
    pub lbppbe: u8,
    /// Logical block provisioning management enabled (thin).
    pub lbpme: bool,
    /// Unmapped blocks read as zeros.
    pub lbprz: bool,
}

impl Capacity {
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        if data.len() < 15 {
            return Err(Error::Protocol(format!(
                "READ CAPACITY(16) returned {} bytes, expected at least 15",
                data.len()
            )));
        }
        let mut lba = [0; 8];
        lba.copy_from_slice(&data[0..8]);
        let block_size = u32::from_be_bytes([data[8], data[9], data[10], data[11]]);
        if block_size == 0 {
            return Err(Error::Protocol(
                "READ CAPACITY(16) reports 0-byte blocks".into(),
            ));
        }
        Ok(Self {
            last_lba: u64::from_be_bytes(lba),
            block_size,
            lbppbe: data[13] & 0x0f,
            lbpme: data[14] & 0x80 != 0,
            lbprz: data[14] & 0x40 != 0,
        })
    }
    pub fn blocks(&self) -> u64 {
        self.last_lba.saturating_add(1)
    }
    pub fn bytes(&self) -> u64 {
        self.blocks().saturating_mul(u64::from(self.block_size))
    }
}

/// Provisioning status of one GET LBA STATUS descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    Mapped,
    Deallocated,
    Anchored,
    Other(u8),
}

/// One GET LBA STATUS descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaStatus {
    pub lba: u64,
    pub blocks: u32,
    pub state: Provisioning,
}

/// Parses GET LBA STATUS parameter data.
pub fn parse_lba_status(data: &[u8]) -> Result<Vec<LbaStatus>, Error> {
    if data.len() < 8 {
        return Err(Error::Protocol(format!(
            "GET LBA STATUS returned {} bytes, expected at least 8",
            data.len()
        )));
    }
    let declared = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    let end = (declared.saturating_add(4)).min(data.len());
    let mut out = Vec::new();
    let mut pos = 8;
    while pos + 16 <= end {
        let d = &data[pos..pos + 16];
        let mut lba = [0; 8];
        lba.copy_from_slice(&d[0..8]);
        out.push(LbaStatus {
            lba: u64::from_be_bytes(lba),
            blocks: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
            state: match d[12] & 0x0f {
                0 => Provisioning::Mapped,
                1 => Provisioning::Deallocated,
                2 => Provisioning::Anchored,
                o => Provisioning::Other(o),
            },
        });
        pos += 16;
    }
    Ok(out)
}

/// The fields of the Block Limits VPD page (B0h) that reclaim and benchmarks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockLimits {
    pub max_transfer_length: u32,
    pub optimal_transfer_length: u32,
    pub max_unmap_lba_count: u32,
    pub max_unmap_descriptors: u32,
    pub optimal_unmap_granularity: u32,
}

impl BlockLimits {
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        if data.len() < 32 || data[1] != 0xb0 {
            return Err(Error::Protocol(
                "Block Limits VPD page is missing or too short".into(),
            ));
        }
        let at = |o: usize| u32::from_be_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
        Ok(Self {
            max_transfer_length: at(8),
            optimal_transfer_length: at(12),
            max_unmap_lba_count: at(20),
            max_unmap_descriptors: at(24),
            optimal_unmap_granularity: at(28) & 0x7fff_ffff,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_cdbs() {
        let c = read16(0x0102_0304_0506_0708, 8, 512).unwrap();
        assert_eq!(c.cdb[0], 0x88);
        assert_eq!(&c.cdb[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c.cdb[10..14], &[0, 0, 0, 8]);
        assert_eq!(c.data_in_len, 4096);
        assert!(read16(0, u32::MAX, 512).is_err());

        let w = write16(5, vec![7; 1024], 512, true).unwrap();
        assert_eq!((w.cdb[0], w.cdb[1]), (0x8a, 0x08));
        assert_eq!(&w.cdb[10..14], &[0, 0, 0, 2]);
        assert_eq!(w.data_out.len(), 1024);
        assert!(write16(0, vec![0; 100], 512, false).is_err());
    }

    #[test]
    fn unmap_parameter_list() {
        let c = unmap(&[(0x10, 0x20), (0x1_0000_0000, 7)]).unwrap();
        assert_eq!(c.cdb[0], 0x42);
        assert_eq!(u16::from_be_bytes([c.cdb[7], c.cdb[8]]), 40);
        let p = &c.data_out;
        assert_eq!(p.len(), 40);
        assert_eq!(u16::from_be_bytes([p[0], p[1]]), 38);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 32);
        assert_eq!(&p[8..16], &0x10u64.to_be_bytes());
        assert_eq!(&p[16..20], &0x20u32.to_be_bytes());
        assert_eq!(&p[24..32], &0x1_0000_0000u64.to_be_bytes());
        assert_eq!(&p[32..36], &7u32.to_be_bytes());
        assert!(unmap(&[]).is_err());
    }

    #[test]
    fn capacity_and_lba_status_parsing() {
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&2047u64.to_be_bytes());
        d[8..12].copy_from_slice(&512u32.to_be_bytes());
        d[13] = 3;
        d[14] = 0xc0;
        let c = Capacity::parse(&d).unwrap();
        assert_eq!(c.blocks(), 2048);
        assert_eq!(c.bytes(), 1 << 20);
        assert_eq!((c.lbppbe, c.lbpme, c.lbprz), (3, true, true));
        assert!(Capacity::parse(&d[..10]).is_err());

        let mut s = vec![0u8; 8 + 32];
        s[0..4].copy_from_slice(&36u32.to_be_bytes());
        s[8..16].copy_from_slice(&0u64.to_be_bytes());
        s[16..20].copy_from_slice(&100u32.to_be_bytes());
        s[20] = 1;
        s[24..32].copy_from_slice(&100u64.to_be_bytes());
        s[32..36].copy_from_slice(&50u32.to_be_bytes());
        s[36] = 0;
        let v = parse_lba_status(&s).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].state, Provisioning::Deallocated);
        assert_eq!(
            (v[1].lba, v[1].blocks, v[1].state),
            (100, 50, Provisioning::Mapped)
        );
        // A declared length beyond the data is clipped.
        s[0..4].copy_from_slice(&1000u32.to_be_bytes());
        assert_eq!(parse_lba_status(&s).unwrap().len(), 2);
    }

    #[test]
    fn other_cdbs() {
        let ws = write_same16(9, 100, vec![0; 512], true);
        assert_eq!((ws.cdb[0], ws.cdb[1]), (0x93, 0x08));
        assert_eq!(&ws.cdb[10..14], &100u32.to_be_bytes());
        let rc = read_capacity16();
        assert_eq!((rc.cdb[0], rc.cdb[1], rc.data_in_len), (0x9e, 0x10, 32));
        let g = get_lba_status(77, 4096);
        assert_eq!((g.cdb[1], g.data_in_len), (0x12, 4096));
        assert_eq!(&g.cdb[2..10], &77u64.to_be_bytes());
        let sc = synchronize_cache16(0, 0);
        assert_eq!(sc.cdb[0], 0x91);
        let inq = inquiry(Some(0xb0), 64);
        assert_eq!(&inq.cdb[..5], &[0x12, 1, 0xb0, 0, 64]);
    }
}
