//! The write path: chunks fingerprinted and compressed outside the lock, deduplicated, appended as one batch.

use super::*;
use crate::meta::chunk_table::{ChunkEntry, PER_PAGE as CHUNKS_PER_PAGE};
use crate::meta::hooks::is_hook;
use crate::meta::pager::Entry;
use rustc_hash::FxHashMap;

/// A chunk shared this many times is not shared further (a dedup hit writes a new copy), so
/// its count never comes near saturating.
const DEDUP_MAX_REFS: u32 = 1 << 31;

/// Whether a chunk's bytes look like random data, which no compressor shrinks: a sample of
/// 512 bytes (every eighth of a 4 KiB chunk) holds at least 200 distinct values and none more
/// than ten times. Random bytes give about 221 distinct values with the most frequent seen
/// about seven times; text, records, zero runs and repeats within the chunk (a half repeated
/// at any distance halves the distinct values sampled) fall far below. The compressor's own
/// try costs more than this check on incompressible data (already compressed or encrypted
/// files, database pages full of random keys), and its output would be thrown away anyway.
fn looks_incompressible(data: &[u8]) -> bool {
    const SAMPLES: usize = 512;
    if data.len() < SAMPLES {
        return false;
    }
    let stride = data.len() / SAMPLES;
    let mut counts = [0u8; 256];
    let mut distinct = 0u32;
    for i in 0..SAMPLES {
        let c = &mut counts[data[i * stride] as usize];
        if *c == 10 {
            return false;
        }
        distinct += u32::from(*c == 0);
        *c += 1;
    }
    distinct >= 200
}

