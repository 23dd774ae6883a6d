//! Provisioning by metadata: UNMAP, ANCHOR, copies by reference, and the provisioning status of ranges.

use super::*;
use crate::meta::map_tree::{self, FANOUT};

impl Engine {
    /// Make `len` bytes at `offset` read as zeros and release their space.
    pub fn unmap(&self, volume: u32, offset: u64, len: u64) -> Result<()> {
        self.release(volume, offset, len, false)
    }

    /// Anchor `len` bytes at `offset` (SBC ANCHOR): whole chunks become anchored entries that
    /// read as zeros and hold space for a later write of them; partial chunks at the edges
    /// are zeroed as by [`Engine::unmap`]. [`EngineError::NoSpace`] when the space to hold is
    /// not free (nothing of that piece changes).
    pub fn anchor(&self, volume: u32, offset: u64, len: u64) -> Result<()> {
        self.release(volume, offset, len, true)
    }

    /// UNMAP (`anchor` false) or ANCHOR a byte range.
    pub(super) fn release(&self, volume: u32, offset: u64, len: u64, anchor: bool) -> Result<()> {
        self.check_writable()?;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, volume, offset, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        let cs = self.geometry.chunk_size as u64;
        let end = offset + len;
        let full_first = offset.div_ceil(cs);
        let full_end = end / cs;
        // Partial chunks at the edges: zero the covered bytes (a chunk that becomes all zeros
        // is unmapped by the write path).
        if full_first > full_end {
            return self.write(volume, offset, &vec![0u8; len as usize]);
        }
        if !offset.is_multiple_of(cs) {
            let head = full_first * cs - offset;
            self.write(volume, offset, &vec![0u8; head as usize])?;
        }
        if !end.is_multiple_of(cs) && full_end * cs >= offset {
            let tail = end - full_end * cs;
            self.write(volume, full_end * cs, &vec![0u8; tail as usize])?;
        }
        // Whole chunks: metadata only, in pieces that bound the time the lock is held.
        const PIECE: u64 = 64 * 1024;
        let mut c = full_first;
        while c < full_end {
            let n = PIECE.min(full_end - c);
            if anchor {
                self.append_data_meta_if(
                    |m| {
                        touch_edges(m, volume, c, n)?;
                        self.room_to_anchor(m, volume, c, n)
                    },
                    |e| e.anchor(volume, c, n),
                )?;
            } else {
                self.append_data_meta_if(
                    |m| touch_edges(m, volume, c, n),
                    |e| e.unmap(volume, c, n),
                )?;
            }
            // The leaves the range dropped give their chunks back now (bounded by the range).
            self.release_nodes(n / map_tree::FANOUT + 2)?;
            c += n;
        }
        self.wake_gc();
        Ok(())
    }

    /// Whether anchoring chunks `first..first + count` of `volume` leaves the space it holds
    /// free: segments outside the collector's reserve and the space already held.
    pub(super) fn room_to_anchor(
        &self,
        m: &mut Meta,
        volume: u32,
        first: u64,
        count: u64,
    ) -> Result<()> {
        if !m.state.has_volume(volume) {
            return Err(EngineError::NoSuchVolume(volume));
        }
        let new = m
            .state
            .entries(volume, first, count)?
            .iter()
            .filter(|&&id| id != ANCHORED)
            .count() as u64;
        let held = self.anchor_reserve(m.state.anchored() + new);
        // One segment more for the log records themselves (Space::Metadata keeps one).
        if self.lock_log().segments.len()
            < gc_reserve(self.geometry.segment_count) as usize + held + 1
        {
            return Err(EngineError::NoSpace);
        }
        Ok(())
    }

    /// Copy `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` by reference where
    /// chunks line up; returns false when they cannot (the caller then copies data).
    pub fn copy(
        &self,
        src: u32,
        src_offset: u64,
        dst: u32,
        dst_offset: u64,
        len: u64,
    ) -> Result<bool> {
        self.check_writable()?;
        {
            let m = self.lock_meta();
            Self::volume_range(&m, src, src_offset, len)?;
            Self::volume_range(&m, dst, dst_offset, len)?;
        }
        let cs = self.geometry.chunk_size as u64;
        let overlapping =
            src == dst && src_offset < dst_offset + len && dst_offset < src_offset + len;
        if len == 0 {
            return Ok(true);
        }
        if src_offset % cs != dst_offset % cs || overlapping {
            return Ok(false);
        }
        let end = src_offset + len;
        let full_first = src_offset.div_ceil(cs);
        let full_end = end / cs;
        let shift = |o: u64| o - src_offset + dst_offset;
        if full_first >= full_end {
            return Ok(false);
        }
        let mut bounce = Vec::new();
        let mut copy_bytes = |from: u64, n: u64| -> Result<()> {
            bounce.resize(n as usize, 0);
            self.read(src, from, &mut bounce)?;
            self.write(dst, shift(from), &bounce)
        };
        if full_first * cs > src_offset {
            copy_bytes(src_offset, full_first * cs - src_offset)?;
        }
        if end > full_end * cs {
            copy_bytes(full_end * cs, end - full_end * cs)?;
        }
        let dst_first = dst_offset.div_ceil(cs);
        const PIECE: u64 = crate::state::MAX_COPY_CHUNKS;
        let mut c = 0;
        let total = full_end - full_first;
        while c < total {
            let n = PIECE.min(total - c);
            let (s, d) = (full_first + c, dst_first + c);
            self.append_data_meta_if(
                |m| touch_copy(m, src, s, dst, d, n),
                |e| e.copy(src, s, dst, d, n),
            )?;
            c += n;
        }
        Ok(true)
    }

