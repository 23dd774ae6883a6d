//! Arbitrary bytes as a login / text key=value data segment.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_iscsi::fuzz_text(data);
});
