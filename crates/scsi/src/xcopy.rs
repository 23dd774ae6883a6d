//! Third-party copy (SPC-4 6.4, 6.18, 7.8.17): EXTENDED COPY(LID1), RECEIVE COPY RESULTS and
//! the Third-party Copy VPD page. This is what VMware "Full Copy" (XCOPY) and
//! `qemu-img convert -C` drive.
//!
//! Accepted descriptors: identification CSCD descriptors (E4h) naming an LU by its 16-byte NAA
//! designator, and block-to-block segment descriptors (02h, and 0Ah when both byte offsets
//! are zero and the byte count is whole blocks). No segment type we accept holds data, and
//! inline data is not taken.
//!
//! Order of business: the whole parameter list is parsed and checked first; a malformed list
//! gets ILLEGAL REQUEST and leaves no trace. A well-formed list is an accepted copy: its
//! outcome is recorded per (I_T nexus, LIST IDENTIFIER) for RECEIVE COPY RESULTS, including
//! COPY ABORTED when a copy target cannot be reached or a range does not fit. Every segment is
//! resolved and range-checked before the first block moves.
//!
//! Copy targets are found by NAA designator: the LU receiving the command matches its own; any
//! other LU only through the transport's [`CopyTargets`], which answers only for LUs this
//! nexus may access (a copy must not reach an LU its initiator could not read or write).

use crate::outcome::{invalid_cdb, invalid_param};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use sliver_volume::VolumeError;

use crate::cdb::{opcode, Command, CopyResultsAction};
use crate::lu::LogicalUnit;
use crate::outcome::{data_out_prefix, truncated, Done, Failure, Outcome};
use crate::range_lock::lock_unpoisoned;
use crate::{CopyTargets, Nexus, Request, Sense, SenseReason, Status};

/// MAXIMUM CSCD DESCRIPTOR COUNT we advertise and accept.
pub const MAX_CSCD_DESCRIPTORS: u16 = 64;
/// MAXIMUM SEGMENT DESCRIPTOR COUNT we advertise and accept.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 64;
/// MAXIMUM DESCRIPTOR LIST LENGTH: the most CSCD descriptors (32 bytes each) plus the most
/// segment descriptors (at most 32 bytes each).
pub const MAX_DESCRIPTOR_LIST_BYTES: u32 = 4096;
/// MAXIMUM SEGMENT LENGTH in bytes: a full 02h segment (65535 blocks) of 4096-byte blocks fits,
/// and so does ESXi's largest XCOPY transfer size (240 MiB).
pub const MAX_SEGMENT_BYTES: u32 = 256 << 20;
/// Finished copy results kept per LU for RECEIVE COPY RESULTS; the oldest goes first. Copies
/// still running are never dropped. Also what we report as concurrent copies supported.
const RETAINED_RESULTS: usize = 64;

/// Parameter list header (SPC-4 6.4.3.1).
const HEADER_LEN: usize = 16;
/// CSCD descriptor sizes: most types are 32 bytes, IPv6 (EAh) and IP copy service (EBh) 64.
const CSCD_LEN: usize = 32;
const CSCD_LONG_LEN: usize = 64;
/// Bytes before a segment descriptor's DESCRIPTOR LENGTH starts counting.
const SEGMENT_HEADER_LEN: usize = 4;

/// Descriptor type codes.
pub(crate) const CSCD_IDENTIFICATION: u8 = 0xe4;
const CSCD_IPV6: u8 = 0xea;
const CSCD_IP_COPY_SERVICE: u8 = 0xeb;
const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
const SEGMENT_BLOCK_TO_BLOCK_OFFSETS: u8 = 0x0a;
/// DESCRIPTOR LENGTH of each segment type we accept.
const BLOCK_TO_BLOCK_LEN: u16 = 0x18;
const BLOCK_TO_BLOCK_OFFSETS_LEN: u16 = 0x1c;
/// Type codes in OPERATING PARAMETERS and VPD 0x8F, segment types first.
const IMPLEMENTED_DESCRIPTORS: [u8; 3] = [
    SEGMENT_BLOCK_TO_BLOCK,
    SEGMENT_BLOCK_TO_BLOCK_OFFSETS,
    CSCD_IDENTIFICATION,
];

/// Designator header fields an LU's NAA designator carries (SPC-4 7.8.6.1).
const DESIGNATOR_TYPE_NAA: u8 = 0x3;
const ASSOCIATION_LU: u8 = 0x0;
const NAA_LEN: usize = 16;

/// A sense for a descriptor-level problem, pointing at `byte` of the parameter list. For COPY
/// ABORTED the same bytes are the segment pointer format with SD = 0 (SPC-4 4.5.2.4.5).
pub(crate) fn at_param(reason: SenseReason, byte: usize) -> Failure {
    Sense::from(reason)
        .with_field_pointer(false, pointer(byte), None)
        .into()
}

/// COPY ABORTED, COPY TARGET DEVICE NOT REACHABLE: hosts fall back to copying themselves.
/// libiscsi (like LIO) also expects it for segments whose ranges do not fit.
fn unreachable(byte: usize) -> Failure {
    at_param(SenseReason::CopyTargetDeviceNotReachable, byte)
}

fn pointer(byte: usize) -> u16 {
    u16::try_from(byte).unwrap_or(u16::MAX)
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(&[x, y]) => u16::from_be_bytes([x, y]),
        _ => 0,
    }
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[w, x, y, z]) => u32::from_be_bytes([w, x, y, z]),
        _ => 0,
    }
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(0, u64::from_be_bytes)
}

/// An upper bound on the bytes an EXTENDED COPY parameter list moves, for a server deciding
/// where to run the command before it runs: `None` when the list does not parse (the command
/// then fails at once). Block counts are taken at the largest block size a volume may have
/// (4096 bytes), so the bound holds whichever volumes the descriptors name.
pub(crate) fn copy_bytes_at_most(param_list: &[u8]) -> Option<u64> {
    const LARGEST_BLOCK: u64 = 4096;
    let list = parse_parameter_list(param_list).ok()?;
    Some(
        list.segments
            .iter()
            .map(|s| match s.length {
                SegmentLength::Blocks(n) => u64::from(n) * LARGEST_BLOCK,
                // The offsets can make the transfer touch one more block at each end.
                SegmentLength::Bytes { bytes, .. } => u64::from(bytes) + 2 * LARGEST_BLOCK,
            })
            .sum(),
    )
}

