//! Restore a whole copy (RFC 0003, "Revision: shipping the backend's writes"): the stream's
//! consecutive objects, from the start of the last complete base to the end (or to the start of
//! a base that never completed, whose records follow a local state the stream does not hold),
//! applied to new files in a data directory. The engine then opens them as after a crash.

use crate::object::{self, Expected, Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use crate::stream::{self, Record};
use sliver_engine::{Backend, FileBackend};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

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
    /// Whether the copy held the array's configuration (written to the path given).
    pub config: bool,
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

/// Apply `bytes` at `offset` through `write`: a write since the base started wholly (and
/// remembered), a base's bytes only where no such write went.
fn layer(
    written: &mut Written,
    offset: u64,
    bytes: &[u8],
    base: bool,
    write: impl Fn(&[u8], u64) -> io::Result<()>,
) -> io::Result<()> {
    if !base {
        written.add(offset, bytes.len() as u64);
        return write(bytes, offset);
    }
    for (o, len) in written.uncovered(offset, bytes.len() as u64) {
        let at = (o - offset) as usize;
        write(&bytes[at..at + len as usize], o)?;
    }
    Ok(())
}

/// Restore the copy in `store` into `dir` (which must not hold an array), and the array's
/// configuration, if the copy holds one, into `config_path`.
pub fn restore(
    store: &dyn ObjectStore,
    dir: &Path,
    config_path: Option<&Path>,
) -> Result<RestoreReport, RestoreError> {
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
    let mut numbers: Vec<u64> = store
        .list(Kind::Stream.folder())?
        .iter()
        .filter_map(|n| ObjectName::parse(n))
        .filter(|n| n.kind == Kind::Stream)
        .map(|n| n.number)
        .collect();
    numbers.sort_unstable();
    let Some(&first) = numbers.first() else {
        return Err(RestoreError::Nothing(format!(
            "{} holds no copy of an array",
            store.describe()
        )));
    };
    // The consecutive run from the first object: a gap ends what a restore may use.
    let run = numbers
        .iter()
        .enumerate()
        .take_while(|&(i, &n)| n == first + i as u64)
        .count() as u64;
    let fetch = |n: u64, pool: Option<[u8; 16]>| -> Result<(Vec<u8>, [u8; 16]), RestoreError> {
        let name = ObjectName::new(Kind::Stream, n).to_string();
        let bytes = store.get(&name)?;
        let header = object::decode_header(&name, &bytes)?;
        let expected = Expected {
            array: pool.unwrap_or(header.array),
            kind: Kind::Stream,
            number: n,
        };
        object::decode(&name, &bytes, &expected)?;
        Ok((bytes, header.array))
    };
    // Pass 1: where bases start and end.
    let mut pool = None;
    let mut starts = Vec::new();
    let mut complete = Vec::new();
    for n in first..first + run {
        let (bytes, p) = fetch(n, pool)?;
        pool = Some(p);
        for (i, r) in stream::records(&bytes[object::HEADER_BYTES..]).enumerate() {
            let r = r.map_err(|source| RestoreError::Stream {
                name: ObjectName::new(Kind::Stream, n).to_string(),
                source,
            })?;
            match r {
                Record::BaseStart { .. } => starts.push((n, i)),
                Record::BaseEnd => {
                    if let Some(&s) = starts.last() {
                        complete.push(s);
                    }
                }
                _ => {}
            }
        }
    }
    let pool = pool.expect("at least one object");
    let Some(&from) = complete.last() else {
        return Err(RestoreError::Nothing(format!(
            "{} holds no complete copy yet (its first base is still being shipped)",
            store.describe()
        )));
    };
    // A newer base that never completed: what follows it belongs to a local state the stream
    // does not hold.
    let until = starts.iter().copied().find(|&s| s > from);
    // Pass 2: apply.
    let mut backend: Option<FileBackend> = None;
    let mut log_written = Written::default();
    let mut meta_written = Written::default();
    let mut root_written = false;
    let mut config: Option<(Vec<u8>, bool)> = None;
    let mut applied = 0u64;
    let mut last = from.0;
    'objects: for n in from.0..first + run {
        let (bytes, _) = fetch(n, Some(pool))?;
        for (i, r) in stream::records(&bytes[object::HEADER_BYTES..]).enumerate() {
            if (n, i) < from {
                continue;
            }
            if Some((n, i)) == until {
                break 'objects;
            }
            let r = r.map_err(|source| RestoreError::Stream {
                name: ObjectName::new(Kind::Stream, n).to_string(),
                source,
            })?;
            last = n;
            if let Record::BaseStart { capacity } = r {
                std::fs::create_dir_all(dir).map_err(local)?;
                backend = Some(FileBackend::open(dir, capacity).map_err(local)?);
                continue;
            }
            let b = backend.as_ref().expect("the base starts first");
            match r {
                Record::Log {
                    offset,
                    bytes,
                    base,
                } => {
                    applied += bytes.len() as u64;
                    layer(&mut log_written, offset, bytes, base, |d, o| {
                        b.write_at(d, o)
                    })
                    .map_err(local)?;
                }
                Record::Meta {
                    offset,
                    bytes,
                    base,
                } => {
                    applied += bytes.len() as u64;
                    layer(&mut meta_written, offset, bytes, base, |d, o| {
                        b.meta_write(d, o)
                    })
                    .map_err(local)?;
                }
                Record::Root { bytes, base } => {
                    if !(base && root_written) {
                        b.store_root(bytes).map_err(local)?;
                    }
                    root_written |= !base;
                }
                Record::Config { bytes, base } => {
                    if !(base && config.as_ref().is_some_and(|c| !c.1)) {
                        config = Some((bytes.to_vec(), base));
                    }
                }
                Record::Discard { offset, len } => {
                    b.discard(offset, len).map_err(local)?;
                    log_written.add(offset, len);
                }
                Record::BaseStart { .. } | Record::BaseEnd => {}
            }
        }
    }
    let b = backend.expect("a complete base was applied");
    b.sync().map_err(local)?;
    b.meta_sync().map_err(local)?;
    if let (Some(path), Some((bytes, _))) = (config_path, &config) {
        let tmp = path.with_extension("restoring");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(local)?;
    }
    Ok(RestoreReport {
        pool,
        first: from.0,
        last,
        left_out: first + run - 1 - last,
        bytes_applied: applied,
        config: config.is_some(),
    })
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
