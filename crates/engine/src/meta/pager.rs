//! Paged metadata: tables of fixed-size entries kept in 4 KiB pages that live in the log as
//! Page records, behind one bounded cache (RFC 0001, docs/rfcs/0001-metadata-at-scale.md).
//!
//! Each table has a *directory* (page index -> where its newest Page record is, and that
//! record's checksum), small enough for RAM: 12 bytes per 4 KiB page. Pages are read on demand
//! ("faulted"), checked against the directory's checksum, and kept in the cache until CLOCK
//! evicts them; a page that was never written reads as zeros. A changed page is *dirty* and is
//! never evicted: only a checkpoint writes it. A checkpoint [`Pager::freeze`]s the dirty set
//! (pointer copies), writes the frozen pages as records, and reports each new place with
//! [`Pager::written`]; a page changed again while frozen is copied first, so the bytes written
//! are exactly those of the moment of the freeze. The engine takes that moment under its
//! metadata lock at a log position, which makes the pages written a consistent image of the
//! metadata at that position: replay continues from it.
//!
//! The pager does no I/O but reads, through [`PageSource`]; writing pages is the checkpoint's
//! business (they are appended to the log like any record).

use crate::format::{decode_referenced, Record, PAGE_PREFIX, RECORD_HEADER};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Bytes of a metadata page.
pub const PAGE_BYTES: usize = 4096;
/// Bytes of a whole Page record: header, prefix, body.
pub const PAGE_RECORD: usize = RECORD_HEADER + PAGE_PREFIX + PAGE_BYTES;

pub type PageBody = [u8; PAGE_BYTES];

/// Where a page's newest record is in the log, and that record's checksum (which tells the
/// record meant from a stale one left at the same place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLoc {
    pub segment: u32,
    pub offset: u32,
    pub crc: u32,
}

/// Reads Page records for the pager (the engine's log; a plain buffer in tests).
pub trait PageSource: Send + Sync {
    /// Fill `buf` with the bytes of the log at `loc`.
    fn read_record(&self, loc: PageLoc, buf: &mut [u8]) -> std::io::Result<()>;
}

/// A page that could not be read: its table, index and place, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageError {
    pub table: u8,
    pub index: u64,
    pub loc: PageLoc,
    pub reason: String,
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "metadata page {} of table {} (log segment {}, offset {}): {}",
            self.index, self.table, self.loc.segment, self.loc.offset, self.reason
        )
    }
}

impl std::error::Error for PageError {}

struct Resident {
    body: Arc<PageBody>,
    /// Changed since its last record was written (or never written): only a checkpoint may
    /// drop it.
    dirty: bool,
    /// Frozen by a checkpoint that has not yet reported where it wrote the page: the
    /// directory still names an older record, so the page must stay.
    frozen: bool,
    /// Used since the clock hand last passed.
    referenced: bool,
}

/// A page handed to a checkpoint by [`Pager::freeze`].
pub struct FrozenPage {
    pub table: u8,
    pub index: u64,
    pub body: Arc<PageBody>,
}

/// Cache figures, for metrics and for tests that must see eviction happen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    pub hits: u64,
    pub faults: u64,
    pub evictions: u64,
    pub resident: usize,
    pub dirty: usize,
}

/// The page cache and the directories of every table.
pub struct Pager {
    /// Pages the cache may hold when none is dirty or frozen.
    capacity: usize,
    directories: Vec<Vec<Option<PageLoc>>>,
    resident: HashMap<(u8, u64), Resident>,
    /// CLOCK ring of resident pages; entries of pages since dropped are skipped.
    clock: VecDeque<(u8, u64)>,
    dirty: usize,
    source: Arc<dyn PageSource>,
    stats: PagerStats,
}

