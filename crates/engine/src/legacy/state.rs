//! Format 2's metadata state machine: everything in RAM, maps as shared pages of 32-bit chunk
//! ids. Kept only to open an array written by format 2 and migrate it to format 3 (RFC 0001):
//! the migration loads the checkpoint and replays the log through this `apply`, as format 2
//! itself did, then converts the result.
//!
//! Every change to volumes, maps and chunks is a log record, and [`V2State::apply`] is the only
//! code that applies one: the live engine appends a record and applies it, recovery replays the
//! log through the same function. Live state and recovered state therefore cannot drift apart.
//!
//! Map pages are shared between volumes (snapshots, clones) through `Arc`: a page referenced by
//! several volumes counts once in its chunks' reference counts, and a volume that changes a
//! shared page first takes a private copy, adding one reference to every chunk in it. Creating a
//! snapshot therefore costs one pointer per map page, and deleting a volume touches only the
//! pages nothing else shares.

use super::cow_vec::CowVec;
use crate::format::{Record, RECORD_HEADER};
pub use crate::state::{Loc, SegState, Segment};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Map entries per page: one page maps 1024 chunks (4 MiB of a volume with 4 KiB chunks) in
/// 4 KiB of memory.
pub const PAGE_ENTRIES: usize = 1024;

/// Largest gap between a new chunk id and the ids in use (see `Store::put_chunk`).
const MAX_ID_GAP: usize = 1 << 16;
/// Largest Copy record the engine writes (it splits larger copies).
pub const MAX_COPY_CHUNKS: u64 = 64 * 1024;

/// Map entry of an anchored chunk (SBC ANCHOR): no data, reads as zeros, space held for it.
/// No chunk ever has this id. Reference counting treats it as one pseudo-chunk whose count
/// (`Store::anchored`) is the number of anchored entries over all map page instances.
pub const ANCHORED: u32 = u32::MAX;

/// Whether a map entry points at stored data (not unmapped, not anchored).
pub fn holds_data(id: u32) -> bool {
    id != 0 && id != ANCHORED
}

/// A page of a volume's block map: chunk ids, 0 = unmapped (reads as zeros), [`ANCHORED`].
#[derive(Clone)]
pub struct Page(pub Box<[u32; PAGE_ENTRIES]>);

impl Page {
    pub fn zeroed() -> Self {
        Page(Box::new([0; PAGE_ENTRIES]))
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|&id| id == 0)
    }
}

/// One volume's map: chunk index -> chunk id, in pages.
#[derive(Clone, Default)]
pub struct VolumeMap {
    pub size: u64,
    pub pages: BTreeMap<u64, Arc<Page>>,
    /// Entries holding data, kept by every change so space figures need no walk of the map.
    pub mapped: u64,
    /// Anchored entries, likewise.
    pub anchored: u64,
}

impl VolumeMap {
    pub fn new(size: u64) -> Self {
        VolumeMap {
            size,
            ..Default::default()
        }
    }

    /// Count `mapped` and `anchored` from the pages (after loading a checkpoint; the checker
    /// compares the counts kept incrementally with these).
    pub fn counted(&self) -> (u64, u64) {
        let (mut mapped, mut anchored) = (0, 0);
        for page in self.pages.values() {
            for &id in page.0.iter() {
                mapped += holds_data(id) as u64;
                anchored += (id == ANCHORED) as u64;
            }
        }
        (mapped, anchored)
    }

    /// Account one entry changing from `old` to `new`.
    fn count_change(&mut self, old: u32, new: u32) {
        self.mapped = self.mapped + holds_data(new) as u64 - holds_data(old) as u64;
        self.anchored = self.anchored + (new == ANCHORED) as u64 - (old == ANCHORED) as u64;
    }

    /// Account a whole page leaving the map.
    fn count_page_gone(&mut self, page: &Page) {
        for &id in page.0.iter() {
            self.count_change(id, 0);
        }
    }
    pub fn get(&self, index: u64) -> u32 {
        self.pages
            .get(&(index / PAGE_ENTRIES as u64))
            .map_or(0, |p| p.0[(index % PAGE_ENTRIES as u64) as usize])
    }

