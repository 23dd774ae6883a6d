//! The records inside a `stream/<n>` object (RFC 0003, "Revision: shipping the backend's
//! writes"): what the engine's devices told [`crate::ship::ShipTap`] they wrote, in
//! completion order. Applying the records of objects `1..k` in order to empty files rebuilds a
//! state a crash could have left on the local disk, which the engine's open recovers.
//!
//! ```text
//! area u8 | flags u8 | pad [2] | len u32 | offset u64 | bytes [len]   (no bytes for discard,
//!                                                                      base start and end)
//! areas: 1 log write, 2 metadata write, 3 root, 4 log discard, 5 base start, 6 base end,
//!        7 array configuration; +0x10 on 1, 2, 3 and 7 for a base's records
//! flags: on a base start only, 1 = the stream before it is whole (a scheduled base), 0 = it
//!        is not (the first base, a restart after a crash or a dropped backlog)
//! ```
//!
//! A scheduled base is taken only so that older objects can be deleted: the stream before it
//! is whole, so a restore that started from an older base goes on through it and skips its
//! base records. A restart base is where a restore from an older base must stop.
//!
//! A base (a full copy, taken while hosts keep writing) is read from the live files, so a
//! range read while a write to it was under way can be torn. Its records are marked as base
//! records, and a restore applies every base record of the base first and the ordinary records
//! since its start after them: each byte ends as its last write since the base started, or as
//! the base read it when nothing wrote it meanwhile (then the read was exact).
//!
//! The object header's CRC covers the body; this decoder still checks every length against
//! what is left, so a damaged or hostile body is an error, never a panic or a huge allocation.

use std::fmt;

/// Bytes before a record's payload.
pub const RECORD_HEADER: usize = 16;

/// One write the engine made, or a base boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// Bytes written to the log at `offset` (`base`: read by a base, not written).
    Log {
        offset: u64,
        bytes: &'a [u8],
        base: bool,
    },
    /// Bytes written to the metadata file at `offset`.
    Meta {
        offset: u64,
        bytes: &'a [u8],
        base: bool,
    },
    /// The root, replaced whole.
    Root { bytes: &'a [u8], base: bool },
    /// The array's configuration (volumes' names, hosts, connections, settings: the server's
    /// `array.json`), replaced whole. Saved after the engine change it names, so a prefix
    /// holding it holds that change.
    Config { bytes: &'a [u8], base: bool },
    /// A log range given back (its contents undefined from then on).
    Discard { offset: u64, len: u64 },
    /// A full copy of the array starts: what came before is no longer needed. `capacity` is the
    /// log's size; `continues`: the stream before it is whole (a scheduled base), so the
    /// ordinary records after it also apply over an older base.
    BaseStart { capacity: u64, continues: bool },
    /// The full copy that the last `BaseStart` began is complete.
    BaseEnd,
}

const LOG: u8 = 1;
const META: u8 = 2;
const ROOT: u8 = 3;
const DISCARD: u8 = 4;
const BASE_START: u8 = 5;
const BASE_END: u8 = 6;
const CONFIG: u8 = 7;
/// Added to the log, metadata and root areas for a base's records.
const BASE_FLAG: u8 = 0x10;

impl<'a> Record<'a> {
    /// Bytes the record takes in a body.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER
            + match self {
                Record::Log { bytes, .. }
                | Record::Meta { bytes, .. }
                | Record::Root { bytes, .. }
                | Record::Config { bytes, .. } => bytes.len(),
                _ => 0,
            }
    }

    /// Append the record to `out`. Payloads are at most `u32::MAX` bytes (callers split).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header());
        out.extend_from_slice(self.payload());
    }

    /// The bytes a record carries after its header (none for discards and base marks).
    pub fn payload(&self) -> &'a [u8] {
        match *self {
            Record::Log { bytes, .. }
            | Record::Meta { bytes, .. }
            | Record::Root { bytes, .. }
            | Record::Config { bytes, .. } => bytes,
            _ => &[],
        }
    }

    /// The record's 16-byte header.
    fn header(&self) -> [u8; RECORD_HEADER] {
        let flag = |base: bool| if base { BASE_FLAG } else { 0 };
        let mut flags = 0u8;
        let (area, len, offset): (u8, u64, u64) = match *self {
            Record::Log {
                offset,
                bytes,
                base,
            } => (LOG | flag(base), bytes.len() as u64, offset),
            Record::Meta {
                offset,
                bytes,
                base,
            } => (META | flag(base), bytes.len() as u64, offset),
            Record::Root { bytes, base } => (ROOT | flag(base), bytes.len() as u64, 0),
            Record::Config { bytes, base } => (CONFIG | flag(base), bytes.len() as u64, 0),
            Record::Discard { offset, len } => (DISCARD, len, offset),
            Record::BaseStart {
                capacity,
                continues,
            } => {
                flags = u8::from(continues);
                (BASE_START, 0, capacity)
            }
            Record::BaseEnd => (BASE_END, 0, 0),
        };
        let len = u32::try_from(len).expect("records are split below 4 GiB");
        let mut h = [0u8; RECORD_HEADER];
        h[0] = area;
        h[1] = flags;
        h[4..8].copy_from_slice(&len.to_le_bytes());
        h[8..16].copy_from_slice(&offset.to_le_bytes());
        h
    }

    /// Call `each` with the record cut into pieces of at most [`PIECE`] payload bytes (log
    /// and metadata writes; the others are small and passed whole). A read of data not yet
    /// fetched after a restore fetches the pieces it touches, so this bounds what one 4 KiB
    /// read costs.
    pub fn in_pieces(self, mut each: impl FnMut(Record<'a>)) {
        let (offset, bytes, base, log) = match self {
            Record::Log {
                offset,
                bytes,
                base,
            } => (offset, bytes, base, true),
            Record::Meta {
                offset,
                bytes,
                base,
            } => (offset, bytes, base, false),
            other => return each(other),
        };
        if bytes.is_empty() {
            return each(self);
        }
        for (i, bytes) in bytes.chunks(PIECE).enumerate() {
            let offset = offset + (i * PIECE) as u64;
            each(if log {
                Record::Log {
                    offset,
                    bytes,
                    base,
                }
            } else {
                Record::Meta {
                    offset,
                    bytes,
                    base,
                }
            });
        }
    }
}

