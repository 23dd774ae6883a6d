//! The read path: map entries and chunk places resolved under the lock, data read and decoded outside it.

use super::*;

/// A chunk a read found in the map: its id and fingerprint.
type Seen = (u64, [u8; 16]);

/// Whether a read may wait for the disk (metadata pages, log data) or must give up instead.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReadMode {
    MayWait,
    CachedOnly,
}

impl Engine {
    /// Read bytes at `offset` of `volume` into `buf`. Unmapped space reads as zeros.
    pub fn read(&self, volume: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.host_activity.fetch_add(1, Ordering::Relaxed);
        let cs = self.geometry.chunk_size as u64;
        if buf.is_empty() {
            let m = self.lock_meta();
            return Self::volume_range(&m, volume, offset, 0);
        }
        let first = offset / cs;
        // Aligned reads go straight into `buf`; their range is checked inside `read_chunks`'
        // own lock hold (one acquisition per command, not two). Edges go through a bounce
        // buffer of whole chunks, so their request is checked here first, as is an end past
        // u64.
        let end = offset.checked_add(buf.len() as u64);
        let aligned = end.is_some_and(|end| offset.is_multiple_of(cs) && end.is_multiple_of(cs));
        if aligned {
            self.read_chunks(volume, first, buf)?;
            return Ok(());
        }
        {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, buf.len() as u64)?;
        }
        let last = (offset + buf.len() as u64 - 1) / cs;
        let mut bounce = sliver_volume::io_buffer((last - first + 1) as usize * cs as usize);
        self.read_chunks(volume, first, &mut bounce)?;
        let skip = (offset - first * cs) as usize;
        buf.copy_from_slice(&bounce[skip..skip + buf.len()]);
        Ok(())
    }

    /// [`Engine::read`] if it can be done without waiting: every metadata page it needs is
    /// cached, no write it overlaps is still being written and the data is in the page
    /// cache. `Ok(true)` when `buf` was filled; `Ok(false)` when the read would wait (call
    /// [`Engine::read`] on a thread that may). Reads not aligned to chunks always wait.
    pub fn read_cached(&self, volume: u32, offset: u64, buf: &mut [u8]) -> Result<bool> {
        let cs = self.geometry.chunk_size as u64;
        let end = offset.checked_add(buf.len() as u64);
        let aligned = end.is_some_and(|end| offset.is_multiple_of(cs) && end.is_multiple_of(cs));
        if buf.is_empty() || !aligned {
            return Ok(false);
        }
        let done = self
            .read_chunks_in(volume, offset / cs, buf, ReadMode::CachedOnly)?
            .is_some();
        if done {
            self.host_activity.fetch_add(1, Ordering::Relaxed);
        }
        Ok(done)
    }

    /// Fill `out` (whole chunks) with chunks `first..` of `volume`. Map entries and chunk
    /// locations are resolved under one lock and the segments pinned against reuse, so the
    /// bytes read are what the map held at that instant. Returns the (id, fingerprint) seen
    /// for each chunk. The chunks must lie in the volume (volume sizes are whole chunks):
    /// [`EngineError::OutOfRange`] otherwise.
    pub(super) fn read_chunks(&self, volume: u32, first: u64, out: &mut [u8]) -> Result<Vec<Seen>> {
        Ok(self
            .read_chunks_in(volume, first, out, ReadMode::MayWait)?
            .expect("a read that may wait completes"))
    }

    /// [`Engine::read_chunks`] in `mode`: `Ok(None)` when [`ReadMode::CachedOnly`] and the
    /// read would wait.
    fn read_chunks_in(
        &self,
        volume: u32,
        first: u64,
        out: &mut [u8],
        mode: ReadMode,
    ) -> Result<Option<Vec<Seen>>> {
        let cs = self.geometry.chunk_size as usize;
        let count = out.len() / cs;
        let cached_only = mode == ReadMode::CachedOnly;
        type Locs = (Vec<(u64, [u8; 16])>, Vec<Option<(u64, Loc, u32, u64)>>);
        let probe = |m: &mut Meta| -> Result<Locs> {
            Self::volume_range(m, volume, first.saturating_mul(cs as u64), out.len() as u64)?;
            let ids = m.state.entries(volume, first, count as u64)?;
            let mut seen = Vec::with_capacity(count);
            let mut locs = Vec::with_capacity(count);
            for (k, id) in ids.into_iter().enumerate() {
                if !holds_data(id) {
                    seen.push((id, [0; 16]));
                    locs.push(None);
                    continue;
                }
                let c = first + k as u64;
                let chunk = m.state.chunk(id)?.ok_or_else(|| EngineError::Corrupt {
                    offset: c * cs as u64,
                    reason: format!("map points at missing chunk {id}"),
                })?;
                seen.push((id, chunk.hash));
                let seq = m.state.segment(chunk.segment).seq;
                let loc = Loc {
                    segment: chunk.segment,
                    offset: chunk.offset,
                };
                locs.push(Some((id, loc, chunk.len, seq)));
            }
            Ok((seen, locs))
        };
        let (m, resolved) = if cached_only {
            // One look under the lock with page reads forbidden: a page that is not cached
            // is the waiting read's to fetch, and so is a lock another thread holds.
            let Some(mut m) = self.try_lock_meta() else {
                return Ok(None);
            };
            m.state.pager_mut().forbid_reads();
            let r = probe(&mut m);
            if !m.state.pager_mut().allow_reads().is_empty() {
                return Ok(None);
            }
            (m, r)
        } else {
            self.lock_resident(probe)
        };
        let (seen, locs) = resolved?;
        // Chunks whose records a write applied but has not written yet are read once it has.
        let unwritten = self
            .inflight
            .holding(locs.iter().flatten().map(|&(_, loc, ..)| loc));
        if cached_only && !unwritten.is_empty() {
            return Ok(None);
        }
        // Pinned in the hold that resolved the locations (never waits; see `read_pins`).
        let _pin = self.read_pins.pin();
        drop(m);
        if !unwritten.is_empty() {
            // Host ranges only: their writers write them before waiting for anything, so
            // nothing owed is needed here.
            self.inflight
                .wait_for(&unwritten, &self.poisoned)
                .map_err(|_| self.poisoned_error())?;
        }
        let mut i = 0;
        while i < count {
            let Some((_, loc, len, seq)) = locs[i] else {
                out[i * cs..(i + 1) * cs].fill(0);
                i += 1;
                continue;
            };
            // Coalesce chunks stored back to back into one read.
            let mut j = i + 1;
            let mut total = len as usize;
            while j < count && total < (1 << 20) {
                match locs[j] {
                    Some((_, l, n, _))
                        if l.segment == loc.segment
                            && l.offset as usize == loc.offset as usize + total =>
                    {
                        total += n as usize;
                        j += 1;
                    }
                    _ => break,
                }
            }
            let at = loc.segment as u64 * self.geometry.segment_size as u64 + loc.offset as u64;
            let run: Vec<(u64, u32)> = locs[i..j]
                .iter()
                .map(|slot| {
                    let (id, _, n, _) = slot.expect("coalesced");
                    (id, n)
                })
                .collect();
            let target = &mut out[i * cs..j * cs];
            if cached_only {
                // Errors, too, are the waiting read's to report (chunk by chunk).
                match self.read_run(&run, at, seq, target, mode) {
                    Ok(true) => {}
                    Ok(false) | Err(_) => return Ok(None),
                }
                i = j;
                continue;
            }
            if self.read_run(&run, at, seq, target, mode).is_err() {
                // A coalesced read failed: read its chunks one by one, so the error names the
                // chunk that fails (and a transient error costs nothing).
                let mut pos = 0u64;
                for (k, &(id, n)) in run.iter().enumerate() {
                    let one = &mut target[k * cs..(k + 1) * cs];
                    self.read_run(&[(id, n)], at + pos, seq, one, mode)
                        .map_err(|reason| EngineError::Corrupt {
                            offset: (first + (i + k) as u64) * cs as u64,
                            reason,
                        })?;
                    pos += n as u64;
                }
            }
            i = j;
        }
        Ok(Some(seen))
    }
}

