//! Deduplication with a sampled index (RFC 0001): the index is advice, never truth.
//!
//! A fingerprint whose first byte has its low [`HOOK_BITS`] bits clear is a *hook* (one in 64).
//! Only hooks are indexed, in a hash table of 4 KiB bucket pages that grows by linear hashing
//! (one bucket split at a time, so no insert ever moves more than one page of entries) and is
//! paged like the rest of the metadata. The complete fingerprints live in the chunk table,
//! whose pages hold chunks in the order they were written (ids are handed out page by page):
//! a chunk page is the fingerprint list of 128 chunks written together. When a write meets a
//! hook, the chunk pages around the chunk it names are loaded into the [`Locality`] cache, and
//! the chunks that follow in the stream (a clone, a copy, a restore: duplicates arrive in runs)
//! are found there. Every candidate is confirmed against the chunk table's entry before it is
//! used, so a stale entry costs a lookup and a missed duplicate costs space, never data.

use super::chunk_table::PER_PAGE as CHUNKS_PER_PAGE;
use super::page_store::PAGE_BYTES;
use super::pager::{PageMut, Pager};
use super::tables::T_HOOKS;
use super::ApplyError;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// One fingerprint in 2^HOOK_BITS is a hook.
pub const HOOK_BITS: u32 = 6;
const ENTRY: usize = 16;
const PER_BUCKET: usize = PAGE_BYTES / ENTRY;
/// Buckets split when the table is this full on average. Linear hashing splits buckets in
/// order, so the ones not yet split in a round hold up to twice the average: at a half, few
/// of them fill up (and a full bucket gives up an entry rather than chain).
const MAX_LOAD: f64 = 0.5;
/// Buckets of a new table: 2^INITIAL_LEVEL.
const INITIAL_LEVEL: u8 = 4;

/// Whether a fingerprint is a hook.
pub fn is_hook(hash: &[u8; 16]) -> bool {
    hash[0].trailing_zeros() >= HOOK_BITS
}

/// The part of a fingerprint the table keys on (independent of the bits that select hooks).
fn tag(hash: &[u8; 16]) -> u64 {
    u64::from_le_bytes(hash[8..16].try_into().unwrap())
}

/// Shape of the hook table, kept in the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookShape {
    /// 2^level buckets before the split pointer's round.
    pub level: u8,
    /// Buckets below this are split already.
    pub split: u64,
    /// Entries inserted (stale ones included): drives splitting.
    pub entries: u64,
}

impl Default for HookShape {
    fn default() -> Self {
        HookShape {
            level: INITIAL_LEVEL,
            split: 0,
            entries: 0,
        }
    }
}

impl HookShape {
    pub fn buckets(&self) -> u64 {
        (1u64 << self.level) + self.split
    }

    fn bucket(&self, tag: u64) -> u64 {
        let low = tag & ((1u64 << self.level) - 1);
        if low < self.split {
            tag & ((1u64 << (self.level + 1)) - 1)
        } else {
            low
        }
    }
}

/// The hook index: fingerprint tag -> chunk id, in bucket pages of the pager.
#[derive(Debug, Default)]
pub struct Hooks {
    pub shape: HookShape,
}

fn read_entry(page: &[u8], k: usize) -> (u64, u64) {
    let b = &page[k * ENTRY..(k + 1) * ENTRY];
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        u64::from_le_bytes(b[8..].try_into().unwrap()),
    )
}

fn write_entry(page: &mut PageMut<'_>, k: usize, tag: u64, id: u64) {
    page.set_word(2 * k, tag);
    page.set_word(2 * k + 1, id);
}

impl Hooks {
    /// The bucket page a lookup of `hash` reads (for reading it ahead of the engine's lock).
    pub fn page_of(&self, hash: &[u8; 16]) -> u64 {
        self.shape.bucket(tag(hash))
    }

    /// The chunk the index names for `hash`, if any (to be confirmed by the caller).
    pub fn get(&self, pager: &mut Pager, hash: &[u8; 16]) -> Result<Option<u64>, ApplyError> {
        let t = tag(hash);
        let page = pager.page(T_HOOKS, self.shape.bucket(t))?;
        Ok((0..PER_BUCKET)
            .map(|k| read_entry(page, k))
            .find(|&(tag, id)| tag == t && id != 0)
            .map(|(_, id)| id))
    }

