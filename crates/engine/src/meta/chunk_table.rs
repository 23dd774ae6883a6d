//! The chunk table in pages (RFC 0001): chunk id -> fingerprint, place in the log, stored
//! length and reference count, 128 entries to a 4 KiB page of the [`Pager`].
//!
//! Ids are 64-bit and reused *page by page*: new ids are taken in order from one page until it
//! is full, then from the lowest page at least half free, else from a fresh page at the end.
//! Chunks written together therefore share pages (a 1 MiB write of new data dirties two pages,
//! not 256), every page stays at least half full whatever the history of overwrites, and the
//! table stays a dense array with O(1) lookups. A slot is free when its length is 0.
//!
//! What the table keeps in RAM is per page, not per chunk: the count of live entries of each
//! page (2 bytes, a table of its own kept whole in RAM) and the set of pages at least half
//! free.

use super::pager::{Entry, Pager, Table};
use super::resident::ResidentTable;
use super::tables::{CHUNK_LIVE, CHUNK_TABLE};
use super::ApplyError;
use std::collections::BTreeSet;

/// Entries per page.
pub const PER_PAGE: u64 = Table::<ChunkEntry>::PER_PAGE;

/// A stored chunk. `len == 0` marks a free slot (whose other fields are left over and mean
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkEntry {
    pub hash: [u8; 16],
    pub segment: u32,
    pub offset: u32,
    /// Length of the whole Chunk record in the log.
    pub len: u32,
    /// Map leaf instances naming the chunk. Saturates: a chunk that reached `u32::MAX` is
    /// kept forever rather than freed while something may still name it.
    pub refs: u32,
}

impl Entry for ChunkEntry {
    const SIZE: usize = 32;
    fn read(b: &[u8]) -> Self {
        let u = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        ChunkEntry {
            hash: b[..16].try_into().unwrap(),
            segment: u(16),
            offset: u(20),
            len: u(24),
            refs: u(28),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[..16].copy_from_slice(&self.hash);
        b[16..20].copy_from_slice(&self.segment.to_le_bytes());
        b[20..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.refs.to_le_bytes());
    }
}

type Result<T> = std::result::Result<T, ApplyError>;

const TABLE: Table<ChunkEntry> = Table::new(CHUNK_TABLE);

/// Id 0 means "unmapped" in maps and is never a chunk.
const FIRST_ID: u64 = 1;

/// Pages a new id may lie beyond the table's end: batches that failed after their ids were
/// taken (a log write refused by a full file system) leave gaps that replay must accept.
const MAX_PAGE_GAP: u64 = 1 << 16;

pub struct ChunkTable {
    /// Live entries per page.
    live: ResidentTable<u16>,
    /// Live entries in all.
    count: u64,
    /// Pages below the end that are at least half free: new ids come from these first.
    roomy: BTreeSet<u64>,
    /// The page ids are being taken from and the next slot to try.
    cursor: Option<(u64, u64)>,
}

impl ChunkTable {
    pub fn new() -> Self {
        ChunkTable::from_live(ResidentTable::new(CHUNK_LIVE))
    }

    /// A table whose pages hold the live entries `live` counts (as a checkpoint recorded them).
    pub fn from_live(live: ResidentTable<u16>) -> Self {
        let roomy = live
            .as_slice()
            .iter()
            .enumerate()
            .filter(|&(_, &n)| (n as u64) <= PER_PAGE / 2)
            .map(|(p, _)| p as u64)
            .collect();
        let count = live.as_slice().iter().map(|&n| n as u64).sum();
        ChunkTable {
            live,
            count,
            roomy,
            cursor: None,
        }
    }

    pub fn live_counts(&self) -> &[u16] {
        self.live.as_slice()
    }

    /// The live counts' table, for checkpoints.
    pub fn live_table(&mut self) -> &mut ResidentTable<u16> {
        &mut self.live
    }

    /// Pages of the table.
    pub fn pages(&self) -> u64 {
        self.live.len()
    }

    /// Chunks stored.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The chunk with this id, if it is stored.
    pub fn get(&self, pager: &mut Pager, id: u64) -> Result<Option<ChunkEntry>> {
        if id < FIRST_ID || id / PER_PAGE >= self.live.len() {
            return Ok(None);
        }
        let e = TABLE.get(pager, id)?;
        Ok((e.len != 0).then_some(e))
    }

