//! Volume maps as copy-on-write radix trees of 4 KiB nodes (RFC 0001).
//!
//! A node holds 512 little-endian u64 entries. In a leaf (level 0) they are chunk ids (0:
//! unmapped, [`ANCHORED`]: anchored); above, they are child node ids (0: absent, reads as
//! unmapped). A volume is a root node and its height; a tree of height h maps 512^(h+1)
//! chunks, so five levels cover 2^45 chunks (128 PiB of 4 KiB chunks).
//!
//! Nodes are shared, with reference counts in the node table (as in Rodeh's shadowing
//! B-trees): a snapshot or clone takes one more reference on the source's root; a copy by
//! reference of whole 2 MiB leaves takes one more reference on each leaf. A change below a
//! node with more than one reference first copies it (the copy takes a reference on each of
//! its children: node references for interior nodes, chunk references for leaves) and drops
//! one from the original. A chunk's reference count is therefore the number of *leaf
//! instances* naming it, as it was the number of map page instances in format 2.
//!
//! A node whose count reaches zero goes on the release stack; `Release` log records pop it
//! and drop its references, so deleting a volume or unmapping a terabyte costs one record per
//! few nodes instead of one pass over every chunk under the engine's lock. Every node also
//! keeps the number of mapped and anchored entries below it, so a volume's figures are its
//! root's and space reports never walk a map.

use super::pager::{Entry, Pager};
use super::resident::ResidentTable;
use super::tables::{T_NODES, T_NODE_META};
use super::ApplyError;
use std::collections::BTreeSet;

/// Entries per node.
pub const FANOUT: u64 = 512;
const SHIFT: u32 = 9;
/// Highest tree: 512^7 = 2^63 chunks.
const MAX_HEIGHT: u8 = 6;

/// Map entry of an anchored chunk (SBC ANCHOR): no data, reads as zeros, space held for it.
/// No chunk ever has this id. Reference counting treats it as one pseudo-chunk counted per
/// leaf instance.
pub const ANCHORED: u64 = u64::MAX;

/// Whether a map entry points at stored data (not unmapped, not anchored).
pub fn holds_data(id: u64) -> bool {
    id != 0 && id != ANCHORED
}

/// What the node table keeps of each node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMeta {
    /// Volume roots and interior entries naming the node.
    pub refs: u32,
    /// 0 for leaves.
    pub level: u8,
    /// Entries below the node holding data.
    pub mapped: u64,
    /// Entries below the node anchored.
    pub anchored: u64,
}

impl Entry for NodeMeta {
    const SIZE: usize = 24;
    fn read(b: &[u8]) -> Self {
        NodeMeta {
            refs: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            level: b[4],
            mapped: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            anchored: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.refs.to_le_bytes());
        b[4] = self.level;
        b[5..8].fill(0);
        b[8..16].copy_from_slice(&self.mapped.to_le_bytes());
        b[16..24].copy_from_slice(&self.anchored.to_le_bytes());
    }
}

/// One volume's map: its size in bytes, root node (0: nothing mapped) and the root's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    pub size: u64,
    pub root: u64,
    pub height: u8,
}

/// Chunk reference counting, done by the chunk table for the trees.
pub trait ChunkRefs {
    /// One more leaf entry names `id` (a chunk, or [`ANCHORED`]).
    fn incref(&mut self, pager: &mut Pager, id: u64) -> Result<(), ApplyError>;
    /// One leaf entry less names `id`.
    fn decref(&mut self, pager: &mut Pager, id: u64) -> Result<(), ApplyError>;
}

/// Chunks mapped by a tree of height `height`.
pub fn coverage(height: u8) -> u64 {
    1u64.checked_shl(SHIFT * (height as u32 + 1))
        .unwrap_or(u64::MAX)
}

/// The lowest height whose tree maps `chunks` chunks.
pub fn height_for(chunks: u64) -> u8 {
    (0..=MAX_HEIGHT)
        .find(|&h| coverage(h) >= chunks)
        .unwrap_or(MAX_HEIGHT)
}

fn slot(index: u64, level: u8) -> usize {
    ((index >> (SHIFT * level as u32)) & (FANOUT - 1)) as usize
}

