//! The two files in the data directory that say whether a start continues the stream:
//! `replication-pool` and `replication-state`.

use std::io;
use std::path::Path;

pub(super) fn write_synced(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

pub(super) fn parse_pool(text: &str) -> Option<[u8; 16]> {
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

/// What a start reads from the data directory before it talks to the store.
pub(super) struct LocalState {
    /// The pool this array ships, if it ever did.
    pub(super) ours: Option<[u8; 16]>,
    /// The clean stop's mark (pool, last object, capacity), taken away.
    pub(super) clean: Option<([u8; 16], u64, u64)>,
}

pub(super) fn parse_state(text: &str) -> Option<([u8; 16], u64, u64)> {
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
