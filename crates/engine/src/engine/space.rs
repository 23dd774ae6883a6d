//! Space figures of the array and of each volume.

use super::*;

impl Engine {
    pub fn space(&self) -> EngineSpace {
        let m = self.lock_meta();
        let store = &m.state.store;
        let seg = self.geometry.segment_size as u64;
        let count = self.geometry.segment_count as u64;
        let used_segments = store
            .segments
            .iter()
            .filter(|s| s.state != SegState::Free)
            .count() as u64;
        let live: u64 = store.segments.iter().map(|s| s.live).sum();
        let physical = used_segments * seg;
        let capacity = (count - gc_reserve(self.geometry.segment_count) as u64) * seg;
        let cs = self.geometry.chunk_size as u64;
        let mut logical = 0u64;
        let mut provisioned = 0u64;
        for map in m.state.volumes.values() {
            provisioned += map.size;
            for page in map.pages.values() {
                logical += page.0.iter().filter(|&&id| holds_data(id)).count() as u64 * cs;
            }
        }
        let host = m.counters.host_bytes;
        let gc = m.counters.gc_bytes;
        let threshold = self.tuning.lock().unwrap().soft_threshold;
        let held = self.anchor_reserve(store.anchored) as u64 * seg;
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
            unique_chunks: store.index.len() as u64,
            anchored_bytes: held,
        }
    }

    /// Space figures of one volume; walks its map.
    pub fn volume_usage(&self, volume: u32) -> Result<VolumeUsage> {
        let m = self.lock_meta();
        let map = m
            .state
            .volumes
            .get(&volume)
            .ok_or(EngineError::NoSuchVolume(volume))?;
        let cs = self.geometry.chunk_size as u64;
        // References from pages only this volume holds: if they account for all of a chunk's
        // references, deleting the volume frees the chunk.
        let mut private: HashMap<u32, u64> = HashMap::new();
        let mut referenced: std::collections::HashSet<u32> = Default::default();
        let mut mapped = 0u64;
        let mut anchored = 0u64;
        for page in map.pages.values() {
            let unique = std::sync::Arc::strong_count(page) == 1;
            for &id in page.0.iter() {
                if id == ANCHORED {
                    anchored += cs;
                }
                if !holds_data(id) {
                    continue;
                }
                mapped += cs;
                referenced.insert(id);
                if unique {
                    *private.entry(id).or_insert(0) += 1;
                }
            }
        }
        let mut unique_bytes = 0;
        let mut shared_bytes = 0;
        for id in referenced {
            let c = m.state.store.chunk(id).expect("referenced chunk exists");
            if private.get(&id) == Some(&c.refs) {
                unique_bytes += c.len as u64;
            } else {
                shared_bytes += c.len as u64;
            }
        }
        Ok(VolumeUsage {
            provisioned_bytes: map.size,
            mapped_bytes: mapped.min(map.size),
            anchored_bytes: anchored.min(map.size),
            unique_bytes,
            shared_bytes,
        })
    }
}
