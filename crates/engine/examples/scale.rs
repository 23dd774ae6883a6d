//! The engine-level driver of `bench/scale` (issue 20): metadata growth with unique but highly
//! compressible 4 KiB chunks, so the metadata grows like terabytes of unique data while the
//! disk holds little. Each subcommand is its own process, so memory and start times are real.
//!
//!     scale fill  --data-dir D --to BYTES [--from BYTES] [--step BYTES] [--capacity BYTES]
//!                 [--metadata-cache BYTES] [--max-rss BYTES] [--time-limit SECONDS]
//!                 [--qd1-rate WRITES_PER_S] [--seed N] [--wrap] [--stall-stacks]
//!     scale open  --data-dir D [--expect BYTES] [--metadata-cache BYTES] [--max-rss BYTES]
//!     scale check --data-dir D [--metadata-cache BYTES] [--max-rss BYTES]
//!
//! Sizes take K/M/G/T suffixes (powers of 1024). Every line printed on stdout is one JSON
//! object with an "event" field; bench/scale reads them.
//!
//! Data: unique chunk k (k = byte position / 4096) holds 8 bytes of a 64-bit mix of k and a
//! fixed seed, then k itself, then zeros: every chunk is distinct and LZ4 turns it into a few
//! dozen bytes. `--seed N` (default 0) gives other content for the same positions: the
//! harness's crash fills use it, so the next fill overwrites what they wrote with new unique
//! chunks instead of finding it already there (`open --expect` checks seed 0). `--wrap` starts
//! again from `--from` with the next seed whenever it reaches `--to`, so a crash fill keeps
//! the load on in a bounded range until it is killed (or its `--time-limit` passes).
//!
//! Position p lives in fill volume p / 256 GiB at offset p % 256 GiB; fill volumes are the
//! engine's 256 GiB volumes in id order, created as needed (the first one is volume 1).
//! `fill` writes 1 MiB commands from two writer threads, sequentially from `--from` (the
//! harness passes where the last fill stopped) to `--to`, and prints a line every `--step`
//! bytes, after a flush. Meanwhile one thread writes 4 KiB of the same kind of
//! data (tagged apart from the fill's) at random offsets of a separate 1 GiB volume, one
//! command at a time, `--qd1-rate` commands per second at most (0: back to back), and records
//! each command's latency; it pauses while the step's flush and `space()` run, so its figures
//! are the latency a small writer sees while the big writers fill. Step lines carry VmRSS and
//! VmHWM, the QD1 percentiles, /proc/self/io, the allocated size of every file in the engine
//! directory and `space()`.
//!
//! `--stall-stacks` (root): where the QD1 writer waits when a command takes over 10 ms, as
//! kernel stacks sampled every 2 ms, counted in the `done` line (see `StallSampler`); the QD1
//! thread is named `qd1` for profilers. With `SCALE_LOG=sliver_engine=debug` the engine logs
//! every metadata-lock hold over 20 ms with where it was taken, on stderr.
//!
//! `open` times `Engine::open` and the first 4 KiB read of volume 1, reports `recovery()` and
//! VmHWM, checks 64 chunks below `--expect` and shuts down cleanly. `check` opens read-only
//! and runs `Engine::check`.
//!
//! `fill` survives SIGKILL anywhere (the harness kills it on purpose): all it needs is in the
//! engine. `--max-rss` stops the fill cleanly once VmRSS exceeds it (the comparison run with
//! today's engine stops there instead of being killed by the kernel), and every subcommand
//! exits at once, status 4, past 1.1 times that.

#[path = "support/proc_status.rs"]
mod proc_status;
use proc_status::status_bytes;
use sliver_engine::{Compression, Engine, EngineConfig, FileBackend, GcPriority, Tuning};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHUNK: u64 = 4096;
const WRITE: u64 = 1 << 20;
const FILL_VOLUME: u64 = 256 << 30;
const QD1_VOLUME: u64 = 1 << 30;
const SEED: u64 = 0x5c41_e5ca_1e5e_ed01;
const WRITERS: usize = 2;