/// A body that does not decode: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    pub at: usize,
    pub what: &'static str,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream record at byte {}: {}", self.at, self.what)
    }
}

impl std::error::Error for StreamError {}

/// The records of a body whose table (if any) is `table_len` bytes (the object header's
/// field: 0 for the interleaved layout), in order; the first malformed one ends the iteration
/// with an error.
pub fn records(
    body: &[u8],
    table_len: u32,
) -> Box<dyn Iterator<Item = Result<Record<'_>, StreamError>> + '_> {
    if table_len == 0 {
        return Box::new(interleaved(body));
    }
    let entries = match body
        .get(..table_len as usize)
        .ok_or(StreamError {
            at: 0,
            what: "the table runs past the end of the object",
        })
        .and_then(|t| table(t, body.len() as u64))
    {
        Ok(e) => e,
        Err(e) => return Box::new(std::iter::once(Err(e))),
    };
    Box::new(entries.into_iter().map(move |e| {
        // `table` checked every payload lies inside the body.
        let at = e.pos as usize;
        Ok(e.record(&body[at..at + e.len() as usize]))
    }))
}

/// The records of an interleaved body (each header followed by its payload).
fn interleaved(body: &[u8]) -> impl Iterator<Item = Result<Record<'_>, StreamError>> {
    let mut at = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= body.len() {
            return None;
        }
        let r = decode_one(body, at);
        match &r {
            Ok((_, next)) => at = *next,
            Err(_) => failed = true,
        }
        Some(r.map(|(rec, _)| rec))
    })
}

fn decode_one(body: &[u8], at: usize) -> Result<(Record<'_>, usize), StreamError> {
    let head = body.get(at..at + RECORD_HEADER).ok_or(StreamError {
        at,
        what: "truncated record header",
    })?;
    let head = Head::decode(head, at)?;
    let start = at + RECORD_HEADER;
    let n = head.payload_len();
    let bytes = start
        .checked_add(n)
        .and_then(|end| body.get(start..end))
        .ok_or(StreamError {
            at,
            what: "payload runs past the end of the object",
        })?;
    Ok((head.record(bytes), start + n))
}

