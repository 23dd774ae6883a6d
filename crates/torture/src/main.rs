//! `sliver-torture`: SIGKILL a live sliver under mixed I/O, restart it, verify what survived.

#[path = "cli.rs"]
mod cli;

use clap::Parser;
use sliver_torture::{run, TortureOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sliver-torture",
    version,
    about = "Crash torture for sliver: random I/O from several sessions, SIGKILL, restart, verify every block"
)]
struct Args {
    /// The sliver binary [default: `sliver` next to this executable].
    #[arg(long)]
    sliver: Option<PathBuf>,
    /// Kill cycles to run.
    #[arg(long, default_value_t = 20)]
    cycles: u32,
    /// Start no new cycle after this many seconds.
    #[arg(long, default_value_t = 3600.0)]
    max_seconds: f64,
    /// Random seed [default: from the clock; printed in the report].
    #[arg(long)]
    seed: Option<u64>,
    /// Data directory (must be empty or absent; kept) [default: a temporary directory,
    /// removed unless a failure is found].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Concurrent I/O sessions.
    #[arg(long, default_value_t = 3)]
    sessions: usize,
    /// Engine volumes (LUNs) to create, 1..=8.
    #[arg(long, default_value_t = 3)]
    volumes: usize,
    /// Size of each volume in MiB.
    #[arg(long, default_value_t = 256)]
    volume_mib: u64,
    /// Blocks of each LUN the sessions write (the working set).
    #[arg(long, default_value_t = 16384)]
    working_blocks: u64,
    /// Shortest I/O time per cycle before the kill (ms).
    #[arg(long, default_value_t = 50)]
    min_io_ms: u64,
    /// Longest I/O time per cycle before the kill (ms).
    #[arg(long, default_value_t = 800)]
    max_io_ms: u64,
    /// Largest queue depth per session.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Run `sliver check` and take a snapshot or clone every N cycles (0: only at the end).
    #[arg(long, default_value_t = 5)]
    check_every: u32,
    /// Take no snapshots or clones.
    #[arg(long)]
    no_snapshots: bool,
    #[command(flatten)]
    report: cli::Report,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let seed = cli::seed_or_clock(a.seed);
    let defaults = TortureOptions::default();
    let opts = TortureOptions {
        sliver: a.sliver.unwrap_or(defaults.sliver),
        cycles: a.cycles,
        max_seconds: a.max_seconds,
        seed,
        data_dir: a.data_dir,
        sessions: a.sessions.max(1),
        volumes: a.volumes.clamp(1, 8),
        volume_bytes: a.volume_mib.max(1) << 20,
        working_blocks: a.working_blocks,
        io_ms: (a.min_io_ms, a.max_io_ms.max(a.min_io_ms)),
        max_queue_depth: a.queue_depth.max(1),
        check_every: a.check_every,
        snapshots: !a.no_snapshots,
        verbose: !a.report.quiet,
        ..defaults
    };
    if !a.report.quiet {
        eprintln!(
            "sliver-torture: seed {seed}, {} cycles, {} sessions, sliver {}",
            opts.cycles,
            opts.sessions,
            opts.sliver.display()
        );
    }
    sliver_torture::exit_with("sliver-torture", run(&opts), a.report.json)
}