    /// Entries `first..first + count`, looking each page up once.
    pub fn entries(&self, first: u64, count: u64) -> Vec<u32> {
        let per = PAGE_ENTRIES as u64;
        let mut out = Vec::with_capacity(count as usize);
        let end = first + count;
        let mut i = first;
        while i < end {
            let page_no = i / per;
            let to = end.min((page_no + 1) * per);
            let (a, b) = ((i - page_no * per) as usize, (to - page_no * per) as usize);
            match self.pages.get(&page_no) {
                Some(p) => out.extend_from_slice(&p.0[a..b]),
                None => out.resize(out.len() + (b - a), 0),
            }
            i = to;
        }
        out
    }
}

/// A unique stored chunk. A slot with `len == 0` is free.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    pub hash: [u8; 16],
    pub loc: Loc,
    /// Length of the whole Chunk record (header, prefix, stored bytes).
    pub len: u32,
    /// Number of map page instances pointing at this chunk (counting repeats).
    pub refs: u64,
}

const FREE_CHUNK: Chunk = Chunk {
    hash: [0; 16],
    loc: Loc {
        segment: 0,
        offset: 0,
    },
    len: 0,
    refs: 0,
};

/// Replay found a record that contradicts the state: metadata damage.
#[derive(Debug, thiserror::Error)]
#[error("inconsistent log record: {0}")]
pub struct Inconsistent(pub String);

type Apply = Result<(), Inconsistent>;

/// Hashes a chunk fingerprint for the dedup index by folding its bytes, no SipHash rounds.
///
/// Fingerprints are keyed BLAKE3 (the key is secret to the array), so their bits are already
/// uniform and no host can aim writes at one hash bucket; SipHash's flooding protection buys
/// nothing here and cost a visible share of every write and every freed chunk.
#[derive(Default, Clone, Copy)]
pub struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        // A multiply only carries bits upwards; fold the high half back down so every byte
        // reaches the low (bucket) bits too.
        let x = self.0 ^ (self.0 >> 32);
        x.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (x >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for word in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..word.len()].copy_from_slice(word);
            self.0 = (self.0.rotate_left(23) ^ u64::from_le_bytes(w))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.write(&n.to_le_bytes());
    }
}

type FingerprintMap = HashMap<[u8; 16], u32, std::hash::BuildHasherDefault<FingerprintHasher>>;

/// Shards of a large [`FingerprintIndex`]: a hash table grows by doubling and moves every
/// entry when it does, so one table of 29 M fingerprints stalled the insert that grew it (and
/// every command waiting for the metadata lock) for about 4 s. In 4,096 shards a growth moves
/// 1/4,096 of the entries: about 65 k at 1 TiB of unique 4 KiB chunks. (RFC 0001 replaces the
/// complete index with a sampled one; this bounds the stall until then.)
const INDEX_SHARDS: usize = 4096;
/// Entries kept in a single table before the index is split into shards: the index a write
/// builds for its own batch never gets there.
const INDEX_UNSHARDED_MAX: usize = 1024;

/// The dedup index: fingerprint -> chunk id. One table while small, [`INDEX_SHARDS`] tables
/// chosen by the fingerprint's first bits (uniform: fingerprints are keyed BLAKE3) once large.
#[derive(Default)]
pub struct FingerprintIndex {
    shards: Vec<FingerprintMap>,
    len: usize,
}

impl FingerprintIndex {
    fn shard_of(&self, hash: &[u8; 16]) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            u16::from_le_bytes([hash[0], hash[1]]) as usize % INDEX_SHARDS
        }
    }

    pub fn get(&self, hash: &[u8; 16]) -> Option<&u32> {
        self.shards.get(self.shard_of(hash))?.get(hash)
    }

    pub fn contains_key(&self, hash: &[u8; 16]) -> bool {
        self.get(hash).is_some()
    }

    pub fn insert(&mut self, hash: [u8; 16], id: u32) -> Option<u32> {
        if self.shards.is_empty() {
            self.shards.push(FingerprintMap::default());
        }
        if self.shards.len() == 1 && self.len >= INDEX_UNSHARDED_MAX {
            let single = self.shards.pop().expect("one shard");
            self.shards = (0..INDEX_SHARDS)
                .map(|_| FingerprintMap::default())
                .collect();
            for (k, v) in single {
                let shard = self.shard_of(&k);
                self.shards[shard].insert(k, v);
            }
        }
        let shard = self.shard_of(&hash);
        let old = self.shards[shard].insert(hash, id);
        self.len += old.is_none() as usize;
        old
    }

    pub fn remove(&mut self, hash: &[u8; 16]) -> Option<u32> {
        let shard = self.shard_of(hash);
        let old = self.shards.get_mut(shard)?.remove(hash);
        self.len -= old.is_some() as usize;
        old
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries in the largest table: what one growth may have to move.
    pub fn largest_table(&self) -> usize {
        self.shards.iter().map(|s| s.len()).max().unwrap_or(0)
    }
}

