//! The objects of a pool in the store (RFC 0003, "Objects"): their names and the 64-byte
//! header every one starts with. Sans-I/O: encoding and checking bytes only.
//!
//! ```text
//! 0   "SLVROBJ1"            magic, 8 bytes
//! 8   kind u8, pad [3]
//! 12  header crc32c u32     over bytes 0..64 with this field zero
//! 16  array uuid [16]       the pool the object belongs to
//! 32  epoch u64             the writer epoch that made it
//! 40  number u64            what its name says (manifest n, segment sequence, generation...)
//! 48  body length u64
//! 56  body crc32c u32
//! 60  table length u32      stream objects: the bytes of the body's record table (0: the
//!                           body is interleaved, as objects were before hydration on demand);
//!                           other kinds: zero
//! 64  body
//! ```
//! Integers are little-endian. An object whose header or body fails its checksum, whose uuid is
//! not the pool's, or whose kind or number is not what its name says is refused with its name in
//! the message: a damaged object is reported, never used.

use std::fmt;

pub const MAGIC: [u8; 8] = *b"SLVROBJ1";
pub const HEADER_BYTES: usize = 64;

/// What an object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// One link of the manifest chain (created if absent, never replaced).
    Manifest = 1,
    /// A sealed segment's bytes as written, up to its seal.
    Segment = 2,
    /// The open segment's bytes from an offset.
    Head = 3,
    /// The metadata pages one checkpoint wrote.
    MetaDelta = 4,
    /// Every live metadata page at one checkpoint.
    Base = 5,
    /// A checkpoint's root, byte for byte.
    Root = 6,
    /// The array configuration.
    Config = 7,
    /// The conditional-write probe.
    Probe = 8,
    /// A batch of the writes the engine made through its backend, in order (RFC 0003,
    /// "Revision: shipping the backend's writes"); numbered consecutively from 1.
    Stream = 9,
    /// A restore point: a name and a time for a prefix of the stream, and the base it builds
    /// on (see `catalog`).
    Point = 10,
    /// A complete base: where in the stream it starts and ends (see `catalog`); numbered by
    /// the stream object it starts in.
    BaseIndex = 11,
    /// Stream objects an array restored on demand still fetches from, with an expiry: the
    /// source's retention keeps them (see `catalog`); numbered at random by the restore.
    Pin = 12,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Manifest,
            2 => Kind::Segment,
            3 => Kind::Head,
            4 => Kind::MetaDelta,
            5 => Kind::Base,
            6 => Kind::Root,
            7 => Kind::Config,
            8 => Kind::Probe,
            9 => Kind::Stream,
            10 => Kind::Point,
            11 => Kind::BaseIndex,
            12 => Kind::Pin,
            _ => return None,
        })
    }

    /// The folder of the pool's prefix its objects live in.
    pub fn folder(self) -> &'static str {
        match self {
            Kind::Manifest => "manifest",
            Kind::Segment => "seg",
            Kind::Head => "head",
            Kind::MetaDelta => "meta",
            Kind::Base => "base",
            Kind::Root => "root",
            Kind::Config => "config",
            Kind::Probe => "probe",
            Kind::Stream => "stream",
            Kind::Point => "points",
            Kind::BaseIndex => "bases",
            Kind::Pin => "pins",
        }
    }
}

/// An object's name below the pool's prefix: the kind's folder and its number. Manifests are
/// numbered in decimal (20 digits, so names sort as numbers); the others in hex (16 digits).
/// Heads carry the offset their bytes start at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    pub kind: Kind,
    pub number: u64,
    /// For heads only: where in the segment the bytes start.
    pub offset: Option<u32>,
}

impl ObjectName {
    pub fn new(kind: Kind, number: u64) -> Self {
        ObjectName {
            kind,
            number,
            offset: None,
        }
    }

    pub fn head(sequence: u64, offset: u32) -> Self {
        ObjectName {
            kind: Kind::Head,
            number: sequence,
            offset: Some(offset),
        }
    }

