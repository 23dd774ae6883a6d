//! The segment table (state, sequence number, bytes written and live bytes of every segment of
//! the log), kept whole in RAM, with an index of sealed segments by live bytes that the garbage
//! collector picks its victims from.
//!
//! Why the index: the collector looks for the emptiest sealed segment several times a second
//! and for every empty one on each round, under the metadata lock. Scanning the table for them
//! costs O(segments): 24 bytes per 4 MiB segment, 94 MB of table at 15 TiB and 1.5 GB at the
//! 256 TiB the engine supports, read under the lock that every host command takes (issue 20:
//! "GC victim selection" must not stall commands). The index keeps sealed segments in buckets
//! of [`BUCKET_BYTES`] of live bytes (bucket 0: none live), each in segment order, and moves a
//! segment between buckets only when a change crosses a bucket's bound. A pick walks the
//! buckets from the emptiest and takes the first segment its caller accepts: the victim is the
//! emptiest to within 64 KiB (1.6 % of a 4 MiB segment), and the cost is the number of buckets
//! plus the segments the caller passes over (those sealed since the last checkpoint, which are
//! few), not the size of the array.

use super::page_buf::PagePool;
use super::page_store::PageError;
use super::pager::{Entry, FrozenPage, Pager};
use super::resident::ResidentTable;
use super::tables::T_SEGMENTS;
use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SegState {
    #[default]
    Free,
    /// The log head: records are being appended.
    Open,
    /// Full (ends with a Seal record); immutable until garbage-collected.
    Sealed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    pub state: SegState,
    pub seq: u64,
    /// Bytes of records written (the append offset for the open segment).
    pub written: u32,
    /// Bytes of Chunk records still referenced.
    pub live: u64,
}

impl Segment {
    pub const FREE: Segment = Segment {
        state: SegState::Free,
        seq: 0,
        written: 0,
        live: 0,
    };
}

impl Entry for Segment {
    const SIZE: usize = 24;
    fn read(b: &[u8]) -> Self {
        Segment {
            state: match b[0] {
                1 => SegState::Open,
                2 => SegState::Sealed,
                _ => SegState::Free,
            },
            written: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            seq: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            live: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0] = match self.state {
            SegState::Free => 0,
            SegState::Open => 1,
            SegState::Sealed => 2,
        };
        b[1..4].fill(0);
        b[4..8].copy_from_slice(&self.written.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.live.to_le_bytes());
    }
}

/// Live bytes per bucket of the victim index.
pub const BUCKET_BYTES: u64 = 64 << 10;

pub struct SegmentTable {
    table: ResidentTable<Segment>,
    /// Sealed segments by [`bucket`] of their live bytes.
    by_live: Vec<BTreeSet<u32>>,
}

/// The victim index's bucket of `s`: none unless it is sealed; 0 when nothing in it is live.
fn bucket(s: &Segment) -> Option<usize> {
    if s.state != SegState::Sealed {
        return None;
    }
    Some(if s.live == 0 {
        0
    } else {
        1 + ((s.live - 1) / BUCKET_BYTES) as usize
    })
}

impl Default for SegmentTable {
    fn default() -> Self {
        Self::new()
    }
}

impl SegmentTable {
    pub fn new() -> Self {
        SegmentTable {
            table: ResidentTable::new(T_SEGMENTS),
            by_live: Vec::new(),
        }
    }

    /// The first `len` segments, read from the pages the pager's directory names, indexed.
    pub fn load(pager: &Pager, len: u64) -> Result<Self, PageError> {
        let mut t = SegmentTable {
            table: ResidentTable::load(T_SEGMENTS, pager, len)?,
            by_live: Vec::new(),
        };
        for i in 0..t.table.len() {
            let s = t.table.get(i);
            t.index(i as u32, &s);
        }
        Ok(t)
    }

    fn index(&mut self, i: u32, s: &Segment) {
        if let Some(b) = bucket(s) {
            if self.by_live.len() <= b {
                self.by_live.resize_with(b + 1, BTreeSet::new);
            }
            self.by_live[b].insert(i);
        }
    }

