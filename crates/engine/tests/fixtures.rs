//! Arrays written by older releases open and read back exactly.
//!
//! `tests/fixtures/engine-v2-d8313b3.tar.gz` is the engine directory (`<data-dir>/engine`: the
//! sparse log and the checkpoint) of an array made by commit d8313b3, the last release whose
//! metadata lived wholly in RAM (checkpoint format version 2, 32-bit chunk ids). It was made by
//! `make_v2_fixture` below, run at that commit. Its history exercises every record kind: plain,
//! compressible, incompressible, all-zero, duplicate and unaligned writes, a clone with
//! divergent writes, UNMAP, ANCHOR, a copy by reference, a resize, a deleted volume, garbage
//! collection, and a tail of writes after the last checkpoint that was never checkpointed (the
//! engine was dropped without shutdown, as in a crash), so opening it replays the log.
//!
//! `tests/fixtures/engine-v3-c923906.tar.gz` is the same history written by commit c923906,
//! the last release of format 3 (metadata pages without generations, no delta journal), made
//! by the same generator run at that commit with the fixture's name changed. Its `engine`
//! directory holds the log, the metadata file and the root.
//!
//! `tests/fixtures/engine-v3-c923906-pages.tar.gz` is that history again at c923906 on a log
//! of 76,500 segments: its segment table needs more than one directory page in either format.
//!
//! `tests/fixtures/engine-v4-1cf347f.tar.gz` is the same history written by commit 1cf347f in
//! today's format 4 (metadata pages with generations, the delta journal in use), so that the
//! restructuring of RFC 0005, which keeps the format, is held to it.
//!
//! The expected content is not stored: [`history`] is replayed on a plain in-memory model.

mod common;

use common::{Call, CrashPoints, CrashTap};
use sliver_engine::test_data::{noise, xorshift64};
use sliver_engine::{
    Engine, EngineConfig, FileBackend, FormatTwoCheckpoint, LogDevice, MemBackend, MetaArea,
    RootStore, Tuning,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

const FIXTURE: &str = "tests/fixtures/engine-v2-d8313b3.tar.gz";
const FIXTURE_V3: &str = "tests/fixtures/engine-v3-c923906.tar.gz";
const FIXTURE_V3_PAGES: &str = "tests/fixtures/engine-v3-c923906-pages.tar.gz";
const FIXTURE_V4: &str = "tests/fixtures/engine-v4-1cf347f.tar.gz";
/// A log of 76,500 segments of 128 KiB: a segment table of 450 pages, named by two format 3
/// directory pages (341 places each) and three of format 4 (204 each).
const CAPACITY_PAGES: u64 = 76_500 * (128 << 10);
const CAPACITY: u64 = 8 << 20;
const MIB: u64 = 1 << 20;

/// One step of the fixture's history. Volumes are named by the order they were created.
#[derive(Debug, Clone)]
enum Op {
    Create {
        size: u64,
    },
    Clone {
        src: usize,
    },
    Delete {
        volume: usize,
    },
    Resize {
        volume: usize,
        size: u64,
    },
    Write {
        volume: usize,
        offset: u64,
        data: Vec<u8>,
    },
    Unmap {
        volume: usize,
        offset: u64,
        len: u64,
    },
    Anchor {
        volume: usize,
        offset: u64,
        len: u64,
    },
    Copy {
        src: usize,
        src_offset: u64,
        dst: usize,
        dst_offset: u64,
        len: u64,
    },
    Checkpoint,
    CollectGarbage,
}

/// Text-like, compressible data, different per seed.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let words = [
        "thin ",
        "provisioned ",
        "flash ",
        "array ",
        "unmap ",
        "clone ",
    ];
    sliver_engine::test_data::text(&words, seed, len)
}

