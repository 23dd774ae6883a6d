//! Arbitrary bytes as the log a metadata page is read from: a value or a clear error naming
//! the page, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_engine::fuzz_page(data);
});
