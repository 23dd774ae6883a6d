//! The time sliver's parts read, injected. Whatever decides by time (how long the collector
//! leaves a segment it could not read, when the shipper cuts a batch or takes a scheduled
//! point, when a retention rule expires a point) asks a [`Clock`] instead of `Instant::now()`
//! or `SystemTime::now()`, so that a test moves time forward by an hour in a step instead of
//! waiting for it, and a simulation runs every part on one clock. A leaf crate: the engine,
//! the off-site copy and the server all take it, and it takes nothing.
//!
//! Two readings, because they answer different questions: [`Clock::now`] is monotonic, for
//! intervals and deadlines inside one process; [`Clock::wall`] is the calendar, for what is
//! written down and compared across restarts and machines (a restore point's time, a pin's
//! expiry).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a part reads the time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Monotonic time, for intervals and deadlines.
    fn now(&self) -> Instant;
    /// Calendar time, for what outlives the process.
    fn wall(&self) -> SystemTime;

    /// [`Clock::wall`] in milliseconds since the Unix epoch (0 before it), as object names
    /// and catalog entries record it.
    fn wall_ms(&self) -> u64 {
        self.wall()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// The system's clocks: what every part uses unless told otherwise.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that stands still until moved ([`ManualClock::advance`]), for tests. Both
/// readings move together, from the moment it was made.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    start_wall: SystemTime,
    elapsed: Mutex<Duration>,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            start_wall: SystemTime::now(),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut elapsed = self.elapsed.lock().unwrap_or_else(|e| e.into_inner());
        *elapsed = elapsed.saturating_add(by);
    }

    fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    fn wall(&self) -> SystemTime {
        self.start_wall + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        let (t0, w0) = (clock.now(), clock.wall());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now(), t0, "real time does not move it");
        assert_eq!(clock.wall(), w0, "real time does not move it");
        clock.advance(Duration::from_secs(3600));
        assert_eq!(clock.now() - t0, Duration::from_secs(3600));
        assert_eq!(
            clock.wall().duration_since(w0).unwrap(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            clock.wall_ms() - 3_600_000,
            w0.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
        );
        assert!(SystemClock.now() >= t0);
    }

    #[test]
    fn the_system_clock_reads_the_calendar_in_milliseconds() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let ms = SystemClock.wall_ms();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            (before..=after).contains(&ms),
            "{before} <= {ms} <= {after}"
        );
        // Well after 2020: a clock that answered 0 or seconds would fail here.
        assert!(ms > 1_577_836_800_000);
    }
}
