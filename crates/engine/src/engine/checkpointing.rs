//! Checkpoints: the metadata pages changed since the last one, written beside the pages the
//! last root names, then a new root naming them at one log position, so recovery replays only
//! the log after it (RFC 0001, "Checkpoints: incremental metadata flushes").
//!
//! The dirty set is frozen under the metadata lock (pointer copies, bounded by the cache), the
//! log is synced up to the position (pages name chunks in it), the frozen pages go to free
//! slots outside the lock (pages changed in a few words as words in journal pages, see
//! [`crate::meta::journal`]), then the directory pages that name them, a sync, and the root.
//! The slots the pages moved away from are free once that root is durable. A crash at any
//! point leaves the previous root and every page it names intact.
//!
//! Before the freeze, outside the lock, a checkpoint reads what keeps the journal bounded: the
//! pages it will write whole because their pending words have piled up (consolidation) and
//! the journal pages whose few live words it will write again (cleaning).

use super::*;
use crate::meta::journal;
use crate::meta::page_store::{page_crc, read_page, write_pages, PageBody, PageLoc, PAGE_BYTES};
use crate::meta::pager::{directory_table, journal_writer, FrozenPage, Pager};
use crate::meta::root::{Root, TableRoot};
use crate::meta::tables::TOP_BASE;
use crate::meta::tables::T_HOOKS;
use crate::meta::tables::T_JOURNAL;
use crate::meta::tables::T_SEGMENTS;
use crate::meta::tables::{CHUNK_LIVE, CHUNK_TABLE};
use crate::meta::tables::{T_NODES, T_NODE_META};
use std::collections::BTreeSet;

/// Groups of journal words, or frozen pages, a checkpoint installs per hold of the metadata
/// lock (a few milliseconds each).
const INSTALL_RUN: usize = 1024;

/// Every table a root names, paged or kept whole in RAM.
pub(super) const TABLES: [u8; 7] = [
    CHUNK_TABLE,
    CHUNK_LIVE,
    T_NODES,
    T_NODE_META,
    T_SEGMENTS,
    T_HOOKS,
    T_JOURNAL,
];

