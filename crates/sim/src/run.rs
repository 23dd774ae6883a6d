//! One seeded run: random host operations on an engine over a [`SimDisk`], with faults,
//! power failures (between operations and in the middle of one) and restarts; after each,
//! every block must read what the [`Vol`] model allows, and `check()` must be clean.
//!
//! The engine runs on this thread only (no background threads are started), so the seed
//! alone decides every call the storage sees, and a failing seed replays exactly.

use crate::disk::{DiskRates, Lie, SimDisk};
use crate::model::{Vol, BLOCK};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_clock::{Clock, ManualClock};
use sliver_engine::meta::root::Root;
use sliver_engine::test_data::{noise, text, xorshift64};
use sliver_engine::{Engine, EngineConfig, EngineError, MemBackend, RootStore, Tuning};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CS: usize = 4096;

/// What a run did, for the test's summary and the long run's figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub steps: u64,
    /// Operations acknowledged, and flushes among them.
    pub acked: u64,
    pub flushes: u64,
    /// Operations that answered an error (after an injected fault).
    pub errors: u64,
    /// Of those, errors after which the engine went on unpoisoned (a failed read, a root
    /// store that left the old root, no space), its reads then checked against the model.
    pub carried_on: u64,
    /// Power failures (each recovered and verified), restarts of a poisoned engine among them.
    pub power_failures: u64,
    pub restarts: u64,
    /// Opens that failed on an injected fault and were tried again.
    pub failed_opens: u64,
    /// Faults the storage injected.
    pub injected: u64,
    /// Simulated time, in milliseconds.
    pub sim_ms: u64,
}

impl Outcome {
    /// Sum `other` into this one.
    pub fn add(&mut self, other: &Outcome) {
        self.steps += other.steps;
        self.acked += other.acked;
        self.flushes += other.flushes;
        self.errors += other.errors;
        self.carried_on += other.carried_on;
        self.power_failures += other.power_failures;
        self.restarts += other.restarts;
        self.failed_opens += other.failed_opens;
        self.injected += other.injected;
        self.sim_ms += other.sim_ms;
    }
}

struct Sim {
    seed: u64,
    rng: StdRng,
    clock: Arc<ManualClock>,
    /// The clock's reading at the start, for the run's simulated time.
    start: Instant,
    rates: DiskRates,
    tuning: Tuning,
    disk: Arc<SimDisk>,
    engine: Engine,
    model: BTreeMap<u32, Vol>,
    trace: Vec<String>,
    out: Outcome,
    /// The promise the storage breaks, if any (kept across restarts).
    lie: Option<Lie>,
}

/// Run `steps` operations from `seed`; `Err` names what broke, with the last operations.
pub fn run(seed: u64, steps: u64) -> Result<Outcome, String> {
    run_lying(seed, steps, None)
}

/// [`run`] on a storage that tells `lie` (the simulation's own tests: it must be caught).
pub fn run_lying(seed: u64, steps: u64, lie: Option<Lie>) -> Result<Outcome, String> {
    let mut sim = Sim::new(seed);
    sim.lie = lie;
    if let Some(lie) = lie {
        sim.disk.lie(lie);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        for _ in 0..steps {
            sim.step()?;
        }
        sim.finish()
    }));
    match outcome {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {what}"))
        }
    }
}

/// Content for a write: zeros, one of a few chunk patterns (dedup), text (compressible) or
/// noise.
fn content(rng: &mut StdRng, offset: usize, len: usize) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0 => vec![0; len],
        1..=3 => {
            let pattern = noise(0xC0FFEE + rng.gen_range(0..3u64) * 1_000_003, CS);
            (0..len).map(|i| pattern[(offset + i) % CS]).collect()
        }
        4..=5 => text(&["power ", "torn ", "seed ", "\n"], rng.gen(), len),
        _ => noise(rng.gen(), len),
    }
}