/// Chunks, their index and the per-segment usage they imply.
#[derive(Default)]
pub struct Store {
    pub chunks: CowVec<Chunk>,
    pub index: FingerprintIndex,
    pub free_ids: Vec<u32>,
    pub segments: CowVec<Segment>,
    /// Anchored map entries, counted like references (per page instance).
    pub anchored: u64,
    /// Sum of the segments' `live` bytes, kept with them so space figures need no walk.
    pub live_bytes: u64,
}

impl Store {
    pub fn new(segment_count: u32) -> Self {
        Store {
            // Id 0 means "unmapped" and is never allocated.
            chunks: CowVec::from_elem(FREE_CHUNK, 1),
            index: FingerprintIndex::default(),
            free_ids: Vec::new(),
            segments: CowVec::from_elem(Segment::FREE, segment_count as usize),
            anchored: 0,
            live_bytes: 0,
        }
    }

    pub fn chunk(&self, id: u32) -> Option<&Chunk> {
        self.chunks.get(id as usize).filter(|c| c.len != 0)
    }

    /// An id for a new chunk. Live path only: replay takes ids from the records.
    pub fn allocate_id(&mut self) -> Option<u32> {
        while let Some(id) = self.free_ids.pop() {
            if self.chunks.get(id as usize).is_some_and(|c| c.len == 0) {
                return Some(id);
            }
        }
        let id = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&id| id != ANCHORED)?;
        self.chunks.push(FREE_CHUNK);
        self.free_ids.push(id);
        self.free_ids.pop()
    }

    /// Recompute the free-id list after recovery.
    pub fn rebuild_free_ids(&mut self) {
        self.free_ids = (1..self.chunks.len() as u32)
            .rev()
            .filter(|&id| self.chunks[id as usize].len == 0)
            .collect();
    }

    fn incref(&mut self, id: u32) -> Apply {
        if id == 0 {
            return Ok(());
        }
        if id == ANCHORED {
            self.anchored += 1;
            return Ok(());
        }
        match self.chunks.get_mut(id as usize) {
            Some(c) if c.len != 0 => {
                c.refs += 1;
                Ok(())
            }
            _ => Err(Inconsistent(format!("reference to missing chunk {id}"))),
        }
    }

    fn decref(&mut self, id: u32) -> Apply {
        if id == 0 {
            return Ok(());
        }
        if id == ANCHORED {
            self.anchored = self
                .anchored
                .checked_sub(1)
                .ok_or_else(|| Inconsistent("anchored entry count below zero".into()))?;
            return Ok(());
        }
        let Some(c) = self
            .chunks
            .get_mut(id as usize)
            .filter(|c| c.len != 0 && c.refs > 0)
        else {
            return Err(Inconsistent(format!("dereference of missing chunk {id}")));
        };
        c.refs -= 1;
        if c.refs == 0 {
            let c = std::mem::replace(c, FREE_CHUNK);
            if self.index.get(&c.hash) == Some(&id) {
                self.index.remove(&c.hash);
            }
            self.segments[c.loc.segment as usize].live -= c.len as u64;
            self.live_bytes -= c.len as u64;
            self.free_ids.push(id);
        }
        Ok(())
    }

    fn put_chunk(&mut self, id: u32, hash: [u8; 16], loc: Loc, len: u32) -> Apply {
        if id == 0 || id == ANCHORED || loc.segment as usize >= self.segments.len() {
            return Err(Inconsistent(format!("chunk {id} at an impossible place")));
        }
        // Ids are handed out densely (a failed batch can leave at most one batch of ids
        // unused), so a far larger id is damage, not a reason to allocate gigabytes.
        if id as usize > self.chunks.len() + MAX_ID_GAP {
            return Err(Inconsistent(format!(
                "chunk id {id} far beyond the {} in use",
                self.chunks.len()
            )));
        }
        let Some(slot) = self.chunks.get_mut(id as usize).filter(|c| c.len != 0) else {
            self.insert_new(id, hash, loc, len);
            return Ok(());
        };
        // A relocation by the garbage collector: same content, new place.
        if slot.hash != hash {
            return Err(Inconsistent(format!(
                "chunk {id} rewritten with other content"
            )));
        }
        let old = *slot;
        slot.loc = loc;
        slot.len = len;
        self.segments[old.loc.segment as usize].live -= old.len as u64;
        self.live_bytes -= old.len as u64;
        self.segments[loc.segment as usize].live += len as u64;
        self.live_bytes += len as u64;
        Ok(())
    }

    /// Enter a chunk at a free `id`, growing the table to it: its entry, its fingerprint and
    /// its live bytes. Replay's new chunks and a checkpoint's chunk list both come in here.
    pub(super) fn insert_new(&mut self, id: u32, hash: [u8; 16], loc: Loc, len: u32) {
        if id as usize >= self.chunks.len() {
            self.chunks.resize(id as usize + 1, FREE_CHUNK);
        }
        self.chunks[id as usize] = Chunk {
            hash,
            loc,
            len,
            refs: 0,
        };
        self.index.insert(hash, id);
        self.segments[loc.segment as usize].live += len as u64;
        self.live_bytes += len as u64;
    }

    /// A private, writable copy of page `page_no` of a map (created empty if absent).
    fn page_mut<'m>(
        &mut self,
        pages: &'m mut BTreeMap<u64, Arc<Page>>,
        page_no: u64,
    ) -> Result<&'m mut Page, Inconsistent> {
        let arc = pages
            .entry(page_no)
            .or_insert_with(|| Arc::new(Page::zeroed()));
        if Arc::get_mut(arc).is_none() {
            // Shared with another volume: the copy is one more reference to each chunk in it.
            let copy = Page::clone(arc);
            for &id in copy.0.iter() {
                self.incref(id)?;
            }
            *arc = Arc::new(copy);
        }
        Ok(Arc::get_mut(arc).expect("page just made private"))
    }

    /// Drop every page of a map (see [`Store::drop_page`]).
    fn drop_map(&mut self, map: VolumeMap) -> Apply {
        for page in map.pages.into_values() {
            self.drop_page(page)?;
        }
        Ok(())
    }

    /// Drop a page from a map; a page nothing else shares gives up its references.
    fn drop_page(&mut self, page: Arc<Page>) -> Apply {
        if let Some(page) = Arc::into_inner(page) {
            for &id in page.0.iter() {
                self.decref(id)?;
            }
        }
        Ok(())
    }
}

