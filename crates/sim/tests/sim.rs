//! The deterministic simulation's seeds (see `sliver_sim` and docs/reliability.md,
//! "Deterministic simulation"). CI runs a bounded number of seeds; the environment replays one
//! or runs many:
//!
//! - `SLIVER_SIM_SEED=<n>`: run seed `n` alone (what a failure's message says to do);
//! - `SLIVER_SIM_SEEDS=<count>`, `SLIVER_SIM_FIRST=<n>`: run `count` seeds from `n`;
//! - `SLIVER_SIM_STEPS=<n>`: operations per seed.

use std::time::Instant;

/// Seeds and steps per seed in CI: a few seconds in a debug build.
const CI_SEEDS: u64 = 24;
const CI_STEPS: u64 = 300;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

#[test]
fn simulation_seeds() {
    let steps = env("SLIVER_SIM_STEPS").unwrap_or(CI_STEPS);
    let seeds = match env("SLIVER_SIM_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let first = env("SLIVER_SIM_FIRST").unwrap_or(0);
            first..first + env("SLIVER_SIM_SEEDS").unwrap_or(CI_SEEDS)
        }
    };
    let started = Instant::now();
    let mut total = sliver_sim::Outcome::default();
    let mut failures = Vec::new();
    for seed in seeds.clone() {
        match sliver_sim::run(seed, steps) {
            Ok(o) => total.add(&o),
            Err(e) => {
                eprintln!("{e}\nreplay: SLIVER_SIM_SEED={seed} SLIVER_SIM_STEPS={steps} cargo test -p sliver-sim --test sim\n");
                failures.push(seed);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation: {} seeds from {} in {secs:.1} s ({:.1} seeds/s), {} failed; {total:?}",
        seeds.end - seeds.start,
        seeds.start,
        (seeds.end - seeds.start) as f64 / secs,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "simulation seeds {failures:?} failed (messages above); replay one with SLIVER_SIM_SEED=<seed> SLIVER_SIM_STEPS={steps} cargo test -p sliver-sim --test sim"
    );
    // Coverage guards: a run of this size that never lost power, never saw an error, never
    // went on after one (no space) or never had a flush acknowledged has stopped testing what
    // it is for.
    if seeds.end - seeds.start >= CI_SEEDS && steps >= CI_STEPS {
        assert!(total.power_failures > seeds.end - seeds.start, "{total:?}");
        assert!(
            total.errors > 0 && total.restarts > 0 && total.flushes > 0,
            "{total:?}"
        );
        assert!(total.carried_on > 0, "{total:?}");
    }
}

/// Shipping seeds in CI: each runs the shipper's threads and a restore per point (about a
/// second each).
const CI_SHIP_SEEDS: u64 = 4;
const CI_SHIP_OPS: u64 = 120;

/// Shipping and restore under store faults (`sliver_sim::ship`); `SLIVER_SIM_SHIP_SEED=<n>`
/// runs seed `n` alone, `SLIVER_SIM_SHIP_SEEDS=<count>` runs `count` seeds.
#[test]
fn shipping_seeds() {
    let seeds = match env("SLIVER_SIM_SHIP_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..env("SLIVER_SIM_SHIP_SEEDS").unwrap_or(CI_SHIP_SEEDS),
    };
    let scratch = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut total = sliver_sim::ShipOutcome::default();
    for seed in seeds.clone() {
        match sliver_sim::run_shipping(seed, CI_SHIP_OPS, scratch.path()) {
            Ok(o) => total.add(&o),
            Err(e) => {
                eprintln!("{e}\nreplay: SLIVER_SIM_SHIP_SEED={seed} cargo test -p sliver-sim --test sim shipping\n");
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "shipping simulation: {} seeds in {:.1} s, {} failed; {total:?}",
        seeds.end - seeds.start,
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "shipping seeds {failures:?} failed (messages above)"
    );
    assert!(total.points > 0 && total.restores > 0, "{total:?}");
    if env("SLIVER_SIM_SHIP_SEED").is_none() {
        // Coverage: faults were injected and some point or restore met one (about half of
        // the restores fail on a fault and are retried without; a run where none did would
        // not be testing the store's faults at all).
        assert!(
            total.injected > 0 && total.points_refused + total.restores_failed > 0,
            "no point or restore met a fault: {total:?}"
        );
    }
}
