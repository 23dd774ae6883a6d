//! EXTENDED COPY (LID1, SPC-4 6.4): what VMware "Full Copy" (XCOPY) and `qemu-img convert -C`
//! drive.
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

use super::copy::{check_other_lu, run_steps, unreachable, Step, Target};
use crate::lu::LogicalUnit;
use crate::outcome::{data_out_prefix, invalid_param, Done, Failure, Outcome};
use crate::param::ParamList;
use crate::{CopyTargets, Request, SenseReason};

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

/// Parameter list header (SPC-4 6.4.3.1).
const HEADER_LEN: usize = 16;
/// CSCD descriptor sizes: most types are 32 bytes, IPv6 (EAh) and IP copy service (EBh) 64.
const CSCD_LEN: usize = 32;
const CSCD_LONG_LEN: usize = 64;
/// Bytes before a segment descriptor's DESCRIPTOR LENGTH starts counting.
const SEGMENT_HEADER_LEN: usize = 4;

/// Descriptor type codes.
pub(super) const CSCD_IDENTIFICATION: u8 = 0xe4;
const CSCD_IPV6: u8 = 0xea;
const CSCD_IP_COPY_SERVICE: u8 = 0xeb;
const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
const SEGMENT_BLOCK_TO_BLOCK_OFFSETS: u8 = 0x0a;
/// DESCRIPTOR LENGTH of each segment type we accept.
const BLOCK_TO_BLOCK_LEN: u16 = 0x18;
const BLOCK_TO_BLOCK_OFFSETS_LEN: u16 = 0x1c;
/// Type codes in OPERATING PARAMETERS and VPD 0x8F, segment types first.
pub(super) const IMPLEMENTED_DESCRIPTORS: [u8; 3] = [
    SEGMENT_BLOCK_TO_BLOCK,
    SEGMENT_BLOCK_TO_BLOCK_OFFSETS,
    CSCD_IDENTIFICATION,
];

/// Designator header fields an LU's NAA designator carries (SPC-4 7.8.6.1).
const DESIGNATOR_TYPE_NAA: u8 = 0x3;
const ASSOCIATION_LU: u8 = 0x0;
const NAA_LEN: usize = 16;

/// An EXTENDED COPY(LID1)'s parameter list, read and checked once, when the command is
/// dispatched ([`crate::dispatch()`]): the list, nothing to copy, or the failure execution
/// reports once the checks every command goes through first have passed.
#[derive(Debug)]
pub(crate) struct CopyList(Result<Option<ParameterList>, Failure>);

impl CopyList {
    /// The list of an EXTENDED COPY whose PARAMETER LIST LENGTH is `param_len`, from its
    /// Data-Out, checked in the order execution reports: a zero length copies nothing, a
    /// length beyond the largest list we accept is refused before the list is looked at, then
    /// the Data-Out must hold the whole list and the list must parse.
    pub(crate) fn read(param_len: usize, data_out: &[u8]) -> Self {
        let read = || {
            // SPC-4 6.4.1: a zero-length parameter list copies nothing and is not an error.
            if param_len == 0 {
                return Ok(None);
            }
            // Longer than the largest list we accept (no inline data).
            if param_len > HEADER_LEN + MAX_DESCRIPTOR_LIST_BYTES as usize {
                return Err(SenseReason::ParameterListLengthError.into());
            }
            let params = data_out_prefix(data_out, param_len)?;
            parse_parameter_list(params).map(Some)
        };
        CopyList(read())
    }

    /// An upper bound on the bytes the list moves, for deciding where to run the command
    /// before it runs: `None` when the list was refused (the command then fails at once).
    /// Block counts are taken at the largest block size a volume may have (4096 bytes), so the
    /// bound holds whichever volumes the descriptors name.
    pub(crate) fn bytes_at_most(&self) -> Option<u64> {
        const LARGEST_BLOCK: u64 = 4096;
        let Ok(list) = &self.0 else {
            return None;
        };
        let segments = list.iter().flat_map(|list| &list.segments);
        Some(
            segments
                .map(|s| match s.length {
                    SegmentLength::Blocks(n) => u64::from(n) * LARGEST_BLOCK,
                    // The offsets can make the transfer touch one more block at each end.
                    SegmentLength::Bytes { bytes, .. } => u64::from(bytes) + 2 * LARGEST_BLOCK,
                })
                .sum(),
        )
    }
}

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
fn parse_parameter_list(bytes: &[u8]) -> Result<ParameterList, Failure> {
    let p = ParamList::new(bytes);
    let header = p.sub(0, HEADER_LEN)?;
    let list_id = header.u8(0)?;
    let tracked = match (header.u8(1)? >> 3) & 0x3 {
        0b00 | 0b10 => true,
        0b11 => false,
        _ => return Err(header.invalid(1, Some(4))), // 01b is reserved
    };
    let cscd_list_len = usize::from(header.be16(2)?);
    let segment_list_len = header.be32(8)? as usize;
    let inline_len = header.be32(12)? as usize;
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
        return Err(header.invalid(12, None)); // MAXIMUM INLINE DATA LENGTH is 0
    }
    let segments_at = HEADER_LEN + cscd_list_len;
    Ok(ParameterList {
        list_id,
        tracked,
        cscds: parse_cscds(p.sub(HEADER_LEN, cscd_list_len)?, header)?,
        segments: parse_segments(p.sub(segments_at, segment_list_len)?, header)?,
    })
}

