//! The longest single insert into format 2's complete dedup index (kept for the migration) while
//! it grows to N fingerprints: the stall
//! a host command waiting for the metadata lock would see. Compares the sharded index with one
//! hash table (what the engine used before).
//!
//!     cargo run --release -p sliver-engine --example index_growth -- [N]

use sliver_engine::legacy::state::{FingerprintHasher, FingerprintIndex};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn key(n: u64) -> [u8; 16] {
    blake3::keyed_hash(&[7; 32], &n.to_le_bytes()).as_bytes()[..16]
        .try_into()
        .unwrap()
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

fn run(name: &str, n: u64, mut insert: impl FnMut([u8; 16], u32)) {
    let keys: Vec<[u8; 16]> = (0..n).map(key).collect();
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    let mut over_1ms = 0u64;
    for (i, k) in keys.iter().enumerate() {
        let t = Instant::now();
        insert(*k, i as u32);
        let d = t.elapsed();
        worst = worst.max(d);
        over_1ms += (d > Duration::from_millis(1)) as u64;
    }
    println!(
        "{name}: {n} inserts in {:.2} s, longest insert {:.2} ms, {over_1ms} inserts over 1 ms, peak RSS {} MiB",
        started.elapsed().as_secs_f64(),
        worst.as_secs_f64() * 1e3,
        rss_mib()
    );
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("N"))
        .unwrap_or(30_000_000);
    if std::env::args().nth(2).as_deref() == Some("single") {
        let mut one: HashMap<[u8; 16], u32, std::hash::BuildHasherDefault<FingerprintHasher>> =
            HashMap::default();
        run("one table", n, |k, v| {
            one.insert(k, v);
        });
    } else {
        let mut sharded = FingerprintIndex::default();
        run("sharded", n, |k, v| {
            sharded.insert(k, v);
        });
    }
}
