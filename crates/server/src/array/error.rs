//! What the array answers when it refuses a change or fails: [`ArrayError`], with the off-site
//! copy's causes in [`ReplicationError`].

use std::path::PathBuf;

use sliver_api_types::InvalidIscsiName;
use sliver_replica::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("volume '{0}' does not exist")]
    NoSuchVolume(String),
    #[error("host '{0}' does not exist")]
    NoSuchHost(String),
    #[error("a volume named '{0}' already exists")]
    VolumeExists(String),
    #[error("a host named '{0}' already exists")]
    HostExists(String),
    #[error("invalid name {0:?}: use 1-63 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit")]
    InvalidName(String),
    #[error("invalid size {0}: it must be a non-zero multiple of the block size (4096 bytes for engine volumes)")]
    InvalidSize(u64),
    #[error("LUN {lun} is already used for host '{host}'")]
    LunInUse { host: String, lun: u64 },
    #[error("volume '{volume}' is already connected to host '{host}'")]
    AlreadyConnected { volume: String, host: String },
    #[error("volume '{volume}' is connected to host(s) {hosts}: disconnect it first")]
    VolumeConnected { volume: String, hosts: String },
    #[error("host '{host}' still has volume(s) {volumes} connected: disconnect them first")]
    HostInUse { host: String, volumes: String },
    #[error("volume '{volume}' is not connected to host '{host}'")]
    NotConnected { volume: String, host: String },
    #[error("volume '{volume}' cannot shrink from {from} to {to} bytes: shrinking discards data")]
    Shrink { volume: String, from: u64, to: u64 },
    #[error("array configuration {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("volume error: {0}")]
    Volume(#[from] sliver_volume::VolumeError),
    #[error("engine: {0}")]
    Engine(String),
    #[error("{0}")]
    NotSupported(String),
    #[error("{0}")]
    InvalidSetting(String),
    #[error("'{0}' is not an iSCSI name (iqn., eui. or naa. form, at most 223 characters)")]
    InvalidIscsiName(String),
    #[error("{0}")]
    InvalidChap(&'static str),
    #[error("the array in {0} is in use by another sliver process")]
    Locked(PathBuf),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Replication(#[from] ReplicationError),
    #[error("{0} already holds an array: restore into a new directory")]
    RestoreIntoArray(PathBuf),
    #[error("{0}")]
    Restore(#[from] sliver_replica::restore::RestoreError),
}

pub type Result<T> = std::result::Result<T, ArrayError>;

impl From<InvalidIscsiName> for ArrayError {
    fn from(e: InvalidIscsiName) -> Self {
        ArrayError::InvalidIscsiName(e.0)
    }
}

/// An engine failure as the array reports it.
pub(super) fn engine_error(e: sliver_engine::EngineError) -> ArrayError {
    ArrayError::Engine(e.to_string())
}

/// Why the off-site copy refused a request or failed it. The sentence is the one users see.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("replication is not configured")]
    NotConfigured,
    #[error("replication has stopped")]
    Stopped,
    /// A name a user may not give a point (`sliver_replica::catalog::check_name` says why).
    #[error("{0}")]
    InvalidPointName(String),
    #[error("a restore point named {0:?} exists")]
    PointExists(String),
    /// The engine's flush before a point failed, so the point would miss acknowledged writes.
    #[error("flushing the engine before the point: {0}")]
    Flush(sliver_engine::EngineError),
    /// The shipper refused the point (it is not running).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}
