//! Exclusive locks on LBA ranges, held by every command that changes blocks; also where
//! point-in-time ROD tokens learn that their data changed.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// Exclusive locks on LBA ranges, so COMPARE AND WRITE, ORWRITE and other read-modify-write
/// sequences are atomic against every write to overlapping blocks.
///
/// Every command that changes blocks takes the lock on them first, which makes the lock also
/// the place where point-in-time ROD tokens (`tpc/rod.rs`) learn that their data changed: a
/// lock taken over a watched range revokes the token before the change happens.
#[derive(Default)]
pub(crate) struct RangeLocks {
    held: Mutex<Held>,
    released: Condvar,
    next_ticket: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Held {
    ranges: Vec<(u64, u64, u64)>, // (start, end exclusive, ticket)
    /// Ranges a live token represents. The flag is the token's; a token that is gone leaves
    /// a dead `Weak`, dropped at the next look.
    watches: Vec<(u64, u64, Weak<AtomicBool>)>,
}

impl Held {
    fn overlaps(&self, lba: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(s, e, _)| s < end && lba < e)
    }
}

pub(crate) struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    ticket: Option<u64>,
}

impl RangeLocks {
    /// Wait until no held range overlaps `[lba, lba + blocks)` and take it. Tokens watching
    /// an overlapping range are revoked.
    pub fn lock(&self, lba: u64, blocks: u64) -> RangeGuard<'_> {
        if blocks == 0 {
            return RangeGuard {
                locks: self,
                ticket: None,
            };
        }
        let end = lba.saturating_add(blocks);
        let ticket = self
            .next_ticket
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut held = lock_unpoisoned(&self.held);
        while held.overlaps(lba, end) {
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        if !held.watches.is_empty() {
            held.watches.retain(|(s, e, token)| {
                let Some(revoked) = token.upgrade() else {
                    return false;
                };
                if *s < end && lba < *e {
                    // SeqCst, and set before the caller changes a block: a copy that saw
                    // the change sees the flag when it checks afterwards.
                    revoked.store(true, std::sync::atomic::Ordering::SeqCst);
                    return false;
                }
                true
            });
        }
        held.ranges.push((lba, end, ticket));
        RangeGuard {
            locks: self,
            ticket: Some(ticket),
        }
    }

    /// Watch `ranges` ((lba, blocks) pairs) for `revoked`: the next lock over any of them
    /// sets it. Waits for commands already changing them, so the watch starts from settled
    /// data.
    pub fn watch(&self, ranges: &[(u64, u64)], revoked: &Arc<AtomicBool>) {
        let spans: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|r| r.1 > 0)
            .map(|&(lba, blocks)| (lba, lba.saturating_add(blocks)))
            .collect();
        let mut held = lock_unpoisoned(&self.held);
        while spans.iter().any(|&(s, e)| held.overlaps(s, e)) {
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.watches.retain(|w| w.2.strong_count() > 0);
        held.watches.extend(
            spans
                .into_iter()
                .map(|(s, e)| (s, e, Arc::downgrade(revoked))),
        );
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            let mut held = lock_unpoisoned(&self.locks.held);
            held.ranges.retain(|&(_, _, t)| t != ticket);
            drop(held);
            self.locks.released.notify_all();
        }
    }
}

/// A panic in one command must not wedge the LU for everyone else: the protected data
/// (queues, lock lists) stays consistent across our critical sections.
pub(crate) fn lock_unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
