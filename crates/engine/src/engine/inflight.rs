//! Log writes in flight: batches already applied to the state under the metadata lock whose
//! bytes are still being written to the log outside it (RFC 0001, "the log write outside the
//! metadata lock").
//!
//! A host write reserves its log range, applies its records and registers the range here, all
//! under `meta`, then writes the bytes after releasing `meta`: a `pwrite` the file system
//! blocks for tens of milliseconds (a journal commit) then stalls that command only, not every
//! command queued on the lock. What may look at the log in between waits here:
//! - a reader whose chunk lies in a range in flight waits for that range;
//! - `flush` (and so a checkpoint) waits for every range below the position it syncs to, and
//!   counts as durable only the prefix with no range in flight;
//! - the collector never reads a segment with a range in flight.
//!
//! A crash can leave a range unwritten while later ones were written. Replay stops at the
//! first record that does not decode, so it keeps a prefix of the log; no host was told those
//! later writes were durable, because `flush` had not passed the hole.
//!
//! A segment switch's seal and start records are *owed* (RFC 0005 step 11): the switch
//! registers them here with their bytes, under `meta` and `log`, and whoever next waits for
//! the log below a position (or flushes, or the collector waiting out a victim) takes them and
//! writes them first, so no such wait can be for a write nobody will make. A host write that
//! switched pays its own switch as it waits for the log before it, with no lock held; before
//! this, both records were written under `meta` and `log`, and one such switch held `meta` for
//! 76 ms. Some payers hold `meta` (the writer's backstop sync, a relocation failing mid-hold),
//! as do backends without fallocate, which still write both records under the lock.
//!
//! Lock order: `meta`, then this set's mutex (registration happens under `meta`); nothing
//! takes `meta` while holding it, and completing a write takes only this mutex, so a thread
//! may wait here while holding `meta` without a deadlock. The owed writes' list is a leaf,
//! taken alone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Condvar;
use std::time::Duration;

use super::ranked::{Rank, RankedMutex};
use crate::state::Loc;

/// A log range whose bytes are not written yet, keyed in [`InFlight`] by its log position
/// (`Meta::appended` when it was reserved: unique and increasing).
#[derive(Debug, Clone, Copy)]
struct Range {
    segment: u32,
    offset: u32,
    len: u32,
}

/// A range registered in flight whose bytes no thread has started writing: a segment
/// switch's seal or start record.
#[derive(Debug)]
pub(super) struct OwedWrite {
    pub(super) position: u64,
    pub(super) segment: u32,
    pub(super) offset: u32,
    pub(super) bytes: Vec<u8>,
}

pub(super) struct InFlight {
    ranges: RankedMutex<BTreeMap<u64, Range>>,
    /// Ranges registered (a read checks this before taking the mutex).
    count: AtomicUsize,
    done: Condvar,
    /// Ranges registered whose writing is owed, oldest first.
    owed: RankedMutex<Vec<OwedWrite>>,
    /// Entries of `owed` (checked before taking its mutex on every wait).
    owed_count: AtomicUsize,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            ranges: RankedMutex::new(Rank::InFlight, BTreeMap::new()),
            count: AtomicUsize::new(0),
            done: Condvar::new(),
            owed: RankedMutex::new(Rank::Leaf, Vec::new()),
            owed_count: AtomicUsize::new(0),
        }
    }
}

/// How long a waiter sleeps before it looks at the poison flag again (a failed write leaves
/// its range registered, and `poison` wakes waiters; this is a second guard).
const RECHECK: Duration = Duration::from_millis(100);

/// A range that will never be written: the engine was poisoned meanwhile.
#[derive(Debug)]
pub(super) struct Abandoned;

impl InFlight {
    /// Register `len` bytes at `offset` of `segment`, at log position `position`. Caller
    /// holds `meta`, so positions register in increasing order.
    pub(super) fn register(&self, position: u64, segment: u32, offset: u32, len: u32) {
        let mut ranges = self.ranges.lock().unwrap();
        debug_assert!(
            ranges
                .last_key_value()
                .is_none_or(|(&p, r)| p + r.len as u64 <= position),
            "ranges in flight register in log order"
        );
        ranges.insert(
            position,
            Range {
                segment,
                offset,
                len,
            },
        );
        self.count.store(ranges.len(), Ordering::Release);
    }

    /// Register `write` in flight and owe it: the next [`InFlight::take_owed`] hands it to its
    /// caller to write. Caller holds `meta` and `log`, as for [`InFlight::register`].
    pub(super) fn owe(&self, write: OwedWrite) {
        self.register(
            write.position,
            write.segment,
            write.offset,
            write.bytes.len() as u32,
        );
        let mut owed = self.owed.lock().unwrap();
        owed.push(write);
        self.owed_count.store(owed.len(), Ordering::Release);
    }

    /// The owed writes, oldest first, for the caller to write and complete (or to poison the
    /// engine over): no other caller gets them.
    pub(super) fn take_owed(&self) -> Vec<OwedWrite> {
        if self.owed_count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut owed = self.owed.lock().unwrap();
        self.owed_count.store(0, Ordering::Release);
        std::mem::take(&mut *owed)
    }

    /// The range at `position` is written.
    pub(super) fn complete(&self, position: u64) {
        let mut ranges = self.ranges.lock().unwrap();
        let removed = ranges.remove(&position);
        debug_assert!(removed.is_some(), "completing a range never registered");
        self.count.store(ranges.len(), Ordering::Release);
        drop(ranges);
        self.done.notify_all();
    }

    /// Wake every waiter (the engine was poisoned: some ranges will never complete).
    pub(super) fn wake_all(&self) {
        let _ranges = self.ranges.lock().unwrap();
        self.done.notify_all();
    }

