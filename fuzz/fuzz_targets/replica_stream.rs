//! Arbitrary bytes as the body of a `stream/<n>` object (RFC 0003, "Revision: shipping the
//! backend's writes"): records decode or end in one error, never a panic or a huge allocation,
//! and the records that decode encode back to exactly the bytes they came from.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sliver_replica::stream::records;

fuzz_target!(|data: &[u8]| {
    let mut again = Vec::new();
    let mut failed = false;
    for r in records(data) {
        match r {
            Ok(rec) => {
                assert!(!failed, "a record after an error");
                rec.encode(&mut again);
            }
            Err(_) => failed = true,
        }
    }
    assert_eq!(&data[..again.len()], &again[..]);
    if !failed {
        assert_eq!(again.len(), data.len());
    }
});
