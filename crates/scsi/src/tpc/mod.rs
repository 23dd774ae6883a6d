//! Third-party copy: the array's copy manager. Hosts offload copies to it in two ways, and
//! both end in the same engine operation, a copy by chunk reference (`Volume::copy_from`):
//!
//! - `lid1`: EXTENDED COPY (LID1) with identification CSCD and block-to-block segment
//!   descriptors (SPC-4 6.4): VMware "Full Copy" (XCOPY) and `qemu-img convert -C`;
//! - `rod`: ROD tokens (SBC-3 POPULATE TOKEN, WRITE USING TOKEN, RECEIVE ROD TOKEN
//!   INFORMATION): what Windows calls Offloaded Data Transfer (ODX).
//!
//! `copy` is what both share: copy targets, resolved steps, the senses of a failed copy.
//! `results` keeps the outcome of each EXTENDED COPY for RECEIVE COPY RESULTS; `vpd` is the
//! Third-party Copy VPD page (SPC-4 7.8.17) that advertises all of it.
//!
//! Copy targets are found by NAA designator: the LU receiving the command matches its own; any
//! other LU only through the transport's [`CopyTargets`](crate::CopyTargets), which answers
//! only for LUs this nexus may access (a copy must not reach an LU its initiator could not
//! read or write).

mod copy;
mod lid1;
mod manager;
mod receive;
mod results;
mod rod;
mod tokens;
mod vpd;

#[cfg(test)]
mod test_kit;

pub(crate) use lid1::CopyList;
pub use lid1::{
    MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES, MAX_SEGMENT_DESCRIPTORS,
};
pub(crate) use manager::CopyManager;
pub(crate) use vpd::third_party_copy_page;

use crate::cdb::Command;
use crate::lu::LogicalUnit;
use crate::outcome::Outcome;
use crate::{Request, SenseReason};

/// The third-party copy commands; `copy_list` is EXTENDED COPY's parameter list as dispatch
/// read it.
pub(crate) fn execute(
    lu: &LogicalUnit,
    req: &Request,
    cmd: &Command,
    copy_list: Option<&CopyList>,
) -> Outcome {
    match *cmd {
        Command::ExtendedCopy { param_len } => match copy_list {
            Some(list) => lid1::extended_copy(lu, req, list),
            // Dispatch reads the list of every EXTENDED COPY: not reached.
            None => lid1::extended_copy(lu, req, &CopyList::read(param_len, req.data_out)),
        },
        Command::ReceiveCopyResults {
            action,
            list_id,
            alloc_len,
        } => receive::receive_copy_results(lu, req.nexus, action, list_id, alloc_len),
        Command::PopulateToken { .. }
        | Command::WriteUsingToken { .. }
        | Command::ReceiveRodTokenInformation { .. } => rod::execute(lu, req, cmd),
        _ => Err(SenseReason::InvalidOpcode.into()),
    }
}
