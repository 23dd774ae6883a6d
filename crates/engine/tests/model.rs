//! Model-based test: random sequences of engine operations checked against a plain in-memory
//! reference (one `Vec<u8>` per volume).
//!
//! Geometry is tiny (4 KiB chunks, 64–512 KiB segments, a few MiB of log) so that segment
//! switches, garbage collection, checkpoints and running out of space happen all the time.
//!
//! What the engine promises when an operation fails with `NoSpace` (and what is checked here):
//!
//! - Volume operations (create, clone, delete, resize), `collect_garbage`, `checkpoint` and
//!   `flush` are all or nothing: on `NoSpace` nothing visible changed.
//! - A `write` is split into pieces of at most `atomic_write_limit()` bytes, cut at chunk
//!   boundaries (the first piece ends at `offset / chunk * chunk + limit`), and applied piece by
//!   piece, each all or nothing. A write that fails with `NoSpace` has applied a prefix of its
//!   pieces (possibly none): the volume reads the new data up to some piece boundary and the old
//!   data after it. This is what SCSI allows for a failed WRITE longer than the atomic limit.
//! - `unmap` and `copy` change the volume one chunk at a time (edges through the write path,
//!   whole chunks by metadata records): after a `NoSpace`, every chunk-sized (chunk-aligned)
//!   part of the range reads either entirely old or entirely new content.

mod common;

use common::test_paced_tuning;
use proptest::prelude::*;
use sliver_engine::test_data::{mem_engine, xorshift64};
use sliver_engine::{Engine, EngineError, MemBackend};
use std::collections::BTreeMap;
use std::sync::Arc;

const CS: u64 = 4096;
const MAX_VOLUMES: usize = 4;

/// The content of a write.
#[derive(Debug, Clone, Copy)]
enum Data {
    Zeros,
    /// One of a few fixed 4 KiB patterns, laid out by volume offset so that chunk-aligned
    /// copies dedup with each other wherever they are written.
    Pattern(u8),
    /// Compressible text.
    Text(u64),
    /// Incompressible bytes.
    Noise(u64),
}

fn pattern(p: u8) -> Vec<u8> {
    let mut x = 0x51_1e_u64 + p as u64 * 7919;
    (0..CS).map(|_| xorshift64(&mut x) as u8).collect()
}

fn generate(data: Data, offset: u64, len: usize, patterns: &[Vec<u8>]) -> Vec<u8> {
    match data {
        Data::Zeros => vec![0; len],
        Data::Pattern(p) => {
            let pat = &patterns[p as usize % patterns.len()];
            (0..len as u64)
                .map(|i| pat[((offset + i) % CS) as usize])
                .collect()
        }
        Data::Text(seed) => {
            const WORDS: [&[u8]; 6] = [b"sliver ", b"thin ", b"chunk ", b"log ", b"dedup ", b"\n"];
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                out.extend_from_slice(WORDS[(xorshift64(&mut x) % 6) as usize]);
            }
            out.truncate(len);
            out
        }
        Data::Noise(seed) => {
            let mut x = seed | 1;
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                out.extend_from_slice(&xorshift64(&mut x).to_le_bytes());
            }
            out.truncate(len);
            out
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Offsets and lengths are raw numbers reduced modulo the chosen volume at run time.
    Write {
        vol: usize,
        block: u64,
        blocks: u64,
        data: Data,
    },
    /// Overwrite a whole volume with noise in one call (many batches): fills the log.
    Fill {
        vol: usize,
        seed: u64,
    },
    Unmap {
        vol: usize,
        offset: u64,
        len: u64,
    },
    /// SBC ANCHOR: reads as zeros like an unmap, but holds space.
    Anchor {
        vol: usize,
        offset: u64,
        len: u64,
    },
    Copy {
        src: usize,
        dst: usize,
        src_block: u64,
        dst_block: u64,
        /// Keep the destination at the same offset within a chunk (by-reference copy).
        same_alignment: bool,
        blocks: u64,
    },
    Create {
        chunks: u64,
    },
    Clone {
        vol: usize,
    },
    Delete {
        vol: usize,
    },
    Resize {
        vol: usize,
        chunks: u64,
    },
    Gc {
        max_live: f64,
    },
    Checkpoint,
    Flush,
    Restart,
}

fn data_strategy() -> impl Strategy<Value = Data> {
    prop_oneof![
        1 => Just(Data::Zeros),
        3 => (0u8..4).prop_map(Data::Pattern),
        2 => (0u64..8).prop_map(Data::Text),
        4 => any::<u64>().prop_map(Data::Noise),
    ]
}

