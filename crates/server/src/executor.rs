//! Where SCSI commands run.
//!
//! The device server is synchronous: a command may wait for the engine's lock, the page cache
//! or the disk, so it runs on a tokio worker only when it cannot wait (a READ served from
//! cache, on its connection's task: `session::run_ready`). Two kinds of thread take the rest:
//!
//! - a small fixed pool (one thread per core, at least two) for the commands that carry the
//!   load: reads, writes without FUA and COMPARE AND WRITE of up to [`QUICK_MAX_BYTES`].
//!   They hold the engine's lock for microseconds; what limits them is handing work between
//!   threads. With tokio's blocking pool, 32 outstanding 4 KiB writes ran on 32 threads that
//!   queued on the same lock, and the futex wake-ups and context switches cost more than the
//!   writes (figures in docs/design.md);
//! - tokio's blocking pool for everything else: commands that wait for a flush (SYNCHRONIZE
//!   CACHE, FUA), long ones (EXTENDED COPY, WRITE SAME over large ranges, SANITIZE, large
//!   transfers) and rare ones. They must not hold up the quick pool, and the heartbeat
//!   COMPARE AND WRITEs of ESXi must not queue behind them.

use std::sync::OnceLock;

/// Largest transfer of a quick command.
pub const QUICK_MAX_BYTES: u64 = 256 * 1024;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct QuickPool {
    jobs: crossbeam_channel::Sender<Job>,
}

fn quick_pool() -> &'static QuickPool {
    static POOL: OnceLock<QuickPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .max(2);
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("sliver-io-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A panicking command must not take the thread (and every command
                        // queued behind it) with it; the session sees the command fail.
                        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                            tracing::error!("a SCSI command panicked on the I/O pool");
                        }
                    }
                })
                .expect("spawn an I/O thread");
        }
        QuickPool { jobs: tx }
    })
}

/// Largest copy an EXTENDED COPY on the quick pool may ask for. Between engine volumes a copy
/// shares chunk references (2 MiB from QEMU is one metadata record), but a copy involving a
/// passthrough volume or unaligned ends moves data, and that must stay short here.
pub const QUICK_MAX_COPY_BYTES: u64 = 32 << 20;

/// Whether a command goes to the quick pool: READ / WRITE (6, 10, 12, 16) without FUA and
/// COMPARE AND WRITE without FUA, moving at most [`QUICK_MAX_BYTES`]; EXTENDED COPY(LID1) whose
/// parameter list (`data_out`) asks for at most [`QUICK_MAX_COPY_BYTES`]. Hypervisors clone
/// with many small copies (QEMU: 2 MiB each, ESXi: 4 MiB by default), one at a time per
/// stream, so the hand-over to tokio's blocking pool was a visible share of each.
pub fn is_quick(cdb: &[u8], transfer_bytes: u64, data_out: &[u8]) -> bool {
    if transfer_bytes > QUICK_MAX_BYTES {
        return false;
    }
    let fua = cdb.get(1).is_some_and(|b| b & 0x08 != 0);
    match cdb.first() {
        // READ(6), READ(10), READ(12), READ(16): FUA on a read only bypasses our cache,
        // which costs nothing extra.
        Some(0x08 | 0x28 | 0xa8 | 0x88) => true,
        // WRITE(6) has no FUA bit.
        Some(0x0a) => true,
        // WRITE(10), WRITE(12), WRITE(16), COMPARE AND WRITE: with FUA they wait for a flush.
        Some(0x2a | 0xaa | 0x8a | 0x89) => !fua,
        // EXTENDED COPY(LID1) only: a token copy's list says nothing about its size here.
        Some(0x83) if cdb.get(1).is_some_and(|b| b & 0x1f == 0) => {
            sliver_scsi::copy_bytes_at_most(data_out)
                .is_some_and(|bytes| bytes <= QUICK_MAX_COPY_BYTES)
        }
        _ => false,
    }
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
    quick_pool().jobs.len()
}

/// Hand `job` to the quick pool.
pub fn run_quick(job: impl FnOnce() + Send + 'static) {
    // The pool lives as long as the process, so the channel never closes.
    let _ = quick_pool().jobs.send(Box::new(job));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_plain_writes_are_quick_flushes_and_large_transfers_are_not() {
        let is_quick = |cdb: &[u8], bytes| is_quick(cdb, bytes, &[]);
        assert!(is_quick(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0], 4096));
        assert!(is_quick(&[0x88, 0x08], 4096), "READ with FUA");
        assert!(is_quick(&[0x8a, 0x00], 65536));
        assert!(!is_quick(&[0x8a, 0x08], 4096), "WRITE(16) with FUA");
        assert!(!is_quick(&[0x2a, 0x08], 4096), "WRITE(10) with FUA");
        assert!(is_quick(&[0x89, 0x00], 1024), "COMPARE AND WRITE");
        assert!(!is_quick(&[0x89, 0x08], 1024), "COMPARE AND WRITE with FUA");
        assert!(!is_quick(&[0x28, 0], QUICK_MAX_BYTES + 512));
        assert!(!is_quick(&[0x35, 0], 0), "SYNCHRONIZE CACHE(10)");
        assert!(!is_quick(&[0x83, 0], 4096), "EXTENDED COPY");
        assert!(!is_quick(&[0x93, 0], 512), "WRITE SAME(16)");
        assert!(!is_quick(&[], 0));
    }

    #[test]
    fn only_a_small_lid1_extended_copy_is_quick() {
        // A LID1 header with no descriptors: it parses and moves nothing.
        let empty_list = [0u8; 16];
        assert!(is_quick(&[0x83, 0x00], 0, &empty_list));
        // The same bytes under POPULATE TOKEN or WRITE USING TOKEN say nothing about size.
        assert!(!is_quick(&[0x83, 0x10], 0, &empty_list));
        assert!(!is_quick(&[0x83, 0x11], 0, &empty_list));
    }

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