impl Pager {
    /// A pager over `tables` tables holding at most `capacity` clean pages.
    pub fn new(source: Arc<dyn PageSource>, tables: usize, capacity: usize) -> Self {
        Pager {
            capacity: capacity.max(1),
            directories: vec![Vec::new(); tables],
            resident: HashMap::new(),
            clock: VecDeque::new(),
            dirty: 0,
            source,
            stats: PagerStats::default(),
        }
    }

    /// A pager that starts from directories a checkpoint recorded.
    pub fn with_directories(
        source: Arc<dyn PageSource>,
        directories: Vec<Vec<Option<PageLoc>>>,
        capacity: usize,
    ) -> Self {
        let mut pager = Pager::new(source, directories.len(), capacity);
        pager.directories = directories;
        pager
    }

    pub fn directory(&self, table: u8) -> &[Option<PageLoc>] {
        &self.directories[table as usize]
    }

    pub fn stats(&self) -> PagerStats {
        PagerStats {
            resident: self.resident.len(),
            dirty: self.dirty,
            ..self.stats
        }
    }

    /// Dirty pages beyond the capacity: the engine should checkpoint.
    pub fn over_budget(&self) -> bool {
        self.dirty >= self.capacity
    }

    /// Page `index` of `table`, read from the log if it is not cached.
    pub fn page(&mut self, table: u8, index: u64) -> Result<&PageBody, PageError> {
        self.load(table, index)?;
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        r.referenced = true;
        Ok(&r.body)
    }

    /// Page `index` of `table` to change: it becomes dirty (copied first if a checkpoint
    /// holds it).
    pub fn page_mut(&mut self, table: u8, index: u64) -> Result<&mut PageBody, PageError> {
        self.load(table, index)?;
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        r.referenced = true;
        if !r.dirty {
            r.dirty = true;
            self.dirty += 1;
        }
        Ok(Arc::make_mut(&mut r.body))
    }

    fn load(&mut self, table: u8, index: u64) -> Result<(), PageError> {
        if self.resident.contains_key(&(table, index)) {
            self.stats.hits += 1;
            return Ok(());
        }
        let loc = self.directories[table as usize]
            .get(index as usize)
            .copied()
            .flatten();
        let body = match loc {
            None => Arc::new([0; PAGE_BYTES]),
            Some(loc) => {
                self.stats.faults += 1;
                Arc::new(self.read(table, index, loc)?)
            }
        };
        self.make_room(self.capacity - 1);
        self.resident.insert(
            (table, index),
            Resident {
                body,
                dirty: false,
                frozen: false,
                referenced: false,
            },
        );
        self.clock.push_back((table, index));
        Ok(())
    }

    fn read(&self, table: u8, index: u64, loc: PageLoc) -> Result<PageBody, PageError> {
        let fail = |reason: String| PageError {
            table,
            index,
            loc,
            reason,
        };
        let mut buf = vec![0; PAGE_RECORD];
        self.source
            .read_record(loc, &mut buf)
            .map_err(|e| fail(format!("read failed: {e}")))?;
        let (record, _, crc) =
            decode_referenced(&buf).map_err(|e| fail(format!("damaged record: {e:?}")))?;
        if crc != loc.crc {
            return Err(fail(format!(
                "checksum {crc:#010x} where the directory expects {:#010x}",
                loc.crc
            )));
        }
        match record {
            Record::Page {
                table: t,
                index: i,
                body,
            } if t == table && i == index && body.len() == PAGE_BYTES => {
                Ok(body.try_into().expect("length checked"))
            }
            Record::Page { table, index, .. } => {
                Err(fail(format!("holds page {index} of table {table} instead")))
            }
            _ => Err(fail("holds a record that is not a page".into())),
        }
    }

