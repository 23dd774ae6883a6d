//! Crash tests: random operations with occasional flushes, power failures at random moments
//! (between operations, and in the middle of one: inside a multi-batch write, a garbage
//! collection's relocation, a checkpoint, recovery itself), keeping any subset of the unsynced
//! writes, torn at 512-byte sectors.
//!
//! After every crash the image is opened and each 512-byte block of every volume must read
//! either exactly its content as of the last flush that covered it, or one of the contents
//! written to it since (never garbage, never a mix within a block); `check()` must be clean;
//! then work continues on the recovered engine (more writes, collections, crashes).

mod common;

use common::{test_paced_tuning, Call, CrashPoints, CrashTap};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_engine::test_data::{mem_engine, xorshift64};
use sliver_engine::{Engine, EngineConfig, EngineError, LogDevice, MemBackend, Tuning};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const CS: u64 = 4096;
const BLOCK: usize = 512;

thread_local! {
    /// Crash cycles verified by the current test (each test runs on its own thread); of
    /// those, taken in the middle of an operation, of a collection, of a recovery; and
    /// operations refused for lack of space. Coverage guards: the fixed-seed test insists on
    /// each.
    static CRASHES: Cell<u64> = const { Cell::new(0) };
    static MID_OPERATION: Cell<u64> = const { Cell::new(0) };
    static MID_COLLECTION: Cell<u64> = const { Cell::new(0) };
    static MID_RECOVERY: Cell<u64> = const { Cell::new(0) };
    static NO_SPACE: Cell<u64> = const { Cell::new(0) };
}

fn count(counter: &'static std::thread::LocalKey<Cell<u64>>) {
    counter.with(|c| c.set(c.get() + 1));
}

/// Which unsynced writes a crash keeps: decided per crash, then per write and sector.
fn crash_image(backend: &MemBackend, rng: &mut StdRng) -> MemBackend {
    let mode = rng.gen_range(0..5);
    let pending = backend.pending_writes();
    let cut = rng.gen_range(0..=pending);
    let seed: u64 = rng.gen();
    let mut r = StdRng::seed_from_u64(seed);
    backend.crash(move |i, sectors| match mode {
        // Nothing of the unsynced writes.
        0 => vec![false; sectors],
        // Everything (as if the cache was flushed just in time).
        1 => vec![true; sectors],
        // Each write whole or not at all.
        2 => vec![r.gen_bool(0.5); sectors],
        // Each sector independently: torn writes.
        3 => (0..sectors).map(|_| r.gen_bool(0.5)).collect(),
        // The writes in order up to a point, the one at the point torn.
        _ => {
            if i < cut {
                vec![true; sectors]
            } else if i == cut {
                let keep = r.gen_range(0..=sectors);
                (0..sectors).map(|s| s < keep).collect()
            } else {
                vec![false; sectors]
            }
        }
    })
}

/// Crash points that take an image at the n-th call once armed.
#[derive(Default)]
struct Countdown {
    armed: Mutex<Option<(u32, StdRng)>>,
    image: Mutex<Option<MemBackend>>,
}

impl CrashPoints for Countdown {
    fn reached(&self, inner: &MemBackend, _: Call) {
        let mut armed = self.armed.lock().unwrap();
        if let Some((n, rng)) = armed.as_mut() {
            if *n == 0 {
                let image = crash_image(inner, rng);
                *self.image.lock().unwrap() = Some(image);
                *armed = None;
            } else {
                *n -= 1;
            }
        }
    }
}

/// A backend that can take a crash image at the n-th I/O call, in the middle of whatever the
/// engine is doing.
type Tap = CrashTap<Countdown>;

impl Tap {
    fn new(inner: MemBackend) -> Self {
        CrashTap {
            inner,
            points: Countdown::default(),
        }
    }

    fn arm(&self, after_calls: u32, seed: u64) {
        *self.points.armed.lock().unwrap() = Some((after_calls, StdRng::seed_from_u64(seed)));
    }

    /// Disarm; the image taken while armed, if the countdown ran out.
    fn disarm(&self) -> Option<MemBackend> {
        *self.points.armed.lock().unwrap() = None;
        self.points.image.lock().unwrap().take()
    }
}

