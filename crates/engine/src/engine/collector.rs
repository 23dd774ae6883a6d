//! The collector's own state (RFC 0005 step 7): the segments it could not read and when it
//! tries each again, the bytes it relocated since open, the clock it reads the time by, and
//! the wakeup its thread sleeps on. One owner, under its own leaf locks: none of it is under
//! the metadata lock, which the collector takes only to pick a victim and to relocate. The
//! engine does the reading and relocating (`gc.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ranked::{Rank, RankedMutex};
use super::wakeup::Wakeup;
use crate::clock::{Clock, SystemClock};

/// A segment the collector could not read.
#[derive(Debug, Clone, Copy)]
struct Unreadable {
    /// Reads of it that failed in a row.
    failures: u32,
    /// When the last one failed.
    failed_at: Instant,
}

impl Unreadable {
    /// How long the collector leaves the segment after its last failure: `first`, doubled
    /// for every failure before, at most 64 times.
    fn wait(&self, first: Duration) -> Duration {
        first.saturating_mul(1 << (self.failures - 1).min(6))
    }
}

pub(super) struct Collector {
    /// Segments (index, sequence) the collector could not read (a medium error, or an object
    /// store out of reach under a restore on demand), and how often and when each failed:
    /// skipped for the tuning's `unreadable_retry` (doubled per failure), or until their
    /// chunks are all dead, when they are freed without being read. A segment reused later
    /// has another sequence number.
    unreadable: RankedMutex<BTreeMap<(u32, u64), Unreadable>>,
    /// Bytes relocated since open.
    relocated: AtomicU64,
    /// Where the collector reads the time ([`crate::clock`]).
    clock: RankedMutex<Arc<dyn Clock>>,
    /// Wakes the collector's thread (`sliver-gc`) before its sleep ends.
    wakeup: Wakeup,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            unreadable: RankedMutex::new(Rank::Leaf, BTreeMap::new()),
            relocated: AtomicU64::new(0),
            clock: RankedMutex::new(Rank::Leaf, Arc::new(SystemClock)),
            wakeup: Wakeup::default(),
        }
    }
}

impl Collector {
    /// The time by the collector's clock.
    pub(super) fn now(&self) -> Instant {
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner()).clone();
        clock.now()
    }

    /// Read the time from `clock` from now on.
    pub(super) fn set_clock(&self, clock: Arc<dyn Clock>) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = clock;
    }

    pub(super) fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }

    /// The unreadable segments (index, sequence) to leave alone at `now`, when the first
    /// retry comes `first` after a failure.
    pub(super) fn waiting(&self, now: Instant, first: Duration) -> BTreeSet<(u32, u64)> {
        let unreadable = self.unreadable.lock().unwrap();
        unreadable
            .iter()
            .filter(|(_, u)| now.saturating_duration_since(u.failed_at) < u.wait(first))
            .map(|(&key, _)| key)
            .collect()
    }

    /// Whether a read of `segment` in its use `seq` failed and has not succeeded since.
    pub(super) fn is_unreadable(&self, segment: u32, seq: u64) -> bool {
        let unreadable = self.unreadable.lock().unwrap();
        !unreadable.is_empty() && unreadable.contains_key(&(segment, seq))
    }

    /// A read of `segment` (in its use `seq`) failed at `now`: returns how long the collector
    /// leaves it. Entries of segments whose use changed since (`current_seq` of a segment is
    /// its sequence now) are dropped: they are of no use any more.
    pub(super) fn read_failed(
        &self,
        segment: u32,
        seq: u64,
        now: Instant,
        first: Duration,
        current_seq: impl Fn(u32) -> u64,
    ) -> Duration {
        let mut unreadable = self.unreadable.lock().unwrap();
        unreadable.retain(|&(i, s), _| current_seq(i) == s);
        let failures = unreadable.get(&(segment, seq)).map_or(0, |u| u.failures) + 1;
        let entry = Unreadable {
            failures,
            failed_at: now,
        };
        unreadable.insert((segment, seq), entry);
        entry.wait(first)
    }

    /// A read of `segment` (in its use `seq`) succeeded.
    pub(super) fn read_succeeded(&self, segment: u32, seq: u64) {
        self.unreadable.lock().unwrap().remove(&(segment, seq));
    }

    pub(super) fn count_relocated(&self, bytes: u64) {
        self.relocated.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes relocated since open.
    #[cfg(test)]
    pub(super) fn relocated(&self) -> u64 {
        self.relocated.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const FIRST: Duration = Duration::from_secs(60);

    fn collector() -> (Collector, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        let c = Collector::default();
        c.set_clock(clock.clone());
        (c, clock)
    }

    #[test]
    fn a_failed_segment_waits_twice_as_long_after_every_failure_up_to_64_times() {
        let (c, _) = collector();
        let now = c.now();
        let waits: Vec<u64> = (0..9)
            .map(|_| c.read_failed(5, 7, now, FIRST, |_| 7).as_secs() / 60)
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
    }

    #[test]
    fn a_failed_segment_is_left_alone_until_its_wait_passes() {
        let (c, clock) = collector();
        let now = c.now();
        c.read_failed(5, 7, now, FIRST, |_| 7);
        assert!(c.waiting(c.now(), FIRST).contains(&(5, 7)));
        clock.advance(FIRST - Duration::from_secs(1));
        assert!(c.waiting(c.now(), FIRST).contains(&(5, 7)));
        clock.advance(Duration::from_secs(1));
        assert!(c.waiting(c.now(), FIRST).is_empty(), "the wait has passed");
        assert!(
            c.is_unreadable(5, 7),
            "still unreadable until a read succeeds"
        );
        c.read_succeeded(5, 7);
        assert!(!c.is_unreadable(5, 7));
    }

    #[test]
    fn a_reused_segment_starts_afresh_and_forgets_its_old_failures() {
        let (c, _) = collector();
        let now = c.now();
        c.read_failed(5, 7, now, FIRST, |_| 7);
        c.read_failed(5, 7, now, FIRST, |_| 7);
        // Segment 5 was freed and written again as sequence 9; segment 6's entry is current.
        c.read_failed(6, 8, now, FIRST, |i| if i == 5 { 7 } else { 8 });
        let wait = c.read_failed(5, 9, now, FIRST, |i| if i == 5 { 9 } else { 8 });
        assert_eq!(wait, FIRST, "the first failure of the segment's new use");
        assert!(!c.is_unreadable(5, 7), "the old use is forgotten");
        assert!(
            c.is_unreadable(6, 8),
            "other segments' current entries stay"
        );
    }
}
