//! The delta journal (RFC 0001, "Deltas: sparse changes without whole pages", format 4): a
//! page that a checkpoint finds changed in a few 8-byte words is not written whole; the words
//! are appended to journal pages instead, and the page's last whole version (its *base*) stays
//! where it is. Random overwrites change one word of a map leaf and one of a chunk-table page
//! per 4 KiB written; written whole, each costs a 4 KiB page per checkpoint once the range
//! being overwritten outgrows the cache (`docs/benchmarks.md`, "random overwrites": up to 159 %
//! of host bytes). As deltas each costs about 10 bytes, and a page is written whole only when
//! its pending words have accumulated (consolidation), which amortises the 4 KiB over many
//! changes.
//!
//! What holds a page's current content, at any moment:
//! - if it is cached: the cache (always the whole truth for a cached page);
//! - else its base (the slot its directory entry names) with its *pending* words applied:
//!   every word the journal holds for it that is younger than the base. The pending words live
//!   in RAM here (bounded: a share of the metadata cache) and on disk in the journal pages the
//!   root names, so a page evicted after a delta checkpoint is read back exactly, and open
//!   rebuilds the pending words from the journal pages.
//!
//! Generations order bases and deltas: each directory entry records the checkpoint that wrote
//! the base ([`PageLoc::gen`]), each journal page the checkpoint that wrote it. A pending word
//! applies only on top of an older base; a page written whole drops its pending words in the
//! same checkpoint, so a root never names a base together with words older than it that it
//! would need.
//!
//! Journal pages are table [`T_JOURNAL`] of the pager, indexed densely, named by a directory
//! like any table. Each knows how many of its entries are still pending (*live*); one with
//! none is dropped from the directory by the checkpoint in which the last died, and its slot
//! is free once that root is durable. Pages with few live entries among many dead ones are
//! *cleaned*: their live entries are written again in the next checkpoint's journal pages,
//! which keeps the journal's size (read whole at open) within twice its live entries.
//!
//! Journal page layout (little-endian):
//!
//! ```text
//! gen u64 | used u16 (bytes of groups) | zero [6]
//! groups: table u8 | page index u64 | n u8 | n x ( word u16 | value u64 )
//! ```

use super::page_store::{PageBody, PageLoc, PAGE_BYTES};
use super::tables::CHUNK_TABLE;
use super::tables::T_HOOKS;
use super::tables::T_NODES;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// 8-byte words of a page.
pub const WORDS: usize = PAGE_BYTES / 8;

/// A page changed in more words than this since the last checkpoint is written whole.
pub const MAX_DELTA_WORDS: usize = 64;

/// A page with more pending words than this is written whole (reading it back stays cheap,
/// and one page's entries fit a journal page several times over).
pub const MAX_PENDING_WORDS: usize = 128;

const HEADER: usize = 16;
const GROUP_HEADER: usize = 10;
const ENTRY: usize = 10;

/// Whether pages of `table` may be written as deltas: the paged tables. Tables kept whole in
/// RAM, directories and the journal itself are always written whole.
pub fn delta_table(table: u8) -> bool {
    matches!(table, CHUNK_TABLE | T_NODES | T_HOOKS)
}

/// A set of the 8-byte words of a page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WordSet([u64; WORDS / 64]);

impl WordSet {
    pub fn insert(&mut self, word: usize) {
        self.0[word / 64] |= 1 << (word % 64);
    }