/// A new engine on `disk` whose fingerprint key comes from the seed: `Engine::create` draws
/// one from the system's randomness, and the key decides which metadata pages a chunk's
/// record lands in, so the calls the storage sees (and where faults fall) would differ from
/// one replay to the next. Made before any chunk exists, then the root rewritten with the
/// seeded key and opened again.
fn seeded_engine(disk: &Arc<SimDisk>, config: EngineConfig, tuning: Tuning, key: u64) -> Engine {
    drop(Engine::create(disk.clone(), config, tuning).expect("create without faults"));
    let bytes = disk.load_root().expect("a root").expect("a root");
    let mut root = Root::decode(&bytes).expect("the root just written");
    let mut x = key | 1;
    for k in root.geometry.key.chunks_mut(8) {
        k.copy_from_slice(&xorshift64(&mut x).to_le_bytes());
    }
    disk.store_root(&root.encode()).expect("no faults yet");
    Engine::open(disk.clone(), tuning, false).expect("open without faults")
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let clock = Arc::new(ManualClock::new());
        let rates = DiskRates::draw(&mut rng);
        let capacity = [1u64 << 20, 2 << 20, 3 << 20][rng.gen_range(0..3)];
        let segment_size = [64u32 << 10, 128 << 10][rng.gen_range(0..2)];
        let tuning = Tuning {
            checkpoint_bytes: [u64::MAX, 256 << 10][rng.gen_range(0..2)],
            metadata_journal: 4 << 10,
            // Fixed: the default depends on the machine's memory.
            metadata_cache: sliver_engine::MIN_METADATA_CACHE,
            ..Tuning::default()
        };
        let disk = Arc::new(SimDisk::new(
            MemBackend::new(capacity),
            rng.gen(),
            rates,
            clock.clone(),
        ));
        let config = EngineConfig {
            chunk_size: CS as u32,
            segment_size,
        };
        let engine = seeded_engine(&disk, config, tuning, rng.gen());
        engine.set_clock(clock.clone());
        let mut model = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=3) {
            let size = rng.gen_range(16..=160usize) * CS;
            let id = engine.create_volume(size as u64).expect("create a volume");
            model.insert(id, Vol::new(size));
        }
        let trace = vec![format!(
            "seed {seed}: capacity {capacity}, segments of {segment_size}, {rates:?}"
        )];
        disk.faults(true);
        Sim {
            seed,
            rng,
            start: clock.now(),
            clock,
            rates,
            tuning,
            disk,
            engine,
            model,
            trace,
            out: Outcome::default(),
            lie: None,
        }
    }

    fn fail<T>(&self, what: String) -> Result<T, String> {
        let start = self.trace.len().saturating_sub(40);
        Err(format!(
            "seed {}: {what}\nlast operations:\n{}",
            self.seed,
            self.trace[start..].join("\n")
        ))
    }

    fn pick(&mut self) -> u32 {
        let n = self.rng.gen_range(0..self.model.len());
        *self.model.keys().nth(n).expect("in range")
    }

    /// One operation, maybe with the power failing in its middle.
    fn step(&mut self) -> Result<(), String> {
        self.out.steps += 1;
        self.clock
            .advance(Duration::from_millis(self.rng.gen_range(0..50)));
        if self.rng.gen_bool(0.03) {
            let calls = self.rng.gen_range(0..24);
            self.trace.push(format!("  power fails in {calls} calls"));
            self.disk.power_fails_in(calls);
        }
        let injected = self.disk.injected();
        let vol = self.pick();
        let size = self.model[&vol].cur.len();
        let op = self.rng.gen_range(0..100);
        let (result, range) = match op {
            0..=54 => {
                let first = self.rng.gen_range(0..size / BLOCK);
                let max = if self.rng.gen_bool(0.2) { 256 } else { 24 };
                let mut n = self.rng.gen_range(1..=max).min(size / BLOCK - first);
                if self.rng.gen_bool(0.1) {
                    // The whole rest of the volume: fills the log, so space runs out.
                    n = size / BLOCK - first;
                }
                let (offset, len) = (first * BLOCK, n * BLOCK);
                let data = content(&mut self.rng, offset, len);
                self.trace.push(format!("write {vol} {offset}+{len}"));
                self.model.get_mut(&vol).unwrap().may_write(offset, &data);
                let r = self.engine.write(vol, offset as u64, &data);
                if r.is_ok() {
                    self.model.get_mut(&vol).unwrap().wrote(offset, &data);
                }
                (r, Some((offset, len)))
            }
            55..=64 => {
                let first = self.rng.gen_range(0..size / BLOCK);
                let n = self.rng.gen_range(1..=64).min(size / BLOCK - first);
                let (offset, len) = (first * BLOCK, n * BLOCK);
                self.trace.push(format!("unmap {vol} {offset}+{len}"));
                let zeros = vec![0; len];
                self.model.get_mut(&vol).unwrap().may_write(offset, &zeros);
                let r = self.engine.unmap(vol, offset as u64, len as u64);
                if r.is_ok() {
                    self.model.get_mut(&vol).unwrap().wrote(offset, &zeros);
                }
                (r, Some((offset, len)))
            }
            65..=73 => {
                let max_live = [0.0, 0.5, 0.9, 1.0][self.rng.gen_range(0..4)];
                self.trace.push(format!("collect_garbage({max_live})"));
                (self.engine.collect_garbage(max_live).map(|_| ()), None)
            }
            74..=86 => {
                self.trace.push("flush".into());
                let r = self.engine.flush();
                if r.is_ok() {
                    self.out.flushes += 1;
                    self.model.values_mut().for_each(Vol::flushed);
                }
                (r, None)
            }
            87..=90 => {
                self.trace.push("checkpoint".into());
                let r = self.engine.checkpoint();
                if r.is_ok() {
                    self.model.values_mut().for_each(Vol::flushed);
                }
                (r, None)
            }
            91..=96 => return self.verify_live(vol),
            _ => {
                self.trace.push("power failure".into());
                let image = self.disk.power_off();
                return self.recover(image);
            }
        };
        self.answered(result, injected, vol, range)
    }

    /// After an operation answered `result`: an error must follow an injected fault; after
    /// one, the engine either refuses writes (poisoned: restarted) or reads what the model
    /// allows.
    fn answered(
        &mut self,
        result: Result<(), EngineError>,
        injected: u64,
        vol: u32,
        range: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let e = match result {
            Ok(()) => {
                self.out.acked += 1;
                return Ok(());
            }
            Err(e) => e,
        };
        self.out.errors += 1;
        self.trace.push(format!("  -> {e}"));
        let no_space = matches!(e, EngineError::NoSpace);
        if !no_space && self.disk.injected() == injected && self.engine.poisoned().is_none() {
            return self.fail(format!("an error no fault explains: {e}"));
        }
        if self.disk.powered_off() {
            let image = self.disk.power_off();
            return self.recover(image);
        }
        if self.engine.poisoned().is_some() {
            return self.restart_poisoned();
        }
        // Not poisoned: the engine goes on, and what it reads now is what it holds.
        self.out.carried_on += 1;
        if let Some((offset, len)) = range {
            self.adopt(vol, offset, len)?;
        }
        Ok(())
    }

    /// Read `vol`'s `offset..+len` with faults off; each block must be allowed; the model takes
    /// what it reads as the volume's current content.
    fn adopt(&mut self, vol: u32, offset: usize, len: usize) -> Result<(), String> {
        self.disk.faults(false);
        let mut got = vec![0; len];
        let r = self.engine.read(vol, offset as u64, &mut got);
        self.disk.faults(true);
        if let Err(e) = r {
            return self.fail(format!("read after a failed operation: {e}"));
        }
        if let Some(b) = self.model[&vol].disallowed(offset, &got) {
            return self.fail(format!(
                "after a failed operation volume {vol} block {b} reads data never written there"
            ));
        }
        self.model.get_mut(&vol).unwrap().cur[offset..offset + len].copy_from_slice(&got);
        Ok(())
    }

    /// A live read of the whole of `vol` must be exactly what the model says it reads now.
    fn verify_live(&mut self, vol: u32) -> Result<(), String> {
        self.trace.push(format!("verify {vol}"));
        let injected = self.disk.injected();
        let mut got = vec![0; self.model[&vol].cur.len()];
        match self.engine.read(vol, 0, &mut got) {
            Ok(()) if got == self.model[&vol].cur => Ok(()),
            Ok(()) => {
                let b = (0..got.len() / BLOCK)
                    .find(|b| {
                        got[b * BLOCK..(b + 1) * BLOCK]
                            != self.model[&vol].cur[b * BLOCK..(b + 1) * BLOCK]
                    })
                    .unwrap_or(0);
                self.fail(format!(
                    "volume {vol} block {b} reads other data than written"
                ))
            }
            Err(e) => self.answered(Err(e), injected, vol, None),
        }
    }

    /// A poisoned engine must refuse writes; then the process restarts (as after a power
    /// failure: what was not synced may or may not be there).
    fn restart_poisoned(&mut self) -> Result<(), String> {
        let vol = self.pick();
        if self.engine.write(vol, 0, &[0; BLOCK]).is_ok() {
            return self.fail("a poisoned engine acknowledged a write".into());
        }
        self.out.restarts += 1;
        self.trace.push("  restart".into());
        let image = self.disk.power_off();
        self.recover(image)
    }

    /// Open the image a power failure left (the open itself may meet faults, power failures
    /// included, and is then tried again), verify it against the model and go on with it.
    fn recover(&mut self, mut image: MemBackend) -> Result<(), String> {
        self.out.power_failures += 1;
        self.out.injected += self.disk.injected();
        let mut tries = 0;
        let engine = loop {
            let disk = Arc::new(SimDisk::new(
                image,
                self.rng.gen(),
                self.rates,
                self.clock.clone(),
            ));
            if let Some(lie) = self.lie {
                disk.lie(lie);
            }
            // Faults during the first opens; the last tries without, so a run goes on.
            tries += 1;
            disk.faults(tries < 4);
            if tries < 4 && self.rng.gen_bool(0.3) {
                disk.power_fails_in(self.rng.gen_range(0..12));
            }
            let opened = Engine::open(disk.clone(), self.tuning, false);
            match opened {
                Ok(engine) if !disk.powered_off() && engine.poisoned().is_none() => {
                    self.disk = disk;
                    break engine;
                }
                Err(e) if disk.injected() == 0 => {
                    return self.fail(format!("recovery failed with no fault injected: {e}"))
                }
                _ => {
                    self.out.failed_opens += 1;
                    self.out.injected += disk.injected();
                    self.trace.push("  open failed on a fault; again".into());
                    image = disk.power_off();
                }
            }
        };
        engine.set_clock(self.clock.clone());
        self.engine = engine;
        self.disk.faults(false);
        let r = self.verify_recovered();
        self.disk.faults(true);
        r
    }

    /// Every volume is there, every block reads what the model allows, `check()` is clean; the
    /// model then takes what the engine holds as durable.
    fn verify_recovered(&mut self) -> Result<(), String> {
        let volumes = self.engine.volumes();
        let expected: Vec<(u32, u64)> = self
            .model
            .iter()
            .map(|(id, v)| (*id, v.cur.len() as u64))
            .collect();
        if volumes != expected {
            return self.fail(format!(
                "volumes after recovery {volumes:?}, expected {expected:?}"
            ));
        }
        let ids: Vec<u32> = self.model.keys().copied().collect();
        for id in ids {
            let mut got = vec![0; self.model[&id].cur.len()];
            if let Err(e) = self.engine.read(id, 0, &mut got) {
                return self.fail(format!("read after recovery: {e}"));
            }
            if let Some(b) = self.model[&id].disallowed(0, &got) {
                return self.fail(format!(
                    "after recovery volume {id} block {b} reads data that was neither flushed \
                     nor written since"
                ));
            }
            self.model.insert(id, Vol::from_content(got));
        }
        let problems = self.engine.check(&mut |_, _| {});
        if !problems.is_empty() {
            return self.fail(format!("check after recovery: {problems:?}"));
        }
        Ok(())
    }

    /// The end of a run: one more power failure, recovered and verified without faults.
    fn finish(mut self) -> Result<Outcome, String> {
        self.trace.push("final power failure".into());
        self.rates = DiskRates::NONE;
        let image = self.disk.power_off();
        self.recover(image)?;
        self.out.sim_ms = (self.clock.now() - self.start).as_millis() as u64;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_runs_the_same_twice() {
        for seed in [7, 8, 9] {
            let a = run(seed, 150).unwrap();
            let b = run(seed, 150).unwrap();
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "seed {seed}");
        }
    }

    /// The first of `seeds` on which the simulation catches `lie`, with what it said.
    fn caught(lie: Lie, seeds: std::ops::Range<u64>) -> Option<(u64, String)> {
        seeds
            .into_iter()
            .find_map(|seed| run_lying(seed, 300, Some(lie)).err().map(|e| (seed, e)))
    }

    // A failed sync hidden loses acknowledged writes: found when the image a power failure
    // leaves is opened and read (missing blocks, records or metadata pages found damaged).
    #[test]
    fn a_storage_that_hides_a_failed_sync_is_caught() {
        let (seed, e) = caught(Lie::HiddenSyncFailure, 0..40).expect("caught within 40 seeds");
        assert!(e.starts_with(&format!("seed {seed}: ")), "{e}");
        assert!(e.contains("recovery"), "{e}");
    }

    #[test]
    fn a_storage_that_drops_writes_is_caught() {
        let (seed, e) = caught(Lie::DroppedWrite, 0..40).expect("caught within 40 seeds");
        assert!(e.starts_with(&format!("seed {seed}: ")), "{e}");
    }
}
