//! Hydration on demand (RFC 0003, "Hydration on demand"): a restored array serves before its
//! data is local. A restore reads each stream object's table (`stream::table`), applies the
//! small records and leaves, for every range of the log and metadata files whose bytes are
//! still in the store, where they are: an [`Extents`] map. [`HydratingBackend`] serves the
//! engine over the restored files and that map: a read of a range the map still names fetches
//! the pieces it touches, writes them to the file and drops them from the map; a write or a
//! discard drops what it covers (its bytes are newer); a background thread fetches the rest in
//! file order, metadata first.
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
//! <engine>/hydrate/source    the store's URL, endpoint and the pool's uuid (text)
//! <engine>/hydrate/map       "SLVRHYD1" | count u64 | entries [48] * count | crc32c u32
//!                            entry: area u8 | pad [3] | piece len u32 | start u64 | len u64
//!                                   | object u64 | pos u64 | piece crc u32 | skip u32
//! <engine>/hydrate/journal   { crc32c u32 (of the rest) | area u8 | pad [3] | start u64
//!                              | len u64 } * n, appended; a torn tail is cut at open
//! ```
//! Once the map is empty and synced, the folder is removed and the array is an ordinary one.

use crate::object::{self, ObjectName};
use crate::store::ObjectStore;
use sliver_engine::{Backend, FileBackend};
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
const MAP_ENTRY: usize = 48;
const JOURNAL_ENTRY: usize = 24;
/// Pieces of one object closer than this are fetched with one range read.
const COALESCE_GAP: u64 = 256 << 10;
/// Most bytes one background fetch asks for.
const BACKGROUND_FETCH: u64 = 8 << 20;

/// Which file a range belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Area {
    Log = 0,
    Meta = 1,
}

/// Where the bytes of a range are in the store: a record's payload in a stream object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    pub object: u64,
    /// The payload's position in the object's body.
    pub pos: u64,
    pub len: u32,
    /// The payload's crc32c (from the object's table): fetched bytes are checked against it.
    pub crc: u32,
    /// The range starts this far into the payload.
    pub skip: u32,
}