fn block_hash(block: &[u8]) -> u64 {
    u64::from_le_bytes(blake3::hash(block).as_bytes()[..8].try_into().unwrap())
}

/// Content for a write at `offset`: zeros, one of a few chunk patterns (dedup), text
/// (compressible) or noise.
fn content(rng: &mut StdRng, offset: u64, len: usize) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0 => vec![0; len],
        1..=3 => {
            let p = rng.gen_range(0..3u64);
            let mut x = 0xC0FFEE + p * 1_000_003;
            let pattern: Vec<u8> = (0..CS).map(|_| xorshift64(&mut x) as u8).collect();
            (0..len as u64)
                .map(|i| pattern[((offset + i) % CS) as usize])
                .collect()
        }
        4..=5 => {
            let words: [&[u8]; 5] = [b"crash ", b"torn ", b"sector ", b"flush ", b"\n"];
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                out.extend_from_slice(words[rng.gen_range(0..5)]);
            }
            out.truncate(len);
            out
        }
        _ => {
            let mut x: u64 = rng.gen::<u64>() | 1;
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                out.extend_from_slice(&xorshift64(&mut x).to_le_bytes());
            }
            out.truncate(len);
            out
        }
    }
}

/// What a volume reads now, and what each of its blocks may read after a crash.
#[derive(Clone)]
struct Vol {
    cur: Vec<u8>,
    allowed: Vec<Vec<u64>>,
}

impl Vol {
    fn new(size: usize) -> Self {
        let zero = block_hash(&[0u8; BLOCK]);
        Vol {
            cur: vec![0; size],
            allowed: vec![vec![zero]; size / BLOCK],
        }
    }
    fn from_content(cur: Vec<u8>) -> Self {
        let allowed = cur.chunks(BLOCK).map(|b| vec![block_hash(b)]).collect();
        Vol { cur, allowed }
    }
    /// `data` may be (partly) written at `offset` from now on.
    fn may_write(&mut self, offset: usize, data: &[u8]) {
        debug_assert!(offset.is_multiple_of(BLOCK) && data.len().is_multiple_of(BLOCK));
        for (i, block) in data.chunks(BLOCK).enumerate() {
            let h = block_hash(block);
            let allowed = &mut self.allowed[offset / BLOCK + i];
            if !allowed.contains(&h) {
                allowed.push(h);
            }
        }
    }
    fn flushed(&mut self) {
        *self = Vol::from_content(std::mem::take(&mut self.cur));
    }
}

struct Session {
    rng: StdRng,
    tap: Arc<Tap>,
    engine: Engine,
    model: BTreeMap<u32, Vol>,
    tuning: Tuning,
    trace: Vec<String>,
    /// A crash image taken during the current operation, with the model it must satisfy.
    image: Option<(MemBackend, BTreeMap<u32, Vol>)>,
}

