//! Hydration on demand (RFC 0003, "Hydration on demand"): a restored array serves before its
//! data is local. A restore reads each stream object's table (`stream::table`), applies the
//! small records and leaves, for every range of the log and metadata files whose bytes are
//! still in the store, where they are: an [`Extents`] map. [`HydratingBackend`] is the engine's
//! log device and metadata area over the restored files and that map: a read of a range the map
//! still names fetches the records around its bytes, checks them against the object's table,
//! writes them to the file and drops them from the map; a write or a discard drops what it
//! covers (its bytes are newer); background threads fetch the rest in file order, metadata
//! first (four at once while no read waits for the store, one while reads do). The restore pins
//! what it fetches from in the source's prefix (`catalog::Pin`) so that a source still shipping
//! there does not delete it; the hydrating array renews the pin and deletes it when done.
//!
//! Crash safety. The map is written once, by the restore, before the root; from then on it
//! only shrinks, and what leaves it is appended to a journal. A range leaves the map durably
//! only after its bytes are: a sync takes the ranges dropped so far, syncs the file, then
//! appends them to the journal and syncs that. A crash can therefore only leave a range in the
//! map whose bytes are already local (fetched again, harmlessly) or whose write was never
//! synced (which the engine does not rely on, as after any crash); never a dropped range whose
//! bytes were lost, and never a fetch over a write the engine synced.
//!
//! ```text
//! <engine>/hydrate/source    the store's URL, endpoint, the pool's uuid and the pin (text)
//! <engine>/hydrate/tables    every stream object's table, as the restore read it
//! <engine>/hydrate/map       "SLVRHYD1" | count u64 | entries [40] * count
//!                            | tables u64 | { object u64 | offset u64 | len u32 | pad [4]
//!                                           | body length u64 } * tables | crc32c u32
//!                            entry: area u8 | pad [7] | start u64 | len u64 | object u64
//!                                   | position in the body u64
//! <engine>/hydrate/journal   { crc32c u32 (of the rest) | area u8 | pad [3] | start u64
//!                              | len u64 } * n, appended; a torn tail is cut at open
//! ```
//! Once the map is empty, synced and journaled, the source file is removed (durably, first),
//! then the rest: the array is an ordinary one.

use crate::catalog::{self, Pin};
use crate::object::{self, ObjectName};
use crate::store::ObjectStore;
use crate::stream;
use sliver_clock::{Clock, SystemClock};
use sliver_engine::{Devices, FileBackend, LogDevice, MetaArea};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The folder, in the engine's directory, that holds a hydration's state.
pub const FOLDER: &str = "hydrate";
const MAP_MAGIC: &[u8; 8] = b"SLVRHYD1";
const MAP_ENTRY: usize = 40;
const TABLE_AT: usize = 32;
const JOURNAL_ENTRY: usize = 24;
/// Pieces of one object closer than this are fetched with one range read.
const COALESCE_GAP: u64 = 256 << 10;
/// Most bytes written to the files under the map's lock at a time.
const APPLY_SLICE: u64 = 256 << 10;
/// Most bytes one background fetch asks for.
const BACKGROUND_FETCH: u64 = 8 << 20;

/// Which file a range belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Area {
    Log = 0,
    Meta = 1,
}

/// Where the bytes of a range are in the store: from this position of a stream object's body
/// on (inside its records' payloads, which the object's table checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    pub object: u64,
    /// The position in the object's body of the range's first byte.
    pub at: u64,
}

/// Ranges of one file not yet fetched: start -> (length, piece). The ranges never overlap, and
/// neighbours that continue each other in one object are one range (a base's read or a large
/// write is one entry, not one per 64 KiB record), so the map costs RAM per run of an object,
/// not per byte.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Extents {
    map: BTreeMap<u64, (u64, Piece)>,
    bytes: u64,
}

impl Extents {
    /// Bytes not yet fetched.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Ranges held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// `[start, start + len)` now comes from `piece` (a newer write than what the map held).
    pub fn insert(&mut self, start: u64, len: u64, piece: Piece) {
        if len == 0 {
            return;
        }
        self.remove(start, len);
        self.bytes += len;
        let (mut start, mut len, mut piece) = (start, len, piece);
        // Join the range before it and the one after when they continue each other.
        if let Some((&s, &(l, p))) = self.map.range(..start).next_back() {
            if s + l == start && p.object == piece.object && p.at + l == piece.at {
                self.map.remove(&s);
                (start, len, piece) = (s, l + len, p);
            }
        }
        if let Some(&(l, p)) = self.map.get(&(start + len)) {
            if p.object == piece.object && piece.at + len == p.at {
                self.map.remove(&(start + len));
                len += l;
            }
        }
        self.map.insert(start, (len, piece));
    }

    /// Drop whatever the map holds in `[start, start + len)`; whether anything was there.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        let hit = self.overlapping(start, len);
        for &(s, l, p) in &hit {
            self.map.remove(&s);
            self.bytes -= l;
            let e = s + l;
            if s < start {
                self.map.insert(s, (start - s, p));
                self.bytes += start - s;
            }
            if e > end {
                let tail = Piece {
                    at: p.at + (end - s),
                    ..p
                };
                self.map.insert(end, (e - end, tail));
                self.bytes += e - end;
            }
        }
        !hit.is_empty()
    }

    /// The ranges that overlap `[start, start + len)`, whole, in order.
    pub fn overlapping(&self, start: u64, len: u64) -> Vec<(u64, u64, Piece)> {
        let end = start.saturating_add(len);
        let mut out = Vec::new();
        if let Some((&s, &(l, p))) = self.map.range(..start).next_back() {
            if s + l > start {
                out.push((s, l, p));
            }
        }
        for (&s, &(l, p)) in self.map.range(start..end) {
            out.push((s, l, p));
        }
        out
    }

    /// The first range at or after `from` (wrapping to the start).
    fn next_from(&self, from: u64) -> Option<(u64, u64, Piece)> {
        self.map
            .range(from..)
            .next()
            .or_else(|| self.map.iter().next())
            .map(|(&s, &(l, p))| (s, l, p))
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64, Piece)> + '_ {
        self.map.iter().map(|(&s, &(l, p))| (s, l, p))
    }
}