    /// An id for a new chunk (live path only: replay takes ids from the records). Ids handed
    /// out are distinct until the next [`ChunkTable::reset_allocation`] even if they are never
    /// stored: a batch that fails leaves its ids free in a page the allocator comes back to.
    pub fn allocate(&mut self, pager: &mut Pager) -> Result<u64> {
        loop {
            let (page, slot) = match self.cursor {
                Some(c) => c,
                None => {
                    let page = match self.roomy.pop_first() {
                        Some(p) => p,
                        None => self.live.push(0),
                    };
                    (page, 0)
                }
            };
            if slot >= PER_PAGE {
                self.cursor = None;
                continue;
            }
            self.cursor = Some((page, slot + 1));
            let id = page * PER_PAGE + slot;
            if id >= FIRST_ID && TABLE.get(pager, id)?.len == 0 {
                return Ok(id);
            }
        }
    }

    /// Forget where allocation stands (after replay, whose records placed ids themselves).
    pub fn reset_allocation(&mut self) {
        if let Some((page, _)) = self.cursor.take() {
            self.note_room(page);
        }
    }

    fn note_room(&mut self, page: u64) {
        if self.cursor.map(|c| c.0) != Some(page) && (self.live.get(page) as u64) <= PER_PAGE / 2 {
            self.roomy.insert(page);
        }
    }

    /// Store a chunk at `id`: new (refs 0), or moved by the collector (same fingerprint, new
    /// place; refs kept). Returns the entry it replaced when it moved one.
    pub fn put(
        &mut self,
        pager: &mut Pager,
        id: u64,
        hash: [u8; 16],
        segment: u32,
        offset: u32,
        len: u32,
    ) -> Result<Option<ChunkEntry>> {
        if id < FIRST_ID || len == 0 {
            return Err(ApplyError::Inconsistent(format!(
                "chunk {id} of length {len} cannot be stored"
            )));
        }
        let page = id / PER_PAGE;
        // Ids are handed out densely (a batch takes its ids only once its room is reserved),
        // so an id far past the end is damage, not a reason to grow the table by gigabytes.
        if page > self.live.len() + MAX_PAGE_GAP {
            return Err(ApplyError::Inconsistent(format!(
                "chunk id {id} far beyond the {} pages in use",
                self.live.len()
            )));
        }
        while self.live.len() <= page {
            let p = self.live.push(0);
            if p != page {
                self.note_room(p);
            }
        }
        let old = TABLE.get(pager, id)?;
        if old.len != 0 {
            if old.hash != hash {
                return Err(ApplyError::Inconsistent(format!(
                    "chunk {id} rewritten with other content"
                )));
            }
            TABLE.set(
                pager,
                id,
                ChunkEntry {
                    segment,
                    offset,
                    len,
                    ..old
                },
            )?;
            return Ok(Some(old));
        }
        TABLE.set(
            pager,
            id,
            ChunkEntry {
                hash,
                segment,
                offset,
                len,
                refs: 0,
            },
        )?;
        self.live.update(page, |n| *n += 1);
        self.count += 1;
        if self.live.get(page) as u64 > PER_PAGE / 2 {
            self.roomy.remove(&page);
        }
        Ok(None)
    }

    /// One more reference to a stored chunk.
    /// Make the table at least `pages` pages long (the migration, whose ids may have gaps of
    /// any size where format 2 freed chunks).
    pub fn reserve_pages(&mut self, pages: u64) {
        while self.live.len() < pages {
            let p = self.live.push(0);
            self.note_room(p);
        }
    }

    /// Set a chunk's count outright (the migration, which carries format 2's counts over).
    pub fn set_refs(&mut self, pager: &mut Pager, id: u64, refs: u32) -> Result<()> {
        let mut e = self.stored(pager, id, "count of")?;
        e.refs = refs;
        TABLE.set(pager, id, e)?;
        Ok(())
    }

    pub fn incref(&mut self, pager: &mut Pager, id: u64) -> Result<()> {
        let mut e = self.stored(pager, id, "reference to")?;
        e.refs = e.refs.saturating_add(1);
        TABLE.set(pager, id, e)?;
        Ok(())
    }

    /// One reference less; returns the chunk if that was its last, which frees its slot.
    pub fn decref(&mut self, pager: &mut Pager, id: u64) -> Result<Option<ChunkEntry>> {
        let mut e = self.stored(pager, id, "dereference of")?;
        match e.refs {
            0 => Err(ApplyError::Inconsistent(format!(
                "dereference of chunk {id}, which has no references"
            ))),
            u32::MAX => Ok(None),
            1 => {
                self.clear(pager, id, e)?;
                Ok(Some(e))
            }
            _ => {
                e.refs -= 1;
                TABLE.set(pager, id, e)?;
                Ok(None)
            }
        }
    }

