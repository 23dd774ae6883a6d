//! A flag a background thread sleeps on until it is set or a timeout passes: how the
//! collector's and the segment preparer's threads are woken early.

use std::sync::Condvar;
use std::time::Duration;

use super::ranked::{Rank, RankedMutex};

pub(super) struct Wakeup {
    woken: RankedMutex<bool>,
    cv: Condvar,
}

impl Default for Wakeup {
    fn default() -> Self {
        Wakeup {
            woken: RankedMutex::new(Rank::Leaf, false),
            cv: Condvar::new(),
        }
    }
}

impl Wakeup {
    pub(super) fn wake(&self) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Sleep until woken or `timeout` passes, and clear the flag.
    pub(super) fn wait(&self, timeout: Duration) {
        let woken = self.woken.lock().unwrap();
        let (mut woken, _) = woken
            .wait_timeout_while(&self.cv, timeout, |w| !*w)
            .unwrap();
        *woken = false;
    }
}
