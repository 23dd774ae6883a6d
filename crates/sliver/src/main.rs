//! The `sliver` command.

/// `println!` for a command's output: a reader that went away (`sliver volume list | head`)
/// ends the command quietly, as other tools do, where `println!` would panic. SIGPIPE stays
/// ignored (Rust's default): the API client writes to its TLS socket with `writev`, which
/// has no MSG_NOSIGNAL, so a connection the server closed must be an error, not the end of
/// the process.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output_line(format_args!($($arg)*))
    };
}

mod admin;
mod client;
mod config;
mod serve_tls;
mod top;

use clap::{CommandFactory, Parser, Subcommand};
use config::Config;
use sliver_server::api::{AllowedHosts, ApiContext};
use sliver_server::array::{parse_gc_priority, ArrayOptions, ChapSecret, ANY_HOST};
use sliver_server::{Array, Server, ServerOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const DEFAULT_TARGET_NAME: &str = "iqn.2026-11.dev.sliver:array";
const DEFAULT_DATA_DIR: &str = "./sliver-data";
const DEFAULT_ISCSI_LISTEN: &str = "127.0.0.1:3260";
const DEFAULT_API_LISTEN: &str = "127.0.0.1:8600";
const DEMO_VOLUME: &str = "demo";
const DEMO_SIZE: u64 = 10 << 30;

#[derive(Parser)]
#[command(
    name = "sliver",
    version,
    about = "A thin-provisioning, data-reducing iSCSI storage array"
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
    /// Serve the array over iSCSI and the management API. With an empty data directory,
    /// creates a 10 GiB volume `demo` visible to every initiator and prints its URL.
    Serve(ServeArgs),
    /// Manage volumes, snapshots, clones and their connections to hosts.
    Volume {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: admin::VolumeCommand,
    },
    /// Manage hosts (initiators allowed to log in, with optional CHAP).
    Host {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: admin::HostCommand,
    },
    /// Show the array: capacity, space, data reduction, garbage collection.
    Array {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: admin::ArrayCommand,
    },
    /// The off-site copy: its state and restore points (take, list, delete).
    Replication {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: admin::ReplicationCommand,
    },
    /// A live esxtop-style view of every volume's I/O and VAAI activity (-b: CSV batch mode).
    Top {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: top::TopArgs,
    },
    /// Verify an array offline (the server must be stopped): engine reference counts, segment
    /// usage, every stored chunk's checksum and fingerprint, and the configuration. Exits
    /// non-zero when anything is damaged.
    Check(CheckArgs),
    /// Rate-controlled space reclamation for Linux hosts (windowed FITRIM), or raw UNMAP of a
    /// LUN range over iSCSI.
    Reclaim(sliver_reclaim::ReclaimArgs),
    /// Restore an array from its off-site copy into a new data directory (`sliver serve
    /// --replicate-to` made the copy). The restored array is the state of the newest shipped
    /// write (or a restore point), recovered as after a crash; serve it at once with `sliver
    /// serve --data-dir DIR`: its data is fetched on demand and in the background.
    Restore(RestoreArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Directory holding the array.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML); flags given here override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory holding the array's configuration and volumes [default: ./sliver-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// iSCSI portal address; repeat for several portals (all in portal group 1)
    /// [default: 127.0.0.1:3260].
    #[arg(long = "iscsi-listen")]
    iscsi_listen: Vec<SocketAddr>,
    /// HTTP API and metrics address [default: 127.0.0.1:8600]; beyond loopback, HTTPS.
    #[arg(long)]
    api_listen: Option<SocketAddr>,
    /// Serve the API over HTTPS on a loopback address too (beyond loopback it always is),
    /// with the certificate of [api] tls_cert or the one generated in the data directory.
    #[arg(long)]
    api_tls: bool,
    /// API token; required when the API listens beyond loopback.
    #[arg(long, env = "SLIVER_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// A host name the API answers to besides IP addresses, localhost and this machine's
    /// name; repeat for several (requests naming others are refused: DNS rebinding).
    #[arg(long = "api-allowed-host", value_name = "NAME")]
    api_allowed_hosts: Vec<String>,
    /// iSCSI qualified name of the target, used when the array is created
    /// [default: iqn.2026-11.dev.sliver:array].
    #[arg(long)]
    target_name: Option<String>,
    /// Log capacity when the array is created, e.g. 100G [default: 90% of the free space].
    #[arg(long)]
    capacity: Option<String>,
    /// Background garbage collection: off, low, medium, high or a rate such as 100MB/s.
    #[arg(long)]
    gc_priority: Option<String>,
    /// RAM for cached engine metadata, e.g. 512M [default: an eighth of the machine's memory].
    #[arg(long)]
    metadata_cache: Option<String>,
    /// Ship every write to an S3-compatible object store, s3://BUCKET/PREFIX (one array per
    /// prefix); credentials from [replication] or the standard AWS variables.
    #[arg(long, value_name = "URL")]
    replicate_to: Option<String>,
    /// The object store's endpoint when it is not AWS, e.g. http://127.0.0.1:8333.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// An array restored on demand: the most its background fetches take from the store,
    /// e.g. 100MB/s [default: no limit; reads that need data are never limited].
    #[arg(long, value_name = "RATE")]
    hydrate_rate: Option<String>,
}

