//! Which commands a reservation lets through: the SPC-4 / SBC-3 tables of commands allowed in
//! the presence of persistent reservations, and the commands SPC-2 RESERVE lets other nexuses
//! send. [`crate::dispatch`] decides it once per command, from the parsed command, and the
//! reservation check reads that decision.

use crate::cdb::{opcode, Command};

// Opcodes and service actions of commands this device server does not implement but the
// access tables name: they still meet a reservation before their INVALID COMMAND OPERATION
// CODE, so whether they conflict depends on what SPC says they are.
const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
const RECEIVE_DIAGNOSTIC_RESULTS: u8 = 0x1c;
const READ_BUFFER: u8 = 0x3c;
const READ_LONG_10: u8 = 0x3e;
const XDREAD_10: u8 = 0x52;
const VARIABLE_LENGTH: u8 = 0x7f;
const ACCESS_CONTROL_IN: u8 = 0x86;
const ACCESS_CONTROL_OUT: u8 = 0x87;
const READ_ATTRIBUTE: u8 = 0x8c;
const SECURITY_PROTOCOL_IN: u8 = 0xa2;
const SERVICE_ACTION_IN_12: u8 = 0xab;
const SA_READ_MEDIA_SERIAL_NUMBER: u8 = 0x01;
const SA_READ_LONG_16: u8 = 0x11;
const SA_REPORT_REFERRALS: u8 = 0x13;
const SA_REPORT_IDENTIFYING_INFORMATION: u8 = 0x05;
const SA_REPORT_ALIASES: u8 = 0x0b;
const SA_REPORT_PRIORITY: u8 = 0x0e;
const SA_REPORT_TIMESTAMP: u8 = 0x0f;
const SA_MANAGEMENT_PROTOCOL_IN: u8 = 0x10;
const SA32_READ: u16 = 0x0009;
const SA32_VERIFY: u16 = 0x000a;

/// How a command fares in the presence of a persistent reservation held by another nexus
/// (the SPC-4 and SBC-3 tables of commands allowed in the presence of persistent reservations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessClass {
    /// Allowed whatever the reservation.
    Always,
    /// Allowed under the Write Exclusive types; under the Exclusive Access types only for
    /// registered nexuses of the registrants-only and all-registrants types.
    Read,
    /// Writes and everything else: only registered nexuses of the registrants-only and
    /// all-registrants types.
    Other,
}

/// Who may send a command while an SPC-2 RESERVE is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spc2Access {
    /// Only the holder's nexus.
    HolderOnly,
    /// Every nexus: the commands SPC-2 lets through, plus the MAINTENANCE IN reports that
    /// multipath path checkers send on every path.
    Anyone,
    /// No nexus, the holder's included: PERSISTENT RESERVE IN and OUT.
    Nobody,
}

/// What the reservations in force decide about one command: its row in the persistent
/// reservation tables and under SPC-2 RESERVE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationAccess {
    pub persistent: AccessClass,
    pub spc2: Spc2Access,
}

impl ReservationAccess {
    const fn new(persistent: AccessClass, spc2: Spc2Access) -> Self {
        ReservationAccess { persistent, spc2 }
    }

    /// A command that reads the medium.
    pub(crate) const READ: Self = Self::new(AccessClass::Read, Spc2Access::HolderOnly);
    /// A command that writes the medium, or changes anything else.
    pub(crate) const WRITE: Self = Self::new(AccessClass::Other, Spc2Access::HolderOnly);
    /// Allowed under any persistent reservation, but only from the SPC-2 holder.
    const ALWAYS_BUT_SPC2_HOLDER_ONLY: Self =
        Self::new(AccessClass::Always, Spc2Access::HolderOnly);
    /// Allowed under any reservation.
    const ALWAYS: Self = Self::new(AccessClass::Always, Spc2Access::Anyone);