    pub fn contains(&self, word: usize) -> bool {
        self.0[word / 64] & (1 << (word % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    pub fn union(&mut self, other: &WordSet) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..WORDS).filter(|&w| self.contains(w))
    }
}

/// Word `word` of `body`.
pub fn word(body: &PageBody, word: usize) -> u64 {
    u64::from_le_bytes(body[word * 8..word * 8 + 8].try_into().unwrap())
}

fn set_word(body: &mut PageBody, word: usize, value: u64) {
    body[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
}

/// A pending word: its value, and the journal page that holds it.
#[derive(Debug, Clone, Copy)]
struct Pending {
    word: u16,
    jpage: u32,
    value: u64,
}

/// RAM of one page's entry in the pending map besides its words (map slot, allocation),
/// and of one word: measured by the `journal_ram` example.
const PAGE_OVERHEAD: u64 = 112;
/// RAM of one pending word.
const WORD_BYTES: u64 = 18;

/// The pending words of every page, and the accounting of the journal pages holding them.
#[derive(Default)]
pub struct Journal {
    /// Each page's words, sorted, exactly sized (RAM is what bounds the journal).
    pending: FxHashMap<(u8, u64), Box<[Pending]>>,
    /// How many pages have each count of pending words (index: the count, the last counting
    /// all with more), for consolidation.
    by_count: Vec<u64>,
    /// Live entries of each journal page (index: the page's index in [`T_JOURNAL`]).
    live: Vec<u32>,
    /// Journal page indexes in use: named by the directory, or being written.
    in_use: FxHashSet<u64>,
    /// Indexes below `live.len()` free to be taken again.
    free: BTreeSet<u64>,
    /// Journal pages in use whose live count fell to zero: the next directory update drops
    /// them.
    dead: Vec<u64>,
    words: u64,
}

/// A group of a journal page: the words of one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub table: u8,
    pub index: u64,
    pub words: Vec<(u16, u64)>,
}

/// Why a journal page could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal page: {0}")]
pub struct JournalError(pub String);

/// Check a journal page and visit its groups in order: `group(table, page index, words)`,
/// the words as their encoded bytes (10 each: word u16, value u64), each word checked to lie
/// in the page. Returns the page's generation. No allocation: open visits every journal page.
pub fn parse(
    body: &PageBody,
    mut group: impl FnMut(u8, u64, &[u8]) -> Result<(), JournalError>,
) -> Result<u64, JournalError> {
    let bad = |why: &str| JournalError(why.to_string());
    let gen = u64::from_le_bytes(body[..8].try_into().unwrap());
    let used = u16::from_le_bytes(body[8..10].try_into().unwrap()) as usize;
    if body[10..HEADER].iter().any(|&b| b != 0) {
        return Err(bad("reserved header bytes are not zero"));
    }
    if used > PAGE_BYTES - HEADER {
        return Err(bad("group bytes beyond the page"));
    }
    let mut at = HEADER;
    let end = HEADER + used;
    while at < end {
        if end - at < GROUP_HEADER {
            return Err(bad("a truncated group header"));
        }
        let table = body[at];
        let index = u64::from_le_bytes(body[at + 1..at + 9].try_into().unwrap());
        let n = body[at + 9] as usize;
        at += GROUP_HEADER;
        if !delta_table(table) {
            return Err(bad("a group of a table that takes no deltas"));
        }
        if n == 0 || end - at < n * ENTRY {
            return Err(bad("a group with no words or beyond the used bytes"));
        }
        let entries = &body[at..at + n * ENTRY];
        if entries
            .chunks_exact(ENTRY)
            .any(|e| u16::from_le_bytes([e[0], e[1]]) as usize >= WORDS)
        {
            return Err(bad("a word beyond the page"));
        }
        group(table, index, entries)?;
        at += n * ENTRY;
    }
    if body[end..].iter().any(|&b| b != 0) {
        return Err(bad("bytes after the groups"));
    }
    Ok(gen)
}

/// The words of a group as [`parse`] hands them over.
fn entries(bytes: &[u8]) -> impl Iterator<Item = (u16, u64)> + '_ {
    bytes.chunks_exact(ENTRY).map(|e| {
        (
            u16::from_le_bytes([e[0], e[1]]),
            u64::from_le_bytes(e[2..10].try_into().unwrap()),
        )
    })
}