impl Session {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let segment_size = if rng.gen_bool(0.5) {
            64 << 10
        } else {
            128 << 10
        };
        let capacity = [1u64 << 20, 2 << 20, 3 << 20][rng.gen_range(0..3)];
        let tap = Arc::new(Tap::new(MemBackend::new(capacity)));
        let config = EngineConfig {
            chunk_size: CS as u32,
            segment_size,
        };
        let engine = Engine::create(tap.clone(), config, test_paced_tuning()).unwrap();
        let mut model = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=3) {
            let size = rng.gen_range(16..=256u64) * CS;
            let id = engine.create_volume(size).unwrap();
            model.insert(id, Vol::new(size as usize));
        }
        let trace = vec![format!(
            "seed {seed}: segments of {segment_size}, capacity {capacity}"
        )];
        Session {
            rng,
            tap,
            engine,
            model,
            tuning: test_paced_tuning(),
            trace,
            image: None,
        }
    }

    fn fail(&self, what: String) -> ! {
        let start = self.trace.len().saturating_sub(60);
        panic!(
            "{what}\nlast operations:\n{}",
            self.trace[start..].join("\n")
        );
    }

    fn pick(&mut self) -> u32 {
        let n = self.rng.gen_range(0..self.model.len());
        *self.model.keys().nth(n).unwrap()
    }

    /// Keep a crash image taken so far with the model as it stands (before a flush narrows it).
    fn barrier(&mut self) {
        if let Some(image) = self.tap.disarm() {
            if self.image.is_none() {
                self.image = Some((image, self.model.clone()));
            }
        }
    }

    fn flushed_all(&mut self) {
        self.barrier();
        for v in self.model.values_mut() {
            v.flushed();
        }
    }

    fn read(&self, engine: &Engine, vol: u32, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        if let Err(e) = engine.read(vol, offset, &mut buf) {
            self.fail(format!("read of volume {vol} {offset}+{len} failed: {e}"));
        }
        buf
    }

    /// After a failed data operation: each block reads something allowed; adopt it.
    fn adopt(&mut self, vol: u32, offset: usize, len: usize) {
        let got = self.read(&self.engine, vol, offset as u64, len);
        let v = &self.model[&vol];
        for (i, block) in got.chunks(BLOCK).enumerate() {
            let b = offset / BLOCK + i;
            if !v.allowed[b].contains(&block_hash(block)) {
                self.fail(format!(
                    "volume {vol} block {b} reads unexpected data after a failed operation"
                ));
            }
        }
        let v = self.model.get_mut(&vol).unwrap();
        v.cur[offset..offset + len].copy_from_slice(&got);
    }

    fn write(&mut self, vol: u32, offset: usize, data: &[u8]) {
        self.model.get_mut(&vol).unwrap().may_write(offset, data);
        match self.engine.write(vol, offset as u64, data) {
            Ok(()) => {
                self.model.get_mut(&vol).unwrap().cur[offset..offset + data.len()]
                    .copy_from_slice(data);
            }
            Err(EngineError::NoSpace) => {
                self.trace.push("  NoSpace".into());
                count(&NO_SPACE);
                self.adopt(vol, offset, data.len());
            }
            Err(e) => self.fail(format!("write failed: {e}")),
        }
    }

    /// One random operation. Crash images may be taken in the middle of it.
    fn step(&mut self, op: u32) {
        let vol = self.pick();
        let size = self.model[&vol].cur.len();
        let blocks = size / BLOCK;
        match op {
            0..=49 => {
                let first = self.rng.gen_range(0..blocks);
                let max = if self.rng.gen_bool(0.2) { 256 } else { 24 };
                let mut n = self.rng.gen_range(1..=max).min(blocks - first);
                if self.rng.gen_bool(0.12) {
                    // Rewrite the whole rest of the volume: fills the log.
                    n = blocks - first;
                }
                let offset = first * BLOCK;
                let data = content(&mut self.rng, offset as u64, n * BLOCK);
                self.trace
                    .push(format!("write {vol} {offset}+{}", data.len()));
                self.write(vol, offset, &data);
            }
            50..=59 => {
                let first = self.rng.gen_range(0..blocks);
                let n = self.rng.gen_range(1..=64).min(blocks - first);
                let (offset, len) = (first * BLOCK, n * BLOCK);
                self.trace.push(format!("unmap {vol} {offset}+{len}"));
                self.model
                    .get_mut(&vol)
                    .unwrap()
                    .may_write(offset, &vec![0; len]);
                match self.engine.unmap(vol, offset as u64, len as u64) {
                    Ok(()) => self.model.get_mut(&vol).unwrap().cur[offset..offset + len].fill(0),
                    Err(EngineError::NoSpace) => {
                        count(&NO_SPACE);
                        self.adopt(vol, offset, len)
                    }
                    Err(e) => self.fail(format!("unmap failed: {e}")),
                }
            }
            60..=67 => {
                let dst = self.pick();
                let dst_size = self.model[&dst].cur.len();
                let len = self.rng.gen_range(1..=64usize) * BLOCK;
                let len = len.min(size).min(dst_size);
                let src_offset = self.rng.gen_range(0..=(size - len) / BLOCK) * BLOCK;
                let mut dst_offset = self.rng.gen_range(0..=(dst_size - len) / BLOCK) * BLOCK;
                let aligned = dst_offset / CS as usize * CS as usize + src_offset % CS as usize;
                if self.rng.gen_bool(0.6) && aligned + len <= dst_size {
                    dst_offset = aligned;
                }
                self.trace.push(format!(
                    "copy {vol}@{src_offset} -> {dst}@{dst_offset} +{len}"
                ));
                let source = self.model[&vol].cur[src_offset..src_offset + len].to_vec();
                self.model
                    .get_mut(&dst)
                    .unwrap()
                    .may_write(dst_offset, &source);
                match self
                    .engine
                    .copy(vol, src_offset as u64, dst, dst_offset as u64, len as u64)
                {
                    Ok(true) => self.model.get_mut(&dst).unwrap().cur[dst_offset..dst_offset + len]
                        .copy_from_slice(&source),
                    Ok(false) => {
                        let data = self.read(&self.engine, vol, src_offset as u64, len);
                        if data != source {
                            self.fail("copy source differs from the model".into());
                        }
                        self.write(dst, dst_offset, &data);
                    }
                    Err(EngineError::NoSpace) => {
                        count(&NO_SPACE);
                        self.adopt(dst, dst_offset, len)
                    }
                    Err(e) => self.fail(format!("copy failed: {e}")),
                }
            }
            68..=76 => {
                let max_live = [0.0, 0.5, 0.9, 1.0][self.rng.gen_range(0..4)];
                self.trace.push(format!("collect_garbage({max_live})"));
                match self.engine.collect_garbage(max_live) {
                    Ok(_) | Err(EngineError::NoSpace) => {}
                    Err(e) => self.fail(format!("collect_garbage failed: {e}")),
                }
            }
            77..=84 => {
                self.trace.push("flush".into());
                if let Err(e) = self.engine.flush() {
                    self.fail(format!("flush failed: {e}"));
                }
                self.flushed_all();
            }
            85..=88 => {
                self.trace.push("checkpoint".into());
                if let Err(e) = self.engine.checkpoint() {
                    self.fail(format!("checkpoint failed: {e}"));
                }
                self.flushed_all();
            }
            // Volume operations are durable on return (and flush everything before them).
            89..=92 if self.model.len() < 4 => {
                self.trace.push(format!("clone {vol}"));
                match self.engine.clone_volume(vol) {
                    Ok(id) => {
                        let copy = self.model[&vol].clone();
                        self.model.insert(id, copy);
                        self.flushed_all();
                    }
                    Err(EngineError::NoSpace) => {}
                    Err(e) => self.fail(format!("clone failed: {e}")),
                }
            }
            93..=94 if self.model.len() > 1 => {
                self.trace.push(format!("delete {vol}"));
                match self.engine.delete_volume(vol) {
                    Ok(()) => {
                        self.model.remove(&vol);
                        self.flushed_all();
                    }
                    Err(EngineError::NoSpace) => {}
                    Err(e) => self.fail(format!("delete failed: {e}")),
                }
            }
            95..=96 => {
                let new = self.rng.gen_range(16..=256usize) * CS as usize;
                self.trace.push(format!("resize {vol} to {new}"));
                match self.engine.resize_volume(vol, new as u64) {
                    Ok(()) => {
                        let v = self.model.get_mut(&vol).unwrap();
                        v.cur.resize(new, 0);
                        self.flushed_all();
                    }
                    Err(EngineError::NoSpace) => {}
                    Err(e) => self.fail(format!("resize failed: {e}")),
                }
            }
            _ => {
                if self.model.len() < 4 {
                    let size = self.rng.gen_range(16..=128u64) * CS;
                    self.trace.push(format!("create {size}"));
                    match self.engine.create_volume(size) {
                        Ok(id) => {
                            self.model.insert(id, Vol::new(size as usize));
                            self.flushed_all();
                        }
                        Err(EngineError::NoSpace) => {}
                        Err(e) => self.fail(format!("create failed: {e}")),
                    }
                }
            }
        }
        self.barrier();
        if let Some(why) = self.engine.poisoned() {
            self.fail(format!("engine poisoned: {why}"));
        }
    }

    /// Open a crash image and verify it against the model; returns the engine and the model
    /// of what it holds (every block now durable). Recovery itself may be crashed and redone.
    fn recover(
        &mut self,
        image: MemBackend,
        model: &BTreeMap<u32, Vol>,
    ) -> (Arc<Tap>, Engine, BTreeMap<u32, Vol>) {
        count(&CRASHES);
        let mut tap = Arc::new(Tap::new(image));
        // Sometimes crash in the middle of recovery (its repair writes), and recover that.
        while self.rng.gen_bool(0.25) {
            tap.arm(self.rng.gen_range(0..6), self.rng.gen());
            let opened = Engine::open(tap.clone(), self.tuning, false);
            let image = tap.disarm();
            match (opened, image) {
                (Err(e), _) => self.fail(format!("recovery failed: {e}")),
                (Ok(_), Some(image)) => {
                    self.trace.push("  crash during recovery".into());
                    count(&CRASHES);
                    count(&MID_RECOVERY);
                    tap = Arc::new(Tap::new(image));
                }
                (Ok(_), None) => break,
            }
        }
        let engine = match Engine::open(tap.clone(), self.tuning, false) {
            Ok(e) => e,
            Err(e) => self.fail(format!("recovery failed: {e}")),
        };
        let volumes = engine.volumes();
        let expected: Vec<(u32, u64)> = model
            .iter()
            .map(|(id, v)| (*id, v.cur.len() as u64))
            .collect();
        if volumes != expected {
            self.fail(format!(
                "volumes after recovery {volumes:?}, expected {expected:?}"
            ));
        }
        let mut recovered = BTreeMap::new();
        for (&id, v) in model {
            let got = self.read(&engine, id, 0, v.cur.len());
            for (b, block) in got.chunks(BLOCK).enumerate() {
                if !v.allowed[b].contains(&block_hash(block)) {
                    self.fail(format!(
                        "after recovery volume {id} block {b} (byte {}) reads data that was \
                         neither flushed nor written since ({} candidates)",
                        b * BLOCK,
                        v.allowed[b].len()
                    ));
                }
            }
            recovered.insert(id, Vol::from_content(got));
        }
        let problems = engine.check(&mut |_, _| {});
        if !problems.is_empty() {
            self.fail(format!("check after recovery: {problems:?}"));
        }
        (tap, engine, recovered)
    }

    fn switch_to(&mut self, image: MemBackend, model: &BTreeMap<u32, Vol>, why: &str) {
        self.trace.push(format!("== crash ({why})"));
        let (tap, engine, model) = self.recover(image, model);
        self.tap = tap;
        self.engine = engine;
        self.model = model;
        // Crash again right after recovery, before anything new was flushed.
        if self.rng.gen_bool(0.2) {
            self.trace.push("== crash right after recovery".into());
            let image = crash_image(&self.tap.inner, &mut self.rng);
            let current = self.model.clone();
            let (tap, engine, model) = self.recover(image, &current);
            self.tap = tap;
            self.engine = engine;
            self.model = model;
        }
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            let op = self.rng.gen_range(0..100);
            // Not during volume operations: their outcome after a crash is either-or (they
            // are durable only once they return).
            if op < 89 && self.rng.gen_bool(0.15) {
                let calls = self.rng.gen_range(0..30);
                let seed = self.rng.gen();
                self.tap.arm(calls, seed);
            }
            self.step(op);
            if let Some((image, model)) = self.image.take() {
                // The model then already allowed everything the interrupted operation could
                // have written; whatever it completed afterwards is lost with the crash.
                count(&MID_OPERATION);
                if (68..=76).contains(&op) {
                    count(&MID_COLLECTION);
                }
                self.switch_to(image, &model, "during an operation");
            } else if self.rng.gen_bool(0.06) {
                self.crash_now("between operations");
            }
        }
        // A final crash of whatever is left, then a clean restart.
        self.crash_now("at the end");
        self.engine.shutdown().unwrap();
        let engine = Engine::open(self.tap.clone(), self.tuning, false).unwrap();
        for (&id, v) in &self.model {
            let got = self.read(&engine, id, 0, v.cur.len());
            assert!(got == v.cur, "volume {id} changed across a clean restart");
        }
        assert!(engine.check(&mut |_, _| {}).is_empty());
    }
}

