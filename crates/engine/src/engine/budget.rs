//! The memory budget: an engine whose configuration cannot fit the machine's memory is refused
//! at create and open with one sentence naming the setting, instead of being killed later.
//!
//! RAM is the metadata cache plus what stays resident per unit of data (RFC 0001, "What lives
//! where"): the directories and live counts of the chunk table, the node table, the segment
//! table. Those are bounded here by the log's capacity at a generous reduction ratio, so an
//! array that fits at creation keeps fitting as it fills.

use super::*;

/// Bytes of RAM the engine needs besides the cache (threads, buffers, the locality cache).
const BASE: u64 = 96 << 20;
/// Resident metadata per TiB of unique 4 KiB chunks (directories, live counts, node table).
const PER_TIB: u64 = 96 << 20;
/// Unique data the log's capacity is assumed to hold at most, as a multiple of it.
const MAX_REDUCTION: u64 = 4;

/// Memory the process may use: the cgroup's limit when one is set, else the machine's (1 GiB
/// when neither can be read).
pub fn memory_limit() -> u64 {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kib| kib * 1024);
    cgroup.map_or(total, |c| c.min(total))
}

/// RAM an engine of this geometry and tuning needs at most.
pub fn needed(geometry: &Geometry, tuning: &Tuning) -> u64 {
    let log = geometry.segment_count as u64 * geometry.segment_size as u64;
    let per_chunk_tib = 4096 / geometry.chunk_size as u64;
    let resident = (log.saturating_mul(MAX_REDUCTION) >> 40).saturating_add(1)
        * PER_TIB
        * per_chunk_tib.max(1);
    tuning
        .metadata_cache
        .saturating_add(BASE)
        .saturating_add(resident)
}

/// Refuse a configuration that cannot fit.
pub fn check(geometry: &Geometry, tuning: &Tuning) -> Result<()> {
    check_against(geometry, tuning, memory_limit())
}

pub fn check_against(geometry: &Geometry, tuning: &Tuning, limit: u64) -> Result<()> {
    if tuning.metadata_cache < MIN_METADATA_CACHE {
        return Err(EngineError::Refused(format!(
            "[engine] metadata_cache (--metadata-cache) is {} MiB; it must be at least {} MiB",
            tuning.metadata_cache >> 20,
            MIN_METADATA_CACHE >> 20
        )));
    }
    let need = needed(geometry, tuning);
    if need > limit {
        let room = limit.saturating_sub(need - tuning.metadata_cache);
        return Err(EngineError::Refused(format!(
            "this array needs up to {} MiB of memory with [engine] metadata_cache \
             (--metadata-cache) at {} MiB but the machine allows {} MiB: lower \
             metadata_cache to at most {} MiB or give sliver more memory",
            need >> 20,
            tuning.metadata_cache >> 20,
            limit >> 20,
            room >> 20
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_that_cannot_fit_is_refused_naming_the_setting() {
        let g = Geometry {
            chunk_size: 4096,
            segment_size: 4 << 20,
            segment_count: 256 * 1024, // 1 TiB of log
            key: [0; 32],
        };
        let tuning = |cache: u64| Tuning {
            metadata_cache: cache,
            ..Tuning::default()
        };
        assert!(check_against(&g, &tuning(512 << 20), 4 << 30).is_ok());
        let e = check_against(&g, &tuning(8 << 30), 4 << 30).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("metadata_cache") && msg.contains("at most"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        let e = check_against(&g, &tuning(1 << 20), 64 << 30).unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
        // Resident costs grow with the log, not the cache.
        let big = Geometry {
            segment_count: 64 * 256 * 1024,
            ..g
        };
        assert!(needed(&big, &tuning(512 << 20)) > needed(&g, &tuning(512 << 20)));
    }
}
