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
//! Directories are themselves stored in pages (204 entries each, table `DIR_BASE + t` for
//! table `t`), and so are the directories of those (table `TOP_BASE + t`: 204 directory pages,
//! 835 Mi pages of table `t`, each), written by the same checkpoint after the pages they name;
//! the root names the top pages only, so it stays a few KiB at any size (format 3 had one
//! level, and its root named every directory page: 92 KiB at 1 TiB, 23 MiB at 256 TiB, written
//! by every checkpoint). The pager does no writes; reads go through a [`PageSource`].
//!
//! A changed page also records *which* 8-byte words changed since it was last frozen: a
//! checkpoint writes a page changed in a few words as a delta in the journal instead of
//! whole ([`super::journal`]), and the pager applies a page's pending words whenever it reads
//! the page's base from disk.

use super::journal::{
    delta_table, Group, Journal, JournalWriter, WordSet, MAX_DELTA_WORDS, MAX_PENDING_WORDS,
};

use super::layout::{dir_per_page, loc_bytes, TableRoot, ROOT_VERSION_V3};
use super::page_buf::{PageBuf, PagePool};
use super::page_store::PAGE_LOC_BYTES;
use super::page_store::{
    read_page, read_pages, PageBody, PageError, PageLoc, PageSource, PAGE_BYTES,
};
use super::tables::{DIR_BASE, TOP_BASE, T_JOURNAL};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeSet, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

/// The table whose pages name the pages of `table`: its directory, the top directory of a
/// directory, none for a top directory (the root names those).
pub fn directory_table(table: u8) -> Option<u8> {
    match table {
        t if t >= DIR_BASE => Some(t - DIR_BASE + TOP_BASE),
        t if t >= TOP_BASE => None,
        t => Some(t + DIR_BASE),
    }
}

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
    /// Words changed since the page was last frozen (meaningful while `dirty`).
    changed: WordSet,
    /// Replaced rather than changed word by word (a new node, a split bucket), or chosen to
    /// be written whole: the next checkpoint writes it whole.
    whole: bool,
}

/// Words cleaning writes again: (journal page they were in, table, page, words).
pub type CleanedWords = (u64, u8, u64, Vec<(u16, u64)>);

/// The journal pages of a checkpoint of generation `gen`: the cleaned words first, then the
/// changed words of each page frozen as a delta (open replays them in this order).
pub fn journal_writer(gen: u64, frozen: &[FrozenPage], cleaned: &[CleanedWords]) -> JournalWriter {
    let mut w = JournalWriter::new(gen);
    for (from, table, index, words) in cleaned {
        w.push(*table, *index, words, Some(*from));
    }
    for p in frozen {
        if let Some(changed) = &p.delta {
            let words: Vec<(u16, u64)> = changed
                .iter()
                .map(|k| (k as u16, super::journal::word(&p.body, k)))
                .collect();
            w.push(p.table, p.index, &words, None);
        }
    }
    w
}

/// A page handed to a checkpoint by [`Pager::freeze`].
pub struct FrozenPage {
    pub table: u8,
    pub index: u64,
    pub body: PageBuf,
    /// `Some(words)`: the checkpoint writes these words to the journal, not the page
    /// ([`Pager::delta_written`] then releases it); `None`: the page is written whole.
    pub delta: Option<WordSet>,
}

/// A page being changed: reads see the whole body, writes go through [`PageMut::set`] so
/// the pager knows which words changed.
pub struct PageMut<'a> {
    body: &'a mut PageBody,
    changed: &'a mut WordSet,
    whole: &'a mut bool,
}

impl PageMut<'_> {
    /// Write `bytes` at byte `at`; only the 8-byte words whose value changes count as
    /// changed.
    pub fn set(&mut self, at: usize, bytes: &[u8]) {
        let end = at + bytes.len();
        for w in at / 8..end.div_ceil(8) {
            let (from, to) = ((w * 8).max(at), (w * 8 + 8).min(end));
            let src = &bytes[from - at..to - at];
            if self.body[from..to] != *src {
                self.body[from..to].copy_from_slice(src);
                self.changed.insert(w);
            }
        }
    }

    /// Write the 8-byte word `word`.
    pub fn set_word(&mut self, word: usize, value: u64) {
        self.set(word * 8, &value.to_le_bytes());
    }

    /// Change the page as a whole (the next checkpoint writes it whole).
    pub fn replace(&mut self, change: impl FnOnce(&mut PageBody)) {
        change(self.body);
        *self.whole = true;
    }
}

impl std::ops::Deref for PageMut<'_> {
    type Target = PageBody;
    fn deref(&self) -> &PageBody {
        self.body
    }
}

