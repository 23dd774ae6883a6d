//! Garbage collection: relocating the live chunks of sparse segments and freeing empty ones.

use super::*;
use crate::meta::chunk_table::PER_PAGE as CHUNKS_PER_PAGE;
use crate::meta::tables::CHUNK_TABLE;
use crate::meta::tables::T_NODES;
use crate::state::Segment;

/// Whether chunk `id` is live and still stored at `offset` of segment `victim`.
fn live_at(m: &mut Meta, id: u64, victim: u32, offset: u32) -> Result<bool> {
    Ok(m.state
        .chunk(id)?
        .is_some_and(|c| c.segment == victim && c.offset == offset))
}

impl Engine {
    /// A writer found the log full: run the collector now. Returns whether the writer should
    /// try again: there is room, or this collection freed segments (which other writers may
    /// have taken meanwhile: with the lock released while the collector checkpoints and
    /// relocates, they keep writing, and comparing the free list's length before and after
    /// would turn their progress into this writer's out-of-space error).
    pub(super) fn collect_for_space(&self) -> Result<bool> {
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        let reserve = gc_reserve(self.geometry.segment_count) as usize;
        // Room in the log (free segments) and on the file system under it (which can fill
        // before the log does: freed segments give their space back).
        let room = || {
            let _m = self.lock_meta();
            let mut l = self.lock_log();
            l.segments.len() > reserve + 1 && self.room_for_data(&mut l)
        };
        if room() {
            // Another writer's collection already made room.
            return Ok(true);
        }
        // Volumes deleted and ranges unmapped give their chunks back as their nodes are
        // released: all of that first.
        self.release_nodes(u64::MAX)?;
        let freed_before = self.lock_log().segments.freed();
        // Relocating a nearly full segment costs a segment to win a sliver: require at least
        // a sixteenth of a segment to be dead, so every round gains ground.
        for _ in 0..self.geometry.segment_count {
            if self.collect_one(1.0 - 1.0 / 16.0, true)?.is_none() || room() {
                break;
            }
        }
        let freed = self.lock_log().segments.freed() > freed_before;
        Ok(room() || (freed && self.room_for_data(&mut self.lock_log())))
    }

