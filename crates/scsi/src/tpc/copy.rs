//! What both kinds of copy share: the LUs a copy reads and writes, the steps it runs once every
//! range is checked, and the senses of a copy that fails.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use sliver_volume::VolumeError;

use crate::lu::LogicalUnit;
use crate::outcome::Failure;
use crate::param::fail_at;
use crate::pr::ReservationAccess;
use crate::{Nexus, SenseReason};

/// COPY ABORTED, COPY TARGET DEVICE NOT REACHABLE: hosts fall back to copying themselves.
/// libiscsi (like LIO) also expects it for segments whose ranges do not fit.
pub(super) fn unreachable(byte: usize) -> Failure {
    fail_at(SenseReason::CopyTargetDeviceNotReachable, byte)
}

/// A copy target: the LU that received the command, or one found through [`CopyTargets`].
#[derive(Clone)]
pub(crate) enum Target<'a> {
    Receiving(&'a LogicalUnit),
    Other(Arc<LogicalUnit>),
}

impl std::ops::Deref for Target<'_> {
    type Target = LogicalUnit;
    fn deref(&self) -> &LogicalUnit {
        match self {
            Target::Receiving(lu) => lu,
            Target::Other(lu) => lu,
        }
    }
}

/// One segment, resolved and checked, ready to copy.
pub(crate) struct Step<'a> {
    pub src: Target<'a>,
    pub dst: Target<'a>,
    pub src_lba: u64,
    pub dst_lba: u64,
    pub blocks: u64,
    pub bytes: u64,
}

/// Another LU is used on behalf of this nexus: its reservations and state apply as if the
/// nexus read or wrote it directly. (The receiving LU was checked by the dispatcher.)
pub(crate) fn check_other_lu(
    target: &Target,
    nexus: &Nexus,
    write: bool,
    at: usize,
) -> Result<(), Failure> {
    let Target::Other(other) = target else {
        return Ok(());
    };
    let access = if write {
        ReservationAccess::WRITE
    } else {
        ReservationAccess::READ
    };
    if other.reservations.admits(nexus, access).is_err()
        || other.sanitizing.load(std::sync::atomic::Ordering::Acquire)
    {
        return Err(unreachable(at));
    }
    Ok(())
}
/// Sense for a volume failure in the middle of a copy. Out of space keeps its own sense (thin
/// provisioning hosts react to it); anything else aborts the copy so the host falls back.
pub(crate) fn copy_failure(e: VolumeError) -> Failure {
    match e {
        VolumeError::NoSpace => SenseReason::SpaceAllocationFailedWriteProtect.into(),
        VolumeError::ReadOnly => SenseReason::WriteProtected.into(),
        // An unreadable source block too: the host's fallback copy then reads it itself and
        // gets the MEDIUM ERROR naming the block.
        VolumeError::OutOfRange { .. }
        | VolumeError::Poisoned(_)
        | VolumeError::Unreadable { .. }
        | VolumeError::Io(_) => SenseReason::CopyTargetDeviceNotReachable.into(),
    }
}

pub(crate) fn run_steps(steps: &[Step], progress: impl Fn(usize, u64)) -> Result<u64, Failure> {
    let mut copied = 0u64;
    for (i, step) in steps.iter().enumerate() {
        if step.blocks > 0 {
            // Writes to the destination range wait for the copy, as for any other write. Only
            // one range lock is held at a time, so copies in opposite directions between two
            // LUs, or within one LU, cannot deadlock.
            let _lock = step.dst.locks.lock(step.dst_lba, step.blocks);
            step.dst
                .volume
                .copy_from(
                    step.src.volume.as_ref(),
                    step.src_lba,
                    step.dst_lba,
                    step.blocks,
                )
                .map_err(copy_failure)?;
            if !step.dst.mode.write_cache() {
                step.dst.volume.flush().map_err(copy_failure)?;
            }
        }
        copied += step.bytes;
        step.src.stats.clone_read.fetch_add(1, Relaxed);
        step.dst.stats.clone_write.fetch_add(1, Relaxed);
        step.dst.stats.cloned_bytes.fetch_add(step.bytes, Relaxed);
        progress(i + 1, copied);
    }
    Ok(copied)
}
