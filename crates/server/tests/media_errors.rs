//! Faults of the storage under the engine, seen through the SCSI layer: a LogicalUnit over an
//! engine volume whose backend fails on command.
//!
//! - An unreadable stretch of the log (EIO on read) is MEDIUM ERROR / UNRECOVERED READ ERROR
//!   (03/11/00) for the blocks stored there and nothing else; the engine keeps accepting
//!   writes, and overwriting whole chunks of the bad blocks makes them readable again.
//! - A failed fsync (SYNCHRONIZE CACHE, FUA) or a failed log write poisons the engine: that
//!   command and every later write, UNMAP and WRITE SAME get HARDWARE ERROR / INTERNAL TARGET
//!   FAILURE (04/44/00), never GOOD; reads keep working; a restart recovers what was synced.

mod engine_lu;

use engine_lu::{cdb16, codes, good, tuning, Identity, Model, Modelled, CHUNK, MIB};
use sliver_engine::{Engine, LogDevice, MemBackend};
use sliver_scsi::{LogicalUnit, Nexus, Response};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

const BS: usize = 512;
const CAPACITY: u64 = 16 * MIB;

/// A MemBackend that can also fail log writes with EIO.
type Faulty = Modelled<FailingWrites>;

/// Log writes fail with EIO while `fail_writes` is set.
struct FailingWrites {
    fail_writes: AtomicBool,
}

impl Model for FailingWrites {
    fn write_at(&self, mem: &MemBackend, data: &[u8], offset: u64) -> io::Result<()> {
        if self.fail_writes.load(SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        mem.write_at(data, offset)
    }
}

/// A backend of [`CAPACITY`] bytes that fails nothing yet.
fn faulty() -> Arc<Faulty> {
    Arc::new(Modelled {
        mem: MemBackend::new(CAPACITY),
        model: FailingWrites {
            fail_writes: AtomicBool::new(false),
        },
    })
}

struct Fixture {
    backend: Arc<Faulty>,
    engine: Arc<Engine>,
    lu: LogicalUnit,
    nexus: Nexus,
}

fn lu_over(engine: &Arc<Engine>, id: u32) -> LogicalUnit {
    let who = Identity {
        serial: "media-errors",
        naa: [0x6a; 16],
        target_name: "iqn.2026-11.test.sliver:media",
    };
    engine_lu::lu_over(engine, id, BS as u32, &who)
}

fn nexus() -> Nexus {
    engine_lu::nexus("iqn.test:media")
}

impl Fixture {
    /// The array opened again after the process or the machine stopped: with the writes not
    /// yet synced (a process crash) or without them (a power loss).
    fn restarted(self, keep_unsynced: bool) -> Fixture {
        let image = self.backend.mem.crash(|_, n| vec![keep_unsynced; n]);
        drop(self);
        let engine = Arc::new(Engine::open(Arc::new(image), tuning(), false).unwrap());
        let id = engine.volumes()[0].0;
        Fixture::powered_on(faulty(), engine, id)
    }

    fn new() -> Self {
        let backend = faulty();
        let engine = engine_lu::create_engine(backend.clone());
        let id = engine.create_volume(8 * MIB).unwrap();
        Fixture::powered_on(backend, engine, id)
    }

    /// A new fixture with `blocks` blocks of [`pattern`] `seed` written at LBA 0 and synced.
    fn with_synced(seed: u64, blocks: usize) -> (Fixture, Vec<u8>) {
        let f = Fixture::new();
        let data = pattern(seed, blocks);
        good(&f.write(0, &data, false));
        good(&f.sync());
        (f, data)
    }

    /// Volume `id`'s logical unit, checked to tell a new nexus about the power-on first.
    #[track_caller]
    fn powered_on(backend: Arc<Faulty>, engine: Arc<Engine>, id: u32) -> Self {
        let f = Self {
            lu: lu_over(&engine, id),
            backend,
            engine,
            nexus: nexus(),
        };
        let r = f.run(&[0; 6], &[]);
        assert_eq!(codes(&r), (0x6, 0x29, 0x00));
        f
    }

