//! Mutexes with a place in the engine's lock order (RFC 0005, "Lock order"; docs/design.md).
//!
//! A lock may be taken only while every lock the thread already holds comes earlier in the
//! order: then no two threads can each hold what the other waits for. In debug builds (every
//! test) each thread keeps the ranks it holds and an acquisition out of order panics at the
//! place that made it, so a new path that would deadlock one day fails the first test that
//! runs it. Release builds keep nothing and check nothing. `try_lock` never waits, so it is
//! not checked, but what it takes counts as held.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, PoisonError, TryLockError, TryLockResult,
    WaitTimeoutResult,
};
use std::time::Duration;

/// The engine's locks, in the order they may be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// Collector rounds and checkpoints, one at a time.
    Maintenance,
    /// Tests: a hook the collector runs between its holds, which writes as hosts do.
    #[cfg(test)]
    TestHook,
    /// The metadata state.
    State,
    /// The log's head and the free segments (every host write takes it after `State`).
    Log,
    /// The segment being written ahead (the head takes it back under `Log`).
    WriteAhead,
    /// Log ranges applied and not yet written.
    InFlight,
    /// Free slots of the metadata area.
    Slots,
    /// The durable position and the sync in progress.
    Flush,
    /// Locks under which no other lock is taken: usage figures, tuning, poison, the
    /// collector's unreadable segments and clock, the group-commit queue, write-ahead figures.
    Leaf,
}

thread_local! {
    /// The ranks this thread holds, in the order taken (debug builds only).
    static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
}

#[track_caller]
fn taking(rank: Rank, checked: bool) {
    if !cfg!(debug_assertions) {
        return;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if checked {
            if let Some(&last) = held.iter().max() {
                assert!(
                    last < rank,
                    "lock order: {rank:?} taken while holding {last:?} (held: {held:?})"
                );
            }
        }
        held.push(rank);
    });
}

fn released(rank: Rank) {
    if !cfg!(debug_assertions) {
        return;
    }
    // A thread that is exiting may have dropped its stack already.
    let _ = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        if let Some(i) = held.iter().rposition(|&r| r == rank) {
            held.remove(i);
        }
    });
}

/// A [`Mutex`] with its [`Rank`].
pub(crate) struct RankedMutex<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T> RankedMutex<T> {
    pub(crate) const fn new(rank: Rank, value: T) -> Self {
        RankedMutex {
            rank,
            inner: Mutex::new(value),
        }
    }

    /// Take the lock, in order (checked in debug builds).
    #[track_caller]
    pub(crate) fn lock(&self) -> LockResult<RankedGuard<'_, T>> {
        taking(self.rank, true);
        match self.inner.lock() {
            Ok(guard) => Ok(self.guard(guard)),
            Err(poisoned) => Err(PoisonError::new(self.guard(poisoned.into_inner()))),
        }
    }

    /// Take the lock if it is free; never waits, so never out of order.
    pub(crate) fn try_lock(&self) -> TryLockResult<RankedGuard<'_, T>> {
        let guard = match self.inner.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(TryLockError::WouldBlock),
            Err(TryLockError::Poisoned(p)) => {
                taking(self.rank, false);
                return Err(TryLockError::Poisoned(PoisonError::new(
                    self.guard(p.into_inner()),
                )));
            }
        };
        taking(self.rank, false);
        Ok(self.guard(guard))
    }

    fn guard<'a>(&'a self, guard: MutexGuard<'a, T>) -> RankedGuard<'a, T> {
        RankedGuard {
            guard: Some(guard),
            rank: self.rank,
        }
    }
}

/// A held [`RankedMutex`]; its rank is released with it.
pub(crate) struct RankedGuard<'a, T> {
    /// Always `Some` but while a condition variable waits with it.
    guard: Option<MutexGuard<'a, T>>,
    rank: Rank,
}

