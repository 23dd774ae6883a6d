//! The free segments and what is under way with them (RFC 0005 step 7): the free list the
//! head takes from, the ones whose file space was not given back yet (`undiscarded`),
//! allocated ahead (`ready`) or being allocated ahead (`preparing`), and the collector's claim.
//! One owner, so the lists change together and their invariants hold after every change:
//!
//! - no segment is on the free list twice;
//! - `undiscarded`, `ready` and `preparing` hold free-listed segments only (segments being
//!   punched are on none of the lists: they leave the free list meanwhile);
//! - `ready` and `undiscarded` are disjoint (a prepared segment holds space on purpose), and so
//!   are `ready` and `preparing`;
//! - `unwritten` holds ready segments only;
//! - the claim is a count, not particular segments: zero whenever no relocation runs, and
//!   only the collector's appends may take the last `claim` free segments.
//!
//! The free list is a stack: the head takes from the top, so the order segments are put back
//! in decides which is reused next. Lives under the log's lock (`Engine::lock_log`); callers
//! do the I/O.

use std::collections::BTreeSet;

pub(super) struct FreeSegments {
    /// Top last: the head takes from the end.
    free: Vec<u32>,
    /// Segments the collector has freed since open. A writer waiting for space judges a
    /// collection by this, not by the free list's length: other writers may take the freed
    /// segments before it retries, which is progress too.
    freed: u64,
    /// Free segments whose file space has not been given back yet (see
    /// `Engine::discard_freed`).
    undiscarded: BTreeSet<u32>,
    /// Free segments whose file space was allocated ahead of need, outside the lock (see
    /// `Engine::prepare_segments`); the head moves to these first.
    ready: BTreeSet<u32>,
    /// Free segments the preparer is allocating right now: still on the free list, so space
    /// figures and the reserve checks do not move; the head takes them last.
    preparing: BTreeSet<u32>,
    /// Ready segments whose blocks were allocated but never written: neither written ahead
    /// nor holding what the log wrote there before. The file system records the conversion
    /// of such blocks to written ones with every sync of an append there (an extent block and
    /// the inode, one after the other after the data), so the head takes them after the
    /// others, and the preparer writes them ahead once syncs turn small. Without that, a
    /// workload of large syncs (a sequential fill) left [`READY_SEGMENTS`] of them, 256 MiB,
    /// under the small syncs that followed.
    ///
    /// [`READY_SEGMENTS`]: super::READY_SEGMENTS
    unwritten: BTreeSet<u32>,
    /// Free segments the relocation in progress may still need (see `Engine::collect_one`):
    /// every other appender leaves them. Hosts append to the same head while a victim is
    /// relocated batch by batch; without the claim they took the segments the collector had
    /// counted on, the relocation stopped half-way (freeing nothing) and the full array
    /// refused every write from then on.
    claim: usize,
}

/// A segment the head takes (see [`FreeSegments::take_for_head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ForHead {
    pub(super) segment: u32,
    /// Its file space was allocated ahead: the head needs no system call for it.
    pub(super) prepared: bool,
    /// The preparer was still allocating it: it must stop writing ahead there before the
    /// head's records land.
    pub(super) was_preparing: bool,
}

impl FreeSegments {
    /// `free` with its top last. After a crash any of them may still hold file space, so all
    /// wait to be punched (holes cost nothing to punch again).
    pub(super) fn new(free: Vec<u32>) -> Self {
        FreeSegments {
            undiscarded: free.iter().copied().collect(),
            free,
            freed: 0,
            ready: BTreeSet::new(),
            unwritten: BTreeSet::new(),
            preparing: BTreeSet::new(),
            claim: 0,
        }
    }

    /// A new log has allocated nothing it could give back.
    pub(super) fn nothing_to_discard(&mut self) {
        self.undiscarded.clear();
    }

    /// Free segments, including those being prepared or ready.
    pub(super) fn len(&self) -> usize {
        self.free.len()
    }

    /// Segments the collector has freed since open.
    pub(super) fn freed(&self) -> u64 {
        self.freed
    }

