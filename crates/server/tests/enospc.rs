//! The file system under the array fills up before the array's configured capacity does.
//!
//! - On a real ext4 file system (root only: a loop mount): writes of new data fail with DATA
//!   PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT (27/07), never a hardware error or a
//!   poisoned engine; acknowledged data reads back; the array restarts on the full file system;
//!   UNMAP works, and after it writes succeed again; `check` finds the array consistent.
//! - On a file system without fallocate, where ENOSPC shows up on the log write itself (a
//!   model backend, no root needed): the same 27/07, with nothing half-written left behind.

mod engine_lu;

use engine_lu::{cdb16, codes, good, run, tuning, Identity, Model, Modelled, MIB};
use sliver_engine::{Engine, EngineConfig, FormatTwoCheckpoint, LogDevice, MemBackend, Tuning};
use sliver_initiator::sense::SenseKey;
use sliver_initiator::{Error, Session, SessionOptions};
use sliver_scsi::{LogicalUnit, Status};
use sliver_server::array::{check_array, ArrayOptions, ANY_HOST};
use sliver_server::{Array, Server};
use sliver_test_support::data::unique;
use sliver_test_support::target::serve_on_loopback;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

const TARGET: &str = "iqn.2026-11.test.sliver:enospc";

// ---------------------------------------------------------------- real ext4 (root)

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A small ext4 file system in an image file, loop-mounted; unmounted by Drop.
struct SmallFs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    fn new(size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let image = image.to_str().unwrap();
        sh(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                image,
            ],
        )
        .unwrap();
        sh("mount", &["-o", "loop", image, mount.to_str().unwrap()]).unwrap();
        Self { mount, _dir: dir }
    }

    /// Free bytes (statvfs f_bfree: what root may still use).
    fn free(&self) -> u64 {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.mount.as_os_str().as_bytes()).unwrap();
        // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
        st.f_bfree as u64 * st.f_frsize as u64
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let m = self.mount.to_str().unwrap_or_default().to_owned();
        if sh("umount", &[&m]).is_err() {
            let _ = sh("umount", &["-l", &m]);
        }
    }
}

/// An in-process `sliver serve` on a loopback port.
struct Running {
    array: Arc<Array>,
    server: Arc<Server>,
    thread: std::thread::JoinHandle<()>,
    url: String,
}

fn serve(dir: &Path, options: ArrayOptions) -> Running {
    let array = Arc::new(Array::open_with(dir, TARGET, options).unwrap());
    let server = Server::new(array.clone());
    let (addr, thread) = serve_on_loopback(&server, "sliver-test");
    let url = format!("iscsi://{}/{TARGET}/0", addr);
    Running {
        array,
        server,
        thread,
        url,
    }
}

impl Running {
    fn stop(self) {
        self.server.shutdown();
        let _ = self.thread.join();
        self.array.shutdown().unwrap();
    }
}

fn sense_of(e: &Error) -> Option<(SenseKey, u8, u8)> {
    e.sense().map(|s| (s.key, s.asc, s.ascq))
}

const FULL: Option<(SenseKey, u8, u8)> = Some((SenseKey::DataProtect, 0x27, 0x07));