/// Lengths in 512-byte blocks: mostly short, sometimes several batches long.
fn blocks_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=8,
        4 => 1u64..=40,
        2 => 8u64..=160,
        1 => 100u64..=600,
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (any::<usize>(), any::<u64>(), blocks_strategy(), data_strategy()).prop_map(
            |(vol, block, blocks, data)| Op::Write { vol, block, blocks, data }
        ),
        2 => (any::<usize>(), any::<u64>()).prop_map(|(vol, seed)| Op::Fill { vol, seed }),
        6 => (any::<usize>(), any::<u64>(), 1u64..300_000).prop_map(|(vol, offset, len)| {
            Op::Unmap { vol, offset, len }
        }),
        3 => (any::<usize>(), any::<u64>(), 1u64..300_000).prop_map(|(vol, offset, len)| {
            Op::Anchor { vol, offset, len }
        }),
        6 => (
            any::<usize>(),
            any::<usize>(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            blocks_strategy()
        )
            .prop_map(|(src, dst, src_block, dst_block, same_alignment, blocks)| Op::Copy {
                src,
                dst,
                src_block,
                dst_block,
                same_alignment,
                blocks
            }),
        1 => (1u64..400).prop_map(|chunks| Op::Create { chunks }),
        2 => any::<usize>().prop_map(|vol| Op::Clone { vol }),
        1 => any::<usize>().prop_map(|vol| Op::Delete { vol }),
        2 => (any::<usize>(), 1u64..1300).prop_map(|(vol, chunks)| Op::Resize { vol, chunks }),
        3 => prop_oneof![Just(0.0), Just(0.3), Just(0.6), Just(0.95), Just(1.0)]
            .prop_map(|max_live| Op::Gc { max_live }),
        2 => Just(Op::Checkpoint),
        2 => Just(Op::Flush),
        2 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    segment_size: u32,
    capacity: u64,
    /// Initial volume sizes in chunks.
    volumes: [u64; 2],
}

fn setup_strategy() -> impl Strategy<Value = Setup> {
    prop_oneof![
        // Small segments: one chunk per batch, GC and segment switches all the time.
        (
            prop_oneof![Just(64u32 << 10), Just(128 << 10)],
            prop_oneof![Just(1u64 << 20), Just(2 << 20), Just(4 << 20)],
            1u64..600,
            1u64..300
        )
            .prop_map(|(segment_size, capacity, a, b)| Setup {
                segment_size,
                capacity,
                volumes: [a, b]
            }),
        // Larger segments: several chunks per batch; a volume crossing a map page boundary
        // (1024 chunks).
        (1030u64..1300, 1u64..200).prop_map(|(a, b)| Setup {
            segment_size: 512 << 10,
            capacity: 5 << 20,
            volumes: [a, b]
        }),
    ]
}

struct Harness {
    backend: Arc<MemBackend>,
    engine: Engine,
    model: BTreeMap<u32, Vec<u8>>,
    patterns: Vec<Vec<u8>>,
    log: Vec<String>,
}

impl Harness {
    fn new(setup: Setup) -> Self {
        let (backend, engine) = mem_engine(setup.capacity, setup.segment_size, test_paced_tuning());
        let mut model = BTreeMap::new();
        for chunks in setup.volumes {
            let id = engine.create_volume(chunks * CS).unwrap();
            model.insert(id, vec![0u8; (chunks * CS) as usize]);
        }
        Harness {
            backend,
            engine,
            model,
            patterns: (0..4).map(pattern).collect(),
            log: Vec::new(),
        }
    }

    fn pick(&self, n: usize) -> Option<u32> {
        if self.model.is_empty() {
            return None;
        }
        self.model.keys().nth(n % self.model.len()).copied()
    }

