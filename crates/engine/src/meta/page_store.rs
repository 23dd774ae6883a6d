//! The metadata area: 4 KiB slots, each holding one page of one table, written by shadow
//! paging. A checkpoint writes every page it changed into a free slot, never over a slot the
//! last durable root still names, then replaces the root; only then do the slots of the pages'
//! previous versions become free. A crash at any moment therefore leaves the old root and
//! every page it names intact.
//!
//! A slot holds the page body alone, so pages stay 4 KiB-aligned. What proves a slot holds
//! the page meant is the checksum kept where the page is named (a directory entry or the
//! root): CRC-32C over the table number, the page index and the body. A stale slot (a page
//! since moved, a slot since reused) or a damaged one fails it and is reported with its
//! table, index and slot; it is never read as metadata.

use std::collections::BTreeSet;
use std::fmt;
use std::io;

/// Bytes of a metadata page (and of a slot).
pub const PAGE_BYTES: usize = 4096;

pub type PageBody = [u8; PAGE_BYTES];

/// Where a page is in the metadata area, the checksum that identifies its content, and the
/// checkpoint that wrote it there (its *generation*: changes the delta journal holds for the
/// page apply on top of it only if they are younger, see [`super::journal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLoc {
    pub slot: u64,
    pub crc: u32,
    pub gen: u64,
}

/// Bytes of an encoded [`PageLoc`] (slot u64, crc u32, generation u64).
pub const PAGE_LOC_BYTES: usize = 20;

/// Bytes of a [`PageLoc`] in format 3 (slot u64, crc u32: no generation).
pub const PAGE_LOC_BYTES_V3: usize = 12;

impl PageLoc {
    /// No page: never written (reads as zeros).
    pub const NONE: PageLoc = PageLoc {
        slot: u64::MAX,
        crc: 0,
        gen: 0,
    };

    pub fn is_none(&self) -> bool {
        self.slot == u64::MAX
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.slot.to_le_bytes());
        out[8..12].copy_from_slice(&self.crc.to_le_bytes());
        out[12..20].copy_from_slice(&self.gen.to_le_bytes());
    }

    /// Decode an entry of `bytes` bytes: [`PAGE_LOC_BYTES`], or [`PAGE_LOC_BYTES_V3`] for a
    /// format 3 directory, whose pages all count as generation 0.
    pub fn decode(b: &[u8]) -> PageLoc {
        let gen = match b.len() {
            PAGE_LOC_BYTES_V3 => 0,
            _ => u64::from_le_bytes(b[12..20].try_into().unwrap()),
        };
        PageLoc {
            slot: u64::from_le_bytes(b[..8].try_into().unwrap()),
            crc: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            gen,
        }
    }
}

/// The checksum of page `index` of `table` with this body.
pub fn page_crc(table: u8, index: u64, body: &PageBody) -> u32 {
    let mut id = [0u8; 9];
    id[0] = table;
    id[1..].copy_from_slice(&index.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&id), body)
}

/// Reads slots of the metadata area (the engine's backend; a buffer in tests).
pub trait PageSource: Send + Sync {
    fn read_slot(&self, slot: u64, buf: &mut PageBody) -> io::Result<()>;

    /// Read the adjacent slots from `first` into `bufs` (one read where the source can).
    fn read_slots(&self, first: u64, bufs: &mut [PageBody]) -> io::Result<()> {
        for (k, buf) in bufs.iter_mut().enumerate() {
            self.read_slot(first + k as u64, buf)?;
        }
        Ok(())
    }
}

/// The pages of a [`crate::MetaArea`].
pub struct MetaPages(pub std::sync::Arc<dyn crate::MetaArea>);

/// A metadata area with nothing written in it: every read fails. For pagers whose pages never
/// leave memory (unit tests, the log fuzzer), so nothing is ever read back.
#[cfg(any(test, feature = "testing"))]
pub(crate) struct NothingWritten;

#[cfg(any(test, feature = "testing"))]
impl PageSource for NothingWritten {
    fn read_slot(&self, _: u64, _: &mut PageBody) -> io::Result<()> {
        Err(io::Error::other("nothing written"))
    }
}

