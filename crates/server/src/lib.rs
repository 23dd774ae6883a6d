//! The sliver server: the only crate that knows about sockets and tokio.
//!
//! It listens on the iSCSI portals, drives one sans-I/O [`sliver_iscsi::Connection`] per TCP
//! connection, keeps the session registry (TSIH allocation, session reinstatement), resolves
//! LUNs through the [`array::Array`] and runs SCSI commands off the tokio workers
//! ([`executor`]), except READs served from cache ([`poll`] for the socket polling).

mod allowed_hosts;
pub mod api;
pub mod array;
mod connection;
pub mod console;
pub mod events;
pub mod executor;
pub mod history;
mod metrics;
pub mod poll;
mod target;
pub mod throttle;
pub mod tls;

pub use array::{Array, ArrayError};
/// A volume's write cache setting, as the API and the array records name it.
pub use sliver_api_types::WriteCache;
pub use target::{Server, ServerOptions, SessionSummary, Timeouts, MAX_CONNECTIONS, MAX_SESSIONS};