    fn unindex(&mut self, i: u32, s: &Segment) {
        if let Some(b) = bucket(s) {
            let removed = self.by_live[b].remove(&i);
            debug_assert!(removed, "sealed segment {i} missing from its bucket {b}");
        }
    }

    pub fn len(&self) -> u64 {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn get(&self, i: u64) -> Segment {
        self.table.get(i)
    }

    pub fn as_slice(&self) -> &[Segment] {
        self.table.as_slice()
    }

    pub fn push(&mut self, s: Segment) -> u64 {
        let i = self.table.push(s);
        self.index(i as u32, &s);
        i
    }

    pub fn set(&mut self, i: u64, s: Segment) {
        let old = self.table.get(i);
        if bucket(&old) != bucket(&s) {
            self.unindex(i as u32, &old);
            self.index(i as u32, &s);
        }
        self.table.set(i, s);
    }

    pub fn update(&mut self, i: u64, f: impl FnOnce(&mut Segment)) {
        let mut s = self.table.get(i);
        f(&mut s);
        self.set(i, s);
    }

    pub fn touch_all(&mut self) {
        self.table.touch_all();
    }

    pub fn freeze(&mut self, pool: &PagePool) -> Vec<FrozenPage> {
        self.table.freeze(pool)
    }

    pub fn thaw(&mut self, pages: &[FrozenPage]) {
        self.table.thaw(pages);
    }

    /// Sealed segments in which nothing is live, in segment order.
    pub fn empty_sealed(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_live.first().into_iter().flatten().copied()
    }

    /// The emptiest sealed segment (to within [`BUCKET_BYTES`]) with at most `max_live` live
    /// bytes that `accept` takes; buckets are walked from the emptiest, each in segment order.
    pub fn emptiest(
        &self,
        max_live: u64,
        mut accept: impl FnMut(u32, &Segment) -> bool,
    ) -> Option<u32> {
        for (b, members) in self.by_live.iter().enumerate() {
            let lowest = if b == 0 {
                0
            } else {
                (b as u64 - 1) * BUCKET_BYTES + 1
            };
            if lowest > max_live {
                break;
            }
            for &i in members {
                let s = self.table.get(i as u64);
                if s.live <= max_live && accept(i, &s) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Whether the index holds exactly the sealed segments, each in its bucket (for `check`
    /// and tests: O(segments)).
    pub fn audit(&self) -> Result<(), String> {
        let mut indexed = 0usize;
        for (b, members) in self.by_live.iter().enumerate() {
            for &i in members {
                let s = self.table.get(i as u64);
                if bucket(&s) != Some(b) {
                    return Err(format!(
                        "segment {i} ({:?}, {} bytes live) is in the victim index's bucket {b}",
                        s.state, s.live
                    ));
                }
            }
            indexed += members.len();
        }
        let sealed = self
            .as_slice()
            .iter()
            .filter(|s| s.state == SegState::Sealed)
            .count();
        if sealed != indexed {
            return Err(format!(
                "{sealed} sealed segments, {indexed} in the victim index"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sealed(live: u64, seq: u64) -> Segment {
        Segment {
            state: SegState::Sealed,
            seq,
            written: 4 << 20,
            live,
        }
    }

    #[test]
    fn picks_follow_live_bytes_and_the_callers_choice() {
        let mut t = SegmentTable::new();
        for _ in 0..8 {
            t.push(Segment::FREE);
        }
        t.set(1, sealed(3 << 20, 1));
        t.set(2, sealed(1 << 20, 2));
        t.set(3, sealed(0, 3));
        t.set(4, sealed(200 << 10, 4));
        t.set(5, sealed(0, 5));
        assert_eq!(t.empty_sealed().collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(t.emptiest(u64::MAX, |_, _| true), Some(3));
        assert_eq!(
            t.emptiest(u64::MAX, |_, s| s.live > 0),
            Some(4),
            "the emptiest with data"
        );
        assert_eq!(t.emptiest(u64::MAX, |_, s| s.seq < 4), Some(3));
        assert_eq!(t.emptiest(u64::MAX, |i, _| i == 1), Some(1));
        assert_eq!(
            t.emptiest(2 << 20, |i, _| i == 1),
            None,
            "over the live limit"
        );
        // Live bytes fall as hosts overwrite: segment 1 becomes the emptiest with data.
        t.update(1, |s| s.live = 1000);
        assert_eq!(t.emptiest(u64::MAX, |_, s| s.live > 0), Some(1));
        // Freed: out of the index.
        t.update(3, |s| {
            s.state = SegState::Free;
            s.written = 0;
        });
        assert_eq!(t.empty_sealed().collect::<Vec<_>>(), vec![5]);
        t.audit().unwrap();
    }

    proptest! {
        /// Against a scan of the whole table (the model): the index holds the sealed
        /// segments, and a pick is within one bucket of the true emptiest acceptable one.
        #[test]
        fn the_index_agrees_with_a_scan(ops in proptest::collection::vec(
            (0u64..64, 0u8..3, 0u64..(4 << 20), 0u64..100), 1..400
        ), limit in 0u64..(5 << 20), even_only in any::<bool>()) {
            let mut t = SegmentTable::new();
            for _ in 0..64 {
                t.push(Segment::FREE);
            }
            for (i, state, live, seq) in ops {
                let state = [SegState::Free, SegState::Open, SegState::Sealed][state as usize];
                t.set(i, Segment { state, seq, written: 4 << 20, live });
            }
            t.audit().map_err(TestCaseError::fail)?;
            let accept = |i: u32, _: &Segment| !even_only || i.is_multiple_of(2);
            let best = t
                .as_slice()
                .iter()
                .enumerate()
                .filter(|(i, s)| s.state == SegState::Sealed && s.live <= limit && accept(*i as u32, s))
                .map(|(_, s)| s.live)
                .min();
            let got = t.emptiest(limit, accept);
            match (best, got) {
                (None, None) => {}
                (Some(best), Some(i)) => {
                    let s = t.get(i as u64);
                    prop_assert!(s.state == SegState::Sealed && s.live <= limit && accept(i, &s));
                    prop_assert_eq!(bucket(&s), bucket(&sealed(best, 0)), "within the emptiest bucket");
                }
                (best, got) => prop_assert!(false, "scan {:?}, index {:?}", best, got),
            }
            let empties: Vec<u32> = t
                .as_slice()
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == SegState::Sealed && s.live == 0)
                .map(|(i, _)| i as u32)
                .collect();
            prop_assert_eq!(t.empty_sealed().collect::<Vec<_>>(), empties);
        }
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// What a victim pick costs under the metadata lock at 15 TiB of 4 MiB segments (a sixteenth
    /// of them sealed), the index against the scan it replaced; both must agree. A measurement,
    /// not a test (no time limit): `cargo test --release -p sliver-engine --lib
    /// victim_pick_cost -- --ignored --nocapture`; figures in docs/benchmarks.md.
    #[test]
    #[ignore]
    fn victim_pick_cost_at_15_tib() {
        let n = (15u64 << 40) >> 22;
        let mut t = SegmentTable::new();
        for i in 0..n {
            t.push(if i < n / 16 {
                Segment {
                    state: SegState::Sealed,
                    seq: i + 1,
                    written: 4 << 20,
                    live: (4 << 20) - (i % 4001) * 1000,
                }
            } else {
                Segment::FREE
            });
        }
        let limit = 1 << 20;
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let scan = t
                .as_slice()
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == SegState::Sealed && s.live <= limit)
                .min_by_key(|(_, s)| s.live)
                .map(|(i, s)| (i as u32, s.live));
            let scanned = started.elapsed();
            let started = std::time::Instant::now();
            let picked = t.emptiest(limit, |_, _| true);
            let indexed = started.elapsed();
            let (scan_victim, scan_live) = scan.expect("a victim");
            let picked = picked.expect("a victim");
            assert_eq!(
                bucket(&t.get(picked as u64)),
                bucket(&sealed_with(scan_live)),
                "index pick {picked}, scan pick {scan_victim}"
            );
            eprintln!(
                "{n} segments: scan {scanned:?} (segment {scan_victim}, {scan_live} B live), \
                 index {indexed:?} (segment {picked}, {} B live)",
                t.get(picked as u64).live
            );
        }
    }

    fn sealed_with(live: u64) -> Segment {
        Segment {
            state: SegState::Sealed,
            seq: 0,
            written: 0,
            live,
        }
    }
}