    /// Drop a chunk nothing references (damage found by replay or the checker).
    pub fn remove_unreferenced(&mut self, pager: &mut Pager, id: u64) -> Result<ChunkEntry> {
        let e = self.stored(pager, id, "removal of")?;
        if e.refs != 0 {
            return Err(ApplyError::Inconsistent(format!(
                "removal of chunk {id}, which has {} references",
                e.refs
            )));
        }
        self.clear(pager, id, e)?;
        Ok(e)
    }

    /// Free the slot of chunk `id` (entry `e`). Only its length and count are cleared (one
    /// 8-byte word: what a checkpoint writes as a delta is that word); the fingerprint and place
    /// left behind mean nothing, since every reader of an entry checks its length first.
    fn clear(&mut self, pager: &mut Pager, id: u64, e: ChunkEntry) -> Result<()> {
        TABLE.set(
            pager,
            id,
            ChunkEntry {
                len: 0,
                refs: 0,
                ..e
            },
        )?;
        let page = id / PER_PAGE;
        self.live.update(page, |n| *n -= 1);
        self.count -= 1;
        self.note_room(page);
        Ok(())
    }

    fn stored(&self, pager: &mut Pager, id: u64, what: &str) -> Result<ChunkEntry> {
        self.get(pager, id)?
            .ok_or_else(|| ApplyError::Inconsistent(format!("{what} missing chunk {id}")))
    }
}

impl Default for ChunkTable {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::page_store::NothingWritten;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn pager() -> Pager {
        // Large enough that nothing is evicted: eviction is the pager's own tests' concern.
        Pager::new(Arc::new(NothingWritten), 1 << 16)
    }

    fn hash(n: u64) -> [u8; 16] {
        let mut h = [0; 16];
        h[..8].copy_from_slice(&n.to_le_bytes());
        h[8] = 1;
        h
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Store `n` new chunks with one reference each.
        New(u8),
        /// Drop a reference from the k-th live chunk.
        Drop(u16),
        /// Add a reference to the k-th live chunk.
        Share(u16),
        /// Move the k-th live chunk.
        Move(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u8..40).prop_map(Op::New),
            4 => any::<u16>().prop_map(Op::Drop),
            1 => any::<u16>().prop_map(Op::Share),
            1 => any::<u16>().prop_map(Op::Move),
        ]
    }

