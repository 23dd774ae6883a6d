//! Restore a whole copy (RFC 0003, "Revision: shipping the backend's writes" and "Restore
//! points and retention"): the stream's consecutive objects from the start of a complete base
//! (the newest, or the one a restore point builds on) to the end (or through the point, or to
//! the start of a restart base, whose records follow a local state the stream does not hold),
//! applied to new files in a data directory. The engine then opens them as after a crash.
//! Each object is read once; the catalog says where to start.

use crate::catalog::{self, Catalog, Point};
use crate::hydrate::{self, Area};
use crate::object::{self, Expected, Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use crate::stream::{self, Record};
use sliver_clock::{Clock, SystemClock};
use sliver_engine::{FileBackend, LogDevice, MetaArea, RootStore};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Object(#[from] object::ObjectError),
    #[error("{name}: {source}")]
    Stream {
        name: String,
        source: stream::StreamError,
    },
    #[error("writing the restored array in {dir}: {source}")]
    Local { dir: String, source: io::Error },
    #[error("{0}")]
    Nothing(String),
}

/// What a restore found and applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    pub pool: [u8; 16],
    /// Objects applied, first and last.
    pub first: u64,
    pub last: u64,
    /// Objects after `last` not used: a gap, or a base that did not complete.
    pub left_out: u64,
    pub bytes_applied: u64,
    /// Bytes left in the store for the array to fetch (on demand and in the background); for
    /// a whole restore, what was fetched after the tables were read.
    pub bytes_on_demand: u64,
    /// Why the store did not take the pin that keeps the source's retention off the objects
    /// an on-demand restore still fetches (`None`: pinned, or nothing to pin).
    pub pin_error: Option<String>,
    /// Whether the copy held the array's configuration (written to the path given).
    pub config: bool,
    /// The restore point restored (`None`: the newest state).
    pub point: Option<Point>,
    /// For the newest state: the first stream object missing after the span applied (the
    /// store lost it), when the store holds newer ones that could not be used.
    pub missing: Option<u64>,
}

/// Ranges written since the base started: a base's bytes go only where none of them did.
#[derive(Default)]
struct Written(BTreeMap<u64, u64>);

impl Written {
    fn add(&mut self, start: u64, len: u64) {
        let mut s = start;
        let mut e = start.saturating_add(len);
        // Merge with every range that touches [s, e).
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=e)
            .rev()
            .take_while(|&(&a, &b)| b >= s || a >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in touching {
            if b >= s && a <= e {
                s = s.min(a);
                e = e.max(b);
                self.0.remove(&a);
            }
        }
        self.0.insert(s, e);
    }

    /// The parts of [start, start + len) no range covers.
    fn uncovered(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let end = start.saturating_add(len);
        let mut out = Vec::new();
        let mut at = start;
        let first = self
            .0
            .range(..=start)
            .next_back()
            .map(|(&a, _)| a)
            .unwrap_or(start);
        for (&a, &b) in self.0.range(first..end) {
            if b <= at {
                continue;
            }
            if a > at {
                out.push((at, a.min(end) - at));
            }
            at = at.max(b);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end - at));
        }
        out
    }
}

/// Which state of the array a restore rebuilds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The newest state the store holds.
    Newest,
    /// The restore point of this name.
    Point(String),
    /// The newest point taken at or before this time (milliseconds since 1970).
    At(u64),
}

/// Where a restore starts and ends.
struct Span {
    /// The chosen base's start: stream object and record.
    from: (u64, usize),
    /// The last object applied (`None`: to the end of the consecutive run).
    through: Option<u64>,
    point: Option<Point>,
}

