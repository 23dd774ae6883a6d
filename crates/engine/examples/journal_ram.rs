//! RAM of the delta journal's pending words, measured against what the engine counts for them
//! (`Journal::ram_bytes`, which the metadata cache budget charges): `pages` pages of the
//! chunk table and map nodes get one word each per round, at random places, for `rounds`
//! rounds, as random overwrites give them.
//!
//!     cargo run --release -p sliver-engine --example journal_ram -- PAGES ROUNDS

#[path = "support/proc_status.rs"]
mod proc_status;
use sliver_engine::meta::journal::Journal;
use sliver_engine::meta::tables::{CHUNK_TABLE, T_NODES};

fn rss() -> u64 {
    proc_status::status_bytes("VmRSS:")
}

fn main() {
    let arg = |k: usize| -> u64 {
        std::env::args()
            .nth(k)
            .and_then(|a| a.parse().ok())
            .expect("usage: journal_ram PAGES ROUNDS")
    };
    let (pages, rounds) = (arg(1), arg(2));
    let before = rss();
    let mut j = Journal::new();
    let journal_pages = j.allocate(1000);
    let mut x = 1u64;
    for round in 0..rounds {
        for p in 0..pages {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let table = if p % 5 == 0 { T_NODES } else { CHUNK_TABLE };
            let jpage = journal_pages[(round % 1000) as usize];
            j.add(table, p, &[(((x >> 20) % 512) as u16, round)], jpage);
        }
    }
    let used = rss() - before;
    println!(
        "{pages} pages, {} words: counted {} MiB, VmRSS grew {} MiB ({:.1} bytes a word)",
        j.words(),
        j.ram_bytes() >> 20,
        used >> 20,
        used as f64 / j.words() as f64
    );
}
