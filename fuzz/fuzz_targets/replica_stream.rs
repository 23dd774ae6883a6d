//! Arbitrary bytes as the body of a `stream/<n>` object (RFC 0003, "Revision: shipping the
//! backend's writes" and "Hydration on demand"), in both layouts: records decode or end in one
//! error, never a panic or a huge allocation. Interleaved records that decode encode back to
//! exactly the bytes they came from; an indexed body's records survive being indexed again.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sliver_replica::stream::{index, records, Record};

fuzz_target!(|data: &[u8]| {
    let mut again = Vec::new();
    let mut failed = false;
    for r in records(data, 0) {
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
    // The same bytes as an indexed body, the table's length taken from the first four.
    if data.len() >= 4 {
        let body = &data[4..];
        let table_len = u32::from_le_bytes(data[..4].try_into().unwrap()) % (body.len() as u32 + 1);
        let decoded: Result<Vec<Record>, _> = records(body, table_len).collect();
        if let Ok(decoded) = decoded {
            let mut interleaved = Vec::new();
            for r in &decoded {
                r.encode(&mut interleaved);
            }
            let (indexed, len) = index(&interleaved).expect("our own encoding indexes");
            let back: Vec<Record> = records(&indexed, len).map(|r| r.unwrap()).collect();
            assert_eq!(back, decoded);
        }
    }
});