/// Everything the engine knows besides the data itself.
pub struct V2State {
    pub store: Store,
    pub volumes: BTreeMap<u32, VolumeMap>,
    pub chunk_size: u32,
}

impl V2State {
    pub fn new(chunk_size: u32, segment_count: u32) -> Self {
        V2State {
            store: Store::new(segment_count),
            volumes: BTreeMap::new(),
            chunk_size,
        }
    }

    /// Chunks per volume of `size` bytes.
    pub fn chunks_of(&self, size: u64) -> u64 {
        size.div_ceil(self.chunk_size as u64)
    }

    fn volume(&self, id: u32) -> Result<&VolumeMap, Inconsistent> {
        self.volumes
            .get(&id)
            .ok_or_else(|| Inconsistent(format!("volume {id} does not exist")))
    }

    fn check_range(&self, volume: u32, first: u64, count: u64) -> Apply {
        let limit = self.chunks_of(self.volume(volume)?.size);
        match first.checked_add(count) {
            Some(end) if end <= limit => Ok(()),
            _ => Err(Inconsistent(format!(
                "range {first}+{count} beyond volume {volume} ({limit} chunks)"
            ))),
        }
    }

    /// Apply one record found at `loc` (the record's own header position).
    pub fn apply(&mut self, record: &Record<'_>, loc: Loc, seq: u64) -> Apply {
        match record {
            Record::SegmentStart { .. } | Record::Seal { .. } => Ok(()),
            Record::Release { .. } => {
                Err(Inconsistent("a format 3 record in a format 2 log".into()))
            }
            Record::Chunk { id, hash, data, .. } => {
                let id = u32::try_from(*id)
                    .map_err(|_| Inconsistent(format!("chunk id {id} in a format 2 log")))?;
                let len = (RECORD_HEADER + crate::format::CHUNK_PREFIX + data.len()) as u32;
                self.store.put_chunk(id, *hash, loc, len)
            }
            Record::Map { volume, first, ids } => {
                self.check_range(*volume, *first, ids.len() as u64)?;
                let ids: Vec<u32> = ids
                    .iter()
                    .map(u32::try_from)
                    .collect::<Result<_, _>>()
                    .map_err(|_| Inconsistent("a 64-bit chunk id in a format 2 log".into()))?;
                // Validate before changing anything: a refused record leaves no trace.
                if let Some(id) = ids
                    .iter()
                    .find(|&&id| holds_data(id) && self.store.chunk(id).is_none())
                {
                    return Err(Inconsistent(format!("reference to missing chunk {id}")));
                }
                self.set_entries(*volume, *first, ids.into_iter())
            }
            Record::Unmap {
                volume,
                first,
                count,
            }
            | Record::Anchor {
                volume,
                first,
                count,
            } => {
                self.check_range(*volume, *first, *count)?;
                let value = if matches!(record, Record::Anchor { .. }) {
                    ANCHORED
                } else {
                    0
                };
                self.fill(*volume, *first, *count, value)
            }
            Record::Copy {
                src,
                src_first,
                dst,
                dst_first,
                count,
            } => {
                if *count > MAX_COPY_CHUNKS {
                    return Err(Inconsistent(format!(
                        "copy of {count} chunks in one record"
                    )));
                }
                self.check_range(*src, *src_first, *count)?;
                self.check_range(*dst, *dst_first, *count)?;
                // Read the whole source first: memmove semantics for overlapping ranges.
                let ids = self.volume(*src)?.entries(*src_first, *count);
                self.set_entries(*dst, *dst_first, ids.into_iter())
            }
            Record::VolumeCreate { volume, size } => {
                if self.volumes.contains_key(volume) || *volume == 0 {
                    return Err(Inconsistent(format!("volume {volume} created twice")));
                }
                self.volumes.insert(*volume, VolumeMap::new(*size));
                Ok(())
            }
            Record::VolumeDelete { volume } => {
                let map = self
                    .volumes
                    .remove(volume)
                    .ok_or_else(|| Inconsistent(format!("delete of missing volume {volume}")))?;
                self.store.drop_map(map)
            }
            Record::VolumeResize { volume, size } => {
                let old = self.chunks_of(self.volume(*volume)?.size);
                let new = self.chunks_of(*size);
                if new < old {
                    self.unmap(*volume, new, old - new)?;
                }
                self.volumes.get_mut(volume).expect("checked").size = *size;
                Ok(())
            }
            Record::VolumeClone { src, dst } => {
                if self.volumes.contains_key(dst) || *dst == 0 {
                    return Err(Inconsistent(format!("clone into existing volume {dst}")));
                }
                let copy = self.volume(*src)?.clone();
                self.volumes.insert(*dst, copy);
                Ok(())
            }
            Record::Batch { inner } => {
                for item in crate::format::records(inner, seq) {
                    let (at, record) =
                        item.map_err(|e| Inconsistent(format!("bad record in batch: {e:?}")))?;
                    let inner_loc = Loc {
                        segment: loc.segment,
                        offset: loc.offset + (RECORD_HEADER + at) as u32,
                    };
                    self.apply(&record, inner_loc, seq)?;
                }
                Ok(())
            }
        }
    }