#[test]
fn a_full_file_system_gives_27_07_and_recovers_after_unmap() {
    if !is_root() {
        eprintln!("skipped: needs root to loop-mount a small ext4 file system (CI runs as root)");
        return;
    }
    let fs = SmallFs::new(96 * MIB);
    let dir = fs.mount.join("array");
    // The configured capacity (1 GiB) is far beyond the 96 MiB file system: the disk fills
    // first.
    let options = ArrayOptions {
        capacity_bytes: Some(1 << 30),
        engine: EngineConfig::default(),
        tuning: Tuning::default(),
        replication: None,
        hydrate: Default::default(),
    };
    let run = serve(&dir, options.clone());
    run.array.create_volume("big", 2 << 30, 512).unwrap();
    run.array.connect("big", ANY_HOST, Some(0)).unwrap();
    let mut s = Session::connect(&run.url, SessionOptions::default()).unwrap();

    let mut written = 0u64;
    let failure = loop {
        match s.write16(written / 512, unique(written / MIB, MIB as usize)) {
            Ok(()) => written += MIB,
            Err(e) => break e,
        }
        assert!(written < 1 << 30, "a 96 MiB file system took 1 GiB");
    };
    assert_eq!(sense_of(&failure), FULL, "{failure}");
    assert!(
        run.array.engine().poisoned().is_none(),
        "ENOSPC poisoned the engine"
    );
    assert!(written >= 32 * MIB, "only {} MiB fit", written / MIB);
    eprintln!(
        "{} MiB written before the file system filled ({} MiB free)",
        written / MIB,
        fs.free() / MIB
    );
    // Stable: the same answer again, and what was acknowledged is durable and reads back.
    let again = s
        .write16(written / 512, unique(1 << 20, MIB as usize))
        .unwrap_err();
    assert_eq!(sense_of(&again), FULL, "{again}");
    s.synchronize_cache16(0, 0).unwrap();
    for i in 0..written / MIB {
        assert!(
            s.read16(i * MIB / 512, (MIB / 512) as u32).unwrap() == unique(i, MIB as usize),
            "MiB {i} reads back other data"
        );
    }
    // Data already stored needs no new space.
    s.write16(written / 512, unique(0, MIB as usize))
        .expect("a write of data already stored");
    s.logout().unwrap();

    // A restart on the full file system: recovery, a checkpoint, a new log segment.
    run.stop();
    let run = serve(&dir, options.clone());
    let mut s = Session::connect(&run.url, SessionOptions::default()).unwrap();
    assert!(s.read16(0, 2048).unwrap() == unique(0, MIB as usize));
    assert!(s.read16(written / 512, 2048).unwrap() == unique(0, MIB as usize));
    // The new head segment recovery opened takes a little more; then the same answer.
    let mut more = 0u64;
    let still = loop {
        let at = written + MIB + more;
        match s.write16(at / 512, unique(at / MIB, MIB as usize)) {
            Ok(()) => more += MIB,
            Err(e) => break e,
        }
        assert!(more <= 8 * MIB, "{more} bytes more after the restart");
    };
    assert_eq!(sense_of(&still), FULL, "{still}");
    for i in 0..more / MIB {
        let at = written + MIB + i * MIB;
        assert!(s.read16(at / 512, 2048).unwrap() == unique(at / MIB, MIB as usize));
    }
    let written_after_restart = written + MIB + more;

    // UNMAP works on the full array, and the space comes back for new data.
    let half = written / 2 / MIB * MIB;
    s.unmap(&[(0, (half / 512) as u32)])
        .expect("UNMAP on a full file system");
    let fresh = 8 * MIB;
    let fresh_at = written_after_restart + MIB;
    for i in 0..fresh / MIB {
        s.write16(
            (fresh_at + i * MIB) / 512,
            unique(1 << 22 | i, MIB as usize),
        )
        .unwrap_or_else(|e| panic!("write {i} after UNMAP: {e}"));
    }
    s.synchronize_cache16(0, 0).unwrap();
    assert!(run.array.engine().poisoned().is_none());
    assert!(s.read16(0, 2048).unwrap().iter().all(|&b| b == 0));
    for i in half / MIB..written / MIB {
        assert!(s.read16(i * MIB / 512, 2048).unwrap() == unique(i, MIB as usize));
    }
    for i in 0..fresh / MIB {
        assert!(
            s.read16((fresh_at + i * MIB) / 512, 2048).unwrap()
                == unique(1 << 22 | i, MIB as usize)
        );
    }
    s.logout().unwrap();
    run.stop();

    let problems = check_array(&dir, &mut |_, _| {}).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    // And it still opens and serves what survived.
    let run = serve(&dir, options);
    let mut s = Session::connect(&run.url, SessionOptions::default()).unwrap();
    let last = (written / MIB - 1) * MIB;
    assert!(s.read16(last / 512, 2048).unwrap() == unique(last / MIB, MIB as usize));
    s.logout().unwrap();
    run.stop();
}

// ---------------------------------------------------------------- no fallocate (model)

const PAGE: u64 = 4096;

/// A file system without fallocate: space is taken by the log writes themselves, a write
/// that does not fit is cut short and fails with ENOSPC, discards give pages back, and the
/// checkpoint file needs room too (its new copy is written before the old one goes).
struct NoFallocateFs {
    fs: Mutex<FsSpace>,
}

struct FsSpace {
    limit: u64,
    pages: BTreeSet<u64>,
    checkpoint: u64,
}

