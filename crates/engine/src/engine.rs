//! The engine: log appends, the write and read paths, group commit, recovery, checkpoints and
//! garbage collection. See docs/design.md ("The engine") for the reasoning.
//!
//! Concurrency: one mutex (`meta`) guards the metadata and the log head; records are appended
//! and applied under it, so the log order is the apply order and recovery reproduces exactly
//! the state that was acknowledged. Hashing, compression and data reads happen outside it.
//! `reuse` keeps the garbage collector from recycling a segment while a reader that looked up
//! a chunk location in it is still reading.

use crate::backend::Backend;
use crate::checkpoint::{self, Counters, Geometry, Head};
use crate::format::{
    self, Codec, Encoder, Record, CHUNK_PREFIX, RECORD_HEADER, SEAL_LEN, SEGMENT_START_LEN,
};
use crate::state::{holds_data, Loc, SegState, Segment, State, ANCHORED};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("out of space")]
    NoSpace,
    #[error("engine is poisoned (read-only) after an I/O failure: {0}")]
    Poisoned(String),
    #[error("volume {0} does not exist")]
    NoSuchVolume(u32),
    #[error("range {offset}+{len} bytes is beyond the end of volume {volume} ({size} bytes)")]
    OutOfRange {
        volume: u32,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("damaged data at volume offset {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("damaged metadata: {0}")]
    Metadata(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// How chunks are compressed before they are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    /// zstd at the given level.
    Zstd(i32),
}

/// Background garbage-collection speed, mirroring ESXi's reclaim priority. Whatever the
/// setting, a write that needs space the collector can free waits for it rather than failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcPriority {
    Off,
    Low,
    Medium,
    High,
    /// Relocate at most this many bytes per second.
    Rate(u64),
}

impl GcPriority {
    fn bytes_per_second(self) -> Option<u64> {
        match self {
            GcPriority::Off => None,
            GcPriority::Low => Some(25_000_000),
            GcPriority::Medium => Some(75_000_000),
            GcPriority::High => Some(250_000_000),
            GcPriority::Rate(r) => Some(r.max(1)),
        }
    }
}

/// Parameters of a new engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Bytes per chunk: a power of two from 4 KiB to 64 KiB.
    pub chunk_size: u32,
    /// Bytes per log segment (the unit of allocation and garbage collection).
    pub segment_size: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            chunk_size: 4096,
            segment_size: 4 << 20,
        }
    }
}

/// Tunables that may change at run time.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    pub compression: Compression,
    pub gc: GcPriority,
    /// Share of capacity in use that raises the thin-provisioning soft threshold (0..1).
    pub soft_threshold: f64,
    /// Write a checkpoint after this many bytes of log (or 8 times the last checkpoint's size,
    /// whichever is more).
    pub checkpoint_bytes: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            compression: Compression::Lz4,
            gc: GcPriority::Medium,
            soft_threshold: 0.8,
            checkpoint_bytes: 256 << 20,
        }
    }
}

/// Array-wide space figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSpace {
    /// Bytes hosts can fill (log capacity less the garbage collector's reserve).
    pub capacity_bytes: u64,
    /// Bytes of log segments in use.
    pub physical_used_bytes: u64,
    /// Bytes of stored chunks still referenced.
    pub live_bytes: u64,
    /// Bytes in use but no longer referenced: what garbage collection can return.
    pub reclaimable_bytes: u64,
    /// Logical bytes mapped by all volumes (zeros and unmapped space excluded).
    pub logical_mapped_bytes: u64,
    /// Provisioned bytes of all volumes.
    pub provisioned_bytes: u64,
    /// logical_mapped_bytes / live_bytes.
    pub data_reduction: f64,
    /// provisioned_bytes / physical_used_bytes (thin provisioning and zeros included).
    pub total_reduction: f64,
    /// (host + relocated bytes) / host bytes written, since the array was created.
    pub write_amplification: f64,
    pub host_written_bytes: u64,
    pub gc_relocated_bytes: u64,
    pub soft_threshold_exceeded: bool,
    pub unique_chunks: u64,
    /// Log space held for anchored blocks (SBC ANCHOR): not in use, but not available.
    pub anchored_bytes: u64,
}

/// Space figures of one volume (see `sliver_volume::VolumeSpace`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VolumeUsage {
    pub provisioned_bytes: u64,
    pub mapped_bytes: u64,
    /// Anchored: no data, space held for it.
    pub anchored_bytes: u64,
    pub unique_bytes: u64,
    pub shared_bytes: u64,
}

struct Meta {
    state: State,
    head: Head,
    /// Total bytes appended since open (the flush target).
    appended: u64,
    counters: Counters,
    /// Sequence of the head in the last durable checkpoint: segments older than it hold no
    /// record recovery still needs besides live chunks.
    checkpoint_seq: u64,
    appended_at_checkpoint: u64,
    checkpointed_at: Instant,
    /// Size of the last checkpoint written (0 before the first of this run).
    checkpoint_len: u64,
    free: Vec<u32>,
    /// Segments the collector has freed since open. A writer waiting for space judges a
    /// collection by this, not by the free list's length: other writers may take the freed
    /// segments before it retries, which is progress too.
    freed: u64,
    /// Free segments whose file space has not been given back yet (see
    /// [`Engine::discard_freed`]). Always a subset of `free`.
    undiscarded: std::collections::BTreeSet<u32>,
    /// Free segments whose file space was allocated ahead of need, outside the lock (see
    /// [`Engine::prepare_segments`]); the head moves to these first. A subset of `free`,
    /// disjoint from `undiscarded`.
    ready: std::collections::BTreeSet<u32>,
    /// Free segments the preparer is allocating right now (still in `free`, so space figures
    /// and the reserve checks do not move; the head takes them last).
    preparing: std::collections::BTreeSet<u32>,
}

/// A flag a background thread sleeps on until it is set or a timeout passes.
#[derive(Default)]
struct Wakeup {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Wakeup {
    fn wake(&self) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Sleep until woken or `timeout` passes, and clear the flag.
    fn wait(&self, timeout: Duration) {
        let woken = self.woken.lock().unwrap();
        let (mut woken, _) = self.cv.wait_timeout_while(woken, timeout, |w| !*w).unwrap();
        *woken = false;
    }
}

/// Free segments kept allocated in the log file ahead of the head (256 MiB with 4 MiB
/// segments: about a second of a fast sequential write, the longest allocation stall seen).
const READY_SEGMENTS: usize = 64;

/// A checkpoint at least this often while the log grows: bounds recovery time and lets the
/// collector reach recently emptied segments.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);

/// A checkpoint holds the whole metadata (about 0.75 % of the unique data), so the log
/// written between two of them is at least this many times its size: checkpoints then cost
/// at most 1/8 of the bytes and of the encoding work that hosts' writes cause, while replay
/// after a crash reads at most this many checkpoints' worth of log.
const CHECKPOINT_SIZE_FACTOR: u64 = 8;

/// Collections a write may trigger before it reports out of space (the backing file system
/// itself may be full, which collection cannot always fix).
const MAX_COLLECTIONS: u32 = 8;

struct FlushState {
    durable: u64,
    syncing: bool,
}

/// What a write of one chunk turns into.
enum Prepared {
    Zero,
    Data {
        hash: [u8; 16],
        codec: Codec,
        bytes: Vec<u8>,
    },
}

/// Outcome of recovery, for logs and `sliver check`.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    pub records_replayed: u64,
    pub bytes_replayed: u64,
    pub torn_tail: bool,
    pub duration: Duration,
}

pub struct Engine {
    backend: Arc<dyn Backend>,
    geometry: Geometry,
    meta: Mutex<Meta>,
    reuse: RwLock<()>,
    flush: Mutex<FlushState>,
    flushed: Condvar,
    poison: Mutex<Option<String>>,
    poisoned: AtomicBool,
    /// Serialises garbage collection and checkpoints.
    maintenance: Mutex<()>,
    tuning: Mutex<Tuning>,
    stop: AtomicBool,
    gc_wakeup: Wakeup,
    /// Wakes the thread that prepares segments ([`Engine::prepare_segments`]).
    segments_wakeup: Wakeup,
    /// Bumped by every host read and write: maintenance gives file space back only while it
    /// stands still (hole punching stalls the log appends and reads hosts wait for).
    host_activity: AtomicU64,
    /// `host_activity` at the previous background round: hosts were busy in between if it
    /// moved (see [`Engine::maintain_in_background`]).
    activity_at_last_round: AtomicU64,
    /// Bytes the collector has relocated since open (for rate limiting).
    gc_relocated: AtomicU64,
    /// Segments (index, sequence) the collector could not read (a medium error): skipped
    /// until their chunks are all dead, when they are freed without being read. A segment
    /// reused later has another sequence number.
    unreadable: Mutex<std::collections::BTreeSet<(u32, u64)>>,
    read_only: bool,
    recovery: Recovery,
}

/// Who asks for log space, which decides how deep into the reserve it may go.
#[derive(Clone, Copy)]
enum Space {
    /// New chunks from hosts: never into the collector's reserve nor into the space held for
    /// anchored entries.
    Data,
    /// New chunks from hosts that all replace anchored entries: may use the space held for
    /// them (the anchors they replace give it up as the write applies).
    AnchoredData,
    /// Records that free or share space (unmap, copy, dedup hits, volume changes): may use the
    /// reserve but leave the collector one segment.
    Metadata,
    /// The collector's relocations.
    Collector,
}

/// Longest run one [`Engine::chunk_status`] call reports (4 GiB of 4 KiB chunks): about
/// a millisecond of scanning under the lock.
pub const STATUS_SCAN_CHUNKS: u64 = 1 << 20;

/// Provisioning state of one chunk of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Holds data (which may be shared).
    Mapped,
    /// Holds nothing and reads as zeros.
    Deallocated,
    /// Holds nothing, reads as zeros, and has space held for a later write (SBC ANCHOR).
    Anchored,
}

impl ChunkState {
    fn of(id: u32) -> Self {
        match id {
            0 => ChunkState::Deallocated,
            ANCHORED => ChunkState::Anchored,
            _ => ChunkState::Mapped,
        }
    }
}

/// Share of free segments above which background collection waits for hosts to pause. Half:
/// with less free than that, collecting ahead keeps sustained writes from catching up with
/// the collector (at a quarter, the benchmark's random overwrites after an UNMAP of half the
/// array slowed down by more than half: runs 20261124-112440 and -115330 in bench/results).
const GC_DEFER_FREE_SHARE: f64 = 0.5;

/// Segments kept for the collector's relocations: hosts cannot fill them.
fn gc_reserve(segment_count: u32) -> u32 {
    (segment_count / 64).clamp(2, 64)
}

fn is_zero(data: &[u8]) -> bool {
    let words = data.chunks_exact(8);
    let rest = words.remainder();
    words
        .into_iter()
        .all(|w| u64::from_ne_bytes(w.try_into().unwrap()) == 0)
        && rest.iter().all(|&b| b == 0)
}

impl Engine {
    /// Format a new engine on an empty backend.
    pub fn create(backend: Arc<dyn Backend>, config: EngineConfig, tuning: Tuning) -> Result<Self> {
        if !config.chunk_size.is_power_of_two() || !(4096..=65536).contains(&config.chunk_size) {
            return Err(EngineError::Invalid(format!(
                "chunk size {} is not a power of two from 4 KiB to 64 KiB",
                config.chunk_size
            )));
        }
        if config.segment_size < config.chunk_size * 16 || config.segment_size > 1 << 30 {
            return Err(EngineError::Invalid(format!(
                "segment size {} must be 16 chunks to 1 GiB",
                config.segment_size
            )));
        }
        let segment_count =
            (backend.capacity() / config.segment_size as u64).min(u32::MAX as u64) as u32;
        if segment_count < 8 {
            return Err(EngineError::Invalid(format!(
                "capacity {} bytes holds fewer than 8 segments of {} bytes",
                backend.capacity(),
                config.segment_size
            )));
        }
        if backend.load_checkpoint()?.is_some() {
            return Err(EngineError::Invalid(
                "the backend already holds an engine".into(),
            ));
        }
        let mut key = [0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut key[..]);
        let geometry = Geometry {
            chunk_size: config.chunk_size,
            segment_size: config.segment_size,
            segment_count,
            key,
        };
        let mut state = State::new(config.chunk_size, segment_count);
        // Segment 0, sequence 1, holds the first record.
        backend.allocate(0, config.segment_size as u64)?;
        let mut buf = Vec::new();
        Encoder::new(&mut buf, 1).segment_start(1, 0);
        backend.write_at(&buf, 0)?;
        backend.sync()?;
        state.store.segments[0] = Segment {
            state: SegState::Open,
            seq: 1,
            written: SEGMENT_START_LEN as u32,
            live: 0,
        };
        let head = Head {
            segment: 0,
            seq: 1,
            offset: SEGMENT_START_LEN as u32,
        };
        let counters = Counters {
            next_volume: 1,
            ..Default::default()
        };
        backend.store_checkpoint(&checkpoint::encode(&geometry, head, counters, &state))?;
        let engine = Self::assemble(
            backend,
            geometry,
            state,
            head,
            counters,
            1,
            tuning,
            false,
            Recovery::default(),
        );
        // A new log has allocated nothing it could give back.
        engine.lock_meta().undiscarded.clear();
        Ok(engine)
    }

