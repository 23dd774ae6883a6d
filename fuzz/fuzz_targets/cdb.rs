//! Arbitrary CDB and Data-Out bytes executed against a small logical unit.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_scsi::fuzz_cdb(data);
});