/// A record header, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    area: u8,
    flags: u8,
    len: u32,
    offset: u64,
}

impl Head {
    fn decode(head: &[u8], at: usize) -> Result<Head, StreamError> {
        let err = |what| StreamError { at, what };
        if head[2..4] != [0; 2] {
            return Err(err("padding is not zero"));
        }
        let h = Head {
            area: head[0],
            flags: head[1],
            len: u32::from_le_bytes(head[4..8].try_into().unwrap()),
            offset: u64::from_le_bytes(head[8..16].try_into().unwrap()),
        };
        if h.flags != 0 && h.area != BASE_START {
            return Err(err("flags on a record that has none"));
        }
        let base = h.area & BASE_FLAG != 0;
        let check = |ok: bool, what| if ok { Ok(h) } else { Err(err(what)) };
        match h.area & !BASE_FLAG {
            LOG | META => Ok(h),
            ROOT => check(h.offset == 0, "a root record with an offset"),
            CONFIG => check(h.offset == 0, "a configuration record with an offset"),
            _ if base => Err(err("a base flag on a record that has none")),
            DISCARD => check(
                h.offset.checked_add(u64::from(h.len)).is_some(),
                "a discard past the end of the address space",
            ),
            BASE_START => check(
                h.len == 0 && h.flags <= 1,
                "a base start with a length or unknown flags",
            ),
            BASE_END => check(h.len == 0 && h.offset == 0, "a base end with fields set"),
            _ => Err(err("unknown record area")),
        }
    }

    /// Bytes of payload that follow the header (a discard's length is not a payload).
    fn payload_len(&self) -> usize {
        match self.area & !BASE_FLAG {
            LOG | META | ROOT | CONFIG => self.len as usize,
            _ => 0,
        }
    }

    /// The record, with its payload (`payload_len` bytes).
    fn record<'a>(&self, bytes: &'a [u8]) -> Record<'a> {
        let base = self.area & BASE_FLAG != 0;
        let offset = self.offset;
        match self.area & !BASE_FLAG {
            LOG => Record::Log {
                offset,
                bytes,
                base,
            },
            META => Record::Meta {
                offset,
                bytes,
                base,
            },
            ROOT => Record::Root { bytes, base },
            CONFIG => Record::Config { bytes, base },
            DISCARD => Record::Discard {
                offset,
                len: u64::from(self.len),
            },
            BASE_START => Record::BaseStart {
                capacity: offset,
                continues: self.flags == 1,
            },
            _ => Record::BaseEnd,
        }
    }
}

/// Largest log or metadata payload in one record (see [`Record::in_pieces`]).
pub const PIECE: usize = 64 << 10;

/// Bytes of one table entry: a record's header and its payload's crc32c.
pub const TABLE_ENTRY: usize = RECORD_HEADER + 4;

/// An indexed body (the layout objects are written in since hydration on demand): a table
/// of every record's header and payload checksum, closed by the table's own crc32c, then the
/// payloads in the same order. A restore reads the table with one range read and fetches a
/// payload only when it is needed; the object header's body checksum still covers the whole.
///
/// ```text
/// table:    { record header [16] | payload crc32c u32 } * n | crc32c u32 of the entries
/// payloads: the records' payloads, in table order
/// ```
///
/// Returns the body and the table's length (for the object header). `interleaved` is a body
/// this crate encoded (records' headers each followed by their payload).
pub fn index(interleaved_body: &[u8]) -> Result<(Vec<u8>, u32), StreamError> {
    let mut table = Vec::new();
    let mut payload_bytes = 0usize;
    for r in interleaved(interleaved_body) {
        let r = r?;
        table.extend_from_slice(&r.header());
        table.extend_from_slice(&crc32c::crc32c(r.payload()).to_le_bytes());
        payload_bytes += r.payload().len();
    }
    let crc = crc32c::crc32c(&table);
    table.extend_from_slice(&crc.to_le_bytes());
    let table_len = u32::try_from(table.len()).map_err(|_| StreamError {
        at: 0,
        what: "a table of more than 4 GiB",
    })?;
    let mut body = table;
    body.reserve(payload_bytes);
    for r in interleaved(interleaved_body) {
        body.extend_from_slice(r?.payload());
    }
    Ok((body, table_len))
}

