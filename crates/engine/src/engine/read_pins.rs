//! Grace periods for freed segments: the collector waits out the readers that may still read a
//! segment before anything writes it again, and readers never wait.
//!
//! A reader resolves chunk locations under the metadata lock and reads the bytes after
//! releasing it; the collector may meanwhile free the segment those bytes are in. Until this
//! module, a reader took a shared `RwLock` pin while still holding the metadata lock and the
//! collector took the write side to wait readers out. A writer-preferring `RwLock` then made
//! every new reader wait, inside the metadata lock, for the older readers' disk reads to end,
//! and every other command waited for that reader: a disk read's latency, on the lock that all
//! I/O takes (issue 20, "reads taking the segment pin while holding the metadata lock").
//!
//! Now, as in RCU's two-counter grace periods: a reader adds itself to the counter of the
//! current epoch in the same metadata-lock hold that resolved its locations, and leaves it
//! when done. The collector makes segments unreachable and advances the epoch in one hold of
//! the metadata lock, then waits until the previous epoch's counter is zero. A reader counted
//! in the new epoch resolved its locations after the segments became unreachable, so it cannot
//! be reading them. One grace period runs at a time (the collector holds `maintenance`), so the
//! counter the epoch returns to two periods later has already drained.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[derive(Default)]
pub(super) struct ReadPins {
    /// Changed only under the metadata lock, so readers and the collector agree on the order.
    epoch: AtomicUsize,
    readers: [AtomicUsize; 2],
}

/// A reader's hold on the segments it resolved; dropping it ends the read.
pub(super) struct ReadPin<'a> {
    readers: &'a AtomicUsize,
}

impl Drop for ReadPin<'_> {
    fn drop(&mut self) {
        // Release: the reader's reads happen before the collector sees the count fall.
        self.readers.fetch_sub(1, Ordering::Release);
    }
}

impl ReadPins {
    /// Pin the segments a reader just resolved. The caller holds the metadata lock, in the
    /// same hold as the lookups.
    pub(super) fn pin(&self) -> ReadPin<'_> {
        let readers = &self.readers[self.epoch.load(Ordering::Relaxed) & 1];
        readers.fetch_add(1, Ordering::Relaxed);
        ReadPin { readers }
    }

    /// Start a grace period. The caller holds the metadata lock, in the hold that made the
    /// segments unreachable, and passes the result to [`ReadPins::wait`] after releasing it.
    pub(super) fn advance(&self) -> GracePeriod {
        GracePeriod(self.epoch.fetch_add(1, Ordering::Relaxed) & 1)
    }

    /// Wait until every reader pinned before `period` began has finished. Called without the
    /// metadata lock (readers finishing need none), by the one collector.
    pub(super) fn wait(&self, period: GracePeriod) {
        let readers = &self.readers[period.0];
        let mut pause = Duration::from_micros(50);
        // Acquire: pairs with the readers' release, so their reads are over.
        while readers.load(Ordering::Acquire) != 0 {
            // Readers hold a pin for one data read: sleep briefly rather than block them.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// The epoch a grace period waits out.
#[must_use = "a grace period must be waited for before the segments are reused"]
pub(super) struct GracePeriod(usize);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};

    /// The metadata lock of the engine, reduced to what the protocol needs.
    struct Engine {
        meta: Mutex<()>,
        pins: ReadPins,
    }

    #[test]
    fn a_grace_period_waits_for_earlier_readers_only_and_readers_never_wait() {
        let e = Arc::new(Engine {
            meta: Mutex::new(()),
            pins: ReadPins::default(),
        });
        let (old_go, old_wait) = mpsc::channel::<()>();
        let (old_pinned_tx, old_pinned) = mpsc::channel::<()>();
        let old_reader = {
            let e = e.clone();
            std::thread::spawn(move || {
                let pin = {
                    let _m = e.meta.lock().unwrap();
                    e.pins.pin()
                };
                old_pinned_tx.send(()).unwrap();
                old_wait.recv().unwrap();
                drop(pin);
            })
        };
        old_pinned.recv().unwrap();
        // The collector: unreachable + advance in one hold, then wait.
        let (done_tx, done) = mpsc::channel::<()>();
        let period = {
            let _m = e.meta.lock().unwrap();
            e.pins.advance()
        };
        let collector = {
            let e = e.clone();
            std::thread::spawn(move || {
                e.pins.wait(period);
                done_tx.send(()).unwrap();
            })
        };
        // A reader arriving during the grace period pins at once and is not waited for.
        let new_pin = {
            let _m = e.meta.lock().unwrap();
            e.pins.pin()
        };
        assert!(
            done.try_recv().is_err(),
            "the period cannot end while an earlier reader reads"
        );
        old_go.send(()).unwrap();
        old_reader.join().unwrap();
        // A liveness bound, not a timing assertion: the period ends with the new reader
        // still pinned (a hang here is the failure).
        done.recv_timeout(Duration::from_secs(60))
            .expect("the grace period ended without waiting for the later reader");
        collector.join().unwrap();
        drop(new_pin);
        // Two periods later the first counter is reused, drained.
        let p1 = {
            let _m = e.meta.lock().unwrap();
            e.pins.advance()
        };
        e.pins.wait(p1);
        let p2 = {
            let _m = e.meta.lock().unwrap();
            e.pins.advance()
        };
        e.pins.wait(p2);
        assert_eq!(e.pins.readers[0].load(Ordering::Relaxed), 0);
        assert_eq!(e.pins.readers[1].load(Ordering::Relaxed), 0);
    }
}