/// Where an object's table is kept locally (`<engine>/hydrate/tables`): the restore read every
/// table once, so a fetch checks its bytes without asking the store for the table again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableAt {
    /// Position in the tables file.
    pub offset: u64,
    pub len: u32,
    /// The object's body length (the table's entries are checked against it).
    pub body_len: u64,
}

/// Both files' maps, and where each object's table is.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maps {
    pub log: Extents,
    pub meta: Extents,
    pub tables: BTreeMap<u64, TableAt>,
}

impl Maps {
    pub fn area(&mut self, area: Area) -> &mut Extents {
        match area {
            Area::Log => &mut self.log,
            Area::Meta => &mut self.meta,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.log.bytes() + self.meta.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty() && self.meta.is_empty()
    }

    /// The map file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let count = (self.log.len() + self.meta.len()) as u64;
        let mut out = Vec::new();
        out.extend_from_slice(MAP_MAGIC);
        out.extend_from_slice(&count.to_le_bytes());
        for (area, e) in [(Area::Log, &self.log), (Area::Meta, &self.meta)] {
            for (s, l, p) in e.iter() {
                out.push(area as u8);
                out.extend_from_slice(&[0; 7]);
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&l.to_le_bytes());
                out.extend_from_slice(&p.object.to_le_bytes());
                out.extend_from_slice(&p.at.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.tables.len() as u64).to_le_bytes());
        for (object, t) in &self.tables {
            out.extend_from_slice(&object.to_le_bytes());
            out.extend_from_slice(&t.offset.to_le_bytes());
            out.extend_from_slice(&t.len.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&t.body_len.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// A map file's bytes, checked: a damaged file is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Maps, String> {
        if bytes.len() < 28 || &bytes[..8] != MAP_MAGIC {
            return Err("not a hydration map".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err("the hydration map's checksum does not match: damaged".into());
        }
        let u32_at = |e: &[u8], at: usize| u32::from_le_bytes(e[at..at + 4].try_into().unwrap());
        let u64_at = |e: &[u8], at: usize| u64::from_le_bytes(e[at..at + 8].try_into().unwrap());
        let short = || "the hydration map's length does not match its counts".to_string();
        let count = u64_at(body, 8);
        let entries_len = count
            .checked_mul(MAP_ENTRY as u64)
            .filter(|&n| n <= body.len() as u64 - 16)
            .ok_or_else(short)? as usize;
        let entries = &body[16..16 + entries_len];
        let rest = &body[16 + entries_len..];
        if rest.len() < 8 {
            return Err(short());
        }
        let tables_count = u64_at(rest, 0);
        if tables_count.checked_mul(TABLE_AT as u64) != Some(rest.len() as u64 - 8) {
            return Err(short());
        }
        let mut maps = Maps::default();
        for t in rest[8..].chunks_exact(TABLE_AT) {
            if t[20..24] != [0; 4] {
                return Err("hydration map table entry with padding set".into());
            }
            let at = TableAt {
                offset: u64_at(t, 8),
                len: u32_at(t, 16),
                body_len: u64_at(t, 24),
            };
            if maps.tables.insert(u64_at(t, 0), at).is_some() {
                return Err("hydration map names an object's table twice".into());
            }
        }
        for e in entries.chunks_exact(MAP_ENTRY) {
            let area = match e[0] {
                0 => Area::Log,
                1 => Area::Meta,
                a => return Err(format!("hydration map entry of unknown area {a}")),
            };
            if e[1..8] != [0; 7] {
                return Err("hydration map entry with padding set".into());
            }
            let (start, len) = (u64_at(e, 8), u64_at(e, 16));
            let piece = Piece {
                object: u64_at(e, 24),
                at: u64_at(e, 32),
            };
            let fits = maps.tables.get(&piece.object).is_some_and(|t| {
                piece
                    .at
                    .checked_add(len)
                    .is_some_and(|end| end <= t.body_len)
            }) && start.checked_add(len).is_some()
                && len > 0;
            let ext = maps.area(area);
            if !fits || !ext.overlapping(start, len).is_empty() {
                return Err("hydration map entry out of bounds or overlapping".into());
            }
            ext.insert(start, len, piece);
        }
        Ok(maps)
    }
}

/// One journal entry: a range that left the map.
fn journal_entry(area: Area, start: u64, len: u64) -> [u8; JOURNAL_ENTRY] {
    let mut e = [0u8; JOURNAL_ENTRY];
    e[4] = area as u8;
    e[8..16].copy_from_slice(&start.to_le_bytes());
    e[16..24].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&e[4..]);
    e[..4].copy_from_slice(&crc.to_le_bytes());
    e
}

/// Apply a journal to `maps`; the length of its whole entries (a torn tail is cut there).
pub fn replay(maps: &mut Maps, journal: &[u8]) -> usize {
    let mut good = 0;
    for e in journal.chunks_exact(JOURNAL_ENTRY) {
        let crc = u32::from_le_bytes(e[..4].try_into().unwrap());
        let area = match e[4] {
            0 => Area::Log,
            1 => Area::Meta,
            _ => break,
        };
        if crc32c::crc32c(&e[4..]) != crc || e[5..8] != [0; 3] {
            break;
        }
        let start = u64::from_le_bytes(e[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(e[16..24].try_into().unwrap());
        maps.area(area).remove(start, len);
        good += JOURNAL_ENTRY;
    }
    good
}

/// Where the data comes from (`<engine>/hydrate/source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub url: String,
    pub endpoint: Option<String>,
    pub pool: [u8; 16],
    /// The pin that keeps the source's retention off the objects still fetched (`None`: the
    /// store would not take one, e.g. read-only credentials).
    pub pin: Option<Pin>,
}

/// How often a hydrating array renews its pin.
const PIN_RENEW: Duration = Duration::from_secs(3600);

impl Source {
    fn encode(&self) -> String {
        format!(
            "url={}\nendpoint={}\npool={}\npin={}\n",
            self.url,
            self.endpoint.as_deref().unwrap_or(""),
            object::hex(&self.pool),
            self.pin
                .map(|p| format!("{:016x} {} {}", p.number, p.first, p.through))
                .unwrap_or_default()
        )
    }

    fn decode(text: &str) -> Option<Source> {
        let mut url = None;
        let mut endpoint = None;
        let mut pool = None;
        let mut pin = None;
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            match k {
                "url" => url = Some(v.to_string()),
                "endpoint" => endpoint = Some((!v.is_empty()).then(|| v.to_string())),
                "pool" if v.len() == 32 => {
                    let mut p = [0u8; 16];
                    for (i, b) in p.iter_mut().enumerate() {
                        *b = u8::from_str_radix(v.get(2 * i..2 * i + 2)?, 16).ok()?;
                    }
                    pool = Some(p);
                }
                "pin" if v.is_empty() => {}
                "pin" => {
                    let mut f = v.split(' ');
                    pin = Some(Pin {
                        number: u64::from_str_radix(f.next()?, 16).ok()?,
                        expires_ms: 0,
                        first: f.next()?.parse().ok()?,
                        through: f.next()?.parse().ok()?,
                    });
                }
                _ => return None,
            }
        }
        Some(Source {
            url: url?,
            endpoint: endpoint?,
            pool: pool?,
            pin,
        })
    }
}

/// Whether `dir` (an engine's directory) holds hydration state at all: with no root beside
/// it, that is a restore that stopped before it finished.
pub fn folder_exists(dir: &Path) -> bool {
    dir.join(FOLDER).exists()
}

/// Whether the engine in `dir` still has data in the store; its source if so.
pub fn pending(dir: &Path) -> io::Result<Option<Source>> {
    match std::fs::read_to_string(dir.join(FOLDER).join("source")) {
        Ok(text) => Source::decode(&text).map(Some).ok_or_else(|| {
            io::Error::other(format!(
                "{}: damaged hydration source",
                dir.join(FOLDER).join("source").display()
            ))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The tables file a restore fills as it reads each object's table.
pub struct TablesWriter {
    file: File,
    len: u64,
}

impl TablesWriter {
    /// A new, empty tables file in the engine's directory `dir`.
    pub fn create(dir: &Path) -> io::Result<TablesWriter> {
        let folder = dir.join(FOLDER);
        std::fs::create_dir_all(&folder)?;
        let file = File::create(folder.join("tables"))?;
        Ok(TablesWriter { file, len: 0 })
    }

    /// Keep object `object`'s table (as read from the store, checksum included).
    pub fn add(&mut self, table: &[u8], body_len: u64) -> io::Result<TableAt> {
        self.file.write_all(table)?;
        let at = TableAt {
            offset: self.len,
            len: table.len() as u32,
            body_len,
        };
        self.len += table.len() as u64;
        Ok(at)
    }

    /// Make the file durable (before the map that points into it is saved).
    pub fn finish(self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// Write a restore's map and source, durably (before the restore stores the root); the
/// tables file is already written ([`TablesWriter`]).
pub fn save(dir: &Path, source: &Source, maps: &Maps) -> io::Result<()> {
    let folder = dir.join(FOLDER);
    std::fs::create_dir_all(&folder)?;
    // The source last: it is what says "hydrating", so the others are whole before it is.
    for (name, bytes) in [
        ("map", maps.encode()),
        ("journal", Vec::new()),
        ("source", source.encode().into_bytes()),
    ] {
        let tmp = folder.join(format!("{name}.tmp"));
        std::fs::write(&tmp, &bytes)?;
        File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, folder.join(name))?;
    }
    sync_dir(&folder)?;
    sync_dir(dir)
}

/// Progress, as the API shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HydrationStatus {
    /// The store the data comes from.
    pub source: String,
    /// Bytes still in the store only.
    pub bytes_left: u64,
    /// Entries of the map in RAM (runs of an object still in the store).
    pub ranges: u64,
    /// Bytes left when this process started.
    pub bytes_at_start: u64,
    /// Bytes fetched by this process: in the background, and for reads that needed them.
    pub fetched_bytes: u64,
    pub on_demand_fetches: u64,
    pub on_demand_bytes: u64,
    /// Background fetch rate over the last few seconds, bytes per second.
    pub rate: u64,
    /// The last error fetching, until a fetch succeeds again.
    pub error: Option<String>,
    pub done: bool,
}

/// Tuning for the background fetches.
#[derive(Debug, Clone)]
pub struct HydrateConfig {
    /// Bytes per second the background threads fetch at most, together (0: no limit).
    pub rate_limit: u64,
    /// Background fetches in flight while no read waits for the store: a range GET waits
    /// mostly for the store, so a few at once go faster than one; while reads need the store
    /// one goes on (measured in docs/benchmarks.md).
    pub threads: usize,
    /// Where the pin's renewal and expiry read the time. The pace of the fetches (the rate
    /// limit, the pause while hosts read from the store) is real time: it paces real I/O.
    pub clock: Arc<dyn Clock>,
}

impl Default for HydrateConfig {
    fn default() -> Self {
        HydrateConfig {
            rate_limit: 0,
            threads: 4,
            clock: Arc::new(SystemClock),
        }
    }
}

struct State {
    maps: Maps,
    /// Ranges dropped since the last sync of each file, not yet in the journal.
    pending: [Vec<(u64, u64)>; 2],
}

struct Shared {
    dir: PathBuf,
    inner: Arc<FileBackend>,
    /// Where the data comes from (the pin to renew, then delete).
    source: Source,
    /// Every object's table, kept by the restore, and where each is.
    tables: File,
    table_at: BTreeMap<u64, TableAt>,
    store: Arc<dyn ObjectStore>,
    config: HydrateConfig,
    state: Mutex<State>,
    /// The journal and its committed length.
    journal: Mutex<(File, u64)>,
    /// One sync per area at a time (see `sync_area`).
    syncing: [Mutex<()>; 2],
    finishing: Mutex<()>,
    /// When a read last had to wait for the store (ms since `opened`, 0: never): the
    /// background fetches then go on one thread only, leaving the store and the cores to the
    /// reads.
    last_demand: AtomicU64,
    opened: Instant,
    /// The map is empty and the folder removed: every call goes straight to the files.
    done: AtomicBool,
    status: Mutex<HydrationStatus>,
    fetched: AtomicU64,
    stop: AtomicBool,
    wake: Condvar,
    sleeping: Mutex<()>,
    /// Where the background fetches go on from (metadata first, then the log).
    cursor: Mutex<(Area, u64)>,
}

/// The engine's log device and metadata area while data is still in the store (see the
/// module's description; [`HydratingBackend::devices`]).
pub struct HydratingBackend {
    shared: Arc<Shared>,
}

/// The background thread; stopping it leaves what is left for the next start.
pub struct Hydrator {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A cloneable view of the progress.
#[derive(Clone)]
pub struct HydrationHandle {
    shared: Arc<Shared>,
}

impl HydrationHandle {
    pub fn status(&self) -> HydrationStatus {
        let mut s = self.shared.status.lock().unwrap().clone();
        if !self.shared.done.load(Ordering::Acquire) {
            let st = self.shared.state.lock().unwrap();
            s.bytes_left = st.maps.bytes();
            s.ranges = (st.maps.log.len() + st.maps.meta.len()) as u64;
        }
        s.done = self.shared.done.load(Ordering::Acquire);
        s.fetched_bytes = self.shared.fetched.load(Ordering::Relaxed);
        s
    }
}

impl HydratingBackend {
    /// Open the hydration state in `dir` (the engine's directory) over its files: the map,
    /// less what the journal says left it. Starts nothing; [`HydratingBackend::start`] starts
    /// the background fetches.
    pub fn open(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: HydrateConfig,
    ) -> io::Result<HydratingBackend> {
        let folder = dir.join(FOLDER);
        let bad = |what: String| io::Error::other(format!("{}: {what}", folder.display()));
        let source = pending(dir)?.ok_or_else(|| bad("no source: not a hydration".into()))?;
        let mut maps = Maps::decode(&std::fs::read(folder.join("map"))?).map_err(bad)?;
        let table_at = std::mem::take(&mut maps.tables);
        let tables = File::open(folder.join("tables"))?;
        let journal_bytes = std::fs::read(folder.join("journal"))?;
        let good = replay(&mut maps, &journal_bytes);
        let journal = OpenOptions::new()
            .read(true)
            .write(true)
            .open(folder.join("journal"))?;
        if good < journal_bytes.len() {
            // A torn append: the entries before it are whole.
            journal.set_len(good as u64)?;
            journal.sync_all()?;
        }
        let left = maps.bytes();
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            inner: Arc::new(inner),
            source,
            tables,
            table_at,
            status: Mutex::new(HydrationStatus {
                source: store.describe(),
                bytes_at_start: left,
                ..HydrationStatus::default()
            }),
            store,
            config,
            state: Mutex::new(State {
                maps,
                pending: [Vec::new(), Vec::new()],
            }),
            journal: Mutex::new((journal, good as u64)),
            syncing: [Mutex::new(()), Mutex::new(())],
            finishing: Mutex::new(()),
            last_demand: AtomicU64::new(0),
            opened: Instant::now(),
            done: AtomicBool::new(false),
            fetched: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
            sleeping: Mutex::new(()),
            cursor: Mutex::new((Area::Meta, 0)),
        });
        Ok(HydratingBackend { shared })
    }

    /// The engine's devices: the log and the metadata area through hydration, the root and
    /// the format 2 checkpoint straight from the files (they are local once restored).
    pub fn devices(self: &Arc<Self>) -> Devices {
        Devices {
            log: self.clone(),
            meta: self.clone(),
            root: self.shared.inner.clone(),
            checkpoint: self.shared.inner.clone(),
        }
    }

    pub fn handle(&self) -> HydrationHandle {
        HydrationHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Start fetching everything left in the background.
    pub fn start(&self) -> Hydrator {
        let threads = self.shared.config.threads.max(1);
        let handles = (0..threads)
            .map(|i| {
                let shared = Arc::clone(&self.shared);
                std::thread::Builder::new()
                    .name(format!("hydrate-{i}"))
                    .spawn(move || background(&shared, i, threads))
                    .expect("spawn a hydration thread")
            })
            .collect();
        Hydrator {
            shared: Arc::clone(&self.shared),
            threads: handles,
        }
    }

    /// Fetch everything left now, on `threads` threads of the caller's (a restore asked to
    /// finish before it returns), then remove the hydration state.
    pub fn hydrate_all(&self, threads: usize) -> io::Result<()> {
        let cursor = &self.shared.cursor;
        let failed: Mutex<Option<io::Error>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads.max(1) {
                scope.spawn(|| loop {
                    if failed.lock().unwrap().is_some() {
                        break;
                    }
                    let next = self.shared.next_run(&mut cursor.lock().unwrap());
                    let Some((area, run)) = next else { break };
                    if let Err(e) = self.shared.fetch_and_apply(area, &run, false).map(drop) {
                        failed.lock().unwrap().get_or_insert(e);
                        break;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap() {
            return Err(e);
        }
        self.shared.finish_if_empty()
    }

    /// One background fetch, on this thread; whether anything was left to fetch (then the
    /// state is removed). For tests that interleave it with reads and writes.
    pub fn step(&self) -> io::Result<bool> {
        let next = self
            .shared
            .next_run(&mut self.shared.cursor.lock().unwrap());
        match next {
            Some((area, run)) => self.shared.fetch_and_apply(area, &run, false).map(|_| true),
            None => self.shared.finish_if_empty().map(|()| false),
        }
    }
}

impl Hydrator {
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        {
            // Under the pause's lock: a pause between its check and its wait still wakes.
            let _g = self.shared.sleeping.lock().unwrap();
            self.shared.stop.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // What was fetched leaves the map durably; the rest waits for the next start.
        if !self.shared.done.load(Ordering::Acquire) {
            if let Err(e) = self.shared.sync_all() {
                tracing::warn!("hydration: saving progress at stop: {e}");
            }
        }
    }
}

impl Drop for Hydrator {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Ranges to fetch: (file start, length, where its bytes are), all of one object.
type Run = Vec<(u64, u64, Piece)>;

impl Shared {
    fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// A write or discard of `[start, start + len)` by `write`: its bytes are newer than the
    /// store's. The range leaves the map before the write (so no fetch lands over it) and is
    /// queued for the journal after it (so no sync journals it before its bytes are there).
    fn drop_range(
        &self,
        area: Area,
        start: u64,
        len: u64,
        write: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        if self.done() {
            return write();
        }
        let dropped = self
            .state
            .lock()
            .unwrap()
            .maps
            .area(area)
            .remove(start, len);
        let written = write();
        if dropped {
            self.state.lock().unwrap().pending[area as usize].push((start, len));
        }
        written
    }

    /// Before a read of `[start, start + len)`: fetch what the map still names there.
    fn ensure(&self, area: Area, start: u64, len: u64) -> io::Result<()> {
        if self.done() {
            return Ok(());
        }
        let end = start.saturating_add(len);
        // Only the read's own bytes: a range may be a whole run of an object.
        let hit: Vec<(u64, u64, Piece)> = self
            .state
            .lock()
            .unwrap()
            .maps
            .area(area)
            .overlapping(start, len)
            .into_iter()
            .map(|(s, l, p)| {
                let (from, to) = (s.max(start), (s + l).min(end));
                let piece = Piece {
                    at: p.at + (from - s),
                    ..p
                };
                (from, to - from, piece)
            })
            .collect();
        if hit.is_empty() {
            return Ok(());
        }
        let bytes: u64 = hit.iter().map(|h| h.1).sum();
        self.last_demand.store(
            self.opened.elapsed().as_millis() as u64 + 1,
            Ordering::Relaxed,
        );
        {
            let mut s = self.status.lock().unwrap();
            s.on_demand_fetches += 1;
            s.on_demand_bytes += bytes;
        }
        // Group by object, in order.
        let mut runs: BTreeMap<u64, Run> = BTreeMap::new();
        for h in hit {
            runs.entry(h.2.object).or_default().push(h);
        }
        for run in runs.values() {
            self.fetch_and_apply(area, run, true)?;
        }
        Ok(())
    }

    /// The entries of object `object`'s table, from the local copy the restore kept.
    fn table(&self, object: u64, name: &str) -> io::Result<Vec<stream::Entry>> {
        use std::os::unix::fs::FileExt;
        let at = self.table_at.get(&object).ok_or_else(|| {
            io::Error::other(format!(
                "{name}: no table kept for it (a damaged hydration map)"
            ))
        })?;
        let mut bytes = vec![0u8; at.len as usize];
        self.tables.read_exact_at(&mut bytes, at.offset)?;
        stream::table(&bytes, at.body_len)
            .map_err(|e| io::Error::other(format!("{name}: its table as kept locally: {e}")))
    }

    /// Fetch what the ranges of `run` (all of one object) need: the whole records around
    /// them (nearby ones in one range read), each checked against the object's table; then
    /// write what the map still holds of them to the file.
    fn fetch_and_apply(&self, area: Area, run: &Run, on_demand: bool) -> io::Result<u64> {
        let object = run[0].2.object;
        let name = ObjectName::new(object::Kind::Stream, object).to_string();
        let entries = self.table(object, &name)?;
        let damaged = |what: String| io::Error::other(format!("{name}: {what}"));
        // The records each range's bytes lie in, widened to whole records.
        let mut wanted: Vec<(u64, u64)> = Vec::new();
        for &(_, len, p) in run {
            let end = p.at + len;
            let first = entries.partition_point(|e| e.pos + u64::from(e.len()) <= p.at);
            let last = entries.partition_point(|e| e.pos < end);
            let (Some(a), Some(b)) = (
                entries.get(first),
                last.checked_sub(1).and_then(|i| entries.get(i)),
            ) else {
                return Err(damaged(format!(
                    "no record holds body bytes {}..{end}",
                    p.at
                )));
            };
            if a.pos > p.at || b.pos + u64::from(b.len()) < end {
                return Err(damaged(format!(
                    "no record holds body bytes {}..{end}",
                    p.at
                )));
            }
            wanted.push((a.pos, b.pos + u64::from(b.len())));
        }
        wanted.sort_unstable();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (s, e) in wanted {
            match spans.last_mut() {
                Some(last) if s <= last.1 + COALESCE_GAP => last.1 = last.1.max(e),
                _ => spans.push((s, e)),
            }
        }
        let mut fetched: Vec<(u64, Vec<u8>)> = Vec::with_capacity(spans.len());
        let mut fetched_bytes = 0u64;
        for (s, e) in spans {
            let at = object::HEADER_BYTES as u64;
            let bytes = self
                .store
                .get_range(&name, at + s..at + e)
                .map_err(|e| io::Error::other(format!("fetching {name} from the store: {e}")))?;
            if bytes.len() as u64 != e - s {
                return Err(damaged(format!(
                    "the store returned {} bytes of {}",
                    bytes.len(),
                    e - s
                )));
            }
            self.fetched
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            fetched_bytes += bytes.len() as u64;
            // Every record wholly inside is checked, whichever range wanted it.
            let inside = entries.partition_point(|x| x.pos < s);
            for x in entries[inside..]
                .iter()
                .take_while(|x| x.pos + u64::from(x.len()) <= e)
            {
                let at = (x.pos - s) as usize;
                let got = crc32c::crc32c(&bytes[at..at + x.len() as usize]);
                if got != x.crc {
                    return Err(damaged(format!(
                        "the payload at {} has checksum {got:08x}, its table says {:08x}: the object is damaged",
                        x.pos, x.crc
                    )));
                }
            }
            fetched.push((s, bytes));
        }
        // Body bytes [at, at + len), from the spans fetched (which hold every range of `run`).
        let body = |at: u64, len: u64| -> Option<&[u8]> {
            let (s, bytes) = fetched.iter().rev().find(|(s, _)| *s <= at)?;
            bytes.get((at - s) as usize..(at - s + len) as usize)
        };
        // Write what is still wanted, under the lock: a write that drops a range first is
        // either before this (and the range is gone) or after (and overwrites it). A slice at
        // a time, so that reads and writes elsewhere wait for one slice's copy at most, not
        // for a whole run's.
        for &(s, l, _) in run {
            let mut at = s;
            while at < s + l {
                let slice = (s + l - at).min(APPLY_SLICE);
                let mut st = self.state.lock().unwrap();
                for (cs, cl, cp) in st.maps.area(area).overlapping(at, slice) {
                    if cp.object != object {
                        continue;
                    }
                    // The part of the range in this slice (a read asks for its own bytes).
                    let (from, to) = (cs.max(at), (cs + cl).min(at + slice));
                    let Some(bytes) = body(cp.at + (from - cs), to - from) else {
                        return Err(damaged(format!("body bytes {}.. were not fetched", cp.at)));
                    };
                    match area {
                        Area::Log => self.inner.write_at(bytes, from)?,
                        Area::Meta => self.inner.meta_write(bytes, from)?,
                    }
                    st.maps.area(area).remove(from, to - from);
                    st.pending[area as usize].push((from, to - from));
                }
                at += slice;
            }
        }
        let st = self.state.lock().unwrap();
        let emptied = st.maps.is_empty();
        drop(st);
        if emptied {
            // Reads fetched the last of it: the background thread finishes now, not after
            // its rate limit's pause.
            let _g = self.sleeping.lock().unwrap();
            self.wake.notify_all();
        }
        if !on_demand {
            self.status.lock().unwrap().error = None;
        }
        Ok(fetched_bytes)
    }

    /// The next run for the background fetches from `cursor` (metadata first, then the log,
    /// each in file order), and the cursor moved past it.
    fn next_run(&self, cursor: &mut (Area, u64)) -> Option<(Area, Run)> {
        let mut st = self.state.lock().unwrap();
        loop {
            let area = cursor.0;
            let ext = st.maps.area(area);
            if ext.is_empty() {
                if area == Area::Meta {
                    *cursor = (Area::Log, 0);
                    continue;
                }
                if st.maps.meta.is_empty() {
                    return None;
                }
                *cursor = (Area::Meta, 0);
                continue;
            }
            let (s, l, p) = ext.next_from(cursor.1)?;
            let mut run = vec![(s, l, p)];
            let mut span = (p.at, p.at + l);
            let mut at = s + l;
            while let Some((s2, l2, p2)) = ext.next_from(at) {
                let joined = (span.0.min(p2.at), span.1.max(p2.at + l2));
                if s2 < at
                    || p2.object != p.object
                    || joined.1 - joined.0 > BACKGROUND_FETCH
                    || p2.at > span.1 + COALESCE_GAP
                    || p2.at + l2 + COALESCE_GAP < span.0
                {
                    break;
                }
                span = joined;
                run.push((s2, l2, p2));
                at = s2 + l2;
            }
            *cursor = (area, at);
            return Some((area, run));
        }
    }

    /// Sync both files, then journal what left the map before the syncs.
    fn sync_all(&self) -> io::Result<()> {
        self.sync_area(Area::Log)?;
        self.sync_area(Area::Meta)
    }

    /// Sync `area`'s file and journal the ranges dropped before the sync started. One sync of
    /// an area at a time, from the take to the journal's sync: a sync that found nothing to
    /// take must not return while another still journals ranges dropped before it began.
    fn sync_area(&self, area: Area) -> io::Result<()> {
        let _one = self.syncing[area as usize].lock().unwrap();
        let taken = std::mem::take(&mut self.state.lock().unwrap().pending[area as usize]);
        let synced = match area {
            Area::Log => self.inner.sync(),
            Area::Meta => self.inner.meta_sync(),
        };
        if let Err(e) = synced {
            self.state.lock().unwrap().pending[area as usize].extend(taken);
            return Err(e);
        }
        if taken.is_empty() || self.done() {
            return Ok(());
        }
        // Neighbours as one entry (a background run leaves the map a slice at a time).
        let mut joined: Vec<(u64, u64)> = Vec::with_capacity(taken.len());
        for &(s, l) in &taken {
            match joined.last_mut() {
                Some(last) if last.0 + last.1 == s => last.1 += l,
                _ => joined.push((s, l)),
            }
        }
        let mut bytes = Vec::with_capacity(joined.len() * JOURNAL_ENTRY);
        for &(s, l) in &joined {
            bytes.extend_from_slice(&journal_entry(area, s, l));
        }
        // At the journal's committed length: a failed append (part written, ENOSPC) is
        // overwritten by the next, never left between whole entries.
        let mut j = self.journal.lock().unwrap();
        let (file, committed) = &mut *j;
        use std::os::unix::fs::FileExt;
        let written = file
            .write_all_at(&bytes, *committed)
            .and_then(|()| file.sync_data());
        match written {
            Ok(()) => {
                *committed += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = file.set_len(*committed);
                drop(j);
                self.state.lock().unwrap().pending[area as usize].extend(taken);
                Err(e)
            }
        }
    }

    /// Once nothing is left: the files synced and what left the map journaled, the folder
    /// removed (its source first, durably), and only then calls go straight through. A
    /// failure leaves the hydration in place, to be finished again.
    fn finish_if_empty(&self) -> io::Result<()> {
        // One finish at a time (every background thread comes here at the end).
        let _one = self.finishing.lock().unwrap();
        if self.done() || !self.state.lock().unwrap().maps.is_empty() {
            return Ok(());
        }
        // The map stays empty from here (it only shrinks): writes drop nothing more.
        self.sync_all()?;
        let folder = self.dir.join(FOLDER);
        let remove = |name: &str| match std::fs::remove_file(folder.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        // Without the source the folder no longer means "hydrating": a crash after this
        // leaves an ordinary array with a stray folder, before it a hydration with nothing
        // left (which finishes again).
        remove("source")?;
        sync_dir(&folder)?;
        self.done.store(true, Ordering::Release);
        remove("journal")?;
        remove("map")?;
        remove("tables")?;
        let _ = std::fs::remove_dir(&folder);
        sync_dir(&self.dir)?;
        tracing::info!("hydration complete: every byte of the restored array is local");
        if let Some(pin) = &self.source.pin {
            // The source's retention may delete what this restore used from now on; a pin
            // left behind (the store failing now) expires by itself.
            let name = ObjectName::new(object::Kind::Pin, pin.number).to_string();
            if let Err(e) = self.store.delete(&name) {
                tracing::warn!("hydration complete, but removing {name} from the store: {e}");
            }
        }
        Ok(())
    }

    /// Wait up to `d` or until stopped; whether stopped.
    fn pause(&self, d: Duration) -> bool {
        let g = self.sleeping.lock().unwrap();
        if self.stop.load(Ordering::Acquire) {
            return true;
        }
        let _ = self.wake.wait_timeout(g, d).unwrap();
        self.stop.load(Ordering::Acquire)
    }
}

/// Background thread `index` of `threads`: fetch everything left, metadata first, at its
/// share of the configured rate; errors are shown and retried with backoff. The first also
/// renews the pin and measures the rate.
fn background(shared: &Shared, index: usize, threads: usize) {
    let mut backoff = Duration::from_millis(500);
    let mut window = (Instant::now(), shared.fetched.load(Ordering::Relaxed));
    let mut last_sync = Instant::now();
    // Renewed at the start (the array may have been off for a while) and then hourly.
    let clock = &shared.config.clock;
    let mut pin_renewed: Option<Instant> = None;
    let mut started = Instant::now();
    let mut since_start = 0u64;
    while !shared.stop.load(Ordering::Acquire) && !shared.done() {
        if let Some(pin) = shared.source.pin.as_ref().filter(|_| index == 0) {
            let now = clock.now();
            if pin_renewed.is_none_or(|t| now.saturating_duration_since(t) >= PIN_RENEW) {
                match catalog::put_pin(
                    shared.store.as_ref(),
                    shared.source.pool,
                    pin,
                    clock.wall_ms(),
                ) {
                    Ok(()) => pin_renewed = Some(now),
                    Err(e) => {
                        tracing::warn!("hydration: renewing the pin on the source's objects: {e}")
                    }
                }
            }
        }
        // Hosts are reading what is still in the store: one background fetch at a time.
        let demand = shared.last_demand.load(Ordering::Relaxed);
        if index > 0 && demand > 0 && (shared.opened.elapsed().as_millis() as u64) < demand + 1000 {
            if shared.pause(Duration::from_millis(200)) {
                break;
            }
            continue;
        }
        let next = shared.next_run(&mut shared.cursor.lock().unwrap());
        let Some((area, run)) = next else {
            match shared.finish_if_empty() {
                Ok(()) => break,
                Err(e) => {
                    shared.status.lock().unwrap().error = Some(format!("finishing: {e}"));
                    if shared.pause(backoff) {
                        break;
                    }
                    continue;
                }
            }
        };
        match shared.fetch_and_apply(area, &run, false) {
            Ok(n) => {
                backoff = Duration::from_millis(500);
                since_start += n;
            }
            Err(e) => {
                tracing::warn!("hydration: {e}; retrying in {backoff:?}");
                shared.status.lock().unwrap().error = Some(e.to_string());
                // Try the same run again after the pause.
                *shared.cursor.lock().unwrap() = (area, run[0].0);
                if shared.pause(backoff) {
                    break;
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        }
        if last_sync.elapsed() >= Duration::from_secs(1) {
            if let Err(e) = shared.sync_all() {
                shared.status.lock().unwrap().error = Some(format!("saving progress: {e}"));
            }
            last_sync = Instant::now();
        }
        let now = Instant::now();
        if index == 0 && now.duration_since(window.0) >= Duration::from_secs(2) {
            let total = shared.fetched.load(Ordering::Relaxed);
            let secs = now.duration_since(window.0).as_secs_f64();
            shared.status.lock().unwrap().rate = ((total - window.1) as f64 / secs) as u64;
            window = (now, total);
        }
        if shared.config.rate_limit > 0 {
            // Ahead of the rate: wait until the bytes fetched so far are due. Behind it by
            // more than a second (the store stalled): start counting again, so the time lost
            // is not made up in a burst.
            let share = (shared.config.rate_limit / threads as u64).max(1);
            let due = Duration::from_secs_f64(since_start as f64 / share as f64);
            let elapsed = started.elapsed();
            if due > elapsed {
                if shared.pause(due - elapsed) {
                    break;
                }
            } else if elapsed - due > Duration::from_secs(1) {
                started = Instant::now();
                since_start = 0;
            }
        }
    }
}

impl LogDevice for HydratingBackend {
    fn capacity(&self) -> u64 {
        self.shared.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.shared.ensure(Area::Log, offset, buf.len() as u64)?;
        self.shared.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let inner = &self.shared.inner;
        self.shared
            .drop_range(Area::Log, offset, data.len() as u64, || {
                inner.write_at(data, offset)
            })
    }

    fn sync(&self) -> io::Result<()> {
        self.shared.sync_area(Area::Log)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.shared.inner.allocate(offset, len)
    }

    fn allocation_reserves(&self) -> bool {
        self.shared.inner.allocation_reserves()
    }

    /// As a discard: the range's old contents must never be fetched over what is written
    /// there next.
    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        let inner = &self.shared.inner;
        self.shared
            .drop_range(Area::Log, offset, len, || inner.write_ahead(offset, len))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let inner = &self.shared.inner;
        self.shared
            .drop_range(Area::Log, offset, len, || inner.discard(offset, len))
    }

    fn has_room(&self, len: u64, keep: u64) -> bool {
        self.shared.inner.has_room(len, keep)
    }
}

impl MetaArea for HydratingBackend {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.shared.ensure(Area::Meta, offset, buf.len() as u64)?;
        self.shared.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let inner = &self.shared.inner;
        self.shared
            .drop_range(Area::Meta, offset, data.len() as u64, || {
                inner.meta_write(data, offset)
            })
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.shared.sync_area(Area::Meta)
    }

    fn reserve_meta(&self, bytes: u64) {
        self.shared.inner.reserve_meta(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(object: u64, at: u64) -> Piece {
        Piece { object, at }
    }

    fn table_at(body_len: u64) -> TableAt {
        TableAt {
            offset: 0,
            len: 24,
            body_len,
        }
    }

    #[test]
    fn ranges_split_where_writes_cut_them_and_join_where_they_continue() {
        let mut e = Extents::default();
        // Two records of one object, one after the other in the file and in the body: one range.
        e.insert(0, 65536, piece(1, 100));
        e.insert(65536, 65536, piece(1, 65636));
        assert_eq!(e.len(), 1);
        assert_eq!(e.bytes(), 131072);
        // A write over the middle.
        assert!(e.remove(60000, 10000));
        assert!(!e.remove(60000, 10000), "nothing left there");
        assert_eq!(e.bytes(), 131072 - 10000);
        assert_eq!(
            e.overlapping(0, 1 << 20),
            vec![
                (0, 60000, piece(1, 100)),
                (70000, 131072 - 70000, piece(1, 70100))
            ]
        );
        // A newer piece over part of a range replaces it there only.
        e.insert(100000, 4096, piece(9, 5));
        assert_eq!(e.overlapping(100000, 1)[0].2.object, 9);
        assert_eq!(e.bytes(), 131072 - 10000);
        assert_eq!(e.overlapping(104096, 1)[0].2.at, 104196);
        // Not joined: another object, or a gap in the body.
        e.insert(200000, 10, piece(1, 300000));
        e.insert(200010, 10, piece(1, 300020));
        e.insert(200020, 10, piece(2, 300020));
        assert_eq!(e.overlapping(200000, 30).len(), 3);
        // Filling the gap back joins all three of object 1's... only where the body continues.
        e.insert(200010, 10, piece(1, 300010));
        assert_eq!(e.overlapping(200000, 30).len(), 2);
        assert_eq!(e.bytes(), 131072 - 10000 + 30);
    }

    #[test]
    fn the_map_round_trips_and_the_journal_replays_up_to_a_torn_entry() {
        let mut m = Maps::default();
        m.tables.insert(1, table_at(1 << 20));
        m.tables.insert(2, table_at(1 << 20));
        m.log.insert(0, 65536, piece(1, 100));
        m.log.insert(1 << 20, 4096, piece(2, 200));
        m.meta.insert(8192, 4096, piece(1, 300_000));
        let bytes = m.encode();
        assert_eq!(Maps::decode(&bytes).unwrap(), m);
        for bit in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Maps::decode(&bad).is_err(), "bit {bit}");
        }
        // A range past its object's body, or of an object whose table is not kept.
        let mut out = m.clone();
        out.log.insert(1 << 30, 4096, piece(2, (1 << 20) - 10));
        assert!(Maps::decode(&out.encode()).is_err());
        let mut out = m.clone();
        out.log.insert(1 << 30, 4096, piece(3, 0));
        assert!(Maps::decode(&out.encode()).is_err());
        let mut journal = journal_entry(Area::Log, 4096, 8192).to_vec();
        journal.extend_from_slice(&journal_entry(Area::Meta, 8192, 4096));
        journal.extend_from_slice(&journal_entry(Area::Log, 1 << 20, 4096)[..10]);
        let mut replayed = m.clone();
        assert_eq!(replay(&mut replayed, &journal), 2 * JOURNAL_ENTRY);
        assert_eq!(replayed.meta.bytes(), 0);
        assert_eq!(replayed.log.bytes(), 65536 - 8192 + 4096);
    }

    #[test]
    fn the_second_encoders_map_decodes() {
        // fuzz/make_corpus.py writes it from the format's description, not from this code.
        let seed = include_bytes!("../../../fuzz/corpus/hydrate_map/map_and_journal");
        let split = u16::from_le_bytes([seed[0], seed[1]]) as usize;
        let (map, journal) = seed[2..].split_at(split);
        let mut m = Maps::decode(map).unwrap();
        assert_eq!((m.log.len(), m.meta.len(), m.tables.len()), (2, 1, 2));
        assert_eq!(m.log.overlapping(1 << 20, 1)[0].2, piece(2, 65656));
        assert_eq!(replay(&mut m, journal), journal.len());
        assert_eq!(m.bytes(), 65536 - 8192 + 4096);
    }
}