/// One record as the table of an indexed body names it: what it is, where its payload lies
/// in the body and the payload's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    head: Head,
    /// The payload's position from the start of the body.
    pub pos: u64,
    pub crc: u32,
}

/// What a table entry writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    Log,
    Meta,
    Root,
    Config,
    /// Discards and base marks: no payload.
    Mark,
}

impl Entry {
    pub fn area(&self) -> Area {
        match self.head.area & !BASE_FLAG {
            LOG => Area::Log,
            META => Area::Meta,
            ROOT => Area::Root,
            CONFIG => Area::Config,
            _ => Area::Mark,
        }
    }

    /// Payload bytes.
    pub fn len(&self) -> u32 {
        self.head.payload_len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the record writes (log and metadata records).
    pub fn offset(&self) -> u64 {
        self.head.offset
    }

    pub fn is_base(&self) -> bool {
        self.head.area & BASE_FLAG != 0
    }

    /// The record, given its payload (`len()` bytes; empty for marks).
    pub fn record<'a>(&self, payload: &'a [u8]) -> Record<'a> {
        self.head.record(payload)
    }
}

/// The entries of a table (`bytes`: exactly the table, as long as the object header says), in
/// order, checked against its checksum and against a body of `body_len` bytes.
pub fn table(bytes: &[u8], body_len: u64) -> Result<Vec<Entry>, StreamError> {
    let err = |at, what| StreamError { at, what };
    if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(TABLE_ENTRY) {
        return Err(err(0, "a table whose length is not whole entries"));
    }
    let (entries, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(entries) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err(err(0, "the table's checksum does not match: damaged"));
    }
    let mut pos = bytes.len() as u64;
    let mut out = Vec::with_capacity(entries.len() / TABLE_ENTRY);
    for (i, e) in entries.chunks_exact(TABLE_ENTRY).enumerate() {
        let at = i * TABLE_ENTRY;
        let head = Head::decode(&e[..RECORD_HEADER], at)?;
        let crc = u32::from_le_bytes(e[RECORD_HEADER..].try_into().unwrap());
        let end = pos + head.payload_len() as u64;
        if end > body_len {
            return Err(err(at, "payload runs past the end of the object"));
        }
        out.push(Entry { head, pos, crc });
        pos = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record<'static>> {
        vec![
            Record::BaseStart {
                capacity: 1 << 30,
                continues: false,
            },
            Record::Log {
                offset: 4096,
                bytes: b"log bytes",
                base: true,
            },
            Record::Meta {
                offset: 8192,
                bytes: &[7; 4096],
                base: false,
            },
            Record::Root {
                bytes: b"old root",
                base: true,
            },
            Record::Config {
                bytes: b"{}",
                base: false,
            },
            Record::Discard {
                offset: 1 << 20,
                len: 4 << 20,
            },
            Record::Root {
                bytes: b"root",
                base: false,
            },
            Record::BaseEnd,
            Record::BaseStart {
                capacity: 1 << 30,
                continues: true,
            },
        ]
    }

    #[test]
    fn records_round_trip_in_order() {
        let mut body = Vec::new();
        for r in sample() {
            let before = body.len();
            r.encode(&mut body);
            assert_eq!(body.len() - before, r.encoded_len());
        }
        let back: Vec<Record> = records(&body, 0).map(|r| r.unwrap()).collect();
        assert_eq!(back, sample());
    }

    #[test]
    fn every_truncation_and_bad_field_is_an_error_not_a_panic() {
        let mut body = Vec::new();
        for r in sample() {
            r.encode(&mut body);
        }
        // Cut anywhere inside a record: the records before it decode, then one error.
        for cut in 1..body.len() {
            let mut ok = 0;
            let mut errors = 0;
            for r in records(&body[..cut], 0) {
                match r {
                    Ok(_) => ok += 1,
                    Err(_) => errors += 1,
                }
            }
            assert!(errors <= 1 && ok <= sample().len(), "cut {cut}");
        }
        let mut bad = body.clone();
        bad[0] = 99;
        assert_eq!(
            records(&bad, 0).next().unwrap().unwrap_err().what,
            "unknown record area"
        );
        let mut bad = body.clone();
        bad[1] = 2;
        assert!(records(&bad, 0).next().unwrap().is_err());
        // A flag on a record other than a base start.
        let log_at = sample()[0].encoded_len();
        let mut bad = body.clone();
        bad[log_at + 1] = 1;
        assert_eq!(
            records(&bad, 0).nth(1).unwrap().unwrap_err().what,
            "flags on a record that has none"
        );
        let mut bad = body.clone();
        bad[2] = 1;
        assert!(records(&bad, 0).next().unwrap().is_err());
        // A length far beyond the body.
        let mut bad = Vec::new();
        Record::Log {
            offset: 0,
            bytes: b"x",
            base: false,
        }
        .encode(&mut bad);
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            records(&bad, 0).next().unwrap().unwrap_err().what,
            "payload runs past the end of the object"
        );
    }

    #[test]
    fn an_indexed_body_holds_the_same_records_and_its_table_is_checked() {
        let mut body = Vec::new();
        for r in sample() {
            r.encode(&mut body);
        }
        let (indexed, table_len) = index(&body).unwrap();
        assert_eq!(table_len as usize, sample().len() * TABLE_ENTRY + 4);
        assert_eq!(indexed.len(), body.len() + sample().len() * 4 + 4);
        let back: Vec<Record> = records(&indexed, table_len).map(|r| r.unwrap()).collect();
        assert_eq!(back, sample());
        // The table alone tells where each payload is and what it holds.
        let entries = table(&indexed[..table_len as usize], indexed.len() as u64).unwrap();
        for (e, r) in entries.iter().zip(sample()) {
            let at = e.pos as usize;
            let payload = &indexed[at..at + e.len() as usize];
            assert_eq!(payload, r.payload());
            assert_eq!(e.crc, crc32c::crc32c(payload));
            assert_eq!(e.record(payload), r);
        }
        // Every flipped bit of the table is refused, never a panic.
        for bit in 0..table_len as usize * 8 {
            let mut bad = indexed.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                table(&bad[..table_len as usize], bad.len() as u64).is_err(),
                "bit {bit}"
            );
        }
        // A table whose payloads would run past the body.
        assert_eq!(
            table(&indexed[..table_len as usize], indexed.len() as u64 - 1)
                .unwrap_err()
                .what,
            "payload runs past the end of the object"
        );
        assert!(records(&indexed, table_len + 1).next().unwrap().is_err());
    }

    #[test]
    fn the_second_encoders_indexed_body_decodes() {
        // fuzz/make_corpus.py writes it from the layout's description, not from this code.
        let seed = include_bytes!("../../../fuzz/corpus/replica_stream/indexed");
        let table_len = u32::from_le_bytes(seed[..4].try_into().unwrap());
        let got: Vec<Record> = records(&seed[4..], table_len).map(|r| r.unwrap()).collect();
        assert_eq!(got.len(), 7);
        assert_eq!(
            got[2],
            Record::Log {
                offset: 4096,
                bytes: b"log",
                base: false
            }
        );
        assert_eq!(got[6], Record::BaseEnd);
    }

    #[test]
    fn large_writes_are_cut_into_pieces_at_their_offsets() {
        let bytes: Vec<u8> = (0..PIECE * 2 + 10).map(|i| i as u8).collect();
        let mut pieces = Vec::new();
        Record::Meta {
            offset: 1000,
            bytes: &bytes,
            base: true,
        }
        .in_pieces(|p| pieces.push(p));
        assert_eq!(pieces.len(), 3);
        let mut at = 1000u64;
        let mut joined = Vec::new();
        for p in &pieces {
            let Record::Meta {
                offset,
                bytes,
                base,
            } = *p
            else {
                panic!("{p:?}")
            };
            assert!(base && offset == at && bytes.len() <= PIECE);
            at += bytes.len() as u64;
            joined.extend_from_slice(bytes);
        }
        assert_eq!(joined, bytes);
        let mut whole = Vec::new();
        Record::Root {
            bytes: &bytes,
            base: false,
        }
        .in_pieces(|p| whole.push(p));
        assert_eq!(whole.len(), 1);
    }
}
