//! Arbitrary bytes as an engine checkpoint: a clean error or a state, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A 256 MiB log: the bound the decoder puts on declared tables before allocating them.
    let _ = sliver_engine::legacy::checkpoint::decode(data, 256 << 20);
});
