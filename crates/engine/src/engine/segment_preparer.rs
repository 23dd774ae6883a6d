//! The segment preparer's own state (RFC 0005 step 7): the segment it is writing ahead of the
//! head, which the head takes back when it reaches it; the log's syncs and length when it last
//! decided whether to write ahead; and the wakeup its thread (`sliver-segments`) sleeps on.
//! The engine does the allocating and writing (`segments.rs`); the free list's side of
//! preparing (which segments are `preparing` and `ready`) is `FreeSegments`'.

use super::ranked::{Rank, RankedGuard, RankedMutex};
use super::wakeup::Wakeup;

/// Syncs covering less log than this on average make the segments prepared next written
/// ahead ([`crate::LogDevice::write_ahead`]). A sync of an append into fallocated blocks also
/// writes the file system's record of their conversion, an extent block and the inode, one
/// after the other after the data; on this machine's ext4 that doubled a small sync's time
/// (4 KiB write-through random writes at QD 32: 1.1k syncs/s at 14 writes each, 2.0k with
/// segments written ahead; docs/benchmarks.md, "Write-through"). Writing a segment ahead
/// costs a write of its size, which large syncs (sequential write-through, write-back's
/// checkpoint syncs) would pay without gaining: 1 MiB sequential writes lost 8 % to it.
const WRITE_AHEAD_BELOW: u64 = 256 << 10;

pub(super) struct SegmentPreparer {
    /// The segment being written ahead. The head, taking a segment still being prepared,
    /// clears it (waiting out the piece being written) so no zeros land after its records.
    writing: RankedMutex<Option<u32>>,
    /// Log syncs and bytes appended when the last round decided: the syncs since then say
    /// how much log a sync covers now.
    last: RankedMutex<(u64, u64)>,
    wakeup: Wakeup,
}

impl Default for SegmentPreparer {
    fn default() -> Self {
        SegmentPreparer {
            writing: RankedMutex::new(Rank::WriteAhead, None),
            last: RankedMutex::new(Rank::Leaf, (0, 0)),
            wakeup: Wakeup::default(),
        }
    }
}

impl SegmentPreparer {
    pub(super) fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }

    /// Segment `s` is being written ahead from now on (the caller holds the log's lock and
    /// saw it still preparing).
    pub(super) fn start_writing(&self, s: u32) {
        *self.writing.lock().unwrap() = Some(s);
    }

    /// The right to write the next piece of `s`: held while the piece is written, so the
    /// head taking `s` back waits for it. None once the head took `s`.
    pub(super) fn piece(&self, s: u32) -> Option<RankedGuard<'_, Option<u32>>> {
        let writing = self.writing.lock().unwrap();
        (*writing == Some(s)).then_some(writing)
    }

    /// Segment `s` is no longer written ahead (the head took it, shutdown gave it back, or
    /// writing it ended); another segment's mark stays.
    pub(super) fn stop_writing(&self, s: u32) {
        let mut writing = self.writing.lock().unwrap();
        if *writing == Some(s) {
            *writing = None;
        }
    }

    /// The segment being written ahead, if any.
    #[cfg(test)]
    pub(super) fn writing(&self) -> Option<u32> {
        *self.writing.lock().unwrap()
    }

    /// Whether the log's syncs since the last call covered less than [`WRITE_AHEAD_BELOW`]
    /// each on average; `syncs` is the log's count of syncs and `appended` its length now.
    pub(super) fn syncs_are_small(&self, syncs: u64, appended: u64) -> bool {
        let mut last = self.last.lock().unwrap();
        let (syncs_then, appended_then) = std::mem::replace(&mut *last, (syncs, appended));
        let syncs = syncs.saturating_sub(syncs_then);
        syncs > 0 && appended.saturating_sub(appended_then) / syncs < WRITE_AHEAD_BELOW
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_are_small_by_their_average_since_the_last_round() {
        let p = SegmentPreparer::default();
        assert!(!p.syncs_are_small(0, 0), "no sync yet");
        // 10 syncs over 1 MiB: 100 KiB each.
        assert!(p.syncs_are_small(10, 1 << 20));
        assert!(
            !p.syncs_are_small(10, 2 << 20),
            "no sync since the last round"
        );
        // 2 syncs over 1 MiB since: 512 KiB each.
        assert!(!p.syncs_are_small(12, 3 << 20));
        // 4 syncs over 1 MiB less a byte: just under 256 KiB each.
        assert!(p.syncs_are_small(16, (4 << 20) - 1));
        assert!(!p.syncs_are_small(20, 5 << 20), "exactly 256 KiB each");
    }

    #[test]
    fn a_taken_segment_is_written_no_further() {
        let p = SegmentPreparer::default();
        p.start_writing(5);
        assert!(p.piece(5).is_some());
        assert!(p.piece(4).is_none());
        p.stop_writing(4);
        assert_eq!(
            p.writing(),
            Some(5),
            "another segment's stop leaves the mark"
        );
        p.stop_writing(5);
        assert!(p.piece(5).is_none());
        assert_eq!(p.writing(), None);
    }
}