#[derive(clap::Args)]
struct RestoreArgs {
    /// The copy: s3://BUCKET/PREFIX.
    #[arg(long, value_name = "URL")]
    from: String,
    /// The object store's endpoint when it is not AWS, e.g. http://127.0.0.1:8333.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// A new directory for the restored array (it must not hold one).
    #[arg(long, required_unless_present = "list")]
    data_dir: Option<PathBuf>,
    /// Restore the restore point of this name (default: the newest state in the store).
    #[arg(long, value_name = "NAME", conflicts_with = "at")]
    point: Option<String>,
    /// Restore the newest point taken at or before TIME (RFC 3339, e.g. 2026-11-27T01:00:00Z).
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// List the restore points in the copy and restore nothing.
    #[arg(long, conflicts_with_all = ["point", "at", "data_dir"])]
    list: bool,
    /// Fetch every byte before returning (default: return once the tables and metadata
    /// records are read; the array then serves at once and fetches the rest on demand and in
    /// the background, so the store must stay reachable until it is done).
    #[arg(long)]
    whole: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json);
    let result = match cli.command {
        Commands::Serve(args) => serve(args),
        Commands::Volume { api, command } => admin::volume(&api, command),
        Commands::Host { api, command } => admin::host(&api, command),
        Commands::Array { api, command } => admin::array(&api, command),
        Commands::Replication { api, command } => admin::replication(&api, command),
        Commands::Top { api, args } => top::run(&api, args),
        Commands::Check(args) => check(args),
        Commands::Restore(args) => restore(args),
        Commands::Reclaim(args) => sliver_reclaim::run(args),
        Commands::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sliver", &mut script);
            output(&script);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sliver: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Write `bytes` to standard output ([`outln!`]): ends the process quietly (status 0) when
/// the reader has gone away.
fn output(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        panic!("cannot write to standard output: {e}");
    }
}

