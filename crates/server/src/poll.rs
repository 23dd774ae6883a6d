//! Polling a connection's socket for a short while before sleeping on it.
//!
//! A thread that sleeps when its connection goes quiet is woken by the next command: on a
//! virtual machine an idle vCPU halts, and waking it (an interrupt to the hypervisor and back)
//! cost more than the command itself. Measured per core (docs/benchmarks.md), a 4 KiB read
//! at QD1 took 81 us from the client's view with the target asleep between commands and
//! 42 us when it polled. SPDK polls all the time; Linux's guest haltpoll polls up to 200 us
//! before halting a vCPU (the hypervisor here turns that off). sliver polls only where it
//! pays and only as much as the machine can spare:
//!
//! - after a quiet period that ended within the window: an initiator that sends its next
//!   command right after each answer (QD1, a database log) gets polled for; one that sends
//!   every few milliseconds never is, so an idle or lightly used target costs no CPU;
//! - only between bursts of at most [`MAX_BURST`] commands: with many commands outstanding
//!   the thread that sleeps wakes to a batch of them and takes them in one read, which
//!   polling would break into a read per command (4 KiB reads at QD32 lost 9 % with it);
//! - a poll that runs out (the initiator slowed down) stops polling until a quiet period
//!   again ends within the window;
//! - at most half the cores (at least one) poll at any moment, across all connections;
//! - between looks at the socket the connection's task yields, so other connections on the
//!   same runtime thread run meanwhile.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::tcp::OwnedReadHalf;

/// Poll window when the configuration names none (`[iscsi] poll_us`).
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// Longest poll window the configuration accepts: past it polling costs more CPU than any
/// wake-up it saves.
pub const MAX_POLL: Duration = Duration::from_millis(1);

/// Most commands between two quiet periods of a connection that polls.
pub const MAX_BURST: u64 = 2;

/// Connections polling right now, across the target.
static POLLING: Slots = Slots(AtomicUsize::new(0));

fn slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() / 2)
        .unwrap_or(1)
        .max(1)
}

/// Places among the connections polling at once.
struct Slots(AtomicUsize);

/// A place taken from [`Slots`]; given back on drop.
struct Slot<'a>(&'a Slots);

impl Slots {
    fn take(&self, limit: usize) -> Option<Slot<'_>> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// When one connection polls: the decision, apart from the socket (tested without one).
#[derive(Debug)]
pub struct Pacing {
    window: Duration,
    /// When the connection last went quiet (nothing executing, nothing to send).
    quiet_since: Option<Instant>,
    /// The last quiet period ended within the window.
    worth_it: bool,
    /// Commands the connection had started when it last went quiet.
    started_then: u64,
}

impl Pacing {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            quiet_since: None,
            worth_it: false,
            started_then: 0,
        }
    }

    /// The connection went quiet at `now`, having started `started` commands in all:
    /// whether to poll, and until when.
    pub fn quiet(&mut self, now: Instant, started: u64) -> Option<Instant> {
        if self.quiet_since.is_none() {
            self.quiet_since = Some(now);
            let burst = started.saturating_sub(std::mem::replace(&mut self.started_then, started));
            if burst > MAX_BURST {
                self.worth_it = false;
            }
        }
        self.would_poll().then(|| now + self.window)
    }

    /// Whether the connection would poll if it went quiet now.
    pub fn would_poll(&self) -> bool {
        self.worth_it && !self.window.is_zero()
    }

    /// Input arrived at `now` (however it was found).
    pub fn input(&mut self, now: Instant) {
        if let Some(since) = self.quiet_since.take() {
            self.worth_it = now.duration_since(since) <= self.window;
        }
    }

    /// A poll ran to its end without input.
    pub fn missed(&mut self) {
        self.worth_it = false;
    }
}

/// Look at `reader`'s socket until input arrives or `until` passes, yielding to the
/// runtime between looks. `None`: nothing came (or every polling place was taken);
/// `Some(Ok(0))`: the initiator closed the connection.
pub async fn poll_input(
    reader: &OwnedReadHalf,
    buf: &mut [u8],
    until: Instant,
) -> Option<std::io::Result<usize>> {
    let _slot = POLLING.take(slots())?;
    let sock = socket2::SockRef::from(reader.as_ref());
    loop {
        // The socket is non-blocking (tokio made it so): a read without input says
        // WouldBlock at once. Reading past tokio's readiness is harmless: a stale readiness
        // makes its next read find WouldBlock and wait again.
        match (&*sock).read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            other => return Some(other),
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    #[test]
    fn polls_only_after_a_quiet_period_that_ended_within_the_window() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut p = Pacing::new(W);
        // Nothing known yet: sleep.
        assert_eq!(p.quiet(us(0), 1), None);
        // The next command came 30 us later: worth polling for the one after.
        p.input(us(30));
        assert_eq!(p.quiet(us(100), 2), Some(us(150)));
        // It came in time again.
        p.input(us(120));
        assert_eq!(p.quiet(us(200), 3), Some(us(250)));
        // This time the poll ran out: sleep until a quiet period ends within the window.
        p.missed();
        p.input(us(900));
        assert_eq!(
            p.quiet(us(1000), 4),
            None,
            "a 700 us gap is not worth polling for"
        );
        p.input(us(1040));
        assert_eq!(p.quiet(us(1100), 5), Some(us(1150)));
    }

    #[test]
    fn a_quiet_period_is_timed_from_its_start() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut p = Pacing::new(W);
        p.quiet(us(0), 1);
        // The loop looks again (a timer, a kick) without input meanwhile: still quiet since 0.
        p.quiet(us(40), 1);
        p.input(us(70));
        assert_eq!(
            p.quiet(us(100), 2),
            None,
            "70 us after the start is outside the window"
        );
    }

    #[test]
    fn a_connection_with_many_commands_outstanding_sleeps() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut p = Pacing::new(W);
        p.quiet(us(0), 1);
        p.input(us(10));
        // Quick answers, but 32 commands in the burst: the sleeper takes them in one read.
        assert_eq!(p.quiet(us(100), 33), None);
        p.input(us(110));
        // Back to one command at a time.
        assert_eq!(p.quiet(us(200), 34), Some(us(250)));
    }

    #[test]
    fn a_zero_window_never_polls() {
        let t0 = Instant::now();
        let mut p = Pacing::new(Duration::ZERO);
        p.quiet(t0, 1);
        p.input(t0);
        assert_eq!(p.quiet(t0, 2), None);
    }

    #[test]
    fn polling_places_are_limited_and_given_back() {
        let slots = Slots(AtomicUsize::new(0));
        let a = slots.take(2).expect("first");
        let b = slots.take(2).expect("second");
        assert!(slots.take(2).is_none(), "a third place beyond the limit");
        drop(a);
        let c = slots.take(2).expect("a place given back is taken again");
        drop((b, c));
        assert_eq!(slots.0.load(Ordering::Acquire), 0);
    }
}
