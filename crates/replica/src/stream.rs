//! The records inside a `stream/<n>` object (RFC 0003, "Revision: shipping the backend's
//! writes"): what the engine wrote through its `Backend`, in completion order. Applying the
//! records of objects `1..k` in order to empty files rebuilds a state a crash could have left on
//! the local disk, which the engine's open recovers.
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

impl Record<'_> {
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
        let flag = |base: bool| if base { BASE_FLAG } else { 0 };
        let mut flags = 0u8;
        let (area, len, offset, bytes): (u8, u64, u64, &[u8]) = match *self {
            Record::Log {
                offset,
                bytes,
                base,
            } => (LOG | flag(base), bytes.len() as u64, offset, bytes),
            Record::Meta {
                offset,
                bytes,
                base,
            } => (META | flag(base), bytes.len() as u64, offset, bytes),
            Record::Root { bytes, base } => (ROOT | flag(base), bytes.len() as u64, 0, bytes),
            Record::Config { bytes, base } => (CONFIG | flag(base), bytes.len() as u64, 0, bytes),
            Record::Discard { offset, len } => (DISCARD, len, offset, &[]),
            Record::BaseStart {
                capacity,
                continues,
            } => {
                flags = u8::from(continues);
                (BASE_START, 0, capacity, &[])
            }
            Record::BaseEnd => (BASE_END, 0, 0, &[]),
        };
        let len = u32::try_from(len).expect("records are split below 4 GiB");
        out.push(area);
        out.push(flags);
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(bytes);
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

/// The records of a body, in order; the first malformed one ends the iteration with an error.
pub fn records(body: &[u8]) -> impl Iterator<Item = Result<Record<'_>, StreamError>> {
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
    let err = |what| StreamError { at, what };
    let head = body
        .get(at..at + RECORD_HEADER)
        .ok_or(err("truncated record header"))?;
    if head[2..4] != [0; 2] {
        return Err(err("padding is not zero"));
    }
    let flags = head[1];
    if flags != 0 && head[0] != BASE_START {
        return Err(err("flags on a record that has none"));
    }
    let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
    let offset = u64::from_le_bytes(head[8..16].try_into().unwrap());
    let start = at + RECORD_HEADER;
    let payload = |n: usize| {
        start
            .checked_add(n)
            .and_then(|end| body.get(start..end))
            .ok_or(err("payload runs past the end of the object"))
    };
    let none = |rec: Record<'static>, ok: bool, what| {
        if ok {
            Ok((rec, start))
        } else {
            Err(err(what))
        }
    };
    let base = head[0] & BASE_FLAG != 0;
    match head[0] & !BASE_FLAG {
        LOG => {
            let bytes = payload(len)?;
            Ok((
                Record::Log {
                    offset,
                    bytes,
                    base,
                },
                start + len,
            ))
        }
        META => {
            let bytes = payload(len)?;
            Ok((
                Record::Meta {
                    offset,
                    bytes,
                    base,
                },
                start + len,
            ))
        }
        ROOT => {
            let bytes = payload(len)?;
            if offset != 0 {
                return Err(err("a root record with an offset"));
            }
            Ok((Record::Root { bytes, base }, start + len))
        }
        CONFIG => {
            let bytes = payload(len)?;
            if offset != 0 {
                return Err(err("a configuration record with an offset"));
            }
            Ok((Record::Config { bytes, base }, start + len))
        }
        _ if base => Err(err("a base flag on a record that has none")),
        DISCARD => none(
            Record::Discard {
                offset,
                len: len as u64,
            },
            offset.checked_add(len as u64).is_some(),
            "a discard past the end of the address space",
        ),
        BASE_START => none(
            Record::BaseStart {
                capacity: offset,
                continues: flags == 1,
            },
            len == 0 && flags <= 1,
            "a base start with a length or unknown flags",
        ),
        BASE_END => none(
            Record::BaseEnd,
            len == 0 && offset == 0,
            "a base end with fields set",
        ),
        _ => Err(err("unknown record area")),
    }
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
        let back: Vec<Record> = records(&body).map(|r| r.unwrap()).collect();
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
            for r in records(&body[..cut]) {
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
            records(&bad).next().unwrap().unwrap_err().what,
            "unknown record area"
        );
        let mut bad = body.clone();
        bad[1] = 2;
        assert!(records(&bad).next().unwrap().is_err());
        // A flag on a record other than a base start.
        let log_at = sample()[0].encoded_len();
        let mut bad = body.clone();
        bad[log_at + 1] = 1;
        assert_eq!(
            records(&bad).nth(1).unwrap().unwrap_err().what,
            "flags on a record that has none"
        );
        let mut bad = body.clone();
        bad[2] = 1;
        assert!(records(&bad).next().unwrap().is_err());
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
            records(&bad).next().unwrap().unwrap_err().what,
            "payload runs past the end of the object"
        );
    }
}
