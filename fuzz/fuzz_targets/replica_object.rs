//! Arbitrary bytes as an object fetched from the store, and as an object's name: the header
//! and body are refused with a clear error or decoded, never a panic; whatever decodes encodes
//! back to the same bytes, and whatever name parses prints back to the same name. The body is
//! also tried as the catalog's restore point, base index entry and pin (the same rules).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sliver_replica::catalog::{BaseEntry, Pin, Point};
use sliver_replica::object::{decode, decode_header, encode_indexed, Expected, ObjectName};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = decode_header("fuzz", data) {
        let expected = Expected {
            array: h.array,
            kind: h.kind,
            number: h.number,
        };
        if let Ok((h, body)) = decode("fuzz", data, &expected) {
            assert_eq!(
                encode_indexed(h.kind, h.array, h.epoch, h.number, body, h.table_len),
                data
            );
            if let Ok(p) = Point::decode(h.number, body) {
                assert_eq!(p.encode(), body);
            }
            if let Ok(b) = BaseEntry::decode(body) {
                assert_eq!(b.encode(), body);
            }
            if let Ok(p) = Pin::decode(h.number, body) {
                assert_eq!(p.encode(), body);
            }
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(name) = ObjectName::parse(s) {
            assert_eq!(name.to_string(), s);
        }
    }
});
