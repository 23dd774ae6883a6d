//! What a command is, decided once when it arrives: the parsed CDB (or the sense of one that
//! does not parse), where it may run, how task management treats it and, for EXTENDED COPY,
//! its parameter list. Execution reads this [`Parsed`] and never parses the CDB again, and the
//! transport reads its facts and never decodes a CDB, a parameter list or its own read and
//! write bits to place a command. This is LIO's shape: `sbc_parse_cdb` sets a command's
//! execute function and flags once and everybody else reads them, so a second transport gets
//! the same decisions.

use crate::cdb::{self, Command};
use crate::pr::ReservationAccess;
use crate::tpc::CopyList;
use crate::Sense;

/// Largest READ or WRITE that may complete on the connection's task ([`Placement::Inline`]).
pub const INLINE_MAX_BYTES: u64 = 64 * 1024;

/// Largest transfer of a quick command.
pub const QUICK_MAX_BYTES: u64 = 256 * 1024;

/// Largest copy an EXTENDED COPY on the quick pool may ask for. Between engine volumes a copy
/// shares chunk references (2 MiB from QEMU is one metadata record), but a copy involving a
/// passthrough volume or unaligned ends moves data, and that must stay short there.
pub const QUICK_MAX_COPY_BYTES: u64 = 32 << 20;

/// Where a command may run. The transport decides from its own load whether to use what is
/// allowed (an inline command may as well go to the quick pool), never beyond it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A READ or a WRITE of at most [`INLINE_MAX_BYTES`]: it may complete on the task that
    /// received it, in the way [`Inline`] says; otherwise it is quick.
    Inline(Inline),
    /// It holds the device server for microseconds and never waits for a flush on its
    /// thread: READ and WRITE (any size of CDB) and COMPARE AND WRITE, moving at most
    /// [`QUICK_MAX_BYTES`], SYNCHRONIZE CACHE, and EXTENDED COPY(LID1) whose parameter list
    /// asks for at most [`QUICK_MAX_COPY_BYTES`]. A write with FUA or under WCE=0, and
    /// SYNCHRONIZE CACHE, wait for durability without a thread
    /// ([`crate::LogicalUnit::execute_deferring_parsed`]). Hypervisors clone with many small
    /// copies (QEMU: 2 MiB each, ESXi: 4 MiB by default), one at a time per stream, so handing
    /// them to a pool for slow commands was a visible share of each.
    Quick,
    /// Anything else: it may wait on its thread (WRITE AND VERIFY, WRITE SAME, UNMAP, large
    /// transfers, SANITIZE, the rare commands) and a CDB that does not parse.
    Blocking,
}

/// How an inline command may complete on the task that received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inline {
    /// A READ: only when it does not wait for a device, which
    /// [`crate::LogicalUnit::execute_cached_parsed`] finds out (and answers it then).
    IfCached,
    /// A WRITE: it may wait a little (the kernel's dirty-page throttling, a range lock held by
    /// an overlapping command, a metadata page read), so only where that task can be spared.
    MayWait,
}

/// A command as the core decided it once, from its CDB and Data-Out; [`dispatch`] makes it,
/// and the `_parsed` functions of [`crate::LogicalUnit`] and
/// [`crate::execute_without_lu_parsed`] run it.
#[derive(Debug)]
pub struct Parsed {
    /// The command, or the sense of a CDB that does not parse. That sense is given only after
    /// the checks every command goes through first (a pending unit attention comes first).
    pub(crate) command: Result<Command, Sense>,
    /// Where it may run.
    pub placement: Placement,
    /// Task management does not abort it: SANITIZE continues through aborts and resets
    /// (SBC-3 4.11).
    pub survives_abort: bool,
    /// EXTENDED COPY(LID1)'s parameter list (`None` for every other command), read and checked
    /// as execution reports it.
    pub(crate) copy_list: Option<CopyList>,
    /// How the reservations in force treat it (`None` for a CDB that does not parse: its
    /// sense answers it before any reservation is looked at).
    pub(crate) reservation_access: Option<ReservationAccess>,
    /// Whether it reports (and so clears) a pending unit attention. SPC-4 5.14: INQUIRY,
    /// REPORT LUNS and REQUEST SENSE do not (REQUEST SENSE returns it as its data instead).
    /// Decided by the opcode, so that one of them whose CDB does not parse leaves the unit
    /// attention pending too and is answered with its own sense.
    pub(crate) reports_unit_attention: bool,
}

