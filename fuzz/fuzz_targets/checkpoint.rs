//! Arbitrary bytes as an engine checkpoint: a clean error or a state, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sliver_engine::legacy::checkpoint::decode(data);
});