/// The fixture's history, deterministic.
fn history() -> Vec<Op> {
    use Op::*;
    let mut ops = vec![
        Create { size: 4 * MIB },
        Create { size: 2 * MIB },
        Write {
            volume: 0,
            offset: 0,
            data: text(1, 256 << 10),
        },
        Write {
            volume: 0,
            offset: 256 << 10,
            data: noise(2, 32 << 10),
        },
        // Duplicates of the first 64 KiB, within a volume and across volumes.
        Write {
            volume: 0,
            offset: 1 << 20,
            data: text(1, 64 << 10),
        },
        Write {
            volume: 1,
            offset: 0,
            data: text(1, 128 << 10),
        },
        Write {
            volume: 0,
            offset: 512 << 10,
            data: vec![0; 64 << 10],
        },
        // Unaligned: partial chunks at both edges.
        Write {
            volume: 0,
            offset: 700_001,
            data: text(3, 10_000),
        },
        Clone { src: 0 },
        Write {
            volume: 2,
            offset: 8192,
            data: text(4, 16 << 10),
        },
        Checkpoint,
        Unmap {
            volume: 0,
            offset: 64 << 10,
            len: 128 << 10,
        },
        Anchor {
            volume: 2,
            offset: 2 * MIB,
            len: 256 << 10,
        },
        Copy {
            src: 0,
            src_offset: 0,
            dst: 1,
            dst_offset: MIB,
            len: 256 << 10,
        },
        Create { size: MIB },
        Write {
            volume: 3,
            offset: 0,
            data: noise(5, 32 << 10),
        },
        Delete { volume: 3 },
        Resize {
            volume: 1,
            size: 3 * MIB,
        },
        Write {
            volume: 1,
            offset: 2 * MIB + 4096,
            data: text(6, 32 << 10),
        },
    ];
    // Overwrites that leave segments mostly dead, then collection.
    for round in 0..6 {
        ops.push(Write {
            volume: 1,
            offset: 0,
            data: text(100 + round, 96 << 10),
        });
    }
    ops.push(CollectGarbage);
    ops.push(Checkpoint);
    // The tail after the last checkpoint, replayed at open.
    ops.push(Write {
        volume: 0,
        offset: 3 * MIB,
        data: text(7, 40 << 10),
    });
    ops.push(Write {
        volume: 2,
        offset: 2 * MIB + 4096,
        data: noise(8, 4096),
    });
    ops.push(Unmap {
        volume: 1,
        offset: 8192,
        len: 4096,
    });
    ops.push(Write {
        volume: 1,
        offset: 100,
        data: text(9, 300),
    });
    ops
}

/// Volume contents the history leaves, by creation order (deleted volumes are `None`).
fn model() -> Vec<Option<Vec<u8>>> {
    let mut vols: Vec<Option<Vec<u8>>> = Vec::new();
    for op in history() {
        match op {
            Op::Create { size } => vols.push(Some(vec![0; size as usize])),
            Op::Clone { src } => vols.push(vols[src].clone()),
            Op::Delete { volume } => vols[volume] = None,
            Op::Resize { volume, size } => vols[volume].as_mut().unwrap().resize(size as usize, 0),
            Op::Write {
                volume,
                offset,
                data,
            } => {
                let v = vols[volume].as_mut().unwrap();
                v[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
            }
            Op::Unmap {
                volume,
                offset,
                len,
            }
            | Op::Anchor {
                volume,
                offset,
                len,
            } => vols[volume].as_mut().unwrap()[offset as usize..(offset + len) as usize].fill(0),
            Op::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let bytes = vols[src].as_ref().unwrap()
                    [src_offset as usize..(src_offset + len) as usize]
                    .to_vec();
                vols[dst].as_mut().unwrap()[dst_offset as usize..(dst_offset + len) as usize]
                    .copy_from_slice(&bytes);
            }
            Op::Checkpoint | Op::CollectGarbage => {}
        }
    }
    vols
}

fn unpack(fixture: &str, into: &Path) {
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(fixture))
        .arg("-C")
        .arg(into)
        .status()
        .expect("tar runs");
    assert!(status.success(), "unpacking {fixture}");
}

#[test]
fn an_array_written_by_d8313b3_opens_and_reads_back_exactly() {
    opens_and_reads_back_exactly(FIXTURE, model(), CAPACITY);
}

