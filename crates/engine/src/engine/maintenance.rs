//! Background work: checkpoints and collection at the configured pace, giving space back while hosts are idle, shutdown.

use super::*;

/// Map nodes a background round releases at most.
const RELEASE_PER_ROUND: u64 = 4096;

impl Engine {
    pub(super) fn wake_gc(&self) {
        self.collector.wakeup().wake();
    }

    pub(super) fn wake_segments(&self) {
        self.preparer.wakeup().wake();
    }

    /// One round of background maintenance: a checkpoint when due, then collection at the
    /// configured rate. Returns how long to sleep.
    pub fn maintain(&self) -> Result<Duration> {
        self.maintain_with(false)
    }

    /// The background thread's round: as [`Engine::maintain`], except that collection
    /// waits while hosts are busy and at least [`GC_DEFER_FREE_SHARE`] of the segments are
    /// free. Relocation then costs hosts CPU and lock time for space nobody needs yet (see
    /// the garbage collection section of docs/design.md). Below that share, or once hosts
    /// pause for a round, it runs at the configured rate again; a write short of space never
    /// waits for this thread.
    pub(super) fn maintain_in_background(&self) -> Result<Duration> {
        let now = self.host_activity.load(Ordering::Relaxed);
        let busy = self.activity_at_last_round.swap(now, Ordering::Relaxed) != now;
        let roomy = {
            let l = self.lock_log();
            l.segments.len() as f64 >= GC_DEFER_FREE_SHARE * self.geometry.segment_count as f64
        };
        self.maintain_with(busy && roomy)
    }

    /// Whether the log since the last root, the chunk records in it or the dirty pages call
    /// for a checkpoint. Nothing written since the last one: never (an idle array writes
    /// nothing).
    pub(super) fn checkpoint_due(&self, tuning: &Tuning) -> bool {
        let m = self.lock_meta();
        m.checkpoint.log_due(
            self.lock_log().head.appended(),
            tuning.checkpoint_bytes,
            CHECKPOINT_RECORDS,
        ) || m.state.pager().checkpoint_wanted()
    }

    /// Called by writers after a change: when the dirty pages have outgrown the cache, the
    /// writer writes them itself (the background round was too slow), which holds back
    /// writers that would grow them further. The change is applied already and will be
    /// durable with the log, so a checkpoint that fails here is logged, not reported to the
    /// command (a failure that matters has poisoned the engine). `over_budget` is what the
    /// writer read under its own lock hold, so a writer that finds the cache within budget
    /// (nearly always) takes the metadata lock once per command, not twice; it is read again
    /// under the maintenance lock before any page is written.
    pub(super) fn relieve_cache(&self, pressure: CachePressure) -> Result<()> {
        if pressure.checkpoint_wanted && !pressure.over_budget {
            // The background thread checkpoints while the dirty pages are few enough to
            // freeze in a short hold of the lock; a writer only wakes it.
            self.wake_gc();
        }
        if !pressure.over_budget {
            return Ok(());
        }
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        if !self.lock_meta().state.pager().over_budget() {
            return Ok(());
        }
        if let Err(e) = self.checkpoint_locked() {
            tracing::warn!("writing metadata pages for a writer: {e}");
        }
        Ok(())
    }

    pub(super) fn maintain_with(&self, defer_collection: bool) -> Result<Duration> {
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return Ok(Duration::from_secs(1));
        }
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        let tuning = self.tuning();
        if self.checkpoint_due(&tuning) {
            match self.checkpoint_locked() {
                // Collection below may free file system space; the next round tries again.
                Err(EngineError::NoSpace) => {
                    tracing::warn!("no space for a checkpoint on the file system; retrying");
                }
                other => other?,
            }
        }
        // Deleted volumes and unmapped ranges give their chunks back a bounded batch of
        // nodes at a time.
        self.release_nodes(RELEASE_PER_ROUND)?;
        self.refresh_one_usage()?;
        // Empty segments cost nothing to free: always take them.
        self.collect_empty()?;
        if defer_collection {
            return Ok(Duration::from_millis(250));
        }
        let Some(rate) = tuning.gc.bytes_per_second() else {
            return Ok(Duration::from_millis(500));
        };
        // Clean segments that are at most half live; the busier ones wait for space pressure,
        // where relocating them is worth its write amplification.
        match self.collect_one(0.5, false)? {
            Some(bytes) => Ok(Duration::from_secs_f64(bytes as f64 / rate as f64)),
            None => Ok(Duration::from_millis(500)),
        }
    }

    /// Give freed segments' space back in small batches for as long as no host I/O arrives
    /// (bounded, so maintenance keeps its other duties).
    pub(super) fn discard_while_idle(&self) {
        const BATCH: usize = 16;
        const IDLE: Duration = Duration::from_millis(200);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut seen = self.host_activity.load(Ordering::Relaxed);
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return;
        }
        while Instant::now() < deadline && self.lock_log().segments.any_undiscarded() {
            std::thread::sleep(IDLE.min(deadline.saturating_duration_since(Instant::now())));
            let now = self.host_activity.load(Ordering::Relaxed);
            if now != seen || self.stop.load(Ordering::Acquire) {
                return;
            }
            while self.host_activity.load(Ordering::Relaxed) == seen
                && Instant::now() < deadline
                && self.discard_freed(BATCH) > 0
            {}
            seen = self.host_activity.load(Ordering::Relaxed);
        }
    }

    /// Start the background threads: maintenance (`sliver-gc`: checkpoints, collection, giving
    /// space back while idle) and `sliver-segments` (keeps [`READY_SEGMENTS`] segments
    /// allocated ahead of the head). Returns the maintenance thread's handle.
    pub fn start_background(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        self.spawn_worker(
            "sliver-segments",
            |e| e.preparer.wakeup(),
            |e| {
                e.prepare_segments();
                Duration::from_secs(1)
            },
        );
        self.spawn_worker(
            "sliver-gc",
            |e| e.collector.wakeup(),
            |e| {
                let sleep = e.maintain_in_background().unwrap_or_else(|err| {
                    tracing::warn!("background maintenance: {err}");
                    Duration::from_secs(1)
                });
                // Outside `maintenance`: it sleeps to see whether hosts are idle.
                e.discard_while_idle();
                sleep
            },
        )
    }

    /// A thread running `round` until the engine is dropped (it holds a weak reference) or
    /// shut down, sleeping between rounds for what `round` returns, at most 1 s, or until
    /// its wakeup fires.
    pub(super) fn spawn_worker(
        self: &Arc<Self>,
        name: &str,
        wakeup: fn(&Engine) -> &Wakeup,
        round: fn(&Engine) -> Duration,
    ) -> std::thread::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let Some(engine) = weak.upgrade() else { return };
                if engine.stop.load(Ordering::Acquire) {
                    return;
                }
                let sleep = round(&engine);
                wakeup(&engine).wait(sleep.min(Duration::from_secs(1)));
            })
            .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"))
    }

    /// Flush, checkpoint and stop background work (clean shutdown: fast recovery next time).
    pub fn shutdown(&self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        self.wake_gc();
        self.wake_segments();
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        self.checkpoint()?;
        // Give back all space freed segments still hold (under the lock: no writer can take
        // one meanwhile), prepared ones included.
        let _m = self.lock_meta();
        let mut l = self.lock_log();
        // Writing ahead stops before their holes are punched.
        for s in l.segments.unprepare_all() {
            self.stop_writing_ahead(s);
        }
        self.punch_all_pending(&mut l);
        Ok(())
    }
}