impl<'a, T> RankedGuard<'a, T> {
    /// Wait on `cv`, the lock released meanwhile (its rank stays: the thread takes nothing
    /// while it waits).
    pub(crate) fn wait(mut self, cv: &Condvar) -> LockResult<Self> {
        let guard = self.guard.take().expect("held");
        let (guard, poisoned) = unpoison(cv.wait(guard));
        self.guard = Some(guard);
        if poisoned {
            Err(PoisonError::new(self))
        } else {
            Ok(self)
        }
    }

    /// [`RankedGuard::wait`] for at most `timeout`.
    pub(crate) fn wait_timeout(
        mut self,
        cv: &Condvar,
        timeout: Duration,
    ) -> LockResult<(Self, WaitTimeoutResult)> {
        let guard = self.guard.take().expect("held");
        let ((guard, result), poisoned) = unpoison(cv.wait_timeout(guard, timeout));
        self.guard = Some(guard);
        if poisoned {
            Err(PoisonError::new((self, result)))
        } else {
            Ok((self, result))
        }
    }

    /// [`RankedGuard::wait_timeout`] while `condition` holds.
    pub(crate) fn wait_timeout_while(
        mut self,
        cv: &Condvar,
        timeout: Duration,
        condition: impl FnMut(&mut T) -> bool,
    ) -> LockResult<(Self, WaitTimeoutResult)> {
        let guard = self.guard.take().expect("held");
        let ((guard, result), poisoned) =
            unpoison(cv.wait_timeout_while(guard, timeout, condition));
        self.guard = Some(guard);
        if poisoned {
            Err(PoisonError::new((self, result)))
        } else {
            Ok((self, result))
        }
    }
}

fn unpoison<G>(result: LockResult<G>) -> (G, bool) {
    match result {
        Ok(g) => (g, false),
        Err(p) => (p.into_inner(), true),
    }
}

impl<T> Deref for RankedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("held")
    }
}

impl<T> DerefMut for RankedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("held")
    }
}

impl<T> Drop for RankedGuard<'_, T> {
    fn drop(&mut self) {
        // The mutex is unlocked first, then the rank is let go.
        drop(self.guard.take());
        released(self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_pass_and_release_their_ranks() {
        let a = RankedMutex::new(Rank::State, 1);
        let b = RankedMutex::new(Rank::Flush, 2);
        {
            let x = a.lock().unwrap();
            let y = b.lock().unwrap();
            assert_eq!(*x + *y, 3);
        }
        // Both released: the later one can be taken first now, and the earlier after it
        // was let go.
        drop(b.lock().unwrap());
        drop(a.lock().unwrap());
        HELD.with(|h| assert!(h.borrow().is_empty()));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order: State taken while holding Flush")]
    fn a_lock_taken_out_of_order_panics() {
        let a = RankedMutex::new(Rank::State, ());
        let b = RankedMutex::new(Rank::Flush, ());
        let _y = b.lock().unwrap();
        let _x = a.lock().unwrap();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order: Leaf taken while holding Leaf")]
    fn two_leaves_are_out_of_order() {
        let a = RankedMutex::new(Rank::Leaf, ());
        let b = RankedMutex::new(Rank::Leaf, ());
        let _x = a.lock().unwrap();
        let _y = b.lock().unwrap();
    }

    #[test]
    fn try_lock_is_not_checked_but_counts_as_held() {
        let a = RankedMutex::new(Rank::State, ());
        let b = RankedMutex::new(Rank::Flush, ());
        let _y = b.lock().unwrap();
        let _x = a.try_lock().unwrap();
        HELD.with(|h| assert_eq!(h.borrow().len(), 2));
    }

    #[test]
    fn a_wait_keeps_the_rank_and_the_value() {
        let a = RankedMutex::new(Rank::Flush, 5);
        let cv = Condvar::new();
        let g = a.lock().unwrap();
        let (g, timed_out) = g.wait_timeout(&cv, Duration::from_millis(1)).unwrap();
        assert!(timed_out.timed_out());
        assert_eq!(*g, 5);
        HELD.with(|h| assert_eq!(*h.borrow(), vec![Rank::Flush]));
    }
}
