//! The byte-rate limiter: a base rate, and a burst allowance spent first at an upper rate
//! (ESXi's reclaim runs the first ~400 GB of a batch at ~1 GB/s, then at the configured rate).
//!
//! Discards are accounted after the fact — FITRIM tells how many bytes it passed down only
//! when it returns — so the limiter keeps a virtual deadline: every byte costs `1/rate`
//! seconds (`1/burst_rate` while the burst allowance lasts), and after each window the caller
//! sleeps until the deadline. Idle time banks no credit: a deadline in the past is moved to
//! now, so the rate holds over any interval that starts at a window boundary.

use sliver_api_types::units::human_rate;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Time source of the limiter; injected so tests run on virtual time.
pub trait Clock {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
    /// Sleeps for `d` (a real clock may return early when asked to stop).
    fn sleep(&self, d: Duration);
}

/// The real clock. Sleeps in short slices and returns early once `stop` is set, so a signal
/// ends a long throttling sleep promptly.
#[derive(Clone)]
pub struct RealClock {
    origin: Instant,
    stop: &'static AtomicBool,
}

impl RealClock {
    pub fn new(stop: &'static AtomicBool) -> Self {
        Self {
            origin: Instant::now(),
            stop,
        }
    }
}

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(100)));
        }
    }
}

/// Limits of one limiter. `None` rates are unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RateSpec {
    /// Bytes per second after the burst allowance.
    pub rate: Option<u64>,
    /// Bytes reclaimed at `burst_rate` before `rate` applies.
    pub burst: u64,
    /// Bytes per second while the burst allowance lasts.
    pub burst_rate: Option<u64>,
}

impl RateSpec {
    pub fn unlimited() -> Self {
        Self {
            rate: None,
            burst: 0,
            burst_rate: None,
        }
    }

    /// The base rate as the reports state it: `limit 25.0 MB/s`, or `no limit`.
    pub fn limit_text(&self) -> String {
        match self.rate {
            Some(r) => format!("limit {}", human_rate(r as f64)),
            None => "no limit".into(),
        }
    }
}

pub struct Limiter<C: Clock> {
    clock: C,
    spec: RateSpec,
    burst_left: u64,
    deadline: Duration,
    begun: bool,
}

fn cost(bytes: u64, rate: Option<u64>) -> Duration {
    match rate {
        None | Some(0) => Duration::ZERO,
        Some(r) => {
            let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(r);
            Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64)
        }
    }
}

impl<C: Clock> Limiter<C> {
    pub fn new(clock: C, spec: RateSpec) -> Self {
        let deadline = clock.now();
        Self {
            clock,
            spec,
            burst_left: spec.burst,
            deadline,
            begun: false,
        }
    }