// ---- scale:metadata-cache:begin ----
// The engine's metadata cache (RFC 0001, `Tuning::metadata_cache`, bytes); returns whether the
// engine has the setting. An engine without it (before RFC 0001) needs the body
// `let _ = (tuning, bytes); false` (the JSON then says "unsupported"): bench/scale puts that in
// when it builds an older commit for the comparison run (--baseline-rev).
fn set_metadata_cache(tuning: &mut Tuning, bytes: u64) -> bool {
    tuning.metadata_cache = bytes;
    true
}
// Bytes of metadata pages the engine wrote since open (`EngineSpace::metadata_written_bytes`),
// if it counts them (format 3); the body `let _ = e; None` for an engine that does not.
fn metadata_written(e: &Engine) -> Option<u64> {
    Some(e.space().metadata_written_bytes)
}
// ---- scale:metadata-cache:end ----

fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The first 16 bytes of chunk `k` of the fill with data seed `seed` (the rest is zeros).
fn stamp(k: u64, seed: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&mix64(k ^ SEED ^ mix64(seed)).to_le_bytes());
    s[8..].copy_from_slice(&k.to_le_bytes());
    s
}

fn parse_size(s: &str) -> u64 {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => fail(&format!("bad size {s}")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let v: f64 = num
        .parse()
        .unwrap_or_else(|_| fail(&format!("bad size {s}")));
    (v * mult as f64) as u64
}

fn fail(msg: &str) -> ! {
    eprintln!("scale: {msg}");
    std::process::exit(2)
}

struct Args {
    cmd: String,
    dir: PathBuf,
    to: u64,
    from: u64,
    step: u64,
    capacity: u64,
    metadata_cache: Option<u64>,
    max_rss: Option<u64>,
    time_limit: Option<f64>,
    qd1_rate: u64,
    expect: Option<u64>,
    wrap: bool,
    seed: u64,
    stall_stacks: bool,
}

fn parse_args() -> Args {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_else(|| {
        fail("usage: scale fill|open|check --data-dir DIR [options] (see the source's header)")
    });
    let mut a = Args {
        cmd,
        dir: PathBuf::new(),
        to: 0,
        from: 0,
        step: 8 << 30,
        capacity: 256 << 30,
        metadata_cache: None,
        max_rss: None,
        time_limit: None,
        qd1_rate: 1000,
        expect: None,
        wrap: false,
        seed: 0,
        stall_stacks: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--wrap" {
            a.wrap = true;
            continue;
        }
        if flag == "--stall-stacks" {
            a.stall_stacks = true;
            continue;
        }
        let v = it
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--data-dir" => a.dir = PathBuf::from(v),
            "--to" => a.to = parse_size(&v),
            "--from" => a.from = parse_size(&v),
            "--step" => a.step = parse_size(&v).max(WRITE),
            "--capacity" => a.capacity = parse_size(&v),
            "--metadata-cache" => a.metadata_cache = Some(parse_size(&v)),
            "--max-rss" => a.max_rss = Some(parse_size(&v)),
            "--time-limit" => {
                a.time_limit = Some(v.parse().unwrap_or_else(|_| fail("bad --time-limit")))
            }
            "--qd1-rate" => a.qd1_rate = v.parse().unwrap_or_else(|_| fail("bad --qd1-rate")),
            "--expect" => a.expect = Some(parse_size(&v)),
            "--seed" => a.seed = v.parse().unwrap_or_else(|_| fail("bad --seed")),
            _ => fail(&format!("unknown option {flag}")),
        }
    }
    if a.dir.as_os_str().is_empty() {
        fail("--data-dir is required");
    }
    a
}

fn rss() -> u64 {
    status_bytes("VmRSS:")
}

fn hwm() -> u64 {
    status_bytes("VmHWM:")
}

fn proc_io() -> serde_json::Value {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let mut m = serde_json::Map::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            if let Ok(n) = v.trim().parse::<u64>() {
                m.insert(k.trim().to_string(), n.into());
            }
        }
    }
    m.into()
}

/// Every file under the engine directory: apparent length and allocated bytes (st_blocks).
fn files(dir: &Path) -> serde_json::Value {
    use std::os::unix::fs::MetadataExt;
    let mut m = serde_json::Map::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
                continue;
            }
            let name = e
                .path()
                .strip_prefix(dir)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            m.insert(
                name,
                serde_json::json!({"bytes": md.len(), "allocated": md.blocks() * 512}),
            );
        }
    }
    m.into()
}