fn output_line(args: std::fmt::Arguments) {
    output(format!("{args}\n").as_bytes());
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

/// What `serve` runs with, after the configuration file and the flags are merged.
struct Settings {
    data_dir: PathBuf,
    target_name: String,
    portals: Vec<SocketAddr>,
    api_listen: SocketAddr,
    api_token: Option<String>,
    api_allowed_hosts: AllowedHosts,
    /// `None`: plain HTTP (loopback only).
    api_certificate: Option<serve_tls::ApiCertificate>,
    options: ArrayOptions,
    login_timeout: Option<std::time::Duration>,
    poll: Option<std::time::Duration>,
    target_chap: Option<ChapSecret>,
    hosts: Vec<config::Host>,
    volumes: Vec<config::VolumeSettings>,
    soft_threshold: Option<f64>,
    gc_priority: Option<sliver_engine::GcPriority>,
}

fn settings(args: ServeArgs) -> Result<Settings, String> {
    let file = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let mut options = ArrayOptions::default();
    if let Some(c) = &args.capacity {
        options.capacity_bytes =
            Some(sliver_api_types::units::parse_size(c).map_err(|e| format!("--capacity: {e}"))?);
    } else {
        options.capacity_bytes = file.capacity.size;
    }
    // Explicit settings are applied after the array opens, over what it kept from earlier
    // runs (`sliver array set`).
    let soft_threshold = file.capacity.soft_threshold_percent;
    let gc_priority = match &args.gc_priority {
        Some(p) => Some(parse_gc_priority(p).map_err(|e| format!("--gc-priority: {e}"))?),
        None => file.gc.priority,
    };
    if let Some(c) = file.engine.compression {
        options.tuning.compression = c;
    }
    match &args.metadata_cache {
        Some(c) => {
            options.tuning.metadata_cache = sliver_api_types::units::parse_size(c)
                .map_err(|e| format!("--metadata-cache: {e}"))?
        }
        None => {
            if let Some(c) = file.engine.metadata_cache {
                options.tuning.metadata_cache = c;
            }
        }
    }
    if let Some(r) = &args.hydrate_rate {
        let bytes = r.strip_suffix("/s").unwrap_or(r);
        options.hydrate.rate_limit = sliver_api_types::units::parse_size(bytes)
            .map_err(|e| format!("--hydrate-rate: {e} (give a rate such as 100MB/s)"))?;
    }
    let replicate_to = args
        .replicate_to
        .clone()
        .or_else(|| file.replication.as_ref().and_then(|r| r.to.clone()));
    if let Some(url) = replicate_to {
        options.replication = Some(replication_options(url, &args, &file)?);
    }
    let portals = if !args.iscsi_listen.is_empty() {
        args.iscsi_listen
    } else if !file.iscsi.listen.is_empty() {
        file.iscsi.listen.clone()
    } else {
        vec![DEFAULT_ISCSI_LISTEN.parse().expect("default portal")]
    };
    let api_listen = args
        .api_listen
        .or(file.api.listen)
        .unwrap_or_else(|| DEFAULT_API_LISTEN.parse().expect("default API address"));
    let api_token = match args.api_token {
        Some(t) => Some(t),
        None => file.api_token()?,
    };
    if api_token.as_deref().is_some_and(|t| t.len() < 16) {
        return Err("the API token must be at least 16 characters long".into());
    }
    let mut api_allowed_hosts = AllowedHosts::new(&file.api.allowed_hosts)?;
    for name in &args.api_allowed_hosts {
        api_allowed_hosts
            .add(name)
            .map_err(|e| format!("--api-allowed-host: {e}"))?;
    }
    // The machine's own name is the one administrators type; an attacker cannot make a
    // browser resolve it (unless they own the local resolver, which owns everything).
    if let Ok(own) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let _ = api_allowed_hosts.add(own.trim());
    }
    let allowed_names: Vec<String> = file
        .api
        .allowed_hosts
        .iter()
        .chain(&args.api_allowed_hosts)
        .cloned()
        .collect();
    let api_certificate = serve_tls::choose(
        api_listen,
        args.api_tls,
        file.api.tls,
        file.api.tls_cert.clone().zip(file.api.tls_key.clone()),
        &allowed_names,
    )?;
    if !api_listen.ip().is_loopback() && api_token.is_none() {
        return Err(format!(
            "the API would listen on {api_listen}, beyond loopback, without a token: set [api] token or token_file in the configuration, or --api-token / SLIVER_API_TOKEN"
        ));
    }
    Ok(Settings {
        data_dir: args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
        target_name: args
            .target_name
            .or(file.target_name)
            .unwrap_or_else(|| DEFAULT_TARGET_NAME.into()),
        portals,
        api_listen,
        api_token,
        api_allowed_hosts,
        api_certificate,
        options,
        login_timeout: file.iscsi.login_timeout,
        poll: file.iscsi.poll_us,
        // Config::load checked the credentials; this cannot fail.
        target_chap: file
            .chap
            .map(|c| ChapSecret::new(c.user, c.secret))
            .transpose()
            .map_err(|e| format!("[chap]: {e}"))?,
        hosts: file.hosts,
        volumes: file.volumes,
        soft_threshold,
        gc_priority,
    })
}

