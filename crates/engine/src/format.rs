//! On-disk format: log records. Byte diagrams live in docs/design.md ("Engine on-disk format")
//! and docs/rfcs/0001-metadata-at-scale.md; this file is the one place that encodes and
//! decodes log records (metadata pages and the root are in [`crate::meta`]).
//!
//! All integers are little-endian. Every record starts with a 16-byte header:
//!
//! ```text
//!  0      4      8    9     10      12     16
//! +------+------+----+-----+-------+------+----------------+
//! | crc  | len  |kind|flags| resvd | seq  | payload (len)  |
//! +------+------+----+-----+-------+------+----------------+
//! ```
//!
//! `crc` is CRC-32C over bytes 4..16 and the payload; `seq` is the low 32 bits of the sequence
//! number of the segment the record was written into, so stale records left in a reused segment
//! never parse as current ones.

use crate::le::{LeReader, Short};
use std::fmt;

pub const RECORD_HEADER: usize = 16;
/// Magic at the start of every segment's first record payload.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"SLVRLOG1");
/// Bytes of a Chunk record payload before the stored data (both kinds: `id u32 | codec u8 |
/// pad [3] | hash [16]` in format 2, `id u64 | hash [16]` in format 3).
pub const CHUNK_PREFIX: usize = 24;
/// Size of a Seal record: always kept free at a segment's end.
pub const SEAL_LEN: usize = RECORD_HEADER + 12;
pub const SEGMENT_START_LEN: usize = RECORD_HEADER + 20;

/// How a chunk's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Raw,
    Lz4,
    Zstd,
    /// Unknown codes survive decoding so a newer format is reported, not misread.
    Unknown(u8),
}

impl Codec {
    pub fn from_u8(v: u8) -> Self {
        match v {
            0 => Codec::Raw,
            1 => Codec::Lz4,
            2 => Codec::Zstd,
            other => Codec::Unknown(other),
        }
    }
    pub fn to_u8(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
            Codec::Unknown(v) => v,
        }
    }
}

/// Record kinds. The numeric values are part of the on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    SegmentStart = 1,
    /// A chunk with a 32-bit id (format 2): still read in segments it left, never written.
    ChunkV2 = 2,
    /// A map change with 32-bit ids (format 2): replayed only by the migration.
    MapV2 = 3,
    Unmap = 4,
    Copy = 5,
    VolumeCreate = 6,
    VolumeDelete = 7,
    VolumeResize = 8,
    VolumeClone = 9,
    Seal = 10,
    Batch = 11,
    Anchor = 12,
    /// A chunk with a 64-bit id, its codec in the header's flags byte (format 3).
    Chunk = 13,
    /// A map change with 64-bit ids (format 3).
    Map = 14,
    /// Release nodes of the map trees that nothing references any more (format 3). Kind 15
    /// was a metadata page in the log in an unreleased draft of format 3; it is not used.
    Release = 16,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::SegmentStart,
            2 => Kind::ChunkV2,
            3 => Kind::MapV2,
            4 => Kind::Unmap,
            5 => Kind::Copy,
            6 => Kind::VolumeCreate,
            7 => Kind::VolumeDelete,
            8 => Kind::VolumeResize,
            9 => Kind::VolumeClone,
            10 => Kind::Seal,
            11 => Kind::Batch,
            12 => Kind::Anchor,
            13 => Kind::Chunk,
            14 => Kind::Map,
            16 => Kind::Release,
            _ => return None,
        })
    }
}

