//! The plain facts of the metadata's on-disk layout that the pager and the root file share:
//! the root's versions, the size of a page's place in a directory, a table's place in the
//! root. Kept apart so that the pager, which reads directories, and the root file, which
//! names them, each depend on this and not on each other.

use super::page_store::{PageLoc, PAGE_BYTES, PAGE_LOC_BYTES, PAGE_LOC_BYTES_V3};

/// The engine's on-disk format with a root (format 2 had a whole checkpoint instead): 4 adds
/// the delta journal and page generations.
pub const ROOT_VERSION: u32 = 4;
/// The first format with a root, still opened (and rewritten as 4 by its first checkpoint).
pub const ROOT_VERSION_V3: u32 = 3;

/// Bytes of a page's place in the directories of a root of `version`.
pub fn loc_bytes(version: u32) -> usize {
    if version == ROOT_VERSION_V3 {
        PAGE_LOC_BYTES_V3
    } else {
        PAGE_LOC_BYTES
    }
}

/// One table's place in the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRoot {
    pub table: u8,
    /// Pages in the table's directory.
    pub pages: u64,
    /// Entries, for tables kept whole in RAM (0 for the others).
    pub entries: u64,
    /// Where the directory's pages are.
    pub dir: Vec<PageLoc>,
}

/// Directory entries per directory page in a root of `version`.
pub fn dir_per_page(version: u32) -> u64 {
    (PAGE_BYTES / loc_bytes(version)) as u64
}