impl Engine {
    pub(super) fn prepare<'a>(&self, data: &'a [u8]) -> Prepared<'a> {
        if is_zero(data) {
            return Prepared::Zero;
        }
        let hash: [u8; 16] = blake3::keyed_hash(&self.geometry.key, data).as_bytes()[..16]
            .try_into()
            .unwrap();
        let compression = self.tuning.lock().unwrap().compression;
        let compressed = match compression {
            _ if looks_incompressible(data) => None,
            Compression::None => None,
            Compression::Lz4 => Some((Codec::Lz4, lz4_flex::block::compress(data))),
            Compression::Zstd(level) => zstd::bulk::compress(data, level)
                .ok()
                .map(|c| (Codec::Zstd, c)),
        };
        match compressed {
            Some((codec, bytes)) if bytes.len() < data.len() => Prepared::Data {
                hash,
                codec,
                bytes: bytes.into(),
            },
            _ => Prepared::Data {
                hash,
                codec: Codec::Raw,
                bytes: data.into(),
            },
        }
    }

    pub(super) fn volume_range(m: &Meta, volume: u32, offset: u64, len: u64) -> Result<()> {
        let size = m
            .state
            .volume_map(volume)
            .ok_or(EngineError::NoSuchVolume(volume))?
            .size;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(EngineError::OutOfRange {
                volume,
                offset,
                len,
                size,
            }),
        }
    }

    /// Write `data` at byte `offset` of `volume`. Chunks are deduplicated, compressed, and
    /// all-zero chunks unmapped. Not durable until [`Engine::flush`].
    pub fn write(&self, volume: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        let request = (offset, data.len() as u64);
        let cs = self.geometry.chunk_size as u64;
        let limit = self.batch_chunks() as u64 * cs;
        // The whole request is checked before anything is written. A write of whole chunks
        // that fits one batch (every small host write) is checked inside its own commit's lock
        // hold, before any change: one metadata lock acquisition per command instead of two,
        // and each is one more wait behind other commands' holds. Longer writes, and writes of
        // partial chunks (which read the old data first), are checked here first, as is an
        // end past u64.
        let end = offset.checked_add(data.len() as u64);
        let single = end.is_some()
            && offset.is_multiple_of(cs)
            && (data.len() as u64).is_multiple_of(cs)
            && !data.is_empty()
            && data.len() as u64 <= limit;
        if !single {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, data.len() as u64)?;
        }
        let Some(end) = end.filter(|_| !data.is_empty()) else {
            return Ok(());
        };
        // Pieces aligned to chunk boundaries, each one batch (crash-atomic).
        let mut pos = offset;
        while pos < end {
            let piece_end = ((pos / cs) * cs + limit).min(end);
            let slice = &data[(pos - offset) as usize..(piece_end - offset) as usize];
            self.write_piece(volume, request, pos, slice)?;
            pos = piece_end;
        }
        Ok(())
    }

    /// One batch: chunks `pos/cs ..= (end-1)/cs` of the write `request` (offset, length),
    /// whose range is checked again under the commit's lock hold.
    pub(super) fn write_piece(
        &self,
        volume: u32,
        request: (u64, u64),
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let cs = self.geometry.chunk_size as u64;
        let first = offset / cs;
        let last = (offset + data.len() as u64 - 1) / cs;
        let partial = |c: u64| -> bool {
            let start = c * cs;
            start < offset || start + cs > offset + data.len() as u64
        };
        // Full chunks do not depend on old data: prepare them once.
        let mut prepared: Vec<Option<Prepared>> = (first..=last)
            .map(|c| {
                if partial(c) {
                    None
                } else {
                    let a = (c * cs - offset) as usize;
                    Some(self.prepare(&data[a..a + cs as usize]))
                }
            })
            .collect();
        let partials: Vec<u64> = [first, last]
            .into_iter()
            .filter(|&c| partial(c))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut attempts = 0;
        let mut collections = 0;
        loop {
            attempts += 1;
            // Partial chunks: read the old content (optimistically, without the lock), merge,
            // and commit only if nobody changed those map entries meanwhile.
            let mut expected = Vec::new();
            for &c in &partials {
                let mut buf = vec![0u8; cs as usize];
                let old = self.read_chunks(volume, c, &mut buf)?[0];
                let start = c * cs;
                let from = offset.max(start);
                let to = (offset + data.len() as u64).min(start + cs);
                buf[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                prepared[(c - first) as usize] = Some(self.prepare(&buf).into_owned());
                expected.push((c, old));
            }
            let hashes: Vec<[u8; 16]> = prepared
                .iter()
                .filter_map(|p| match p {
                    Some(Prepared::Data { hash, .. }) => Some(*hash),
                    _ => None,
                })
                .collect();
            let n = last - first + 1;
            // With the pages the batch will touch cached (read outside the lock if not): the
            // entries it replaces and their chunks, and its dedup candidates.
            let (mut m, probed) = self.lock_resident(|m| -> Result<bool> {
                Self::volume_range(m, volume, request.0, request.1)?;
                for id in m.state.entries(volume, first, n)? {
                    if holds_data(id) {
                        m.state.chunk(id)?;
                    }
                }
                // A shared leaf (a snapshot's) is copied first: every chunk it names gains a
                // reference.
                let vol = m.state.volume_map(volume).expect("volume_range found it");
                for index in [first, last] {
                    for id in m.state.shared_leaf_entries(&vol, index)? {
                        if holds_data(id) {
                            m.state.chunk(id)?;
                        }
                    }
                }
                for hash in &hashes {
                    let candidate = match m.locality.get(hash) {
                        Some(id) => Some(id),
                        None if is_hook(hash) => m.state.hook(hash)?,
                        None => None,
                    };
                    if let Some(id) = candidate {
                        m.state.chunk(id)?;
                        // A hit loads the next chunk page into the locality cache too.
                        let next = id / CHUNKS_PER_PAGE + 1;
                        if next < m.state.chunk_pages() {
                            m.state.chunk_page(next)?;
                        }
                    }
                }
                // Compare id and fingerprint: an id freed and reused meanwhile has other
                // content.
                for &(c, old) in &expected {
                    let id = m.state.entry(volume, c)?;
                    if id != old.0
                        || (holds_data(id) && m.state.chunk(id)?.map(|x| x.hash) != Some(old.1))
                    {
                        return Ok(true);
                    }
                }
                Ok(false)
            });
            let changed = probed?;
            if changed {
                drop(m);
                if attempts > 1000 {
                    return Err(EngineError::Invalid(
                        "write kept racing with overlapping writes".into(),
                    ));
                }
                std::thread::yield_now();
                continue;
            }
            let items: Vec<&Prepared> = prepared
                .iter()
                .map(|p| p.as_ref().expect("prepared"))
                .collect();
            match self.commit(&mut m, volume, first, &items) {
                Err(EngineError::NoSpace) => {
                    drop(m);
                    collections += 1;
                    if collections <= MAX_COLLECTIONS && self.collect_for_space()? {
                        continue;
                    }
                    return Err(EngineError::NoSpace);
                }
                Ok(unwritten) => {
                    let pressure = CachePressure::of(m.state.pager());
                    // The log write happens without the lock: other commands go on meanwhile.
                    drop(m);
                    self.write_unwritten(unwritten)?;
                    return self.relieve_cache(pressure);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Encode and apply one batch mapping chunks `first..` of `volume`; the caller writes it
    /// to the log once it has let go of the lock.
    pub(super) fn commit(
        &self,
        m: &mut Meta,
        volume: u32,
        first: u64,
        items: &[&Prepared],
    ) -> Result<Unwritten> {
        // First what is new and what is stored already, and the room the batch needs; ids
        // for the new chunks only once the room is reserved, so a batch that fails for want
        // of space takes none (replay meets only ids of batches that were written).
        enum Slot {
            Zero,
            Stored(u64),
            /// The n-th new chunk of the batch.
            New(usize),
        }
        let mut slots = Vec::with_capacity(items.len());
        let mut new: Vec<(&[u8; 16], Codec, &[u8])> = Vec::new();
        // Under the lock: sized once, and hashed cheaply (the keys are keyed BLAKE3 already).
        let mut local: FxHashMap<[u8; 16], usize> =
            FxHashMap::with_capacity_and_hasher(items.len(), Default::default());
        let mut into_anchored = true;
        let mut size = RECORD_HEADER + RECORD_HEADER + 16 + 8 * items.len();
        let mut data = 0u64;
        for (k, item) in items.iter().enumerate() {
            let slot = match item {
                Prepared::Zero => Slot::Zero,
                Prepared::Data { hash, codec, bytes } => {
                    data += 1;
                    if let Some(&n) = local.get(hash) {
                        Slot::New(n)
                    } else if let Some(id) = self.find_duplicate(m, hash)? {
                        Slot::Stored(id)
                    } else {
                        // Without anchors anywhere (the usual case) no lookup is needed.
                        into_anchored &= m.state.anchored() > 0
                            && m.state.entry(volume, first + k as u64)? == ANCHORED;
                        local.insert(*hash, new.len());
                        new.push((hash, *codec, bytes));
                        size += RECORD_HEADER + CHUNK_PREFIX + bytes.len();
                        Slot::New(new.len() - 1)
                    }
                }
            };
            slots.push(slot);
        }
        // Writes of data already stored (dedup hits, zeros) need no chunk space: like UNMAP
        // they keep working on a full array.
        let class = if new.is_empty() {
            Space::Metadata
        } else if into_anchored {
            Space::AnchoredData
        } else {
            Space::Data
        };
        let at = self.reserve(m, size, class)?;
        let mut new_ids = Vec::with_capacity(new.len());
        for _ in &new {
            new_ids.push(m.state.allocate_chunk()?);
        }
        let ids: Vec<u64> = slots
            .iter()
            .map(|s| match s {
                Slot::Zero => 0,
                Slot::Stored(id) => *id,
                Slot::New(n) => new_ids[*n],
            })
            .collect();
        let new: Vec<(u64, &[u8; 16], Codec, &[u8])> = new
            .into_iter()
            .zip(&new_ids)
            .map(|((hash, codec, bytes), &id)| (id, hash, codec, bytes))
            .collect();
        let mut buf = Vec::with_capacity(size);
        let mut e = Encoder::new(&mut buf, at.seq);
        let batch = e.begin_batch();
        let mut host = 0u64;
        for (id, hash, codec, bytes) in &new {
            e.chunk(*id, *codec, hash, bytes);
            host += (RECORD_HEADER + CHUNK_PREFIX + bytes.len()) as u64;
        }
        e.map(volume, first, &ids);
        e.end_batch(batch);
        debug_assert_eq!(buf.len(), size);
        let unwritten = self.append_unwritten(m, at, buf)?;
        // The chunks just written are the freshest locality: the rest of the stream, and
        // repeats of its blocks, find them there.
        for group in new.chunk_by(|a, b| a.0 / CHUNKS_PER_PAGE == b.0 / CHUNKS_PER_PAGE) {
            m.locality.add(
                group[0].0 / CHUNKS_PER_PAGE,
                group.iter().map(|(id, hash, ..)| (**hash, *id)),
            );
        }
        m.counters.host_bytes += host;
        self.data_chunks_written.fetch_add(data, Ordering::Relaxed);
        self.dedup_chunks
            .fetch_add(data - new.len() as u64, Ordering::Relaxed);
        Ok(unwritten)
    }

    /// A stored chunk with this fingerprint, from the locality cache or a hook, confirmed
    /// against the chunk table (the index is advice: the id may have been freed and reused).
    fn find_duplicate(&self, m: &mut Meta, hash: &[u8; 16]) -> Result<Option<u64>> {
        let (candidate, hook) = match m.locality.get(hash) {
            Some(id) => (Some(id), false),
            None if is_hook(hash) => (m.state.hook(hash)?, true),
            None => (None, false),
        };
        let Some(id) = candidate else {
            return Ok(None);
        };
        match m.state.chunk(id)? {
            // Past 2^31 references a chunk is not shared further: a new copy is written. A
            // chunk in a segment the medium failed to read is not shared either: writing
            // its data again must store a good copy.
            Some(c)
                if c.hash == *hash
                    && c.refs < DEDUP_MAX_REFS
                    && !self.unreadable_segment(m, c.segment) => {}
            _ => return Ok(None),
        }
        let page = id / CHUNKS_PER_PAGE;
        if hook {
            self.load_locality(m, page)?;
        } else {
            m.locality.touch(page);
        }
        // Duplicates arrive in runs (a clone, a copy, a restore): the chunks written after
        // this one are in the next page.
        if hook || id % CHUNKS_PER_PAGE >= CHUNKS_PER_PAGE / 2 {
            self.load_locality(m, page + 1)?;
        }
        Ok(Some(id))
    }

    /// Whether the collector found `segment` (in its current use) unreadable.
    fn unreadable_segment(&self, m: &Meta, segment: u32) -> bool {
        self.collector
            .is_unreadable(segment, m.state.segment(segment).seq)
    }

    /// Put the fingerprints of chunk page `page` in the locality cache.
    fn load_locality(&self, m: &mut Meta, page: u64) -> Result<()> {
        if m.locality.contains_page(page) {
            m.locality.touch(page);
            return Ok(());
        }
        if page >= m.state.chunk_pages() {
            return Ok(());
        }
        let body = m.state.chunk_page(page)?;
        let entries: Vec<([u8; 16], u64)> = (0..CHUNKS_PER_PAGE)
            .filter_map(|k| {
                let e = ChunkEntry::read(&body[k as usize * 32..(k as usize + 1) * 32]);
                (e.len != 0).then_some((e.hash, page * CHUNKS_PER_PAGE + k))
            })
            .collect();
        m.locality.add(page, entries);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::looks_incompressible;
    use crate::engine::tests::noise as random;

    /// Random chunks are found out nearly always; anything LZ4 shrinks by a useful share is
    /// never skipped: text, a zero tail, a repeated half or phrase, a small alphabet.
    #[test]
    fn only_random_looking_chunks_skip_compression() {
        let skipped = (0..1000)
            .filter(|&s| looks_incompressible(&random(s, 4096)))
            .count();
        assert!(skipped >= 990, "random chunks skipped: {skipped} of 1000");
        let compressible = |data: &[u8]| {
            let packed = lz4_flex::block::compress(data).len();
            assert!(packed < data.len() * 9 / 10, "LZ4 shrinks it: {packed}");
            assert!(!looks_incompressible(data), "must be compressed");
        };
        let r = random(1, 4096);
        let mut zero_tail = r.clone();
        zero_tail[3072..].fill(0);
        compressible(&zero_tail);
        let mut halves = r[..2048].to_vec();
        halves.extend_from_slice(&r[..2048]);
        compressible(&halves);
        let mut phrase = r[..2048].to_vec();
        phrase.extend(r[..64].iter().cycle().take(2048));
        compressible(&phrase);
        let words = b"thin provisioned flash array unmap clone zero ";
        compressible(&words.iter().cycle().take(4096).copied().collect::<Vec<_>>());
        let hex: Vec<u8> = r
            .iter()
            .map(|b| b"0123456789abcdef"[(b & 15) as usize])
            .collect();
        assert!(!looks_incompressible(&hex));
        assert!(
            !looks_incompressible(&r[..100]),
            "short data is left to the compressor"
        );
    }
}