    /// Parse a name as [`fmt::Display`] writes it (relative to the pool's prefix).
    pub fn parse(s: &str) -> Option<Self> {
        let (folder, rest) = s.split_once('/')?;
        let kind = [
            Kind::Manifest,
            Kind::Segment,
            Kind::Head,
            Kind::MetaDelta,
            Kind::Base,
            Kind::Root,
            Kind::Config,
            Kind::Probe,
            Kind::Stream,
            Kind::Point,
            Kind::BaseIndex,
            Kind::Pin,
        ]
        .into_iter()
        .find(|k| k.folder() == folder)?;
        // Exactly `digits` lower-case hex digits: one spelling per number, so a name read
        // back prints as itself (from_str_radix alone takes upper case and a leading '+').
        let hex = |t: &str, digits: usize| {
            (t.len() == digits
                && t.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then(|| u64::from_str_radix(t, 16).ok())
            .flatten()
        };
        match kind {
            Kind::Manifest => {
                (rest.len() == 20 && rest.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
                Some(ObjectName::new(kind, rest.parse().ok()?))
            }
            Kind::Head => {
                let (seq, off) = rest.split_once('-')?;
                let offset = u32::try_from(hex(off, 8)?).ok()?;
                Some(ObjectName::head(hex(seq, 16)?, offset))
            }
            _ => Some(ObjectName::new(kind, hex(rest, 16)?)),
        }
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.offset) {
            (Kind::Manifest, _) => write!(f, "manifest/{:020}", self.number),
            (Kind::Head, Some(off)) => write!(f, "head/{:016x}-{:08x}", self.number, off),
            (k, _) => write!(f, "{}/{:016x}", k.folder(), self.number),
        }
    }
}

/// What a reader expects of an object it fetched by name.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    pub array: [u8; 16],
    pub kind: Kind,
    pub number: u64,
}

/// The header fields of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub array: [u8; 16],
    pub epoch: u64,
    pub number: u64,
    pub body_len: u64,
    pub body_crc: u32,
    /// Stream objects: the length of the table at the start of the body (`stream::index`),
    /// 0 when the body is interleaved.
    pub table_len: u32,
}

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object {name}: {reason}")]
pub struct ObjectError {
    pub name: String,
    pub reason: String,
}

/// An object: header then body.
pub fn encode(kind: Kind, array: [u8; 16], epoch: u64, number: u64, body: &[u8]) -> Vec<u8> {
    encode_indexed(kind, array, epoch, number, body, 0)
}

/// A stream object whose body starts with a table of `table_len` bytes (`stream::index`).
pub fn encode_indexed(
    kind: Kind,
    array: [u8; 16],
    epoch: u64,
    number: u64,
    body: &[u8],
    table_len: u32,
) -> Vec<u8> {
    debug_assert!(table_len == 0 || kind == Kind::Stream);
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&MAGIC);
    out.push(kind as u8);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&[0; 4]); // header crc, below
    out.extend_from_slice(&array);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(&table_len.to_le_bytes());
    debug_assert_eq!(out.len(), HEADER_BYTES);
    let crc = crc32c::crc32c(&out);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The header of `bytes` (at least its first 64 bytes), checked on its own: magic, checksum,
