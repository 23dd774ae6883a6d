//! Arbitrary bytes as the TCP stream of one iSCSI connection: login, then full feature phase.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sliver_iscsi::fuzz_receive(data);
});