/// One decoded log record, borrowing its payload from the buffer it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    SegmentStart {
        seq: u64,
        segment: u32,
    },
    /// A unique chunk stored in the log (new, or relocated by the garbage collector).
    Chunk {
        id: u64,
        codec: Codec,
        hash: [u8; 16],
        data: &'a [u8],
    },
    /// Point `ids.len()` consecutive map entries of `volume`, from chunk index `first`, at chunks
    /// (0 = unmapped).
    Map {
        volume: u32,
        first: u64,
        ids: Ids<'a>,
    },
    Unmap {
        volume: u32,
        first: u64,
        count: u64,
    },
    /// Make `count` map entries of `volume` from `first` anchored (no data, space held).
    Anchor {
        volume: u32,
        first: u64,
        count: u64,
    },
    /// Make `count` map entries of `dst` from `dst_first` reference what `src` references from
    /// `src_first` (memmove semantics when the ranges overlap).
    Copy {
        src: u32,
        src_first: u64,
        dst: u32,
        dst_first: u64,
        count: u64,
    },
    VolumeCreate {
        volume: u32,
        size: u64,
    },
    VolumeDelete {
        volume: u32,
    },
    VolumeResize {
        volume: u32,
        size: u64,
    },
    /// Create `dst` sharing every map page of `src` (snapshots and clones).
    VolumeClone {
        src: u32,
        dst: u32,
    },
    /// The segment ends here; the log continues in segment `next_segment`, whose first
    /// record must be a SegmentStart with sequence `next_seq`.
    Seal {
        next_segment: u32,
        next_seq: u64,
    },
    /// Records applied all or nothing (one CRC covers them): one write command, one relocation
    /// batch. The payload is a sequence of complete records.
    Batch {
        inner: &'a [u8],
    },
    /// Release up to `nodes` map tree nodes from the queue of nodes nothing references (see
    /// [`crate::meta::map_tree`]): their references to chunks and child nodes are dropped.
    Release {
        nodes: u32,
    },
}

/// A borrowed little-endian array of chunk ids: 4 bytes each in format 2 records, 8 in
/// format 3 ones.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Ids<'a> {
    bytes: &'a [u8],
    width: usize,
}

impl<'a> Ids<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / self.width
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// Whether the ids are 32-bit (a format 2 record).
    pub fn narrow(&self) -> bool {
        self.width == 4
    }
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        let width = self.width;
        self.bytes.chunks_exact(width).map(move |b| {
            if width == 4 {
                u32::from_le_bytes(b.try_into().unwrap()) as u64
            } else {
                u64::from_le_bytes(b.try_into().unwrap())
            }
        })
    }
}

impl fmt::Debug for Ids<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Why bytes did not decode as a record. Replay stops at the first one: it marks the end of
/// what reached the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header or the announced payload.
    Truncated,
    /// The checksum does not match (torn or never written).
    Checksum,
    /// A record of an older use of this segment.
    StaleSequence,
    /// Checksummed, current, but not understood: a newer format or corruption.
    Malformed(&'static str),
}

impl From<Short> for DecodeError {
    /// A count beyond the end is a payload too short for it, too.
    fn from(_: Short) -> Self {
        DecodeError::Malformed("payload too short")
    }
}

/// A record's checksum: CRC32C of everything after the checksum field, here in two parts
/// (`start` from the record's first byte, then `rest`), as the encoder, the decoder and a
/// chunk read in two parts all compute it.
fn record_checksum(start: &[u8], rest: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&start[4..]), rest)
}

/// Bytes of a chunk record before its data.
pub const CHUNK_HEAD: usize = RECORD_HEADER + CHUNK_PREFIX;

/// A chunk record read in two parts: `head` (its first [`CHUNK_HEAD`] bytes) and `data` (the
/// rest, read straight into the host's buffer). When `head` is that of a Chunk record stored
/// raw, returns its id once length, sequence and checksum (over both parts) are checked;
/// None for any other record (compressed, an old format's, or not a chunk), which the caller
/// decodes whole.
pub fn raw_chunk(head: &[u8], data: &[u8], seq: u64) -> Option<Result<u64, DecodeError>> {
    let head: &[u8; CHUNK_HEAD] = head.try_into().ok()?;
    if head[8] != Kind::Chunk as u8 || Codec::from_u8(head[9]) != Codec::Raw {
        return None;
    }
    let check = || {
        let crc = u32::from_le_bytes(head[0..4].try_into().unwrap());
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
        if len != CHUNK_PREFIX + data.len() {
            return Err(DecodeError::Malformed("chunk record of another length"));
        }
        if record_checksum(head, data) != crc {
            return Err(DecodeError::Checksum);
        }
        if u32::from_le_bytes(head[12..16].try_into().unwrap()) != seq as u32 {
            return Err(DecodeError::StaleSequence);
        }
        Ok(u64::from_le_bytes(head[16..24].try_into().unwrap()))
    };
    Some(check())
}