#[test]
fn an_array_of_format_3_written_by_c923906_opens_and_reads_back_exactly() {
    let dir = opens_and_reads_back_exactly(FIXTURE_V3, model(), CAPACITY);
    // The first checkpoint after open wrote the root (and every directory page) in the
    // current format.
    let root = std::fs::read(dir.path().join("engine/root")).unwrap();
    assert_eq!(
        u32::from_le_bytes(root[8..12].try_into().unwrap()),
        sliver_engine::meta::root::ROOT_VERSION
    );
}

/// An array of today's format, its journal in use, opens and reads back exactly.
#[test]
fn an_array_of_format_4_written_by_1cf347f_opens_and_reads_back_exactly() {
    use sliver_engine::meta::root::{Root, ROOT_VERSION};
    use sliver_engine::meta::tables::T_JOURNAL;
    let dir = tempfile::tempdir().unwrap();
    unpack(FIXTURE_V4, dir.path());
    let bytes = std::fs::read(dir.path().join("engine/root")).unwrap();
    let root = Root::decode(&bytes).expect("the fixture's root decodes");
    assert_eq!(root.version, ROOT_VERSION);
    let journal = root.tables.iter().find(|t| t.table == T_JOURNAL);
    assert!(
        journal.is_some_and(|t| t.pages > 0),
        "the fixture's root names journal pages"
    );
    opens_and_reads_back_exactly(FIXTURE_V4, model(), CAPACITY);
}

/// Format 3 directories of more than one page (341 places each) are split anew into format 4's
/// (204 each) by the first checkpoint: the same history on a log large enough for a segment
/// table of 450 pages opens, reads back, takes a write and reopens (the table is read through
/// its three new directory pages then).
#[test]
fn a_format_3_array_with_many_directory_pages_opens_and_reads_back_exactly() {
    opens_and_reads_back_exactly(FIXTURE_V3_PAGES, model(), CAPACITY_PAGES);
}

/// Open the array of `fixture`, read every volume against `want` (its model), check it,
/// write, restart and read the write back. Returns the directory it was unpacked in.
fn opens_and_reads_back_exactly(
    fixture: &str,
    want: Vec<Option<Vec<u8>>>,
    capacity: u64,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    unpack(fixture, dir.path());
    let engine_dir = dir.path().join("engine");
    let backend = Arc::new(FileBackend::open(&engine_dir, capacity).unwrap());
    let engine = Engine::open(backend, Tuning::default(), false).expect("the old array opens");
    assert!(
        engine.recovery().records_replayed > 0,
        "the fixture ends in a tail after its last checkpoint, which open must replay"
    );
    // Engine ids follow creation order, starting at 1 (the fixture's generator asserted it).
    let have: BTreeMap<u32, u64> = engine.volumes().into_iter().collect();
    let expected: BTreeMap<u32, u64> = want
        .iter()
        .enumerate()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k as u32 + 1, v.len() as u64)))
        .collect();
    assert_eq!(have, expected, "volumes and their sizes");
    for (k, content) in want.iter().enumerate() {
        let Some(content) = content else { continue };
        let mut got = vec![0xEE; content.len()];
        engine.read(k as u32 + 1, 0, &mut got).unwrap();
        if let Some(at) = (0..content.len()).find(|&i| got[i] != content[i]) {
            panic!("volume {} differs first at byte {at}", k + 1);
        }
    }
    let problems = engine.check(&mut |_, _| {});
    assert!(
        problems.is_empty(),
        "check of the opened fixture: {problems:?}"
    );
    // It keeps working: a write, a restart, and the write is there.
    engine.write(1, 0, &text(42, 8192)).unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let backend = Arc::new(FileBackend::open(&engine_dir, capacity).unwrap());
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    let mut got = vec![0; 8192];
    engine.read(1, 0, &mut got).unwrap();
    assert_eq!(got, text(42, 8192));
    reads_back_exactly_but(&engine, &want, fixture, 8192);
    drop(engine);
    dir
}