    /// Clean the emptiest eligible segment whose live share is at most `max_live`. Returns
    /// the bytes relocated, or None when no segment qualifies. Takes a checkpoint first when
    /// the only candidates are too recent. Caller holds `maintenance`.
    pub(super) fn collect_one(&self, max_live: f64, may_checkpoint: bool) -> Result<Option<u64>> {
        let seg = self.geometry.segment_size as u64;
        let now = self.now();
        let first = self.tuning().unreadable_retry;
        let waiting = self.collector.waiting(now, first);
        let waiting = |i: u32, seq: u64| waiting.contains(&(i, seq));
        // From the victim index, not a scan: the cost is the index's buckets, not the log's
        // size, under the lock every command takes.
        let pick = |m: &Meta, eligible_only: bool| -> Option<(u32, u64, bool)> {
            let limit = (max_live * seg as f64) as u64;
            let covered = |s: &Segment| !eligible_only || m.checkpoint.covers(s.seq);
            let usable = |i, s: &Segment| (s.live == 0 || !waiting(i, s.seq)) && covered(s);
            let victim = m.state.emptiest_segment(limit, usable)?;
            let s = m.state.segment(victim);
            Some((victim, s.seq, s.live == 0))
        };
        let victim = {
            let m = self.lock_meta();
            match pick(&m, true) {
                Some(v) => Some(v),
                None if may_checkpoint && pick(&m, false).is_some() => None,
                None => return Ok(None),
            }
        };
        let (victim, seq, empty) = match victim {
            Some(v) => v,
            None => {
                self.checkpoint_locked()?;
                let m = self.lock_meta();
                match pick(&m, true) {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
        };
        // The segment is sealed: its bytes no longer change. Only the collector (us) moves
        // chunks out of it; hosts may free them meanwhile, which the liveness check sees.
        // Live bytes of a sealed segment only fall, so one found empty stays empty: nothing
        // to read or relocate (the common case after a large UNMAP or zeroing).
        let mut raw = vec![0u8; if empty { 0 } else { seg as usize }];
        self.wait_victim_written(victim)?;
        if !empty {
            if let Err(e) = self.log_device.read_at(&mut raw, victim as u64 * seg) {
                // The medium's failure, not the log's: writes go on. Hosts reading the
                // segment's chunks get medium errors until they rewrite them; once none is
                // live the segment is freed without being read.
                let retry = self.unreadable_again(victim, seq);
                tracing::error!(
                    "cannot read segment {victim} to collect it ({e}); the collector leaves it alone for {retry:?}"
                );
                return Ok(Some(0));
            }
            self.collector.read_succeeded(victim, seq);
        }
        let candidates = chunk_records(&raw, seq)
            .map_err(|e| self.poison(format!("segment {victim} damaged: {e}")))?;
        drop(raw);
        // The chunk pages that say which candidates are still live, read outside the lock.
        self.fault_in(
            candidates
                .iter()
                .map(|c| (CHUNK_TABLE, c.0 / CHUNKS_PER_PAGE))
                .collect(),
        )?;
        let mut relocated = 0u64;
        let batch_bytes = self.geometry.segment_size as usize / 16;
        // A batch may end one chunk record past `batch_bytes`; a segment switch can leave up
        // to one batch unused.
        let max_batch =
            batch_bytes + RECORD_HEADER + CHUNK_PREFIX + self.geometry.chunk_size as usize;
        let per_segment = seg as usize - SEGMENT_START_LEN - SEAL_LEN - max_batch;
        // Start only a relocation that can be finished: a half-relocated victim frees nothing,
        // and the segments it took are gone (down to the last free one, which a restart or
        // an unmap on a full array needs). The free segments the rest of the relocation needs
        // stay claimed (`FreeSegments::claim`: every other appender leaves them), and the
        // claim is recomputed from the bytes left after every batch.
        let _claim = ClaimEnd(self);
        let Some(mut remaining) = self.claim_for(&candidates, victim, batch_bytes, per_segment)?
        else {
            return Ok(None);
        };
        let mut i = 0;
        while i < candidates.len() {
            let mut m = self.lock_meta();
            let mut unwritten = Vec::new();
            // Hosts append to the same head between the relocation's batches, so a segment
            // the collector takes can be filled by them before its next batch. While free
            // segments are plentiful that costs nothing; once they are down to the claim
            // (and one), a segment the collector takes is filled with its batches in this one
            // lock hold, so every segment taken shrinks the claim by one and the claim never
            // exceeds the free list.
            let mut filling = false;
            while i < candidates.len() {
                let start = i;
                let mut take = Vec::new();
                let mut size = RECORD_HEADER;
                while i < candidates.len() && size < batch_bytes {
                    let (id, offset, ..) = &candidates[i];
                    let live = live_at(&mut m, *id, victim, *offset);
                    if live.map_err(|e| self.write_pending(&mut unwritten, e))? {
                        size += RECORD_HEADER + CHUNK_PREFIX + candidates[i].4.len();
                        take.push(i);
                    }
                    i += 1;
                }
                if take.is_empty() {
                    continue;
                }
                let (switches, free, claim) = {
                    let l = self.lock_log();
                    (
                        !l.head.fits(size, seg as usize),
                        l.segments.len(),
                        l.segments.claim(),
                    )
                };
                if switches && filling {
                    // The segment this hold took is full: the rest in later holds, with
                    // liveness checked again then.
                    i = start;
                    break;
                }
                filling |= switches && free <= claim + 1;
                let at = self
                    .reserve(&mut m, size, Space::Collector)
                    .map_err(|e| self.write_pending(&mut unwritten, e))?;
                let mut buf = Vec::with_capacity(size);
                let mut e = Encoder::new(&mut buf, at.seq);
                let batch = e.begin_batch();
                for &k in &take {
                    let (id, _, codec, hash, data) = &candidates[k];
                    e.chunk(*id, *codec, hash, data);
                }
                e.end_batch(batch);
                let appended = self
                    .append_unwritten(&mut m, at, buf)
                    .map_err(|e| self.write_pending(&mut unwritten, e))?;
                unwritten.push(appended);
                let moved = (size - RECORD_HEADER) as u64;
                m.counters.gc_bytes += moved;
                relocated += moved;
                remaining = remaining.saturating_sub(size);
                self.lock_log()
                    .segments
                    .set_claim(remaining.div_ceil(per_segment));
                if !filling {
                    break;
                }
            }
            // Hosts' commands go on while the relocation reaches the log (readers of the
            // chunks it moved wait for it).
            drop(m);
            for u in unwritten {
                self.write_unwritten(u)?;
            }
            #[cfg(test)]
            if let Some(hook) = self.between_relocation_holds.lock().unwrap().as_mut() {
                hook(self);
            }
        }
        // Relocations durable before the old copies can disappear; and the records that made
        // the victim's chunks dead (UNMAP, overwrites) durable before their data can be
        // overwritten, or a replay after a crash would map chunks that are gone.
        self.flush()?;
        self.free_sealed(&[victim], |_, live| {
            format!("segment {victim} still holds {live} live bytes after collection")
        })?;
        self.collector.count_relocated(relocated);
        Ok(Some(relocated))
    }

    /// Free every segment that holds no live chunk and no record the current checkpoint's
    /// replay needs, all at once: one flush for all of them and one discard per run of adjacent
    /// segments. After a large UNMAP or zeroing thousands of segments die together; freeing
    /// them one by one cost a sync and a hole punch each, and the hole punches contend with the
    /// log appends hosts wait for. Returns how many were freed. Caller holds `maintenance`.
    pub(super) fn collect_empty(&self) -> Result<usize> {
        let victims: Vec<u32> = {
            let m = self.lock_meta();
            m.state
                .empty_sealed_segments()
                .filter(|&i| m.checkpoint.covers(m.state.segment(i).seq))
                .collect()
        };
        if victims.is_empty() {
            return Ok(0);
        }
        // The records that made these segments' chunks dead must be durable before their
        // bytes can be overwritten, or a replay after a crash would map chunks that are gone.
        self.flush()?;
        // Only the collector (us, under `maintenance`) frees or fills sealed segments, and
        // live bytes of a sealed segment only fall.
        self.free_sealed(&victims, |v, live| {
            format!("segment {v} changed while being freed: {live} live bytes")
        })?;
        Ok(victims.len())
    }

    /// Free `victims`, sealed segments without live bytes whose deaths are durable: marked
    /// free, then, once no reader can still be reading them, on the free list (their space
    /// punched later). A victim that is not sealed or still holds live bytes poisons the
    /// engine with the message `changed` makes of it and its live bytes. Caller holds
    /// `maintenance`.
    fn free_sealed(&self, victims: &[u32], changed: impl Fn(u32, u64) -> String) -> Result<()> {
        let period = {
            let mut m = self.lock_meta();
            for &v in victims {
                if let Err(s) = m.state.free_sealed(v) {
                    return Err(self.poison(changed(v, s.live)));
                }
            }
            // No new reader can find them; wait out those that did.
            self.read_pins.advance()
        };
        self.read_pins.wait(period);
        let m = self.lock_meta();
        let mut l = self.lock_log();
        l.segments.add_collected(victims);
        l.check_segment_lists(Some(&m.state));
        Ok(())
    }

    /// Collect every segment whose live share is at most `max_live`, checkpointing as needed
    /// (operators' "collect now", tests and benchmarks). Returns the bytes relocated.
    pub fn collect_garbage(&self, max_live: f64) -> Result<u64> {
        self.check_writable()?;
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.release_nodes(u64::MAX)?;
        let mut total = 0;
        // Bounded: relocated data lands in new segments that could qualify again.
        for _ in 0..self.geometry.segment_count {
            match self.collect_one(max_live, true)? {
                Some(n) => total += n,
                None => break,
            }
        }
        Ok(total)
    }
}

/// Ends the collector's claim on free segments (see `FreeSegments::claim`) when a
/// relocation ends, however it ends.
struct ClaimEnd<'a>(&'a Engine);

impl Drop for ClaimEnd<'_> {
    fn drop(&mut self) {
        self.0.lock_log().segments.set_claim(0);
    }
}