    pub(super) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    pub(super) fn is_preparing(&self, s: u32) -> bool {
        self.preparing.contains(&s)
    }

    /// Whether some free segment still holds file space.
    pub(super) fn any_undiscarded(&self) -> bool {
        !self.undiscarded.is_empty()
    }

    /// Free segments the relocation in progress may still need.
    pub(super) fn claim(&self) -> usize {
        self.claim
    }

    /// The relocation in progress may still need `segments` free segments.
    pub(super) fn set_claim(&mut self, segments: usize) {
        self.claim = segments;
    }

    /// The collector's append takes one of the segments it claimed.
    pub(super) fn use_claim(&mut self) {
        self.claim = self.claim.saturating_sub(1);
    }

    /// The next segment for the head: a ready one (lowest first, written ones before
    /// `unwritten` ones), else the top one not being prepared, else the top one (allocating it
    /// twice is harmless, and the preparer sees it was taken). None when no segment is free.
    /// It holds space from here on, so it no longer waits to be punched.
    pub(super) fn take_for_head(&mut self) -> Option<ForHead> {
        let ready = self
            .ready
            .iter()
            .find(|s| !self.unwritten.contains(s))
            .or(self.ready.first())
            .copied();
        let taken = match ready {
            Some(s) => {
                self.ready.remove(&s);
                self.unwritten.remove(&s);
                // Prepared segments sit on top of the free list.
                if let Some(i) = self.free.iter().rposition(|&f| f == s) {
                    self.free.remove(i);
                }
                ForHead {
                    segment: s,
                    prepared: true,
                    was_preparing: false,
                }
            }
            None => {
                let i = self
                    .free
                    .iter()
                    .rposition(|s| !self.preparing.contains(s))
                    .or(self.free.len().checked_sub(1))?;
                let s = self.free.remove(i);
                ForHead {
                    segment: s,
                    prepared: false,
                    was_preparing: self.preparing.remove(&s),
                }
            }
        };
        self.undiscarded.remove(&taken.segment);
        Some(taken)
    }

    /// The head could not allocate `s`, or allocated it but could not write its start there:
    /// back on top, and waiting to be punched, as it may hold space (a file system that ran
    /// out of space in the middle of `fallocate` can keep what it allocated so far; a hole
    /// costs nothing to punch again).
    pub(super) fn put_back(&mut self, s: u32) {
        self.free.push(s);
        self.undiscarded.insert(s);
    }

    /// The collector freed `victims`: free again, their space given back later.
    pub(super) fn add_collected(&mut self, victims: &[u32]) {
        self.free.extend_from_slice(victims);
        self.freed += victims.len() as u64;
        self.undiscarded.extend(victims.iter().copied());
    }

    /// Mark free segments for the preparer, from the top (those the head would take next
    /// anyway), so that `target` are ready or preparing, but no more ready ones than `spare`
    /// (how many may leave the free list for a while). Each comes with whether it still
    /// holds what was written there (free space then needs no writing ahead).
    pub(super) fn start_preparing(&mut self, target: usize, spare: usize) -> Vec<(u32, bool)> {
        let want = target
            .saturating_sub(self.ready.len() + self.preparing.len())
            .min(spare.saturating_sub(self.ready.len()));
        let mut taken = Vec::with_capacity(want);
        let mut i = self.free.len();
        while taken.len() < want && i > 0 {
            i -= 1;
            let s = self.free[i];
            if !self.ready.contains(&s) && !self.preparing.contains(&s) {
                taken.push(s);
            }
        }
        taken
            .into_iter()
            .map(|s| {
                self.preparing.insert(s);
                // Allocated from now on: not to be punched.
                (s, self.undiscarded.remove(&s))
            })
            .collect()
    }

    /// Up to `max` `unwritten` ready segments, highest first (those the head takes last), back
    /// to preparing, for the preparer to write ahead; finish each with
    /// [`FreeSegments::finish_preparing`].
    pub(super) fn start_writing_ahead(&mut self, max: usize) -> Vec<u32> {
        let taken: Vec<u32> = self.unwritten.iter().rev().take(max).copied().collect();
        for s in &taken {
            self.unwritten.remove(s);
            self.ready.remove(s);
            self.preparing.insert(*s);
        }
        taken
    }

