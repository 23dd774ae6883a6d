//! CDB parsing: bytes in, a typed [`Command`] out. No I/O and no LU state here.
//!
//! Parsing rejects what is wrong in the CDB alone (reserved service actions, protection
//! fields we do not support, NACA); checks that need the LU (LBA ranges, allocation vs
//! capacity) happen in the command families.

use crate::sense::Sense;

pub mod opcode {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_ATOMIC_16: u8 = 0x9c;
    pub const ORWRITE_16: u8 = 0x8b;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const LOG_SENSE: u8 = 0x4d;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN service actions.
    pub const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
    pub const SA_REPORT_SUPPORTED_TMFS: u8 = 0x0d;
    /// SANITIZE service actions.
    pub const SA_SANITIZE_OVERWRITE: u8 = 0x01;
    pub const SA_SANITIZE_BLOCK_ERASE: u8 = 0x02;
    pub const SA_SANITIZE_CRYPTO_ERASE: u8 = 0x03;
    pub const SA_SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1f;
    /// THIRD-PARTY COPY OUT service actions: EXTENDED COPY(LID1) and the token-based copy
    /// (LID4 EXTENDED COPY, COPY OPERATION ABORT and friends are not implemented).
    pub const SA_EXTENDED_COPY_LID1: u8 = 0x00;
    pub const SA_POPULATE_TOKEN: u8 = 0x10;
    pub const SA_WRITE_USING_TOKEN: u8 = 0x11;
    /// RECEIVE COPY RESULTS service actions (RECEIVE DATA, 01h, is not implemented: no
    /// segment type we accept holds data).
    pub const SA_COPY_STATUS: u8 = 0x00;
    pub const SA_OPERATING_PARAMETERS: u8 = 0x03;
    pub const SA_FAILED_SEGMENT_DETAILS: u8 = 0x04;
    pub const SA_RECEIVE_ROD_TOKEN_INFORMATION: u8 = 0x07;
    /// PERSISTENT RESERVE IN service actions.
    pub const SA_PRIN_READ_KEYS: u8 = 0x00;
    pub const SA_PRIN_READ_RESERVATION: u8 = 0x01;
    pub const SA_PRIN_REPORT_CAPABILITIES: u8 = 0x02;
    pub const SA_PRIN_READ_FULL_STATUS: u8 = 0x03;
    /// PERSISTENT RESERVE OUT service actions.
    pub const SA_PROUT_REGISTER: u8 = 0x00;
    pub const SA_PROUT_RESERVE: u8 = 0x01;
    pub const SA_PROUT_RELEASE: u8 = 0x02;
    pub const SA_PROUT_CLEAR: u8 = 0x03;
    pub const SA_PROUT_PREEMPT: u8 = 0x04;
    pub const SA_PROUT_PREEMPT_AND_ABORT: u8 = 0x05;
    pub const SA_PROUT_REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
    pub const SA_PROUT_REGISTER_AND_MOVE: u8 = 0x07;
}

use opcode::*;

/// A block range with the flags every READ/WRITE-family CDB carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    pub lba: u64,
    pub blocks: u64,
}

/// Which mode pages a MODE SENSE asks for (page control field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageControl {
    Current,
    Changeable,
    Default,
    Saved,
}

/// What START STOP UNIT asks for; we keep no stopped state (see `sbc`), so only
/// validity matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartStop {
    pub immed: bool,
    pub power_condition: u8,
    pub load_eject: bool,
    pub start: bool,
}

/// SANITIZE service actions we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanitizeAction {
    Overwrite,
    BlockErase,
    CryptoErase,
    ExitFailureMode,
}

/// RECEIVE COPY RESULTS service actions we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyResultsAction {
    CopyStatus,
    OperatingParameters,
    FailedSegmentDetails,
}

/// REPORT SUPPORTED OPERATION CODES reporting options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RsocOptions {
    /// 000b: every command.
    All,
    /// 001b: one opcode that has no service actions.
    Opcode(u8),
    /// 010b: one opcode + service action (the opcode must have service actions).
    OpcodeServiceAction(u8, u16),
    /// 011b: one opcode, with service action if it has them.
    OpcodeMaybeServiceAction(u8, u16),
}

/// PERSISTENT RESERVE IN service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrinAction {
    ReadKeys,
    ReadReservation,
    ReportCapabilities,
    ReadFullStatus,
}

/// PERSISTENT RESERVE OUT service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProutServiceAction {
    Register,
    Reserve,
    Release,
    Clear,
    Preempt,
    PreemptAndAbort,
    RegisterAndIgnoreExistingKey,
    RegisterAndMove,
}

/// A PERSISTENT RESERVE OUT CDB. A reserved service action is carried as the sense it is
/// answered with, and SCOPE and TYPE as their codes: which of them must be valid depends on
/// the service action, and the device server reports them only when the command runs (after
/// the unit attention, sanitize and reservation checks) and, for SCOPE and TYPE, after the
/// parameter list's length, as it always has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProutCdb {
    /// SERVICE ACTION (bits 4-0 of byte 1), or INVALID FIELD IN CDB pointing at it.
    pub action: Result<ProutServiceAction, Sense>,
    /// SCOPE (bits 7-4 of byte 2): only LU_SCOPE (0) is defined.
    pub scope: u8,
    /// TYPE (bits 3-0 of byte 2).
    pub type_code: u8,
    /// PARAMETER LIST LENGTH.
    pub param_len: usize,
}

