//! Migration from format 2 (RFC 0001, "Migration from format 2"): an engine directory holding
//! a format 2 checkpoint and no root is opened the way format 2 opened it (the whole
//! checkpoint loaded, the log after it replayed through format 2's state machine), converted
//! into paged tables (ids keep their values, widened to 64 bits; each map page of 1,024
//! entries becomes two leaves, shared where the page was shared), and written as the first
//! root. Only then is the format 2 checkpoint set aside (as `checkpoint.v2`). A crash at any
//! point before the root exists leaves the format 2 array as it was and the migration starts
//! again; the format 2 records left in the log (chunks with 32-bit ids) stay readable for as
//! long as they hold live chunks.

use super::open::{replay, used_slots, ReplayTarget};
use super::*;
use crate::legacy::checkpoint as v2;
use crate::legacy::state as old;
use crate::meta::chunk_table::PER_PAGE as CHUNKS_PER_PAGE;
use crate::meta::map_tree::{height_for, Volume, FANOUT};

use crate::meta::pager::Pager;
use crate::state::row_after;
use std::collections::HashMap;

impl ReplayTarget for old::V2State {
    fn replay(
        &mut self,
        record: &Record<'_>,
        loc: Loc,
        len: u32,
        seq: u64,
    ) -> std::result::Result<(), String> {
        let Some(&before) = self.store.segments.get(loc.segment as usize) else {
            return Err(format!(
                "a record in segment {}, beyond the log",
                loc.segment
            ));
        };
        let row = row_after(record, loc, len, seq, before).map_err(|e| e.to_string())?;
        self.apply(record, loc, seq).map_err(|e| e.to_string())?;
        let s = &mut self.store.segments[loc.segment as usize];
        s.state = row.state;
        s.seq = row.seq;
        s.written = row.written;
        Ok(())
    }
}

impl Engine {
    /// Open a format 2 array and, unless `read_only`, migrate it to format 3 for good.
    pub(super) fn migrate(devices: Devices, tuning: Tuning, read_only: bool) -> Result<Self> {
        let started = Instant::now();
        let checkpoint = devices.checkpoint.clone();
        let bytes = checkpoint
            .load_checkpoint()?
            .ok_or_else(|| EngineError::Metadata("no format 2 checkpoint".into()))?;
        let loaded = v2::decode(&bytes, devices.log.capacity())
            .map_err(|e| EngineError::Metadata(e.to_string()))?;
        drop(bytes);
        let geometry = loaded.geometry;
        // (`decode` refused a checkpoint naming more segments than the log holds.)
        super::budget::check(&geometry, &tuning)?;
        let mut state = loaded.state;
        let mut counters = loaded.counters;
        let mut recovery = Recovery::default();
        let end = replay(
            &*devices.log,
            &geometry,
            &mut state,
            &mut counters,
            loaded.head,
            &mut recovery,
        )?;
        state.store.rebuild_free_ids();
        if !read_only {
            tracing::info!(
                chunks = state.store.chunks.iter().filter(|c| c.len != 0).count(),
                volumes = state.volumes.len(),
                "migrating the engine's metadata from format 2 to format 3"
            );
        }
        let pager = new_pager(&devices.meta, &tuning);
        let converted = convert(state, pager)?;
        // A format 2 array has no metadata pages; pages of a migration cut short are named by
        // no root and are free.
        let slots = Slots::from_used(used_slots(converted.pager()));
        let engine = Self::finish_open(
            devices,
            geometry,
            converted,
            counters,
            loaded.head,
            end,
            slots,
            0,
            // Written by format 2, which did not bound the segments it opened between syncs.
            u64::MAX,
            tuning,
            read_only,
            recovery,
            started,
        )?;
        if !read_only {
            checkpoint.retire_checkpoint()?;
            tracing::info!(
                seconds = started.elapsed().as_secs_f64(),
                "engine metadata migrated to format 3"
            );
        }
        Ok(engine)
    }
}