fn choose(
    store: &dyn ObjectStore,
    cat: &Catalog,
    pool: [u8; 16],
    target: &Target,
) -> Result<Span, RestoreError> {
    let of_point = |p: &Point| Span {
        from: (p.base, p.base_record as usize),
        through: Some(p.through),
        point: Some(p.clone()),
    };
    let names = || {
        let mut n: Vec<&str> = cat.points.iter().map(|p| p.name.as_str()).collect();
        if n.len() > 12 {
            n.drain(..n.len() - 12);
        }
        if n.is_empty() {
            "it holds none".to_string()
        } else {
            format!("it holds {}", n.join(", "))
        }
    };
    match target {
        Target::Point(name) => cat
            .points
            .iter()
            .find(|p| &p.name == name)
            .map(of_point)
            .ok_or_else(|| {
                RestoreError::Nothing(format!(
                    "{} holds no restore point named {name:?}: {}",
                    store.describe(),
                    names()
                ))
            }),
        Target::At(t) => cat
            .points
            .iter()
            .filter(|p| p.time_ms <= *t)
            .max_by_key(|p| (p.time_ms, p.number))
            .map(of_point)
            .ok_or_else(|| {
                RestoreError::Nothing(format!(
                    "{} holds no restore point taken at or before {}: {}",
                    store.describe(),
                    catalog::utc(*t),
                    names()
                ))
            }),
        Target::Newest => {
            let from = match catalog::newest_base(&cat.bases) {
                Some(b) => (b.start, b.record as usize),
                // A copy shipped before the base index existed: find its bases by reading it.
                None => scan_for_base(store, cat, pool)?,
            };
            Ok(Span {
                from,
                through: None,
                point: None,
            })
        }
    }
}

/// The start of the last complete base in the consecutive run from the first stream object,
/// found by reading every object (copies without a base index only).
fn scan_for_base(
    store: &dyn ObjectStore,
    cat: &Catalog,
    pool: [u8; 16],
) -> Result<(u64, usize), RestoreError> {
    let run = cat.stream.first().cloned().unwrap_or(0..0);
    let mut starts = Vec::new();
    let mut complete = None;
    prefetched(
        run,
        |n| fetch(store, n, pool),
        |n, bytes| {
            for (i, r) in body_records(&bytes).enumerate() {
                match r.map_err(|source| stream_error(n, source))? {
                    Record::BaseStart { .. } => starts.push((n, i)),
                    Record::BaseEnd => complete = starts.last().copied().or(complete),
                    _ => {}
                }
            }
            Ok(true)
        },
    )?;
    complete.ok_or_else(|| {
        RestoreError::Nothing(format!(
            "{} holds no complete copy yet (its first base is still being shipped)",
            store.describe()
        ))
    })
}

/// The records of a fetched (and checked) stream object, in either layout.
fn body_records(
    bytes: &[u8],
) -> Box<dyn Iterator<Item = Result<Record<'_>, stream::StreamError>> + '_> {
    // `fetch` checked the header; a header that no longer decodes yields no table.
    let table_len = object::decode_header("", bytes).map_or(0, |h| h.table_len);
    stream::records(&bytes[object::HEADER_BYTES..], table_len)
}

fn stream_error(n: u64, source: stream::StreamError) -> RestoreError {
    RestoreError::Stream {
        name: ObjectName::new(Kind::Stream, n).to_string(),
        source,
    }
}

/// Objects fetched ahead of the one being applied: a restore reads at the store's parallel
/// rate, not one round trip at a time, holding at most this many (8 MiB) objects more.
const PREFETCH: usize = 4;

/// Call `apply` with what `fetch` returns for each stream object of `range`, in order, fetched
/// up to [`PREFETCH`] ahead on threads of their own. `apply` returns `Ok(false)` to stop early.
fn prefetched<T: Send>(
    range: std::ops::Range<u64>,
    fetch: impl Fn(u64) -> Result<T, RestoreError> + Sync,
    mut apply: impl FnMut(u64, T) -> Result<bool, RestoreError>,
) -> Result<(), RestoreError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH);
        let numbers = range.clone();
        let stop = &stop;
        let fetch = &fetch;
        scope.spawn(move || {
            for n in numbers {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let fetching = scope.spawn(move || fetch(n));
                if tx.send(fetching).is_err() {
                    break;
                }
            }
        });
        let mut outcome = Ok(());
        for n in range {
            let Ok(fetching) = rx.recv() else { break };
            let step = fetching
                .join()
                .unwrap_or_else(|_| Err(RestoreError::Nothing("a fetch thread panicked".into())))
                .and_then(|bytes| apply(n, bytes));
            match step {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        stop.store(true, Ordering::Release);
        drop(rx);
        outcome
    })
}

