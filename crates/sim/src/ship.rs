//! Shipping and restore under store faults: an engine tapped by a [`ShipTap`] copies its
//! writes to a [`FaultyStore`] that fails requests, loses answers, loses its connection for
//! stretches of simulated time and reorders concurrent answers; restore points are taken at
//! seeded moments, each then restored (through the faulty store) into a fresh directory. A
//! restore either fails with an error or gives exactly the volume as it was when its point
//! was asked for; once the faults stop, every point must restore exactly.
//!
//! Not exactly replayable yet: the shipper runs on its own threads with real-time waits
//! (RFC 0005 step 13's "loops as steps" is left), so how writes fall into objects varies from
//! run to run. The seed still decides the writes, the points, the faults' rates and which
//! restore requests fail; a failure names its seed.

use crate::store::{FaultyStore, MemStore, StoreRates};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_clock::ManualClock;
use sliver_engine::test_data::noise;
use sliver_engine::{Engine, EngineConfig, FileBackend, Tuning};
use sliver_replica::restore::{restore, Mode, Target};
use sliver_replica::ship::{ShipConfig, ShipState, ShipTap, Shipper, MIN_BACKLOG};
use sliver_replica::store::ObjectStore;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAPACITY: u64 = 16 << 20;
const VOLUME: usize = 2 << 20;

/// What a shipping run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShipOutcome {
    pub writes: u64,
    pub points: u64,
    /// Points refused (the store failed meanwhile).
    pub points_refused: u64,
    pub restores: u64,
    /// Restores that failed on a store fault (each then redone without faults).
    pub restores_failed: u64,
    pub injected: u64,
}

impl ShipOutcome {
    /// Sum `other` into this one.
    pub fn add(&mut self, other: &ShipOutcome) {
        self.writes += other.writes;
        self.points += other.points;
        self.points_refused += other.points_refused;
        self.restores += other.restores;
        self.restores_failed += other.restores_failed;
        self.injected += other.injected;
    }
}

/// Longest real time the run waits for the shipper (a hang, not a threshold: a healthy
/// shipper answers in milliseconds).
const HANG: Duration = Duration::from_secs(120);

