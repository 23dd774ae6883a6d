//! Segment space in the file: allocated (and, under small syncs, written) ahead of the head
//! outside the lock, given back (hole punching) when freed.

use super::*;

/// Bytes written ahead per call: the head, taking the segment back under the log's lock,
/// waits for at most one (its write and its write-back, about a millisecond here).
const WRITE_AHEAD_PIECE: u64 = 256 << 10;

impl Engine {
    /// Free segments beyond the collector's reserve and a margin of two for writers: how many
    /// may leave the free list for a while (to be allocated ahead, or punched).
    fn spare_free_segments(&self, l: &Log) -> usize {
        l.segments
            .len()
            .saturating_sub(gc_reserve(self.geometry.segment_count) as usize + 2)
    }

    /// Allocate the file space of up to [`READY_SEGMENTS`] free segments outside the metadata
    /// lock, so the head moves on without a system call under it, and write them ahead while
    /// the log's syncs are small ([`SegmentPreparer::syncs_are_small`]), as well as ready segments that were
    /// allocated under large syncs and never written. Returns how many became ready.
    /// The segments stay on the free list meanwhile (marked `preparing`), so free space as
    /// writers and reports see it does not change.
    pub fn prepare_segments(&self) -> usize {
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return 0;
        }
        let seg = self.geometry.segment_size as u64;
        // Only where the file system has room to spare for them and as much again: on a small
        // or nearly full one the head allocates as it goes, and a full file system is
        // reported by the write that needs the space (27/07), not by this thread.
        let ready_bytes = READY_SEGMENTS as u64 * seg;
        if !self.log_device.has_room(ready_bytes, ready_bytes) {
            return 0;
        }
        let (taken, appended) = {
            let mut l = self.lock_log();
            // Never more than the writers' own margin over the collector's reserve.
            let spare = self.spare_free_segments(&l);
            (
                l.segments.start_preparing(READY_SEGMENTS, spare),
                l.head.appended(),
            )
        };
        let syncs = self.log_syncs.load(Ordering::Relaxed);
        let ahead = self.preparer.syncs_are_small(syncs, appended);
        // One at a time, each ready as soon as it is: the head need not wait for the round.
        let mut ready = 0;
        for (s, mut written) in taken {
            let mut ok = self.log_device.allocate(s as u64 * seg, seg).is_ok();
            if ok && ahead && !written {
                ok = self.write_segment_ahead(s);
                written = ok;
            }
            ready += usize::from(self.finish_preparing(s, ok, written));
        }
        if ahead {
            self.write_ready_segments_ahead();
        }
        ready
    }

    /// Write ahead the ready segments allocated while syncs were large, a few at a time
    /// (the head takes the others meanwhile), until none is left or the engine stops.
    fn write_ready_segments_ahead(&self) {
        const AT_ONCE: usize = 4;
        while !self.stop.load(Ordering::Acquire) && !self.poisoned.load(Ordering::Acquire) {
            let taken = self.lock_log().segments.start_writing_ahead(AT_ONCE);
            if taken.is_empty() {
                return;
            }
            let mut failed = false;
            for s in taken {
                // After a failure (logged) the rest stay as they are, for a later round.
                let written = !failed && self.write_segment_ahead(s);
                failed |= !written;
                self.finish_preparing(s, true, written);
            }
            if failed {
                return;
            }
        }
    }

    /// The preparer is done with `s` (see [`FreeSegments::finish_preparing`]): false when the
    /// head took it meanwhile or it could not be allocated.
    fn finish_preparing(&self, s: u32, allocated: bool, written: bool) -> bool {
        let mut l = self.lock_log();
        // When allocating failed, the file system is full: the head allocates (and reports)
        // itself.
        let kept = l.segments.finish_preparing(s, allocated, written);
        l.check_segment_lists(None);
        kept && allocated
    }

    /// Write free segment `s` ahead, piece by piece, unless the head takes it meanwhile (or
    /// shutdown does), then sync it ([`LogDevice::sync_written_ahead`], which leaves any error
    /// it meets to be reported by the log's next sync too). False when the backend failed
    /// (the head then allocates the segment itself; a failed sync poisons the engine, as
    /// every failed sync of the log does: the kernel may have dropped the log's unwritten
    /// pages).
    ///
    /// The sync is here so that the file system records the conversion of the segment's
    /// blocks once, in this thread, and not with whichever host sync comes next: without it
    /// every piece written ahead added an extent block and the inode, written one after the
    /// other, to a write-through write's sync (4 KiB random writes at QD 32 in write-through:
    /// 22.8k to 24.6k IOPS, p99 6.0 to 5.0 ms; docs/benchmarks.md, "Write-through").
    pub(super) fn write_segment_ahead(&self, s: u32) -> bool {
        let seg = self.geometry.segment_size as u64;
        let base = s as u64 * seg;
        {
            // Marked under the log's lock, and only while still being prepared: the head
            // removes a segment from `preparing` and clears the mark under that lock too, so
            // either it sees the mark or this sees the segment gone, never neither.
            let l = self.lock_log();
            if !l.segments.is_preparing(s) {
                return true;
            }
            self.preparer.start_writing(s);
        }
        let mut at = 0;
        let mut written = true;
        while at < seg {
            let len = (seg - at).min(WRITE_AHEAD_PIECE);
            let Some(piece) = self.preparer.piece(s) else {
                // Taken: what was written ahead lies behind the head's records.
                return true;
            };
            if let Err(e) = self.log_device.write_ahead(base + at, len) {
                tracing::warn!("could not write segment {s} ahead: {e}");
                written = false;
                break;
            }
            drop(piece);
            at += len;
        }
        self.stop_writing_ahead(s);
        if !written {
            return false;
        }
        if let Err(e) = self.log_device.sync_written_ahead(base, seg) {
            self.poison(format!("fsync of the log failed: {e}"));
            return false;
        }
        true
    }

    /// Segment `s` is no longer being prepared (the head took it, shutdown gave it back, or
    /// writing it ahead ended): no more of it is written ahead once this returns. The order
    /// is the log's lock, then this one.
    pub(super) fn stop_writing_ahead(&self, s: u32) {
        self.preparer.stop_writing(s);
    }

    /// Give the file space of up to `max` free segments back to the file system (hole
    /// punching), lowest first; returns how many. They leave the free list meanwhile so no
    /// writer can reuse one while its hole is punched.
    ///
    /// Freed segments are not punched at once: on a file system a hole punch takes the
    /// inode's locks and drops the page cache of the range, stalling every log append and read
    /// behind it (zeroing 100 GiB of written data took four times longer while the collector
    /// punched). Maintenance calls this while hosts are idle; a writer that finds the file
    /// system full punches everything pending first; a clean shutdown punches the rest.
    pub(super) fn discard_freed(&self, max: usize) -> usize {
        // Under `meta` too: the free list's length changes only under it, so a writer or a
        // relocation that reads it twice in one hold of `meta` reads the same.
        let taken: Vec<u32> = {
            let _m = self.lock_meta();
            let mut l = self.lock_log();
            // Leave writers enough free segments meanwhile: on a nearly full array they
            // would otherwise report out of space while a hole is being punched.
            let spare = self.spare_free_segments(&l);
            let taken = l.segments.take_to_discard(max.min(spare));
            if taken.is_empty() {
                return 0;
            }
            taken
        };
        self.punch(&taken);
        let m = self.lock_meta();
        let mut l = self.lock_log();
        l.segments.return_discarded(&taken);
        l.check_segment_lists(Some(&m.state));
        taken.len()
    }

    /// Punch the holes of every free segment still holding file space, under the lock (so no
    /// writer can take one meanwhile): a full file system, or a clean shutdown.
    pub(super) fn punch_all_pending(&self, l: &mut Log) {
        let pending = l.segments.take_all_to_discard();
        self.punch(&pending);
    }

    /// Punch the holes of `segments` (sorted), one call per run of adjacent segments.
    pub(super) fn punch(&self, segments: &[u32]) {
        let seg = self.geometry.segment_size as u64;
        let mut i = 0;
        while i < segments.len() {
            let mut j = i + 1;
            while j < segments.len() && segments[j] == segments[j - 1] + 1 {
                j += 1;
            }
            let (first, count) = (segments[i] as u64, (j - i) as u64);
            if let Err(e) = self.log_device.discard(first * seg, count * seg) {
                tracing::warn!(
                    "could not give back the space of segments {first}..{}: {e}",
                    first + count
                );
            }
            i = j;
        }
    }
}