/// Cache figures, for metrics and for tests that must see eviction happen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    pub hits: u64,
    pub faults: u64,
    pub evictions: u64,
    pub resident: usize,
    pub dirty: usize,
    /// Words of pages written as deltas and not yet part of their pages' bases, the journal
    /// pages holding them and their RAM.
    pub journal_words: u64,
    pub journal_pages: usize,
    pub journal_bytes: u64,
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
    /// Directory pages whose entries changed since the last root was made durable, as (the
    /// table they describe, page of its directory): the next checkpoint writes them, the
    /// directories of data tables first, then the top directories naming those.
    changed_dirs: BTreeSet<(u8, u64)>,
    /// Where page buffers come from: blocks of their own, so the cache's churn does not
    /// fragment the heap (see [`super::page_buf`]).
    pool: PagePool,
    /// While set, a page that would need I/O is not read: the lookup fails with
    /// [`NOT_CACHED`] and the page is noted in `wanted`, for the engine to read it outside its
    /// lock and try again.
    no_reads: bool,
    wanted: Vec<(u8, u64)>,
    /// The words pending on top of pages' bases (see [`super::journal`]).
    journal: Journal,
    /// RAM the pending words may take, when configured (else derived from the capacity).
    journal_limit: Option<u64>,
}

/// Share of the cache the journal's pending words may take; beyond three quarters of it,
/// checkpoints write the pages with the most pending words whole (consolidation), and at
/// all of it no page goes as a delta until they have.
const JOURNAL_SHARE: u64 = 4;
/// The most RAM pending words take, whatever the cache: open reads the journal whole, and
/// this bounds it (with cleaning, to twice the live entries: about 0.5 GiB at most).
const JOURNAL_MAX_BYTES: u64 = 256 << 20;
/// Share of the cache's pages dirty pages may fill before a background checkpoint writes
/// them. The larger, the fewer times a page changed again and again is written; it stays below
/// the writers' back-pressure point (9/10), so a checkpoint in progress has room for the pages
/// hosts dirty meanwhile.
pub const DIRTY_SHARE: f64 = 0.6;

/// Dirty pages at which a background checkpoint is due, whatever the cache: a checkpoint
/// freezes its dirty pages in one hold of the engine's lock (about 0.3 us each here), so this
/// bounds that hold to about 10 ms. A page changed in a few words costs the checkpoint ten
/// bytes a word (the journal), so checkpoints more frequent than the cache would call for
/// write little more.
pub const MAX_FROZEN_PAGES: usize = 32 << 10;