impl PageSource for MetaPages {
    fn read_slot(&self, slot: u64, buf: &mut PageBody) -> io::Result<()> {
        let offset = slot
            .checked_mul(PAGE_BYTES as u64)
            .ok_or_else(|| io::Error::other("slot beyond any file"))?;
        self.0.meta_read(buf, offset)
    }

    fn read_slots(&self, first: u64, bufs: &mut [PageBody]) -> io::Result<()> {
        let offset = first
            .checked_mul(PAGE_BYTES as u64)
            .ok_or_else(|| io::Error::other("slot beyond any file"))?;
        self.0.meta_read(bufs.as_flattened_mut(), offset)
    }
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
            "metadata page {} of table {} ({}), slot {} of the metadata file (byte {}): {}",
            self.index,
            self.table,
            crate::meta::tables::table_name(self.table),
            self.loc.slot,
            self.loc.slot.saturating_mul(PAGE_BYTES as u64),
            self.reason
        )
    }
}

impl std::error::Error for PageError {}

/// Read page `index` of `table` from `loc` and check it is that page.
pub fn read_page(
    source: &dyn PageSource,
    table: u8,
    index: u64,
    loc: PageLoc,
) -> Result<Box<PageBody>, PageError> {
    let fail = |reason: String| PageError {
        table,
        index,
        loc,
        reason,
    };
    let mut body = Box::new([0u8; PAGE_BYTES]);
    source
        .read_slot(loc.slot, &mut body)
        .map_err(|e| fail(format!("read failed: {e}")))?;
    check_page(table, index, loc, &body)?;
    Ok(body)
}

/// Whether `body`, read from `loc`, is page `index` of `table`.
fn check_page(table: u8, index: u64, loc: PageLoc, body: &PageBody) -> Result<(), PageError> {
    let crc = page_crc(table, index, body);
    if crc != loc.crc {
        return Err(PageError {
            table,
            index,
            loc,
            reason: format!(
                "checksum {crc:#010x} where {:#010x} is expected (damaged, or not this page)",
                loc.crc
            ),
        });
    }
    Ok(())
}

/// Read pages `items` (index, place) of `table`, each checked as [`read_page`] checks it, in
/// the order given; runs of adjacent slots are read in one call each (at most 256 pages).
pub fn read_pages(
    source: &dyn PageSource,
    table: u8,
    items: &[(u64, PageLoc)],
) -> Result<Vec<Box<PageBody>>, PageError> {
    let mut out: Vec<Box<PageBody>> = Vec::with_capacity(items.len());
    let mut run: Vec<PageBody> = Vec::new();
    let mut k = 0;
    while k < items.len() {
        let first = items[k].1.slot;
        let mut n = 1;
        while k + n < items.len() && n < 256 && items[k + n].1.slot == first.wrapping_add(n as u64)
        {
            n += 1;
        }
        run.clear();
        run.resize(n, [0u8; PAGE_BYTES]);
        if let Err(e) = source.read_slots(first, &mut run) {
            let (index, loc) = items[k];
            return Err(PageError {
                table,
                index,
                loc,
                reason: format!("read failed: {e}"),
            });
        }
        for (body, &(index, loc)) in run.iter().zip(&items[k..k + n]) {
            check_page(table, index, loc, body)?;
            out.push(Box::new(*body));
        }
        k += n;
    }
    Ok(out)
}

/// Which slots are free. Slots in use are those the current directories name; a slot a page
/// moved away from is *retiring* until the root that no longer names it is durable.
#[derive(Debug, Default)]
pub struct Slots {
    free: BTreeSet<u64>,
    /// One past the highest slot ever used: the area's size in slots.
    end: u64,
    retiring: Vec<u64>,
}

impl Slots {
    /// The free slots of an area whose slots in use are `used`.
    pub fn from_used(used: impl IntoIterator<Item = u64>) -> Slots {
        let mut used: Vec<u64> = used.into_iter().collect();
        used.sort_unstable();
        used.dedup();
        let end = used.last().map_or(0, |&s| s + 1);
        let mut free = BTreeSet::new();
        let mut next = 0;
        for s in used {
            free.extend(next..s);
            next = s + 1;
        }
        Slots {
            free,
            end,
            retiring: Vec::new(),
        }
    }

