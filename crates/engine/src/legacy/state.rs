//! The engine's metadata as a deterministic state machine.
//!
//! Every change to volumes, maps and chunks is a log record, and [`State::apply`] is the only
//! code that applies one: the live engine appends a record and applies it, recovery replays the
//! log through the same function. Live state and recovered state therefore cannot drift apart.
//!
//! Map pages are shared between volumes (snapshots, clones) through `Arc`: a page referenced by
//! several volumes counts once in its chunks' reference counts, and a volume that changes a
//! shared page first takes a private copy, adding one reference to every chunk in it. Creating a
//! snapshot therefore costs one pointer per map page, and deleting a volume touches only the
//! pages nothing else shares.

use crate::cow_vec::CowVec;
use crate::format::{Record, RECORD_HEADER};
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

/// Where a chunk's record lives in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub segment: u32,
    pub offset: u32,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    Free,
    /// The log head: records are being appended.
    Open,
    /// Full (ends with a Seal record); immutable until garbage-collected.
    Sealed,
}

#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub state: SegState,
    pub seq: u64,
    /// Bytes of records written (the append offset for the open segment).
    pub written: u32,
    /// Bytes of Chunk records still referenced.
    pub live: u64,
}

impl Segment {
    pub const FREE: Segment = Segment {
        state: SegState::Free,
        seq: 0,
        written: 0,
        live: 0,
    };
}

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
        if id as usize >= self.chunks.len() {
            self.chunks.resize(id as usize + 1, FREE_CHUNK);
        }
        let slot = &mut self.chunks[id as usize];
        if slot.len != 0 {
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
        } else {
            *slot = Chunk {
                hash,
                loc,
                len,
                refs: 0,
            };
            self.index.insert(hash, id);
        }
        self.segments[loc.segment as usize].live += len as u64;
        self.live_bytes += len as u64;
        Ok(())
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
pub struct State {
    pub store: Store,
    pub volumes: BTreeMap<u32, VolumeMap>,
    pub chunk_size: u32,
}

