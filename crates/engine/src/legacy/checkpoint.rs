//! Format 2 checkpoints: the whole metadata state at one log position, so recovery replays
//! only the log written after it. Read to migrate a format 2 array (RFC 0001); written only by
//! tests that build format 2 arrays. Layout (little-endian; byte diagram in docs/design.md):
//!
//! ```text
//! "SLVRCKP1" | version u32 (2) | crc32c u32 (of the body) | body
//! body: config | head | counters | segments | chunks | pages | volumes
//! ```
//!
//! Version 1 checkpoints (the same body, lz4-compressed and size-prefixed) are still read.
//!
//! Pages shared between volumes are stored once and referenced by index, so a checkpoint
//! preserves sharing exactly (and with it the reference counts, which are recomputed on load).

use super::cow_vec::CowVec;
use super::state::{
    Chunk, Loc, Page, SegState, Segment, V2State, VolumeMap, ANCHORED, PAGE_ENTRIES,
};
use crate::format::{CHUNK_PREFIX, RECORD_HEADER};
use crate::le::{LeReader, LeWriter, Short};
pub use crate::meta::root::{Counters, Geometry, Head};

pub const CHECKPOINT_MAGIC: u64 = u64::from_le_bytes(*b"SLVRCKP1");
/// Version of the format 2 checkpoint. 2: the body is stored uncompressed, and logs may hold
/// Anchor records (kind 12), which version 1 binaries cannot replay.
pub const FORMAT_VERSION: u32 = 2;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Checkpoint version whose body is lz4-compressed (still read, no longer written).
const LZ4_BODY_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("not a sliver checkpoint")]
    Magic,
    #[error("checkpoint format version {0} is not supported")]
    Version(u32),
    #[error("checkpoint checksum mismatch")]
    Checksum,
    #[error("checkpoint is damaged: {0}")]
    Malformed(String),
}

impl From<Short> for CheckpointError {
    fn from(short: Short) -> Self {
        CheckpointError::Malformed(short.what().into())
    }
}

/// A checkpoint of `state` at `head`.
pub fn encode(geometry: &Geometry, head: Head, counters: Counters, state: &V2State) -> Vec<u8> {
    encode_parts(
        geometry,
        head,
        counters,
        &state.store.segments,
        &state.store.chunks,
        &state.volumes,
    )
}

fn encode_parts(
    geometry: &Geometry,
    head: Head,
    counters: Counters,
    segments: &CowVec<Segment>,
    chunks: &CowVec<Chunk>,
    volumes: &BTreeMap<u32, VolumeMap>,
) -> Vec<u8> {
    let pages_upper_bound: usize = volumes.values().map(|v| v.pages.len()).sum();
    let mut w = LeWriter(Vec::with_capacity(
        64 + segments.len() * 17 + chunks.len() * 32 + pages_upper_bound * (PAGE_ENTRIES * 4 + 12),
    ));
    geometry.write(&mut w);
    w.u32(head.segment);
    w.u64(head.seq);
    w.u32(head.offset);
    w.u64(counters.host_bytes);
    w.u64(counters.gc_bytes);
    w.u32(counters.next_volume);

    let used: Vec<(usize, &Segment)> = segments
        .iter()
        .enumerate()
        .filter(|(_, s)| s.state != SegState::Free)
        .collect();
    w.u32(used.len() as u32);
    for (i, s) in used {
        w.u32(i as u32);
        w.u8(if s.state == SegState::Open { 1 } else { 2 });
        w.u64(s.seq);
        w.u32(s.written);
    }

    let chunks: Vec<(usize, &Chunk)> = chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len != 0)
        .collect();
    w.u32(chunks.len() as u32);
    for (id, c) in chunks {
        w.u32(id as u32);
        w.bytes(&c.hash);
        w.u32(c.loc.segment);
        w.u32(c.loc.offset);
        w.u32(c.len);
    }

    let mut page_index: HashMap<*const Page, u32> = HashMap::new();
    let mut pages: Vec<&Page> = Vec::new();
    for map in volumes.values() {
        for page in map.pages.values() {
            page_index.entry(Arc::as_ptr(page)).or_insert_with(|| {
                pages.push(page);
                (pages.len() - 1) as u32
            });
        }
    }
    w.u32(pages.len() as u32);
    for page in &pages {
        for id in page.0.iter() {
            w.u32(*id);
        }
    }
    w.u32(volumes.len() as u32);
    for (id, map) in volumes {
        w.u32(*id);
        w.u64(map.size);
        w.u32(map.pages.len() as u32);
        for (no, page) in &map.pages {
            w.u64(*no);
            w.u32(page_index[&Arc::as_ptr(page)]);
        }
    }

    // Stored uncompressed: the bulk is chunk fingerprints, which do not compress (lz4 saved
    // 9 % of a 10 GiB array's checkpoint and cost 0.3-0.5 s of CPU each time).
    let mut out = Vec::with_capacity(w.0.len() + 16);
    out.extend_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&w.0).to_le_bytes());
    out.extend_from_slice(&w.0);
    out
}

