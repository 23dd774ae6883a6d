//! The engine's metadata as a deterministic state machine.
//!
//! Every change to volumes, maps and chunks is a log record, and [`MetaState::apply`] is the only
//! code that applies one: the live engine appends a record and applies it, recovery replays the
//! log through the same function. Live state and recovered state therefore cannot drift apart.
//!
//! The state itself is paged (RFC 0001): maps are copy-on-write trees of nodes
//! ([`crate::meta::map_tree`]), chunks live in the paged chunk table, and all of it sits in 4 KiB
//! pages behind the [`Pager`]'s bounded cache. Applying a record may read pages it needs; the
//! engine reads them ahead of its lock where it can.

use crate::format::{Record, CHUNK_PREFIX, RECORD_HEADER};
use crate::meta::chunk_table::{ChunkEntry, ChunkTable};
use crate::meta::hooks::{is_hook, Hooks};
use crate::meta::map_tree::{self, ChunkRefs, NodeMeta, Trees, Volume, ANCHORED, FANOUT};
use crate::meta::pager::Pager;
use crate::meta::resident::ResidentTable;
use crate::meta::root::Root;
use crate::meta::segment_table::SegmentTable;
use crate::meta::ApplyError;
use std::collections::{BTreeMap, HashMap, HashSet};

mod import;
mod parts;

pub use crate::meta::map_tree::holds_data;
/// A segment's row in the segment table; it lives with the table, which the state holds.
pub use crate::meta::segment_table::{SegState, Segment};

/// Largest Copy record the engine writes (it splits larger copies).
pub const MAX_COPY_CHUNKS: u64 = 64 * 1024;
/// Largest Release record the engine writes: a leaf drops up to 512 chunk references.
pub const MAX_RELEASE_NODES: u32 = 8;

/// Where a chunk's record lives in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub segment: u32,
    pub offset: u32,
}

/// References counted per chunk or node id.
pub type Counts = HashMap<u64, u64>;

/// Replay found a record that contradicts the state: metadata damage.
pub type Inconsistent = ApplyError;

type Apply = Result<(), ApplyError>;

fn inconsistent(why: String) -> ApplyError {
    ApplyError::Inconsistent(why)
}

/// The row of the segment a record of `len` bytes at `loc` lies in, after the record, from
/// the row `before` it: a segment start opens its segment (which must be empty, and the start
/// at its beginning), a seal seals the segment it ends, and any other record moves its
/// segment's end of written bytes past itself. Shared with format 2's replay, whose state keeps
/// the same rows.
pub fn row_after(
    record: &Record<'_>,
    loc: Loc,
    len: u32,
    seq: u64,
    before: Segment,
) -> Result<Segment, ApplyError> {
    let end = loc.offset + len;
    match record {
        Record::SegmentStart {
            seq: start_seq,
            segment,
        } => {
            if *segment != loc.segment || *start_seq != seq || loc.offset != 0 {
                return Err(inconsistent(format!(
                    "misplaced segment start in segment {}",
                    loc.segment
                )));
            }
            if before.live != 0 {
                return Err(inconsistent(format!(
                    "segment {segment} reused while it held live chunks"
                )));
            }
            Ok(Segment {
                state: SegState::Open,
                seq,
                written: end,
                live: 0,
            })
        }
        Record::Seal { .. } => Ok(Segment {
            state: SegState::Sealed,
            seq,
            written: end,
            ..before
        }),
        _ => Ok(Segment {
            state: SegState::Open,
            seq,
            written: end,
            ..before
        }),
    }
}

/// Everything the engine knows besides the data itself. Its fields are private: records change
/// it through [`MetaState::apply`], and the engine's parts read and reach it through the methods
/// named for what they need (`parts.rs`).
pub struct MetaState {
    pager: Pager,
    chunks: ChunkTable,
    segments: SegmentTable,
    trees: Trees,
    volumes: BTreeMap<u32, Volume>,
    hooks: Hooks,
    chunk_size: u32,
    /// Anchored map entries, counted like references (per leaf instance).
    anchored: u64,
    /// Sum of the segments' `live` bytes, kept with them so space figures need no walk.
    live_bytes: u64,
    /// Bumped by every change to a volume's map (for cached usage walks).
    volume_generation: HashMap<u32, u64>,
    /// Bumped by every change that can move a chunk between shared and unique.
    sharing_generation: u64,
}

/// The chunk reference counting the trees call back into.
struct Refs<'a> {
    chunks: &'a mut ChunkTable,
    segments: &'a mut SegmentTable,
    anchored: &'a mut u64,
    live_bytes: &'a mut u64,
}