    fn run(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        engine_lu::run(&self.lu, &self.nexus, cdb, data_out)
    }

    fn read(&self, lba: u64, blocks: u32) -> Response {
        self.run(&cdb16(0x88, lba, blocks, false), &[])
    }

    /// A READ that must succeed.
    #[track_caller]
    fn read_good(&self, lba: u64, blocks: u32) -> Response {
        let r = self.read(lba, blocks);
        good(&r);
        r
    }

    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Response {
        self.run(&cdb16(0x8a, lba, (data.len() / BS) as u32, fua), data)
    }

    fn sync(&self) -> Response {
        self.run(&cdb16(0x91, 0, 0, false), &[])
    }

    fn unmap(&self, lba: u64, blocks: u32) -> Response {
        let mut p = vec![0u8; 24];
        p[0..2].copy_from_slice(&22u16.to_be_bytes());
        p[2..4].copy_from_slice(&16u16.to_be_bytes());
        p[8..16].copy_from_slice(&lba.to_be_bytes());
        p[16..20].copy_from_slice(&blocks.to_be_bytes());
        let mut c = [0u8; 10];
        c[0] = 0x42;
        c[8] = 24;
        self.run(&c, &p)
    }

    fn write_same_zero(&self, lba: u64, blocks: u32) -> Response {
        self.run(&cdb16(0x93, lba, blocks, false), &[0u8; BS])
    }

    fn compare_and_write(&self, lba: u64, compare: &[u8], new: &[u8]) -> Response {
        let mut c = [0u8; 16];
        c[0] = 0x89;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[13] = (new.len() / BS) as u8;
        let mut data = compare.to_vec();
        data.extend_from_slice(new);
        self.run(&c, &data)
    }
}

/// The INFORMATION field of fixed-format sense data, if VALID.
fn information(r: &Response) -> Option<u64> {
    (r.sense[0] & 0x80 != 0).then(|| u32::from_be_bytes(r.sense[3..7].try_into().unwrap()) as u64)
}

const MEDIUM_ERROR_UNRECOVERED_READ: (u8, u8, u8) = (0x3, 0x11, 0x00);
const INTERNAL_TARGET_FAILURE: (u8, u8, u8) = (0x4, 0x44, 0x00);

/// Fails unless `r` is HARDWARE ERROR / INTERNAL TARGET FAILURE: what a poisoned engine
/// answers.
#[track_caller]
fn internal_target_failure(r: &Response) {
    assert_eq!(codes(r), INTERNAL_TARGET_FAILURE);
}

/// `blocks` blocks of content unique to `seed` (no two 4 KiB chunks alike).
fn pattern(seed: u64, blocks: usize) -> Vec<u8> {
    sliver_test_support::data::unique(seed, blocks * BS)
}

/// Where `needle` is stored in the log (chunks are stored verbatim without compression).
fn find_in_log(backend: &Faulty, needle: &[u8]) -> u64 {
    let mut log = vec![0u8; CAPACITY as usize];
    backend.mem.read_at(&mut log, 0).unwrap();
    let hits: Vec<usize> = log
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "the chunk is stored exactly once");
    hits[0] as u64
}