/// Decide what `cdb` is, which moves `transfer_bytes` (the transport's expected data transfer
/// length) with the Data-Out bytes `data_out` (all of them: EXTENDED COPY's parameter list
/// says how much it copies). A CDB that does not parse is neither quick nor lasting: it fails
/// as soon as it runs.
pub fn dispatch(cdb: &[u8], transfer_bytes: u64, data_out: &[u8]) -> Parsed {
    let command = cdb::parse(cdb);
    let copy_list = match &command {
        Ok(Command::ExtendedCopy { param_len }) => Some(CopyList::read(*param_len, data_out)),
        _ => None,
    };
    let placement = match &command {
        Ok(Command::Read { .. }) if transfer_bytes <= INLINE_MAX_BYTES => {
            Placement::Inline(Inline::IfCached)
        }
        Ok(Command::Write { .. }) if transfer_bytes <= INLINE_MAX_BYTES => {
            Placement::Inline(Inline::MayWait)
        }
        _ if transfer_bytes > QUICK_MAX_BYTES => Placement::Blocking,
        // FUA on a read only bypasses our cache, which costs nothing extra; with FUA the
        // others wait for a sync, but not on the thread that runs them.
        Ok(
            Command::Read { .. }
            | Command::Write { .. }
            | Command::CompareAndWrite { .. }
            | Command::SynchronizeCache { .. },
        ) => Placement::Quick,
        // LID1 only: a token copy's list says nothing about its size.
        Ok(Command::ExtendedCopy { .. })
            if copy_list
                .as_ref()
                .and_then(CopyList::bytes_at_most)
                .is_some_and(|bytes| bytes <= QUICK_MAX_COPY_BYTES) =>
        {
            Placement::Quick
        }
        _ => Placement::Blocking,
    };
    let reservation_access = command
        .as_ref()
        .ok()
        .map(|command| ReservationAccess::of(command, cdb));
    let reports_unit_attention = !matches!(
        cdb.first(),
        Some(&(cdb::opcode::INQUIRY | cdb::opcode::REPORT_LUNS | cdb::opcode::REQUEST_SENSE))
    );
    Parsed {
        survives_abort: matches!(command, Ok(Command::Sanitize { .. })),
        reports_unit_attention,
        command,
        placement,
        copy_list,
        reservation_access,
    }
}