impl State {
    pub fn new(chunk_size: u32, segment_count: u32) -> Self {
        State {
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
            // Pages are read through their directories, never by replay.
            Record::SegmentStart { .. } | Record::Seal { .. } | Record::Page { .. } => Ok(()),
            Record::Chunk { id, hash, data, .. } => {
                let len = (RECORD_HEADER + crate::format::CHUNK_PREFIX + data.len()) as u32;
                self.store.put_chunk(*id, *hash, loc, len)
            }
            Record::Map { volume, first, ids } => {
                self.check_range(*volume, *first, ids.len() as u64)?;
                // Validate before changing anything: a refused record leaves no trace.
                if let Some(id) = ids
                    .iter()
                    .find(|&id| holds_data(id) && self.store.chunk(id).is_none())
                {
                    return Err(Inconsistent(format!("reference to missing chunk {id}")));
                }
                self.set_entries(*volume, *first, ids.iter())
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
        let State { store, volumes, .. } = self;
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
        let State { store, volumes, .. } = self;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Ids;

    const LOC: Loc = Loc {
        segment: 0,
        offset: 0,
    };

    /// Every byte of a fingerprint reaches the hash, in both halves of the hashbrown hash
    /// (bucket bits low, tag bits high): fingerprints differing anywhere must not collide.
    #[test]
    fn entries_match_get_across_present_and_absent_pages() {
        let mut map = VolumeMap::new(0);
        for page_no in [0u64, 2, 3] {
            let mut p = Page::zeroed();
            for (k, e) in p.0.iter_mut().enumerate() {
                *e = (page_no * 10_000 + k as u64) as u32;
            }
            map.pages.insert(page_no, Arc::new(p));
        }
        let per = PAGE_ENTRIES as u64;
        for (first, count) in [
            (0, 0),
            (5, 3),
            (per - 2, 4),
            (per - 1, 2 * per + 7),
            (0, 5 * per),
        ] {
            let want: Vec<u32> = (first..first + count).map(|i| map.get(i)).collect();
            assert_eq!(map.entries(first, count), want, "{first} {count}");
        }
    }

    /// The index behaves as a map across the switch to shards, and once large no table holds
    /// much more than its share, so no growth moves more than a few shards' worth of entries.
    #[test]
    fn a_large_fingerprint_index_is_sharded_evenly() {
        let key = |n: u64| -> [u8; 16] {
            blake3::keyed_hash(&[7; 32], &n.to_le_bytes()).as_bytes()[..16]
                .try_into()
                .unwrap()
        };
        let mut index = FingerprintIndex::default();
        let n = 400_000u64;
        for i in 0..n {
            assert_eq!(index.insert(key(i), i as u32), None);
            if i == INDEX_UNSHARDED_MAX as u64 - 1 {
                assert_eq!(
                    index.largest_table(),
                    INDEX_UNSHARDED_MAX,
                    "still one table"
                );
            }
        }
        assert_eq!(
            index.insert(key(5), 99),
            Some(5),
            "an update keeps the count"
        );
        assert_eq!(index.len(), n as usize);
        for i in (0..n).step_by(997) {
            let want = if i == 5 { 99 } else { i as u32 };
            assert_eq!(index.get(&key(i)), Some(&want));
        }
        for i in 0..n / 2 {
            assert!(index.remove(&key(i)).is_some());
        }
        assert_eq!(index.len(), (n - n / 2) as usize);
        assert!(!index.contains_key(&key(1)) && index.contains_key(&key(n - 1)));
        let mean = index.len() / INDEX_SHARDS;
        assert!(
            index.largest_table() < 2 * mean + 16,
            "largest table {} for a mean of {mean}",
            index.largest_table()
        );
    }

    #[test]
    fn fingerprint_hasher_uses_every_byte() {
        use std::hash::BuildHasher;
        let build = std::hash::BuildHasherDefault::<FingerprintHasher>::default();
        let base = [0x5au8; 16];
        let h0 = build.hash_one(base);
        for i in 0..16 {
            let mut k = base;
            k[i] ^= 1;
            let h = build.hash_one(k);
            assert_ne!(h as u32, h0 as u32, "byte {i} does not reach the low bits");
            assert_ne!(h >> 57, h0 >> 57, "byte {i} does not reach the tag bits");
        }
        let mut index = FingerprintIndex::default();
        for n in 0..10_000u32 {
            let mut k = [0u8; 16];
            k[12..].copy_from_slice(&n.to_le_bytes());
            index.insert(k, n);
        }
        assert_eq!(index.len(), 10_000);
        assert_eq!(
            index.get(&{
                let mut k = [0u8; 16];
                k[12..].copy_from_slice(&77u32.to_le_bytes());
                k
            }),
            Some(&77)
        );
    }

    fn state_with_chunks(n: u32) -> State {
        let mut s = State::new(4096, 4);
        for id in 1..=n {
            s.store.put_chunk(id, [id as u8; 16], LOC, 100).unwrap();
        }
        s.apply(
            &Record::VolumeCreate {
                volume: 1,
                size: 64 << 20,
            },
            LOC,
            0,
        )
        .unwrap();
        s
    }

    fn map(s: &mut State, volume: u32, first: u64, ids: &[u32]) {
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        s.apply(
            &Record::Map {
                volume,
                first,
                ids: ids_of(&bytes),
            },
            LOC,
            0,
        )
        .unwrap();
    }

    fn ids_of(bytes: &[u8]) -> Ids<'_> {
        // Decode through the real codec to build an Ids view.
        let mut out = Vec::new();
        let ids: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        crate::format::Encoder::new(&mut out, 0).map(0, 0, &ids);
        let leaked: &'static [u8] = Box::leak(out.into_boxed_slice());
        match crate::format::decode(leaked, 0).unwrap().0 {
            Record::Map { ids, .. } => ids,
            _ => unreachable!(),
        }
    }

    #[test]
    fn snapshot_shares_pages_and_copy_on_write_keeps_counts_exact() {
        let mut s = state_with_chunks(3);
        map(&mut s, 1, 0, &[1, 2, 2]);
        assert_eq!(s.store.chunks[2].refs, 2);
        s.apply(&Record::VolumeClone { src: 1, dst: 2 }, LOC, 0)
            .unwrap();
        // Shared page: counts unchanged.
        assert_eq!(s.store.chunks[1].refs, 1);
        map(&mut s, 2, 0, &[3]);
        // Volume 2 took a private copy (+1 on 1, 2, 2) then replaced 1 by 3.
        assert_eq!(s.store.chunks[1].refs, 1);
        assert_eq!(s.store.chunks[2].refs, 4);
        assert_eq!((s.volumes[&1].mapped, s.volumes[&2].mapped), (3, 3));
        assert!(s.audit_counters().is_empty());
        assert_eq!(s.store.chunks[3].refs, 1);
        assert_eq!(s.volumes[&1].get(0), 1);
        assert_eq!(s.volumes[&2].get(0), 3);
        assert_eq!(s.count_references()[&2], 4);
        s.apply(&Record::VolumeDelete { volume: 1 }, LOC, 0)
            .unwrap();
        assert_eq!(s.store.chunk(1).map(|c| c.refs), None, "chunk 1 freed");
        assert_eq!(s.store.chunks[2].refs, 2);
        assert!(s.store.free_ids.contains(&1));
        assert!(!s.store.index.contains_key(&[1; 16]));
    }

    #[test]
    fn unmap_of_whole_and_partial_pages() {
        let mut s = state_with_chunks(2);
        let ids: Vec<u32> = (0..3000).map(|i| 1 + (i % 2)).collect();
        map(&mut s, 1, 10, &ids);
        assert_eq!(s.store.chunks[1].refs + s.store.chunks[2].refs, 3000);
        s.apply(
            &Record::Unmap {
                volume: 1,
                first: 0,
                count: 2048,
            },
            LOC,
            0,
        )
        .unwrap();
        let left = (2048..3010u64)
            .filter(|&i| s.volumes[&1].get(i) != 0)
            .count() as u64;
        assert_eq!(left, 962);
        assert_eq!(s.store.chunks[1].refs + s.store.chunks[2].refs, left);
        s.apply(
            &Record::Unmap {
                volume: 1,
                first: 0,
                count: 16384,
            },
            LOC,
            0,
        )
        .unwrap();
        assert!(s.volumes[&1].pages.is_empty());
        assert!(s.store.chunk(1).is_none() && s.store.chunk(2).is_none());
        assert_eq!(s.store.segments[0].live, 0);
    }

    /// The mapped and anchored counts kept per volume follow every kind of change: partial
    /// and whole-page unmaps and anchors, overwrites of anchored entries, copies, clones and
    /// shrinking; a wrong count in any path shows as a difference from the recount.
    #[test]
    fn counters_kept_incrementally_match_a_recount() {
        let mut s = state_with_chunks(3);
        let per = PAGE_ENTRIES as u64;
        let ids: Vec<u32> = (0..3 * per as u32).map(|i| 1 + i % 3).collect();
        map(&mut s, 1, 5, &ids);
        // Keeps every chunk alive through the unmaps below.
        map(&mut s, 1, 15_000, &[1, 2, 3]);
        assert_eq!(s.volumes[&1].mapped, 3 * per + 3);
        let range = |volume, first, count| (volume, first, count);
        let steps = [
            (false, range(1, 100, 10)),
            (true, range(1, 200, per)),
            (true, range(1, 0, 4 * per)),
            (false, range(1, per, per)),
            (true, range(1, 2 * per, 3)),
        ];
        for (anchor, (volume, first, count)) in steps {
            let record = if anchor {
                Record::Anchor {
                    volume,
                    first,
                    count,
                }
            } else {
                Record::Unmap {
                    volume,
                    first,
                    count,
                }
            };
            s.apply(&record, LOC, 0).unwrap();
            assert_eq!(s.audit_counters(), Vec::<String>::new(), "{record:?}");
        }
        assert_eq!(s.volumes[&1].anchored, 3 * per);
        map(&mut s, 1, 2 * per, &[1, 2, 0, 3]);
        s.apply(&Record::VolumeClone { src: 1, dst: 2 }, LOC, 0)
            .unwrap();
        s.apply(
            &Record::Copy {
                src: 1,
                src_first: 2 * per,
                dst: 2,
                dst_first: 7,
                count: 4,
            },
            LOC,
            0,
        )
        .unwrap();
        s.apply(
            &Record::VolumeResize {
                volume: 1,
                size: (2 * per + 1) * 4096,
            },
            LOC,
            0,
        )
        .unwrap();
        assert_eq!(s.audit_counters(), Vec::<String>::new());
        assert_eq!(s.volumes[&1].mapped, 1);
        assert_eq!(s.volumes[&2].mapped, 3 + 3 + 3);
        s.apply(&Record::VolumeDelete { volume: 2 }, LOC, 0)
            .unwrap();
        assert_eq!(s.audit_counters(), Vec::<String>::new());
        // A wrong count is reported.
        s.volumes.get_mut(&1).unwrap().mapped += 1;
        s.store.live_bytes += 1;
        assert_eq!(s.audit_counters().len(), 2);
    }

    #[test]
    fn overlapping_copy_is_a_memmove() {
        let mut s = state_with_chunks(4);
        map(&mut s, 1, 0, &[1, 2, 3, 4]);
        s.apply(
            &Record::Copy {
                src: 1,
                src_first: 0,
                dst: 1,
                dst_first: 1,
                count: 3,
            },
            LOC,
            0,
        )
        .unwrap();
        let got: Vec<u32> = (0..4).map(|i| s.volumes[&1].get(i)).collect();
        assert_eq!(got, vec![1, 1, 2, 3]);
        assert!(s.store.chunk(4).is_none());
        assert_eq!(s.store.chunks[1].refs, 2);
    }

    #[test]
    fn records_that_contradict_the_state_are_refused() {
        let mut s = state_with_chunks(1);
        let bytes: Vec<u8> = 9u32.to_le_bytes().to_vec();
        let r = s.apply(
            &Record::Map {
                volume: 1,
                first: 0,
                ids: ids_of(&bytes),
            },
            LOC,
            0,
        );
        assert!(r.is_err(), "reference to a chunk that does not exist");
        let r = s.apply(
            &Record::Unmap {
                volume: 1,
                first: 16383,
                count: 2,
            },
            LOC,
            0,
        );
        assert!(r.is_err(), "range beyond the end");
        let r = s.apply(&Record::VolumeDelete { volume: 7 }, LOC, 0);
        assert!(r.is_err());
    }

    #[test]
    fn shrinking_a_volume_releases_the_tail() {
        let mut s = state_with_chunks(1);
        map(&mut s, 1, 5000, &[1]);
        s.apply(
            &Record::VolumeResize {
                volume: 1,
                size: 8 << 20,
            },
            LOC,
            0,
        )
        .unwrap();
        assert!(s.store.chunk(1).is_none());
        s.apply(
            &Record::VolumeResize {
                volume: 1,
                size: 64 << 20,
            },
            LOC,
            0,
        )
        .unwrap();
        assert_eq!(s.volumes[&1].get(5000), 0);
    }
}