/// The CSCD descriptor list. A list length that ends inside a descriptor points at the CSCD
/// DESCRIPTOR LIST LENGTH in the `header`.
fn parse_cscds(list: ParamList, header: ParamList) -> Result<Vec<Cscd>, Failure> {
    let too_many = SenseReason::TooManyTargetDescriptors;
    parse_descriptors(list, MAX_CSCD_DESCRIPTORS, too_many, |code, at| {
        let len = match code {
            CSCD_IPV6 | CSCD_IP_COPY_SERVICE => CSCD_LONG_LEN,
            _ => CSCD_LEN,
        };
        if code != CSCD_IDENTIFICATION {
            return Err(list.fail_at(SenseReason::UnsupportedTargetDescriptorType, at));
        }
        let Ok(d) = list.sub(at, len) else {
            return Err(header.invalid(2, None));
        };
        // Only block devices: segment types 02h and 0Ah copy between them. LU ID TYPE is
        // ignored (SPC-4) and so is the obsolete NUL bit.
        if d.u8(CSCD_DEVICE_TYPE)? & 0x1f != 0 {
            return Err(d.invalid(CSCD_DEVICE_TYPE, Some(4)));
        }
        // The designation descriptor occupies bytes 4..24: a 4-byte header and at most 16
        // bytes of designator.
        let designator = d.sub(CSCD_DESIGNATOR, 20)?;
        let designator_len = usize::from(designator.u8(3)?);
        if designator_len > 16 {
            return Err(designator.invalid(3, None));
        }
        let association = (designator.u8(1)? >> 4) & 0x3;
        let designator_type = designator.u8(1)? & 0x0f;
        let naa = if designator_type == DESIGNATOR_TYPE_NAA
            && association == ASSOCIATION_LU
            && designator_len == NAA_LEN
        {
            Some(designator.array::<NAA_LEN>(4)?)
        } else {
            None
        };
        let cscd = Cscd {
            at: d.offset(0),
            naa,
            block_length: d.be24(CSCD_BLOCK_LENGTH)?,
        };
        Ok((cscd, len))
    })
}

/// The segment descriptor list. A list length that ends inside a descriptor points at the
/// SEGMENT DESCRIPTOR LIST LENGTH in the `header`.
fn parse_segments(list: ParamList, header: ParamList) -> Result<Vec<Segment>, Failure> {
    let too_many = SenseReason::TooManySegmentDescriptors;
    parse_descriptors(list, MAX_SEGMENT_DESCRIPTORS, too_many, |code, at| {
        let expected_len = match code {
            SEGMENT_BLOCK_TO_BLOCK => BLOCK_TO_BLOCK_LEN,
            SEGMENT_BLOCK_TO_BLOCK_OFFSETS => BLOCK_TO_BLOCK_OFFSETS_LEN,
            _ => {
                return Err(list.fail_at(SenseReason::UnsupportedSegmentDescriptorType, at));
            }
        };
        let Ok(descriptor_header) = list.sub(at, SEGMENT_HEADER_LEN) else {
            return Err(header.invalid(8, None));
        };
        if descriptor_header.be16(2)? != expected_len {
            return Err(descriptor_header.invalid(2, None));
        }
        let len = SEGMENT_HEADER_LEN + usize::from(expected_len);
        let Ok(d) = list.sub(at, len) else {
            return Err(header.invalid(8, None));
        };
        let length = if code == SEGMENT_BLOCK_TO_BLOCK {
            SegmentLength::Blocks(d.be16(SEG_BLOCKS)?)
        } else {
            let bytes = d.be32(SEG_BYTES)?;
            if bytes > MAX_SEGMENT_BYTES {
                return Err(d.invalid(SEG_BYTES, None));
            }
            SegmentLength::Bytes {
                bytes,
                src_offset: d.be16(SEG_SRC_OFFSET)?,
                dst_offset: d.be16(SEG_DST_OFFSET)?,
            }
        };
        let segment = Segment {
            at: d.offset(0),
            src: d.be16(SEG_SRC_INDEX)?,
            dst: d.be16(SEG_DST_INDEX)?,
            length,
            src_lba: d.be64(SEG_SRC_LBA)?,
            dst_lba: d.be64(SEG_DST_LBA)?,
        };
        Ok((segment, len))
    })
}

/// Walks a descriptor list of at most `max` descriptors (one more fails with `too_many`,
/// pointing at it). `one` parses the descriptor at `at` whose type code is `code`, and
/// returns it with its length.
fn parse_descriptors<T>(
    list: ParamList,
    max: u16,
    too_many: SenseReason,
    mut one: impl FnMut(u8, usize) -> Result<(T, usize), Failure>,
) -> Result<Vec<T>, Failure> {
    let mut descriptors = Vec::new();
    let mut at = 0;
    while at < list.len() {
        if descriptors.len() >= usize::from(max) {
            return Err(list.fail_at(too_many, at));
        }
        let (descriptor, len) = one(list.u8(at)?, at)?;
        descriptors.push(descriptor);
        at += len;
    }
    Ok(descriptors)
}

// ---------------------------------------------------------------------------------------------
// Resolving copy targets and planning the copy (LU state, no I/O)

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

pub(super) fn extended_copy(lu: &LogicalUnit, req: &Request, list: &CopyList) -> Outcome {
    let list = match &list.0 {
        Ok(Some(list)) => list,
        Ok(None) => return Ok(Done::good()),
        Err(failure) => return Err(failure.clone()),
    };
    let ticket = if list.tracked {
        Some(lu.copy_manager.results.begin(req.nexus, list.list_id))
    } else {
        None
    };
    let outcome = plan(lu, req, list).and_then(|steps| {
        run_steps(&steps, |segments, bytes| {
            if let Some(t) = ticket {
                lu.copy_manager.results.progress(t, segments, bytes);
            }
        })
    });
    if let Some(t) = ticket {
        lu.copy_manager.results.finish(t, &outcome);
    }
    outcome.map(Done::affected)
}

#[cfg(test)]
mod tests;
