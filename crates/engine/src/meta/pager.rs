//! The page cache and the directories of every paged table (RFC 0001).
//!
//! Each table has a *directory*: page index -> [`PageLoc`] (slot and checksum), 16 bytes of RAM
//! per 4 KiB page. Pages are read on demand ("faulted"), checked against the directory's
//! checksum, and kept until CLOCK evicts them; a page never written reads as zeros. A changed
//! page is *dirty* and is never evicted: only a checkpoint writes it. A checkpoint
//! [`Pager::freeze`]s the dirty set (pointer copies), writes the frozen pages into free slots
//! and reports each new place with [`Pager::written`]; a page changed again while frozen is
//! copied first, so the bytes written are exactly those of the moment of the freeze. The
//! engine takes that moment under its metadata lock at a log position, which makes the pages
//! written a consistent image of the metadata at that position: replay continues from it.
//!
//! Directories are themselves stored in pages (341 entries each, table `DIR_BASE + t` for
//! table `t`), written by the same checkpoint after the pages they name; the root names the
//! directory pages. The pager does no writes; reads go through a [`PageSource`].

use super::page_buf::{PageBuf, PagePool};
use super::page_store::PAGE_LOC_BYTES;
use super::page_store::{read_page, PageBody, PageError, PageLoc, PageSource, PAGE_BYTES};
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

/// Table numbers at or above this hold the directory pages of table `t - DIR_BASE`.
pub const DIR_BASE: u8 = 128;

/// Directory entries per directory page.
pub const DIR_PER_PAGE: u64 = (PAGE_BYTES / PAGE_LOC_BYTES) as u64;

struct Resident {
    body: PageBuf,
    /// Changed since it was last written (or never written): only a checkpoint may drop it.
    dirty: bool,
    /// Frozen by a checkpoint that has not yet reported where it wrote the page: the
    /// directory still names an older version, so the page must stay.
    frozen: bool,
    /// Used since the clock hand last passed.
    referenced: bool,
    /// Changed while frozen: the checkpoint still holds the frozen version's buffer.
    copied: bool,
}

/// A page handed to a checkpoint by [`Pager::freeze`].
pub struct FrozenPage {
    pub table: u8,
    pub index: u64,
    pub body: PageBuf,
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
    directories: Vec<Vec<PageLoc>>,
    resident: FxHashMap<(u8, u64), Resident>,
    /// CLOCK ring of resident pages; entries of pages since dropped are skipped.
    clock: VecDeque<(u8, u64)>,
    dirty: usize,
    /// The pages that became dirty since the last freeze (each once): a freeze visits these,
    /// not the whole cache.
    dirty_keys: Vec<(u8, u64)>,
    /// Buffers of frozen versions a checkpoint holds beside the changed copies: they take
    /// room in the cache until the checkpoint has written them.
    copies: usize,
    source: Arc<dyn PageSource>,
    stats: PagerStats,
    /// Directory pages (table, directory page index) whose entries changed since the last
    /// root was made durable: the next checkpoint writes them.
    changed_dirs: BTreeSet<(u8, u64)>,
    /// Where page buffers come from: blocks of their own, so the cache's churn does not
    /// fragment the heap (see [`super::page_buf`]).
    pool: PagePool,
    /// While set, a page that would need I/O is not read: the lookup fails with
    /// [`NOT_CACHED`] and the page is noted in `wanted`, for the engine to read it outside its
    /// lock and try again.
    no_reads: bool,
    wanted: Vec<(u8, u64)>,
}

/// The reason of a [`PageError`] for a page not read because reads were forbidden.
pub const NOT_CACHED: &str = "not cached";

impl Pager {
    /// An empty pager holding at most `capacity` clean pages.
    pub fn new(source: Arc<dyn PageSource>, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Pager {
            capacity,
            directories: vec![Vec::new(); 256],
            // Sized for the capacity at once (what the cache is configured to hold): growing
            // a map of hundreds of thousands of pages rehashes them all under the metadata
            // lock. Only the control bytes are touched until pages arrive.
            resident: FxHashMap::with_capacity_and_hasher(capacity, Default::default()),
            clock: VecDeque::with_capacity(capacity),
            dirty: 0,
            dirty_keys: Vec::new(),
            copies: 0,
            source,
            stats: PagerStats::default(),
            changed_dirs: BTreeSet::new(),
            pool: PagePool::new(),
            no_reads: false,
            wanted: Vec::new(),
        }
    }

