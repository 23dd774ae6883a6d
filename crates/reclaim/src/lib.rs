//! `sliver reclaim`: ESXi-style, rate-controlled space reclamation for Linux hosts.
//!
//! Three modes (see docs/reclaim.md):
//! - one pass (`sliver reclaim MOUNTPOINT...`, `--once` to say so explicitly): windowed FITRIM
//!   over each file system, windows aligned to its allocation groups, paced by a byte-rate
//!   limiter with an optional burst allowance;
//! - `--watch`: a daemon that re-runs passes as free space grows, per-mount settings from a
//!   TOML file, stopping cleanly on SIGTERM/SIGINT;
//! - raw (`--lun iscsi://... --lba --count --blocks-per-command`): UNMAP over iSCSI with a chosen
//!   number of blocks per command, reporting duration and commands.

pub mod fs;
pub mod limiter;
pub mod raw;
pub mod trim;
pub mod watch;

use limiter::{Limiter, RateSpec, RealClock};
use sliver_api_types::units;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Upper rate of the burst allowance unless `--burst-rate` says otherwise: the ~1 GB/s a single
/// ESXi host reaches at the start of a reclaim batch.
pub const DEFAULT_BURST_RATE: u64 = 1_000_000_000;

/// ESXi-style reclaim priorities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Priority {
    /// 25 MB/s (ESXi's default "low").
    Low,
    /// 75 MB/s.
    Medium,
    /// 250 MB/s.
    High,
}

impl Priority {
    /// Bytes per second (decimal MB, as ESXi states its rates).
    pub fn rate(self) -> u64 {
        match self {
            Priority::Low => 25_000_000,
            Priority::Medium => 75_000_000,
            Priority::High => 250_000_000,
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "low" => Ok(Self::Low),
            "medium" => Ok(Self::Medium),
            "high" => Ok(Self::High),
            other => Err(format!("unknown priority '{other}' (low, medium or high)")),
        }
    }
}

/// A `--rate` value: bytes per second, or unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateArg(pub Option<u64>);

fn parse_rate_arg(s: &str) -> Result<RateArg, String> {
    if s == "unlimited" {
        return Ok(RateArg(None));
    }
    units::parse_rate(s).map(|r| RateArg(Some(r)))
}

/// Arguments of `sliver reclaim`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Reclaim free space of mounted file systems at a controlled rate (windowed FITRIM), \
             or UNMAP a raw LUN range over iSCSI",
    after_help = "Sizes: 4096, 64K/64KiB (binary), 500MB (decimal). Rates: 500MB/s, 1GiB/s, \
                  'unlimited'. Priorities: low 25 MB/s, medium 75 MB/s, high 250 MB/s."
)]
pub struct ReclaimArgs {
    /// Mount points of the file systems to reclaim.
    #[arg(value_name = "MOUNTPOINT")]
    pub mounts: Vec<PathBuf>,

    /// Reclaim rate by priority: low (25 MB/s, the default), medium (75 MB/s), high (250 MB/s).
    #[arg(long, value_enum, conflicts_with = "rate")]
    pub priority: Option<Priority>,

    /// Reclaim rate in bytes per second, e.g. 500MB/s, or 'unlimited'.
    #[arg(long, value_parser = parse_rate_arg)]
    pub rate: Option<RateArg>,

    /// An initial allowance reclaimed at --burst-rate before the rate applies (ESXi runs about
    /// 400 GB at 1 GB/s first), e.g. 10GiB.
    #[arg(long, value_parser = units::parse_size, value_name = "SIZE")]
    pub burst: Option<u64>,

    /// Rate of the burst allowance.
    #[arg(long, value_parser = parse_rate_arg, default_value = "1GB/s", value_name = "RATE")]
    pub burst_rate: RateArg,

    /// Smallest free extent passed to discard (FITRIM minlen). Default: the device's discard
    /// granularity.
    #[arg(long, value_parser = units::parse_size, value_name = "SIZE")]
    pub min_extent: Option<u64>,

    /// FITRIM window size. Default: one allocation group (ext4 block group, XFS AG; at most
    /// 1 GiB). Windows never straddle a group boundary.
    #[arg(long, value_parser = units::parse_size, value_name = "SIZE")]
    pub window: Option<u64>,

    /// One pass over each file system, then exit (the default without --watch).
    #[arg(long, conflicts_with = "watch")]
    pub once: bool,

    /// Run as a daemon: re-run a pass whenever free space has grown by --min-growth.
    #[arg(long)]
    pub watch: bool,

    /// Per-mount settings for --watch (TOML); default /etc/sliver/reclaim.toml when no mount
    /// point is given.
    #[arg(long, value_name = "FILE", requires = "watch")]
    pub config: Option<PathBuf>,

    /// How often --watch checks free space, e.g. 5m.
    #[arg(long, value_parser = units::parse_duration, requires = "watch", value_name = "DURATION")]
    pub interval: Option<std::time::Duration>,

    /// Free-space growth that triggers a new pass in --watch mode.
    #[arg(long, value_parser = units::parse_size, requires = "watch", value_name = "SIZE")]
    pub min_growth: Option<u64>,

