//! The engine: log appends, the write and read paths, group commit, recovery, checkpoints and
//! garbage collection. See docs/design.md ("The engine") for the reasoning.
//!
//! A write goes through, in this order: [`write`] (fingerprint, compress, deduplicate against
//! the sampled index), [`log`] (room at the head, the append, `MetaState::apply`), [`read`] for
//! the old content of partial chunks; [`provision`] handles UNMAP, ANCHOR and copies by
//! reference. [`checkpointing`] writes the metadata pages changed since the last checkpoint;
//! [`gc`] and [`segments`] manage log space; [`maintenance`] runs both in the background;
//! [`open`] creates, opens and recovers an engine, and [`migrate`] upgrades format 2 arrays.
//!
//! Concurrency: one mutex (`meta`) guards the metadata state; records are applied under it,
//! and whoever moves the log's head holds it, so the log order is the apply order and
//! recovery reproduces exactly the state that was acknowledged. The head and the free segments
//! have their own lock (`log`, taken after `meta`), which a flush, the segment preparer and
//! free-space figures take alone. Hashing, compression, data reads and most metadata page
//! reads happen outside both. [`read_pins`] lets the garbage collector wait out a reader that
//! looked up a chunk location in a segment before the segment is reused; readers never wait.
//! Lock order: `maintenance` -> `meta` -> `log` -> `write_ahead` -> `inflight` -> `slots` ->
//! `flush`, then the leaves (docs/design.md, "Locks and their order"). Each part (`LogHead`,
//! `FreeSegments`, `CheckpointMarks`, `Collector`, `SegmentPreparer`) owns its state and its
//! invariants.

mod budget;
mod check;
mod checkpoint_marks;
mod checkpointing;
mod collector;
mod free_segments;
mod gc;
mod group_commit;
mod hold_histogram;
pub use group_commit::Durable;
mod inflight;
mod log;
mod log_head;
mod maintenance;
mod migrate;
mod open;
mod provision;
mod ranked;
mod read;
mod read_pins;
mod segment_preparer;
mod segments;
mod space;
mod wakeup;
mod write;

use log::{out_of_space, Unwritten};
use read::decode_chunk;