/// Whether decoding compares each record's checksum with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksums {
    /// Bytes read from a medium: every record's checksum is compared.
    Verify,
    /// Bytes an enclosing checksum already covered (the payload of a Batch record, whose own
    /// checksum was compared) or that this process has just encoded: comparing again would
    /// only repeat work (on the write path, under the lock every command takes). Lengths and
    /// fields are still checked as for any input.
    Covered,
}

/// Decode the record at the start of `buf`, written into a segment with sequence `seq`.
/// Returns the record and its total length (header + payload).
pub fn decode(buf: &[u8], seq: u64) -> Result<(Record<'_>, usize), DecodeError> {
    decode_with(buf, seq, Checksums::Verify)
}

fn decode_with(
    buf: &[u8],
    seq: u64,
    checksums: Checksums,
) -> Result<(Record<'_>, usize), DecodeError> {
    let (record, total, _, record_seq) = decode_checked(buf, checksums)?;
    if record_seq != seq as u32 {
        return Err(DecodeError::StaleSequence);
    }
    Ok((record?, total))
}

/// Header checks: length and checksum; the payload decoded (its error returned inside, after
/// the sequence check that [`decode`] makes first).
#[allow(clippy::type_complexity)]
fn decode_checked(
    buf: &[u8],
    checksums: Checksums,
) -> Result<(Result<Record<'_>, DecodeError>, usize, u32, u32), DecodeError> {
    if buf.len() < RECORD_HEADER {
        return Err(DecodeError::Truncated);
    }
    let crc = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    let len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
    let total = RECORD_HEADER
        .checked_add(len)
        .ok_or(DecodeError::Truncated)?;
    if buf.len() < total {
        return Err(DecodeError::Truncated);
    }
    if checksums == Checksums::Verify
        && record_checksum(&buf[..RECORD_HEADER], &buf[RECORD_HEADER..total]) != crc
    {
        return Err(DecodeError::Checksum);
    }
    let record_seq = u32::from_le_bytes(buf[12..16].try_into().unwrap());
    let record = Kind::from_u8(buf[8])
        .ok_or(DecodeError::Malformed("unknown record kind"))
        .and_then(|kind| decode_payload(kind, buf[9], &buf[RECORD_HEADER..total]));
    Ok((record, total, crc, record_seq))
}

fn decode_payload(kind: Kind, flags: u8, payload: &[u8]) -> Result<Record<'_>, DecodeError> {
    let mut r = LeReader(payload);
    let record = match kind {
        Kind::SegmentStart => {
            if r.u64()? != SEGMENT_MAGIC {
                return Err(DecodeError::Malformed("bad segment magic"));
            }
            let seq = r.u64()?;
            let segment = r.u32()?;
            Record::SegmentStart { seq, segment }
        }
        Kind::ChunkV2 | Kind::Chunk => {
            let (id, codec) = if kind == Kind::ChunkV2 {
                let id = r.u32()? as u64;
                let codec = Codec::from_u8(r.u8()?);
                r.take(3)?;
                (id, codec)
            } else {
                (r.u64()?, Codec::from_u8(flags))
            };
            let hash: [u8; 16] = r.take(16)?.try_into().unwrap();
            let data = r.0;
            r.0 = &[];
            Record::Chunk {
                id,
                codec,
                hash,
                data,
            }
        }
        Kind::MapV2 | Kind::Map => {
            let volume = r.u32()?;
            r.u32()?;
            let first = r.u64()?;
            let width = if kind == Kind::MapV2 { 4 } else { 8 };
            if !r.0.len().is_multiple_of(width) {
                return Err(DecodeError::Malformed("map ids not a whole number of ids"));
            }
            let ids = Ids { bytes: r.0, width };
            r.0 = &[];
            Record::Map { volume, first, ids }
        }
        Kind::Unmap => {
            let volume = r.u32()?;
            r.u32()?;
            Record::Unmap {
                volume,
                first: r.u64()?,
                count: r.u64()?,
            }
        }
        Kind::Anchor => {
            let volume = r.u32()?;
            r.u32()?;
            Record::Anchor {
                volume,
                first: r.u64()?,
                count: r.u64()?,
            }
        }
        Kind::Copy => {
            let src = r.u32()?;
            let dst = r.u32()?;
            Record::Copy {
                src,
                dst,
                src_first: r.u64()?,
                dst_first: r.u64()?,
                count: r.u64()?,
            }
        }
        Kind::VolumeCreate => {
            let volume = r.u32()?;
            r.u32()?;
            Record::VolumeCreate {
                volume,
                size: r.u64()?,
            }
        }
        Kind::VolumeDelete => Record::VolumeDelete { volume: r.u32()? },
        Kind::VolumeResize => {
            let volume = r.u32()?;
            r.u32()?;
            Record::VolumeResize {
                volume,
                size: r.u64()?,
            }
        }
        Kind::VolumeClone => Record::VolumeClone {
            src: r.u32()?,
            dst: r.u32()?,
        },
        Kind::Seal => Record::Seal {
            next_segment: r.u32()?,
            next_seq: r.u64()?,
        },
        Kind::Batch => {
            let inner = r.0;
            r.0 = &[];
            Record::Batch { inner }
        }
        Kind::Release => {
            let nodes = r.u32()?;
            r.u32()?;
            Record::Release { nodes }
        }
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes in payload"));
    }
    Ok(record)
}

