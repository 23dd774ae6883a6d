//! A minimal, blocking iSCSI initiator (RFC 7143) for sliver's tools, tests and load generators.
//!
//! It is not meant for production hosts (those use open-iscsi, ESXi or libiscsi): one connection
//! per session, no digests, ErrorRecoveryLevel 0, no task reassignment. What it does do properly:
//!
//! - login without authentication or with one-way CHAP (MD5), negotiating ImmediateData,
//!   InitialR2T, MaxRecvDataSegmentLength, MaxBurstLength and FirstBurstLength;
//! - immediate data, unsolicited Data-Out, R2T-solicited Data-Out and Data-In gathering, all
//!   within the negotiated limits;
//! - several outstanding commands per session: [`Session::submit`] returns a [`Tag`] and
//!   [`Session::wait`] / [`Session::wait_any`] collect completions in any order, within the
//!   target's CmdSN window;
//! - answers to the target's NOP-In pings, NOP-Out pings of its own, logout.
//!
//! The socket is non-blocking underneath: while a large Data-Out is being written, what the
//! target sends meanwhile is read and buffered, so initiator and target can never both block on
//! full socket buffers.
//!
//! ```no_run
//! use sliver_initiator::{Session, SessionOptions};
//! let mut s = Session::connect("iscsi://127.0.0.1:3260/iqn.2026-11.dev.sliver:array/0",
//!                              SessionOptions::default())?;
//! let cap = s.read_capacity16()?;
//! s.unmap(&[(0, 2048)])?;
//! s.logout()?;
//! # Ok::<(), sliver_initiator::Error>(())
//! ```

pub mod cdb;
pub mod sense;
mod session;
pub mod url;

pub use cdb::{BlockLimits, Capacity, LbaStatus, OutgoingCommand, Provisioning};
pub use sense::{Sense, SenseKey};
pub use session::{Completion, Negotiated, RawConnection, Residual, Session, SessionOptions, Tag};
pub use url::IscsiUrl;

/// Why a task failed at the transport level (it has no SCSI status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskFailure {
    /// The iSCSI Response field was not "command completed at target".
    ServiceResponse(u8),
    /// The target rejected the command PDU with this reason code.
    Rejected(u8),
}

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Url(#[from] url::UrlError),
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("login to {target} failed: {message}")]
    Login { target: String, message: String },
    #[error("I/O error on the iSCSI connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the target closed the connection")]
    Closed,
    #[error("no answer from the target within {0:?}")]
    Timeout(std::time::Duration),
    #[error("iSCSI protocol error: {0}")]
    Protocol(String),
    #[error("task {tag:#x} failed: {failure:?}")]
    Task { tag: u32, failure: TaskFailure },
    #[error("{command} failed with {}{}", sense::status::name(*status),
            sense.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Check {
        command: String,
        status: u8,
        sense: Option<Sense>,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl Error {
    /// The sense data of a failed command, if any.
    pub fn sense(&self) -> Option<&Sense> {
        match self {
            Error::Check { sense, .. } => sense.as_ref(),
            _ => None,
        }
    }
}
