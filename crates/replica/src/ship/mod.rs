//! Continuous off-site copy (RFC 0003, "Revision: shipping the backend's writes"): a
//! [`ShipTap`] is told of every write the engine's devices (the array's `FileBackend`)
//! complete, copies it into the current batch and cuts batches at syncs, roots, 8 MiB and a
//! timer, and a shipper thread creates them in the store as `stream/<n>`, consecutively and
//! one at a time, with put-if-absent. Hosts never wait for the store: past the backlog bound the writes waiting are
//! dropped and the copy starts over online with a base.
//!
//! Whether a start continues the stream or takes a base is decided from two small files in the
//! data directory: `replication-pool` (the pool's identity, kept for good) and
//! `replication-state` (written by a clean stop that shipped everything, removed at start: a
//! crash leaves none, and the local disk may then hold writes the stream never got).
//!
//! The parts, in the order a write travels: `tap` records it into a batch and cuts batches;
//! `send` creates the cut batches in the store; `points` takes restore points and schedules
//! bases, which `base` reads from the live files; `retain` deletes what nothing needs any more.
//! `attach` starts all of it and `local` keeps the two files; this module holds the state
//! they share ([`Shared`]) and the handles the server holds.

use crate::catalog::{self, BaseEntry, Point};
use crate::object::{Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use sliver_clock::{Clock, SystemClock};
use sliver_engine::FileBackend;
use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod attach;
mod base;
mod create;
mod local;
mod points;
mod retain;
mod send;
mod tap;

pub use attach::ATTACH_WAIT;

/// A batch is cut once it holds this much (a quarter of the backlog bound if that is less).
pub const BATCH_BYTES: usize = 8 << 20;

/// The smallest backlog bound: below it one burst of the engine's own writes (a segment's
/// relocation, a checkpoint's pages) could break the copy with the store well.
pub const MIN_BACKLOG: u64 = 16 << 20;

/// How long a batch collects writes before a log sync cuts it ([`Shared::cut_at_sync`]).
const SYNC_CUT_AGE: Duration = Duration::from_millis(250);

/// Settings of a shipper.
#[derive(Debug, Clone)]
pub struct ShipConfig {
    /// Longest time a completed write waits in the batch before it is cut (the copy's RPO,
    /// with the time the store takes).
    pub cut_interval: Duration,
    /// Bytes of cut batches waiting for the store before the copy is given up as broken (at
    /// least [`MIN_BACKLOG`]).
    pub max_backlog: u64,
    /// How often a scheduled restore point is taken (zero: never). None is taken while
    /// nothing new was shipped since the last one.
    pub points_every: Duration,
    /// Scheduled points kept; older ones are deleted, with the objects no kept point needs.
    /// Points a user named are kept until a user deletes them.
    pub keep_points: usize,
    /// A scheduled base is taken once the stream shipped since the newest base's start holds
    /// this many times that base's bytes (and at least `rebase_min_bytes`): the store then holds
    /// at most about twice the array, beside what kept points need, and each byte of a
    /// scheduled base is paid for by a byte written.
    pub rebase_ratio: f64,
    pub rebase_min_bytes: u64,
    /// Where the shipper reads the time: when a batch is due, when a scheduled point is, a
    /// point's time, a pin's expiry and the lag. Waits for the store stay in real time.
    pub clock: Arc<dyn Clock>,
}

impl Default for ShipConfig {
    fn default() -> Self {
        ShipConfig {
            cut_interval: Duration::from_secs(5),
            max_backlog: 1 << 30,
            points_every: Duration::from_secs(3600),
            keep_points: 24,
            rebase_ratio: 1.0,
            rebase_min_bytes: 1 << 30,
            clock: Arc::new(SystemClock),
        }
    }
}

/// What the shipper is doing, for the API and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShipState {
    /// Streaming a base (a full copy) while following new writes.
    Base,
    /// Following the array's writes.
    Streaming,
    /// Another writer created the next object: this array stopped shipping to the prefix.
    Fenced(String),
    /// A base could not be read (a local I/O error): nothing more is shipped until a restart.
    Broken(String),
    /// The store could not be used yet (down, slow, refusing the credentials): the array
    /// serves, nothing is recorded, and the shipper tries again; a base follows.
    Waiting(String),
    /// Stopped (the array shut down).
    Stopped,
}

/// Progress and health of the copy.
#[derive(Debug, Clone)]
pub struct ShipStatus {
    pub state: ShipState,
    pub pool: [u8; 16],
    /// Number of the newest object created in the store (0: none yet).
    pub shipped_through: u64,
    /// Bytes cut and waiting for the store, and in the batch being filled.
    pub backlog_bytes: u64,
    /// Object bodies created since start, and their bytes.
    pub objects: u64,
    pub bytes: u64,
    /// The last error the store returned (retried), or why the copy started over.
    pub last_error: Option<String>,
    /// Times the copy started over (a base): the backlog bound passed, or the store lost it.
    pub resyncs: u64,
    /// Why it last started over.
    pub last_restart: Option<String>,
    /// How long ago the oldest write the store does not hold yet was made (`None`: it holds
    /// every write), by the shipper's clock: the copy's lag.
    pub lag: Option<Duration>,
    /// The newest restore point.
    pub newest_point: Option<Point>,
    /// Objects and base index entries retention deleted since start.
    pub deleted_objects: u64,
}

