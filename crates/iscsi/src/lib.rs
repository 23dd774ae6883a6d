//! Sans-I/O iSCSI target protocol core (RFC 7143).
//!
//! Bytes read from a socket go into [`Connection::receive`]; what the target has to do comes out
//! of [`Connection::next_event`] and what it has to send comes out of
//! [`Connection::take_output`]. The core never blocks, never touches a socket or a clock, and
//! bounds the memory an initiator can make it hold.
//!
//! Modules: [`pdu`] (header codec and framing), [`text`] (key=value codec and negotiation),
//! [`chap`] (CHAP MD5), `login` (login phase), `connection` (full feature phase), [`output`]
//! (what waits for the socket, READ data by reference).

pub mod chap;
mod connection;
mod login;
pub mod output;
pub mod pdu;
pub mod text;

#[cfg(test)]
mod scenario_tests;

use std::sync::Arc;

pub use chap::ChapCredentials;
pub use connection::{Connection, MAX_IMMEDIATE_TASKS, MAX_PENDING_TMFS, MAX_SOLICITED_BYTES};
pub use text::{NegotiatedParams, SessionType};

/// What the target declares and accepts during negotiation.
#[derive(Debug, Clone)]
pub struct TargetSettings {
    /// Our IQN.
    pub target_name: String,
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag declared at login.
    pub portal_group_tag: u16,
    /// The MaxRecvDataSegmentLength we declare.
    pub max_recv_data_segment_length: u32,
    /// Upper bound we accept for MaxBurstLength.
    pub max_burst_length: u32,
    /// Upper bound we accept for FirstBurstLength.
    pub first_burst_length: u32,
    /// Upper bound for MaxOutstandingR2T (the result is the minimum of both offers).
    pub max_outstanding_r2t: u32,
    /// Our InitialR2T preference (negotiated with OR).
    pub initial_r2t: bool,
    /// Our ImmediateData preference (negotiated with AND).
    pub immediate_data: bool,
    /// CmdSN window: MaxCmdSN = ExpCmdSN + queue_depth - 1.
    pub queue_depth: u32,
    /// Largest ExpectedDataTransferLength accepted.
    pub max_transfer_length: u32,
    /// The target's own name and secret for mutual CHAP.
    pub mutual_chap: Option<ChapCredentials>,
}

impl Default for TargetSettings {
    fn default() -> Self {
        Self {
            target_name: "iqn.2026-11.dev.sliver:array".to_owned(),
            target_alias: None,
            portal_group_tag: 1,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 16_776_192,
            first_burst_length: 262_144,
            max_outstanding_r2t: 16,
            initial_r2t: false,
            immediate_data: true,
            queue_depth: 128,
            max_transfer_length: 32 << 20,
            mutual_chap: None,
        }
    }
}

/// One target returned by SendTargets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    /// "address:port,portal-group-tag", e.g. "127.0.0.1:3260,1".
    pub addresses: Vec<String>,
}

/// The answer of [`Authority::authorize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// Login may proceed; CHAP with these credentials is required if `Some`.
    Allow {
        chap: Option<ChapCredentials>,
    },
    NotFound,
    Denied,
}

/// The server's policy, consulted during login.
pub trait Authority: Send + Sync {
    fn send_targets(&self, initiator_name: &str) -> Vec<DiscoveredTarget>;
    /// `target_name` None = discovery session.
    fn authorize(&self, initiator_name: &str, target_name: Option<&str>) -> Authorization;
    /// Called once when a login is about to succeed (normal or discovery). Allocates the TSIH;
    /// the server reinstates (closes) any existing session with the same initiator name + ISID.
    /// Err = fail the login with that status.
    fn register_session(&self, info: &SessionInfo) -> Result<u16, LoginStatus>;
    /// Fill `buf` with unpredictable bytes: CHAP identifiers and challenges. The core draws no
    /// randomness of its own (as rustls takes its randomness from the provider it is given):
    /// the server's authority uses the operating system's generator, tests a deterministic
    /// one, so a login is reproducible byte for byte.
    fn fill_random(&self, buf: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, buf)
    }
    /// Called when `initiator_name`'s CHAP response is wrong (the login then fails with an
    /// authentication failure): the server slows down an address that keeps guessing.
    fn chap_failed(&self, _initiator_name: &str) {}
}

/// A logged-in session as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub isid: [u8; 6],
    /// 0 while [`Authority::register_session`] runs, then the allocated value.
    pub tsih: u16,
    pub session_type: SessionType,
    pub target_name: Option<String>,
    pub params: NegotiatedParams,
}

/// What the server has to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    LoggedIn(SessionInfo),
    Command(IncomingCommand),
    TaskManagement(TaskManagement),
    /// The initiator logged out; the response is queued. Flush output, then close.
    LoggedOut,
}

