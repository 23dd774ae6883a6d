//! What the engine's parts may read and reach of the [`MetaState`], by name: figures the space and
//! root reports need, volume lookups, the pages a read or a check pages in, and the
//! checkpoint's freeze and thaw of the tables. The fields themselves stay private to
//! `state`, so a change to the metadata goes through [`MetaState::apply`] or one of these (RFC 0005
//! step 5).

use super::MetaState;
use crate::meta::hooks::HookShape;
use crate::meta::journal::Group;
use crate::meta::map_tree::{NodeMeta, Volume, FANOUT};
use crate::meta::page_store::PageBody;
use crate::meta::pager::{CleanedWords, FrozenPage, Pager};
use crate::meta::segment_table::Segment;
use crate::meta::tables::{CHUNK_LIVE, CHUNK_TABLE, T_NODE_META, T_SEGMENTS};
use crate::meta::{ApplyError, PageError};

/// Chunk ids with whether their leaf is the map's own, and the entry to go on from.
pub type ChunksFrom = (Vec<(u64, bool)>, Option<u64>);

impl MetaState {
    /// The page cache under every table. Readers page in through it and the checkpointer
    /// writes from it; neither changes what a table holds.
    pub fn pager(&self) -> &Pager {
        &self.pager
    }

    /// The page cache, to insert pages read outside the lock and to name where pages were
    /// written.
    pub fn pager_mut(&mut self) -> &mut Pager {
        &mut self.pager
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Anchored map entries (zeroed ranges that hold space), counted per leaf instance.
    pub fn anchored(&self) -> u64 {
        self.anchored
    }

    /// Sum of the segments' live bytes.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Whether volume `id` exists.
    pub fn has_volume(&self, id: u32) -> bool {
        self.volumes.contains_key(&id)
    }

    /// Volume `id`'s map root and size.
    pub fn volume_map(&self, id: u32) -> Option<Volume> {
        self.volumes.get(&id).copied()
    }

    /// Every volume with its map, by id.
    pub fn volume_maps(&self) -> impl Iterator<Item = (u32, &Volume)> + '_ {
        self.volumes.iter().map(|(&id, v)| (id, v))
    }

    /// Number of volumes.
    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    /// Mapped and anchored entries under a map root.
    pub fn counts(&self, vol: &Volume) -> (u64, u64) {
        self.trees.counts(vol.root)
    }

    /// What a usage walk of `volume` depends on: changes to its map, and changes of sharing
    /// anywhere (clones, copies, releases, shared nodes copied on write).
    pub fn usage_generation(&self, volume: u32) -> (u64, u64) {
        (
            self.volume_generation.get(&volume).copied().unwrap_or(0),
            self.sharing_generation + self.trees.copies,
        )
    }

    /// Stored chunks.
    pub fn unique_chunks(&self) -> u64 {
        self.chunks.len()
    }

    /// Pages of the chunk table.
    pub fn chunk_pages(&self) -> u64 {
        self.chunks.pages()
    }

    /// Page `page` of the chunk table, read into the cache if it is not there.
    pub fn chunk_page(&mut self, page: u64) -> Result<&PageBody, PageError> {
        self.pager.page(CHUNK_TABLE, page)
    }

    /// The chunk a hook names for a fingerprint, if any (the hook is advice: the caller
    /// confirms it against the chunk table).
    pub fn hook(&mut self, hash: &[u8; 16]) -> Result<Option<u64>, ApplyError> {
        self.hooks.get(&mut self.pager, hash)
    }

    /// The hook table's shape, for the root.
    pub fn hook_shape(&self) -> HookShape {
        self.hooks.shape
    }

    /// Every segment's row.
    pub fn segments(&self) -> &[Segment] {
        self.segments.as_slice()
    }

    /// The segment with the fewest live bytes, at most `limit`, among those `eligible`
    /// accepts (from the table's victim index, not a scan).
    pub fn emptiest_segment(
        &self,
        limit: u64,
        eligible: impl FnMut(u32, &Segment) -> bool,
    ) -> Option<u32> {
        self.segments.emptiest(limit, eligible)
    }

