//! Segment space in the file: allocated ahead of the head outside the lock, given back (hole punching) when freed.

use super::*;

impl Engine {
    /// Free segments beyond the collector's reserve and a margin of two for writers: how many
    /// may leave the free list for a while (to be allocated ahead, or punched).
    fn spare_free_segments(&self, m: &Meta) -> usize {
        m.free
            .len()
            .saturating_sub(gc_reserve(self.geometry.segment_count) as usize + 2)
    }

    /// Allocate the file space of up to [`READY_SEGMENTS`] free segments outside the metadata
    /// lock, so the head moves on without a system call under it. Returns how many became
    /// ready. The segments stay on the free list meanwhile (marked `preparing`), so free space
    /// as writers and reports see it does not change.
    pub fn prepare_segments(&self) -> usize {
        if self.read_only || self.poisoned.load(Ordering::Acquire) {
            return 0;
        }
        let seg = self.geometry.segment_size as u64;
        // Only where the file system has room to spare for them and as much again: on a small
        // or nearly full one the head allocates as it goes, and a full file system is
        // reported by the write that needs the space (27/07), not by this thread.
        let ready_bytes = READY_SEGMENTS as u64 * seg;
        if !self.backend.has_room(ready_bytes, ready_bytes) {
            return 0;
        }
        let taken: Vec<u32> = {
            let mut m = self.lock_meta();
            // Never more than the writers' own margin over the collector's reserve.
            let spare = self.spare_free_segments(&m);
            let want = READY_SEGMENTS
                .saturating_sub(m.ready.len() + m.preparing.len())
                .min(spare.saturating_sub(m.ready.len()));
            let mut taken = Vec::with_capacity(want);
            // From the top of the free list: the segments the head would take next anyway.
            let mut i = m.free.len();
            while taken.len() < want && i > 0 {
                i -= 1;
                let s = m.free[i];
                if !m.ready.contains(&s) && !m.preparing.contains(&s) {
                    taken.push(s);
                }
            }
            for s in &taken {
                m.preparing.insert(*s);
                // Allocated from now on: not to be punched.
                m.undiscarded.remove(s);
            }
            taken
        };
        if taken.is_empty() {
            return 0;
        }
        let results: Vec<(u32, bool)> = taken
            .iter()
            .map(|&s| (s, self.backend.allocate(s as u64 * seg, seg).is_ok()))
            .collect();
        let mut m = self.lock_meta();
        let mut ready = 0;
        for (s, ok) in results {
            // Not preparing any more: the head took it meanwhile.
            if !m.preparing.remove(&s) {
                continue;
            }
            if ok {
                m.ready.insert(s);
                ready += 1;
            } else {
                // The file system is full: the head allocates (and reports) itself; what was
                // allocated of this one is given back when idle.
                m.undiscarded.insert(s);
            }
        }
        m.check_segment_lists();
        ready
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
        let taken: Vec<u32> = {
            let mut m = self.lock_meta();
            // Leave writers enough free segments meanwhile: on a nearly full array they
            // would otherwise report out of space while a hole is being punched.
            let spare = self.spare_free_segments(&m);
            let taken: Vec<u32> = m.undiscarded.iter().copied().take(max.min(spare)).collect();
            if taken.is_empty() {
                return 0;
            }
            for id in &taken {
                m.undiscarded.remove(id);
            }
            let set: std::collections::HashSet<u32> = taken.iter().copied().collect();
            m.free.retain(|s| !set.contains(s));
            taken
        };
        self.punch(&taken);
        // Back on top of the free list in reverse, so the lowest is reused first.
        let mut m = self.lock_meta();
        m.free.extend(taken.iter().rev());
        m.check_segment_lists();
        taken.len()
    }

    /// Punch the holes of every free segment still holding file space, under the lock (so no
    /// writer can take one meanwhile): a full file system, or a clean shutdown.
    pub(super) fn punch_all_pending(&self, m: &mut Meta) {
        let pending: Vec<u32> = std::mem::take(&mut m.undiscarded).into_iter().collect();
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
            if let Err(e) = self.backend.discard(first * seg, count * seg) {
                tracing::warn!(
                    "could not give back the space of segments {first}..{}: {e}",
                    first + count
                );
            }
            i = j;
        }
    }
}