/// Append-only encoder of records into a buffer.
pub struct Encoder<'b> {
    pub out: &'b mut Vec<u8>,
    seq: u64,
}

impl<'b> Encoder<'b> {
    pub fn new(out: &'b mut Vec<u8>, seq: u64) -> Self {
        Self { out, seq }
    }

    /// Start a record; returns its start offset in `out` for [`Encoder::finish`].
    fn begin(&mut self, kind: Kind) -> usize {
        self.begin_with(kind, 0)
    }

    fn begin_with(&mut self, kind: Kind, flags: u8) -> usize {
        let start = self.out.len();
        self.out.extend_from_slice(&[0; 8]);
        self.out.push(kind as u8);
        self.out.push(flags);
        self.out.extend_from_slice(&[0; 2]);
        self.out.extend_from_slice(&(self.seq as u32).to_le_bytes());
        start
    }

    fn finish(&mut self, start: usize) {
        let len = (self.out.len() - start - RECORD_HEADER) as u32;
        self.out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
        let crc = record_checksum(&self.out[start..], &[]);
        self.out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }

    fn put_u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn segment_start(&mut self, seq: u64, segment: u32) {
        let s = self.begin(Kind::SegmentStart);
        self.put_u64(SEGMENT_MAGIC);
        self.put_u64(seq);
        self.put_u32(segment);
        self.finish(s);
    }

    /// Encode a chunk record; returns the offset of the record in `out`.
    pub fn chunk(&mut self, id: u64, codec: Codec, hash: &[u8; 16], data: &[u8]) -> usize {
        let s = self.begin_with(Kind::Chunk, codec.to_u8());
        self.put_u64(id);
        self.out.extend_from_slice(hash);
        self.out.extend_from_slice(data);
        self.finish(s);
        s
    }

    /// A format 2 chunk record (32-bit id): only tests that build old logs write these.
    pub fn chunk_v2(&mut self, id: u32, codec: Codec, hash: &[u8; 16], data: &[u8]) -> usize {
        let s = self.begin(Kind::ChunkV2);
        self.put_u32(id);
        self.out.push(codec.to_u8());
        self.out.extend_from_slice(&[0; 3]);
        self.out.extend_from_slice(hash);
        self.out.extend_from_slice(data);
        self.finish(s);
        s
    }

    pub fn map(&mut self, volume: u32, first: u64, ids: &[u64]) {
        let s = self.begin(Kind::Map);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(first);
        for id in ids {
            self.put_u64(*id);
        }
        self.finish(s);
    }

    /// A format 2 map record (32-bit ids): only tests that build old logs write these.
    pub fn map_v2(&mut self, volume: u32, first: u64, ids: &[u32]) {
        let s = self.begin(Kind::MapV2);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(first);
        for id in ids {
            self.put_u32(*id);
        }
        self.finish(s);
    }

    pub fn release(&mut self, nodes: u32) {
        let s = self.begin(Kind::Release);
        self.put_u32(nodes);
        self.put_u32(0);
        self.finish(s);
    }

    pub fn unmap(&mut self, volume: u32, first: u64, count: u64) {
        let s = self.begin(Kind::Unmap);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(first);
        self.put_u64(count);
        self.finish(s);
    }