pub(crate) fn execute(lu: &LogicalUnit, req: &Request, cmd: &Command) -> Outcome {
    match *cmd {
        Command::ExtendedCopy { param_len } => extended_copy(lu, req, param_len),
        Command::ReceiveCopyResults {
            action,
            list_id,
            alloc_len,
        } => {
            let data = match action {
                CopyResultsAction::CopyStatus => copy_status(lu, req.nexus, list_id)?,
                CopyResultsAction::OperatingParameters => operating_parameters(lu),
                CopyResultsAction::FailedSegmentDetails => {
                    failed_segment_details(lu, req.nexus, list_id)?
                }
            };
            Ok(Done::data(truncated(data, alloc_len)))
        }
        _ => Err(SenseReason::InvalidOpcode.into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Parameter list parsing (no LU state, no I/O)

/// One identification CSCD descriptor (E4h).
#[derive(Debug)]
struct Cscd {
    /// Offset of the descriptor in the parameter list, for sense field pointers.
    at: usize,
    /// The designator, if it is a 16-byte NAA designator of an LU: only those name our LUs.
    naa: Option<[u8; NAA_LEN]>,
    /// DISK BLOCK LENGTH from the block device type specific parameters.
    block_length: u32,
}

#[derive(Debug, Clone, Copy)]
enum SegmentLength {
    /// 02h: NUMBER OF BLOCKS (with equal block sizes, DC does not change its meaning).
    Blocks(u16),
    /// 0Ah: NUMBER OF BYTES and the byte offsets into the first source and destination block.
    Bytes {
        bytes: u32,
        src_offset: u16,
        dst_offset: u16,
    },
}

/// One block-to-block segment descriptor.
#[derive(Debug)]
struct Segment {
    /// Offset of the descriptor in the parameter list, for sense field pointers.
    at: usize,
    src: u16,
    dst: u16,
    length: SegmentLength,
    src_lba: u64,
    dst_lba: u64,
}

/// Segment descriptor field offsets, relative to the descriptor.
const SEG_SRC_INDEX: usize = 4;
const SEG_DST_INDEX: usize = 6;
const SEG_BYTES: usize = 8;
const SEG_BLOCKS: usize = 10;
const SEG_SRC_LBA: usize = 12;
const SEG_DST_LBA: usize = 20;
const SEG_SRC_OFFSET: usize = 28;
const SEG_DST_OFFSET: usize = 30;
/// CSCD descriptor field offsets, relative to the descriptor.
const CSCD_DEVICE_TYPE: usize = 1;
const CSCD_DESIGNATOR: usize = 4;
const CSCD_BLOCK_LENGTH: usize = 29;

#[derive(Debug)]
struct ParameterList {
    list_id: u8,
    /// LIST ID USAGE 00b or 10b: the outcome is kept for RECEIVE COPY RESULTS. 11b: the list
    /// identifier is not used and nothing is kept.
    tracked: bool,
    cscds: Vec<Cscd>,
    segments: Vec<Segment>,
}

/// Parse and check the whole parameter list (SPC-4 6.4.3). Errors are ILLEGAL REQUEST.
fn parse_parameter_list(p: &[u8]) -> Result<ParameterList, Failure> {
    let Some(header) = p.get(..HEADER_LEN) else {
        return Err(SenseReason::ParameterListLengthError.into());
    };
    let list_id = header[0];
    let tracked = match (header[1] >> 3) & 0x3 {
        0b00 | 0b10 => true,
        0b11 => false,
        _ => return Err(invalid_param(1, Some(4))), // 01b is reserved
    };
    let cscd_list_len = be16(header, 2) as usize;
    let segment_list_len = be32(header, 8) as usize;
    let inline_len = be32(header, 12) as usize;
    // Both lengths come from at most 48 bits of input: no overflow in usize on 64-bit, and
    // checked anyway so 32-bit targets stay correct.
    let descriptors_len = cscd_list_len
        .checked_add(segment_list_len)
        .ok_or(SenseReason::ParameterListLengthError)?;
    if descriptors_len > MAX_DESCRIPTOR_LIST_BYTES as usize {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    let needed = HEADER_LEN
        .checked_add(descriptors_len)
        .and_then(|n| n.checked_add(inline_len))
        .ok_or(SenseReason::ParameterListLengthError)?;
    if needed > p.len() {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    if inline_len != 0 {
        return Err(invalid_param(12, None)); // MAXIMUM INLINE DATA LENGTH is 0
    }
    let segments_at = HEADER_LEN + cscd_list_len;
    let cscd_bytes = p.get(HEADER_LEN..segments_at).unwrap_or_default();
    let segment_bytes = p
        .get(segments_at..segments_at + segment_list_len)
        .unwrap_or_default();
    Ok(ParameterList {
        list_id,
        tracked,
        cscds: parse_cscds(cscd_bytes, HEADER_LEN)?,
        segments: parse_segments(segment_bytes, segments_at)?,
    })
}

/// The CSCD descriptor list; `base` is its offset in the parameter list.
fn parse_cscds(list: &[u8], base: usize) -> Result<Vec<Cscd>, Failure> {
    let mut cscds = Vec::new();
    let mut at = 0;
    while at < list.len() {
        if cscds.len() >= MAX_CSCD_DESCRIPTORS as usize {
            return Err(at_param(SenseReason::TooManyTargetDescriptors, base + at));
        }
        let code = list[at];
        let len = match code {
            CSCD_IPV6 | CSCD_IP_COPY_SERVICE => CSCD_LONG_LEN,
            _ => CSCD_LEN,
        };
        if code != CSCD_IDENTIFICATION {
            return Err(at_param(
                SenseReason::UnsupportedTargetDescriptorType,
                base + at,
            ));
        }
        let Some(d) = list.get(at..at + len) else {
            // The list length ends inside a descriptor.
            return Err(invalid_param(2, None));
        };
        // Only block devices: segment types 02h and 0Ah copy between them. LU ID TYPE is
        // ignored (SPC-4) and so is the obsolete NUL bit.
        if d[CSCD_DEVICE_TYPE] & 0x1f != 0 {
            return Err(invalid_param(base + at + CSCD_DEVICE_TYPE, Some(4)));
        }
        // The designation descriptor occupies bytes 4..24: a 4-byte header and at most 16
        // bytes of designator.
        let designator = &d[CSCD_DESIGNATOR..CSCD_DESIGNATOR + 20];
        let designator_len = designator[3] as usize;
        if designator_len > 16 {
            return Err(invalid_param(base + at + CSCD_DESIGNATOR + 3, None));
        }
        let association = (designator[1] >> 4) & 0x3;
        let designator_type = designator[1] & 0x0f;
        let naa = (designator_type == DESIGNATOR_TYPE_NAA
            && association == ASSOCIATION_LU
            && designator_len == NAA_LEN)
            .then(|| <[u8; NAA_LEN]>::try_from(&designator[4..4 + NAA_LEN]).ok())
            .flatten();
        let block_length = u32::from_be_bytes([
            0,
            d[CSCD_BLOCK_LENGTH],
            d[CSCD_BLOCK_LENGTH + 1],
            d[CSCD_BLOCK_LENGTH + 2],
        ]);
        cscds.push(Cscd {
            at: base + at,
            naa,
            block_length,
        });
        at += len;
    }
    Ok(cscds)
}

/// The segment descriptor list; `base` is its offset in the parameter list.
fn parse_segments(list: &[u8], base: usize) -> Result<Vec<Segment>, Failure> {
    let mut segments = Vec::new();
    let mut at = 0;
    while at < list.len() {
        if segments.len() >= MAX_SEGMENT_DESCRIPTORS as usize {
            return Err(at_param(SenseReason::TooManySegmentDescriptors, base + at));
        }
        let code = list[at];
        let expected_len = match code {
            SEGMENT_BLOCK_TO_BLOCK => BLOCK_TO_BLOCK_LEN,
            SEGMENT_BLOCK_TO_BLOCK_OFFSETS => BLOCK_TO_BLOCK_OFFSETS_LEN,
            _ => {
                return Err(at_param(
                    SenseReason::UnsupportedSegmentDescriptorType,
                    base + at,
                ))
            }
        };
        if list.len() - at < SEGMENT_HEADER_LEN {
            return Err(invalid_param(8, None)); // list length ends inside a descriptor
        }
        if be16(list, at + 2) != expected_len {
            return Err(invalid_param(base + at + 2, None));
        }
        let len = SEGMENT_HEADER_LEN + expected_len as usize;
        let Some(d) = list.get(at..at + len) else {
            return Err(invalid_param(8, None));
        };
        let length = if code == SEGMENT_BLOCK_TO_BLOCK {
            SegmentLength::Blocks(be16(d, SEG_BLOCKS))
        } else {
            let bytes = be32(d, SEG_BYTES);
            if bytes > MAX_SEGMENT_BYTES {
                return Err(invalid_param(base + at + SEG_BYTES, None));
            }
            SegmentLength::Bytes {
                bytes,
                src_offset: be16(d, SEG_SRC_OFFSET),
                dst_offset: be16(d, SEG_DST_OFFSET),
            }
        };
        segments.push(Segment {
            at: base + at,
            src: be16(d, SEG_SRC_INDEX),
            dst: be16(d, SEG_DST_INDEX),
            length,
            src_lba: be64(d, SEG_SRC_LBA),
            dst_lba: be64(d, SEG_DST_LBA),
        });
        at += len;
    }
    Ok(segments)
}

// ---------------------------------------------------------------------------------------------
// Resolving copy targets and planning the copy (LU state, no I/O)

/// A copy target: the LU that received the command, or one found through [`CopyTargets`].
#[derive(Clone)]
pub(crate) enum Target<'a> {
    Receiving(&'a LogicalUnit),
    Other(Arc<LogicalUnit>),
}

impl std::ops::Deref for Target<'_> {
    type Target = LogicalUnit;
    fn deref(&self) -> &LogicalUnit {
        match self {
            Target::Receiving(lu) => lu,
            Target::Other(lu) => lu,
        }
    }
}

/// One segment, resolved and checked, ready to copy.
pub(crate) struct Step<'a> {
    pub src: Target<'a>,
    pub dst: Target<'a>,
    pub src_lba: u64,
    pub dst_lba: u64,
    pub blocks: u64,
    pub bytes: u64,
}

fn resolve<'a>(
    lu: &'a LogicalUnit,
    targets: &dyn CopyTargets,
    cscd: &Cscd,
) -> Result<Target<'a>, Failure> {
    let target = match cscd.naa {
        Some(naa) if naa == lu.naa() => Target::Receiving(lu),
        Some(naa) => targets
            .find_by_naa(&naa)
            .map(Target::Other)
            .ok_or_else(|| unreachable(cscd.at + CSCD_DESIGNATOR))?,
        None => return Err(unreachable(cscd.at + CSCD_DESIGNATOR)),
    };
    if cscd.block_length != target.volume.block_size() {
        return Err(invalid_param(cscd.at + CSCD_BLOCK_LENGTH, None));
    }
    Ok(target)
}

/// Another LU is used on behalf of this nexus: its reservations and state apply as if the
/// nexus read or wrote it directly. (The receiving LU was checked by the dispatcher.)
pub(crate) fn check_other_lu(
    target: &Target,
    nexus: &Nexus,
    write: bool,
    at: usize,
) -> Result<(), Failure> {
    let Target::Other(other) = target else {
        return Ok(());
    };
    let mut cdb = [0u8; 16];
    cdb[0] = if write {
        opcode::WRITE_16
    } else {
        opcode::READ_16
    };
    if other.reservations.check_access(nexus, &cdb).is_err()
        || other.sanitizing.load(std::sync::atomic::Ordering::Acquire)
    {
        return Err(unreachable(at));
    }
    Ok(())
}

/// Resolve every segment's copy targets and check every range before any data moves.
fn plan<'a>(
    lu: &'a LogicalUnit,
    req: &Request,
    list: &ParameterList,
) -> Result<Vec<Step<'a>>, Failure> {
    let mut resolved: Vec<Option<Target<'a>>> = vec![None; list.cscds.len()];
    let mut target = |index: u16, field: usize| -> Result<Target<'a>, Failure> {
        let i = index as usize;
        let (Some(slot), Some(cscd)) = (resolved.get_mut(i), list.cscds.get(i)) else {
            // An index past the CSCD list names nothing we could reach.
            return Err(unreachable(field));
        };
        if slot.is_none() {
            *slot = Some(resolve(lu, req.copy_targets, cscd)?);
        }
        slot.clone().ok_or_else(|| unreachable(field))
    };
    let mut steps = Vec::with_capacity(list.segments.len());
    for seg in &list.segments {
        let src = target(seg.src, seg.at + SEG_SRC_INDEX)?;
        let dst = target(seg.dst, seg.at + SEG_DST_INDEX)?;
        let block_size = src.volume.block_size();
        if dst.volume.block_size() != block_size {
            return Err(invalid_param(seg.at + SEG_DST_INDEX, None));
        }
        let bs = block_size.max(1) as u64;
        let (blocks, length_field) = match seg.length {
            SegmentLength::Blocks(n) => (n as u64, seg.at + SEG_BLOCKS),
            SegmentLength::Bytes {
                bytes,
                src_offset,
                dst_offset,
            } => {
                // Byte-granular copies would need read-modify-write of partial blocks; hosts
                // copying whole blocks never ask for them.
                if src_offset != 0 {
                    return Err(invalid_param(seg.at + SEG_SRC_OFFSET, None));
                }
                if dst_offset != 0 {
                    return Err(invalid_param(seg.at + SEG_DST_OFFSET, None));
                }
                if !(bytes as u64).is_multiple_of(bs) {
                    return Err(invalid_param(seg.at + SEG_BYTES, None));
                }
                (bytes as u64 / bs, seg.at + SEG_BYTES)
            }
        };
        let bytes = blocks * bs; // at most 2^32 * 2^16: no overflow
        if bytes > MAX_SEGMENT_BYTES as u64 {
            return Err(invalid_param(length_field, None));
        }
        if src.volume.check_range(seg.src_lba, blocks).is_err() {
            return Err(unreachable(seg.at + SEG_SRC_LBA));
        }
        if dst.volume.check_range(seg.dst_lba, blocks).is_err() {
            return Err(unreachable(seg.at + SEG_DST_LBA));
        }
        check_other_lu(&src, req.nexus, false, seg.at + SEG_SRC_INDEX)?;
        check_other_lu(&dst, req.nexus, true, seg.at + SEG_DST_INDEX)?;
        if dst.mode.write_protected() {
            return Err(SenseReason::WriteProtected.into());
        }
        steps.push(Step {
            src,
            dst,
            src_lba: seg.src_lba,
            dst_lba: seg.dst_lba,
            blocks,
            bytes,
        });
    }
    Ok(steps)
}