#[test]
fn crash_sessions_with_fixed_seeds() {
    for seed in 0..40u64 {
        Session::new(seed).run(120);
    }
    let crashes = CRASHES.with(Cell::get);
    assert!(crashes >= 300, "only {crashes} crash cycles");
    for (what, n, min) in [
        ("in the middle of an operation", &MID_OPERATION, 50),
        ("in the middle of a collection", &MID_COLLECTION, 5),
        ("in the middle of recovery", &MID_RECOVERY, 20),
        ("NoSpace failures", &NO_SPACE, 5),
    ] {
        let n = n.with(Cell::get);
        assert!(n >= min, "only {n} crashes/events {what}");
    }
    eprintln!(
        "{crashes} crash cycles; mid-operation {}, mid-collection {}, mid-recovery {}, NoSpace {}",
        MID_OPERATION.with(Cell::get),
        MID_COLLECTION.with(Cell::get),
        MID_RECOVERY.with(Cell::get),
        NO_SPACE.with(Cell::get)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn crash_sessions_with_random_seeds(seed in any::<u64>()) {
        Session::new(seed).run(80);
    }
}

/// Lost writes from before a crash must never come back: after recovery the engine reuses
/// segments that may still hold records of the lost history.
#[test]
fn records_lost_in_a_crash_never_resurface() {
    for seed in 0..30u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (backend, engine) = mem_engine(4 << 20, 64 << 10, test_paced_tuning());
        let v = engine.create_volume(256 * CS).unwrap();
        let base = content(&mut rng, 0, 256 * CS as usize);
        engine.write(v, 0, &base).unwrap();
        engine.flush().unwrap();
        // Unflushed: several segments' worth of same-sized records.
        let mut x = seed | 1;
        for i in 0..64u64 {
            let chunk: Vec<u8> = (0..CS).map(|_| xorshift64(&mut x) as u8).collect();
            engine.write(v, (i % 256) * CS, &chunk).unwrap();
        }
        // The crash keeps the later segments' bytes but not the seal leading to them.
        let n = backend.pending_writes();
        let keep_from = rng.gen_range(2..n / 2);
        let image = backend.crash(|i, s| vec![i >= keep_from; s]);
        drop(engine);
        let image = Arc::new(image);
        let engine = Engine::open(image.clone(), test_paced_tuning(), false).unwrap();
        let mut now = vec![0u8; base.len()];
        engine.read(v, 0, &mut now).unwrap();
        // Fewer new writes of the same record sizes over the reused segments (so that lost
        // records remain after the new ones), then a restart.
        let again = rng.gen_range(4..40u64);
        for i in 0..again {
            let chunk: Vec<u8> = (0..CS).map(|_| xorshift64(&mut x) as u8).collect();
            engine.write(v, (i % 256) * CS, &chunk).unwrap();
            now[(i % 256) as usize * CS as usize..][..CS as usize].copy_from_slice(&chunk);
        }
        engine.flush().unwrap();
        if rng.gen_bool(0.5) {
            engine.shutdown().unwrap();
        }
        drop(engine);
        let engine = match Engine::open(image, test_paced_tuning(), false) {
            Ok(e) => e,
            Err(e) => panic!("seed {seed}: recovery failed: {e}"),
        };
        let mut back = vec![0u8; base.len()];
        engine.read(v, 0, &mut back).unwrap();
        assert!(back == now, "seed {seed}: lost records came back");
        assert!(engine.check(&mut |_, _| {}).is_empty(), "seed {seed}");
    }
}

