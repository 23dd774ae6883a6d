//! Windowed FITRIM on real ext4 and XFS file systems on loop devices (root only).

mod common;

use common::{require_root, LoopFs, Tmpfs, MIB};
use sliver_reclaim::limiter::{Limiter, RateSpec, RealClock};
use sliver_reclaim::trim::{self, PassReport, Target};
use std::sync::atomic::AtomicBool;

static NEVER: AtomicBool = AtomicBool::new(false);

fn pass(fs: &LoopFs, rate: Option<u64>) -> PassReport {
    let t = Target::prepare(fs.path(), None, None).unwrap();
    let spec = RateSpec {
        rate,
        burst: 0,
        burst_rate: None,
    };
    let mut limiter = Limiter::new(RealClock::new(&NEVER), spec);
    let r = trim::pass(&t, &mut limiter, &NEVER, None).unwrap();
    assert!(r.completed);
    assert_eq!(r.windows_done, r.windows_total);
    r
}

#[test]
fn ext4_passes_report_what_was_freed_and_the_image_shrinks() {
    let fs = LoopFs::new("ext4", 512 * MIB, |_| {});
    let t = Target::prepare(fs.path(), None, None).unwrap();
    // Windows follow the 128 MiB block groups read from the superblock.
    assert_eq!(t.geometry.origin, "ext4 superblock");
    assert_eq!(t.geometry.group_bytes, 128 * MIB);
    assert_eq!(t.windows.len(), 4);
    assert_eq!(t.min_extent, 4096, "loop devices discard in 4 KiB units");

    // First pass: every free block is passed down, exactly what statfs calls free.
    let free = fs.free_bytes();
    let first = pass(&fs, None);
    assert_eq!(first.bytes_trimmed, free);
    assert_eq!(first.accounting, "fitrim");

    fs.write_file("data", 128 * MIB);
    let written = fs.image_allocated();
    fs.remove_file("data");
    let second = pass(&fs, Some(2_000_000_000));
    assert!(
        second.bytes_trimmed >= 128 * MIB,
        "the freed 128 MiB are passed down: {}",
        second.bytes_trimmed
    );
    // Only the groups the file touched are trimmed again: ext4 remembers trimmed groups.
    assert!(
        second.bytes_trimmed < first.bytes_trimmed,
        "{} vs {}",
        second.bytes_trimmed,
        first.bytes_trimmed
    );
    let after = fs.image_allocated();
    assert!(
        after + 120 * MIB <= written,
        "the image must shrink by the file: {written} -> {after}"
    );
    // Nothing changed since: a third pass passes nothing down.
    assert_eq!(pass(&fs, None).bytes_trimmed, 0);
}