/// Read every volume of `engine` against the fixture's model.
fn reads_back_exactly(engine: &Engine, what: &str) {
    reads_back_exactly_but(engine, &model(), what, 0);
}

/// Read every volume of `engine` against `want`, but for the first `skip` bytes of volume 1
/// (which the test wrote itself).
fn reads_back_exactly_but(engine: &Engine, want: &[Option<Vec<u8>>], what: &str, skip: usize) {
    for (k, content) in want.iter().enumerate() {
        let Some(content) = content else { continue };
        let mut got = vec![0xEE; content.len()];
        engine.read(k as u32 + 1, 0, &mut got).unwrap();
        let from = if k == 0 { skip.min(content.len()) } else { 0 };
        if let Some(at) = (from..content.len()).find(|&i| got[i] != content[i]) {
            panic!("{what}: volume {} differs first at byte {at}", k + 1);
        }
    }
}

/// Crash points that take a power-failure image at the n-th write, sync or root/checkpoint
/// change: every unsynced write kept, lost or torn at random 512-byte sectors.
struct CrashAt {
    countdown: AtomicU32,
    seed: u64,
    image: Mutex<Option<MemBackend>>,
}

impl CrashPoints for CrashAt {
    fn reached(&self, inner: &MemBackend, call: Call) {
        // Discards and checkpoint stores are not counted: this test's crash points have
        // always been the other calls.
        if matches!(call, Call::Discard | Call::StoreCheckpoint) {
            return;
        }
        if self.countdown.fetch_sub(1, Ordering::SeqCst) == 1 {
            let mut x = self.seed | 1;
            let image = inner.crash(|_, sectors| {
                (0..sectors)
                    .map(|_| !xorshift64(&mut x).is_multiple_of(3))
                    .collect()
            });
            *self.image.lock().unwrap() = Some(image);
        }
    }
}

/// A power failure at any point of the migration loses nothing: the array opens again
/// (migrating anew, or from the root the migration wrote) and reads back exactly.
#[test]
fn a_crash_anywhere_in_the_migration_loses_nothing() {
    a_crash_anywhere_in_the_upgrade_loses_nothing(FIXTURE);
}

/// The same for format 3, whose first checkpoint rewrites every directory page in format 4.
#[test]
fn a_crash_anywhere_in_the_format_3_upgrade_loses_nothing() {
    a_crash_anywhere_in_the_upgrade_loses_nothing(FIXTURE_V3);
}

fn a_crash_anywhere_in_the_upgrade_loses_nothing(fixture: &str) {
    let dir = tempfile::tempdir().unwrap();
    unpack(fixture, dir.path());
    let engine_dir = dir.path().join("engine");
    let log = std::fs::read(engine_dir.join("log")).unwrap();
    let file = |name: &str| std::fs::read(engine_dir.join(name)).ok();
    let (checkpoint, meta, root) = (file("checkpoint"), file("meta"), file("root"));
    let fresh = || {
        let mem = MemBackend::new(log.len() as u64);
        mem.write_at(&log, 0).unwrap();
        mem.sync().unwrap();
        if let Some(c) = &checkpoint {
            mem.store_checkpoint(c).unwrap();
        }
        if let Some(m) = &meta {
            mem.meta_write(m, 0).unwrap();
            mem.meta_sync().unwrap();
        }
        if let Some(r) = &root {
            mem.store_root(r).unwrap();
        }
        mem
    };
    let mut crashes = 0;
    for n in 1.. {
        let tap = Arc::new(CrashTap {
            inner: fresh(),
            points: CrashAt {
                countdown: AtomicU32::new(n),
                seed: n as u64 * 0x9e37_79b9,
                image: Mutex::new(None),
            },
        });
        let opened = Engine::open(tap.clone(), Tuning::default(), false);
        let Some(image) = tap.points.image.lock().unwrap().take() else {
            // The migration finished before the n-th call: every point has been tried.
            let engine = opened.expect("a migration without a crash succeeds");
            reads_back_exactly(&engine, "after the migration");
            break;
        };
        drop(opened);
        crashes += 1;
        let engine = Engine::open(Arc::new(image), Tuning::default(), false)
            .unwrap_or_else(|e| panic!("crash at call {n}: the array does not open: {e}"));
        reads_back_exactly(&engine, &format!("crash at call {n}"));
        let problems = engine.check(&mut |_, _| {});
        assert!(problems.is_empty(), "crash at call {n}: {problems:?}");
    }
    assert!(crashes > 5, "only {crashes} crash points in a migration");
}