/// Something to do once the object holding a batch is in the store.
enum Mark {
    /// A base's start record is record `record` of the batch.
    BaseStart {
        record: u32,
        generation: u64,
        continues: bool,
    },
    /// A base's end record is in the batch; its base records held `bytes`.
    BaseEnd { generation: u64, bytes: u64 },
    /// A restore point was asked for: every write completed before is in the batch or earlier.
    Point(PointRequest),
}

struct PointRequest {
    /// `None`: a scheduled point.
    name: Option<String>,
    time_ms: u64,
    reply: Option<mpsc::SyncSender<Result<Point, String>>>,
}

impl PointRequest {
    fn answer(self, r: Result<Point, String>) {
        if let Some(tx) = self.reply {
            let _ = tx.send(r);
        }
    }
}

struct Batch {
    body: Vec<u8>,
    /// Records in `body`.
    records: u32,
    marks: Vec<Mark>,
    /// When its first record was added.
    since: Option<Instant>,
}

/// A batch cut and waiting for the store.
struct Cut {
    /// The shipper removes the body it shipped by id, since the queue may have been emptied
    /// and refilled (a resync) while it was being created.
    id: u64,
    body: Arc<Vec<u8>>,
    /// When its first write was made.
    since: Instant,
    marks: Vec<Mark>,
}

struct Queue {
    bodies: VecDeque<Cut>,
    next_id: u64,
    bytes: u64,
    /// Marks asked for while nothing was waiting: due at the newest object shipped.
    immediate: Vec<Mark>,
    /// The shipper is acting on the marks of the object it just created (taken off the queue
    /// with them, so a point asked for meanwhile goes to `immediate`, never onto a batch that
    /// is already done).
    busy: bool,
}

/// What the store holds besides the stream's newest objects, as this array knows it: kept up
/// to date by the shipper, read at start.
struct CatalogState {
    stream: Vec<Range<u64>>,
    bases: Vec<BaseEntry>,
    points: Vec<Point>,
    next_point: u64,
    /// Set when a pass of retention may delete something.
    retain_due: bool,
}

struct Shared {
    store: Arc<dyn ObjectStore>,
    config: ShipConfig,
    /// The log's size: a start continues the stream only on the same one.
    capacity: u64,
    batch: Mutex<Batch>,
    queue: Mutex<Queue>,
    wake: Condvar,
    status: Mutex<ShipStatus>,
    /// Set once the shipper was fenced or a base could not be read: nothing more is recorded.
    off: AtomicBool,
    /// A restart base (the first, or one after a crash or a dropped backlog) has begun and not
    /// reached the store whole: no point can be taken until it has.
    restarting: AtomicBool,
    catalog: Mutex<CatalogState>,
    /// Wakes the retention thread.
    retain_wake: Condvar,
    stop: AtomicBool,
    /// The array's files, which a base reads.
    inner: Arc<FileBackend>,
    /// The array configuration as last saved, for a base.
    array_config: Mutex<Option<Vec<u8>>>,
    /// Bumped by every base start: an older base's reader stops, and its records are dropped.
    generation: std::sync::atomic::AtomicU64,
    /// The base reader running, if any.
    base: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by a start that stopped waiting for the store before it was attached: the engine
    /// may write before recording starts, so the attach takes a base.
    late: AtomicBool,
    /// The shipper, retention and (while the store is awaited) attach threads.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    me: std::sync::Weak<Shared>,
}

/// The engine's [`sliver_engine::WriteTap`]: every write its devices complete copied to the
/// stream ([`ShipTap::devices`]).
pub struct ShipTap {
    inner: Arc<FileBackend>,
    shared: Arc<Shared>,
}

/// The running shipper: its status, and the clean stop.
pub struct Shipper {
    shared: Arc<Shared>,
    dir: PathBuf,
}

/// Why shipping cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("replication state in {dir}: {source}")]
    Local { dir: String, source: io::Error },
    #[error("{0}")]
    Refused(String),
}

fn local_error(dir: &Path) -> impl Fn(io::Error) -> ShipError + '_ {
    move |source| ShipError::Local {
        dir: dir.display().to_string(),
        source,
    }
}

/// What the shipper thread keeps between objects.
struct Local {
    pool: [u8; 16],
    /// The number the next stream object gets.
    next: u64,
    /// The base whose start is in the store and whose end is not yet: (start object, record,
    /// generation, continues).
    open_base: Option<(u64, u32, u64, bool)>,
    /// Points asked for while a restart base was on its way: taken once it is whole.
    waiting: Vec<PointRequest>,
    /// Stream bytes shipped since the newest base started (since this start, at first).
    since_base: u64,
    /// A scheduled base was begun and has not completed (or been replaced by a restart).
    rebasing: bool,
    /// When the last scheduled point was due, and the newest object it covered.
    last_point: (Instant, u64),
}