impl Engine {
    /// Read the chunk records `run` ((id, record length) each), stored back to back at log
    /// offset `at`, into `out` (one chunk each), in one scatter read: a record stored raw
    /// lands in two parts, its head in a small buffer and its data straight in `out` (no
    /// bounce buffer, no copy); any other record in a buffer of its own, decoded from there.
    /// `Ok(false)`: [`ReadMode::CachedOnly`] and the bytes are not all in the page cache.
    fn read_run(
        &self,
        run: &[(u64, u32)],
        at: u64,
        seq: u64,
        out: &mut [u8],
        mode: ReadMode,
    ) -> std::result::Result<bool, String> {
        let cs = self.geometry.chunk_size as usize;
        let raw_len = format::CHUNK_HEAD + cs;
        let mut heads = vec![0u8; format::CHUNK_HEAD * run.len()];
        let mut whole: Vec<Vec<u8>> = run
            .iter()
            .map(|&(_, n)| match n as usize {
                n if n == raw_len => Vec::new(),
                n => sliver_volume::io_buffer(n),
            })
            .collect();
        {
            let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(2 * run.len());
            let parts = heads.chunks_mut(format::CHUNK_HEAD).zip(&mut whole);
            for ((head, record), target) in parts.zip(out.chunks_mut(cs)) {
                if record.is_empty() {
                    bufs.push(head);
                    bufs.push(target);
                } else {
                    bufs.push(record);
                }
            }
            let read = match mode {
                ReadMode::MayWait => self
                    .log_device
                    .read_vectored_at(&mut bufs, at)
                    .map(|()| true),
                ReadMode::CachedOnly => self.log_device.read_vectored_cached(&mut bufs, at),
            };
            if !read.map_err(|e| format!("read failed: {e}"))? {
                return Ok(false);
            }
        }
        let parts = heads.chunks(format::CHUNK_HEAD).zip(&whole).zip(run);
        for (((head, record), &(id, _)), target) in parts.zip(out.chunks_mut(cs)) {
            if !record.is_empty() {
                decode_chunk(record, seq, id, target)?;
                continue;
            }
            match format::raw_chunk(head, target, seq) {
                Some(Ok(got)) if got == id => {}
                Some(Ok(got)) => return Err(format!("record holds chunk {got}, expected {id}")),
                Some(Err(e)) => return Err(format!("record unreadable: {e:?}")),
                // Not a raw chunk record of this format: decoded whole, as any other.
                None => {
                    let mut record = head.to_vec();
                    record.extend_from_slice(target);
                    decode_chunk(&record, seq, id, target)?;
                }
            }
        }
        Ok(true)
    }
}