/// A chunk record found in a segment being collected: (id, offset, codec, hash, stored bytes).
pub(super) type Candidate = (u64, u32, Codec, [u8; 16], Vec<u8>);

/// The chunk records (plain and in batches) of segment bytes `buf` written with sequence
/// `seq`, up to its seal or the first record that does not decode (the segment's unwritten
/// end); an error when a batch that decoded holds one that does not.
fn chunk_records(buf: &[u8], seq: u64) -> std::result::Result<Vec<Candidate>, String> {
    let mut candidates: Vec<Candidate> = Vec::new();
    for item in format::records(buf, seq) {
        let Ok((pos, record)) = item else {
            break;
        };
        match record {
            Record::Chunk {
                id,
                codec,
                hash,
                data,
            } => candidates.push((id, pos as u32, codec, hash, data.to_vec())),
            Record::Batch { inner } => {
                for item in format::covered_records(inner, seq) {
                    let (p, r) = item.map_err(|e| format!("{e:?}"))?;
                    if let Record::Chunk {
                        id,
                        codec,
                        hash,
                        data,
                    } = r
                    {
                        candidates.push((
                            id,
                            (pos + RECORD_HEADER + p) as u32,
                            codec,
                            hash,
                            data.to_vec(),
                        ));
                    }
                }
            }
            Record::Seal { .. } => break,
            _ => {}
        }
    }
    Ok(candidates)
}

