//! What a transport needs to know about a command before it runs, as the core's parser decides
//! it: which pool may run it and how task management treats it. The transport reads these
//! facts and never decodes a CDB or a parameter list itself (LIO's core sets the command's
//! flags and its fabrics only read them), so a second transport gets the same decisions.

use crate::cdb::{self, Command};

/// Largest transfer of a quick command.
pub const QUICK_MAX_BYTES: u64 = 256 * 1024;

/// Largest copy an EXTENDED COPY on the quick pool may ask for. Between engine volumes a copy
/// shares chunk references (2 MiB from QEMU is one metadata record), but a copy involving a
/// passthrough volume or unaligned ends moves data, and that must stay short there.
pub const QUICK_MAX_COPY_BYTES: u64 = 32 << 20;

/// The facts about one command that its transport acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    /// It holds the device server for microseconds and never waits for a flush on its
    /// thread: READ and WRITE (any size of CDB) and COMPARE AND WRITE, moving at most
    /// [`QUICK_MAX_BYTES`], SYNCHRONIZE CACHE, and EXTENDED COPY(LID1) whose parameter list
    /// asks for at most [`QUICK_MAX_COPY_BYTES`]. A write with FUA or under WCE=0, and
    /// SYNCHRONIZE CACHE, wait for durability without a thread
    /// ([`crate::LogicalUnit::execute_deferring`]). Hypervisors clone with many small copies (QEMU: 2 MiB each,
    /// ESXi: 4 MiB by default), one at a time per stream, so handing them to a pool for slow
    /// commands was a visible share of each.
    pub quick: bool,
    /// Task management does not abort it: SANITIZE continues through aborts and resets
    /// (SBC-3 4.11).
    pub survives_abort: bool,
}

/// The facts of the command `cdb`, which moves `transfer_bytes` (the transport's expected
/// data transfer length) with the Data-Out bytes `data_out` received so far (EXTENDED COPY's
/// parameter list, which says how much it copies). A CDB that does not parse is neither quick
/// nor lasting: it fails as soon as it runs.
pub fn dispatch(cdb: &[u8], transfer_bytes: u64, data_out: &[u8]) -> Dispatch {
    let parsed = cdb::parse(cdb);
    let quick = transfer_bytes <= QUICK_MAX_BYTES
        && match &parsed {
            // FUA on a read only bypasses our cache, which costs nothing extra.
            Ok(Command::Read { .. }) => true,
            // With FUA they wait for a sync, but not on the thread that runs them.
            Ok(
                Command::Write { .. }
                | Command::CompareAndWrite { .. }
                | Command::SynchronizeCache { .. },
            ) => true,
            // LID1 only: a token copy's list says nothing about its size.
            Ok(Command::ExtendedCopy { .. }) => crate::tpc::copy_bytes_at_most(data_out)
                .is_some_and(|bytes| bytes <= QUICK_MAX_COPY_BYTES),
            _ => false,
        };
    Dispatch {
        quick,
        survives_abort: matches!(parsed, Ok(Command::Sanitize { .. })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CDB of `len` bytes with `op` and byte 1 `b1` (FUA is bit 3 of byte 1).
    fn cdb(op: u8, b1: u8, len: usize) -> Vec<u8> {
        let mut c = vec![0u8; len];
        c[0] = op;
        c[1] = b1;
        c
    }

    fn quick(cdb: &[u8], bytes: u64) -> bool {
        dispatch(cdb, bytes, &[]).quick
    }

    #[test]
    fn reads_writes_and_syncs_are_quick_large_transfers_are_not() {
        assert!(quick(&cdb(0x08, 0, 6), 4096), "READ(6)");
        assert!(quick(&cdb(0x28, 0, 10), 4096), "READ(10)");
        assert!(quick(&cdb(0x88, 0x08, 16), 4096), "READ(16) with FUA");
        assert!(quick(&cdb(0x0a, 0, 6), 4096), "WRITE(6) has no FUA");
        assert!(quick(&cdb(0x8a, 0, 16), 65536), "WRITE(16)");
        assert!(quick(&cdb(0x8a, 0x08, 16), 4096), "WRITE(16) with FUA");
        assert!(quick(&cdb(0x2a, 0x08, 10), 4096), "WRITE(10) with FUA");
        assert!(quick(&cdb(0xaa, 0x08, 12), 4096), "WRITE(12) with FUA");
        assert!(quick(&cdb(0x89, 0, 16), 1024), "COMPARE AND WRITE");
        assert!(
            quick(&cdb(0x89, 0x08, 16), 1024),
            "COMPARE AND WRITE with FUA"
        );
        assert!(!quick(&cdb(0x28, 0, 10), QUICK_MAX_BYTES + 512));
        assert!(!quick(&cdb(0x2a, 0x08, 10), QUICK_MAX_BYTES + 512));
        assert!(quick(&cdb(0x35, 0, 10), 0), "SYNCHRONIZE CACHE(10)");
        assert!(quick(&cdb(0x91, 0, 16), 0), "SYNCHRONIZE CACHE(16)");
        assert!(
            !quick(&cdb(0x2e, 0, 10), 4096),
            "WRITE AND VERIFY waits on its thread"
        );
        assert!(!quick(&cdb(0x93, 0, 16), 512), "WRITE SAME(16)");
        assert!(!quick(&[0x28, 0], 4096), "a truncated CDB");
        assert!(!quick(&[], 0));
    }

    #[test]
    fn only_a_small_lid1_extended_copy_is_quick() {
        // A LID1 header with no descriptors: it parses and moves nothing.
        let empty_list = [0u8; 16];
        assert!(dispatch(&cdb(0x83, 0x00, 16), 0, &empty_list).quick);
        assert!(
            !dispatch(&cdb(0x83, 0x00, 16), 0, &[0u8; 3]).quick,
            "a list that does not parse"
        );
        // The same bytes under POPULATE TOKEN or WRITE USING TOKEN say nothing about size.
        assert!(!dispatch(&cdb(0x83, 0x10, 16), 0, &empty_list).quick);
        assert!(!dispatch(&cdb(0x83, 0x11, 16), 0, &empty_list).quick);
    }

    #[test]
    fn only_sanitize_survives_task_management() {
        let overwrite = cdb(0x48, 0x01, 10);
        assert!(dispatch(&overwrite, 0, &[]).survives_abort);
        assert!(!dispatch(&cdb(0x28, 0, 10), 4096, &[]).survives_abort);
        assert!(
            !dispatch(&[0x48], 0, &[]).survives_abort,
            "a truncated SANITIZE"
        );
    }
}