    pub fn anchor(&mut self, volume: u32, first: u64, count: u64) {
        let s = self.begin(Kind::Anchor);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(first);
        self.put_u64(count);
        self.finish(s);
    }

    pub fn copy(&mut self, src: u32, src_first: u64, dst: u32, dst_first: u64, count: u64) {
        let s = self.begin(Kind::Copy);
        self.put_u32(src);
        self.put_u32(dst);
        self.put_u64(src_first);
        self.put_u64(dst_first);
        self.put_u64(count);
        self.finish(s);
    }

    pub fn volume_create(&mut self, volume: u32, size: u64) {
        let s = self.begin(Kind::VolumeCreate);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(size);
        self.finish(s);
    }

    pub fn volume_delete(&mut self, volume: u32) {
        let s = self.begin(Kind::VolumeDelete);
        self.put_u32(volume);
        self.finish(s);
    }

    pub fn volume_resize(&mut self, volume: u32, size: u64) {
        let s = self.begin(Kind::VolumeResize);
        self.put_u32(volume);
        self.put_u32(0);
        self.put_u64(size);
        self.finish(s);
    }

    pub fn volume_clone(&mut self, src: u32, dst: u32) {
        let s = self.begin(Kind::VolumeClone);
        self.put_u32(src);
        self.put_u32(dst);
        self.finish(s);
    }

    pub fn seal(&mut self, next_segment: u32, next_seq: u64) {
        let s = self.begin(Kind::Seal);
        self.put_u32(next_segment);
        self.put_u64(next_seq);
        self.finish(s);
    }

    /// Open a Batch record: the records encoded until [`Encoder::end_batch`] are its
    /// payload, encoded in place (no copy of the batch afterwards). Returns its start.
    /// Offsets of inner records in `out` count from the buffer, as always: the batch's
    /// header is before them.
    pub fn begin_batch(&mut self) -> usize {
        self.begin(Kind::Batch)
    }

    /// Close the Batch record opened at `start`.
    pub fn end_batch(&mut self, start: usize) {
        self.finish(start);
    }
}

/// Iterate over the records in `buf`, stopping at the end or an error.
pub fn records(
    buf: &[u8],
    seq: u64,
) -> impl Iterator<Item = Result<(usize, Record<'_>), DecodeError>> {
    records_with(buf, seq, Checksums::Verify)
}

/// The records of a Batch's payload (its checksum covered them), or of bytes this process
/// has just encoded; see [`Checksums::Covered`].
pub fn covered_records(
    buf: &[u8],
    seq: u64,
) -> impl Iterator<Item = Result<(usize, Record<'_>), DecodeError>> {
    records_with(buf, seq, Checksums::Covered)
}