/// SAM task attribute from the SCSI Command PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    Untagged,
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

impl TaskAttr {
    fn from_wire(v: u8) -> Self {
        match v & 0x07 {
            0 => Self::Untagged,
            2 => Self::Ordered,
            3 => Self::HeadOfQueue,
            4 => Self::Aca,
            // 1 is Simple; reserved values are treated as Simple too.
            _ => Self::Simple,
        }
    }
}

/// A SCSI command an initiator sent, with all its Data-Out gathered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingCommand {
    pub itt: u32,
    /// LUN number decoded from the 8-byte SAM LUN field (peripheral and flat addressing).
    pub lun: u64,
    /// The 16-byte CDB field followed by any extended CDB AHS bytes.
    pub cdb: Vec<u8>,
    pub attr: TaskAttr,
    pub data_out: Vec<u8>,
    pub expected_data_transfer_length: u32,
    pub read: bool,
    pub write: bool,
}

/// The SCSI layer's answer to an [`IncomingCommand`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandResult {
    pub status: u8,
    /// Raw sense data; the core adds the 2-byte SenseLength.
    pub sense: Vec<u8>,
    pub data_in: Vec<u8>,
    /// Bytes of Data-Out the CDB described, for write residuals.
    pub data_out_expected: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskManagement {
    pub itt: u32,
    pub function: TmfFunction,
    pub lun: u64,
    pub referenced_task_tag: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfFunction {
    AbortTask,
    AbortTaskSet,
    ClearAca,
    ClearTaskSet,
    LogicalUnitReset,
    TargetWarmReset,
    TargetColdReset,
    TaskReassign,
    Unknown(u8),
}

impl TmfFunction {
    pub fn from_code(v: u8) -> Self {
        match v {
            1 => Self::AbortTask,
            2 => Self::AbortTaskSet,
            3 => Self::ClearAca,
            4 => Self::ClearTaskSet,
            5 => Self::LogicalUnitReset,
            6 => Self::TargetWarmReset,
            7 => Self::TargetColdReset,
            8 => Self::TaskReassign,
            other => Self::Unknown(other),
        }
    }
    pub fn code(self) -> u8 {
        match self {
            Self::AbortTask => 1,
            Self::AbortTaskSet => 2,
            Self::ClearAca => 3,
            Self::ClearTaskSet => 4,
            Self::LogicalUnitReset => 5,
            Self::TargetWarmReset => 6,
            Self::TargetColdReset => 7,
            Self::TaskReassign => 8,
            Self::Unknown(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfResponse {
    FunctionComplete,
    TaskDoesNotExist,
    LunDoesNotExist,
    TaskStillAllegiant,
    ReassignNotSupported,
    NotSupported,
    AuthorizationFailed,
    Rejected,
}

impl TmfResponse {
    /// The Response field of the Task Management Function Response (RFC 7143 §11.6.1).
    pub fn code(self) -> u8 {
        match self {
            Self::FunctionComplete => 0,
            Self::TaskDoesNotExist => 1,
            Self::LunDoesNotExist => 2,
            Self::TaskStillAllegiant => 3,
            Self::ReassignNotSupported => 4,
            Self::NotSupported => 5,
            Self::AuthorizationFailed => 6,
            Self::Rejected => 255,
        }
    }
}

/// Login status class and detail (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginStatus {
    Success,
    TargetMovedTemporarily,
    TargetMovedPermanently,
    InitiatorError,
    AuthenticationFailure,
    AuthorizationFailure,
    NotFound,
    TargetRemoved,
    UnsupportedVersion,
    TooManyConnections,
    MissingParameter,
    CannotIncludeInSession,
    SessionTypeNotSupported,
    SessionDoesNotExist,
    InvalidDuringLogin,
    TargetError,
    ServiceUnavailable,
    OutOfResources,
    /// Any other class/detail pair.
    Other(u8, u8),
}

impl LoginStatus {
    /// (status class, status detail).
    pub fn code(&self) -> (u8, u8) {
        match *self {
            Self::Success => (0, 0),
            Self::TargetMovedTemporarily => (1, 1),
            Self::TargetMovedPermanently => (1, 2),
            Self::InitiatorError => (2, 0),
            Self::AuthenticationFailure => (2, 1),
            Self::AuthorizationFailure => (2, 2),
            Self::NotFound => (2, 3),
            Self::TargetRemoved => (2, 4),
            Self::UnsupportedVersion => (2, 5),
            Self::TooManyConnections => (2, 6),
            Self::MissingParameter => (2, 7),
            Self::CannotIncludeInSession => (2, 8),
            Self::SessionTypeNotSupported => (2, 9),
            Self::SessionDoesNotExist => (2, 0x0a),
            Self::InvalidDuringLogin => (2, 0x0b),
            Self::TargetError => (3, 0),
            Self::ServiceUnavailable => (3, 1),
            Self::OutOfResources => (3, 2),
            Self::Other(class, detail) => (class, detail),
        }
    }

    pub fn from_code(class: u8, detail: u8) -> Self {
        [
            Self::Success,
            Self::TargetMovedTemporarily,
            Self::TargetMovedPermanently,
            Self::InitiatorError,
            Self::AuthenticationFailure,
            Self::AuthorizationFailure,
            Self::NotFound,
            Self::TargetRemoved,
            Self::UnsupportedVersion,
            Self::TooManyConnections,
            Self::MissingParameter,
            Self::CannotIncludeInSession,
            Self::SessionTypeNotSupported,
            Self::SessionDoesNotExist,
            Self::InvalidDuringLogin,
            Self::TargetError,
            Self::ServiceUnavailable,
            Self::OutOfResources,
        ]
        .into_iter()
        .find(|s| s.code() == (class, detail))
        .unwrap_or(Self::Other(class, detail))
    }
}

/// A fatal protocol error: the byte stream can no longer be trusted and the connection must close
/// (after any pending output, such as a login reject, is flushed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data segment of {length} bytes exceeds the limit of {limit}")]
    DataSegmentTooLong { length: u32, limit: u32 },
    #[error("truncated PDU")]
    Truncated,
    #[error("login failed: status {0:?}")]
    LoginFailed(LoginStatus),
    #[error("{0}")]
    Violation(&'static str),
    #[error("connection is closed")]
    Closed,
}

/// An authority that lets everyone in without CHAP, for fuzzing.
struct PermissiveAuthority;

impl Authority for PermissiveAuthority {
    fn send_targets(&self, _initiator_name: &str) -> Vec<DiscoveredTarget> {
        vec![DiscoveredTarget {
            name: TargetSettings::default().target_name,
            addresses: vec!["127.0.0.1:3260,1".to_owned()],
        }]
    }
    fn authorize(&self, _initiator_name: &str, _target_name: Option<&str>) -> Authorization {
        Authorization::Allow { chap: None }
    }
    fn register_session(&self, _info: &SessionInfo) -> Result<u16, LoginStatus> {
        Ok(1)
    }
}

/// Drives a fresh [`Connection`] with arbitrary bytes, completing every command it yields, for
/// the cargo-fuzz target. Must never panic.
#[doc(hidden)]
pub fn fuzz_receive(data: &[u8]) {
    let mut conn = Connection::new(
        Arc::new(TargetSettings::default()),
        Arc::new(PermissiveAuthority),
    );
    let mut out = Vec::new();
    // Feed in uneven chunks so the framing paths get exercised.
    for chunk in data.chunks(977) {
        if conn.receive(chunk).is_err() {
            break;
        }
        while let Some(event) = conn.next_event() {
            match event {
                Event::Command(cmd) => {
                    let len = cmd.expected_data_transfer_length.min(1 << 20) as usize;
                    conn.complete_command(
                        cmd.itt,
                        CommandResult {
                            status: 0,
                            sense: vec![],
                            data_in: if cmd.read { vec![0x5a; len] } else { vec![] },
                            data_out_expected: cmd.data_out.len(),
                        },
                    );
                }
                Event::TaskManagement(tmf) => {
                    conn.complete_task_management(tmf.itt, TmfResponse::FunctionComplete)
                }
                Event::LoggedIn(_) | Event::LoggedOut => {}
            }
        }
        conn.take_output(&mut out);
        out.clear();
    }
    conn.ping();
    conn.request_logout();
    conn.take_output(&mut out);
}

/// Runs the text-key parser and value decoders on arbitrary bytes, for the cargo-fuzz target.
#[doc(hidden)]
pub fn fuzz_text(data: &[u8]) {
    if let Ok(pairs) = text::parse(data) {
        let settings = TargetSettings::default();
        let mut negotiator = text::Negotiator::new(&settings);
        for (key, value) in &pairs {
            let _ = text::parse_number(value);
            let _ = text::decode_binary(value);
            let _ = negotiator.answer(&settings, key, value, false, None);
        }
        let _ = text::encode(&pairs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_status_codes_round_trip() {
        assert_eq!(LoginStatus::SessionDoesNotExist.code(), (2, 0x0a));
        assert_eq!(LoginStatus::from_code(2, 7), LoginStatus::MissingParameter);
        assert_eq!(LoginStatus::from_code(9, 9), LoginStatus::Other(9, 9));
        for v in 0..=255u8 {
            assert_eq!(TmfFunction::from_code(v).code(), v);
        }
    }
}
