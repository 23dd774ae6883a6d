//! sliver's engine: thin volumes on a log-structured, deduplicating, compressing store.
//!
//! - [`format`]: the log record and checkpoint byte formats.
//! - [`pager`]: paged metadata tables behind a bounded cache (RFC 0001; being wired in).
//! - [`state`]: metadata as a deterministic state machine (one `apply` for live and replay).
//! - [`engine`]: the log, write/read paths, group commit, recovery, checkpoints, GC.
//! - [`backend`]: the narrow storage interface (file, and a crash-simulating one for tests).
//! - [`volume`]: an engine volume behind the `sliver_volume::Volume` trait.

pub mod backend;
pub mod checkpoint;
pub mod cow_vec;
pub mod engine;
pub mod format;
pub mod pager;
pub mod state;
pub mod volume;

pub use backend::{Backend, FileBackend, MemBackend};
pub use engine::{
    ChunkState, Compression, Engine, EngineConfig, EngineError, EngineSpace, GcPriority, Recovery,
    Tuning, VolumeUsage, STATUS_SCAN_CHUNKS,
};
pub use volume::EngineVolume;

/// Fuzzing entry point: `data` describes records as `[kind u8][len u8][payload]...`; each is
/// given a valid header and checksum (random bytes would never pass the CRC), decoded and
/// applied to a small state until the first refusal, then the state must survive a checkpoint
/// round trip. Nothing may panic.
#[doc(hidden)]
pub fn fuzz_log(data: &[u8]) {
    use format::{records, Record, RECORD_HEADER};
    use state::{Loc, State};
    let mut buf = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], (rest[1] as usize).min(rest.len() - 2));
        let payload = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&(len as u32).to_le_bytes());
        buf.extend_from_slice(&[kind, 0, 0, 0]);
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(payload);
        let crc = crc32c::crc32c(&buf[start + 4..]);
        buf[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(buf.len() - start, RECORD_HEADER + len);
    }
    let mut state = State::new(4096, 16);
    let create = Record::VolumeCreate {
        volume: 1,
        size: 64 << 20,
    };
    state
        .apply(
            &create,
            Loc {
                segment: 0,
                offset: 0,
            },
            1,
        )
        .expect("fresh state accepts a volume");
    for item in records(&buf, 1) {
        let Ok((pos, record)) = item else { break };
        let loc = Loc {
            segment: (pos % 16) as u32,
            offset: pos as u32,
        };
        if state.apply(&record, loc, 1).is_err() {
            break;
        }
    }
    let drift = state.audit_counters();
    assert!(drift.is_empty(), "counters drifted: {drift:?}");
    let geometry = checkpoint::Geometry {
        chunk_size: 4096,
        segment_size: 1 << 20,
        segment_count: 16,
        key: [0; 32],
    };
    let head = checkpoint::Head {
        segment: 0,
        seq: 1,
        offset: 0,
    };
    let bytes = checkpoint::encode(&geometry, head, checkpoint::Counters::default(), &state);
    let loaded = checkpoint::decode(&bytes)
        .unwrap_or_else(|e| panic!("a checkpoint of a valid state must decode: {e}"));
    assert_eq!(loaded.state.volumes.len(), state.volumes.len());
    for (id, c) in state
        .store
        .chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len != 0)
    {
        assert_eq!(
            loaded.state.store.chunks[id].refs, c.refs,
            "chunk {id} reference count"
        );
    }
}