fn records_with(
    buf: &[u8],
    seq: u64,
    checksums: Checksums,
) -> impl Iterator<Item = Result<(usize, Record<'_>), DecodeError>> {
    let mut pos = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= buf.len() {
            return None;
        }
        match decode_with(&buf[pos..], seq, checksums) {
            Ok((record, len)) => {
                let at = pos;
                pos += len;
                Some(Ok((at, record)))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_round_trips() {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out, 7);
        e.segment_start(7, 3);
        e.chunk(5, Codec::Lz4, &[9; 16], b"abc");
        e.map(1, 100, &[1, 0, 5]);
        e.unmap(2, 3, 4);
        e.copy(1, 2, 3, 4, 5);
        e.volume_create(4, 1 << 30);
        e.volume_delete(4);
        e.volume_resize(4, 2 << 30);
        e.volume_clone(4, 6);
        let b = e.begin_batch();
        e.map(1, 0, &[2]);
        e.end_batch(b);
        e.anchor(2, 5, 6);
        e.chunk_v2(6, Codec::Zstd, &[8; 16], b"de");
        e.map_v2(3, 7, &[6, 0]);
        e.release(9);
        e.seal(4, 8);
        let got: Vec<_> = records(&out, 7).map(|r| r.unwrap().1).collect();
        assert_eq!(got.len(), 15);
        assert_eq!(
            got[11],
            Record::Chunk {
                id: 6,
                codec: Codec::Zstd,
                hash: [8; 16],
                data: b"de"
            }
        );
        match &got[12] {
            Record::Map { volume, first, ids } => {
                assert!(ids.narrow());
                assert_eq!((*volume, *first), (3, 7));
                assert_eq!(ids.iter().collect::<Vec<_>>(), vec![6, 0]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(got[13], Record::Release { nodes: 9 });
        // A 64-bit id survives whole.
        let mut big = Vec::new();
        Encoder::new(&mut big, 1).chunk(1 << 40, Codec::Raw, &[1; 16], b"x");
        Encoder::new(&mut big, 1).map(1, 0, &[1 << 40, u64::MAX]);
        let got_big: Vec<_> = records(&big, 1).map(|r| r.unwrap().1).collect();
        assert!(matches!(got_big[0], Record::Chunk { id, .. } if id == 1 << 40));
        match &got_big[1] {
            Record::Map { ids, .. } => {
                assert!(!ids.narrow());
                assert_eq!(ids.iter().collect::<Vec<_>>(), vec![1 << 40, u64::MAX]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            got[10],
            Record::Anchor {
                volume: 2,
                first: 5,
                count: 6
            }
        );
        assert_eq!(got[0], Record::SegmentStart { seq: 7, segment: 3 });
        match &got[1] {
            Record::Chunk {
                id,
                codec,
                hash,
                data,
            } => {
                assert_eq!(
                    (*id, *codec, *hash, *data),
                    (5, Codec::Lz4, [9; 16], &b"abc"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        match &got[2] {
            Record::Map { volume, first, ids } => {
                assert_eq!((*volume, *first), (1, 100));
                assert_eq!(ids.iter().collect::<Vec<_>>(), vec![1, 0, 5]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            got[3],
            Record::Unmap {
                volume: 2,
                first: 3,
                count: 4
            }
        );
        assert_eq!(
            got[4],
            Record::Copy {
                src: 1,
                src_first: 2,
                dst: 3,
                dst_first: 4,
                count: 5
            }
        );
        assert_eq!(
            got[5],
            Record::VolumeCreate {
                volume: 4,
                size: 1 << 30
            }
        );
        assert_eq!(got[6], Record::VolumeDelete { volume: 4 });
        assert_eq!(
            got[7],
            Record::VolumeResize {
                volume: 4,
                size: 2 << 30
            }
        );
        assert_eq!(got[8], Record::VolumeClone { src: 4, dst: 6 });
        match &got[9] {
            Record::Batch { inner } => {
                let inner: Vec<_> = records(inner, 7).map(|r| r.unwrap().1).collect();
                assert_eq!(inner.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            got[14],
            Record::Seal {
                next_segment: 4,
                next_seq: 8
            }
        );
        let last = records(&out, 7).last().unwrap().unwrap().0;
        assert_eq!(out.len() - last, SEAL_LEN);
        let mut start = Vec::new();
        Encoder::new(&mut start, 1).segment_start(1, 0);
        assert_eq!(start.len(), SEGMENT_START_LEN);
    }

    #[test]
    fn torn_stale_and_truncated_records_are_rejected() {
        let mut out = Vec::new();
        Encoder::new(&mut out, 9).map(1, 2, &[3, 4]);
        assert!(decode(&out, 9).is_ok());
        assert_eq!(decode(&out, 10).unwrap_err(), DecodeError::StaleSequence);
        assert_eq!(
            decode(&out[..out.len() - 1], 9).unwrap_err(),
            DecodeError::Truncated
        );
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, 9).is_err(), "flip at {i} accepted");
        }
        assert_eq!(decode(&[0u8; 64], 0).unwrap_err(), DecodeError::Checksum);
    }

    #[test]
    fn checksummed_garbage_is_malformed_not_a_panic() {
        let mut x: u64 = 0x1234_5678;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        };
        for _ in 0..5000 {
            let kind = next() % 18;
            let n = (next() % 48) as usize;
            let mut buf = vec![0u8; RECORD_HEADER];
            buf[4..8].copy_from_slice(&(n as u32).to_le_bytes());
            buf[8] = kind;
            buf.extend((0..n).map(|_| next()));
            let crc = crc32c::crc32c(&buf[4..]);
            buf[0..4].copy_from_slice(&crc.to_le_bytes());
            match decode(&buf, 0) {
                Ok((_, len)) => assert_eq!(len, buf.len()),
                Err(e) => assert!(matches!(e, DecodeError::Malformed(_)), "{e:?}"),
            }
        }
    }
}