    /// The preparer is done with `s`: ready when `allocated` (and `unwritten` unless
    /// `written`), else waiting to be punched (what was allocated of it is given back when
    /// idle). False when the head took it meanwhile.
    pub(super) fn finish_preparing(&mut self, s: u32, allocated: bool, written: bool) -> bool {
        if !self.preparing.remove(&s) {
            return false;
        }
        if allocated {
            self.ready.insert(s);
            if !written {
                self.unwritten.insert(s);
            }
        } else {
            self.undiscarded.insert(s);
        }
        true
    }

    /// Shutdown: ready and preparing segments wait to be punched with the rest. Returns those
    /// that were being prepared, whose writing ahead must stop before their holes are punched.
    pub(super) fn unprepare_all(&mut self) -> Vec<u32> {
        self.undiscarded.append(&mut self.ready);
        self.unwritten.clear();
        let preparing: Vec<u32> = self.preparing.iter().copied().collect();
        self.undiscarded.append(&mut self.preparing);
        preparing
    }

    /// Up to `max` segments to punch outside the lock, lowest first. They leave the free list
    /// meanwhile so no writer reuses one while its hole is punched; give them back with
    /// [`FreeSegments::return_discarded`].
    pub(super) fn take_to_discard(&mut self, max: usize) -> Vec<u32> {
        let taken: Vec<u32> = self.undiscarded.iter().copied().take(max).collect();
        if taken.is_empty() {
            return taken;
        }
        for s in &taken {
            self.undiscarded.remove(s);
        }
        let set: std::collections::HashSet<u32> = taken.iter().copied().collect();
        self.free.retain(|s| !set.contains(s));
        taken
    }

    /// Segments from [`FreeSegments::take_to_discard`], punched: back on top of the free list
    /// in reverse, so the lowest is reused first.
    pub(super) fn return_discarded(&mut self, taken: &[u32]) {
        self.free.extend(taken.iter().rev());
    }

    /// Every segment waiting to be punched, sorted, for a caller punching them under the lock
    /// (no writer can take one meanwhile): they stay on the free list.
    pub(super) fn take_all_to_discard(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.undiscarded).into_iter().collect()
    }

    /// The invariants (see the module's comment), and that every listed segment `is_free` in
    /// the segment table; checked in debug builds after every change.
    pub(super) fn check(&self, is_free: impl Fn(u32) -> bool) {
        if !cfg!(debug_assertions) {
            return;
        }
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        assert_eq!(
            free.len(),
            self.free.len(),
            "a segment on the free list twice"
        );
        for &s in &self.free {
            assert!(is_free(s), "segment {s} on the free list is in use");
        }
        for (name, set) in [
            ("undiscarded", &self.undiscarded),
            ("ready", &self.ready),
            ("preparing", &self.preparing),
        ] {
            if let Some(s) = set.iter().find(|s| !free.contains(s)) {
                panic!("segment {s} is {name} but not on the free list");
            }
        }
        assert!(
            self.ready.is_disjoint(&self.undiscarded),
            "a ready segment waits to be punched"
        );
        assert!(self.ready.is_disjoint(&self.preparing));
        assert!(
            self.unwritten.is_subset(&self.ready),
            "an unwritten segment is not ready"
        );
    }
}

#[cfg(test)]
impl FreeSegments {
    pub(super) fn free(&self) -> &[u32] {
        &self.free
    }

    pub(super) fn ready(&self) -> &BTreeSet<u32> {
        &self.ready
    }

    pub(super) fn undiscarded(&self) -> &BTreeSet<u32> {
        &self.undiscarded
    }

    pub(super) fn unwritten(&self) -> &BTreeSet<u32> {
        &self.unwritten
    }

    /// Marks `s` preparing or not, as the preparer or the head would, without the rest.
    pub(super) fn set_preparing(&mut self, s: u32, preparing: bool) {
        if preparing {
            self.preparing.insert(s);
        } else {
            self.preparing.remove(&s);
        }
    }

