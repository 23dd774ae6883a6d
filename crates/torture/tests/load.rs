//! The CI load run: 64 sessions (each its own connection and login) of mixed, verified I/O
//! against a live `sliver serve` for a few seconds. No error, no mismatch, every session gets
//! its share, the server stops cleanly and `sliver check` passes. No timing thresholds: the
//! figures are printed, not judged.

mod common;

use common::{assert_each_completed, sliver_binary};
use sliver_torture::load::{run, LoadOptions};
use std::time::Duration;

#[test]
fn sixty_four_sessions_of_mixed_io_see_no_error_and_no_mismatch() {
    let opts = LoadOptions {
        sliver: sliver_binary(),
        sessions: 64,
        volumes: 4,
        volume_bytes: 256 << 20,
        session_bytes: 1 << 20,
        duration: Duration::from_secs(5),
        queue_depth: 4,
        seed: std::env::var("SLIVER_LOAD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20261123),
        capacity_bytes: 2 << 30,
        verbose: true,
        ..LoadOptions::default()
    };
    let report = run(&opts).expect("the load generator runs");
    eprintln!("{}", report.summary());
    assert!(report.passed(), "load run failed:\n{}", report.summary());
    assert_eq!(report.errors, 0);
    assert_eq!(report.mismatches, 0);
    assert_eq!(report.sessions_logged_in, 64);
    assert_eq!(
        report.idle_sessions, 0,
        "every session must complete commands"
    );
    assert!(report.session_commands_min > 0);
    assert_each_completed(
        &report.commands_completed,
        &[
            "write",
            "write_fua",
            "read",
            "unmap",
            "write_same_unmap",
            "write_same_pattern",
            "compare_and_write",
            "synchronize_cache",
        ],
    );
    // Every session read its whole stripe back after the timed phase.
    assert_eq!(report.blocks_verified, 64 * (1 << 20) / 512);
    assert!(report.clean_exit && report.check_ok);
    assert!(report.server.samples > 0 && report.server.peak_rss_mib > 0.0);
    assert!(report.latency_all.count == report.commands);
}