impl FsSpace {
    fn used(&self) -> u64 {
        self.pages.len() as u64 * PAGE + self.checkpoint
    }
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl Model for NoFallocateFs {
    fn write_at(&self, mem: &MemBackend, data: &[u8], offset: u64) -> io::Result<()> {
        let mut fs = self.fs.lock().unwrap();
        let end = offset + data.len() as u64;
        let mut fits = offset;
        for page in offset / PAGE..end.div_ceil(PAGE) {
            if !fs.pages.contains(&page) {
                if fs.used() + PAGE > fs.limit {
                    break;
                }
                fs.pages.insert(page);
            }
            fits = ((page + 1) * PAGE).min(end);
        }
        if fits > offset {
            mem.write_at(&data[..(fits - offset) as usize], offset)?;
        }
        if fits < end {
            return Err(enospc());
        }
        Ok(())
    }
    fn allocate(&self, _mem: &MemBackend, _offset: u64, _len: u64) -> io::Result<()> {
        // What FileBackend does on EOPNOTSUPP.
        Ok(())
    }
    fn allocation_reserves(&self) -> bool {
        // And what it answers afterwards: space is only known when a write lands.
        false
    }
    fn discard(&self, mem: &MemBackend, offset: u64, len: u64) -> io::Result<()> {
        let mut fs = self.fs.lock().unwrap();
        for page in offset.div_ceil(PAGE)..(offset + len) / PAGE {
            fs.pages.remove(&page);
        }
        mem.discard(offset, len)
    }
    fn store_checkpoint(&self, mem: &MemBackend, bytes: &[u8]) -> io::Result<()> {
        let mut fs = self.fs.lock().unwrap();
        if fs.used() + bytes.len() as u64 > fs.limit {
            return Err(enospc());
        }
        fs.checkpoint = bytes.len() as u64;
        mem.store_checkpoint(bytes)
    }
}

/// The logical unit of volume `id`, 512-byte blocks.
fn lu_over(engine: &Arc<Engine>, id: u32) -> LogicalUnit {
    let who = Identity {
        serial: "enospc",
        naa: [0x6b; 16],
        target_name: TARGET,
    };
    engine_lu::lu_over(engine, id, 512, &who)
}

#[test]
fn enospc_on_the_log_write_itself_is_27_07_and_leaves_nothing_behind() {
    let capacity = 32 * MIB;
    let backend = Arc::new(Modelled {
        mem: MemBackend::new(capacity),
        model: NoFallocateFs {
            fs: Mutex::new(FsSpace {
                limit: 8 * MIB,
                pages: BTreeSet::new(),
                checkpoint: 0,
            }),
        },
    });
    let engine = engine_lu::create_engine(backend.clone());
    let id = engine.create_volume(64 * MIB).unwrap();
    let lu = lu_over(&engine, id);
    let nexus = engine_lu::nexus("iqn.test:enospc");
    assert_eq!(codes(&run(&lu, &nexus, &[0; 6], &[])).0, 0x6);
    let piece = 64 * 1024u64;
    let write = |i: u64, seed: u64| {
        run(
            &lu,
            &nexus,
            &cdb16(0x8a, i * piece / 512, (piece / 512) as u32, false),
            &unique(seed, piece as usize),
        )
    };
    let mut pieces = 0u64;
    let failed = loop {
        let r = write(pieces, pieces);
        if r.status != Status::Good {
            break r;
        }
        pieces += 1;
        assert!(
            pieces * piece < capacity,
            "an 8 MiB file system took 32 MiB"
        );
    };
    assert_eq!(codes(&failed), (0x7, 0x27, 0x07), "DATA PROTECT, 27/07");
    assert!(engine.poisoned().is_none(), "ENOSPC poisoned the engine");
    assert!(pieces * piece >= 4 * MIB, "only {pieces} writes fit");
    // The same again; a flush works; everything acknowledged reads back.
    assert_eq!(codes(&write(pieces, 1 << 30)), (0x7, 0x27, 0x07));
    good(&run(&lu, &nexus, &cdb16(0x91, 0, 0, false), &[]));
    let check_all = |lu: &LogicalUnit, upto: u64| {
        for i in 0..upto {
            let r = run(lu, &nexus, &cdb16(0x88, i * piece / 512, 128, false), &[]);
            good(&r);
            assert!(r.data_in == unique(i, piece as usize), "piece {i}");
        }
    };
    check_all(&lu, pieces);
    // The refused write left nothing: its blocks still read as zeros.
    let r = run(
        &lu,
        &nexus,
        &cdb16(0x88, pieces * piece / 512, 128, false),
        &[],
    );
    good(&r);
    assert!(r.data_in.iter().all(|&b| b == 0));

    // The administrator makes room on the file system: writes go on.
    backend.model.fs.lock().unwrap().limit = capacity;
    good(&write(pieces, pieces));
    good(&write(pieces + 1, pieces + 1));
    good(&run(&lu, &nexus, &cdb16(0x91, 0, 0, false), &[]));
    check_all(&lu, pieces + 2);
    assert!(engine.check(&mut |_, _| {}).is_empty());

    // A power failure now: everything synced is there, and the engine is consistent.
    let image = backend.mem.crash(|_, n| vec![false; n]);
    drop(lu);
    drop(engine);
    let engine = Arc::new(Engine::open(Arc::new(image), tuning(), false).unwrap());
    assert!(engine.check(&mut |_, _| {}).is_empty());
    let lu = lu_over(&engine, id);
    assert_eq!(codes(&run(&lu, &nexus, &[0; 6], &[])).0, 0x6);
    check_all(&lu, pieces + 2);
}
