//! Metadata at scale (RFC 0001, docs/rfcs/0001-metadata-at-scale.md): every table of the
//! engine's metadata lives in 4 KiB pages in the metadata area, behind one bounded cache.
//!
//! In the order a write meets them:
//! - [`hooks`]: the sampled dedup index and the locality cache (advice, confirmed against the
//!   chunk table);
//! - [`map_tree`]: each volume's map, a copy-on-write radix tree of nodes with reference
//!   counts, so snapshots, clones and copies of whole leaves share nodes;
//! - [`chunk_table`]: chunk id -> fingerprint, place in the log, length, reference count;
//! - [`resident`]: the small tables kept whole in RAM (segments, node metadata, live counts);
//! - [`segment_table`]: the segment table and the collector's index of sealed segments;
//! - [`pager`]: the cache and the directories that find every page;
//! - [`journal`]: pages changed in a few words, written as deltas on top of their last whole
//!   version;
//! - [`page_buf`]: the cache's page buffers, in blocks of their own;
//! - [`page_store`]: slots of the metadata area, checksums, shadow paging;
//! - [`layout`]: what the pager and the root file both know of the directories' layout;
//! - [`root`]: the root file naming a consistent set of pages at one log position;
//! - [`tables`]: the tables' numbers, which all of these share.

pub mod chunk_table;
pub mod hooks;
pub mod journal;
pub mod layout;
pub mod map_tree;
pub mod page_buf;
pub mod page_store;
pub mod pager;
pub mod resident;
pub mod root;
pub mod segment_table;
pub mod tables;

pub use page_store::PageError;

/// Why a record could not be applied: it contradicts the state (replay of damaged metadata),
/// or a metadata page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("inconsistent log record: {0}")]
    Inconsistent(String),
    #[error("{0}")]
    Page(#[from] PageError),
}
