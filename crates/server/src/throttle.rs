//! Slowing down guesses: API tokens and CHAP responses tried from one address.
//!
//! A few failures in a row from an address cost nothing (a typo, an initiator retrying
//! with an old secret); past [`FREE_FAILURES`], every attempt from that address waits
//! until [`delay_after`] the number of failures has passed since the last one: 250 ms,
//! then doubling up to [`MAX_DELAY`]. Attempts that arrive while others from the address
//! already wait are refused past [`MAX_WAITING`], so opening connections in parallel does
//! not buy more guesses: at most `MAX_WAITING` per delay. A success from the address
//! forgets it. Other addresses are never delayed.
//!
//! Addresses are IPv4 addresses or IPv6 /64 prefixes (one machine commonly holds a whole
//! /64). The table holds at most [`MAX_ADDRESSES`]; past that the address whose last
//! failure is oldest is forgotten, and an address is forgotten [`FORGET_AFTER`] after its
//! last failure. An attacker with many addresses can thus evict others; each of its own
//! addresses is still slowed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures in a row that cost nothing.
pub const FREE_FAILURES: u32 = 3;
/// The first delay; each further failure doubles it.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(8);
/// Attempts from one address waiting at once; more are refused.
pub const MAX_WAITING: u32 = 4;
/// Addresses remembered.
pub const MAX_ADDRESSES: usize = 4096;
/// How long an address's failures are remembered after its last one.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// How long attempts wait after `failures` failures in a row.
pub fn delay_after(failures: u32) -> Duration {
    if failures <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES - 1).min(16);
    (FIRST_DELAY * (1u32 << doublings)).min(MAX_DELAY)
}

/// Whether the `failures`th failure in a row is worth an event: the first, the one that
/// starts the slowdown, and then each doubling (a guessing loop leaves a few lines, not
/// one per guess).
pub fn worth_reporting(failures: u32) -> bool {
    failures == 1 || (failures > FREE_FAILURES && (failures - FREE_FAILURES).is_power_of_two())
}

/// Failed authentications by source address.
#[derive(Debug, Default)]
pub struct FailedLogins {
    table: Mutex<HashMap<Source, Record>>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Source(IpAddr);

impl Source {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Source(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
            v4 => Source(v4),
        }
    }
}

#[derive(Debug)]
struct Record {
    failures: u32,
    last_failure: Instant,
    /// Attempts sleeping in [`FailedLogins::wait_turn`] now.
    waiting: u32,
}

/// What an attempt from a slowed address is told.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// Go ahead after waiting this long (zero: at once).
    After(Duration),
    /// Too many attempts from the address already wait: refuse this one.
    Refused,
}

impl FailedLogins {
    pub fn new() -> Self {
        Self::default()
    }

    /// When an attempt from `ip` arriving at `now` may be checked. A [`Turn::After`] with a
    /// delay counts the attempt as waiting until [`FailedLogins::done_waiting`].
    pub fn turn(&self, ip: IpAddr, now: Instant) -> Turn {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = table.get_mut(&Source::of(ip)) else {
            return Turn::After(Duration::ZERO);
        };
        let ready = r.last_failure + delay_after(r.failures);
        if ready <= now {
            return Turn::After(Duration::ZERO);
        }
        if r.waiting >= MAX_WAITING {
            return Turn::Refused;
        }
        r.waiting += 1;
        Turn::After(ready - now)
    }

