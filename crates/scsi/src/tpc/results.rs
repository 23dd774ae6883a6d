//! Outcomes of the EXTENDED COPY commands one LU received: the copy manager's per-LU state
//! for `lid1`, which the LU holds and RECEIVE COPY RESULTS (`receive`) reads.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::outcome::Failure;
use crate::range_lock::lock_unpoisoned;
use crate::{Nexus, Sense, Status};

/// Finished copy results kept per LU for RECEIVE COPY RESULTS; the oldest goes first. Copies
/// still running are never dropped. Also what we report as concurrent copies supported.
pub(super) const RETAINED_RESULTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CopyState {
    InProgress,
    Succeeded,
    /// Ended with this status (CHECK CONDITION carries sense).
    Failed(Status, Option<Sense>),
}

#[derive(Debug, Clone)]
pub(super) struct CopyRecord {
    ticket: u64,
    initiator_port: String,
    relative_target_port: u16,
    list_id: u8,
    pub(super) state: CopyState,
    pub(super) segments_processed: usize,
    pub(super) bytes_copied: u64,
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

    pub(super) fn find(&self, nexus: &Nexus, list_id: u8) -> Option<CopyRecord> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_kit::nexus;
    use crate::SenseReason;

    #[test]
    fn reusing_a_list_identifier_replaces_its_result() {
        let results = CopyResults::default();
        let n = nexus(1);
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
            ..nexus(1)
        };
        assert!(results.find(&other, 3).is_none());
        results.begin(&other, 3);
        assert_eq!(results.find(&n, 3).unwrap().state, CopyState::Succeeded);
        assert_eq!(lock_unpoisoned(&results.records).list.len(), 2);
    }

    #[test]
    fn retained_results_are_bounded() {
        let results = CopyResults::default();
        let n = nexus(1);
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
