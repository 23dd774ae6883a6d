//! Raw mode: UNMAP over iSCSI against a running sliver (in-process, ephemeral port).

use sliver_initiator::{Provisioning, Session, SessionOptions};
use sliver_reclaim::limiter::{Clock, Limiter, RateSpec, RealClock};
use sliver_reclaim::raw::{self, RawRequest};
use sliver_test_support::target::Running;
use sliver_volume::Volume;
use std::cell::Cell;
use std::os::unix::fs::MetadataExt;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.test.sliver:reclaim";
const MIB: u64 = 1 << 20;
static NEVER: AtomicBool = AtomicBool::new(false);

/// A target whose volume `v` is LUN 0.
struct Target(Running);

/// A passthrough volume: its backing file's allocation shows what UNMAP freed.
fn start(size: u64) -> Target {
    start_with(size, false)
}

fn start_with(size: u64, engine: bool) -> Target {
    Target(Running::start(TARGET, |array| {
        if engine {
            array.create_volume("v", size, 512).unwrap();
        } else {
            array
                .create_passthrough_volume("v", size, 512, sliver_server::WriteCache::WriteBack)
                .unwrap();
        }
        array.connect("v", "*", Some(0)).unwrap();
    }))
}

impl Target {
    fn url(&self) -> String {
        self.0.url(0)
    }
    fn volume(&self) -> Arc<dyn Volume> {
        self.0.array.unit("v").unwrap().volume().clone()
    }
    /// Bytes allocated to the volume's backing file.
    fn allocated(&self) -> u64 {
        let mut total = 0;
        for e in std::fs::read_dir(self.0.dir().join("volumes")).unwrap() {
            total += e.unwrap().metadata().unwrap().blocks() * 512;
        }
        total
    }
    fn fill(&self, blocks: u64) {
        let mut s = Session::connect(&self.url(), SessionOptions::default()).unwrap();
        for i in 0..blocks * 512 / MIB {
            // Varies per 4 KiB (and repeats every 241 chunks): an engine volume stores part.
            let chunk: Vec<u8> = (0..MIB)
                .map(|b| ((i * MIB + b) / 4096 % 241 + (i * MIB + b) % 7) as u8 + 1)
                .collect();
            s.write16(i * 2048, chunk).unwrap();
        }
        s.synchronize_cache16(0, 0).unwrap();
        s.logout().unwrap();
    }
}

fn request(t: &Target, lba: u64, count: u64, bpc: u64, qd: u32) -> RawRequest {
    RawRequest {
        url: t.url(),
        lba,
        count,
        blocks_per_command: bpc,
        queue_depth: qd,
        initiator_name: "iqn.2026-11.test:reclaim".into(),
    }
}

#[test]
fn raw_unmap_frees_exactly_the_range() {
    let t = start(64 * MIB);
    t.fill(32768); // 16 MiB
    let mapped = t.volume().space().unwrap().mapped_bytes;
    let allocated = t.allocated();
    assert!(mapped >= 16 * MIB && allocated >= 16 * MIB);

    // 8 MiB from LBA 4096 with 1000 blocks per command: 17 commands, the last one short.
    let mut limiter = Limiter::new(RealClock::new(&NEVER), RateSpec::unlimited());
    let r = raw::run(&request(&t, 4096, 16384, 1000, 4), &mut limiter, &NEVER).unwrap();
    assert_eq!(r.commands, 17);
    assert_eq!(r.blocks_unmapped, 16384);
    assert_eq!(r.bytes_unmapped, 8 * MIB);
    assert!(r.completed);
    assert!(r.text().contains("in 17 commands"), "{}", r.text());

    let space = t.volume().space().unwrap();
    assert_eq!(
        space.mapped_bytes + 8 * MIB,
        mapped,
        "exactly 8 MiB deallocated"
    );
    // SEEK_HOLE above proves exactly 8 MiB is deallocated. The block count of the file is
    // checked with 1 MiB of slack: about one run in ten on ext4 (UNMAPs at queue depth 4
    // punching adjacent ranges concurrently) kept part of a MiB counted; not yet explained.
    let now = t.allocated();
    assert!(
        now + 7 * MIB <= allocated,
        "the backing file shrinks: {allocated} bytes allocated before, {now} after"
    );
    let mut s = Session::connect(&t.url(), SessionOptions::default()).unwrap();
    let st = s.get_lba_status(0).unwrap();
    assert_eq!((st[0].state, st[0].blocks), (Provisioning::Mapped, 4096));
    assert_eq!(
        (st[1].state, st[1].lba, st[1].blocks),
        (Provisioning::Deallocated, 4096, 16384)
    );
    assert_eq!(st[2].state, Provisioning::Mapped);
    assert_eq!(s.read16(4096 + 16383, 1).unwrap(), vec![0; 512]);
    assert_ne!(s.read16(4096 + 16384, 1).unwrap(), vec![0; 512]);
    s.logout().unwrap();
}