/// Stream object `n`, checked against its name and the pool.
fn fetch(store: &dyn ObjectStore, n: u64, pool: [u8; 16]) -> Result<Vec<u8>, RestoreError> {
    let name = ObjectName::new(Kind::Stream, n).to_string();
    let bytes = store.get(&name)?;
    let expected = Expected {
        array: pool,
        kind: Kind::Stream,
        number: n,
    };
    object::decode(&name, &bytes, &expected)?;
    Ok(bytes)
}

/// The restore points and bases a store holds (`sliver restore --list`).
pub fn list(store: &dyn ObjectStore) -> Result<Catalog, RestoreError> {
    Ok(catalog::load(store)?)
}

/// What a stream object gave the restore: its table (the payloads stay in the store until
/// they are needed), or, for an object in the interleaved layout, all of it.
enum Fetched {
    Table {
        entries: Vec<stream::Entry>,
        /// The table as read (kept locally for the checks of later fetches).
        raw: Vec<u8>,
        body_len: u64,
    },
    Whole(Vec<u8>),
}

/// Stream object `n`'s header and table (one range read each), or the whole object when it
/// has no table; checked against its name and the pool.
fn fetch_table(store: &dyn ObjectStore, n: u64, pool: [u8; 16]) -> Result<Fetched, RestoreError> {
    let name = ObjectName::new(Kind::Stream, n).to_string();
    let at = object::HEADER_BYTES as u64;
    let head = store.get_range(&name, 0..at)?;
    let header = object::decode_header(&name, &head)?;
    header.check(
        &name,
        &Expected {
            array: pool,
            kind: Kind::Stream,
            number: n,
        },
    )?;
    if header.table_len == 0 {
        return fetch(store, n, pool).map(Fetched::Whole);
    }
    let table = store.get_range(&name, at..at + u64::from(header.table_len))?;
    let entries =
        stream::table(&table, header.body_len).map_err(|source| stream_error(n, source))?;
    Ok(Fetched::Table {
        entries,
        raw: table,
        body_len: header.body_len,
    })
}

/// How a restore leaves the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Every byte fetched before the restore returns.
    Whole,
    /// The array serves at once and fetches the rest on demand and in the background
    /// (`crate::hydrate`); the source is where a later start finds the store again.
    OnDemand {
        url: String,
        endpoint: Option<String>,
    },
}

/// Where a restored byte range comes from.
enum From<'a> {
    /// A record's payload still in the store: object and table entry.
    Stored(u64, stream::Entry),
    /// Bytes at hand (an object in the interleaved layout).
    Bytes(&'a [u8]),
}

/// The restored files as the records build them: what the map will fetch and what was
/// written at once, with the base rule (a base's bytes only where no write since the base
/// started went).
struct Layers {
    written: [Written; 2],
    maps: hydrate::Maps,
    applied: u64,
}

impl Layers {
    fn place(
        &mut self,
        files: &FileBackend,
        area: Area,
        offset: u64,
        len: u64,
        from: From<'_>,
        base: bool,
    ) -> io::Result<()> {
        let parts = if base {
            self.written[area as usize].uncovered(offset, len)
        } else {
            self.written[area as usize].add(offset, len);
            vec![(offset, len)]
        };
        for (o, l) in parts {
            let into = (o - offset) as u32;
            match &from {
                From::Stored(object, e) => self.maps.area(area).insert(
                    o,
                    l,
                    hydrate::Piece {
                        object: *object,
                        at: e.pos + u64::from(into),
                    },
                ),
                From::Bytes(b) => {
                    let bytes = &b[into as usize..into as usize + l as usize];
                    self.maps.area(area).remove(o, l);
                    match area {
                        Area::Log => files.write_at(bytes, o)?,
                        Area::Meta => files.meta_write(bytes, o)?,
                    }
                    self.applied += l;
                }
            }
        }
        Ok(())
    }
}