    /// The access of `command`, parsed from `cdb`. The CDB is read only for
    /// [`Command::Unsupported`]: see [`ReservationAccess::of_unimplemented`].
    pub(crate) fn of(command: &Command, cdb: &[u8]) -> Self {
        match command {
            Command::PersistentReserveIn { .. } | Command::PersistentReserveOut(_) => {
                Self::new(AccessClass::Always, Spc2Access::Nobody)
            }
            Command::Inquiry { .. }
            | Command::RequestSense { .. }
            | Command::ReportLuns { .. }
            | Command::LogSense { .. }
            | Command::Release
            | Command::ReportTargetPortGroups { .. } => Self::ALWAYS,
            // RESERVE's own method applies SPC-4's compatible reservation handling.
            Command::Reserve
            | Command::TestUnitReady
            | Command::ReadCapacity10
            | Command::ReadCapacity16 { .. } => Self::ALWAYS_BUT_SPC2_HOLDER_ONLY,
            Command::ReportSupportedOpcodes { .. } | Command::ReportSupportedTmfs { .. } => {
                Self::new(AccessClass::Read, Spc2Access::Anyone)
            }
            Command::Read { .. }
            | Command::Verify { .. }
            | Command::PreFetch { .. }
            | Command::ReadDefectData { .. }
            | Command::ModeSense { .. }
            | Command::GetLbaStatus { .. } => Self::READ,
            Command::Write { .. }
            | Command::WriteAndVerify { .. }
            | Command::OrWrite { .. }
            | Command::WriteAtomic { .. }
            | Command::CompareAndWrite { .. }
            | Command::WriteSame { .. }
            | Command::Unmap { .. }
            | Command::SynchronizeCache { .. }
            | Command::StartStopUnit(_)
            | Command::ModeSelect { .. }
            | Command::Sanitize { .. }
            | Command::ExtendedCopy { .. }
            | Command::ReceiveCopyResults { .. }
            | Command::PopulateToken { .. }
            | Command::WriteUsingToken { .. }
            | Command::ReceiveRodTokenInformation { .. } => Self::WRITE,
            Command::Unsupported { .. } => Self::of_unimplemented(cdb),
        }
    }

    /// The access of a command this device server does not implement: the parser keeps only
    /// its opcode, but the reservation check comes before its INVALID COMMAND OPERATION CODE,
    /// so the tables' rows for such commands are looked up here, by opcode and service action.
    fn of_unimplemented(cdb: &[u8]) -> Self {
        use opcode::{MAINTENANCE_IN, SERVICE_ACTION_IN_16};
        let op = cdb.first().copied().unwrap_or(0);
        let service_action = cdb.get(1).map_or(0, |b| b & 0x1f);
        match op {
            ACCESS_CONTROL_IN | ACCESS_CONTROL_OUT => Self::ALWAYS_BUT_SPC2_HOLDER_ONLY,
            PREVENT_ALLOW_MEDIUM_REMOVAL if prevent_field(cdb) == 0 => Self::ALWAYS,
            SERVICE_ACTION_IN_12 if service_action == SA_READ_MEDIA_SERIAL_NUMBER => Self::ALWAYS,
            SERVICE_ACTION_IN_16 => match service_action {
                SA_READ_LONG_16 | SA_REPORT_REFERRALS => Self::READ,
                _ => Self::WRITE,
            },
            MAINTENANCE_IN => match service_action {
                SA_REPORT_TIMESTAMP => Self::ALWAYS,
                SA_REPORT_IDENTIFYING_INFORMATION | SA_REPORT_ALIASES | SA_REPORT_PRIORITY => {
                    Self::ALWAYS_BUT_SPC2_HOLDER_ONLY
                }
                SA_MANAGEMENT_PROTOCOL_IN => Self::READ,
                _ => Self::WRITE,
            },
            READ_LONG_10
            | XDREAD_10
            | READ_BUFFER
            | RECEIVE_DIAGNOSTIC_RESULTS
            | READ_ATTRIBUTE
            | SECURITY_PROTOCOL_IN => Self::READ,
            VARIABLE_LENGTH => {
                let sa32 = match (cdb.get(8), cdb.get(9)) {
                    (Some(&hi), Some(&lo)) => u16::from_be_bytes([hi, lo]),
                    _ => 0,
                };
                if sa32 == SA32_READ || sa32 == SA32_VERIFY {
                    Self::READ
                } else {
                    Self::WRITE
                }
            }
            _ => Self::WRITE,
        }
    }
}

fn prevent_field(cdb: &[u8]) -> u8 {
    cdb.get(4).map_or(0, |b| b & 0x03)
}