#[test]
fn failed_fsync_poisons_writes_but_reads_and_recovery_work() {
    for seed in 0..8u64 {
        let mut s = Session::new(1000 + seed);
        s.run_steps_without_crashes(40);
        let vol = *s.model.keys().next().unwrap();
        let data = content(&mut s.rng, 0, 8192);
        s.write(vol, 0, &data);
        s.tap.inner.fail_next_sync();
        assert!(matches!(s.engine.flush(), Err(EngineError::Poisoned(_))));
        assert!(s.engine.poisoned().unwrap().contains("fsync"));
        assert!(matches!(
            s.engine.write(vol, 0, &data),
            Err(EngineError::Poisoned(_))
        ));
        assert!(matches!(
            s.engine.unmap(vol, 0, 4096),
            Err(EngineError::Poisoned(_))
        ));
        assert!(matches!(
            s.engine.create_volume(CS),
            Err(EngineError::Poisoned(_))
        ));
        assert!(matches!(
            s.engine.collect_garbage(1.0),
            Err(EngineError::Poisoned(_))
        ));
        assert!(matches!(
            s.engine.checkpoint(),
            Err(EngineError::Poisoned(_))
        ));
        assert!(matches!(s.engine.flush(), Err(EngineError::Poisoned(_))));
        // Reads still serve what was written.
        for (&id, v) in &s.model {
            let got = s.read(&s.engine, id, 0, v.cur.len());
            assert!(got == v.cur, "volume {id} reads differently once poisoned");
        }
        // Restart from what reached the disk: nothing flushed is lost.
        s.crash_now("after a failed fsync");
        s.run_steps_without_crashes(10);
        s.engine.flush().unwrap();
    }
}

