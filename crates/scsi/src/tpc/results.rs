//! Outcomes of EXTENDED COPY commands and RECEIVE COPY RESULTS (SPC-4 6.18): COPY STATUS,
//! OPERATING PARAMETERS and FAILED SEGMENT DETAILS.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::lid1::{
    IMPLEMENTED_DESCRIPTORS, MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES,
    MAX_SEGMENT_DESCRIPTORS,
};
use crate::cdb::CopyResultsAction;
use crate::lu::LogicalUnit;
use crate::outcome::{invalid_cdb, truncated, Done, Failure, Outcome};
use crate::range_lock::lock_unpoisoned;
use crate::{Nexus, Sense, Status};

/// Finished copy results kept per LU for RECEIVE COPY RESULTS; the oldest goes first. Copies
/// still running are never dropped. Also what we report as concurrent copies supported.
pub(super) const RETAINED_RESULTS: usize = 64;

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
    pub(super) fn begin(&self, nexus: &Nexus, list_id: u8) -> u64 {
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

    pub(super) fn progress(&self, ticket: u64, segments: usize, bytes: u64) {
        self.update(ticket, |r| {
            r.segments_processed = segments;
            r.bytes_copied = bytes;
        });
    }

    pub(super) fn finish(&self, ticket: u64, outcome: &Result<u64, Failure>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpc::test_kit::nexus;
    use crate::SenseReason;

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
}
