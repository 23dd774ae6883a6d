//! What every block may hold after a crash, and the block contents that make each version
//! recognisable.
//!
//! Every version of a block is a [`Vid`]: 0 is all zeros (never written, unmapped, zeroed),
//! anything else names one block written by one command in one cycle, and its 512 bytes are a
//! pure function of the vid ([`fill_block`]), so a block read back identifies the version it
//! holds ([`identify`]) or is recognisably garbage.
//!
//! Per block the model keeps a history: the first entry is the last *durable* version, the
//! others were written after it, in order (the harness never has two commands touching one
//! block in flight at once, so order is well defined). A command's entries are added when it is
//! submitted and marked done, with a sequence number, when its GOOD status arrives. Then:
//!
//! - a write completed with FUA becomes the durable version of its blocks;
//! - a SYNCHRONIZE CACHE of a LUN, completed GOOD, makes durable, for every block of that LUN,
//!   the last version whose command had completed before the SYNCHRONIZE CACHE was issued;
//! - a command that was not executed (UNIT ATTENTION, BUSY) leaves no entry;
//! - a command in flight at the kill keeps its entry: its blocks may hold it or not.
//!
//! After a crash a block may hold any version of its history (the durable one or a later one),
//! and nothing else. Verification reads the block and then *settles* the history to what it
//! read: that is the state the next cycle starts from.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// A block version; 0 is all zeros.
pub type Vid = u64;
/// The version of a block that reads as zeros.
pub const ZEROS: Vid = 0;
/// Logical block size the harness uses.
pub const BLOCK: usize = 512;

const MAGIC: [u8; 8] = *b"SLVTORT1";

/// The version of block `index` of command `op` in cycle `cycle` (never 0 for cycle >= 1).
pub fn make_vid(cycle: u32, op: u64, index: u32) -> Vid {
    ((u64::from(cycle) & 0xf_ffff) << 44) | ((op & 0xfff_ffff) << 16) | u64::from(index & 0xffff)
}

/// "zeros" or "cycle C op O block I".
pub fn describe_vid(vid: Vid) -> String {
    if vid == ZEROS {
        "zeros".into()
    } else {
        format!(
            "c{}/op{}/b{}",
            vid >> 44,
            (vid >> 16) & 0xfff_ffff,
            vid & 0xffff
        )
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes the 512 bytes of version `vid` into `out`.
pub fn fill_block(vid: Vid, out: &mut [u8]) {
    assert_eq!(out.len(), BLOCK);
    if vid == ZEROS {
        out.fill(0);
        return;
    }
    out[..8].copy_from_slice(&MAGIC);
    out[8..16].copy_from_slice(&vid.to_be_bytes());
    let mut state = vid;
    for word in out[16..].chunks_exact_mut(8) {
        word.copy_from_slice(&splitmix(&mut state).to_le_bytes());
    }
}

/// The 512 bytes of version `vid`.
pub fn block_of(vid: Vid) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    fill_block(vid, &mut b);
    b
}

/// Blocks of the given versions, concatenated (a write's Data-Out).
pub fn blocks_of(vids: &[Vid]) -> Vec<u8> {
    let mut data = vec![0u8; vids.len() * BLOCK];
    for (v, out) in vids.iter().zip(data.chunks_exact_mut(BLOCK)) {
        fill_block(*v, out);
    }
    data
}

/// The version a block read back holds, or `None` when it is no version at all (torn, mixed,
/// stale garbage).
pub fn identify(block: &[u8]) -> Option<Vid> {
    if block.len() != BLOCK {
        return None;
    }
    if block.iter().all(|&b| b == 0) {
        return Some(ZEROS);
    }
    if block[..8] != MAGIC {
        return None;
    }
    let vid = u64::from_be_bytes(block[8..16].try_into().ok()?);
    if vid == ZEROS {
        return None;
    }
    let mut expected = [0u8; BLOCK];
    fill_block(vid, &mut expected);
    (expected[..] == *block).then_some(vid)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    vid: Vid,
    /// The token of the command that wrote it (0: the durable base).
    token: u64,
    /// Sequence number of its completion; `None` while in flight (or lost in a crash).
    done: Option<u64>,
}

const BASE: Entry = Entry {
    vid: ZEROS,
    token: 0,
    done: Some(0),
};

/// The model of one LUN.
#[derive(Clone, Debug, Default)]
pub struct LunModel {
    blocks: HashMap<u64, Vec<Entry>>,
    /// Blocks whose history has more than the durable entry.
    dirty: HashSet<u64>,
}

impl LunModel {
    fn history(&mut self, lba: u64) -> &mut Vec<Entry> {
        self.blocks.entry(lba).or_insert_with(|| vec![BASE])
    }
    fn tidy(&mut self, lba: u64) {
        if self.blocks.get(&lba).is_some_and(|h| h.len() > 1) {
            self.dirty.insert(lba);
        } else {
            self.dirty.remove(&lba);
        }
    }
}

/// A block that does not hold a version it may hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub lun: u64,
    pub lba: u64,
    /// What it holds (`None`: no recognisable version).
    pub found: Option<Vid>,
    pub allowed: Vec<Vid>,
    /// The block's first 16 bytes.
    pub head: Vec<u8>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allowed: Vec<String> = self.allowed.iter().map(|v| describe_vid(*v)).collect();
        match self.found {
            Some(v) => write!(
                f,
                "LUN {} LBA {} holds version {} which is not allowed (allowed: {})",
                self.lun,
                self.lba,
                describe_vid(v),
                allowed.join(", ")
            ),
            None => {
                let head: Vec<String> = self.head.iter().map(|b| format!("{b:02x}")).collect();
                write!(
                    f,
                    "LUN {} LBA {} holds unrecognisable data (starts {}; allowed: {})",
                    self.lun,
                    self.lba,
                    head.join(""),
                    allowed.join(", ")
                )
            }
        }
    }
}

