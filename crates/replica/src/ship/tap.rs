//! Recording: every write the engine completes copied into the current batch, batches cut
//! at syncs, roots, their size and a timer, the copy started over with a base past the
//! backlog bound, and the tap the engine's devices tell of their writes ([`ShipTap`]).

use super::base::read_base;
use super::{Batch, Cut, Mark, Shared, ShipState, ShipTap, BATCH_BYTES, SYNC_CUT_AGE};
use crate::stream::Record;
use sliver_engine::{Devices, WriteTap};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Shared {
    pub(super) fn record(&self, rec: Record<'_>) {
        if self.off.load(Ordering::Acquire) {
            return;
        }
        let mut b = self.batch.lock().unwrap();
        self.append_locked(&mut b, rec);
    }

    /// Add `rec` to the batch `b`, cutting it once full. Caller holds the batch lock.
    pub(super) fn append_locked(&self, b: &mut Batch, rec: Record<'_>) {
        b.since.get_or_insert_with(|| self.config.clock.now());
        rec.in_pieces(|piece| {
            piece.encode(&mut b.body);
            b.records += 1;
        });
        if b.body.len() >= self.batch_limit() {
            self.cut_locked(b);
        }
    }

    /// Bytes a batch may take: [`BATCH_BYTES`], or less under a small backlog bound so that
    /// one batch never fills it alone.
    pub(super) fn batch_limit(&self) -> usize {
        BATCH_BYTES.min((self.config.max_backlog / 4).max(64 << 10) as usize)
    }

    /// Cut the current batch (a sync point, a root, or the timer).
    pub(super) fn cut(&self) {
        let mut b = self.batch.lock().unwrap();
        self.cut_locked(&mut b);
    }

    /// A log sync: cut the batch once it has waited [`SYNC_CUT_AGE`] (or the whole cut
    /// interval, if shorter); a younger batch is cut by a later sync or the timer. Hosts that
    /// flush often, and write-through volumes, which sync for every group of writes (thousands
    /// of times a second), would otherwise make an object of every few writes.
    pub(super) fn cut_at_sync(&self) {
        let mut b = self.batch.lock().unwrap();
        let age = SYNC_CUT_AGE.min(self.config.cut_interval);
        // The clock is read only with a batch waiting: write-through volumes sync thousands of
        // times a second, mostly with nothing batched since the last cut.
        if b.since
            .is_some_and(|t| self.config.clock.now().saturating_duration_since(t) >= age)
        {
            self.cut_locked(&mut b);
        }
    }

    pub(super) fn cut_locked(&self, b: &mut Batch) {
        if b.body.is_empty() || self.off.load(Ordering::Acquire) {
            return;
        }
        let body = std::mem::take(&mut b.body);
        let since = b.since.take().unwrap_or_else(|| self.config.clock.now());
        let marks = std::mem::take(&mut b.marks);
        b.records = 0;
        let mut q = self.queue.lock().unwrap();
        if q.bytes + body.len() as u64 > self.config.max_backlog {
            // Hosts never wait for the store: the writes waiting are dropped, and the copy
            // starts over with a base, online.
            drop(q);
            let why = format!(
                "more than {} bytes waited for the store: copying the whole array again",
                self.config.max_backlog
            );
            self.start_over_locked(b, why, marks);
            return;
        }
        q.bytes += body.len() as u64;
        let id = q.next_id;
        q.next_id += 1;
        q.bodies.push_back(Cut {
            id,
            body: Arc::new(body),
            since,
            marks,
        });
        self.wake.notify_all();
    }

    /// Drop every write waiting for the store and start over with a restart base, online. The
    /// batch lock is held, so the base's start is the first record after the objects already
    /// numbered: a restore never applies a write that followed a dropped one without the base
    /// under it. Points asked for (in `marks` or the dropped batches) wait for that base.
    pub(super) fn start_over_locked(&self, b: &mut Batch, why: String, mut marks: Vec<Mark>) {
        // Before any point asked for can be looked at again: none may be taken until the
        // base is whole (the writes before it were in the batches dropped here).
        self.restarting.store(true, Ordering::Release);
        // What the batch holds is dropped too: the base reads it from the files.
        b.body.clear();
        b.records = 0;
        b.since = None;
        marks.append(&mut b.marks);
        let mut q = self.queue.lock().unwrap();
        let dropped = std::mem::take(&mut q.bodies);
        let mut points: Vec<Mark> = dropped
            .into_iter()
            .flat_map(|c| c.marks)
            .chain(marks.drain(..))
            .filter(|m| matches!(m, Mark::Point(_)))
            .collect();
        q.immediate.append(&mut points);
        q.bytes = 0;
        drop(q);
        tracing::warn!("replication: {why}");
        {
            let mut s = self.status.lock().unwrap();
            s.resyncs += 1;
            s.last_error = Some(why.clone());
            s.last_restart = Some(why);
        }
        self.begin_base_locked(b, false);
        self.wake.notify_all();
    }

    /// Start a base: its start record in the batch `b`, then a reader thread. `continues`: the
    /// stream before it is whole (a scheduled base); otherwise the batch is empty (a restart:
    /// nothing before it applies after it). Caller holds the batch lock.
    pub(super) fn begin_base_locked(&self, b: &mut Batch, continues: bool) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        if !continues {
            self.restarting.store(true, Ordering::Release);
        }
        b.marks.push(Mark::BaseStart {
            record: b.records,
            generation,
            continues,
        });
        self.append_locked(
            b,
            Record::BaseStart {
                capacity: self.capacity,
                continues,
            },
        );
        self.status.lock().unwrap().state = ShipState::Base;
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let reader = std::thread::Builder::new()
            .name("replica-base".into())
            .spawn(move || {
                if let Err(e) = read_base(&me, generation) {
                    tracing::error!("replication base failed: {e}");
                    me.off.store(true, Ordering::Release);
                    me.status.lock().unwrap().state =
                        ShipState::Broken(format!("reading the base: {e}"));
                }
            });
        match reader {
            Ok(h) => *self.base.lock().unwrap() = Some(h),
            Err(e) => {
                self.off.store(true, Ordering::Release);
                self.status.lock().unwrap().state =
                    ShipState::Broken(format!("starting the base reader: {e}"));
            }
        }
    }

    /// Record a base's record unless a newer base started meanwhile. Returns false then.
    pub(super) fn record_base(&self, rec: Record<'_>, generation: u64) -> bool {
        self.record_base_marked(rec, generation, None)
    }

    pub(super) fn record_base_marked(
        &self,
        rec: Record<'_>,
        generation: u64,
        mark: Option<Mark>,
    ) -> bool {
        if self.off.load(Ordering::Acquire) {
            return false;
        }
        let mut b = self.batch.lock().unwrap();
        if self.generation.load(Ordering::Acquire) != generation {
            return false;
        }
        b.marks.extend(mark);
        self.append_locked(&mut b, rec);
        // The cut may have started a newer base.
        self.generation.load(Ordering::Acquire) == generation
    }

    /// Block while more than a quarter of the backlog bound waits (the base's reader only:
    /// hosts' writes never wait, and the rest of the bound is theirs, with the collector's).
    pub(super) fn throttle(&self) {
        let mut q = self.queue.lock().unwrap();
        while q.bytes > self.config.max_backlog / 4
            && !self.off.load(Ordering::Acquire)
            && !self.stop.load(Ordering::Acquire)
        {
            q = self
                .wake
                .wait_timeout(q, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }
}

impl ShipTap {
    /// The engine's devices: the array's files, with every write they complete recorded here.
    pub fn devices(self: &Arc<Self>) -> Devices {
        Devices::of(self.inner.clone()).tapped(self.clone())
    }

    /// The server saved its configuration (after the engine change it names): into the
    /// stream, as a cut of its own.
    pub fn record_config(&self, bytes: &[u8]) {
        *self.shared.array_config.lock().unwrap() = Some(bytes.to_vec());
        self.shared.record(Record::Config { bytes, base: false });
        self.shared.cut();
    }
}

/// What the stream records of the engine's writes. Not recorded: a segment's zeros written
/// ahead and their sync (the range is free, its contents undefined, and the records later
/// written there are recorded as any others), allocations, and the format 2 checkpoint (an
/// array that ships is migrated before it opens).
impl WriteTap for ShipTap {
    fn log_written(&self, offset: u64, bytes: &[u8]) {
        self.shared.record(Record::Log {
            offset,
            bytes,
            base: false,
        });
    }

    fn log_discarded(&self, offset: u64, len: u64) {
        // Split below the record's 4 GiB length.
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(1 << 30);
            self.shared.record(Record::Discard { offset: at, len: n });
            at += n;
        }
    }

    /// Never fails: hosts never wait for the store.
    fn log_synced(&self) -> io::Result<()> {
        self.shared.cut_at_sync();
        Ok(())
    }

    fn meta_written(&self, offset: u64, bytes: &[u8]) {
        self.shared.record(Record::Meta {
            offset,
            bytes,
            base: false,
        });
    }

    fn meta_synced(&self) {
        self.shared.cut();
    }

    fn root_stored(&self, bytes: &[u8]) {
        self.shared.record(Record::Root { bytes, base: false });
        self.shared.cut();
    }
}

