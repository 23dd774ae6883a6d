//! What the engine's own unit tests, its integration tests and its examples share: engines on
//! the in-memory backend, and deterministic pseudo-random data (a fixture's expected content
//! is regenerated from the same seeds, so there is one generator for all of them).

use crate::backend::MemBackend;
use crate::engine::{Engine, EngineConfig, Tuning};
use std::sync::Arc;

/// An engine of 4 KiB chunks and segments of `segment_size` on a fresh in-memory backend of
/// `capacity` bytes (returned too, to crash or restart it).
pub fn mem_engine(capacity: u64, segment_size: u32, tuning: Tuning) -> (Arc<MemBackend>, Engine) {
    let backend = Arc::new(MemBackend::new(capacity));
    let config = EngineConfig {
        chunk_size: 4096,
        segment_size,
    };
    let engine = Engine::create(backend.clone(), config, tuning).unwrap();
    (backend, engine)
}

/// One step of xorshift64 on `x` (which must not be zero): the new state, also the next value.
pub fn xorshift64(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `len` bytes of text-like, compressible data, different per `seed`: the seed in hex, then
/// `words` picked by xorshift64 (at least one word).
pub fn text(words: &[&str], seed: u64, len: usize) -> Vec<u8> {
    assert!(!words.is_empty(), "text needs words to pick from");
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = format!("{seed:016x}").into_bytes();
    while out.len() < len {
        let word = xorshift64(&mut x) % words.len() as u64;
        out.extend_from_slice(words[word as usize].as_bytes());
    }
    out.truncate(len);
    out
}

/// `len` incompressible bytes, different per `seed`: the low byte of each xorshift64 step.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len).map(|_| xorshift64(&mut x) as u8).collect()
}
