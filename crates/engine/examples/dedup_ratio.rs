//! How many of the duplicates a complete fingerprint index would find the engine's sampled
//! index finds (issue 20: at least 97 %), on the benchmark's kinds of data:
//!
//! - `copies`: a file-system image written to a volume, then to three more (host copies, as
//!   `qemu-img convert` does), then divergent 4 KiB writes of mixed data into each copy (the
//!   side-by-side benchmark's 4-copies data set);
//! - `clones`: a volume holding the image copied by the host into 8 new volumes, each given 5 %
//!   divergent writes (VM image clones made without copy offload);
//! - `golden`: an image copied again after 4 GiB of other writes have pushed it out of the
//!   locality cache, so only the sampled hooks can lead back to it;
//! - `overwrites`: 4 KiB random overwrites of mixed data (30 % drawn from 256 recurring
//!   blocks, the rest half unique), iscsi-load's `mix`.
//!
//! The complete index's answer is counted beside the engine: a model of what every volume
//! holds and which contents are stored, so a chunk counts as a duplicate when identical
//! content is stored at the moment it is written. The engine's answer is its
//! `dedup_chunks` counter.
//!
//!     cargo run --release -p sliver-engine --example dedup_ratio -- [--image FILE] [--json FILE]
//!
//! Without `--image`, an ext4 image of /usr/share/doc (384 MiB) is made with mke2fs.

use sliver_engine::test_data::xorshift64;
use sliver_engine::{Compression, Engine, EngineConfig, FileBackend, GcPriority, Tuning};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CHUNK: usize = 4096;
const MIB: usize = 1 << 20;

/// What a complete index knows: every volume's chunks and how often each content is stored.
#[derive(Default)]
struct Model {
    at: HashMap<(u32, u64), [u8; 32]>,
    stored: HashMap<[u8; 32], u64>,
    written: u64,
    duplicates: u64,
}

impl Model {
    fn write(&mut self, volume: u32, offset: u64, data: &[u8]) {
        for (k, chunk) in data.chunks(CHUNK).enumerate() {
            let index = offset / CHUNK as u64 + k as u64;
            let old = self.at.remove(&(volume, index));
            if chunk.iter().any(|&b| b != 0) {
                let h = *blake3::hash(chunk).as_bytes();
                self.written += 1;
                // The old content is still stored while the new one is looked up.
                if self.stored.get(&h).is_some_and(|&n| n > 0) {
                    self.duplicates += 1;
                }
                *self.stored.entry(h).or_insert(0) += 1;
                self.at.insert((volume, index), h);
            }
            if let Some(old) = old {
                let n = self.stored.get_mut(&old).expect("stored");
                *n -= 1;
                if *n == 0 {
                    self.stored.remove(&old);
                }
            }
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        xorshift64(&mut self.0)
    }

    /// Fill `buf` (a multiple of 8 bytes) with the next values.
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf.chunks_exact_mut(8) {
            b.copy_from_slice(&self.next().to_le_bytes());
        }
    }
}

/// A 4 KiB block of iscsi-load's `mix`: 30 % one of 256 recurring blocks, else a unique first
/// half and a repeated phrase.
fn mix_block(rng: &mut Rng, pool: &[u8]) -> Vec<u8> {
    let h = rng.next();
    if h % 100 < 30 {
        let k = ((h >> 8) % 256) as usize;
        return pool[k * CHUNK..(k + 1) * CHUNK].to_vec();
    }
    let mut b = vec![0u8; CHUNK];
    let start = ((h >> 12) as usize % (pool.len() - CHUNK)) & !7;
    b[..CHUNK / 2].copy_from_slice(&pool[start..start + CHUNK / 2]);
    b[..8].copy_from_slice(&h.to_le_bytes());
    for (i, byte) in b.iter_mut().enumerate().skip(CHUNK / 2) {
        *byte = b'a' + (i % 64) as u8 % 26;
    }
    b
}

struct Run {
    engine: Arc<Engine>,
    model: Model,
    _dir: tempfile::TempDir,
}