#[cfg(test)]
mod tests {
    use super::super::attach::prepare;
    use super::super::ShipConfig;
    use super::*;
    use crate::store::{MemStore, ObjectStore};
    use sliver_engine::{Engine, EngineConfig, FileBackend, Tuning};
    use std::sync::Mutex;

    /// A second tap beside the shipper's: what it is told, encoded as the shipper records it.
    #[derive(Default)]
    struct Second(Mutex<Vec<u8>>);

    impl Second {
        fn push(&self, rec: Record<'_>) {
            let mut body = self.0.lock().unwrap();
            rec.in_pieces(|piece| piece.encode(&mut body));
        }
    }

    impl WriteTap for Second {
        fn log_written(&self, offset: u64, bytes: &[u8]) {
            self.push(Record::Log {
                offset,
                bytes,
                base: false,
            });
        }
        fn log_discarded(&self, offset: u64, len: u64) {
            self.push(Record::Discard { offset, len });
        }
        fn log_synced(&self) -> io::Result<()> {
            Ok(())
        }
        fn meta_written(&self, offset: u64, bytes: &[u8]) {
            self.push(Record::Meta {
                offset,
                bytes,
                base: false,
            });
        }
        fn meta_synced(&self) {}
        fn root_stored(&self, bytes: &[u8]) {
            self.push(Record::Root { bytes, base: false });
        }
    }

