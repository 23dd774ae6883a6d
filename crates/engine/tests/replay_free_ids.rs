//! Regressions found by the torture harness: chunk ids freed during log replay were left
//! on the free list more than once, so two new chunks could get the same id, which poisoned
//! the engine and kept the array from opening again.

use sliver_engine::test_data::mem_engine;
use sliver_engine::{Engine, MemBackend, Tuning};
use std::sync::Arc;

fn chunk(byte: u8) -> Vec<u8> {
    (0..4096u32)
        .map(|i| byte ^ (i as u8).wrapping_mul(31))
        .collect()
}

/// A volume created and flushed, then one chunk of it overwritten four times (ids 1, 2, 1, 2
/// ... each overwrite frees the previous id) and flushed, with no checkpoint since creation.
fn one_chunk_overwritten_four_times() -> (Arc<MemBackend>, Engine, u32) {
    let (backend, e) = mem_engine(64 << 20, 1 << 20, Tuning::default());
    let v = e.create_volume(1 << 20).unwrap();
    e.flush().unwrap();
    for b in 1..=4u8 {
        e.write(v, 0, &chunk(b)).unwrap();
    }
    e.flush().unwrap();
    (backend, e, v)
}

#[test]
fn regression_ids_freed_during_replay_are_handed_out_once() {
    let (backend, e, v) = one_chunk_overwritten_four_times();
    // Power failure (everything synced survives), no checkpoint since creation.
    let image = backend.crash(|_, n| vec![true; n]);
    drop(e);
    let e = Engine::open(Arc::new(image), Tuning::default(), false).unwrap();
    // One write of two new distinct chunks: both must get distinct ids.
    let mut two = chunk(10);
    two.extend_from_slice(&chunk(11));
    e.write(v, 8192, &two).unwrap();
    let mut back = vec![0u8; 8192];
    e.read(v, 8192, &mut back).unwrap();
    assert_eq!(back, two);
    assert!(e.check(&mut |_, _| {}).is_empty());
}

#[test]
fn regression_after_replay_new_chunks_keep_the_engine_openable() {
    let (backend, e, v) = one_chunk_overwritten_four_times();
    let image = Arc::new(backend.crash(|_, n| vec![true; n]));
    drop(e);
    let e = Engine::open(image.clone(), Tuning::default(), false).unwrap();
    let mut two = chunk(10);
    two.extend_from_slice(&chunk(11));
    e.write(v, 8192, &two).unwrap();
    let image2 = image.crash(|_, n| vec![true; n]);
    drop(e);
    let r = Engine::open(Arc::new(image2), Tuning::default(), false);
    assert!(r.is_ok());
}
