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

use crate::object::{self, Kind, ObjectName, HEADER_BYTES};
use crate::store::{ObjectStore, StoreError};
use crate::stream::Record;
use sliver_engine::{Backend, FileBackend};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A batch is cut once it holds this much (a quarter of the backlog bound if that is less).
pub const BATCH_BYTES: usize = 8 << 20;

/// The smallest backlog bound: below it one burst of the engine's own writes (a segment's
/// relocation, a checkpoint's pages) could break the copy with the store well.
pub const MIN_BACKLOG: u64 = 16 << 20;

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
}

impl Default for ShipConfig {
    fn default() -> Self {
        ShipConfig {
            cut_interval: Duration::from_secs(5),
            max_backlog: 1 << 30,
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
    /// Times the copy started over (a base) because the backlog bound was passed.
    pub resyncs: u64,
    /// When the oldest write the store does not hold yet was made (`None`: it holds every
    /// write): the copy's lag is the time since.
    pub oldest_unshipped: Option<Instant>,
}

struct Batch {
    body: Vec<u8>,
    /// When its first record was added.
    since: Option<Instant>,
}

struct Queue {
    /// (id, body, when its first write was made), oldest first.
    bodies: VecDeque<(u64, Arc<Vec<u8>>, Instant)>,
    /// Id of the next body queued: the shipper removes the body it shipped by id, since the
    /// queue may have been emptied and refilled (a resync) while it was being created.
    next_id: u64,
    bytes: u64,
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
    stop: AtomicBool,
    /// The array's files, which a base reads.
    inner: Arc<FileBackend>,
    /// The array configuration as last saved, for a base.
    array_config: Mutex<Option<Vec<u8>>>,
    /// Bumped by every base start: an older base's reader stops, and its records are dropped.
    generation: std::sync::atomic::AtomicU64,
    /// The base reader running, if any.
    base: Mutex<Option<std::thread::JoinHandle<()>>>,
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
        rec.encode(&mut b.body);
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

    fn cut_locked(&self, b: &mut Batch) {
        if b.body.is_empty() || self.off.load(Ordering::Acquire) {
            return;
        }
        let body = std::mem::take(&mut b.body);
        let since = b.since.take().unwrap_or_else(Instant::now);
        let mut q = self.queue.lock().unwrap();
        if q.bytes + body.len() as u64 > self.config.max_backlog {
            // Hosts never wait for the store: the writes waiting are dropped, and the copy
            // starts over with a base, online. The batch lock is held, so the base's start is
            // the first record after the objects already numbered: a restore never applies a
            // write that followed a dropped one without the base under it.
            q.bodies.clear();
            q.bytes = 0;
            drop(q);
            let why = format!(
                "more than {} bytes waited for the store: copying the whole array again",
                self.config.max_backlog
            );
            tracing::warn!("replication: {why}");
            {
                let mut s = self.status.lock().unwrap();
                s.resyncs += 1;
                s.last_error = Some(why);
            }
            self.begin_base_locked(b);
            self.wake.notify_all();
            return;
        }
        q.bytes += body.len() as u64;
        let id = q.next_id;
        q.next_id += 1;
        q.bodies.push_back((id, Arc::new(body), since));
        self.wake.notify_all();
    }

    /// Start a base: its start record first in the (empty) batch `b`, then a reader thread.
    /// Caller holds the batch lock.
    fn begin_base_locked(&self, b: &mut Batch) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        Record::BaseStart {
            capacity: self.capacity,
        }
        .encode(&mut b.body);
        b.since.get_or_insert_with(Instant::now);
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
        if self.off.load(Ordering::Acquire) {
            return false;
        }
        let mut b = self.batch.lock().unwrap();
        if self.generation.load(Ordering::Acquire) != generation {
            return false;
        }
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
    thread: Option<std::thread::JoinHandle<()>>,
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

fn local(dir: &Path) -> impl Fn(io::Error) -> ShipError + '_ {
    move |source| ShipError::Local {
        dir: dir.display().to_string(),
        source,
    }
}

/// The newest stream object in the store and the pool it belongs to.
fn newest(store: &dyn ObjectStore) -> Result<Option<(u64, [u8; 16])>, ShipError> {
    let names = store.list(Kind::Stream.folder())?;
    let Some(last) = names
        .iter()
        .filter_map(|n| ObjectName::parse(n))
        .filter(|n| n.kind == Kind::Stream)
        .map(|n| n.number)
        .max()
    else {
        return Ok(None);
    };
    let name = ObjectName::new(Kind::Stream, last).to_string();
    let head = store.get_range(&name, 0..HEADER_BYTES as u64)?;
    let header =
        object::decode_header(&name, &head).map_err(|e| ShipError::Refused(e.to_string()))?;
    Ok(Some((last, header.array)))
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
    /// that holds another array's pool.
    /// `array_config` is the server's configuration as saved now, for the base (later saves
    /// go through [`ShippingBackend::record_config`]).
    pub fn start(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: ShipConfig,
        array_config: Option<Vec<u8>>,
    ) -> Result<(ShippingBackend, Shipper), ShipError> {
        let err = local(dir);
        let pool_path = dir.join(POOL_FILE);
        let ours = match std::fs::read_to_string(&pool_path) {
            Ok(t) => Some(parse_pool(&t).ok_or_else(|| {
                ShipError::Refused(format!("{} is damaged", pool_path.display()))
            })?),
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
        let newest = newest(store.as_ref())?;
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
        let capacity = inner.capacity();
        let continues = clean == Some((pool, last, capacity)) && last > 0;
        let inner = Arc::new(inner);
        let shared = Arc::new_cyclic(|me| Shared {
            store,
            config,
            capacity,
            batch: Mutex::new(Batch {
                body: Vec::new(),
                since: None,
            }),
            queue: Mutex::new(Queue {
                bodies: VecDeque::new(),
                next_id: 0,
                bytes: 0,
            }),
            wake: Condvar::new(),
            status: Mutex::new(ShipStatus {
                state: if continues {
                    ShipState::Streaming
                } else {
                    ShipState::Base
                },
                pool,
                shipped_through: last,
                backlog_bytes: 0,
                objects: 0,
                bytes: 0,
                last_error: None,
                resyncs: 0,
                oldest_unshipped: None,
            }),
            off: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            inner: inner.clone(),
            array_config: Mutex::new(array_config),
            generation: std::sync::atomic::AtomicU64::new(0),
            base: Mutex::new(None),
            me: me.clone(),
        });
        if continues {
            tracing::info!(
                "replicating to {}: continuing the copy at object {}",
                shared.store.describe(),
                last + 1
            );
        } else {
            tracing::info!(
                "replicating to {}: copying the whole array (a base) from object {}, following its writes meanwhile",
                shared.store.describe(),
                last + 1
            );
        }
        // A base starts in the stream before any write the engine makes from now on.
        if !continues {
            let mut b = shared.batch.lock().unwrap();
            shared.begin_base_locked(&mut b);
        }
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("replica-ship".into())
                .spawn(move || ship_loop(&shared, last + 1))
                .map_err(&err)?
        };
        Ok((
            ShippingBackend {
                inner,
                shared: shared.clone(),
            },
            Shipper {
                shared,
                dir: dir.to_path_buf(),
                thread: Some(thread),
            },
        ))
    }
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
    if shared.record_base(Record::BaseEnd, generation) {
        shared.cut();
        let mut s = shared.status.lock().unwrap();
        if s.state == ShipState::Base && shared.generation.load(Ordering::Acquire) == generation {
            s.state = ShipState::Streaming;
        }
    }
    Ok(())
}

/// Create the cut batches in the store, in order, one at a time; cut the batch on the timer.
fn ship_loop(shared: &Shared, mut next: u64) {
    let pool = shared.status.lock().unwrap().pool;
    loop {
        let item = {
            let mut q = shared.queue.lock().unwrap();
            loop {
                if let Some(front) = q.bodies.front() {
                    break Some((front.0, Arc::clone(&front.1)));
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
                    q = shared.queue.lock().unwrap();
                }
            }
        };
        let Some((id, body)) = item else {
            return;
        };
        let name = ObjectName::new(Kind::Stream, next).to_string();
        let bytes = object::encode(Kind::Stream, pool, 0, next, &body);
        let mut delay = Duration::from_millis(100);
        let created = loop {
            match shared.store.put_if_absent(&name, bytes.clone()) {
                Ok(true) => break true,
                // A create whose answer was lost and that the client sent again: ours if the
                // object holds exactly these bytes.
                Ok(false) => break shared.store.get(&name).ok().as_deref() == Some(&bytes[..]),
                Err(e) => {
                    shared.status.lock().unwrap().last_error = Some(e.to_string());
                    if shared.stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        };
        if !created {
            let why = format!(
                "{name} in {} was created by another writer: this array no longer ships there",
                shared.store.describe()
            );
            tracing::error!("replication fenced: {why}");
            shared.off.store(true, Ordering::Release);
            shared.status.lock().unwrap().state = ShipState::Fenced(why);
            return;
        }
        {
            let mut q = shared.queue.lock().unwrap();
            if q.bodies.front().is_some_and(|f| f.0 == id) {
                let (_, done, _) = q.bodies.pop_front().expect("the front");
                q.bytes -= done.len() as u64;
            }
            shared.wake.notify_all();
        }
        let mut s = shared.status.lock().unwrap();
        s.shipped_through = next;
        s.objects += 1;
        s.bytes += body.len() as u64;
        s.last_error = None;
        next += 1;
    }
}

impl Shipper {
    pub fn status(&self) -> ShipStatus {
        let mut s = self.shared.status.lock().unwrap().clone();
        let (queued, queued_since) = {
            let q = self.shared.queue.lock().unwrap();
            (q.bytes, q.bodies.front().map(|b| b.2))
        };
        let (batched, batched_since) = {
            let b = self.shared.batch.lock().unwrap();
            (b.body.len() as u64, b.since)
        };
        s.backlog_bytes = queued + batched;
        s.oldest_unshipped = queued_since.or(batched_since);
        s
    }

    /// Ship what is left (waiting at most `within`) and, if everything reached the store,
    /// leave the mark that lets the next start continue the stream. Call after the engine
    /// shut down (no more writes).
    pub fn stop(mut self, within: Duration) -> ShipStatus {
        self.shared.cut();
        let deadline = Instant::now() + within;
        loop {
            let empty = self.shared.queue.lock().unwrap().bodies.is_empty();
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
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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
        self.shared.cut();
        Ok(())
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }

    fn allocation_reserves(&self) -> bool {
        self.inner.allocation_reserves()
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