/// One parsed CDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    TestUnitReady,
    RequestSense {
        descriptor: bool,
        alloc_len: usize,
    },
    Inquiry {
        evpd: bool,
        page: u8,
        alloc_len: usize,
    },
    ReportLuns {
        select: u8,
        alloc_len: usize,
    },
    LogSense {
        /// Page control: 0 threshold, 1 cumulative, 2 default threshold, 3 default cumulative.
        page_control: u8,
        page: u8,
        subpage: u8,
        alloc_len: usize,
    },
    Read {
        range: BlockRange,
        fua: bool,
    },
    Write {
        range: BlockRange,
        fua: bool,
    },
    Verify {
        range: BlockRange,
        /// BYTCHK: 0 = medium only, 1 = compare every block, 3 = one block against each.
        byte_check: u8,
    },
    WriteAndVerify {
        range: BlockRange,
    },
    OrWrite {
        range: BlockRange,
        fua: bool,
    },
    /// WRITE ATOMIC(16): all or nothing. `boundary` is the ATOMIC BOUNDARY field.
    WriteAtomic {
        range: BlockRange,
        fua: bool,
        boundary: u16,
    },
    CompareAndWrite {
        range: BlockRange,
        fua: bool,
    },
    WriteSame {
        range: BlockRange,
        unmap: bool,
        anchor: bool,
        /// No Data-Out: the pattern is a zero block.
        ndob: bool,
    },
    Unmap {
        anchor: bool,
        param_len: usize,
    },
    GetLbaStatus {
        lba: u64,
        alloc_len: usize,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc_len: usize,
    },
    SynchronizeCache {
        range: BlockRange,
    },
    PreFetch {
        range: BlockRange,
    },
    StartStopUnit(StartStop),
    ModeSense {
        ten: bool,
        dbd: bool,
        llbaa: bool,
        control: PageControl,
        page: u8,
        subpage: u8,
        alloc_len: usize,
    },
    ModeSelect {
        ten: bool,
        save_pages: bool,
        param_len: usize,
    },
    ReadDefectData {
        ten: bool,
        format: u8,
        alloc_len: usize,
    },
    Sanitize {
        action: SanitizeAction,
        param_len: usize,
    },
    Reserve,
    Release,
    PersistentReserveIn {
        /// SERVICE ACTION, or for a reserved one INVALID FIELD IN CDB pointing at it, which
        /// the command is answered with when it runs (after the reservation checks).
        action: Result<PrinAction, Sense>,
        alloc_len: usize,
    },
    PersistentReserveOut(ProutCdb),
    /// EXTENDED COPY(LID1).
    ExtendedCopy {
        param_len: usize,
    },
    ReceiveCopyResults {
        action: CopyResultsAction,
        list_id: u8,
        alloc_len: usize,
    },
    /// POPULATE TOKEN (SBC-3): make a ROD token for LBA ranges of this LU.
    PopulateToken {
        list_id: u32,
        param_len: usize,
    },
    /// WRITE USING TOKEN (SBC-3): write the data a ROD token represents.
    WriteUsingToken {
        list_id: u32,
        param_len: usize,
    },
    /// RECEIVE ROD TOKEN INFORMATION (SBC-3): the outcome of a POPULATE TOKEN or WRITE
    /// USING TOKEN, with the token.
    ReceiveRodTokenInformation {
        list_id: u32,
        alloc_len: usize,
    },
    ReportTargetPortGroups {
        extended: bool,
        alloc_len: usize,
    },
    ReportSupportedOpcodes {
        rctd: bool,
        options: RsocOptions,
        alloc_len: usize,
    },
    ReportSupportedTmfs {
        extended: bool,
        alloc_len: usize,
    },
    /// An opcode (or service action) this device server does not implement.
    Unsupported {
        opcode: u8,
    },
}

/// CDB length implied by the opcode's group code (SPC-4 4.2.5.1); `None` for groups
/// (reserved / vendor specific) we never parse.
pub fn cdb_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Fixed-size view of a CDB whose length was checked against its group code, so field
/// accessors with constant offsets cannot go out of bounds.
struct Fields([u8; 16]);

impl Fields {
    fn u8(&self, i: usize) -> u8 {
        self.0[i]
    }
    fn bit(&self, i: usize, bit: u8) -> bool {
        self.0[i] & (1 << bit) != 0
    }
    fn u16(&self, i: usize) -> u16 {
        u16::from_be_bytes([self.0[i], self.0[i + 1]])
    }
    fn u24(&self, i: usize) -> u32 {
        u32::from_be_bytes([0, self.0[i], self.0[i + 1], self.0[i + 2]])
    }
    fn u32(&self, i: usize) -> u32 {
        u32::from_be_bytes([self.0[i], self.0[i + 1], self.0[i + 2], self.0[i + 3]])
    }
    fn u64(&self, i: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[i..i + 8]);
        u64::from_be_bytes(b)
    }
}