impl Session {
    fn run_steps_without_crashes(&mut self, steps: usize) {
        for _ in 0..steps {
            let op = self.rng.gen_range(0..100);
            self.step(op);
        }
    }

    fn crash_now(&mut self, why: &str) {
        let image = crash_image(&self.tap.inner, &mut self.rng);
        let model = self.model.clone();
        self.switch_to(image, &model, why);
    }
}

#[test]
fn read_errors_are_reported_for_the_failing_chunks_only() {
    // Large segments: many chunks per batch, stored back to back and read in one go.
    let (backend, engine) = mem_engine(8 << 20, 1 << 20, test_paced_tuning());
    assert!(engine.atomic_write_limit() >= 8 * CS);
    let v = engine.create_volume(64 * CS).unwrap();
    let mut x = 77u64;
    let data: Vec<u8> = (0..16 * CS).map(|_| xorshift64(&mut x) as u8).collect();
    engine.write(v, 0, &data).unwrap();
    engine.flush().unwrap();
    // Find chunk 5's stored bytes in the log and make reads of them fail.
    let mut raw = vec![0u8; 8 << 20];
    backend.read_at(&mut raw, 0).unwrap();
    let needle = &data[5 * CS as usize..5 * CS as usize + 64];
    let at = raw.windows(64).position(|w| w == needle).unwrap() as u64;
    backend.fail_reads(at + 100, 1);
    let mut buf = vec![0u8; CS as usize];
    for c in 0..16u64 {
        match engine.read(v, c * CS, &mut buf) {
            Ok(()) => {
                assert_ne!(c, 5, "the failing chunk read fine");
                assert!(buf[..] == data[(c * CS) as usize..((c + 1) * CS) as usize]);
            }
            Err(EngineError::Corrupt { offset, .. }) => {
                assert_eq!((c, offset), (5, 5 * CS), "only chunk 5 fails")
            }
            Err(e) => panic!("chunk {c}: {e}"),
        }
    }
    // A large read covering good and bad chunks names the failing chunk.
    let mut all = vec![0u8; 16 * CS as usize];
    match engine.read(v, 0, &mut all) {
        Err(EngineError::Corrupt { offset, .. }) => assert_eq!(offset, 5 * CS),
        other => panic!("{other:?}"),
    }
    // Sub-chunk reads inside good chunks are unaffected.
    let mut small = vec![0u8; 1024];
    engine.read(v, 4 * CS + 512, &mut small).unwrap();
    assert!(small[..] == data[(4 * CS + 512) as usize..(4 * CS + 1536) as usize]);
    assert!(engine.poisoned().is_none(), "a read error does not poison");
    engine.write(v, 20 * CS, &data[..CS as usize]).unwrap();
    engine.flush().unwrap();
}