fn span(level: u8) -> u64 {
    1u64 << (SHIFT * level as u32)
}

fn entry(pager: &mut Pager, node: u64, i: usize) -> Result<u64, ApplyError> {
    let page = pager.page(T_NODES, node)?;
    Ok(u64::from_le_bytes(
        page[i * 8..i * 8 + 8].try_into().unwrap(),
    ))
}

fn set_entry(pager: &mut Pager, node: u64, i: usize, value: u64) -> Result<(), ApplyError> {
    pager.page_mut(T_NODES, node)?.set_word(i, value);
    Ok(())
}

/// The entries of node `node`.
pub fn node_entries(pager: &mut Pager, node: u64) -> Result<Vec<u64>, ApplyError> {
    let page = pager.page(T_NODES, node)?;
    Ok(page
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect())
}

/// Mapped and anchored entries among leaf entries.
fn leaf_counts(ids: impl IntoIterator<Item = u64>) -> (i64, i64) {
    ids.into_iter().fold((0, 0), |(m, a), id| {
        (m + holds_data(id) as i64, a + (id == ANCHORED) as i64)
    })
}

/// The nodes of every tree: their metadata, free ids and the release stack.
pub struct Trees {
    pub meta: ResidentTable<NodeMeta>,
    /// Ids below the table's end with no references and not awaiting release.
    free: BTreeSet<u64>,
    /// Nodes whose count reached zero, their references not yet dropped (see `Release`).
    pub releasing: Vec<u64>,
    /// Shared nodes copied since open: each copy moves chunks between shared and unique.
    pub copies: u64,
}

impl Default for Trees {
    fn default() -> Self {
        Self::new()
    }
}

impl Trees {
    pub fn new() -> Self {
        let mut meta = ResidentTable::new(T_NODE_META);
        // Id 0 means "absent" and is never a node.
        meta.push(NodeMeta::default());
        Trees {
            meta,
            free: BTreeSet::new(),
            releasing: Vec::new(),
            copies: 0,
        }
    }

    /// The trees as a checkpoint left them: `len` node ids, `releasing` awaiting release.
    pub fn from_parts(meta: ResidentTable<NodeMeta>, releasing: Vec<u64>) -> Self {
        let queued: BTreeSet<u64> = releasing.iter().copied().collect();
        let free = (1..meta.len())
            .filter(|&id| meta.get(id).refs == 0 && !queued.contains(&id))
            .collect();
        let mut meta = meta;
        if meta.is_empty() {
            meta.push(NodeMeta::default());
        }
        Trees {
            meta,
            free,
            releasing,
            copies: 0,
        }
    }

    /// Nodes in use (for figures and checks).
    pub fn live_nodes(&self) -> u64 {
        self.meta.len().saturating_sub(1 + self.free.len() as u64)
    }

    pub fn counts(&self, node: u64) -> (u64, u64) {
        if node == 0 {
            return (0, 0);
        }
        let m = self.meta.get(node);
        (m.mapped, m.anchored)
    }

    fn alloc(&mut self, pager: &mut Pager, level: u8) -> u64 {
        let id = self.free.pop_first().unwrap_or_else(|| self.meta.len());
        self.meta.set(
            id,
            NodeMeta {
                refs: 1,
                level,
                mapped: 0,
                anchored: 0,
            },
        );
        pager.page_new(T_NODES, id);
        id
    }

    fn add_counts(&mut self, node: u64, (dm, da): (i64, i64)) {
        if dm == 0 && da == 0 {
            return;
        }
        self.meta.update(node, |m| {
            m.mapped = (m.mapped as i64 + dm) as u64;
            m.anchored = (m.anchored as i64 + da) as u64;
        });
    }

    /// One reference less on `node`; at zero it awaits release.
    fn decref_node(&mut self, node: u64) -> Result<(), ApplyError> {
        let mut m = self.meta.get(node);
        if m.refs == 0 {
            return Err(ApplyError::Inconsistent(format!(
                "dereference of map node {node}, which has no references"
            )));
        }
        m.refs -= 1;
        self.meta.set(node, m);
        if m.refs == 0 {
            self.releasing.push(node);
        }
        Ok(())
    }