    /// Forbid reads until [`Pager::allow_reads`]: lookups of pages that are not cached fail.
    pub fn forbid_reads(&mut self) {
        self.no_reads = true;
    }

    /// Allow reads again; returns the pages lookups wanted meanwhile.
    pub fn allow_reads(&mut self) -> Vec<(u8, u64)> {
        self.no_reads = false;
        std::mem::take(&mut self.wanted)
    }

    /// Where this cache's page buffers come from (tables kept whole in RAM encode their
    /// pages for a checkpoint into buffers of the same pool).
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    pub fn source(&self) -> &Arc<dyn PageSource> {
        &self.source
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        // A configuration change: one resize now instead of one under a host's write later.
        self.resident
            .reserve(self.capacity.saturating_sub(self.resident.len()));
        self.clock
            .reserve(self.capacity.saturating_sub(self.clock.len()));
        self.make_room(self.capacity);
    }

    pub fn directory(&self, table: u8) -> &[PageLoc] {
        &self.directories[table as usize]
    }

    /// Install a directory (at open, from the directory pages the root names).
    pub fn set_directory(&mut self, table: u8, directory: Vec<PageLoc>) {
        self.directories[table as usize] = directory;
    }

    /// Where page `index` of `table` is ([`PageLoc::NONE`] if it was never written).
    pub fn loc(&self, table: u8, index: u64) -> PageLoc {
        self.directories[table as usize]
            .get(index as usize)
            .copied()
            .unwrap_or(PageLoc::NONE)
    }

    pub fn stats(&self) -> PagerStats {
        PagerStats {
            resident: self.resident.len(),
            dirty: self.dirty,
            ..self.stats
        }
    }

    /// Dirty pages, and whether they have reached `share` of the capacity.
    pub fn dirty_pages(&self) -> usize {
        self.dirty
    }

    /// Dirty pages (and frozen versions held beside their copies) past 9/10 of the
    /// capacity: the engine must checkpoint before it adds more (this is the writers'
    /// back-pressure; background checkpoints start earlier).
    pub fn over_budget(&self) -> bool {
        (self.dirty + self.copies) * 10 >= self.capacity * 9
    }

    /// Page `index` of `table` if it is cached, without marking it used (a scan that must
    /// not push the working set out).
    pub fn cached(&self, table: u8, index: u64) -> Option<&PageBody> {
        self.resident.get(&(table, index)).map(|r| &*r.body)
    }

    /// Page `index` of `table`, read from the metadata area if it is not cached.
    pub fn page(&mut self, table: u8, index: u64) -> Result<&PageBody, PageError> {
        self.load(table, index)?;
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        r.referenced = true;
        Ok(&r.body)
    }

    /// Page `index` of `table` if it can be had without I/O: cached, or never written.
    pub fn peek(&mut self, table: u8, index: u64) -> Option<&PageBody> {
        if !self.available(table, index) {
            return None;
        }
        self.page(table, index).ok()
    }

    /// Whether page `index` of `table` can be had without I/O.
    pub fn available(&self, table: u8, index: u64) -> bool {
        self.resident.contains_key(&(table, index)) || self.loc(table, index).is_none()
    }

    /// Page `index` of `table` to change: it becomes dirty (copied first if a checkpoint
    /// holds it).
    pub fn page_mut(&mut self, table: u8, index: u64) -> Result<&mut PageBody, PageError> {
        self.load(table, index)?;
        Ok(self.dirty_body(table, index))
    }

    /// Page `index` of `table` replaced by zeros without reading what it held (a node id
    /// reused for a new node): dirty.
    pub fn page_new(&mut self, table: u8, index: u64) -> &mut PageBody {
        if !self.resident.contains_key(&(table, index)) {
            let body = self.pool.take();
            self.insert(table, index, body);
        }
        let body = self.dirty_body(table, index);
        body.fill(0);
        body
    }