fn emit(v: serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn tuning(args: &Args) -> (Tuning, serde_json::Value) {
    let mut t = Tuning {
        compression: Compression::Lz4,
        gc: GcPriority::Medium,
        ..Tuning::default()
    };
    let cache = match args.metadata_cache {
        None => serde_json::Value::Null,
        Some(bytes) if set_metadata_cache(&mut t, bytes) => bytes.into(),
        Some(_) => "unsupported".into(),
    };
    (t, cache)
}

/// Past 1.1 times `--max-rss`, exit at once (status 4) whatever the process is doing: a
/// graceful stop that itself needs more memory must not take the machine down.
fn rss_watchdog(max: Option<u64>) {
    let Some(max) = max else { return };
    let hard = max + max / 10;
    std::thread::spawn(move || loop {
        let r = rss();
        if r > hard {
            emit(
                serde_json::json!({"event": "killed", "reason": "max-rss", "rss": r,
                "hwm": hwm(), "max_rss": max}),
            );
            std::process::exit(4);
        }
        std::thread::sleep(Duration::from_millis(50));
    });
}

/// The 256 GiB fill volumes in id order and the 1 GiB QD1 volume (None when absent).
fn volumes(e: &Engine) -> (Vec<u32>, Option<u32>) {
    let mut v = e.volumes();
    v.sort();
    let fill = v
        .iter()
        .filter(|(_, s)| *s == FILL_VOLUME)
        .map(|(id, _)| *id)
        .collect();
    let qd1 = v.iter().find(|(_, s)| *s == QD1_VOLUME).map(|(id, _)| *id);
    (fill, qd1)
}

fn space_json(e: &Engine) -> (serde_json::Value, f64) {
    let t = Instant::now();
    let s = e.space();
    let secs = t.elapsed().as_secs_f64();
    (
        serde_json::json!({
            "capacity_bytes": s.capacity_bytes,
            "physical_used_bytes": s.physical_used_bytes,
            "live_bytes": s.live_bytes,
            "reclaimable_bytes": s.reclaimable_bytes,
            "logical_mapped_bytes": s.logical_mapped_bytes,
            "unique_chunks": s.unique_chunks,
            "host_written_bytes": s.host_written_bytes,
            "gc_relocated_bytes": s.gc_relocated_bytes,
            "write_amplification": s.write_amplification,
            "data_reduction": s.data_reduction,
            "metadata_written_bytes": metadata_written(e),
        }),
        secs,
    )
}

/// The metadata lock's holds between two snapshots of [`Engine::lock_holds`] (cumulative counts
/// per bucket, upper bounds in seconds): how many, and the buckets holding the median, the
/// 99th percentile and the longest (buckets are at most 12.5 % wide).
fn hold_percentiles(before: &[(f64, u64)], after: &[(f64, u64)]) -> serde_json::Value {
    let grown: Vec<(f64, u64)> = after
        .iter()
        .zip(before)
        .map(|(&(le, now), &(_, then))| (le, now.saturating_sub(then)))
        .collect();
    let total = grown.last().map_or(0, |&(_, n)| n);
    if total == 0 {
        return serde_json::json!({"count": 0});
    }
    let at = |q: f64| {
        let le = grown
            .iter()
            .find(|&&(_, n)| n as f64 >= q * total as f64)
            .map_or(f64::INFINITY, |&(le, _)| le);
        // Over the last finite bucket: reported as null (JSON has no infinity).
        le.is_finite().then_some(le * 1e6)
    };
    serde_json::json!({"count": total, "p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0)})
}

fn percentiles(lat: &mut [u64]) -> serde_json::Value {
    if lat.is_empty() {
        return serde_json::json!({"count": 0});
    }
    lat.sort_unstable();
    let at = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0;
    serde_json::json!({"count": lat.len(), "mean_us": mean, "p50_us": at(0.5),
        "p99_us": at(0.99), "p999_us": at(0.999), "max_us": *lat.last().unwrap() as f64 / 1000.0})
}

fn open_existing(args: &Args, t: Tuning, read_only: bool) -> (Arc<Engine>, f64) {
    let started = Instant::now();
    let backend = Arc::new(
        FileBackend::open(&args.dir, 0).unwrap_or_else(|e| fail(&format!("backend: {e}"))),
    );
    let e = Engine::open(backend, t, read_only).unwrap_or_else(|e| fail(&format!("open: {e}")));
    (Arc::new(e), started.elapsed().as_secs_f64())
}

fn has_engine(dir: &Path) -> bool {
    dir.join("log").exists()
}

/// The metadata cache's counters (pages resident and dirty, hits, faults, evictions).
fn cache_json(engine: &Engine) -> serde_json::Value {
    let c = engine.cache_stats();
    serde_json::json!({
        "resident_pages": c.resident,
        "dirty_pages": c.dirty,
        "hits": c.hits,
        "faults": c.faults,
        "evictions": c.evictions,
    })
}

/// `--stall-stacks`: where the QD1 writer waits when a command takes long. The writer marks
/// when each command starts; a sampler thread reads the writer's kernel stack
/// (`/proc/self/task/TID/stack`, root only) every 2 ms while the command has run over 10 ms,
/// and counts each stack (its top frames, offsets dropped). Each sample stands for about 2 ms
/// of waiting; the fill's `done` line lists the most frequent stacks.
struct StallSampler {
    base: Instant,
    /// Nanoseconds since `base` + 1 when the current command started; 0 while idle.
    started: AtomicU64,
    stack_path: Mutex<Option<PathBuf>>,
    counts: Mutex<std::collections::HashMap<String, u64>>,
}

impl StallSampler {
    const THRESHOLD: Duration = Duration::from_millis(10);
    const PERIOD: Duration = Duration::from_millis(2);
    const FRAMES: usize = 8;

    fn new() -> Arc<StallSampler> {
        Arc::new(StallSampler {
            base: Instant::now(),
            started: AtomicU64::new(0),
            stack_path: Mutex::new(None),
            counts: Mutex::default(),
        })
    }

    /// Called on the writer's thread before its first command.
    fn register_writer(&self) {
        if let Ok(link) = std::fs::read_link("/proc/thread-self") {
            *self.stack_path.lock().unwrap() = Some(Path::new("/proc").join(link).join("stack"));
        }
    }

    fn begin(&self) {
        let ns = self.base.elapsed().as_nanos() as u64 + 1;
        self.started.store(ns, Ordering::Release);
    }

    fn end(&self) {
        self.started.store(0, Ordering::Release);
    }

    fn spawn(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Self::PERIOD);
                let started = me.started.load(Ordering::Acquire);
                if started == 0 {
                    continue;
                }
                let running = (me.base.elapsed().as_nanos() as u64 + 1).saturating_sub(started);
                if running < Self::THRESHOLD.as_nanos() as u64 {
                    continue;
                }
                let Some(path) = me.stack_path.lock().unwrap().clone() else {
                    continue;
                };
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let frames: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.split_whitespace().nth(1))
                    .map(|f| f.split('+').next().unwrap_or(f))
                    .take(Self::FRAMES)
                    .collect();
                let key = if frames.is_empty() {
                    "(running in user space)".to_string()
                } else {
                    frames.join(" < ")
                };
                *me.counts.lock().unwrap().entry(key).or_default() += 1;
            }
        })
    }

    fn summary(&self) -> serde_json::Value {
        let counts = self.counts.lock().unwrap();
        let mut v: Vec<(&String, &u64)> = counts.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.iter()
            .take(20)
            .map(|(k, n)| serde_json::json!({"samples": n, "stack": k}))
            .collect()
    }
}