/// Ranges of one file not yet fetched: start -> (length, piece). The ranges never overlap.
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

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// `[start, start + len)` now comes from `piece` (a newer write than what the map held).
    pub fn insert(&mut self, start: u64, len: u64, piece: Piece) {
        if len == 0 {
            return;
        }
        self.remove(start, len);
        self.map.insert(start, (len, piece));
        self.bytes += len;
    }

    /// Drop whatever the map holds in `[start, start + len)`; whether anything was there.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        let hit: Vec<(u64, u64, Piece)> =
            self.overlapping(start, len).into_iter().collect::<Vec<_>>();
        for &(s, l, p) in &hit {
            self.map.remove(&s);
            self.bytes -= l;
            let e = s + l;
            if s < start {
                self.map.insert(s, (start - s, p));
                self.bytes += start - s;
            }
            if e > end {
                let cut = end - s;
                let tail = Piece {
                    skip: p.skip + cut as u32,
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

/// Both files' maps.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maps {
    pub log: Extents,
    pub meta: Extents,
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
        let mut out = Vec::with_capacity(16 + count as usize * MAP_ENTRY + 4);
        out.extend_from_slice(MAP_MAGIC);
        out.extend_from_slice(&count.to_le_bytes());
        for (area, e) in [(Area::Log, &self.log), (Area::Meta, &self.meta)] {
            for (s, l, p) in e.iter() {
                out.push(area as u8);
                out.extend_from_slice(&[0; 3]);
                out.extend_from_slice(&p.len.to_le_bytes());
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&l.to_le_bytes());
                out.extend_from_slice(&p.object.to_le_bytes());
                out.extend_from_slice(&p.pos.to_le_bytes());
                out.extend_from_slice(&p.crc.to_le_bytes());
                out.extend_from_slice(&p.skip.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// A map file's bytes, checked: a damaged file is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Maps, String> {
        if bytes.len() < 20 || &bytes[..8] != MAP_MAGIC {
            return Err("not a hydration map".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err("the hydration map's checksum does not match: damaged".into());
        }
        let count = u64::from_le_bytes(body[8..16].try_into().unwrap());
        let entries = &body[16..];
        if count.checked_mul(MAP_ENTRY as u64) != Some(entries.len() as u64) {
            return Err("the hydration map's length does not match its count".into());
        }
        let u32_at = |e: &[u8], at: usize| u32::from_le_bytes(e[at..at + 4].try_into().unwrap());
        let u64_at = |e: &[u8], at: usize| u64::from_le_bytes(e[at..at + 8].try_into().unwrap());
        let mut maps = Maps::default();
        for e in entries.chunks_exact(MAP_ENTRY) {
            let area = match e[0] {
                0 => Area::Log,
                1 => Area::Meta,
                a => return Err(format!("hydration map entry of unknown area {a}")),
            };
            if e[1..4] != [0; 3] {
                return Err("hydration map entry with padding set".into());
            }
            let piece = Piece {
                len: u32_at(e, 4),
                object: u64_at(e, 24),
                pos: u64_at(e, 32),
                crc: u32_at(e, 40),
                skip: u32_at(e, 44),
            };
            let (start, len) = (u64_at(e, 8), u64_at(e, 16));
            let fits = u64::from(piece.skip)
                .checked_add(len)
                .is_some_and(|end| end <= u64::from(piece.len))
                && start.checked_add(len).is_some()
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
}

impl Source {
    fn encode(&self) -> String {
        format!(
            "url={}\nendpoint={}\npool={}\n",
            self.url,
            self.endpoint.as_deref().unwrap_or(""),
            object::hex(&self.pool)
        )
    }

    fn decode(text: &str) -> Option<Source> {
        let mut url = None;
        let mut endpoint = None;
        let mut pool = None;
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
                _ => return None,
            }
        }
        Some(Source {
            url: url?,
            endpoint: endpoint?,
            pool: pool?,
        })
    }
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

/// Write a restore's map and source, durably (before the restore stores the root).
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
#[derive(Debug, Clone, Copy, Default)]
pub struct HydrateConfig {
    /// Bytes per second the background thread fetches at most (0: no limit).
    pub rate_limit: u64,
}

struct State {
    maps: Maps,
    /// Ranges dropped since the last sync of each file, not yet in the journal.
    pending: [Vec<(u64, u64)>; 2],
}

struct Shared {
    dir: PathBuf,
    inner: Arc<FileBackend>,
    store: Arc<dyn ObjectStore>,
    config: HydrateConfig,
    state: Mutex<State>,
    journal: Mutex<File>,
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

/// The engine's backend while data is still in the store (see the module's description).
pub struct HydratingBackend {
    shared: Arc<Shared>,
}

/// The background thread; stopping it leaves what is left for the next start.
pub struct Hydrator {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A cloneable view of the progress.
#[derive(Clone)]
pub struct HydrationHandle {
    shared: Arc<Shared>,
}

impl HydrationHandle {
    pub fn status(&self) -> HydrationStatus {
        let mut s = self.shared.status.lock().unwrap().clone();
        s.bytes_left = if self.shared.done.load(Ordering::Acquire) {
            0
        } else {
            self.shared.state.lock().unwrap().maps.bytes()
        };
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
        let mut maps = Maps::decode(&std::fs::read(folder.join("map"))?).map_err(bad)?;
        let journal_bytes = std::fs::read(folder.join("journal"))?;
        let good = replay(&mut maps, &journal_bytes);
        let mut journal = OpenOptions::new()
            .read(true)
            .write(true)
            .open(folder.join("journal"))?;
        if good < journal_bytes.len() {
            // A torn append: the entries before it are whole.
            journal.set_len(good as u64)?;
            journal.sync_all()?;
        }
        use std::io::Seek;
        journal.seek(io::SeekFrom::End(0))?;
        let left = maps.bytes();
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            inner: Arc::new(inner),
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
            journal: Mutex::new(journal),
            done: AtomicBool::new(false),
            fetched: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
            sleeping: Mutex::new(()),
            cursor: Mutex::new((Area::Meta, 0)),
        });
        Ok(HydratingBackend { shared })
    }

    pub fn handle(&self) -> HydrationHandle {
        HydrationHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Start fetching everything left in the background.
    pub fn start(&self) -> Hydrator {
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("hydrate".into())
            .spawn(move || background(&shared))
            .expect("spawn the hydration thread");
        Hydrator {
            shared: Arc::clone(&self.shared),
            thread: Some(thread),
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
                    if let Err(e) = self.shared.fetch_and_apply(area, &run, false) {
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
            Some((area, run)) => self
                .shared
                .fetch_and_apply(area, &run, false)
                .map(|()| true),
            None => self.shared.finish_if_empty().map(|()| false),
        }
    }
}

impl Hydrator {
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
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

/// Pieces to fetch: (file start, length, piece) of the map's ranges, all of one object.
type Run = Vec<(u64, u64, Piece)>;

impl Shared {
    fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// A write or discard of `[start, start + len)`: its bytes are newer than the store's.
    fn drop_range(&self, area: Area, start: u64, len: u64) {
        if self.done() {
            return;
        }
        let mut st = self.state.lock().unwrap();
        if st.maps.area(area).remove(start, len) {
            st.pending[area as usize].push((start, len));
        }
    }

    /// Before a read of `[start, start + len)`: fetch what the map still names there.
    fn ensure(&self, area: Area, start: u64, len: u64) -> io::Result<()> {
        if self.done() {
            return Ok(());
        }
        let hit = self
            .state
            .lock()
            .unwrap()
            .maps
            .area(area)
            .overlapping(start, len);
        if hit.is_empty() {
            return Ok(());
        }
        let bytes: u64 = hit.iter().map(|h| h.1).sum();
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

    /// Fetch the pieces `run` names (one object; nearby pieces in one range read each),
    /// check them, and write what the map still holds of them to the file.
    fn fetch_and_apply(&self, area: Area, run: &Run, on_demand: bool) -> io::Result<()> {
        let object = run[0].2.object;
        let name = ObjectName::new(object::Kind::Stream, object).to_string();
        let mut pieces: Vec<Piece> = run.iter().map(|r| r.2).collect();
        pieces.sort_by_key(|p| p.pos);
        pieces.dedup_by_key(|p| p.pos);
        // Spans of nearby pieces, fetched one range read each.
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for p in &pieces {
            let (s, e) = (p.pos, p.pos + u64::from(p.len));
            match spans.last_mut() {
                Some(last) if s <= last.1 + COALESCE_GAP => last.1 = last.1.max(e),
                _ => spans.push((s, e)),
            }
        }
        let mut fetched: Vec<(u64, Vec<u8>)> = Vec::with_capacity(spans.len());
        for (s, e) in spans {
            let at = object::HEADER_BYTES as u64;
            let bytes = self
                .store
                .get_range(&name, at + s..at + e)
                .map_err(|e| io::Error::other(format!("fetching {name} from the store: {e}")))?;
            if bytes.len() as u64 != e - s {
                return Err(io::Error::other(format!(
                    "{name}: the store returned {} bytes of {}",
                    bytes.len(),
                    e - s
                )));
            }
            self.fetched
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            fetched.push((s, bytes));
        }
        let payload = |p: &Piece| -> &[u8] {
            let (s, bytes) = fetched
                .iter()
                .rev()
                .find(|(s, _)| *s <= p.pos)
                .expect("a span holds every piece");
            let at = (p.pos - s) as usize;
            &bytes[at..at + p.len as usize]
        };
        for p in &pieces {
            let got = crc32c::crc32c(payload(p));
            if got != p.crc {
                return Err(io::Error::other(format!(
                    "{name}: the payload at {} has checksum {got:08x}, its table says {:08x}: the object is damaged",
                    p.pos, p.crc
                )));
            }
        }
        // Write what is still wanted, under the lock: a write that drops a range first is
        // either before this (and the range is gone) or after (and overwrites it).
        let mut st = self.state.lock().unwrap();
        for &(s, l, _) in run {
            for (cs, cl, cp) in st.maps.area(area).overlapping(s, l) {
                let Some(p) = pieces.iter().find(|p| p.pos == cp.pos) else {
                    continue;
                };
                if cp.object != object {
                    continue;
                }
                let bytes = &payload(p)[cp.skip as usize..cp.skip as usize + cl as usize];
                match area {
                    Area::Log => self.inner.write_at(bytes, cs)?,
                    Area::Meta => self.inner.meta_write(bytes, cs)?,
                }
                st.maps.area(area).remove(cs, cl);
                st.pending[area as usize].push((cs, cl));
            }
        }
        let emptied = st.maps.is_empty();
        drop(st);
        if emptied {
            // Reads fetched the last of it: the background thread finishes now, not after
            // its rate limit's pause.
            self.wake.notify_all();
        }
        if !on_demand {
            self.status.lock().unwrap().error = None;
        }
        Ok(())
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
            let mut span = (p.pos, p.pos + u64::from(p.len));
            let mut at = s + l;
            while let Some((s2, l2, p2)) = ext.next_from(at) {
                if s2 < at
                    || p2.object != p.object
                    || p2.pos + u64::from(p2.len) > span.0 + BACKGROUND_FETCH
                    || p2.pos + COALESCE_GAP < span.0
                    || p2.pos > span.1 + COALESCE_GAP
                {
                    break;
                }
                span = (span.0.min(p2.pos), span.1.max(p2.pos + u64::from(p2.len)));
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

    /// Sync `area`'s file and journal the ranges dropped before the sync started.
    fn sync_area(&self, area: Area) -> io::Result<()> {
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
        let mut bytes = Vec::with_capacity(taken.len() * JOURNAL_ENTRY);
        for &(s, l) in &taken {
            bytes.extend_from_slice(&journal_entry(area, s, l));
        }
        let mut j = self.journal.lock().unwrap();
        let written = j.write_all(&bytes).and_then(|()| j.sync_data());
        if let Err(e) = written {
            drop(j);
            self.state.lock().unwrap().pending[area as usize].extend(taken);
            return Err(e);
        }
        Ok(())
    }

    /// Once nothing is left: the files synced, the folder removed, calls go straight through.
    fn finish_if_empty(&self) -> io::Result<()> {
        if self.done() || !self.state.lock().unwrap().maps.is_empty() {
            return Ok(());
        }
        self.inner.sync()?;
        self.inner.meta_sync()?;
        let st = self.state.lock().unwrap();
        if !st.maps.is_empty() {
            return Ok(());
        }
        self.done.store(true, Ordering::Release);
        drop(st);
        let folder = self.dir.join(FOLDER);
        // The source first, durably: without it the folder no longer means "hydrating", and
        // a crash before the rest is removed leaves an ordinary array with a stray folder.
        let remove = |name: &str| match std::fs::remove_file(folder.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        remove("source")?;
        sync_dir(&folder)?;
        remove("journal")?;
        remove("map")?;
        let _ = std::fs::remove_dir(&folder);
        sync_dir(&self.dir)?;
        tracing::info!("hydration complete: every byte of the restored array is local");
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

/// The background thread: fetch everything left, metadata first, at the configured rate;
/// errors are shown and retried with backoff.
fn background(shared: &Shared) {
    let mut backoff = Duration::from_millis(500);
    let mut window = (Instant::now(), shared.fetched.load(Ordering::Relaxed));
    let mut last_sync = Instant::now();
    let started = Instant::now();
    let mut since_start = 0u64;
    while !shared.stop.load(Ordering::Acquire) && !shared.done() {
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
        let before = shared.fetched.load(Ordering::Relaxed);
        match shared.fetch_and_apply(area, &run, false) {
            Ok(()) => backoff = Duration::from_millis(500),
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
        since_start += shared.fetched.load(Ordering::Relaxed) - before;
        if last_sync.elapsed() >= Duration::from_secs(1) {
            if let Err(e) = shared.sync_all() {
                shared.status.lock().unwrap().error = Some(format!("saving progress: {e}"));
            }
            last_sync = Instant::now();
        }
        let now = Instant::now();
        if now.duration_since(window.0) >= Duration::from_secs(2) {
            let total = shared.fetched.load(Ordering::Relaxed);
            let secs = now.duration_since(window.0).as_secs_f64();
            shared.status.lock().unwrap().rate = ((total - window.1) as f64 / secs) as u64;
            window = (now, total);
        }
        if shared.config.rate_limit > 0 {
            // Ahead of the rate: wait until the bytes fetched so far are due.
            let due = Duration::from_secs_f64(since_start as f64 / shared.config.rate_limit as f64);
            let elapsed = started.elapsed();
            if due > elapsed && shared.pause(due - elapsed) {
                break;
            }
        }
    }
}

impl Backend for HydratingBackend {
    fn capacity(&self) -> u64 {
        self.shared.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.shared.ensure(Area::Log, offset, buf.len() as u64)?;
        self.shared.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.shared.drop_range(Area::Log, offset, data.len() as u64);
        self.shared.inner.write_at(data, offset)
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

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.shared.drop_range(Area::Log, offset, len);
        self.shared.inner.discard(offset, len)
    }

    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.shared.ensure(Area::Meta, offset, buf.len() as u64)?;
        self.shared.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.shared
            .drop_range(Area::Meta, offset, data.len() as u64);
        self.shared.inner.meta_write(data, offset)
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.shared.sync_area(Area::Meta)
    }

    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.shared.inner.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.shared.inner.store_root(bytes)
    }

    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        self.shared.inner.load_checkpoint()
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.shared.inner.store_checkpoint(bytes)
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        self.shared.inner.retire_checkpoint()
    }

    fn reserve_meta(&self, bytes: u64) {
        self.shared.inner.reserve_meta(bytes)
    }

    fn has_room(&self, len: u64, keep: u64) -> bool {
        self.shared.inner.has_room(len, keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(object: u64, pos: u64, skip: u32) -> Piece {
        Piece {
            object,
            pos,
            len: 65536,
            crc: 7,
            skip,
        }
    }

    #[test]
    fn ranges_split_where_writes_cut_them_and_keep_their_place_in_the_piece() {
        let mut e = Extents::default();
        e.insert(0, 65536, piece(1, 100, 0));
        e.insert(65536, 65536, piece(1, 65636, 0));
        assert_eq!(e.bytes(), 131072);
        // A write over the middle of both.
        assert!(e.remove(60000, 10000));
        assert!(!e.remove(60000, 10000), "nothing left there");
        assert_eq!(e.bytes(), 131072 - 10000);
        let got = e.overlapping(0, 1 << 20);
        assert_eq!(
            got,
            vec![
                (0, 60000, piece(1, 100, 0)),
                (70000, 131072 - 70000, piece(1, 65636, 70000 - 65536)),
            ]
        );
        // A newer piece over part of a range replaces it there only.
        e.insert(100000, 4096, piece(9, 5, 0));
        assert_eq!(e.overlapping(100000, 1).len(), 1);
        assert_eq!(e.overlapping(100000, 1)[0].2.object, 9);
        assert_eq!(e.bytes(), 131072 - 10000);
        assert_eq!(e.overlapping(104096, 1)[0].2.skip, (104096 - 65536) as u32);
    }

    #[test]
    fn the_map_round_trips_and_the_journal_replays_up_to_a_torn_entry() {
        let mut m = Maps::default();
        m.log.insert(0, 65536, piece(1, 100, 0));
        m.log.insert(1 << 20, 4096, piece(2, 200, 8192));
        m.meta.insert(8192, 4096, piece(1, 300, 0));
        let bytes = m.encode();
        assert_eq!(Maps::decode(&bytes).unwrap(), m);
        for bit in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Maps::decode(&bad).is_err(), "bit {bit}");
        }
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
        assert_eq!((m.log.len(), m.meta.len()), (2, 1));
        assert_eq!(m.log.overlapping(1 << 20, 1)[0].2.skip, 8192);
        assert_eq!(replay(&mut m, journal), journal.len());
        assert_eq!(m.bytes(), 65536 - 8192 + 4096);
    }
}