    /// Evict clean, unfrozen pages by CLOCK until at most `target` are cached. Dirty and
    /// frozen pages are passed over: the cache may exceed its capacity by them until the next
    /// checkpoint ([`Pager::over_budget`]).
    fn make_room(&mut self, target: usize) {
        let mut budget = 2 * self.clock.len();
        while self.resident.len() > target && budget > 0 {
            budget -= 1;
            let Some(key) = self.clock.pop_front() else {
                break;
            };
            let Some(r) = self.resident.get_mut(&key) else {
                continue;
            };
            if r.dirty || r.frozen || r.referenced {
                r.referenced = false;
                self.clock.push_back(key);
                continue;
            }
            self.resident.remove(&key);
            self.stats.evictions += 1;
        }
    }

    /// Hand every dirty page to a checkpoint. They become clean but stay cached until
    /// [`Pager::written`] reports where each went.
    pub fn freeze(&mut self) -> Vec<FrozenPage> {
        let mut out = Vec::with_capacity(self.dirty);
        for (&(table, index), r) in self.resident.iter_mut() {
            if r.dirty {
                r.dirty = false;
                r.frozen = true;
                out.push(FrozenPage {
                    table,
                    index,
                    body: r.body.clone(),
                });
            }
        }
        self.dirty = 0;
        out.sort_by_key(|p| (p.table, p.index));
        out
    }

    /// A frozen page was written at `loc`: its directory entry moves there.
    pub fn written(&mut self, table: u8, index: u64, loc: PageLoc) {
        let dir = &mut self.directories[table as usize];
        if dir.len() <= index as usize {
            dir.resize(index as usize + 1, None);
        }
        dir[index as usize] = Some(loc);
        if let Some(r) = self.resident.get_mut(&(table, index)) {
            r.frozen = false;
        }
        self.make_room(self.capacity);
    }

    /// A checkpoint that froze pages failed before writing them: they are dirty again.
    pub fn thaw(&mut self, pages: Vec<FrozenPage>) {
        for p in pages {
            if let Some(r) = self.resident.get_mut(&(p.table, p.index)) {
                r.frozen = false;
                if !r.dirty {
                    r.dirty = true;
                    self.dirty += 1;
                }
            }
        }
    }
}

/// An entry of a paged table: a fixed number of little-endian bytes.
pub trait Entry: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn write(&self, bytes: &mut [u8]);
}

impl Entry for u64 {
    const SIZE: usize = 8;
    fn read(bytes: &[u8]) -> Self {
        u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
    fn write(&self, bytes: &mut [u8]) {
        bytes.copy_from_slice(&self.to_le_bytes());
    }
}

/// A dense array of `T` indexed by u64, in the pages of table `id` of a [`Pager`].
pub struct Table<T> {
    pub id: u8,
    _entry: PhantomData<T>,
}

impl<T: Entry> Table<T> {
    pub const PER_PAGE: u64 = (PAGE_BYTES / T::SIZE) as u64;

    pub const fn new(id: u8) -> Self {
        Table {
            id,
            _entry: PhantomData,
        }
    }

    fn place(index: u64) -> (u64, usize) {
        (
            index / Self::PER_PAGE,
            (index % Self::PER_PAGE) as usize * T::SIZE,
        )
    }

    pub fn get(&self, pager: &mut Pager, index: u64) -> Result<T, PageError> {
        let (page, at) = Self::place(index);
        Ok(T::read(&pager.page(self.id, page)?[at..at + T::SIZE]))
    }

