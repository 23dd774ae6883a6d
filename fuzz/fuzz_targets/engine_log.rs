//! Engine log records (checksummed by the harness) applied to the metadata state machine,
//! then a checkpoint round trip.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_engine::fuzz_log(data);
});