impl Engine {
    /// Append `Release` records until at most `max` nodes were released or none awaits
    /// release: deleted volumes and unmapped ranges give their chunks back. Returns how many
    /// were released. The pages each record needs are read ahead, outside the lock.
    pub(super) fn release_nodes(&self, max: u64) -> Result<u64> {
        let mut done = 0u64;
        let mut end = None;
        while done < max {
            // The pages the next record reads, outside the lock.
            let next: Vec<u64> = {
                let m = self.lock_meta();
                let r = m.state.releasing();
                r.iter()
                    .rev()
                    .take(crate::state::MAX_RELEASE_NODES as usize)
                    .copied()
                    .collect()
            };
            if next.is_empty() {
                break;
            }
            let mut keys: Vec<(u8, u64)> = next.iter().map(|&n| (T_NODES, n)).collect();
            self.fault_in(keys.clone())?;
            {
                let mut m = self.lock_meta();
                for &n in &next {
                    if m.state.node(n).level == 0 {
                        if let Some(page) = m.state.pager_mut().peek(T_NODES, n) {
                            for e in page.chunks_exact(8) {
                                let id = u64::from_le_bytes(e.try_into().unwrap());
                                if holds_data(id) {
                                    keys.push((CHUNK_TABLE, id / CHUNKS_PER_PAGE));
                                }
                            }
                        }
                    }
                }
            }
            self.fault_in(keys)?;
            let mut m = self.lock_meta();
            // Others may have released some meanwhile: the count is taken under the lock the
            // record is applied under.
            let n = (m.state.releasing().len() as u32).min(crate::state::MAX_RELEASE_NODES);
            if n == 0 {
                break;
            }
            let mut probe = Vec::new();
            Encoder::new(&mut probe, 0).release(n);
            // Releasing frees space, so it may use the reserve; with none left at all the
            // collector goes on without it.
            let at = match self.reserve(&mut m, probe.len(), Space::Metadata) {
                Ok(at) => at,
                Err(EngineError::NoSpace) => break,
                Err(e) => return Err(e),
            };
            let mut buf = Vec::with_capacity(probe.len());
            Encoder::new(&mut buf, at.seq).release(n);
            end = Some(self.append_at(&mut m, at, &buf)?);
            done += n as u64;
        }
        // The records' segment switches are written before this returns (UNMAP and volume
        // deletion release inline); a round that appended nothing waits for nothing.
        if let Some(end) = end {
            self.wait_written(end)?;
        }
        Ok(done)
    }
}

impl Engine {
    /// The bytes relocating the live ones of `candidates` (chunk records of `victim`) takes
    /// in batches of `batch_bytes`, claimed as free segments of `per_segment` usable bytes
    /// (see `FreeSegments::claim`); None when the free list cannot hold them.
    fn claim_for(
        &self,
        candidates: &[Candidate],
        victim: u32,
        batch_bytes: usize,
        per_segment: usize,
    ) -> Result<Option<usize>> {
        let mut m = self.lock_meta();
        let mut needed = 0usize;
        for (id, offset, _, _, data) in candidates {
            if live_at(&mut m, *id, victim, *offset)? {
                needed += RECORD_HEADER + CHUNK_PREFIX + data.len();
            }
        }
        let total = if needed == 0 {
            0
        } else {
            needed + (needed / batch_bytes + 1) * RECORD_HEADER
        };
        let fresh = total.div_ceil(per_segment);
        let mut l = self.lock_log();
        if fresh > l.segments.len() {
            return Ok(None);
        }
        l.segments.set_claim(fresh);
        Ok(Some(total))
    }

