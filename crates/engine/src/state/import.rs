//! Building a state from another format's (the format 2 migration, `engine/migrate.rs`):
//! chunks, volumes and leaves put in place directly, every page dirty so the first root
//! writes them all. Nothing here is a live change; live changes are [`MetaState::apply`]'s.

use super::MetaState;
use crate::meta::hooks::is_hook;
use crate::meta::map_tree::Volume;
use crate::meta::segment_table::Segment;
use crate::meta::ApplyError;

impl MetaState {
    /// Segment `i`'s row as the other format's state has it.
    pub fn import_segment(&mut self, i: u32, row: Segment) {
        self.set_segment(i, row);
    }

    /// Room for chunk ids below `pages` pages' worth, gaps included.
    pub fn import_reserve_chunk_pages(&mut self, pages: u64) {
        self.chunks.reserve_pages(pages);
    }

    /// Chunk `id` with its record's place and its reference count, and its hook if its
    /// fingerprint makes one.
    #[allow(clippy::too_many_arguments)]
    pub fn import_chunk(
        &mut self,
        id: u64,
        hash: [u8; 16],
        segment: u32,
        offset: u32,
        len: u32,
        refs: u32,
    ) -> Result<(), ApplyError> {
        let pager = &mut self.pager;
        self.chunks.put(pager, id, hash, segment, offset, len)?;
        self.chunks.set_refs(pager, id, refs)?;
        if is_hook(&hash) {
            self.hooks.insert(pager, &hash, id)?;
        }
        Ok(())
    }

    /// The totals the imported chunks and maps add up to.
    pub fn import_totals(&mut self, live_bytes: u64, anchored: u64) {
        self.live_bytes = live_bytes;
        self.anchored = anchored;
    }

    /// Volume `id` with an empty map of the given shape.
    pub fn import_volume(&mut self, id: u32, vol: Volume) {
        self.volumes.insert(id, vol);
    }

    /// A new leaf holding `entries`.
    pub fn import_leaf(&mut self, entries: &[u64]) -> u64 {
        self.trees.new_leaf(&mut self.pager, entries)
    }

    /// One more reference to `leaf`, which another volume's map shares.
    pub fn import_shared_leaf(&mut self, leaf: u64) {
        self.trees.incref_node(leaf);
    }

    /// Every resident table's pages dirty, so the first checkpoint writes them.
    pub fn import_done(&mut self) {
        self.segments.touch_all();
        self.trees.touch_all();
        self.chunks.live_table().touch_all();
    }
}