/// A handle on the running shipper for status and restore points, cheap to clone: callers
/// that must not hold their own locks across the store's calls (a point's deletion) take one
/// and let go of the `Shipper`.
#[derive(Clone)]
pub struct ShipHandle {
    shared: Arc<Shared>,
}

impl ShipHandle {
    /// The restore points in the store, oldest first.
    pub fn points(&self) -> Vec<Point> {
        self.shared.catalog.lock().unwrap().points.clone()
    }

    /// Take a restore point named `name` holding every write completed before this call. The
    /// answer comes once the point is in the store (after the writes before it, and after a
    /// whole base if a restart is on its way).
    pub fn take_point(&self, name: &str) -> Result<mpsc::Receiver<Result<Point, String>>, String> {
        catalog::check_name(name)?;
        if self.shared.off.load(Ordering::Acquire) {
            return Err("replication is not running".into());
        }
        if self.points().iter().any(|p| p.name == name) {
            return Err(format!("a restore point named {name:?} exists"));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.shared.request_point(PointRequest {
            name: Some(name.to_string()),
            time_ms: self.shared.config.clock.wall_ms(),
            reply: Some(tx),
        });
        Ok(rx)
    }

    /// Delete the point `name` from the store; retention then deletes the objects only it
    /// needed. Scheduled points may be deleted too.
    pub fn delete_point(&self, name: &str) -> Result<Option<Point>, StoreError> {
        let Some(p) = self.points().into_iter().find(|p| p.name == name) else {
            return Ok(None);
        };
        self.shared
            .store
            .delete(&ObjectName::new(Kind::Point, p.number).to_string())?;
        {
            let mut c = self.shared.catalog.lock().unwrap();
            c.points.retain(|q| q.number != p.number);
            c.retain_due = true;
        }
        self.shared.retain_wake.notify_all();
        let mut s = self.shared.status.lock().unwrap();
        if s.newest_point
            .as_ref()
            .is_some_and(|n| n.number == p.number)
        {
            s.newest_point = self
                .shared
                .catalog
                .lock()
                .unwrap()
                .points
                .iter()
                .max_by_key(|p| p.number)
                .cloned();
        }
        Ok(Some(p))
    }

    pub fn status(&self) -> ShipStatus {
        let mut s = self.shared.status.lock().unwrap().clone();
        let (queued, queued_since) = {
            let q = self.shared.queue.lock().unwrap();
            (q.bytes, q.bodies.front().map(|c| c.since))
        };
        let (batched, batched_since) = {
            let b = self.shared.batch.lock().unwrap();
            (b.body.len() as u64, b.since)
        };
        s.backlog_bytes = queued + batched;
        let now = self.shared.config.clock.now();
        s.lag = queued_since
            .or(batched_since)
            .map(|t| now.saturating_duration_since(t));
        s
    }
}

impl Shipper {
    pub fn handle(&self) -> ShipHandle {
        ShipHandle {
            shared: self.shared.clone(),
        }
    }

    pub fn points(&self) -> Vec<Point> {
        self.handle().points()
    }

    pub fn take_point(&self, name: &str) -> Result<mpsc::Receiver<Result<Point, String>>, String> {
        self.handle().take_point(name)
    }

    pub fn delete_point(&self, name: &str) -> Result<Option<Point>, StoreError> {
        self.handle().delete_point(name)
    }

    pub fn status(&self) -> ShipStatus {
        self.handle().status()
    }

    /// Ship what is left (waiting at most `within`) and, if everything reached the store,
    /// leave the mark that lets the next start continue the stream. Call after the engine
    /// shut down (no more writes).
    pub fn stop(self, within: Duration) -> ShipStatus {
        self.shared.cut();
        let deadline = Instant::now() + within;
        loop {
            let empty = {
                let q = self.shared.queue.lock().unwrap();
                q.bodies.is_empty() && !q.busy && q.immediate.is_empty()
            };
            if empty || self.shared.off.load(Ordering::Acquire) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let base_done = self
            .shared
            .base
            .lock()
            .unwrap()
            .as_ref()
            .is_none_or(|b| b.is_finished());
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        self.shared.retain_wake.notify_all();
        // A thread blocked on a hung store (a request waits up to the client's timeout) is left
        // behind after a few seconds rather than holding up the array's shutdown.
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap());
        let grace = Instant::now() + Duration::from_secs(5);
        while Instant::now() < grace && threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(
                    "replication: a thread waiting for the store was left behind at shutdown"
                );
            }
        }
        let base = self.shared.base.lock().unwrap().take();
        if let Some(b) = base {
            let _ = b.join();
        }
        let mut status = self.status();
        let drained =
            status.backlog_bytes == 0 && base_done && matches!(status.state, ShipState::Streaming);
        if drained {
            if let Err(e) = local::record_clean_stop(
                &self.dir,
                &status.pool,
                status.shipped_through,
                self.shared.capacity,
            ) {
                tracing::error!("replication: cannot record the clean stop ({e}); the next start copies the array again");
            }
        }
        status.state = ShipState::Stopped;
        status
    }
}