/// A root or configuration chosen so far: where its bytes are (a record of an object), or
/// them.
enum Blob {
    Stored(u64, stream::Entry),
    Bytes(Vec<u8>),
}

/// Restore the copy in `store` into `dir` (which must not hold an array), as `target` names it,
/// and the array's configuration, if the copy holds one, into `config_path`. With
/// [`Mode::OnDemand`] only the objects' tables and the small records are read now; the engine
/// then opens the array over [`hydrate::HydratingBackend`].
pub fn restore(
    shared_store: &Arc<dyn ObjectStore>,
    dir: &Path,
    config_path: Option<&Path>,
    target: &Target,
    mode: &Mode,
) -> Result<RestoreReport, RestoreError> {
    let store = shared_store.as_ref();
    let local = |source: io::Error| RestoreError::Local {
        dir: dir.display().to_string(),
        source,
    };
    if sliver_engine::holds_engine(dir) {
        return Err(RestoreError::Nothing(format!(
            "{} already holds an array: restore into a new directory",
            dir.display()
        )));
    }
    let cat = catalog::load(store)?;
    let Some(pool) = cat.pool else {
        return Err(RestoreError::Nothing(match cat.damaged.first() {
            Some(d) => d.clone(),
            None => format!("{} holds no copy of an array", store.describe()),
        }));
    };
    let span = choose(store, &cat, pool, target)?;
    // The objects from the base's start must all be there, consecutively, through the point
    // (or to the first gap, for the newest state).
    let held = cat
        .stream
        .iter()
        .find(|r| r.contains(&span.from.0))
        .cloned()
        .unwrap_or(span.from.0..span.from.0);
    let end = match span.through {
        Some(t) if t >= held.end => {
            return Err(RestoreError::Nothing(format!(
                "{} is missing stream object {} that the restore point needs (deleted, or never shipped)",
                store.describe(),
                held.end.max(span.from.0)
            )))
        }
        Some(t) => t + 1,
        None => held.end,
    };
    let mut files: Option<FileBackend> = None;
    let mut layers = Layers {
        written: [Written::default(), Written::default()],
        maps: hydrate::Maps::default(),
        applied: 0,
    };
    let mut root: Option<(Blob, bool)> = None;
    let mut root_written = false;
    let mut config: Option<(Blob, bool)> = None;
    // A newer base (a scheduled one: the stream before it is whole) started: its base records
    // repeat what the chosen base and the writes since hold, and are skipped.
    let mut newer_base = false;
    let mut last = span.from.0;
    std::fs::create_dir_all(dir).map_err(local)?;
    // What an earlier restore into this directory left before it stopped (it stored no root).
    match std::fs::remove_dir_all(dir.join(hydrate::FOLDER)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(local(e)),
        _ => {}
    }
    let mut tables = hydrate::TablesWriter::create(dir).map_err(local)?;
    prefetched(
        span.from.0..end,
        |n| fetch_table(store, n, pool),
        |n, fetched| {
            let items: Vec<(Record<'_>, From<'_>)> = match &fetched {
                Fetched::Table {
                    entries,
                    raw,
                    body_len,
                } => {
                    let at = tables.add(raw, *body_len).map_err(local)?;
                    layers.maps.tables.insert(n, at);
                    entries
                        .iter()
                        .map(|e| (e.record(&[]), From::Stored(n, *e)))
                        .collect()
                }
                Fetched::Whole(bytes) => body_records(bytes)
                    .map(|r| r.map(|r| (r, From::Bytes(r.payload()))))
                    .collect::<Result<_, _>>()
                    .map_err(|source| stream_error(n, source))?,
            };
            for (i, (r, from)) in items.into_iter().enumerate() {
                if (n, i) < span.from {
                    continue;
                }
                let len = match &from {
                    From::Stored(_, e) => u64::from(e.len()),
                    From::Bytes(b) => b.len() as u64,
                };
                if let Record::BaseStart {
                    capacity,
                    continues,
                } = r
                {
                    if files.is_none() {
                        std::fs::create_dir_all(dir).map_err(local)?;
                        files = Some(FileBackend::open(dir, capacity).map_err(local)?);
                    } else if continues {
                        newer_base = true;
                    } else if span.through.is_some() {
                        // A point never spans a restart (it waits for the restart's base).
                        return Err(RestoreError::Nothing(format!(
                            "{}: a restart of the copy inside the restore point's objects",
                            ObjectName::new(Kind::Stream, n)
                        )));
                    } else {
                        // A restart: what follows builds on a state the stream does not hold.
                        return Ok(false);
                    }
                    last = n;
                    continue;
                }
                let Some(f) = files.as_ref() else {
                    return Err(RestoreError::Nothing(format!(
                        "{}: the base index names a record that is not a base's start",
                        ObjectName::new(Kind::Stream, n)
                    )));
                };
                last = n;
                let blob = |from: From<'_>| match from {
                    From::Bytes(b) => Blob::Bytes(b.to_vec()),
                    From::Stored(object, e) => Blob::Stored(object, e),
                };
                match r {
                    Record::Log { offset, base, .. } | Record::Meta { offset, base, .. } => {
                        if base && newer_base {
                            continue;
                        }
                        let area = if matches!(r, Record::Log { .. }) {
                            Area::Log
                        } else {
                            Area::Meta
                        };
                        layers
                            .place(f, area, offset, len, from, base)
                            .map_err(local)?;
                    }
                    Record::Root { base, .. } => {
                        if !(base && (root_written || newer_base)) {
                            root = Some((blob(from), base));
                        }
                        root_written |= !base;
                    }
                    Record::Config { base, .. } => {
                        let newer_held = config.as_ref().is_some_and(|c| !c.1);
                        if !(base && (newer_held || newer_base)) {
                            config = Some((blob(from), base));
                        }
                    }
                    Record::Discard { offset, len } => {
                        f.discard(offset, len).map_err(local)?;
                        layers.maps.log.remove(offset, len);
                        layers.written[Area::Log as usize].add(offset, len);
                    }
                    Record::BaseStart { .. } | Record::BaseEnd => {}
                }
            }
            Ok(true)
        },
    )?;
    let files = files.ok_or_else(|| {
        RestoreError::Nothing(format!(
            "{}: no base starts where the catalog says",
            store.describe()
        ))
    })?;
    let blob_bytes = |b: Blob| -> Result<Vec<u8>, RestoreError> {
        match b {
            Blob::Bytes(b) => Ok(b),
            Blob::Stored(n, e) => fetch_payload(store, n, &e),
        }
    };
    let root = root
        .map(|(b, _)| blob_bytes(b))
        .transpose()?
        .ok_or_else(|| {
            RestoreError::Nothing(format!(
                "{}: no root in stream objects {}..{last}: no array to restore there (not yet created, or its base incomplete{})",
                store.describe(),
                span.from.0,
                if span.through.is_none() && held.end <= last + 1 && cat.stream.iter().any(|r| r.start > last) {
                    format!("; stream object {} is missing", last + 1)
                } else {
                    String::new()
                }
            ))
        })?;
    let config = config.map(|(b, _)| blob_bytes(b)).transpose()?;
    let on_demand = layers.maps.bytes();
    // A pin on the objects still to fetch keeps the source's retention off them while the
    // restored array hydrates. A store that refuses it (read-only credentials) is said.
    let mut pin_error = None;
    let pin = match mode {
        Mode::OnDemand { .. } if !layers.maps.is_empty() => {
            let pin = catalog::Pin {
                number: rand::random::<u64>() | 1,
                expires_ms: 0,
                first: span.from.0,
                through: last,
            };
            match catalog::put_pin(store, pool, &pin, SystemClock.wall_ms()) {
                Ok(()) => Some(pin),
                Err(e) => {
                    pin_error = Some(e.to_string());
                    None
                }
            }
        }
        _ => None,
    };
    let source = hydrate::Source {
        pin,
        url: match mode {
            Mode::OnDemand { url, .. } => url.clone(),
            Mode::Whole => store.describe(),
        },
        endpoint: match mode {
            Mode::OnDemand { endpoint, .. } => endpoint.clone(),
            Mode::Whole => None,
        },
        pool,
    };
    files.sync().map_err(local)?;
    files.meta_sync().map_err(local)?;
    tables.finish().map_err(local)?;
    if layers.maps.is_empty() {
        // Everything was applied at once (objects in the interleaved layout): an ordinary
        // array, with nothing to fetch.
        std::fs::remove_dir_all(dir.join(hydrate::FOLDER)).map_err(local)?;
    } else {
        hydrate::save(dir, &source, &layers.maps).map_err(local)?;
    }
    let files = if *mode == Mode::Whole && !layers.maps.is_empty() {
        // The same fetches a serving array makes, on this thread, to the end.
        let h = hydrate::HydratingBackend::open(
            dir,
            files,
            Arc::clone(shared_store),
            hydrate::HydrateConfig::default(),
        )
        .map_err(local)?;
        h.hydrate_all(PREFETCH).map_err(local)?;
        drop(h);
        FileBackend::open(dir, 0).map_err(local)?
    } else {
        files
    };
    if let (Some(path), Some(bytes)) = (config_path, &config) {
        let tmp = path.with_extension("restoring");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(local)?;
    }
    // The root last: until it is there the directory holds no array.
    files.store_root(&root).map_err(local)?;
    Ok(RestoreReport {
        pool,
        first: span.from.0,
        last,
        // Everything newer that the store holds and the restore could not use.
        left_out: if span.through.is_none() {
            cat.stream
                .iter()
                .map(|r| r.end.saturating_sub(r.start.max(last + 1)))
                .sum()
        } else {
            0
        },
        missing: (span.through.is_none() && cat.stream.iter().any(|r| r.start > held.end))
            .then_some(held.end),
        bytes_applied: layers.applied,
        bytes_on_demand: on_demand,
        pin_error,
        config: config.is_some(),
        point: span.point,
    })
}