fn fill(args: &Args) {
    let (t, cache) = tuning(args);
    let created = !has_engine(&args.dir);
    let started = Instant::now();
    let (engine, open_secs) = if created {
        let backend = Arc::new(
            FileBackend::open(&args.dir, args.capacity)
                .unwrap_or_else(|e| fail(&format!("backend: {e}"))),
        );
        let e = Engine::create(backend, EngineConfig::default(), t)
            .unwrap_or_else(|e| fail(&format!("create: {e}")));
        (Arc::new(e), started.elapsed().as_secs_f64())
    } else {
        open_existing(args, t, false)
    };
    emit(
        serde_json::json!({"event": "opened", "created": created, "open_seconds": open_secs,
        "recovery": recovery_json(&engine), "rss": rss(), "hwm": hwm(),
        "metadata_cache": cache, "data_dir": args.dir.display().to_string()}),
    );
    engine.start_background();

    // Volumes: the first fill volume first (volume 1 of a new engine), then the QD1 volume,
    // then more fill volumes as the fill needs them.
    let need = args.to.div_ceil(FILL_VOLUME).max(1) as usize;
    let (mut fill_vols, mut qd1) = volumes(&engine);
    while fill_vols.len() < need || qd1.is_none() {
        if fill_vols.is_empty() || qd1.is_some() {
            fill_vols.push(
                engine
                    .create_volume(FILL_VOLUME)
                    .unwrap_or_else(|e| fail(&format!("create volume: {e}"))),
            );
        } else {
            qd1 = Some(
                engine
                    .create_volume(QD1_VOLUME)
                    .unwrap_or_else(|e| fail(&format!("create volume: {e}"))),
            );
        }
    }
    let qd1 = qd1.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let lat: Arc<Mutex<Vec<u64>>> = Arc::default();
    let qd1_errors = Arc::new(AtomicU64::new(0));
    let sampler = args.stall_stacks.then(StallSampler::new);
    let sampler_thread = sampler.as_ref().map(|s| s.spawn(stop.clone()));
    let qd1_thread = {
        let (engine, stop, paused, lat, errors, sampler) = (
            engine.clone(),
            stop.clone(),
            paused.clone(),
            lat.clone(),
            qd1_errors.clone(),
            sampler.clone(),
        );
        let rate = args.qd1_rate;
        // Named, so profiles (`perf sched`, off-CPU stacks) can tell it from the fill writers.
        let named = std::thread::Builder::new().name("qd1".into());
        named
            .spawn(move || {
                // Tagged apart from the fill (bit 63 of the second word) and from other runs.
                let run = mix64(std::process::id() as u64 ^ SEED.rotate_left(17))
                    ^ std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as u64)
                        .unwrap_or(0);
                let mut buf = vec![0u8; CHUNK as usize];
                let period = if rate > 0 {
                    Duration::from_secs_f64(1.0 / rate as f64)
                } else {
                    Duration::ZERO
                };
                let mut next = Instant::now();
                let mut n = 0u64;
                if let Some(s) = &sampler {
                    s.register_writer();
                }
                while !stop.load(Ordering::Acquire) {
                    if paused.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(1));
                        next = Instant::now();
                        continue;
                    }
                    n += 1;
                    let tag = mix64(run ^ n);
                    buf[..8].copy_from_slice(&tag.to_le_bytes());
                    buf[8..16].copy_from_slice(&(n | 1 << 63).to_le_bytes());
                    let at = (mix64(tag) % (QD1_VOLUME / CHUNK)) * CHUNK;
                    let t0 = Instant::now();
                    if let Some(s) = &sampler {
                        s.begin();
                    }
                    let r = engine.write(qd1, at, &buf);
                    let ns = t0.elapsed().as_nanos() as u64;
                    if let Some(s) = &sampler {
                        s.end();
                    }
                    if r.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    lat.lock().unwrap().push(ns);
                    if rate > 0 {
                        next += period;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            next = now; // late: no catch-up burst
                        }
                    }
                }
            })
            .unwrap_or_else(|e| fail(&format!("cannot start the QD1 writer: {e}")))
    };

    let mut pos = args.from / WRITE * WRITE;
    let to = args.to / WRITE * WRITE;
    let (mut space_before, _) = space_json(&engine);
    let fill_started = Instant::now();
    let mut holds_before = engine.lock_holds();
    let mut reason = "reached";
    emit(
        serde_json::json!({"event": "writing", "from": pos, "to": to,
        "seconds": started.elapsed().as_secs_f64()}),
    );
    let write_errors = AtomicU64::new(0);
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let mut seed = args.seed;
    while pos < to {
        let step_end = ((pos / args.step + 1) * args.step).min(to);
        let next = AtomicU64::new(pos / WRITE);
        let end_unit = step_end / WRITE;
        let step_started = Instant::now();
        lat.lock().unwrap().clear();
        let hwm_before = hwm();
        let io_before = proc_io();
        let halt = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut workers = Vec::new();
            for _ in 0..WRITERS {
                workers.push(s.spawn(|| {
                    let mut buf = vec![0u8; WRITE as usize];
                    loop {
                        if halt.load(Ordering::Acquire) {
                            return;
                        }
                        let u = next.fetch_add(1, Ordering::AcqRel);
                        if u >= end_unit {
                            return;
                        }
                        let p = u * WRITE;
                        let first = p / CHUNK;
                        for (i, c) in buf.chunks_exact_mut(CHUNK as usize).enumerate() {
                            c[..16].copy_from_slice(&stamp(first + i as u64, seed));
                        }
                        let vol = fill_vols[(p / FILL_VOLUME) as usize];
                        if let Err(e) = engine.write(vol, p % FILL_VOLUME, &buf) {
                            write_errors.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().unwrap().get_or_insert(e.to_string());
                            halt.store(true, Ordering::Release);
                            return;
                        }
                    }
                }));
            }
            while workers.iter().any(|w| !w.is_finished()) {
                std::thread::sleep(Duration::from_millis(50));
                if args.max_rss.is_some_and(|m| rss() > m) {
                    reason = "max-rss";
                    halt.store(true, Ordering::Release);
                } else if args
                    .time_limit
                    .is_some_and(|l| started.elapsed().as_secs_f64() > l)
                {
                    reason = "time-limit";
                    halt.store(true, Ordering::Release);
                }
            }
        });
        // Units are claimed in order and every claimed unit is written (or the run stops on
        // an error): everything below min(next, end) is there.
        let done_to = next.load(Ordering::Acquire).min(end_unit) * WRITE;
        let write_secs = step_started.elapsed().as_secs_f64();
        let mut step_lat = std::mem::take(&mut *lat.lock().unwrap());
        paused.store(true, Ordering::Release);
        let flush_started = Instant::now();
        let flushed = engine.flush();
        let flush_secs = flush_started.elapsed().as_secs_f64();
        let (space, space_secs) = space_json(&engine);
        paused.store(false, Ordering::Release);
        let step_bytes = done_to - pos;
        let step_secs = write_secs + flush_secs;
        // The step's holds, its flush and checkpoints included.
        let holds_now = engine.lock_holds();
        emit(serde_json::json!({
            "event": "step",
            "unique_bytes": done_to,
            "step_bytes": step_bytes,
            "seconds": fill_started.elapsed().as_secs_f64(),
            "step_seconds": step_secs,
            "flush_seconds": flush_secs,
            "space_seconds": space_secs,
            "mb_s": step_bytes as f64 / step_secs.max(1e-9) / 1e6,
            "rss": rss(),
            "hwm": hwm(),
            "hwm_before": hwm_before,
            "qd1": percentiles(&mut step_lat),
            "qd1_errors": qd1_errors.load(Ordering::Relaxed),
            "io_before": io_before,
            "io": proc_io(),
            "files": files(&args.dir),
            "space_before": space_before,
            "space": space.clone(),
            "flush_error": flushed.err().map(|e| e.to_string()),
            "cache": cache_json(&engine),
            "longest_lock_hold_us": engine.longest_lock_hold_us(),
            "lock_hold": hold_percentiles(&holds_before, &holds_now),
        }));
        holds_before = holds_now;
        pos = done_to;
        space_before = space;
        if write_errors.load(Ordering::Relaxed) > 0 {
            reason = "write-error";
        }
        if reason != "reached" {
            break;
        }
        if args.wrap && pos >= to {
            // Keep the load on: write the range again with new unique content.
            pos = args.from / WRITE * WRITE;
            seed += 1;
        }
    }
    stop.store(true, Ordering::Release);
    let _ = qd1_thread.join();
    if let Some(t) = sampler_thread {
        let _ = t.join();
    }
    let shut = Instant::now();
    let shutdown = engine.shutdown();
    let shutdown_secs = shut.elapsed().as_secs_f64();
    emit(serde_json::json!({
        "event": "done",
        "reason": reason,
        "unique_bytes": pos,
        "seconds": started.elapsed().as_secs_f64(),
        "shutdown_seconds": shutdown_secs,
        "shutdown_error": shutdown.err().map(|e| e.to_string()),
        "write_error": first_error.lock().unwrap().clone(),
        "rss": rss(),
        "hwm": hwm(),
        "io": proc_io(),
        "files": files(&args.dir),
        "stall_stacks": sampler.map(|s| s.summary()),
    }));
    if reason == "write-error" {
        std::process::exit(1);
    }
}