    /// Index `hash` -> `id`. A full bucket gives up one entry (the index is advice).
    pub fn insert(
        &mut self,
        pager: &mut Pager,
        hash: &[u8; 16],
        id: u64,
    ) -> Result<(), ApplyError> {
        let t = tag(hash);
        let mut page = pager.page_mut(T_HOOKS, self.shape.bucket(t))?;
        let mut free = None;
        for k in 0..PER_BUCKET {
            let (tag, old) = read_entry(&page[..], k);
            if old != 0 && tag == t {
                write_entry(&mut page, k, t, id);
                return Ok(());
            }
            if old == 0 && free.is_none() {
                free = Some(k);
            }
        }
        let k = free.unwrap_or((t >> 32) as usize % PER_BUCKET);
        write_entry(&mut page, k, t, id);
        self.shape.entries += 1;
        let capacity = self.shape.buckets() as f64 * PER_BUCKET as f64;
        if self.shape.entries as f64 > MAX_LOAD * capacity {
            self.split(pager)?;
        }
        Ok(())
    }

    /// Split the bucket at the split pointer into itself and its image 2^level higher.
    fn split(&mut self, pager: &mut Pager) -> Result<(), ApplyError> {
        let shape = self.shape;
        let from = shape.split;
        let to = from + (1u64 << shape.level);
        let entries: Vec<(u64, u64)> = {
            let page = pager.page(T_HOOKS, from)?;
            (0..PER_BUCKET)
                .map(|k| read_entry(page, k))
                .filter(|&(_, id)| id != 0)
                .collect()
        };
        let high = 1u64 << shape.level;
        let (stay, go): (Vec<_>, Vec<_>) = entries.into_iter().partition(|&(t, _)| t & high == 0);
        let mut page = pager.page_mut(T_HOOKS, from)?;
        page.replace(|b| b.fill(0));
        for (k, &(t, id)) in stay.iter().enumerate() {
            write_entry(&mut page, k, t, id);
        }
        let mut page = pager.page_new(T_HOOKS, to);
        for (k, &(t, id)) in go.iter().enumerate() {
            write_entry(&mut page, k, t, id);
        }
        self.shape.split += 1;
        if self.shape.split == high {
            self.shape.level += 1;
            self.shape.split = 0;
        }
        Ok(())
    }
}

/// The fingerprints of one chunk page's slots, as the locality cache knows them.
type PageFingerprints = Vec<Option<[u8; 16]>>;

/// Fingerprints of recently used chunk pages, and of chunks just written: where duplicates of
/// a stream are found between hooks. Bounded by a number of pages, one fingerprint per slot of
/// each; least recently used page first out. Kept in RAM only (a cold cache costs dedup,
/// never correctness).
pub struct Locality {
    max_pages: usize,
    /// Chunk page -> (last use, the fingerprint in each of its slots).
    pages: FxHashMap<u64, (u64, PageFingerprints)>,
    by_use: BTreeMap<u64, u64>,
    index: FxHashMap<[u8; 16], u64>,
    clock: u64,
}

impl Locality {
    /// Both maps are sized for the bound at once: growing them rehashes every entry, tens of
    /// milliseconds under the metadata lock at a few hundred thousand fingerprints.
    pub fn new(max_pages: usize) -> Self {
        let max_pages = max_pages.max(1);
        Locality {
            max_pages,
            pages: FxHashMap::with_capacity_and_hasher(max_pages + 1, Default::default()),
            by_use: BTreeMap::new(),
            index: FxHashMap::with_capacity_and_hasher(
                max_pages * CHUNKS_PER_PAGE as usize,
                Default::default(),
            ),
            clock: 0,
        }
    }

    pub fn get(&self, hash: &[u8; 16]) -> Option<u64> {
        self.index.get(hash).copied()
    }

    pub fn contains_page(&self, page: u64) -> bool {
        self.pages.contains_key(&page)
    }

    /// Mark chunk page `page` used (a hit in it keeps it).
    pub fn touch(&mut self, page: u64) {
        self.clock += 1;
        if let Some((stamp, _)) = self.pages.get_mut(&page) {
            self.by_use.remove(stamp);
            *stamp = self.clock;
            self.by_use.insert(self.clock, page);
        }
    }