    /// A second tap on the engine's devices is told exactly the bytes the shipper records, in
    /// the same order: the log's and the metadata's writes, the log's discards and the roots
    /// (RFC 0005, "Test plan").
    #[test]
    fn a_second_tap_sees_the_bytes_the_shipper_records() {
        let dir = tempfile::tempdir().unwrap();
        let files = FileBackend::open(dir.path(), 16 << 20).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(MemStore::default());
        let (tap, _shipper, _) =
            prepare(dir.path(), files, store, ShipConfig::default(), None).unwrap();
        // Recording as once attached, with no shipper thread: the cut batches stay queued.
        tap.shared.off.store(false, Ordering::Release);
        let tap = Arc::new(tap);
        let second = Arc::new(Second::default());
        let config = EngineConfig {
            chunk_size: 4096,
            segment_size: 1 << 20,
        };
        let engine = Engine::create(
            tap.devices().tapped(second.clone()),
            config,
            Tuning::default(),
        )
        .unwrap();
        let v = engine.create_volume(8 << 20).unwrap();
        for k in 0..40u64 {
            let data = sliver_test_support::data::unique(k, 64 << 10);
            engine.write(v, (k % 24) * (64 << 10), &data).unwrap();
            if k % 10 == 9 {
                engine.flush().unwrap();
            }
        }
        engine.checkpoint().unwrap();
        engine.delete_volume(v).unwrap();
        engine.collect_garbage(1.0).unwrap();
        engine.checkpoint().unwrap();
        engine.shutdown().unwrap();
        drop(engine);
        let mut shipped = Vec::new();
        for cut in &tap.shared.queue.lock().unwrap().bodies {
            shipped.extend_from_slice(&cut.body);
        }
        shipped.extend_from_slice(&tap.shared.batch.lock().unwrap().body);
        let told = second.0.lock().unwrap();
        let kinds = |body: &[u8]| {
            let mut n = [0usize; 4];
            for r in crate::stream::records(body, 0) {
                match r.unwrap() {
                    Record::Log { .. } => n[0] += 1,
                    Record::Meta { .. } => n[1] += 1,
                    Record::Root { .. } => n[2] += 1,
                    Record::Discard { .. } => n[3] += 1,
                    other => panic!("not a write: {other:?}"),
                }
            }
            n
        };
        let n = kinds(&shipped);
        assert!(n.iter().all(|&k| k > 0), "every kind recorded: {n:?}");
        assert_eq!(kinds(&told), n);
        assert!(*told == shipped, "the second tap saw other bytes");
    }
}
