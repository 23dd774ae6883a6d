//! RECEIVE COPY RESULTS (SPC-4 6.18): COPY STATUS, OPERATING PARAMETERS and FAILED SEGMENT
//! DETAILS, read from the LU's copy results (`results`).

use super::lid1::{
    IMPLEMENTED_DESCRIPTORS, MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES,
    MAX_SEGMENT_DESCRIPTORS,
};
use super::results::{CopyState, RETAINED_RESULTS};
use crate::cdb::CopyResultsAction;
use crate::lu::LogicalUnit;
use crate::outcome::{invalid_cdb, truncated, Done, Failure, Outcome};
use crate::{Nexus, Status};

/// RECEIVE COPY RESULTS.
pub(super) fn receive_copy_results(
    lu: &LogicalUnit,
    nexus: &Nexus,
    action: CopyResultsAction,
    list_id: u8,
    alloc_len: usize,
) -> Outcome {
    let data = match action {
        CopyResultsAction::CopyStatus => copy_status(lu, nexus, list_id)?,
        CopyResultsAction::OperatingParameters => operating_parameters(lu),
        CopyResultsAction::FailedSegmentDetails => failed_segment_details(lu, nexus, list_id)?,
    };
    Ok(Done::data(truncated(data, alloc_len)))
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
        .copy_manager
        .results
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
pub(super) fn data_segment_granularity(lu: &LogicalUnit) -> u8 {
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
        .copy_manager
        .results
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