/// Pages one checkpoint writes whole to consolidate pending words at most.
const MAX_VICTIMS: usize = 4096;
/// Journal pages one checkpoint cleans at most, and the pages in use below which it does not.
const MAX_CLEANED: usize = 256;
const CLEAN_SLACK: usize = 64;

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
            journal: Journal::new(),
            journal_limit: None,
        }
    }

    /// Set the RAM the pending words may take (instead of a share of the capacity).
    pub fn set_journal_budget(&mut self, bytes: u64) {
        self.journal_limit = Some(bytes);
    }

    /// Read the journal pages the directories name and rebuild the pending words from them
    /// (open: the directories are those of the root). The pages are read in the order they
    /// were written (generation, then index), which is also nearly the order of their slots,
    /// runs of adjacent slots in one read each.
    pub fn load_journal(&mut self) -> Result<(), PageError> {
        let mut named: Vec<(u64, PageLoc)> = self
            .directory(T_JOURNAL)
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_none())
            .map(|(j, &l)| (j as u64, l))
            .collect();
        named.sort_by_key(|&(j, l)| (l.gen, j));
        let source = self.source.clone();
        let directories = &self.directories;
        let mut failed = None;
        // Read 1,024 pages at a time, as the load takes them.
        let pages = named
            .chunks(1024)
            .map_while(|batch| match read_pages(&*source, T_JOURNAL, batch) {
                Ok(bodies) => Some(batch.iter().copied().zip(bodies)),
                Err(e) => {
                    failed = Some(e);
                    None
                }
            })
            .flatten()
            .map(|((j, l), body)| (j, l, body));
        let loaded = Journal::load(pages, |table, index| {
            directories[table as usize].get(index as usize).copied()
        });
        if let Some(e) = failed {
            return Err(e);
        }
        self.journal = loaded.map_err(|e| PageError {
            table: T_JOURNAL,
            index: 0,
            loc: PageLoc::NONE,
            reason: e.to_string(),
        })?;
        Ok(())
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// RAM the journal's pending words may take.
    pub fn journal_budget(&self) -> u64 {
        self.journal_limit.unwrap_or(
            (self.capacity as u64 * PAGE_BYTES as u64 / JOURNAL_SHARE).min(JOURNAL_MAX_BYTES),
        )
    }

    /// Pages the cache may hold: its capacity less the pending words' budget (at least
    /// half). The budget is set aside whether the words use it or not: page buffers are kept
    /// in their pool once allocated (see [`super::page_buf`]), so pages that filled it first
    /// would stay in RAM beside the words that came later.
    fn page_room(&self) -> usize {
        let journal = (self.journal_budget() / PAGE_BYTES as u64) as usize;
        self.capacity.saturating_sub(journal).max(self.capacity / 2)
    }

    /// Pages to write whole in the next checkpoint so that the pending words shrink: none
    /// until they take three quarters of their budget, then those with the most words.
    pub fn consolidation_victims(&self) -> Vec<(u8, u64)> {
        let budget = self.journal_budget();
        if self.journal.ram_bytes() * 4 < budget * 3 {
            return Vec::new();
        }
        self.journal.victims(budget / 2, MAX_VICTIMS)
    }

    /// Journal pages the next checkpoint should clean, with where they are.
    pub fn journal_cleanable(&self) -> Vec<(u64, PageLoc)> {
        // A small budget (tests) cleans early too.
        let slack = (self.journal_budget() / PAGE_BYTES as u64) as usize;
        self.journal
            .cleanable(slack.clamp(2, CLEAN_SLACK), MAX_CLEANED)
            .into_iter()
            .map(|j| (j, self.loc(T_JOURNAL, j)))
            .collect()
    }

    /// Make the cached ones of `pages` dirty, to be written whole by the next checkpoint.
    pub fn make_whole(&mut self, pages: &[(u8, u64)]) {
        for &(table, index) in pages {
            if self.resident.contains_key(&(table, index)) {
                self.dirty_body(table, index);
                self.resident
                    .get_mut(&(table, index))
                    .expect("cached")
                    .whole = true;
            }
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
        self.make_room(self.page_room());
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
            journal_words: self.journal.words(),
            journal_pages: self.journal.journal_pages(),
            journal_bytes: self.journal.ram_bytes(),
            ..self.stats
        }
    }

    /// Dirty pages (and frozen versions held beside their copies) past 9/10 of the
    /// capacity: the engine must checkpoint before it adds more (this is the writers'
    /// back-pressure; background checkpoints start earlier).
    pub fn over_budget(&self) -> bool {
        (self.dirty + self.copies) * 10 >= self.page_room() * 9
    }

    /// Whether the dirty pages (and the frozen versions held beside them) call for a
    /// background checkpoint: [`DIRTY_SHARE`] of the pages' room, at most
    /// [`MAX_FROZEN_PAGES`].
    pub fn checkpoint_wanted(&self) -> bool {
        let limit = ((self.page_room() as f64 * DIRTY_SHARE) as usize).min(MAX_FROZEN_PAGES);
        self.dirty + self.copies >= limit.max(1)
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
    pub fn page_mut(&mut self, table: u8, index: u64) -> Result<PageMut<'_>, PageError> {
        self.load(table, index)?;
        Ok(self.dirty_body(table, index))
    }

    /// Page `index` of `table` replaced by zeros without reading what it held (a node id
    /// reused for a new node): dirty, and written whole by the next checkpoint (its pending
    /// words, if any, are dropped when it is).
    pub fn page_new(&mut self, table: u8, index: u64) -> PageMut<'_> {
        if !self.resident.contains_key(&(table, index)) {
            let body = self.pool.take();
            self.insert(table, index, body);
        }
        let mut page = self.dirty_body(table, index);
        page.replace(|b| b.fill(0));
        page
    }

    fn dirty_body(&mut self, table: u8, index: u64) -> PageMut<'_> {
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        if PageBuf::get_mut(&mut r.body).is_none() {
            // A checkpoint holds this version: change a copy.
            r.body = self.pool.copy_of(&r.body);
            if r.frozen && !r.copied {
                r.copied = true;
                self.copies += 1;
            }
            self.make_room(self.page_room());
        }
        let r = self.resident.get_mut(&(table, index)).expect("loaded");
        r.referenced = true;
        if !r.dirty {
            r.dirty = true;
            self.dirty += 1;
            self.dirty_keys.push((table, index));
        }
        PageMut {
            body: PageBuf::get_mut(&mut r.body).expect("unshared"),
            changed: &mut r.changed,
            whole: &mut r.whole,
        }
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
        self.make_room(self.page_room().saturating_sub(1));
        let mut buffer = self.pool.copy_of(&body);
        self.journal
            .apply(table, index, PageBuf::get_mut(&mut buffer).expect("new"));
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
                changed: WordSet::default(),
                whole: false,
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
            let mut read = read_page(&*self.source, table, index, loc)?;
            self.journal.apply(table, index, &mut read);
            self.pool.copy_of(&read)
        };
        self.make_room(self.page_room().saturating_sub(1));
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
    ///
    /// A page of a table that takes deltas goes as one when it has a base on disk, changed in
    /// at most [`MAX_DELTA_WORDS`] words, would keep at most [`MAX_PENDING_WORDS`] pending,
    /// and the pending words are within their budget; otherwise it is written whole.
    pub fn freeze(&mut self) -> Vec<FrozenPage> {
        let mut out = Vec::with_capacity(self.dirty);
        let deltas_allowed = self.journal.ram_bytes() < self.journal_budget();
        // In (table, index) order, so pages written together sit together; the keys are
        // sorted, not the frozen pages (five times larger, and this runs under the lock).
        let mut keys = std::mem::take(&mut self.dirty_keys);
        keys.sort_unstable();
        for (table, index) in keys {
            let Some(r) = self.resident.get_mut(&(table, index)) else {
                continue;
            };
            if r.dirty {
                r.dirty = false;
                r.frozen = true;
                let changed = std::mem::take(&mut r.changed);
                let whole = std::mem::take(&mut r.whole);
                let body = r.body.clone();
                // The cheap tests first: most pages of a sequential fill fail them.
                let delta = (deltas_allowed
                    && delta_table(table)
                    && !whole
                    && changed.len() <= MAX_DELTA_WORDS
                    && !self.loc(table, index).is_none()
                    && self.journal.count(table, index) + changed.len() <= MAX_PENDING_WORDS)
                    .then_some(changed);
                out.push(FrozenPage {
                    table,
                    index,
                    body,
                    delta,
                });
            }
        }
        self.dirty = 0;
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
        if directory_table(table).is_some() {
            for page in from / DIR_PER_PAGE..=index / DIR_PER_PAGE {
                self.changed_dirs.insert((table, page));
            }
        }
        // Written whole: the base holds every pending word now.
        if delta_table(table) {
            self.journal.drop_page(table, index);
        }
        self.unfreeze(table, index);
        old
    }

    fn unfreeze(&mut self, table: u8, index: u64) {
        if let Some(r) = self.resident.get_mut(&(table, index)) {
            r.frozen = false;
            if std::mem::take(&mut r.copied) {
                self.copies -= 1;
            }
        }
    }

    fn journal_moved(&mut self, table: u8, index: u64, words: &[(u16, u64)], from: u64, to: u64) {
        self.journal.moved(table, index, words, from, to);
    }

    /// The live words of the journal pages a checkpoint cleans (`cleaned`: each page's index
    /// and groups, as read), except those of pages it writes whole: (journal page, table,
    /// page, words).
    pub fn cleaning_words(
        &self,
        cleaned: &[(u64, Vec<Group>)],
        frozen: &[FrozenPage],
    ) -> Vec<CleanedWords> {
        if cleaned.is_empty() {
            return Vec::new();
        }
        let whole: FxHashSet<(u8, u64)> = frozen
            .iter()
            .filter(|p| p.delta.is_none())
            .map(|p| (p.table, p.index))
            .collect();
        let mut out = Vec::new();
        for (j, groups) in cleaned {
            let mut seen = FxHashSet::default();
            for g in groups {
                let key = (g.table, g.index);
                if whole.contains(&key) || !seen.insert(key) {
                    continue;
                }
                let words = self.journal.live_in(g.table, g.index, *j);
                if !words.is_empty() {
                    out.push((*j, g.table, g.index, words));
                }
            }
        }
        out
    }

    /// A checkpoint's pages are written: the whole ones of `frozen` at `whole_locs` (in their
    /// order), the journal pages `writer` filled at `journal` (index, place, in its order).
    /// Directories move, the written words become pending, cleaned words move, delta pages
    /// are released and journal pages with nothing live left are dropped. Returns the places
    /// pages moved away from, free once the next root is durable.
    ///
    /// The engine takes the steps one by one ([`Pager::install_pages`],
    /// [`Pager::install_words`], [`Pager::release_deltas`], [`Pager::drop_dead_journal_pages`]),
    /// in several holds of its lock: between them, a page not yet released is still frozen
    /// (cached, so its pending words are not read), and the words of every other page keep
    /// their values (cleaning only moves them between journal pages).
    pub fn install(
        &mut self,
        frozen: &[FrozenPage],
        whole_locs: &[PageLoc],
        placed: Vec<(usize, Option<u64>, Group)>,
        journal: &[(u64, PageLoc)],
    ) -> Vec<PageLoc> {
        let mut retired = self.install_pages(frozen, whole_locs, journal);
        self.install_words(&placed, journal);
        self.release_deltas(frozen);
        retired.extend(self.drop_dead_journal_pages(journal));
        retired
    }

    /// The first step of [`Pager::install`]: the directories name the pages written whole and
    /// the new journal pages. Returns the places pages moved away from.
    pub fn install_pages(
        &mut self,
        frozen: &[FrozenPage],
        whole_locs: &[PageLoc],
        journal: &[(u64, PageLoc)],
    ) -> Vec<PageLoc> {
        let mut retired = Vec::new();
        let whole = frozen.iter().filter(|p| p.delta.is_none());
        for (p, loc) in whole.zip(whole_locs) {
            retired.push(self.written(p.table, p.index, *loc));
        }
        for &(j, loc) in journal {
            retired.push(self.written(T_JOURNAL, j, loc));
        }
        retired.retain(|l| !l.is_none());
        retired
    }

    /// The second step: the words of (a run of) the groups written become pending, or move
    /// to the journal page they were cleaned into. Groups go in the order written.
    pub fn install_words(
        &mut self,
        placed: &[(usize, Option<u64>, Group)],
        journal: &[(u64, PageLoc)],
    ) {
        for (ordinal, from, g) in placed {
            let to = journal[*ordinal].0;
            match from {
                Some(from) => self.journal_moved(g.table, g.index, &g.words, *from, to),
                None => self.journal.add(g.table, g.index, &g.words, to),
            }
        }
    }

    /// The third step, once every group is installed: the pages of (a run of) `frozen` that
    /// went as deltas are released (their base and pending words give their content now).
    pub fn release_deltas(&mut self, frozen: &[FrozenPage]) {
        for p in frozen.iter().filter(|p| p.delta.is_some()) {
            self.unfreeze(p.table, p.index);
        }
    }

    /// Journal page indexes for a checkpoint's new journal pages (see [`Journal::allocate`]).
    pub fn allocate_journal_pages(&mut self, n: usize) -> Vec<u64> {
        self.journal.allocate(n)
    }

    /// Journal page indexes taken for pages that were not written after all.
    pub fn cancel_journal_pages(&mut self, indexes: &[u64]) {
        self.journal.cancel(indexes);
    }

    /// Drop the journal pages none of whose words are pending any more from the directory
    /// (`written`: the journal pages this checkpoint wrote, index and place); returns the places
    /// they held, free once the next root is durable.
    pub fn drop_dead_journal_pages(&mut self, written: &[(u64, PageLoc)]) -> Vec<PageLoc> {
        let indexes: Vec<u64> = written.iter().map(|&(j, _)| j).collect();
        self.journal.settle_new(&indexes);
        let dead = self.journal.take_dead();
        dead.into_iter()
            .map(|j| self.written(T_JOURNAL, j, PageLoc::NONE))
            .filter(|l| !l.is_none())
            .collect()
    }

    /// Release the cache space the pages just written held beyond the capacity.
    pub fn settle(&mut self) {
        self.make_room(self.page_room());
    }

    /// A checkpoint that froze pages failed before writing them: they are dirty again.
    pub fn thaw(&mut self, pages: Vec<FrozenPage>) {
        for p in pages {
            if let Some(r) = self.resident.get_mut(&(p.table, p.index)) {
                r.frozen = false;
                if std::mem::take(&mut r.copied) {
                    self.copies -= 1;
                }
                // What changed since the freeze, and what the frozen version had changed.
                match p.delta {
                    Some(words) => r.changed.union(&words),
                    None => r.whole = true,
                }
                if !r.dirty {
                    r.dirty = true;
                    self.dirty += 1;
                    self.dirty_keys.push((p.table, p.index));
                }
            }
        }
    }

    /// Install the directories a root names (open): for each table, its top directory pages
    /// (format 4) or its directory pages (format 3) from the root, read and decoded down to
    /// the table's own directory. Pages never written read as zeros (none are, below a root).
    pub fn load_directories(
        &mut self,
        tables: &[TableRoot],
        version: u32,
    ) -> Result<(), PageError> {
        let per = dir_per_page(version);
        for t in tables {
            let levels: &[u8] = if version == ROOT_VERSION_V3 {
                &[DIR_BASE + t.table]
            } else {
                &[TOP_BASE + t.table, DIR_BASE + t.table]
            };
            let mut locs = t.dir.clone();
            for (k, &holder) in levels.iter().enumerate() {
                let below = if k + 1 < levels.len() {
                    t.pages.div_ceil(per)
                } else {
                    t.pages
                };
                let named: Vec<(u64, PageLoc)> = locs
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_none())
                    .map(|(p, &l)| (p as u64, l))
                    .collect();
                let mut bodies: Vec<Box<PageBody>> =
                    locs.iter().map(|_| Box::new([0u8; PAGE_BYTES])).collect();
                for (&(p, _), body) in named.iter().zip(read_pages(&*self.source, holder, &named)?)
                {
                    bodies[p as usize] = body;
                }
                self.set_directory(holder, std::mem::take(&mut locs));
                locs = decode_directory(below, &bodies, version);
            }
            self.set_directory(t.table, locs);
        }
        Ok(())
    }

    /// Every directory page is to be written with the next root (a format 3 array, whose
    /// directory pages have another layout).
    pub fn rewrite_all_directories(&mut self) {
        // The top directories follow, as each directory page is written.
        for table in 0..TOP_BASE {
            let pages = self.directories[table as usize].len() as u64;
            for page in 0..pages.div_ceil(DIR_PER_PAGE) {
                self.changed_dirs.insert((table, page));
            }
        }
    }

    /// The directory pages to write with the next root (see [`Pager::dir_page`]): those of
    /// data tables (`top` false), or the top directory pages (`top` true: taken after the
    /// directory pages were written, which changes them); a checkpoint that fails gives them
    /// back with [`Pager::keep_changed_dirs`].
    pub fn take_changed_dirs(&mut self, top: bool) -> BTreeSet<(u8, u64)> {
        let (taken, kept) = std::mem::take(&mut self.changed_dirs)
            .into_iter()
            .partition(|&(t, _)| (t >= DIR_BASE) == top);
        self.changed_dirs = kept;
        taken
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

/// Decode the directory of a table of `pages` pages from its directory pages' bodies, written
/// in the format of a root of `version`.
pub fn decode_directory(pages: u64, dir_pages: &[Box<PageBody>], version: u32) -> Vec<PageLoc> {
    let size = loc_bytes(version);
    let mut out = Vec::with_capacity(pages as usize);
    for body in dir_pages {
        for k in 0..dir_per_page(version) as usize {
            if out.len() as u64 == pages {
                return out;
            }
            out.push(PageLoc::decode(&body[k * size..(k + 1) * size]));
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

/// Unsigned integers are entries of their own size.
macro_rules! integer_entries {
    ($($int:ty),*) => {$(
        impl Entry for $int {
            const SIZE: usize = std::mem::size_of::<$int>();
            fn read(bytes: &[u8]) -> Self {
                <$int>::from_le_bytes(bytes.try_into().expect("an entry's bytes"))
            }
            fn write(&self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

integer_entries!(u64, u16);

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
        const MAX_ENTRY: usize = 64;
        debug_assert!(T::SIZE <= MAX_ENTRY);
        let (page, at) = Self::place(index);
        let mut bytes = [0u8; MAX_ENTRY];
        value.write(&mut bytes[..T::SIZE]);
        pager.page_mut(self.id, page)?.set(at, &bytes[..T::SIZE]);
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
        fn append(&self, table: u8, index: u64, body: &PageBody, gen: u64) -> PageLoc {
            let mut slots = self.0.lock().unwrap();
            slots.push(*body);
            PageLoc {
                slot: slots.len() as u64 - 1,
                crc: page_crc(table, index, body),
                gen,
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
        /// A pager opened on the directories a checkpoint left (the journal read back).
        fn with_directories(
            source: Arc<dyn PageSource>,
            dirs: Vec<Vec<PageLoc>>,
            capacity: usize,
        ) -> Pager {
            let mut p = Pager::new(source, capacity);
            for (t, d) in dirs.into_iter().enumerate() {
                p.set_directory(t as u8, d);
            }
            p.load_journal().expect("journal");
            p
        }
    }

    /// The directories a root would name (every table the tests use, and the journal).
    fn directories(pager: &Pager) -> Vec<Vec<PageLoc>> {
        (0..=T_JOURNAL)
            .map(|t| pager.directory(t).to_vec())
            .collect()
    }

    /// The first half of a checkpoint as the engine does it: consolidation victims read and
    /// marked, journal pages to clean read, the dirty set frozen.
    fn freeze(pager: &mut Pager) -> (Vec<FrozenPage>, Vec<CleanedWords>) {
        let victims = pager.consolidation_victims();
        for &(t, i) in &victims {
            pager.page(t, i).unwrap();
        }
        let cleaned: Vec<(u64, Vec<Group>)> = pager
            .journal_cleanable()
            .into_iter()
            .map(|(j, loc)| {
                let body = read_page(&**pager.source(), T_JOURNAL, j, loc).unwrap();
                (j, super::super::journal::decode(&body).unwrap().1)
            })
            .collect();
        pager.make_whole(&victims);
        let frozen = pager.freeze();
        let cleaning = pager.cleaning_words(&cleaned, &frozen);
        (frozen, cleaning)
    }

    /// The second half: whole pages and journal pages written, then installed.
    fn finish(
        pager: &mut Pager,
        log: &MemLog,
        frozen: Vec<FrozenPage>,
        cleaning: &[CleanedWords],
        gen: u64,
    ) -> usize {
        let writer = journal_writer(gen, &frozen, cleaning);
        let indexes = pager.allocate_journal_pages(writer.pages().len());
        let whole: Vec<PageLoc> = frozen
            .iter()
            .filter(|p| p.delta.is_none())
            .map(|p| log.append(p.table, p.index, &p.body, gen))
            .collect();
        let journal: Vec<(u64, PageLoc)> = indexes
            .iter()
            .zip(writer.pages())
            .map(|(&j, b)| (j, log.append(T_JOURNAL, j, b, gen)))
            .collect();
        let n = frozen.len();
        pager.install(&frozen, &whole, writer.into_placed(), &journal);
        pager.settle();
        n
    }

    fn checkpoint(pager: &mut Pager, log: &MemLog, gen: &mut u64) -> usize {
        *gen += 1;
        let (frozen, cleaning) = freeze(pager);
        finish(pager, log, frozen, &cleaning, *gen)
    }

    const T0: Table<u64> = Table::new(0);
    /// A table that takes deltas.
    const T1: Table<u64> = Table::new(super::super::tables::CHUNK_TABLE);

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
            let mut durable_dirs = directories(&pager);
            let mut gen = 0u64;
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
                        checkpoint(&mut pager, &log, &mut gen);
                        durable = live.clone();
                        durable_dirs = directories(&pager);
                    }
                    Op::Restart => {
                        pager = Pager::with_directories(log.clone(), durable_dirs.clone(), 2);
                        live = durable.clone();
                    }
                    Op::ChangeWhileFrozen(changes) => {
                        let (frozen, cleaning) = freeze(&mut pager);
                        let image = live.clone();
                        for &(t, i, v) in &changes {
                            table(t).set(&mut pager, i, v).unwrap();
                            live.insert((t as u8, i), v);
                        }
                        // Reads in the window see the changes and everything before the freeze.
                        for (&(t, i), &v) in &live {
                            prop_assert_eq!(table(t == 1).get(&mut pager, i).unwrap(), v);
                        }
                        gen += 1;
                        finish(&mut pager, &log, frozen, &cleaning, gen);
                        // What was written is the image at the freeze, not the later change.
                        let mut reader = Pager::with_directories(log.clone(), directories(&pager), 2);
                        for (&(tt, ii), &vv) in &image {
                            prop_assert_eq!(table(tt == 1).get(&mut reader, ii).unwrap(), vv);
                        }
                        // The changed page is dirty again: the next checkpoint carries it.
                        prop_assert!(pager.stats().dirty >= 1);
                        durable = image;
                        durable_dirs = directories(&pager);
                    }
                }
                let s = pager.stats();
                prop_assert!(s.resident <= 2 + s.dirty + 1, "{s:?}");
                prop_assert!(pager.journal().audit().is_empty(), "{:?}", pager.journal().audit());
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
        assert_eq!(checkpoint(&mut pager, &log, &mut 0), 6);
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
        checkpoint(&mut pager, &log, &mut 0);
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
        assert_eq!(
            decode_directory(
                dirs[1].len() as u64,
                &[body],
                super::super::root::ROOT_VERSION
            ),
            dirs[1]
        );
    }

    /// A table of 41,700 pages has 205 directory pages, named by two top directory pages:
    /// written as checkpoints write them (directory pages first, then the top pages they
    /// changed) and read back as open reads them, the directories are the same.
    #[test]
    fn directories_of_two_levels_round_trip() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 4);
        let pages = 41_700u64;
        let dir: Vec<PageLoc> = (0..pages)
            .map(|i| PageLoc {
                slot: i * 3,
                crc: i as u32 ^ 0x5a5a,
                gen: i / 7,
            })
            .collect();
        pager.set_directory(1, dir.clone());
        pager.rewrite_all_directories();
        for top in [false, true] {
            let changed = pager.take_changed_dirs(top);
            assert_eq!(changed.len(), if top { 2 } else { 205 });
            for (t, p) in changed {
                let holder = directory_table(t).unwrap();
                let loc = log.append(holder, p, &pager.dir_page(t, p), 1);
                pager.written(holder, p, loc);
            }
        }
        assert!(
            pager.take_changed_dirs(false).is_empty() && pager.take_changed_dirs(true).is_empty()
        );
        let root = TableRoot {
            table: 1,
            pages,
            entries: 0,
            dir: pager.directory(TOP_BASE + 1).to_vec(),
        };
        assert_eq!(root.dir.len(), 2);
        let mut reader = Pager::new(log.clone(), 4);
        reader
            .load_directories(&[root], super::super::root::ROOT_VERSION)
            .unwrap();
        assert_eq!(reader.directory(1), &dir[..]);
        assert_eq!(
            reader.directory(DIR_BASE + 1),
            pager.directory(DIR_BASE + 1)
        );
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
        assert_eq!(checkpoint(&mut pager, &log, &mut 0), 1);
    }

    /// Slots written since `from`, by what they hold: (journal pages, other pages).
    fn written_since(log: &MemLog, from: usize, pager: &Pager) -> (usize, usize) {
        let n = log.0.lock().unwrap().len();
        let journal: FxHashSet<u64> = pager.directory(T_JOURNAL).iter().map(|l| l.slot).collect();
        let j = (from..n).filter(|&s| journal.contains(&(s as u64))).count();
        (j, n - from - j)
    }

    #[test]
    fn pages_changed_in_a_few_words_go_to_the_journal_and_read_back() {
        let log = Arc::new(MemLog::default());
        let mut pager = Pager::new(log.clone(), 64);
        let mut gen = 0;
        // 40 pages written whole first (no base yet), in the delta table and the other.
        for page in 0..40u64 {
            T1.set(&mut pager, page * 512, page).unwrap();
            T0.set(&mut pager, page * 512, page).unwrap();
        }
        checkpoint(&mut pager, &log, &mut gen);
        // One word of each changed: one journal page instead of 40 pages for T1.
        let from = log.0.lock().unwrap().len();
        for page in 0..40u64 {
            T1.set(&mut pager, page * 512 + 7, 1000 + page).unwrap();
            T0.set(&mut pager, page * 512 + 7, 1000 + page).unwrap();
        }
        checkpoint(&mut pager, &log, &mut gen);
        assert_eq!(
            written_since(&log, from, &pager),
            (1, 40),
            "T0 whole, T1 as words"
        );
        assert_eq!(pager.journal().words(), 40);
        // The pages read back after eviction (their bases and pending words) and after a
        // restart from the directories (the journal read back).
        pager.set_capacity(1);
        for page in 0..40u64 {
            assert_eq!(T1.get(&mut pager, page * 512 + 7).unwrap(), 1000 + page);
            assert_eq!(T1.get(&mut pager, page * 512).unwrap(), page);
        }
        let mut reopened = Pager::with_directories(log.clone(), directories(&pager), 4);
        assert_eq!(reopened.journal().words(), 40);
        for page in 0..40u64 {
            assert_eq!(T1.get(&mut reopened, page * 512 + 7).unwrap(), 1000 + page);
        }
        // A page changed in many words is written whole, and its pending words go with it.
        pager.set_capacity(64);
        for k in 0..=MAX_DELTA_WORDS as u64 {
            T1.set(&mut pager, 3 * 512 + 100 + k, k + 1).unwrap();
        }
        checkpoint(&mut pager, &log, &mut gen);
        assert_eq!(pager.journal().words(), 39);
        let mut reopened = Pager::with_directories(log.clone(), directories(&pager), 4);
        assert_eq!(T1.get(&mut reopened, 3 * 512 + 7).unwrap(), 1003);
        assert_eq!(T1.get(&mut reopened, 3 * 512 + 100).unwrap(), 1);
        assert_eq!(T1.get(&mut reopened, 3 * 512 + 164).unwrap(), 65);
        assert!(pager.journal().audit().is_empty());
    }

    #[test]
    fn pending_words_past_their_budget_are_consolidated_and_the_journal_cleaned() {
        let log = Arc::new(MemLog::default());
        // 64 pages of cache: a journal budget of 64 KiB.
        let mut pager = Pager::new(log.clone(), 64);
        let mut gen = 0;
        for page in 0..400u64 {
            T1.set(&mut pager, page * 512, 1).unwrap();
            if pager.over_budget() {
                checkpoint(&mut pager, &log, &mut gen);
            }
        }
        checkpoint(&mut pager, &log, &mut gen);
        let mut model = HashMap::new();
        let mut rng = 0x9e3779b97f4a7c15u64;
        for round in 0..300u64 {
            for _ in 0..20 {
                let index = crate::test_data::xorshift64(&mut rng) % (400 * 512);
                T1.set(&mut pager, index, round + 1).unwrap();
                model.insert(index, round + 1);
            }
            checkpoint(&mut pager, &log, &mut gen);
            assert!(pager.journal().audit().is_empty());
            assert!(
                pager.journal().ram_bytes() <= pager.journal_budget() + 64 * 64 * 16,
                "pending words stay near their budget"
            );
        }
        // Cleaning keeps the journal pages within twice what their live words need.
        let per_page = 4080 / 20;
        let live_pages = (pager.journal().words() as usize).div_ceil(per_page);
        assert!(
            pager.journal().journal_pages() <= (2 * live_pages).max(CLEAN_SLACK) + MAX_CLEANED,
            "{} journal pages for {} words",
            pager.journal().journal_pages(),
            pager.journal().words()
        );
        let mut reopened = Pager::with_directories(log.clone(), directories(&pager), 8);
        for (&index, &v) in &model {
            assert_eq!(T1.get(&mut reopened, index).unwrap(), v, "entry {index}");
        }
    }
}