/// One shipping run of `ops` operations from `seed` in a directory of its own under `scratch`.
pub fn run_shipping(seed: u64, ops: u64, scratch: &Path) -> Result<ShipOutcome, String> {
    let fail = |what: String| Err(format!("shipping seed {seed}: {what}"));
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(FaultyStore::new(
        Arc::new(MemStore::default()),
        rng.gen(),
        clock.clone(),
    ));
    let ship_rates = StoreRates::draw(&mut rng);
    let restore_rates = StoreRates::draw(&mut rng);
    let array = scratch.join(format!("array-{seed}"));
    std::fs::create_dir_all(&array).map_err(|e| e.to_string())?;
    let fb = FileBackend::open(&array, CAPACITY).map_err(|e| e.to_string())?;
    let config = ShipConfig {
        cut_interval: Duration::from_millis(20),
        max_backlog: MIN_BACKLOG,
        points_every: Duration::ZERO,
        ..ShipConfig::default()
    };
    let shared: Arc<dyn ObjectStore> = store.clone();
    let (tap, shipper) = match ShipTap::start(&array, fb, shared, config, None) {
        Ok(s) => s,
        Err(e) => return fail(format!("start: {e}")),
    };
    store.set_rates(ship_rates);
    let engine_config = EngineConfig {
        chunk_size: 4096,
        segment_size: 1 << 20,
    };
    let engine = match Engine::create(Arc::new(tap).devices(), engine_config, Tuning::default()) {
        Ok(e) => e,
        Err(e) => return fail(format!("create: {e}")),
    };
    let vol = engine
        .create_volume(VOLUME as u64)
        .map_err(|e| e.to_string())?;
    let mut model = vec![0u8; VOLUME];
    let mut points: Vec<(String, Vec<u8>)> = Vec::new();
    let mut out = ShipOutcome::default();
    for op in 0..ops {
        clock.advance(Duration::from_millis(rng.gen_range(0..200)));
        match rng.gen_range(0..100) {
            0..=79 => {
                let len = rng.gen_range(1..=16usize) * 4096;
                let at = rng.gen_range(0..=(VOLUME - len) / 512) * 512;
                let data = noise(rng.gen(), len);
                if let Err(e) = engine.write(vol, at as u64, &data) {
                    return fail(format!("write: {e}"));
                }
                model[at..at + len].copy_from_slice(&data);
                out.writes += 1;
            }
            80..=87 => {
                if let Err(e) = engine.flush() {
                    return fail(format!("flush: {e}"));
                }
            }
            88..=92 => store.lose_connection(Duration::from_secs(rng.gen_range(1..30))),
            _ => {
                let name = format!("p{op}");
                let before = store.injected();
                match point(&shipper, &name, &clock) {
                    Ok(()) => {
                        points.push((name, model.clone()));
                        out.points += 1;
                    }
                    Err(_) if store.injected() > before => out.points_refused += 1,
                    Err(e) => return fail(format!("point {name}: {e}")),
                }
            }
        }
    }
    if let Err(e) = engine.flush() {
        return fail(format!("flush: {e}"));
    }
    if let Err(e) = point(&shipper, "last", &clock) {
        return fail(format!("the last point: {e}"));
    }
    points.push(("last".into(), model.clone()));
    out.points += 1;
    for (i, (name, expected)) in points.iter().enumerate() {
        let dir = scratch.join(format!("restore-{seed}-{i}"));
        store.set_rates(restore_rates);
        store.lose_connection(Duration::ZERO);
        out.restores += 1;
        let target = Target::Point(name.clone());
        let shared: Arc<dyn ObjectStore> = store.clone();
        let before = store.injected();
        let first = restore(&shared, &dir, None, &target, &Mode::Whole);
        let dir = match first {
            Ok(_) => dir,
            // Only a fault injected during this restore explains its failure.
            Err(_) if store.injected() > before => {
                out.restores_failed += 1;
                store.set_rates(StoreRates::NONE);
                let again = scratch.join(format!("restore-{seed}-{i}-again"));
                if let Err(e) = restore(&shared, &again, None, &target, &Mode::Whole) {
                    return fail(format!("restore of {name} without faults: {e}"));
                }
                again
            }
            Err(e) => return fail(format!("restore of {name} with no fault injected: {e}")),
        };
        match read_back(&dir) {
            Ok(got) if got == *expected => {}
            Ok(_) => return fail(format!("point {name} restores other data than it held")),
            Err(e) => return fail(format!("restored point {name}: {e}")),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    out.injected = store.injected();
    store.set_rates(StoreRates::NONE);
    // Faults make the shipper wait and retry, never give up: fenced or broken is a bug.
    let state = shipper.status().state;
    if matches!(state, ShipState::Fenced(_) | ShipState::Broken(_)) {
        return fail(format!("the shipper ended {state:?}"));
    }
    if let Err(e) = engine.shutdown() {
        return fail(format!("shutdown: {e}"));
    }
    drop(engine);
    shipper.stop(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&array);
    Ok(out)
}

/// Take the point `name` and wait for its answer, moving the simulated clock meanwhile (so
/// that a lost connection comes back).
fn point(shipper: &Shipper, name: &str, clock: &ManualClock) -> Result<(), String> {
    let rx = shipper.take_point(name)?;
    let end = Instant::now() + HANG;
    loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(r) => return r.map(|_| ()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                clock.advance(Duration::from_secs(1));
                if Instant::now() > end {
                    return Err(format!(
                        "no answer for point {name}: {:?}",
                        shipper.status()
                    ));
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The restored array's one volume.
fn read_back(dir: &Path) -> Result<Vec<u8>, String> {
    let fb = FileBackend::open(dir, CAPACITY).map_err(|e| e.to_string())?;
    let engine = Engine::open(Arc::new(fb), Tuning::default(), false).map_err(|e| e.to_string())?;
    let (v, size) = engine.volumes()[0];
    let mut back = vec![0u8; size as usize];
    engine.read(v, 0, &mut back).map_err(|e| e.to_string())?;
    Ok(back)
}