    pub fn spec(&self) -> RateSpec {
        self.spec
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// What is left of the burst allowance.
    pub fn burst_left(&self) -> u64 {
        self.burst_left
    }

    /// Restores the full burst allowance (a new batch of dead space, as ESXi does after idle).
    pub fn refill_burst(&mut self) {
        self.burst_left = self.spec.burst;
    }

    /// Marks the start of a unit of work (a FITRIM window, an UNMAP command): time spent in
    /// the work itself counts towards its cost, idle time before it does not.
    pub fn begin(&mut self) {
        let now = self.clock.now();
        if self.deadline < now {
            self.deadline = now;
        }
        self.begun = true;
    }

    /// Accounts for `bytes` just passed to discard and sleeps until they are paid for.
    /// Returns how long it slept. Without a preceding [`Limiter::begin`] the work is taken to
    /// have been instantaneous.
    pub fn consume(&mut self, bytes: u64) -> Duration {
        let now = self.clock.now();
        if !self.begun && self.deadline < now {
            self.deadline = now;
        }
        self.begun = false;
        let from_burst = bytes.min(self.burst_left);
        self.burst_left -= from_burst;
        self.deadline += cost(from_burst, self.spec.burst_rate.or(self.spec.rate))
            + cost(bytes - from_burst, self.spec.rate);
        let wait = self.deadline.saturating_sub(now);
        if !wait.is_zero() {
            self.clock.sleep(wait);
        }
        wait
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// Virtual time: `sleep` advances it, `advance` simulates work.
    #[derive(Clone, Default)]
    pub struct FakeClock(Rc<Cell<Duration>>);
    impl FakeClock {
        pub fn advance(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }
    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
        fn sleep(&self, d: Duration) {
            self.advance(d);
        }
    }

    const MB: u64 = 1_000_000;

    #[test]
    fn steady_rate_is_held_exactly() {
        let clock = FakeClock::default();
        let mut l = Limiter::new(
            clock.clone(),
            RateSpec {
                rate: Some(25 * MB),
                burst: 0,
                burst_rate: None,
            },
        );
        // 40 windows of 128 MiB at 25 MB/s take 40 * 134217728 / 25e6 s.
        for _ in 0..40 {
            l.consume(128 << 20);
        }
        let expected = Duration::from_nanos(40 * (128 << 20) * 1_000_000_000 / (25 * MB));
        assert_eq!(clock.now(), expected);
        // Achieved rate over the pass is the requested one.
        let rate = (40 * (128u64 << 20)) as f64 / clock.now().as_secs_f64();
        assert!((rate - 25e6).abs() < 1.0, "{rate}");
    }

    #[test]
    fn slow_work_is_not_slowed_further_and_idle_banks_no_credit() {
        let clock = FakeClock::default();
        let spec = RateSpec {
            rate: Some(100 * MB),
            burst: 0,
            burst_rate: None,
        };
        let mut l = Limiter::new(clock.clone(), spec);
        // A window that took 2 s to trim 100 MB already ran below the rate: no sleep.
        l.begin();
        clock.advance(Duration::from_secs(2));
        assert_eq!(l.consume(100 * MB), Duration::ZERO);
        // A window that took 0.5 s for 100 MB waits out the other half second.
        l.begin();
        clock.advance(Duration::from_millis(500));
        assert_eq!(l.consume(100 * MB), Duration::from_millis(500));
        // An hour of idleness must not allow a burst afterwards, with or without begin().
        clock.advance(Duration::from_secs(3600));
        l.begin();
        assert_eq!(l.consume(200 * MB), Duration::from_secs(2));
        clock.advance(Duration::from_secs(3600));
        assert_eq!(l.consume(50 * MB), Duration::from_millis(500));
        assert_eq!(
            clock.now(),
            Duration::from_millis(2000 + 1000 + 3_600_000 + 2000 + 3_600_000 + 500)
        );
    }

    #[test]
    fn burst_allowance_runs_at_the_upper_rate_then_the_base_rate() {
        let clock = FakeClock::default();
        let spec = RateSpec {
            rate: Some(25 * MB),
            burst: 1000 * MB,
            burst_rate: Some(1000 * MB),
        };
        let mut l = Limiter::new(clock.clone(), spec);
        // 10 windows of 100 MB exhaust the allowance in 1 s.
        for _ in 0..10 {
            l.consume(100 * MB);
        }
        assert_eq!(clock.now(), Duration::from_secs(1));
        assert_eq!(l.burst_left(), 0);
        // A window straddling nothing: the next 100 MB go at 25 MB/s (4 s).
        l.consume(100 * MB);
        assert_eq!(clock.now(), Duration::from_secs(5));
        // A window straddling the end of a refilled allowance is split between both rates.
        l.refill_burst();
        l.consume(950 * MB); // 0.95 s at the upper rate
        l.consume(100 * MB); // 50 MB at 1 GB/s (0.05 s) + 50 MB at 25 MB/s (2 s)
        assert_eq!(clock.now(), Duration::from_secs(8));
    }

    #[test]
    fn unlimited_never_sleeps_and_burst_without_upper_rate_uses_base() {
        let clock = FakeClock::default();
        let mut l = Limiter::new(clock.clone(), RateSpec::unlimited());
        for _ in 0..100 {
            assert_eq!(l.consume(1 << 40), Duration::ZERO);
        }
        assert_eq!(clock.now(), Duration::ZERO);
        let spec = RateSpec {
            rate: Some(10 * MB),
            burst: 50 * MB,
            burst_rate: None,
        };
        let mut l = Limiter::new(clock.clone(), spec);
        l.consume(60 * MB);
        assert_eq!(clock.now(), Duration::from_secs(6));
    }
}