    /// Segments waiting to be punched to the bottom of the free list, the others on top (in
    /// their order): the head then offers never-allocated segments first, as after a restart.
    pub(super) fn undiscarded_to_bottom(&mut self) {
        let pending = self.undiscarded.clone();
        self.free.sort_by_key(|s| !pending.contains(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments 0..n, 0 on top, as open lists them.
    fn segments(n: u32) -> FreeSegments {
        FreeSegments::new((0..n).rev().collect())
    }

    fn head_takes(f: &mut FreeSegments) -> u32 {
        let taken = f.take_for_head().unwrap();
        f.check(|_| true);
        taken.segment
    }

    #[test]
    fn the_head_takes_from_the_top_and_nothing_from_an_empty_list() {
        let mut f = segments(3);
        assert!(
            f.any_undiscarded(),
            "after open every free segment may hold space"
        );
        assert_eq!([head_takes(&mut f), head_takes(&mut f)], [0, 1]);
        assert!(
            !f.undiscarded().contains(&0),
            "taken segments hold space on purpose"
        );
        assert_eq!(head_takes(&mut f), 2);
        assert_eq!(f.take_for_head(), None);
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn ready_segments_go_first_lowest_first_and_preparing_ones_last() {
        let mut f = segments(8);
        let marked = f.start_preparing(3, usize::MAX);
        assert_eq!(marked, vec![(0, true), (1, true), (2, true)]);
        assert!(f.finish_preparing(2, true, true));
        assert!(f.finish_preparing(1, true, true));
        assert_eq!(f.len(), 8, "prepared segments stay free");
        f.check(|_| true);
        let first = f.take_for_head().unwrap();
        assert_eq!(
            first,
            ForHead {
                segment: 1,
                prepared: true,
                was_preparing: false
            }
        );
        assert_eq!(head_takes(&mut f), 2);
        // 0 is still being prepared: every other free segment goes before it.
        for expected in 3..8 {
            assert_eq!(head_takes(&mut f), expected);
        }
        assert_eq!(
            f.take_for_head(),
            Some(ForHead {
                segment: 0,
                prepared: false,
                was_preparing: true
            })
        );
        assert!(!f.finish_preparing(0, true, true), "the head took it");
        assert_eq!(f.ready_len(), 0);
    }

    #[test]
    fn unwritten_segments_go_after_written_ones_and_are_written_ahead_highest_first() {
        let mut f = segments(8);
        f.nothing_to_discard();
        f.start_preparing(5, usize::MAX);
        // 0, 1 and 3 allocated only (large syncs), 2 and 4 written ahead.
        for s in [0, 1, 3] {
            assert!(f.finish_preparing(s, true, false));
        }
        for s in [2, 4] {
            assert!(f.finish_preparing(s, true, true));
        }
        f.check(|_| true);
        assert_eq!(f.unwritten().iter().copied().collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(head_takes(&mut f), 2, "the lowest written one first");
        assert_eq!(f.start_writing_ahead(2), [3, 1], "highest first");
        assert!(f.is_preparing(3) && !f.ready().contains(&3));
        f.check(|_| true);
        assert!(f.finish_preparing(3, true, true));
        assert_eq!(head_takes(&mut f), 3);
        assert_eq!(head_takes(&mut f), 4);
        assert_eq!(head_takes(&mut f), 0, "then the unwritten ones");
        assert!(f.unwritten().is_empty());
        // 1 is still being written ahead: the head takes it last, and the preparer sees it.
        assert_eq!(head_takes(&mut f), 5);
        assert_eq!(head_takes(&mut f), 6);
        assert_eq!(head_takes(&mut f), 7);
        assert_eq!(head_takes(&mut f), 1);
        assert!(!f.finish_preparing(1, true, true));
        assert!(f.start_writing_ahead(4).is_empty());
    }

    #[test]
    fn shutdown_forgets_unwritten_segments() {
        let mut f = segments(4);
        f.nothing_to_discard();
        f.start_preparing(2, usize::MAX);
        assert!(f.finish_preparing(0, true, false));
        assert!(f.finish_preparing(1, true, false));
        f.unprepare_all();
        assert!(f.unwritten().is_empty());
        f.check(|_| true);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "an unwritten segment is not ready")]
    fn an_unwritten_segment_that_is_not_ready_is_caught() {
        let mut f = segments(3);
        f.unwritten.insert(1);
        f.check(|_| true);
    }

    #[test]
    fn the_preparer_stays_within_its_target_and_the_spare() {
        let mut f = segments(10);
        f.nothing_to_discard();
        assert_eq!(f.start_preparing(4, 2), vec![(0, false), (1, false)]);
        assert!(f.is_preparing(1));
        assert!(f.finish_preparing(0, true, true));
        assert!(f.finish_preparing(1, false, true), "a full file system");
        assert_eq!(f.undiscarded().iter().copied().collect::<Vec<_>>(), [1]);
        // One ready already counts against both.
        assert_eq!(f.start_preparing(4, 2), vec![(1, true)]);
        assert_eq!(f.start_preparing(4, 8), vec![(2, false), (3, false)]);
        assert_eq!(f.start_preparing(4, 8), vec![]);
        f.check(|_| true);
    }

    #[test]
    fn punched_segments_return_on_top_in_reverse() {
        let mut f = FreeSegments::new(vec![5, 3, 1]);
        f.nothing_to_discard();
        f.add_collected(&[4, 2, 0]);
        assert_eq!(f.freed(), 3);
        let taken = f.take_to_discard(2);
        assert_eq!(taken, [0, 2], "lowest first");
        assert_eq!(f.len(), 4, "off the free list while punched");
        assert_eq!(f.undiscarded().iter().copied().collect::<Vec<_>>(), [4]);
        f.check(|_| true);
        f.return_discarded(&taken);
        f.check(|_| true);
        assert_eq!(f.free(), [5, 3, 1, 4, 2, 0]);
        assert_eq!([head_takes(&mut f), head_takes(&mut f)], [0, 2]);
        assert_eq!(f.take_all_to_discard(), [4]);
        assert!(!f.any_undiscarded());
        assert_eq!(f.take_to_discard(8), Vec::<u32>::new());
    }

    #[test]
    fn a_segment_put_back_is_taken_again_and_waits_to_be_punched() {
        let mut f = segments(4);
        f.nothing_to_discard();
        let s = head_takes(&mut f);
        f.put_back(s);
        f.check(|_| true);
        assert_eq!(f.undiscarded().iter().copied().collect::<Vec<_>>(), [s]);
        assert_eq!(head_takes(&mut f), s);
        assert!(
            !f.any_undiscarded(),
            "taken again, it holds space on purpose"
        );
    }

    #[test]
    fn shutdown_gives_back_ready_and_preparing_segments() {
        let mut f = segments(6);
        f.nothing_to_discard();
        f.start_preparing(3, usize::MAX);
        assert!(f.finish_preparing(0, true, true));
        assert_eq!(f.unprepare_all(), [1, 2]);
        assert_eq!(f.ready_len(), 0);
        assert_eq!(f.take_all_to_discard(), [0, 1, 2]);
        assert_eq!(f.len(), 6);
        f.check(|_| true);
    }

    #[test]
    fn the_claim_shrinks_as_the_collector_uses_it() {
        let mut f = segments(4);
        f.set_claim(2);
        f.use_claim();
        assert_eq!(f.claim(), 1);
        f.use_claim();
        f.use_claim();
        assert_eq!(f.claim(), 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "on the free list twice")]
    fn a_segment_listed_twice_is_caught() {
        let mut f = segments(2);
        f.put_back(1);
        f.check(|_| true);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "on the free list is in use")]
    fn a_free_listed_segment_in_use_is_caught() {
        segments(3).check(|s| s != 2);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a ready segment waits to be punched")]
    fn a_ready_segment_waiting_to_be_punched_is_caught() {
        let mut f = segments(3);
        f.ready.insert(0);
        f.check(|_| true);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "is preparing but not on the free list")]
    fn a_preparing_segment_off_the_free_list_is_caught() {
        let mut f = segments(3);
        f.set_preparing(7, true);
        f.check(|_| true);
    }
}