    /// Open an existing engine: load the checkpoint, replay the log after it, repair a torn
    /// tail. With `read_only` nothing is written (for the offline checker).
    pub fn open(backend: Arc<dyn Backend>, tuning: Tuning, read_only: bool) -> Result<Self> {
        let started = Instant::now();
        let bytes = backend
            .load_checkpoint()?
            .ok_or_else(|| EngineError::Metadata("no checkpoint: not an engine".into()))?;
        let loaded =
            checkpoint::decode(&bytes).map_err(|e| EngineError::Metadata(e.to_string()))?;
        let geometry = loaded.geometry;
        if geometry.segment_count as u64 * geometry.segment_size as u64 > backend.capacity() {
            return Err(EngineError::Metadata(
                "the log is smaller than the checkpoint says".into(),
            ));
        }
        let mut state = loaded.state;
        let mut counters = loaded.counters;
        let mut checkpoint_seq = loaded.head.seq;
        let mut recovery = Recovery::default();
        let end = replay(
            &*backend,
            &geometry,
            &mut state,
            &mut counters,
            loaded.head,
            &mut recovery,
        )?;
        // Chunks no map references can only be left by damage; keep them visible to the checker
        // in read-only mode, free them otherwise.
        // Replay frees ids as records drop references and reuses them as Chunk records name
        // them, so the free list it leaves can hold an id twice or an id in use: rebuild it
        // from the chunk table (found by the torture harness: an id handed out twice).
        state.store.rebuild_free_ids();
        let mut head = match end {
            LogEnd::Torn(h) => {
                recovery.torn_tail = true;
                h
            }
            LogEnd::AfterSeal(h) => h,
        };
        if !read_only {
            head = repair_tail(&*backend, &geometry, &mut state, end, loaded.head)?;
            // A checkpoint at the new head: recovery never again depends on the log before
            // it (whose tail may hold records of the lost history), and the segments left
            // behind become collectable at once.
            backend.store_checkpoint(&checkpoint::encode(&geometry, head, counters, &state))?;
            checkpoint_seq = head.seq;
        }
        recovery.duration = started.elapsed();
        let mut engine = Self::assemble(
            backend,
            geometry,
            state,
            head,
            counters,
            checkpoint_seq,
            tuning,
            read_only,
            recovery,
        );
        engine.read_only = read_only;
        // Paces the next checkpoint (see CHECKPOINT_SIZE_FACTOR) like one written by this run.
        engine
            .meta
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .checkpoint_len = bytes.len() as u64;
        Ok(engine)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        backend: Arc<dyn Backend>,
        geometry: Geometry,
        state: State,
        head: Head,
        counters: Counters,
        checkpoint_seq: u64,
        tuning: Tuning,
        read_only: bool,
        recovery: Recovery,
    ) -> Self {
        let free: Vec<u32> = (0..geometry.segment_count)
            .rev()
            .filter(|&i| state.store.segments[i as usize].state == SegState::Free)
            .collect();
        // A crash can leave freed segments' space allocated: give it back when idle. Holes
        // cost nothing to punch again, and adjacent segments go in one call.
        let undiscarded = free.iter().copied().collect();
        Engine {
            backend,
            geometry,
            meta: Mutex::new(Meta {
                state,
                head,
                appended: 0,
                counters,
                checkpoint_seq,
                appended_at_checkpoint: 0,
                checkpoint_len: 0,
                checkpointed_at: Instant::now(),
                free,
                freed: 0,
                undiscarded,
                ready: Default::default(),
                preparing: Default::default(),
            }),
            reuse: RwLock::new(()),
            flush: Mutex::new(FlushState {
                durable: 0,
                syncing: false,
            }),
            flushed: Condvar::new(),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            maintenance: Mutex::new(()),
            tuning: Mutex::new(tuning),
            stop: AtomicBool::new(false),
            gc_wakeup: Wakeup::default(),
            segments_wakeup: Wakeup::default(),
            host_activity: AtomicU64::new(0),
            activity_at_last_round: AtomicU64::new(0),
            gc_relocated: AtomicU64::new(0),
            unreadable: Mutex::new(Default::default()),
            read_only,
            recovery,
        }
    }

    pub fn chunk_size(&self) -> u32 {
        self.geometry.chunk_size
    }

    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub fn tuning(&self) -> Tuning {
        *self.tuning.lock().unwrap()
    }

    pub fn set_tuning(&self, tuning: Tuning) {
        *self.tuning.lock().unwrap() = tuning;
        self.wake_gc();
    }

    /// Whether segments in use exceed the soft threshold share of capacity. Cheap: one lock.
    pub fn soft_threshold_exceeded(&self) -> bool {
        let threshold = self.tuning.lock().unwrap().soft_threshold;
        let count = self.geometry.segment_count as f64;
        let usable = count - gc_reserve(self.geometry.segment_count) as f64;
        let m = self.lock_meta();
        let held = self.anchor_reserve(m.state.store.anchored) as f64;
        let used = count - m.free.len() as f64 + held;
        used > threshold * usable
    }

    /// Bytes hosts can fill: the log less the collector's reserve (as in [`Engine::space`]).
    pub fn capacity_bytes(&self) -> u64 {
        let usable = self
            .geometry
            .segment_count
            .saturating_sub(gc_reserve(self.geometry.segment_count));
        usable as u64 * self.geometry.segment_size as u64
    }

    /// Bytes hosts can still fill with new data (free segments outside the collector's reserve;
    /// reclaimable space not counted).
    pub fn available_bytes(&self) -> u64 {
        let m = self.lock_meta();
        let keep = gc_reserve(self.geometry.segment_count) as u64
            + self.anchor_reserve(m.state.store.anchored) as u64;
        (m.free.len() as u64).saturating_sub(keep) * self.geometry.segment_size as u64
    }

    /// Segments held for `anchored` entries: room to store each as an incompressible chunk,
    /// counting only 15/16 of a segment (a batch that does not fit starts a new segment),
    /// plus one for rounding.
    fn anchor_reserve(&self, anchored: u64) -> usize {
        if anchored == 0 {
            return 0;
        }
        let per = (RECORD_HEADER + CHUNK_PREFIX + self.geometry.chunk_size as usize + 4) as u64;
        let usable =
            (self.geometry.segment_size as u64 - (SEGMENT_START_LEN + SEAL_LEN) as u64) / 16 * 15;
        (anchored.saturating_mul(per).div_ceil(usable) + 1) as usize
    }

    /// Largest write that is applied all or nothing across a crash.
    pub fn atomic_write_limit(&self) -> u64 {
        self.batch_chunks() as u64 * self.geometry.chunk_size as u64
    }

    /// Chunks per batch: a batch takes at most 1/16 of a segment, which bounds the space a
    /// segment switch leaves unused.
    fn batch_chunks(&self) -> usize {
        let per = RECORD_HEADER + CHUNK_PREFIX + self.geometry.chunk_size as usize + 4;
        ((self.geometry.segment_size as usize / 16) / per).max(1)
    }

    fn lock_meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_writable(&self) -> Result<()> {
        self.host_activity.fetch_add(1, Ordering::Relaxed);
        if self.read_only {
            return Err(EngineError::Invalid("engine opened read-only".into()));
        }
        if self.poisoned.load(Ordering::Acquire) {
            let why = self.poison.lock().unwrap().clone().unwrap_or_default();
            return Err(EngineError::Poisoned(why));
        }
        Ok(())
    }

    /// Stop accepting writes: durability can no longer be promised.
    fn poison(&self, why: String) -> EngineError {
        tracing::error!("engine poisoned, refusing further writes: {why}");
        let mut p = self.poison.lock().unwrap();
        if p.is_none() {
            *p = Some(why.clone());
        }
        self.poisoned.store(true, Ordering::Release);
        EngineError::Poisoned(why)
    }

    pub fn poisoned(&self) -> Option<String> {
        self.poison.lock().unwrap().clone()
    }

    // ----- volumes -----

    pub fn volumes(&self) -> Vec<(u32, u64)> {
        let m = self.lock_meta();
        m.state
            .volumes
            .iter()
            .map(|(id, v)| (*id, v.size))
            .collect()
    }

    pub fn volume_size(&self, volume: u32) -> Result<u64> {
        let m = self.lock_meta();
        m.state
            .volumes
            .get(&volume)
            .map(|v| v.size)
            .ok_or(EngineError::NoSuchVolume(volume))
    }

    /// Create a volume of `size` bytes (a multiple of the chunk size); durable on return.
    pub fn create_volume(&self, size: u64) -> Result<u32> {
        self.check_size(size)?;
        let id = self.append_meta(|m, e| {
            let id = m.counters.next_volume;
            e.volume_create(id, size);
            Ok(id)
        })?;
        Ok(id)
    }

    /// A new volume sharing all of `src`'s data (snapshot or clone); durable on return.
    pub fn clone_volume(&self, src: u32) -> Result<u32> {
        self.append_meta(|m, e| {
            if !m.state.volumes.contains_key(&src) {
                return Err(EngineError::NoSuchVolume(src));
            }
            let id = m.counters.next_volume;
            e.volume_clone(src, id);
            Ok(id)
        })
    }

    pub fn delete_volume(&self, volume: u32) -> Result<()> {
        self.append_meta(|m, e| {
            if !m.state.volumes.contains_key(&volume) {
                return Err(EngineError::NoSuchVolume(volume));
            }
            e.volume_delete(volume);
            Ok(())
        })?;
        self.wake_gc();
        Ok(())
    }

    pub fn resize_volume(&self, volume: u32, size: u64) -> Result<()> {
        self.check_size(size)?;
        self.append_meta(|m, e| {
            if !m.state.volumes.contains_key(&volume) {
                return Err(EngineError::NoSuchVolume(volume));
            }
            e.volume_resize(volume, size);
            Ok(())
        })
    }

    fn check_size(&self, size: u64) -> Result<()> {
        let cs = self.geometry.chunk_size as u64;
        if size == 0 || !size.is_multiple_of(cs) || size > (u32::MAX as u64) * cs * 1024 {
            return Err(EngineError::Invalid(format!(
                "volume size {size} must be a non-zero multiple of {cs} bytes"
            )));
        }
        Ok(())
    }

    /// Append one small metadata record built by `build`, apply it and make it durable.
    fn append_meta<T>(&self, build: impl Fn(&Meta, &mut Encoder) -> Result<T>) -> Result<T> {
        self.check_writable()?;
        let value = {
            let mut m = self.lock_meta();
            // Encode once to learn the size (metadata records do not depend on the position).
            let mut probe = Vec::new();
            let value = build(&m, &mut Encoder::new(&mut probe, 0))?;
            let at = self.reserve(&mut m, probe.len(), Space::Metadata)?;
            let mut buf = Vec::with_capacity(probe.len());
            build(&m, &mut Encoder::new(&mut buf, at.seq))?;
            self.append_at(&mut m, at, &buf)?;
            if let Ok((
                Record::VolumeCreate { volume, .. } | Record::VolumeClone { dst: volume, .. },
                _,
            )) = format::decode(&buf, at.seq)
            {
                m.counters.next_volume = m.counters.next_volume.max(volume + 1);
            }
            value
        };
        self.flush()?;
        Ok(value)
    }

    // ----- the log -----

