//! The two files in the data directory that say whether a start continues the stream:
//! `replication-pool` (the pool's identity, kept for good) and `replication-state` (written by
//! a clean stop that shipped everything, taken away at start).

use std::io;
use std::path::{Path, PathBuf};

const POOL_FILE: &str = "replication-pool";
const STATE_FILE: &str = "replication-state";

/// What a start reads from the data directory before it talks to the store.
#[derive(Debug, PartialEq)]
pub(super) struct LocalState {
    /// The pool this array ships, if it ever did.
    pub(super) ours: Option<[u8; 16]>,
    /// The clean stop's mark (pool, last object, capacity), taken away.
    pub(super) clean: Option<([u8; 16], u64, u64)>,
}

/// Why the local files could not be read or written.
#[derive(Debug)]
pub(super) enum LocalError {
    Io(io::Error),
    /// The pool file does not hold a pool's identity: which copy in the store is this
    /// array's cannot be told, so nothing may be shipped over it.
    DamagedPool(PathBuf),
}

impl From<io::Error> for LocalError {
    fn from(e: io::Error) -> Self {
        LocalError::Io(e)
    }
}

/// Read the pool file and take the clean stop's mark away, durably, before anything else: a
/// crash from here on leaves none, so the next start takes a base. A damaged mark is no mark.
pub(super) fn take(dir: &Path) -> Result<LocalState, LocalError> {
    let pool_path = dir.join(POOL_FILE);
    let ours = match std::fs::read_to_string(&pool_path) {
        Ok(t) => Some(parse_pool(&t).ok_or(LocalError::DamagedPool(pool_path))?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let state_path = dir.join(STATE_FILE);
    let clean = match std::fs::read_to_string(&state_path) {
        Ok(t) => {
            std::fs::remove_file(&state_path)?;
            std::fs::File::open(dir)?.sync_all()?;
            parse_state(&t)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    Ok(LocalState { ours, clean })
}

/// Record the pool this array ships from now on.
pub(super) fn record_pool(dir: &Path, pool: &[u8; 16]) -> io::Result<()> {
    write_synced(dir, POOL_FILE, &crate::object::hex(pool))
}

/// Record a clean stop: everything up to stream object `last` is in the store, from an array
/// of `capacity` bytes.
pub(super) fn record_clean_stop(
    dir: &Path,
    pool: &[u8; 16],
    last: u64,
    capacity: u64,
) -> io::Result<()> {
    let text = format!(
        "pool {}\nlast {last}\ncapacity {capacity}\n",
        crate::object::hex(pool)
    );
    write_synced(dir, STATE_FILE, &text)
}

/// Replace `name` in `dir` with `text` so that a crash leaves the old file or the new one.
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

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: [u8; 16] = *b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\xfd\xfe\xff";

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn an_empty_directory_has_no_pool_and_no_clean_stop() {
        let d = dir();
        let local = take(d.path()).unwrap();
        assert_eq!(
            local,
            LocalState {
                ours: None,
                clean: None
            }
        );
    }

    #[test]
    fn the_pool_is_kept_for_good() {
        let d = dir();
        record_pool(d.path(), &POOL).unwrap();
        for _ in 0..2 {
            assert_eq!(take(d.path()).unwrap().ours, Some(POOL));
        }
        assert!(!d.path().join("replication-pool.tmp").exists());
    }

    #[test]
    fn a_clean_stop_is_read_once() {
        let d = dir();
        record_clean_stop(d.path(), &POOL, 4711, 1 << 40).unwrap();
        let first = take(d.path()).unwrap();
        assert_eq!(first.clean, Some((POOL, 4711, 1 << 40)));
        assert!(!d.path().join(STATE_FILE).exists());
        assert_eq!(take(d.path()).unwrap().clean, None);
    }

    #[test]
    fn a_damaged_pool_file_is_refused() {
        let d = dir();
        for text in ["", "00", &"zz".repeat(16), &"0".repeat(33)] {
            std::fs::write(d.path().join(POOL_FILE), text).unwrap();
            match take(d.path()) {
                Err(LocalError::DamagedPool(p)) => assert!(p.ends_with(POOL_FILE)),
                other => panic!("{text:?} was read as {other:?}"),
            }
        }
    }

    #[test]
    fn a_damaged_clean_stop_is_no_clean_stop_and_is_taken_away_too() {
        let d = dir();
        let good = format!(
            "pool {}\nlast 9\ncapacity 4096\n",
            crate::object::hex(&POOL)
        );
        let damaged = [
            good.replace("last 9", "last nine"),
            good.replace("capacity 4096\n", ""),
            good.replace("pool ", "pool 00"),
            format!("{good}extra line\n"),
            String::new(),
        ];
        for text in damaged {
            std::fs::write(d.path().join(STATE_FILE), &text).unwrap();
            assert_eq!(take(d.path()).unwrap().clean, None, "{text:?}");
            assert!(!d.path().join(STATE_FILE).exists());
        }
        std::fs::write(d.path().join(STATE_FILE), &good).unwrap();
        assert_eq!(take(d.path()).unwrap().clean, Some((POOL, 9, 4096)));
    }
}