    fn read(&self, vol: u32, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xA5u8; len];
        self.engine
            .read(vol, offset, &mut buf)
            .unwrap_or_else(|e| panic!("read {vol} {offset}+{len}: {e}\n{:#?}", self.log));
        buf
    }

    /// The engine's content of `vol` at `offset` equals the model's.
    fn compare(&self, vol: u32, offset: u64, len: usize, what: &str) {
        let got = self.read(vol, offset, len);
        let want = &self.model[&vol][offset as usize..offset as usize + len];
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{what}: volume {vol} differs from the model at byte {} (range {offset}+{len})\nops: {:#?}",
                offset as usize + first,
                self.log
            );
        }
    }

    fn compare_all(&self, what: &str) {
        let volumes = self.engine.volumes();
        let expected: Vec<(u32, u64)> = self
            .model
            .iter()
            .map(|(id, v)| (*id, v.len() as u64))
            .collect();
        assert_eq!(
            volumes, expected,
            "{what}: volume list\nops: {:#?}",
            self.log
        );
        for (&id, data) in &self.model {
            self.compare(id, 0, data.len(), what);
        }
        let problems = self.engine.check(&mut |_, _| {});
        assert!(
            problems.is_empty(),
            "{what}: check found {problems:?}\nops: {:#?}",
            self.log
        );
    }

    /// A write that failed with NoSpace applied a prefix of its pieces.
    fn check_write_prefix(&mut self, vol: u32, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let got = self.read(vol, offset, data.len());
        let old = self.model[&vol][offset as usize..end as usize].to_vec();
        let limit = self.engine.atomic_write_limit();
        let mut pieces = Vec::new();
        let mut pos = offset;
        while pos < end {
            let piece_end = ((pos / CS) * CS + limit).min(end);
            pieces.push(((pos - offset) as usize, (piece_end - offset) as usize));
            pos = piece_end;
        }
        let is_new = |&(a, b): &(usize, usize)| got[a..b] == data[a..b];
        let is_old = |&(a, b): &(usize, usize)| got[a..b] == old[a..b];
        let applied = pieces.iter().take_while(|p| is_new(p)).count();
        assert!(
            pieces[applied..].iter().all(is_old),
            "a write that ran out of space left more than a prefix of its pieces \
             (volume {vol}, {offset}+{}, pieces {pieces:?}, first {applied} new)\nops: {:#?}",
            data.len(),
            self.log
        );
        self.model.get_mut(&vol).unwrap()[offset as usize..end as usize].copy_from_slice(&got);
    }

    /// After a failed unmap or copy: every chunk-aligned part of the range is old or new.
    fn check_chunkwise(&mut self, vol: u32, offset: u64, new: &[u8]) {
        let end = offset + new.len() as u64;
        let got = self.read(vol, offset, new.len());
        let old = &self.model[&vol][offset as usize..end as usize];
        let mut pos = offset;
        while pos < end {
            let to = ((pos / CS + 1) * CS).min(end);
            let (a, b) = ((pos - offset) as usize, (to - offset) as usize);
            assert!(
                got[a..b] == new[a..b] || got[a..b] == old[a..b],
                "volume {vol} bytes {pos}..{to} are neither old nor new after a failed op\nops: {:#?}",
                self.log
            );
            pos = to;
        }
        self.model.get_mut(&vol).unwrap()[offset as usize..end as usize].copy_from_slice(&got);
    }

    fn write(&mut self, vol: u32, offset: u64, data: &[u8]) {
        match self.engine.write(vol, offset, data) {
            Ok(()) => {
                self.model.get_mut(&vol).unwrap()[offset as usize..offset as usize + data.len()]
                    .copy_from_slice(data);
                self.compare(vol, offset, data.len(), "after write");
            }
            Err(EngineError::NoSpace) => {
                self.log.push("  -> NoSpace".into());
                self.check_write_prefix(vol, offset, data);
            }
            Err(e) => panic!("write failed: {e}\nops: {:#?}", self.log),
        }
    }

    fn run(&mut self, op: &Op) {
        self.log.push(format!("{op:?}"));
        match *op {
            Op::Write {
                vol,
                block,
                blocks,
                data,
            } => {
                let Some(vol) = self.pick(vol) else { return };
                let size = self.model[&vol].len() as u64;
                let offset = (block % (size / 512)) * 512;
                let len = (blocks * 512).min(size - offset);
                let bytes = generate(data, offset, len as usize, &self.patterns);
                self.log.push(format!("  -> volume {vol} {offset}+{len}"));
                self.write(vol, offset, &bytes);
            }
            Op::Fill { vol, seed } => {
                let Some(vol) = self.pick(vol) else { return };
                let size = self.model[&vol].len();
                let bytes = generate(Data::Noise(seed), 0, size, &self.patterns);
                self.log.push(format!("  -> volume {vol} 0+{size}"));
                self.write(vol, 0, &bytes);
            }
            Op::Unmap { vol, offset, len } | Op::Anchor { vol, offset, len } => {
                let Some(vol) = self.pick(vol) else { return };
                let size = self.model[&vol].len() as u64;
                let offset = offset % size;
                let len = len.min(size - offset);
                self.log.push(format!("  -> volume {vol} {offset}+{len}"));
                let done = if matches!(op, Op::Anchor { .. }) {
                    self.engine.anchor(vol, offset, len)
                } else {
                    self.engine.unmap(vol, offset, len)
                };
                match done {
                    Ok(()) => {
                        self.model.get_mut(&vol).unwrap()[offset as usize..(offset + len) as usize]
                            .fill(0);
                        self.compare(vol, offset, len as usize, "after unmap");
                    }
                    Err(EngineError::NoSpace) => {
                        self.log.push("  -> NoSpace".into());
                        self.check_chunkwise(vol, offset, &vec![0u8; len as usize]);
                    }
                    Err(e) => panic!("unmap failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Copy {
                src,
                dst,
                src_block,
                dst_block,
                same_alignment,
                blocks,
            } => {
                let (Some(src), Some(dst)) = (self.pick(src), self.pick(dst)) else {
                    return;
                };
                let src_size = self.model[&src].len() as u64;
                let dst_size = self.model[&dst].len() as u64;
                let len = (blocks * 512).min(src_size).min(dst_size);
                let src_offset = (src_block % ((src_size - len) / 512 + 1)) * 512;
                let mut dst_offset = (dst_block % ((dst_size - len) / 512 + 1)) * 512;
                if same_alignment {
                    let aligned = dst_offset / CS * CS + src_offset % CS;
                    if aligned + len <= dst_size {
                        dst_offset = aligned;
                    }
                }
                self.log.push(format!(
                    "  -> {src}@{src_offset} -> {dst}@{dst_offset} len {len}"
                ));
                let source =
                    self.model[&src][src_offset as usize..(src_offset + len) as usize].to_vec();
                match self.engine.copy(src, src_offset, dst, dst_offset, len) {
                    Ok(true) => {
                        self.model.get_mut(&dst).unwrap()
                            [dst_offset as usize..(dst_offset + len) as usize]
                            .copy_from_slice(&source);
                        self.compare(dst, dst_offset, len as usize, "after copy by reference");
                    }
                    Ok(false) => {
                        // What the Volume layer does: copy the data (whole source read first,
                        // so overlapping ranges behave like memmove).
                        self.log.push("  -> by data".into());
                        let data = self.read(src, src_offset, len as usize);
                        assert!(data == source, "copy source differs from the model");
                        self.write(dst, dst_offset, &data);
                    }
                    Err(EngineError::NoSpace) => {
                        self.log.push("  -> NoSpace".into());
                        self.check_chunkwise(dst, dst_offset, &source);
                    }
                    Err(e) => panic!("copy failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Create { chunks } => {
                if self.model.len() >= MAX_VOLUMES {
                    return;
                }
                match self.engine.create_volume(chunks * CS) {
                    Ok(id) => {
                        assert!(!self.model.contains_key(&id), "volume id {id} reused");
                        self.model.insert(id, vec![0; (chunks * CS) as usize]);
                        self.compare(id, 0, (chunks * CS) as usize, "new volume");
                    }
                    Err(EngineError::NoSpace) => self.log.push("  -> NoSpace".into()),
                    Err(e) => panic!("create failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Clone { vol } => {
                if self.model.len() >= MAX_VOLUMES {
                    return;
                }
                let Some(vol) = self.pick(vol) else { return };
                match self.engine.clone_volume(vol) {
                    Ok(id) => {
                        assert!(!self.model.contains_key(&id), "volume id {id} reused");
                        let copy = self.model[&vol].clone();
                        let len = copy.len();
                        self.model.insert(id, copy);
                        self.compare(id, 0, len, "clone");
                    }
                    Err(EngineError::NoSpace) => self.log.push("  -> NoSpace".into()),
                    Err(e) => panic!("clone failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Delete { vol } => {
                let Some(vol) = self.pick(vol) else { return };
                match self.engine.delete_volume(vol) {
                    Ok(()) => {
                        self.model.remove(&vol);
                        assert!(matches!(
                            self.engine.volume_size(vol),
                            Err(EngineError::NoSuchVolume(_))
                        ));
                    }
                    Err(EngineError::NoSpace) => self.log.push("  -> NoSpace".into()),
                    Err(e) => panic!("delete failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Resize { vol, chunks } => {
                let Some(vol) = self.pick(vol) else { return };
                match self.engine.resize_volume(vol, chunks * CS) {
                    Ok(()) => {
                        self.model
                            .get_mut(&vol)
                            .unwrap()
                            .resize((chunks * CS) as usize, 0);
                        assert_eq!(self.engine.volume_size(vol).unwrap(), chunks * CS);
                    }
                    Err(EngineError::NoSpace) => self.log.push("  -> NoSpace".into()),
                    Err(e) => panic!("resize failed: {e}\nops: {:#?}", self.log),
                }
            }
            Op::Gc { max_live } => match self.engine.collect_garbage(max_live) {
                Ok(_) | Err(EngineError::NoSpace) => {}
                Err(e) => panic!("collect_garbage failed: {e}\nops: {:#?}", self.log),
            },
            Op::Checkpoint => self
                .engine
                .checkpoint()
                .unwrap_or_else(|e| panic!("checkpoint failed: {e}\nops: {:#?}", self.log)),
            Op::Flush => self
                .engine
                .flush()
                .unwrap_or_else(|e| panic!("flush failed: {e}\nops: {:#?}", self.log)),
            Op::Restart => {
                self.engine
                    .shutdown()
                    .unwrap_or_else(|e| panic!("shutdown failed: {e}\nops: {:#?}", self.log));
                self.engine = Engine::open(self.backend.clone(), test_paced_tuning(), false)
                    .unwrap_or_else(|e| panic!("reopen failed: {e}\nops: {:#?}", self.log));
                self.compare_all("after restart");
            }
        }
        assert!(
            self.engine.poisoned().is_none(),
            "engine poisoned: {:?}\nops: {:#?}",
            self.engine.poisoned(),
            self.log
        );
    }
}

proptest! {
    #[test]
    fn engine_matches_a_simple_model(
        setup in setup_strategy(),
        ops in proptest::collection::vec(op_strategy(), 1..50),
    ) {
        let mut h = Harness::new(setup);
        h.log.push(format!("{setup:?}"));
        for op in &ops {
            h.run(op);
        }
        h.compare_all("at the end");
        h.run(&Op::Restart);
    }
}

/// A write batch that spans two map pages and moves a chunk from the first page to the
/// second: the chunk's only reference is dropped (page 1023) before the new one is taken
/// (page 1024) unless references are taken first for the whole batch.
#[test]
fn batch_moving_a_chunk_across_a_map_page_boundary() {
    let (backend, engine) = mem_engine(8 << 20, 512 << 10, test_paced_tuning());
    assert!(
        engine.atomic_write_limit() >= 2 * CS,
        "needs multi-chunk batches"
    );
    let v = engine.create_volume(2048 * CS).unwrap();
    let x = generate(Data::Noise(1), 0, CS as usize, &[]);
    let y = generate(Data::Noise(2), 0, CS as usize, &[]);
    engine.write(v, 1023 * CS, &x).unwrap();
    let mut both = y.clone();
    both.extend_from_slice(&x);
    engine.write(v, 1023 * CS, &both).unwrap();
    let mut back = vec![0u8; 2 * CS as usize];
    engine.read(v, 1023 * CS, &mut back).unwrap();
    assert!(back == both);
    assert!(engine.check(&mut |_, _| {}).is_empty());
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(backend, test_paced_tuning(), false).unwrap();
    engine.read(v, 1023 * CS, &mut back).unwrap();
    assert!(back == both);
    assert!(engine.check(&mut |_, _| {}).is_empty());
}

/// A full array must stay openable however often it restarts: each open used to seal the head
/// and take a fresh segment, which the next open could not collect, until none was left.
#[test]
fn restarts_of_a_full_array_never_run_out_of_segments() {
    let (backend, mut engine) = mem_engine(1 << 20, 64 << 10, test_paced_tuning());
    let v = engine.create_volume(400 * CS).unwrap();
    let mut model = vec![0u8; 400 * CS as usize];
    let mut full = false;
    for round in 0..40u64 {
        // New data until the array is full, then only small writes.
        let len = if full { 2 * CS } else { 64 * CS } as usize;
        let offset = if full {
            round * 7 % 300
        } else {
            round * 64 % 320
        } * CS;
        let data = generate(Data::Noise(2 * round + 1), offset, len, &[]);
        match engine.write(v, offset, &data) {
            Ok(()) => model[offset as usize..offset as usize + len].copy_from_slice(&data),
            Err(EngineError::NoSpace) => {
                full = true;
                let mut back = vec![0u8; len];
                engine.read(v, offset, &mut back).unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&back);
            }
            Err(e) => panic!("round {round}: {e}"),
        }
        for _ in 0..3 {
            engine.shutdown().unwrap();
            drop(engine);
            engine = Engine::open(backend.clone(), test_paced_tuning(), false)
                .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        }
        let mut back = vec![0u8; model.len()];
        engine.read(v, 0, &mut back).unwrap();
        assert!(back == model, "round {round}: content changed");
    }
    assert!(full, "the array never filled up");
    assert!(engine.check(&mut |_, _| {}).is_empty());
}
