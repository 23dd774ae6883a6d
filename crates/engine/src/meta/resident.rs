//! Tables kept whole in RAM and persisted page by page: the segment table, the node table of
//! the map trees and the live counts of the chunk table's pages. Each is small next to the data
//! it describes (24 bytes per 4 MiB segment, 24 per 2 MiB of mapped volume, 2 per 128 chunks),
//! is needed on every write, and is loaded at open in one pass. A change marks its page dirty;
//! a checkpoint encodes the dirty pages at the moment it freezes the metadata.

use super::page_buf::{PageBuf, PagePool};
use super::page_store::{read_page, PageError, PAGE_BYTES};
use super::pager::{Entry, FrozenPage, Pager};
use std::collections::BTreeSet;

pub struct ResidentTable<T> {
    table: u8,
    items: Vec<T>,
    dirty: BTreeSet<u64>,
}

impl<T: Entry + Default + PartialEq> ResidentTable<T> {
    const PER_PAGE: usize = PAGE_BYTES / T::SIZE;

    pub fn new(table: u8) -> Self {
        ResidentTable {
            table,
            items: Vec::new(),
            dirty: BTreeSet::new(),
        }
    }

    /// The first `len` entries of `table`, read from the pages its directory names.
    pub fn load(table: u8, pager: &Pager, len: u64) -> Result<Self, PageError> {
        let mut items = Vec::with_capacity(len as usize);
        for (page, &loc) in pager.directory(table).iter().enumerate() {
            if items.len() as u64 >= len {
                break;
            }
            let body = if loc.is_none() {
                Box::new([0; PAGE_BYTES])
            } else {
                read_page(&**pager.source(), table, page as u64, loc)?
            };
            for k in 0..Self::PER_PAGE {
                if items.len() as u64 >= len {
                    break;
                }
                items.push(T::read(&body[k * T::SIZE..(k + 1) * T::SIZE]));
            }
        }
        items.resize(len as usize, T::default());
        Ok(ResidentTable {
            table,
            items,
            dirty: BTreeSet::new(),
        })
    }

    pub fn len(&self) -> u64 {
        self.items.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn get(&self, index: u64) -> T {
        self.items.get(index as usize).copied().unwrap_or_default()
    }

    pub fn as_slice(&self) -> &[T] {
        &self.items
    }

    /// Set entry `index`, growing the table as needed.
    pub fn set(&mut self, index: u64, value: T) {
        let i = index as usize;
        if i >= self.items.len() {
            if value == T::default() {
                return;
            }
            self.items.resize(i + 1, T::default());
        }
        if self.items[i] != value {
            self.items[i] = value;
            self.dirty.insert(index / Self::PER_PAGE as u64);
        }
    }

    /// Change entry `index` in place.
    pub fn update(&mut self, index: u64, f: impl FnOnce(&mut T)) {
        let mut v = self.get(index);
        f(&mut v);
        self.set(index, v);
    }

    pub fn push(&mut self, value: T) -> u64 {
        let index = self.len();
        self.items.push(value);
        self.dirty.insert(index / Self::PER_PAGE as u64);
        index
    }

    /// Mark every page dirty (a table written whole for the first time: the migration).
    pub fn touch_all(&mut self) {
        let pages = self.items.len().div_ceil(Self::PER_PAGE) as u64;
        self.dirty.extend(0..pages);
    }

    /// The dirty pages, encoded into buffers of `pool`, for a checkpoint; they are clean
    /// afterwards.
    pub fn freeze(&mut self, pool: &PagePool) -> Vec<FrozenPage> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|page| {
                let mut buf = pool.zeroed();
                let body = PageBuf::get_mut(&mut buf).expect("a buffer just taken is ours");
                let from = page as usize * Self::PER_PAGE;
                let to = self.items.len().min(from + Self::PER_PAGE);
                for (k, item) in self.items[from.min(to)..to].iter().enumerate() {
                    item.write(&mut body[k * T::SIZE..(k + 1) * T::SIZE]);
                }
                FrozenPage {
                    table: self.table,
                    index: page,
                    body: buf,
                    delta: None,
                }
            })
            .collect()
    }

    /// A checkpoint failed before writing the frozen pages: dirty again.
    pub fn thaw(&mut self, pages: &[FrozenPage]) {
        self.dirty.extend(
            pages
                .iter()
                .filter(|p| p.table == self.table)
                .map(|p| p.index),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::page_store::{page_crc, PageBody, PageLoc, PageSource};
    use std::sync::Arc;

    struct Slots(std::sync::Mutex<Vec<PageBody>>);
    impl PageSource for Slots {
        fn read_slot(&self, slot: u64, buf: &mut PageBody) -> std::io::Result<()> {
            buf.copy_from_slice(&self.0.lock().unwrap()[slot as usize]);
            Ok(())
        }
    }

    #[test]
    fn a_resident_table_round_trips_through_its_dirty_pages() {
        let slots = Arc::new(Slots(Default::default()));
        let mut pager = Pager::new(slots.clone(), 4);
        let mut t: ResidentTable<u64> = ResidentTable::new(9);
        for i in 0..1500u64 {
            t.push(i * 3);
        }
        t.set(2000, 7);
        let write = |pager: &mut Pager, frozen: Vec<FrozenPage>| {
            for p in frozen {
                let mut s = slots.0.lock().unwrap();
                s.push(*p.body);
                let loc = PageLoc {
                    slot: s.len() as u64 - 1,
                    crc: page_crc(p.table, p.index, &p.body),
                    gen: 1,
                };
                pager.written(p.table, p.index, loc);
            }
        };
        write(&mut pager, t.freeze(&PagePool::new()));
        assert!(
            t.freeze(&PagePool::new()).is_empty(),
            "clean after a checkpoint"
        );
        t.set(5, 1);
        let frozen = t.freeze(&PagePool::new());
        assert_eq!(frozen.len(), 1, "one page changed");
        write(&mut pager, frozen);
        let back: ResidentTable<u64> = ResidentTable::load(9, &pager, t.len()).unwrap();
        assert_eq!(back.as_slice(), t.as_slice());
        assert_eq!(back.get(5), 1);
        assert_eq!(back.get(1999), 0);
        assert_eq!(back.get(2000), 7);
        assert_eq!(back.get(5000), 0, "beyond the end reads as the default");
    }
}
