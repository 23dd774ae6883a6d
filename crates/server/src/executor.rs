//! Where SCSI commands run.
//!
//! The device server is synchronous: a command may wait for the engine's lock, the page cache
//! or the disk, so it runs on a tokio worker only when it cannot wait (a READ served from
//! cache, on its connection's task: `connection::task::run_ready`). Two kinds of thread take the rest:
//!
//! - a small fixed pool (one thread per core, at least two) for the commands that carry the
//!   load, those the SCSI core does not place as blocking ([`sliver_scsi::Placement`]):
//!   reads, writes and COMPARE AND WRITE of up to [`sliver_scsi::dispatch::QUICK_MAX_BYTES`],
//!   SYNCHRONIZE CACHE, small EXTENDED COPYs.
//!   They hold the engine's lock for microseconds; what limits them is handing work between
//!   threads. With tokio's blocking pool, 32 outstanding 4 KiB writes ran on 32 threads that
//!   queued on the same lock, and the futex wake-ups and context switches cost more than the
//!   writes (figures in docs/design.md);
//! - tokio's blocking pool for everything else: commands that wait for a flush (SYNCHRONIZE
//!   CACHE, FUA), long ones (EXTENDED COPY, WRITE SAME over large ranges, SANITIZE, large
//!   transfers) and rare ones. They must not hold up the quick pool, and the heartbeat
//!   COMPARE AND WRITEs of ESXi must not queue behind them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The quick pool's queue. A thread with nothing to do sleeps on the condition variable at
/// once: no spinning and no `sched_yield` before it parks, which on a machine with as many
/// busy threads as cores only takes the CPU from the thread that would give it work (the
/// channel this replaced spent 6-9 % of a target core yielding under 4 KiB random writes,
/// `bench/profile`). A push wakes a thread only when one sleeps.
struct QuickPool {
    queue: Mutex<Queue>,
    work: Condvar,
    /// `queue.jobs.len()`, kept beside it for [`quick_queued`], which every completion asks:
    /// read without the queue's lock.
    queued: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads asleep on `work` that no push has woken yet.
    idle: usize,
    /// Wake-ups sent and not yet taken by a thread: a burst of pushes wakes as many threads
    /// as are asleep, then no more (each `notify_one` is a system call).
    woken: usize,
}

impl QuickPool {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A job never runs under the lock, so a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next(&self) -> Job {
        let mut queue = self.lock();
        loop {
            if let Some(job) = queue.jobs.pop_front() {
                self.queued.store(queue.jobs.len(), Ordering::Relaxed);
                return job;
            }
            queue.idle += 1;
            queue = self.work.wait(queue).unwrap_or_else(|e| e.into_inner());
            if queue.woken > 0 {
                queue.woken -= 1;
            } else {
                // Woken by no push (spurious): still asleep as far as pushes know.
                queue.idle -= 1;
            }
        }
    }

    fn push(&self, job: Job) {
        let mut queue = self.lock();
        queue.jobs.push_back(job);
        self.queued.store(queue.jobs.len(), Ordering::Relaxed);
        let wake = queue.idle > 0;
        if wake {
            queue.idle -= 1;
            queue.woken += 1;
        }
        drop(queue);
        if wake {
            self.work.notify_one();
        }
    }
}

fn quick_pool() -> &'static QuickPool {
    static POOL: OnceLock<QuickPool> = OnceLock::new();
    static STARTED: OnceLock<()> = OnceLock::new();
    let pool = POOL.get_or_init(|| QuickPool {
        queue: Mutex::new(Queue::default()),
        work: Condvar::new(),
        queued: AtomicUsize::new(0),
    });
    STARTED.get_or_init(|| {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .max(2);
        for i in 0..threads {
            std::thread::Builder::new()
                .name(format!("sliver-io-{i}"))
                .spawn(move || loop {
                    let job = pool.next();
                    // A panicking command must not take the thread (and every command
                    // queued behind it) with it; the session sees the command fail.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                        tracing::error!("a SCSI command panicked on the I/O pool");
                    }
                })
                .expect("spawn an I/O thread");
        }
    });
    pool
}

/// Run `job` on the quick pool when `quick`, else on tokio's blocking pool; returns when it
/// has been handed over (quick) or has finished (blocking pool).
pub async fn run(quick: bool, job: impl FnOnce() + Send + 'static) {
    if quick {
        run_quick(job);
    } else {
        let _ = tokio::task::spawn_blocking(job).await;
    }
}

/// Commands waiting in the quick pool's queue (not yet taken by a thread).
pub fn quick_queued() -> usize {
    quick_pool().queued.load(Ordering::Relaxed)
}

/// Hand `job` to the quick pool.
pub fn run_quick(job: impl FnOnce() + Send + 'static) {
    quick_pool().push(Box::new(job));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_jobs_run_and_a_panic_does_not_stop_the_pool() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.block_on(async {
            run(true, || panic!("a broken command")).await;
            for i in 0..64 {
                let tx = tx.clone();
                run(true, move || tx.send(i).unwrap()).await;
            }
        });
        let mut got: Vec<i32> = (0..64)
            .map(|_| rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, (0..64).collect::<Vec<_>>());
    }
}