fn recovery_json(e: &Engine) -> serde_json::Value {
    let r = e.recovery();
    serde_json::json!({"records_replayed": r.records_replayed, "bytes_replayed": r.bytes_replayed,
        "torn_tail": r.torn_tail, "seconds": r.duration.as_secs_f64()})
}

/// Read chunk `k` of the fill back and compare it with what the fill wrote.
fn verify_chunk(e: &Engine, fill_vols: &[u32], k: u64, buf: &mut [u8]) -> Result<bool, String> {
    let p = k * CHUNK;
    let Some(&vol) = fill_vols.get((p / FILL_VOLUME) as usize) else {
        return Ok(false);
    };
    e.read(vol, p % FILL_VOLUME, buf)
        .map_err(|e| e.to_string())?;
    Ok(buf[..16] == stamp(k, 0) && buf[16..].iter().all(|&b| b == 0))
}

fn open_cmd(args: &Args) {
    let (t, cache) = tuning(args);
    let started = Instant::now();
    let (engine, open_secs) = open_existing(args, t, false);
    let hwm_open = hwm();
    // The first host read after start: 4 KiB of volume 1.
    let read_started = Instant::now();
    let mut buf = vec![0u8; CHUNK as usize];
    let first_read = engine.read(1, 0, &mut buf).err().map(|e| e.to_string());
    let read_secs = read_started.elapsed().as_secs_f64();
    let ready_secs = started.elapsed().as_secs_f64();
    // With --expect N: the fill's data below N must be there (the harness passes the last
    // position a fill flushed): the last chunk, the first, and 62 spread between.
    let (mut verified, mut mismatches, mut read_errors) = (0u64, 0u64, Vec::new());
    if let Some(n) = args.expect.filter(|&n| n >= CHUNK) {
        let (fill_vols, _) = volumes(&engine);
        let chunks = n / CHUNK;
        let mut picks: Vec<u64> = (0..62).map(|i| mix64(i ^ SEED) % chunks).collect();
        picks.extend([0, chunks - 1]);
        for k in picks {
            match verify_chunk(&engine, &fill_vols, k, &mut buf) {
                Ok(true) => verified += 1,
                Ok(false) => mismatches += 1,
                Err(e) => read_errors.push(e),
            }
        }
    }
    let (space, space_secs) = space_json(&engine);
    let shut = Instant::now();
    let shutdown = engine.shutdown();
    emit(serde_json::json!({
        "event": "open",
        "space": space,
        "space_seconds": space_secs,
        "io": proc_io(),
        "open_seconds": open_secs,
        "first_read_seconds": read_secs,
        "first_read_error": first_read,
        "ready_seconds": ready_secs,
        "recovery": recovery_json(&engine),
        "hwm_open": hwm_open,
        "verified": verified,
        "mismatches": mismatches,
        "read_errors": read_errors,
        "shutdown_seconds": shut.elapsed().as_secs_f64(),
        "shutdown_error": shutdown.err().map(|e| e.to_string()),
        "rss": rss(),
        "hwm": hwm(),
        "metadata_cache": cache,
        "files": files(&args.dir),
    }));
    if mismatches > 0 {
        std::process::exit(3);
    }
}