// ---------------------------------------------------------------------------------------------
// Copying

/// Sense for a volume failure in the middle of a copy. Out of space keeps its own sense (thin
/// provisioning hosts react to it); anything else aborts the copy so the host falls back.
pub(crate) fn copy_failure(e: VolumeError) -> Failure {
    match e {
        VolumeError::NoSpace => SenseReason::SpaceAllocationFailedWriteProtect.into(),
        VolumeError::ReadOnly => SenseReason::WriteProtected.into(),
        // An unreadable source block too: the host's fallback copy then reads it itself and
        // gets the MEDIUM ERROR naming the block.
        VolumeError::OutOfRange { .. }
        | VolumeError::Poisoned(_)
        | VolumeError::Unreadable { .. }
        | VolumeError::Io(_) => SenseReason::CopyTargetDeviceNotReachable.into(),
    }
}

pub(crate) fn run_steps(steps: &[Step], progress: impl Fn(usize, u64)) -> Result<u64, Failure> {
    let mut copied = 0u64;
    for (i, step) in steps.iter().enumerate() {
        if step.blocks > 0 {
            // Writes to the destination range wait for the copy, as for any other write. Only
            // one range lock is held at a time, so copies in opposite directions between two
            // LUs, or within one LU, cannot deadlock.
            let _lock = step.dst.locks.lock(step.dst_lba, step.blocks);
            step.dst
                .volume
                .copy_from(
                    step.src.volume.as_ref(),
                    step.src_lba,
                    step.dst_lba,
                    step.blocks,
                )
                .map_err(copy_failure)?;
            if !step.dst.mode.write_cache() {
                step.dst.volume.flush().map_err(copy_failure)?;
            }
        }
        copied += step.bytes;
        step.src.stats.clone_read.fetch_add(1, Relaxed);
        step.dst.stats.clone_write.fetch_add(1, Relaxed);
        step.dst.stats.cloned_bytes.fetch_add(step.bytes, Relaxed);
        progress(i + 1, copied);
    }
    Ok(copied)
}