    /// Sealed segments with no live bytes.
    pub fn empty_sealed_segments(&self) -> impl Iterator<Item = u32> + '_ {
        self.segments.empty_sealed()
    }

    /// The chunk ids the leaves of `vol`'s map name from entry `from` on, leaf by leaf, at
    /// most `max_leaves` leaves, each with whether its leaf is the map's own (not shared);
    /// and the entry to go on from, if any.
    pub fn chunks_from(
        &mut self,
        vol: &Volume,
        from: u64,
        max_leaves: usize,
    ) -> Result<ChunksFrom, ApplyError> {
        let mut leaves = Vec::new();
        let next = self
            .trees
            .leaves_from(&mut self.pager, vol, from, max_leaves, &mut leaves)?;
        let mut ids = Vec::new();
        for (_, leaf, private) in leaves {
            for id in crate::meta::map_tree::node_entries(&mut self.pager, leaf)? {
                if crate::meta::map_tree::holds_data(id) {
                    ids.push((id, private));
                }
            }
        }
        Ok((ids, next))
    }

    /// The `class` of entry `index` of `vol`'s map, and how many entries from there, below
    /// `limit`, share it (at least one). An absent leaf counts as entries of 0, skipped whole.
    pub fn entry_run<K: PartialEq>(
        &mut self,
        vol: &Volume,
        index: u64,
        limit: u64,
        class: impl Fn(u64) -> K,
    ) -> Result<(K, u64), ApplyError> {
        let first = class(self.trees.get(&mut self.pager, vol, index)?);
        let mut i = index + 1;
        while i < limit {
            let leaf_end = ((i / FANOUT + 1) * FANOUT).min(limit);
            match self.trees.leaf(&mut self.pager, vol, i)? {
                0 if class(0) == first => i = leaf_end,
                0 => break,
                leaf => {
                    let entries = crate::meta::map_tree::node_entries(&mut self.pager, leaf)?;
                    let (from, to) = (
                        (i % FANOUT) as usize,
                        (leaf_end - i) as usize + (i % FANOUT) as usize,
                    );
                    match entries[from..to].iter().position(|&id| class(id) != first) {
                        Some(k) => {
                            i += k as u64;
                            break;
                        }
                        None => i = leaf_end,
                    }
                }
            }
        }
        Ok((first, i - index))
    }

    /// A new chunk id, from the chunk table's free ids or past its end.
    pub fn allocate_chunk(&mut self) -> Result<u64, ApplyError> {
        self.chunks.allocate(&mut self.pager)
    }

    /// Map nodes awaiting release, the last released first.
    pub fn releasing(&self) -> &[u64] {
        &self.trees.releasing
    }

    /// Map nodes in the node table (ids below this exist).
    pub fn node_count(&self) -> u64 {
        self.trees.meta.len()
    }

    /// Map node `id`'s level and reference count.
    pub fn node(&self, id: u64) -> NodeMeta {
        self.trees.meta.get(id)
    }

    /// Entries of map node `id` (the caller has paged it in or lets this read it).
    pub fn node_entries(&mut self, id: u64) -> Result<Vec<u64>, ApplyError> {
        crate::meta::map_tree::node_entries(&mut self.pager, id)
    }

    /// The entries of the leaf that holds `index` in `vol`'s map if another map shares that
    /// leaf (a snapshot's), else none: a write there copies the leaf first, and every chunk
    /// it names gains a reference.
    pub fn shared_leaf_entries(
        &mut self,
        vol: &Volume,
        index: u64,
    ) -> Result<Vec<u64>, ApplyError> {
        match self.trees.shared_leaf(&mut self.pager, vol, index)? {
            Some(leaf) => crate::meta::map_tree::node_entries(&mut self.pager, leaf),
            None => Ok(Vec::new()),
        }
    }

    /// Entries a table with resident rows reports in the root (0 for paged tables).
    pub fn table_entries(&self, table: u8) -> u64 {
        match table {
            T_SEGMENTS => self.segments.len(),
            T_NODE_META => self.trees.meta.len(),
            CHUNK_LIVE => self.chunks.pages(),
            _ => 0,
        }
    }

    /// Freeze every dirty page for a checkpoint: the pages in `victims` made whole, the
    /// pager's dirty pages, then the resident tables' (segments, node metadata, chunk
    /// liveness); with the words of the `cleaned` journal pages that the frozen pages do not
    /// already carry whole. Changes after this go to copies until [`MetaState::thaw`] or the
    /// pages are installed.
    pub fn freeze(
        &mut self,
        victims: &[(u8, u64)],
        cleaned: &[(u64, Vec<Group>)],
    ) -> (Vec<FrozenPage>, Vec<CleanedWords>) {
        let pool = self.pager.pool().clone();
        self.pager.make_whole(victims);
        let mut frozen = self.pager.freeze();
        let cleaning = self.pager.cleaning_words(cleaned, &frozen);
        frozen.extend(self.segments.freeze(&pool));
        frozen.extend(self.trees.meta.freeze(&pool));
        frozen.extend(self.chunks.live_table().freeze(&pool));
        (frozen, cleaning)
    }

    /// Give back pages a failed checkpoint froze, and the journal pages it had taken.
    pub fn thaw(&mut self, frozen: Vec<FrozenPage>, journal: &[u64]) {
        self.segments.thaw(&frozen);
        self.trees.meta.thaw(&frozen);
        self.chunks.live_table().thaw(&frozen);
        self.pager.thaw(frozen);
        self.pager.cancel_journal_pages(journal);
    }

    /// The chunk table's allocator starts from its lowest free id (after replay).
    pub fn reset_chunk_allocation(&mut self) {
        self.chunks.reset_allocation();
    }
}
