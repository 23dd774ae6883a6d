//! Space figures of the array and of each volume.

use super::*;
use crate::meta::chunk_table::{ChunkEntry, PER_PAGE as CHUNKS_PER_PAGE};
use crate::meta::page_store::{read_page, PageBody};
use crate::meta::pager::Entry;
use crate::meta::tables::CHUNK_TABLE;
use std::collections::HashMap;

impl Engine {
    /// Array-wide figures: O(volumes), from counters kept by every change.
    pub fn space(&self) -> EngineSpace {
        let m = self.lock_meta();
        let seg = self.geometry.segment_size as u64;
        let count = self.geometry.segment_count as u64;
        let used_segments = count - self.lock_log().segments.len() as u64;
        let live = m.state.live_bytes();
        let physical = used_segments * seg;
        let capacity = (count - gc_reserve(self.geometry.segment_count) as u64) * seg;
        let cs = self.geometry.chunk_size as u64;
        let mut logical = 0u64;
        let mut provisioned = 0u64;
        for (_, vol) in m.state.volume_maps() {
            provisioned += vol.size;
            logical += m.state.counts(vol).0 * cs;
        }
        let host = m.counters.host_bytes;
        let gc = m.counters.gc_bytes;
        let threshold = self.tuning.lock().unwrap().soft_threshold;
        let held = self.anchor_reserve(m.state.anchored()) as u64 * seg;
        EngineSpace {
            capacity_bytes: capacity,
            physical_used_bytes: physical,
            live_bytes: live,
            reclaimable_bytes: physical.saturating_sub(live),
            logical_mapped_bytes: logical,
            provisioned_bytes: provisioned,
            data_reduction: if live == 0 {
                1.0
            } else {
                logical as f64 / live as f64
            },
            total_reduction: if physical == 0 {
                1.0
            } else {
                provisioned as f64 / physical as f64
            },
            write_amplification: if host == 0 {
                1.0
            } else {
                (host + gc) as f64 / host as f64
            },
            host_written_bytes: host,
            gc_relocated_bytes: gc,
            soft_threshold_exceeded: (physical + held) as f64 > threshold * capacity as f64,
            unique_chunks: m.state.unique_chunks(),
            data_chunks_written: self.data_chunks_written.load(Ordering::Relaxed),
            dedup_chunks: self.dedup_chunks.load(Ordering::Relaxed),
            log_syncs: self.log_syncs.load(Ordering::Relaxed),
            metadata_written_bytes: self.metadata_written(),
            anchored_bytes: held,
        }
    }

    /// Space figures of one volume. Mapped and anchored bytes are counters (O(1)); unique
    /// and shared bytes need a walk of the volume's tree, cached until the volume or the
    /// sharing between volumes changes. Volumes up to [`SYNC_USAGE_CHUNKS`] mapped chunks are
    /// walked on demand; larger ones report the last walk, which the background rounds
    /// refresh, so this never costs more than a bounded walk.
    pub fn volume_usage(&self, volume: u32) -> Result<VolumeUsage> {
        let cs = self.geometry.chunk_size as u64;
        let (vol, (mapped, anchored), key) = {
            let m = self.lock_meta();
            let vol = m
                .state
                .volume_map(volume)
                .ok_or(EngineError::NoSuchVolume(volume))?;
            (vol, m.state.counts(&vol), usage_key(&m, volume))
        };
        let cached = self.usage.lock().unwrap().get(&volume).copied();
        let (unique, shared) = match cached {
            Some(c) if c.key == key => (c.unique, c.shared),
            _ if mapped <= SYNC_USAGE_CHUNKS => self.walk_usage(volume)?,
            Some(c) => (c.unique, c.shared),
            None => (0, 0),
        };
        Ok(VolumeUsage {
            provisioned_bytes: vol.size,
            mapped_bytes: (mapped * cs).min(vol.size),
            anchored_bytes: (anchored * cs).min(vol.size),
            unique_bytes: unique,
            shared_bytes: shared,
        })
    }