    /// A free slot: the lowest, so the area stays compact and writes cluster.
    pub fn allocate(&mut self) -> u64 {
        match self.free.pop_first() {
            Some(s) => s,
            None => {
                self.end += 1;
                self.end - 1
            }
        }
    }

    /// Slots allocated but not used after all (a write failed): free again.
    pub fn cancel(&mut self, slots: impl IntoIterator<Item = u64>) {
        for s in slots {
            debug_assert!(s < self.end);
            self.free.insert(s);
        }
    }

    /// A page moved away from `slot`: free once the next root is durable.
    pub fn retire(&mut self, slot: u64) {
        self.retiring.push(slot);
    }

    /// The root that no longer names the retiring slots is durable: they are free.
    pub fn root_durable(&mut self) {
        for s in std::mem::take(&mut self.retiring) {
            debug_assert!(s < self.end);
            self.free.insert(s);
        }
    }

    /// Size of the area in slots.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Slots free now.
    pub fn free_count(&self) -> u64 {
        self.free.len() as u64
    }
}

/// Write `pages` (slot, body) to the metadata area, runs of adjacent slots in one write each.
pub fn write_pages(meta: &dyn crate::MetaArea, pages: &mut [(u64, &PageBody)]) -> io::Result<()> {
    pages.sort_by_key(|p| p.0);
    let mut i = 0;
    let mut buf = Vec::new();
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j].0 == pages[j - 1].0 + 1 && j - i < 256 {
            j += 1;
        }
        buf.clear();
        for (_, body) in &pages[i..j] {
            buf.extend_from_slice(&body[..]);
        }
        meta.meta_write(&buf, pages[i].0 * PAGE_BYTES as u64)?;
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_and_retired_ones_only_after_the_root() {
        let mut s = Slots::from_used([5, 1, 3]);
        assert_eq!(s.end(), 6);
        assert_eq!((s.allocate(), s.allocate(), s.allocate()), (0, 2, 4));
        assert_eq!(s.allocate(), 6);
        s.retire(1);
        assert_eq!(s.allocate(), 7, "a retiring slot is not free yet");
        s.root_durable();
        assert_eq!(s.allocate(), 1);
        s.cancel([7]);
        assert_eq!(s.allocate(), 7);
        let empty = Slots::from_used([]);
        assert_eq!((empty.end(), empty.free_count()), (0, 0));
    }

    #[test]
    fn a_page_is_checked_against_its_table_index_and_content() {
        struct One(PageBody);
        impl PageSource for One {
            fn read_slot(&self, _: u64, buf: &mut PageBody) -> io::Result<()> {
                buf.copy_from_slice(&self.0);
                Ok(())
            }
        }
        let mut body = [0u8; PAGE_BYTES];
        body[100] = 7;
        let loc = PageLoc {
            slot: 3,
            crc: page_crc(2, 9, &body),
            gen: 77,
        };
        let source = One(body);
        assert_eq!(read_page(&source, 2, 9, loc).unwrap()[100], 7);
        let e = read_page(&source, 2, 10, loc).unwrap_err();
        assert_eq!((e.table, e.index, e.loc), (2, 10, loc));
        assert!(e.to_string().contains("slot 3"), "{e}");
        assert!(
            read_page(&source, 1, 9, loc).is_err(),
            "another table's page"
        );
        let mut damaged = body;
        damaged[4000] ^= 1;
        assert!(read_page(&One(damaged), 2, 9, loc).is_err());
        let mut b = [0u8; PAGE_LOC_BYTES];
        loc.encode(&mut b);
        assert_eq!(PageLoc::decode(&b), loc);
        // A format 3 entry has no generation: 0.
        assert_eq!(
            PageLoc::decode(&b[..PAGE_LOC_BYTES_V3]),
            PageLoc { gen: 0, ..loc }
        );
        assert!(PageLoc::NONE.is_none() && !loc.is_none());
    }
}