/// Decode a journal page: its generation and groups.
pub fn decode(body: &PageBody) -> Result<(u64, Vec<Group>), JournalError> {
    let mut groups = Vec::new();
    let gen = parse(body, |table, index, words| {
        groups.push(Group {
            table,
            index,
            words: entries(words).collect(),
        });
        Ok(())
    })?;
    Ok((gen, groups))
}

/// Journal pages being filled by one checkpoint (generation `gen`), and where each group
/// went (the ordinal of its page in [`JournalWriter::pages`]).
pub struct JournalWriter {
    gen: u64,
    pages: Vec<Box<PageBody>>,
    used: usize,
    placed: Vec<(usize, Option<u64>, Group)>,
}

impl JournalWriter {
    pub fn new(gen: u64) -> Self {
        JournalWriter {
            gen,
            pages: Vec::new(),
            used: 0,
            placed: Vec::new(),
        }
    }

    /// Append the words of page `index` of `table` (split across journal pages if they do
    /// not fit the current one); `from`: the journal page they are cleaned from, if they are.
    pub fn push(&mut self, table: u8, index: u64, mut words: &[(u16, u64)], from: Option<u64>) {
        while !words.is_empty() {
            let room = (PAGE_BYTES - HEADER).saturating_sub(self.used);
            if self.pages.is_empty() || room < GROUP_HEADER + ENTRY {
                let mut body = Box::new([0u8; PAGE_BYTES]);
                body[..8].copy_from_slice(&self.gen.to_le_bytes());
                self.pages.push(body);
                self.used = 0;
                continue;
            }
            let n = words
                .len()
                .min((room - GROUP_HEADER) / ENTRY)
                .min(u8::MAX as usize);
            let body = self.pages.last_mut().expect("a page");
            let mut at = HEADER + self.used;
            body[at] = table;
            body[at + 1..at + 9].copy_from_slice(&index.to_le_bytes());
            body[at + 9] = n as u8;
            at += GROUP_HEADER;
            for &(w, v) in &words[..n] {
                body[at..at + 2].copy_from_slice(&w.to_le_bytes());
                body[at + 2..at + 10].copy_from_slice(&v.to_le_bytes());
                at += ENTRY;
            }
            self.used += GROUP_HEADER + n * ENTRY;
            body[8..10].copy_from_slice(&(self.used as u16).to_le_bytes());
            self.placed.push((
                self.pages.len() - 1,
                from,
                Group {
                    table,
                    index,
                    words: words[..n].to_vec(),
                },
            ));
            words = &words[n..];
        }
    }

    pub fn pages(&self) -> &[Box<PageBody>] {
        &self.pages
    }

    /// The groups written, each with the ordinal of its journal page and the journal page
    /// it was cleaned from, in the order written.
    pub fn into_placed(self) -> Vec<(usize, Option<u64>, Group)> {
        self.placed
    }
}

impl Journal {
    pub fn new() -> Self {
        Journal {
            by_count: vec![0; MAX_PENDING_WORDS + 1],
            ..Default::default()
        }
    }

    /// Words pending in all.
    pub fn words(&self) -> u64 {
        self.words
    }

    /// Journal pages in use.
    pub fn journal_pages(&self) -> usize {
        self.in_use.len()
    }

    /// RAM the pending words take.
    pub fn ram_bytes(&self) -> u64 {
        self.pending.len() as u64 * PAGE_OVERHEAD
            + self.words * WORD_BYTES
            + self.live.len() as u64 * 4
    }

    /// Words pending for page `index` of `table`.
    pub fn count(&self, table: u8, index: u64) -> usize {
        self.pending.get(&(table, index)).map_or(0, |p| p.len())
    }

    /// Whether page `index` of `table` has words pending.
    pub fn has(&self, table: u8, index: u64) -> bool {
        self.pending.contains_key(&(table, index))
    }

    /// The words pending for page `index` of `table`, for a reader that reads its base
    /// outside the engine's lock.
    pub fn words_of(&self, table: u8, index: u64) -> Vec<(u16, u64)> {
        self.pending
            .get(&(table, index))
            .map_or_else(Vec::new, |p| p.iter().map(|e| (e.word, e.value)).collect())
    }

