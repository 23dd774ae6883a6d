//! Polling a connection's socket for a short while before sleeping on it.
//!
//! A thread that sleeps when its connection goes quiet is woken by the next command: on a
//! virtual machine an idle vCPU halts, and waking it (an interrupt to the hypervisor and back)
//! cost more than the command itself. Measured per core (docs/benchmarks.md), a 4 KiB read
//! at QD1 took 80 us from the client's view with the target asleep between commands and
//! 43-46 us when it polled. SPDK polls all the time; Linux's guest haltpoll polls up to 200 us
//! before halting a vCPU (the hypervisor here turns that off). sliver polls only where it
//! pays and only as much as the machine can spare:
//!
//! - after a quiet period that ended within the window: an initiator that sends its next
//!   command right after each answer (QD1, a database log) gets polled for; one that sends
//!   every few milliseconds never is, so an idle or lightly used target costs no CPU;
//! - only for an initiator that waits for answers: at most [`MAX_BURST`] commands between
//!   quiet periods, and none found already waiting when a poll starts right after the
//!   connection answered (then not for the next [`PIPELINED_PAUSE`] quiet periods). With many commands outstanding the thread that
//!   sleeps wakes to a batch of them and takes them in one read, which polling breaks into a
//!   read per command (4 KiB reads at QD32 lost 8-9 % with it);
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

/// How many windows a quiet period the connection slept through may last and still be
/// worth polling for next time (it includes the wake-up).
const SLEEPER_ALLOWANCE: u32 = 2;

/// Quiet periods a connection sleeps through, without polling, after its next command was
/// found already waiting (the initiator sends without waiting for answers).
const PIPELINED_PAUSE: u32 = 64;

/// Most commands between two quiet periods of a connection that polls.
pub const MAX_BURST: u64 = 2;

/// Connections polling right now, across the target.
static POLLING: Slots = Slots::new();

/// Half the cores, at least one; asked once (std asks the kernel and cgroups each time).
pub(crate) fn slots() -> usize {
    static SLOTS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SLOTS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get() / 2)
            .unwrap_or(1)
            .max(1)
    })
}

/// Places among the connections polling at once.
pub(crate) struct Slots(AtomicUsize);

/// A place taken from [`Slots`]; given back on drop.
pub(crate) struct Slot<'a>(&'a Slots);

impl Slots {
    pub(crate) const fn new() -> Self {
        Slots(AtomicUsize::new(0))
    }

    /// A place, if fewer than `limit` are taken.
    pub(crate) fn take(&self, limit: usize) -> Option<Slot<'_>> {
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
    /// The last quiet period ended soon enough (see [`Pacing::input`]).
    worth_it: bool,
    /// The connection is polling through the current quiet period.
    polling: bool,
    /// Commands the connection had started when it last went quiet.
    started_then: u64,
    /// Quiet periods left without polling since input was found waiting.
    pause: u32,
}

impl Pacing {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            quiet_since: None,
            worth_it: false,
            polling: false,
            started_then: 0,
            pause: 0,
        }
    }

    /// The connection went quiet at `at`, having started `started` commands in all: seen by
    /// the loop, or recorded by the completion that left nothing in flight while the loop
    /// slept (whichever comes first counts).
    pub fn quiet_at(&mut self, at: Instant, started: u64) {
        match self.quiet_since {
            None => {
                self.quiet_since = Some(at);
                let burst =
                    started.saturating_sub(std::mem::replace(&mut self.started_then, started));
                if burst > MAX_BURST {
                    self.worth_it = false;
                }
            }
            Some(since) if at < since => self.quiet_since = Some(at),
            Some(_) => {}
        }
    }

    /// The loop finds the connection quiet at `now`: whether to poll, and until when.
    pub fn quiet(&mut self, now: Instant, started: u64) -> Option<Instant> {
        self.quiet_at(now, started);
        self.polling = self.would_poll();
        self.polling.then(|| now + self.window)
    }

    /// Whether the connection would poll if it went quiet now.
    pub fn would_poll(&self) -> bool {
        self.worth_it && !self.window.is_zero()
    }

    /// Input arrived at `now` (however it was found).
    pub fn input(&mut self, now: Instant) {
        if let Some(since) = self.quiet_since.take() {
            // Found by polling, it came within the poll (which may have started after the
            // quiet period did: the loop woken by the completion that began it); found by a
            // thread that slept, the gap includes the wake-up that polling would save (tens
            // of microseconds on a virtual machine), so it is allowed that much more.
            self.worth_it =
                self.polling || now.duration_since(since) <= self.window * SLEEPER_ALLOWANCE;
            if self.pause > 0 {
                self.pause -= 1;
                self.worth_it = false;
            }
        }
        self.polling = false;
    }

    /// A poll found the next command already waiting at its first look: the initiator does
    /// not wait for answers, and sleeping lets its commands gather into one read.
    pub fn pipelined(&mut self) {
        self.pause = PIPELINED_PAUSE;
        self.worth_it = false;
    }

    /// A poll ran to its end without input.
    pub fn missed(&mut self) {
        self.worth_it = false;
        self.polling = false;
        // Judged: the input that ends this quiet period does not turn polling on again.
        self.quiet_since = None;
    }
}