/// The model of every LUN the harness drives.
#[derive(Debug, Default)]
pub struct Model {
    seq: u64,
    luns: BTreeMap<u64, LunModel>,
}

impl Model {
    pub fn new() -> Self {
        Self::default()
    }

    fn tick(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn add_lun(&mut self, lun: u64) {
        self.luns.entry(lun).or_default();
    }

    pub fn remove_lun(&mut self, lun: u64) {
        self.luns.remove(&lun);
    }

    /// `to` becomes a copy of `from` (a snapshot or clone taken while the array is stopped).
    pub fn clone_lun(&mut self, from: u64, to: u64) {
        let copy = self.luns.get(&from).cloned().unwrap_or_default();
        self.luns.insert(to, copy);
    }

    pub fn luns(&self) -> Vec<u64> {
        self.luns.keys().copied().collect()
    }

    fn lun(&mut self, lun: u64) -> &mut LunModel {
        self.luns.entry(lun).or_default()
    }

    /// The version the live array holds now (last completed write); untouched blocks are zeros.
    pub fn current(&self, lun: u64, lba: u64) -> Vid {
        self.luns
            .get(&lun)
            .and_then(|m| m.blocks.get(&lba))
            .and_then(|h| h.iter().rev().find(|e| e.done.is_some()))
            .map_or(ZEROS, |e| e.vid)
    }

    /// A token for a new command (strictly increasing).
    pub fn begin(&mut self) -> u64 {
        self.tick()
    }

    /// Command `token` is about to write `vids` at `lba`.
    pub fn stage(&mut self, token: u64, lun: u64, lba: u64, vids: &[Vid]) {
        let m = self.lun(lun);
        for (i, &vid) in vids.iter().enumerate() {
            let b = lba + i as u64;
            m.history(b).push(Entry {
                vid,
                token,
                done: None,
            });
            m.dirty.insert(b);
        }
    }

    /// Command `token` completed GOOD for `blocks` blocks at `lba`; `durable` with FUA.
    pub fn complete(&mut self, token: u64, lun: u64, lba: u64, blocks: u64, durable: bool) {
        let seq = self.tick();
        let m = self.lun(lun);
        for b in lba..lba + blocks {
            let h = m.history(b);
            if let Some(i) = h.iter().rposition(|e| e.token == token) {
                h[i].done = Some(seq);
                if durable {
                    h.drain(..i);
                }
            }
            m.tidy(b);
        }
    }

    /// Command `token` was not executed: its entries go.
    pub fn abandon(&mut self, token: u64, lun: u64, lba: u64, blocks: u64) {
        let m = self.lun(lun);
        for b in lba..lba + blocks {
            let h = m.history(b);
            if let Some(i) = h.iter().rposition(|e| e.token == token) {
                h.remove(i);
            }
            m.tidy(b);
        }
    }

    /// A SYNCHRONIZE CACHE is being issued; returns its sequence number.
    pub fn flush_issued(&mut self) -> u64 {
        self.tick()
    }

    /// The SYNCHRONIZE CACHE issued at `issued` on `lun` completed GOOD.
    pub fn flush_completed(&mut self, lun: u64, issued: u64) {
        let m = self.lun(lun);
        let dirty: Vec<u64> = m.dirty.iter().copied().collect();
        for b in dirty {
            let h = m.history(b);
            if let Some(i) = h.iter().rposition(|e| e.done.is_some_and(|d| d < issued)) {
                h.drain(..i);
            }
            m.tidy(b);
        }
    }

    /// The versions the block may hold after a crash, durable one first.
    pub fn allowed(&self, lun: u64, lba: u64) -> Vec<Vid> {
        match self.luns.get(&lun).and_then(|m| m.blocks.get(&lba)) {
            Some(h) => {
                let mut v: Vec<Vid> = Vec::with_capacity(h.len());
                for e in h {
                    if !v.contains(&e.vid) {
                        v.push(e.vid);
                    }
                }
                v
            }
            None => vec![ZEROS],
        }
    }

    /// Checks a block read back; returns the version it holds.
    pub fn check(&self, lun: u64, lba: u64, block: &[u8]) -> Result<Vid, Mismatch> {
        let found = identify(block);
        let allowed = self.allowed(lun, lba);
        match found {
            Some(v) if allowed.contains(&v) => Ok(v),
            _ => Err(Mismatch {
                lun,
                lba,
                found,
                allowed,
                head: block.iter().take(16).copied().collect(),
            }),
        }
    }

    /// The block holds `vid`, durably: its history collapses to that.
    pub fn settle(&mut self, lun: u64, lba: u64, vid: Vid) {
        let m = self.lun(lun);
        m.blocks.insert(
            lba,
            vec![Entry {
                vid,
                token: 0,
                done: Some(0),
            }],
        );
        m.dirty.remove(&lba);
    }

    /// Every block of `lun` ever written, sorted.
    pub fn touched(&self, lun: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .luns
            .get(&lun)
            .map(|m| m.blocks.keys().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Blocks of `lun` whose content after a crash is not yet certain.
    pub fn uncertain(&self, lun: u64) -> usize {
        self.luns.get(&lun).map_or(0, |m| m.dirty.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_identify_their_version() {
        let v = make_vid(3, 77, 5);
        let b = block_of(v);
        assert_eq!(identify(&b), Some(v));
        assert_eq!(identify(&[0u8; BLOCK]), Some(ZEROS));
        let mut torn = b.clone();
        torn[300] ^= 1;
        assert_eq!(identify(&torn), None);
        let mut mixed = b.clone();
        mixed[256..].copy_from_slice(&block_of(make_vid(3, 78, 5))[256..]);
        assert_eq!(identify(&mixed), None);
        assert_eq!(describe_vid(v), "c3/op77/b5");
        assert_ne!(make_vid(1, 0, 0), ZEROS);
    }

    #[test]
    fn flush_and_fua_make_versions_durable() {
        let mut m = Model::new();
        let (a, b, c) = (make_vid(1, 1, 0), make_vid(1, 2, 0), make_vid(1, 3, 0));
        let t = m.begin();
        m.stage(t, 0, 10, &[a]);
        assert_eq!(m.allowed(0, 10), vec![ZEROS, a]);
        assert_eq!(m.current(0, 10), ZEROS);
        m.complete(t, 0, 10, 1, false);
        assert_eq!(m.current(0, 10), a);
        let f = m.flush_issued();
        // b completes after the flush was issued: not covered by it.
        let t = m.begin();
        m.stage(t, 0, 10, &[b]);
        m.complete(t, 0, 10, 1, false);
        m.flush_completed(0, f);
        assert_eq!(m.allowed(0, 10), vec![a, b]);
        // A flush of another LUN changes nothing here.
        let f = m.flush_issued();
        m.flush_completed(1, f);
        assert_eq!(m.allowed(0, 10), vec![a, b]);
        // FUA: durable at once.
        let t = m.begin();
        m.stage(t, 0, 10, &[c]);
        m.complete(t, 0, 10, 1, true);
        assert_eq!(m.allowed(0, 10), vec![c]);
        assert_eq!(m.uncertain(0), 0);
        // Not executed: no trace.
        let t = m.begin();
        m.stage(t, 0, 10, &[a]);
        m.abandon(t, 0, 10, 1);
        assert_eq!(m.allowed(0, 10), vec![c]);
    }

    #[test]
    fn versions_outside_the_allowed_set_are_reported() {
        let mut m = Model::new();
        let (a, b) = (make_vid(1, 1, 0), make_vid(1, 2, 0));
        let t = m.begin();
        m.stage(t, 2, 5, &[a]);
        m.complete(t, 2, 5, 1, true);
        assert_eq!(m.check(2, 5, &block_of(a)), Ok(a));
        let e = m.check(2, 5, &block_of(b)).unwrap_err();
        assert_eq!(e.found, Some(b));
        assert!(e.to_string().contains("not allowed"), "{e}");
        // Lost durable data: the block reads as zeros.
        assert!(m.check(2, 5, &[0u8; BLOCK]).is_err());
        // Garbage.
        assert_eq!(m.check(2, 5, &[0xee; BLOCK]).unwrap_err().found, None);
        // Settling collapses to what was read.
        let t = m.begin();
        m.stage(t, 2, 5, &[b]);
        m.settle(2, 5, a);
        assert_eq!(m.allowed(2, 5), vec![a]);
    }
}
