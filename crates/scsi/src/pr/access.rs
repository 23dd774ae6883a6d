//! Which commands a reservation lets through: the SPC-4 / SBC-3 tables of commands allowed in
//! the presence of persistent reservations, and the commands SPC-2 RESERVE lets other nexuses
//! send.

use crate::cdb::opcode;

// Opcodes and service actions the access tables need that the CDB parser does not name.
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
pub(super) enum AccessClass {
    /// Allowed whatever the reservation.
    Always,
    /// Allowed under the Write Exclusive types; under the Exclusive Access types only for
    /// registered nexuses of the registrants-only and all-registrants types.
    Read,
    /// Writes and everything else: only registered nexuses of the registrants-only and
    /// all-registrants types.
    Other,
}

pub(super) fn access_class(cdb: &[u8]) -> AccessClass {
    use opcode::*;
    let op = cdb.first().copied().unwrap_or(0);
    let service_action = cdb.get(1).map_or(0, |b| b & 0x1f);
    match op {
        INQUIRY
        | REQUEST_SENSE
        | REPORT_LUNS
        | TEST_UNIT_READY
        | LOG_SENSE
        | READ_CAPACITY_10
        | PERSISTENT_RESERVE_IN
        | PERSISTENT_RESERVE_OUT
        | ACCESS_CONTROL_IN
        | ACCESS_CONTROL_OUT => AccessClass::Always,
        // Their own methods apply SPC-4's compatible reservation handling.
        RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10 => AccessClass::Always,
        PREVENT_ALLOW_MEDIUM_REMOVAL if prevent_field(cdb) == 0 => AccessClass::Always,
        SERVICE_ACTION_IN_12 if service_action == SA_READ_MEDIA_SERIAL_NUMBER => {
            AccessClass::Always
        }
        SERVICE_ACTION_IN_16 => match service_action {
            SA_READ_CAPACITY_16 => AccessClass::Always,
            SA_GET_LBA_STATUS | SA_READ_LONG_16 | SA_REPORT_REFERRALS => AccessClass::Read,
            _ => AccessClass::Other,
        },
        MAINTENANCE_IN => match service_action {
            SA_REPORT_IDENTIFYING_INFORMATION
            | SA_REPORT_TARGET_PORT_GROUPS
            | SA_REPORT_ALIASES
            | SA_REPORT_PRIORITY
            | SA_REPORT_TIMESTAMP => AccessClass::Always,
            SA_REPORT_SUPPORTED_OPCODES | SA_REPORT_SUPPORTED_TMFS | SA_MANAGEMENT_PROTOCOL_IN => {
                AccessClass::Read
            }
            _ => AccessClass::Other,
        },
        READ_6
        | READ_10
        | READ_12
        | READ_16
        | VERIFY_10
        | VERIFY_12
        | VERIFY_16
        | PRE_FETCH_10
        | PRE_FETCH_16
        | READ_DEFECT_DATA_10
        | READ_DEFECT_DATA_12
        | READ_LONG_10
        | XDREAD_10
        | MODE_SENSE_6
        | MODE_SENSE_10
        | READ_BUFFER
        | RECEIVE_DIAGNOSTIC_RESULTS
        | READ_ATTRIBUTE
        | SECURITY_PROTOCOL_IN => AccessClass::Read,
        VARIABLE_LENGTH => {
            let sa32 = match (cdb.get(8), cdb.get(9)) {
                (Some(&hi), Some(&lo)) => u16::from_be_bytes([hi, lo]),
                _ => 0,
            };
            if sa32 == SA32_READ || sa32 == SA32_VERIFY {
                AccessClass::Read
            } else {
                AccessClass::Other
            }
        }
        _ => AccessClass::Other,
    }
}

fn prevent_field(cdb: &[u8]) -> u8 {
    cdb.get(4).map_or(0, |b| b & 0x03)
}

/// Commands a nexus may send while another holds an SPC-2 reservation, plus
/// the MAINTENANCE IN reports that multipath path checkers send on every path.
pub(super) fn spc2_allows_non_holder(cdb: &[u8]) -> bool {
    use opcode::*;
    let op = cdb.first().copied().unwrap_or(0);
    let service_action = cdb.get(1).map_or(0, |b| b & 0x1f);
    match op {
        INQUIRY | REQUEST_SENSE | REPORT_LUNS | LOG_SENSE | RELEASE_6 | RELEASE_10 => true,
        PREVENT_ALLOW_MEDIUM_REMOVAL => prevent_field(cdb) == 0,
        SERVICE_ACTION_IN_12 => service_action == SA_READ_MEDIA_SERIAL_NUMBER,
        MAINTENANCE_IN => matches!(
            service_action,
            SA_REPORT_TARGET_PORT_GROUPS
                | SA_REPORT_SUPPORTED_OPCODES
                | SA_REPORT_SUPPORTED_TMFS
                | SA_REPORT_TIMESTAMP
        ),
        _ => false,
    }
}
