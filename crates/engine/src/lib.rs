//! sliver's engine: thin volumes on a log-structured, deduplicating, compressing store.
//!
//! - [`format`]: the log record and checkpoint byte formats.
//! - [`state`]: metadata as a deterministic state machine (one `apply` for live and replay).
//! - [`engine`]: the log, write/read paths, group commit, recovery, checkpoints, GC.
//! - [`backend`]: the narrow storage interface (file, and a crash-simulating one for tests).
//! - [`volume`]: an engine volume behind the `sliver_volume::Volume` trait.

pub mod backend;
pub mod checkpoint;
pub mod engine;
pub mod format;
pub mod state;
pub mod volume;

pub use backend::{Backend, FileBackend, MemBackend};
pub use engine::{
    Compression, Engine, EngineConfig, EngineError, EngineSpace, GcPriority, Recovery, Tuning,
    VolumeUsage,
};
pub use volume::EngineVolume;