    /// Apply the pending words of page `index` of `table` to its base.
    pub fn apply(&self, table: u8, index: u64, body: &mut PageBody) {
        if let Some(p) = self.pending.get(&(table, index)) {
            for e in p {
                set_word(body, e.word as usize, e.value);
            }
        }
    }

    fn rebucket(&mut self, from: usize, to: usize) {
        let b = |n: usize| n.min(MAX_PENDING_WORDS);
        if from != 0 {
            self.by_count[b(from)] -= 1;
        }
        if to != 0 {
            self.by_count[b(to)] += 1;
        }
    }

    fn unlive(&mut self, jpage: u32) {
        let l = &mut self.live[jpage as usize];
        *l -= 1;
        if *l == 0 {
            self.dead.push(jpage as u64);
        }
    }

    /// Words of page `index` of `table` now held by journal page `jpage`: each replaces the
    /// word's older pending value.
    pub fn add(&mut self, table: u8, index: u64, words: &[(u16, u64)], jpage: u64) {
        let key = (table, index);
        let mut new: Vec<Pending> = words
            .iter()
            .map(|&(word, value)| Pending {
                word,
                jpage: jpage as u32,
                value,
            })
            .collect();
        // Sorted and distinct (as checkpoints and cleaning write them; a damaged journal read
        // at open may not be): the last of equal words wins.
        if !new.windows(2).all(|w| w[0].word < w[1].word) {
            new.reverse();
            new.sort_by_key(|e| e.word);
            new.dedup_by_key(|e| e.word);
        }
        self.live[jpage as usize] += new.len() as u32;
        let old = self.pending.remove(&key).unwrap_or_default();
        // One allocation: the old words merged with the new, which replace equal ones.
        let mut merged = Vec::with_capacity(old.len() + new.len());
        let mut superseded = Vec::new();
        let (mut a, mut b) = (old.iter().peekable(), new.into_iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.word < y.word => merged.push(*a.next().unwrap()),
                (Some(x), Some(y)) if x.word == y.word => {
                    superseded.push(x.jpage);
                    a.next();
                    merged.push(b.next().unwrap());
                }
                (_, Some(_)) => merged.push(b.next().unwrap()),
                (Some(_), None) => merged.push(*a.next().unwrap()),
                (None, None) => break,
            }
        }
        for j in superseded {
            self.unlive(j);
        }
        self.words += (merged.len() - old.len()) as u64;
        self.rebucket(old.len(), merged.len());
        self.pending.insert(key, merged.into_boxed_slice());
    }

    /// Words of page `index` of `table` that journal page `from` held, written again in
    /// journal page `to` (cleaning). Words changed meanwhile stay where they are.
    pub fn moved(&mut self, table: u8, index: u64, words: &[(u16, u64)], from: u64, to: u64) {
        let Some(list) = self.pending.get_mut(&(table, index)) else {
            return;
        };
        let mut moved = 0;
        for &(word, _) in words {
            if let Ok(k) = list.binary_search_by_key(&word, |e| e.word) {
                if list[k].jpage as u64 == from {
                    list[k].jpage = to as u32;
                    moved += 1;
                }
            }
        }
        self.live[to as usize] += moved;
        for _ in 0..moved {
            self.unlive(from as u32);
        }
    }

    /// Page `index` of `table` was written whole: its pending words are part of its base.
    pub fn drop_page(&mut self, table: u8, index: u64) {
        if let Some(list) = self.pending.remove(&(table, index)) {
            self.rebucket(list.len(), 0);
            self.words -= list.len() as u64;
            for e in list.iter() {
                self.unlive(e.jpage);
            }
        }
    }

    /// `n` journal page indexes for a checkpoint's new pages, in increasing order (the order
    /// their groups were written in, which open replays).
    pub fn allocate(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let j = match self.free.pop_first() {
                Some(j) => j,
                None => {
                    self.live.push(0);
                    self.live.len() as u64 - 1
                }
            };
            self.in_use.insert(j);
            out.push(j);
        }
        out.sort_unstable();
        out
    }

    /// Indexes taken by [`Journal::allocate`] for pages that were not written after all.
    pub fn cancel(&mut self, indexes: &[u64]) {
        for &j in indexes {
            debug_assert_eq!(self.live[j as usize], 0);
            self.in_use.remove(&j);
            self.free.insert(j);
        }
    }

    /// Journal pages just written whose groups all came to nothing (cleaned words that had
    /// died meanwhile): dead like any page with no live word.
    pub fn settle_new(&mut self, indexes: &[u64]) {
        for &j in indexes {
            if self.live[j as usize] == 0 && !self.dead.contains(&j) {
                self.dead.push(j);
            }
        }
    }

    /// Journal pages with no live entry left: the caller drops them from the directory (their
    /// indexes are free from now on).
    pub fn take_dead(&mut self) -> Vec<u64> {
        let dead = std::mem::take(&mut self.dead);
        for &j in &dead {
            debug_assert_eq!(self.live[j as usize], 0);
            self.in_use.remove(&j);
            self.free.insert(j);
        }
        dead
    }

    /// Pages to write whole so that the pending words fall to `target` bytes of RAM: those
    /// with the most words first, at most `max` of them. One pass over the pending pages,
    /// which their budget bounds.
    pub fn victims(&self, target: u64, max: usize) -> Vec<(u8, u64)> {
        let excess = self.ram_bytes().saturating_sub(target);
        if excess == 0 {
            return Vec::new();
        }
        let freed = |n: usize| n as u64 * WORD_BYTES + PAGE_OVERHEAD;
        // The smallest count whose pages and those with more free enough (or are `max`).
        let mut least = 1;
        let (mut sum, mut pages) = (0u64, 0u64);
        for n in (1..=MAX_PENDING_WORDS).rev() {
            sum += self.by_count[n] * freed(n);
            pages += self.by_count[n];
            if sum >= excess || pages >= max as u64 {
                least = n;
                break;
            }
        }
        // Pages with at least that many words, in whatever order the map holds them, until they
        // free enough: no sort, and the pass stops early (it runs under the engine's lock).
        let mut left = excess;
        let mut out = Vec::new();
        for (&key, list) in &self.pending {
            if left == 0 || out.len() >= max {
                break;
            }
            if list.len() >= least {
                out.push(key);
                left = left.saturating_sub(freed(list.len()));
            }
        }
        out
    }

    /// Journal pages worth cleaning: when the pages in use could hold more than twice the live
    /// entries (and more than `slack` pages are in use), up to `max` of those with the fewest
    /// live entries.
    pub fn cleanable(&self, slack: usize, max: usize) -> Vec<u64> {
        let per_page = ((PAGE_BYTES - HEADER) / (GROUP_HEADER + ENTRY)) as u64;
        let pages = self.in_use.len() as u64;
        if pages <= slack as u64 || pages * per_page <= 2 * self.words {
            return Vec::new();
        }
        let mut candidates: Vec<(u32, u64)> = self
            .in_use
            .iter()
            .map(|&j| (self.live[j as usize], j))
            .filter(|&(l, _)| l > 0)
            .collect();
        candidates.sort_unstable();
        candidates.truncate(max);
        candidates.into_iter().map(|(_, j)| j).collect()
    }

    /// The words of page `index` of `table` that journal page `jpage` holds live (cleaning
    /// writes them again).
    pub fn live_in(&self, table: u8, index: u64, jpage: u64) -> Vec<(u16, u64)> {
        self.pending
            .get(&(table, index))
            .map_or_else(Vec::new, |p| {
                p.iter()
                    .filter(|e| e.jpage as u64 == jpage)
                    .map(|e| (e.word, e.value))
                    .collect()
            })
    }

    /// Rebuild the pending words from the journal pages a root names (open), given in the
    /// order they were written: by generation, then index (their directory entries give the
    /// generation without reading them). Each item is the page's index, directory entry and
    /// body; `base` gives the directory entry of a page of a delta table (`None` beyond the
    /// table). A word applies if it is younger than its page's base; later pages override
    /// earlier ones.
    ///
    /// The words are gathered per page as they come and settled once at the end (sorted, the
    /// newest of each word kept): a merge per group would allocate for each of millions.
    pub fn load<B: std::borrow::Borrow<PageBody>>(
        pages: impl IntoIterator<Item = (u64, PageLoc, B)>,
        base: impl Fn(u8, u64) -> Option<PageLoc>,
    ) -> Result<Journal, JournalError> {
        let mut j = Journal::new();
        let mut gathered: FxHashMap<(u8, u64), Vec<Pending>> = FxHashMap::default();
        let mut last = (0u64, 0u64);
        for (index, loc, body) in pages {
            if (loc.gen, index) < last {
                return Err(JournalError(
                    "journal pages not in the order written".into(),
                ));
            }
            last = (loc.gen, index);
            let body: &PageBody = body.borrow();
            let gen = u64::from_le_bytes(body[..8].try_into().unwrap());
            if gen != loc.gen {
                return Err(JournalError(format!(
                    "journal page {index} says generation {gen}, its directory {}",
                    loc.gen
                )));
            }
            if index >= u32::MAX as u64 {
                return Err(JournalError(format!(
                    "journal page index {index} too large"
                )));
            }
            while j.live.len() as u64 <= index {
                j.free.insert(j.live.len() as u64);
                j.live.push(0);
            }
            j.free.remove(&index);
            j.in_use.insert(index);
            parse(body, |table, page, words| {
                let Some(b) = base(table, page) else {
                    return Err(JournalError(format!(
                        "journal page {index} names page {page} of table {table}, beyond the table"
                    )));
                };
                if b.is_none() {
                    return Err(JournalError(format!(
                        "journal page {index} names page {page} of table {table}, which was never written"
                    )));
                }
                if gen > b.gen {
                    let list = gathered.entry((table, page)).or_default();
                    list.extend(entries(words).map(|(word, value)| Pending {
                        word,
                        jpage: index as u32,
                        value,
                    }));
                }
                Ok(())
            })?;
        }
        j.pending.reserve(gathered.len());
        for (key, mut list) in gathered {
            // Newest first among equal words (a stable sort keeps that), then one of each.
            list.reverse();
            list.sort_by_key(|e| e.word);
            list.dedup_by_key(|e| e.word);
            for e in &list {
                j.live[e.jpage as usize] += 1;
            }
            j.words += list.len() as u64;
            j.rebucket(0, list.len());
            j.pending.insert(key, list.into_boxed_slice());
        }
        // Pages none of whose entries survived: dead, dropped by the next checkpoint.
        let dead: Vec<u64> = j
            .in_use
            .iter()
            .copied()
            .filter(|&p| j.live[p as usize] == 0)
            .collect();
        j.dead = dead;
        j.dead.sort_unstable();
        Ok(j)
    }

    /// Check the accounting against the pending words (`sliver check`, tests): every live
    /// count equals the words that name its page, every word names a page in use.
    pub fn audit(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut live = vec![0u32; self.live.len()];
        let mut counts = vec![0u64; MAX_PENDING_WORDS + 1];
        let mut words = 0u64;
        for (&(t, i), list) in &self.pending {
            words += list.len() as u64;
            if list.is_empty() {
                problems.push(format!("journal: page {i} of table {t} has no words"));
            }
            counts[list.len().min(MAX_PENDING_WORDS)] += 1;
            for w in list.windows(2) {
                if w[0].word >= w[1].word {
                    problems.push(format!("journal: page {i} of table {t}: words unsorted"));
                }
            }
            for e in list {
                if !self.in_use.contains(&(e.jpage as u64)) {
                    problems.push(format!(
                        "journal: page {i} of table {t} has a word in journal page {}, not in use",
                        e.jpage
                    ));
                } else {
                    live[e.jpage as usize] += 1;
                }
            }
        }
        if counts != self.by_count {
            problems.push("journal: pages by count do not match the pending words".into());
        }
        if words != self.words {
            problems.push(format!(
                "journal: {} words counted, {words} pending",
                self.words
            ));
        }
        for &j in &self.in_use {
            if self.live[j as usize] == 0 && !self.dead.contains(&j) {
                problems.push(format!("journal page {j}: no live entry, yet not dropped"));
            }
        }
        for (p, (&a, &b)) in self.live.iter().zip(&live).enumerate() {
            if a != b {
                problems.push(format!(
                    "journal page {p}: {a} live entries counted, {b} found"
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_journal_page_round_trips_and_groups_split_across_pages() {
        let mut w = JournalWriter::new(9);
        let big: Vec<(u16, u64)> = (0..500u16).map(|k| (k, k as u64 * 3)).collect();
        w.push(CHUNK_TABLE, 5, &[(3, 7), (4, 8)], None);
        w.push(T_NODES, 1 << 40, &big, Some(3));
        assert_eq!(w.pages().len(), 2);
        let mut decoded = Vec::new();
        for p in w.pages() {
            let (gen, groups) = decode(p).unwrap();
            assert_eq!(gen, 9);
            decoded.extend(groups);
        }
        let placed: Vec<Group> = w.into_placed().into_iter().map(|(_, _, g)| g).collect();
        assert_eq!(decoded, placed);
        assert_eq!(decoded[0].words, vec![(3, 7), (4, 8)]);
        let all: Vec<(u16, u64)> = decoded[1..]
            .iter()
            .flat_map(|g| g.words.iter().copied())
            .collect();
        assert_eq!(all, big);
    }

    #[test]
    fn damaged_journal_pages_are_refused() {
        let mut w = JournalWriter::new(1);
        w.push(T_HOOKS, 2, &[(1, 1)], None);
        let good = w.pages()[0].clone();
        assert!(decode(&good).is_ok());
        let mut bad = good.clone();
        bad[16] = 2; // a resident table's page
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[26..28].copy_from_slice(&600u16.to_le_bytes());
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[8..10].copy_from_slice(&4090u16.to_le_bytes());
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[25] = 0; // a group of no words
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[4000] = 1;
        assert!(decode(&bad).is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A checkpoint writes these pages' words as deltas (page, words).
        Delta(Vec<(u64, Vec<(u16, u64)>)>),
        /// A checkpoint writes this page whole.
        Whole(u64),
        /// Clean the journal page with the fewest live entries.
        Clean,
    }

    fn op() -> impl Strategy<Value = Op> {
        let words = proptest::collection::vec((0u16..8, any::<u64>()), 1..4);
        prop_oneof![
            4 => proptest::collection::vec((0u64..6, words), 1..4).prop_map(Op::Delta),
            1 => (0u64..6).prop_map(Op::Whole),
            1 => Just(Op::Clean),
        ]
    }

    proptest! {
        /// The journal against a model of each page's words: after every checkpoint, the
        /// pending words and the journal pages still named (loaded back as open would) give
        /// every page's content, live counts stay exact, dead pages are dropped.
        #[test]
        fn the_journal_matches_a_model(ops in proptest::collection::vec(op(), 1..60)) {
            let mut j = Journal::new();
            // Named journal pages: index -> (gen, body).
            let mut named: FxHashMap<u64, (u64, Box<PageBody>)> = FxHashMap::default();
            // Each page's base generation and the words it holds in the model.
            let mut base_gen = [1u64; 6];
            let mut model: FxHashMap<u64, FxHashMap<u16, u64>> = FxHashMap::default();
            let mut base: FxHashMap<u64, FxHashMap<u16, u64>> = FxHashMap::default();
            let mut gen = 1u64;
            for op in ops {
                gen += 1;
                let mut w = JournalWriter::new(gen);
                let mut whole = None;
                match &op {
                    Op::Delta(pages) => {
                        for (p, words) in pages {
                            w.push(CHUNK_TABLE, *p, words, None);
                        }
                    }
                    Op::Whole(p) => whole = Some(*p),
                    Op::Clean => {
                        if let Some(&victim) = j.cleanable(0, 1).first() {
                            let (_, groups) = decode(&named[&victim].1).unwrap();
                            for g in groups {
                                let live = j.live_in(g.table, g.index, victim);
                                if !live.is_empty() {
                                    w.push(g.table, g.index, &live, Some(victim));
                                }
                            }
                        }
                    }
                }
                let indexes = j.allocate(w.pages().len());
                for (k, &i) in indexes.iter().enumerate() {
                    named.insert(i, (gen, w.pages()[k].clone()));
                }
                for (ordinal, from, g) in w.into_placed() {
                    match from {
                        Some(from) => j.moved(g.table, g.index, &g.words, from, indexes[ordinal]),
                        None => j.add(g.table, g.index, &g.words, indexes[ordinal]),
                    }
                }
                if let Op::Delta(pages) = &op {
                    for (p, words) in pages {
                        model.entry(*p).or_default().extend(words.iter().copied());
                    }
                }
                if let Some(p) = whole {
                    j.drop_page(CHUNK_TABLE, p);
                    base.insert(p, model.get(&p).cloned().unwrap_or_default());
                    base_gen[p as usize] = gen;
                }
                for d in j.take_dead() {
                    named.remove(&d);
                }
                prop_assert!(j.audit().is_empty(), "{:?}", j.audit());
                // Open: rebuild from the named pages, in the order written.
                let mut pages: Vec<(u64, PageLoc, &PageBody)> = named
                    .iter()
                    .map(|(&i, (g, body))| (i, PageLoc { slot: i, crc: 0, gen: *g }, &**body))
                    .collect();
                pages.sort_by_key(|p| (p.1.gen, p.0));
                let loaded = Journal::load(pages, |_, i| {
                    Some(PageLoc { slot: 0, crc: 0, gen: base_gen[i as usize] })
                })
                .unwrap();
                prop_assert!(loaded.audit().is_empty());
                for p in 0..6u64 {
                    for jj in [&j, &loaded] {
                        let mut body = [0u8; PAGE_BYTES];
                        for (&w, &v) in base.get(&p).into_iter().flatten() {
                            set_word(&mut body, w as usize, v);
                        }
                        jj.apply(CHUNK_TABLE, p, &mut body);
                        for (&w, &v) in model.get(&p).into_iter().flatten() {
                            prop_assert_eq!(word(&body, w as usize), v);
                        }
                    }
                }
                prop_assert_eq!(loaded.words(), j.words());
            }
        }
    }

    #[test]
    fn victims_are_the_pages_with_most_words() {
        let mut j = Journal::new();
        let idx = j.allocate(1)[0];
        j.add(CHUNK_TABLE, 1, &[(0, 1)], idx);
        j.add(CHUNK_TABLE, 2, &[(0, 1), (1, 1), (2, 1)], idx);
        j.add(T_NODES, 3, &[(0, 1), (1, 1)], idx);
        let mut two = j.victims(0, 2);
        two.sort_unstable();
        assert_eq!(two, vec![(CHUNK_TABLE, 2), (T_NODES, 3)]);
        assert_eq!(j.victims(j.ram_bytes() - 1, 10), vec![(CHUNK_TABLE, 2)]);
        assert!(j.victims(j.ram_bytes(), 10).is_empty());
        j.drop_page(CHUNK_TABLE, 2);
        j.drop_page(CHUNK_TABLE, 1);
        j.drop_page(T_NODES, 3);
        assert_eq!(j.take_dead(), vec![idx]);
        assert_eq!(j.words(), 0);
        assert!(j.audit().is_empty());
    }
}