use crate::backend::{Devices, LogDevice, MetaArea, RootStore};
use crate::format::{
    self, Codec, Encoder, Record, CHUNK_PREFIX, RECORD_HEADER, SEAL_LEN, SEGMENT_START_LEN,
};
use crate::meta::hooks::Locality;
use crate::meta::map_tree::{holds_data, ANCHORED};
use crate::meta::page_store::Slots;
use crate::meta::root::{Counters, Geometry, Head};
use crate::meta::ApplyError;
use crate::state::{Loc, MetaState, SegState};
use checkpoint_marks::CheckpointMarks;
use collector::Collector;
use free_segments::FreeSegments;
use log_head::LogHead;
use ranked::{Rank, RankedGuard, RankedMutex};
use segment_preparer::SegmentPreparer;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar};
use std::time::{Duration, Instant};
use wakeup::Wakeup;

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
    #[error("{0}")]
    Refused(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl From<crate::meta::PageError> for EngineError {
    fn from(e: crate::meta::PageError) -> Self {
        EngineError::Metadata(e.to_string())
    }
}

impl From<ApplyError> for EngineError {
    fn from(e: ApplyError) -> Self {
        EngineError::Metadata(e.to_string())
    }
}

/// Pages a metadata cache of `bytes` holds. The setting is the RAM metadata may use: the
/// locality cache and the buffers and threads of the engine (about 40 MiB together) come out
/// of it; each page costs its 4 KiB and its bookkeeping (versions a checkpoint holds while
/// hosts change them count as pages).
fn cache_pages(bytes: u64) -> usize {
    let bytes = bytes.max(MIN_METADATA_CACHE);
    let pages = bytes.saturating_sub(CACHE_OVERHEAD) / 4250;
    (pages as usize).max(1024)
}

/// The page cache `tuning` asks for, reading the metadata area `meta`.
fn new_pager(meta: &Arc<dyn MetaArea>, tuning: &Tuning) -> crate::meta::pager::Pager {
    let mut pager = crate::meta::pager::Pager::new(
        Arc::new(crate::meta::page_store::MetaPages(meta.clone())),
        cache_pages(tuning.metadata_cache),
    );
    if tuning.metadata_journal != 0 {
        pager.set_journal_budget(tuning.metadata_journal);
    }
    pager
}

/// RAM of the metadata cache setting that is not pages (see [`cache_pages`]).
const CACHE_OVERHEAD: u64 = 40 << 20;

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

impl EngineConfig {
    /// Why these sizes cannot make an engine, or None: what `create` refuses, so also what no
    /// checkpoint of a created engine can hold.
    pub(crate) fn size_problem(&self) -> Option<String> {
        if !self.chunk_size.is_power_of_two() || !(4096..=65536).contains(&self.chunk_size) {
            return Some(format!(
                "chunk size {} is not a power of two from 4 KiB to 64 KiB",
                self.chunk_size
            ));
        }
        if self.segment_size < self.chunk_size * 16 || self.segment_size > 1 << 30 {
            return Some(format!(
                "segment size {} must be 16 chunks to 1 GiB",
                self.segment_size
            ));
        }
        None
    }
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
    /// Write a checkpoint after this many bytes of log: the most a crash recovery replays.
    pub checkpoint_bytes: u64,
    /// Bytes of RAM for cached metadata pages (`[engine] metadata_cache`): clean pages beyond
    /// it are evicted, and a checkpoint writes the dirty ones once they fill half of it.
    pub metadata_cache: u64,
    /// Bytes of the metadata cache the delta journal's pending words may take; 0 (the
    /// default) for a quarter of it, at most 256 MiB. Tests set it small to make consolidation
    /// and cleaning happen.
    pub metadata_journal: u64,
    /// How long the collector leaves a segment it could not read before reading it again;
    /// doubled with every further failure, up to 64 times. A failed read may pass (a path
    /// of a multipath disk, an object store out of reach while a restore hydrates), and a
    /// segment never collected again would hold its dead space until a restart.
    pub unreadable_retry: Duration,
}

/// The metadata cache when none is configured: an eighth of the machine's memory, at least
/// 128 MiB and at most 64 GiB.
pub fn default_metadata_cache() -> u64 {
    (budget::memory_limit() / 8).clamp(128 << 20, 64 << 30)
}

/// Smallest metadata cache accepted: room for the fixed overhead and every page one command
/// can touch, many times.
pub const MIN_METADATA_CACHE: u64 = 64 << 20;

impl Default for Tuning {
    fn default() -> Self {
        Self {
            compression: Compression::Lz4,
            gc: GcPriority::Medium,
            soft_threshold: 0.8,
            checkpoint_bytes: 256 << 20,
            metadata_cache: default_metadata_cache(),
            metadata_journal: 0,
            unreadable_retry: Duration::from_secs(60),
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
    /// Chunks of data hosts wrote since open (zeros excluded).
    pub data_chunks_written: u64,
    /// Of those, the ones found already stored (deduplicated) instead of written.
    pub dedup_chunks: u64,
    /// Syncs of the log since open: with the writes, how many writes a sync covers (group
    /// commit).
    pub log_syncs: u64,
    /// Bytes of metadata pages checkpoints wrote since open.
    pub metadata_written_bytes: u64,
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
    state: MetaState,
    counters: Counters,
    /// What the last durable checkpoint covered, what was appended since, its generation.
    checkpoint: CheckpointMarks,
    /// Fingerprints of recently used chunk pages (the dedup index's locality cache).
    locality: Locality,
}

/// The log's head and the free segments it takes from, under their own lock (RFC 0005 step
/// 9), taken after `meta` by whoever holds both. Everything that moves the head holds `meta`
/// too (records are applied in log order), so under `meta` the head and the state agree;
/// what needs only the head's length or the free lists (a flush, the segment preparer,
/// giving space back, free-space figures) takes this lock alone and does not wait for
/// metadata work.
struct Log {
    /// Where the next record goes, the bytes appended since open, the unsynced switches.
    head: LogHead,
    /// The free list, the segments' file space and the collector's claim.
    segments: FreeSegments,
}

impl Log {
    /// The segment lists' invariants, checked in debug builds after every change to them;
    /// with `state`, also that every listed segment is free in it (its rows change only
    /// under `meta`, so without `meta` only the lists' own invariants are checked).
    fn check_segment_lists(&self, state: Option<&MetaState>) {
        self.segments
            .check(|s| state.is_none_or(|state| state.segment(s).state == SegState::Free));
    }
}

/// The metadata lock, held: measures how long, so the longest hold is a figure, and holds
/// over 20 ms (what a host command could notice) are logged with where they were taken.
struct MetaGuard<'a> {
    guard: RankedGuard<'a, Meta>,
    since: Instant,
    at: &'static std::panic::Location<'static>,
    longest: &'a AtomicU64,
    total: &'a AtomicU64,
    holds: &'a hold_histogram::HoldHistogram,
}

impl std::ops::Deref for MetaGuard<'_> {
    type Target = Meta;
    fn deref(&self) -> &Meta {
        &self.guard
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut Meta {
        &mut self.guard
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        let elapsed = self.since.elapsed();
        self.total
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        self.holds.record(elapsed);
        let held = elapsed.as_micros() as u64;
        if held > self.longest.load(Ordering::Relaxed) {
            self.longest.fetch_max(held, Ordering::Relaxed);
        }
        if held > 20_000 {
            tracing::debug!(held_us = held, at = %self.at, "metadata lock held long");
        }
    }
}

/// Segments a writer opens at most beyond the log's durable prefix (what a sync made durable
/// with no write in flight below it, so replay reaches it): the sequence numbers a crash can
/// lose, which the head skips after one (see [`open::repair_tail`]). Checkpoints sync every
/// 256 MiB of log and hosts flush, so the writer's own sync at this bound (4 GiB of 4 MiB
/// segments) is a backstop that is rarely reached.
const MAX_UNSYNCED_SEGMENTS: u64 = if cfg!(test) { 8 } else { 1024 };

/// Free segments kept allocated in the log file ahead of the head (256 MiB with 4 MiB
/// segments: about a second of a fast sequential write, the longest allocation stall seen).
const READY_SEGMENTS: usize = 64;

/// A checkpoint after this many chunk records: replay applies each, so this bounds crash
/// recovery time when chunks are small (compressible data), as `checkpoint_bytes` does when
/// they are large.
const CHECKPOINT_RECORDS: u64 = 2 << 20;

/// Map nodes a command releases itself (4,096 leaves map 8 GiB of 4 KiB chunks); the
/// background rounds release the rest.
const INLINE_RELEASE: u64 = 4096;

/// What a writer read of the metadata cache in its own lock hold: whether the dirty pages
/// call for a background checkpoint, and whether they are past the point where the writer
/// must write them itself.
#[derive(Clone, Copy)]
struct CachePressure {
    checkpoint_wanted: bool,
    over_budget: bool,
}

impl CachePressure {
    fn of(pager: &crate::meta::pager::Pager) -> Self {
        CachePressure {
            checkpoint_wanted: pager.checkpoint_wanted(),
            over_budget: pager.over_budget(),
        }
    }
}

/// Chunk pages the locality cache holds (128 fingerprints each).
const LOCALITY_PAGES: usize = 2048;

/// Collections a write may trigger before it reports out of space (the backing file system
/// itself may be full, which collection cannot always fix).
const MAX_COLLECTIONS: u32 = 8;

struct FlushState {
    durable: u64,
    syncing: bool,
}

/// What a write of one chunk turns into. Data stored raw borrows the host's buffer: the
/// only copy is the one into the log record.
enum Prepared<'a> {
    Zero,
    Data {
        hash: [u8; 16],
        codec: Codec,
        bytes: std::borrow::Cow<'a, [u8]>,
    },
}

impl Prepared<'_> {
    /// The same, owning its bytes (a merged partial chunk outlives its buffer).
    fn into_owned(self) -> Prepared<'static> {
        match self {
            Prepared::Zero => Prepared::Zero,
            Prepared::Data { hash, codec, bytes } => Prepared::Data {
                hash,
                codec,
                bytes: std::borrow::Cow::Owned(bytes.into_owned()),
            },
        }
    }
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
    /// Where the log's segments are written and read.
    log_device: Arc<dyn LogDevice>,
    /// Where checkpoints write metadata pages and the page cache reads them.
    meta_area: Arc<dyn MetaArea>,
    /// Where checkpoints store the root.
    root_store: Arc<dyn RootStore>,
    geometry: Geometry,
    meta: RankedMutex<Meta>,
    /// The log's head and the free segments ([`Log`]).
    log: RankedMutex<Log>,
    /// Free slots of the metadata area (checkpoints allocate and retire them).
    slots: RankedMutex<Slots>,
    /// Unique and shared bytes of volumes, from their last walk.
    usage: RankedMutex<HashMap<u32, space::UsageWalk>>,
    /// Bytes of metadata pages checkpoints have written since open.
    metadata_written: AtomicU64,
    /// The longest hold of `meta` since open (microseconds).
    longest_hold: AtomicU64,
    /// Nanoseconds the metadata lock was held in all, since open: with the commands served
    /// meanwhile, the serial part of each (what bounds the engine's rate however many cores
    /// it has).
    total_hold_ns: AtomicU64,
    /// The holds of `meta` since open by length.
    holds: hold_histogram::HoldHistogram,
    /// Data chunks hosts wrote since open, and how many of them dedup found stored.
    data_chunks_written: AtomicU64,
    dedup_chunks: AtomicU64,
    /// Log syncs since open ([`EngineSpace::log_syncs`]).
    log_syncs: AtomicU64,
    /// The segment being written ahead of the head, and the preparer's thread's wakeup.
    preparer: SegmentPreparer,
    /// Readers still reading segments they resolved: the collector waits them out before a
    /// freed segment is written again.
    read_pins: read_pins::ReadPins,
    flush: RankedMutex<FlushState>,
    flushed: Condvar,
    /// Completions waiting for the log to be durable, and the thread that syncs for them.
    group_commit: Arc<group_commit::GroupCommit>,
    /// Log ranges applied but still being written (host writes write outside `meta`).
    inflight: inflight::InFlight,
    poison: RankedMutex<Option<String>>,
    poisoned: AtomicBool,
    /// Serialises garbage collection and checkpoints.
    maintenance: RankedMutex<()>,
    tuning: RankedMutex<Tuning>,
    stop: AtomicBool,
    /// The collector's unreadable segments, clock, relocation count and wakeup.
    collector: Collector,
    /// Bumped by every host read and write: maintenance gives file space back only while it
    /// stands still (hole punching stalls the log appends and reads hosts wait for).
    host_activity: AtomicU64,
    /// `host_activity` at the previous background round: hosts were busy in between if it
    /// moved (see [`Engine::maintain_in_background`]).
    activity_at_last_round: AtomicU64,
    read_only: bool,
    recovery: Recovery,
    /// Run by the collector between the lock holds of a relocation (tests: hosts appending
    /// meanwhile).
    #[cfg(test)]
    between_relocation_holds: RankedMutex<Option<TestHook>>,
}