    proptest! {
        /// The table against a map of id -> (hash, place, refs): lookups, counts, frees, moves;
        /// allocated ids are distinct and free; pages stay at least half full once written
        /// past the first.
        #[test]
        fn chunk_table_matches_a_model(ops in proptest::collection::vec(op(), 1..120)) {
            let mut p = pager();
            let mut t = ChunkTable::new();
            let mut model: HashMap<u64, (u64, u32, u32)> = HashMap::new();
            let mut serial = 0u64;
            let pick = |model: &HashMap<u64, (u64, u32, u32)>, k: u16| {
                let mut ids: Vec<u64> = model.keys().copied().collect();
                ids.sort();
                (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
            };
            for op in ops {
                match op {
                    Op::New(n) => {
                        let ids: Vec<u64> =
                            (0..n).map(|_| t.allocate(&mut p).unwrap()).collect();
                        let mut distinct = ids.clone();
                        distinct.sort();
                        distinct.dedup();
                        prop_assert_eq!(distinct.len(), ids.len(), "ids handed out twice");
                        for &id in &ids {
                            prop_assert!(id >= 1 && !model.contains_key(&id), "{id} in use");
                            serial += 1;
                            prop_assert!(t.put(&mut p, id, hash(serial), 3, serial as u32, 100)
                                .unwrap()
                                .is_none());
                            t.incref(&mut p, id).unwrap();
                            model.insert(id, (serial, 3, 1));
                        }
                    }
                    Op::Drop(k) => {
                        if let Some(id) = pick(&model, k) {
                            let freed = t.decref(&mut p, id).unwrap();
                            let m = model.get_mut(&id).unwrap();
                            m.2 -= 1;
                            prop_assert_eq!(freed.is_some(), m.2 == 0);
                            if m.2 == 0 {
                                model.remove(&id);
                            }
                        }
                    }
                    Op::Share(k) => {
                        if let Some(id) = pick(&model, k) {
                            t.incref(&mut p, id).unwrap();
                            model.get_mut(&id).unwrap().2 += 1;
                        }
                    }
                    Op::Move(k) => {
                        if let Some(id) = pick(&model, k) {
                            let m = model.get_mut(&id).unwrap();
                            let old = t.put(&mut p, id, hash(m.0), 9, 7, 100).unwrap();
                            prop_assert_eq!(old.map(|o| o.segment), Some(m.1));
                            m.1 = 9;
                        }
                    }
                }
                prop_assert_eq!(t.len(), model.len() as u64);
            }
            for (&id, &(serial, segment, refs)) in &model {
                let e = t.get(&mut p, id).unwrap().expect("stored");
                prop_assert_eq!((e.hash, e.segment, e.refs), (hash(serial), segment, refs));
            }
            // Reopened from its live counts (as after a checkpoint), the table still hands out
            // only free ids.
            let mut live = ResidentTable::new(CHUNK_LIVE);
            for &n in t.live_counts() {
                live.push(n);
            }
            let mut again = ChunkTable::from_live(live);
            for _ in 0..300 {
                let id = again.allocate(&mut p).unwrap();
                prop_assert!(!model.contains_key(&id));
            }
        }
    }

    #[test]
    fn new_ids_fill_half_free_pages_before_growing() {
        let mut p = pager();
        let mut t = ChunkTable::new();
        let per = PER_PAGE;
        // Id 0 is never used: four full pages.
        let ids: Vec<u64> = (0..4 * per - 1)
            .map(|n| {
                let id = t.allocate(&mut p).unwrap();
                t.put(&mut p, id, hash(n), 0, 0, 10).unwrap();
                t.incref(&mut p, id).unwrap();
                id
            })
            .collect();
        assert_eq!(t.live_counts().len(), 4);
        // Free three quarters of page 1 and a quarter of page 2.
        for &id in ids.iter().filter(|&&id| id / per == 1 && id % 4 != 0) {
            t.decref(&mut p, id).unwrap();
        }
        for &id in ids.iter().filter(|&&id| id / per == 2 && id % 4 == 0) {
            t.decref(&mut p, id).unwrap();
        }
        let pages_before = t.live_counts().len();
        let freed_in_1 = per - per / 4;
        let fresh: Vec<u64> = (0..freed_in_1)
            .map(|_| t.allocate(&mut p).unwrap())
            .collect();
        assert!(
            fresh.iter().all(|&id| id / per == 1),
            "page 1 (three quarters free) is refilled first"
        );
        assert_eq!(t.live_counts().len(), pages_before, "no page was added");
        // Page 2 is only a quarter free: the next id comes from a new page, not from page 2.
        let next = t.allocate(&mut p).unwrap();
        assert_eq!(next / per, 4);
    }

    #[test]
    fn contradictions_are_refused_not_applied() {
        let mut p = pager();
        let mut t = ChunkTable::new();
        assert!(t.incref(&mut p, 5).is_err(), "reference to a missing chunk");
        t.put(&mut p, 5, hash(1), 0, 0, 10).unwrap();
        assert!(t.decref(&mut p, 5).is_err(), "no reference to drop");
        assert!(
            t.put(&mut p, 5, hash(2), 0, 0, 10).is_err(),
            "other content"
        );
        assert!(t.put(&mut p, 1 << 40, hash(3), 0, 0, 10).is_err(), "far id");
        assert!(t.put(&mut p, 0, hash(3), 0, 0, 10).is_err(), "id 0");
        assert_eq!(t.len(), 1);
        t.incref(&mut p, 5).unwrap();
        assert!(t.remove_unreferenced(&mut p, 5).is_err());
    }

    #[test]
    fn a_saturated_count_is_never_freed() {
        let mut p = pager();
        let mut t = ChunkTable::new();
        t.put(&mut p, 1, hash(1), 0, 0, 10).unwrap();
        let mut e = TABLE.get(&mut p, 1).unwrap();
        e.refs = u32::MAX - 1;
        TABLE.set(&mut p, 1, e).unwrap();
        t.incref(&mut p, 1).unwrap();
        t.incref(&mut p, 1).unwrap();
        assert_eq!(t.get(&mut p, 1).unwrap().unwrap().refs, u32::MAX);
        assert!(t.decref(&mut p, 1).unwrap().is_none());
        assert!(t.get(&mut p, 1).unwrap().is_some());
    }
}