    fn set_entries(&mut self, volume: u32, first: u64, ids: impl Iterator<Item = u32>) -> Apply {
        let V2State { store, volumes, .. } = self;
        let map = volumes
            .get_mut(&volume)
            .ok_or_else(|| Inconsistent(format!("volume {volume} does not exist")))?;
        let ids: Vec<u32> = ids.collect();
        if let Some(id) = ids
            .iter()
            .find(|&&id| holds_data(id) && store.chunk(id).is_none())
        {
            return Err(Inconsistent(format!("reference to missing chunk {id}")));
        }
        // Take every new reference before giving up any old one. Doing it page by page is not
        // enough: one record may move a chunk from a slot in an earlier page to a slot in a
        // later one, and dropping its only (old) reference first would free it.
        for &id in &ids {
            store.incref(id)?;
        }
        let mut released = Vec::with_capacity(ids.len());
        let mut counts = Vec::with_capacity(ids.len());
        let mut ids = ids.into_iter().peekable();
        let mut index = first;
        while ids.peek().is_some() {
            let page_no = index / PAGE_ENTRIES as u64;
            let page = store.page_mut(&mut map.pages, page_no)?;
            let mut slot = (index % PAGE_ENTRIES as u64) as usize;
            while slot < PAGE_ENTRIES {
                let Some(id) = ids.next() else { break };
                let old = std::mem::replace(&mut page.0[slot], id);
                released.push(old);
                counts.push((old, id));
                slot += 1;
                index += 1;
            }
            if page.is_empty() {
                map.pages.remove(&page_no);
            }
        }
        for (old, new) in counts {
            map.count_change(old, new);
        }
        for old in released {
            store.decref(old)?;
        }
        Ok(())
    }