impl Run {
    fn new(capacity: u64) -> Run {
        let dir = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into()))
            .expect("scratch directory");
        let backend = Arc::new(FileBackend::open(dir.path(), capacity).expect("backend"));
        let tuning = Tuning {
            compression: Compression::Lz4,
            gc: GcPriority::Off,
            ..Tuning::default()
        };
        let engine =
            Arc::new(Engine::create(backend, EngineConfig::default(), tuning).expect("engine"));
        Run {
            engine,
            model: Model::default(),
            _dir: dir,
        }
    }

    fn write(&mut self, volume: u32, offset: u64, data: &[u8]) {
        self.engine.write(volume, offset, data).expect("write");
        self.model.write(volume, offset, data);
    }

    /// A new volume of the image's size holding `image`.
    fn image_volume(&mut self, image: &[u8]) -> u32 {
        let volume = self.engine.create_volume(image.len() as u64).unwrap();
        for (k, piece) in image.chunks(MIB).enumerate() {
            self.write(volume, (k * MIB) as u64, piece);
        }
        volume
    }

    fn diverge(&mut self, volume: u32, size: u64, bytes: usize, rng: &mut Rng, pool: &[u8]) {
        for _ in 0..bytes / CHUNK {
            let at = rng.next() % (size / CHUNK as u64) * CHUNK as u64;
            let block = mix_block(rng, pool);
            self.write(volume, at, &block);
        }
    }

    /// (chunks written, duplicates a complete index finds, duplicates found).
    fn result(&self) -> (u64, u64, u64) {
        let s = self.engine.space();
        assert_eq!(
            s.data_chunks_written, self.model.written,
            "chunks counted alike"
        );
        (s.data_chunks_written, self.model.duplicates, s.dedup_chunks)
    }
}

fn image(arg: Option<PathBuf>, scratch: &Path) -> Vec<u8> {
    let path = arg.unwrap_or_else(|| {
        let path = scratch.join("dataset.ext4");
        let ok = std::process::Command::new("mke2fs")
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-E",
                "nodiscard",
                "-d",
                "/usr/share/doc",
            ])
            .arg(&path)
            .arg("384M")
            .status()
            .expect("mke2fs (e2fsprogs) runs");
        assert!(ok.success(), "mke2fs failed");
        path
    });
    let mut data = std::fs::read(&path).expect("the image");
    data.resize(data.len().div_ceil(MIB) * MIB, 0);
    data
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch");
    let image = image(flag("--image").map(PathBuf::from), scratch.path());
    let size = image.len() as u64;
    let mut pool = vec![0u8; 256 * CHUNK + MIB];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    rng.fill(&mut pool);
    let mut rows = Vec::new();

    // The 4-copies set: the image in four volumes, then divergent writes into the copies.
    let mut run = Run::new(16 << 30);
    for _ in 0..4 {
        run.image_volume(&image);
    }
    for v in 2..=4 {
        run.diverge(v, size, 32 * MIB, &mut rng, &pool);
    }
    rows.push((
        "image written 4 times, 32 MiB divergent writes per copy",
        run.result(),
    ));
    drop(run);

    // Host copies of a VM image (no offload), 5 % divergent writes each.
    let mut run = Run::new(16 << 30);
    let base = run.image_volume(&image);
    let mut copy = vec![0u8; MIB];
    for _ in 0..8 {
        let v = run.engine.create_volume(size).unwrap();
        for k in 0..size as usize / MIB {
            run.engine.read(base, (k * MIB) as u64, &mut copy).unwrap();
            let piece = copy.clone();
            run.write(v, (k * MIB) as u64, &piece);
        }
        run.diverge(v, size, size as usize / 20, &mut rng, &pool);
    }
    rows.push((
        "image copied by the host into 8 clones, 5 % divergent",
        run.result(),
    ));
    drop(run);

    // A golden image copied long after it was written: 4 GiB of other data in between push
    // it out of the locality cache, so only the hooks can lead back to it.
    let mut run = Run::new(16 << 30);
    let _golden = run.image_volume(&image);
    let other = run.engine.create_volume(4 << 30).unwrap();
    let mut noise = vec![0u8; MIB];
    for k in 0..4096u64 {
        rng.fill(&mut noise);
        let piece = noise.clone();
        run.write(other, k * MIB as u64, &piece);
    }
    let _later_copy = run.image_volume(&image);
    rows.push((
        "image copied after 4 GiB of other writes (out of the locality cache)",
        run.result(),
    ));
    drop(run);

    // Random overwrites of mixed data.
    let mut run = Run::new(8 << 30);
    let v = run.engine.create_volume(256 << 20).unwrap();
    run.diverge(v, 256 << 20, 512 * MIB, &mut rng, &pool);
    rows.push((
        "4 KiB random overwrites, 30 % of 256 recurring blocks",
        run.result(),
    ));
    drop(run);

    println!("| data set | data chunks written | duplicates (complete index) | found (sampled index) | share found |");
    println!("|---|---|---|---|---|");
    let mut json = Vec::new();
    for (name, (written, complete, found)) in &rows {
        let share = if *complete == 0 {
            1.0
        } else {
            *found as f64 / *complete as f64
        };
        println!(
            "| {name} | {written} | {complete} | {found} | {:.2} % |",
            share * 100.0
        );
        json.push(serde_json::json!({
            "data_set": name, "chunks_written": written, "complete_index": complete,
            "found": found, "share": share,
        }));
    }
    if let Some(path) = flag("--json") {
        std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap()).expect("write json");
    }
}