/// Shipping to the object store at `url`: the [replication] section's schedule, bounds and
/// credentials, with the flags' endpoint over the section's.
fn replication_options(
    url: String,
    args: &ServeArgs,
    file: &Config,
) -> Result<sliver_server::array::ReplicationOptions, String> {
    let section = file.replication.as_ref();
    let mut ship = sliver_replica::ship::ShipConfig::default();
    if let Some(i) = section.and_then(|r| r.interval) {
        ship.cut_interval = i;
    }
    if let Some(b) = section.and_then(|r| r.max_backlog) {
        if b < sliver_replica::ship::MIN_BACKLOG {
            return Err(format!(
                "[replication] max_backlog: at least {} MiB",
                sliver_replica::ship::MIN_BACKLOG >> 20
            ));
        }
        ship.max_backlog = b;
    }
    if let Some(p) = section.and_then(|r| r.points_every) {
        ship.points_every = p;
    }
    if let Some(k) = section.and_then(|r| r.keep_points) {
        ship.keep_points = k;
    }
    Ok(sliver_server::array::ReplicationOptions {
        s3: sliver_replica::store::S3Config {
            url,
            endpoint: args
                .s3_endpoint
                .clone()
                .or_else(|| section.and_then(|r| r.endpoint.clone())),
            region: section.and_then(|r| r.region.clone()),
            access_key_id: section.and_then(|r| r.access_key_id.clone()),
            secret_access_key: file.s3_secret()?,
        },
        ship,
    })
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let has_config = args.config.is_some();
    let s = settings(args)?;
    let array = Array::open_with(&s.data_dir, &s.target_name, s.options)
        .map_err(|e| format!("cannot open the array in {}: {e}", s.data_dir.display()))?;
    let array = Arc::new(array);
    if let Some(t) = s.soft_threshold {
        array
            .set_soft_threshold(t)
            .map_err(|e| format!("cannot apply the soft threshold: {e}"))?;
    }
    if let Some(p) = s.gc_priority {
        array
            .set_gc_priority(p)
            .map_err(|e| format!("cannot apply the GC priority: {e}"))?;
    }
    if has_config {
        array
            .set_target_chap(s.target_chap.clone())
            .map_err(|e| format!("cannot apply the configuration's CHAP: {e}"))?;
        for h in &s.hosts {
            let chap = match (&h.chap_user, &h.chap_secret) {
                (Some(user), Some(secret)) => Some(
                    ChapSecret::new(user.as_str(), secret.as_str())
                        .map_err(|e| format!("host '{}': {e}", h.name))?,
                ),
                _ => None,
            };
            array
                .ensure_host(&h.name, h.iqns.clone(), chap)
                .map_err(|e| {
                    format!("cannot apply host '{}' from the configuration: {e}", h.name)
                })?;
        }
    }
    if array.volumes().is_empty() {
        array
            .create_volume(DEMO_VOLUME, DEMO_SIZE, 512)
            .and_then(|()| array.connect(DEMO_VOLUME, ANY_HOST, Some(0)))
            .map_err(|e| format!("cannot create the demo volume: {e}"))?;
        tracing::info!("created volume '{DEMO_VOLUME}' (10 GiB) connected to every initiator");
    }
    for v in &s.volumes {
        if let Some(setting) = v.write_cache {
            array.set_write_cache(&v.name, setting).map_err(|e| {
                format!(
                    "cannot apply volume '{}' from the configuration: {e}",
                    v.name
                )
            })?;
        }
    }
    let api_tls = s
        .api_certificate
        .as_ref()
        .map(|c| serve_tls::load(c, &s.data_dir))
        .transpose()?;
    let scheme = if api_tls.is_some() { "https" } else { "http" };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let server = Server::new(array.clone());
        if let Some(t) = s.login_timeout {
            server.set_login_timeout(t);
        }
        if let Some(window) = s.poll {
            server.set_poll(window);
        }
        let options = ServerOptions { portals: s.portals };
        let listeners = server.bind(&options).await.map_err(|e| e.to_string())?;
        let api_listener = tokio::net::TcpListener::bind(s.api_listen)
            .await
            .map_err(|e| format!("cannot listen on {} for the API: {e}", s.api_listen))?;
        let api_addr = api_listener.local_addr().map_err(|e| e.to_string())?;
        let target = array.target_name();
        for portal in server.portals() {
            tracing::info!("iSCSI portal {portal} serving {target}");
        }
        tracing::info!(
            "API on {scheme}://{api_addr}{}",
            if s.api_token.is_some() {
                " (token required)"
            } else {
                ""
            }
        );
        if let Some(first) = server.portals().first() {
            for c in array.connections() {
                println!(
                    "volume {} (host {}): iscsi://{first}/{target}/{}",
                    c.volume, c.host, c.lun
                );
            }
        }
        println!("API: {scheme}://{api_addr}");
        println!("console: {}", console_url(scheme, api_addr));
        let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
        let api = tokio::spawn(sliver_server::api::serve(
            api_listener,
            ApiContext {
                array: array.clone(),
                portals: server.portals(),
                token: s.api_token,
                allowed_hosts: s.api_allowed_hosts,
                history: Default::default(),
                server: Some(server.clone()),
                tls: api_tls,
                failed_logins: Default::default(),
            },
            async move {
                let _ = api_stopped.await;
            },
        ));
        let runner = {
            let server = server.clone();
            tokio::spawn(async move { server.run(listeners).await })
        };
        shutdown_signal().await;
        tracing::info!("shutting down");
        server.shutdown();
        let _ = stop_api.send(());
        // Give initiators a moment to log out; then stop regardless.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), runner).await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), api).await;
        // A final checkpoint makes the next start fast (not needed for safety: the log is).
        array.shutdown().map_err(|e| {
            format!("clean shutdown failed (the next start recovers from the log): {e}")
        })
    })
}