    fn dirty_body(&mut self, table: u8, index: u64) -> &mut PageBody {
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        if PageBuf::get_mut(&mut r.body).is_none() {
            // A checkpoint holds this version: change a copy.
            r.body = self.pool.copy_of(&r.body);
            if r.frozen && !r.copied {
                r.copied = true;
                self.copies += 1;
            }
            self.make_room(self.capacity);
        }
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        r.referenced = true;
        if !r.dirty {
            r.dirty = true;
            self.dirty += 1;
            self.dirty_keys.push((table, index));
        }
        PageBuf::get_mut(&mut r.body).expect("unshared")
    }

    /// Of `keys`, the pages that would need I/O, with where they are.
    pub fn missing(&self, keys: impl IntoIterator<Item = (u8, u64)>) -> Vec<(u8, u64, PageLoc)> {
        let mut out: Vec<(u8, u64, PageLoc)> = keys
            .into_iter()
            .filter(|&(t, i)| !self.resident.contains_key(&(t, i)))
            .filter_map(|(t, i)| {
                let loc = self.loc(t, i);
                (!loc.is_none()).then_some((t, i, loc))
            })
            .collect();
        out.sort_by_key(|&(t, i, _)| (t, i));
        out.dedup_by_key(|&mut (t, i, _)| (t, i));
        out
    }

    /// A page read without the caller holding the engine's lock (see [`Pager::missing`]):
    /// cached unless it is cached already or its directory entry moved meanwhile.
    pub fn insert_read(&mut self, table: u8, index: u64, loc: PageLoc, body: Box<PageBody>) {
        if self.resident.contains_key(&(table, index)) || self.loc(table, index) != loc {
            return;
        }
        self.stats.faults += 1;
        self.make_room(self.capacity.saturating_sub(1));
        let buffer = self.pool.copy_of(&body);
        self.insert(table, index, buffer);
    }

    fn insert(&mut self, table: u8, index: u64, body: PageBuf) {
        self.resident.insert(
            (table, index),
            Resident {
                body,
                dirty: false,
                frozen: false,
                referenced: false,
                copied: false,
            },
        );
        self.clock.push_back((table, index));
    }

    fn load(&mut self, table: u8, index: u64) -> Result<(), PageError> {
        if self.resident.contains_key(&(table, index)) {
            self.stats.hits += 1;
            return Ok(());
        }
        let loc = self.loc(table, index);
        if self.no_reads && !loc.is_none() {
            self.wanted.push((table, index));
            return Err(PageError {
                table,
                index,
                loc,
                reason: NOT_CACHED.into(),
            });
        }
        let body = if loc.is_none() {
            self.pool.zeroed()
        } else {
            self.stats.faults += 1;
            let read = read_page(&*self.source, table, index, loc)?;
            self.pool.copy_of(&read)
        };
        self.make_room(self.capacity.saturating_sub(1));
        self.insert(table, index, body);
        Ok(())
    }

    /// Evict clean, unfrozen pages by CLOCK until at most `target` are cached. Dirty and
    /// frozen pages are passed over: the cache may exceed its capacity by them until the next
    /// checkpoint ([`Pager::over_budget`]).
    fn make_room(&mut self, target: usize) {
        let mut budget = 2 * self.clock.len();
        while self.resident.len() + self.copies > target && budget > 0 {
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
            // Its buffer returns to the pool (or stays with a checkpoint that holds it).
            self.resident.remove(&key);
            self.stats.evictions += 1;
        }
        // The ring keeps keys of pages evicted by other paths; trim it when it grows.
        if self.clock.len() > 2 * self.resident.len() + 64 {
            let resident = &self.resident;
            self.clock.retain(|k| resident.contains_key(k));
        }
    }