    /// Return once no log write in `victim` is in flight. Victims are older than the last
    /// checkpoint, which waited for the log writes in flight before it; a range still in
    /// flight here would be read as torn records.
    fn wait_victim_written(&self, victim: u32) -> Result<()> {
        let unwritten = self.inflight.in_segment(victim);
        debug_assert!(
            unwritten.is_empty(),
            "victim {victim} has log writes in flight"
        );
        self.pay_owed()?;
        self.inflight
            .wait_for(&unwritten, &self.poisoned)
            .map_err(|_| self.poisoned_error())
    }

    /// A relocation failed with `error` after applying the batches `unwritten`: write them
    /// (their records are applied and registered in flight: left unwritten, every flush and
    /// every later write would wait for them for ever), then report `error`, or the write's
    /// own failure, which poisons the engine.
    fn write_pending(&self, unwritten: &mut Vec<Unwritten>, error: EngineError) -> EngineError {
        for u in unwritten.drain(..) {
            if let Err(e) = self.write_unwritten(u) {
                return e;
            }
        }
        error
    }

    /// Note a failed read of `segment` (in its use `seq`) and return how long the collector
    /// leaves it.
    fn unreadable_again(&self, segment: u32, seq: u64) -> Duration {
        // The clock and the tuning are leaves of the lock order, read before the collector's
        // entries, which are one too; `meta` comes before them, as the dedup check takes them.
        let now = self.now();
        let retry = self.tuning().unreadable_retry;
        let m = self.lock_meta();
        self.collector
            .read_failed(segment, seq, now, retry, |i| m.state.segment(i).seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{mem_engine, noise};
    use std::sync::atomic::AtomicU64;
    use std::sync::mpsc;

    const BLOCK: u64 = 4096;

    /// Unique host writes of one block each to `volume` from block `*next` on, made as the
    /// write path makes them but never collecting, until `done`.
    fn fill_until(engine: &Engine, volume: u32, next: &mut u64, done: impl Fn(&Engine) -> bool) {
        while !done(engine) {
            let block = noise(7_000_000 + *next, BLOCK as usize);
            let prepared = engine.prepare(&block).into_owned();
            let mut m = engine.lock_meta();
            let unwritten = engine.commit(&mut m, volume, *next, &[&prepared]).unwrap();
            drop(m);
            engine.write_unwritten(unwritten).unwrap();
            *next += 1;
        }
    }

    /// A relocation whose chunk page cannot be read after it applied a batch in the same lock
    /// hold writes that batch before it reports the error (da5130e). Before, the batch stayed
    /// registered in flight and unwritten: every later write and flush waited for it for ever.
    /// The victim starts with live chunks of chunk table page 1 and goes on with page 2's; the
    /// head has room for one batch, so the first hold relocates one batch; the array is full,
    /// so the second hold switches segments and fills the new one with batch after batch, and
    /// page 2, dropped from the cache and damaged between the holds, fails the second hold's
    /// second batch.
    #[test]
    fn a_relocation_failing_after_a_batch_in_its_hold_writes_that_batch() {
        let seg = 128u32 << 10;
        let tuning = Tuning {
            gc: GcPriority::Off,
            ..Tuning::default()
        };
        let (backend, engine) = mem_engine(16 << 20, seg, tuning);
        let v = engine.create_volume(8 << 20).unwrap();
        // Chunk ids are handed out in order: 24 blocks around the end of page 1's ids, the
        // later ones made half dead so that their segment is the emptiest.
        let page_2 = 2 * CHUNKS_PER_PAGE;
        let window = page_2 - 14;
        for start in (0..window).step_by(16) {
            let n = (window - start).min(16);
            let data = noise(start + 1, (n * BLOCK) as usize);
            engine.write(v, start * BLOCK, &data).unwrap();
        }
        let mut model = noise(999, 24 * BLOCK as usize);
        engine.write(v, window * BLOCK, &model).unwrap();
        for b in (14..24).step_by(2) {
            let data = noise(5000 + b, BLOCK as usize);
            engine.write(v, (window + b) * BLOCK, &data).unwrap();
            let at = (b * BLOCK) as usize;
            model[at..at + BLOCK as usize].copy_from_slice(&data);
        }
        let victim =
            {
                let mut m = engine.lock_meta();
                let place = |m: &mut Meta, id: u64| m.state.chunk(id).unwrap().unwrap();
                let first_of_page_2 = place(&mut m, page_2);
                // Page 1's last four chunks come before it in its segment: two batches.
                let page_1: Vec<_> = (page_2 - 4..page_2).map(|id| place(&mut m, id)).collect();
                assert!(page_1
                    .iter()
                    .all(|c| c.segment == first_of_page_2.segment
                        && c.offset < first_of_page_2.offset));
                first_of_page_2.segment
            };
        // The array full (free segments down to the reserve) and the victim older than the
        // checkpoint; then the head left with room for one batch (8 KiB), not two.
        let filler = engine.create_volume(64 << 20).unwrap();
        let mut next = 0;
        let reserve = gc_reserve(engine.geometry.segment_count) as usize;
        fill_until(&engine, filler, &mut next, |e| {
            e.lock_log().segments.len() <= reserve
        });
        engine.checkpoint().unwrap();
        fill_until(&engine, filler, &mut next, |e| {
            !e.lock_log().head.fits(13 << 10, seg as usize)
        });
        // Between the holds: page 2 dropped from the cache (clean since the checkpoint) and
        // damaged on the medium; how much the first hold relocated.
        let first_hold = Arc::new(AtomicU64::new(0));
        let (hold, damaged) = (first_hold.clone(), backend.clone());
        *engine.between_relocation_holds.lock().unwrap() = Some(Box::new(move |e: &Engine| {
            let mut m = e.lock_meta();
            if hold.swap(m.counters.gc_bytes, Ordering::Relaxed) != 0 {
                return;
            }
            let pager = m.state.pager_mut();
            let capacity = pager.capacity();
            pager.set_capacity(1);
            pager.set_capacity(capacity);
            assert_eq!(pager.missing([(CHUNK_TABLE, 2)]).len(), 1, "page 2 dropped");
            damaged.corrupt_meta(pager.loc(CHUNK_TABLE, 2).slot * 4096 + 100);
        }));
        let failed = {
            let _maintenance = engine.maintenance.lock().unwrap();
            engine.collect_one(0.9, false)
        };
        *engine.between_relocation_holds.lock().unwrap() = None;
        let error = failed.unwrap_err().to_string();
        assert!(error.contains("chunk table"), "{error}");
        let (relocated, first) = (
            engine.lock_meta().counters.gc_bytes,
            first_hold.load(Ordering::Relaxed),
        );
        assert!(
            first > 0 && relocated > first,
            "the failing hold applied a batch: {first} then {relocated} bytes relocated"
        );
        assert!(engine.poisoned().is_none());
        // A write and a flush complete (a hang guard, not a time limit: they took
        // milliseconds, or never completed).
        let engine = Arc::new(engine);
        let (done, finished) = mpsc::channel();
        let writer = engine.clone();
        std::thread::spawn(move || {
            let written = writer.write(v, 0, &noise(77, BLOCK as usize));
            done.send(written.and_then(|()| writer.flush())).unwrap();
        });
        let outcome = finished.recv_timeout(Duration::from_secs(60));
        assert!(matches!(outcome, Ok(Ok(()))), "{outcome:?}");
        // Undamaged again, every chunk reads back where it is, in the victim or moved.
        let slot = engine.lock_meta().state.pager().loc(CHUNK_TABLE, 2).slot;
        backend.corrupt_meta(slot * 4096 + 100);
        let mut back = vec![0u8; model.len()];
        engine.read(v, window * BLOCK, &mut back).unwrap();
        assert!(back == model, "the window reads back");
        assert_eq!(engine.check(&mut |_, _| {}), Vec::<String>::new());
        assert!(engine.lock_meta().state.segment(victim).live > 0);
    }
}