    fn unmap(&mut self, volume: u32, first: u64, count: u64) -> Apply {
        self.fill(volume, first, count, 0)
    }

    /// Set entries `first..first + count` to `value`: 0 (unmapped) or [`ANCHORED`] (pages
    /// created as needed), neither of which refers to a stored chunk.
    fn fill(&mut self, volume: u32, first: u64, count: u64, value: u32) -> Apply {
        debug_assert!(!holds_data(value));
        let V2State { store, volumes, .. } = self;
        let map = volumes
            .get_mut(&volume)
            .ok_or_else(|| Inconsistent(format!("volume {volume} does not exist")))?;
        if count == 0 {
            return Ok(());
        }
        let end = first + count;
        let per = PAGE_ENTRIES as u64;
        let pages = first / per..=(end - 1) / per;
        // Unmapping only changes pages that exist: visit those, not the whole range.
        let visit: Vec<u64> = if value == 0 {
            map.pages.range(pages).map(|(&no, _)| no).collect()
        } else {
            pages.collect()
        };
        for page_no in visit {
            let page_start = page_no * per;
            let from = first.max(page_start);
            let to = end.min(page_start + per);
            if value == ANCHORED {
                store.anchored += to - from;
            }
            if from == page_start && to == page_start + per {
                let old = if value == 0 {
                    map.pages.remove(&page_no)
                } else {
                    map.pages
                        .insert(page_no, Arc::new(Page(Box::new([value; PAGE_ENTRIES]))))
                };
                if let Some(old) = &old {
                    map.count_page_gone(old);
                }
                map.anchored += (value == ANCHORED) as u64 * per;
                if let Some(old) = old {
                    store.drop_page(old)?;
                }
                continue;
            }
            let page = store.page_mut(&mut map.pages, page_no)?;
            let released: Vec<u32> = (from..to)
                .map(|i| std::mem::replace(&mut page.0[(i - page_start) as usize], value))
                .collect();
            let empty = page.is_empty();
            for &old in &released {
                map.count_change(old, value);
            }
            for old in released {
                store.decref(old)?;
            }
            if empty {
                map.pages.remove(&page_no);
            }
        }
        Ok(())
    }

    /// Give back the map pages a checkpoint image held (see [`crate::checkpoint::Image`]).
    /// References are counted per page instance and a page shared with anything is copied
    /// before it changes, the copy counting its chunks again: a page the volumes changed
    /// while the image held it left the image the last holder of the old instance, whose
    /// references are dropped here. Pages the volumes still hold only lose a pointer.
    pub fn release_pages(&mut self, volumes: BTreeMap<u32, VolumeMap>) -> Apply {
        for map in volumes.into_values() {
            self.store.drop_map(map)?;
        }
        Ok(())
    }

    /// Differences between the counters kept incrementally (per volume mapped and anchored
    /// entries, live bytes) and the same figures recounted from the maps and segments. Empty
    /// when they agree; the checker and the tests report them.
    pub fn audit_counters(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, map) in &self.volumes {
            let (mapped, anchored) = map.counted();
            if (map.mapped, map.anchored) != (mapped, anchored) {
                out.push(format!(
                    "volume {id}: {} mapped and {} anchored entries counted, {mapped} and \
                     {anchored} in its map",
                    map.mapped, map.anchored
                ));
            }
        }
        let live: u64 = self.store.segments.iter().map(|s| s.live).sum();
        if live != self.store.live_bytes {
            out.push(format!(
                "{} live bytes counted, {live} in the segment table",
                self.store.live_bytes
            ));
        }
        out
    }

    /// Recompute every chunk's reference count from the maps (after loading a checkpoint, and
    /// by the checker to audit the counts kept incrementally). Anchored entries are counted
    /// under [`ANCHORED`].
    pub fn count_references(&self) -> HashMap<u32, u64> {
        let mut counts = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for map in self.volumes.values() {
            for page in map.pages.values() {
                if !seen.insert(Arc::as_ptr(page)) {
                    continue;
                }
                for &id in page.0.iter() {
                    if id != 0 {
                        *counts.entry(id).or_insert(0) += 1;
                    }
                }
            }
        }
        counts
    }
}