#[test]
fn xfs_passes_report_what_was_freed_and_the_image_shrinks() {
    let fs = LoopFs::new("xfs", 512 * MIB, |_| {});
    let t = Target::prepare(fs.path(), None, None).unwrap();
    assert_eq!(t.geometry.origin, "xfs superblock");
    assert!(t.windows.len() >= 2);
    assert!(
        t.xfs_accounting,
        "XFS counts from allocation group free space"
    );

    let first = pass(&fs, None);
    // XFS keeps a reserve that statfs does not count as free, so the AG free space is a bit
    // larger than f_bfree, never smaller, and never more than the file system.
    assert!(first.bytes_trimmed >= fs.free_bytes());
    assert!(first.bytes_trimmed <= 512 * MIB);

    fs.write_file("data", 128 * MIB);
    let with_file = pass(&fs, None);
    let written = fs.image_allocated();
    fs.remove_file("data");
    let after_delete = pass(&fs, None);
    let diff = after_delete.bytes_trimmed as i64 - with_file.bytes_trimmed as i64;
    assert!(
        (diff - (128 * MIB) as i64).abs() <= (2 * MIB) as i64,
        "the pass after deleting 128 MiB passes down 128 MiB more: {diff}"
    );
    // XFS skips extents that are still busy (freed, not yet past the log), and its last
    // discards may complete just after FITRIM returns: later passes pick up what is left, as
    // the daemon's next pass would. Bounded retries, no timing asserted.
    let mut after = fs.image_allocated();
    for _ in 0..20 {
        if after + 120 * MIB <= written {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        pass(&fs, None);
        after = fs.image_allocated();
    }
    assert!(
        after + 120 * MIB <= written,
        "the image must shrink by the file: {written} -> {after}"
    );
}

#[test]
fn unusable_targets_are_clear_errors() {
    require_root();
    // Not a mount point.
    let dir = tempfile::tempdir().unwrap();
    let e = Target::prepare(dir.path(), None, None).err().unwrap();
    assert!(e.contains("is not a mount point"), "{e}");
    let e = Target::prepare(std::path::Path::new("/nonexistent/mnt"), None, None)
        .err()
        .unwrap();
    assert!(e.contains("No such file"), "{e}");

    // A file system without FITRIM.
    let tmp = Tmpfs::new();
    let t = Target::prepare(&tmp.mount, None, None).unwrap();
    let mut limiter = Limiter::new(RealClock::new(&NEVER), RateSpec::unlimited());
    let e = trim::pass(&t, &mut limiter, &NEVER, None).unwrap_err();
    assert!(
        e.contains("tmpfs") && e.contains("does not support FITRIM"),
        "{e}"
    );

    // A device without discard.
    let fs = LoopFs::new("ext4", 64 * MIB, |dev| {
        let name = dev.trim_start_matches("/dev/");
        std::fs::write(format!("/sys/block/{name}/queue/discard_max_bytes"), "0").unwrap();
    });
    let e = Target::prepare(fs.path(), None, None).err().unwrap();
    assert!(e.contains("does not support discard"), "{e}");
}

#[test]
fn missing_privileges_are_reported() {
    let fs = LoopFs::new("ext4", 64 * MIB, |_| {});
    let t = Target::prepare(fs.path(), None, None).unwrap();
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            // Drop root in this thread only (the raw syscall, unlike libc's wrapper, is
            // per-thread): the file system stays open, CAP_SYS_ADMIN is gone.
            // SAFETY: plain syscalls on the current thread.
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
            }
            let mut limiter = Limiter::new(RealClock::new(&NEVER), RateSpec::unlimited());
            trim::pass(&t, &mut limiter, &NEVER, None).unwrap_err()
        })
        .join()
        .unwrap()
    });
    assert!(e.contains("insufficient privileges"), "{e}");
}

#[test]
fn a_stop_request_ends_the_pass_between_windows_and_says_so() {
    static STOP: AtomicBool = AtomicBool::new(false);
    let fs = LoopFs::new("ext4", 512 * MIB, |_| {});
    let t = Target::prepare(fs.path(), None, None).unwrap();
    let mut limiter = Limiter::new(RealClock::new(&STOP), RateSpec::unlimited());
    let mut seen = 0;
    let mut stop_after_two = |p: &trim::Progress| {
        seen = p.windows_done;
        if p.windows_done == 2 {
            STOP.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let r = trim::pass(&t, &mut limiter, &STOP, Some(&mut stop_after_two)).unwrap();
    assert_eq!(seen, 2);
    assert!(!r.completed);
    assert_eq!((r.windows_done, r.windows_total), (2, 4));
    assert!(
        r.text().contains("STOPPED after 2 of 4 windows"),
        "{}",
        r.text()
    );
}

#[test]
fn the_command_runs_a_pass_with_json_output() {
    let fs = LoopFs::new("ext4", 256 * MIB, |_| {});
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: sliver_reclaim::ReclaimArgs,
    }
    let m = fs.path().to_str().unwrap();
    let cli =
        Cli::try_parse_from(["reclaim", m, "--once", "--rate", "unlimited", "--json"]).unwrap();
    sliver_reclaim::run(cli.args).unwrap();
    // A window larger than the file system and a min extent of 1 MiB are accepted.
    let cli = Cli::try_parse_from([
        "reclaim",
        m,
        "--priority",
        "high",
        "--window",
        "1GiB",
        "--min-extent",
        "1MiB",
    ])
    .unwrap();
    sliver_reclaim::run(cli.args).unwrap();
    let cli = Cli::try_parse_from(["reclaim", m, "/nonexistent"]).unwrap();
    let e = sliver_reclaim::run(cli.args).unwrap_err();
    assert!(e.contains("/nonexistent"), "{e}");
}
