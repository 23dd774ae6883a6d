//! Format 2, kept to read arrays it wrote: the whole-metadata checkpoint and the in-RAM state
//! machine its log is replayed through. The migration (`crate::engine::migrate`) turns what
//! they load into format 3.

pub mod checkpoint;
pub mod cow_vec;
pub mod state;
