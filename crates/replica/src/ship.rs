//! Continuous off-site copy (RFC 0003, "Revision: shipping the backend's writes"): a
//! [`ShippingBackend`] wraps the array's `FileBackend`, copies every write the engine completes
//! into the current batch, cuts batches at syncs, roots, 8 MiB and a timer, and a shipper
//! thread creates them in the store as `stream/<n>`, consecutively and one at a time, with
//! put-if-absent. Hosts never wait for the store: past the backlog bound the writes waiting are
//! dropped and the copy starts over online with a base.
//!
//! Whether a start continues the stream or takes a base is decided from two small files in the
//! data directory: `replication-pool` (the pool's identity, kept for good) and
//! `replication-state` (written by a clean stop that shipped everything, removed at start: a
//! crash leaves none, and the local disk may then hold writes the stream never got).

use crate::catalog::{self, BaseEntry, Point};
use crate::object::{self, Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use crate::stream::{self, Record};
use sliver_engine::{Backend, FileBackend};
use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// A batch is cut once it holds this much (a quarter of the backlog bound if that is less).
pub const BATCH_BYTES: usize = 8 << 20;

/// The smallest backlog bound: below it one burst of the engine's own writes (a segment's
/// relocation, a checkpoint's pages) could break the copy with the store well.
pub const MIN_BACKLOG: u64 = 16 << 20;

/// How long a batch collects writes before a log sync cuts it ([`Shared::cut_at_sync`]).
const SYNC_CUT_AGE: Duration = Duration::from_millis(250);

const POOL_FILE: &str = "replication-pool";
const STATE_FILE: &str = "replication-state";

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
    /// When the oldest write the store does not hold yet was made (`None`: it holds every
    /// write): the copy's lag is the time since.
    pub oldest_unshipped: Option<Instant>,
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

impl Shared {
    fn record(&self, rec: Record<'_>) {
        if self.off.load(Ordering::Acquire) {
            return;
        }
        let mut b = self.batch.lock().unwrap();
        self.append_locked(&mut b, rec);
    }

    /// Add `rec` to the batch `b`, cutting it once full. Caller holds the batch lock.
    fn append_locked(&self, b: &mut Batch, rec: Record<'_>) {
        b.since.get_or_insert_with(Instant::now);
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
    fn batch_limit(&self) -> usize {
        BATCH_BYTES.min((self.config.max_backlog / 4).max(64 << 10) as usize)
    }

    /// Cut the current batch (a sync point, a root, or the timer).
    fn cut(&self) {
        let mut b = self.batch.lock().unwrap();
        self.cut_locked(&mut b);
    }

    /// A log sync: cut the batch once it has waited [`SYNC_CUT_AGE`] (or the whole cut
    /// interval, if shorter); a younger batch is cut by a later sync or the timer. Hosts that
    /// flush often, and write-through volumes, which sync for every group of writes (thousands
    /// of times a second), would otherwise make an object of every few writes.
    fn cut_at_sync(&self) {
        let mut b = self.batch.lock().unwrap();
        let age = SYNC_CUT_AGE.min(self.config.cut_interval);
        if b.since.is_some_and(|t| t.elapsed() >= age) {
            self.cut_locked(&mut b);
        }
    }

    fn cut_locked(&self, b: &mut Batch) {
        if b.body.is_empty() || self.off.load(Ordering::Acquire) {
            return;
        }
        let body = std::mem::take(&mut b.body);
        let since = b.since.take().unwrap_or_else(Instant::now);
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
    fn start_over_locked(&self, b: &mut Batch, why: String, mut marks: Vec<Mark>) {
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
    fn begin_base_locked(&self, b: &mut Batch, continues: bool) {
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
    fn record_base(&self, rec: Record<'_>, generation: u64) -> bool {
        self.record_base_marked(rec, generation, None)
    }

    fn record_base_marked(&self, rec: Record<'_>, generation: u64, mark: Option<Mark>) -> bool {
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
    fn throttle(&self) {
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

/// The array's backend, with every completed write copied to the stream.
pub struct ShippingBackend {
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

fn write_synced(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

fn parse_pool(text: &str) -> Option<[u8; 16]> {
    let t = text.trim();
    if t.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl ShippingBackend {
    /// Start shipping the array in `dir` (its `FileBackend` opened, the engine not yet) to
    /// `store`: continue the stream after a clean stop, take a base otherwise. Refuses a prefix
    /// that holds another array's pool, and fails when the store cannot be read.
    /// `array_config` is the server's configuration as saved now, for the base (later saves
    /// go through [`ShippingBackend::record_config`]).
    pub fn start(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: ShipConfig,
        array_config: Option<Vec<u8>>,
    ) -> Result<(ShippingBackend, Shipper), ShipError> {
        let (backend, shipper, local) = prepare(dir, inner, store, config, array_config)?;
        attach(&shipper.shared, dir, local.ours, local.clean, false)?;
        Ok((backend, shipper))
    }

    /// As [`ShippingBackend::start`], with the store probed first, but a store that cannot be
    /// reached (down, hung, refusing the credentials) does not stop the array: the first
    /// attempt is waited for at most [`ATTACH_WAIT`]; after that the shipper waits for the
    /// store, saying why in its status, tries again with backoff, and once it answers takes a
    /// base (the writes made meanwhile were not recorded). Misconfiguration that retrying
    /// cannot mend (another array's prefix, a store that does not fence) fails the start when
    /// the first attempt finds it, and breaks the copy when a later one does.
    pub fn start_or_wait(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: ShipConfig,
        array_config: Option<Vec<u8>>,
    ) -> Result<(ShippingBackend, Shipper), ShipError> {
        let (backend, shipper, local) = prepare(dir, inner, store, config, array_config)?;
        let (first_tx, first_rx) = mpsc::sync_channel(1);
        let shared = shipper.shared.clone();
        let dir_owned = dir.to_path_buf();
        let waiter = std::thread::Builder::new()
            .name("replica-attach".into())
            .spawn(move || attach_loop(&shared, &dir_owned, local, first_tx))
            .map_err(local_error(dir))?;
        shipper.shared.threads.lock().unwrap().push(waiter);
        let first = first_rx.recv_timeout(ATTACH_WAIT);
        {
            // Under the batch lock, as `attach` starts recording: either it has (the stream
            // may go on) or it learns it is late (the engine may write before it, so a base).
            let _b = shipper.shared.batch.lock().unwrap();
            if shipper.shared.off.load(Ordering::Acquire) {
                shipper.shared.late.store(true, Ordering::Release);
            }
        }
        match first {
            Ok(Err(e @ (ShipError::Refused(_) | ShipError::Local { .. }))) => {
                shipper.shared.stop.store(true, Ordering::Release);
                return Err(e);
            }
            Ok(_) => {}
            Err(_) => {
                let why = format!(
                    "{} did not answer within {} s",
                    shipper.shared.store.describe(),
                    ATTACH_WAIT.as_secs()
                );
                let mut s = shipper.shared.status.lock().unwrap();
                if matches!(s.state, ShipState::Waiting(_)) {
                    s.state = ShipState::Waiting(why);
                }
            }
        }
        if let ShipState::Waiting(why) = &shipper.status().state {
            tracing::warn!("replication: the store cannot be used yet ({why}); the array serves, and the copy starts once the store answers");
        }
        Ok((backend, shipper))
    }
}

/// How long a start waits for the store before the array serves without it.
pub const ATTACH_WAIT: Duration = Duration::from_secs(10);

/// Attach, and while the store cannot be used, try again with backoff (2 s to 60 s). The first
/// attempt's outcome goes to `first`.
fn attach_loop(
    shared: &Arc<Shared>,
    dir: &Path,
    local: LocalState,
    first: mpsc::SyncSender<Result<(), ShipError>>,
) {
    let mut clean = local.clean;
    let mut first = Some(first);
    let mut delay = Duration::from_secs(2);
    loop {
        let outcome = attach(shared, dir, local.ours, clean.take(), true);
        let state = match &outcome {
            Ok(()) => None,
            Err(ShipError::Store(e)) => Some(ShipState::Waiting(e.to_string())),
            Err(e) => {
                tracing::error!("replication: {e}");
                Some(ShipState::Broken(e.to_string()))
            }
        };
        let done = !matches!(state, Some(ShipState::Waiting(_)));
        if let Some(state) = state {
            shared.status.lock().unwrap().state = state;
        }
        if let Some(tx) = first.take() {
            let _ = tx.send(outcome);
        }
        if done {
            return;
        }
        let until = Instant::now() + delay;
        while Instant::now() < until {
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// What a start reads from the data directory before it talks to the store.
struct LocalState {
    /// The pool this array ships, if it ever did.
    ours: Option<[u8; 16]>,
    /// The clean stop's mark (pool, last object, capacity), taken away.
    clean: Option<([u8; 16], u64, u64)>,
}

/// The backend and the shipper, not yet attached to the store (nothing is recorded until
/// [`attach`] has run).
fn prepare(
    dir: &Path,
    inner: FileBackend,
    store: Arc<dyn ObjectStore>,
    config: ShipConfig,
    array_config: Option<Vec<u8>>,
) -> Result<(ShippingBackend, Shipper, LocalState), ShipError> {
    let err = local_error(dir);
    let pool_path = dir.join(POOL_FILE);
    let ours = match std::fs::read_to_string(&pool_path) {
        Ok(t) => Some(
            parse_pool(&t)
                .ok_or_else(|| ShipError::Refused(format!("{} is damaged", pool_path.display())))?,
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(err(e)),
    };
    // A clean stop's mark, taken away before anything else: a crash from here on leaves
    // none, so the next start takes a base.
    let state_path = dir.join(STATE_FILE);
    let clean = match std::fs::read_to_string(&state_path) {
        Ok(t) => {
            std::fs::remove_file(&state_path).map_err(&err)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(&err)?;
            parse_state(&t)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(err(e)),
    };
    let capacity = inner.capacity();
    let inner = Arc::new(inner);
    let shared = Arc::new_cyclic(|me| Shared {
        store,
        config,
        capacity,
        batch: Mutex::new(Batch {
            body: Vec::new(),
            records: 0,
            marks: Vec::new(),
            since: None,
        }),
        queue: Mutex::new(Queue {
            bodies: VecDeque::new(),
            next_id: 0,
            bytes: 0,
            immediate: Vec::new(),
            busy: false,
        }),
        wake: Condvar::new(),
        status: Mutex::new(ShipStatus {
            state: ShipState::Waiting("connecting to the store".into()),
            pool: ours.unwrap_or_default(),
            shipped_through: 0,
            backlog_bytes: 0,
            objects: 0,
            bytes: 0,
            last_error: None,
            resyncs: 0,
            last_restart: None,
            oldest_unshipped: None,
            newest_point: None,
            deleted_objects: 0,
        }),
        // Nothing is recorded before the store has been read.
        off: AtomicBool::new(true),
        late: AtomicBool::new(false),
        restarting: AtomicBool::new(false),
        catalog: Mutex::new(CatalogState {
            stream: Vec::new(),
            bases: Vec::new(),
            points: Vec::new(),
            next_point: 1,
            retain_due: false,
        }),
        retain_wake: Condvar::new(),
        stop: AtomicBool::new(false),
        inner: inner.clone(),
        array_config: Mutex::new(array_config),
        generation: std::sync::atomic::AtomicU64::new(0),
        base: Mutex::new(None),
        threads: Mutex::new(Vec::new()),
        me: me.clone(),
    });
    Ok((
        ShippingBackend {
            inner,
            shared: shared.clone(),
        },
        Shipper {
            shared,
            dir: dir.to_path_buf(),
        },
        LocalState { ours, clean },
    ))
}

/// Read the store (probed first if `probe`), decide the pool and whether the stream goes on,
/// and start recording and shipping.
fn attach(
    shared: &Arc<Shared>,
    dir: &Path,
    ours: Option<[u8; 16]>,
    clean: Option<([u8; 16], u64, u64)>,
    probe: bool,
) -> Result<(), ShipError> {
    let err = local_error(dir);
    let store = &shared.store;
    if probe {
        match crate::probe::probe(store.clone()) {
            Ok(_) => {}
            Err(crate::probe::ProbeError::Store(e)) => return Err(ShipError::Store(e)),
            Err(e) => return Err(ShipError::Refused(e.to_string())),
        }
    }
    let cat = catalog::load(store.as_ref())?;
    if let Some(d) = cat.damaged.first() {
        if cat.pool.is_none() {
            return Err(ShipError::Refused(d.clone()));
        }
        tracing::warn!(
            "replication: {} catalog object(s) damaged, not used: {d}",
            cat.damaged.len()
        );
    }
    let newest = cat.stream.last().map(|r| r.end - 1).zip(cat.pool);
    let pool = match (ours, newest) {
        (Some(p), Some((_, theirs))) if p != theirs => {
            return Err(ShipError::Refused(format!(
            "{} holds the copy of array {}, not of this one ({}): give this array its own prefix",
            store.describe(),
            object::hex(&theirs),
            object::hex(&p)
        )))
        }
        (None, Some((_, theirs))) => {
            return Err(ShipError::Refused(format!(
                "{} already holds the copy of array {}: give this array its own prefix",
                store.describe(),
                object::hex(&theirs)
            )))
        }
        (Some(p), _) => p,
        (None, None) => {
            let p: [u8; 16] = rand::random();
            write_synced(dir, POOL_FILE, &object::hex(&p)).map_err(&err)?;
            p
        }
    };
    let last = newest.map(|(n, _)| n).unwrap_or(0);
    let continues = clean == Some((pool, last, shared.capacity)) && last > 0;
    // A stream shipped before the base index existed: a scheduled base gives it one.
    let needs_index = continues && cat.bases.is_empty();
    {
        let mut s = shared.status.lock().unwrap();
        s.state = if continues {
            ShipState::Streaming
        } else {
            ShipState::Base
        };
        s.pool = pool;
        s.shipped_through = last;
        s.newest_point = cat.points.iter().max_by_key(|p| p.number).cloned();
    }
    {
        let mut c = shared.catalog.lock().unwrap();
        c.next_point = cat.last_point_number + 1;
        c.stream = cat.stream;
        c.bases = cat.bases;
        c.points = cat.points;
        c.retain_due = true;
    }
    if continues {
        tracing::info!(
            "replicating to {}: continuing the copy at object {}",
            store.describe(),
            last + 1
        );
    } else {
        tracing::info!(
            "replicating to {}: copying the whole array (a base) from object {}, following its writes meanwhile",
            store.describe(),
            last + 1
        );
    }
    {
        // Recording starts under the batch lock with the base's start record first: no write
        // the engine completes from now on goes before it, and every one before is in the
        // files the base reads.
        let mut b = shared.batch.lock().unwrap();
        if shared.stop.load(Ordering::Acquire) {
            return Err(ShipError::Refused("the array stopped".into()));
        }
        if continues && shared.late.load(Ordering::Acquire) {
            // The engine may have written since the start: the stream cannot go on.
            shared.status.lock().unwrap().state = ShipState::Base;
            shared.off.store(false, Ordering::Release);
            shared.begin_base_locked(&mut b, false);
        } else {
            shared.off.store(false, Ordering::Release);
            if !continues || needs_index {
                shared.begin_base_locked(&mut b, continues);
            }
        }
    }
    let ship = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("replica-ship".into())
            .spawn(move || ship_loop(&shared, last + 1))
            .map_err(&err)?
    };
    let retain = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("replica-retain".into())
            .spawn(move || retain_loop(&shared))
            .map_err(&err)?
    };
    shared.threads.lock().unwrap().extend([ship, retain]);
    Ok(())
}

fn parse_state(text: &str) -> Option<([u8; 16], u64, u64)> {
    let mut pool = None;
    let mut last = None;
    let mut capacity = None;
    for line in text.lines() {
        match line.split_once(' ')? {
            ("pool", v) => pool = parse_pool(v),
            ("last", v) => last = v.parse().ok(),
            ("capacity", v) => capacity = v.parse().ok(),
            _ => return None,
        }
    }
    Some((pool?, last?, capacity?))
}

/// Every extent of the files that holds data, as base records, then the base's end. Read from
/// the live files while hosts write (see `stream`: a restore puts the writes made meanwhile
/// over it). Stops when a newer base starts (`generation`) or the shipper stops.
fn read_base(shared: &Shared, generation: u64) -> io::Result<()> {
    let inner = &shared.inner;
    // A piece never fills a batch alone (see `Shared::batch_limit`).
    let piece = (4u64 << 20).min(shared.batch_limit() as u64);
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    let current = || {
        !shared.stop.load(Ordering::Acquire)
            && shared.generation.load(Ordering::Acquire) == generation
    };
    for (meta, extents) in [
        (false, inner.log_data_extents()?),
        (true, inner.meta_data_extents()?),
    ] {
        for (start, len) in extents {
            let mut at = start;
            while at < start + len {
                if !current() {
                    return Ok(());
                }
                let n = piece.min(start + len - at) as usize;
                buf.resize(n, 0);
                let rec = if meta {
                    inner.meta_read(&mut buf, at)?;
                    Record::Meta {
                        offset: at,
                        bytes: &buf,
                        base: true,
                    }
                } else {
                    inner.read_at(&mut buf, at)?;
                    Record::Log {
                        offset: at,
                        bytes: &buf,
                        base: true,
                    }
                };
                if !shared.record_base(rec, generation) {
                    return Ok(());
                }
                shared.throttle();
                at += n as u64;
                bytes += n as u64;
            }
        }
    }
    if let Some(root) = inner.load_root()? {
        let rec = Record::Root {
            bytes: &root,
            base: true,
        };
        if !shared.record_base(rec, generation) {
            return Ok(());
        }
    }
    let config = shared.array_config.lock().unwrap().clone();
    if let Some(bytes) = config {
        let rec = Record::Config {
            bytes: &bytes,
            base: true,
        };
        if !shared.record_base(rec, generation) {
            return Ok(());
        }
    }
    let end = Mark::BaseEnd { generation, bytes };
    if shared.record_base_marked(Record::BaseEnd, generation, Some(end)) {
        shared.cut();
        let mut s = shared.status.lock().unwrap();
        if s.state == ShipState::Base && shared.generation.load(Ordering::Acquire) == generation {
            s.state = ShipState::Streaming;
        }
    }
    Ok(())
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Create `name` with `bytes` unless it exists, retrying store errors with backoff until it
/// answers or the shipper stops (`None`). `Some(false)`: another writer created it first.
fn create_retrying(shared: &Shared, name: &str, bytes: &[u8]) -> Option<bool> {
    create_counting(shared, name, bytes).map(|(created, _)| created)
}

/// [`create_retrying`], with the number of store errors retried.
fn create_counting(shared: &Shared, name: &str, bytes: &[u8]) -> Option<(bool, u32)> {
    let mut delay = Duration::from_millis(100);
    let mut errors = 0;
    loop {
        let failed = match shared.store.put_if_absent(name, bytes.to_vec()) {
            Ok(true) => return Some((true, errors)),
            // A create whose answer was lost and that the client sent again: ours if the
            // object holds exactly these bytes.
            Ok(false) => match shared.store.get(name) {
                Ok(held) => return Some((held == bytes, errors)),
                // Gone again (deleted meanwhile): create it again.
                Err(StoreError::NotFound { .. }) => continue,
                // Only a read that answers can say another writer made it.
                Err(e) => e,
            },
            Err(e) => e,
        };
        errors += 1;
        shared.status.lock().unwrap().last_error = Some(failed.to_string());
        if shared.stop.load(Ordering::Acquire) {
            return None;
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

fn fenced(shared: &Shared, name: &str) {
    let why = format!(
        "{name} in {} was created by another writer: this array no longer ships there",
        shared.store.describe()
    );
    tracing::error!("replication fenced: {why}");
    shared.off.store(true, Ordering::Release);
    shared.status.lock().unwrap().state = ShipState::Fenced(why);
}

/// Create the cut batches in the store, in order, one at a time; cut the batch on the timer;
/// take scheduled points and bases.
fn ship_loop(shared: &Shared, next: u64) {
    let mut local = Local {
        pool: shared.status.lock().unwrap().pool,
        next,
        open_base: None,
        waiting: Vec::new(),
        since_base: 0,
        rebasing: false,
        last_point: (Instant::now(), next - 1),
    };
    loop {
        schedule(shared, &mut local);
        let item = {
            let mut q = shared.queue.lock().unwrap();
            loop {
                if !q.immediate.is_empty() {
                    break Some(Err(std::mem::take(&mut q.immediate)));
                }
                if let Some(front) = q.bodies.front() {
                    break Some(Ok((front.id, Arc::clone(&front.body))));
                }
                if shared.stop.load(Ordering::Acquire) || shared.off.load(Ordering::Acquire) {
                    break None;
                }
                let (g, timeout) = shared
                    .wake
                    .wait_timeout(q, shared.config.cut_interval)
                    .unwrap();
                q = g;
                if timeout.timed_out() {
                    drop(q);
                    let due = {
                        let b = shared.batch.lock().unwrap();
                        b.since
                            .is_some_and(|t| t.elapsed() >= shared.config.cut_interval)
                    };
                    if due {
                        shared.cut();
                    }
                    schedule(shared, &mut local);
                    q = shared.queue.lock().unwrap();
                }
            }
        };
        let (id, body) = match item {
            None => return,
            // Marks due at the newest object already in the store.
            Some(Err(marks)) => {
                let newest = local.next - 1;
                if !shipped(shared, &mut local, newest, marks) {
                    return;
                }
                continue;
            }
            Some(Ok(item)) => item,
        };
        let n = local.next;
        let name = ObjectName::new(Kind::Stream, n).to_string();
        // The table first, so that a restore reads what an object holds with one range read
        // and fetches payloads as they are needed (hydration on demand).
        let bytes = match stream::index(&body) {
            Ok((indexed, table_len)) => {
                object::encode_indexed(Kind::Stream, local.pool, 0, n, &indexed, table_len)
            }
            Err(e) => {
                // Only this crate's encoder fills batches: a bug, shipped as it is rather
                // than lost.
                tracing::error!(
                    "stream object {n}: cannot index its body ({e}); shipped interleaved"
                );
                object::encode(Kind::Stream, local.pool, 0, n, &body)
            }
        };
        let errors = match create_counting(shared, &name, &bytes) {
            None => return,
            Some((false, _)) => return fenced(shared, &name),
            Some((true, errors)) => errors,
        };
        local.next += 1;
        local.since_base += body.len() as u64;
        {
            let mut s = shared.status.lock().unwrap();
            s.shipped_through = n;
            s.objects += 1;
            s.bytes += body.len() as u64;
            s.last_error = None;
        }
        {
            let mut c = shared.catalog.lock().unwrap();
            match c.stream.last_mut() {
                Some(r) if r.end == n => r.end = n + 1,
                _ => c.stream.push(n..n + 1),
            }
        }
        // Off the queue with its marks in one step (see `Queue::busy`).
        let marks = {
            let mut q = shared.queue.lock().unwrap();
            if q.bodies.front().is_some_and(|f| f.id == id) {
                let done = q.bodies.pop_front().expect("the front");
                q.bytes -= done.body.len() as u64;
                q.busy = true;
                done.marks
            } else {
                Vec::new()
            }
        };
        // After the store failed for a while, make sure it still holds what it held: a bucket
        // deleted or emptied meanwhile leaves a copy no restore can use.
        if errors > 0 && n > 1 && lost(shared, n - 1) {
            let why = format!(
                "{} no longer holds {}: the bucket was deleted or emptied; copying the whole array again",
                shared.store.describe(),
                ObjectName::new(Kind::Stream, n - 1)
            );
            forget_catalog(shared, n);
            local.open_base = None;
            local.rebasing = false;
            let mut b = shared.batch.lock().unwrap();
            shared.start_over_locked(&mut b, why, marks);
            drop(b);
            shared.queue.lock().unwrap().busy = false;
            continue;
        }
        let going = shipped(shared, &mut local, n, marks);
        shared.queue.lock().unwrap().busy = false;
        shared.wake.notify_all();
        if !going {
            return;
        }
    }
}

/// Whether the store lost stream object `n`, which it held (a failed read is not a loss).
fn lost(shared: &Shared, n: u64) -> bool {
    let held = shared
        .catalog
        .lock()
        .unwrap()
        .stream
        .iter()
        .any(|r| r.contains(&n));
    let name = ObjectName::new(Kind::Stream, n).to_string();
    held && matches!(
        shared
            .store
            .get_range(&name, 0..object::HEADER_BYTES as u64),
        Err(StoreError::NotFound { .. })
    )
}

/// The store lost the copy: nothing it held counts any more but object `n`, just created.
fn forget_catalog(shared: &Shared, n: u64) {
    let mut c = shared.catalog.lock().unwrap();
    c.stream = catalog::ranges(vec![n]);
    c.bases.clear();
    c.points.clear();
    drop(c);
    shared.status.lock().unwrap().newest_point = None;
}

/// Ask for a scheduled point when one is due, and begin a scheduled base when the stream since
/// the newest base has grown past the bound.
fn schedule(shared: &Shared, local: &mut Local) {
    if shared.off.load(Ordering::Acquire) || shared.stop.load(Ordering::Acquire) {
        return;
    }
    let every = shared.config.points_every;
    let newest = local.next - 1;
    if !every.is_zero() && local.last_point.0.elapsed() >= every && newest > local.last_point.1 {
        local.last_point = (Instant::now(), newest);
        shared.request_point(PointRequest {
            name: None,
            time_ms: now_ms(),
            reply: None,
        });
    }
    let newest_base = {
        let c = shared.catalog.lock().unwrap();
        catalog::newest_base(&c.bases).copied()
    };
    if let Some(base) = newest_base {
        let bound = (base.bytes as f64 * shared.config.rebase_ratio)
            .max(shared.config.rebase_min_bytes as f64);
        if !local.rebasing
            && !shared.restarting.load(Ordering::Acquire)
            && local.since_base as f64 >= bound
        {
            tracing::info!(
                "replication: {} bytes shipped since the newest base; copying the whole array again so that older objects can go",
                local.since_base
            );
            local.rebasing = true;
            let mut b = shared.batch.lock().unwrap();
            shared.begin_base_locked(&mut b, true);
        }
    }
}

/// Object `n` (holding the batch the marks came with) is in the store: record bases, take
/// points. Returns false when the shipper must end (fenced or stopped).
fn shipped(shared: &Shared, local: &mut Local, n: u64, marks: Vec<Mark>) -> bool {
    for mark in marks {
        match mark {
            Mark::BaseStart {
                record,
                generation,
                continues,
            } => {
                local.open_base = Some((n, record, generation, continues));
                local.since_base = 0;
            }
            Mark::BaseEnd { generation, bytes } => {
                let Some((start, record, g, continues)) = local.open_base else {
                    continue;
                };
                if g != generation {
                    continue;
                }
                local.open_base = None;
                let entry = BaseEntry {
                    start,
                    record,
                    end: n,
                    continues,
                    bytes,
                };
                let name = ObjectName::new(Kind::BaseIndex, start).to_string();
                let obj = object::encode(Kind::BaseIndex, local.pool, 0, start, &entry.encode());
                match create_retrying(shared, &name, &obj) {
                    None => return false,
                    Some(false) => {
                        fenced(shared, &name);
                        return false;
                    }
                    Some(true) => {}
                }
                // Only the newest generation's end clears a restart: an older base's end
                // (one a restart replaced) never reaches here, its mark being dropped.
                if generation == shared.generation.load(Ordering::Acquire) {
                    shared.restarting.store(false, Ordering::Release);
                }
                local.rebasing = false;
                {
                    let mut c = shared.catalog.lock().unwrap();
                    c.bases.push(entry);
                    c.retain_due = true;
                }
                shared.retain_wake.notify_all();
                for req in std::mem::take(&mut local.waiting) {
                    if !take_point(shared, local, n, req) {
                        return false;
                    }
                }
            }
            Mark::Point(req) => {
                let has_base = !shared.catalog.lock().unwrap().bases.is_empty();
                if shared.restarting.load(Ordering::Acquire) || !has_base || n == 0 {
                    local.waiting.push(req);
                } else if !take_point(shared, local, n, req) {
                    return false;
                }
            }
        }
    }
    true
}

/// Create the point `req` through object `n`, on the newest complete base.
fn take_point(shared: &Shared, local: &mut Local, n: u64, req: PointRequest) -> bool {
    let (number, base) = {
        let mut c = shared.catalog.lock().unwrap();
        let Some(base) = catalog::newest_base(&c.bases).copied() else {
            drop(c);
            req.answer(Err(
                "no complete copy of the array is in the store yet".into()
            ));
            return true;
        };
        if let Some(name) = &req.name {
            if c.points.iter().any(|p| &p.name == name) {
                drop(c);
                let msg = format!("a restore point named {name:?} exists");
                req.answer(Err(msg));
                return true;
            }
        }
        let number = c.next_point;
        c.next_point += 1;
        (number, base)
    };
    let name = match &req.name {
        Some(n) => n.clone(),
        None => {
            // Two scheduled points in one second (a short schedule) get their numbers too.
            let n = catalog::scheduled_name(req.time_ms);
            let taken = shared
                .catalog
                .lock()
                .unwrap()
                .points
                .iter()
                .any(|p| p.name == n);
            if taken {
                format!("{n}-{number}")
            } else {
                n
            }
        }
    };
    let point = Point {
        number,
        name,
        scheduled: req.name.is_none(),
        time_ms: req.time_ms,
        through: n,
        base: base.start,
        base_record: base.record,
    };
    let name = ObjectName::new(Kind::Point, number).to_string();
    let obj = object::encode(Kind::Point, local.pool, 0, number, &point.encode());
    match create_retrying(shared, &name, &obj) {
        None => {
            req.answer(Err("the array is stopping".into()));
            return false;
        }
        Some(false) => {
            req.answer(Err("another writer took the point's number".into()));
            fenced(shared, &name);
            return false;
        }
        Some(true) => {}
    }
    tracing::info!(
        "replication: restore point {} through object {n}",
        point.name
    );
    {
        let mut c = shared.catalog.lock().unwrap();
        c.points.push(point.clone());
        c.retain_due |= point.scheduled;
    }
    shared.retain_wake.notify_all();
    shared.status.lock().unwrap().newest_point = Some(point.clone());
    req.answer(Ok(point));
    true
}

impl Shared {
    /// Ask for a point covering every write completed before now: marked in the batch and cut,
    /// or, with nothing waiting, due at the newest object in the store.
    fn request_point(&self, req: PointRequest) {
        let mut b = self.batch.lock().unwrap();
        if !b.body.is_empty() {
            b.marks.push(Mark::Point(req));
            self.cut_locked(&mut b);
            return;
        }
        let mut q = self.queue.lock().unwrap();
        match q.bodies.back_mut() {
            Some(last) => last.marks.push(Mark::Point(req)),
            None => q.immediate.push(Mark::Point(req)),
        }
        self.wake.notify_all();
    }
}

/// Delete what no restore needs whenever a point or a base was added or a point deleted.
fn retain_loop(shared: &Shared) {
    loop {
        {
            let mut c = shared.catalog.lock().unwrap();
            while !c.retain_due {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                c = shared
                    .retain_wake
                    .wait_timeout(c, Duration::from_millis(200))
                    .unwrap()
                    .0;
            }
            c.retain_due = false;
        }
        if shared.off.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = retain_once(shared) {
            tracing::warn!("replication retention: {e} (tried again at the next point)");
            shared.status.lock().unwrap().last_error = Some(format!("retention: {e}"));
        }
    }
}

/// One pass of retention: expired points first (so no point ever names deleted objects), then
/// the stream objects nothing needs, then index entries of bases nothing builds on.
fn retain_once(shared: &Shared) -> Result<(), StoreError> {
    // Restores in progress elsewhere (arrays restored on demand, still fetching) pin what
    // they need; expired pins (an abandoned restore) go.
    let (pins, expired) = catalog::load_pins(shared.store.as_ref(), now_ms())?;
    for n in expired {
        let _ = shared
            .store
            .delete(&ObjectName::new(Kind::Pin, n).to_string());
    }
    let pinned: Vec<Range<u64>> = pins.iter().map(|p| p.needs()).collect();
    let plan = {
        let c = shared.catalog.lock().unwrap();
        catalog::plan(
            &c.stream,
            &c.bases,
            &c.points,
            shared.config.keep_points,
            &pinned,
        )
    };
    let mut deleted = 0u64;
    let outcome = delete_planned(shared, &plan, &mut deleted);
    if deleted > 0 {
        tracing::info!("replication retention: deleted {deleted} objects no restore needs");
    }
    shared.status.lock().unwrap().deleted_objects += deleted;
    outcome
}

/// Delete what `plan` names, in its order, each object dropped from the catalog once the
/// store has deleted it; `deleted` counts them (also when a deletion fails).
fn delete_planned(
    shared: &Shared,
    plan: &catalog::Plan,
    deleted: &mut u64,
) -> Result<(), StoreError> {
    let mut gone = |kind: Kind, n: u64, forget: &dyn Fn(&mut CatalogState)| {
        shared.store.delete(&ObjectName::new(kind, n).to_string())?;
        forget(&mut shared.catalog.lock().unwrap());
        *deleted += 1;
        Ok::<(), StoreError>(())
    };
    for &n in &plan.points {
        gone(Kind::Point, n, &|c| c.points.retain(|p| p.number != n))?;
    }
    for n in plan.stream.iter().flat_map(|r| r.clone()) {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        gone(Kind::Stream, n, &|c| {
            let held = std::mem::take(&mut c.stream);
            c.stream = catalog::subtract(&held, std::slice::from_ref(&(n..n + 1)));
        })?;
    }
    for &start in &plan.bases {
        gone(Kind::BaseIndex, start, &|c| {
            c.bases.retain(|b| b.start != start)
        })?;
    }
    Ok(())
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
            time_ms: now_ms(),
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
        s.oldest_unshipped = queued_since.or(batched_since);
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
            let text = format!(
                "pool {}\nlast {}\ncapacity {}\n",
                object::hex(&status.pool),
                status.shipped_through,
                self.shared.capacity
            );
            if let Err(e) = write_synced(&self.dir, STATE_FILE, &text) {
                tracing::error!("replication: cannot record the clean stop ({e}); the next start copies the array again");
            }
        }
        status.state = ShipState::Stopped;
        status
    }
}

impl ShippingBackend {
    /// The server saved its configuration (after the engine change it names): into the
    /// stream, as a cut of its own.
    pub fn record_config(&self, bytes: &[u8]) {
        *self.shared.array_config.lock().unwrap() = Some(bytes.to_vec());
        self.shared.record(Record::Config { bytes, base: false });
        self.shared.cut();
    }
}

impl Backend for ShippingBackend {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        self.inner.read_vectored_at(bufs, offset)
    }

    fn read_vectored_cached(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<bool> {
        self.inner.read_vectored_cached(bufs, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(data, offset)?;
        self.shared.record(Record::Log {
            offset,
            bytes: data,
            base: false,
        });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()?;
        self.shared.cut_at_sync();
        Ok(())
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }

    fn allocation_reserves(&self) -> bool {
        self.inner.allocation_reserves()
    }

    /// Not shipped: the range is free, its contents undefined, and the records later written
    /// there are shipped as any others.
    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_ahead(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)?;
        // Split below the record's 4 GiB length.
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(1 << 30);
            self.shared.record(Record::Discard { offset: at, len: n });
            at += n;
        }
        Ok(())
    }

    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.meta_write(data, offset)?;
        self.shared.record(Record::Meta {
            offset,
            bytes: data,
            base: false,
        });
        Ok(())
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.inner.meta_sync()?;
        self.shared.cut();
        Ok(())
    }

    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.store_root(bytes)?;
        self.shared.record(Record::Root { bytes, base: false });
        self.shared.cut();
        Ok(())
    }

    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_checkpoint()
    }

    fn store_checkpoint(&self, _bytes: &[u8]) -> io::Result<()> {
        // Format 2 checkpoints are only written by tests that build old arrays; an array
        // that ships is migrated before it opens.
        Err(io::Error::other(
            "format 2 checkpoints are not written to a shipping array",
        ))
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        self.inner.retire_checkpoint()
    }

    fn reserve_meta(&self, bytes: u64) {
        self.inner.reserve_meta(bytes)
    }

    fn has_room(&self, len: u64, keep: u64) -> bool {
        self.inner.has_room(len, keep)
    }
}