    /// Print results as JSON.
    #[arg(long)]
    pub json: bool,

    /// Raw mode: the LUN to UNMAP, iscsi://[USER%SECRET@]HOST[:PORT]/TARGET-IQN/LUN.
    #[arg(long, value_name = "ISCSI_URL", conflicts_with_all = ["watch", "mounts"],
          requires_all = ["lba", "count", "blocks_per_command"])]
    pub lun: Option<String>,

    /// Raw mode: first block to unmap.
    #[arg(long, requires = "lun")]
    pub lba: Option<u64>,

    /// Raw mode: number of blocks to unmap.
    #[arg(long, requires = "lun")]
    pub count: Option<u64>,

    /// Raw mode: blocks per UNMAP command (like esxcli's -n).
    #[arg(long, requires = "lun")]
    pub blocks_per_command: Option<u64>,

    /// Raw mode: UNMAP commands in flight at once.
    #[arg(long, default_value_t = 1, requires = "lun")]
    pub queue_depth: u32,

    /// Raw mode: our iSCSI initiator name.
    #[arg(
        long,
        default_value = "iqn.2026-11.dev.sliver:reclaim",
        requires = "lun"
    )]
    pub initiator_name: String,
}

/// Set by SIGTERM/SIGINT: passes stop between windows, the daemon between passes.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

impl ReclaimArgs {
    /// The rate limits the command line asks for; `default` applies when neither --rate nor
    /// --priority is given.
    pub fn rate_spec(&self, default: Option<u64>) -> RateSpec {
        let rate = match (self.rate, self.priority) {
            (Some(RateArg(r)), _) => r,
            (None, Some(p)) => Some(p.rate()),
            (None, None) => default,
        };
        RateSpec {
            rate,
            burst: self.burst.unwrap_or(0),
            burst_rate: self.burst_rate.0,
        }
    }
}

/// Runs `sliver reclaim`. Output goes to stdout (progress to stderr on a terminal); the error
/// is a complete sentence for the user.
pub fn run(args: ReclaimArgs) -> Result<(), String> {
    install_signal_handlers();
    if args.lun.is_some() {
        return run_raw(&args);
    }
    if args.watch {
        return run_watch(&args);
    }
    if args.mounts.is_empty() {
        return Err(
            "give at least one MOUNTPOINT, --watch, or --lun ISCSI_URL for raw mode".into(),
        );
    }
    run_passes(&args)
}

fn print_json(value: &serde_json::Value) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").map_err(|e| format!("cannot write to stdout: {e}"))
}

