//! sliver's engine: thin volumes on a log-structured, deduplicating, compressing store.
//!
//! In the order a write meets them:
//! - [`volume`]: an engine volume behind the `sliver_volume::Volume` trait;
//! - [`engine`]: the write and read paths, the log, group commit, checkpoints, garbage
//!   collection, recovery and the migration from format 2;
//! - [`state`]: metadata as a deterministic state machine (one `apply` for live and replay);
//! - [`meta`]: the metadata's paged tables behind one bounded cache (RFC 0001);
//! - [`format`]: the log's record format;
//! - [`backend`]: the narrow storage interfaces (log device, metadata area, root store; files,
//!   and a crash-simulating one for tests) and the write tap;
//! - [`legacy`]: format 2, read to migrate arrays it wrote.

pub mod backend;
/// The engine's clock (the collector's time), from the leaf crate every part shares.
pub use sliver_clock as clock;
pub mod engine;
pub mod format;
#[cfg(any(test, feature = "testing"))]
mod fuzz_ops;
mod le;
pub mod legacy;
pub mod meta;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod test_data;
pub mod volume;

#[cfg(any(test, feature = "testing"))]
pub use backend::MemBackend;
pub use backend::{
    holds_engine, Devices, FileBackend, FormatTwoCheckpoint, LogDevice, MetaArea, RootStore,
    TappedLog, TappedMeta, TappedRoot, WriteTap,
};
pub use engine::{
    default_metadata_cache, ChunkState, Compression, Durable, Engine, EngineConfig, EngineError,
    EngineSpace, GcPriority, Recovery, Tuning, VolumeUsage, MIN_METADATA_CACHE, STATUS_SCAN_CHUNKS,
};
pub use volume::EngineVolume;

/// Fuzzing entry point: operation sequences against a model (`fuzz_ops.rs`).
#[cfg(any(test, feature = "testing"))]
pub use fuzz_ops::fuzz_ops;

/// Fuzzing entry point: `data` describes records as `[kind u8][len u8][payload]...`; each is
/// given a valid header and checksum (random bytes would never pass the CRC), decoded and
/// applied to a small state until the first refusal. Nothing may panic, and the counts kept
/// incrementally (per node, per chunk, live bytes) must equal a recount from the trees.
#[cfg(any(test, feature = "testing"))]
pub fn fuzz_log(data: &[u8]) {
    use format::{records, Record, RECORD_HEADER};
    use meta::map_tree::ANCHORED;
    use meta::page_store::NothingWritten;
    use state::{Loc, MetaState, MAX_RELEASE_NODES};
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
    let pager = meta::pager::Pager::new(std::sync::Arc::new(NothingWritten), 1 << 14);
    let mut state = MetaState::new(4096, 16, pager);
    let create = Record::VolumeCreate {
        volume: 1,
        size: 64 << 20,
    };
    let at = Loc {
        segment: 0,
        offset: 0,
    };
    state
        .apply(&create, at, 0, 1)
        .expect("fresh state accepts a volume");
    let mut decoded = records(&buf, 1).peekable();
    while let Some(item) = decoded.next() {
        let Ok((pos, record)) = item else { break };
        let end = match decoded.peek() {
            Some(Ok((next, _))) => *next,
            _ => buf.len(),
        };
        let loc = Loc {
            segment: (pos % 16) as u32,
            offset: pos as u32,
        };
        if state.apply(&record, loc, (end - pos) as u32, 1).is_err() {
            // A refused record may have changed part of the state (the engine poisons itself
            // then); the counts are only promised after accepted records.
            return;
        }
    }
    while !state.releasing().is_empty() {
        let n = (state.releasing().len() as u32).min(MAX_RELEASE_NODES);
        state
            .apply(&Record::Release { nodes: n }, at, 0, 1)
            .expect("releasing what awaits release");
    }
    let drift = state.audit_counters();
    assert!(drift.is_empty(), "counters drifted: {drift:?}");
    let (chunk_refs, _) = state.count_references().expect("pages in memory");
    for (id, n) in chunk_refs {
        if id == ANCHORED {
            assert_eq!(state.anchored(), n, "anchored entries");
        } else {
            let c = state
                .chunk(id)
                .expect("in memory")
                .expect("referenced chunk");
            assert_eq!(c.refs as u64, n, "chunk {id} reference count");
        }
    }
}

/// Fuzzing entry point: `data` is a root file, then the metadata area its directories are
/// read from. Decoding the root and reading any page it names must give a value or a clear
/// error, never a panic.
#[doc(hidden)]
pub fn fuzz_page(data: &[u8]) {
    use meta::page_store::{read_page, PageBody, PageSource, PAGE_BYTES};
    use meta::root::Root;
    struct Bytes(Vec<u8>);
    impl PageSource for Bytes {
        fn read_slot(&self, slot: u64, buf: &mut PageBody) -> std::io::Result<()> {
            let from = (slot as usize).saturating_mul(PAGE_BYTES).min(self.0.len());
            let n = PAGE_BYTES.min(self.0.len() - from);
            buf[..n].copy_from_slice(&self.0[from..from + n]);
            buf[n..].fill(0);
            Ok(())
        }
    }
    let split = data
        .get(..2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .min(data.len().saturating_sub(2));
    let (root, area) = data.get(2..).unwrap_or(&[]).split_at(split);
    let Ok(root) = Root::decode(root) else { return };
    if root.version == meta::root::ROOT_VERSION {
        assert_eq!(Root::decode(&root.encode()).as_ref(), Ok(&root));
    }
    let area = std::sync::Arc::new(Bytes(area.to_vec()));
    let mut pager = meta::pager::Pager::new(area.clone(), 16);
    // Directories as open reads them, for tables of at most 64 Ki pages (a damaged root may
    // claim any size; open's allocations follow the root's own bytes).
    let tables: Vec<meta::root::TableRoot> = root
        .tables
        .iter()
        .filter(|t| t.pages <= 1 << 16)
        .cloned()
        .collect();
    if pager.load_directories(&tables, root.version).is_err() {
        return;
    }
    for t in &tables {
        for (i, &loc) in pager.directory(t.table).iter().enumerate().take(64) {
            if !loc.is_none() {
                if let Ok(body) = read_page(&*area, t.table, i as u64, loc) {
                    if t.table == meta::tables::T_JOURNAL {
                        let _ = meta::journal::decode(&body);
                    }
                }
            }
        }
    }
    // The journal rebuilt from the pages named: words apply only to pages the directories
    // name, whatever the journal pages say.
    let _ = pager.load_journal();
}
