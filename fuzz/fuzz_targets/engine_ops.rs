//! Engine operation sequences (writes, unmaps, flushes, checkpoints, collections, failed
//! syncs, crashes) against a model of one small volume: a flushed write is never lost and a
//! read never returns what was not written.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_engine::fuzz_ops(data);
});