#[cfg(test)]
type TestHook = Box<dyn FnMut(&Engine) + Send>;

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
    fn of(id: u64) -> Self {
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
    /// Bytes of metadata pages written by checkpoints since open (the cost of keeping the
    /// metadata on disk, next to `host_written_bytes`).
    pub fn metadata_written(&self) -> u64 {
        self.metadata_written.load(Ordering::Relaxed)
    }

    /// Figures of the metadata cache.
    pub fn cache_stats(&self) -> crate::meta::pager::PagerStats {
        self.lock_meta().state.pager().stats()
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

    /// Read the time from `clock` from now on (tests move a [`crate::clock::ManualClock`]).
    pub fn set_clock(&self, clock: Arc<dyn crate::clock::Clock>) {
        self.collector.set_clock(clock);
    }

    /// The time by the engine's clock.
    pub(super) fn now(&self) -> Instant {
        self.collector.now()
    }

    /// Whether segments in use exceed the soft threshold share of capacity. Cheap: two short
    /// lock holds.
    pub fn soft_threshold_exceeded(&self) -> bool {
        let threshold = self.tuning.lock().unwrap().soft_threshold;
        let count = self.geometry.segment_count as f64;
        let usable = count - gc_reserve(self.geometry.segment_count) as f64;
        let m = self.lock_meta();
        let held = self.anchor_reserve(m.state.anchored()) as f64;
        let used = count - self.lock_log().segments.len() as f64 + held;
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
            + self.anchor_reserve(m.state.anchored()) as u64;
        (self.lock_log().segments.len() as u64).saturating_sub(keep)
            * self.geometry.segment_size as u64
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

    /// The log's head and the free segments: after `meta` when both are held.
    fn lock_log(&self) -> RankedGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[track_caller]
    fn lock_meta(&self) -> MetaGuard<'_> {
        let guard = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        MetaGuard {
            guard,
            since: Instant::now(),
            at: std::panic::Location::caller(),
            longest: &self.longest_hold,
            total: &self.total_hold_ns,
            holds: &self.holds,
        }
    }

    /// [`Engine::lock_meta`] unless another thread holds it: for a read that must not wait.
    #[track_caller]
    fn try_lock_meta(&self) -> Option<MetaGuard<'_>> {
        let guard = match self.meta.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(MetaGuard {
            guard,
            since: Instant::now(),
            at: std::panic::Location::caller(),
            longest: &self.longest_hold,
            total: &self.total_hold_ns,
            holds: &self.holds,
        })
    }

    /// The longest the metadata lock was held since open, in microseconds: every host
    /// command may wait that long for metadata work.
    pub fn longest_lock_hold_us(&self) -> u64 {
        self.longest_hold.load(Ordering::Relaxed)
    }

    /// The holds of the metadata lock since open by length: each bucket's upper bound in
    /// seconds (the last infinite) and the holds up to it (cumulative).
    pub fn lock_holds(&self) -> Vec<(f64, u64)> {
        self.holds.cumulative()
    }

    /// How long the metadata lock was held in all since open, in nanoseconds.
    pub fn lock_held_ns(&self) -> u64 {
        self.total_hold_ns.load(Ordering::Relaxed)
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
        drop(p);
        // Waiters on log ranges that will never be written give up.
        self.inflight.wake_all();
        EngineError::Poisoned(why)
    }

    pub fn poisoned(&self) -> Option<String> {
        self.poison.lock().unwrap().clone()
    }

    pub fn volumes(&self) -> Vec<(u32, u64)> {
        let m = self.lock_meta();
        m.state.volume_maps().map(|(id, v)| (id, v.size)).collect()
    }

    pub fn volume_size(&self, volume: u32) -> Result<u64> {
        let m = self.lock_meta();
        m.state
            .volume_map(volume)
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
            if !m.state.has_volume(src) {
                return Err(EngineError::NoSuchVolume(src));
            }
            let id = m.counters.next_volume;
            e.volume_clone(src, id);
            Ok(id)
        })
    }

    pub fn delete_volume(&self, volume: u32) -> Result<()> {
        self.append_meta(|m, e| {
            if !m.state.has_volume(volume) {
                return Err(EngineError::NoSuchVolume(volume));
            }
            e.volume_delete(volume);
            Ok(())
        })?;
        // A small volume's space comes back at once; a large one's in the background.
        self.release_nodes(INLINE_RELEASE)?;
        self.wake_gc();
        Ok(())
    }

    pub fn resize_volume(&self, volume: u32, size: u64) -> Result<()> {
        self.check_size(size)?;
        self.append_meta(|m, e| {
            if !m.state.has_volume(volume) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{mem_engine, xorshift64};

    /// What volume `v` of `engine` reads: `len` bytes at `offset`.
    fn read_back(engine: &Engine, v: u32, offset: u64, len: usize) -> Vec<u8> {
        let mut back = vec![0u8; len];
        engine.read(v, offset, &mut back).unwrap();
        back
    }

    /// No collector and no checkpoint by volume of log: the test decides when they happen.
    fn no_checkpoints() -> Tuning {
        Tuning {
            checkpoint_bytes: u64::MAX,
            ..gc_off()
        }
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
        let mut noise =
            |len: usize| -> Vec<u8> { (0..len).map(|_| xorshift64(&mut x) as u8).collect() };
        engine.write(v, 0, &noise(4 << 20)).unwrap();
        engine.unmap(v, 0, 4 << 20).unwrap();
        engine.checkpoint().unwrap();
        engine.collect_garbage(0.0).unwrap();
        {
            let mut m = engine.lock_log();
            assert!(
                m.segments.any_undiscarded(),
                "freed segments wait to be punched"
            );
            // Never-allocated segments on top (popped first), the dead ones below.
            m.segments.undiscarded_to_bottom();
        }
        backend.limit_space(backend.allocated_bytes(), 4096);
        let fresh = noise(1 << 20);
        engine.write(v, 4 << 20, &fresh).unwrap();
        assert!(read_back(&engine, v, 4 << 20, 1 << 20) == fresh);
        assert!(!engine.lock_log().segments.any_undiscarded());
        assert!(engine.poisoned().is_none());
    }

    /// A segment the head could not allocate (a full file system) waits to be punched:
    /// `fallocate` may have kept part of what it allocated before it ran out of space.
    #[test]
    fn a_segment_the_head_could_not_allocate_waits_to_be_punched() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(16 << 20).unwrap();
        engine.lock_log().segments.nothing_to_discard();
        backend.limit_space(backend.allocated_bytes(), 4096);
        let err = engine.write(v, 0, &noise(1, 2 << 20)).unwrap_err();
        assert!(matches!(err, EngineError::NoSpace), "{err}");
        assert!(engine.lock_log().segments.any_undiscarded());
        assert!(engine.poisoned().is_none());
    }

    /// Incompressible bytes, different per `seed` (also the write path's tests).
    pub(super) use crate::test_data::noise;

    /// A checkpoint writes the pages changed since the last one, not the whole metadata: a
    /// small write after a large one costs a handful of pages, and a checkpoint with nothing
    /// changed writes none.
    #[test]
    fn checkpoints_write_only_the_pages_that_changed() {
        let (backend, engine) = mem_engine(256 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(64 << 20).unwrap();
        engine.write(v, 0, &noise(1, 20 << 20)).unwrap();
        engine.checkpoint().unwrap();
        let after_big = engine.metadata_written();
        assert!(
            after_big > 40 * 4096,
            "5,120 chunks take 40 chunk pages and more"
        );
        engine.checkpoint().unwrap();
        assert_eq!(engine.metadata_written(), after_big, "nothing changed");
        engine.write(v, 8 << 20, &noise(2, 4096)).unwrap();
        engine.checkpoint().unwrap();
        let small = engine.metadata_written() - after_big;
        assert!(
            small <= 16 * 4096,
            "one 4 KiB write cost {} pages",
            small / 4096
        );
        // What was written is what a restart sees.
        drop(engine);
        let engine = Engine::open(backend, gc_off(), false).unwrap();
        assert!(read_back(&engine, v, 8 << 20, 4096) == noise(2, 4096));
        assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    }

    /// A damaged metadata page is found by its checksum, reported with its table and place,
    /// and never read as metadata: reads that need it fail, `check` names it.
    #[test]
    fn a_damaged_metadata_page_is_reported_never_used() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(16 << 20).unwrap();
        engine.write(v, 0, &noise(7, 4 << 20)).unwrap();
        engine.shutdown().unwrap();
        let slot = engine
            .lock_meta()
            .state
            .pager()
            .loc(crate::meta::tables::CHUNK_TABLE, 0)
            .slot;
        drop(engine);
        backend.corrupt_meta(slot * 4096 + 100);
        let engine = Engine::open(backend.clone(), gc_off(), true).unwrap();
        let mut buf = vec![0u8; 4096];
        let e = engine.read(v, 0, &mut buf).unwrap_err().to_string();
        assert!(
            e.contains("chunk table") && e.contains(&format!("slot {slot}")),
            "{e}"
        );
        let problems = engine.check(&mut |_, _| {});
        assert!(
            problems
                .iter()
                .any(|p| p.contains("chunk table") && p.contains(&format!("slot {slot}"))),
            "{problems:?}"
        );
    }

    /// A record that no longer fits the state when it is appended (its volume deleted or
    /// shrunk by a racing command) is refused before it is written: the engine is not
    /// poisoned and nothing reaches the log that replay would refuse.
    #[test]
    fn a_record_that_raced_a_delete_is_refused_not_written() {
        let (_, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        engine.write(v, 0, &noise(3, 8192)).unwrap();
        engine.delete_volume(v).unwrap();
        let mut m = engine.lock_meta();
        let head = engine.lock_log().head.at();
        let mut buf = Vec::new();
        Encoder::new(&mut buf, head.seq).unmap(v, 0, 2);
        let at = engine.reserve(&mut m, buf.len(), Space::Metadata).unwrap();
        let r = engine.append_at(&mut m, at, &buf);
        assert!(matches!(r, Err(EngineError::Invalid(_))), "{r:?}");
        assert_eq!(engine.lock_log().head.at(), head, "nothing appended");
        drop(m);
        assert!(engine.poisoned().is_none());
        let w = engine.create_volume(8 << 20).unwrap();
        engine.write(w, 0, &noise(4, 4096)).unwrap();
    }

    /// Append unique single-chunk host writes to `volume` from chunk `*next` on, as the write
    /// path does under the lock, until the log refuses data: the head is full and the free
    /// segments left are the reserve and the collector's claim.
    fn fill_as_hosts(engine: &Engine, volume: u32, next: &mut u64) -> usize {
        let mut n = 0;
        loop {
            let p = engine.prepare(&noise(1_000_000 + *next, 4096)).into_owned();
            let mut m = engine.lock_meta();
            match engine.commit(&mut m, volume, *next, &[&p]) {
                Ok(u) => {
                    drop(m);
                    engine.write_unwritten(u).unwrap();
                }
                Err(EngineError::NoSpace) => return n,
                Err(e) => panic!("host append failed: {e}"),
            }
            *next += 1;
            n += 1;
        }
    }

    /// Hosts fill every segment the collector takes between its batches. On a full array
    /// (free segments down to the reserve) a relocation still finishes and frees its victim:
    /// a segment it takes there is filled with its own batches in one lock hold. (Before,
    /// each batch took one more free segment until none was left, the relocation failed half
    /// done and the array refused every write: the rare "out of space" of the 4-writer test
    /// in tests/engine.rs.)
    #[test]
    fn a_relocation_finishes_when_hosts_fill_every_segment_it_takes() {
        let seg = 128u32 << 10;
        let (_, engine) = mem_engine(4 << 20, seg, gc_off());
        let v = engine.create_volume(1 << 20).unwrap();
        // The victim: 96 KiB, half of it overwritten, older than the checkpoint.
        let old = noise(5, 96 << 10);
        engine.write(v, 0, &old).unwrap();
        let mut model = old.clone();
        for c in (0..24).step_by(2) {
            let data = noise(100 + c, 4096);
            engine.write(v, c * 4096, &data).unwrap();
            model[c as usize * 4096..(c as usize + 1) * 4096].copy_from_slice(&data);
        }
        engine.checkpoint().unwrap();
        let filler = engine.create_volume(8 << 20).unwrap();
        let mut next = 0;
        assert!(fill_as_hosts(&engine, filler, &mut next) > 0);
        let reserve = gc_reserve(engine.geometry.segment_count) as usize;
        assert_eq!(
            engine.lock_log().segments.len(),
            reserve,
            "the array is full"
        );
        let before = next;
        let shared_next = Arc::new(AtomicU64::new(next));
        let counter = shared_next.clone();
        *engine.between_relocation_holds.lock().unwrap() = Some(Box::new(move |e: &Engine| {
            let mut at = counter.load(Ordering::Relaxed);
            fill_as_hosts(e, filler, &mut at);
            counter.store(at, Ordering::Relaxed);
        }));
        let relocated = {
            let _maintenance = engine.maintenance.lock().unwrap();
            engine.collect_one(0.9, false).unwrap()
        };
        *engine.between_relocation_holds.lock().unwrap() = None;
        assert!(matches!(relocated, Some(n) if n > 0), "{relocated:?}");
        assert!(
            shared_next.load(Ordering::Relaxed) > before,
            "hosts appended between the holds"
        );
        {
            let m = engine.lock_log();
            assert_eq!(m.segments.claim(), 0);
            assert!(m.segments.len() >= reserve, "{} free", m.segments.len());
        }
        let back = read_back(&engine, v, 0, model.len());
        assert!(back == model, "the relocated data reads back");
        assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    }

    /// Segments claimed by a relocation in progress are left to it: host data and metadata
    /// records are refused the last free segments the collector counts on (hosts append to
    /// the same head between its batches), the collector takes them, and the claim ends with
    /// the relocation.
    #[test]
    fn a_relocation_keeps_the_segments_it_claimed() {
        let (_, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(16 << 20).unwrap();
        engine.write(v, 0, &noise(7, 64 << 10)).unwrap();
        let largest = (1 << 20) - SEGMENT_START_LEN - SEAL_LEN;
        {
            let mut m = engine.lock_meta();
            assert!(
                engine.lock_log().head.at().offset as usize > SEGMENT_START_LEN,
                "the next record switches"
            );
            let free = engine.lock_log().segments.len();
            engine.lock_log().segments.set_claim(free - 1);
            for class in [Space::Data, Space::AnchoredData, Space::Metadata] {
                let r = engine.reserve(&mut m, largest, class);
                assert!(matches!(r, Err(EngineError::NoSpace)), "{r:?}");
            }
            assert_eq!(engine.lock_log().segments.len(), free, "nothing taken");
            let at = engine.reserve(&mut m, largest, Space::Collector).unwrap();
            assert_eq!(at.offset as usize, SEGMENT_START_LEN);
            assert_eq!(engine.lock_log().segments.len(), free - 1);
            assert_eq!(
                engine.lock_log().segments.claim(),
                free - 2,
                "the claim shrinks as it is used"
            );
            engine.lock_log().segments.set_claim(0);
        }
        // A real relocation: garbage made, collected, and no claim left behind.
        engine.write(v, 0, &noise(8, 4 << 20)).unwrap();
        engine.write(v, 0, &noise(9, 4 << 20)).unwrap();
        assert!(
            engine.collect_garbage(1.0).unwrap() > 0,
            "something relocated"
        );
        assert_eq!(engine.lock_log().segments.claim(), 0);
        let back = read_back(&engine, v, 0, 4 << 20);
        assert!(back == noise(9, 4 << 20), "the relocated data reads back");
    }

    /// A host write's batch, applied under the lock but not yet written to the log (what a
    /// write looks like to other commands while its `pwrite` is blocked in the file system).
    fn applied_not_written(engine: &Engine, volume: u32, chunk: u64, data: &[u8]) -> Unwritten {
        let prepared = engine.prepare(data);
        let mut m = engine.lock_meta();
        let unwritten = engine.commit(&mut m, volume, chunk, &[&prepared]).unwrap();
        assert!(matches!(unwritten, Unwritten::Pending { .. }));
        unwritten
    }

    /// A read of a chunk whose record is still on its way to the log waits for it (reading
    /// the log then would find no record there and fail, or worse, find an old one).
    #[test]
    fn a_read_of_a_chunk_in_flight_waits_for_its_write() {
        let (_, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        let data = noise(5, 4096);
        let unwritten = applied_not_written(&engine, v, 3, &data);
        let written = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut back = vec![0u8; 4096];
                let r = engine.read(v, 3 * 4096, &mut back);
                (r, back, written.load(Ordering::Acquire))
            });
            // Give the reader time to reach the range (were it not to wait, it would read now).
            std::thread::sleep(Duration::from_millis(50));
            written.store(true, Ordering::Release);
            engine.write_unwritten(unwritten).unwrap();
            let (r, back, after) = reader.join().unwrap();
            r.unwrap();
            assert!(after, "the read returned before the write it depends on");
            assert!(back == data);
        });
    }

    /// `flush` counts a write as durable only once its bytes are written and synced: a crash
    /// right after a flush that overlapped a write in flight keeps that write.
    #[test]
    fn flush_waits_for_log_writes_in_flight() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        let data = noise(6, 4096);
        let unwritten = applied_not_written(&engine, v, 0, &data);
        let written = AtomicBool::new(false);
        std::thread::scope(|s| {
            let flusher = s.spawn(|| (engine.flush(), written.load(Ordering::Acquire)));
            std::thread::sleep(Duration::from_millis(50));
            written.store(true, Ordering::Release);
            engine.write_unwritten(unwritten).unwrap();
            let (r, after) = flusher.join().unwrap();
            r.unwrap();
            assert!(
                after,
                "flush returned before the write in flight was written"
            );
        });
        // Power fails: nothing that was not synced survives.
        let crashed = Arc::new(backend.crash(|_, n| vec![false; n]));
        let reopened = Engine::open(crashed, gc_off(), false).unwrap();
        let mut back = vec![0u8; 4096];
        reopened.read(v, 0, &mut back).unwrap();
        assert!(back == data, "a flushed write was lost");
    }

    /// Writes are acknowledged in log order: a write whose bytes are written still waits for
    /// an earlier one in flight, so a crash of the process alone (the page cache survives)
    /// never loses a write that was acknowledged.
    #[test]
    fn writes_are_acknowledged_in_log_order() {
        let (_, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        let first = applied_not_written(&engine, v, 1, &noise(11, 4096));
        let second = applied_not_written(&engine, v, 2, &noise(12, 4096));
        let first_written = AtomicBool::new(false);
        std::thread::scope(|s| {
            let later = s.spawn(|| {
                let r = engine.write_unwritten(second);
                (r, first_written.load(Ordering::Acquire))
            });
            std::thread::sleep(Duration::from_millis(50));
            first_written.store(true, Ordering::Release);
            engine.write_unwritten(first).unwrap();
            let (r, after) = later.join().unwrap();
            r.unwrap();
            assert!(
                after,
                "a later write was acknowledged before an earlier one was written"
            );
        });
    }

    /// A segment switch's seal and start records are written outside the locks (RFC 0005
    /// step 11), by whoever next waits for the log: a command that switched segments has
    /// them written before it returns, so nothing is still owed between commands, and a crash
    /// of the process alone (every write issued survives, nothing synced) keeps every
    /// command that returned, across the switches of host writes and of UNMAP records.
    #[test]
    fn segment_switches_are_written_before_the_command_that_made_them_returns() {
        let (backend, engine) = mem_engine(64 << 20, 128 << 10, no_checkpoints());
        let v = engine.create_volume(8 << 20).unwrap();
        let chunk = engine.geometry.chunk_size as u64;
        let mut model = vec![0u8; 8 << 20];
        let mut switches = (0, 0);
        let mut segment = engine.lock_log().head.at().segment;
        // After each command: nothing owed any more, and whether the head left `segment`
        // (which then names the head's new one).
        let after = |segment: &mut u32, command: &str| -> u32 {
            assert!(
                engine.inflight.take_owed().is_empty(),
                "{command}'s segment switch still owed after it returned"
            );
            let now = engine.lock_log().head.at().segment;
            let switched = now != *segment;
            *segment = now;
            switched as u32
        };
        for k in 0..1500u64 {
            // Mostly small UNMAP records, which fill a segment in a few thousand, and now and
            // then a write of 24 KiB.
            if k % 40 == 0 {
                let data = noise(500 + k, 24 << 10);
                let at = (k * 7919 % 300) * chunk;
                engine.write(v, at, &data).unwrap();
                model[at as usize..at as usize + data.len()].copy_from_slice(&data);
                switches.0 += after(&mut segment, "a write");
            }
            if k % 40 == 20 {
                // A whole leaf's range written, then unmapped: the UNMAP releases the leaf
                // inline, in records of its own.
                let (from, len) = (1024 * chunk, 512 * chunk);
                engine
                    .write(v, from, &vec![k as u8 | 1; len as usize])
                    .unwrap();
                engine.unmap(v, from, len).unwrap();
                model[from as usize..(from + len) as usize].fill(0);
                after(&mut segment, "an UNMAP releasing a leaf");
            }
            for u in 0..8 {
                let at = ((k * 8 + u) * 104_729 % 2048) * chunk;
                engine.unmap(v, at, chunk).unwrap();
                model[at as usize..(at + chunk) as usize].fill(0);
                switches.1 += after(&mut segment, "an UNMAP");
            }
        }
        assert!(
            switches.0 >= 2 && switches.1 >= 2,
            "writes and UNMAP records both switched segments: {switches:?}"
        );
        let crashed = Arc::new(backend.crash(|_, n| vec![true; n]));
        let reopened = Engine::open(crashed, gc_off(), false).unwrap();
        let mut back = vec![0u8; model.len()];
        reopened.read(v, 0, &mut back).unwrap();
        assert!(back == model, "a command that returned was lost");
        let problems = reopened.check(&mut |_, _| {});
        assert!(problems.is_empty(), "{problems:?}");
    }

    /// Writes in flight complete out of order: a crash with an earlier range unwritten and a
    /// later one written keeps the log before the hole only (no flush passed the hole, so no
    /// host was told either write was durable), and the array opens clean and writable.
    #[test]
    fn a_crash_with_a_hole_before_a_written_range_keeps_the_prefix() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(8 << 20).unwrap();
        let kept = noise(7, 4096);
        engine.write(v, 0, &kept).unwrap();
        engine.flush().unwrap();
        let first = applied_not_written(&engine, v, 1, &noise(8, 4096));
        let second = applied_not_written(&engine, v, 2, &noise(9, 4096));
        // The second range's bytes land (its writer then waits for the first, see below).
        let Unwritten::Pending {
            segment,
            offset,
            bytes,
            ..
        } = second
        else {
            unreachable!()
        };
        let seg = engine.geometry.segment_size as u64;
        backend
            .write_at(&bytes, segment as u64 * seg + offset as u64)
            .unwrap();
        // Every unsynced write survives the crash; the first range was never written.
        let crashed = Arc::new(backend.crash(|_, n| vec![true; n]));
        drop(first);
        let reopened = Engine::open(crashed, gc_off(), false).unwrap();
        let mut back = vec![0u8; 3 * 4096];
        reopened.read(v, 0, &mut back).unwrap();
        assert!(back[..4096] == kept[..]);
        assert!(
            back[4096..].iter().all(|&b| b == 0),
            "a record after the hole was replayed"
        );
        let problems = reopened.check(&mut |_, _| {});
        assert!(problems.is_empty(), "{problems:?}");
        let fresh = noise(10, 2 * 4096);
        reopened.write(v, 4096, &fresh).unwrap();
        reopened.flush().unwrap();
        reopened.read(v, 0, &mut back).unwrap();
        assert!(back[4096..] == fresh[..]);
    }

    /// A writer that opens segment after segment with nothing syncing the log syncs it
    /// itself every [`MAX_UNSYNCED_SEGMENTS`] (8 in tests) segments: what it wrote before then
    /// survives a power loss, and the head after the crash skips at most that many sequence
    /// numbers, not the whole segment count (here 512).
    #[test]
    fn a_writer_syncs_every_few_segments_so_a_crash_skips_few_sequences() {
        let tuning = no_checkpoints();
        let (backend, engine) = mem_engine(64 << 20, 128 << 10, tuning);
        let v = engine.create_volume(8 << 20).unwrap();
        engine.flush().unwrap();
        let chunk = 128 << 10;
        for k in 0..60u64 {
            engine
                .write(v, k * chunk, &noise(100 + k, chunk as usize))
                .unwrap();
        }
        let (unsynced, seq) = {
            let m = engine.lock_log();
            (m.head.unsynced_switches() as u64, m.head.at().seq)
        };
        assert!(seq >= 20, "{seq}: too few segments opened");
        assert!(
            unsynced <= MAX_UNSYNCED_SEGMENTS,
            "{unsynced} switches not durable"
        );
        // The power fails: no write since the last sync survives.
        let crashed = Arc::new(backend.crash(|_, n| vec![false; n]));
        drop(engine);
        let reopened = Engine::open(crashed, tuning, false).unwrap();
        let head = reopened.lock_log().head.at().seq;
        assert!(
            head <= seq + MAX_UNSYNCED_SEGMENTS + 1,
            "head {head} after a crash at sequence {seq}"
        );
        let mut back = vec![0u8; chunk as usize];
        reopened.read(v, 0, &mut back).unwrap();
        assert!(
            back == noise(100, chunk as usize),
            "the first write was synced"
        );
        let problems = reopened.check(&mut |_, _| {});
        assert!(problems.is_empty(), "{problems:?}");
        // Writes after the crash land, and survive a clean restart.
        reopened.write(v, 0, &noise(1, chunk as usize)).unwrap();
        reopened.flush().unwrap();
        reopened.read(v, 0, &mut back).unwrap();
        assert!(back == noise(1, chunk as usize));
    }

    /// A checkpoint whose root could not be stored (a full file system) after its pages were
    /// written and installed: the retry writes under the next generation, so a leaf the failed
    /// attempt wrote whole and the retry wrote as a delta reads back its last word after a
    /// restart (with one generation for both, open took the word for older than the base).
    #[test]
    fn a_checkpoint_retried_after_its_root_failed_keeps_every_word() {
        let tuning = no_checkpoints();
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, tuning);
        let v = engine.create_volume(8 << 20).unwrap();
        // A leaf of 256 new chunks: written whole.
        engine.write(v, 0, &noise(1, 1 << 20)).unwrap();
        backend.fail_next_root();
        assert!(matches!(engine.checkpoint(), Err(EngineError::NoSpace)));
        // One word of that leaf changes: the retry writes it as a delta on the new base.
        let fresh = noise(2, 4096);
        engine.write(v, 0, &fresh).unwrap();
        engine.checkpoint().unwrap();
        let crashed = Arc::new(backend.crash(|_, n| vec![true; n]));
        drop(engine);
        let reopened = Engine::open(crashed, tuning, false).unwrap();
        let mut back = vec![0u8; 4096];
        reopened.read(v, 0, &mut back).unwrap();
        assert!(
            back == fresh,
            "the word written after the failed root was lost"
        );
        let problems = reopened.check(&mut |_, _| {});
        assert!(problems.is_empty(), "{problems:?}");
    }

    /// Background collection waits while hosts are busy and space is plentiful, runs once
    /// they pause, and does not wait when free space runs short.
    #[test]
    fn background_collection_yields_to_busy_hosts_only_while_space_is_plentiful() {
        let relocated = |e: &Engine| e.collector.relocated();
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
        let free = tight.lock_log().segments.len() as f64;
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

    /// Checkpoints come after `checkpoint_bytes` of log (the replay bound), never from a
    /// timer: an idle array writes nothing.
    #[test]
    fn checkpoints_follow_the_log_not_a_timer() {
        let tuning = Tuning {
            checkpoint_bytes: 1 << 20,
            ..gc_off()
        };
        let (_, engine) = mem_engine(256 << 20, 1 << 20, tuning);
        let v = engine.create_volume(64 << 20).unwrap();
        engine.maintain().unwrap();
        let generation = |e: &Engine| e.lock_meta().checkpoint.generation();
        let idle = generation(&engine);
        engine.maintain().unwrap();
        assert_eq!(generation(&engine), idle, "an idle array writes nothing");
        engine.write(v, 0, &noise(5, 512 << 10)).unwrap();
        engine.maintain().unwrap();
        assert_eq!(generation(&engine), idle, "half the log bound");
        engine.write(v, 1 << 20, &noise(6, 1 << 20)).unwrap();
        engine.maintain().unwrap();
        assert_eq!(generation(&engine), idle + 1, "past the log bound");
        let written = engine.metadata_written();
        std::thread::sleep(Duration::from_millis(50));
        engine.maintain().unwrap();
        assert_eq!(engine.metadata_written(), written);
    }

    /// While the log's syncs are small, the segments prepared next are written ahead (zeros,
    /// synced once per segment); after large syncs they are not. The head writes into them
    /// either way, and a crash that keeps any subset of the unsynced writes loses nothing
    /// that was flushed.
    #[test]
    fn segments_are_written_ahead_while_syncs_are_small() {
        let (backend, engine) = mem_engine(1 << 30, 1 << 20, gc_off());
        let v = engine.create_volume(256 << 20).unwrap();
        for i in 0..16 {
            engine.write(v, i * 4096, &noise(i, 4096)).unwrap();
            engine.flush().unwrap();
        }
        assert_eq!(engine.prepare_segments(), READY_SEGMENTS);
        assert_eq!(
            backend.written_ahead(),
            (READY_SEGMENTS as u64) << 20,
            "small syncs: each 1 MiB segment written ahead"
        );
        assert_eq!(backend.pending_writes(), 0, "and synced");
        for &s in engine.lock_log().segments.ready().iter() {
            let mut seg = vec![1u8; 1 << 20];
            backend.read_at(&mut seg, (s as u64) << 20).unwrap();
            assert!(seg.iter().all(|&b| b == 0), "segment {s} not zeroed");
        }
        // The head writes into segments written ahead.
        let first = noise(100, 8 << 20);
        engine.write(v, 1 << 20, &first).unwrap();
        engine.flush().unwrap();
        // One large sync: the next round writes nothing ahead.
        let second = noise(101, 16 << 20);
        engine.write(v, 16 << 20, &second).unwrap();
        engine.flush().unwrap();
        let unflushed = noise(102, 64 << 10);
        engine.write(v, 64 << 20, &unflushed).unwrap();
        let (pending, ahead) = (backend.pending_writes(), backend.written_ahead());
        assert!(engine.prepare_segments() > 0);
        assert_eq!(
            (backend.pending_writes(), backend.written_ahead()),
            (pending, ahead),
            "large syncs: nothing written ahead (or synced)"
        );
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..4 {
            let crashed = Arc::new(backend.crash(|_, n| {
                (0..n)
                    .map(|_| round == 3 || xorshift64(&mut x) & 1 == 1)
                    .collect()
            }));
            let reopened = Engine::open(crashed, gc_off(), false).unwrap();
            for i in 0..16 {
                assert!(read_back(&reopened, v, i * 4096, 4096) == noise(i, 4096));
            }
            assert!(read_back(&reopened, v, 1 << 20, 8 << 20) == first);
            assert!(read_back(&reopened, v, 16 << 20, 16 << 20) == second);
        }
    }

    /// Segments prepared while syncs were large are allocated only; once syncs turn small
    /// the preparer writes them ahead too (before, they stayed as they were until the head
    /// used them, and every sync there recorded a conversion of blocks).
    #[test]
    fn ready_segments_are_written_ahead_when_syncs_turn_small() {
        let (backend, engine) = mem_engine(1 << 30, 1 << 20, gc_off());
        let v = engine.create_volume(256 << 20).unwrap();
        engine.write(v, 0, &noise(1, 16 << 20)).unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.prepare_segments(), READY_SEGMENTS);
        assert_eq!(backend.written_ahead(), 0, "large syncs");
        let unwritten = engine.lock_log().segments.unwritten().len();
        assert_eq!(unwritten, READY_SEGMENTS);
        for i in 0..16 {
            engine.write(v, i * 4096, &noise(i, 4096)).unwrap();
            engine.flush().unwrap();
        }
        assert_eq!(engine.prepare_segments(), 0, "enough ready");
        let m = engine.lock_log();
        assert!(m.segments.unwritten().is_empty());
        let ready = m.segments.ready().len();
        drop(m);
        assert!(ready >= READY_SEGMENTS - 1, "the head took at most one");
        assert_eq!(
            backend.written_ahead(),
            (ready as u64) << 20,
            "each ready segment written ahead"
        );
        for i in 0..16 {
            assert!(read_back(&engine, v, i * 4096, 4096) == noise(i, 4096));
        }
    }

    /// A segment the head took before writing it ahead began is not written at all (the mark
    /// is set under the log's lock, only while the segment is still being prepared); one
    /// still being prepared is written whole, and its mark cleared at the end.
    #[test]
    fn a_segment_taken_before_writing_ahead_begins_is_not_written() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let s = {
            let mut m = engine.lock_log();
            let s = *m.segments.free().last().unwrap();
            m.segments.set_preparing(s, true);
            s
        };
        {
            // The head's fallback, before the preparer marks the segment.
            let mut m = engine.lock_log();
            m.segments.set_preparing(s, false);
            engine.stop_writing_ahead(s);
        }
        assert!(engine.write_segment_ahead(s));
        assert_eq!(backend.written_ahead(), 0, "a taken segment was written");
        engine.lock_log().segments.set_preparing(s, true);
        assert!(engine.write_segment_ahead(s));
        assert_eq!(backend.written_ahead(), 1 << 20);
        assert_eq!(backend.pending_writes(), 0, "synced at the end");
        assert_eq!(engine.preparer.writing(), None);
    }

    /// A failed sync after writing a segment ahead poisons the engine, as any failed sync of
    /// the log does (the kernel may have dropped unwritten pages of hosts' writes with it).
    #[test]
    fn a_failed_sync_after_writing_ahead_poisons_the_engine() {
        let (backend, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        let v = engine.create_volume(1 << 20).unwrap();
        engine.write(v, 0, &noise(1, 4096)).unwrap();
        let s = {
            let mut m = engine.lock_log();
            let s = *m.segments.free().last().unwrap();
            m.segments.set_preparing(s, true);
            s
        };
        backend.fail_next_sync();
        assert!(!engine.write_segment_ahead(s));
        assert!(engine.write(v, 4096, &noise(2, 4096)).is_err());
        assert!(engine.flush().is_err());
        assert!(
            backend.sync().is_err(),
            "the log's own sync reports the error too"
        );
    }

    /// A segment being written ahead that the head takes is written no further: the head
    /// clears the mark the writer checks before each piece.
    #[test]
    fn the_head_stops_writing_ahead_of_a_segment_it_takes() {
        let (_, engine) = mem_engine(64 << 20, 1 << 20, gc_off());
        engine.preparer.start_writing(5);
        engine.stop_writing_ahead(4);
        assert_eq!(engine.preparer.writing(), Some(5));
        engine.stop_writing_ahead(5);
        assert_eq!(engine.preparer.writing(), None);
    }

    /// Segments prepared outside the lock are allocated in the file, stay on the free list
    /// (space figures do not change), are never punched while ready, and are where the head
    /// goes next; shutdown gives their space back.
    #[test]
    fn prepared_segments_are_allocated_free_and_taken_first() {
        let (backend, engine) = mem_engine(1 << 30, 1 << 20, gc_off());
        let v = engine.create_volume(256 << 20).unwrap();
        let free_before = engine.lock_log().segments.len();
        let allocated_before = backend.allocated_bytes();
        assert_eq!(engine.prepare_segments(), READY_SEGMENTS);
        assert_eq!(engine.prepare_segments(), 0, "already enough ready");
        {
            let m = engine.lock_log();
            let f = &m.segments;
            assert_eq!(f.len(), free_before);
            assert!(f.ready().iter().all(|s| f.free().contains(s)));
            assert!(f.ready().iter().all(|s| !f.undiscarded().contains(s)));
        }
        assert!(backend.allocated_bytes() >= allocated_before + ((READY_SEGMENTS as u64) << 20));
        let ready: Vec<u32> = engine.lock_log().segments.ready().iter().copied().collect();
        let data = noise(6, 8 << 20);
        engine.write(v, 0, &data).unwrap();
        let (head, left) = {
            let m = engine.lock_log();
            (m.head.at().segment, m.segments.ready_len())
        };
        assert!(
            ready.contains(&head),
            "the head moved to segment {head}, not a prepared one"
        );
        assert!(left < READY_SEGMENTS);
        // Idle discards leave prepared segments alone.
        while engine.discard_freed(64) > 0 {}
        assert_eq!(engine.lock_log().segments.ready_len(), left);
        assert!(read_back(&engine, v, 0, 8 << 20) == data);
        let after_writes = backend.allocated_bytes();
        engine.shutdown().unwrap();
        assert_eq!(engine.lock_log().segments.ready_len(), 0);
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
        let data: Vec<u8> = (0..8 << 20).map(|_| xorshift64(&mut x) as u8).collect();
        engine.write(v, 0, &data).unwrap();
        engine.flush().unwrap();
        let allocated = || std::fs::metadata(dir.path().join("log")).unwrap().blocks() * 512;
        engine.unmap(v, 0, 6 << 20).unwrap();
        engine.checkpoint().unwrap();
        engine.maintain().unwrap();
        let before = allocated();
        assert!(engine.lock_log().segments.any_undiscarded());
        engine.discard_while_idle();
        let after = allocated();
        assert!(after + (5 << 20) < before, "{before} -> {after}");
        assert!(read_back(&engine, v, 6 << 20, 2 << 20) == data[6 << 20..]);
    }
}