    /// The position of the first range in flight, if any: every log byte before it is written.
    pub(super) fn first(&self) -> Option<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.ranges.lock().unwrap().keys().next().copied()
    }

    /// Positions of the ranges in flight that hold any of `locs` (chunk records located by
    /// segment and offset). Caller holds `meta`, so the answer stays true until it lets go.
    pub(super) fn holding(&self, locs: impl Iterator<Item = Loc>) -> Vec<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let ranges = self.ranges.lock().unwrap();
        let mut found: Vec<u64> = Vec::new();
        for loc in locs {
            for (&position, r) in ranges.iter() {
                if r.segment == loc.segment
                    && r.offset <= loc.offset
                    && loc.offset < r.offset + r.len
                    && !found.contains(&position)
                {
                    found.push(position);
                }
            }
        }
        found
    }

    /// Positions of the ranges in flight in `segment`.
    pub(super) fn in_segment(&self, segment: u32) -> Vec<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let ranges = self.ranges.lock().unwrap();
        ranges
            .iter()
            .filter(|(_, r)| r.segment == segment)
            .map(|(&p, _)| p)
            .collect()
    }

    /// Wait until none of the ranges at `positions` is in flight.
    pub(super) fn wait_for(
        &self,
        positions: &[u64],
        poisoned: &AtomicBool,
    ) -> Result<(), Abandoned> {
        self.wait_while(poisoned, |ranges| {
            positions.iter().any(|p| ranges.contains_key(p))
        })
    }

    /// Wait until no range before log position `limit` is in flight.
    pub(super) fn wait_below(&self, limit: u64, poisoned: &AtomicBool) -> Result<(), Abandoned> {
        self.wait_while(poisoned, |ranges| {
            ranges.keys().next().is_some_and(|&p| p < limit)
        })
    }

    fn wait_while(
        &self,
        poisoned: &AtomicBool,
        busy: impl Fn(&BTreeMap<u64, Range>) -> bool,
    ) -> Result<(), Abandoned> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut ranges = self.ranges.lock().unwrap();
        while busy(&ranges) {
            if poisoned.load(Ordering::Acquire) {
                return Err(Abandoned);
            }
            ranges = ranges.wait_timeout(&self.done, RECHECK).unwrap().0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn loc(segment: u32, offset: u32) -> Loc {
        Loc { segment, offset }
    }

    #[test]
    fn ranges_are_found_by_the_records_they_hold() {
        let f = InFlight::default();
        f.register(100, 3, 64, 32);
        f.register(200, 3, 96, 16);
        f.register(300, 4, 16, 8);
        assert_eq!(f.holding([loc(3, 64)].into_iter()), vec![100]);
        assert_eq!(
            f.holding([loc(3, 95), loc(3, 96)].into_iter()),
            vec![100, 200]
        );
        assert!(f
            .holding([loc(3, 112), loc(4, 24), loc(5, 16)].into_iter())
            .is_empty());
        assert_eq!(f.in_segment(3), vec![100, 200]);
        assert_eq!(f.first(), Some(100));
        f.complete(100);
        assert_eq!(f.first(), Some(200));
        assert!(f.holding([loc(3, 64)].into_iter()).is_empty());
        f.complete(200);
        f.complete(300);
        assert_eq!(f.first(), None);
    }

    #[test]
    fn owed_writes_are_in_flight_until_written_and_handed_out_once() {
        let f = InFlight::default();
        assert!(f.take_owed().is_empty());
        f.register(10, 1, 0, 10);
        f.owe(OwedWrite {
            position: 20,
            segment: 1,
            offset: 10,
            bytes: vec![7; 8],
        });
        f.owe(OwedWrite {
            position: 28,
            segment: 2,
            offset: 0,
            bytes: vec![9; 4],
        });
        assert_eq!(f.in_segment(1), vec![10, 20]);
        assert_eq!(f.in_segment(2), vec![28]);
        let owed = f.take_owed();
        assert_eq!(
            owed.iter()
                .map(|w| (w.position, w.segment, w.offset, w.bytes.len()))
                .collect::<Vec<_>>(),
            vec![(20, 1, 10, 8), (28, 2, 0, 4)]
        );
        assert!(
            f.take_owed().is_empty(),
            "each owed write is handed out once"
        );
        assert_eq!(f.first(), Some(10), "taken is not written");
        f.complete(10);
        f.complete(20);
        assert_eq!(f.first(), Some(28));
        f.complete(28);
        assert_eq!(f.first(), None);
    }

    #[test]
    fn waiters_return_once_their_ranges_are_written_or_abandoned() {
        let f = Arc::new(InFlight::default());
        let poisoned = Arc::new(AtomicBool::new(false));
        f.register(10, 1, 0, 10);
        f.register(20, 1, 10, 10);
        // Nothing below 10 is in flight.
        assert!(f.wait_below(10, &poisoned).is_ok());
        let waiter = {
            let (f, p) = (f.clone(), poisoned.clone());
            std::thread::spawn(move || f.wait_below(21, &p).map(|()| f.first()))
        };
        f.complete(20);
        f.complete(10);
        assert_eq!(waiter.join().unwrap().unwrap(), None);
        f.register(30, 1, 20, 10);
        let waiter = {
            let (f, p) = (f.clone(), poisoned.clone());
            std::thread::spawn(move || f.wait_for(&[30], &p))
        };
        poisoned.store(true, Ordering::Release);
        f.wake_all();
        assert!(
            waiter.join().unwrap().is_err(),
            "a poisoned engine abandons the wait"
        );
    }
}