/// Format 2's state as format 3 tables, every page dirty (the first root writes them all).
fn convert(old: old::V2State, pager: Pager) -> Result<MetaState> {
    let segment_count = old.store.segments.len() as u32;
    let mut state = MetaState::new(old.chunk_size, segment_count, pager);
    for (i, s) in old.store.segments.iter().enumerate() {
        state.import_segment(i as u32, *s);
    }
    // Format 2 left freed ids as gaps of any length.
    let end = old.store.chunks.len() as u64;
    state.import_reserve_chunk_pages(end.div_ceil(CHUNKS_PER_PAGE));
    for (id, c) in old
        .store
        .chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len != 0)
    {
        let refs = c.refs.min(u32::MAX as u64) as u32;
        state.import_chunk(id as u64, c.hash, c.loc.segment, c.loc.offset, c.len, refs)?;
    }
    state.import_totals(old.store.live_bytes, old.store.anchored);
    // A page shared by several volumes becomes leaves shared by them.
    let mut leaves: HashMap<(*const old::Page, usize), u64> = HashMap::new();
    for (&id, map) in &old.volumes {
        let chunks = state.chunks_of(map.size);
        state.import_volume(
            id,
            Volume {
                size: map.size,
                root: 0,
                height: height_for(chunks),
            },
        );
        for (&page_no, page) in &map.pages {
            for half in 0..old::PAGE_ENTRIES / FANOUT as usize {
                let from = half * FANOUT as usize;
                let entries: Vec<u64> = page.0[from..from + FANOUT as usize]
                    .iter()
                    .map(|&e| {
                        if e == old::ANCHORED {
                            ANCHORED
                        } else {
                            e as u64
                        }
                    })
                    .collect();
                if entries.iter().all(|&e| e == 0) {
                    continue;
                }
                let key = (std::sync::Arc::as_ptr(page), half);
                let leaf = match leaves.get(&key) {
                    Some(&leaf) => {
                        state.import_shared_leaf(leaf);
                        leaf
                    }
                    None => {
                        let leaf = state.import_leaf(&entries);
                        leaves.insert(key, leaf);
                        leaf
                    }
                };
                let index = page_no * old::PAGE_ENTRIES as u64 + from as u64;
                state.with_tree(id, |trees, pager, refs, vol| {
                    trees.attach_leaf(pager, refs, vol, index, leaf)
                })?;
            }
        }
    }
    state.import_done();
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::page_store::NothingWritten;

    /// Format 2 leaves the ids of freed chunks as gaps: a volume deleted after another was
    /// written leaves thousands of free ids below the live ones, which the converted chunk
    /// table must take as they are.
    #[test]
    fn ids_after_a_long_run_of_freed_ones_convert() {
        let mut old = old::V2State::new(4096, 16);
        let at = Loc {
            segment: 0,
            offset: 0,
        };
        old.apply(
            &Record::VolumeCreate {
                volume: 1,
                size: 64 << 20,
            },
            at,
            1,
        )
        .unwrap();
        for id in [1u32, 60_000] {
            let mut buf = Vec::new();
            crate::format::Encoder::new(&mut buf, 1).chunk_v2(
                id,
                crate::format::Codec::Raw,
                &[id as u8; 16],
                b"x",
            );
            let (record, _) = crate::format::decode(&buf, 1).unwrap();
            old.apply(&record, at, 1).unwrap();
        }
        let mut buf = Vec::new();
        crate::format::Encoder::new(&mut buf, 1).map_v2(1, 7, &[60_000, 1]);
        let (record, _) = crate::format::decode(&buf, 1).unwrap();
        old.apply(&record, at, 1).unwrap();
        let mut state = convert(old, Pager::new(Arc::new(NothingWritten), 1 << 12)).unwrap();
        assert_eq!(state.entry(1, 7).unwrap(), 60_000);
        assert_eq!(state.chunk(60_000).unwrap().unwrap().refs, 1);
        assert_eq!(state.chunk(1).unwrap().unwrap().refs, 1);
        assert!(state.audit_counters().is_empty());
    }
}
