//! The `sliver` command.

use clap::{Parser, Subcommand};
use sliver_server::array::ANY_HOST;
use sliver_server::{Array, Server, ServerOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const DEFAULT_TARGET_NAME: &str = "iqn.2026-11.dev.sliver:array";
const DEMO_VOLUME: &str = "demo";
const DEMO_SIZE: u64 = 10 << 30;

#[derive(Parser)]
#[command(
    name = "sliver",
    version,
    about = "A thin-provisioning iSCSI storage array"
)]
struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Serve the array over iSCSI. With an empty data directory, creates a 10 GiB volume
    /// `demo` visible to every initiator and prints its URL.
    Serve(ServeArgs),
    /// Verify an array offline (the server must be stopped): engine reference counts, segment
    /// usage, every stored chunk's checksum and fingerprint, and the configuration. Exits
    /// non-zero when anything is damaged.
    Check(CheckArgs),
    /// Rate-controlled space reclamation for Linux hosts (windowed FITRIM), or raw UNMAP of a
    /// LUN range over iSCSI.
    Reclaim(sliver_reclaim::ReclaimArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Directory holding the array.
    #[arg(long, default_value = "./sliver-data")]
    data_dir: PathBuf,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Directory holding the array's configuration and volumes.
    #[arg(long, default_value = "./sliver-data")]
    data_dir: PathBuf,
    /// iSCSI portal address; repeat for several portals (all in portal group 1).
    #[arg(long = "iscsi-listen", default_value = "127.0.0.1:3260")]
    iscsi_listen: Vec<SocketAddr>,
    /// iSCSI qualified name of the target, used when the array is created.
    #[arg(long, default_value = DEFAULT_TARGET_NAME)]
    target_name: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json);
    let result = match cli.command {
        Commands::Serve(args) => serve(args),
        Commands::Check(args) => check(args),
        Commands::Reclaim(args) => sliver_reclaim::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sliver: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLIVER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let array = Array::open(&args.data_dir, &args.target_name)
        .map_err(|e| format!("cannot open the array in {}: {e}", args.data_dir.display()))?;
    let array = Arc::new(array);
    if array.volumes().is_empty() {
        array
            .create_volume(DEMO_VOLUME, DEMO_SIZE, 512)
            .and_then(|()| array.connect(DEMO_VOLUME, ANY_HOST, Some(0)))
            .map_err(|e| format!("cannot create the demo volume: {e}"))?;
        tracing::info!("created volume '{DEMO_VOLUME}' (10 GiB) connected to every initiator");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let server = Server::new(array.clone());
        let options = ServerOptions {
            portals: args.iscsi_listen,
        };
        let listeners = server.bind(&options).await.map_err(|e| e.to_string())?;
        let target = array.target_name();
        for portal in server.portals() {
            tracing::info!("iSCSI portal {portal} serving {target}");
        }
        if let Some(first) = server.portals().first() {
            for c in array.connections() {
                println!(
                    "volume {} (host {}): iscsi://{first}/{target}/{}",
                    c.volume, c.host, c.lun
                );
            }
        }
        let runner = {
            let server = server.clone();
            tokio::spawn(async move { server.run(listeners).await })
        };
        shutdown_signal().await;
        tracing::info!("shutting down");
        server.shutdown();
        // Give initiators a moment to log out; then stop regardless.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), runner).await;
        // A final checkpoint makes the next start fast (not needed for safety: the log is).
        array.shutdown().map_err(|e| {
            format!("clean shutdown failed (the next start recovers from the log): {e}")
        })
    })
}

fn check(args: CheckArgs) -> Result<(), String> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut progress = |done: u64, total: u64| {
        if tty && total > 0 {
            eprint!(
                "\rchecking chunks: {done}/{total} ({}%)   ",
                done * 100 / total
            );
        }
    };
    let problems = sliver_server::array::check_array(&args.data_dir, &mut progress)
        .map_err(|e| format!("cannot check {}: {e}", args.data_dir.display()))?;
    if tty {
        eprintln!();
    }
    if problems.is_empty() {
        println!(
            "array in {} is consistent (checked in {:.1} s)",
            args.data_dir.display(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    for p in &problems {
        println!("damage: {p}");
    }
    Err(format!("{} problem(s) found", problems.len()))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
