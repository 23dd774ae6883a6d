//! `sliver-load`: many sessions of mixed, verified I/O against a live sliver for a fixed time;
//! reports IOPS, latency percentiles and the server's memory, and fails on any error or
//! data mismatch.

#[path = "../cli.rs"]
mod cli;

use clap::Parser;
use sliver_torture::load::{run, LoadOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "sliver-load",
    version,
    about = "Load for sliver: N sessions of mixed verified I/O for a bounded time; IOPS, latency percentiles, server memory"
)]
struct Args {
    /// The sliver binary [default: `sliver` next to this executable].
    #[arg(long)]
    sliver: Option<PathBuf>,
    /// Concurrent sessions, each its own TCP connection and login.
    #[arg(long, default_value_t = 64)]
    sessions: usize,
    /// Length of the timed I/O phase in seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Engine volumes (LUNs); sessions are spread over them.
    #[arg(long, default_value_t = 4)]
    volumes: usize,
    /// Size of each volume in MiB.
    #[arg(long, default_value_t = 2048)]
    volume_mib: u64,
    /// KiB of its LUN each session writes and verifies.
    #[arg(long, default_value_t = 4096)]
    session_kib: u64,
    /// Commands each session keeps in flight.
    #[arg(long, default_value_t = 4)]
    queue_depth: usize,
    /// Engine log capacity in GiB (a sparse file).
    #[arg(long, default_value_t = 8)]
    capacity_gib: u64,
    /// Random seed [default: from the clock; printed in the report].
    #[arg(long)]
    seed: Option<u64>,
    /// Data directory (must be empty or absent; kept) [default: a temporary directory,
    /// removed unless the run fails].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    report: cli::Report,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let seed = cli::seed_or_clock(a.seed);
    if !(a.seconds.is_finite() && a.seconds > 0.0 && a.seconds <= 86_400.0) {
        eprintln!("sliver-load: --seconds must be in (0, 86400]");
        return ExitCode::from(2);
    }
    let defaults = LoadOptions::default();
    let opts = LoadOptions {
        sliver: a.sliver.unwrap_or(defaults.sliver),
        sessions: a.sessions.max(1),
        volumes: a.volumes.clamp(1, 64),
        volume_bytes: a.volume_mib.max(1) << 20,
        session_bytes: a.session_kib.max(4) << 10,
        duration: Duration::from_secs_f64(a.seconds),
        queue_depth: a.queue_depth.clamp(1, 64),
        seed,
        data_dir: a.data_dir,
        capacity_bytes: a.capacity_gib.max(1) << 30,
        verbose: !a.report.quiet,
        ..defaults
    };
    sliver_torture::exit_with("sliver-load", run(&opts), a.report.json)
}