impl ChunkRefs for Refs<'_> {
    fn incref(&mut self, pager: &mut Pager, id: u64) -> Apply {
        if id == ANCHORED {
            *self.anchored += 1;
            return Ok(());
        }
        self.chunks.incref(pager, id)
    }

    fn decref(&mut self, pager: &mut Pager, id: u64) -> Apply {
        if id == ANCHORED {
            *self.anchored = self
                .anchored
                .checked_sub(1)
                .ok_or_else(|| inconsistent("anchored entry count below zero".into()))?;
            return Ok(());
        }
        if let Some(freed) = self.chunks.decref(pager, id)? {
            self.segments
                .update(freed.segment as u64, |s| s.live -= freed.len as u64);
            *self.live_bytes -= freed.len as u64;
        }
        Ok(())
    }
}

impl MetaState {
    pub fn new(chunk_size: u32, segment_count: u32, pager: Pager) -> Self {
        let mut segments = SegmentTable::new();
        for _ in 0..segment_count {
            segments.push(Segment::FREE);
        }
        MetaState {
            pager,
            chunks: ChunkTable::new(),
            segments,
            trees: Trees::new(),
            volumes: BTreeMap::new(),
            hooks: Hooks::default(),
            chunk_size,
            anchored: 0,
            live_bytes: 0,
            volume_generation: HashMap::new(),
            sharing_generation: 0,
        }
    }

    /// The state a root and the tables it names hold, as loaded at open (the log after the
    /// root is replayed on top).
    pub fn loaded(
        pager: Pager,
        segments: SegmentTable,
        nodes: ResidentTable<NodeMeta>,
        live: ResidentTable<u16>,
        root: &Root,
    ) -> Self {
        MetaState {
            pager,
            chunks: ChunkTable::from_live(live),
            segments,
            trees: Trees::from_parts(nodes, root.releasing.clone()),
            volumes: root.volumes.iter().copied().collect(),
            hooks: Hooks { shape: root.hooks },
            chunk_size: root.geometry.chunk_size,
            anchored: root.anchored,
            live_bytes: root.live_bytes,
            volume_generation: HashMap::new(),
            sharing_generation: 0,
        }
    }

    /// Chunks per volume of `size` bytes.
    pub fn chunks_of(&self, size: u64) -> u64 {
        size.div_ceil(self.chunk_size as u64)
    }

    pub fn segment(&self, i: u32) -> Segment {
        self.segments.get(i as u64)
    }

    pub fn segment_count(&self) -> u32 {
        self.segments.len() as u32
    }

    fn set_segment(&mut self, i: u32, s: Segment) {
        self.segments.set(i as u64, s);
    }

    fn update_segment(&mut self, i: u32, f: impl FnOnce(&mut Segment)) {
        self.segments.update(i as u64, f);
    }

    /// The stored chunk `id`, if any.
    pub fn chunk(&mut self, id: u64) -> Result<Option<ChunkEntry>, ApplyError> {
        self.chunks.get(&mut self.pager, id)
    }

    /// Mapped and anchored entries of a volume.
    pub fn volume_counts(&self, volume: u32) -> Option<(u64, u64)> {
        self.volumes.get(&volume).map(|v| self.trees.counts(v.root))
    }

    /// Entry `index` of `volume`.
    pub fn entry(&mut self, volume: u32, index: u64) -> Result<u64, ApplyError> {
        let vol = *self.volume(volume)?;
        self.trees.get(&mut self.pager, &vol, index)
    }

    /// Entries `first..first + count` of `volume`.
    pub fn entries(&mut self, volume: u32, first: u64, count: u64) -> Result<Vec<u64>, ApplyError> {
        let vol = *self.volume(volume)?;
        self.trees.entries(&mut self.pager, &vol, first, count)
    }

    fn volume(&self, id: u32) -> Result<&Volume, ApplyError> {
        self.volumes
            .get(&id)
            .ok_or_else(|| inconsistent(format!("volume {id} does not exist")))
    }

    fn check_range(&self, volume: u32, first: u64, count: u64) -> Apply {
        let limit = self.chunks_of(self.volume(volume)?.size);
        match first.checked_add(count) {
            Some(end) if end <= limit => Ok(()),
            _ => Err(inconsistent(format!(
                "range {first}+{count} beyond volume {volume} ({limit} chunks)"
            ))),
        }
    }

    /// A copy record's ranges lie within both volumes, and it copies no more than a record may.
    fn check_copy(&self, src: u32, src_first: u64, dst: u32, dst_first: u64, count: u64) -> Apply {
        if count > MAX_COPY_CHUNKS {
            return Err(inconsistent(format!(
                "copy of {count} chunks in one record"
            )));
        }
        self.check_range(src, src_first, count)?;
        self.check_range(dst, dst_first, count)
    }

    fn touched(&mut self, volume: u32) {
        *self.volume_generation.entry(volume).or_insert(0) += 1;
    }

