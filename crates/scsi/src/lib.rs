//! The SCSI device server: SPC-4 / SBC-3 for thin logical units.
//!
//! Transport-independent: the iSCSI layer hands over a CDB, the gathered Data-Out bytes and
//! the I_T nexus, and gets back a status, sense data and Data-In bytes. Storage is reached only
//! through [`sliver_volume::Volume`] (and the pool behind it through
//! [`sliver_volume::Pool`]). What a transport must know before a command runs comes
//! from [`dispatch()`] (which thread pool, whether task management leaves it running), and task
//! management's semantics from [`tmf::TaskSet`]: the transport reads and routes, it never
//! decodes a CDB.
//!
//! Layout follows the standards: `cdb` parses (no I/O), `spc` / `sbc` / `pr` / `tpc` execute
//! one command family each (`tpc` is third-party copy: EXTENDED COPY and ROD tokens), `vpd`
//! and `mode` build INQUIRY pages and mode pages, `lu` holds the per-LU state (unit
//! attentions, mode parameters, the copy manager's results and tokens) and the
//! dispatcher, `outcome` how a command ends (and the helpers every family shares),
//! `range_lock` the LBA range locks, `sense` is the single table of sense codes.

pub mod cdb;
pub mod dispatch;
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
mod tests;
pub mod tmf;
mod tpc;
mod vpd;

pub use dispatch::{dispatch, Dispatch};
pub use lu::{execute_without_lu, LogicalUnit, LuConfig, Reset};
pub use sense::{Sense, SenseKey, SenseReason, Status};
pub use stats::{
    latency_bucket, ClassStats, CommandClass, LuStats, StatsSnapshot, VaaiCounters,
    LATENCY_BOUNDS_US,
};
pub use tpc::{
    MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES, MAX_SEGMENT_DESCRIPTORS,
};

#[doc(hidden)]
pub use lu::fuzz_cdb;

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
