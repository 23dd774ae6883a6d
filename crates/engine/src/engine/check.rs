//! `sliver check`: every structure verified against the others, streamed with bounded memory
//! (RFC 0001, test plan): every metadata page's checksum, every node's counts and reference
//! count, every chunk's reference count against a recount from the trees (in windows of ids,
//! so memory does not grow with the array), every segment's live bytes against the chunks in
//! it, and every live chunk's stored record (checksum, decompression, fingerprint).

use super::*;
use crate::meta::chunk_table::{ChunkEntry, PER_PAGE as CHUNKS_PER_PAGE};
use crate::meta::pager::Entry;
use crate::meta::tables::CHUNK_TABLE;
use crate::meta::tables::T_HOOKS;
use crate::meta::tables::T_JOURNAL;
use crate::meta::tables::T_NODES;

/// Chunk ids whose references one pass over the trees counts (4 bytes each: 64 MiB).
const COUNT_WINDOW: u64 = 16 << 20;

impl Engine {
    /// Verify the whole engine. Returns a list of problems (empty when healthy); `progress`
    /// hears (done, total) chunks as the data is read.
    pub fn check(&self, progress: &mut dyn FnMut(u64, u64)) -> Vec<String> {
        let mut problems = Vec::new();
        // The collector and checkpoints wait: a relocation between reading the segment table
        // and reading the chunk pages would look like damage (an engine checked while open, as
        // tests do; `sliver check` opens it alone).
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        // Chunks are read from the log: writes applied but still in flight land first.
        let appended = self.lock_log().head.appended();
        if let Err(e) = self.wait_written(appended) {
            problems.push(format!("log writes in flight never completed: {e}"));
            return problems;
        }
        if let Err(e) = self.check_metadata(&mut problems) {
            problems.push(format!("metadata could not be read: {e}"));
        }
        if let Err(e) = self.check_chunks(&mut problems, progress) {
            problems.push(format!("chunks could not be read: {e}"));
        }
        problems
    }

    /// Pages, node counts and references, chunk reference counts.
    fn check_metadata(&self, problems: &mut Vec<String>) -> Result<()> {
        // Every page the directories name must be the page meant (checksum).
        {
            let (dirs, source) = {
                let m = self.lock_meta();
                let dirs: Vec<(u8, Vec<crate::meta::page_store::PageLoc>)> =
                    [CHUNK_TABLE, T_NODES, T_HOOKS, T_JOURNAL]
                        .iter()
                        .map(|&t| (t, m.state.pager().directory(t).to_vec()))
                        .collect();
                (dirs, m.state.pager().source().clone())
            };
            for (table, dir) in dirs {
                for (index, loc) in dir.into_iter().enumerate() {
                    if loc.is_none() {
                        continue;
                    }
                    match crate::meta::page_store::read_page(&*source, table, index as u64, loc) {
                        Err(e) => problems.push(e.to_string()),
                        Ok(body) if table == T_JOURNAL => {
                            if let Err(e) = crate::meta::journal::decode(&body) {
                                problems
                                    .push(format!("{e} (journal page {index}, slot {})", loc.slot));
                            }
                        }
                        Ok(_) => {}
                    }
                }
            }
        }
        let mut m = self.lock_meta();
        problems.extend(m.state.audit_counters());
        problems.extend(m.state.pager().journal().audit());
        // Node references: volume roots and interior entries, each node visited once.
        let nodes = m.state.node_count();
        let mut node_refs = vec![0u32; nodes as usize];
        let mut seen = vec![false; nodes as usize];
        let mut leaves = Vec::new();
        let mut stack: Vec<u64> = m.state.volume_maps().map(|(_, v)| v.root).collect();
        for &root in &stack {
            if root != 0 && root < nodes {
                node_refs[root as usize] += 1;
            }
        }
        // Nodes awaiting release still hold their references.
        stack.extend(m.state.releasing().iter().copied());
        while let Some(node) = stack.pop() {
            if node == 0 || node >= nodes {
                if node != 0 {
                    problems.push(format!("a map names node {node}, beyond the node table"));
                }
                continue;
            }
            if std::mem::replace(&mut seen[node as usize], true) {
                continue;
            }
            if m.state.node(node).level == 0 {
                leaves.push(node);
                continue;
            }
            for child in m.state.node_entries(node)? {
                if child != 0 && child < nodes {
                    node_refs[child as usize] += 1;
                    stack.push(child);
                } else if child != 0 {
                    problems.push(format!("node {node} names node {child}, beyond the table"));
                }
            }
        }
        let releasing: std::collections::HashSet<u64> =
            m.state.releasing().iter().copied().collect();
        for id in 1..nodes {
            let meta = m.state.node(id);
            if meta.refs != node_refs[id as usize] {
                problems.push(format!(
                    "map node {id}: reference count {} but {} references",
                    meta.refs, node_refs[id as usize]
                ));
            }
            if releasing.contains(&id) && meta.refs != 0 {
                problems.push(format!("map node {id} awaits release but is referenced"));
            }
        }
        // Chunk references, a window of ids per pass over the leaves.
        let end = m.state.chunk_pages() * CHUNKS_PER_PAGE;
        let mut anchored = 0u64;
        let mut from = 0;
        while from < end.max(1) {
            let to = (from + COUNT_WINDOW).min(end);
            let mut counts = vec![0u32; (to - from) as usize];
            for &leaf in &leaves {
                for id in m.state.node_entries(leaf)? {
                    if id == ANCHORED {
                        anchored += (from == 0) as u64;
                    } else if id != 0 && (from..to).contains(&id) {
                        counts[(id - from) as usize] += 1;
                    } else if holds_data(id) && id >= end && from == 0 {
                        problems.push(format!("map references missing chunk {id}"));
                    }
                }
            }
            for (k, &n) in counts.iter().enumerate() {
                let id = from + k as u64;
                let entry = m.state.chunk(id)?;
                match entry {
                    None if n > 0 => problems.push(format!("map references missing chunk {id}")),
                    Some(c) if c.refs != u32::MAX && c.refs != n => problems.push(format!(
                        "chunk {id}: reference count {} but {n} references",
                        c.refs
                    )),
                    _ => {}
                }
            }
            from = to;
            if end == 0 {
                break;
            }
        }
        if anchored != m.state.anchored() {
            problems.push(format!(
                "{} anchored entries counted but the maps hold {anchored}",
                m.state.anchored()
            ));
        }
        Ok(())
    }

