//! The metadata tables' numbers: the vocabulary every part of `meta` shares (the journal, the
//! root file and page errors name tables), kept apart so that naming a table needs none of
//! the modules that implement them.

/// Table number of the chunk table in the pager.
pub const CHUNK_TABLE: u8 = 1;
/// Table number of the live counts of the chunk table's pages.
pub const CHUNK_LIVE: u8 = 2;
/// Table of node pages.
pub const T_NODES: u8 = 3;
/// Table of node metadata (kept whole in RAM).
pub const T_NODE_META: u8 = 4;
/// Table of the segment table (kept whole in RAM).
pub const T_SEGMENTS: u8 = 5;
/// Table of hook bucket pages.
pub const T_HOOKS: u8 = 6;
/// Table of the journal pages.
pub const T_JOURNAL: u8 = 7;

/// Table numbers at or above this hold the directory pages of table `t - DIR_BASE`.
pub const DIR_BASE: u8 = 128;

/// Table numbers from this to [`DIR_BASE`] hold the top directory pages of table
/// `t - TOP_BASE`: pages naming its directory pages (format 4; the root names these).
pub const TOP_BASE: u8 = 64;

/// What a table number holds, for messages.
pub fn table_name(table: u8) -> &'static str {
    match table {
        CHUNK_TABLE => "chunk table",
        CHUNK_LIVE => "chunk table live counts",
        T_NODES => "map nodes",
        T_NODE_META => "map node table",
        T_SEGMENTS => "segment table",
        T_HOOKS => "dedup hooks",
        T_JOURNAL => "delta journal",
        t if t >= DIR_BASE => "directory",
        _ => "unknown table",
    }
}
