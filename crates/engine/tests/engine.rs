//! Engine behaviour through its public API, on the in-memory backend and on real files.

use sliver_engine::test_data::noise;
use sliver_engine::{
    ChunkState, Compression, Engine, EngineConfig, EngineError, FileBackend, GcPriority, LogDevice,
    MemBackend, Tuning, STATUS_SCAN_CHUNKS,
};
use std::sync::Arc;
use std::time::Duration;

const CS: usize = 4096;

fn config() -> EngineConfig {
    EngineConfig {
        chunk_size: 4096,
        segment_size: 128 << 10,
    }
}

/// An engine of [`config`]'s geometry on an in-memory backend of `capacity` bytes.
fn mem_engine(capacity: u64) -> (Arc<MemBackend>, Engine) {
    sliver_engine::test_data::mem_engine(capacity, config().segment_size, Tuning::default())
}

/// Text-like data: compressible, different per `seed`.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let words = [
        "thin ",
        "provisioned ",
        "flash ",
        "array ",
        "unmap ",
        "clone ",
        "zero ",
    ];
    sliver_engine::test_data::text(&words, seed, len)
}

/// An 8 MiB volume of `noise(seed)` with every other 64 KiB unmapped (the even ones): its
/// segments are half dead, worth collecting but holding live data. Returns the volume and
/// what was written.
fn half_dead_volume(engine: &Engine, seed: u64) -> (u32, Vec<u8>) {
    let v = engine.create_volume(8 << 20).unwrap();
    let data = noise(seed, 8 << 20);
    engine.write(v, 0, &data).unwrap();
    for i in (0..128u64).step_by(2) {
        engine.unmap(v, i * (64 << 10), 64 << 10).unwrap();
    }
    (v, data)
}

/// Volume `v` of [`half_dead_volume`] reads zeros in the unmapped 64 KiB and `data` elsewhere.
fn assert_half_dead_volume_reads_back(engine: &Engine, v: u32, data: &[u8]) {
    let mut back = vec![0u8; 8 << 20];
    engine.read(v, 0, &mut back).unwrap();
    for i in 0..128usize {
        let range = i * (64 << 10)..(i + 1) * (64 << 10);
        if i % 2 == 0 {
            assert!(back[range].iter().all(|&x| x == 0), "unmapped 64 KiB {i}");
        } else {
            assert!(back[range.clone()] == data[range], "live 64 KiB {i}");
        }
    }
}

#[test]
fn identical_data_is_stored_once_and_zeros_not_at_all() {
    let (_, engine) = mem_engine(16 << 20);
    let a = engine.create_volume(1 << 20).unwrap();
    let b = engine.create_volume(1 << 20).unwrap();
    let data = noise(1, 256 << 10);
    engine.write(a, 0, &data).unwrap();
    let after_first = engine.space();
    engine.write(b, 512 << 10, &data).unwrap();
    let after_second = engine.space();
    assert_eq!(after_first.unique_chunks, 64);
    assert_eq!(after_second.unique_chunks, 64, "second copy deduplicated");
    assert_eq!(after_first.live_bytes, after_second.live_bytes);
    assert_eq!(after_second.logical_mapped_bytes, 512 << 10);
    assert!(
        (after_second.data_reduction - 2.0).abs() < 0.05,
        "{after_second:?}"
    );
    engine.write(a, 256 << 10, &vec![0u8; 256 << 10]).unwrap();
    assert_eq!(
        engine.space().live_bytes,
        after_second.live_bytes,
        "zeros take no space"
    );
    let mut back = vec![1u8; 256 << 10];
    engine.read(b, 512 << 10, &mut back).unwrap();
    assert!(back == data);
    engine.read(a, 256 << 10, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0));
    let usage = engine.volume_usage(a).unwrap();
    assert_eq!(usage.mapped_bytes, 256 << 10);
    assert_eq!(usage.unique_bytes, 0, "everything a holds is shared with b");
    assert!(usage.shared_bytes > 256 << 10);
}

#[test]
fn compression_shrinks_text_and_stores_noise_raw() {
    let (_, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(2 << 20).unwrap();
    engine.write(v, 0, &text(3, 1 << 20)).unwrap();
    let s = engine.space();
    assert!(s.live_bytes < (1 << 20) / 2, "text compressed: {s:?}");
    engine.write(v, 1 << 20, &noise(4, 1 << 20)).unwrap();
    let t = engine.space();
    let noise_bytes = t.live_bytes - s.live_bytes;
    // Raw plus a 40-byte record overhead per chunk, never more.
    assert!(noise_bytes <= (1 << 20) + 256 * 40, "{noise_bytes}");
    let mut back = vec![0u8; 2 << 20];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back[..1 << 20] == text(3, 1 << 20)[..]);
    assert!(back[1 << 20..] == noise(4, 1 << 20)[..]);
}