    pub fn set(&self, pager: &mut Pager, index: u64, value: T) -> Result<(), PageError> {
        let (page, at) = Self::place(index);
        value.write(&mut pager.page_mut(self.id, page)?[at..at + T::SIZE]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Encoder;
    use proptest::prelude::*;
    use std::sync::Mutex;

    /// A log in memory: Page records appended one after another in "segment" 0.
    #[derive(Default)]
    struct MemLog(Mutex<Vec<u8>>);

    impl MemLog {
        fn append(&self, p: &FrozenPage) -> PageLoc {
            let mut log = self.0.lock().unwrap();
            let offset = log.len() as u32;
            let mut buf = Vec::new();
            let (_, crc) = Encoder::new(&mut buf, 7).page(p.table, p.index, &p.body[..]);
            log.extend_from_slice(&buf);
            PageLoc {
                segment: 0,
                offset,
                crc,
            }
        }
    }

    impl PageSource for MemLog {
        fn read_record(&self, loc: PageLoc, buf: &mut [u8]) -> std::io::Result<()> {
            let log = self.0.lock().unwrap();
            let at = loc.offset as usize;
            let src = log
                .get(at..at + buf.len())
                .ok_or_else(|| std::io::Error::other("beyond the log"))?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    fn checkpoint(pager: &mut Pager, log: &MemLog) -> usize {
        let frozen = pager.freeze();
        let n = frozen.len();
        for p in frozen {
            let loc = log.append(&p);
            pager.written(p.table, p.index, loc);
        }
        n
    }

    const T0: Table<u64> = Table::new(0);
    const T1: Table<u64> = Table::new(1);

    #[derive(Debug, Clone)]
    enum Op {
        Set(bool, u64, u64),
        Get(bool, u64),
        Checkpoint,
        /// Restart from the last checkpoint's directories: what was not checkpointed is gone.
        Restart,
        /// A checkpoint whose pages are frozen, then changed and read, then written.
        ChangeWhileFrozen(Vec<(bool, u64, u64)>),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A few pages of 512 entries: indexes up to 4 pages per table.
        let index = 0u64..2048;
        prop_oneof![
            5 => (any::<bool>(), index.clone(), any::<u64>()).prop_map(|(t, i, v)| Op::Set(t, i, v)),
            5 => (any::<bool>(), index.clone()).prop_map(|(t, i)| Op::Get(t, i)),
            1 => Just(Op::Checkpoint),
            1 => Just(Op::Restart),
            1 => proptest::collection::vec((any::<bool>(), index, any::<u64>()), 1..6)
                .prop_map(Op::ChangeWhileFrozen),
        ]
    }

    proptest! {
        /// The pager against a map: every read sees the last value set, across evictions
        /// (capacity 2 pages for 8), checkpoints, restarts (which keep exactly what the last
        /// checkpoint wrote) and changes made while a checkpoint holds the page.
        #[test]
        fn pager_matches_a_model(ops in proptest::collection::vec(op(), 1..200)) {
            let log = Arc::new(MemLog::default());
            let mut pager = Pager::new(log.clone(), 2, 2);
            let mut live: HashMap<(u8, u64), u64> = HashMap::new();
            let mut durable = live.clone();
            let mut durable_dirs = vec![Vec::new(); 2];
            let table = |t: bool| if t { T1 } else { T0 };
            for op in ops {
                match op {
                    Op::Set(t, i, v) => {
                        table(t).set(&mut pager, i, v).unwrap();
                        live.insert((t as u8, i), v);
                    }
                    Op::Get(t, i) => {
                        let want = live.get(&(t as u8, i)).copied().unwrap_or(0);
                        prop_assert_eq!(table(t).get(&mut pager, i).unwrap(), want);
                    }
                    Op::Checkpoint => {
                        checkpoint(&mut pager, &log);
                        durable = live.clone();
                        durable_dirs = (0..2).map(|t| pager.directory(t).to_vec()).collect();
                    }
                    Op::Restart => {
                        pager = Pager::with_directories(log.clone(), durable_dirs.clone(), 2);
                        live = durable.clone();
                    }
                    Op::ChangeWhileFrozen(changes) => {
                        let frozen = pager.freeze();
                        let image = live.clone();
                        for &(t, i, v) in &changes {
                            table(t).set(&mut pager, i, v).unwrap();
                            live.insert((t as u8, i), v);
                        }
                        // Reads in the window see the changes and everything before the freeze.
                        for (&(t, i), &v) in &live {
                            prop_assert_eq!(table(t == 1).get(&mut pager, i).unwrap(), v);
                        }
                        for p in frozen {
                            let loc = log.append(&p);
                            pager.written(p.table, p.index, loc);
                        }
                        // What was written is the image at the freeze, not the later change.
                        let dirs: Vec<_> = (0..2).map(|t| pager.directory(t).to_vec()).collect();
                        let mut reader = Pager::with_directories(log.clone(), dirs, 2);
                        for (&(tt, ii), &vv) in &image {
                            prop_assert_eq!(table(tt == 1).get(&mut reader, ii).unwrap(), vv);
                        }
                        // The changed page is dirty again: the next checkpoint carries it.
                        prop_assert!(pager.stats().dirty >= 1);
                        durable = image;
                        durable_dirs = (0..2).map(|t| pager.directory(t).to_vec()).collect();
                    }
                }
                let s = pager.stats();
                prop_assert!(s.resident <= 2 + s.dirty + 1, "{s:?}");
            }
        }
    }

    #[test]
    fn clean_pages_are_evicted_and_dirty_ones_kept() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 1, 2);
        for page in 0..6u64 {
            T0.set(&mut pager, page * 512, page + 1).unwrap();
        }
        assert_eq!(pager.stats().resident, 6, "dirty pages are never evicted");
        assert!(pager.over_budget());
        assert_eq!(checkpoint(&mut pager, &log), 6);
        for page in 0..6u64 {
            assert_eq!(T0.get(&mut pager, page * 512).unwrap(), page + 1);
        }
        let s = pager.stats();
        assert!(s.resident <= 2, "{s:?}");
        assert!(s.evictions >= 4 && s.faults >= 4, "{s:?}");
        assert!(!pager.over_budget());
    }

    #[test]
    fn a_damaged_or_misplaced_page_is_reported_with_its_place() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 2, 1);
        T0.set(&mut pager, 3, 33).unwrap();
        T1.set(&mut pager, 600, 66).unwrap();
        checkpoint(&mut pager, &log);
        let dirs: Vec<_> = (0..2).map(|t| pager.directory(t).to_vec()).collect();
        // Flip a byte inside table 0's page body.
        let loc0 = dirs[0][0].unwrap();
        log.0.lock().unwrap()[loc0.offset as usize + RECORD_HEADER + PAGE_PREFIX + 24] ^= 1;
        let mut reader = Pager::with_directories(log.clone(), dirs.clone(), 4);
        let e = T0.get(&mut reader, 3).unwrap_err();
        assert_eq!((e.table, e.index, e.loc), (0, 0, loc0));
        assert!(e.to_string().contains("offset"), "{e}");
        // A directory entry naming another page's (valid) record is refused too.
        let mut swapped = dirs.clone();
        swapped[0][0] = dirs[1][1];
        let mut reader = Pager::with_directories(log.clone(), swapped, 4);
        let e = T0.get(&mut reader, 3).unwrap_err();
        assert!(e.reason.contains("page 1 of table 1 instead"), "{e}");
        // A directory entry whose checksum is not the record's (a stale entry) is refused.
        let mut stale = dirs.clone();
        stale[1][1] = Some(PageLoc {
            crc: dirs[1][1].unwrap().crc ^ 1,
            ..dirs[1][1].unwrap()
        });
        let mut reader = Pager::with_directories(log.clone(), stale, 4);
        let e = T1.get(&mut reader, 600).unwrap_err();
        assert!(e.reason.contains("checksum"), "{e}");
        let mut reader = Pager::with_directories(log.clone(), dirs, 4);
        // The undamaged page still reads.
        assert_eq!(T1.get(&mut reader, 600).unwrap(), 66);
    }

    #[test]
    fn a_failed_checkpoint_leaves_its_pages_dirty() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 1, 1);
        T0.set(&mut pager, 0, 5).unwrap();
        let frozen = pager.freeze();
        assert_eq!(pager.stats().dirty, 0);
        pager.thaw(frozen);
        assert_eq!(pager.stats().dirty, 1);
        assert_eq!(checkpoint(&mut pager, &log), 1);
    }
}