fn invalid_field(byte: u16, bit: Option<u8>) -> Sense {
    Sense::invalid_cdb(byte, bit)
}

/// Fails with INVALID FIELD IN CDB pointing at the protection field (bits 7-5 of byte 1):
/// the LU is formatted without protection information.
fn no_protection(f: &Fields) -> Result<(), Sense> {
    if f.u8(1) >> 5 != 0 {
        return Err(invalid_field(1, Some(7)));
    }
    Ok(())
}

/// Parse a CDB. Unknown opcodes and service actions become [`Command::Unsupported`];
/// malformed fields of known commands become an ILLEGAL REQUEST sense.
pub fn parse(cdb: &[u8]) -> Result<Command, Sense> {
    let Some(&op) = cdb.first() else {
        return Err(invalid_field(0, None));
    };
    let Some(len) = cdb_length(op) else {
        return Ok(Command::Unsupported { opcode: op });
    };
    if cdb.len() < len {
        return Err(invalid_field(0, None));
    }
    let mut fixed = [0u8; 16];
    fixed[..len].copy_from_slice(&cdb[..len]);
    let f = Fields(fixed);
    // NACA = 1 asks for ACA, which we do not implement (SAM-5 5.9.1.3).
    if f.bit(len - 1, 2) {
        return Err(invalid_field(len as u16 - 1, Some(2)));
    }
    match op {
        READ_6 | WRITE_6 | READ_10 | READ_12 | READ_16 | WRITE_10 | WRITE_12 | WRITE_16 => {
            read_or_write(op, &f)
        }
        VERIFY_10 | VERIFY_12 | VERIFY_16 | WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12
        | WRITE_AND_VERIFY_16 => verify(op, &f),
        WRITE_ATOMIC_16 | ORWRITE_16 | COMPARE_AND_WRITE | WRITE_SAME_10 | WRITE_SAME_16
        | UNMAP => special_write(op, &f),
        READ_CAPACITY_10 | SERVICE_ACTION_IN_16 | SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16
        | PRE_FETCH_10 | PRE_FETCH_16 | START_STOP_UNIT | READ_DEFECT_DATA_10
        | READ_DEFECT_DATA_12 | SANITIZE => block_device(op, &f),
        EXTENDED_COPY | RECEIVE_COPY_RESULTS => third_party_copy(op, &f),
        MAINTENANCE_IN => maintenance_in(op, &f),
        RESERVE_6
        | RESERVE_10
        | RELEASE_6
        | RELEASE_10
        | PERSISTENT_RESERVE_IN
        | PERSISTENT_RESERVE_OUT => reservation(op, &f),
        _ => primary(op, &f),
    }
}

fn range(lba: u64, blocks: u64) -> BlockRange {
    BlockRange { lba, blocks }
}

/// The LBA and TRANSFER LENGTH of a 10-, 12- or 16-byte READ/WRITE-family CDB of opcode `op`,
/// where each of these sizes keeps them.
fn block_range(op: u8, f: &Fields) -> BlockRange {
    match cdb_length(op) {
        Some(10) => range(f.u32(2) as u64, f.u16(7) as u64),
        Some(12) => range(f.u32(2) as u64, f.u32(6) as u64),
        _ => range(f.u64(2), f.u32(10) as u64),
    }
}

/// READ and WRITE of every CDB size.
fn read_or_write(op: u8, f: &Fields) -> Result<Command, Sense> {
    if matches!(op, READ_6 | WRITE_6) {
        // A TRANSFER LENGTH of 0 means 256 blocks for the 6-byte commands.
        let blocks = match f.u8(4) {
            0 => 256,
            n => n as u64,
        };
        let range = range((f.u24(1) & 0x1f_ffff) as u64, blocks);
        return Ok(if op == READ_6 {
            Command::Read { range, fua: false }
        } else {
            Command::Write { range, fua: false }
        });
    }
    no_protection(f)?;
    let fua = f.bit(1, 3);
    let range = block_range(op, f);
    Ok(if matches!(op, READ_10 | READ_12 | READ_16) {
        Command::Read { range, fua }
    } else {
        Command::Write { range, fua }
    })
}

/// VERIFY and WRITE AND VERIFY.
fn verify(op: u8, f: &Fields) -> Result<Command, Sense> {
    no_protection(f)?;
    let range = block_range(op, f);
    if matches!(op, VERIFY_10 | VERIFY_12 | VERIFY_16) {
        let byte_check = (f.u8(1) >> 1) & 3;
        if byte_check == 2 {
            return Err(invalid_field(1, Some(2)));
        }
        return Ok(Command::Verify { range, byte_check });
    }
    // BYTCHK 10b and 11b are reserved for WRITE AND VERIFY (SBC-4 5.47).
    if f.bit(1, 2) {
        return Err(invalid_field(1, Some(2)));
    }
    Ok(Command::WriteAndVerify { range })
}