    /// Walk `volume`'s tree and cache its unique and shared bytes. A chunk is unique when
    /// every reference to it comes from leaves only this volume holds: deleting the volume
    /// would free it. The lock is taken per batch of leaves, never while a page is read, and
    /// chunk pages that are not cached are read beside the cache (a walk of a large volume
    /// would otherwise push the working set out).
    pub(super) fn walk_usage(&self, volume: u32) -> Result<(u64, u64)> {
        let key = usage_key(&self.lock_meta(), volume);
        let mut unique = 0u64;
        let mut shared = 0u64;
        // Chunks named more than once: their private references are counted until all are
        // seen (bounded; past the bound they count as shared).
        let mut repeated: HashMap<u64, (u32, u32, u32)> = HashMap::new();
        let mut from = Some(0);
        while let Some(at) = from {
            // A batch of leaves and the chunk ids they hold; the chunk pages: cached ones
            // read now, the others' places noted to be read after the lock is released.
            let (m, batch) = self.lock_resident(|m| {
                let vol = m
                    .state
                    .volume_map(volume)
                    .ok_or(EngineError::NoSuchVolume(volume))?;
                Ok(m.state.chunks_from(&vol, at, 32)?)
            });
            let (ids, next) = batch?;
            from = next;
            let mut pages: HashMap<u64, Option<Box<PageBody>>> = HashMap::new();
            let mut to_read = Vec::new();
            for &(id, _) in &ids {
                let page = id / CHUNKS_PER_PAGE;
                if pages.contains_key(&page) {
                    continue;
                }
                match m.state.pager().cached(CHUNK_TABLE, page) {
                    Some(body) => {
                        pages.insert(page, Some(Box::new(*body)));
                    }
                    None => {
                        pages.insert(page, None);
                        // The base on disk, and the words pending on top of it now.
                        let pager = m.state.pager();
                        to_read.push((
                            page,
                            pager.loc(CHUNK_TABLE, page),
                            pager.journal().words_of(CHUNK_TABLE, page),
                        ));
                    }
                }
            }
            let source = m.state.pager().source().clone();
            drop(m);
            for (page, loc, words) in to_read {
                // A page that moved meanwhile (its slot reused) fails its checksum: its
                // chunks are left out of this walk's figures.
                if let Ok(mut body) = read_page(&*source, CHUNK_TABLE, page, loc) {
                    for (w, v) in words {
                        body[w as usize * 8..w as usize * 8 + 8].copy_from_slice(&v.to_le_bytes());
                    }
                    pages.insert(page, Some(body));
                }
            }
            for (id, private) in ids {
                let Some(Some(body)) = pages.get(&(id / CHUNKS_PER_PAGE)) else {
                    continue;
                };
                let at = (id % CHUNKS_PER_PAGE) as usize * ChunkEntry::SIZE;
                let c = ChunkEntry::read(&body[at..at + ChunkEntry::SIZE]);
                if c.len == 0 {
                    continue; // freed meanwhile
                }
                match (private, c.refs) {
                    (true, 1) => unique += c.len as u64,
                    (true, refs) if repeated.len() < MAX_REPEATED || repeated.contains_key(&id) => {
                        repeated.entry(id).or_insert((0, refs, c.len)).0 += 1;
                    }
                    _ => shared += c.len as u64,
                }
            }
        }
        for (private_refs, refs, len) in repeated.into_values() {
            if private_refs >= refs {
                unique += len as u64;
            } else {
                shared += len as u64;
            }
        }
        self.usage.lock().unwrap().insert(
            volume,
            UsageWalk {
                key,
                walked: Instant::now(),
                unique,
                shared,
            },
        );
        Ok((unique, shared))
    }

    /// Refresh the usage of one large volume whose walk is out of date (a background round).
    pub(super) fn refresh_one_usage(&self) -> Result<()> {
        let stale = {
            let m = self.lock_meta();
            let cache = self.usage.lock().unwrap();
            let stale = m
                .state
                .volume_maps()
                .map(|(id, v)| (id, m.state.counts(v).0))
                .filter(|&(_, mapped)| mapped > SYNC_USAGE_CHUNKS)
                .find(|&(id, _)| {
                    cache.get(&id).is_none_or(|c| {
                        c.key != usage_key(&m, id) && c.walked.elapsed() >= USAGE_REFRESH
                    })
                })
                .map(|(id, _)| id);
            stale
        };
        if let Some(volume) = stale {
            if let Err(e) = self.walk_usage(volume) {
                tracing::warn!("walking volume {volume} for its space figures: {e}");
            }
        }
        Ok(())
    }
}

/// Volumes with at most this many mapped chunks (256 MiB of 4 KiB chunks) are walked when
/// asked; larger ones in the background.
pub const SYNC_USAGE_CHUNKS: u64 = 64 * 1024;
/// Chunks with several references a walk counts one by one at most.
const MAX_REPEATED: usize = 4 << 20;

/// A large volume changing all the time is walked again at most this often.
const USAGE_REFRESH: Duration = Duration::from_secs(60);

/// A cached walk of one volume, valid while its key stands.
#[derive(Debug, Clone, Copy)]
pub(super) struct UsageWalk {
    key: (u64, u64),
    walked: Instant,
    unique: u64,
    shared: u64,
}

/// What a usage walk depends on: the volume's changes and changes of sharing anywhere
/// (clones, copies, releases, shared nodes copied on write).
fn usage_key(m: &Meta, volume: u32) -> (u64, u64) {
    m.state.usage_generation(volume)
}