pub struct Loaded {
    pub geometry: Geometry,
    pub head: Head,
    pub counters: Counters,
    pub state: V2State,
}

fn bad(what: &str) -> CheckpointError {
    CheckpointError::Malformed(what.to_string())
}

/// Decode a format 2 checkpoint of a log of `log_capacity` bytes. The capacity bounds what the
/// tables may declare before anything is allocated for them: a damaged count or id is an
/// error, not an allocation of gigabytes.
pub fn decode(bytes: &[u8], log_capacity: u64) -> Result<Loaded, CheckpointError> {
    if bytes.len() < 16 || u64::from_le_bytes(bytes[0..8].try_into().unwrap()) != CHECKPOINT_MAGIC {
        return Err(CheckpointError::Magic);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version != FORMAT_VERSION && version != LZ4_BODY_VERSION {
        return Err(CheckpointError::Version(version));
    }
    let crc = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
    let body = &bytes[16..];
    if crc32c::crc32c(body) != crc {
        return Err(CheckpointError::Checksum);
    }
    let decompressed;
    let raw = if version == LZ4_BODY_VERSION {
        // lz4 cannot expand more than ~255x: a larger declared size is damage, not a reason
        // to allocate it.
        let declared = body
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
        if declared > body.len().saturating_mul(255) {
            return Err(bad("declared size impossible for its compressed length"));
        }
        decompressed =
            lz4_flex::block::decompress_size_prepended(body).map_err(|e| bad(&e.to_string()))?;
        &decompressed[..]
    } else {
        body
    };
    let mut r = LeReader(raw);
    let geometry = Geometry::read(&mut r)?;
    // Format 2's create accepted the same sizes as today's.
    let sizes = crate::engine::EngineConfig {
        chunk_size: geometry.chunk_size,
        segment_size: geometry.segment_size,
    };
    if sizes.size_problem().is_some() {
        return Err(bad("impossible geometry"));
    }
    if geometry.segment_count as u64 * geometry.segment_size as u64 > log_capacity {
        return Err(bad("more segments than the log holds"));
    }
    // A new id was taken only when every smaller id was live, each live chunk holding at least
    // a record header and its prefix in the log: no id can exceed what the log could hold.
    let max_id = log_capacity / (RECORD_HEADER + CHUNK_PREFIX) as u64;
    let head = Head {
        segment: r.u32()?,
        seq: r.u64()?,
        offset: r.u32()?,
    };
    let counters = Counters {
        host_bytes: r.u64()?,
        gc_bytes: r.u64()?,
        next_volume: r.u32()?,
    };
    let mut state = V2State::new(geometry.chunk_size, geometry.segment_count);
    if head.segment >= geometry.segment_count || head.offset > geometry.segment_size {
        return Err(bad("head outside the log"));
    }
    for _ in 0..r.count(17)? {
        let i = r.u32()? as usize;
        let open = r.u8()? == 1;
        let seq = r.u64()?;
        let written = r.u32()?;
        let seg = state
            .store
            .segments
            .get_mut(i)
            .ok_or_else(|| bad("segment index"))?;
        *seg = Segment {
            state: if open {
                SegState::Open
            } else {
                SegState::Sealed
            },
            seq,
            written,
            live: 0,
        };
    }
    for _ in 0..r.count(32)? {
        let id = r.u32()?;
        let hash: [u8; 16] = r.take(16)?.try_into().unwrap();
        let loc = Loc {
            segment: r.u32()?,
            offset: r.u32()?,
        };
        let len = r.u32()?;
        if id == 0 || id as u64 > max_id || loc.segment >= geometry.segment_count || len == 0 {
            return Err(bad("chunk entry"));
        }
        if state.store.chunk(id).is_some() {
            return Err(bad("chunk listed twice"));
        }
        state.store.insert_new(id, hash, loc, len);
    }
    let mut pages = Vec::new();
    for _ in 0..r.count(PAGE_ENTRIES * 4)? {
        let mut page = Page::zeroed();
        for slot in page.0.iter_mut() {
            *slot = r.u32()?;
        }
        pages.push(Arc::new(page));
    }
    for _ in 0..r.count(16)? {
        let id = r.u32()?;
        let size = r.u64()?;
        let mut map = VolumeMap::new(size);
        for _ in 0..r.count(12)? {
            let no = r.u64()?;
            let page = pages
                .get(r.u32()? as usize)
                .ok_or_else(|| bad("page index"))?;
            map.pages.insert(no, page.clone());
        }
        (map.mapped, map.anchored) = map.counted();
        if state.volumes.insert(id, map).is_some() {
            return Err(bad("volume listed twice"));
        }
    }
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    drop(pages);
    for (id, refs) in state.count_references() {
        if id == ANCHORED {
            state.store.anchored = refs;
            continue;
        }
        match state.store.chunks.get_mut(id as usize) {
            Some(c) if c.len != 0 => c.refs = refs,
            _ => return Err(bad(&format!("map references missing chunk {id}"))),
        }
    }
    state.store.rebuild_free_ids();
    Ok(Loaded {
        geometry,
        head,
        counters,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Record;

    /// Version 1 checkpoints (lz4-compressed body) still load; unknown versions are refused.
    #[test]
    fn a_version_1_checkpoint_still_loads() {
        let mut state = V2State::new(4096, 8);
        let create = Record::VolumeCreate {
            volume: 1,
            size: 1 << 20,
        };
        let at = Loc {
            segment: 0,
            offset: 0,
        };
        state.apply(&create, at, 1).unwrap();
        let geometry = Geometry {
            chunk_size: 4096,
            segment_size: 1 << 20,
            segment_count: 8,
            key: [7; 32],
        };
        let head = Head {
            segment: 0,
            seq: 1,
            offset: 64,
        };
        let v2 = encode(&geometry, head, Counters::default(), &state);
        assert_eq!(u32::from_le_bytes(v2[8..12].try_into().unwrap()), 2);
        let body = lz4_flex::block::compress_prepend_size(&v2[16..]);
        let mut v1 = v2[..8].to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        v1.extend_from_slice(&body);
        let loaded = decode(&v1, 8 << 20).unwrap();
        assert_eq!(loaded.state.volumes[&1].size, 1 << 20);
        assert!(
            encode(
                &loaded.geometry,
                loaded.head,
                loaded.counters,
                &loaded.state
            ) == v2
        );
        let mut v3 = v2.clone();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            decode(&v3, 8 << 20),
            Err(CheckpointError::Version(3))
        ));
    }
}