    /// An attempt that [`FailedLogins::turn`] made wait is done waiting.
    pub fn done_waiting(&self, ip: IpAddr) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = table.get_mut(&Source::of(ip)) {
            r.waiting = r.waiting.saturating_sub(1);
        }
    }

    /// Waits for the turn of an attempt from `ip`; `false`: refuse it.
    pub async fn wait_turn(&self, ip: IpAddr) -> bool {
        match self.turn(ip, Instant::now()) {
            Turn::Refused => false,
            Turn::After(d) if d.is_zero() => true,
            Turn::After(d) => {
                // Counted down also when the waiting request is dropped (client gone).
                struct Waiting<'a>(&'a FailedLogins, IpAddr);
                impl Drop for Waiting<'_> {
                    fn drop(&mut self) {
                        self.0.done_waiting(self.1);
                    }
                }
                let _waiting = Waiting(self, ip);
                tokio::time::sleep(d).await;
                true
            }
        }
    }

    /// Records a failure from `ip` at `now`; returns the failures in a row from it.
    pub fn failed(&self, ip: IpAddr, now: Instant) -> u32 {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let source = Source::of(ip);
        if !table.contains_key(&source) && table.len() >= MAX_ADDRESSES {
            table.retain(|_, r| now.saturating_duration_since(r.last_failure) < FORGET_AFTER);
            if table.len() >= MAX_ADDRESSES {
                if let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, r)| r.last_failure)
                    .map(|(s, _)| *s)
                {
                    table.remove(&oldest);
                }
            }
        }
        let r = table.entry(source).or_insert(Record {
            failures: 0,
            last_failure: now,
            waiting: 0,
        });
        if now.saturating_duration_since(r.last_failure) >= FORGET_AFTER {
            r.failures = 0;
        }
        r.failures = r.failures.saturating_add(1);
        r.last_failure = now;
        r.failures
    }

    /// A success from `ip`: its failures are forgotten.
    pub fn succeeded(&self, ip: IpAddr) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = table.get_mut(&Source::of(ip)) {
            r.failures = 0;
            // Kept while attempts still wait, for their count; forgotten otherwise.
            if r.waiting == 0 {
                table.remove(&Source::of(ip));
            }
        }
    }

    /// Addresses remembered now.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn delays_start_after_the_free_failures_double_and_stop_at_the_cap() {
        for n in 0..=FREE_FAILURES {
            assert_eq!(delay_after(n), Duration::ZERO);
        }
        assert_eq!(delay_after(FREE_FAILURES + 1), FIRST_DELAY);
        assert_eq!(delay_after(FREE_FAILURES + 2), FIRST_DELAY * 2);
        assert_eq!(delay_after(FREE_FAILURES + 3), FIRST_DELAY * 4);
        assert_eq!(delay_after(FREE_FAILURES + 30), MAX_DELAY);
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
        let reported: Vec<u32> = (1..=20).filter(|n| worth_reporting(*n)).collect();
        assert_eq!(reported, [1, 4, 5, 7, 11, 19]);
    }

    #[test]
    fn only_the_failing_address_waits_and_a_success_forgets_it() {
        let t = FailedLogins::new();
        let t0 = Instant::now();
        let (bad, good) = (ip("192.0.2.1"), ip("192.0.2.2"));
        for n in 1..=FREE_FAILURES {
            assert_eq!(t.turn(bad, t0), Turn::After(Duration::ZERO));
            assert_eq!(t.failed(bad, t0), n);
        }
        assert_eq!(t.turn(bad, t0), Turn::After(Duration::ZERO));
        assert_eq!(t.failed(bad, t0), FREE_FAILURES + 1);
        assert_eq!(t.turn(bad, t0), Turn::After(FIRST_DELAY));
        t.done_waiting(bad);
        assert_eq!(t.turn(good, t0), Turn::After(Duration::ZERO));
        // Time that passed counts.
        let later = t0 + FIRST_DELAY / 2;
        assert_eq!(t.turn(bad, later), Turn::After(FIRST_DELAY / 2));
        t.done_waiting(bad);
        assert_eq!(t.turn(bad, t0 + FIRST_DELAY), Turn::After(Duration::ZERO));
        t.succeeded(bad);
        assert!(t.is_empty());
        assert_eq!(t.turn(bad, t0), Turn::After(Duration::ZERO));
    }

    #[test]
    fn parallel_attempts_beyond_the_waiting_bound_are_refused() {
        let t = FailedLogins::new();
        let t0 = Instant::now();
        let bad = ip("192.0.2.1");
        for _ in 0..=FREE_FAILURES {
            t.failed(bad, t0);
        }
        for _ in 0..MAX_WAITING {
            assert!(matches!(t.turn(bad, t0), Turn::After(d) if !d.is_zero()));
        }
        assert_eq!(t.turn(bad, t0), Turn::Refused);
        t.done_waiting(bad);
        assert!(matches!(t.turn(bad, t0), Turn::After(_)));
    }

    #[test]
    fn an_ipv6_prefix_is_one_source_and_old_failures_are_forgotten() {
        let t = FailedLogins::new();
        let t0 = Instant::now();
        for host in 1..=FREE_FAILURES + 1 {
            t.failed(ip(&format!("2001:db8::{host}")), t0);
        }
        assert_eq!(t.len(), 1);
        assert!(matches!(t.turn(ip("2001:db8::ffff"), t0), Turn::After(d) if !d.is_zero()));
        assert_eq!(
            t.turn(ip("2001:db8:0:1::1"), t0),
            Turn::After(Duration::ZERO)
        );
        assert_eq!(t.failed(ip("2001:db8::1"), t0 + FORGET_AFTER), 1);
    }

    #[test]
    fn the_table_stays_bounded() {
        let t = FailedLogins::new();
        let t0 = Instant::now();
        for i in 0..MAX_ADDRESSES as u32 + 10 {
            t.failed(
                IpAddr::from((0x0a00_0000u32 + i).to_be_bytes()),
                t0 + Duration::from_millis(i.into()),
            );
        }
        assert_eq!(t.len(), MAX_ADDRESSES);
        // The oldest went first.
        assert_eq!(t.failed(ip("10.0.0.0"), t0 + Duration::from_secs(10)), 1);
    }
}