/// Virtual time for the rate test: the limiter's sleeps advance it.
#[derive(Clone, Default)]
struct FakeClock(Rc<Cell<Duration>>);
impl Clock for FakeClock {
    fn now(&self) -> Duration {
        self.0.get()
    }
    fn sleep(&self, d: Duration) {
        self.0.set(self.0.get() + d);
    }
}

#[test]
fn raw_unmap_is_paced_by_the_limiter() {
    let t = start(64 * MIB);
    let clock = FakeClock::default();
    let spec = RateSpec {
        rate: Some(8_000_000),
        burst: 4 * MIB,
        burst_rate: Some(1_000_000_000),
    };
    let mut limiter = Limiter::new(clock.clone(), spec);
    // 32 MiB in 1 MiB commands: 4 MiB of burst at 1 GB/s, 28 MiB at 8 MB/s.
    let r = raw::run(&request(&t, 0, 65536, 2048, 2), &mut limiter, &NEVER).unwrap();
    assert_eq!(r.commands, 32);
    let expected = (4 * MIB) as f64 / 1e9 + (28 * MIB) as f64 / 8e6;
    assert!(
        (r.throttled_seconds - expected).abs() < 1e-6,
        "throttled {} s, expected {expected} s",
        r.throttled_seconds
    );
    assert!((r.elapsed_seconds - expected).abs() < 1e-6);
}

#[test]
fn raw_mode_errors_are_clear() {
    let t = start(8 * MIB);
    let mut limiter = Limiter::new(RealClock::new(&NEVER), RateSpec::unlimited());
    let e = raw::run(&request(&t, 16000, 1000, 100, 1), &mut limiter, &NEVER).unwrap_err();
    assert!(e.contains("beyond the end of the LUN (16384 blocks"), "{e}");
    let e = raw::run(&request(&t, 0, 10, 0, 1), &mut limiter, &NEVER).unwrap_err();
    assert!(e.contains("--blocks-per-command"), "{e}");
    let mut bad = request(&t, 0, 10, 5, 1);
    bad.url = format!("iscsi://{}/iqn.2026-11.test:nosuchtarget/0", t.0.addr);
    let e = raw::run(&bad, &mut limiter, &NEVER).unwrap_err();
    assert!(e.contains("login") && e.contains("no such target"), "{e}");
}

#[test]
fn the_command_line_raw_mode_runs() {
    let t = start(16 * MIB);
    t.fill(8192);
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: sliver_reclaim::ReclaimArgs,
    }
    let url = t.url();
    let cli = Cli::try_parse_from([
        "reclaim",
        "--lun",
        &url,
        "--lba",
        "0",
        "--count",
        "8192",
        "--blocks-per-command",
        "2048",
        "--json",
    ])
    .unwrap();
    sliver_reclaim::run(cli.args).unwrap();
    assert_eq!(t.volume().space().unwrap().mapped_bytes, 0);
}

#[test]
fn raw_unmap_frees_engine_space() {
    let t = start_with(64 * MIB, true);
    t.fill(32768); // 16 MiB
    let before = t.volume().space().unwrap();
    assert!(before.mapped_bytes >= 16 * MIB && before.unique_bytes > 0);
    let mut limiter = Limiter::new(RealClock::new(&NEVER), RateSpec::unlimited());
    let r = raw::run(&request(&t, 4096, 16384, 1000, 4), &mut limiter, &NEVER).unwrap();
    assert_eq!(r.blocks_unmapped, 16384);
    let after = t.volume().space().unwrap();
    assert_eq!(after.mapped_bytes + 8 * MIB, before.mapped_bytes);
    assert!(
        after.unique_bytes < before.unique_bytes,
        "{before:?} -> {after:?}"
    );
}