#[test]
fn zstd_and_no_compression_read_back() {
    for compression in [Compression::None, Compression::Zstd(3)] {
        let backend = Arc::new(MemBackend::new(16 << 20));
        let tuning = Tuning {
            compression,
            ..Tuning::default()
        };
        let engine = Engine::create(backend, config(), tuning).unwrap();
        let v = engine.create_volume(1 << 20).unwrap();
        let data = text(9, 300 << 10);
        engine.write(v, 4096, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        engine.read(v, 4096, &mut back).unwrap();
        assert!(back == data, "{compression:?}");
    }
}

#[test]
fn sub_chunk_writes_and_unaligned_unmap_merge_correctly() {
    let (_, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(1 << 20).unwrap();
    let mut model = vec![0u8; 1 << 20];
    let ops: [(u64, usize, u8); 5] = [
        (512, 512, 1),
        (3584, 1024, 2),
        (4096 * 3 + 512, 8192, 3),
        (0, 512, 4),
        (100_352, 70_000 - 70_000 % 512, 5),
    ];
    for (off, len, fill) in ops {
        let data = vec![fill; len];
        engine.write(v, off, &data).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&data);
    }
    engine.unmap(v, 1024, 4096 * 4 + 512).unwrap();
    model[1024..1024 + 4096 * 4 + 512].fill(0);
    let mut back = vec![0u8; 1 << 20];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    // A chunk made all-zero by a partial unmap is unmapped.
    engine.unmap(v, 0, 1024).unwrap();
    assert_eq!(
        engine.chunk_status(v, 0).unwrap().0,
        ChunkState::Deallocated
    );
    let mut odd = vec![0u8; 1536];
    engine.read(v, 3584 - 512, &mut odd).unwrap();
    assert!(odd[..] == model[3072..3072 + 1536]);
}

#[test]
fn snapshots_are_isolated_and_deleting_frees_only_unshared_chunks() {
    let (_, engine) = mem_engine(32 << 20);
    let v = engine.create_volume(4 << 20).unwrap();
    let base = noise(5, 4 << 20);
    engine.write(v, 0, &base).unwrap();
    let snap = engine.clone_volume(v).unwrap();
    let live = engine.space().live_bytes;
    assert_eq!(engine.volume_usage(snap).unwrap().unique_bytes, 0);
    engine.write(v, 1 << 20, &noise(6, 1 << 20)).unwrap();
    let mut back = vec![0u8; 4 << 20];
    engine.read(snap, 0, &mut back).unwrap();
    assert!(back == base, "snapshot unchanged by writes to its origin");
    let snap_unique = engine.volume_usage(snap).unwrap().unique_bytes;
    assert!(
        snap_unique >= 1 << 20,
        "the overwritten MiB now belongs to the snapshot alone"
    );
    engine.delete_volume(snap).unwrap();
    let after = engine.space().live_bytes;
    assert_eq!(
        after, live,
        "deleting the snapshot freed exactly what it alone held"
    );
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

#[test]
fn chunk_status_follows_runs_across_pages_and_stops_at_the_scan_limit() {
    let (_, engine) = mem_engine(64 << 20);
    // 8 GiB thin volume: twice the scan limit; map pages hold 1024 chunks.
    let v = engine
        .create_volume(2 * STATUS_SCAN_CHUNKS * CS as u64)
        .unwrap();
    // Chunks 1000..4000 mapped (one pattern, stored once), crossing three page boundaries.
    let pattern = noise(3, CS);
    for c in 1000..4000u64 {
        engine.write(v, c * CS as u64, &pattern).unwrap();
    }
    engine.unmap(v, 2500 * CS as u64, CS as u64).unwrap();
    let status = |c| engine.chunk_status(v, c).unwrap();
    assert_eq!(status(0), (ChunkState::Deallocated, 1000));
    assert_eq!(status(1000), (ChunkState::Mapped, 1500));
    assert_eq!(status(1024), (ChunkState::Mapped, 1476));
    assert_eq!(status(2500), (ChunkState::Deallocated, 1));
    assert_eq!(status(2501), (ChunkState::Mapped, 1499));
    // From inside a present page into absent ones, cut at the scan limit.
    assert_eq!(status(4000), (ChunkState::Deallocated, STATUS_SCAN_CHUNKS));
    let last = 2 * STATUS_SCAN_CHUNKS - 1;
    assert_eq!(status(last), (ChunkState::Deallocated, 1));
    assert!(engine.chunk_status(v, last + 1).is_err());
}

#[test]
fn copy_by_reference_adds_no_data() {
    let (_, engine) = mem_engine(32 << 20);
    let a = engine.create_volume(4 << 20).unwrap();
    let b = engine.create_volume(4 << 20).unwrap();
    let data = noise(7, 3 << 20);
    engine.write(a, 0, &data).unwrap();
    let live = engine.space().live_bytes;
    // Same alignment within a chunk (512-byte offset): head and tail partial chunks go
    // through the data path and are deduplicated or stored; whole chunks are shared.
    assert!(engine
        .copy(a, 512, b, 4096 * 10 + 512, (2 << 20) - 1024)
        .unwrap());
    let mut back = vec![0u8; (2 << 20) - 1024];
    engine.read(b, 4096 * 10 + 512, &mut back).unwrap();
    assert!(back[..] == data[512..512 + back.len()]);
    let grown = engine.space().live_bytes - live;
    assert!(
        grown <= 2 * (CS as u64 + 64),
        "only the two edge chunks are new: {grown}"
    );
    // Different alignment cannot share chunks.
    assert!(!engine.copy(a, 512, b, 0, 4096).unwrap());
}

#[test]
fn state_survives_clean_restart_and_crash_without_flush_loses_only_unflushed() {
    let (backend, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(1 << 20).unwrap();
    engine.write(v, 0, &text(1, 64 << 10)).unwrap();
    engine.flush().unwrap();
    engine.write(v, 64 << 10, &text(2, 64 << 10)).unwrap();
    // Crash keeping none of the unflushed writes.
    let crashed = Arc::new(backend.crash(|_, n| vec![false; n]));
    drop(engine);
    let engine = Engine::open(crashed.clone(), Tuning::default(), false).unwrap();
    let mut back = vec![0u8; 128 << 10];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back[..64 << 10] == text(1, 64 << 10)[..]);
    assert!(back[64 << 10..].iter().all(|&x| x == 0));
    assert!(engine.check(&mut |_, _| {}).is_empty());
    // Keep writing after recovery, then restart cleanly.
    engine.write(v, 64 << 10, &text(3, 64 << 10)).unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(crashed, Tuning::default(), false).unwrap();
    engine.read(v, 64 << 10, &mut back[..64 << 10]).unwrap();
    assert!(back[..64 << 10] == text(3, 64 << 10)[..]);
    assert_eq!(
        engine.recovery().records_replayed,
        0,
        "clean shutdown: nothing to replay"
    );
}

#[test]
fn failed_sync_poisons_the_engine() {
    let (backend, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(1 << 20).unwrap();
    engine.write(v, 0, &text(1, 8192)).unwrap();
    backend.fail_next_sync();
    assert!(matches!(engine.flush(), Err(EngineError::Poisoned(_))));
    assert!(matches!(
        engine.write(v, 0, &text(2, 8192)),
        Err(EngineError::Poisoned(_))
    ));
    assert!(matches!(engine.flush(), Err(EngineError::Poisoned(_))));
    assert!(engine.poisoned().unwrap().contains("fsync"));
    // Reads still work from what was written.
    let mut back = vec![0u8; 8192];
    engine.read(v, 0, &mut back).unwrap();
}

/// Write-through completions run after their sync as one round of answers: a transport can
/// hold back what it announces of each (a socket write, a wake-up) until the round is over.
#[test]
fn durable_completions_are_answered_as_a_round() {
    let (_backend, engine) = mem_engine(16 << 20);
    let engine = Arc::new(engine);
    let v = engine.create_volume(1 << 20).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for k in 0..4u64 {
        engine.write(v, k * 8192, &text(k, 8192)).unwrap();
        let tx = tx.clone();
        engine.flush_then(Box::new(move |synced| {
            let in_round = sliver_volume::answers::running();
            let announced = tx.clone();
            sliver_volume::answers::at_round_end(move || {
                announced.send(format!("announce {k}")).unwrap()
            });
            tx.send(format!("answer {k}: {synced:?}, in a round: {in_round}"))
                .unwrap();
        }));
    }
    drop(tx);
    let events: Vec<String> = (0..8)
        .map(|n| {
            rx.recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("only {n} of 8 answers and announcements came"))
        })
        .collect();
    for k in 0..4 {
        let answer = events
            .iter()
            .position(|e| *e == format!("answer {k}: Ok(()), in a round: true"))
            .unwrap_or_else(|| panic!("answer {k} in a round: {events:?}"));
        let announce = events
            .iter()
            .position(|e| *e == format!("announce {k}"))
            .unwrap();
        assert!(announce > answer, "{events:?}");
    }
}

/// A write-through completion that panics is the transport's bug, but must not leave every
/// later write-through command unanswered with the thread it took down.
#[test]
fn a_panicking_completion_leaves_the_group_commit_thread_answering() {
    let (_backend, engine) = mem_engine(16 << 20);
    let engine = Arc::new(engine);
    let v = engine.create_volume(1 << 20).unwrap();
    engine.write(v, 0, &text(1, 8192)).unwrap();
    engine.flush_then(Box::new(|_| panic!("a transport's completion panicked")));
    let (tx, rx) = std::sync::mpsc::channel();
    engine.write(v, 8192, &text(2, 8192)).unwrap();
    engine.flush_then(Box::new(move |synced| tx.send(synced.is_ok()).unwrap()));
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
}

#[test]
fn full_array_refuses_new_data_but_unmap_and_overwrites_of_known_data_work() {
    // 64 segments of 128 KiB = 8 MiB; 2 reserved for the collector.
    let (_, engine) = mem_engine(8 << 20);
    let v = engine.create_volume(32 << 20).unwrap();
    let mut written = 0u64;
    let err = loop {
        match engine.write(v, written, &noise(written, 256 << 10)) {
            Ok(()) => written += 256 << 10,
            Err(e) => break e,
        }
        assert!(written < 32 << 20, "never ran out of space");
    };
    assert!(matches!(err, EngineError::NoSpace), "{err:?}");
    assert!(
        written >= 6 << 20,
        "filled most of the array before failing: {written}"
    );
    // Data already stored can be written again (dedup needs no space).
    engine.write(v, written, &noise(0, 256 << 10)).unwrap();
    // Freeing space works when full, and then writes succeed again.
    engine.unmap(v, 0, 4 << 20).unwrap();
    engine
        .write(v, written + (256 << 10), &noise(999, 256 << 10))
        .unwrap();
    let mut back = vec![0u8; 256 << 10];
    engine.read(v, written + (256 << 10), &mut back).unwrap();
    assert!(back == noise(999, 256 << 10));
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

#[test]
fn garbage_collection_returns_space_and_keeps_data() {
    let (_, engine) = mem_engine(16 << 20);
    // Free every other 64 KiB: segments become half dead.
    let (v, data) = half_dead_volume(&engine, 11);
    let before = engine.space();
    assert!(before.reclaimable_bytes >= 3 << 20, "{before:?}");
    let moved = engine.collect_garbage(0.9).unwrap();
    let after = engine.space();
    assert!(moved > 0);
    assert!(
        after.physical_used_bytes < before.physical_used_bytes - (2 << 20),
        "{before:?} -> {after:?}"
    );
    assert!(after.write_amplification > 1.0);
    assert_half_dead_volume_reads_back(&engine, v, &data);
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

/// A segment the collector cannot read is left alone for the tuning's retry and read again
/// after it: a failed read may pass (an object store out of reach under a restore on
/// demand), and a segment never collected again would hold its dead space until a restart.
#[test]
fn collector_reads_an_unreadable_segment_again_after_its_retry() {
    let (backend, engine) = mem_engine(16 << 20);
    // Every other 64 KiB dead: the segments are worth collecting but hold live data.
    let (v, data) = half_dead_volume(&engine, 15);
    engine.checkpoint().unwrap();
    let retry = |unreadable_retry| {
        engine.set_tuning(Tuning {
            unreadable_retry,
            ..engine.tuning()
        })
    };
    // Reads fail, then come back: within the retry the collector does not read again.
    retry(std::time::Duration::from_secs(3600));
    backend.fail_reads(0, 16 << 20);
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    let before = engine.space();
    backend.fail_reads(0, 0);
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    assert_eq!(
        engine.space().physical_used_bytes,
        before.physical_used_bytes
    );
    // A retry that has passed (none) reads them again, and their dead space comes back.
    retry(std::time::Duration::ZERO);
    assert!(engine.collect_garbage(0.9).unwrap() > 0);
    let after = engine.space();
    assert!(
        after.physical_used_bytes + (2 << 20) < before.physical_used_bytes,
        "{before:?} -> {after:?}"
    );
    assert!(engine.poisoned().is_none());
    assert_half_dead_volume_reads_back(&engine, v, &data);
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

/// The collector leaves a segment it could not read for the tuning's retry, doubled for every
/// failure, by the engine's clock: moved by hand here, so the hour-long waits take no time.
#[test]
fn the_wait_for_an_unreadable_segment_doubles_with_every_failure() {
    let (backend, engine) = mem_engine(16 << 20);
    let clock = Arc::new(sliver_engine::clock::ManualClock::new());
    engine.set_clock(clock.clone());
    half_dead_volume(&engine, 16);
    engine.checkpoint().unwrap();
    let hour = Duration::from_secs(3600);
    engine.set_tuning(Tuning {
        unreadable_retry: hour,
        ..engine.tuning()
    });
    let reads = || backend.reads_failed();
    backend.fail_reads(0, 16 << 20);
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    let first = reads();
    assert!(first > 0, "the collector tried to read");
    // Within the hour nothing is read again; past it the segment is tried (and fails again).
    clock.advance(hour - Duration::from_secs(1));
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    assert_eq!(reads(), first, "read again within its retry");
    clock.advance(Duration::from_secs(2));
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    let second = reads();
    assert!(second > first, "not read again after its retry");
    // The second failure doubles the wait: one hour later it is still left alone.
    clock.advance(hour + Duration::from_secs(1));
    assert_eq!(engine.collect_garbage(0.9).unwrap(), 0);
    assert_eq!(reads(), second, "the wait did not double");
    // Two hours after it, with reads working again, its dead space comes back.
    backend.fail_reads(0, 0);
    clock.advance(hour);
    assert!(engine.collect_garbage(0.9).unwrap() > 0);
    assert!(engine.poisoned().is_none());
}

/// A segment whose chunks are all dead is freed without reading it: after a large UNMAP or
/// zeroing the collector has nothing to relocate, and reading whole segments only to find
/// that out cost CPU and disk bandwidth the hosts were waiting for. Reads that fail while the
/// collector runs prove it never looked.
#[test]
fn collecting_entirely_dead_segments_reads_nothing() {
    let capacity = 16 << 20;
    let (backend, engine) = mem_engine(capacity);
    let v = engine.create_volume(8 << 20).unwrap();
    let data = noise(12, 8 << 20);
    engine.write(v, 0, &data).unwrap();
    engine.unmap(v, 0, 4 << 20).unwrap();
    engine.checkpoint().unwrap();
    let before = engine.space();
    backend.fail_reads(0, capacity);
    engine.collect_garbage(0.0).unwrap();
    backend.fail_reads(0, 0);
    let after = engine.space();
    assert!(engine.poisoned().is_none());
    assert!(
        after.physical_used_bytes + (3 << 20) < before.physical_used_bytes,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.gc_relocated_bytes, before.gc_relocated_bytes);
    let mut back = vec![0u8; 8 << 20];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back[..4 << 20].iter().all(|&x| x == 0));
    assert!(back[4 << 20..] == data[4 << 20..]);
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

/// Background maintenance frees all dead segments in one pass, without reading them, and
/// data that is still live is untouched.
#[test]
fn maintenance_frees_dead_segments_in_one_pass() {
    let capacity = 16 << 20;
    let (backend, engine) = mem_engine(capacity);
    let v = engine.create_volume(8 << 20).unwrap();
    let data = noise(13, 8 << 20);
    engine.write(v, 0, &data).unwrap();
    engine.unmap(v, 2 << 20, 4 << 20).unwrap();
    engine.checkpoint().unwrap();
    // Rate-limited relocation (which must read) off: this pass may only free dead segments.
    engine.set_tuning(Tuning {
        gc: GcPriority::Off,
        ..engine.tuning()
    });
    let before = engine.space();
    backend.fail_reads(0, capacity);
    engine.maintain().unwrap();
    backend.fail_reads(0, 0);
    let after = engine.space();
    assert!(engine.poisoned().is_none());
    assert!(
        after.physical_used_bytes + (3 << 20) < before.physical_used_bytes,
        "{before:?} -> {after:?}"
    );
    // New data lands in the freed segments and reads back with the old.
    let fresh = noise(14, 4 << 20);
    engine.write(v, 2 << 20, &fresh).unwrap();
    engine.flush().unwrap();
    let mut back = vec![0u8; 8 << 20];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back[..2 << 20] == data[..2 << 20]);
    assert!(back[2 << 20..6 << 20] == fresh[..]);
    assert!(back[6 << 20..] == data[6 << 20..]);
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

#[test]
fn file_backend_round_trip_with_real_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(FileBackend::open(dir.path(), 64 << 20).unwrap());
    let engine = Engine::create(backend, EngineConfig::default(), Tuning::default()).unwrap();
    let v = engine.create_volume(16 << 20).unwrap();
    engine.write(v, 4096, &text(1, 1 << 20)).unwrap();
    engine.flush().unwrap();
    drop(engine);
    let backend = Arc::new(FileBackend::open(dir.path(), 64 << 20).unwrap());
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    let mut back = vec![0u8; 1 << 20];
    engine.read(v, 4096, &mut back).unwrap();
    assert!(back == text(1, 1 << 20));
    assert!(
        engine.recovery().records_replayed > 0,
        "replayed the log after the checkpoint"
    );
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

/// A log in several files (ext4 holds at most 16 TiB in one; here 1 MiB each, 8 segments):
/// data written across every file, overwritten so the collector moves it between files, reads
/// back after a restart and checks clean.
#[test]
fn a_log_in_several_files_works_like_one() {
    let dir = tempfile::tempdir().unwrap();
    let open = |capacity| -> Arc<FileBackend> {
        Arc::new(FileBackend::open_with_span(dir.path(), capacity, 1 << 20).unwrap())
    };
    let engine = Engine::create(open(12 << 20), config(), Tuning::default()).unwrap();
    let v = engine.create_volume(4 << 20).unwrap();
    let mut model = noise(1, 4 << 20);
    engine.write(v, 0, &model).unwrap();
    for k in 0..24u64 {
        let at = (k * 7 % 32) << 17;
        let data = noise(100 + k, 128 << 10);
        engine.write(v, at, &data).unwrap();
        model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    assert!(
        engine.collect_garbage(0.9).unwrap() > 0,
        "the collector moved something"
    );
    engine.flush().unwrap();
    drop(engine);
    assert!(dir.path().join("log.11").exists() && !dir.path().join("log.12").exists());
    let engine = Engine::open(open(0), Tuning::default(), false).unwrap();
    let mut back = vec![0u8; 4 << 20];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model, "the volume reads back");
    assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
}

/// `chunks` chunks of 4 KiB, every third compressible, the others not (distinct seeds:
/// chunks alike would be one stored chunk).
fn mixed_chunks(chunks: u64) -> Vec<u8> {
    (0..chunks)
        .flat_map(|k| {
            if k % 3 == 0 {
                text(k, 4096)
            } else {
                noise(2 * k + 1, 4096)
            }
        })
        .collect()
}

/// Flip a bit inside chunk `chunk` of `model` (one stored raw) where the log holds it.
fn damage_chunk(backend: &dyn LogDevice, model: &[u8], chunk: usize) {
    let needle = &model[chunk * 4096 + 1000..chunk * 4096 + 1064];
    let mut log = vec![0u8; 2 << 20];
    backend.read_at(&mut log, 0).unwrap();
    let at = log.windows(64).position(|w| w == needle).unwrap();
    backend.write_at(&[log[at] ^ 0x40], at as u64).unwrap();
}

/// Over log files, chunks stored raw are read in two parts (their data straight into the
/// caller's buffer) and compressed ones whole, side by side in one read; a raw chunk damaged
/// on disk is refused for its own blocks only.
#[test]
fn raw_and_compressed_chunks_read_back_from_files_and_damage_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(FileBackend::open(dir.path(), 16 << 20).unwrap());
    let engine = Engine::create(backend.clone(), config(), Tuning::default()).unwrap();
    let v = engine.create_volume(1 << 20).unwrap();
    let model = mixed_chunks(64);
    engine.write(v, 0, &model).unwrap();
    engine.flush().unwrap();
    let mut back = vec![0u8; model.len()];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    // Damage chunk 10 (stored raw) in the log file.
    damage_chunk(&*backend, &model, 10);
    match engine.read(v, 0, &mut back) {
        Err(EngineError::Corrupt { offset, .. }) => assert_eq!(offset, 10 * 4096),
        other => panic!("{other:?}"),
    }
    let mut around = vec![0u8; 10 * 4096];
    engine.read(v, 0, &mut around).unwrap();
    assert!(around[..] == model[..10 * 4096]);
    engine.read(v, 11 * 4096, &mut around).unwrap();
    assert!(around[..] == model[11 * 4096..21 * 4096]);
}

/// Drop the files under `dir` from the page cache (after making them durable).
fn evict_page_cache(dir: &std::path::Path) {
    use std::os::unix::io::AsRawFd;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let f = std::fs::File::open(&path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a valid descriptor; the call only drops clean cached pages.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
    }
}

#[test]
fn a_read_that_would_wait_for_the_disk_is_left_to_a_thread_that_may() {
    // On the disk the target directory is on: a tmpfs would keep the files cached.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let open = || Arc::new(FileBackend::open(dir.path(), 16 << 20).unwrap());
    let engine = Engine::create(open(), config(), Tuning::default()).unwrap();
    let v = engine.create_volume(1 << 20).unwrap();
    let model = mixed_chunks(64);
    engine.write(v, 0, &model).unwrap();
    engine.flush().unwrap();
    // Just written: metadata and data cached.
    let mut back = vec![0u8; model.len()];
    assert!(engine.read_cached(v, 0, &mut back).unwrap());
    assert!(back == model);
    // Not aligned to chunks: always left to the waiting read.
    assert!(!engine.read_cached(v, 512, &mut back[..4096]).unwrap());
    // Out of the page cache: it would wait for the disk. POSIX_FADV_DONTNEED is advice and
    // can leave pages behind (those still in another CPU's batch on their way to the LRU
    // lists, for one: it drains only the calling CPU's); once in the whole workspace's run
    // it did. So eviction is tried again until it took; the read must then refuse.
    let evicted = (0..50).any(|_| {
        evict_page_cache(dir.path());
        back.fill(0);
        let cached = engine.read_cached(v, 0, &mut back).unwrap();
        if cached {
            // Answered from the cache: the bytes must be right all the same.
            assert!(back == model);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        !cached
    });
    assert!(
        evicted,
        "a read of evicted pages was answered without waiting"
    );
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    assert!(engine.read_cached(v, 4096, &mut back[..8192]).unwrap());
    assert!(back[..8192] == model[4096..12288]);
    engine.shutdown().unwrap();
    drop(engine);
    // Reopened: the map's pages are read from the metadata file on first use, by the
    // waiting read.
    let engine = Engine::open(open(), Tuning::default(), false).unwrap();
    assert!(!engine.read_cached(v, 0, &mut back).unwrap());
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    assert!(engine.read_cached(v, 0, &mut back).unwrap());
    // A damaged chunk is the waiting read's to report: never bytes, never an answer here.
    damage_chunk(&*open(), &model, 10);
    assert!(!engine.read_cached(v, 0, &mut back).unwrap());
    assert!(matches!(
        engine.read(v, 0, &mut back),
        Err(EngineError::Corrupt { offset, .. }) if offset == 10 * 4096
    ));
}

#[test]
fn corrupted_chunk_is_reported_for_its_blocks_only() {
    let (backend, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(1 << 20).unwrap();
    engine.write(v, 0, &noise(1, 64 << 10)).unwrap();
    engine.flush().unwrap();
    // Flip a byte inside the stored data: the first segment's records start after the
    // volume-create record; find the chunk by reading back failures.
    let mut raw = vec![0u8; 128 << 10];
    backend.read_at(&mut raw, 0).unwrap();
    let needle = &noise(1, 64 << 10)[8192..8192 + 64];
    let at = raw.windows(64).position(|w| w == needle).unwrap();
    raw[at] ^= 0xff;
    backend.write_at(&raw[at..at + 1], at as u64).unwrap();
    let mut buf = vec![0u8; 4096];
    match engine.read(v, 8192, &mut buf) {
        Err(EngineError::Corrupt { offset, .. }) => assert_eq!(offset, 8192),
        other => panic!("{other:?}"),
    }
    engine.read(v, 4096, &mut buf).unwrap();
    engine.read(v, 12288, &mut buf).unwrap();
    assert!(!engine.check(&mut |_, _| {}).is_empty());
}

#[test]
fn anchored_chunks_read_zeros_hold_space_and_survive_replay_and_checkpoint() {
    let (backend, engine) = mem_engine(16 << 20);
    let v = engine.create_volume(1 << 20).unwrap();
    let mut model = noise(11, 256 << 10);
    engine.write(v, 0, &model).unwrap();
    engine.flush().unwrap();
    let available = engine.available_bytes();
    // Partial chunks at both ends are zeroed; chunks 1..49 become anchored.
    engine.anchor(v, 1000, 200_000).unwrap();
    model[1000..201_000].fill(0);
    let five = noise(12, CS);
    engine.write(v, 5 * CS as u64, &five).unwrap();
    model[5 * CS..6 * CS].copy_from_slice(&five);
    let expect = |engine: &Engine| {
        let status = |c| engine.chunk_status(v, c).unwrap();
        assert_eq!(status(0), (ChunkState::Mapped, 1));
        assert_eq!(status(1), (ChunkState::Anchored, 4));
        assert_eq!(
            status(5),
            (ChunkState::Mapped, 1),
            "written after anchoring"
        );
        assert_eq!(status(6), (ChunkState::Anchored, 43));
        assert_eq!(status(49).0, ChunkState::Mapped);
        let mut back = vec![0u8; model.len()];
        engine.read(v, 0, &mut back).unwrap();
        assert!(back == model);
        assert_eq!(
            engine.volume_usage(v).unwrap().anchored_bytes,
            47 * CS as u64
        );
        assert!(engine.space().anchored_bytes >= 47 * CS as u64);
        assert!(engine.available_bytes() + 47 * CS as u64 <= available);
        assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    };
    expect(&engine);
    // Crash after a flush: the anchors come back by replaying the log.
    engine.flush().unwrap();
    let crashed = Arc::new(backend.crash(|_, n| vec![false; n]));
    drop(engine);
    let engine = Engine::open(crashed.clone(), Tuning::default(), false).unwrap();
    assert!(engine.recovery().records_replayed > 0);
    expect(&engine);
    // Clean restart: from the checkpoint.
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(crashed, Tuning::default(), false).unwrap();
    assert_eq!(engine.recovery().records_replayed, 0);
    expect(&engine);
    // A snapshot shares the anchored page; deleting both gives all the held space back.
    let snap = engine.clone_volume(v).unwrap();
    engine.write(v, 7 * CS as u64, &five).unwrap();
    assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    engine.delete_volume(v).unwrap();
    engine.delete_volume(snap).unwrap();
    assert_eq!(engine.space().anchored_bytes, 0);
    assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
}

#[test]
fn writes_into_anchored_chunks_use_the_space_held_for_them() {
    let (_, engine) = mem_engine(8 << 20);
    let v = engine.create_volume(64 << 20).unwrap();
    const PIECE: usize = 64 << 10;
    let anchored = 1 << 20;
    engine.anchor(v, 0, anchored).unwrap();
    // Fill everything else with unique data until the array refuses.
    let mut offset = anchored;
    let mut seed = 100;
    loop {
        match engine.write(v, offset, &noise(seed, PIECE)) {
            Ok(()) => {}
            Err(EngineError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
        offset += PIECE as u64;
        seed += 1;
        assert!(offset < 64 << 20, "the array never filled");
    }
    assert!(offset > 2 << 20, "wrote only {offset} bytes");
    // More anchoring needs space that is not there; nothing changes.
    let c = (offset + (1 << 20)) / CS as u64;
    assert!(matches!(
        engine.anchor(v, c * CS as u64, 1 << 20),
        Err(EngineError::NoSpace)
    ));
    assert_eq!(
        engine.chunk_status(v, c).unwrap().0,
        ChunkState::Deallocated
    );
    // Every anchored chunk can still be written with data that does not compress.
    for (i, at) in (0..anchored).step_by(PIECE).enumerate() {
        engine.write(v, at, &noise(9000 + i as u64, PIECE)).unwrap();
    }
    assert_eq!(engine.space().anchored_bytes, 0);
    let mut back = vec![0u8; PIECE];
    engine.read(v, anchored - PIECE as u64, &mut back).unwrap();
    assert!(back == noise(9000 + (anchored / PIECE as u64 - 1), PIECE));
    assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
}

/// A nearly full array under concurrent random overwrites, with the background collector
/// running and checkpoints taken alongside (they hold the metadata lock only to capture the
/// state, so writers go on meanwhile): no write runs out of space, what was written reads back,
/// and the space accounting stays exact (`check` recomputes it from the chunks).
#[test]
fn a_nearly_full_array_keeps_taking_overwrites_while_checkpoints_and_the_collector_run() {
    let backend = Arc::new(MemBackend::new(12 << 20));
    let tuning = Tuning {
        gc: GcPriority::High,
        ..Tuning::default()
    };
    let engine = Arc::new(Engine::create(backend, config(), tuning).unwrap());
    let background = engine.start_background();
    let usable = engine.capacity_bytes();
    const IO: u64 = 64 << 10;
    const WRITERS: u64 = 4;
    // 85 % of what hosts can fill, split into one region per writer.
    let region = (usable * 85 / 100 / WRITERS) / IO * IO;
    let v = engine.create_volume(region * WRITERS).unwrap();
    for w in 0..WRITERS {
        engine
            .write(v, w * region, &noise(w + 1, region as usize))
            .unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let checkpoints = s.spawn(|| {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                engine.checkpoint().unwrap();
                n += 1;
                // Let the collector have the maintenance lock between checkpoints.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            n
        });
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let engine = &engine;
                s.spawn(move || {
                    let mut model = noise(w + 1, region as usize);
                    let mut x = w * 7919 + 13;
                    // Overwrite each region about three times over.
                    for i in 0..3 * region / IO {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let at = (x >> 33) % (region / IO) * IO;
                        let data = noise(1000 + w * 100_000 + i, IO as usize);
                        engine.write(v, w * region + at, &data).unwrap_or_else(|e| {
                            panic!("writer {w}, overwrite {i}: {e}");
                        });
                        model[at as usize..(at + IO) as usize].copy_from_slice(&data);
                    }
                    model
                })
            })
            .collect();
        let models: Vec<_> = writers.into_iter().map(|h| h.join()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(checkpoints.join().unwrap() > 0);
        models.into_iter().map(|m| m.unwrap()).collect()
    });
    for (w, model) in models.iter().enumerate() {
        let mut back = vec![0u8; region as usize];
        engine.read(v, w as u64 * region, &mut back).unwrap();
        assert!(back == *model, "region {w} reads back other data");
    }
    assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
    engine.shutdown().unwrap();
    background.join().unwrap();
}

/// Requests outside a volume are refused whole, before anything is written, whether the
/// range is checked up front (partial chunks, several batches) or inside the commit's own lock
/// hold (whole chunks in one batch) or the read's (aligned reads).
#[test]
fn requests_outside_a_volume_are_refused_whole_and_write_nothing() {
    let (_, e) = mem_engine(8 << 20);
    let size = 16 * CS as u64;
    let vol = e.create_volume(size).unwrap();
    let out_of_range = |r: Result<(), EngineError>, offset: u64, len: u64| match r {
        Err(EngineError::OutOfRange {
            volume,
            offset: o,
            len: l,
            size: s,
        }) => {
            assert_eq!((volume, o, l, s), (vol, offset, len, size));
        }
        other => panic!("expected OutOfRange for {offset}+{len}, got {other:?}"),
    };
    let data = text(1, 4 * CS);
    let before = e.space();
    // Whole chunks in one batch, crossing the end: its first two chunks are inside.
    let at = size - 2 * CS as u64;
    out_of_range(e.write(vol, at, &data), at, data.len() as u64);
    // Whole chunks entirely past the end, and an offset whose end overflows.
    out_of_range(e.write(vol, size, &data[..CS]), size, CS as u64);
    out_of_range(
        e.write(vol, u64::MAX - CS as u64 + 1, &data[..CS]),
        u64::MAX - CS as u64 + 1,
        CS as u64,
    );
    // A partial chunk crossing the end, and more than one batch crossing it.
    out_of_range(e.write(vol, size - 100, &data[..200]), size - 100, 200);
    let long = text(2, 64 * CS);
    out_of_range(e.write(vol, 0, &long), 0, long.len() as u64);
    // Nothing of the refused writes landed: the range inside still reads as zeros.
    let mut back = vec![0xAAu8; size as usize];
    e.read(vol, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "a refused write left data");
    assert_eq!(e.space().logical_mapped_bytes, before.logical_mapped_bytes);
    // Reads: aligned (checked in the read's own lock hold) and unaligned.
    let mut buf = vec![0u8; 2 * CS];
    out_of_range(
        e.read(vol, at + CS as u64, &mut buf),
        at + CS as u64,
        buf.len() as u64,
    );
    out_of_range(e.read(vol, size - 10, &mut buf[..20]), size - 10, 20);
    let huge = u64::MAX - CS as u64 + 1;
    out_of_range(e.read(vol, huge, &mut buf), huge, buf.len() as u64);
    out_of_range(e.read(vol, huge + 10, &mut buf[..20]), huge + 10, 20);
    // A volume that does not exist.
    assert!(matches!(
        e.write(vol + 7, 0, &data[..CS]),
        Err(EngineError::NoSuchVolume(v)) if v == vol + 7
    ));
    let mut one = vec![0u8; CS];
    assert!(matches!(
        e.read(vol + 7, 0, &mut one),
        Err(EngineError::NoSuchVolume(v)) if v == vol + 7
    ));
    // And the edges themselves work.
    e.write(vol, at, &data[..2 * CS]).unwrap();
    e.read(vol, at, &mut buf).unwrap();
    assert_eq!(buf, &data[..2 * CS]);
}