    /// Forget `hash` if it still names chunk `id`.
    fn unindex(index: &mut FxHashMap<[u8; 16], u64>, hash: &[u8; 16], id: u64) {
        if index.get(hash) == Some(&id) {
            index.remove(hash);
        }
    }

    /// Record fingerprints of chunk page `page` (all its live entries, or chunks just
    /// written into it): each replaces what its slot held.
    pub fn add(&mut self, page: u64, entries: impl IntoIterator<Item = ([u8; 16], u64)>) {
        self.touch(page);
        if !self.pages.contains_key(&page) {
            while self.pages.len() >= self.max_pages {
                let Some((_, old)) = self.by_use.pop_first() else {
                    break;
                };
                if let Some((_, slots)) = self.pages.remove(&old) {
                    for (k, h) in slots.iter().enumerate() {
                        if let Some(h) = h {
                            Self::unindex(&mut self.index, h, old * CHUNKS_PER_PAGE + k as u64);
                        }
                    }
                }
            }
            self.clock += 1;
            self.pages
                .insert(page, (self.clock, vec![None; CHUNKS_PER_PAGE as usize]));
            self.by_use.insert(self.clock, page);
        }
        let slots = &mut self.pages.get_mut(&page).expect("just added").1;
        for (hash, id) in entries {
            debug_assert_eq!(id / CHUNKS_PER_PAGE, page);
            let k = (id % CHUNKS_PER_PAGE) as usize;
            if let Some(old) = slots[k].replace(hash) {
                Self::unindex(&mut self.index, &old, id);
            }
            self.index.insert(hash, id);
        }
    }

    /// Fingerprints held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::page_store::NothingWritten;
    use std::sync::Arc;

    fn fp(n: u64) -> [u8; 16] {
        let h = blake3::hash(&n.to_le_bytes());
        h.as_bytes()[..16].try_into().unwrap()
    }

    #[test]
    fn hooks_are_found_across_bucket_splits() {
        let mut pager = Pager::new(Arc::new(NothingWritten), 1 << 16);
        let mut hooks = Hooks::default();
        let n = 20_000u64;
        for i in 1..=n {
            hooks.insert(&mut pager, &fp(i), i).unwrap();
        }
        assert!(
            hooks.shape.buckets() > 1 << INITIAL_LEVEL,
            "{:?}",
            hooks.shape
        );
        let found = (1..=n)
            .filter(|&i| hooks.get(&mut pager, &fp(i)).unwrap() == Some(i))
            .count() as u64;
        // Splits keep the load under a half: an overflowing bucket (which drops an entry) is
        // rare.
        assert!(found >= n * 995 / 1000, "{found} of {n}");
        assert_eq!(hooks.get(&mut pager, &fp(n + 1)).unwrap(), None);
        hooks.insert(&mut pager, &fp(5), 77).unwrap();
        assert_eq!(hooks.get(&mut pager, &fp(5)).unwrap(), Some(77));
    }

    #[test]
    fn about_one_fingerprint_in_64_is_a_hook() {
        let hooks = (0..64_000u64).filter(|&i| is_hook(&fp(i))).count();
        assert!((800..1200).contains(&hooks), "{hooks}");
    }

    #[test]
    fn locality_keeps_the_pages_used_last() {
        let mut l = Locality::new(2);
        l.add(1, [(fp(1), 128)]);
        l.add(2, [(fp(2), 256)]);
        l.touch(1);
        l.add(3, [(fp(3), 384)]);
        assert_eq!(l.get(&fp(1)), Some(128));
        assert_eq!(l.get(&fp(2)), None, "least recently used page went");
        assert_eq!(l.get(&fp(3)), Some(384));
        assert!(l.contains_page(3) && !l.contains_page(2));
    }

    /// A page kept in the cache while its slots are reused holds one fingerprint per slot:
    /// steady overwrites of a small array do not grow it.
    #[test]
    fn a_reused_slot_replaces_its_fingerprint() {
        let mut l = Locality::new(4);
        for n in 0..10_000u64 {
            l.add(0, [(fp(n), 1 + n % 100)]);
        }
        assert_eq!(l.len(), 100);
        assert_eq!(l.get(&fp(9_999)), Some(100));
        assert_eq!(l.get(&fp(1)), None, "replaced in its slot");
    }
}