impl Parsed {
    /// What `req` is, for a caller that did not dispatch it (tests, the array's own
    /// commands): its Data-Out is its whole transfer.
    pub(crate) fn of(req: &crate::Request) -> Parsed {
        dispatch(req.cdb, req.data_out.len() as u64, req.data_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SenseReason;

    /// A CDB of `len` bytes with `op` and byte 1 `b1` (FUA is bit 3 of byte 1).
    fn cdb(op: u8, b1: u8, len: usize) -> Vec<u8> {
        let mut c = vec![0u8; len];
        c[0] = op;
        c[1] = b1;
        c
    }

    fn placed(cdb: &[u8], bytes: u64) -> Placement {
        dispatch(cdb, bytes, &[]).placement
    }

    fn quick(cdb: &[u8], bytes: u64) -> bool {
        placed(cdb, bytes) != Placement::Blocking
    }

    const READ_HERE: Placement = Placement::Inline(Inline::IfCached);
    const WRITE_HERE: Placement = Placement::Inline(Inline::MayWait);

    #[test]
    fn reads_and_writes_of_at_most_64_kib_may_complete_inline() {
        assert_eq!(placed(&cdb(0x28, 0, 10), 4096), READ_HERE, "READ(10)");
        assert_eq!(placed(&cdb(0x88, 0, 16), INLINE_MAX_BYTES), READ_HERE);
        assert_eq!(placed(&cdb(0x08, 0, 6), 512), READ_HERE, "READ(6)");
        assert_eq!(placed(&cdb(0x88, 0x08, 16), 4096), READ_HERE, "with FUA");
        assert_eq!(placed(&cdb(0x8a, 0, 16), INLINE_MAX_BYTES), WRITE_HERE);
        assert_eq!(placed(&cdb(0x0a, 0, 6), 512), WRITE_HERE, "WRITE(6)");
        assert_eq!(placed(&cdb(0xaa, 0x08, 12), 4096), WRITE_HERE, "with FUA");
        assert_eq!(placed(&cdb(0x88, 0, 16), 0), READ_HERE, "no transfer");
        let over = INLINE_MAX_BYTES + 512;
        assert_eq!(placed(&cdb(0x88, 0, 16), over), Placement::Quick);
        assert_eq!(placed(&cdb(0x2a, 0, 10), over), Placement::Quick);
        // Only READ and WRITE: the others that carry data are quick at most.
        assert_eq!(placed(&cdb(0x89, 0, 16), 1024), Placement::Quick, "CAW");
        assert_eq!(placed(&cdb(0x35, 0, 10), 0), Placement::Quick, "SYNC CACHE");
        assert_eq!(
            placed(&cdb(0x9c, 0, 16), 4096),
            Placement::Blocking,
            "ATOMIC"
        );
        assert_eq!(placed(&cdb(0x2e, 0, 10), 4096), Placement::Blocking, "W&V");
        assert_eq!(placed(&cdb(0x12, 0, 6), 36), Placement::Blocking, "INQUIRY");
        // A READ(10) with RDPROTECT set does not parse: it is none of these.
        assert_eq!(placed(&cdb(0x28, 0x20, 10), 4096), Placement::Blocking);
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
        assert!(quick(&cdb(0x28, 0, 10), QUICK_MAX_BYTES));
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

    /// EXTENDED COPY(LID1) whose PARAMETER LIST LENGTH is `len`.
    fn xcopy(len: u32) -> Vec<u8> {
        let mut c = cdb(0x83, 0x00, 16);
        c[10..14].copy_from_slice(&len.to_be_bytes());
        c
    }

    #[test]
    fn only_a_small_lid1_extended_copy_is_quick() {
        // A LID1 header with no descriptors: it parses and moves nothing.
        let empty_list = [0u8; 16];
        assert_eq!(
            dispatch(&xcopy(16), 16, &empty_list).placement,
            Placement::Quick
        );
        assert_eq!(
            dispatch(&xcopy(3), 3, &[0u8; 3]).placement,
            Placement::Blocking,
            "a list that does not parse"
        );
        assert_eq!(
            dispatch(&xcopy(16), 16, &empty_list[..8]).placement,
            Placement::Blocking,
            "a list shorter than its length"
        );
        // The same bytes under POPULATE TOKEN or WRITE USING TOKEN say nothing about size.
        for sa in [0x10, 0x11] {
            let mut token = xcopy(16);
            token[1] = sa;
            let parsed = dispatch(&token, 16, &empty_list);
            assert_eq!(parsed.placement, Placement::Blocking);
            assert!(parsed.copy_list.is_none());
        }
    }

    #[test]
    fn the_copy_list_is_read_once_as_execution_reports_it() {
        let empty_list = [0u8; 16];
        let read = dispatch(&xcopy(16), 16, &empty_list);
        assert_eq!(read.copy_list.as_ref().unwrap().bytes_at_most(), Some(0));
        // PARAMETER LIST LENGTH 0 copies nothing, whatever Data-Out came.
        let none = dispatch(&xcopy(0), 3, &[1, 2, 3]);
        assert_eq!(none.copy_list.as_ref().unwrap().bytes_at_most(), Some(0));
        // Longer than any list we take: refused before it is looked at.
        let long = dispatch(&xcopy(1 << 20), 1 << 20, &[]);
        assert!(long.copy_list.as_ref().unwrap().bytes_at_most().is_none());
        assert_eq!(long.placement, Placement::Blocking);
        assert!(dispatch(&cdb(0x28, 0, 10), 0, &empty_list)
            .copy_list
            .is_none());
    }

    #[test]
    fn a_cdb_is_parsed_into_its_command_or_its_sense() {
        let unsupported = dispatch(&cdb(0xc5, 0, 16), 0, &[]);
        assert_eq!(
            unsupported.command,
            Ok(Command::Unsupported { opcode: 0xc5 })
        );
        assert_eq!(unsupported.placement, Placement::Blocking);
        let truncated = dispatch(&[0x88, 0], 4096, &[]);
        assert_eq!(
            truncated.command.map_err(|s| s.reason),
            Err(SenseReason::InvalidFieldInCdb)
        );
    }

    /// A CDB of `len` bytes with `op`, byte 1 `b1` and `byte` at `at`.
    fn cdb_with(op: u8, b1: u8, len: usize, at: usize, byte: u8) -> Vec<u8> {
        let mut c = cdb(op, b1, len);
        c[at] = byte;
        c
    }

    /// Every command of SPC-4's table of commands allowed in the presence of persistent
    /// reservations and of SBC-3's additions, those SPC-2 RESERVE lets other nexuses send, and
    /// one of each other kind, with what the reservations decide: whether it parses or not
    /// (the device server does not implement all of them, and those still meet a reservation
    /// before their INVALID COMMAND OPERATION CODE).
    #[test]
    fn reservation_access_follows_spc4_and_sbc3_tables() {
        use crate::pr::{AccessClass::*, Spc2Access::*};
        #[rustfmt::skip]
        let table = [
            ("INQUIRY", cdb(0x12, 0, 6), Always, Anyone),
            ("REQUEST SENSE", cdb(0x03, 0, 6), Always, Anyone),
            ("REPORT LUNS", cdb(0xa0, 0, 12), Always, Anyone),
            ("LOG SENSE", cdb(0x4d, 0, 10), Always, Anyone),
            ("RELEASE(6)", cdb(0x17, 0, 6), Always, Anyone),
            ("RELEASE(10)", cdb(0x57, 0, 10), Always, Anyone),
            ("TEST UNIT READY", cdb(0x00, 0, 6), Always, HolderOnly),
            ("READ CAPACITY(10)", cdb(0x25, 0, 10), Always, HolderOnly),
            ("READ CAPACITY(16)", cdb(0x9e, 0x10, 16), Always, HolderOnly),
            ("RESERVE(6)", cdb(0x16, 0, 6), Always, HolderOnly),
            ("RESERVE(10)", cdb(0x56, 0, 10), Always, HolderOnly),
            ("ACCESS CONTROL IN", cdb(0x86, 0, 16), Always, HolderOnly),
            ("ACCESS CONTROL OUT", cdb(0x87, 0, 16), Always, HolderOnly),
            ("PERSISTENT RESERVE IN", cdb(0x5e, 0, 10), Always, Nobody),
            ("PERSISTENT RESERVE OUT", cdb(0x5f, 0, 10), Always, Nobody),
            ("PREVENT ALLOW MEDIUM REMOVAL, allow", cdb(0x1e, 0, 6), Always, Anyone),
            ("PREVENT ALLOW MEDIUM REMOVAL, prevent", cdb_with(0x1e, 0, 6, 4, 1), Other, HolderOnly),
            ("READ MEDIA SERIAL NUMBER", cdb(0xab, 0x01, 12), Always, Anyone),
            ("SERVICE ACTION IN(12) 02h", cdb(0xab, 0x02, 12), Other, HolderOnly),
            ("REPORT IDENTIFYING INFORMATION", cdb(0xa3, 0x05, 12), Always, HolderOnly),
            ("REPORT TARGET PORT GROUPS", cdb(0xa3, 0x0a, 12), Always, Anyone),
            ("REPORT ALIASES", cdb(0xa3, 0x0b, 12), Always, HolderOnly),
            ("REPORT SUPPORTED OPERATION CODES", cdb(0xa3, 0x0c, 12), Read, Anyone),
            ("REPORT SUPPORTED TMFS", cdb(0xa3, 0x0d, 12), Read, Anyone),
            ("REPORT PRIORITY", cdb(0xa3, 0x0e, 12), Always, HolderOnly),
            ("REPORT TIMESTAMP", cdb(0xa3, 0x0f, 12), Always, Anyone),
            ("MANAGEMENT PROTOCOL IN", cdb(0xa3, 0x10, 12), Read, HolderOnly),
            ("MAINTENANCE IN 06h", cdb(0xa3, 0x06, 12), Other, HolderOnly),
            ("GET LBA STATUS", cdb(0x9e, 0x12, 16), Read, HolderOnly),
            ("READ LONG(16)", cdb(0x9e, 0x11, 16), Read, HolderOnly),
            ("REPORT REFERRALS", cdb(0x9e, 0x13, 16), Read, HolderOnly),
            ("SERVICE ACTION IN(16) 14h", cdb(0x9e, 0x14, 16), Other, HolderOnly),
            ("READ(6)", cdb(0x08, 0, 6), Read, HolderOnly),
            ("READ(10)", cdb(0x28, 0, 10), Read, HolderOnly),
            ("READ(12)", cdb(0xa8, 0, 12), Read, HolderOnly),
            ("READ(16)", cdb(0x88, 0, 16), Read, HolderOnly),
            ("VERIFY(10)", cdb(0x2f, 0, 10), Read, HolderOnly),
            ("VERIFY(12)", cdb(0xaf, 0, 12), Read, HolderOnly),
            ("VERIFY(16)", cdb(0x8f, 0, 16), Read, HolderOnly),
            ("PRE-FETCH(10)", cdb(0x34, 0, 10), Read, HolderOnly),
            ("PRE-FETCH(16)", cdb(0x90, 0, 16), Read, HolderOnly),
            ("READ DEFECT DATA(10)", cdb(0x37, 0, 10), Read, HolderOnly),
            ("READ DEFECT DATA(12)", cdb(0xb7, 0, 12), Read, HolderOnly),
            ("READ LONG(10)", cdb(0x3e, 0, 10), Read, HolderOnly),
            ("XDREAD(10)", cdb(0x52, 0, 10), Read, HolderOnly),
            ("MODE SENSE(6)", cdb(0x1a, 0, 6), Read, HolderOnly),
            ("MODE SENSE(10)", cdb(0x5a, 0, 10), Read, HolderOnly),
            ("READ BUFFER", cdb(0x3c, 0, 10), Read, HolderOnly),
            ("RECEIVE DIAGNOSTIC RESULTS", cdb(0x1c, 0, 6), Read, HolderOnly),
            ("READ ATTRIBUTE", cdb(0x8c, 0, 16), Read, HolderOnly),
            ("SECURITY PROTOCOL IN", cdb(0xa2, 0, 12), Read, HolderOnly),
            ("READ(32)", cdb_with(0x7f, 0, 32, 9, 0x09), Read, HolderOnly),
            ("VERIFY(32)", cdb_with(0x7f, 0, 32, 9, 0x0a), Read, HolderOnly),
            ("WRITE(32)", cdb_with(0x7f, 0, 32, 9, 0x0b), Other, HolderOnly),
            ("WRITE(6)", cdb(0x0a, 0, 6), Other, HolderOnly),
            ("WRITE(10)", cdb(0x2a, 0, 10), Other, HolderOnly),
            ("WRITE(12)", cdb(0xaa, 0, 12), Other, HolderOnly),
            ("WRITE(16)", cdb(0x8a, 0, 16), Other, HolderOnly),
            ("WRITE AND VERIFY(10)", cdb(0x2e, 0, 10), Other, HolderOnly),
            ("WRITE AND VERIFY(12)", cdb(0xae, 0, 12), Other, HolderOnly),
            ("WRITE AND VERIFY(16)", cdb(0x8e, 0, 16), Other, HolderOnly),
            ("ORWRITE(16)", cdb(0x8b, 0, 16), Other, HolderOnly),
            ("WRITE ATOMIC(16)", cdb(0x9c, 0, 16), Other, HolderOnly),
            ("COMPARE AND WRITE", cdb(0x89, 0, 16), Other, HolderOnly),
            ("WRITE SAME(10)", cdb(0x41, 0, 10), Other, HolderOnly),
            ("WRITE SAME(16)", cdb(0x93, 0, 16), Other, HolderOnly),
            ("UNMAP", cdb(0x42, 0, 10), Other, HolderOnly),
            ("SYNCHRONIZE CACHE(10)", cdb(0x35, 0, 10), Other, HolderOnly),
            ("SYNCHRONIZE CACHE(16)", cdb(0x91, 0, 16), Other, HolderOnly),
            ("START STOP UNIT", cdb(0x1b, 0, 6), Other, HolderOnly),
            ("MODE SELECT(6)", cdb(0x15, 0, 6), Other, HolderOnly),
            ("MODE SELECT(10)", cdb(0x55, 0, 10), Other, HolderOnly),
            ("SANITIZE", cdb(0x48, 0x01, 10), Other, HolderOnly),
            ("EXTENDED COPY(LID1)", cdb(0x83, 0x00, 16), Other, HolderOnly),
            ("POPULATE TOKEN", cdb(0x83, 0x10, 16), Other, HolderOnly),
            ("WRITE USING TOKEN", cdb(0x83, 0x11, 16), Other, HolderOnly),
            ("THIRD-PARTY COPY OUT 1Ch", cdb(0x83, 0x1c, 16), Other, HolderOnly),
            ("RECEIVE COPY STATUS", cdb(0x84, 0x00, 16), Other, HolderOnly),
            ("RECEIVE ROD TOKEN INFORMATION", cdb(0x84, 0x07, 16), Other, HolderOnly),
            ("an unknown opcode", cdb(0xc5, 0, 16), Other, HolderOnly),
        ];
        for (name, cdb, persistent, spc2) in table {
            let parsed = dispatch(&cdb, 0, &[]);
            assert!(parsed.command.is_ok(), "{name} parses");
            let expected = ReservationAccess { persistent, spc2 };
            assert_eq!(parsed.reservation_access, Some(expected), "{name}");
        }
        // A CDB that does not parse is answered by its sense before any reservation.
        assert_eq!(dispatch(&[0x28, 0], 0, &[]).reservation_access, None);
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