    /// Segment usage against the chunks, and every live chunk's record.
    fn check_chunks(
        &self,
        problems: &mut Vec<String>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let (pages, total, segments) = {
            let m = self.lock_meta();
            (
                m.state.chunk_pages(),
                m.state.unique_chunks(),
                m.state.segments().to_vec(),
            )
        };
        let mut live = vec![0u64; segments.len()];
        let cs = self.geometry.chunk_size as usize;
        let mut buf = vec![0u8; cs];
        let mut done = 0u64;
        progress(0, total);
        for page in 0..pages {
            let entries: Vec<(u64, ChunkEntry)> = {
                let mut m = self.lock_meta();
                let body = m.state.chunk_page(page)?;
                (0..CHUNKS_PER_PAGE)
                    .map(|k| {
                        let at = k as usize * ChunkEntry::SIZE;
                        (
                            page * CHUNKS_PER_PAGE + k,
                            ChunkEntry::read(&body[at..at + ChunkEntry::SIZE]),
                        )
                    })
                    .filter(|(_, e)| e.len != 0)
                    .collect()
            };
            for (id, c) in entries {
                let Some(seg) = segments.get(c.segment as usize) else {
                    problems.push(format!(
                        "chunk {id} in segment {}, beyond the log",
                        c.segment
                    ));
                    continue;
                };
                live[c.segment as usize] += c.len as u64;
                if seg.state == SegState::Free {
                    problems.push(format!("chunk {id} lives in free segment {}", c.segment));
                }
                let mut raw = vec![0u8; c.len as usize];
                let at = c.segment as u64 * self.geometry.segment_size as u64 + c.offset as u64;
                if let Err(e) = self.log_device.read_at(&mut raw, at) {
                    problems.push(format!("chunk {id}: read failed: {e}"));
                } else {
                    match decode_chunk(&raw, seg.seq, id, &mut buf) {
                        Err(e) => problems.push(format!("chunk {id}: {e}")),
                        Ok(()) => {
                            let hash = blake3::keyed_hash(&self.geometry.key, &buf);
                            if hash.as_bytes()[..16] != c.hash {
                                problems.push(format!(
                                    "chunk {id}: content does not match its fingerprint"
                                ));
                            }
                        }
                    }
                }
                done += 1;
                if done.is_multiple_of(4096) {
                    progress(done, total);
                }
            }
        }
        progress(done, total);
        for (i, (s, actual)) in segments.iter().zip(&live).enumerate() {
            if s.live != *actual {
                problems.push(format!(
                    "segment {i}: usage {} bytes, chunks say {actual}",
                    s.live
                ));
            }
        }
        Ok(())
    }
}