/// kind and padding. `name` is for messages.
pub fn decode_header(name: &str, bytes: &[u8]) -> Result<Header, ObjectError> {
    let refuse = |reason: String| ObjectError {
        name: name.to_string(),
        reason,
    };
    if bytes.len() < HEADER_BYTES {
        return Err(refuse(format!(
            "{} bytes, shorter than the {HEADER_BYTES}-byte header",
            bytes.len()
        )));
    }
    let h = &bytes[..HEADER_BYTES];
    if h[..8] != MAGIC {
        return Err(refuse("not a sliver object (bad magic)".into()));
    }
    let mut zeroed = [0u8; HEADER_BYTES];
    zeroed.copy_from_slice(h);
    zeroed[12..16].fill(0);
    let stored = u32_at(h, 12);
    let computed = crc32c::crc32c(&zeroed);
    if stored != computed {
        return Err(refuse(format!(
            "header checksum {stored:08x}, computed {computed:08x}: the object is damaged"
        )));
    }
    if h[9..12] != [0; 3] {
        return Err(refuse("reserved header bytes are not zero".into()));
    }
    let kind = Kind::from_byte(h[8]).ok_or_else(|| refuse(format!("unknown kind {}", h[8])))?;
    let header = Header {
        kind,
        array: h[16..32].try_into().expect("16 bytes"),
        epoch: u64_at(h, 32),
        number: u64_at(h, 40),
        body_len: u64_at(h, 48),
        body_crc: u32_at(h, 56),
        table_len: u32_at(h, 60),
    };
    if header.table_len != 0 && kind != Kind::Stream {
        return Err(refuse("reserved header bytes are not zero".into()));
    }
    if u64::from(header.table_len) > header.body_len {
        return Err(refuse(format!(
            "a table of {} bytes in a body of {}",
            header.table_len, header.body_len
        )));
    }
    Ok(header)
}

/// The header and body of a whole object fetched as `name`, refused unless it is exactly what
/// `expected` names and both checksums hold.
pub fn decode<'a>(
    name: &str,
    bytes: &'a [u8],
    expected: &Expected,
) -> Result<(Header, &'a [u8]), ObjectError> {
    let header = decode_header(name, bytes)?;
    header.check(name, expected)?;
    let refuse = |reason: String| ObjectError {
        name: name.to_string(),
        reason,
    };
    let body = &bytes[HEADER_BYTES..];
    if body.len() as u64 != header.body_len {
        return Err(refuse(format!(
            "body of {} bytes, the header says {}",
            body.len(),
            header.body_len
        )));
    }
    let crc = crc32c::crc32c(body);
    if crc != header.body_crc {
        return Err(refuse(format!(
            "body checksum {crc:08x}, the header says {:08x}: the object is damaged",
            header.body_crc
        )));
    }
    Ok((header, body))
}

impl Header {
    /// Refused unless the header is what `expected` names (pool, kind and number).
    pub fn check(&self, name: &str, expected: &Expected) -> Result<(), ObjectError> {
        let header = self;
        let refuse = |reason: String| ObjectError {
            name: name.to_string(),
            reason,
        };
        if header.array != expected.array {
            return Err(refuse(format!(
                "belongs to array {}, not this pool's {}",
                hex(&header.array),
                hex(&expected.array)
            )));
        }
        if header.kind != expected.kind || header.number != expected.number {
            return Err(refuse(format!(
                "holds {:?} {}, its name says {:?} {}",
                header.kind, header.number, expected.kind, expected.number
            )));
        }
        Ok(())
    }
}

