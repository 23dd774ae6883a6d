//! Completions that wait for the log to be durable, without a thread each.
//!
//! A write-through command (WCE=0, FUA, SYNCHRONIZE CACHE) must not be answered before the
//! log holding it is synced. Waiting for that on the thread that ran the command would hold a
//! thread of the transport's small I/O pool for a whole `fdatasync` (0.2-8 ms here) per
//! command, so a queue of 32 writes would share a sync among at most as many writes as the
//! pool has threads. Instead the command registers what is to happen once it is durable
//! ([`Engine::flush_then`]) and its thread moves on; one thread here syncs for every command
//! waiting (through [`Engine::flush`], so it also shares syncs with synchronous callers) and
//! runs their completions. While a sync runs, new waiters gather for the next one: each sync
//! covers everything that arrived before it began, and a waiter never waits for more than the
//! sync in progress when it arrived plus its own (group commit as in jbd2 or a database's
//! log writer).
//!
//! The queue is its own lock and state (it never takes `meta` or `flush`), shared with the
//! thread, which holds the engine only weakly between rounds.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, OnceLock, Weak};
use std::time::Duration;

use super::ranked::{Rank, RankedGuard, RankedMutex};
use super::Engine;
use super::{EngineError, Result};

/// Why waiters left when the engine went away are answered with an error.
const CLOSED: &str = "the engine was closed before the write was durable";

/// What runs once the log up to a command's write is durable (or the sync failed).
pub type Durable = Box<dyn FnOnce(Result<()>) + Send>;

pub(super) struct GroupCommit {
    queue: RankedMutex<Queue>,
    work: Condvar,
    started: OnceLock<()>,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            queue: RankedMutex::new(Rank::Leaf, Queue::default()),
            work: Condvar::new(),
            started: OnceLock::new(),
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Durable>,
    /// The engine is gone or shut down: waiters are answered with an error.
    closed: bool,
}

impl GroupCommit {
    fn lock(&self) -> RankedGuard<'_, Queue> {
        // Completions never run under the lock, so a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `done`, or give it back when the queue is closed.
    fn push(&self, done: Durable) -> std::result::Result<(), Durable> {
        let mut queue = self.lock();
        if queue.closed {
            return Err(done);
        }
        let wake = queue.waiting.is_empty();
        queue.waiting.push(done);
        drop(queue);
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    /// The waiters queued so far, after waiting up to `idle` for the first.
    fn take(&self, idle: Duration) -> Vec<Durable> {
        let queue = self.lock();
        let (mut queue, _) = queue
            .wait_timeout_while(&self.work, idle, |q| q.waiting.is_empty() && !q.closed)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut queue.waiting)
    }

    /// Answer every waiter with an error and refuse new ones.
    fn close(&self, why: &str) {
        let waiting = {
            let mut queue = self.lock();
            queue.closed = true;
            std::mem::take(&mut queue.waiting)
        };
        self.work.notify_all();
        for done in waiting {
            done(Err(EngineError::Poisoned(why.into())));
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.close(CLOSED);
    }
}

/// An engine error for each of several waiters (errors are not `Clone`).
fn shared_error(e: &EngineError) -> EngineError {
    match e {
        EngineError::Poisoned(why) => EngineError::Poisoned(why.clone()),
        other => EngineError::Poisoned(other.to_string()),
    }
}

impl Engine {
    /// Run `done` once every write completed before this call is durable, on the engine's
    /// group-commit thread (here, at once, for a read-only or poisoned engine). `done` must
    /// not block for long: it runs before the next sync's waiters are answered, and in a
    /// round with the other waiters of its sync, whose transports write their answers once
    /// the round is over ([`sliver_volume::answers`]). One that panics is logged; the others
    /// are still answered.
    pub fn flush_then(self: &Arc<Self>, done: Durable) {
        if self.read_only {
            return done(Ok(()));
        }
        if self.poisoned.load(Ordering::Acquire) {
            return done(Err(self.poisoned_error()));
        }
        // Started with the first waiter: engines that never see a write-through command
        // never have the thread.
        self.group_commit.started.get_or_init(|| {
            let engine = Arc::downgrade(self);
            let commit = self.group_commit.clone();
            std::thread::Builder::new()
                .name("sliver-commit".into())
                .spawn(move || group_commit_thread(engine, commit))
                .expect("spawn the group-commit thread");
        });
        if let Err(done) = self.group_commit.push(done) {
            done(Err(EngineError::Poisoned(
                "the engine is shutting down".into(),
            )));
        }
    }
}

/// Sync for every waiter queued, round after round, until the engine is dropped or shut
/// down; the queue is then closed (its waiters answered with an error).
fn group_commit_thread(engine: Weak<Engine>, commit: Arc<GroupCommit>) {
    loop {
        // Holding only the queue while idle: the engine can be dropped meanwhile.
        let waiting = commit.take(Duration::from_secs(1));
        let Some(engine) = engine.upgrade() else {
            commit.close(CLOSED);
            return;
        };
        if waiting.is_empty() {
            if engine.stop.load(Ordering::Acquire) {
                commit.close("the engine is shutting down");
                return;
            }
            continue;
        }
        let result = engine.flush();
        drop(engine);
        answer_round(waiting, result);
    }
}

/// Answer one sync's waiters as one round of answers ([`sliver_volume::answers`]): their
/// transports write what the round answered once it is over, a write and at most one wake-up
/// per connection instead of one per command.
fn answer_round(waiting: Vec<Durable>, result: Result<()>) {
    sliver_volume::answers::in_round(|| {
        for done in waiting {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(shared_error(e)),
            };
            // A completion that panics must not take the thread, and every later
            // write-through command with it, down.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(outcome))).is_err() {
                tracing::error!("a write-through completion panicked on the group-commit thread");
            }
        }
    });
}