    pub fn incref_node(&mut self, node: u64) {
        self.meta
            .update(node, |m| m.refs = m.refs.saturating_add(1));
    }

    /// A private copy of a shared node: one more reference on each thing it names.
    fn copy_node(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        node: u64,
    ) -> Result<u64, ApplyError> {
        let m = self.meta.get(node);
        let entries = node_entries(pager, node)?;
        self.copies += 1;
        let copy = self.alloc(pager, m.level);
        let mut body = pager.page_new(T_NODES, copy);
        for (i, e) in entries.iter().enumerate() {
            body.set_word(i, *e);
        }
        self.meta.update(copy, |c| {
            c.mapped = m.mapped;
            c.anchored = m.anchored;
        });
        for &e in entries.iter().filter(|&&e| e != 0) {
            if m.level == 0 {
                refs.incref(pager, e)?;
            } else {
                self.incref_node(e);
            }
        }
        self.decref_node(node)?;
        Ok(copy)
    }

    /// `node` if only one thing names it, else a private copy of it.
    fn private(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        node: u64,
    ) -> Result<u64, ApplyError> {
        if self.meta.get(node).refs > 1 {
            self.copy_node(pager, refs, node)
        } else {
            Ok(node)
        }
    }

    /// The nodes from the root down to the one at `to_level` that maps chunk `index`, every
    /// one private to this volume, created where absent.
    fn private_path(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        vol: &mut Volume,
        index: u64,
        to_level: u8,
    ) -> Result<Vec<u64>, ApplyError> {
        vol.root = if vol.root == 0 {
            self.alloc(pager, vol.height)
        } else {
            self.private(pager, refs, vol.root)?
        };
        let mut path = vec![vol.root];
        let mut node = vol.root;
        let mut level = vol.height;
        while level > to_level {
            let s = slot(index, level);
            let child = entry(pager, node, s)?;
            let next = if child == 0 {
                self.alloc(pager, level - 1)
            } else {
                self.private(pager, refs, child)?
            };
            if next != child {
                set_entry(pager, node, s, next)?;
            }
            path.push(next);
            node = next;
            level -= 1;
        }
        Ok(path)
    }

    /// Drop the nodes at the bottom of `path` (the private path to chunk `index`) that map
    /// nothing any more, so empty leaves and their empty parents do not linger.
    fn prune(
        &mut self,
        pager: &mut Pager,
        vol: &mut Volume,
        path: &[u64],
        index: u64,
    ) -> Result<(), ApplyError> {
        for i in (0..path.len()).rev() {
            let node = path[i];
            if self.counts(node) != (0, 0) {
                break;
            }
            if i == 0 {
                vol.root = 0;
            } else {
                let parent_level = vol.height - (i as u8 - 1);
                set_entry(pager, path[i - 1], slot(index, parent_level), 0)?;
            }
            self.decref_node(node)?;
        }
        Ok(())
    }

    /// The entry for chunk `index`.
    pub fn get(&self, pager: &mut Pager, vol: &Volume, index: u64) -> Result<u64, ApplyError> {
        match self.leaf(pager, vol, index)? {
            0 => Ok(0),
            leaf => entry(pager, leaf, slot(index, 0)),
        }
    }

    /// The node at `level` on the way to chunk `index` and how many levels were walked, or
    /// None when the way is absent.
    fn node_at(
        &self,
        pager: &mut Pager,
        vol: &Volume,
        index: u64,
        level: u8,
    ) -> Result<Option<(u64, u8)>, ApplyError> {
        if vol.root == 0 || index >= coverage(vol.height) {
            return Ok(None);
        }
        let mut node = vol.root;
        let mut l = vol.height;
        while l > level {
            node = entry(pager, node, slot(index, l))?;
            if node == 0 {
                return Ok(None);
            }
            l -= 1;
        }
        Ok(Some((node, l)))
    }

