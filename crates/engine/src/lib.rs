//! sliver's engine: thin volumes on a log-structured, deduplicating, compressing store.
//!
//! - [`format`]: the log record and checkpoint byte formats.
//! - [`chunk_table`]: the chunk table in pager pages, ids reused page by page (RFC 0001; being
//!   wired in).
//! - [`pager`]: paged metadata tables behind a bounded cache (RFC 0001; being wired in).
//! - [`state`]: metadata as a deterministic state machine (one `apply` for live and replay).
//! - [`engine`]: the log, write/read paths, group commit, recovery, checkpoints, GC.
//! - [`backend`]: the narrow storage interface (file, and a crash-simulating one for tests).
//! - [`volume`]: an engine volume behind the `sliver_volume::Volume` trait.

pub mod backend;
pub mod checkpoint;
pub mod chunk_table;
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

/// Fuzzing entry point: `data` is the log a metadata page is read from, and the directory
/// names a record at offset 0 whose checksum is the data's first four bytes (the one case
/// where damaged bytes pass the directory's check is when they are a valid record). Reading
/// an entry must give a value or a [`pager::PageError`], never a panic.
#[doc(hidden)]
pub fn fuzz_page(data: &[u8]) {
    use pager::{PageLoc, PageSource, Pager, Table};
    struct Bytes(Vec<u8>);
    impl PageSource for Bytes {
        fn read_record(&self, loc: PageLoc, buf: &mut [u8]) -> std::io::Result<()> {
            let from = (loc.offset as usize).min(self.0.len());
            let n = buf.len().min(self.0.len() - from);
            buf[..n].copy_from_slice(&self.0[from..from + n]);
            buf[n..].fill(0);
            Ok(())
        }
    }
    let crc = data
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
    let loc = PageLoc {
        segment: 0,
        offset: 0,
        crc,
    };
    let source = std::sync::Arc::new(Bytes(data.to_vec()));
    let mut pager = Pager::with_directories(source, vec![vec![Some(loc)]], 1);
    let table = Table::<u64>::new(0);
    if let Ok(value) = table.get(&mut pager, 5) {
        // Only a real Page record of page 0 of table 0 gets this far (the log reads as zeros
        // past the data's end).
        let mut log = data.to_vec();
        log.resize(log.len().max(pager::PAGE_RECORD), 0);
        let body = format::RECORD_HEADER + format::PAGE_PREFIX;
        assert_eq!(log[8], 15, "a page from a record of another kind");
        assert_eq!(
            value.to_le_bytes()[..],
            log[body + 40..body + 48],
            "the entry read is not the one in the record"
        );
    }
}