    /// Hand every dirty page to a checkpoint. They become clean but stay cached until
    /// [`Pager::written`] reports where each went.
    pub fn freeze(&mut self) -> Vec<FrozenPage> {
        let mut out = Vec::with_capacity(self.dirty);
        for (table, index) in std::mem::take(&mut self.dirty_keys) {
            let Some(r) = self.resident.get_mut(&(table, index)) else {
                continue;
            };
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

    /// Page `index` of `table` was written at `loc` (a frozen page, a page of a table kept
    /// whole in RAM, or a directory page): its directory entry moves there. Returns the place
    /// it moved from, which becomes free once the next root is durable.
    pub fn written(&mut self, table: u8, index: u64, loc: PageLoc) -> PageLoc {
        let dir = &mut self.directories[table as usize];
        let from = if dir.len() <= index as usize {
            // Every directory page up to the new end is written, so the root can name them
            // all (pages skipped over read as never written).
            let from = dir.len() as u64;
            dir.resize(index as usize + 1, PageLoc::NONE);
            from
        } else {
            index
        };
        let old = std::mem::replace(&mut dir[index as usize], loc);
        if table < DIR_BASE {
            for page in from / DIR_PER_PAGE..=index / DIR_PER_PAGE {
                self.changed_dirs.insert((table, page));
            }
        }
        if let Some(r) = self.resident.get_mut(&(table, index)) {
            r.frozen = false;
            if std::mem::take(&mut r.copied) {
                self.copies -= 1;
            }
        }
        old
    }

    /// Release the cache space the pages just written held beyond the capacity.
    pub fn settle(&mut self) {
        self.make_room(self.capacity);
    }

    /// A checkpoint that froze pages failed before writing them: they are dirty again.
    pub fn thaw(&mut self, pages: Vec<FrozenPage>) {
        for p in pages {
            if let Some(r) = self.resident.get_mut(&(p.table, p.index)) {
                r.frozen = false;
                if std::mem::take(&mut r.copied) {
                    self.copies -= 1;
                }
                if !r.dirty {
                    r.dirty = true;
                    self.dirty += 1;
                    self.dirty_keys.push((p.table, p.index));
                }
            }
        }
    }

    /// The directory pages to write with the next root (see [`Pager::dir_page`]); a
    /// checkpoint that fails gives them back with [`Pager::keep_changed_dirs`].
    pub fn take_changed_dirs(&mut self) -> BTreeSet<(u8, u64)> {
        std::mem::take(&mut self.changed_dirs)
    }

    pub fn keep_changed_dirs(&mut self, dirs: BTreeSet<(u8, u64)>) {
        self.changed_dirs.extend(dirs);
    }

    /// Directory page `page` of `table`, encoded.
    pub fn dir_page(&self, table: u8, page: u64) -> Box<PageBody> {
        let mut body = Box::new([0u8; PAGE_BYTES]);
        let dir = &self.directories[table as usize];
        let from = (page * DIR_PER_PAGE) as usize;
        let to = dir.len().min(from + DIR_PER_PAGE as usize);
        for (k, loc) in dir[from.min(to)..to].iter().enumerate() {
            loc.encode(&mut body[k * PAGE_LOC_BYTES..(k + 1) * PAGE_LOC_BYTES]);
        }
        body
    }
}

/// Decode the directory of a table of `pages` pages from its directory pages' bodies.
pub fn decode_directory(pages: u64, dir_pages: &[Box<PageBody>]) -> Vec<PageLoc> {
    let mut out = Vec::with_capacity(pages as usize);
    for body in dir_pages {
        for k in 0..DIR_PER_PAGE as usize {
            if out.len() as u64 == pages {
                return out;
            }
            out.push(PageLoc::decode(
                &body[k * PAGE_LOC_BYTES..(k + 1) * PAGE_LOC_BYTES],
            ));
        }
    }
    out.resize(pages as usize, PageLoc::NONE);
    out
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

impl Entry for u16 {
    const SIZE: usize = 2;
    fn read(bytes: &[u8]) -> Self {
        u16::from_le_bytes(bytes.try_into().expect("2 bytes"))
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

    /// The page holding entry `index`, and the entry's byte offset in it.
    pub fn place(index: u64) -> (u64, usize) {
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
    use crate::meta::page_store::page_crc;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A metadata area in memory: every page written to a new slot (slots are never reused
    /// here, so older checkpoints stay readable).
    #[derive(Default)]
    struct MemLog(Mutex<Vec<PageBody>>);

    impl MemLog {
        fn append(&self, p: &FrozenPage) -> PageLoc {
            let mut slots = self.0.lock().unwrap();
            slots.push(*p.body);
            PageLoc {
                slot: slots.len() as u64 - 1,
                crc: page_crc(p.table, p.index, &p.body),
            }
        }
    }

    impl PageSource for MemLog {
        fn read_slot(&self, slot: u64, buf: &mut PageBody) -> std::io::Result<()> {
            let slots = self.0.lock().unwrap();
            let src = slots
                .get(slot as usize)
                .ok_or_else(|| std::io::Error::other("beyond the area"))?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    impl Pager {
        fn with_directories(
            source: Arc<dyn PageSource>,
            dirs: Vec<Vec<PageLoc>>,
            capacity: usize,
        ) -> Pager {
            let mut p = Pager::new(source, capacity);
            for (t, d) in dirs.into_iter().enumerate() {
                p.set_directory(t as u8, d);
            }
            p
        }
    }

    fn checkpoint(pager: &mut Pager, log: &MemLog) -> usize {
        let frozen = pager.freeze();
        let n = frozen.len();
        for p in frozen {
            let loc = log.append(&p);
            pager.written(p.table, p.index, loc);
        }
        pager.settle();
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
            let mut pager = Pager::new(log.clone(), 2);
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
                        pager.settle();
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
        let mut pager = Pager::new(log.clone(), 2);
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
        let mut pager = Pager::new(log.clone(), 1);
        T0.set(&mut pager, 3, 33).unwrap();
        T1.set(&mut pager, 600, 66).unwrap();
        checkpoint(&mut pager, &log);
        let dirs: Vec<_> = (0..2).map(|t| pager.directory(t).to_vec()).collect();
        // Flip a byte inside table 0's page body.
        let loc0 = dirs[0][0];
        log.0.lock().unwrap()[loc0.slot as usize][24] ^= 1;
        let mut reader = Pager::with_directories(log.clone(), dirs.clone(), 4);
        let e = T0.get(&mut reader, 3).unwrap_err();
        assert_eq!((e.table, e.index, e.loc), (0, 0, loc0));
        assert!(e.to_string().contains("slot"), "{e}");
        // A directory entry naming another page's (valid) slot is refused too.
        let mut swapped = dirs.clone();
        swapped[0][0] = dirs[1][1];
        let mut reader = Pager::with_directories(log.clone(), swapped, 4);
        let e = T0.get(&mut reader, 3).unwrap_err();
        assert!(e.reason.contains("checksum"), "{e}");
        // A directory entry whose checksum is not the slot's (a stale entry) is refused.
        let mut stale = dirs.clone();
        stale[1][1] = PageLoc {
            crc: dirs[1][1].crc ^ 1,
            ..dirs[1][1]
        };
        let mut reader = Pager::with_directories(log.clone(), stale, 4);
        let e = T1.get(&mut reader, 600).unwrap_err();
        assert!(e.reason.contains("checksum"), "{e}");
        let mut reader = Pager::with_directories(log.clone(), dirs.clone(), 4);
        // The undamaged page still reads.
        assert_eq!(T1.get(&mut reader, 600).unwrap(), 66);
        // Directories survive their own encoding.
        let body = pager.dir_page(1, 0);
        assert_eq!(decode_directory(dirs[1].len() as u64, &[body]), dirs[1]);
    }

    #[test]
    fn a_failed_checkpoint_leaves_its_pages_dirty() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 1);
        T0.set(&mut pager, 0, 5).unwrap();
        let frozen = pager.freeze();
        assert_eq!(pager.stats().dirty, 0);
        pager.thaw(frozen);
        assert_eq!(pager.stats().dirty, 1);
        assert_eq!(checkpoint(&mut pager, &log), 1);
    }
}