fn restore(args: RestoreArgs) -> Result<(), String> {
    use sliver_replica::store::{ObjectStore, S3Config, S3Store};
    let store = S3Store::connect(&S3Config {
        url: args.from.clone(),
        endpoint: args.s3_endpoint.clone(),
        ..S3Config::default()
    })
    .map_err(|e| e.to_string())?;
    let store: std::sync::Arc<dyn ObjectStore> = std::sync::Arc::new(store);
    if args.list {
        let cat = sliver_replica::restore::list(store.as_ref()).map_err(|e| e.to_string())?;
        for d in &cat.damaged {
            eprintln!("damaged, not used: {d}");
        }
        if cat.points.is_empty() {
            println!("{} holds no restore points", args.from);
        }
        for p in &cat.points {
            println!(
                "{:<32} {:<21} {:<9} objects {}..{}",
                p.name,
                sliver_replica::catalog::utc(p.time_ms),
                if p.scheduled { "scheduled" } else { "named" },
                p.base,
                p.through
            );
        }
        if let Some(b) = sliver_replica::catalog::newest_base(&cat.bases) {
            let end = cat.stream.last().map_or(0, |r| r.end.saturating_sub(1));
            println!(
                "{:<32} {:<21} {:<9} objects {}..{}",
                "(newest)", "", "", b.start, end
            );
        }
        return Ok(());
    }
    let data_dir = args.data_dir.ok_or("--data-dir is required")?;
    let target = match (&args.point, &args.at) {
        (Some(p), _) => sliver_replica::restore::Target::Point(p.clone()),
        (None, Some(t)) => {
            let when = humantime::parse_rfc3339_weak(t).map_err(|e| {
                format!("--at {t}: {e} (give a UTC time such as 2026-11-27T01:00:00Z)")
            })?;
            let ms = when
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| format!("--at {t}: before 1970"))?
                .as_millis() as u64;
            sliver_replica::restore::Target::At(ms)
        }
        (None, None) => sliver_replica::restore::Target::Newest,
    };
    let started = std::time::Instant::now();
    let mode = if args.whole {
        sliver_replica::restore::Mode::Whole
    } else {
        sliver_replica::restore::Mode::OnDemand {
            url: args.from.clone(),
            endpoint: args.s3_endpoint.clone(),
        }
    };
    let report = sliver_server::array::restore(&store, &data_dir, &target, &mode)
        .map_err(|e| e.to_string())?;
    let what = match &report.point {
        Some(p) => format!(
            "restore point {} ({})",
            p.name,
            sliver_replica::catalog::utc(p.time_ms)
        ),
        None => "the newest state".to_string(),
    };
    let left_out = if report.left_out > 0 {
        format!(
            "; {} newer objects left out: a gap or an unfinished copy",
            report.left_out
        )
    } else {
        String::new()
    };
    if args.whole {
        eprintln!(
            "restored {what} of {} into {}: stream objects {}..{}, {} fetched{left_out}, in {:.1?}; the array opens as after a crash",
            args.from,
            data_dir.display(),
            report.first,
            report.last,
            size_text(report.bytes_applied + report.bytes_on_demand),
            started.elapsed()
        );
    } else {
        eprintln!(
            "restored {what} of {} into {}: stream objects {}..{}{left_out}, in {:.1?}; {} stay in the store until needed.\nServe it now with `sliver serve --data-dir {}`: reads fetch what they need, the rest is fetched in the background (GET /api/v1/hydration); keep the store reachable (and its credentials in the environment) until that says done",
            args.from,
            data_dir.display(),
            report.first,
            report.last,
            started.elapsed(),
            size_text(report.bytes_on_demand),
            data_dir.display()
        );
    }
    match sliver_server::array::free_space(&data_dir) {
        Ok(free) if free < report.bytes_on_demand => eprintln!(
            "WARNING: {} still to fetch but {} free in {}: hydration will stop with the file system full",
            size_text(report.bytes_on_demand),
            size_text(free),
            data_dir.display()
        ),
        _ => {}
    }
    if let Some(e) = &report.pin_error {
        eprintln!(
            "WARNING: the store did not take the pin that keeps {}'s retention off the objects this array still fetches ({e}): if the source array still ships there, finish hydration before its retention deletes them, or restore with --whole",
            args.from
        );
    }
    if let Some(n) = report.missing {
        eprintln!(
            "WARNING: {} has lost stream object {n}: the restored state is the one before it, and the {} newer objects it holds were not used",
            args.from, report.left_out
        );
    }
    Ok(())
}

/// Bytes as a person reads them.
fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
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

/// Where the console is: the API's address, or for a wildcard listener the machine's host
/// name (which the API's `Host` check accepts).
fn console_url(scheme: &str, api: std::net::SocketAddr) -> String {
    if !api.ip().is_unspecified() {
        return format!("{scheme}://{api}/");
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{scheme}://{name}:{}/", api.port())
}

/// jemalloc rather than the C library's allocator. glibc either maps and unmaps every large
/// block (a page fault per 4 KiB each time: with the threshold at 1 MiB, a fifth of a core's
/// time on 1 MiB writes went to faulting in fresh command and batch buffers) or, with its
/// adaptive threshold, keeps freed large blocks in the heap for good (the off-site copy's
/// drained backlog held 1.08 GiB of RSS). jemalloc reuses freed blocks at once and gives
/// pages back after they stay unused (`dirty_decay_ms`, with its background thread so an idle
/// array shrinks too). Measured in docs/benchmarks.md ("The write path per core"); mimalloc
/// was measured as well and still faulted pages in on every large allocation here.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts (the crate's symbol prefix `_rjem_`).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: Option<&'static u8> =
    Some(&b"background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:5000\0"[0]);