/// Decode one Chunk record into `out` (one chunk).
pub(super) fn decode_chunk(
    raw: &[u8],
    seq: u64,
    id: u64,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let (record, _) = format::decode(raw, seq).map_err(|e| format!("record unreadable: {e:?}"))?;
    let Record::Chunk {
        id: got,
        codec,
        data,
        ..
    } = record
    else {
        return Err("not a chunk record".into());
    };
    if got != id {
        return Err(format!("record holds chunk {got}, expected {id}"));
    }
    match codec {
        Codec::Raw if data.len() == out.len() => {
            out.copy_from_slice(data);
            Ok(())
        }
        Codec::Lz4 => match lz4_flex::block::decompress_into(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("lz4 data decompressed to {n} bytes")),
            Err(e) => Err(format!("lz4: {e}")),
        },
        Codec::Zstd => match zstd::bulk::decompress_to_buffer(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("zstd data decompressed to {n} bytes")),
            Err(e) => Err(format!("zstd: {e}")),
        },
        other => Err(format!(
            "unsupported stored form {other:?} ({} bytes)",
            data.len()
        )),
    }
}

impl Engine {
    /// Take the metadata lock with the pages `probe` needs cached. `probe` runs under the
    /// lock with page reads forbidden; when it wanted pages that are not cached, they are read
    /// outside the lock and it runs again (a lookup down a tree discovers one level a round).
    /// After a few rounds it runs with reads allowed, so it always completes. `probe` must not
    /// change anything before it has looked up every page it needs: a round it does not finish
    /// is abandoned.
    pub(super) fn lock_resident<T>(
        &self,
        mut probe: impl FnMut(&mut Meta) -> Result<T>,
    ) -> (MetaGuard<'_>, Result<T>) {
        for _ in 0..6 {
            let mut m = self.lock_meta();
            m.state.pager_mut().forbid_reads();
            let r = probe(&mut m);
            let wanted = m.state.pager_mut().allow_reads();
            if wanted.is_empty() {
                return (m, r);
            }
            drop(m);
            if let Err(e) = self.fault_in(wanted) {
                return (self.lock_meta(), Err(e));
            }
        }
        let mut m = self.lock_meta();
        let r = probe(&mut m);
        (m, r)
    }

    /// Read the metadata pages `keys` names that are not cached, without holding the lock
    /// during the reads, and cache them. A page whose place changed meanwhile (a checkpoint
    /// moved it) is left for the next lookup to read.
    pub(super) fn fault_in(&self, keys: Vec<(u8, u64)>) -> Result<()> {
        let (missing, source) = {
            let m = self.lock_meta();
            (
                m.state.pager().missing(keys),
                m.state.pager().source().clone(),
            )
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut read = Vec::with_capacity(missing.len());
        for (table, index, loc) in missing {
            match crate::meta::page_store::read_page(&*source, table, index, loc) {
                Ok(body) => read.push((table, index, loc, body)),
                // Reported by the lookup itself, under the lock, if it still stands.
                Err(_) => continue,
            }
        }
        let mut m = self.lock_meta();
        for (table, index, loc, body) in read {
            m.state.pager_mut().insert_read(table, index, loc, body);
        }
        Ok(())
    }
}
