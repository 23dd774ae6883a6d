//! The CI torture run: 20 SIGKILL cycles of a live `sliver serve` under mixed I/O, bounded by
//! about a minute, with zero failures. Plus checks that the model really catches lost and
//! foreign data, so a green run means something.

use sliver_torture::model::{block_of, make_vid, Model, BLOCK, ZEROS};
use sliver_torture::{run, TortureOptions};

mod common;
use common::{assert_each_completed, sliver_binary};

#[test]
fn twenty_kill_cycles_lose_nothing() {
    let opts = TortureOptions {
        sliver: sliver_binary(),
        cycles: 20,
        max_seconds: 60.0,
        seed: std::env::var("SLIVER_TORTURE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20261124),
        io_ms: (50, 500),
        check_every: 5,
        verbose: true,
        ..TortureOptions::default()
    };
    let report = run(&opts).expect("the harness runs");
    eprintln!("{}", report.summary());
    assert!(
        report.passed(),
        "torture found {} failure(s) (seed {}):\n{}",
        report.failure_count,
        report.seed,
        report.summary()
    );
    assert!(
        report.cycles_run >= 5,
        "only {} cycles ran",
        report.cycles_run
    );
    assert_eq!(report.cycles.len() as u32, report.cycles_run);
    for c in &report.cycles {
        assert!(c.killed, "cycle {} did not kill the server", c.cycle);
        assert!(
            c.blocks_verified > 0,
            "cycle {} verified no blocks after its kill",
            c.cycle
        );
    }
    assert!(
        report.cycles.iter().any(|c| c.inflight_at_kill > 0),
        "no kill ever hit commands in flight"
    );
    assert!(
        report.checks_run >= 2,
        "sliver check ran {} times",
        report.checks_run
    );
    assert_each_completed(
        &report.commands_completed,
        &[
            "write",
            "write_fua",
            "synchronize_cache",
            "unmap",
            "write_same_zero",
            "write_same_pattern",
            "compare_and_write",
            "extended_copy",
        ],
    );
}

#[test]
fn the_model_reports_versions_outside_the_allowed_set() {
    let mut m = Model::new();
    let (old, new, other) = (make_vid(1, 1, 0), make_vid(1, 2, 0), make_vid(1, 3, 0));
    // Durable `old`, then `new` completed without a flush: either may survive.
    let t = m.begin();
    m.stage(t, 0, 7, &[old]);
    m.complete(t, 0, 7, 1, true);
    let t = m.begin();
    m.stage(t, 0, 7, &[new]);
    m.complete(t, 0, 7, 1, false);
    assert_eq!(m.check(0, 7, &block_of(old)), Ok(old));
    assert_eq!(m.check(0, 7, &block_of(new)), Ok(new));
    // A version written elsewhere, zeros (lost durable data) and garbage are all caught.
    let e = m.check(0, 7, &block_of(other)).unwrap_err();
    assert_eq!((e.lun, e.lba, e.found), (0, 7, Some(other)));
    assert!(e.to_string().contains("not allowed"), "{e}");
    assert!(m.check(0, 7, &[0u8; BLOCK]).is_err());
    let mut torn = block_of(new);
    torn[BLOCK / 2..].copy_from_slice(&block_of(old)[BLOCK / 2..]);
    assert_eq!(m.check(0, 7, &torn).unwrap_err().found, None);
    // Once a SYNCHRONIZE CACHE issued after `new` completed is GOOD, `old` is no longer
    // acceptable.
    let f = m.flush_issued();
    m.flush_completed(0, f);
    assert!(m.check(0, 7, &block_of(old)).is_err());
    assert_eq!(m.check(0, 7, &block_of(new)), Ok(new));
    // Untouched blocks must read zeros.
    assert_eq!(m.check(0, 8, &[0u8; BLOCK]), Ok(ZEROS));
    assert!(m.check(0, 8, &block_of(new)).is_err());
}

#[test]
fn a_write_in_flight_at_the_kill_may_or_may_not_land() {
    let mut m = Model::new();
    let (a, b) = (make_vid(2, 1, 0), make_vid(2, 2, 0));
    let t = m.begin();
    m.stage(t, 1, 0, &[a, a]);
    m.complete(t, 1, 0, 2, false);
    let f = m.flush_issued();
    m.flush_completed(1, f);
    let t = m.begin();
    m.stage(t, 1, 1, &[b]); // never completes: the kill
    assert!(m.check(1, 0, &block_of(a)).is_ok());
    assert!(m.check(1, 1, &block_of(a)).is_ok());
    assert!(m.check(1, 1, &block_of(b)).is_ok());
    assert!(m.check(1, 0, &block_of(b)).is_err());
    assert!(m.check(1, 1, &[0u8; BLOCK]).is_err(), "flushed data lost");
}