/// A record's payload, checked against its table entry.
fn fetch_payload(
    store: &dyn ObjectStore,
    n: u64,
    e: &stream::Entry,
) -> Result<Vec<u8>, RestoreError> {
    let name = ObjectName::new(Kind::Stream, n).to_string();
    let at = object::HEADER_BYTES as u64 + e.pos;
    let bytes = store.get_range(&name, at..at + u64::from(e.len()))?;
    if bytes.len() != e.len() as usize || crc32c::crc32c(&bytes) != e.crc {
        return Err(RestoreError::Nothing(format!(
            "{name}: the payload at {} does not match its table's checksum: the object is damaged",
            e.pos
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::Written;

    #[test]
    fn written_ranges_merge_and_leave_the_uncovered_parts() {
        let mut w = Written::default();
        w.add(10, 10); // 10..20
        w.add(30, 5); // 30..35
        assert_eq!(w.uncovered(0, 40), vec![(0, 10), (20, 10), (35, 5)]);
        assert_eq!(w.uncovered(12, 5), vec![]);
        assert_eq!(w.uncovered(15, 20), vec![(20, 10)]);
        w.add(18, 13); // 10..35 merged
        assert_eq!(w.0.len(), 1);
        assert_eq!(w.uncovered(0, 40), vec![(0, 10), (35, 5)]);
        w.add(0, 10); // touching: 0..35
        assert_eq!(w.uncovered(0, 40), vec![(35, 5)]);
    }
}
