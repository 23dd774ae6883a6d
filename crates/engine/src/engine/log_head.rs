//! The log's head (RFC 0005 step 7): where the next record goes, how many bytes were appended
//! since open (the position a flush waits for), and the segment switches the log's durable
//! prefix does not cover yet. One owner, so the three move together: a switch moves the head
//! into its new segment past the seal and start records, counts their bytes and remembers where
//! it happened, and a sync forgets the switches it covered. Lives under the log's lock with the
//! free segments (`Engine::lock_log`); the engine does the I/O.

use std::collections::VecDeque;

use crate::format::{SEAL_LEN, SEGMENT_START_LEN};
use crate::meta::root::Head;

pub(super) struct LogHead {
    at: Head,
    appended: u64,
    /// Where the head moved to a new segment (the log position right after its start record),
    /// for each move the log's durable prefix does not cover yet (see
    /// [`super::MAX_UNSYNCED_SEGMENTS`]); oldest first.
    unsynced_switches: VecDeque<u64>,
}

impl LogHead {
    /// The head at `at`, as open finds it: nothing appended since, no switch unsynced.
    pub(super) fn new(at: Head) -> Self {
        LogHead {
            at,
            appended: 0,
            unsynced_switches: VecDeque::new(),
        }
    }

    /// Where the next record goes.
    pub(super) fn at(&self) -> Head {
        self.at
    }

    /// Bytes appended since open: the log position after the last record.
    pub(super) fn appended(&self) -> u64 {
        self.appended
    }

    /// Whether `len` more bytes and the seal after them fit in the head's segment, of
    /// `segment_size` bytes.
    pub(super) fn fits(&self, len: usize, segment_size: usize) -> bool {
        self.at.offset as usize + len + SEAL_LEN <= segment_size
    }

    /// Segment switches the log's durable prefix does not cover yet.
    pub(super) fn unsynced_switches(&self) -> usize {
        self.unsynced_switches.len()
    }

    /// The log is durable up to `upto` (a position from [`LogHead::appended`]): the switches
    /// before it are covered.
    pub(super) fn synced_up_to(&mut self, upto: u64) {
        while self.unsynced_switches.front().is_some_and(|&p| p <= upto) {
            self.unsynced_switches.pop_front();
        }
    }

    /// The head's segment was sealed and `segment` opened with sequence `seq` (both records
    /// written and applied): the head moves past the new segment's start record.
    pub(super) fn switch(&mut self, segment: u32, seq: u64) {
        self.at = Head {
            segment,
            seq,
            offset: SEGMENT_START_LEN as u32,
        };
        self.appended += (SEAL_LEN + SEGMENT_START_LEN) as u64;
        self.unsynced_switches.push_back(self.appended);
    }

    /// Records of `len` bytes were appended at the head.
    pub(super) fn advance(&mut self, len: usize) {
        self.at.offset += len as u32;
        self.appended += len as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> LogHead {
        LogHead::new(Head {
            segment: 3,
            seq: 7,
            offset: 100,
        })
    }

    #[test]
    fn appends_move_the_head_and_count_bytes() {
        let mut h = head();
        assert_eq!(h.appended(), 0);
        h.advance(50);
        assert_eq!(h.at().offset, 150);
        assert_eq!((h.at().segment, h.at().seq), (3, 7));
        assert_eq!(h.appended(), 50);
    }

    #[test]
    fn a_record_fits_with_room_for_the_seal_after_it() {
        let h = head();
        let room = 1000 - 100 - SEAL_LEN;
        assert!(h.fits(room, 1000));
        assert!(!h.fits(room + 1, 1000));
    }

    #[test]
    fn a_switch_counts_its_records_and_waits_for_a_sync_covering_it() {
        let mut h = head();
        h.advance(10);
        h.switch(9, 8);
        let first = 10 + (SEAL_LEN + SEGMENT_START_LEN) as u64;
        assert_eq!(h.appended(), first);
        assert_eq!(
            h.at(),
            Head {
                segment: 9,
                seq: 8,
                offset: SEGMENT_START_LEN as u32
            }
        );
        h.advance(20);
        h.switch(4, 9);
        assert_eq!(h.unsynced_switches(), 2);
        h.synced_up_to(first - 1);
        assert_eq!(
            h.unsynced_switches(),
            2,
            "the sync ended before the first switch"
        );
        h.synced_up_to(first);
        assert_eq!(h.unsynced_switches(), 1);
        h.synced_up_to(h.appended());
        assert_eq!(h.unsynced_switches(), 0);
    }
}