/// Look at `reader`'s socket until input arrives or `until` passes, yielding to the
/// runtime between looks. `None`: nothing came (or every polling place was taken);
/// `Some(Ok(0))`: the initiator closed the connection.
/// `Some((_, true))`: the input was there at the first look.
pub async fn poll_input(
    reader: &OwnedReadHalf,
    buf: &mut [u8],
    until: Instant,
) -> Option<(std::io::Result<usize>, bool)> {
    let _slot = POLLING.take(slots())?;
    let sock = socket2::SockRef::from(reader.as_ref());
    let mut first = true;
    loop {
        // The socket is non-blocking (tokio made it so): a read without input says
        // WouldBlock at once. Reading past tokio's readiness is harmless: a stale readiness
        // makes its next read find WouldBlock and wait again.
        match (&*sock).read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            other => return Some((other, first)),
        }
        first = false;
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

    /// A pacing with window `W`, and a clock: `us(n)` is `n` microseconds from now.
    fn pacing() -> (Pacing, impl Fn(u64) -> Instant) {
        let t0 = Instant::now();
        (Pacing::new(W), move |n| t0 + Duration::from_micros(n))
    }

    #[test]
    fn polls_only_after_a_quiet_period_that_ended_within_the_window() {
        let (mut p, us) = pacing();
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
        let (mut p, us) = pacing();
        p.quiet(us(0), 1);
        // The loop looks again (a timer, a kick) without input meanwhile: still quiet since 0.
        p.quiet(us(40), 1);
        p.input(us(130));
        assert_eq!(
            p.quiet(us(200), 2),
            None,
            "130 us after the start is past twice the window"
        );
    }

    #[test]
    fn a_connection_with_many_commands_outstanding_sleeps() {
        let (mut p, us) = pacing();
        p.quiet(us(0), 1);
        p.input(us(10));
        // Quick answers, but 32 commands in the burst: the sleeper takes them in one read.
        assert_eq!(p.quiet(us(100), 33), None);
        p.input(us(110));
        // Back to one command at a time.
        assert_eq!(p.quiet(us(200), 34), Some(us(250)));
    }

    #[test]
    fn a_quiet_period_the_loop_slept_through_counts_from_the_completion() {
        let (mut p, us) = pacing();
        // Commands completed on the pool while the loop slept: each completion that left
        // nothing in flight says when, and the next command came 30 us after it.
        p.quiet_at(us(0), 1);
        p.input(us(30));
        assert!(p.would_poll(), "polls for the next one");
        // The loop, woken to poll, sees the quiet later than the completion did.
        p.quiet_at(us(100), 2);
        assert_eq!(p.quiet(us(115), 2), Some(us(165)));
        p.input(us(140));
        assert!(p.would_poll(), "40 us after the completion");
        // A poll that ran out; a later command that came within the window of its
        // completion turns polling on again.
        p.quiet_at(us(200), 3);
        p.missed();
        p.input(us(900));
        assert!(!p.would_poll());
        p.quiet_at(us(1000), 4);
        p.input(us(1020));
        assert!(p.would_poll());
    }

    #[test]
    fn a_sleeper_is_allowed_its_wake_up_but_a_poller_only_the_window() {
        let (mut p, us) = pacing();
        // Slept through 80 us (the initiator's 40 and as much to wake): worth polling.
        p.quiet(us(0), 1);
        p.input(us(80));
        assert!(p.would_poll());
        // Polled, and the input came 45 us in: still worth it.
        assert_eq!(p.quiet(us(100), 2), Some(us(150)));
        p.input(us(145));
        assert!(p.would_poll());
        // A poll that finds nothing is a miss, whatever comes after it.
        assert_eq!(p.quiet(us(200), 3), Some(us(250)));
        p.missed();
        p.input(us(260));
        assert!(!p.would_poll(), "the window ran out before the input");
    }

    #[test]
    fn an_initiator_that_does_not_wait_for_answers_is_not_polled_for() {
        let (mut p, us) = pacing();
        p.quiet(us(0), 1);
        p.input(us(30));
        assert!(p.would_poll());
        // The next command was waiting at the first look.
        assert!(p.quiet(us(100), 2).is_some());
        p.pipelined();
        p.input(us(100));
        assert!(!p.would_poll());
        // Quick answers do not turn polling on again for a while.
        for k in 0..PIPELINED_PAUSE as u64 {
            assert_eq!(p.quiet(us(200 + 100 * k), 3 + k), None);
            p.input(us(210 + 100 * k));
        }
        assert!(p.quiet(us(100_000), 100).is_none());
        p.input(us(100_010));
        assert!(p.would_poll(), "then they do");
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
