//! The log: room at the head (switching segments), appends applied through `MetaState::apply`, group commit.

use super::inflight::OwedWrite;
use super::*;

impl Engine {
    /// Room for `len` bytes at the head, switching to a new segment when needed.
    pub(super) fn reserve(&self, m: &mut Meta, len: usize, class: Space) -> Result<Head> {
        let seg = self.geometry.segment_size as usize;
        if len + SEGMENT_START_LEN + SEAL_LEN > seg {
            return Err(EngineError::Invalid(format!(
                "record of {len} bytes exceeds a segment"
            )));
        }
        let mut l = self.lock_log();
        if !l.head.fits(len, seg) {
            if l.head.unsynced_switches() as u64 >= MAX_UNSYNCED_SEGMENTS {
                // The backstop of the bound a crash's sequence skip relies on (nothing has
                // made this many segment switches durable: checkpoints and hosts normally do).
                // The writes in flight below the head complete without `meta` or `log`, so
                // waiting for them here is safe; then the whole log up to the head is durable.
                self.wait_written(l.head.appended())?;
                if let Err(e) = self.log_device.sync() {
                    return Err(self.poison(format!("fsync of the log failed: {e}")));
                }
                let all = l.head.appended();
                l.head.synced_up_to(all);
            }
            let keep = match class {
                Space::Data => {
                    gc_reserve(self.geometry.segment_count) as usize
                        + self.anchor_reserve(m.state.anchored())
                        + l.segments.claim()
                }
                Space::AnchoredData => {
                    gc_reserve(self.geometry.segment_count) as usize + l.segments.claim()
                }
                Space::Metadata => 1 + l.segments.claim(),
                Space::Collector => 0,
            };
            if l.segments.len() <= keep {
                return Err(EngineError::NoSpace);
            }
            if matches!(class, Space::Collector) {
                l.segments.use_claim();
            }
            // New data stops while the file system still holds what frees space.
            if matches!(class, Space::Data | Space::AnchoredData) && !self.room_for_data(&mut l) {
                return Err(EngineError::NoSpace);
            }
            // A prepared segment needs no system call here: allocating file space under the
            // lock stalled every command for up to a second while the file system committed
            // its journal for a checkpoint's fsync.
            let Some(taken) = l.segments.take_for_head() else {
                return Err(EngineError::NoSpace);
            };
            if taken.was_preparing {
                self.stop_writing_ahead(taken.segment);
            }
            if l.segments.ready_len() < READY_SEGMENTS / 2 {
                self.wake_segments();
            }
            let next = taken.segment;
            let base = next as u64 * seg as u64;
            let mut allocated = if taken.prepared {
                Ok(())
            } else {
                self.log_device.allocate(base, seg as u64)
            };
            if matches!(&allocated, Err(e) if e.raw_os_error() == Some(libc::ENOSPC))
                && l.segments.any_undiscarded()
            {
                // The file system is full but free segments still hold space: give it back
                // now (the lock keeps them from being reused meanwhile) and try again.
                self.punch_all_pending(&mut l);
                allocated = self.log_device.allocate(base, seg as u64);
            }
            if let Err(e) = allocated {
                l.segments.put_back(next);
                return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    EngineError::NoSpace
                } else {
                    self.poison(format!("cannot allocate a log segment: {e}"))
                });
            }
            let old = l.head.at();
            let next_seq = old.seq + 1;
            let mut seal = Vec::new();
            Encoder::new(&mut seal, old.seq).seal(next, next_seq);
            let mut start = Vec::new();
            Encoder::new(&mut start, next_seq).segment_start(next_seq, next);
            if self.log_device.allocation_reserves() {
                // Written by whoever next waits for the log, usually with no lock held (see
                // `inflight`): in flight until then, so no flush counts them durable and the
                // collector leaves the old segment alone. Their failure poisons the engine.
                let position = l.head.appended();
                self.inflight.owe(OwedWrite {
                    position,
                    segment: old.segment,
                    offset: old.offset,
                    bytes: seal,
                });
                self.inflight.owe(OwedWrite {
                    position: position + SEAL_LEN as u64,
                    segment: next,
                    offset: 0,
                    bytes: start,
                });
            } else if let Err(e) = self
                .write_log(old.segment, old.offset, &seal)
                .and_then(|()| self.write_log(next, 0, &start))
            {
                // Without reserved space a write can fail for want of it, which must be known
                // before the records apply. On failure nothing changed: the head stays where
                // it was (the next record overwrites a seal written there) and the segment
                // goes back.
                l.segments.put_back(next);
                return Err(e);
            }
            let sealed_at = Loc {
                segment: old.segment,
                offset: old.offset,
            };
            m.state
                .apply_seal(sealed_at, old.seq, next, next_seq)
                .and_then(|()| m.state.apply_start(next, next_seq))
                .map_err(|e| self.poison(format!("applying a segment switch: {e}")))?;
            l.head.switch(next, next_seq);
            l.check_segment_lists(Some(&m.state));
        }
        Ok(l.head.at())
    }

    /// The byte offset in the log area of `offset` in `segment`.
    fn log_offset(&self, segment: u32, offset: u32) -> u64 {
        segment as u64 * self.geometry.segment_size as u64 + offset as u64
    }

    pub(super) fn write_log(&self, segment: u32, offset: u32, bytes: &[u8]) -> Result<()> {
        let at = self.log_offset(segment, offset);
        match self.log_device.write_at(bytes, at) {
            Ok(()) => Ok(()),
            Err(e) if out_of_space(&e) => self.clear_cut_short(at, bytes),
            Err(e) => Err(self.poison(format!("log write failed: {e}"))),
        }
    }

    /// A log write failed for want of space (a file system without fallocate, or one that
    /// filled behind our back): the file may hold a prefix of it. Nothing refers to those
    /// bytes, as the head has not moved, but the next record written there may be shorter and
    /// leave whole records of the prefix (a batch's inner chunk records) right behind it,
    /// where a replay would apply them. Zero the prefix; NoSpace when that works.
    pub(super) fn clear_cut_short(&self, at: u64, bytes: &[u8]) -> Result<()> {
        let mut found = vec![0u8; bytes.len()];
        if let Err(e) = self.log_device.read_at(&mut found, at) {
            return Err(self.poison(format!(
                "cannot read back a log write cut short by a full file system: {e}"
            )));
        }
        let landed = found.iter().zip(bytes).take_while(|(a, b)| a == b).count();
        if landed > 0 {
            if let Err(e) = self.log_device.write_at(&vec![0u8; landed], at) {
                return Err(self.poison(format!(
                    "cannot clear a log write cut short by a full file system: {e}"
                )));
            }
        }
        Err(EngineError::NoSpace)
    }

    /// Whether the file system can take a segment of new data and still hold what frees space
    /// (a segment of metadata or relocations, a checkpoint). When it cannot, freed segments
    /// whose space was not given back yet are punched first.
    pub(super) fn room_for_data(&self, l: &mut Log) -> bool {
        let seg = self.geometry.segment_size as u64;
        if self.log_device.has_room(seg, seg) {
            return true;
        }
        if !l.segments.any_undiscarded() {
            return false;
        }
        self.punch_all_pending(l);
        self.log_device.has_room(seg, seg)
    }

    /// Write `bytes` (records encoded for `at.seq`) at the reserved position and apply them,
    /// all under the lock (metadata records, relocations, copies: see [`Unwritten`] for host
    /// writes). Returns the log position after them, for [`Engine::wait_written`].
    pub(super) fn append_at(&self, m: &mut Meta, at: Head, bytes: &[u8]) -> Result<u64> {
        self.validate_append(m, at, bytes)?;
        self.write_log(at.segment, at.offset, bytes)?;
        self.apply_append(m, at, bytes)
    }

    /// Apply `bytes` (records encoded for `at.seq`, at the reserved position) and register
    /// them as in flight; the caller writes them with [`Engine::write_unwritten`] once it has
    /// let go of the lock. Used where the write may take as long as the file system makes it
    /// (a host write), so that other commands do not wait for it.
    pub(super) fn append_unwritten(
        &self,
        m: &mut Meta,
        at: Head,
        bytes: Vec<u8>,
    ) -> Result<Unwritten> {
        if !self.log_device.allocation_reserves() {
            // Without fallocate a write can still run out of space, which must be known
            // before the records are applied.
            self.append_at(m, at, &bytes)?;
            return Ok(Unwritten::Written);
        }
        self.validate_append(m, at, &bytes)?;
        let position = {
            let mut l = self.lock_log();
            let position = l.head.appended();
            l.head.advance(bytes.len());
            // Registered as the head moves past it, under the log's lock: a flush reading the
            // head's length finds the range in flight, never counts it written.
            self.inflight
                .register(position, at.segment, at.offset, bytes.len() as u32);
            position
        };
        self.apply_records(m, at, &bytes)?;
        Ok(Unwritten::Pending {
            position,
            segment: at.segment,
            offset: at.offset,
            bytes,
        })
    }

    /// Write what [`Engine::append_unwritten`] applied (without the lock), and return once
    /// every range before it is written too. A failure poisons the engine: the state is
    /// ahead of the log, and the range stays in flight so that no reader or flush takes its
    /// bytes as written.
    pub(super) fn write_unwritten(&self, unwritten: Unwritten) -> Result<()> {
        let Unwritten::Pending {
            position,
            segment,
            offset,
            bytes,
        } = unwritten
        else {
            return Ok(());
        };
        if let Err(e) = self
            .log_device
            .write_at(&bytes, self.log_offset(segment, offset))
        {
            return Err(self.poison(format!(
                "log write failed after its records were applied: {e}"
            )));
        }
        self.inflight.complete(position);
        // Acknowledged in log order: once a command returns, the log before its records is
        // written too, so a crash of the process alone (the page cache survives) keeps every
        // write acknowledged, as when the log was written under the lock.
        self.wait_written(position)
    }

    /// Nothing reaches the log that `apply` would refuse (see `MetaState::validate`).
    fn validate_append(&self, m: &Meta, at: Head, bytes: &[u8]) -> Result<()> {
        debug_assert_eq!(at, self.lock_log().head.at());
        for item in format::covered_records(bytes, at.seq) {
            let (_, record) = item
                .map_err(|e| self.poison(format!("self-encoded record failed to decode: {e:?}")))?;
            let inner: Vec<Record<'_>> = match &record {
                Record::Batch { inner } => format::covered_records(inner, at.seq)
                    .filter_map(|r| r.ok().map(|(_, r)| r))
                    .collect(),
                _ => vec![record],
            };
            for r in &inner {
                m.state
                    .validate(r)
                    .map_err(|e| EngineError::Invalid(format!("refused: {e}")))?;
            }
        }
        Ok(())
    }

    /// Move the head past `bytes` (written already) and apply their records.
    fn apply_append(&self, m: &mut Meta, at: Head, bytes: &[u8]) -> Result<u64> {
        let end = {
            let mut l = self.lock_log();
            l.head.advance(bytes.len());
            l.head.appended()
        };
        self.apply_records(m, at, bytes)?;
        Ok(end)
    }

    /// Apply the records of `bytes`, appended at `at` (the head has moved past them).
    fn apply_records(&self, m: &mut Meta, at: Head, bytes: &[u8]) -> Result<()> {
        let mut records = format::covered_records(bytes, at.seq).peekable();
        while let Some(item) = records.next() {
            let (pos, record) = item
                .map_err(|e| self.poison(format!("self-encoded record failed to decode: {e:?}")))?;
            let end = match records.peek() {
                Some(Ok((next, _))) => *next,
                _ => bytes.len(),
            };
            let loc = Loc {
                segment: at.segment,
                offset: at.offset + pos as u32,
            };
            m.checkpoint.count_records(match &record {
                Record::Batch { inner } => format::covered_records(inner, at.seq).count() as u64,
                _ => 1,
            });
            m.state
                .apply(&record, loc, (end - pos) as u32, at.seq)
                .map_err(|e| self.poison(format!("applying a new record: {e}")))?;
        }
        Ok(())
    }

    /// Write the segment switches' records that no thread has started writing (see
    /// `inflight`): every wait for the log below a position does this first. A failure
    /// poisons the engine (the switch is applied already).
    pub(super) fn pay_owed(&self) -> Result<()> {
        for owed in self.inflight.take_owed() {
            let at = self.log_offset(owed.segment, owed.offset);
            if let Err(e) = self.log_device.write_at(&owed.bytes, at) {
                return Err(self.poison(format!(
                    "log write of a segment switch failed after it was applied: {e}"
                )));
            }
            self.inflight.complete(owed.position);
        }
        Ok(())
    }

    /// Wait until the log ranges in flight before `position` are written.
    pub(super) fn wait_written(&self, position: u64) -> Result<()> {
        self.pay_owed()?;
        self.inflight
            .wait_below(position, &self.poisoned)
            .map_err(|_| self.poisoned_error())
    }

    /// The error of a poisoned engine.
    pub(super) fn poisoned_error(&self) -> EngineError {
        EngineError::Poisoned(self.poison.lock().unwrap().clone().unwrap_or_default())
    }

    /// Make every write completed so far durable (group commit: concurrent callers share one
    /// sync).
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let target = self.lock_log().head.appended();
        // Writes applied before this call may still be on their way to the log.
        self.wait_written(target)?;
        let mut f = self.flush.lock().unwrap();
        loop {
            if self.poisoned.load(Ordering::Acquire) {
                return Err(self.poisoned_error());
            }
            if f.durable >= target {
                return Ok(());
            }
            if !f.syncing {
                f.syncing = true;
                drop(f);
                // Durable after the sync: the log up to the first range still in flight
                // (ranges register under the log's lock as the head moves past them, so none
                // can start below `appended` later).
                let upto = {
                    let l = self.lock_log();
                    let appended = l.head.appended();
                    self.inflight.first().map_or(appended, |p| p.min(appended))
                };
                let result = self.log_device.sync();
                self.log_syncs.fetch_add(1, Ordering::Relaxed);
                if result.is_ok() {
                    // The segments opened before `upto` are durable with all the log before
                    // them: replay reaches them.
                    self.lock_log().head.synced_up_to(upto);
                }
                f = self.flush.lock().unwrap();
                f.syncing = false;
                match result {
                    Ok(()) => f.durable = f.durable.max(upto),
                    Err(e) => {
                        drop(f);
                        let err = self.poison(format!("fsync of the log failed: {e}"));
                        self.flushed.notify_all();
                        return Err(err);
                    }
                }
                self.flushed.notify_all();
            } else {
                f = f.wait(&self.flushed).unwrap();
            }
        }
    }
}

/// ENOSPC or EDQUOT: the file system (or the quota) is full.
pub(super) fn out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What [`Engine::append_unwritten`] leaves to write.
#[must_use = "applied records must be written"]
pub(super) enum Unwritten {
    /// Written under the lock already (a backend that cannot reserve space).
    Written,
    /// Applied and registered in flight at log `position`; `bytes` go at `offset` of `segment`.
    Pending {
        position: u64,
        segment: u32,
        offset: u32,
        bytes: Vec<u8>,
    },
}