/// The writes beyond WRITE: atomic, OR, compare-and-write and the VAAI and thin provisioning
/// ones (WRITE SAME, UNMAP).
fn special_write(op: u8, f: &Fields) -> Result<Command, Sense> {
    if op == UNMAP {
        return Ok(Command::Unmap {
            anchor: f.bit(1, 0),
            param_len: f.u16(7) as usize,
        });
    }
    no_protection(f)?;
    let cmd = match op {
        WRITE_ATOMIC_16 => Command::WriteAtomic {
            range: range(f.u64(2), f.u16(12) as u64),
            fua: f.bit(1, 3),
            boundary: f.u16(10),
        },
        ORWRITE_16 => Command::OrWrite {
            range: range(f.u64(2), f.u32(10) as u64),
            fua: f.bit(1, 3),
        },
        COMPARE_AND_WRITE => Command::CompareAndWrite {
            range: range(f.u64(2), f.u8(13) as u64),
            fua: f.bit(1, 3),
        },
        WRITE_SAME_10 | WRITE_SAME_16 => {
            // PBDATA / LBDATA (bits 2, 1) are obsolete-ish and need protection info or
            // per-block LBA stamping, which we do not do.
            if f.u8(1) & 0x06 != 0 {
                return Err(invalid_field(1, Some(2)));
            }
            Command::WriteSame {
                range: block_range(op, f),
                unmap: f.bit(1, 3),
                anchor: f.bit(1, 4),
                ndob: op == WRITE_SAME_16 && f.bit(1, 0),
            }
        }
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

/// The block device's commands that move no data of their own: capacity and LBA status,
/// cache, start/stop, defect data and SANITIZE.
fn block_device(op: u8, f: &Fields) -> Result<Command, Sense> {
    let cmd = match op {
        READ_CAPACITY_10 => {
            // PMI = 0 with a non-zero LBA is invalid (SBC-3 5.16.1).
            if !f.bit(8, 0) && f.u32(2) != 0 {
                return Err(invalid_field(2, None));
            }
            Command::ReadCapacity10
        }
        SERVICE_ACTION_IN_16 => match f.u8(1) & 0x1f {
            SA_READ_CAPACITY_16 => Command::ReadCapacity16 {
                alloc_len: f.u32(10) as usize,
            },
            SA_GET_LBA_STATUS => Command::GetLbaStatus {
                lba: f.u64(2),
                alloc_len: f.u32(10) as usize,
            },
            _ => Command::Unsupported { opcode: op },
        },
        SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => Command::SynchronizeCache {
            range: block_range(op, f),
        },
        PRE_FETCH_10 | PRE_FETCH_16 => Command::PreFetch {
            range: block_range(op, f),
        },
        START_STOP_UNIT => Command::StartStopUnit(StartStop {
            immed: f.bit(1, 0),
            power_condition: f.u8(4) >> 4,
            load_eject: f.bit(4, 1),
            start: f.bit(4, 0),
        }),
        READ_DEFECT_DATA_10 => Command::ReadDefectData {
            ten: true,
            format: f.u8(2) & 0x07,
            alloc_len: f.u16(7) as usize,
        },
        READ_DEFECT_DATA_12 => Command::ReadDefectData {
            ten: false,
            format: f.u8(1) & 0x07,
            alloc_len: f.u32(6) as usize,
        },
        SANITIZE => sanitize(f)?,
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

fn sanitize(f: &Fields) -> Result<Command, Sense> {
    // Byte 1 bit 6 and bytes 2..=6 are reserved (SBC-3 5.30).
    if f.u8(1) & 0x40 != 0 {
        return Err(invalid_field(1, Some(6)));
    }
    if let Some(i) = (2..=6).find(|&i| f.u8(i) != 0) {
        return Err(invalid_field(i as u16, None));
    }
    let action = match f.u8(1) & 0x1f {
        SA_SANITIZE_OVERWRITE => SanitizeAction::Overwrite,
        SA_SANITIZE_BLOCK_ERASE => SanitizeAction::BlockErase,
        SA_SANITIZE_CRYPTO_ERASE => SanitizeAction::CryptoErase,
        SA_SANITIZE_EXIT_FAILURE_MODE => SanitizeAction::ExitFailureMode,
        _ => return Err(invalid_field(1, Some(4))),
    };
    Ok(Command::Sanitize {
        action,
        param_len: f.u16(7) as usize,
    })
}

/// THIRD-PARTY COPY OUT (EXTENDED COPY and the token copy of VAAI's XCOPY and ODX) and
/// RECEIVE COPY RESULTS, by service action.
fn third_party_copy(op: u8, f: &Fields) -> Result<Command, Sense> {
    let service_action = f.u8(1) & 0x1f;
    let cmd = match (op, service_action) {
        (EXTENDED_COPY, SA_EXTENDED_COPY_LID1) => Command::ExtendedCopy {
            param_len: f.u32(10) as usize,
        },
        (EXTENDED_COPY, SA_POPULATE_TOKEN) => Command::PopulateToken {
            list_id: f.u32(6),
            param_len: f.u32(10) as usize,
        },
        (EXTENDED_COPY, SA_WRITE_USING_TOKEN) => Command::WriteUsingToken {
            list_id: f.u32(6),
            param_len: f.u32(10) as usize,
        },
        (RECEIVE_COPY_RESULTS, SA_RECEIVE_ROD_TOKEN_INFORMATION) => {
            Command::ReceiveRodTokenInformation {
                list_id: f.u32(2),
                alloc_len: f.u32(10) as usize,
            }
        }
        (RECEIVE_COPY_RESULTS, _) => {
            let action = match service_action {
                SA_COPY_STATUS => CopyResultsAction::CopyStatus,
                SA_OPERATING_PARAMETERS => CopyResultsAction::OperatingParameters,
                SA_FAILED_SEGMENT_DETAILS => CopyResultsAction::FailedSegmentDetails,
                _ => return Ok(Command::Unsupported { opcode: op }),
            };
            Command::ReceiveCopyResults {
                action,
                list_id: f.u8(2),
                alloc_len: f.u32(10) as usize,
            }
        }
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

/// MAINTENANCE IN, by service action: the reports of target port groups and of what the
/// device server supports.
fn maintenance_in(op: u8, f: &Fields) -> Result<Command, Sense> {
    let cmd = match f.u8(1) & 0x1f {
        SA_REPORT_TARGET_PORT_GROUPS => Command::ReportTargetPortGroups {
            extended: f.u8(1) >> 5 == 1,
            alloc_len: f.u32(6) as usize,
        },
        SA_REPORT_SUPPORTED_OPCODES => {
            let requested_op = f.u8(3);
            let requested_sa = f.u16(4);
            let options = match f.u8(2) & 0x07 {
                0 => RsocOptions::All,
                1 => RsocOptions::Opcode(requested_op),
                2 => RsocOptions::OpcodeServiceAction(requested_op, requested_sa),
                3 => RsocOptions::OpcodeMaybeServiceAction(requested_op, requested_sa),
                _ => return Err(invalid_field(2, Some(2))),
            };
            Command::ReportSupportedOpcodes {
                rctd: f.bit(2, 7),
                options,
                alloc_len: f.u32(6) as usize,
            }
        }
        SA_REPORT_SUPPORTED_TMFS => Command::ReportSupportedTmfs {
            extended: f.bit(2, 7),
            alloc_len: f.u32(6) as usize,
        },
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

/// SPC-2 RESERVE and RELEASE, and PERSISTENT RESERVE IN and OUT.
fn reservation(op: u8, f: &Fields) -> Result<Command, Sense> {
    let cmd = match op {
        RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10 => {
            // Third-party and extent reservations (obsolete) are not supported.
            if f.u8(1) & 0x13 != 0 {
                return Err(invalid_field(1, None));
            }
            if matches!(op, RESERVE_6 | RESERVE_10) {
                Command::Reserve
            } else {
                Command::Release
            }
        }
        PERSISTENT_RESERVE_IN => Command::PersistentReserveIn {
            action: prin_action(f.u8(1) & 0x1f),
            alloc_len: f.u16(7) as usize,
        },
        PERSISTENT_RESERVE_OUT => Command::PersistentReserveOut(ProutCdb {
            action: prout_action(f.u8(1) & 0x1f),
            scope: f.u8(2) >> 4,
            type_code: f.u8(2) & 0x0f,
            param_len: f.u32(5) as usize,
        }),
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

/// A PERSISTENT RESERVE IN service action; a reserved one is an invalid SERVICE ACTION field.
fn prin_action(service_action: u8) -> Result<PrinAction, Sense> {
    Ok(match service_action {
        SA_PRIN_READ_KEYS => PrinAction::ReadKeys,
        SA_PRIN_READ_RESERVATION => PrinAction::ReadReservation,
        SA_PRIN_REPORT_CAPABILITIES => PrinAction::ReportCapabilities,
        SA_PRIN_READ_FULL_STATUS => PrinAction::ReadFullStatus,
        _ => return Err(invalid_field(1, Some(4))),
    })
}

/// A PERSISTENT RESERVE OUT service action; a reserved one is an invalid SERVICE ACTION field.
fn prout_action(service_action: u8) -> Result<ProutServiceAction, Sense> {
    Ok(match service_action {
        SA_PROUT_REGISTER => ProutServiceAction::Register,
        SA_PROUT_RESERVE => ProutServiceAction::Reserve,
        SA_PROUT_RELEASE => ProutServiceAction::Release,
        SA_PROUT_CLEAR => ProutServiceAction::Clear,
        SA_PROUT_PREEMPT => ProutServiceAction::Preempt,
        SA_PROUT_PREEMPT_AND_ABORT => ProutServiceAction::PreemptAndAbort,
        SA_PROUT_REGISTER_AND_IGNORE_EXISTING_KEY => {
            ProutServiceAction::RegisterAndIgnoreExistingKey
        }
        SA_PROUT_REGISTER_AND_MOVE => ProutServiceAction::RegisterAndMove,
        _ => return Err(invalid_field(1, Some(4))),
    })
}

/// The primary commands every device type has (TEST UNIT READY, REQUEST SENSE, INQUIRY,
/// REPORT LUNS, LOG SENSE, MODE SENSE and MODE SELECT), and any opcode we do not implement.
fn primary(op: u8, f: &Fields) -> Result<Command, Sense> {
    let cmd = match op {
        TEST_UNIT_READY => Command::TestUnitReady,
        REQUEST_SENSE => Command::RequestSense {
            descriptor: f.bit(1, 0),
            alloc_len: f.u8(4) as usize,
        },
        INQUIRY => {
            let evpd = f.bit(1, 0);
            if f.bit(1, 1) {
                return Err(invalid_field(1, Some(1))); // CMDDT is obsolete
            }
            if !evpd && f.u8(2) != 0 {
                return Err(invalid_field(2, None));
            }
            Command::Inquiry {
                evpd,
                page: f.u8(2),
                alloc_len: f.u16(3) as usize,
            }
        }
        LOG_SENSE => log_sense(f)?,
        REPORT_LUNS => Command::ReportLuns {
            select: f.u8(2),
            alloc_len: f.u32(6) as usize,
        },
        MODE_SENSE_6 | MODE_SENSE_10 => mode_sense(op, f),
        MODE_SELECT_6 | MODE_SELECT_10 => {
            let ten = op == MODE_SELECT_10;
            Command::ModeSelect {
                ten,
                save_pages: f.bit(1, 0),
                param_len: if ten {
                    f.u16(7) as usize
                } else {
                    f.u8(4) as usize
                },
            }
        }
        _ => Command::Unsupported { opcode: op },
    };
    Ok(cmd)
}

fn log_sense(f: &Fields) -> Result<Command, Sense> {
    // PPC (parameter pointer control) and SP (save parameters) are not supported.
    if f.u8(1) & 0x03 != 0 {
        return Err(invalid_field(
            1,
            Some((f.u8(1) & 0x03).trailing_zeros() as u8),
        ));
    }
    if f.u16(5) != 0 {
        return Err(invalid_field(5, None));
    }
    Ok(Command::LogSense {
        page_control: f.u8(2) >> 6,
        page: f.u8(2) & 0x3f,
        subpage: f.u8(3),
        alloc_len: f.u16(7) as usize,
    })
}

fn mode_sense(op: u8, f: &Fields) -> Command {
    let ten = op == MODE_SENSE_10;
    let control = match f.u8(2) >> 6 {
        0 => PageControl::Current,
        1 => PageControl::Changeable,
        2 => PageControl::Default,
        _ => PageControl::Saved,
    };
    Command::ModeSense {
        ten,
        dbd: f.bit(1, 3),
        llbaa: ten && f.bit(1, 4),
        control,
        page: f.u8(2) & 0x3f,
        subpage: f.u8(3),
        alloc_len: if ten {
            f.u16(7) as usize
        } else {
            f.u8(4) as usize
        },
    }
}

/// One command this device server implements, for REPORT SUPPORTED OPERATION CODES.
pub struct CommandInfo {
    pub opcode: u8,
    /// Service action, for opcodes that have them.
    pub service_action: Option<u16>,
    /// CDB USAGE DATA (SPC-4 6.35.3): byte 0 is the opcode, the service action bits hold
    /// the service action, every other bit is 1 where the device server looks at it.
    pub usage: &'static [u8],
}

/// The [`CommandInfo`] of each row `OPCODE: [usage]` or `OPCODE / SERVICE_ACTION: [usage]`,
/// where `usage` is the CDB USAGE DATA from byte 1 on. Byte 0 is the opcode, and every service
/// action here is bits 4-0 of byte 1, so a row's byte 1 holds only the other bits.
macro_rules! supported_commands {
    (@service_action) => {
        None
    };
    (@service_action $sa:tt) => {
        Some($sa as u16)
    };
    ($($op:ident $(/ $sa:tt)?: [$byte1:expr $(, $byte:expr)*];)*) => {
        &[$(CommandInfo {
            opcode: $op,
            service_action: supported_commands!(@service_action $($sa)?),
            usage: &[$op, $byte1 $(| $sa)?, $($byte),*],
        },)*]
    };
}

/// Every implemented command, sorted by opcode and service action.
pub static SUPPORTED_COMMANDS: &[CommandInfo] = supported_commands! {
    TEST_UNIT_READY: [0, 0, 0, 0, 0x03];
    REQUEST_SENSE: [0x01, 0, 0, 0xff, 0x03];
    READ_6: [0x1f, 0xff, 0xff, 0xff, 0x03];
    WRITE_6: [0x1f, 0xff, 0xff, 0xff, 0x03];
    INQUIRY: [0x01, 0xff, 0xff, 0xff, 0x03];
    MODE_SELECT_6: [0x11, 0, 0, 0xff, 0x03];
    RESERVE_6: [0, 0, 0, 0, 0x03];
    RELEASE_6: [0, 0, 0, 0, 0x03];
    MODE_SENSE_6: [0x08, 0xff, 0xff, 0xff, 0x03];
    START_STOP_UNIT: [0x01, 0, 0x0f, 0xf7, 0x03];
    READ_CAPACITY_10: [0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0x03];
    READ_10: [0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    WRITE_10: [0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    WRITE_AND_VERIFY_10: [0x12, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    VERIFY_10: [0x16, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    PRE_FETCH_10: [0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    SYNCHRONIZE_CACHE_10: [0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    READ_DEFECT_DATA_10: [0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    WRITE_SAME_10: [0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x03];
    UNMAP: [0x01, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0x03];
    SANITIZE / SA_SANITIZE_OVERWRITE: [0xa0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    SANITIZE / SA_SANITIZE_BLOCK_ERASE: [0xa0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    SANITIZE / SA_SANITIZE_EXIT_FAILURE_MODE: [0xa0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    LOG_SENSE: [0, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x03];
    MODE_SELECT_10: [0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    RESERVE_10: [0, 0, 0, 0, 0, 0, 0, 0, 0x03];
    RELEASE_10: [0, 0, 0, 0, 0, 0, 0, 0, 0x03];
    MODE_SENSE_10: [0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_IN / 0x00: [0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_IN / 0x01: [0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_IN / 0x02: [0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_IN / 0x03: [0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x00: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x01: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x02: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x03: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x04: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x05: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x06: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    PERSISTENT_RESERVE_OUT / 0x07: [0, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x03];
    EXTENDED_COPY / SA_EXTENDED_COPY_LID1:
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    EXTENDED_COPY / SA_POPULATE_TOKEN:
        [0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    EXTENDED_COPY / SA_WRITE_USING_TOKEN:
        [0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    RECEIVE_COPY_RESULTS / SA_COPY_STATUS:
        [0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    RECEIVE_COPY_RESULTS / SA_OPERATING_PARAMETERS:
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    RECEIVE_COPY_RESULTS / SA_FAILED_SEGMENT_DETAILS:
        [0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    RECEIVE_COPY_RESULTS / SA_RECEIVE_ROD_TOKEN_INFORMATION:
        [0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    READ_16:
        [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    COMPARE_AND_WRITE:
        [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x1f, 0x03];
    WRITE_16:
        [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    ORWRITE_16:
        [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    WRITE_AND_VERIFY_16:
        [0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    VERIFY_16:
        [0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    PRE_FETCH_16:
        [0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    SYNCHRONIZE_CACHE_16:
        [0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    WRITE_SAME_16:
        [0x19, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    WRITE_ATOMIC_16:
        [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    SERVICE_ACTION_IN_16 / SA_READ_CAPACITY_16:
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    SERVICE_ACTION_IN_16 / SA_GET_LBA_STATUS:
        [0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    REPORT_LUNS: [0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    MAINTENANCE_IN / SA_REPORT_TARGET_PORT_GROUPS:
        [0xe0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    MAINTENANCE_IN / SA_REPORT_SUPPORTED_OPCODES:
        [0, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    MAINTENANCE_IN / SA_REPORT_SUPPORTED_TMFS: [0, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
    READ_12: [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    WRITE_12: [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    WRITE_AND_VERIFY_12: [0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    VERIFY_12: [0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x03];
    READ_DEFECT_DATA_12: [0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x03];
};

/// Whether `opcode` is one whose commands are told apart by a service action.
pub fn has_service_actions(opcode: u8) -> bool {
    SUPPORTED_COMMANDS
        .iter()
        .any(|c| c.opcode == opcode && c.service_action.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::SenseReason;

    #[test]
    fn read16_fields() {
        let mut cdb = [0u8; 16];
        cdb[0] = READ_16;
        cdb[1] = 0x08;
        cdb[2..10].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        cdb[10..14].copy_from_slice(&77u32.to_be_bytes());
        assert_eq!(
            parse(&cdb).unwrap(),
            Command::Read {
                range: BlockRange {
                    lba: 0x0102_0304_0506_0708,
                    blocks: 77
                },
                fua: true
            }
        );
    }

    #[test]
    fn rdprotect_rejected() {
        let mut cdb = [0u8; 10];
        cdb[0] = READ_10;
        cdb[1] = 0x20;
        let sense = parse(&cdb).unwrap_err();
        assert_eq!(sense.reason, SenseReason::InvalidFieldInCdb);
    }

    #[test]
    fn short_cdb_rejected_and_unknown_opcode_is_unsupported() {
        assert!(parse(&[READ_16, 0, 0]).is_err());
        assert!(parse(&[]).is_err());
        assert_eq!(
            parse(&[0xc5; 16]).unwrap(),
            Command::Unsupported { opcode: 0xc5 }
        );
        assert_eq!(
            parse(&[0x02, 0, 0, 0, 0, 0]).unwrap(),
            Command::Unsupported { opcode: 0x02 }
        );
    }

    #[test]
    fn read6_zero_length_means_256() {
        let cdb = [READ_6, 0x01, 0x02, 0x03, 0, 0];
        assert_eq!(
            parse(&cdb).unwrap(),
            Command::Read {
                range: BlockRange {
                    lba: 0x010203,
                    blocks: 256
                },
                fua: false
            }
        );
    }

    /// A 10-byte CDB: `op`, bytes 1 and 2, and `len` in bytes 5-8 (PERSISTENT RESERVE OUT's
    /// PARAMETER LIST LENGTH; PERSISTENT RESERVE IN's ALLOCATION LENGTH is bytes 7-8).
    fn cdb10(op: u8, byte1: u8, byte2: u8, len: u32) -> [u8; 10] {
        let mut c = [op, byte1, byte2, 0, 0, 0, 0, 0, 0, 0];
        c[5..9].copy_from_slice(&len.to_be_bytes());
        c
    }

    #[test]
    fn persistent_reserve_in_decodes_service_action_and_allocation_length() {
        let actions = [
            (SA_PRIN_READ_KEYS, PrinAction::ReadKeys),
            (SA_PRIN_READ_RESERVATION, PrinAction::ReadReservation),
            (SA_PRIN_REPORT_CAPABILITIES, PrinAction::ReportCapabilities),
            (SA_PRIN_READ_FULL_STATUS, PrinAction::ReadFullStatus),
        ];
        assert_eq!(actions.map(|(sa, _)| sa), [0, 1, 2, 3]);
        for (sa, action) in actions {
            // Bits 7-5 of byte 1 are not the service action's; bytes 2-6 are reserved.
            let cdb = cdb10(PERSISTENT_RESERVE_IN, 0xe0 | sa, 0xff, 0xffff_1234);
            assert_eq!(
                parse(&cdb).unwrap(),
                Command::PersistentReserveIn {
                    action: Ok(action),
                    alloc_len: 0x1234,
                }
            );
        }
        for sa in 4..0x20 {
            let Ok(Command::PersistentReserveIn { action, .. }) =
                parse(&cdb10(PERSISTENT_RESERVE_IN, sa, 0, 8))
            else {
                panic!("{sa:#x} parses");
            };
            assert_eq!(action, Err(Sense::invalid_cdb(1, Some(4))), "{sa:#x}");
        }
        cut_short_or_with_naca_is_the_cdbs_own_sense(PERSISTENT_RESERVE_IN);
    }

    /// A 10-byte CDB of `op` cut to 9 bytes, or with NACA set: INVALID FIELD IN CDB at once.
    fn cut_short_or_with_naca_is_the_cdbs_own_sense(op: u8) {
        let mut cdb = cdb10(op, 0, 0, 24);
        assert_eq!(parse(&cdb[..9]), Err(Sense::invalid_cdb(0, None)), "short");
        cdb[9] = 0x04;
        assert_eq!(parse(&cdb), Err(Sense::invalid_cdb(9, Some(2))), "NACA");
    }

    #[test]
    fn persistent_reserve_out_decodes_its_fields() {
        use ProutServiceAction::*;
        let actions = [
            (SA_PROUT_REGISTER, Register),
            (SA_PROUT_RESERVE, Reserve),
            (SA_PROUT_RELEASE, Release),
            (SA_PROUT_CLEAR, Clear),
            (SA_PROUT_PREEMPT, Preempt),
            (SA_PROUT_PREEMPT_AND_ABORT, PreemptAndAbort),
            (
                SA_PROUT_REGISTER_AND_IGNORE_EXISTING_KEY,
                RegisterAndIgnoreExistingKey,
            ),
            (SA_PROUT_REGISTER_AND_MOVE, RegisterAndMove),
        ];
        assert_eq!(actions.map(|(sa, _)| sa), [0, 1, 2, 3, 4, 5, 6, 7]);
        for (sa, action) in actions {
            let cdb = cdb10(PERSISTENT_RESERVE_OUT, 0xe0 | sa, 0x13, 0x118);
            let expected = ProutCdb {
                action: Ok(action),
                scope: 1,
                type_code: 3,
                param_len: 0x118,
            };
            assert_eq!(parse(&cdb), Ok(Command::PersistentReserveOut(expected)));
        }
        // Reserved service actions, and reserved scopes and types, still parse: each is
        // reported when the command runs, the service action as this sense.
        for sa in 8..0x20 {
            let cdb = cdb10(PERSISTENT_RESERVE_OUT, sa, 0xf9, 24);
            let expected = ProutCdb {
                action: Err(Sense::invalid_cdb(1, Some(4))),
                scope: 0xf,
                type_code: 9,
                param_len: 24,
            };
            let parsed = parse(&cdb);
            assert_eq!(
                parsed,
                Ok(Command::PersistentReserveOut(expected)),
                "{sa:#x}"
            );
        }
        let longest = cdb10(PERSISTENT_RESERVE_OUT, 0, 0, u32::MAX);
        let Ok(Command::PersistentReserveOut(prout)) = parse(&longest) else {
            panic!("parses");
        };
        assert_eq!(prout.param_len, u32::MAX as usize);
        cut_short_or_with_naca_is_the_cdbs_own_sense(PERSISTENT_RESERVE_OUT);
    }

    #[test]
    fn supported_table_is_sorted_and_usage_matches_cdb_length() {
        for pair in SUPPORTED_COMMANDS.windows(2) {
            let a = (pair[0].opcode, pair[0].service_action);
            let b = (pair[1].opcode, pair[1].service_action);
            assert!(a < b, "{a:?} !< {b:?}");
        }
        for c in SUPPORTED_COMMANDS {
            assert_eq!(c.usage[0], c.opcode);
            assert_eq!(Some(c.usage.len()), cdb_length(c.opcode), "{:#x}", c.opcode);
        }
    }
}