fn extended_copy(lu: &LogicalUnit, req: &Request, param_len: usize) -> Outcome {
    // SPC-4 6.4.1: a zero-length parameter list copies nothing and is not an error.
    if param_len == 0 {
        return Ok(Done::good());
    }
    // Longer than the largest list we accept (no inline data): refuse before looking at it.
    if param_len > HEADER_LEN + MAX_DESCRIPTOR_LIST_BYTES as usize {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    let params = data_out_prefix(req.data_out, param_len)?;
    let list = parse_parameter_list(params)?;
    let ticket = if list.tracked {
        Some(lu.copy_results.begin(req.nexus, list.list_id))
    } else {
        None
    };
    let outcome = plan(lu, req, &list).and_then(|steps| {
        run_steps(&steps, |segments, bytes| {
            if let Some(t) = ticket {
                lu.copy_results.progress(t, segments, bytes);
            }
        })
    });
    if let Some(t) = ticket {
        lu.copy_results.finish(t, &outcome);
    }
    outcome.map(Done::affected)
}

// ---------------------------------------------------------------------------------------------
// Copy results

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyState {
    InProgress,
    Succeeded,
    /// Ended with this status (CHECK CONDITION carries sense).
    Failed(Status, Option<Sense>),
}

#[derive(Debug, Clone)]
struct CopyRecord {
    ticket: u64,
    initiator_port: String,
    relative_target_port: u16,
    list_id: u8,
    state: CopyState,
    segments_processed: usize,
    bytes_copied: u64,
}

impl CopyRecord {
    fn is(&self, nexus: &Nexus, list_id: u8) -> bool {
        self.list_id == list_id && self.belongs_to(nexus)
    }

    fn belongs_to(&self, nexus: &Nexus) -> bool {
        self.initiator_port == nexus.initiator_port
            && self.relative_target_port == nexus.relative_target_port
    }
}

#[derive(Default)]
struct Records {
    list: VecDeque<CopyRecord>,
    next_ticket: u64,
}

/// Outcomes of recent EXTENDED COPY commands of one LU, by (I_T nexus, LIST IDENTIFIER).
#[derive(Default)]
pub(crate) struct CopyResults {
    records: Mutex<Records>,
}

impl CopyResults {
    /// Register a copy about to run; it replaces any record with the same nexus and list
    /// identifier. SPC-4 6.4.1 wants a duplicate of a running copy refused with OPERATION IN
    /// PROGRESS, but QEMU issues every copy with LIST IDENTIFIER 1 from up to 8 coroutines at
    /// once and does not fall back, and we hold no data a duplicate could confuse: the later
    /// copy runs and its result is the one reported.
    fn begin(&self, nexus: &Nexus, list_id: u8) -> u64 {
        let mut records = lock_unpoisoned(&self.records);
        records.list.retain(|r| !r.is(nexus, list_id));
        let ticket = records.next_ticket;
        records.next_ticket += 1;
        records.list.push_back(CopyRecord {
            ticket,
            initiator_port: nexus.initiator_port.clone(),
            relative_target_port: nexus.relative_target_port,
            list_id,
            state: CopyState::InProgress,
            segments_processed: 0,
            bytes_copied: 0,
        });
        while records.list.len() > RETAINED_RESULTS {
            let Some(oldest_finished) = records
                .list
                .iter()
                .position(|r| r.state != CopyState::InProgress)
            else {
                break;
            };
            records.list.remove(oldest_finished);
        }
        ticket
    }

    fn update(&self, ticket: u64, f: impl FnOnce(&mut CopyRecord)) {
        let mut records = lock_unpoisoned(&self.records);
        // Absent if the nexus went away, the LU was reset, or the list identifier was reused
        // meanwhile.
        if let Some(r) = records.list.iter_mut().find(|r| r.ticket == ticket) {
            f(r);
        }
    }

    fn progress(&self, ticket: u64, segments: usize, bytes: u64) {
        self.update(ticket, |r| {
            r.segments_processed = segments;
            r.bytes_copied = bytes;
        });
    }

    fn finish(&self, ticket: u64, outcome: &Result<u64, Failure>) {
        let state = match outcome {
            Ok(_) => CopyState::Succeeded,
            Err(Failure::Check(sense)) => CopyState::Failed(Status::CheckCondition, Some(*sense)),
            Err(Failure::Conflict) => CopyState::Failed(Status::ReservationConflict, None),
        };
        self.update(ticket, |r| r.state = state);
    }

    fn find(&self, nexus: &Nexus, list_id: u8) -> Option<CopyRecord> {
        lock_unpoisoned(&self.records)
            .list
            .iter()
            .find(|r| r.is(nexus, list_id))
            .cloned()
    }

    /// The nexus is gone: its copy results go with it.
    pub(crate) fn nexus_lost(&self, nexus: &Nexus) {
        lock_unpoisoned(&self.records)
            .list
            .retain(|r| !r.belongs_to(nexus));
    }

    /// A reset discards all copy results.
    pub(crate) fn clear(&self) {
        lock_unpoisoned(&self.records).list.clear();
    }
}

/// TRANSFER COUNT UNITS and TRANSFER COUNT (SPC-4 6.18.3): the smallest power-of-1024 unit in
/// which the byte count fits 32 bits.
fn transfer_count(bytes: u64) -> (u8, u32) {
    let mut units = 0u8;
    let mut count = bytes;
    while count > u32::MAX as u64 {
        count >>= 10;
        units += 1;
    }
    (units, count as u32)
}

/// RECEIVE COPY RESULTS, COPY STATUS.
fn copy_status(lu: &LogicalUnit, nexus: &Nexus, list_id: u8) -> Result<Vec<u8>, Failure> {
    let record = lu
        .copy_results
        .find(nexus, list_id)
        .ok_or_else(|| invalid_cdb(2, None))?;
    let mut d = vec![0u8; 12];
    d[0..4].copy_from_slice(&8u32.to_be_bytes()); // AVAILABLE DATA
    d[4] = match record.state {
        CopyState::InProgress => 0x00,
        CopyState::Succeeded => 0x01,
        CopyState::Failed(..) => 0x02,
    }; // HDD = 0: no held data was discarded
    let segments = u16::try_from(record.segments_processed).unwrap_or(u16::MAX);
    d[5..7].copy_from_slice(&segments.to_be_bytes());
    let (units, count) = transfer_count(record.bytes_copied);
    d[7] = units;
    d[8..12].copy_from_slice(&count.to_be_bytes());
    Ok(d)
}

/// RECEIVE COPY RESULTS, OPERATING PARAMETERS (SPC-4 6.18.4).
fn operating_parameters(lu: &LogicalUnit) -> Vec<u8> {
    let mut d = vec![0u8; 44];
    d[4] = 0x01; // SNLID: LIST ID USAGE 11b (no list identifier) is supported
    d[8..10].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    d[10..12].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    d[12..16].copy_from_slice(&MAX_DESCRIPTOR_LIST_BYTES.to_be_bytes());
    d[16..20].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    // MAXIMUM INLINE DATA LENGTH, HELD DATA LIMIT, MAXIMUM STREAM DEVICE TRANSFER SIZE: 0.
    d[34..36].copy_from_slice(&(RETAINED_RESULTS as u16).to_be_bytes());
    d[36] = RETAINED_RESULTS as u8; // MAXIMUM CONCURRENT COPIES
    d[37] = data_segment_granularity(lu);
    // INLINE DATA GRANULARITY and HELD DATA GRANULARITY: 0 (none taken, none held).
    d[43] = IMPLEMENTED_DESCRIPTORS.len() as u8;
    d.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    d
}

/// log2 of the smallest unit a segment may copy: one logical block.
fn data_segment_granularity(lu: &LogicalUnit) -> u8 {
    lu.volume.block_size().max(1).trailing_zeros() as u8
}

/// RECEIVE COPY RESULTS, FAILED SEGMENT DETAILS (SPC-4 6.18.5). While the copy runs there are
/// no details (AVAILABLE DATA 0); a successful copy reports status GOOD without sense.
fn failed_segment_details(
    lu: &LogicalUnit,
    nexus: &Nexus,
    list_id: u8,
) -> Result<Vec<u8>, Failure> {
    let record = lu
        .copy_results
        .find(nexus, list_id)
        .ok_or_else(|| invalid_cdb(2, None))?;
    let (status, sense) = match record.state {
        CopyState::InProgress => return Ok(vec![0; 4]),
        CopyState::Succeeded => (Status::Good, Vec::new()),
        CopyState::Failed(status, sense) => {
            let sense = match sense {
                Some(s) if lu.mode.descriptor_sense() => s.to_descriptor(),
                Some(s) => s.to_fixed(),
                None => Vec::new(),
            };
            (status, sense)
        }
    };
    let mut d = vec![0u8; 60];
    d[56] = status as u8; // COPY COMMAND STATUS
    d[58..60].copy_from_slice(&(sense.len() as u16).to_be_bytes());
    d.extend_from_slice(&sense);
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// Third-party Copy VPD page (SPC-4 7.8.17)

/// Third-party copy descriptor type codes.
const TPC_BLOCK_DEVICE_ROD_LIMITS: u16 = 0x0000;
const TPC_SUPPORTED_COMMANDS: u16 = 0x0001;
const TPC_PARAMETER_DATA: u16 = 0x0004;
const TPC_SUPPORTED_DESCRIPTORS: u16 = 0x0008;
const TPC_SUPPORTED_CSCD_IDS: u16 = 0x000c;
const TPC_ROD_TOKEN_FEATURES: u16 = 0x0106;
const TPC_SUPPORTED_ROD_TYPES: u16 = 0x0108;
const TPC_GENERAL_COPY_OPERATIONS: u16 = 0x8001;

/// One third-party copy descriptor, its body padded to a multiple of 4 bytes.
pub(crate) fn tpc_descriptor(out: &mut Vec<u8>, kind: u16, mut body: Vec<u8>) {
    body.resize(body.len().next_multiple_of(4), 0);
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(u16::try_from(body.len()).unwrap_or(u16::MAX)).to_be_bytes());
    out.extend_from_slice(&body);
}

/// The page body (after the 4-byte VPD header). The token copy limits come first: Windows
/// looks for them before using ODX.
pub(crate) fn third_party_copy_page(lu: &LogicalUnit) -> Vec<u8> {
    let mut page = Vec::new();

    tpc_descriptor(
        &mut page,
        TPC_BLOCK_DEVICE_ROD_LIMITS,
        crate::token::block_device_rod_limits(lu),
    );

    let commands = [
        opcode::EXTENDED_COPY,
        3,
        opcode::SA_EXTENDED_COPY_LID1,
        opcode::SA_POPULATE_TOKEN,
        opcode::SA_WRITE_USING_TOKEN,
        opcode::RECEIVE_COPY_RESULTS,
        4,
        opcode::SA_COPY_STATUS,
        opcode::SA_OPERATING_PARAMETERS,
        opcode::SA_FAILED_SEGMENT_DETAILS,
        opcode::SA_RECEIVE_ROD_TOKEN_INFORMATION,
    ];
    let mut body = vec![commands.len() as u8];
    body.extend_from_slice(&commands);
    tpc_descriptor(&mut page, TPC_SUPPORTED_COMMANDS, body);

    let mut body = vec![0u8; 28];
    body[4..6].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    body[6..8].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    body[8..12].copy_from_slice(&MAX_DESCRIPTOR_LIST_BYTES.to_be_bytes());
    // MAXIMUM INLINE DATA LENGTH (body 12..16): 0.
    tpc_descriptor(&mut page, TPC_PARAMETER_DATA, body);

    let mut body = vec![IMPLEMENTED_DESCRIPTORS.len() as u8];
    body.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
    tpc_descriptor(&mut page, TPC_SUPPORTED_DESCRIPTORS, body);

    // No CSCD descriptor IDs (such as FFFFh, "this copy manager") are supported.
    tpc_descriptor(&mut page, TPC_SUPPORTED_CSCD_IDS, vec![0, 0]);

    tpc_descriptor(
        &mut page,
        TPC_ROD_TOKEN_FEATURES,
        crate::token::rod_token_features(lu),
    );

    tpc_descriptor(
        &mut page,
        TPC_SUPPORTED_ROD_TYPES,
        crate::token::supported_rod_types(),
    );

    let mut body = vec![0u8; 32];
    body[0..4].copy_from_slice(&(RETAINED_RESULTS as u32).to_be_bytes());
    body[4..8].copy_from_slice(&(RETAINED_RESULTS as u32).to_be_bytes());
    body[8..12].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    body[12] = data_segment_granularity(lu);
    tpc_descriptor(&mut page, TPC_GENERAL_COPY_OPERATIONS, body);

    page
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use sliver_volume::{BlockStatus, FileVolume, Volume};

    use super::*;
    use crate::{LuConfig, NoCopyTargets, Response, TaskAttr};

    pub(crate) const BS: usize = 512;
    pub(crate) const BLOCKS: u64 = 4096;

    /// LUs over files in a temporary directory; LU `i` has NAA `[0x60, i, i, ...]`.
    pub(crate) struct Array {
        _dir: tempfile::TempDir,
        pub lus: Vec<Arc<LogicalUnit>>,
    }

    pub(crate) fn naa(i: u8) -> [u8; 16] {
        let mut n = [i; 16];
        n[0] = 0x60;
        n
    }

    pub(crate) fn lu_over(volume: Arc<dyn Volume>, i: u8) -> Arc<LogicalUnit> {
        Arc::new(LogicalUnit::new(
            volume,
            LuConfig {
                vendor: "SLIVER".into(),
                product: "sliver".into(),
                revision: "0001".into(),
                serial: format!("serial-{i}"),
                naa: naa(i),
                target_name: "iqn.2024-01.io.sliver:t1".into(),
                target_port_group: 1,
                state_dir: None,
            },
        ))
    }

    pub(crate) fn array(count: u8) -> Array {
        let dir = tempfile::tempdir().unwrap();
        let lus = (0..count)
            .map(|i| {
                let path = dir.path().join(format!("lu{i}"));
                let volume = FileVolume::open(&path, BLOCKS * BS as u64, BS as u32).unwrap();
                lu_over(Arc::new(volume), i)
            })
            .collect();
        Array { _dir: dir, lus }
    }

    /// The LUs a nexus may reach, as the transport would supply them.
    pub(crate) struct Reachable(pub Vec<Arc<LogicalUnit>>);

    impl CopyTargets for Reachable {
        fn find_by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
            self.0.iter().find(|lu| lu.naa() == naa).cloned()
        }
    }

    pub(crate) fn nexus() -> Nexus {
        Nexus {
            initiator_port: "iqn.test:1,i,0x000000000001".into(),
            initiator_name: "iqn.test:1".into(),
            relative_target_port: 1,
        }
    }

    pub(crate) fn run(
        lu: &LogicalUnit,
        targets: &dyn CopyTargets,
        cdb: &[u8],
        data: &[u8],
    ) -> Response {
        let n = nexus();
        let req = Request {
            nexus: &n,
            cdb,
            data_out: data,
            attr: TaskAttr::Simple,
            luns: &[0, 1, 2],
            copy_targets: targets,
        };
        let r = lu.execute(&req);
        // Each LU reports POWER ON, RESET once per nexus; absorb it.
        if r.sense.get(12) == Some(&0x29) {
            return lu.execute(&req);
        }
        r
    }

    fn cscd(naa: [u8; 16], block_length: u32) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01; // binary
        d[5] = 0x03; // association LU, NAA
        d[7] = 16;
        d[8..24].copy_from_slice(&naa);
        d[29..32].copy_from_slice(&block_length.to_be_bytes()[1..]);
        d
    }

    fn b2b(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = 0x02;
        d[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        d
    }

    fn b2b_offsets(
        src: u16,
        dst: u16,
        bytes: u32,
        lbas: (u64, u64),
        offsets: (u16, u16),
    ) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0x0a;
        d[2..4].copy_from_slice(&0x1cu16.to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[8..12].copy_from_slice(&bytes.to_be_bytes());
        d[12..20].copy_from_slice(&lbas.0.to_be_bytes());
        d[20..28].copy_from_slice(&lbas.1.to_be_bytes());
        d[28..30].copy_from_slice(&offsets.0.to_be_bytes());
        d[30..32].copy_from_slice(&offsets.1.to_be_bytes());
        d
    }

    /// A parameter list with LIST ID USAGE `usage` (2 bits).
    fn params(list_id: u8, usage: u8, cscds: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
        let cscd_len: usize = cscds.iter().map(Vec::len).sum();
        let segment_len: usize = segments.iter().map(Vec::len).sum();
        let mut p = vec![0u8; 16];
        p[0] = list_id;
        p[1] = usage << 3;
        p[2..4].copy_from_slice(&(cscd_len as u16).to_be_bytes());
        p[8..12].copy_from_slice(&(segment_len as u32).to_be_bytes());
        p.extend(cscds.iter().flatten());
        p.extend(segments.iter().flatten());
        p
    }

    fn xcopy_cdb(len: usize) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = 0x83;
        c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
        c
    }

    fn xcopy(lu: &LogicalUnit, targets: &dyn CopyTargets, p: &[u8]) -> Response {
        run(lu, targets, &xcopy_cdb(p.len()), p)
    }

    fn results(lu: &LogicalUnit, action: u8, list_id: u8) -> Response {
        let mut c = [0u8; 16];
        c[0] = 0x84;
        c[1] = action;
        c[2] = list_id;
        c[10..14].copy_from_slice(&1024u32.to_be_bytes());
        run(lu, &NoCopyTargets, &c, &[])
    }

    pub(crate) fn good(r: &Response) {
        assert_eq!(r.status, Status::Good, "sense {:02x?}", r.sense);
    }

    /// (key, ASC, ASCQ) from fixed-format sense.
    pub(crate) fn sense(r: &Response) -> (u8, u8, u8) {
        assert_eq!(r.status, Status::CheckCondition, "{r:?}");
        (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
    }

    const COPY_TARGET_NOT_REACHABLE: (u8, u8, u8) = (0xa, 0x0d, 0x02);
    const PARAMETER_LIST_LENGTH_ERROR: (u8, u8, u8) = (0x5, 0x1a, 0x00);
    const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8, u8) = (0x5, 0x26, 0x00);

    pub(crate) fn write(lu: &LogicalUnit, lba: u64, data: &[u8]) {
        lu.volume().write(lba, data).unwrap();
    }

    pub(crate) fn read(lu: &LogicalUnit, lba: u64, blocks: usize) -> Vec<u8> {
        let mut buf = vec![0u8; blocks * BS];
        lu.volume().read(lba, &mut buf).unwrap();
        buf
    }

    pub(crate) fn pattern(blocks: usize, seed: u8) -> Vec<u8> {
        (0..blocks * BS)
            .map(|i| (i / BS) as u8 ^ seed ^ (i as u8))
            .collect()
    }

    #[test]
    fn the_copy_bound_counts_every_segment_at_the_largest_block_size() {
        let targets = [cscd(naa(0), 512), cscd(naa(1), 512)];
        let one = params(0, 0b11, &targets, &[b2b(0, 1, 4096, 0, 0)]);
        assert_eq!(copy_bytes_at_most(&one), Some(4096 * 4096));
        let two = params(
            0,
            0b11,
            &targets,
            &[b2b(0, 1, 8, 0, 0), b2b_offsets(0, 1, 1000, (0, 0), (3, 7))],
        );
        assert_eq!(copy_bytes_at_most(&two), Some(8 * 4096 + 1000 + 2 * 4096));
        assert_eq!(copy_bytes_at_most(&one[..one.len() - 1]), None, "cut short");
        assert_eq!(copy_bytes_at_most(&[]), None);
    }

    #[test]
    fn copy_within_one_lu_and_its_copy_status() {
        let a = array(1);
        let lu = &a.lus[0];
        let data = pattern(100, 7);
        write(lu, 10, &data);
        let p = params(5, 0, &[cscd(naa(0), 512)], &[b2b(0, 0, 100, 10, 1000)]);
        good(&xcopy(lu, &NoCopyTargets, &p));
        assert!(read(lu, 1000, 100) == data);

        let r = results(lu, 0x00, 5);
        good(&r);
        assert_eq!(r.data_in.len(), 12);
        assert_eq!(u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()), 8);
        assert_eq!(r.data_in[4], 0x01, "completed without errors");
        assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 1);
        assert_eq!(r.data_in[7], 0, "bytes");
        assert_eq!(
            u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
            100 * 512
        );
        // No failure to detail: status GOOD, no sense.
        let r = results(lu, 0x04, 5);
        good(&r);
        assert_eq!(r.data_in.len(), 60);
        assert_eq!((r.data_in[56], r.data_in[58], r.data_in[59]), (0, 0, 0));
    }

    #[test]
    fn overlapping_copy_within_one_lu_is_a_memmove() {
        let a = array(1);
        let lu = &a.lus[0];
        let data = pattern(3000, 1);
        write(lu, 0, &data);
        // Destination overlaps the end of the source: a forward copy would re-read its own
        // output.
        let p = params(1, 0, &[cscd(naa(0), 512)], &[b2b(0, 0, 3000, 0, 500)]);
        good(&xcopy(lu, &NoCopyTargets, &p));
        assert!(read(lu, 500, 3000) == data);
    }

    #[test]
    fn copy_across_lus_in_both_directions_and_several_segments() {
        let a = array(3);
        let (receiving, other) = (&a.lus[0], &a.lus[1]);
        let reachable = Reachable(a.lus.clone());
        let data = pattern(64, 3);
        write(other, 0, &data);
        // QEMU's shape: sent to the destination LU, CSCD 0 = source, CSCD 1 = destination.
        let cscds = [cscd(naa(1), 512), cscd(naa(0), 512)];
        let p = params(1, 2, &cscds, &[b2b(0, 1, 64, 0, 200)]);
        good(&xcopy(receiving, &reachable, &p));
        assert!(read(receiving, 200, 64) == data);

        // Receiving LU as the source, other LUs as destinations, three segments.
        let cscds = [cscd(naa(0), 512), cscd(naa(1), 512), cscd(naa(2), 512)];
        let segments = [
            b2b(0, 1, 32, 200, 1000),
            b2b(0, 2, 32, 232, 2000),
            b2b(2, 1, 32, 2000, 1032),
        ];
        good(&xcopy(
            receiving,
            &reachable,
            &params(2, 0, &cscds, &segments),
        ));
        assert!(read(other, 1000, 64) == data);
        assert!(read(&a.lus[2], 2000, 32) == data[32 * BS..]);
        let r = results(receiving, 0x00, 2);
        good(&r);
        assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 3);

        // esxtop's CLONE_RD / CLONE_WR: segments read from and written to each LU.
        let vaai = |i: usize| a.lus[i].stats().vaai;
        assert_eq!((vaai(0).clone_read, vaai(0).clone_write), (2, 1));
        assert_eq!((vaai(1).clone_read, vaai(1).clone_write), (1, 2));
        assert_eq!((vaai(2).clone_read, vaai(2).clone_write), (1, 1));
        assert_eq!(vaai(1).cloned_bytes, 64 * BS as u64);
        assert_eq!(vaai(0).clone_failed, 0);
        let copies = receiving.stats();
        let c = copies.class(crate::CommandClass::ExtendedCopy);
        assert_eq!((c.commands, c.errors, c.bytes), (2, 0, 160 * BS as u64));
    }

    #[test]
    fn unreachable_copy_targets_abort_the_copy() {
        let a = array(2);
        let (receiving, other) = (&a.lus[0], &a.lus[1]);
        write(other, 0, &pattern(8, 9));
        let cscds = [cscd(naa(1), 512), cscd(naa(0), 512)];
        let p = params(1, 0, &cscds, &[b2b(0, 1, 8, 0, 0)]);
        // The LU exists but this nexus may not reach it: nothing found, nothing copied.
        assert_eq!(
            sense(&xcopy(receiving, &NoCopyTargets, &p)),
            COPY_TARGET_NOT_REACHABLE
        );
        assert!(read(receiving, 0, 8).iter().all(|&b| b == 0));
        // An NAA nobody has.
        let cscds = [cscd(naa(9), 512), cscd(naa(0), 512)];
        let p = params(1, 0, &cscds, &[b2b(0, 1, 8, 0, 0)]);
        let r = xcopy(receiving, &Reachable(a.lus.clone()), &p);
        assert_eq!(sense(&r), COPY_TARGET_NOT_REACHABLE);
        // The segment pointer (SD = 0) names the designator of CSCD 0.
        assert_eq!(r.sense[15], 0x80);
        assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 16 + 4);
        // A designator that is not an NAA LU designator cannot name one of our LUs.
        let mut t10 = cscd(naa(0), 512);
        t10[5] = 0x01;
        let p = params(1, 0, &[t10], &[b2b(0, 0, 8, 0, 8)]);
        assert_eq!(
            sense(&xcopy(receiving, &NoCopyTargets, &p)),
            COPY_TARGET_NOT_REACHABLE
        );
        // A CSCD index beyond the list (libiscsi ExtendedCopy.ValidateSegDescr).
        let p = params(1, 0, &[cscd(naa(0), 512)], &[b2b(0, 1, 8, 0, 8)]);
        assert_eq!(
            sense(&xcopy(receiving, &NoCopyTargets, &p)),
            COPY_TARGET_NOT_REACHABLE
        );
        // The failure is recorded for the list identifier.
        let r = results(receiving, 0x00, 1);
        good(&r);
        assert_eq!(r.data_in[4], 0x02);
        let vaai = receiving.stats().vaai;
        assert_eq!((vaai.clone_failed, vaai.clone_write), (4, 0));
    }

    #[test]
    fn other_lus_reservations_apply_to_the_copy() {
        let a = array(2);
        let (receiving, other) = (&a.lus[0], &a.lus[1]);
        let reachable = Reachable(a.lus.clone());
        // Another initiator holds LU 1 with RESERVE(6).
        let holder = Nexus {
            initiator_port: "iqn.test:2,i,0x000000000002".into(),
            initiator_name: "iqn.test:2".into(),
            relative_target_port: 1,
        };
        let reserve = |lu: &LogicalUnit| {
            lu.execute(&Request {
                nexus: &holder,
                cdb: &[0x16, 0, 0, 0, 0, 0],
                data_out: &[],
                attr: TaskAttr::Simple,
                luns: &[0, 1],
                copy_targets: &NoCopyTargets,
            })
        };
        reserve(other); // power-on unit attention
        good(&reserve(other));
        write(receiving, 0, &pattern(8, 4));
        let cscds = [cscd(naa(0), 512), cscd(naa(1), 512)];
        let p = params(1, 0, &cscds, &[b2b(0, 1, 8, 0, 0)]);
        assert_eq!(
            sense(&xcopy(receiving, &reachable, &p)),
            COPY_TARGET_NOT_REACHABLE
        );
        assert!(read(other, 0, 8).iter().all(|&b| b == 0));
    }

    #[test]
    fn ranges_are_checked_on_both_sides_before_any_copying() {
        let a = array(1);
        let lu = &a.lus[0];
        write(lu, 0, &pattern(16, 2));
        let t = [cscd(naa(0), 512)];
        // First segment fine, second out of range on the destination: nothing is copied.
        let segments = [b2b(0, 0, 16, 0, 100), b2b(0, 0, 16, 0, BLOCKS - 15)];
        let r = xcopy(lu, &NoCopyTargets, &params(1, 0, &t, &segments));
        assert_eq!(sense(&r), COPY_TARGET_NOT_REACHABLE);
        assert_eq!(
            u16::from_be_bytes([r.sense[16], r.sense[17]]) as usize,
            16 + 32 + 28 + 20
        );
        assert!(read(lu, 100, 16).iter().all(|&b| b == 0));
        let r = results(lu, 0x00, 1);
        assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 0);
        // Source side, and LBAs that overflow.
        for seg in [
            b2b(0, 0, 2, BLOCKS - 1, 0),
            b2b(0, 0, 2, u64::MAX, 0),
            b2b(0, 0, 2, 0, u64::MAX),
        ] {
            let r = xcopy(lu, &NoCopyTargets, &params(1, 0, &t, &[seg]));
            assert_eq!(sense(&r), COPY_TARGET_NOT_REACHABLE);
        }
        // Exactly up to the end is fine.
        good(&xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &t, &[b2b(0, 0, 16, 0, BLOCKS - 16)]),
        ));
    }

    #[test]
    fn descriptor_limits() {
        let a = array(1);
        let lu = &a.lus[0];
        let t = cscd(naa(0), 512);
        let s = b2b(0, 0, 1, 0, 1);
        let max_t = MAX_CSCD_DESCRIPTORS as usize;
        let max_s = MAX_SEGMENT_DESCRIPTORS as usize;
        // The advertised maxima are accepted together.
        good(&xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &vec![t.clone(); max_t], &vec![s.clone(); max_s]),
        ));
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &vec![t.clone(); max_t + 1], std::slice::from_ref(&s)),
        );
        assert_eq!(sense(&r), (0x5, 0x26, 0x06));
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, std::slice::from_ref(&t), &vec![s.clone(); max_s + 1]),
        );
        assert_eq!(sense(&r), (0x5, 0x26, 0x08));
        // Descriptor lists longer than MAXIMUM DESCRIPTOR LIST LENGTH (libiscsi's third case).
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &vec![t.clone(); max_t + 1], &vec![s; 73]),
        );
        assert_eq!(sense(&r), PARAMETER_LIST_LENGTH_ERROR);
        // Refused lists leave the result of the accepted one alone.
        let r = results(lu, 0x00, 1);
        good(&r);
        assert_eq!(r.data_in[4], 0x01);
        assert_eq!(
            u16::from_be_bytes([r.data_in[5], r.data_in[6]]),
            MAX_SEGMENT_DESCRIPTORS
        );
    }

    #[test]
    fn unsupported_descriptor_types() {
        let a = array(1);
        let lu = &a.lus[0];
        let mut fc = cscd(naa(0), 512);
        fc[0] = 0xe0;
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[fc], &[b2b(0, 0, 1, 0, 1)]),
        );
        assert_eq!(sense(&r), (0x5, 0x26, 0x07));
        assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 16);
        let ipv6 = {
            let mut d = vec![0u8; 64];
            d[0] = 0xea;
            d
        };
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[ipv6], &[b2b(0, 0, 1, 0, 1)]),
        );
        assert_eq!(sense(&r), (0x5, 0x26, 0x07));
        // Stream-to-stream (03h), as libiscsi ExtendedCopy.DescrType sends it.
        let mut stream = vec![0u8; 20];
        stream[0] = 0x03;
        stream[3] = 0x10;
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[cscd(naa(0), 512)], &[stream]),
        );
        assert_eq!(sense(&r), (0x5, 0x26, 0x09));
        // A known type with the wrong DESCRIPTOR LENGTH.
        let mut short = b2b(0, 0, 1, 0, 1);
        short[3] = 0x14;
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[cscd(naa(0), 512)], &[short]),
        );
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        // A non-block peripheral device type, and the wrong block length.
        let mut tape = cscd(naa(0), 512);
        tape[1] = 0x01;
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[tape], &[b2b(0, 0, 1, 0, 1)]),
        );
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[cscd(naa(0), 4096)], &[b2b(0, 0, 1, 0, 1)]),
        );
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        // LU ID TYPE is ignored (SPC-4), as libiscsi ExtendedCopy.ValidateTgtDescr expects.
        let mut lu_id = cscd(naa(0), 512);
        lu_id[1] = 0xc0;
        good(&xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &[lu_id], &[b2b(0, 0, 1, 0, 1)]),
        ));
    }

    #[test]
    fn parameter_list_lengths_and_header_fields() {
        let a = array(1);
        let lu = &a.lus[0];
        let p = params(1, 0, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]);
        // Zero length: nothing to do, not an error.
        good(&run(lu, &NoCopyTargets, &xcopy_cdb(0), &[]));
        // Truncating the CSCD list or the segment list (libiscsi ExtendedCopy.Param).
        for len in [10, 16 + 31, 16 + 32 + 27] {
            let r = run(lu, &NoCopyTargets, &xcopy_cdb(len), &p[..len]);
            assert_eq!(sense(&r), PARAMETER_LIST_LENGTH_ERROR, "{len}");
        }
        // Larger than any list we take.
        let huge = 16 + MAX_DESCRIPTOR_LIST_BYTES as usize + 1;
        let r = run(lu, &NoCopyTargets, &xcopy_cdb(huge), &vec![0; huge]);
        assert_eq!(sense(&r), PARAMETER_LIST_LENGTH_ERROR);
        // Data-Out shorter than the CDB says.
        let r = run(lu, &NoCopyTargets, &xcopy_cdb(p.len()), &p[..20]);
        assert_eq!(sense(&r), (0x5, 0x0e, 0x03));
        // Inline data is not taken.
        let mut inline = p.clone();
        inline[15] = 4;
        inline.extend_from_slice(&[0; 4]);
        let r = xcopy(lu, &NoCopyTargets, &inline);
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 12);
        // LIST ID USAGE 01b is reserved; 11b copies without keeping a result.
        let r = xcopy(
            lu,
            &NoCopyTargets,
            &params(7, 1, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]),
        );
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        good(&xcopy(
            lu,
            &NoCopyTargets,
            &params(7, 3, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]),
        ));
        assert_eq!(sense(&results(lu, 0x00, 7)), (0x5, 0x24, 0x00));
    }

    #[test]
    fn block_to_block_with_offsets_whole_blocks_only() {
        let a = array(1);
        let lu = &a.lus[0];
        let data = pattern(4, 5);
        write(lu, 40, &data);
        let t = [cscd(naa(0), 512)];
        good(&xcopy(
            lu,
            &NoCopyTargets,
            &params(1, 0, &t, &[b2b_offsets(0, 0, 2048, (40, 80), (0, 0))]),
        ));
        assert!(read(lu, 80, 4) == data);
        for (bytes, offsets, field) in [(2048, (1, 0), 28), (2048, (0, 3), 30), (2000, (0, 0), 8)] {
            let seg = b2b_offsets(0, 0, bytes, (40, 80), offsets);
            let r = xcopy(lu, &NoCopyTargets, &params(1, 0, &t, &[seg]));
            assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
            assert_eq!(
                u16::from_be_bytes([r.sense[16], r.sense[17]]) as usize,
                16 + 32 + field
            );
        }
        let too_long = b2b_offsets(0, 0, MAX_SEGMENT_BYTES + 512, (0, 0), (0, 0));
        let r = xcopy(lu, &NoCopyTargets, &params(1, 0, &t, &[too_long]));
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
    }

    /// A file volume for copy tests: writes at and beyond `fail_from` fail, and the first
    /// copy that reaches it runs `before_copy` first (after the copy command checked its
    /// parameters, before any data moved).
    pub(crate) struct ScriptedVolume {
        inner: FileVolume,
        fail_from: u64,
        before_copy: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    impl ScriptedVolume {
        pub(crate) fn new(inner: FileVolume) -> Self {
            ScriptedVolume {
                inner,
                fail_from: u64::MAX,
                before_copy: Mutex::new(None),
            }
        }
        pub(crate) fn failing_from(self, lba: u64) -> Self {
            ScriptedVolume {
                fail_from: lba,
                ..self
            }
        }
        pub(crate) fn before_copy(self, hook: impl FnOnce() + Send + 'static) -> Self {
            ScriptedVolume {
                before_copy: Mutex::new(Some(Box::new(hook))),
                ..self
            }
        }
    }

    impl Volume for ScriptedVolume {
        fn block_size(&self) -> u32 {
            self.inner.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.inner.num_blocks()
        }
        fn read(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<()> {
            self.inner.read(lba, buf)
        }
        fn write(&self, lba: u64, data: &[u8]) -> sliver_volume::Result<()> {
            let end = lba + (data.len() / BS) as u64;
            if end > self.fail_from {
                return Err(VolumeError::Io(std::io::Error::other("injected")));
            }
            self.inner.write(lba, data)
        }
        fn flush(&self) -> sliver_volume::Result<()> {
            self.inner.flush()
        }
        fn unmap(&self, lba: u64, blocks: u64) -> sliver_volume::Result<()> {
            self.inner.unmap(lba, blocks)
        }
        fn copy_from(
            &self,
            source: &dyn Volume,
            src_lba: u64,
            dst_lba: u64,
            blocks: u64,
        ) -> sliver_volume::Result<()> {
            let hook = lock_unpoisoned(&self.before_copy).take();
            if let Some(hook) = hook {
                hook();
            }
            // Through our own `write`, so injected failures apply to copies too.
            sliver_volume::copy_by_data(self, source, src_lba, dst_lba, blocks)
        }
        fn block_status(&self, lba: u64) -> sliver_volume::Result<BlockStatus> {
            self.inner.block_status(lba)
        }
        fn space(&self) -> sliver_volume::Result<sliver_volume::VolumeSpace> {
            self.inner.space()
        }
    }

    #[test]
    fn failed_segment_is_reported_by_receive_copy_results() {
        let dir = tempfile::tempdir().unwrap();
        let inner = FileVolume::open(&dir.path().join("f"), BLOCKS * BS as u64, BS as u32).unwrap();
        let lu = lu_over(Arc::new(ScriptedVolume::new(inner).failing_from(2000)), 0);
        let t = [cscd(naa(0), 512)];
        let segments = [
            b2b(0, 0, 8, 0, 1000),
            b2b(0, 0, 8, 0, 1996),
            b2b(0, 0, 8, 0, 100),
        ];
        let r = xcopy(&lu, &NoCopyTargets, &params(9, 0, &t, &segments));
        assert_eq!(sense(&r), COPY_TARGET_NOT_REACHABLE);

        let r = results(&lu, 0x00, 9);
        good(&r);
        assert_eq!(r.data_in[4], 0x02, "completed with errors");
        assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 1);
        assert_eq!(
            u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
            8 * 512
        );

        let r = results(&lu, 0x04, 9);
        good(&r);
        assert_eq!(r.data_in[56], Status::CheckCondition as u8);
        let sense_len = u16::from_be_bytes([r.data_in[58], r.data_in[59]]) as usize;
        assert_eq!(r.data_in.len(), 60 + sense_len);
        assert_eq!(
            u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()) as usize,
            56 + sense_len
        );
        let sense = &r.data_in[60..];
        assert_eq!(
            (sense[2] & 0x0f, sense[12], sense[13]),
            COPY_TARGET_NOT_REACHABLE
        );

        // Other nexuses and unknown list identifiers see nothing.
        assert_eq!(sense_of(&results(&lu, 0x00, 10)), (0x5, 0x24, 0x00));
        lu.nexus_lost(&nexus());
        assert_eq!(sense_of(&results(&lu, 0x04, 9)), (0x5, 0x24, 0x00));
    }

    fn sense_of(r: &Response) -> (u8, u8, u8) {
        sense(r)
    }

    #[test]
    fn operating_parameters_and_vpd_page() {
        let a = array(1);
        let lu = &a.lus[0];
        let r = results(lu, 0x03, 0);
        good(&r);
        let d = &r.data_in;
        assert_eq!(
            u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
            d.len() - 4
        );
        assert_eq!(u16::from_be_bytes([d[8], d[9]]), 64);
        assert_eq!(u16::from_be_bytes([d[10], d[11]]), 64);
        assert_eq!(u32::from_be_bytes(d[12..16].try_into().unwrap()), 4096);
        assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), 256 << 20);
        assert_eq!(
            u32::from_be_bytes(d[20..24].try_into().unwrap()),
            0,
            "no inline data"
        );
        assert_eq!(d[37], 9, "granularity: one 512-byte block");
        assert_eq!(d[43], 3);
        assert_eq!(&d[44..47], &[0x02, 0x0a, 0xe4]);
        // The largest lists the parameters allow must fit the descriptor list length.
        assert!(64 * 32 + 64 * 32 <= u32::from_be_bytes(d[12..16].try_into().unwrap()));

        // RECEIVE DATA (01h) is not implemented.
        assert_eq!(sense(&results(lu, 0x01, 0)), (0x5, 0x20, 0x00));

        let r = run(lu, &NoCopyTargets, &[0x12, 1, 0x8f, 0x04, 0, 0], &[]);
        good(&r);
        let page = &r.data_in;
        assert_eq!(
            u16::from_be_bytes([page[2], page[3]]) as usize,
            page.len() - 4
        );
        let mut at = 4;
        let mut kinds = Vec::new();
        while at < page.len() {
            let kind = u16::from_be_bytes([page[at], page[at + 1]]);
            let len = u16::from_be_bytes([page[at + 2], page[at + 3]]) as usize;
            assert_eq!(len % 4, 0);
            if kind == 0x0001 {
                // libiscsi looks for RECEIVE COPY RESULTS / COPY STATUS here; the token
                // commands (10h, 11h, 07h) follow the LID1 ones.
                let list = &page[at + 5..at + 5 + page[at + 4] as usize];
                assert_eq!(
                    list,
                    &[0x83, 3, 0x00, 0x10, 0x11, 0x84, 4, 0x00, 0x03, 0x04, 0x07]
                );
            }
            kinds.push(kind);
            at += 4 + len;
        }
        assert_eq!(at, page.len());
        assert_eq!(
            kinds,
            [0x0000, 0x0001, 0x0004, 0x0008, 0x000c, 0x0106, 0x0108, 0x8001]
        );
    }

    #[test]
    fn report_supported_operation_codes_lists_the_copy_commands() {
        let a = array(1);
        let lu = &a.lus[0];
        let rsoc = |op: u8, sa: u16| {
            let mut c = [0u8; 12];
            c[0] = 0xa3;
            c[1] = 0x0c;
            c[2] = 0x02;
            c[3] = op;
            c[4..6].copy_from_slice(&sa.to_be_bytes());
            c[9] = 64;
            run(lu, &NoCopyTargets, &c, &[])
        };
        for (op, sa) in [(0x83, 0x00), (0x84, 0x00), (0x84, 0x03), (0x84, 0x04)] {
            let r = rsoc(op, sa);
            good(&r);
            assert_eq!(r.data_in[1] & 0x07, 0x03, "{op:#x}/{sa:#x}");
            assert_eq!(&r.data_in[4..6], &[op, sa as u8]);
        }
        for (op, sa) in [(0x83, 0x01), (0x84, 0x01)] {
            assert_eq!(rsoc(op, sa).data_in[1] & 0x07, 0x01);
        }
    }

    #[test]
    fn reusing_a_list_identifier_replaces_its_result() {
        let results = CopyResults::default();
        let n = nexus();
        let first = results.begin(&n, 3);
        let second = results.begin(&n, 3);
        // The earlier copy finishing (with an error) does not touch the later one's record.
        results.finish(
            first,
            &Err(SenseReason::CopyTargetDeviceNotReachable.into()),
        );
        assert_eq!(results.find(&n, 3).unwrap().state, CopyState::InProgress);
        results.finish(second, &Ok(0));
        assert_eq!(results.find(&n, 3).unwrap().state, CopyState::Succeeded);
        // Another nexus with the same list identifier is independent.
        let other = Nexus {
            relative_target_port: 2,
            ..nexus()
        };
        assert!(results.find(&other, 3).is_none());
        results.begin(&other, 3);
        assert_eq!(results.find(&n, 3).unwrap().state, CopyState::Succeeded);
        assert_eq!(lock_unpoisoned(&results.records).list.len(), 2);
    }

    #[test]
    fn retained_results_are_bounded() {
        let results = CopyResults::default();
        let n = nexus();
        for id in 0..=255u8 {
            let t = results.begin(&n, id);
            results.finish(t, &Ok(0));
        }
        assert_eq!(
            lock_unpoisoned(&results.records).list.len(),
            RETAINED_RESULTS
        );
        assert!(results.find(&n, 255).is_some());
        assert!(results.find(&n, 0).is_none());
    }

    /// Deterministic xorshift, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn malformed_parameter_lists_never_panic() {
        let a = array(2);
        let lu = &a.lus[0];
        let reachable = Reachable(a.lus.clone());
        let valid = params(
            1,
            0,
            &[cscd(naa(0), 512), cscd(naa(1), 512)],
            &[b2b(0, 1, 4, 0, 8), b2b_offsets(1, 0, 1024, (8, 16), (0, 0))],
        );
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut outcomes = [0usize; 2];
        for round in 0..3000 {
            let p: Vec<u8> = if round % 2 == 0 {
                // Random bytes behind a header whose lengths are small enough to matter.
                let mut p: Vec<u8> = (0..rng.below(400)).map(|_| rng.next() as u8).collect();
                if p.len() >= 16 && round % 4 == 0 {
                    p[2..4].copy_from_slice(&(rng.below(200) as u16).to_be_bytes());
                    p[8..12].copy_from_slice(&(rng.below(200) as u32).to_be_bytes());
                    p[12..16].fill(0);
                }
                p
            } else {
                // A valid list with a few bytes changed.
                let mut p = valid.clone();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(p.len());
                    p[i] = rng.next() as u8;
                }
                p
            };
            let r = xcopy(lu, &reachable, &p);
            assert_eq!(r.sense.is_empty(), r.status == Status::Good, "{r:?}");
            outcomes[usize::from(r.status == Status::Good)] += 1;
        }
        // Both outcomes occur, so the loop reaches the copy and not just the first check.
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
    }
}