impl Engine {
    /// Write a checkpoint of the current state (the log up to it is synced first).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.checkpoint_locked()
    }

    /// The root of the state as it is now (caller holds the lock), its tables still to be
    /// filled in once their directory pages are written.
    pub(super) fn root_image(&self, m: &Meta) -> Root {
        Root {
            version: crate::meta::root::ROOT_VERSION,
            geometry: self.geometry,
            head: self.lock_log().head.at(),
            counters: m.counters,
            generation: m.checkpoint.generation() + 1,
            anchored: m.state.anchored(),
            live_bytes: m.state.live_bytes(),
            hooks: m.state.hook_shape(),
            tables: Vec::new(),
            volumes: m.state.volume_maps().map(|(k, v)| (k, *v)).collect(),
            releasing: m.state.releasing().to_vec(),
        }
    }

    /// Write `pages` to free slots as generation `gen`; returns where each went. On failure
    /// the slots are free again and nothing names them.
    fn write_to_slots(&self, pages: &[(u8, u64, &PageBody)], gen: u64) -> Result<Vec<PageLoc>> {
        let slots: Vec<u64> = {
            let mut s = self.slots.lock().unwrap();
            pages.iter().map(|_| s.allocate()).collect()
        };
        let mut batch: Vec<(u64, &PageBody)> = slots
            .iter()
            .zip(pages)
            .map(|(&slot, &(_, _, body))| (slot, body))
            .collect();
        if let Err(e) = write_pages(&*self.meta_area, &mut batch) {
            self.slots.lock().unwrap().cancel(slots);
            return Err(if out_of_space(&e) {
                EngineError::NoSpace
            } else {
                self.poison(format!("writing metadata pages failed: {e}"))
            });
        }
        self.metadata_written
            .fetch_add((pages.len() * PAGE_BYTES) as u64, Ordering::Relaxed);
        Ok(slots
            .iter()
            .zip(pages)
            .map(|(&slot, &(table, index, body))| PageLoc {
                slot,
                crc: page_crc(table, index, body),
                gen,
            })
            .collect())
    }

    /// Write directory pages (as [`dir_pages`] made them) to free slots and name them in the
    /// directories above; the places they moved from retire.
    fn write_directory_pages(&self, dirs: &[(u8, u64, Box<PageBody>)], gen: u64) -> Result<()> {
        let pages: Vec<(u8, u64, &PageBody)> =
            dirs.iter().map(|(t, p, b)| (*t, *p, &**b)).collect();
        let locs = self.write_to_slots(&pages, gen)?;
        let mut m = self.lock_meta();
        let mut slots = self.slots.lock().unwrap();
        for ((t, p, _), loc) in dirs.iter().zip(&locs) {
            let old = m.state.pager_mut().written(*t, *p, *loc);
            if !old.is_none() {
                slots.retire(old.slot);
            }
        }
        Ok(())
    }

    /// Name the pages a checkpoint of generation `generation` wrote: the journal pages at
    /// `journal_locs`, the pages of `frozen` written whole at `whole_locs` (in their order), the
    /// words `placed` in the journal pages; then release the pages that went as deltas. In
    /// runs of [`INSTALL_RUN`], each its own hold of the lock (see `Pager::install`): one hold
    /// for 32 Ki pages written whole took 26 ms. Returns the places pages moved away from.
    fn install_in_runs(
        &self,
        frozen: &[FrozenPage],
        whole_locs: &[PageLoc],
        placed: Vec<(usize, Option<u64>, journal::Group)>,
        journal_locs: &[(u64, PageLoc)],
        generation: u64,
    ) -> Vec<PageLoc> {
        let mut retired = {
            let mut m = self.lock_meta();
            // From here the state in RAM names pages of this generation, whether or not its
            // root is stored: a retry after a failure below must write under the next one, or
            // a base and a word written by the two attempts would carry the same generation
            // and open could not order them.
            m.checkpoint.installed(generation);
            m.state.pager_mut().install_pages(&[], &[], journal_locs)
        };
        let mut left = whole_locs;
        for run in frozen.chunks(INSTALL_RUN) {
            let whole = run.iter().filter(|p| p.delta.is_none()).count();
            let (locs, rest) = left.split_at(whole);
            left = rest;
            let mut m = self.lock_meta();
            retired.extend(m.state.pager_mut().install_pages(run, locs, &[]));
        }
        for run in placed.chunks(INSTALL_RUN) {
            self.lock_meta()
                .state
                .pager_mut()
                .install_words(run, journal_locs);
        }
        for run in frozen.chunks(INSTALL_RUN) {
            self.lock_meta().state.pager_mut().release_deltas(run);
        }
        retired
    }

    /// Freeze, write and name the changed metadata; caller holds `maintenance`.
    pub(super) fn checkpoint_locked(&self) -> Result<()> {
        let started = Instant::now();
        // Journal upkeep, read ahead of the freeze so the lock is not held for it.
        let (victims, to_clean, source) = {
            let m = self.lock_meta();
            let pager = m.state.pager();
            (
                pager.consolidation_victims(),
                pager.journal_cleanable(),
                pager.source().clone(),
            )
        };
        if !victims.is_empty() {
            self.fault_in(victims.clone())?;
        }
        // A journal page that cannot be read is left alone here (`check` and the next open
        // report it); its words stay pending.
        let cleaned: Vec<(u64, Vec<journal::Group>)> = to_clean
            .into_iter()
            .filter_map(|(j, loc)| {
                let body = read_page(&*source, T_JOURNAL, j, loc).ok()?;
                Some((j, journal::decode(&body).ok()?.1))
            })
            .collect();
        let (frozen, cleaning, mut root, captured) = {
            let mut m = self.lock_meta();
            let (frozen, cleaning) = m.state.freeze(&victims, &cleaned);
            let root = self.root_image(&m);
            let captured = m.checkpoint.capture(self.lock_log().head.appended());
            (frozen, cleaning, root, captured)
        };
        let froze = started.elapsed();
        let thaw = |frozen: Vec<FrozenPage>, journal: &[u64]| {
            self.lock_meta().state.thaw(frozen, journal);
        };
        let writer = journal_writer(root.generation, &frozen, &cleaning);
        let journal_indexes = self
            .lock_meta()
            .state
            .pager_mut()
            .allocate_journal_pages(writer.pages().len());
        // The pages name chunks whose records must be durable before any root names them.
        if let Err(e) = self.flush() {
            thaw(frozen, &journal_indexes);
            return Err(e);
        }
        let pages: Vec<(u8, u64, &PageBody)> = frozen
            .iter()
            .filter(|p| p.delta.is_none())
            .map(|p| (p.table, p.index, &*p.body))
            .chain(
                journal_indexes
                    .iter()
                    .zip(writer.pages())
                    .map(|(&j, body)| (T_JOURNAL, j, &**body)),
            )
            .collect();
        let mut locs = match self.write_to_slots(&pages, root.generation) {
            Ok(locs) => locs,
            Err(e) => {
                thaw(frozen, &journal_indexes);
                return Err(e);
            }
        };
        let journal_locs: Vec<(u64, PageLoc)> = journal_indexes
            .iter()
            .copied()
            .zip(locs.split_off(locs.len() - journal_indexes.len()))
            .collect();
        let written = pages.len();
        drop(pages);
        // The directories move to the new places, the words written become pending; the
        // directory pages that changed follow.
        let mut retired = self.install_in_runs(
            &frozen,
            &locs,
            writer.into_placed(),
            &journal_locs,
            root.generation,
        );
        let (dirs, changed) = {
            let mut m = self.lock_meta();
            let mut slots = self.slots.lock().unwrap();
            retired.extend(m.state.pager_mut().drop_dead_journal_pages(&journal_locs));
            for old in retired {
                slots.retire(old.slot);
            }
            m.state.pager_mut().settle();
            // The frozen buffers return to the pool here, under the lock (those the cache
            // still holds stay with it).
            drop(frozen);
            let changed = m.state.pager_mut().take_changed_dirs(false);
            let dirs = dir_pages(m.state.pager(), &changed);
            (dirs, changed)
        };
        // The directory pages, then the top directory pages that name them.
        if let Err(e) = self.write_directory_pages(&dirs, root.generation) {
            self.lock_meta()
                .state
                .pager_mut()
                .keep_changed_dirs(changed);
            return Err(e);
        }
        let (tops, changed_tops) = {
            let mut m = self.lock_meta();
            let changed = m.state.pager_mut().take_changed_dirs(true);
            (dir_pages(m.state.pager(), &changed), changed)
        };
        if let Err(e) = self.write_directory_pages(&tops, root.generation) {
            self.lock_meta()
                .state
                .pager_mut()
                .keep_changed_dirs(changed_tops);
            return Err(e);
        }
        {
            let m = self.lock_meta();
            let state = &m.state;
            root.tables = TABLES
                .iter()
                .map(|&t| TableRoot {
                    table: t,
                    pages: state.pager().directory(t).len() as u64,
                    entries: state.table_entries(t),
                    dir: state.pager().directory(TOP_BASE + t).to_vec(),
                })
                .collect();
        }
        // A failed sync of the metadata file may have dropped pages the directories now
        // name, and a later root would name them: like a failed log sync, nothing can be
        // promised any more.
        if let Err(e) = self.meta_area.meta_sync() {
            return Err(self.poison(format!("fsync of the metadata file failed: {e}")));
        }
        if let Err(e) = self.root_store.store_root(&root.encode()) {
            // The pages stay where the directories now say; the next root names them. The
            // previous root and the slots it names are untouched.
            let mut m = self.lock_meta();
            m.state.pager_mut().keep_changed_dirs(changed);
            m.state.pager_mut().keep_changed_dirs(changed_tops);
            drop(m);
            return Err(if out_of_space(&e) {
                EngineError::NoSpace
            } else {
                self.poison(format!("writing the metadata root failed: {e}"))
            });
        }
        self.slots.lock().unwrap().root_durable();
        let mut m = self.lock_meta();
        self.meta_area
            .reserve_meta(meta_reserve(&m.state, self.tuning().metadata_cache));
        m.checkpoint
            .durable(root.head.seq, captured, root.generation);
        drop(m);
        tracing::debug!(
            pages = written,
            directory_pages = dirs.len() + tops.len(),
            lock_held_us = froze.as_micros() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }
}

/// Bytes the next checkpoint may add to the metadata area, which a nearly full file system
/// must keep free: the dirty pages it can hold, which cannot outgrow the cache's dirty share
/// nor, on a small array, much more than the metadata there is.
pub(super) fn meta_reserve(state: &MetaState, cache: u64) -> u64 {
    let pages: u64 = TABLES
        .iter()
        .map(|&t| state.pager().directory(t).len() as u64)
        .sum();
    let dirty_limit = cache;
    dirty_limit.min(2 * pages * PAGE_BYTES as u64 + (4 << 20))
}

/// The directory pages `changed` names ((table described, page of its directory)), encoded,
/// each as the page of the table that holds it.
fn dir_pages(pager: &Pager, changed: &BTreeSet<(u8, u64)>) -> Vec<(u8, u64, Box<PageBody>)> {
    changed
        .iter()
        .filter_map(|&(t, p)| Some((directory_table(t)?, p, pager.dir_page(t, p))))
        .collect()
}
