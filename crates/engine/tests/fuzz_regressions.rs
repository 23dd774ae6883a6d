//! Inputs the fuzzers found, kept as regression tests.

#[test]
fn clone_copy_resize_delete_keeps_a_checkpointable_state() {
    sliver_engine::fuzz_log(include_bytes!("fuzz/clone_copy_resize_delete.bin"));
}