/// Regenerates the fixture. Only meaningful at the commit whose format the fixture records:
/// `git checkout d8313b3 -- crates/engine/tests/fixtures.rs` is not needed, the history above
/// is the one that was run; run with
/// `cargo test -p sliver-engine --test fixtures -- --ignored make_v2_fixture`.
#[test]
#[ignore]
fn make_v2_fixture() {
    make_fixture(FIXTURE, history(), CAPACITY);
}

/// Regenerates the format 4 fixture; meaningful at 1cf347f only:
/// `cargo test -p sliver-engine --test fixtures -- --ignored make_v4_fixture`.
#[test]
#[ignore]
fn make_v4_fixture() {
    make_fixture(FIXTURE_V4, history(), CAPACITY);
}

/// Regenerates the format 3 fixture of many directory pages; meaningful at c923906 only:
/// `cargo test -p sliver-engine --test fixtures -- --ignored make_v3_pages_fixture`.
#[test]
#[ignore]
fn make_v3_pages_fixture() {
    make_fixture(FIXTURE_V3_PAGES, history(), CAPACITY_PAGES);
}

/// Writes the array of `ops` into the fixture `name` (a tarball of its `engine` directory, a
/// log of `capacity` bytes), ending with a tail of writes after the last checkpoint and no
/// shutdown (a crash).
fn make_fixture(name: &str, ops: Vec<Op>, capacity: u64) {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    let dir = tempfile::tempdir().unwrap();
    let engine_dir = dir.path().join("engine");
    let backend = Arc::new(FileBackend::open(&engine_dir, capacity).unwrap());
    let config = EngineConfig {
        chunk_size: 4096,
        segment_size: 128 << 10,
    };
    let engine = Engine::create(backend, config, Tuning::default()).unwrap();
    let mut ids: Vec<u32> = Vec::new();
    for op in ops {
        match op {
            Op::Create { size } => ids.push(engine.create_volume(size).unwrap()),
            Op::Clone { src } => ids.push(engine.clone_volume(ids[src]).unwrap()),
            Op::Delete { volume } => engine.delete_volume(ids[volume]).unwrap(),
            Op::Resize { volume, size } => engine.resize_volume(ids[volume], size).unwrap(),
            Op::Write {
                volume,
                offset,
                data,
            } => engine.write(ids[volume], offset, &data).unwrap(),
            Op::Unmap {
                volume,
                offset,
                len,
            } => engine.unmap(ids[volume], offset, len).unwrap(),
            Op::Anchor {
                volume,
                offset,
                len,
            } => engine.anchor(ids[volume], offset, len).unwrap(),
            Op::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                engine
                    .copy(ids[src], src_offset, ids[dst], dst_offset, len)
                    .unwrap();
            }
            Op::Checkpoint => engine.checkpoint().unwrap(),
            Op::CollectGarbage => {
                let freed = engine.collect_garbage(0.9).unwrap();
                assert!(freed > 0, "the history leaves something to collect");
            }
        }
    }
    let want: Vec<u32> = (1..=ids.len() as u32).collect();
    assert_eq!(ids, want, "volume ids follow creation order");
    // Durable but not checkpointed: the tail is replayed at open. No shutdown (a crash).
    engine.flush().unwrap();
    drop(engine);
    let status = std::process::Command::new("tar")
        .args(["--sparse", "-czf"])
        .arg(&out)
        .arg("-C")
        .arg(dir.path())
        .arg("engine")
        .status()
        .unwrap();
    assert!(status.success());
}