#[test]
fn an_unreadable_chunk_is_a_medium_error_for_its_blocks_only() {
    // 32 chunks (256 blocks) of unique data, durable.
    let (f, data) = Fixture::with_synced(1, 256);
    // Chunk 5 (LBA 40..48) becomes unreadable.
    let bad = 5 * CHUNK;
    let at = find_in_log(&f.backend, &data[bad..bad + CHUNK]);
    f.backend.mem.fail_reads(at, CHUNK as u64);

    // The INFORMATION field names the first bad block of the request (Linux fails only the
    // blocks from there on and completes the ones before).
    for (lba, blocks, first_bad) in [
        (40, 8, 40),
        (44, 1, 44),
        (47, 1, 47),
        (0, 256, 40),
        (36, 8, 40),
    ] {
        let r = f.read(lba, blocks);
        assert_eq!(
            codes(&r),
            MEDIUM_ERROR_UNRECOVERED_READ,
            "READ LBA {lba} x{blocks} covers the bad chunk"
        );
        assert_eq!(information(&r), Some(first_bad), "READ LBA {lba} x{blocks}");
    }
    // Every other block reads back, right up to the bad chunk's edges.
    for (lba, blocks) in [(0u64, 40u32), (32, 8), (39, 1), (48, 8), (48, 208)] {
        let r = f.read_good(lba, blocks);
        let a = lba as usize * BS;
        assert!(
            r.data_in == data[a..a + blocks as usize * BS],
            "READ LBA {lba} x{blocks} returned other data"
        );
    }
    // COMPARE AND WRITE must read the medium to compare: it fails the same way.
    let old = &data[40 * BS..41 * BS];
    assert_eq!(
        codes(&f.compare_and_write(40, old, &pattern(2, 1))),
        MEDIUM_ERROR_UNRECOVERED_READ
    );
    // A write of part of the bad chunk has to merge with what it cannot read: a medium
    // error, nothing written, and the engine not poisoned.
    let r = f.write(41, &pattern(3, 1), false);
    assert_eq!(codes(&r).0, 0x3, "MEDIUM ERROR, sense {:02x?}", r.sense);
    assert_eq!(information(&r), Some(41));
    assert!(
        f.engine.poisoned().is_none(),
        "a read error poisoned the engine"
    );
    // Writes elsewhere and flushes go on.
    let more = pattern(4, 64);
    good(&f.write(512, &more, true));
    good(&f.sync());
    let r = f.read_good(512, 64);
    assert!(r.data_in == more);
    // Rewriting the whole chunk needs no read: the blocks are readable again (the new data
    // lives elsewhere in the log; the fault stays where the old copy was).
    let fresh = pattern(5, 8);
    good(&f.write(40, &fresh, false));
    let r = f.read_good(0, 256);
    assert!(r.data_in[..40 * BS] == data[..40 * BS]);
    assert!(r.data_in[40 * BS..48 * BS] == fresh[..]);
    assert!(r.data_in[48 * BS..] == data[48 * BS..]);
    assert!(f.engine.poisoned().is_none());
}

#[test]
fn a_failed_synchronize_cache_poisons_writes_and_reads_continue() {
    let (f, synced) = Fixture::with_synced(10, 64);
    let unsynced = pattern(11, 64);
    good(&f.write(64, &unsynced, false));

    f.backend.mem.fail_next_sync();
    assert_eq!(
        codes(&f.sync()),
        INTERNAL_TARGET_FAILURE,
        "a failed fsync must never be GOOD"
    );
    assert!(f.engine.poisoned().is_some());
    // Every command that changes data is refused with the same clear sense, also after the
    // device would accept syncs again.
    let new = pattern(12, 8);
    internal_target_failure(&f.write(256, &new, false));
    internal_target_failure(&f.write(256, &new, true));
    internal_target_failure(&f.unmap(0, 8));
    internal_target_failure(&f.write_same_zero(0, 8));
    internal_target_failure(&f.compare_and_write(0, &synced[..BS], &new[..BS]));
    internal_target_failure(&f.sync());
    // Reads go on: synced data, and what is still in the page cache.
    let r = f.read_good(0, 128);
    assert!(r.data_in[..64 * BS] == synced[..]);
    assert!(r.data_in[64 * BS..] == unsynced[..]);
    good(&f.run(&[0; 6], &[])); // TEST UNIT READY
    let mut read_capacity = [0u8; 16];
    read_capacity[0] = 0x9e;
    read_capacity[1] = 0x10;
    read_capacity[13] = 32;
    good(&f.run(&read_capacity, &[]));

    // The operator restarts: recovery from what was durable; writes work again.
    let g = f.restarted(false);
    let r = g.read_good(0, 64);
    assert!(r.data_in == synced, "synced data survives the restart");
    good(&g.write(256, &new, true));
    let r = g.read_good(256, 8);
    assert!(r.data_in == new);
}