    /// The trees, the pager and the chunk reference counting the trees call back into.
    fn tree_parts(&mut self) -> (&mut Trees, &mut Pager, Refs<'_>) {
        let MetaState {
            pager,
            chunks,
            segments,
            trees,
            anchored,
            live_bytes,
            ..
        } = self;
        let refs = Refs {
            chunks,
            segments,
            anchored,
            live_bytes,
        };
        (trees, pager, refs)
    }

    /// Run `f` on one volume's tree with the chunk reference counting wired up.
    pub(crate) fn with_tree<T>(
        &mut self,
        volume: u32,
        f: impl FnOnce(&mut Trees, &mut Pager, &mut dyn ChunkRefs, &mut Volume) -> Result<T, ApplyError>,
    ) -> Result<T, ApplyError> {
        let mut vol = *self.volume(volume)?;
        let (trees, pager, mut refs) = self.tree_parts();
        let out = f(trees, pager, &mut refs, &mut vol)?;
        self.volumes.insert(volume, vol);
        self.touched(volume);
        Ok(out)
    }

    /// Whether `record` fits the state as it is (volumes exist, ranges lie inside them, the
    /// release stack holds what it pops), without changing anything. The live engine checks
    /// every record with this before writing it, so a command that raced a change to its
    /// volume (a delete, a shrink) is refused instead of writing a record `apply` would refuse
    /// on replay. Chunk references are not checked: a batch's own chunk records come first.
    pub fn validate(&self, record: &Record<'_>) -> Apply {
        match record {
            Record::Map { volume, first, ids } => {
                self.check_range(*volume, *first, ids.len() as u64)
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
            } => self.check_range(*volume, *first, *count),
            Record::Copy {
                src,
                src_first,
                dst,
                dst_first,
                count,
            } => self.check_copy(*src, *src_first, *dst, *dst_first, *count),
            Record::VolumeCreate { volume, .. }
                if self.volumes.contains_key(volume) || *volume == 0 =>
            {
                Err(inconsistent(format!("volume {volume} created twice")))
            }
            Record::VolumeDelete { volume } | Record::VolumeResize { volume, .. } => {
                self.volume(*volume).map(|_| ())
            }
            Record::VolumeClone { src, dst } => {
                if self.volumes.contains_key(dst) || *dst == 0 {
                    return Err(inconsistent(format!("clone into existing volume {dst}")));
                }
                self.volume(*src).map(|_| ())
            }
            Record::Release { nodes } => {
                if *nodes as usize > self.trees.releasing.len() || *nodes > MAX_RELEASE_NODES {
                    return Err(inconsistent(format!(
                        "release of {nodes} nodes with {} awaiting release",
                        self.trees.releasing.len()
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Apply one record of `len` bytes found at `loc` (its header's position) in the segment
    /// of sequence `seq`: its change to the metadata, then its segment's row (see
    /// [`row_after`]). Live appends and replay both come here, so no other code writes a
    /// segment's row while the log is written; freeing a collected segment, which has no
    /// record, is [`MetaState::free_sealed`].
    pub fn apply(&mut self, record: &Record<'_>, loc: Loc, len: u32, seq: u64) -> Apply {
        if loc.segment >= self.segment_count() {
            return Err(inconsistent(format!(
                "a record in segment {}, beyond the log",
                loc.segment
            )));
        }
        // Checked before anything changes; the change may move the segment's live bytes
        // (a chunk record), which the row then keeps.
        let row = row_after(record, loc, len, seq, self.segment(loc.segment))?;
        self.change(record, loc, seq)?;
        self.update_segment(loc.segment, |s| {
            s.state = row.state;
            s.seq = row.seq;
            s.written = row.written;
        });
        Ok(())
    }

    /// Apply the seal written at `at`, ending the segment of sequence `seq` and naming
    /// `next_segment`, whose start carries `next_seq`.
    pub fn apply_seal(&mut self, at: Loc, seq: u64, next_segment: u32, next_seq: u64) -> Apply {
        let seal = Record::Seal {
            next_segment,
            next_seq,
        };
        self.apply(&seal, at, crate::format::SEAL_LEN as u32, seq)
    }

    /// Apply the start record written at the beginning of `segment` under sequence `seq`.
    pub fn apply_start(&mut self, segment: u32, seq: u64) -> Apply {
        let start = Record::SegmentStart { seq, segment };
        let at = Loc { segment, offset: 0 };
        self.apply(&start, at, crate::format::SEGMENT_START_LEN as u32, seq)
    }

    /// Free a sealed segment the collector emptied: it has no log record, and takes new
    /// records only after a segment start opens it again. A segment that is not sealed or
    /// still holds live bytes is refused with its row.
    pub fn free_sealed(&mut self, i: u32) -> Result<(), Segment> {
        let s = self.segment(i);
        if s.live != 0 || s.state != SegState::Sealed {
            return Err(s);
        }
        self.update_segment(i, |s| {
            s.state = SegState::Free;
            s.written = 0;
        });
        Ok(())
    }

    /// After a crash that left nothing to seal the torn head with (every segment held live
    /// chunks or records replay needs), appending goes on in the torn segment from `offset`
    /// under the same sequence: the repair writes no record, so this sets the row.
    pub fn resume_torn(&mut self, segment: u32, seq: u64, offset: u32) {
        self.update_segment(segment, |s| {
            s.state = SegState::Open;
            s.seq = seq;
            s.written = offset;
        });
    }

    /// A record's change to the metadata (segment rows aside).
    fn change(&mut self, record: &Record<'_>, loc: Loc, seq: u64) -> Apply {
        match record {
            Record::SegmentStart { .. } | Record::Seal { .. } => Ok(()),
            Record::Chunk { id, hash, data, .. } => {
                let len = (RECORD_HEADER + CHUNK_PREFIX + data.len()) as u32;
                self.put_chunk(*id, *hash, loc, len)
            }
            Record::Map { volume, first, ids } => {
                self.check_range(*volume, *first, ids.len() as u64)?;
                // Validate before changing anything: a refused record leaves no trace.
                let ids: Vec<u64> = ids.iter().collect();
                for &id in ids.iter().filter(|&&id| holds_data(id)) {
                    if self.chunk(id)?.is_none() {
                        return Err(inconsistent(format!("reference to missing chunk {id}")));
                    }
                }
                let first = *first;
                self.with_tree(*volume, |trees, pager, refs, vol| {
                    trees.set_entries(pager, refs, vol, first, &ids)
                })
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
                let (first, count) = (*first, *count);
                self.with_tree(*volume, |trees, pager, refs, vol| {
                    trees.fill(pager, refs, vol, first, count, value)
                })
            }
            Record::Copy {
                src,
                src_first,
                dst,
                dst_first,
                count,
            } => {
                self.check_copy(*src, *src_first, *dst, *dst_first, *count)?;
                self.copy(*src, *src_first, *dst, *dst_first, *count)
            }
            Record::VolumeCreate { volume, size } => {
                if self.volumes.contains_key(volume) || *volume == 0 {
                    return Err(inconsistent(format!("volume {volume} created twice")));
                }
                let height = map_tree::height_for(self.chunks_of(*size));
                self.volumes.insert(
                    *volume,
                    Volume {
                        size: *size,
                        root: 0,
                        height,
                    },
                );
                self.touched(*volume);
                Ok(())
            }
            Record::VolumeDelete { volume } => {
                let vol = self
                    .volumes
                    .remove(volume)
                    .ok_or_else(|| inconsistent(format!("delete of missing volume {volume}")))?;
                self.volume_generation.remove(volume);
                self.sharing_generation += 1;
                self.trees.drop_volume(vol)
            }
            Record::VolumeResize { volume, size } => {
                let old = self.chunks_of(self.volume(*volume)?.size);
                let new = self.chunks_of(*size);
                let size = *size;
                self.with_tree(*volume, |trees, pager, refs, vol| {
                    if new < old {
                        trees.fill(pager, refs, vol, new, old - new, 0)?;
                    } else {
                        trees.grow(pager, vol, new);
                    }
                    vol.size = size;
                    Ok(())
                })
            }
            Record::VolumeClone { src, dst } => {
                if self.volumes.contains_key(dst) || *dst == 0 {
                    return Err(inconsistent(format!("clone into existing volume {dst}")));
                }
                let src = *self.volume(*src)?;
                let copy = self.trees.clone_volume(&src);
                self.volumes.insert(*dst, copy);
                self.touched(*dst);
                self.sharing_generation += 1;
                Ok(())
            }
            Record::Batch { inner } => {
                for item in crate::format::covered_records(inner, seq) {
                    let (at, record) =
                        item.map_err(|e| inconsistent(format!("bad record in batch: {e:?}")))?;
                    let inner_loc = Loc {
                        segment: loc.segment,
                        offset: loc.offset + (RECORD_HEADER + at) as u32,
                    };
                    self.change(&record, inner_loc, seq)?;
                }
                Ok(())
            }
            Record::Release { nodes } => {
                if *nodes as usize > self.trees.releasing.len() || *nodes > MAX_RELEASE_NODES {
                    return Err(inconsistent(format!(
                        "release of {nodes} nodes with {} awaiting release",
                        self.trees.releasing.len()
                    )));
                }
                self.sharing_generation += 1;
                let (trees, pager, mut refs) = self.tree_parts();
                trees.release(pager, &mut refs, *nodes).map(|_| ())
            }
        }
    }

    fn put_chunk(&mut self, id: u64, hash: [u8; 16], loc: Loc, len: u32) -> Apply {
        if id == 0 || id == ANCHORED || loc.segment >= self.segment_count() {
            return Err(inconsistent(format!("chunk {id} at an impossible place")));
        }
        let old = self
            .chunks
            .put(&mut self.pager, id, hash, loc.segment, loc.offset, len)?;
        match old {
            // A relocation by the garbage collector: same content, new place.
            Some(old) => {
                self.update_segment(old.segment, |s| s.live -= old.len as u64);
                self.live_bytes -= old.len as u64;
            }
            None => {
                if is_hook(&hash) {
                    self.hooks.insert(&mut self.pager, &hash, id)?;
                }
            }
        }
        self.update_segment(loc.segment, |s| s.live += len as u64);
        self.live_bytes += len as u64;
        Ok(())
    }

    /// A Copy record: memmove semantics when the ranges overlap; whole leaves shared by
    /// reference where both ranges line up on leaf boundaries.
    fn copy(&mut self, src: u32, src_first: u64, dst: u32, dst_first: u64, count: u64) -> Apply {
        let overlapping =
            src == dst && src_first < dst_first + count && dst_first < src_first + count;
        self.sharing_generation += 1;
        if overlapping || src_first % FANOUT != dst_first % FANOUT {
            // Read the whole source first: memmove semantics for overlapping ranges.
            let ids = self.entries(src, src_first, count)?;
            return self.with_tree(dst, |trees, pager, refs, vol| {
                trees.set_entries(pager, refs, vol, dst_first, &ids)
            });
        }
        let head = ((FANOUT - src_first % FANOUT) % FANOUT).min(count);
        let leaves = (count - head) / FANOUT;
        let tail = count - head - leaves * FANOUT;
        let pieces = [
            (0, head, false),
            (head, leaves * FANOUT, true),
            (head + leaves * FANOUT, tail, false),
        ];
        for (off, n, whole) in pieces {
            if n == 0 {
                continue;
            }
            if whole {
                let src_vol = *self.volume(src)?;
                self.with_tree(dst, |trees, pager, refs, vol| {
                    let mut released = Vec::new();
                    // The source may be the destination volume (ranges apart): its tree is
                    // the one being changed, so read the source from it.
                    let from = if src == dst { *vol } else { src_vol };
                    trees.share_leaves(
                        pager,
                        refs,
                        &from,
                        src_first + off,
                        vol,
                        dst_first + off,
                        n / FANOUT,
                        &mut released,
                    )?;
                    for id in released {
                        refs.decref(pager, id)?;
                    }
                    Ok(())
                })?;
            } else {
                let ids = self.entries(src, src_first + off, n)?;
                self.with_tree(dst, |trees, pager, refs, vol| {
                    trees.set_entries(pager, refs, vol, dst_first + off, &ids)
                })?;
            }
        }
        Ok(())
    }

    /// Differences between the counters kept incrementally (per node mapped and anchored
    /// entries, live bytes) and the same figures recounted. Empty when they agree; walks every
    /// tree, so for tests and small arrays (the checker streams its own recount).
    pub fn audit_counters(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let volumes: Vec<(u32, Volume)> = self.volumes.iter().map(|(k, v)| (*k, *v)).collect();
        let mut seen = HashSet::new();
        for (id, vol) in volumes {
            match self.recount(vol.root, &mut seen) {
                Ok(()) => {}
                Err(e) => out.push(format!("volume {id}: {e}")),
            }
        }
        if let Err(e) = self.segments.audit() {
            out.push(e);
        }
        let live: u64 = self.segments.as_slice().iter().map(|s| s.live).sum();
        if live != self.live_bytes {
            out.push(format!(
                "{} live bytes counted, {live} in the segment table",
                self.live_bytes
            ));
        }
        out
    }

    /// Check the counts of `node` and below against its entries.
    fn recount(&mut self, node: u64, seen: &mut HashSet<u64>) -> Result<(), String> {
        if node == 0 || !seen.insert(node) {
            return Ok(());
        }
        let meta = self.trees.meta.get(node);
        let entries = map_tree::node_entries(&mut self.pager, node).map_err(|e| e.to_string())?;
        let (mut mapped, mut anchored) = (0, 0);
        if meta.level == 0 {
            for &e in &entries {
                mapped += holds_data(e) as u64;
                anchored += (e == ANCHORED) as u64;
            }
        } else {
            for &child in entries.iter().filter(|&&c| c != 0) {
                self.recount(child, seen)?;
                let (m, a) = self.trees.counts(child);
                mapped += m;
                anchored += a;
            }
        }
        if (meta.mapped, meta.anchored) != (mapped, anchored) {
            return Err(format!(
                "node {node}: {} mapped and {} anchored entries counted, {mapped} and \
                 {anchored} below it",
                meta.mapped, meta.anchored
            ));
        }
        Ok(())
    }

    /// Recompute every chunk's reference count and every node's from the trees (the checker
    /// and the tests audit the counts kept incrementally with these). Anchored entries are
    /// counted under [`ANCHORED`]. Holds a count per chunk: for tests and small arrays.
    pub fn count_references(&mut self) -> Result<(Counts, Counts), ApplyError> {
        let mut chunk_refs = HashMap::new();
        let mut node_refs: HashMap<u64, u64> = HashMap::new();
        let mut stack: Vec<u64> = Vec::new();
        for vol in self.volumes.values() {
            if vol.root != 0 {
                *node_refs.entry(vol.root).or_insert(0) += 1;
                stack.push(vol.root);
            }
        }
        // Nodes awaiting release still hold their references.
        stack.extend(self.trees.releasing.iter().copied());
        let mut seen = HashSet::new();
        while let Some(node) = stack.pop() {
            if !seen.insert(node) {
                continue;
            }
            let level = self.trees.meta.get(node).level;
            for e in map_tree::node_entries(&mut self.pager, node)? {
                if e == 0 {
                    continue;
                }
                if level == 0 {
                    *chunk_refs.entry(e).or_insert(0) += 1;
                } else {
                    *node_refs.entry(e).or_insert(0) += 1;
                    stack.push(e);
                }
            }
        }
        Ok((chunk_refs, node_refs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{decode, Encoder};
    use crate::meta::page_store::NothingWritten;
    use std::sync::Arc;

    const LOC: Loc = Loc {
        segment: 0,
        offset: 0,
    };

    fn state_with_chunks(n: u64) -> MetaState {
        let mut s = MetaState::new(4096, 4, Pager::new(Arc::new(NothingWritten), 1 << 16));
        for id in 1..=n {
            s.put_chunk(id, [id as u8; 16], LOC, 100).unwrap();
        }
        s.apply(
            &Record::VolumeCreate {
                volume: 1,
                size: 64 << 20,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        s
    }

    #[test]
    fn segment_rows_follow_starts_records_and_seals_only() {
        let mut s = MetaState::new(4096, 4, Pager::new(Arc::new(NothingWritten), 1 << 16));
        let at = |segment, offset| Loc { segment, offset };
        let start = Record::SegmentStart { seq: 7, segment: 2 };
        let start_len = crate::format::SEGMENT_START_LEN as u32;
        // A start elsewhere than at its segment's beginning, or under another sequence, is
        // refused and changes nothing.
        assert!(s.apply(&start, at(2, 64), start_len, 7).is_err());
        assert!(s.apply(&start, at(2, 0), start_len, 8).is_err());
        assert_eq!(s.segment(2).state, SegState::Free);
        s.apply(&start, at(2, 0), start_len, 7).unwrap();
        let open = s.segment(2);
        assert_eq!(
            (open.state, open.seq, open.written),
            (SegState::Open, 7, start_len)
        );
        // A chunk record adds its bytes to the segment's live ones and moves its end.
        let mut out = Vec::new();
        Encoder::new(&mut out, 7).chunk(1, crate::format::Codec::Raw, &[1; 16], &[9; 100]);
        let len = out.len();
        let (chunk, _) = decode(&out, 7).unwrap();
        s.apply(&chunk, at(2, start_len), len as u32, 7).unwrap();
        let row = s.segment(2);
        assert_eq!(row.written, start_len + len as u32);
        assert_eq!(row.live, len as u64);
        // An open segment or one holding live bytes is not freed.
        assert!(s.free_sealed(2).is_err());
        let seal = Record::Seal {
            next_segment: 3,
            next_seq: 8,
        };
        let seal_len = crate::format::SEAL_LEN as u32;
        s.apply(&seal, at(2, row.written), seal_len, 7).unwrap();
        let sealed = s.segment(2);
        assert_eq!(sealed.state, SegState::Sealed);
        assert_eq!(sealed.written, row.written + seal_len);
        assert_eq!(sealed.live, len as u64, "a seal keeps the live bytes");
        assert_eq!(s.free_sealed(2).unwrap_err().live, len as u64);
        // A segment that still holds live chunks cannot be started again.
        let again = Record::SegmentStart { seq: 9, segment: 2 };
        assert!(s.apply(&again, at(2, 0), start_len, 9).is_err());
        // Nor can a record name a segment beyond the log.
        assert!(s.apply(&seal, at(4, 0), seal_len, 7).is_err());
    }

    fn refs(s: &mut MetaState, id: u64) -> u32 {
        s.chunk(id).unwrap().map_or(0, |c| c.refs)
    }

    fn map(s: &mut MetaState, volume: u32, first: u64, ids: &[u64]) {
        let mut out = Vec::new();
        Encoder::new(&mut out, 0).map(volume, first, ids);
        let (record, _) = decode(&out, 0).unwrap();
        s.apply(&record, LOC, 0, 0).unwrap();
    }

    fn get(s: &mut MetaState, volume: u32, index: u64) -> u64 {
        s.entry(volume, index).unwrap()
    }

    fn release_all(s: &mut MetaState) {
        while !s.trees.releasing.is_empty() {
            let n = (s.trees.releasing.len() as u32).min(MAX_RELEASE_NODES);
            s.apply(&Record::Release { nodes: n }, LOC, 0, 0).unwrap();
        }
    }

    /// The counts kept incrementally equal a recount from the trees.
    fn audit(s: &mut MetaState) {
        assert_eq!(s.audit_counters(), Vec::<String>::new());
        let (chunk_refs, node_refs) = s.count_references().unwrap();
        for (&id, &n) in &chunk_refs {
            if id == ANCHORED {
                assert_eq!(s.anchored, n, "anchored entries");
            } else {
                assert_eq!(refs(s, id) as u64, n, "chunk {id}");
            }
        }
        for (&node, &n) in &node_refs {
            let pending: u64 = s.trees.releasing.iter().filter(|&&x| x == node).count() as u64;
            assert_eq!(
                s.trees.meta.get(node).refs as u64,
                n,
                "node {node} ({pending})"
            );
        }
    }

    #[test]
    fn snapshot_shares_nodes_and_copy_on_write_keeps_counts_exact() {
        let mut s = state_with_chunks(3);
        map(&mut s, 1, 0, &[1, 2, 2]);
        assert_eq!(refs(&mut s, 2), 2);
        s.apply(&Record::VolumeClone { src: 1, dst: 2 }, LOC, 0, 0)
            .unwrap();
        // Shared tree: counts unchanged.
        assert_eq!(refs(&mut s, 1), 1);
        map(&mut s, 2, 0, &[3]);
        // Volume 2 took a private copy (+1 on 1, 2, 2) then replaced 1 by 3.
        assert_eq!(refs(&mut s, 1), 1);
        assert_eq!(refs(&mut s, 2), 4);
        assert_eq!(s.volume_counts(1), Some((3, 0)));
        assert_eq!(s.volume_counts(2), Some((3, 0)));
        audit(&mut s);
        assert_eq!(refs(&mut s, 3), 1);
        assert_eq!(get(&mut s, 1, 0), 1);
        assert_eq!(get(&mut s, 2, 0), 3);
        s.apply(&Record::VolumeDelete { volume: 1 }, LOC, 0, 0)
            .unwrap();
        assert_eq!(refs(&mut s, 1), 1, "released only by Release records");
        release_all(&mut s);
        assert!(s.chunk(1).unwrap().is_none(), "chunk 1 freed");
        assert_eq!(refs(&mut s, 2), 2);
        audit(&mut s);
    }

    #[test]
    fn unmap_of_whole_and_partial_leaves() {
        let mut s = state_with_chunks(2);
        let ids: Vec<u64> = (0..3000).map(|i| 1 + (i % 2)).collect();
        map(&mut s, 1, 10, &ids);
        assert_eq!(refs(&mut s, 1) + refs(&mut s, 2), 3000);
        s.apply(
            &Record::Unmap {
                volume: 1,
                first: 0,
                count: 2048,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        release_all(&mut s);
        let left = (2048..3010u64).filter(|&i| get(&mut s, 1, i) != 0).count() as u32;
        assert_eq!(left, 962);
        assert_eq!(refs(&mut s, 1) + refs(&mut s, 2), left);
        audit(&mut s);
        s.apply(
            &Record::Unmap {
                volume: 1,
                first: 0,
                count: 16384,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        release_all(&mut s);
        assert_eq!(s.volumes[&1].root, 0, "an empty tree holds no node");
        assert!(s.chunk(1).unwrap().is_none() && s.chunk(2).unwrap().is_none());
        assert_eq!(s.segment(0).live, 0);
        assert_eq!(s.trees.live_nodes(), 0);
    }

    #[test]
    fn counters_kept_incrementally_match_a_recount() {
        let mut s = state_with_chunks(3);
        let per = FANOUT;
        let ids: Vec<u64> = (0..3 * per).map(|i| 1 + i % 3).collect();
        map(&mut s, 1, 5, &ids);
        // Keeps every chunk alive through the unmaps below.
        map(&mut s, 1, 15_000, &[1, 2, 3]);
        assert_eq!(s.volume_counts(1), Some((3 * per + 3, 0)));
        let steps = [
            (false, 100, 10),
            (true, 200, per),
            (true, 0, 4 * per),
            (false, per, per),
            (true, 2 * per, 3),
        ];
        for (anchor, first, count) in steps {
            let record = if anchor {
                Record::Anchor {
                    volume: 1,
                    first,
                    count,
                }
            } else {
                Record::Unmap {
                    volume: 1,
                    first,
                    count,
                }
            };
            s.apply(&record, LOC, 0, 0).unwrap();
            release_all(&mut s);
            audit(&mut s);
        }
        assert_eq!(s.volume_counts(1).unwrap().1, 3 * per);
        map(&mut s, 1, 2 * per, &[1, 2, 0, 3]);
        s.apply(&Record::VolumeClone { src: 1, dst: 2 }, LOC, 0, 0)
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
            0,
        )
        .unwrap();
        release_all(&mut s);
        audit(&mut s);
        assert_eq!(s.volume_counts(1).unwrap().0, 1);
        assert_eq!(s.volume_counts(2).unwrap().0, 3 + 3 + 3);
        s.apply(&Record::VolumeDelete { volume: 2 }, LOC, 0, 0)
            .unwrap();
        release_all(&mut s);
        audit(&mut s);
        // A wrong count is reported.
        s.live_bytes += 1;
        assert_eq!(s.audit_counters().len(), 1);
    }

    #[test]
    fn copies_of_whole_leaves_share_them() {
        let mut s = state_with_chunks(4);
        let ids: Vec<u64> = (0..4 * FANOUT).map(|i| 1 + i % 4).collect();
        map(&mut s, 1, 0, &ids);
        s.apply(
            &Record::VolumeCreate {
                volume: 2,
                size: 64 << 20,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        let before = refs(&mut s, 1);
        s.apply(
            &Record::Copy {
                src: 1,
                src_first: 10,
                dst: 2,
                dst_first: 8192 + 10,
                count: 3 * FANOUT,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        // Two whole leaves shared (no chunk reference taken for them), two partial ones copied.
        let copied_partially = (10..FANOUT).chain(2 * FANOUT + FANOUT..3 * FANOUT + 10);
        let expected = copied_partially.filter(|i| i % 4 == 0).count() as u32;
        assert_eq!(refs(&mut s, 1) - before, expected);
        for i in [10, 600, 1500, 3 * FANOUT + 9] {
            assert_eq!(get(&mut s, 2, 8192 + i), get(&mut s, 1, i), "entry {i}");
        }
        assert_eq!(get(&mut s, 2, 8192 + 9), 0);
        // Changing the shared leaf in the destination copies it; the source keeps its data.
        map(&mut s, 2, 8192 + FANOUT + 1, &[4]);
        assert_eq!(get(&mut s, 1, FANOUT + 1), 2);
        assert_eq!(get(&mut s, 2, 8192 + FANOUT + 1), 4);
        audit(&mut s);
        // Within one volume, ranges apart.
        s.apply(
            &Record::Copy {
                src: 1,
                src_first: 0,
                dst: 1,
                dst_first: 8 * FANOUT,
                count: 2 * FANOUT,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        assert_eq!(get(&mut s, 1, 8 * FANOUT + 5), get(&mut s, 1, 5));
        audit(&mut s);
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
            0,
        )
        .unwrap();
        let got: Vec<u64> = (0..4).map(|i| get(&mut s, 1, i)).collect();
        assert_eq!(got, vec![1, 1, 2, 3]);
        assert!(s.chunk(4).unwrap().is_none());
        assert_eq!(refs(&mut s, 1), 2);
    }

    #[test]
    fn records_that_contradict_the_state_are_refused() {
        let mut s = state_with_chunks(1);
        let mut out = Vec::new();
        Encoder::new(&mut out, 0).map(1, 0, &[9]);
        let (record, _) = decode(&out, 0).unwrap();
        assert!(
            s.apply(&record, LOC, 0, 0).is_err(),
            "reference to a missing chunk"
        );
        let r = s.apply(
            &Record::Unmap {
                volume: 1,
                first: 16383,
                count: 2,
            },
            LOC,
            0,
            0,
        );
        assert!(r.is_err(), "range beyond the end");
        assert!(s
            .apply(&Record::VolumeDelete { volume: 7 }, LOC, 0, 0)
            .is_err());
        assert!(s.apply(&Record::Release { nodes: 1 }, LOC, 0, 0).is_err());
    }

    #[test]
    fn shrinking_a_volume_releases_the_tail_and_growing_raises_the_tree() {
        let mut s = state_with_chunks(1);
        map(&mut s, 1, 5000, &[1]);
        s.apply(
            &Record::VolumeResize {
                volume: 1,
                size: 8 << 20,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        release_all(&mut s);
        assert!(s.chunk(1).unwrap().is_none());
        map(&mut s, 1, 100, &[]);
        s.put_chunk(2, [2; 16], LOC, 100).unwrap();
        map(&mut s, 1, 100, &[2]);
        let height = s.volumes[&1].height;
        s.apply(
            &Record::VolumeResize {
                volume: 1,
                size: 1 << 40,
            },
            LOC,
            0,
            0,
        )
        .unwrap();
        assert!(s.volumes[&1].height > height);
        assert_eq!(get(&mut s, 1, 100), 2);
        assert_eq!(get(&mut s, 1, 5000), 0);
        map(&mut s, 1, (1 << 28) - 1, &[2]);
        assert_eq!(get(&mut s, 1, (1 << 28) - 1), 2);
        audit(&mut s);
    }
}
