//! The engine's clock, injected: the collector's behaviour that depends on time (how long it
//! leaves a segment it could not read) asks this instead of `Instant::now()`, so that a test
//! moves time forward by an hour in a step instead of waiting for it. The background
//! thread's pace is outside it already: [`crate::Engine::maintain`] is one round and returns
//! how long to wait, and only the thread that calls it sleeps.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the engine reads the time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The system's monotonic clock: what the engine uses unless told otherwise.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until moved ([`ManualClock::advance`]), for tests.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    elapsed: Mutex<Duration>,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut elapsed = self.elapsed.lock().unwrap_or_else(|e| e.into_inner());
        *elapsed = elapsed.saturating_add(by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.elapsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now(), t0, "real time does not move it");
        clock.advance(Duration::from_secs(3600));
        assert_eq!(clock.now() - t0, Duration::from_secs(3600));
        assert!(SystemClock.now() >= t0);
    }
}