    /// Append a data-path metadata record (unmap, anchor, copy) after `check` passed under the
    /// same lock hold: needs no new chunk space, but log space; waits for the collector when
    /// the log is full.
    pub(super) fn append_data_meta_if(
        &self,
        check: impl Fn(&mut Meta) -> Result<()>,
        build: impl Fn(&mut Encoder),
    ) -> Result<()> {
        let mut collections = 0;
        loop {
            // `check` reads the pages the record will touch, so they are read ahead of the
            // lock (it changes nothing).
            let (mut m, checked) = self.lock_resident(&check);
            let mut probe = Vec::new();
            build(&mut Encoder::new(&mut probe, 0));
            // Freeing space must keep working on a full array: unmap may use the reserve.
            match checked.and_then(|()| self.reserve(&mut m, probe.len(), Space::Metadata)) {
                Ok(at) => {
                    let mut buf = Vec::with_capacity(probe.len());
                    build(&mut Encoder::new(&mut buf, at.seq));
                    let end = self.append_at(&mut m, at, &buf)?;
                    let pressure = CachePressure::of(m.state.pager());
                    drop(m);
                    // Returns once the log before the record is written too (a segment
                    // switch owed, a host write in flight), so a crash of the process alone
                    // keeps every command that returned, as for host writes.
                    self.wait_written(end)?;
                    return self.relieve_cache(pressure);
                }
                // Short of space: what the collector can return may be enough.
                Err(EngineError::NoSpace) => {
                    drop(m);
                    collections += 1;
                    if collections > MAX_COLLECTIONS || !self.collect_for_space()? {
                        return Err(EngineError::NoSpace);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Provisioning of chunk `index` onwards: its state and how many chunks from `index` share
    /// it. The run is cut at [`STATUS_SCAN_CHUNKS`] so the lock is held for a bounded time
    /// (a fully mapped 16 TiB volume would otherwise be scanned whole under it); callers that
    /// want the whole run ask again from where it stopped.
    pub fn chunk_status(&self, volume: u32, index: u64) -> Result<(ChunkState, u64)> {
        let (m, result) = self.lock_resident(|m| self.status_run(m, volume, index));
        drop(m);
        result
    }

    fn status_run(&self, m: &mut Meta, volume: u32, index: u64) -> Result<(ChunkState, u64)> {
        let vol = m
            .state
            .volume_map(volume)
            .ok_or(EngineError::NoSuchVolume(volume))?;
        let total = m.state.chunks_of(vol.size);
        if index >= total {
            return Err(EngineError::OutOfRange {
                volume,
                offset: index * self.geometry.chunk_size as u64,
                len: 0,
                size: vol.size,
            });
        }
        let limit = total.min(index + STATUS_SCAN_CHUNKS);
        Ok(m.state.entry_run(&vol, index, limit, ChunkState::of)?)
    }
}

/// Read the pages an unmap or anchor of chunks `first..first + count` changes entry by entry:
/// the partial leaves at both edges and the chunks they name (whole leaves in between are
/// dropped or replaced without being read).
fn touch_edges(m: &mut Meta, volume: u32, first: u64, count: u64) -> Result<()> {
    let end = first + count;
    let head = first..end.min(first.next_multiple_of(FANOUT));
    let tail = (end - end % FANOUT).max(first)..end;
    for range in [head, tail] {
        if range.is_empty() {
            continue;
        }
        for id in m
            .state
            .entries(volume, range.start, range.end - range.start)?
        {
            if holds_data(id) {
                m.state.chunk(id)?;
            }
        }
    }
    Ok(())
}

/// Read the pages a Copy record touches: where the ranges do not line up on leaves, every
/// entry of both and the chunks they name (each copied reference is counted, each replaced one
/// dropped); where they do, whole leaves are shared without being read.
fn touch_copy(m: &mut Meta, src: u32, s: u64, dst: u32, d: u64, n: u64) -> Result<()> {
    if s % FANOUT == d % FANOUT {
        touch_edges(m, src, s, n)?;
        return touch_edges(m, dst, d, n);
    }
    for (volume, first) in [(src, s), (dst, d)] {
        for id in m.state.entries(volume, first, n)? {
            if holds_data(id) {
                m.state.chunk(id)?;
            }
        }
    }
    Ok(())
}