    /// The leaf mapping chunk `index` if a change to it would copy it: it, or a node above it,
    /// is shared (the copy takes a reference on every chunk the leaf names).
    pub fn shared_leaf(
        &self,
        pager: &mut Pager,
        vol: &Volume,
        index: u64,
    ) -> Result<Option<u64>, ApplyError> {
        if vol.root == 0 || index >= coverage(vol.height) {
            return Ok(None);
        }
        let mut node = vol.root;
        let mut shared = self.meta.get(node).refs > 1;
        let mut l = vol.height;
        while l > 0 {
            node = entry(pager, node, slot(index, l))?;
            if node == 0 {
                return Ok(None);
            }
            shared |= self.meta.get(node).refs > 1;
            l -= 1;
        }
        Ok(shared.then_some(node))
    }

    /// The leaf mapping chunk `index` (0 when absent).
    pub fn leaf(&self, pager: &mut Pager, vol: &Volume, index: u64) -> Result<u64, ApplyError> {
        Ok(self.node_at(pager, vol, index, 0)?.map_or(0, |(n, _)| n))
    }

    /// Up to `max` leaves of `vol` in index order from chunk `from` (leaf-aligned), each with
    /// the chunk index it starts at and whether only this volume reaches it (every node on its
    /// path has one reference). Returns where to go on from, or None at the end. Absent
    /// subtrees are skipped, so a sparse volume costs what it maps, not what it provisions.
    pub fn leaves_from(
        &self,
        pager: &mut Pager,
        vol: &Volume,
        from: u64,
        max: usize,
        out: &mut Vec<(u64, u64, bool)>,
    ) -> Result<Option<u64>, ApplyError> {
        if vol.root == 0 {
            return Ok(None);
        }
        self.collect_leaves(pager, vol.root, vol.height, 0, true, from, max, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn collect_leaves(
        &self,
        pager: &mut Pager,
        node: u64,
        level: u8,
        node_first: u64,
        private: bool,
        from: u64,
        max: usize,
        out: &mut Vec<(u64, u64, bool)>,
    ) -> Result<Option<u64>, ApplyError> {
        let private = private && self.meta.get(node).refs == 1;
        if level == 0 {
            if out.len() >= max {
                return Ok(Some(node_first));
            }
            out.push((node_first, node, private));
            return Ok(None);
        }
        let sp = span(level);
        let entries = node_entries(pager, node)?;
        let lo = (from.saturating_sub(node_first) / sp) as usize;
        for (s, &child) in entries.iter().enumerate().skip(lo) {
            if child == 0 {
                continue;
            }
            let c_first = node_first + s as u64 * sp;
            if let Some(next) =
                self.collect_leaves(pager, child, level - 1, c_first, private, from, max, out)?
            {
                return Ok(Some(next));
            }
        }
        Ok(None)
    }

    /// Mark every node's metadata for writing (a table written whole: the migration).
    pub fn touch_all(&mut self) {
        self.meta.touch_all();
    }

    /// The nodes a lookup of chunks `first..first + count` reads, as far as they can be known
    /// without I/O (for reading them ahead of the engine's lock): each known node's page, and
    /// for the deepest cached one, the page it needs next.
    pub fn pages_for(
        &self,
        pager: &mut Pager,
        vol: &Volume,
        first: u64,
        count: u64,
        out: &mut Vec<(u8, u64)>,
    ) {
        if vol.root == 0 || count == 0 {
            return;
        }
        let mut stack = vec![(vol.root, vol.height, 0u64)];
        let end = first.saturating_add(count).min(coverage(vol.height));
        while let Some((node, level, node_first)) = stack.pop() {
            let Some(page) = pager.peek(T_NODES, node) else {
                out.push((T_NODES, node));
                continue;
            };
            if level == 0 {
                continue;
            }
            let sp = span(level);
            let from = first.max(node_first);
            let lo = ((from - node_first) / sp) as usize;
            let hi = ((end - 1 - node_first) / sp) as usize;
            for s in lo..=hi.min(FANOUT as usize - 1) {
                let child = u64::from_le_bytes(page[s * 8..s * 8 + 8].try_into().unwrap());
                if child != 0 {
                    stack.push((child, level - 1, node_first + s as u64 * sp));
                }
            }
            if out.len() > 4096 {
                return;
            }
        }
    }

    /// Entries `first..first + count`.
    pub fn entries(
        &self,
        pager: &mut Pager,
        vol: &Volume,
        first: u64,
        count: u64,
    ) -> Result<Vec<u64>, ApplyError> {
        let mut out = Vec::with_capacity(count as usize);
        let end = first + count;
        let mut i = first;
        while i < end {
            let to = end.min((i / FANOUT + 1) * FANOUT);
            let leaf = self.leaf(pager, vol, i)?;
            if leaf == 0 {
                out.resize(out.len() + (to - i) as usize, 0);
            } else {
                let page = pager.page(T_NODES, leaf)?;
                for k in i..to {
                    let s = slot(k, 0);
                    out.push(u64::from_le_bytes(
                        page[s * 8..s * 8 + 8].try_into().unwrap(),
                    ));
                }
            }
            i = to;
        }
        Ok(out)
    }

    /// Point entries `first..first + ids.len()` at `ids`. Every new reference is taken before
    /// any old one is dropped: one record may move a chunk from one slot to another, and
    /// dropping its only (old) reference first would free it.
    pub fn set_entries(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        vol: &mut Volume,
        first: u64,
        ids: &[u64],
    ) -> Result<(), ApplyError> {
        for &id in ids.iter().filter(|&&id| id != 0) {
            refs.incref(pager, id)?;
        }
        let mut released = Vec::with_capacity(ids.len());
        let mut k = 0usize;
        while k < ids.len() {
            let index = first + k as u64;
            let n = ((FANOUT - index % FANOUT) as usize).min(ids.len() - k);
            let new = &ids[k..k + n];
            if new.iter().all(|&id| id == 0) {
                // Zeros: like an unmap, nothing is created for them.
                self.fill_collect(pager, refs, vol, index, n as u64, 0, &mut released)?;
                k += n;
                continue;
            }
            let path = self.private_path(pager, refs, vol, index, 0)?;
            let leaf = *path.last().expect("a leaf");
            let mut page = pager.page_mut(T_NODES, leaf)?;
            let mut delta = (0i64, 0i64);
            for (j, &id) in new.iter().enumerate() {
                let s = slot(index + j as u64, 0);
                let old = u64::from_le_bytes(page[s * 8..s * 8 + 8].try_into().unwrap());
                page.set_word(s, id);
                let (m1, a1) = leaf_counts([id]);
                let (m0, a0) = leaf_counts([old]);
                delta.0 += m1 - m0;
                delta.1 += a1 - a0;
                if old != 0 {
                    released.push(old);
                }
            }
            for &node in &path {
                self.add_counts(node, delta);
            }
            self.prune(pager, vol, &path, index)?;
            k += n;
        }
        for old in released {
            refs.decref(pager, old)?;
        }
        Ok(())
    }

    /// Set entries `first..first + count` to `value`: 0 (unmap) or [`ANCHORED`]. Whole
    /// subtrees are dropped (unmap) or replaced (anchor) at the highest level that covers
    /// them; absent parts of the range are not visited when unmapping.
    pub fn fill(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        vol: &mut Volume,
        first: u64,
        count: u64,
        value: u64,
    ) -> Result<(), ApplyError> {
        let mut released = Vec::new();
        self.fill_collect(pager, refs, vol, first, count, value, &mut released)?;
        for old in released {
            refs.decref(pager, old)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn fill_collect(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        vol: &mut Volume,
        first: u64,
        count: u64,
        value: u64,
        released: &mut Vec<u64>,
    ) -> Result<(), ApplyError> {
        debug_assert!(!holds_data(value));
        if count == 0 || (value == 0 && vol.root == 0) {
            return Ok(());
        }
        let end = first + count;
        if first == 0 && end >= coverage(vol.height) {
            // The whole tree.
            if vol.root != 0 {
                self.decref_node(vol.root)?;
                vol.root = 0;
            }
            if value == 0 {
                return Ok(());
            }
        }
        vol.root = if vol.root == 0 {
            self.alloc(pager, vol.height)
        } else {
            self.private(pager, refs, vol.root)?
        };
        let root = vol.root;
        self.fill_node(
            pager, refs, root, vol.height, 0, first, end, value, released,
        )?;
        if self.counts(root) == (0, 0) {
            self.decref_node(root)?;
            vol.root = 0;
        }
        Ok(())
    }

    /// Fill `from..to` under private node `node` (level `level`, mapping from `node_first`);
    /// returns the change of its counts, already added to it.
    #[allow(clippy::too_many_arguments)]
    fn fill_node(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        node: u64,
        level: u8,
        node_first: u64,
        from: u64,
        to: u64,
        value: u64,
        released: &mut Vec<u64>,
    ) -> Result<(i64, i64), ApplyError> {
        let mut delta = (0i64, 0i64);
        if level == 0 {
            let mut page = pager.page_mut(T_NODES, node)?;
            for i in from..to {
                let s = (i - node_first) as usize;
                let old = u64::from_le_bytes(page[s * 8..s * 8 + 8].try_into().unwrap());
                if old == value {
                    continue;
                }
                page.set_word(s, value);
                let (m0, a0) = leaf_counts([old]);
                delta.0 -= m0;
                delta.1 += (value == ANCHORED) as i64 - a0;
                if old != 0 {
                    released.push(old);
                }
            }
            // Every entry changed to anchored is one more anchored reference.
            if value == ANCHORED {
                for _ in 0..delta.1 {
                    refs.incref(pager, ANCHORED)?;
                }
            }
            self.add_counts(node, delta);
            return Ok(delta);
        }
        let sp = span(level);
        let lo = ((from - node_first) / sp) as usize;
        let hi = ((to - 1 - node_first) / sp) as usize;
        for s in lo..=hi {
            let c_first = node_first + s as u64 * sp;
            let (c_from, c_to) = (from.max(c_first), to.min(c_first + sp));
            let child = entry(pager, node, s)?;
            let whole = c_from == c_first && c_to == c_first + sp;
            let target = if whole {
                if child != 0 {
                    let (m, a) = self.counts(child);
                    delta.0 -= m as i64;
                    delta.1 -= a as i64;
                    set_entry(pager, node, s, 0)?;
                    self.decref_node(child)?;
                }
                if value == 0 {
                    continue;
                }
                let fresh = self.alloc(pager, level - 1);
                set_entry(pager, node, s, fresh)?;
                fresh
            } else if child == 0 {
                if value == 0 {
                    continue;
                }
                let fresh = self.alloc(pager, level - 1);
                set_entry(pager, node, s, fresh)?;
                fresh
            } else {
                let own = self.private(pager, refs, child)?;
                if own != child {
                    set_entry(pager, node, s, own)?;
                }
                own
            };
            let d = self.fill_node(
                pager,
                refs,
                target,
                level - 1,
                c_first,
                c_from,
                c_to,
                value,
                released,
            )?;
            delta.0 += d.0;
            delta.1 += d.1;
            if self.counts(target) == (0, 0) {
                set_entry(pager, node, s, 0)?;
                self.decref_node(target)?;
            }
        }
        self.add_counts(node, delta);
        Ok(delta)
    }

    /// Make `dst`'s leaves from chunk `dst_first` name the same leaf nodes as `src`'s from
    /// `src_first`, for `leaves` whole leaves (both leaf-aligned): a copy by reference that
    /// costs one node reference per 512 chunks. Absent source leaves unmap the destination's.
    #[allow(clippy::too_many_arguments)]
    pub fn share_leaves(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        src: &Volume,
        src_first: u64,
        dst: &mut Volume,
        dst_first: u64,
        leaves: u64,
        released: &mut Vec<u64>,
    ) -> Result<(), ApplyError> {
        debug_assert!(src_first.is_multiple_of(FANOUT) && dst_first.is_multiple_of(FANOUT));
        // Take every reference first (the source may be the destination: a leaf that moves
        // must not reach zero on the way).
        let mut shared = Vec::with_capacity(leaves as usize);
        for k in 0..leaves {
            let leaf = self.leaf(pager, src, src_first + k * FANOUT)?;
            if leaf != 0 {
                self.incref_node(leaf);
            }
            shared.push(leaf);
        }
        for (k, &leaf) in shared.iter().enumerate() {
            let index = dst_first + k as u64 * FANOUT;
            if leaf == 0 {
                self.fill_collect(pager, refs, dst, index, FANOUT, 0, released)?;
                continue;
            }
            if dst.height == 0 {
                // The destination is one leaf: it becomes this one.
                if dst.root != 0 {
                    self.decref_node(dst.root)?;
                }
                dst.root = leaf;
                continue;
            }
            let path = self.private_path(pager, refs, dst, index, 1)?;
            let parent = *path.last().expect("a parent");
            let s = slot(index, 1);
            let old = entry(pager, parent, s)?;
            set_entry(pager, parent, s, leaf)?;
            let (m1, a1) = self.counts(leaf);
            let (m0, a0) = self.counts(old);
            let delta = (m1 as i64 - m0 as i64, a1 as i64 - a0 as i64);
            for &node in &path {
                self.add_counts(node, delta);
            }
            if old != 0 {
                self.decref_node(old)?;
            }
        }
        Ok(())
    }

    /// A new leaf holding `entries` (the migration, which sets its chunks' counts itself).
    pub fn new_leaf(&mut self, pager: &mut Pager, entries: &[u64]) -> u64 {
        let id = self.alloc(pager, 0);
        let mut page = pager.page_new(T_NODES, id);
        for (i, e) in entries.iter().enumerate() {
            page.set_word(i, *e);
        }
        let (m, a) = leaf_counts(entries.iter().copied());
        self.add_counts(id, (m, a));
        id
    }

    /// Hang `leaf` (the caller holds the reference this takes over) at chunk `index` of
    /// `vol`, where no leaf is yet (the migration builds trees this way).
    pub fn attach_leaf(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        vol: &mut Volume,
        index: u64,
        leaf: u64,
    ) -> Result<(), ApplyError> {
        if vol.height == 0 {
            if vol.root != 0 {
                return Err(ApplyError::Inconsistent(format!(
                    "a second leaf for chunk {index}"
                )));
            }
            vol.root = leaf;
            return Ok(());
        }
        let path = self.private_path(pager, refs, vol, index, 1)?;
        let parent = *path.last().expect("a parent");
        let s = slot(index, 1);
        if entry(pager, parent, s)? != 0 {
            return Err(ApplyError::Inconsistent(format!(
                "a second leaf for chunk {index}"
            )));
        }
        set_entry(pager, parent, s, leaf)?;
        let (m, a) = self.counts(leaf);
        for &node in &path {
            self.add_counts(node, (m as i64, a as i64));
        }
        Ok(())
    }

    /// A new volume sharing `src`'s tree.
    pub fn clone_volume(&mut self, src: &Volume) -> Volume {
        if src.root != 0 {
            self.incref_node(src.root);
        }
        *src
    }

    /// Drop a volume's tree (released by later `Release` records).
    pub fn drop_volume(&mut self, vol: Volume) -> Result<(), ApplyError> {
        if vol.root != 0 {
            self.decref_node(vol.root)?;
        }
        Ok(())
    }

    /// Raise the tree so it maps `chunks` chunks (a volume grown).
    pub fn grow(&mut self, pager: &mut Pager, vol: &mut Volume, chunks: u64) {
        while coverage(vol.height) < chunks && vol.height < MAX_HEIGHT {
            if vol.root != 0 {
                let counts = self.counts(vol.root);
                let top = self.alloc(pager, vol.height + 1);
                pager.page_new(T_NODES, top).set_word(0, vol.root);
                self.meta.update(top, |m| {
                    m.mapped = counts.0;
                    m.anchored = counts.1;
                });
                vol.root = top;
            }
            vol.height += 1;
        }
    }

    /// Release up to `max` nodes from the release stack: drop their references to chunks
    /// (leaves) or child nodes (interior nodes); children that reach zero are released next.
    /// Returns how many were released.
    pub fn release(
        &mut self,
        pager: &mut Pager,
        refs: &mut dyn ChunkRefs,
        max: u32,
    ) -> Result<u32, ApplyError> {
        let mut n = 0;
        while n < max {
            let Some(node) = self.releasing.pop() else {
                break;
            };
            let m = self.meta.get(node);
            for e in node_entries(pager, node)?.into_iter().filter(|&e| e != 0) {
                if m.level == 0 {
                    refs.decref(pager, e)?;
                } else {
                    self.decref_node(e)?;
                }
            }
            self.meta.set(node, NodeMeta::default());
            self.free.insert(node);
            n += 1;
        }
        Ok(n)
    }
}