fn check_cmd(args: &Args) {
    let (t, cache) = tuning(args);
    let started = Instant::now();
    let (engine, open_secs) = open_existing(args, t, true);
    let hwm_open = hwm();
    let check_started = Instant::now();
    let mut last = (0u64, 0u64);
    let problems = engine.check(&mut |done, total| last = (done, total));
    let check_secs = check_started.elapsed().as_secs_f64();
    emit(serde_json::json!({
        "event": "check",
        "open_seconds": open_secs,
        "check_seconds": check_secs,
        "seconds": started.elapsed().as_secs_f64(),
        "progress": [last.0, last.1],
        "problems": problems.len(),
        "first_problems": problems.iter().take(5).collect::<Vec<_>>(),
        "hwm_open": hwm_open,
        "rss": rss(),
        "hwm": hwm(),
        "metadata_cache": cache,
    }));
    if !problems.is_empty() {
        std::process::exit(3);
    }
}

fn main() {
    // SCALE_LOG=debug (any tracing filter) writes the engine's log to stderr: the metadata
    // lock's long holds are logged at debug with where they were taken.
    if let Ok(filter) = std::env::var("SCALE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let args = parse_args();
    rss_watchdog(args.max_rss);
    match args.cmd.as_str() {
        "fill" => fill(&args),
        "open" => open_cmd(&args),
        "check" => check_cmd(&args),
        other => fail(&format!("unknown subcommand {other} (fill, open, check)")),
    }
}