fn run_passes(args: &ReclaimArgs) -> Result<(), String> {
    let spec = args.rate_spec(Some(Priority::Low.rate()));
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for path in &args.mounts {
        let target = match trim::Target::prepare(path, args.min_extent, args.window) {
            Ok(t) => t,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let mut limiter = Limiter::new(RealClock::new(&STOP), spec);
        let mut draw = |p: &trim::Progress| {
            let pct = p.windows_done * 100 / p.windows_total.max(1);
            let secs = p.elapsed.as_secs_f64();
            let rate = if secs > 0.0 {
                p.bytes_trimmed as f64 / secs
            } else {
                0.0
            };
            eprint!(
                "\r\x1b[K{}: {pct}% ({}/{} windows), {} passed to discard, {}",
                p.mount,
                p.windows_done,
                p.windows_total,
                units::human_bytes(p.bytes_trimmed),
                units::human_rate(rate)
            );
        };
        let progress: Option<&mut dyn FnMut(&trim::Progress)> =
            if show_progress { Some(&mut draw) } else { None };
        let result = trim::pass(&target, &mut limiter, &STOP, progress);
        if show_progress {
            eprint!("\r\x1b[K");
        }
        match result {
            Ok(r) => {
                if !args.json {
                    println!("{}", r.text());
                }
                if !r.completed {
                    errors.push(format!(
                        "{}: interrupted after {} of {} windows",
                        r.mount, r.windows_done, r.windows_total
                    ));
                }
                reports.push(r);
            }
            Err(e) => errors.push(e),
        }
        if STOP.load(Ordering::Relaxed) {
            break;
        }
    }
    if args.json {
        print_json(&serde_json::json!({
            "mode": "fitrim",
            "passes": reports,
            "errors": errors,
        }))?;
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

fn run_watch(args: &ReclaimArgs) -> Result<(), String> {
    let mut config = match (&args.config, args.mounts.is_empty()) {
        (Some(path), _) => watch::load_config(path)?,
        (None, true) => watch::load_config(std::path::Path::new(watch::DEFAULT_CONFIG))?,
        (None, false) => watch::WatchConfig {
            interval: watch::DEFAULT_INTERVAL,
            mounts: vec![],
        },
    };
    if let Some(i) = args.interval {
        config.interval = i;
    }
    let spec = args.rate_spec(Some(Priority::Low.rate()));
    for path in &args.mounts {
        config.mounts.push(watch::MountSettings {
            path: path.clone(),
            limit: spec,
            min_extent: args.min_extent,
            window: args.window,
            min_growth: args.min_growth.unwrap_or(watch::DEFAULT_MIN_GROWTH),
        });
    }
    let json = args.json;
    let mut report = |ev: watch::WatchEvent| match ev {
        watch::WatchEvent::Pass(r) => {
            if json {
                let _ = print_json(&serde_json::json!({ "event": "pass", "pass": r }));
            } else {
                println!("{}", r.text());
            }
        }
        watch::WatchEvent::Error { mount, message } => {
            if json {
                let _ = print_json(&serde_json::json!({
                    "event": "error", "mount": mount, "error": message,
                }));
            }
            eprintln!("sliver reclaim: {}: {message}", mount.display());
        }
    };
    watch::watch(&config, &STOP, &mut report)?;
    if !json {
        eprintln!("sliver reclaim: stopped");
    }
    Ok(())
}

fn run_raw(args: &ReclaimArgs) -> Result<(), String> {
    let (Some(url), Some(lba), Some(count), Some(bpc)) =
        (&args.lun, args.lba, args.count, args.blocks_per_command)
    else {
        return Err("raw mode needs --lun, --lba, --count and --blocks-per-command".into());
    };
    let req = raw::RawRequest {
        url: url.clone(),
        lba,
        count,
        blocks_per_command: bpc,
        queue_depth: args.queue_depth,
        initiator_name: args.initiator_name.clone(),
    };
    let mut limiter = Limiter::new(RealClock::new(&STOP), args.rate_spec(None));
    let report = raw::run(&req, &mut limiter, &STOP)?;
    if args.json {
        print_json(&serde_json::json!({ "mode": "raw", "result": report }))?;
    } else {
        println!("{}", report.text());
    }
    if report.completed {
        Ok(())
    } else {
        Err(format!(
            "interrupted after {} of {} blocks",
            report.blocks_unmapped, report.count
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReclaimArgs,
    }

    fn parse(v: &[&str]) -> Result<ReclaimArgs, String> {
        let mut all = vec!["reclaim"];
        all.extend_from_slice(v);
        Cli::try_parse_from(all)
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    /// Raw mode's arguments: `count` blocks of `lun` from LBA 0, `blocks_per_command` at a time.
    fn raw<'a>(lun: &'a str, count: &'a str, blocks_per_command: &'a str) -> Vec<&'a str> {
        vec![
            "--lun",
            lun,
            "--lba",
            "0",
            "--count",
            count,
            "--blocks-per-command",
            blocks_per_command,
        ]
    }

    #[test]
    fn rate_selection() {
        let a = parse(&["/mnt"]).unwrap();
        assert_eq!(a.rate_spec(Some(25_000_000)).rate, Some(25_000_000));
        let a = parse(&["/mnt", "--priority", "high"]).unwrap();
        assert_eq!(a.rate_spec(None).rate, Some(250_000_000));
        let a = parse(&["/mnt", "--rate", "500MB/s", "--burst", "400GB"]).unwrap();
        let s = a.rate_spec(None);
        assert_eq!(s.rate, Some(500_000_000));
        assert_eq!(s.burst, 400_000_000_000);
        assert_eq!(s.burst_rate, Some(DEFAULT_BURST_RATE));
        let a = parse(&["/mnt", "--rate", "unlimited"]).unwrap();
        assert_eq!(a.rate_spec(Some(1)).rate, None);
        assert_eq!(Priority::Medium.rate(), 75_000_000);
    }

    #[test]
    fn conflicting_or_incomplete_arguments_are_refused() {
        assert!(parse(&["/mnt", "--priority", "low", "--rate", "5MB/s"]).is_err());
        assert!(parse(&["/mnt", "--once", "--watch"]).is_err());
        assert!(parse(&["/mnt", "--rate", "fast"]).is_err());
        assert!(parse(&["--lun", "iscsi://h/iqn.x/0", "--lba", "0"]).is_err());
        let mountpoint_and_raw = [vec!["/mnt"], raw("iscsi://h/iqn.x/0", "1", "1")].concat();
        assert!(parse(&mountpoint_and_raw).is_err());
        assert!(
            parse(&["/mnt", "--config", "x.toml"]).is_err(),
            "--config needs --watch"
        );
        let with_queue_depth = [
            raw("iscsi://h/iqn.x/0", "8", "4"),
            vec!["--queue-depth", "2"],
        ]
        .concat();
        let a = parse(&with_queue_depth).unwrap();
        assert_eq!((a.count, a.queue_depth), (Some(8), 2));
        assert_eq!(
            a.rate_spec(None).rate,
            None,
            "raw mode is unlimited by default"
        );
        let e = run(parse(&[]).unwrap()).unwrap_err();
        assert!(e.contains("MOUNTPOINT"), "{e}");
    }

    #[test]
    fn raw_mode_reports_bad_urls_and_ranges_before_sending() {
        let e = run(parse(&raw("http://x/y/0", "8", "4")).unwrap()).unwrap_err();
        assert!(e.contains("iscsi://"), "{e}");
        let e = run(parse(&raw("iscsi://127.0.0.1:1/iqn.x/0", "0", "4")).unwrap()).unwrap_err();
        assert!(e.contains("--count"), "{e}");
    }
}