    /// Room for `len` bytes at the head, switching to a new segment when needed.
    fn reserve(&self, m: &mut Meta, len: usize, class: Space) -> Result<Head> {
        let seg = self.geometry.segment_size as usize;
        if len + SEGMENT_START_LEN + SEAL_LEN > seg {
            return Err(EngineError::Invalid(format!(
                "record of {len} bytes exceeds a segment"
            )));
        }
        if m.head.offset as usize + len + SEAL_LEN > seg {
            let keep = match class {
                Space::Data => {
                    gc_reserve(self.geometry.segment_count) as usize
                        + self.anchor_reserve(m.state.store.anchored)
                }
                Space::AnchoredData => gc_reserve(self.geometry.segment_count) as usize,
                Space::Metadata => 1,
                Space::Collector => 0,
            };
            if m.free.len() <= keep {
                return Err(EngineError::NoSpace);
            }
            // New data stops while the file system still holds what frees space.
            if matches!(class, Space::Data | Space::AnchoredData) && !self.room_for_data(m) {
                return Err(EngineError::NoSpace);
            }
            // A prepared segment needs no system call here: allocating file space under the
            // lock stalled every command for up to a second while the file system committed
            // its journal for a checkpoint's fsync.
            let prepared = m.ready.pop_first();
            let next = match prepared {
                Some(s) => {
                    // Prepared segments sit on top of the free list.
                    if let Some(i) = m.free.iter().rposition(|&f| f == s) {
                        m.free.remove(i);
                    }
                    s
                }
                // The top segment not being prepared; failing that, one that is (allocating it
                // twice is harmless, and the preparer sees it was taken).
                None => {
                    let i = m
                        .free
                        .iter()
                        .rposition(|s| !m.preparing.contains(s))
                        .or(m.free.len().checked_sub(1));
                    let Some(i) = i else {
                        return Err(EngineError::NoSpace);
                    };
                    let s = m.free.remove(i);
                    m.preparing.remove(&s);
                    s
                }
            };
            if m.ready.len() < READY_SEGMENTS / 2 {
                self.wake_segments();
            }
            m.undiscarded.remove(&next);
            let base = next as u64 * seg as u64;
            let mut allocated = match prepared {
                Some(_) => Ok(()),
                None => self.backend.allocate(base, seg as u64),
            };
            if matches!(&allocated, Err(e) if e.raw_os_error() == Some(libc::ENOSPC))
                && !m.undiscarded.is_empty()
            {
                // The file system is full but free segments still hold space: give it back
                // now (the lock keeps them from being reused meanwhile) and try again.
                self.punch_all_pending(m);
                allocated = self.backend.allocate(base, seg as u64);
            }
            if let Err(e) = allocated {
                m.free.push(next);
                return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    EngineError::NoSpace
                } else {
                    self.poison(format!("cannot allocate a log segment: {e}"))
                });
            }
            let next_seq = m.head.seq + 1;
            let mut seal = Vec::new();
            Encoder::new(&mut seal, m.head.seq).seal(next, next_seq);
            let old = m.head;
            let mut start = Vec::new();
            Encoder::new(&mut start, next_seq).segment_start(next_seq, next);
            // On failure nothing changed: the head stays where it was (the next record
            // overwrites a seal written there) and the segment goes back.
            if let Err(e) = self
                .write_log(old.segment, old.offset, &seal)
                .and_then(|()| self.write_log(next, 0, &start))
            {
                m.free.push(next);
                m.undiscarded.insert(next);
                return Err(e);
            }
            let segments = &mut m.state.store.segments;
            segments[old.segment as usize].state = SegState::Sealed;
            segments[old.segment as usize].written = old.offset + SEAL_LEN as u32;
            segments[next as usize] = Segment {
                state: SegState::Open,
                seq: next_seq,
                written: SEGMENT_START_LEN as u32,
                live: 0,
            };
            m.head = Head {
                segment: next,
                seq: next_seq,
                offset: SEGMENT_START_LEN as u32,
            };
            m.appended += (SEAL_LEN + SEGMENT_START_LEN) as u64;
        }
        Ok(m.head)
    }

    fn write_log(&self, segment: u32, offset: u32, bytes: &[u8]) -> Result<()> {
        let at = segment as u64 * self.geometry.segment_size as u64 + offset as u64;
        match self.backend.write_at(bytes, at) {
            Ok(()) => Ok(()),
            Err(e) if out_of_space(&e) => self.clear_cut_short(at, bytes),
            Err(e) => Err(self.poison(format!("log write failed: {e}"))),
        }
    }

    /// A log write failed for want of space (a file system without fallocate, or one that
    /// filled behind our back): the file may hold a prefix of it. Nothing refers to those
    /// bytes, as the head has not moved, but the next record written there may be shorter and
    /// leave whole records of the prefix (a batch's inner chunk records) right behind it,
    /// where a replay would apply them. Zero the prefix; NoSpace when that works.
    fn clear_cut_short(&self, at: u64, bytes: &[u8]) -> Result<()> {
        let mut found = vec![0u8; bytes.len()];
        if let Err(e) = self.backend.read_at(&mut found, at) {
            return Err(self.poison(format!(
                "cannot read back a log write cut short by a full file system: {e}"
            )));
        }
        let landed = found.iter().zip(bytes).take_while(|(a, b)| a == b).count();
        if landed > 0 {
            if let Err(e) = self.backend.write_at(&vec![0u8; landed], at) {
                return Err(self.poison(format!(
                    "cannot clear a log write cut short by a full file system: {e}"
                )));
            }
        }
        Err(EngineError::NoSpace)
    }

    /// Whether the file system can take a segment of new data and still hold what frees space
    /// (a segment of metadata or relocations, a checkpoint). When it cannot, freed segments
    /// whose space was not given back yet are punched first.
    fn room_for_data(&self, m: &mut Meta) -> bool {
        let seg = self.geometry.segment_size as u64;
        if self.backend.has_room(seg, seg) {
            return true;
        }
        if m.undiscarded.is_empty() {
            return false;
        }
        self.punch_all_pending(m);
        self.backend.has_room(seg, seg)
    }

    /// Write `bytes` (records encoded for `at.seq`) at the reserved position and apply them.
    fn append_at(&self, m: &mut Meta, at: Head, bytes: &[u8]) -> Result<()> {
        debug_assert_eq!(at, m.head);
        self.write_log(at.segment, at.offset, bytes)?;
        m.head.offset += bytes.len() as u32;
        m.state.store.segments[at.segment as usize].written = m.head.offset;
        m.appended += bytes.len() as u64;
        for item in format::records(bytes, at.seq) {
            let (pos, record) = item
                .map_err(|e| self.poison(format!("self-encoded record failed to decode: {e:?}")))?;
            let loc = Loc {
                segment: at.segment,
                offset: at.offset + pos as u32,
            };
            m.state
                .apply(&record, loc, at.seq)
                .map_err(|e| self.poison(format!("applying a new record: {e}")))?;
        }
        Ok(())
    }

    /// Make every write completed so far durable (group commit: concurrent callers share one
    /// sync).
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let target = self.lock_meta().appended;
        let mut f = self.flush.lock().unwrap();
        loop {
            if self.poisoned.load(Ordering::Acquire) {
                let why = self.poison.lock().unwrap().clone().unwrap_or_default();
                return Err(EngineError::Poisoned(why));
            }
            if f.durable >= target {
                return Ok(());
            }
            if !f.syncing {
                f.syncing = true;
                drop(f);
                let upto = self.lock_meta().appended;
                let result = self.backend.sync();
                f = self.flush.lock().unwrap();
                f.syncing = false;
                match result {
                    Ok(()) => f.durable = f.durable.max(upto),
                    Err(e) => {
                        drop(f);
                        let err = self.poison(format!("fsync of the log failed: {e}"));
                        self.flushed.notify_all();
                        return Err(err);
                    }
                }
                self.flushed.notify_all();
            } else {
                f = self.flushed.wait(f).unwrap();
            }
        }
    }

    // ----- data path -----

    fn prepare(&self, data: &[u8]) -> Prepared {
        if is_zero(data) {
            return Prepared::Zero;
        }
        let hash: [u8; 16] = blake3::keyed_hash(&self.geometry.key, data).as_bytes()[..16]
            .try_into()
            .unwrap();
        let compression = self.tuning.lock().unwrap().compression;
        let compressed = match compression {
            Compression::None => None,
            Compression::Lz4 => Some((Codec::Lz4, lz4_flex::block::compress(data))),
            Compression::Zstd(level) => zstd::bulk::compress(data, level)
                .ok()
                .map(|c| (Codec::Zstd, c)),
        };
        match compressed {
            Some((codec, bytes)) if bytes.len() < data.len() => {
                Prepared::Data { hash, codec, bytes }
            }
            _ => Prepared::Data {
                hash,
                codec: Codec::Raw,
                bytes: data.to_vec(),
            },
        }
    }

    fn volume_range(m: &Meta, volume: u32, offset: u64, len: u64) -> Result<()> {
        let size = m
            .state
            .volumes
            .get(&volume)
            .ok_or(EngineError::NoSuchVolume(volume))?
            .size;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(EngineError::OutOfRange {
                volume,
                offset,
                len,
                size,
            }),
        }
    }

    /// Write `data` at byte `offset` of `volume`. Chunks are deduplicated, compressed, and
    /// all-zero chunks unmapped. Not durable until [`Engine::flush`].
    pub fn write(&self, volume: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, data.len() as u64)?;
        }
        if data.is_empty() {
            return Ok(());
        }
        let cs = self.geometry.chunk_size as u64;
        let limit = self.batch_chunks() as u64 * cs;
        // Pieces aligned to chunk boundaries, each one batch (crash-atomic).
        let mut pos = offset;
        let end = offset + data.len() as u64;
        while pos < end {
            let piece_end = ((pos / cs) * cs + limit).min(end);
            let slice = &data[(pos - offset) as usize..(piece_end - offset) as usize];
            self.write_piece(volume, pos, slice)?;
            pos = piece_end;
        }
        Ok(())
    }

    /// One batch: chunks `pos/cs ..= (end-1)/cs`.
    fn write_piece(&self, volume: u32, offset: u64, data: &[u8]) -> Result<()> {
        let cs = self.geometry.chunk_size as u64;
        let first = offset / cs;
        let last = (offset + data.len() as u64 - 1) / cs;
        let partial = |c: u64| -> bool {
            let start = c * cs;
            start < offset || start + cs > offset + data.len() as u64
        };
        // Full chunks do not depend on old data: prepare them once.
        let mut prepared: Vec<Option<Prepared>> = (first..=last)
            .map(|c| {
                if partial(c) {
                    None
                } else {
                    let a = (c * cs - offset) as usize;
                    Some(self.prepare(&data[a..a + cs as usize]))
                }
            })
            .collect();
        let partials: Vec<u64> = [first, last]
            .into_iter()
            .filter(|&c| partial(c))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut attempts = 0;
        let mut collections = 0;
        loop {
            attempts += 1;
            // Partial chunks: read the old content (optimistically, without the lock), merge,
            // and commit only if nobody changed those map entries meanwhile.
            let mut expected = Vec::new();
            for &c in &partials {
                let mut buf = vec![0u8; cs as usize];
                let old = self.read_chunks(volume, c, &mut buf)?[0];
                let start = c * cs;
                let from = offset.max(start);
                let to = (offset + data.len() as u64).min(start + cs);
                buf[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                prepared[(c - first) as usize] = Some(self.prepare(&buf));
                expected.push((c, old));
            }
            let mut m = self.lock_meta();
            let map = m
                .state
                .volumes
                .get(&volume)
                .ok_or(EngineError::NoSuchVolume(volume))?;
            // Compare id and fingerprint: an id freed and reused meanwhile has other content.
            let changed = expected.iter().any(|&(c, old)| {
                let id = map.get(c);
                id != old.0
                    || (holds_data(id) && m.state.store.chunk(id).map(|x| x.hash) != Some(old.1))
            });
            if changed {
                drop(m);
                if attempts > 1000 {
                    return Err(EngineError::Invalid(
                        "write kept racing with overlapping writes".into(),
                    ));
                }
                std::thread::yield_now();
                continue;
            }
            let items: Vec<&Prepared> = prepared
                .iter()
                .map(|p| p.as_ref().expect("prepared"))
                .collect();
            match self.commit(&mut m, volume, first, &items) {
                Err(EngineError::NoSpace) => {
                    drop(m);
                    collections += 1;
                    if collections <= MAX_COLLECTIONS && self.collect_for_space()? {
                        continue;
                    }
                    return Err(EngineError::NoSpace);
                }
                other => return other,
            }
        }
    }

    /// Encode and append one batch mapping chunks `first..` of `volume`.
    fn commit(&self, m: &mut Meta, volume: u32, first: u64, items: &[&Prepared]) -> Result<()> {
        let mut ids = Vec::with_capacity(items.len());
        let mut new: Vec<(u32, &[u8; 16], Codec, &[u8])> = Vec::new();
        let mut local = crate::state::FingerprintIndex::default();
        let mut allocated = Vec::new();
        let mut into_anchored = true;
        let mut size = RECORD_HEADER + RECORD_HEADER + 16 + 4 * items.len();
        for (k, item) in items.iter().enumerate() {
            let id = match item {
                Prepared::Zero => 0,
                Prepared::Data { hash, codec, bytes } => {
                    if let Some(&id) = m.state.store.index.get(hash) {
                        id
                    } else if let Some(&id) = local.get(hash) {
                        id
                    } else {
                        let Some(id) = m.state.store.allocate_id() else {
                            return Err(EngineError::NoSpace);
                        };
                        allocated.push(id);
                        // Without anchors anywhere (the usual case) no lookup is needed.
                        into_anchored &= m.state.store.anchored > 0
                            && m.state
                                .volumes
                                .get(&volume)
                                .is_some_and(|map| map.get(first + k as u64) == ANCHORED);
                        local.insert(*hash, id);
                        new.push((id, hash, *codec, bytes));
                        size += RECORD_HEADER + CHUNK_PREFIX + bytes.len();
                        id
                    }
                }
            };
            ids.push(id);
        }
        // Writes of data already stored (dedup hits, zeros) need no chunk space: like UNMAP
        // they keep working on a full array.
        let class = if new.is_empty() {
            Space::Metadata
        } else if into_anchored {
            Space::AnchoredData
        } else {
            Space::Data
        };
        let at = match self.reserve(m, size, class) {
            Ok(at) => at,
            Err(e) => {
                // Ids taken but not used go back.
                m.state.store.free_ids.extend(allocated);
                return Err(e);
            }
        };
        let mut buf = Vec::with_capacity(size);
        let mut e = Encoder::new(&mut buf, at.seq);
        let mut host = 0u64;
        for (id, hash, codec, bytes) in &new {
            e.chunk(*id, *codec, hash, bytes);
            host += (RECORD_HEADER + CHUNK_PREFIX + bytes.len()) as u64;
        }
        e.map(volume, first, &ids);
        e.wrap_batch(0);
        debug_assert_eq!(buf.len(), size);
        if let Err(e) = self.append_at(m, at, &buf) {
            if matches!(e, EngineError::NoSpace) {
                // Nothing was applied.
                m.state.store.free_ids.extend(allocated);
            }
            return Err(e);
        }
        m.counters.host_bytes += host;
        Ok(())
    }

    /// Read bytes at `offset` of `volume` into `buf`. Unmapped space reads as zeros.
    pub fn read(&self, volume: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.host_activity.fetch_add(1, Ordering::Relaxed);
        let cs = self.geometry.chunk_size as u64;
        if buf.is_empty() {
            let m = self.lock_meta();
            return Self::volume_range(&m, volume, offset, 0);
        }
        let first = offset / cs;
        let last = (offset + buf.len() as u64 - 1) / cs;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, buf.len() as u64)?;
        }
        // Aligned fast path reads straight into `buf`; edges go through a bounce buffer.
        let aligned_start = offset.is_multiple_of(cs);
        let aligned_end = (offset + buf.len() as u64).is_multiple_of(cs);
        if aligned_start && aligned_end {
            self.read_chunks(volume, first, buf)?;
            return Ok(());
        }
        let mut bounce = vec![0u8; (last - first + 1) as usize * cs as usize];
        self.read_chunks(volume, first, &mut bounce)?;
        let skip = (offset - first * cs) as usize;
        buf.copy_from_slice(&bounce[skip..skip + buf.len()]);
        Ok(())
    }

    /// Fill `out` (whole chunks) with chunks `first..` of `volume`. Map entries and chunk
    /// locations are resolved under one lock and the segments pinned against reuse, so the
    /// bytes read are what the map held at that instant. Returns the (id, fingerprint) seen
    /// for each chunk.
    fn read_chunks(&self, volume: u32, first: u64, out: &mut [u8]) -> Result<Vec<(u32, [u8; 16])>> {
        let cs = self.geometry.chunk_size as usize;
        let count = out.len() / cs;
        let (seen, locs, _pin) = {
            let m = self.lock_meta();
            let map = m
                .state
                .volumes
                .get(&volume)
                .ok_or(EngineError::NoSuchVolume(volume))?;
            let pin = self.reuse.read().unwrap_or_else(|p| p.into_inner());
            let mut seen = Vec::with_capacity(count);
            let mut locs = Vec::with_capacity(count);
            for c in first..first + count as u64 {
                let id = map.get(c);
                if !holds_data(id) {
                    seen.push((id, [0; 16]));
                    locs.push(None);
                    continue;
                }
                let chunk = m
                    .state
                    .store
                    .chunk(id)
                    .ok_or_else(|| EngineError::Corrupt {
                        offset: c * cs as u64,
                        reason: format!("map points at missing chunk {id}"),
                    })?;
                seen.push((id, chunk.hash));
                let seq = m.state.store.segments[chunk.loc.segment as usize].seq;
                locs.push(Some((id, chunk.loc, chunk.len, seq)));
            }
            (seen, locs, pin)
        };
        let mut i = 0;
        while i < count {
            let Some((_, loc, len, seq)) = locs[i] else {
                out[i * cs..(i + 1) * cs].fill(0);
                i += 1;
                continue;
            };
            // Coalesce chunks stored back to back into one read.
            let mut j = i + 1;
            let mut total = len as usize;
            while j < count && total < (1 << 20) {
                match locs[j] {
                    Some((_, l, n, _))
                        if l.segment == loc.segment
                            && l.offset as usize == loc.offset as usize + total =>
                    {
                        total += n as usize;
                        j += 1;
                    }
                    _ => break,
                }
            }
            let mut raw = vec![0u8; total];
            let at = loc.segment as u64 * self.geometry.segment_size as u64 + loc.offset as u64;
            if let Err(e) = self.backend.read_at(&mut raw, at) {
                if j == i + 1 {
                    return Err(EngineError::Corrupt {
                        offset: (first + i as u64) * cs as u64,
                        reason: format!("read failed: {e}"),
                    });
                }
                // A coalesced read failed: read its chunks one by one, so the error names
                // the chunk that fails (and a transient error costs nothing).
                let mut pos = 0;
                for (k, slot) in locs.iter().enumerate().take(j).skip(i) {
                    let (_, _, n, _) = slot.expect("coalesced");
                    let one = &mut raw[pos..pos + n as usize];
                    self.backend.read_at(one, at + pos as u64).map_err(|e| {
                        EngineError::Corrupt {
                            offset: (first + k as u64) * cs as u64,
                            reason: format!("read failed: {e}"),
                        }
                    })?;
                    pos += n as usize;
                }
            }
            let mut pos = 0;
            for (k, slot) in locs.iter().enumerate().take(j).skip(i) {
                let (id, _, n, _) = slot.expect("coalesced");
                let target = &mut out[k * cs..(k + 1) * cs];
                decode_chunk(&raw[pos..pos + n as usize], seq, id, target).map_err(|reason| {
                    EngineError::Corrupt {
                        offset: (first + k as u64) * cs as u64,
                        reason,
                    }
                })?;
                pos += n as usize;
            }
            i = j;
        }
        Ok(seen)
    }

    /// Make `len` bytes at `offset` read as zeros and release their space.
    pub fn unmap(&self, volume: u32, offset: u64, len: u64) -> Result<()> {
        self.release(volume, offset, len, false)
    }

    /// Anchor `len` bytes at `offset` (SBC ANCHOR): whole chunks become anchored entries that
    /// read as zeros and hold space for a later write of them; partial chunks at the edges
    /// are zeroed as by [`Engine::unmap`]. [`EngineError::NoSpace`] when the space to hold is
    /// not free (nothing of that piece changes).
    pub fn anchor(&self, volume: u32, offset: u64, len: u64) -> Result<()> {
        self.release(volume, offset, len, true)
    }

    /// UNMAP (`anchor` false) or ANCHOR a byte range.
    fn release(&self, volume: u32, offset: u64, len: u64, anchor: bool) -> Result<()> {
        self.check_writable()?;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        let cs = self.geometry.chunk_size as u64;
        let end = offset + len;
        let full_first = offset.div_ceil(cs);
        let full_end = end / cs;
        // Partial chunks at the edges: zero the covered bytes (a chunk that becomes all zeros
        // is unmapped by the write path).
        if full_first > full_end {
            return self.write(volume, offset, &vec![0u8; len as usize]);
        }
        if !offset.is_multiple_of(cs) {
            let head = full_first * cs - offset;
            self.write(volume, offset, &vec![0u8; head as usize])?;
        }
        if !end.is_multiple_of(cs) && full_end * cs >= offset {
            let tail = end - full_end * cs;
            self.write(volume, full_end * cs, &vec![0u8; tail as usize])?;
        }
        // Whole chunks: metadata only, in pieces that bound the time the lock is held.
        const PIECE: u64 = 64 * 1024;
        let mut c = full_first;
        while c < full_end {
            let n = PIECE.min(full_end - c);
            if anchor {
                self.append_data_meta_if(
                    |m| self.room_to_anchor(m, volume, c, n),
                    |e| e.anchor(volume, c, n),
                )?;
            } else {
                self.append_data_meta(|e| e.unmap(volume, c, n))?;
            }
            c += n;
        }
        self.wake_gc();
        Ok(())
    }

    /// Whether anchoring chunks `first..first + count` of `volume` leaves the space it holds
    /// free: segments outside the collector's reserve and the space already held.
    fn room_to_anchor(&self, m: &Meta, volume: u32, first: u64, count: u64) -> Result<()> {
        let map = m
            .state
            .volumes
            .get(&volume)
            .ok_or(EngineError::NoSuchVolume(volume))?;
        let new = map
            .entries(first, count)
            .iter()
            .filter(|&&id| id != ANCHORED)
            .count() as u64;
        let held = self.anchor_reserve(m.state.store.anchored + new);
        // One segment more for the log records themselves (Space::Metadata keeps one).
        if m.free.len() < gc_reserve(self.geometry.segment_count) as usize + held + 1 {
            return Err(EngineError::NoSpace);
        }
        Ok(())
    }

    /// Copy `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` by reference where
    /// chunks line up; returns false when they cannot (the caller then copies data).
    pub fn copy(
        &self,
        src: u32,
        src_offset: u64,
        dst: u32,
        dst_offset: u64,
        len: u64,
    ) -> Result<bool> {
        self.check_writable()?;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, src, src_offset, len)?;
            Self::volume_range(&m, dst, dst_offset, len)?;
        }
        let cs = self.geometry.chunk_size as u64;
        let overlapping =
            src == dst && src_offset < dst_offset + len && dst_offset < src_offset + len;
        if len == 0 {
            return Ok(true);
        }
        if src_offset % cs != dst_offset % cs || overlapping {
            return Ok(false);
        }
        let end = src_offset + len;
        let full_first = src_offset.div_ceil(cs);
        let full_end = end / cs;
        let shift = |o: u64| o - src_offset + dst_offset;
        if full_first >= full_end {
            return Ok(false);
        }
        let mut bounce = Vec::new();
        let mut copy_bytes = |from: u64, n: u64| -> Result<()> {
            bounce.resize(n as usize, 0);
            self.read(src, from, &mut bounce)?;
            self.write(dst, shift(from), &bounce)
        };
        if full_first * cs > src_offset {
            copy_bytes(src_offset, full_first * cs - src_offset)?;
        }
        if end > full_end * cs {
            copy_bytes(full_end * cs, end - full_end * cs)?;
        }
        let dst_first = dst_offset.div_ceil(cs);
        const PIECE: u64 = crate::state::MAX_COPY_CHUNKS;
        let mut c = 0;
        let total = full_end - full_first;
        while c < total {
            let n = PIECE.min(total - c);
            self.append_data_meta(|e| e.copy(src, full_first + c, dst, dst_first + c, n))?;
            c += n;
        }
        Ok(true)
    }

    /// Append a data-path metadata record (unmap, copy): needs no new chunk space, but log
    /// space; waits for the collector when the log is full.
    fn append_data_meta(&self, build: impl Fn(&mut Encoder)) -> Result<()> {
        self.append_data_meta_if(|_| Ok(()), build)
    }

    /// [`Engine::append_data_meta`] after `check` passed under the same lock hold.
    fn append_data_meta_if(
        &self,
        check: impl Fn(&Meta) -> Result<()>,
        build: impl Fn(&mut Encoder),
    ) -> Result<()> {
        let mut collections = 0;
        loop {
            let mut m = self.lock_meta();
            let mut probe = Vec::new();
            build(&mut Encoder::new(&mut probe, 0));
            // Freeing space must keep working on a full array: unmap may use the reserve.
            match check(&m).and_then(|()| self.reserve(&mut m, probe.len(), Space::Metadata)) {
                Ok(at) => {
                    let mut buf = Vec::with_capacity(probe.len());
                    build(&mut Encoder::new(&mut buf, at.seq));
                    return self.append_at(&mut m, at, &buf);
                }
                // Short of space: what the collector can return may be enough.
                Err(EngineError::NoSpace) => {
                    drop(m);
                    collections += 1;
                    if collections > MAX_COLLECTIONS || !self.collect_for_space()? {
                        return Err(EngineError::NoSpace);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Provisioning of chunk `index` onwards: its state and how many chunks from `index` share
    /// it. The run is cut at [`STATUS_SCAN_CHUNKS`] so the lock is held for a bounded time
    /// (a fully mapped 16 TiB volume would otherwise be scanned whole under it); callers that
    /// want the whole run ask again from where it stopped.
    pub fn chunk_status(&self, volume: u32, index: u64) -> Result<(ChunkState, u64)> {
        let m = self.lock_meta();
        let map = m
            .state
            .volumes
            .get(&volume)
            .ok_or(EngineError::NoSuchVolume(volume))?;
        let total = m.state.chunks_of(map.size);
        if index >= total {
            return Err(EngineError::OutOfRange {
                volume,
                offset: index * self.geometry.chunk_size as u64,
                len: 0,
                size: map.size,
            });
        }
        let limit = total.min(index + STATUS_SCAN_CHUNKS);
        let state = ChunkState::of(map.get(index));
        let per = crate::state::PAGE_ENTRIES as u64;
        let mut i = index + 1;
        while i < limit {
            let page_no = i / per;
            let page_end = ((page_no + 1) * per).min(limit);
            match map.pages.get(&page_no) {
                // An absent page is all deallocated: skip to the next present one.
                None if state == ChunkState::Deallocated => {
                    i = match map.pages.range(page_no + 1..).next() {
                        Some((&next, _)) => (next * per).min(limit),
                        None => limit,
                    };
                }
                None => break,
                Some(page) => {
                    let from = (i - page_no * per) as usize;
                    let to = (page_end - page_no * per) as usize;
                    match page.0[from..to]
                        .iter()
                        .position(|&id| ChunkState::of(id) != state)
                    {
                        Some(k) => {
                            i += k as u64;
                            break;
                        }
                        None => i = page_end,
                    }
                }
            }
        }
        Ok((state, i - index))
    }

    // ----- space -----

    pub fn space(&self) -> EngineSpace {
        let m = self.lock_meta();
        let store = &m.state.store;
        let seg = self.geometry.segment_size as u64;
        let count = self.geometry.segment_count as u64;
        let used_segments = store
            .segments
            .iter()
            .filter(|s| s.state != SegState::Free)
            .count() as u64;
        let live: u64 = store.segments.iter().map(|s| s.live).sum();
        let physical = used_segments * seg;
        let capacity = (count - gc_reserve(self.geometry.segment_count) as u64) * seg;
        let cs = self.geometry.chunk_size as u64;
        let mut logical = 0u64;
        let mut provisioned = 0u64;
        for map in m.state.volumes.values() {
            provisioned += map.size;
            for page in map.pages.values() {
                logical += page.0.iter().filter(|&&id| holds_data(id)).count() as u64 * cs;
            }
        }
        let host = m.counters.host_bytes;
        let gc = m.counters.gc_bytes;
        let threshold = self.tuning.lock().unwrap().soft_threshold;
        let held = self.anchor_reserve(store.anchored) as u64 * seg;
        EngineSpace {
            capacity_bytes: capacity,
            physical_used_bytes: physical,
            live_bytes: live,
            reclaimable_bytes: physical.saturating_sub(live),
            logical_mapped_bytes: logical,
            provisioned_bytes: provisioned,
            data_reduction: if live == 0 {
                1.0
            } else {
                logical as f64 / live as f64
            },
            total_reduction: if physical == 0 {
                1.0
            } else {
                provisioned as f64 / physical as f64
            },
            write_amplification: if host == 0 {
                1.0
            } else {
                (host + gc) as f64 / host as f64
            },
            host_written_bytes: host,
            gc_relocated_bytes: gc,
            soft_threshold_exceeded: (physical + held) as f64 > threshold * capacity as f64,
            unique_chunks: store.index.len() as u64,
            anchored_bytes: held,
        }
    }

    /// Space figures of one volume; walks its map.
    pub fn volume_usage(&self, volume: u32) -> Result<VolumeUsage> {
        let m = self.lock_meta();
        let map = m
            .state
            .volumes
            .get(&volume)
            .ok_or(EngineError::NoSuchVolume(volume))?;
        let cs = self.geometry.chunk_size as u64;
        // References from pages only this volume holds: if they account for all of a chunk's
        // references, deleting the volume frees the chunk.
        let mut private: HashMap<u32, u64> = HashMap::new();
        let mut referenced: std::collections::HashSet<u32> = Default::default();
        let mut mapped = 0u64;
        let mut anchored = 0u64;
        for page in map.pages.values() {
            let unique = std::sync::Arc::strong_count(page) == 1;
            for &id in page.0.iter() {
                if id == ANCHORED {
                    anchored += cs;
                }
                if !holds_data(id) {
                    continue;
                }
                mapped += cs;
                referenced.insert(id);
                if unique {
                    *private.entry(id).or_insert(0) += 1;
                }
            }
        }
        let mut unique_bytes = 0;
        let mut shared_bytes = 0;
        for id in referenced {
            let c = m.state.store.chunk(id).expect("referenced chunk exists");
            if private.get(&id) == Some(&c.refs) {
                unique_bytes += c.len as u64;
            } else {
                shared_bytes += c.len as u64;
            }
        }
        Ok(VolumeUsage {
            provisioned_bytes: map.size,
            mapped_bytes: mapped.min(map.size),
            anchored_bytes: anchored.min(map.size),
            unique_bytes,
            shared_bytes,
        })
    }

    // ----- checkpoints and garbage collection -----

    /// Write a checkpoint of the current state (the log up to it is synced first).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.checkpoint_locked()
    }

    fn checkpoint_locked(&self) -> Result<()> {
        let started = Instant::now();
        // Capture under the lock (pointer copies), encode and write outside it: hosts' commands
        // must not wait for a pass over the whole metadata.
        let (image, head, appended) = {
            let m = self.lock_meta();
            (
                checkpoint::Image::capture(&self.geometry, m.head, m.counters, &m.state),
                m.head,
                m.appended,
            )
        };
        let captured = started.elapsed();
        let bytes = image.encode();
        // Release the image before writing: host writes would go on copying the blocks and
        // pages it shares, and chunks only its pages still refer to stay allocated until then.
        let released = image.release(&mut self.lock_meta().state);
        if let Err(e) = released {
            return Err(self.poison(format!("releasing a checkpoint image: {e}")));
        }
        self.flush()?;
        self.backend.store_checkpoint(&bytes).map_err(|e| {
            if out_of_space(&e) {
                // The previous checkpoint and the log after it still recover everything, and
                // segments it needs are not collected until a newer one is written.
                EngineError::NoSpace
            } else {
                self.poison(format!("writing a checkpoint failed: {e}"))
            }
        })?;
        let mut m = self.lock_meta();
        m.checkpoint_seq = head.seq;
        m.appended_at_checkpoint = appended;
        m.checkpointed_at = Instant::now();
        m.checkpoint_len = bytes.len() as u64;
        drop(m);
        tracing::debug!(
            bytes = bytes.len(),
            lock_held_us = captured.as_micros() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }

    fn wake_gc(&self) {
        self.gc_wakeup.wake();
    }

    fn wake_segments(&self) {
        self.segments_wakeup.wake();
    }

    /// Allocate the file space of up to [`READY_SEGMENTS`] free segments outside the metadata
    /// lock, so the head moves on without a system call under it. Returns how many became
    /// ready. The segments stay on the free list meanwhile (marked `preparing`), so free space
    /// as writers and reports see it does not change.
    pub fn prepare_segments(&self) -> usize {
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return 0;
        }
        let seg = self.geometry.segment_size as u64;
        // Only where the file system has room to spare for them and as much again: on a small
        // or nearly full one the head allocates as it goes, and a full file system is
        // reported by the write that needs the space (27/07), not by this thread.
        let ready_bytes = READY_SEGMENTS as u64 * seg;
        if !self.backend.has_room(ready_bytes, ready_bytes) {
            return 0;
        }
        let taken: Vec<u32> = {
            let mut m = self.lock_meta();
            // Never more than the writers' own margin over the collector's reserve.
            let spare = m
                .free
                .len()
                .saturating_sub(gc_reserve(self.geometry.segment_count) as usize + 2);
            let want = READY_SEGMENTS
                .saturating_sub(m.ready.len() + m.preparing.len())
                .min(spare.saturating_sub(m.ready.len()));
            let mut taken = Vec::with_capacity(want);
            // From the top of the free list: the segments the head would take next anyway.
            let mut i = m.free.len();
            while taken.len() < want && i > 0 {
                i -= 1;
                let s = m.free[i];
                if !m.ready.contains(&s) && !m.preparing.contains(&s) {
                    taken.push(s);
                }
            }
            for s in &taken {
                m.preparing.insert(*s);
                // Allocated from now on: not to be punched.
                m.undiscarded.remove(s);
            }
            taken
        };
        if taken.is_empty() {
            return 0;
        }
        let results: Vec<(u32, bool)> = taken
            .iter()
            .map(|&s| (s, self.backend.allocate(s as u64 * seg, seg).is_ok()))
            .collect();
        let mut m = self.lock_meta();
        let mut ready = 0;
        for (s, ok) in results {
            // Not preparing any more: the head took it meanwhile.
            if !m.preparing.remove(&s) {
                continue;
            }
            if ok {
                m.ready.insert(s);
                ready += 1;
            } else {
                // The file system is full: the head allocates (and reports) itself; what was
                // allocated of this one is given back when idle.
                m.undiscarded.insert(s);
            }
        }
        ready
    }

    /// A writer found the log full: run the collector now. Returns whether the writer should
    /// try again: there is room, or this collection freed segments (which other writers may
    /// have taken meanwhile: with the lock released while the collector checkpoints and
    /// relocates, they keep writing, and comparing the free list's length before and after
    /// would turn their progress into this writer's out-of-space error).
    fn collect_for_space(&self) -> Result<bool> {
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        let reserve = gc_reserve(self.geometry.segment_count) as usize;
        // Room in the log (free segments) and on the file system under it (which can fill
        // before the log does: freed segments give their space back).
        let room = || {
            let mut m = self.lock_meta();
            m.free.len() > reserve + 1 && self.room_for_data(&mut m)
        };
        if room() {
            // Another writer's collection already made room.
            return Ok(true);
        }
        let freed_before = self.lock_meta().freed;
        // Relocating a nearly full segment costs a segment to win a sliver: require at least
        // a sixteenth of a segment to be dead, so every round gains ground.
        for _ in 0..self.geometry.segment_count {
            if self.collect_one(1.0 - 1.0 / 16.0, true)?.is_none() || room() {
                break;
            }
        }
        let freed = self.lock_meta().freed > freed_before;
        Ok(room() || (freed && self.room_for_data(&mut self.lock_meta())))
    }

    /// Clean the emptiest eligible segment whose live share is at most `max_live`. Returns
    /// the bytes relocated, or None when no segment qualifies. Takes a checkpoint first when
    /// the only candidates are too recent. Caller holds `maintenance`.
    fn collect_one(&self, max_live: f64, may_checkpoint: bool) -> Result<Option<u64>> {
        let seg = self.geometry.segment_size as u64;
        let unreadable = self.unreadable.lock().unwrap().clone();
        let pick = |m: &Meta, eligible_only: bool| -> Option<(u32, u64, bool)> {
            m.state
                .store
                .segments
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == SegState::Sealed)
                .filter(|(i, s)| s.live == 0 || !unreadable.contains(&(*i as u32, s.seq)))
                .filter(|(_, s)| !eligible_only || s.seq < m.checkpoint_seq)
                .filter(|(_, s)| (s.live as f64) <= max_live * seg as f64)
                .min_by_key(|(_, s)| s.live)
                .map(|(i, s)| (i as u32, s.seq, s.live == 0))
        };
        let victim = {
            let m = self.lock_meta();
            match pick(&m, true) {
                Some(v) => Some(v),
                None if may_checkpoint && pick(&m, false).is_some() => None,
                None => return Ok(None),
            }
        };
        let (victim, seq, empty) = match victim {
            Some(v) => v,
            None => {
                self.checkpoint_locked()?;
                let m = self.lock_meta();
                match pick(&m, true) {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
        };
        // The segment is sealed: its bytes no longer change. Only the collector (us) moves
        // chunks out of it; hosts may free them meanwhile, which the liveness check sees.
        // Live bytes of a sealed segment only fall, so one found empty stays empty: nothing
        // to read or relocate (the common case after a large UNMAP or zeroing).
        let mut raw = vec![0u8; if empty { 0 } else { seg as usize }];
        if !empty {
            if let Err(e) = self.backend.read_at(&mut raw, victim as u64 * seg) {
                // The medium's failure, not the log's: writes go on. Hosts reading the
                // segment's chunks get medium errors until they rewrite them; once none is
                // live the segment is freed without being read.
                tracing::error!(
                    "cannot read segment {victim} to collect it ({e}); the collector leaves it alone"
                );
                self.unreadable.lock().unwrap().insert((victim, seq));
                return Ok(Some(0));
            }
        }
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut visit = |buf: &[u8], base: usize| -> std::result::Result<bool, String> {
            for item in format::records(buf, seq) {
                let Ok((pos, record)) = item else {
                    return Ok(false);
                };
                match record {
                    Record::Chunk {
                        id,
                        codec,
                        hash,
                        data,
                    } => candidates.push((id, (base + pos) as u32, codec, hash, data.to_vec())),
                    Record::Batch { inner } => {
                        for item in format::records(inner, seq) {
                            let (p, r) = item.map_err(|e| format!("{e:?}"))?;
                            if let Record::Chunk {
                                id,
                                codec,
                                hash,
                                data,
                            } = r
                            {
                                candidates.push((
                                    id,
                                    (base + pos + RECORD_HEADER + p) as u32,
                                    codec,
                                    hash,
                                    data.to_vec(),
                                ));
                            }
                        }
                    }
                    Record::Seal { .. } => return Ok(true),
                    _ => {}
                }
            }
            Ok(false)
        };
        visit(&raw, 0).map_err(|e| self.poison(format!("segment {victim} damaged: {e}")))?;
        drop(raw);
        let mut relocated = 0u64;
        let batch_bytes = self.geometry.segment_size as usize / 16;
        // Start only a relocation that can be finished: a half-relocated victim frees nothing,
        // and the segments it took are gone (down to the last free one, which a restart or
        // an unmap on a full array needs).
        {
            let m = self.lock_meta();
            let needed: usize = candidates
                .iter()
                .filter(|(id, offset, ..)| {
                    m.state
                        .store
                        .chunk(*id)
                        .is_some_and(|c| c.loc.segment == victim && c.loc.offset == *offset)
                })
                .map(|c| RECORD_HEADER + CHUNK_PREFIX + c.4.len())
                .sum();
            if needed > 0 {
                let seg = seg as usize;
                // A batch may end one chunk record past `batch_bytes`; a segment switch can
                // leave up to one batch unused.
                let max_batch =
                    batch_bytes + RECORD_HEADER + CHUNK_PREFIX + self.geometry.chunk_size as usize;
                let total = needed + (needed / batch_bytes + 1) * RECORD_HEADER;
                let in_head = seg.saturating_sub(m.head.offset as usize + SEAL_LEN + max_batch);
                let per_segment = seg - SEGMENT_START_LEN - SEAL_LEN - max_batch;
                if total > in_head + m.free.len() * per_segment {
                    return Ok(None);
                }
            }
        }
        let mut i = 0;
        while i < candidates.len() {
            let mut m = self.lock_meta();
            let mut take = Vec::new();
            let mut size = RECORD_HEADER;
            while i < candidates.len() && size < batch_bytes {
                let (id, offset, ..) = &candidates[i];
                let live = m
                    .state
                    .store
                    .chunk(*id)
                    .is_some_and(|c| c.loc.segment == victim && c.loc.offset == *offset);
                if live {
                    size += RECORD_HEADER + CHUNK_PREFIX + candidates[i].4.len();
                    take.push(i);
                }
                i += 1;
            }
            if take.is_empty() {
                continue;
            }
            let at = self.reserve(&mut m, size, Space::Collector)?;
            let mut buf = Vec::with_capacity(size);
            let mut e = Encoder::new(&mut buf, at.seq);
            for &k in &take {
                let (id, _, codec, hash, data) = &candidates[k];
                e.chunk(*id, *codec, hash, data);
            }
            e.wrap_batch(0);
            self.append_at(&mut m, at, &buf)?;
            let moved = (size - RECORD_HEADER) as u64;
            m.counters.gc_bytes += moved;
            relocated += moved;
        }
        // Relocations durable before the old copies can disappear; and the records that made
        // the victim's chunks dead (UNMAP, overwrites) durable before their data can be
        // overwritten, or a replay after a crash would map chunks that are gone.
        self.flush()?;
        {
            let mut m = self.lock_meta();
            let s = &mut m.state.store.segments[victim as usize];
            if s.live != 0 || s.state != SegState::Sealed {
                return Err(self.poison(format!(
                    "segment {victim} still holds {} live bytes after collection",
                    s.live
                )));
            }
            // No new readers can find it; wait out those that did.
            s.state = SegState::Free;
            s.written = 0;
        }
        drop(self.reuse.write().unwrap_or_else(|p| p.into_inner()));
        let mut m = self.lock_meta();
        m.free.push(victim);
        m.freed += 1;
        m.undiscarded.insert(victim);
        drop(m);
        self.gc_relocated.fetch_add(relocated, Ordering::Relaxed);
        Ok(Some(relocated))
    }

    /// Free every segment that holds no live chunk and no record the current checkpoint's
    /// replay needs, all at once: one flush for all of them and one discard per run of adjacent
    /// segments. After a large UNMAP or zeroing thousands of segments die together; freeing
    /// them one by one cost a sync and a hole punch each, and the hole punches contend with the
    /// log appends hosts wait for. Returns how many were freed. Caller holds `maintenance`.
    fn collect_empty(&self) -> Result<usize> {
        let victims: Vec<u32> = {
            let m = self.lock_meta();
            m.state
                .store
                .segments
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.state == SegState::Sealed && s.seq < m.checkpoint_seq && s.live == 0
                })
                .map(|(i, _)| i as u32)
                .collect()
        };
        if victims.is_empty() {
            return Ok(0);
        }
        // The records that made these segments' chunks dead must be durable before their
        // bytes can be overwritten, or a replay after a crash would map chunks that are gone.
        self.flush()?;
        {
            let mut m = self.lock_meta();
            for &v in &victims {
                let s = &mut m.state.store.segments[v as usize];
                // Only the collector (us, under `maintenance`) frees or fills sealed segments,
                // and live bytes of a sealed segment only fall.
                if s.live != 0 || s.state != SegState::Sealed {
                    return Err(self.poison(format!(
                        "segment {v} changed while being freed: {} live bytes",
                        s.live
                    )));
                }
                s.state = SegState::Free;
                s.written = 0;
            }
        }
        // No new readers can find them; wait out those that did.
        drop(self.reuse.write().unwrap_or_else(|p| p.into_inner()));
        let mut m = self.lock_meta();
        m.free.extend_from_slice(&victims);
        m.freed += victims.len() as u64;
        m.undiscarded.extend(victims.iter().copied());
        Ok(victims.len())
    }

    /// Give the file space of up to `max` free segments back to the file system (hole
    /// punching), lowest first; returns how many. They leave the free list meanwhile so no
    /// writer can reuse one while its hole is punched.
    ///
    /// Freed segments are not punched at once: on a file system a hole punch takes the
    /// inode's locks and drops the page cache of the range, stalling every log append and read
    /// behind it (zeroing 100 GiB of written data took four times longer while the collector
    /// punched). Maintenance calls this while hosts are idle; a writer that finds the file
    /// system full punches everything pending first; a clean shutdown punches the rest.
    fn discard_freed(&self, max: usize) -> usize {
        let taken: Vec<u32> = {
            let mut m = self.lock_meta();
            // Leave writers enough free segments meanwhile: on a nearly full array they
            // would otherwise report out of space while a hole is being punched.
            let spare = m
                .free
                .len()
                .saturating_sub(gc_reserve(self.geometry.segment_count) as usize + 2);
            let taken: Vec<u32> = m.undiscarded.iter().copied().take(max.min(spare)).collect();
            if taken.is_empty() {
                return 0;
            }
            for id in &taken {
                m.undiscarded.remove(id);
            }
            let set: std::collections::HashSet<u32> = taken.iter().copied().collect();
            m.free.retain(|s| !set.contains(s));
            taken
        };
        self.punch(&taken);
        // Back on top of the free list in reverse, so the lowest is reused first.
        self.lock_meta().free.extend(taken.iter().rev());
        taken.len()
    }

    /// Punch the holes of every free segment still holding file space, under the lock (so no
    /// writer can take one meanwhile): a full file system, or a clean shutdown.
    fn punch_all_pending(&self, m: &mut Meta) {
        let pending: Vec<u32> = std::mem::take(&mut m.undiscarded).into_iter().collect();
        self.punch(&pending);
    }

    /// Punch the holes of `segments` (sorted), one call per run of adjacent segments.
    fn punch(&self, segments: &[u32]) {
        let seg = self.geometry.segment_size as u64;
        let mut i = 0;
        while i < segments.len() {
            let mut j = i + 1;
            while j < segments.len() && segments[j] == segments[j - 1] + 1 {
                j += 1;
            }
            let (first, count) = (segments[i] as u64, (j - i) as u64);
            if let Err(e) = self.backend.discard(first * seg, count * seg) {
                tracing::warn!(
                    "could not give back the space of segments {first}..{}: {e}",
                    first + count
                );
            }
            i = j;
        }
    }

    /// Collect every segment whose live share is at most `max_live`, checkpointing as needed
    /// (operators' "collect now", tests and benchmarks). Returns the bytes relocated.
    pub fn collect_garbage(&self, max_live: f64) -> Result<u64> {
        self.check_writable()?;
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = 0;
        // Bounded: relocated data lands in new segments that could qualify again.
        for _ in 0..self.geometry.segment_count {
            match self.collect_one(max_live, true)? {
                Some(n) => total += n,
                None => break,
            }
        }
        Ok(total)
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
    fn maintain_in_background(&self) -> Result<Duration> {
        let now = self.host_activity.load(Ordering::Relaxed);
        let busy = self.activity_at_last_round.swap(now, Ordering::Relaxed) != now;
        let roomy = {
            let m = self.lock_meta();
            m.free.len() as f64 >= GC_DEFER_FREE_SHARE * self.geometry.segment_count as f64
        };
        self.maintain_with(busy && roomy)
    }

    fn maintain_with(&self, defer_collection: bool) -> Result<Duration> {
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return Ok(Duration::from_secs(1));
        }
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        let tuning = self.tuning();
        let due = {
            let m = self.lock_meta();
            let written = m.appended - m.appended_at_checkpoint;
            written
                >= tuning
                    .checkpoint_bytes
                    .max(CHECKPOINT_SIZE_FACTOR * m.checkpoint_len)
                || (written > 0 && m.checkpointed_at.elapsed() >= CHECKPOINT_INTERVAL)
        };
        if due {
            match self.checkpoint_locked() {
                // Collection below may free file system space; the next round tries again.
                Err(EngineError::NoSpace) => {
                    tracing::warn!("no space for a checkpoint on the file system; retrying");
                    self.lock_meta().checkpointed_at = Instant::now();
                }
                other => other?,
            }
        }
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
    fn discard_while_idle(&self) {
        const BATCH: usize = 16;
        const IDLE: Duration = Duration::from_millis(200);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut seen = self.host_activity.load(Ordering::Relaxed);
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return;
        }
        while Instant::now() < deadline && !self.lock_meta().undiscarded.is_empty() {
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
            |e| &e.segments_wakeup,
            |e| {
                e.prepare_segments();
                Duration::from_secs(1)
            },
        );
        self.spawn_worker(
            "sliver-gc",
            |e| &e.gc_wakeup,
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
    fn spawn_worker(
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
        let mut m = self.lock_meta();
        let Meta {
            undiscarded,
            ready,
            preparing,
            ..
        } = &mut *m;
        undiscarded.append(ready);
        undiscarded.append(preparing);
        self.punch_all_pending(&mut m);
        Ok(())
    }

    // ----- checking -----

    /// Verify the whole engine: reference counts against the maps, segment usage against the
    /// chunks, and every live chunk's record (checksum, decompression, fingerprint).
    /// Returns a list of problems (empty when healthy).
    pub fn check(&self, progress: &mut dyn FnMut(u64, u64)) -> Vec<String> {
        let mut problems = Vec::new();
        let (chunks, segment_live, counts, segment_seq, anchored_tracked) = {
            let m = self.lock_meta();
            let counts = m.state.count_references();
            let chunks: Vec<(u32, crate::state::Chunk)> = m
                .state
                .store
                .chunks
                .iter()
                .enumerate()
                .filter(|(_, c)| c.len != 0)
                .map(|(i, c)| (i as u32, *c))
                .collect();
            let live: Vec<u64> = m.state.store.segments.iter().map(|s| s.live).collect();
            let seq: Vec<(SegState, u64)> = m
                .state
                .store
                .segments
                .iter()
                .map(|s| (s.state, s.seq))
                .collect();
            (chunks, live, counts, seq, m.state.store.anchored)
        };
        let mut live = vec![0u64; segment_live.len()];
        for (id, c) in &chunks {
            let expected = counts.get(id).copied().unwrap_or(0);
            if c.refs != expected {
                problems.push(format!(
                    "chunk {id}: reference count {} but {expected} references",
                    c.refs
                ));
            }
            live[c.loc.segment as usize] += c.len as u64;
            if segment_seq[c.loc.segment as usize].0 == SegState::Free {
                problems.push(format!(
                    "chunk {id} lives in free segment {}",
                    c.loc.segment
                ));
            }
        }
        let existing: std::collections::HashSet<u32> = chunks.iter().map(|(id, _)| *id).collect();
        let anchored = counts.get(&ANCHORED).copied().unwrap_or(0);
        if anchored != anchored_tracked {
            problems.push(format!(
                "{anchored_tracked} anchored entries counted but the maps hold {anchored}"
            ));
        }
        for id in counts.keys().filter(|&&id| id != ANCHORED) {
            if !existing.contains(id) {
                problems.push(format!("map references missing chunk {id}"));
            }
        }
        for (i, (tracked, actual)) in segment_live.iter().zip(&live).enumerate() {
            if tracked != actual {
                problems.push(format!(
                    "segment {i}: usage {tracked} bytes, chunks say {actual}"
                ));
            }
        }
        let cs = self.geometry.chunk_size as usize;
        let mut buf = vec![0u8; cs];
        let total = chunks.len() as u64;
        for (n, (id, c)) in chunks.iter().enumerate() {
            if n % 4096 == 0 {
                progress(n as u64, total);
            }
            let mut raw = vec![0u8; c.len as usize];
            let at = c.loc.segment as u64 * self.geometry.segment_size as u64 + c.loc.offset as u64;
            if let Err(e) = self.backend.read_at(&mut raw, at) {
                problems.push(format!("chunk {id}: read failed: {e}"));
                continue;
            }
            let seq = segment_seq[c.loc.segment as usize].1;
            match decode_chunk(&raw, seq, *id, &mut buf) {
                Err(e) => problems.push(format!("chunk {id}: {e}")),
                Ok(()) => {
                    let hash = blake3::keyed_hash(&self.geometry.key, &buf);
                    if hash.as_bytes()[..16] != c.hash {
                        problems.push(format!(
                            "chunk {id}: content does not match its fingerprint"
                        ));
                    }
                }
            }
        }
        progress(total, total);
        problems
    }
}

/// Decode one Chunk record into `out` (one chunk).
fn decode_chunk(raw: &[u8], seq: u64, id: u32, out: &mut [u8]) -> std::result::Result<(), String> {
    let (record, _) = format::decode(raw, seq).map_err(|e| format!("record unreadable: {e:?}"))?;
    let Record::Chunk {
        id: got,
        codec,
        data,
        ..
    } = record
    else {
        return Err("not a chunk record".into());
    };
    if got != id {
        return Err(format!("record holds chunk {got}, expected {id}"));
    }
    match codec {
        Codec::Raw if data.len() == out.len() => {
            out.copy_from_slice(data);
            Ok(())
        }
        Codec::Lz4 => match lz4_flex::block::decompress_into(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("lz4 data decompressed to {n} bytes")),
            Err(e) => Err(format!("lz4: {e}")),
        },
        Codec::Zstd => match zstd::bulk::decompress_to_buffer(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("zstd data decompressed to {n} bytes")),
            Err(e) => Err(format!("zstd: {e}")),
        },
        other => Err(format!(
            "unsupported stored form {other:?} ({} bytes)",
            data.len()
        )),
    }
}

/// A chunk record found in a segment being collected: (id, offset, codec, hash, stored bytes).
type Candidate = (u32, u32, Codec, [u8; 16], Vec<u8>);

/// Where replay stopped.
enum LogEnd {
    /// At an invalid record inside the head segment: the tail from here was never durable.
    Torn(Head),
    /// Right after a Seal whose next segment never got its start record.
    AfterSeal(Head),
}

/// ENOSPC or EDQUOT: the file system (or the quota) is full.
fn out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

fn replay(
    backend: &dyn Backend,
    geometry: &Geometry,
    state: &mut State,
    counters: &mut Counters,
    start: Head,
    recovery: &mut Recovery,
) -> Result<LogEnd> {
    let seg = geometry.segment_size as u64;
    let mut head = start;
    let mut buf = vec![0u8; seg as usize];
    loop {
        let base = head.segment as u64 * seg;
        backend.read_at(&mut buf, base)?;
        let mut pos = head.offset as usize;
        loop {
            let decoded = format::decode(&buf[pos..], head.seq);
            let (record, len) = match decoded {
                Ok(x) => x,
                Err(format::DecodeError::Malformed(why)) => {
                    return Err(EngineError::Metadata(format!(
                        "segment {} offset {pos}: {why}",
                        head.segment
                    )))
                }
                Err(_) => {
                    return Ok(LogEnd::Torn(Head {
                        offset: pos as u32,
                        ..head
                    }))
                }
            };
            recovery.records_replayed += 1;
            recovery.bytes_replayed += len as u64;
            let loc = Loc {
                segment: head.segment,
                offset: pos as u32,
            };
            match record {
                Record::SegmentStart { seq, segment } => {
                    if pos != 0 || seq != head.seq || segment != head.segment {
                        return Err(EngineError::Metadata(format!(
                            "misplaced segment start in segment {}",
                            head.segment
                        )));
                    }
                }
                Record::Seal {
                    next_segment,
                    next_seq,
                } => {
                    let s = &mut state.store.segments[head.segment as usize];
                    s.state = SegState::Sealed;
                    s.seq = head.seq;
                    s.written = (pos + len) as u32;
                    // Sequences grow by one per segment, and jump after a recovery (see
                    // `repair_tail`).
                    if next_segment >= geometry.segment_count || next_seq <= head.seq {
                        return Err(EngineError::Metadata("seal points outside the log".into()));
                    }
                    let mut start = vec![0u8; SEGMENT_START_LEN];
                    backend.read_at(&mut start, next_segment as u64 * seg)?;
                    match format::decode(&start, next_seq) {
                        Ok((Record::SegmentStart { seq, segment }, _))
                            if seq == next_seq && segment == next_segment =>
                        {
                            let n = &mut state.store.segments[next_segment as usize];
                            if n.live != 0 {
                                return Err(EngineError::Metadata(format!(
                                    "segment {next_segment} reused while it held live chunks"
                                )));
                            }
                            *n = Segment {
                                state: SegState::Open,
                                seq: next_seq,
                                written: SEGMENT_START_LEN as u32,
                                live: 0,
                            };
                            head = Head {
                                segment: next_segment,
                                seq: next_seq,
                                offset: SEGMENT_START_LEN as u32,
                            };
                            break;
                        }
                        _ => {
                            return Ok(LogEnd::AfterSeal(Head {
                                segment: next_segment,
                                seq: next_seq,
                                offset: 0,
                            }))
                        }
                    }
                }
                other => {
                    state.apply(&other, loc, head.seq).map_err(|e| {
                        EngineError::Metadata(format!("segment {} offset {pos}: {e}", head.segment))
                    })?;
                    if let Record::VolumeCreate { volume, .. }
                    | Record::VolumeClone { dst: volume, .. } = other
                    {
                        counters.next_volume = counters.next_volume.max(volume + 1);
                    }
                    if let Record::Batch { inner } = other {
                        for (_, r) in format::records(inner, head.seq).flatten() {
                            if let Record::Chunk { data, .. } = r {
                                // Host and collector writes are not told apart in the log;
                                // count them as host bytes (the figure is advisory).
                                counters.host_bytes +=
                                    (RECORD_HEADER + CHUNK_PREFIX + data.len()) as u64;
                            }
                        }
                    }
                }
            }
            pos += len;
            let s = &mut state.store.segments[head.segment as usize];
            s.state = SegState::Open;
            s.seq = head.seq;
            s.written = pos as u32;
            if pos >= buf.len() {
                return Ok(LogEnd::Torn(Head {
                    offset: pos as u32,
                    ..head
                }));
            }
        }
    }
}

/// Make the log appendable again after replay: seal a torn segment (stale bytes after the tear
/// must never be read as records) and open a fresh head segment, which the caller records in
/// a new checkpoint.
///
/// The writes lost in the crash may have reached other segments: a crash keeps any subset of
/// what was not synced, so segments the lost history opened after the tear (with the sequence
/// numbers that come next) can hold complete, checksummed records. Were the new head to reuse
/// those sequence numbers, replay would one day run from the new records into the lost ones.
/// Between two syncs each segment is opened at most once (a segment only becomes free again
/// after the collector synced), so the lost history used at most `segment_count` sequence
/// numbers after the last one replay saw: the new head skips all of them.
///
/// The new head is a free segment or, when there is none, a segment holding neither live
/// chunks nor records the current checkpoint's replay needs: an old one, or the torn head
/// itself when nothing after the checkpoint was found (a clean restart). So repeated restarts
/// of a full array do not run out of segments.
fn repair_tail(
    backend: &dyn Backend,
    geometry: &Geometry,
    state: &mut State,
    end: LogEnd,
    checkpoint: Head,
) -> Result<Head> {
    let seg = geometry.segment_size as u64;
    let (last_seq, torn) = match end {
        // The seal is durable; the lost history started the segment it names.
        LogEnd::AfterSeal(h) => (h.seq, None),
        LogEnd::Torn(h) => {
            if h.offset as u64 + SEAL_LEN as u64 > seg {
                return Err(EngineError::Metadata(format!(
                    "segment {} has no room for its seal",
                    h.segment
                )));
            }
            (h.seq, Some(h))
        }
    };
    let seq = last_seq + geometry.segment_count as u64 + 1;
    let segments = &state.store.segments;
    let garbage = |i: u32| {
        let s = &segments[i as usize];
        s.state == SegState::Sealed && s.live == 0 && s.seq < checkpoint.seq
    };
    // Replay stopped right at the checkpoint's head: the torn segment holds nothing the
    // checkpoint's replay needs before that point, and the bytes there, which stop that
    // replay, stay as they are (only the segment's start record is rewritten).
    let reusable_head = torn.filter(|&h| h == checkpoint && segments[h.segment as usize].live == 0);
    let mut candidates: Vec<u32> = (0..geometry.segment_count)
        .filter(|&i| segments[i as usize].state == SegState::Free)
        .chain((0..geometry.segment_count).filter(|&i| garbage(i)))
        .filter(|&i| !matches!(torn, Some(h) if h.segment == i))
        .collect();
    candidates.extend(reusable_head.map(|h| h.segment));
    let mut segment = None;
    for i in candidates {
        match backend.allocate(i as u64 * seg, seg) {
            Ok(()) => {
                segment = Some(i);
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let Some(segment) = segment else {
        // Every segment holds live chunks or records replay needs. Then the lost history
        // opened no segment either (it could only have taken one that is free or garbage
        // here), so its records can only lie in the torn segment after the tear: wipe them
        // and go on appending there, with the same sequence number.
        let h = torn.ok_or(EngineError::NoSpace)?;
        let from = h.segment as u64 * seg + h.offset as u64;
        backend.write_at(&vec![0u8; (seg - h.offset as u64) as usize], from)?;
        backend.sync()?;
        let s = &mut state.store.segments[h.segment as usize];
        s.state = SegState::Open;
        s.seq = h.seq;
        s.written = h.offset;
        return Ok(h);
    };
    if let Some(h) = torn.filter(|h| h.segment != segment) {
        let mut seal = Vec::new();
        Encoder::new(&mut seal, h.seq).seal(segment, seq);
        backend.write_at(&seal, h.segment as u64 * seg + h.offset as u64)?;
        let s = &mut state.store.segments[h.segment as usize];
        s.state = SegState::Sealed;
        s.seq = h.seq;
        s.written = h.offset + SEAL_LEN as u32;
    }
    // No record anywhere carries the new sequence number: the segment needs no wiping.
    let mut start = Vec::new();
    Encoder::new(&mut start, seq).segment_start(seq, segment);
    backend.write_at(&start, segment as u64 * seg)?;
    backend.sync()?;
    state.store.segments[segment as usize] = Segment {
        state: SegState::Open,
        seq,
        written: SEGMENT_START_LEN as u32,
        live: 0,
    };
    Ok(Head {
        segment,
        seq,
        offset: SEGMENT_START_LEN as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    /// An engine with 4 KiB chunks on an in-memory backend of `capacity` bytes.
    fn mem_engine(capacity: u64, segment_size: u32, tuning: Tuning) -> (Arc<MemBackend>, Engine) {
        let backend = Arc::new(MemBackend::new(capacity));
        let config = EngineConfig {
            chunk_size: 4096,
            segment_size,
        };
        let engine = Engine::create(backend.clone(), config, tuning).unwrap();
        (backend, engine)
    }

    fn gc_off() -> Tuning {
        Tuning {
            gc: GcPriority::Off,
            ..Tuning::default()
        }
    }

    /// When the file system is full, a writer that needs a new segment first gets back the
    /// space freed segments still hold (their holes are punched lazily). Here the free list
    /// offers a never-allocated segment while dead ones still hold space, as after a restart.
    #[test]
    fn a_full_file_system_gets_back_the_space_of_freed_segments_first() {
        let (backend, engine) = mem_engine(16 << 20, 128 << 10, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut noise = |len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        engine.write(v, 0, &noise(4 << 20)).unwrap();
        engine.unmap(v, 0, 4 << 20).unwrap();
        engine.checkpoint().unwrap();
        engine.collect_garbage(0.0).unwrap();
        {
            let mut m = engine.lock_meta();
            assert!(
                !m.undiscarded.is_empty(),
                "freed segments wait to be punched"
            );
            let pending = m.undiscarded.clone();
            // Never-allocated segments on top (popped first), the dead ones below.
            m.free.sort_by_key(|s| !pending.contains(s));
        }
        backend.limit_space(backend.allocated_bytes(), 4096);
        let fresh = noise(1 << 20);
        engine.write(v, 4 << 20, &fresh).unwrap();
        let mut back = vec![0u8; 1 << 20];
        engine.read(v, 4 << 20, &mut back).unwrap();
        assert!(back == fresh);
        assert!(engine.lock_meta().undiscarded.is_empty());
        assert!(engine.poisoned().is_none());
    }

    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A checkpoint is encoded after the metadata lock is released, from an image captured
    /// under it: host commands that change the shared chunk table blocks, segments and map
    /// pages afterwards must not reach the image.
    #[test]
    fn a_captured_checkpoint_image_is_unchanged_by_later_writes() {
        let (_, engine) = mem_engine(256 << 20, 1 << 20, Tuning::default());
        let v = engine.create_volume(64 << 20).unwrap();
        // More than one 4,096-entry block of the chunk table.
        engine.write(v, 0, &noise(1, 20 << 20)).unwrap();
        let (image, expected) = {
            let m = engine.lock_meta();
            (
                checkpoint::Image::capture(&engine.geometry, m.head, m.counters, &m.state),
                checkpoint::encode(&engine.geometry, m.head, m.counters, &m.state),
            )
        };
        engine.write(v, 4 << 20, &noise(2, 8 << 20)).unwrap();
        engine.unmap(v, 0, 2 << 20).unwrap();
        engine.copy(v, 16 << 20, v, 40 << 20, 4 << 20).unwrap();
        let w = engine.create_volume(8 << 20).unwrap();
        engine.write(w, 0, &noise(3, 1 << 20)).unwrap();
        assert!(
            image.encode() == expected,
            "the image changed after capture"
        );
        // And what it encodes is a state the engine really had: it decodes, with the first
        // write's data mapped.
        let loaded = checkpoint::decode(&image.encode()).unwrap();
        assert_eq!(loaded.state.volumes.len(), 1);
        assert_eq!(
            loaded
                .state
                .store
                .chunks
                .iter()
                .filter(|c| c.len != 0)
                .count(),
            5120
        );
        // Pages the writes copied away from the image held references of their own; released
        // under the lock, the counts and segment usage are exact again (the checker recounts).
        image.release(&mut engine.lock_meta().state).unwrap();
        assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    }

    /// Background collection waits while hosts are busy and space is plentiful, runs once
    /// they pause, and does not wait when free space runs short.
    #[test]
    fn background_collection_yields_to_busy_hosts_only_while_space_is_plentiful() {
        let relocated = |e: &Engine| e.gc_relocated.load(Ordering::Relaxed);
        // Half of each of the first segments' chunks overwritten: they become collectable.
        let churn = |e: &Engine, v: u32, bytes: u64| {
            e.write(v, 0, &noise(1, bytes as usize)).unwrap();
            for c in (0..bytes / 4096).step_by(2) {
                e.write(v, c * 4096, &noise(c + 2, 4096)).unwrap();
            }
            e.checkpoint().unwrap();
        };

        let (_, roomy) = mem_engine(64 << 20, 1 << 20, Tuning::default());
        let v = roomy.create_volume(16 << 20).unwrap();
        churn(&roomy, v, 4 << 20);
        roomy.maintain_in_background().unwrap();
        assert_eq!(relocated(&roomy), 0, "hosts wrote since the last round");
        roomy.maintain_in_background().unwrap();
        assert!(relocated(&roomy) > 0, "hosts paused for a round");

        let (_, tight) = mem_engine(16 << 20, 1 << 20, Tuning::default());
        let v = tight.create_volume(12 << 20).unwrap();
        tight.write(v, 4 << 20, &noise(9, 7 << 20)).unwrap();
        churn(&tight, v, 4 << 20);
        let free = tight.lock_meta().free.len() as f64;
        assert!(
            free < GC_DEFER_FREE_SHARE * 16.0,
            "{free} of 16 segments free"
        );
        tight.write(v, 0, &noise(3, 4096)).unwrap();
        tight.maintain_in_background().unwrap();
        assert!(
            relocated(&tight) > 0,
            "short of space, busy hosts do not hold it back"
        );
    }

    /// Checkpoints come after `checkpoint_bytes` of log or 8 times the last checkpoint's
    /// size, whichever is more: a large metadata state is not rewritten every few MiB.
    #[test]
    fn checkpoints_are_paced_by_their_own_size() {
        let tuning = Tuning {
            checkpoint_bytes: 64 << 10,
            ..gc_off()
        };
        let (_, engine) = mem_engine(256 << 20, 1 << 20, tuning);
        let v = engine.create_volume(64 << 20).unwrap();
        engine.write(v, 0, &noise(5, 8 << 20)).unwrap();
        engine.checkpoint().unwrap();
        let (len, at) = {
            let m = engine.lock_meta();
            (m.checkpoint_len, m.appended_at_checkpoint)
        };
        assert!(
            len > 64 << 10,
            "2,048 chunks make a checkpoint of {len} bytes"
        );
        let since = |e: &Engine| {
            let m = e.lock_meta();
            (
                m.appended - m.appended_at_checkpoint,
                m.appended_at_checkpoint,
            )
        };
        // More than checkpoint_bytes, less than 8 checkpoints' worth: no checkpoint yet.
        let mut offset = 8 << 20;
        while since(&engine).0 < 2 * (64 << 10) {
            engine.write(v, offset, &noise(offset, 64 << 10)).unwrap();
            offset += 64 << 10;
        }
        engine.maintain().unwrap();
        assert_eq!(
            since(&engine).1,
            at,
            "checkpointed after {} bytes",
            since(&engine).0
        );
        while since(&engine).0 < 8 * len {
            engine.write(v, offset, &noise(offset, 256 << 10)).unwrap();
            offset += 256 << 10;
        }
        engine.maintain().unwrap();
        assert!(
            since(&engine).1 > at,
            "no checkpoint after 8 checkpoints' worth of log"
        );
    }

    /// Segments prepared outside the lock are allocated in the file, stay on the free list
    /// (space figures do not change), are never punched while ready, and are where the head
    /// goes next; shutdown gives their space back.
    #[test]
    fn prepared_segments_are_allocated_free_and_taken_first() {
        let (backend, engine) = mem_engine(1 << 30, 1 << 20, gc_off());
        let v = engine.create_volume(256 << 20).unwrap();
        let free_before = engine.lock_meta().free.len();
        let allocated_before = backend.allocated_bytes();
        assert_eq!(engine.prepare_segments(), READY_SEGMENTS);
        assert_eq!(engine.prepare_segments(), 0, "already enough ready");
        {
            let m = engine.lock_meta();
            assert_eq!(m.free.len(), free_before);
            assert!(m.ready.iter().all(|s| m.free.contains(s)));
            assert!(m.ready.iter().all(|s| !m.undiscarded.contains(s)));
        }
        assert!(backend.allocated_bytes() >= allocated_before + ((READY_SEGMENTS as u64) << 20));
        let ready: Vec<u32> = engine.lock_meta().ready.iter().copied().collect();
        let data = noise(6, 8 << 20);
        engine.write(v, 0, &data).unwrap();
        let (head, left) = {
            let m = engine.lock_meta();
            (m.head.segment, m.ready.len())
        };
        assert!(
            ready.contains(&head),
            "the head moved to segment {head}, not a prepared one"
        );
        assert!(left < READY_SEGMENTS);
        // Idle discards leave prepared segments alone.
        while engine.discard_freed(64) > 0 {}
        assert_eq!(engine.lock_meta().ready.len(), left);
        let mut back = vec![0u8; 8 << 20];
        engine.read(v, 0, &mut back).unwrap();
        assert!(back == data);
        let after_writes = backend.allocated_bytes();
        engine.shutdown().unwrap();
        assert!(engine.lock_meta().ready.is_empty());
        assert!(backend.allocated_bytes() + ((left as u64) << 20) <= after_writes);
    }

    /// While hosts are idle, maintenance gives the file space of freed segments back to the
    /// file system (a real file: its allocated blocks shrink).
    #[test]
    fn idle_maintenance_gives_freed_space_back_to_the_file_system() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(crate::backend::FileBackend::open(dir.path(), 32 << 20).unwrap());
        let config = EngineConfig {
            chunk_size: 4096,
            segment_size: 128 << 10,
        };
        let engine = Engine::create(backend, config, Tuning::default()).unwrap();
        let v = engine.create_volume(8 << 20).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..8 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        engine.write(v, 0, &data).unwrap();
        engine.flush().unwrap();
        let allocated = || std::fs::metadata(dir.path().join("log")).unwrap().blocks() * 512;
        engine.unmap(v, 0, 6 << 20).unwrap();
        engine.checkpoint().unwrap();
        engine.maintain().unwrap();
        let before = allocated();
        assert!(!engine.lock_meta().undiscarded.is_empty());
        engine.discard_while_idle();
        let after = allocated();
        assert!(after + (5 << 20) < before, "{before} -> {after}");
        let mut back = vec![0u8; 2 << 20];
        engine.read(v, 6 << 20, &mut back).unwrap();
        assert!(back == data[6 << 20..]);
    }
}
