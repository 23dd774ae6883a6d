//! How a command ends: [`Done`] (GOOD, or a status with data) or [`Failure`] (CHECK
//! CONDITION with its sense), and the helpers every command family uses to say so: one
//! `invalid_cdb` / `invalid_param` carrying the field pointer, the volume errors' senses, the
//! Data-Out and allocation-length bounds. Families and the dispatcher share them without
//! importing each other.

use std::sync::Arc;

use sliver_volume::{Volume, VolumeError};

use crate::{Sense, SenseReason, Status};

/// How a command that did not fail ended.
pub(crate) struct Done {
    pub status: Status,
    pub data_in: Vec<u8>,
    /// Bytes of the medium a write, WRITE SAME, UNMAP or EXTENDED COPY affected (statistics).
    pub affected_bytes: u64,
    /// A volume whose completed writes must be durable before the command is answered
    /// (FUA, WCE=0, SYNCHRONIZE CACHE). The command's thread does not wait for that: the
    /// LU answers once the volume says so (`LogicalUnit::execute_deferring`), so a queue of
    /// write-through commands shares one sync.
    pub durable: Option<Arc<dyn Volume>>,
}

impl Done {
    pub fn good() -> Self {
        Done {
            status: Status::Good,
            data_in: Vec::new(),
            affected_bytes: 0,
            durable: None,
        }
    }

    pub fn data(data_in: Vec<u8>) -> Self {
        Done {
            status: Status::Good,
            data_in,
            affected_bytes: 0,
            durable: None,
        }
    }

    /// GOOD, having affected `bytes` of the medium.
    pub fn affected(bytes: u64) -> Self {
        Done {
            affected_bytes: bytes,
            ..Done::good()
        }
    }

    /// The same, answered only once `volume`'s completed writes are durable.
    pub fn once_durable(self, volume: &Arc<dyn Volume>) -> Self {
        Done {
            durable: Some(volume.clone()),
            ..self
        }
    }
}

/// How a command failed.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Check(Sense),
    Conflict,
}

/// INVALID FIELD IN CDB for a command's outcome ([`Sense::invalid_cdb`]).
pub(crate) fn invalid_cdb(byte: u16, bit: Option<u8>) -> Failure {
    Sense::invalid_cdb(byte, bit).into()
}

/// INVALID FIELD IN PARAMETER LIST for a command's outcome ([`Sense::invalid_param`]).
pub(crate) fn invalid_param(byte: usize, bit: Option<u8>) -> Failure {
    Sense::invalid_param(byte, bit).into()
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Self {
        Failure::Check(s)
    }
}

impl From<SenseReason> for Failure {
    fn from(r: SenseReason) -> Self {
        Failure::Check(r.into())
    }
}

pub(crate) type Outcome = Result<Done, Failure>;

/// Sense for a failed volume read.
pub(crate) fn read_failure(e: VolumeError) -> Failure {
    volume_failure(e, SenseReason::UnrecoveredReadError)
}

/// Sense for a failed volume write (or unmap / flush).
pub(crate) fn write_failure(e: VolumeError) -> Failure {
    volume_failure(e, SenseReason::WriteError)
}

fn volume_failure(e: VolumeError, io_reason: SenseReason) -> Failure {
    let reason = match e {
        // Also for a write: a partial-chunk write that cannot read what it merges with.
        VolumeError::Unreadable { lba, .. } => {
            return Failure::Check(
                Sense::from(SenseReason::UnrecoveredReadError).with_information(lba),
            )
        }
        VolumeError::OutOfRange { .. } => SenseReason::LbaOutOfRange,
        VolumeError::NoSpace => SenseReason::SpaceAllocationFailedWriteProtect,
        VolumeError::ReadOnly => SenseReason::WriteProtected,
        VolumeError::Poisoned(_) => SenseReason::InternalTargetFailure,
        VolumeError::Io(_) => io_reason,
    };
    reason.into()
}

/// The first `needed` bytes of Data-Out, or INVALID FIELD IN INFORMATION UNIT when the
/// initiator sent fewer than the CDB asks for (we never act on a partial buffer).
pub(crate) fn data_out_prefix(data_out: &[u8], needed: usize) -> Result<&[u8], Failure> {
    data_out
        .get(..needed)
        .ok_or_else(|| SenseReason::InvalidFieldInInformationUnit.into())
}

/// Limit parameter data to the allocation length.
pub(crate) fn truncated(mut data: Vec<u8>, alloc_len: usize) -> Vec<u8> {
    data.truncate(alloc_len);
    data
}