/// Lower-case hex of `b` (uuids in messages).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POOL: [u8; 16] = *b"0123456789abcdef";

    fn expected(kind: Kind, number: u64) -> Expected {
        Expected {
            array: POOL,
            kind,
            number,
        }
    }

    #[test]
    fn an_object_round_trips_and_names_parse_back() {
        let obj = encode(Kind::Segment, POOL, 3, 0x2a, b"segment bytes");
        let (h, body) = decode("seg/000000000000002a", &obj, &expected(Kind::Segment, 0x2a))
            .expect("round trip");
        assert_eq!(body, b"segment bytes");
        assert_eq!(
            (h.kind, h.epoch, h.number, h.body_len),
            (Kind::Segment, 3, 0x2a, 13)
        );
        for name in [
            ObjectName::new(Kind::Manifest, 7),
            ObjectName::new(Kind::Segment, 0xdead_beef),
            ObjectName::head(9, 0x1000),
            ObjectName::new(Kind::MetaDelta, 1),
            ObjectName::new(Kind::Base, 2),
            ObjectName::new(Kind::Root, 3),
            ObjectName::new(Kind::Config, 4),
            ObjectName::new(Kind::Probe, u64::MAX),
            ObjectName::new(Kind::Point, 12),
            ObjectName::new(Kind::BaseIndex, 0x30),
        ] {
            let s = name.to_string();
            assert_eq!(ObjectName::parse(&s), Some(name), "{s}");
        }
        assert_eq!(
            ObjectName::new(Kind::Manifest, 7).to_string(),
            "manifest/00000000000000000007"
        );
        assert_eq!(
            ObjectName::head(9, 0x1000).to_string(),
            "head/0000000000000009-00001000"
        );
        for bad in [
            "",
            "seg",
            "seg/2a",
            "seg/000000000000002A",
            "manifest/7",
            "head/0000000000000009",
            // Found by the fuzz target: other spellings of a number must not parse.
            "head/0000000000000009-0000F000",
            "head/0000000000000009-+0001000",
            "seg/+00000000000002a",
            "manifest/+0000000000000000007",
            "nope/0000000000000009",
        ] {
            assert_eq!(ObjectName::parse(bad), None, "{bad:?}");
        }
        // Names sort as the numbers they carry.
        assert!(
            ObjectName::new(Kind::Manifest, 9).to_string()
                < ObjectName::new(Kind::Manifest, 10).to_string()
        );
    }

    #[test]
    fn objects_of_another_pool_kind_or_number_are_refused_by_name() {
        let obj = encode(Kind::Root, POOL, 1, 5, b"root");
        let other = Expected {
            array: *b"fedcba9876543210",
            ..expected(Kind::Root, 5)
        };
        let e = decode("root/0000000000000005", &obj, &other).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("object root/0000000000000005: belongs to array"));
        assert!(decode("x", &obj, &expected(Kind::Base, 5)).is_err());
        assert!(decode("x", &obj, &expected(Kind::Root, 6)).is_err());
        assert!(decode("x", &obj[..obj.len() - 1], &expected(Kind::Root, 5)).is_err());
        assert!(decode("x", &obj[..10], &expected(Kind::Root, 5)).is_err());
    }

    #[test]
    fn the_fuzz_seed_written_by_another_encoder_decodes() {
        // fuzz/make_corpus.py writes objects with its own encoder (Python's): the format is
        // the bytes, not this crate's code.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/replica_object/segment"
        );
        let bytes = std::fs::read(path).expect("the checked-in seed");
        let expected = Expected {
            array: *b"pool-a-uuid-0001",
            kind: Kind::Segment,
            number: 0x10,
        };
        let (h, body) = decode("seg/0000000000000010", &bytes, &expected).expect("decodes");
        assert_eq!(h.epoch, 1);
        let want: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
        assert_eq!(body, &want[..]);
        assert_eq!(encode(h.kind, h.array, h.epoch, h.number, body), bytes);
    }

    proptest! {
        /// Every single flipped bit, in the header or the body, is refused.
        #[test]
        fn every_flipped_bit_is_refused(body in proptest::collection::vec(any::<u8>(), 0..200),
                                        number in any::<u64>(), epoch in any::<u64>(),
                                        bit in any::<prop::sample::Index>()) {
            let obj = encode(Kind::MetaDelta, POOL, epoch, number, &body);
            prop_assert!(decode("m", &obj, &expected(Kind::MetaDelta, number)).is_ok());
            let mut damaged = obj.clone();
            let at = bit.index(obj.len() * 8);
            damaged[at / 8] ^= 1 << (at % 8);
            prop_assert!(decode("m", &damaged, &expected(Kind::MetaDelta, number)).is_err());
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_bytes_are_refused_or_decoded_without_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = decode("m", &bytes, &expected(Kind::Segment, 1));
            let _ = ObjectName::parse(&String::from_utf8_lossy(&bytes));
        }
    }
}
