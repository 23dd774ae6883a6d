//! The SCSI device server: SPC-4 / SBC-3 for thin logical units.
//!
//! Transport-independent: the iSCSI layer hands over a CDB, the gathered Data-Out bytes and
//! the I_T nexus, and gets back a status, sense data and Data-In bytes. Storage is reached only
//! through [`sliver_volume::Volume`] (and the pool behind it through
//! [`sliver_volume::Pool`]). A command is parsed once, by [`dispatch()`]: its [`Parsed`] says
//! where it may run and whether task management leaves it running, and execution takes it
//! instead of the CDB again. Task management's semantics come from [`tmf::TaskSet`]: the
//! transport reads and routes, it never decodes a CDB.
//!
//! Layout, from the bottom up; a module uses only those above it in this list (a test in
//! `sliver-test-support` checks that no two modules use each other, directly or around):
//!
//! - `sense` is the single table of sense codes; `cdb` parses (no I/O); `outcome` is how a
//!   command ends and the helpers every family shares (`invalid_cdb`, `invalid_param`);
//!   `param` reads parameter lists with field pointers; `range_lock` the LBA range locks;
//!   `limits` what the LU advertises and enforces; `stats` the counters;
//! - the families' per-LU state, each knowing nothing of the LU: `mode::ModeParams`,
//!   `pr::Reservations` (persistent reservations are state and rules, no LU needed),
//!   `tpc::CopyManager` (copy results and ROD tokens);
//! - `lu`: the logical unit's state, holding those;
//! - the command families, each taking the LU: `spc`, `sbc`, `mode` (MODE SENSE / SELECT),
//!   `vpd` (INQUIRY pages), `tpc` (third-party copy: EXTENDED COPY and ROD tokens);
//! - `dispatch`: what a command is, decided once (its parsed CDB and EXTENDED COPY list,
//!   where it may run, whether task management leaves it running);
//! - `execute`: what every command goes through first and the family that runs it;
//! - `tmf`: task management, what the transport asks around a command.

pub mod cdb;
pub mod dispatch;
mod execute;
mod limits;
mod lu;
mod mode;
mod outcome;
mod param;
pub mod pr;
mod range_lock;
mod sbc;
pub mod sense;
mod spc;
pub mod stats;
#[cfg(test)]
mod test_kit;
#[cfg(test)]
mod tests;
pub mod tmf;
mod tpc;
mod vpd;

pub use dispatch::{dispatch, Inline, Parsed, Placement, INLINE_MAX_BYTES};
pub use execute::{execute_without_lu, execute_without_lu_parsed, Answer};
pub use lu::{LogicalUnit, LuConfig, Reset};
pub use mode::SavedModePages;
pub use sense::{Sense, SenseKey, SenseReason, Status};
pub use stats::{
    latency_bucket, ClassStats, CommandClass, LuStats, StatsSnapshot, VaaiCounters,
    LATENCY_BOUNDS_US,
};
pub use tpc::{
    MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES, MAX_SEGMENT_DESCRIPTORS,
};

#[doc(hidden)]
pub use execute::fuzz_cdb;

/// An I_T nexus: one SCSI initiator port talking through one SCSI target port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// SCSI initiator port name; for iSCSI `<initiator name>,i,0x<ISID as 12 hex digits>`.
    pub initiator_port: String,
    /// iSCSI initiator name alone (PR TransportIDs may name it without ISID).
    pub initiator_name: String,
    /// Relative target port identifier (1-based) of the port the command arrived on.
    pub relative_target_port: u16,
}

/// SAM task attribute from the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// One command as the transport delivers it.
#[derive(Debug)]
pub struct Request<'a> {
    pub nexus: &'a Nexus,
    pub cdb: &'a [u8],
    /// All Data-Out bytes the initiator sent (the transport gathers them before execution).
    pub data_out: &'a [u8],
    pub attr: TaskAttr,
    /// LUNs this nexus may see, for REPORT LUNS.
    pub luns: &'a [u64],
    /// LUs this nexus may address, for EXTENDED COPY's copy-target lookup.
    pub copy_targets: &'a dyn CopyTargets,
}

/// LUs a nexus may address, for EXTENDED COPY's copy-target lookup (the transport supplies it
/// per command). It must only find LUs the nexus is allowed to access: a copy names its source
/// and destination by designator, so this lookup is the access control (CVE-2020-28374 was LIO
/// searching every LU instead).
pub trait CopyTargets: Send + Sync {
    /// The LU whose NAA designator (VPD 0x83, 16 bytes) is `naa`.
    fn find_by_naa(&self, naa: &[u8]) -> Option<std::sync::Arc<LogicalUnit>>;
}

impl std::fmt::Debug for dyn CopyTargets + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CopyTargets")
    }
}

/// No other LU is reachable: EXTENDED COPY works only within the LU that receives it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCopyTargets;

impl CopyTargets for NoCopyTargets {
    fn find_by_naa(&self, _naa: &[u8]) -> Option<std::sync::Arc<LogicalUnit>> {
        None
    }
}

/// The outcome of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    /// Sense data (fixed or descriptor format); empty unless status is CHECK CONDITION.
    pub sense: Vec<u8>,
    /// Data-In bytes, already limited by the CDB's allocation length / transfer length.
    pub data_in: Vec<u8>,
    /// Bytes of Data-Out the CDB asked for (0 for commands without Data-Out), so the
    /// transport can compute write residuals against its expected transfer length.
    pub data_out_expected: usize,
}

impl Response {
    /// TASK ABORTED (TAS=1): what the initiator of a command another nexus aborted hears.
    pub fn task_aborted(data_out_expected: usize) -> Self {
        Response {
            status: Status::TaskAborted,
            sense: Vec::new(),
            data_in: Vec::new(),
            data_out_expected,
        }
    }

    /// CHECK CONDITION with sense key UNIT ATTENTION, in fixed or descriptor format.
    pub fn reports_unit_attention(&self) -> bool {
        let key = match self.sense.first().map(|code| code & 0x7f) {
            Some(0x70 | 0x71) => self.sense.get(2),
            Some(0x72 | 0x73) => self.sense.get(1),
            _ => None,
        };
        self.status == Status::CheckCondition
            && key.is_some_and(|k| k & 0x0f == SenseKey::UnitAttention as u8)
    }
}
