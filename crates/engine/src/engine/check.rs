//! `sliver check`: every reference count, segment usage and stored chunk verified against the rest.

use super::*;

impl Engine {
    /// Verify the whole engine: reference counts against the maps, segment usage against the
    /// chunks, and every live chunk's record (checksum, decompression, fingerprint).
    /// Returns a list of problems (empty when healthy).
    pub fn check(&self, progress: &mut dyn FnMut(u64, u64)) -> Vec<String> {
        let mut problems = Vec::new();
        let (chunks, segment_live, counts, segment_seq, anchored_tracked) = {
            let m = self.lock_meta();
            let counts = m.state.count_references();
            let chunks: Vec<(u32, crate::state::Chunk)> = m
                .state
                .store
                .chunks
                .iter()
                .enumerate()
                .filter(|(_, c)| c.len != 0)
                .map(|(i, c)| (i as u32, *c))
                .collect();
            let live: Vec<u64> = m.state.store.segments.iter().map(|s| s.live).collect();
            let seq: Vec<(SegState, u64)> = m
                .state
                .store
                .segments
                .iter()
                .map(|s| (s.state, s.seq))
                .collect();
            (chunks, live, counts, seq, m.state.store.anchored)
        };
        let mut live = vec![0u64; segment_live.len()];
        for (id, c) in &chunks {
            let expected = counts.get(id).copied().unwrap_or(0);
            if c.refs != expected {
                problems.push(format!(
                    "chunk {id}: reference count {} but {expected} references",
                    c.refs
                ));
            }
            live[c.loc.segment as usize] += c.len as u64;
            if segment_seq[c.loc.segment as usize].0 == SegState::Free {
                problems.push(format!(
                    "chunk {id} lives in free segment {}",
                    c.loc.segment
                ));
            }
        }
        let existing: std::collections::HashSet<u32> = chunks.iter().map(|(id, _)| *id).collect();
        let anchored = counts.get(&ANCHORED).copied().unwrap_or(0);
        if anchored != anchored_tracked {
            problems.push(format!(
                "{anchored_tracked} anchored entries counted but the maps hold {anchored}"
            ));
        }
        for id in counts.keys().filter(|&&id| id != ANCHORED) {
            if !existing.contains(id) {
                problems.push(format!("map references missing chunk {id}"));
            }
        }
        for (i, (tracked, actual)) in segment_live.iter().zip(&live).enumerate() {
            if tracked != actual {
                problems.push(format!(
                    "segment {i}: usage {tracked} bytes, chunks say {actual}"
                ));
            }
        }
        let cs = self.geometry.chunk_size as usize;
        let mut buf = vec![0u8; cs];
        let total = chunks.len() as u64;
        for (n, (id, c)) in chunks.iter().enumerate() {
            if n % 4096 == 0 {
                progress(n as u64, total);
            }
            let mut raw = vec![0u8; c.len as usize];
            let at = c.loc.segment as u64 * self.geometry.segment_size as u64 + c.loc.offset as u64;
            if let Err(e) = self.backend.read_at(&mut raw, at) {
                problems.push(format!("chunk {id}: read failed: {e}"));
                continue;
            }
            let seq = segment_seq[c.loc.segment as usize].1;
            match decode_chunk(&raw, seq, *id, &mut buf) {
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
        progress(total, total);
        problems
    }
}