#[test]
fn a_failed_fua_write_is_not_good_and_poisons() {
    let f = Fixture::new();
    let before = pattern(20, 16);
    good(&f.write(0, &before, true));
    f.backend.mem.fail_next_sync();
    internal_target_failure(&f.write(16, &pattern(21, 16), true));
    assert!(f.engine.poisoned().is_some());
    internal_target_failure(&f.write(64, &pattern(22, 8), false));
    let r = f.read_good(0, 16);
    assert!(r.data_in == before);
}

#[test]
fn an_eio_on_a_log_write_poisons_and_reads_continue() {
    let (f, before) = Fixture::with_synced(30, 32);
    f.backend.model.fail_writes.store(true, SeqCst);
    internal_target_failure(&f.write(32, &pattern(31, 8), false));
    assert!(f.engine.poisoned().is_some());
    // The device works again, but the engine does not pretend nothing happened.
    f.backend.model.fail_writes.store(false, SeqCst);
    internal_target_failure(&f.write(64, &pattern(32, 8), false));
    internal_target_failure(&f.unmap(0, 8));
    let r = f.read_good(0, 32);
    assert!(r.data_in == before);
    // The failed write was applied before its log write (which runs outside the metadata
    // lock): its blocks report the failure instead of returning what is not on the medium.
    internal_target_failure(&f.read(32, 8));
    // After a restart the log holds nothing of it: its blocks read as they were (zeros).
    let g = f.restarted(true);
    let r = g.read_good(0, 40);
    assert!(r.data_in[..32 * BS] == before[..]);
    assert!(r.data_in[32 * BS..].iter().all(|&b| b == 0));
}

#[test]
fn an_unreadable_segment_does_not_stop_the_collector() {
    let f = Fixture::new();
    // A (256 KiB) then B (2 MiB): A's segment is sealed, and overwriting B leaves garbage for
    // the collector in it.
    let a = pattern(40, 512);
    let b = pattern(41, 4096);
    good(&f.write(0, &a, false));
    good(&f.write(1024, &b, false));
    good(&f.write(1024, &pattern(42, 2048), false));
    good(&f.sync());
    f.engine.checkpoint().unwrap();
    let at = find_in_log(&f.backend, &a[..CHUNK]);
    let segment = at / MIB * MIB;
    f.backend.mem.fail_reads(segment, MIB);

    // The collector meets the unreadable segment: it leaves it alone, and nothing stops.
    f.engine.collect_garbage(1.0).unwrap();
    assert!(
        f.engine.poisoned().is_none(),
        "a read error of the collector poisoned the engine"
    );
    assert_eq!(codes(&f.read(0, 8)), MEDIUM_ERROR_UNRECOVERED_READ);
    let c = pattern(43, 64);
    good(&f.write(8192, &c, true));
    // Everything rewritten (whole chunks: nothing to read): the old segments hold nothing
    // live, and are freed without being read.
    let used = f.engine.space().physical_used_bytes;
    let a2 = pattern(44, 512);
    let b2 = pattern(45, 4096);
    good(&f.write(0, &a2, false));
    good(&f.write(1024, &b2, false));
    good(&f.sync());
    f.engine.collect_garbage(1.0).unwrap();
    assert!(f.engine.poisoned().is_none());
    assert!(
        f.engine.space().physical_used_bytes <= used,
        "the dead segments were not freed"
    );
    // The disk remaps the bad sectors when they are written again.
    f.backend.mem.fail_reads(0, 0);
    good(&f.write(12288, &pattern(46, 2048), false));
    for (lba, data) in [(0u64, &a2), (1024, &b2), (8192, &c)] {
        let r = f.read_good(lba, (data.len() / BS) as u32);
        assert!(r.data_in == *data, "LBA {lba}");
    }
    assert!(f.engine.check(&mut |_, _| {}).is_empty());
}
