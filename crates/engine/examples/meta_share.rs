//! Metadata bytes checkpoints write per host byte under sustained 4 KiB random overwrites
//! (issue 20: at most 5 %), for volumes whose hot metadata fits the cache and for ones whose
//! does not, and what an idle array writes afterwards (nothing, it must be).
//!
//!     cargo run --release -p sliver-engine --example meta_share -- [--cache BYTES]
//!         [--sizes 8G,32G,128G] [--overwrite BYTES] [--json FILE]
//!
//! `META_SHARE_LOG=sliver_engine=debug` writes the engine's log to stderr.
//!
//! Each volume is first filled with unique compressible chunks (as bench/scale writes them),
//! then overwritten at random 4 KiB offsets with new unique compressible chunks while the
//! engine's background thread checkpoints as it would in service.

#[path = "support/proc_status.rs"]
mod proc_status;
use sliver_engine::{Compression, Engine, EngineConfig, FileBackend, GcPriority, Tuning};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHUNK: u64 = 4096;
const MIB: u64 = 1 << 20;

fn size(s: &str) -> u64 {
    let (n, unit) = s.split_at(s.trim_end_matches(['K', 'M', 'G', 'T']).len());
    let n: u64 = n.parse().expect("a size");
    n << match unit {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => 0,
    }
}

/// A distinct, compressible chunk: a 16-byte stamp, then zeros.
fn chunk(stamp: u64, salt: u64, out: &mut [u8]) {
    out.fill(0);
    out[..8].copy_from_slice(&stamp.to_le_bytes());
    out[8..16].copy_from_slice(&salt.to_le_bytes());
}

/// A line of /proc/self/status in MiB (VmRSS, VmHWM).
fn status_mib(key: &str) -> u64 {
    proc_status::status_bytes(key) >> 20
}

fn main() {
    // META_SHARE_LOG=sliver_engine=debug: the engine's log on stderr (metadata-lock holds over
    // 20 ms with where they were taken, each checkpoint's figures).
    if let Ok(filter) = std::env::var("META_SHARE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let cache = flag("--cache").map_or(512 * MIB, |s| size(&s));
    let sizes: Vec<u64> = flag("--sizes")
        .unwrap_or("8G,32G,128G".into())
        .split(',')
        .map(size)
        .collect();
    let overwrite = flag("--overwrite").map_or(4 << 30, |s| size(&s));
    println!(
        "| volume | metadata cache | host bytes overwritten | metadata bytes written | share | writes/s | longest metadata lock hold | VmRSS after | idle 5 s: metadata written | clean start after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &volume_size in &sizes {
        let dir = tempfile::tempdir_in("/var/tmp").expect("scratch");
        let backend = Arc::new(FileBackend::open(dir.path(), 64 << 30).expect("backend"));
        let tuning = Tuning {
            compression: Compression::Lz4,
            gc: GcPriority::Medium,
            metadata_cache: cache,
            ..Tuning::default()
        };
        let engine =
            Arc::new(Engine::create(backend, EngineConfig::default(), tuning).expect("engine"));
        engine.start_background();
        let v = engine.create_volume(volume_size).unwrap();
        let mut buf = vec![0u8; MIB as usize];
        for m in 0..volume_size / MIB {
            for (k, c) in buf.chunks_exact_mut(CHUNK as usize).enumerate() {
                chunk(m * 256 + k as u64, 1, c);
            }
            engine.write(v, m * MIB, &buf).unwrap();
        }
        engine.checkpoint().unwrap();
        let before = engine.metadata_written();
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ volume_size;
        let mut one = vec![0u8; CHUNK as usize];
        let writes = overwrite / CHUNK;
        let started = Instant::now();
        for n in 0..writes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = x % (volume_size / CHUNK);
            chunk(n, 2 + (volume_size >> 30), &mut one);
            engine.write(v, at * CHUNK, &one).unwrap();
        }
        let elapsed = started.elapsed();
        // What the overwrites left dirty counts too.
        engine.checkpoint().unwrap();
        let metadata = engine.metadata_written() - before;
        let rss = status_mib("VmRSS:");
        let hold_ms = engine.longest_lock_hold_us() as f64 / 1000.0;
        let idle_from = engine.metadata_written();
        std::thread::sleep(Duration::from_secs(5));
        let idle = engine.metadata_written() - idle_from;
        let share = metadata as f64 / overwrite as f64;
        // A clean restart after the overwrites: what open reads grows with what the
        // overwrites left (format 4: the journal of pending words).
        engine.shutdown().unwrap();
        drop(engine);
        let backend = Arc::new(FileBackend::open(dir.path(), 64 << 30).expect("backend"));
        let opened = Instant::now();
        let engine = Arc::new(Engine::open(backend, tuning, false).expect("reopen"));
        let start_ms = opened.elapsed().as_secs_f64() * 1000.0;
        println!(
            "| {} GiB | {} MiB | {} MiB | {} MiB | {:.1} % | {:.0} | {:.1} ms | {} MiB | {} bytes | {:.0} ms |",
            volume_size >> 30,
            cache >> 20,
            overwrite >> 20,
            metadata >> 20,
            share * 100.0,
            writes as f64 / elapsed.as_secs_f64(),
            hold_ms,
            rss,
            idle,
            start_ms
        );
        rows.push(serde_json::json!({
            "volume_bytes": volume_size, "cache_bytes": cache, "host_bytes": overwrite,
            "metadata_bytes": metadata, "share": share,
            "writes_per_s": writes as f64 / elapsed.as_secs_f64(), "idle_metadata_bytes": idle,
            "vm_rss_mib": rss, "longest_lock_hold_ms": hold_ms, "clean_start_ms": start_ms,
        }));
        engine.shutdown().unwrap();
    }
    println!(
        "\nVmHWM of the process (all volumes): {} MiB",
        status_mib("VmHWM:")
    );
    if let Some(path) = flag("--json") {
        std::fs::write(path, serde_json::to_vec_pretty(&rows).unwrap()).expect("write json");
    }
}
