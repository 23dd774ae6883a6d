//! Arbitrary bytes as a restored array's hydration map and journal (RFC 0003, "Hydration on
//! demand"): the map is refused with a clear error or decoded, never a panic; what decodes
//! encodes to a map that decodes to the same ranges; a journal replays over it without a
//! panic, only ever removing ranges, and stops at its first damaged entry.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sliver_replica::hydrate::{replay, Maps};

fuzz_target!(|data: &[u8]| {
    // The first two bytes say where the map ends and the journal begins.
    if data.len() < 2 {
        return;
    }
    let split = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
    let (map, journal) = data[2..].split_at(split);
    if let Ok(mut maps) = Maps::decode(map) {
        assert_eq!(Maps::decode(&maps.encode()).unwrap(), maps);
        let before = maps.bytes();
        let good = replay(&mut maps, journal);
        assert!(good <= journal.len() && good % 24 == 0);
        assert!(maps.bytes() <= before);
    }
});
