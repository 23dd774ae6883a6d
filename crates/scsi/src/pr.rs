//! Reservations for one logical unit: SPC-4 persistent reservations (PERSISTENT RESERVE IN /
//! OUT) and SPC-2 RESERVE / RELEASE, with SPC-4's compatible reservation handling (CRH=1)
//! between the two.
//!
//! # Model
//!
//! A *registration* holds a reservation key for a set of I_T nexuses, described by a
//! `Registrant`: an initiator (one iSCSI initiator port "name,i,0xISID", or with a format
//! 00b TransportID every port of one iSCSI initiator name) and one relative target port, or
//! every target port when registered with ALL_TG_PT=1. Registrations never overlap, so each
//! nexus has at most one. A persistent *reservation* has a type and a holder registrant; for
//! the all-registrants types every registered nexus is a holder. The scope is always LU_SCOPE.
//!
//! Every PERSISTENT RESERVE OUT runs on a copy of the state; the copy replaces the state only
//! after it is on disk (when APTPL is in force), so a failed write changes nothing.
//!
//! # APTPL file format (version 1)
//!
//! When the last REGISTER, REGISTER AND IGNORE EXISTING KEY or REGISTER AND MOVE set APTPL=1,
//! the state is written to `persist_path` after every change as JSON, atomically (temporary
//! file, fsync, rename, fsync of the directory). APTPL=0 deletes the file. Example:
//!
//! ```json
//! {
//!   "version": 1,
//!   "registrations": [
//!     { "initiator": { "port": "iqn.1998-01.com.vmware:esx1,i,0x00023d000001" },
//!       "target_port": 1, "key": 1311768467294899695 },
//!     { "initiator": { "node": "iqn.2005-03.org.open-iscsi:host2" },
//!       "target_port": null, "key": 42 }
//!   ],
//!   "reservation": { "holder": 0, "type": 5 }
//! }
//! ```
//!
//! `initiator` is `{"port": ...}` (an iSCSI initiator port) or `{"node": ...}` (every port
//! of an iSCSI initiator name); `target_port` is a relative target port identifier or `null`
//! for all target ports (ALL_TG_PT=1); `key` is the reservation key as an unsigned 64-bit
//! number; `reservation` is `null` or names its holder by index into `registrations` and its
//! SPC-4 TYPE code (1 WE, 3 EA, 5 WE-RO, 6 EA-RO, 7 WE-AR, 8 EA-AR). The PRGENERATION counter
//! is not saved: it restarts at 0 with the process, as after a power on. A file with another
//! `version`, or that fails validation, is not loaded (see [`Reservations::load_error`]).
//!
//! # Not implemented
//!
//! PREEMPT AND ABORT does not abort the preempted nexuses' commands: commands run to completion
//! on their own threads, so there is nothing queued to abort. Only the iSCSI TransportID
//! (protocol identifier 5) is accepted.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use crate::cdb::opcode;
use crate::{Nexus, Sense, SenseReason};

/// Why a reservation command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrError {
    /// End the command with RESERVATION CONFLICT status.
    Conflict,
    /// End the command with CHECK CONDITION and this sense.
    Sense(Sense),
}

impl From<SenseReason> for PrError {
    fn from(reason: SenseReason) -> Self {
        PrError::Sense(reason.into())
    }
}

/// A unit attention a PERSISTENT RESERVE OUT establishes for another initiator port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingUa {
    /// The SCSI initiator port ("name,i,0xISID"). For a registration made through a format
    /// 00b TransportID (name only) this is the bare iSCSI name: every port of that initiator.
    pub initiator_port: String,
    pub reason: SenseReason,
}

/// Most registrations one LU keeps; more get INSUFFICIENT REGISTRATION RESOURCES. Bounds the
/// memory and the APTPL file an initiator can make us hold.
pub const MAX_REGISTRATIONS: usize = 1024;

/// Version of the APTPL file format written by this code.
const APTPL_FILE_VERSION: u32 = 1;

/// Longest iSCSI name (RFC 7143).
const MAX_ISCSI_NAME_LEN: usize = 223;

/// TransportID protocol identifier for iSCSI (SPC-4).
const PROTOCOL_ID_ISCSI: u8 = 0x5;

/// Separator between the iSCSI name and the ISID in an iSCSI initiator port name.
const ISID_SEPARATOR: &str = ",i,0x";

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

/// PERSISTENT RESERVE IN service actions.
const PRIN_READ_KEYS: u8 = 0x00;
const PRIN_READ_RESERVATION: u8 = 0x01;
const PRIN_REPORT_CAPABILITIES: u8 = 0x02;
const PRIN_READ_FULL_STATUS: u8 = 0x03;

/// PERSISTENT RESERVE OUT service actions.
const PROUT_REGISTER: u8 = 0x00;
const PROUT_RESERVE: u8 = 0x01;
const PROUT_RELEASE: u8 = 0x02;
const PROUT_CLEAR: u8 = 0x03;
const PROUT_PREEMPT: u8 = 0x04;
const PROUT_PREEMPT_AND_ABORT: u8 = 0x05;
const PROUT_REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
const PROUT_REGISTER_AND_MOVE: u8 = 0x07;

/// LU_SCOPE, the only scope SPC-4 still defines.
const SCOPE_LU: u8 = 0x0;

/// Length of the basic PERSISTENT RESERVE OUT parameter list (and of the REGISTER AND MOVE
/// header before its TransportID).
const BASIC_PARAMETER_LIST_LEN: usize = 24;

/// Persistent reservation types (SPC-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrType {
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    fn code(self) -> u8 {
        match self {
            PrType::WriteExclusive => 1,
            PrType::ExclusiveAccess => 3,
            PrType::WriteExclusiveRegistrantsOnly => 5,
            PrType::ExclusiveAccessRegistrantsOnly => 6,
            PrType::WriteExclusiveAllRegistrants => 7,
            PrType::ExclusiveAccessAllRegistrants => 8,
        }
    }

    /// Every registered nexus is a reservation holder.
    fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registered nexuses that are not the holder still get full access.
    fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        )
    }

    /// Registered non-holders have full access (registrants-only and all-registrants types).
    fn admits_registrants(self) -> bool {
        self.registrants_only() || self.all_registrants()
    }

    /// Reads are restricted too, not only writes.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// The initiator side of the nexuses a registration covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Initiator {
    /// One SCSI initiator port, "name,i,0xISID" (TransportID format 01b, or the nexus itself).
    Port(String),
    /// Every port of one iSCSI initiator name (TransportID format 00b).
    Node(String),
}

impl Initiator {
    /// iSCSI names are case-insensitive (RFC 3722 folds them to lower case) and the ISID is
    /// hex, so all comparisons ignore ASCII case.
    fn matches(&self, nexus: &Nexus) -> bool {
        match self {
            Initiator::Port(port) => port.eq_ignore_ascii_case(&nexus.initiator_port),
            Initiator::Node(name) => name.eq_ignore_ascii_case(&nexus.initiator_name),
        }
    }

    /// The iSCSI name part.
    fn name(&self) -> &str {
        match self {
            Initiator::Port(port) => match find_ignore_ascii_case(port, ISID_SEPARATOR) {
                Some(at) => &port[..at],
                None => port,
            },
            Initiator::Node(name) => name,
        }
    }

    /// Every port `other` names is also named by `self`.
    fn covers(&self, other: &Initiator) -> bool {
        match (self, other) {
            (Initiator::Port(a), Initiator::Port(b)) => a.eq_ignore_ascii_case(b),
            (Initiator::Node(a), _) => a.eq_ignore_ascii_case(other.name()),
            (Initiator::Port(_), Initiator::Node(_)) => false,
        }
    }

    fn overlaps(&self, other: &Initiator) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// Where unit attentions for this initiator go (see [`PendingUa::initiator_port`]).
    fn ua_port(&self) -> &str {
        match self {
            Initiator::Port(port) => port,
            Initiator::Node(name) => name,
        }
    }
}

fn find_ignore_ascii_case(haystack: &str, needle: &str) -> Option<usize> {
    // ASCII lower-casing keeps byte offsets, so the offset is valid in `haystack`.
    haystack
        .to_ascii_lowercase()
        .find(&needle.to_ascii_lowercase())
}

/// The I_T nexuses one registration covers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registrant {
    initiator: Initiator,
    /// Relative target port identifier; `None` for every target port (ALL_TG_PT=1).
    target_port: Option<u16>,
}

impl Registrant {
    fn of(nexus: &Nexus, all_target_ports: bool) -> Self {
        Registrant {
            initiator: Initiator::Port(nexus.initiator_port.clone()),
            target_port: (!all_target_ports).then_some(nexus.relative_target_port),
        }
    }

    fn matches(&self, nexus: &Nexus) -> bool {
        self.initiator.matches(nexus)
            && self
                .target_port
                .is_none_or(|port| port == nexus.relative_target_port)
    }

    fn covers(&self, other: &Registrant) -> bool {
        self.initiator.covers(&other.initiator)
            && match (self.target_port, other.target_port) {
                (None, _) => true,
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
            }
    }

    fn overlaps(&self, other: &Registrant) -> bool {
        self.covers(other) || other.covers(self) || {
            // Partial overlap: e.g. a node on port 1 and one of its ports on all ports.
            self.initiator.overlaps(&other.initiator)
                && match (self.target_port, other.target_port) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    registrant: Registrant,
    key: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    pr_type: PrType,
    /// The registrant that holds it; for the all-registrants types any registrant (kept only
    /// so the invariant "the holder is registered" holds for every type).
    holder: Registrant,
}

/// Persistent reservation state. Invariants: registrations do not overlap, keys are
/// non-zero, and a reservation's holder is one of the registrants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PrState {
    registrations: Vec<Registration>,
    reservation: Option<Reservation>,
    /// Activate persist through power loss: the APTPL bit of the last REGISTER, REGISTER AND
    /// IGNORE EXISTING KEY or REGISTER AND MOVE.
    aptpl: bool,
    /// PRGENERATION: counts the PERSISTENT RESERVE OUT commands that changed registrations.
    generation: u32,
}

#[derive(Debug, Default)]
struct State {
    persistent: PrState,
    /// Holder of an SPC-2 RESERVE(6)/(10) reservation: (initiator port, relative target port).
    reserved_by: Option<(String, u16)>,
}

/// SPC-4 persistent reservations and SPC-2 reservations of one logical unit.
pub struct Reservations {
    persist_path: Option<PathBuf>,
    state: RwLock<State>,
    /// Whether any reservation (SPC-2 or persistent) exists, so that `check_access` on the I/O
    /// path skips the lock while nothing restricts access. Written under the write lock.
    restricted: AtomicBool,
    load_error: Option<String>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("persist_path", &self.persist_path)
            .field("state", &*self.read())
            .finish()
    }
}

impl Reservations {
    /// Reservations for one LU. With `persist_path`, APTPL is supported and state saved
    /// there by an earlier APTPL=1 is loaded (a file that cannot be loaded is left alone and
    /// reported by [`Reservations::load_error`]; the LU then starts without reservations).
    pub fn new(persist_path: Option<PathBuf>) -> Self {
        let (persistent, load_error) = match persist_path.as_deref().map(load_aptpl_file) {
            Some(Ok(Some(state))) => (state, None),
            Some(Err(error)) => (PrState::default(), Some(error)),
            Some(Ok(None)) | None => (PrState::default(), None),
        };
        let restricted = persistent.reservation.is_some();
        Reservations {
            persist_path,
            state: RwLock::new(State {
                persistent,
                reserved_by: None,
            }),
            restricted: AtomicBool::new(restricted),
            load_error,
        }
    }

    /// Why the APTPL file given to [`Reservations::new`] could not be loaded, if it could not.
    pub fn load_error(&self) -> Option<&str> {
        self.load_error.as_deref()
    }

    /// The current PRGENERATION.
    pub fn generation(&self) -> u32 {
        self.read().persistent.generation
    }

    /// Whether `nexus` may run `cdb` given the reservations in force. `Err(())` means the
    /// command ends with RESERVATION CONFLICT. RESERVE, RELEASE and PERSISTENT RESERVE OUT
    /// pass here as far as persistent reservations go: their own methods decide.
    #[allow(clippy::result_unit_err)] // The API agreed with the LU: the only error is a conflict.
    pub fn check_access(&self, nexus: &Nexus, cdb: &[u8]) -> Result<(), ()> {
        if !self.restricted.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(&op) = cdb.first() else {
            return Ok(()); // Not a command; the parser rejects it.
        };
        let state = self.read();
        if let Some(holder) = &state.reserved_by {
            // SPC-2: while RESERVE is in force every PERSISTENT RESERVE command
            // conflicts, whoever sends it.
            if op == opcode::PERSISTENT_RESERVE_IN || op == opcode::PERSISTENT_RESERVE_OUT {
                return Err(());
            }
            if is_same_nexus(holder, nexus) || spc2_allows_non_holder(cdb) {
                return Ok(());
            }
            return Err(());
        }
        let pr = &state.persistent;
        let Some(reservation) = &pr.reservation else {
            return Ok(());
        };
        if pr.is_holder(nexus) {
            return Ok(());
        }
        let registered = pr.registration_of(nexus).is_some();
        let pr_type = reservation.pr_type;
        let allowed = match access_class(cdb) {
            AccessClass::Always => true,
            AccessClass::Read => {
                !pr_type.exclusive_access() || (registered && pr_type.admits_registrants())
            }
            AccessClass::Other => registered && pr_type.admits_registrants(),
        };
        if allowed {
            Ok(())
        } else {
            Err(())
        }
    }

    /// PERSISTENT RESERVE IN: the complete parameter data (the caller truncates it to the
    /// ALLOCATION LENGTH).
    pub fn persistent_reserve_in(&self, _nexus: &Nexus, cdb: &[u8]) -> Result<Vec<u8>, PrError> {
        let service_action = cdb.get(1).map_or(0, |b| b & 0x1f);
        let state = self.read();
        if state.reserved_by.is_some() {
            return Err(PrError::Conflict);
        }
        let pr = &state.persistent;
        match service_action {
            PRIN_READ_KEYS => Ok(pr.read_keys()),
            PRIN_READ_RESERVATION => Ok(pr.read_reservation()),
            PRIN_REPORT_CAPABILITIES => Ok(pr.report_capabilities(self.persist_path.is_some())),
            PRIN_READ_FULL_STATUS => Ok(pr.read_full_status()),
            _ => Err(PrError::Sense(
                Sense::from(SenseReason::InvalidFieldInCdb).with_field_pointer(true, 1, Some(4)),
            )),
        }
    }

    /// PERSISTENT RESERVE OUT with its parameter list (exactly PARAMETER LIST LENGTH bytes).
    /// Returns the unit attentions to establish for other initiator ports.
    pub fn persistent_reserve_out(
        &self,
        nexus: &Nexus,
        cdb: &[u8],
        params: &[u8],
    ) -> Result<Vec<PendingUa>, PrError> {
        let request = ProutRequest::parse(cdb, params, self.persist_path.is_some())?;
        self.update(|state| {
            if state.reserved_by.is_some() {
                return Err(PrError::Conflict);
            }
            let mut next = state.persistent.clone();
            let unit_attentions = next.apply(nexus, &request)?;
            if let Some(path) = &self.persist_path {
                if next.aptpl && next != state.persistent {
                    write_atomically(path, &next.to_aptpl_file()?)
                        .map_err(|_| PrError::from(SenseReason::InternalTargetFailure))?;
                } else if !next.aptpl && state.persistent.aptpl {
                    remove_durably(path)
                        .map_err(|_| PrError::from(SenseReason::InternalTargetFailure))?;
                }
            }
            state.persistent = next;
            Ok(unit_attentions)
        })
    }

    /// RESERVE(6) / RESERVE(10) (SPC-2), with SPC-4's exception to it: while any persistent
    /// registration exists, RESERVE conflicts.
    pub fn reserve(&self, nexus: &Nexus) -> Result<(), PrError> {
        self.update(|state| {
            if !state.persistent.registrations.is_empty() {
                return Err(PrError::Conflict);
            }
            match &state.reserved_by {
                Some(holder) if !is_same_nexus(holder, nexus) => Err(PrError::Conflict),
                _ => {
                    state.reserved_by =
                        Some((nexus.initiator_port.clone(), nexus.relative_target_port));
                    Ok(())
                }
            }
        })
    }

    /// RELEASE(6) / RELEASE(10) (SPC-2): releases the nexus's own reservation; from another
    /// nexus it does nothing and succeeds. While persistent registrations exist it succeeds
    /// (without effect) only for a persistent reservation holder, or a registrant under a
    /// registrants-only or all-registrants reservation, and conflicts otherwise (SPC-4).
    pub fn release(&self, nexus: &Nexus) -> Result<(), PrError> {
        self.update(|state| {
            let pr = &state.persistent;
            if !pr.registrations.is_empty() {
                let registrant_admitted = pr.registration_of(nexus).is_some()
                    && pr
                        .reservation
                        .as_ref()
                        .is_some_and(|r| r.pr_type.admits_registrants());
                return if pr.is_holder(nexus) || registrant_admitted {
                    Ok(())
                } else {
                    Err(PrError::Conflict)
                };
            }
            if state
                .reserved_by
                .as_ref()
                .is_some_and(|holder| is_same_nexus(holder, nexus))
            {
                state.reserved_by = None;
            }
            Ok(())
        })
    }

    /// Logical unit reset: SPC-2 reservations end; persistent ones survive.
    pub fn reset(&self) {
        self.update(|state| state.reserved_by = None);
    }

    /// The nexus is gone: its SPC-2 reservation ends. Registrations survive (SPC-4).
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.update(|state| {
            if state
                .reserved_by
                .as_ref()
                .is_some_and(|holder| is_same_nexus(holder, nexus))
            {
                state.reserved_by = None;
            }
        });
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // Updates replace the state only once complete, so a poisoned lock holds a
        // consistent state.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `change` under the write lock and keeps the `restricted` flag in step.
    fn update<R>(&self, change: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.write();
        let result = change(&mut state);
        let restricted = state.reserved_by.is_some() || state.persistent.reservation.is_some();
        self.restricted.store(restricted, Ordering::Release);
        result
    }
}

fn is_same_nexus(holder: &(String, u16), nexus: &Nexus) -> bool {
    holder.0 == nexus.initiator_port && holder.1 == nexus.relative_target_port
}

/// How a command fares in the presence of a persistent reservation held by another nexus
/// (the SPC-4 and SBC-3 tables of commands allowed in the presence of persistent reservations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessClass {
    /// Allowed whatever the reservation.
    Always,
    /// Allowed under the Write Exclusive types; under the Exclusive Access types only for
    /// registered nexuses of the registrants-only and all-registrants types.
    Read,
    /// Writes and everything else: only registered nexuses of the registrants-only and
    /// all-registrants types.
    Other,
}

fn access_class(cdb: &[u8]) -> AccessClass {
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
fn spc2_allows_non_holder(cdb: &[u8]) -> bool {
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

/// A validated PERSISTENT RESERVE OUT.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProutRequest {
    /// RESERVATION KEY: the key the sending nexus is registered with.
    key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    service_action_key: u64,
    action: ProutAction,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ProutAction {
    Register {
        ignore_existing_key: bool,
        /// SPEC_I_PT=1: further initiators to register along with the sender.
        also_register: Option<Vec<Initiator>>,
        all_target_ports: bool,
        aptpl: bool,
    },
    Reserve(PrType),
    Release {
        scope: u8,
        type_code: u8,
    },
    Clear,
    Preempt(PrType),
    RegisterAndMove {
        destination: Initiator,
        target_port: u16,
        unregister: bool,
        aptpl: bool,
    },
}

fn invalid_cdb_field(byte: u16, bit: u8) -> PrError {
    PrError::Sense(Sense::invalid_cdb(byte, Some(bit)))
}

fn invalid_parameter(byte: usize) -> PrError {
    PrError::Sense(Sense::invalid_param(byte, None))
}

fn parameter_list_length_error() -> PrError {
    SenseReason::ParameterListLengthError.into()
}

fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let field = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_be_bytes(field.try_into().ok()?))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(field.try_into().ok()?))
}

impl ProutRequest {
    /// Validates the CDB and parameter list (SPC-4). `persist_capable`: APTPL=1 can be
    /// honoured.
    fn parse(cdb: &[u8], params: &[u8], persist_capable: bool) -> Result<Self, PrError> {
        let service_action = cdb.get(1).ok_or_else(|| invalid_cdb_field(1, 4))? & 0x1f;
        let scope_type = cdb.get(2).copied().unwrap_or(0);
        let (scope, type_code) = (scope_type >> 4, scope_type & 0x0f);
        if service_action > PROUT_REGISTER_AND_MOVE {
            return Err(invalid_cdb_field(1, 4));
        }
        if params.len() < BASIC_PARAMETER_LIST_LEN {
            return Err(parameter_list_length_error());
        }
        let key = be_u64(params, 0).ok_or_else(parameter_list_length_error)?;
        let service_action_key = be_u64(params, 8).ok_or_else(parameter_list_length_error)?;

        if service_action == PROUT_REGISTER_AND_MOVE {
            let action = parse_register_and_move(params, persist_capable)?;
            return Ok(ProutRequest {
                key,
                service_action_key,
                action,
            });
        }

        let flags = params.get(20).copied().unwrap_or(0);
        let spec_i_pt = flags & 0x08 != 0;
        let all_target_ports = flags & 0x04 != 0;
        let aptpl = flags & 0x01 != 0;
        let is_register = service_action == PROUT_REGISTER;
        if spec_i_pt && !is_register {
            // SPEC_I_PT is defined for REGISTER only (SPC-4).
            return Err(invalid_parameter(20));
        }
        if spec_i_pt {
            // A TRANSPORTID PARAMETER DATA LENGTH and the TransportIDs follow.
            let ids_len = be_u32(params, 24).ok_or_else(parameter_list_length_error)?;
            let expected = usize::try_from(ids_len)
                .ok()
                .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN + 4));
            if expected != Some(params.len()) {
                return Err(parameter_list_length_error());
            }
        } else if params.len() != BASIC_PARAMETER_LIST_LEN {
            return Err(parameter_list_length_error());
        }

        let valid_type = || PrType::from_code(type_code).ok_or_else(|| invalid_cdb_field(2, 3));
        let valid_scope = || {
            if scope == SCOPE_LU {
                Ok(())
            } else {
                Err(invalid_cdb_field(2, 7))
            }
        };
        let action = match service_action {
            PROUT_REGISTER | PROUT_REGISTER_AND_IGNORE_EXISTING_KEY => {
                if aptpl && !persist_capable {
                    return Err(invalid_parameter(20));
                }
                let also_register = if spec_i_pt {
                    let ids = params.get(BASIC_PARAMETER_LIST_LEN + 4..).unwrap_or(&[]);
                    Some(parse_transport_ids(ids, BASIC_PARAMETER_LIST_LEN + 4)?)
                } else {
                    None
                };
                ProutAction::Register {
                    ignore_existing_key: !is_register,
                    also_register,
                    all_target_ports,
                    aptpl,
                }
            }
            PROUT_RESERVE => {
                valid_scope()?;
                ProutAction::Reserve(valid_type()?)
            }
            PROUT_RELEASE => ProutAction::Release { scope, type_code },
            PROUT_CLEAR => ProutAction::Clear,
            PROUT_PREEMPT | PROUT_PREEMPT_AND_ABORT => {
                valid_scope()?;
                ProutAction::Preempt(valid_type()?)
            }
            _ => return Err(invalid_cdb_field(1, 4)),
        };
        Ok(ProutRequest {
            key,
            service_action_key,
            action,
        })
    }
}

/// The REGISTER AND MOVE parameter list (SPC-4): the basic header with UNREG, APTPL
/// and RELATIVE TARGET PORT IDENTIFIER, then exactly one TransportID.
fn parse_register_and_move(params: &[u8], persist_capable: bool) -> Result<ProutAction, PrError> {
    let flags = params.get(17).copied().unwrap_or(0);
    let unregister = flags & 0x02 != 0;
    let aptpl = flags & 0x01 != 0;
    let target_port = match params.get(18..20) {
        Some(&[hi, lo]) => u16::from_be_bytes([hi, lo]),
        _ => return Err(parameter_list_length_error()),
    };
    let ids_len = be_u32(params, 20).ok_or_else(parameter_list_length_error)?;
    let expected = usize::try_from(ids_len)
        .ok()
        .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN));
    if expected != Some(params.len()) {
        return Err(parameter_list_length_error());
    }
    if aptpl && !persist_capable {
        return Err(invalid_parameter(17));
    }
    if target_port == 0 {
        // Relative target port identifier 0 is reserved (SPC-4).
        return Err(invalid_parameter(18));
    }
    let ids = params.get(BASIC_PARAMETER_LIST_LEN..).unwrap_or(&[]);
    let (destination, used) = parse_transport_id(ids, BASIC_PARAMETER_LIST_LEN)?;
    if used != ids.len() {
        return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN + used));
    }
    // The destination is an I_T nexus: a name without ISID names no single port.
    if !matches!(destination, Initiator::Port(_)) {
        return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN));
    }
    Ok(ProutAction::RegisterAndMove {
        destination,
        target_port,
        unregister,
        aptpl,
    })
}

/// iSCSI TransportIDs packed back to back; `base` is their offset in the parameter list
/// (for the sense field pointer).
fn parse_transport_ids(mut bytes: &[u8], base: usize) -> Result<Vec<Initiator>, PrError> {
    let mut ids = Vec::new();
    let mut offset = base;
    while !bytes.is_empty() {
        if ids.len() >= MAX_REGISTRATIONS {
            return Err(SenseReason::InsufficientRegistrationResources.into());
        }
        let (id, used) = parse_transport_id(bytes, offset)?;
        ids.push(id);
        bytes = bytes.get(used..).unwrap_or(&[]);
        offset = offset.saturating_add(used);
    }
    Ok(ids)
}

/// One iSCSI TransportID (SPC-4): returns it and its length in bytes.
fn parse_transport_id(bytes: &[u8], offset: usize) -> Result<(Initiator, usize), PrError> {
    let &[format_protocol, _, len_hi, len_lo, ..] = bytes else {
        return Err(invalid_parameter(offset));
    };
    if format_protocol & 0x0f != PROTOCOL_ID_ISCSI {
        return Err(invalid_parameter(offset));
    }
    let additional_len = usize::from(u16::from_be_bytes([len_hi, len_lo]));
    if additional_len == 0 || additional_len % 4 != 0 {
        return Err(invalid_parameter(offset.saturating_add(2)));
    }
    let total = additional_len + 4;
    let body = bytes
        .get(4..total)
        .ok_or_else(|| invalid_parameter(offset.saturating_add(2)))?;
    let name_field = offset.saturating_add(4);
    // The text is NUL-terminated and NUL-padded.
    let text_len = body
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| invalid_parameter(name_field))?;
    let text = std::str::from_utf8(&body[..text_len]).map_err(|_| invalid_parameter(name_field))?;
    let initiator = match format_protocol >> 6 {
        0b00 => {
            validate_iscsi_name(text).ok_or_else(|| invalid_parameter(name_field))?;
            Initiator::Node(text.to_string())
        }
        0b01 => {
            let at = find_ignore_ascii_case(text, ISID_SEPARATOR)
                .ok_or_else(|| invalid_parameter(name_field))?;
            let name = &text[..at];
            let isid = &text[at + ISID_SEPARATOR.len()..];
            validate_iscsi_name(name).ok_or_else(|| invalid_parameter(name_field))?;
            if isid.is_empty() || isid.len() > 12 || !isid.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid_parameter(name_field));
            }
            // The form the iSCSI layer builds nexus names in: 12 lower-case hex digits.
            let isid = format!("{:0>12}", isid.to_ascii_lowercase());
            Initiator::Port(format!("{name}{ISID_SEPARATOR}{isid}"))
        }
        _ => return Err(invalid_parameter(offset)),
    };
    Ok((initiator, total))
}

fn validate_iscsi_name(name: &str) -> Option<()> {
    let plausible = !name.is_empty()
        && name.len() <= MAX_ISCSI_NAME_LEN
        && !name.contains(',')
        && name.bytes().all(|b| b.is_ascii_graphic());
    plausible.then_some(())
}

/// Encodes a TransportID for READ FULL STATUS: format 01b for a port, 00b for a node.
fn encode_transport_id(initiator: &Initiator) -> Vec<u8> {
    let (format, text) = match initiator {
        Initiator::Port(port) => (0b01u8, port.as_bytes()),
        Initiator::Node(name) => (0b00u8, name.as_bytes()),
    };
    // Names come from login or from TransportIDs we parsed (both bounded), but never let a
    // long one overflow the 16-bit length.
    let text = text.get(..text.len().min(0xfff0)).unwrap_or(text);
    // NUL-terminated, padded to a multiple of 4, at least 20 bytes (SPC-4).
    let padded_len = (text.len() + 1).next_multiple_of(4).max(20);
    let mut id = Vec::with_capacity(4 + padded_len);
    id.push(format << 6 | PROTOCOL_ID_ISCSI);
    id.push(0);
    id.extend_from_slice(&u16::try_from(padded_len).unwrap_or(u16::MAX).to_be_bytes());
    id.extend_from_slice(text);
    id.resize(4 + padded_len, 0);
    id
}

/// Prefixes parameter data with PRGENERATION and ADDITIONAL LENGTH.
fn with_header(generation: u32, body: Vec<u8>) -> Vec<u8> {
    let mut data = Vec::with_capacity(8 + body.len());
    data.extend_from_slice(&generation.to_be_bytes());
    data.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    data.extend_from_slice(&body);
    data
}

impl PrState {
    fn registration_of(&self, nexus: &Nexus) -> Option<usize> {
        self.registrations
            .iter()
            .position(|r| r.registrant.matches(nexus))
    }

    fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            None => false,
            Some(r) if r.pr_type.all_registrants() => self.registration_of(nexus).is_some(),
            Some(r) => r.holder.matches(nexus),
        }
    }

    fn holder_key(&self) -> Option<u64> {
        let holder = &self.reservation.as_ref()?.holder;
        self.registrations
            .iter()
            .find(|r| r.registrant == *holder)
            .map(|r| r.key)
    }

    // ---- PERSISTENT RESERVE IN ----

    fn read_keys(&self) -> Vec<u8> {
        let keys = self
            .registrations
            .iter()
            .flat_map(|r| r.key.to_be_bytes())
            .collect();
        with_header(self.generation, keys)
    }

    fn read_reservation(&self) -> Vec<u8> {
        let mut body = Vec::new();
        if let Some(reservation) = &self.reservation {
            // All-registrants reservations have no single key: report 0 (SPC-4).
            let key = if reservation.pr_type.all_registrants() {
                0
            } else {
                self.holder_key().unwrap_or(0)
            };
            body.extend_from_slice(&key.to_be_bytes());
            body.extend_from_slice(&[0; 4]); // obsolete
            body.push(0);
            body.push(SCOPE_LU << 4 | reservation.pr_type.code());
            body.extend_from_slice(&[0; 2]); // obsolete
        }
        with_header(self.generation, body)
    }

    fn report_capabilities(&self, persist_capable: bool) -> Vec<u8> {
        const CRH: u8 = 0x10; // compatible reservation handling (SPC-4)
        const SIP_C: u8 = 0x08; // SPEC_I_PT supported
        const ATP_C: u8 = 0x04; // ALL_TG_PT supported
        const PTPL_C: u8 = 0x01; // APTPL supported
        const TMV: u8 = 0x80; // type mask valid
                              // ALLOW COMMANDS 001b: TEST UNIT READY is allowed under WE and EA reservations.
        const ALLOW_COMMANDS_TUR: u8 = 0b001 << 4;
        const PTPL_A: u8 = 0x01; // APTPL active
        let mut data = vec![0u8; 8];
        data[1] = 8; // LENGTH
        data[2] = CRH | SIP_C | ATP_C | if persist_capable { PTPL_C } else { 0 };
        data[3] = TMV | ALLOW_COMMANDS_TUR | if self.aptpl { PTPL_A } else { 0 };
        // PERSISTENT RESERVATION TYPE MASK: every type.
        data[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02; // WR_EX_AR EX_AC_RO WR_EX_RO EX_AC WR_EX
        data[5] = 0x01; // EX_AC_AR
        data
    }

    fn read_full_status(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for registration in &self.registrations {
            let holder = self
                .reservation
                .as_ref()
                .filter(|r| r.pr_type.all_registrants() || r.holder == registration.registrant);
            let transport_id = encode_transport_id(&registration.registrant.initiator);
            body.extend_from_slice(&registration.key.to_be_bytes());
            body.extend_from_slice(&[0; 4]);
            let all_tg_pt = registration.registrant.target_port.is_none();
            body.push(u8::from(all_tg_pt) << 1 | u8::from(holder.is_some()));
            body.push(holder.map_or(0, |r| SCOPE_LU << 4 | r.pr_type.code()));
            body.extend_from_slice(&[0; 4]);
            // RELATIVE TARGET PORT IDENTIFIER: not meaningful with ALL_TG_PT.
            let target_port = registration.registrant.target_port.unwrap_or(0);
            body.extend_from_slice(&target_port.to_be_bytes());
            let id_len = u32::try_from(transport_id.len()).unwrap_or(u32::MAX);
            body.extend_from_slice(&id_len.to_be_bytes());
            body.extend_from_slice(&transport_id);
        }
        with_header(self.generation, body)
    }

    // ---- PERSISTENT RESERVE OUT ----

    fn apply(&mut self, nexus: &Nexus, request: &ProutRequest) -> Result<Vec<PendingUa>, PrError> {
        // Every service action but the registering ones needs the sender registered under
        // the key it names.
        let sender = match self.registration_of(nexus) {
            Some(index) if self.registrations[index].key == request.key => {
                Ok(self.registrations[index].registrant.clone())
            }
            _ => Err(PrError::Conflict),
        };
        match &request.action {
            ProutAction::Register {
                ignore_existing_key,
                also_register,
                all_target_ports,
                aptpl,
            } => self.register(
                nexus,
                request,
                *ignore_existing_key,
                also_register.as_deref(),
                *all_target_ports,
                *aptpl,
            ),
            ProutAction::Reserve(pr_type) => self.reserve(nexus, sender?, *pr_type),
            ProutAction::Release { scope, type_code } => {
                sender?;
                self.release(nexus, *scope, *type_code)
            }
            ProutAction::Clear => {
                sender?;
                let unit_attentions =
                    self.unit_attentions(nexus, SenseReason::ReservationsPreempted, |_| true);
                self.registrations.clear();
                self.reservation = None;
                self.bump_generation();
                Ok(unit_attentions)
            }
            ProutAction::Preempt(pr_type) => {
                let unit_attentions =
                    self.preempt(nexus, sender?, request.service_action_key, *pr_type)?;
                self.bump_generation();
                Ok(unit_attentions)
            }
            ProutAction::RegisterAndMove {
                destination,
                target_port,
                unregister,
                aptpl,
            } => {
                let destination = Registrant {
                    initiator: destination.clone(),
                    target_port: Some(*target_port),
                };
                self.register_and_move(
                    nexus,
                    sender?,
                    destination,
                    request.service_action_key,
                    *unregister,
                )?;
                self.aptpl = *aptpl;
                self.bump_generation();
                Ok(Vec::new())
            }
        }
    }

    fn bump_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// REGISTER and REGISTER AND IGNORE EXISTING KEY (SPC-4).
    fn register(
        &mut self,
        nexus: &Nexus,
        request: &ProutRequest,
        ignore_existing_key: bool,
        also_register: Option<&[Initiator]>,
        all_target_ports: bool,
        aptpl: bool,
    ) -> Result<Vec<PendingUa>, PrError> {
        let new_key = request.service_action_key;
        let Some(own) = self.registration_of(nexus) else {
            if !ignore_existing_key && request.key != 0 {
                return Err(PrError::Conflict);
            }
            if new_key == 0 {
                return Ok(Vec::new()); // Unregistering an unregistered nexus: nothing to do.
            }
            let mut registrants = vec![Registrant::of(nexus, all_target_ports)];
            for initiator in also_register.unwrap_or(&[]) {
                let registrant = Registrant {
                    initiator: initiator.clone(),
                    target_port: (!all_target_ports).then_some(nexus.relative_target_port),
                };
                // Naming the sender or one initiator twice is harmless; any other overlap
                // (or an initiator already registered) fails the whole command.
                if registrants.contains(&registrant) {
                    continue;
                }
                if registrants.iter().any(|r| r.overlaps(&registrant)) {
                    return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN + 4));
                }
                registrants.push(registrant);
            }
            let clash = registrants.iter().any(|new| {
                self.registrations
                    .iter()
                    .any(|old| old.registrant.overlaps(new))
            });
            if clash {
                return Err(if also_register.is_some() {
                    invalid_parameter(BASIC_PARAMETER_LIST_LEN + 4)
                } else {
                    invalid_parameter(20) // ALL_TG_PT over another port's registration
                });
            }
            if self.registrations.len() + registrants.len() > MAX_REGISTRATIONS {
                return Err(SenseReason::InsufficientRegistrationResources.into());
            }
            self.registrations
                .extend(registrants.into_iter().map(|registrant| Registration {
                    registrant,
                    key: new_key,
                }));
            self.aptpl = aptpl;
            self.bump_generation();
            return Ok(Vec::new());
        };
        if !ignore_existing_key && request.key != self.registrations[own].key {
            return Err(PrError::Conflict);
        }
        if also_register.is_some() {
            // SPEC_I_PT from a registered nexus (SPC-4).
            return Err(invalid_parameter(20));
        }
        let unit_attentions = if new_key == 0 {
            self.unregister(nexus, own)
        } else {
            self.registrations[own].key = new_key;
            Vec::new()
        };
        self.aptpl = aptpl;
        self.bump_generation();
        Ok(unit_attentions)
    }

    /// Removes one registration (SPC-4): a holder's reservation goes with it,
    /// and if it was a registrants-only one the other registrants learn RESERVATIONS
    /// RELEASED.
    fn unregister(&mut self, nexus: &Nexus, index: usize) -> Vec<PendingUa> {
        let pr_type = self.reservation.as_ref().map(|r| r.pr_type);
        self.remove_registrations(|i, _| i == index);
        let released = pr_type.is_some() && self.reservation.is_none();
        match pr_type {
            Some(pr_type) if released && pr_type.registrants_only() => {
                self.unit_attentions(nexus, SenseReason::ReservationsReleased, |_| true)
            }
            _ => Vec::new(),
        }
    }

    /// Removes the registrations `remove` selects (by index) and keeps the reservation
    /// consistent: it ends with its holder (or, for the all-registrants types, with the last
    /// registrant). Returns the removed registrations.
    fn remove_registrations(
        &mut self,
        mut remove: impl FnMut(usize, &Registration) -> bool,
    ) -> Vec<Registration> {
        let mut removed = Vec::new();
        let mut kept = Vec::with_capacity(self.registrations.len());
        for (index, registration) in std::mem::take(&mut self.registrations)
            .into_iter()
            .enumerate()
        {
            if remove(index, &registration) {
                removed.push(registration);
            } else {
                kept.push(registration);
            }
        }
        self.registrations = kept;
        if let Some(reservation) = &mut self.reservation {
            let holder_left = !self
                .registrations
                .iter()
                .any(|r| r.registrant == reservation.holder);
            if holder_left {
                match self.registrations.first() {
                    Some(next) if reservation.pr_type.all_registrants() => {
                        reservation.holder = next.registrant.clone();
                    }
                    _ => self.reservation = None,
                }
            }
        }
        removed
    }

    /// Unit attentions for the initiator ports of the registrations `select` picks, except
    /// the sender's own port (the LU queues per port, so it could not tell the sender's
    /// nexus apart from another nexus of the same port).
    fn unit_attentions(
        &self,
        sender: &Nexus,
        reason: SenseReason,
        select: impl Fn(&Registration) -> bool,
    ) -> Vec<PendingUa> {
        let registrations: Vec<&Registration> =
            self.registrations.iter().filter(|r| select(r)).collect();
        unit_attentions_for(sender, reason, registrations)
    }

    fn reserve(
        &mut self,
        nexus: &Nexus,
        own_registrant: Registrant,
        pr_type: PrType,
    ) -> Result<Vec<PendingUa>, PrError> {
        match &self.reservation {
            // Reserving again what one holds is a no-op; anything else conflicts.
            Some(existing) if existing.pr_type == pr_type && self.is_holder(nexus) => {}
            Some(_) => return Err(PrError::Conflict),
            None => {
                self.reservation = Some(Reservation {
                    pr_type,
                    holder: own_registrant,
                })
            }
        }
        Ok(Vec::new())
    }

    /// RELEASE (SPC-4): only the holder releases, and only with the reservation's
    /// own scope and type; from a registered non-holder it succeeds without effect.
    fn release(
        &mut self,
        nexus: &Nexus,
        scope: u8,
        type_code: u8,
    ) -> Result<Vec<PendingUa>, PrError> {
        let Some(reservation) = &self.reservation else {
            return Ok(Vec::new());
        };
        if !self.is_holder(nexus) {
            return Ok(Vec::new());
        }
        if scope != SCOPE_LU || type_code != reservation.pr_type.code() {
            return Err(SenseReason::InvalidReleaseOfPersistentReservation.into());
        }
        let pr_type = reservation.pr_type;
        self.reservation = None;
        Ok(if pr_type.admits_registrants() {
            self.unit_attentions(nexus, SenseReason::ReservationsReleased, |_| true)
        } else {
            Vec::new()
        })
    }

    /// PREEMPT / PREEMPT AND ABORT (SPC-4). The sender's own registration is never
    /// removed.
    fn preempt(
        &mut self,
        nexus: &Nexus,
        own_registrant: Registrant,
        preempted_key: u64,
        pr_type: PrType,
    ) -> Result<Vec<PendingUa>, PrError> {
        let not_own = |r: &Registration| r.registrant != own_registrant;
        let takes_reservation = match &self.reservation {
            None => false,
            Some(r) if r.pr_type.all_registrants() => preempted_key == 0,
            Some(_) => Some(preempted_key) == self.holder_key(),
        };
        if !takes_reservation {
            // Only registrations go; the reservation (if any) stays as it is.
            if preempted_key == 0 {
                return Err(invalid_parameter(8));
            }
            let removed = self.remove_registrations(|_, r| r.key == preempted_key && not_own(r));
            if removed.is_empty() {
                return Err(PrError::Conflict);
            }
            return Ok(unit_attentions_for(
                nexus,
                SenseReason::RegistrationsPreempted,
                removed.iter(),
            ));
        }
        let old_type = self.reservation.as_ref().map(|r| r.pr_type);
        // Key 0 preempts an all-registrants reservation: every other registration goes.
        let removed = self.remove_registrations(|_, r| {
            not_own(r) && (preempted_key == 0 || r.key == preempted_key)
        });
        self.reservation = Some(Reservation {
            pr_type,
            holder: own_registrant,
        });
        let mut unit_attentions =
            unit_attentions_for(nexus, SenseReason::RegistrationsPreempted, removed.iter());
        if old_type != Some(pr_type) {
            unit_attentions.extend(self.unit_attentions(
                nexus,
                SenseReason::ReservationsReleased,
                |_| true,
            ));
        }
        Ok(unit_attentions)
    }

    /// REGISTER AND MOVE (SPC-4): the holder hands its reservation to another I_T
    /// nexus, registering that nexus with the service action key if it is not registered.
    fn register_and_move(
        &mut self,
        nexus: &Nexus,
        own_registrant: Registrant,
        destination: Registrant,
        new_key: u64,
        unregister: bool,
    ) -> Result<(), PrError> {
        let holds = match &self.reservation {
            Some(r) => !r.pr_type.all_registrants() && r.holder.matches(nexus),
            None => false,
        };
        if !holds {
            return Err(PrError::Conflict);
        }
        if new_key == 0 {
            return Err(invalid_parameter(8));
        }
        let destination_is_sender = destination.initiator.matches(nexus)
            && destination.target_port == Some(nexus.relative_target_port);
        if destination_is_sender {
            return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN));
        }
        let new_holder = match self
            .registrations
            .iter()
            .find(|r| r.registrant.overlaps(&destination))
        {
            // Already registered (perhaps for all target ports): keep its key.
            Some(existing)
                if existing.registrant.covers(&destination)
                    && existing.registrant != own_registrant =>
            {
                existing.registrant.clone()
            }
            Some(_) => return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN)),
            None => {
                if self.registrations.len() >= MAX_REGISTRATIONS {
                    return Err(SenseReason::InsufficientRegistrationResources.into());
                }
                self.registrations.push(Registration {
                    registrant: destination.clone(),
                    key: new_key,
                });
                destination
            }
        };
        if let Some(reservation) = &mut self.reservation {
            reservation.holder = new_holder;
        }
        if unregister {
            self.remove_registrations(|_, r| r.registrant == own_registrant);
        }
        Ok(())
    }

    // ---- APTPL file ----

    fn to_aptpl_file(&self) -> Result<Vec<u8>, PrError> {
        let registrations = self
            .registrations
            .iter()
            .map(|r| FileRegistration {
                initiator: r.registrant.initiator.clone(),
                target_port: r.registrant.target_port,
                key: r.key,
            })
            .collect();
        let reservation = match &self.reservation {
            None => None,
            Some(r) => Some(FileReservation {
                holder: self
                    .registrations
                    .iter()
                    .position(|reg| reg.registrant == r.holder)
                    .ok_or(PrError::from(SenseReason::InternalTargetFailure))?,
                pr_type: r.pr_type.code(),
            }),
        };
        let file = AptplFile {
            version: APTPL_FILE_VERSION,
            registrations,
            reservation,
        };
        let mut bytes = serde_json::to_vec_pretty(&file)
            .map_err(|_| PrError::from(SenseReason::InternalTargetFailure))?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    fn from_aptpl_file(file: AptplFile) -> Result<Self, String> {
        if file.version != APTPL_FILE_VERSION {
            return Err(format!(
                "unsupported version {} (expected {APTPL_FILE_VERSION})",
                file.version
            ));
        }
        if file.registrations.len() > MAX_REGISTRATIONS {
            return Err(format!("more than {MAX_REGISTRATIONS} registrations"));
        }
        let mut registrations: Vec<Registration> = Vec::new();
        for (index, r) in file.registrations.into_iter().enumerate() {
            let name_ok = validate_iscsi_name(r.initiator.name()).is_some();
            if !name_ok || r.key == 0 || r.target_port == Some(0) {
                return Err(format!("registration {index} is invalid"));
            }
            let registrant = Registrant {
                initiator: r.initiator,
                target_port: r.target_port,
            };
            if registrations
                .iter()
                .any(|old| old.registrant.overlaps(&registrant))
            {
                return Err(format!("registration {index} overlaps an earlier one"));
            }
            registrations.push(Registration {
                registrant,
                key: r.key,
            });
        }
        let reservation = match file.reservation {
            None => None,
            Some(r) => Some(Reservation {
                pr_type: PrType::from_code(r.pr_type)
                    .ok_or_else(|| format!("unknown reservation type {}", r.pr_type))?,
                holder: registrations
                    .get(r.holder)
                    .ok_or_else(|| format!("reservation holder {} is not registered", r.holder))?
                    .registrant
                    .clone(),
            }),
        };
        Ok(PrState {
            registrations,
            reservation,
            aptpl: true,
            generation: 0,
        })
    }
}

fn unit_attentions_for<'a>(
    sender: &Nexus,
    reason: SenseReason,
    registrations: impl IntoIterator<Item = &'a Registration>,
) -> Vec<PendingUa> {
    let mut unit_attentions: Vec<PendingUa> = Vec::new();
    for registration in registrations {
        let port = registration.registrant.initiator.ua_port();
        let duplicate = port.eq_ignore_ascii_case(&sender.initiator_port)
            || unit_attentions
                .iter()
                .any(|ua| ua.initiator_port.eq_ignore_ascii_case(port));
        if !duplicate {
            unit_attentions.push(PendingUa {
                initiator_port: port.to_string(),
                reason,
            });
        }
    }
    unit_attentions
}

/// The APTPL file (see the module documentation).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AptplFile {
    version: u32,
    registrations: Vec<FileRegistration>,
    reservation: Option<FileReservation>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRegistration {
    initiator: Initiator,
    target_port: Option<u16>,
    key: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileReservation {
    /// Index into `registrations`.
    holder: usize,
    #[serde(rename = "type")]
    pr_type: u8,
}

/// `Ok(None)`: no file, so no saved state.
fn load_aptpl_file(path: &Path) -> Result<Option<PrState>, String> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let file: AptplFile =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    PrState::from_aptpl_file(file)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new file.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = parent_dir(path);
    fs::create_dir_all(dir)?;
    let mut temp_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_os_string();
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

fn remove_durably(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => File::open(parent_dir(path))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WE: u8 = 1;
    const EA: u8 = 3;
    const WE_RO: u8 = 5;
    const EA_RO: u8 = 6;
    const WE_AR: u8 = 7;
    const EA_AR: u8 = 8;
    const ALL_TYPES: [u8; 6] = [WE, EA, WE_RO, EA_RO, WE_AR, EA_AR];

    const READ_10: [u8; 10] = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    const WRITE_10: [u8; 10] = [0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    const MODE_SENSE_6: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
    const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 0xff, 0];
    const TEST_UNIT_READY: [u8; 6] = [0; 6];
    const READ_CAPACITY_16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    const SYNCHRONIZE_CACHE_10: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];

    fn nexus(n: u8) -> Nexus {
        Nexus {
            initiator_port: format!("iqn.2024-01.test:host{n},i,0x00023d00000{n}"),
            initiator_name: format!("iqn.2024-01.test:host{n}"),
            relative_target_port: 1,
        }
    }

    fn on_port(mut nexus: Nexus, port: u16) -> Nexus {
        nexus.relative_target_port = port;
        nexus
    }

    fn prout_cdb(service_action: u8, pr_type: u8, len: usize) -> [u8; 10] {
        let len = u32::try_from(len).unwrap().to_be_bytes();
        [
            0x5f,
            service_action,
            pr_type,
            0,
            0,
            len[0],
            len[1],
            len[2],
            len[3],
            0,
        ]
    }

    fn basic_params(key: u64, service_action_key: u64, flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&service_action_key.to_be_bytes());
        p[20] = flags;
        p
    }

    fn prout(
        r: &Reservations,
        n: &Nexus,
        service_action: u8,
        pr_type: u8,
        params: &[u8],
    ) -> Result<Vec<PendingUa>, PrError> {
        r.persistent_reserve_out(n, &prout_cdb(service_action, pr_type, params.len()), params)
    }

    fn register(r: &Reservations, n: &Nexus, key: u64, new_key: u64) -> Result<(), PrError> {
        prout(r, n, PROUT_REGISTER, 0, &basic_params(key, new_key, 0)).map(|_| ())
    }

    fn register_ignore(r: &Reservations, n: &Nexus, new_key: u64) {
        let params = basic_params(0, new_key, 0);
        prout(r, n, PROUT_REGISTER_AND_IGNORE_EXISTING_KEY, 0, &params).unwrap();
    }

    fn reserve(r: &Reservations, n: &Nexus, key: u64, pr_type: u8) -> Result<(), PrError> {
        prout(r, n, PROUT_RESERVE, pr_type, &basic_params(key, 0, 0)).map(|_| ())
    }

    fn release(
        r: &Reservations,
        n: &Nexus,
        key: u64,
        pr_type: u8,
    ) -> Result<Vec<PendingUa>, PrError> {
        prout(r, n, PROUT_RELEASE, pr_type, &basic_params(key, 0, 0))
    }

    fn preempt(
        r: &Reservations,
        n: &Nexus,
        key: u64,
        preempted: u64,
        pr_type: u8,
    ) -> Result<Vec<PendingUa>, PrError> {
        prout(
            r,
            n,
            PROUT_PREEMPT,
            pr_type,
            &basic_params(key, preempted, 0),
        )
    }

    fn prin(r: &Reservations, n: &Nexus, service_action: u8) -> Result<Vec<u8>, PrError> {
        r.persistent_reserve_in(n, &[0x5e, service_action, 0, 0, 0, 0, 0, 0x40, 0, 0])
    }

    /// (PRGENERATION, keys) from READ KEYS.
    fn read_keys(r: &Reservations, n: &Nexus) -> (u32, Vec<u64>) {
        let data = prin(r, n, PRIN_READ_KEYS).unwrap();
        let generation = u32::from_be_bytes(data[0..4].try_into().unwrap());
        let len = u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize;
        assert_eq!(len, data.len() - 8);
        let keys = data[8..]
            .chunks(8)
            .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
            .collect();
        (generation, keys)
    }

    /// (key, scope/type byte) from READ RESERVATION, if reserved.
    fn read_reservation(r: &Reservations, n: &Nexus) -> Option<(u64, u8)> {
        let data = prin(r, n, PRIN_READ_RESERVATION).unwrap();
        match u32::from_be_bytes(data[4..8].try_into().unwrap()) {
            0 => {
                assert_eq!(data.len(), 8);
                None
            }
            16 => {
                assert_eq!(data.len(), 24);
                Some((
                    u64::from_be_bytes(data[8..16].try_into().unwrap()),
                    data[21],
                ))
            }
            other => panic!("additional length {other}"),
        }
    }

    fn ua(n: &Nexus, reason: SenseReason) -> PendingUa {
        PendingUa {
            initiator_port: n.initiator_port.clone(),
            reason,
        }
    }

    fn sense_reason(result: Result<impl std::fmt::Debug, PrError>) -> SenseReason {
        match result {
            Err(PrError::Sense(sense)) => sense.reason,
            other => panic!("expected CHECK CONDITION, got {other:?}"),
        }
    }

    fn iscsi_transport_id(format: u8, text: &str) -> Vec<u8> {
        let padded = (text.len() + 1).next_multiple_of(4).max(20);
        let mut id = vec![format << 6 | 0x05, 0];
        id.extend_from_slice(&u16::try_from(padded).unwrap().to_be_bytes());
        id.extend_from_slice(text.as_bytes());
        id.resize(4 + padded, 0);
        id
    }

    fn spec_i_pt_params(key: u64, new_key: u64, flags: u8, ids: &[Vec<u8>]) -> Vec<u8> {
        let ids: Vec<u8> = ids.concat();
        let mut params = basic_params(key, new_key, flags | 0x08);
        params.extend_from_slice(&u32::try_from(ids.len()).unwrap().to_be_bytes());
        params.extend_from_slice(&ids);
        params
    }

    fn register_and_move_params(
        key: u64,
        new_key: u64,
        flags: u8,
        target_port: u16,
        id: &[u8],
    ) -> Vec<u8> {
        let mut params = basic_params(key, new_key, 0);
        params[17] = flags;
        params[18..20].copy_from_slice(&target_port.to_be_bytes());
        params[20..24].copy_from_slice(&u32::try_from(id.len()).unwrap().to_be_bytes());
        params.extend_from_slice(id);
        params
    }

    /// The invariants every state must keep, whatever commands ran.
    fn assert_consistent(r: &Reservations) {
        let state = r.read();
        let pr = &state.persistent;
        for (i, a) in pr.registrations.iter().enumerate() {
            assert_ne!(a.key, 0);
            for b in &pr.registrations[i + 1..] {
                assert!(
                    !a.registrant.overlaps(&b.registrant),
                    "{a:?} overlaps {b:?}"
                );
            }
        }
        if let Some(reservation) = &pr.reservation {
            assert!(pr
                .registrations
                .iter()
                .any(|reg| reg.registrant == reservation.holder));
        }
        let restricted = state.reserved_by.is_some() || pr.reservation.is_some();
        assert_eq!(r.restricted.load(Ordering::Acquire), restricted);
    }

    #[test]
    fn reservations_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Reservations>();
    }

    #[test]
    fn register_read_keys_change_key_and_unregister() {
        let r = Reservations::new(None);
        let a = nexus(1);
        assert_eq!(read_keys(&r, &a), (0, vec![]));
        register(&r, &a, 0, 0x1111).unwrap();
        assert_eq!(read_keys(&r, &a), (1, vec![0x1111]));
        // Registering again without naming the current key conflicts (libiscsi
        // prout_reregister_key_fails).
        assert_eq!(register(&r, &a, 0, 0x1112), Err(PrError::Conflict));
        assert_eq!(register(&r, &a, 0x9999, 0x1112), Err(PrError::Conflict));
        register(&r, &a, 0x1111, 0x2222).unwrap();
        assert_eq!(read_keys(&r, &a), (2, vec![0x2222]));
        register(&r, &a, 0x2222, 0).unwrap();
        assert_eq!(read_keys(&r, &a), (3, vec![]));
        assert_eq!(r.generation(), 3);
    }

    #[test]
    fn register_from_unregistered_nexus() {
        let r = Reservations::new(None);
        let a = nexus(1);
        // A non-zero RESERVATION KEY from an unregistered nexus conflicts.
        assert_eq!(register(&r, &a, 5, 6), Err(PrError::Conflict));
        // Unregistering what is not registered succeeds and changes nothing.
        register(&r, &a, 0, 0).unwrap();
        assert_eq!(read_keys(&r, &a), (0, vec![]));
    }

    #[test]
    fn register_and_ignore_existing_key_replaces_any_key() {
        let r = Reservations::new(None);
        let a = nexus(1);
        register_ignore(&r, &a, 7);
        register_ignore(&r, &a, 8);
        assert_eq!(read_keys(&r, &a), (2, vec![8]));
        let params = basic_params(0xdead, 0, 0);
        prout(&r, &a, PROUT_REGISTER_AND_IGNORE_EXISTING_KEY, 0, &params).unwrap();
        assert_eq!(read_keys(&r, &a).1, Vec::<u64>::new());
    }

    #[test]
    fn registrations_are_per_i_t_nexus() {
        let r = Reservations::new(None);
        let a = nexus(1);
        // Same initiator name, another ISID: another initiator port.
        let a2 = Nexus {
            initiator_port: "iqn.2024-01.test:host1,i,0x00023d000009".into(),
            ..nexus(1)
        };
        register_ignore(&r, &a, 1);
        register_ignore(&r, &a2, 2);
        register_ignore(&r, &on_port(a.clone(), 2), 3);
        assert_eq!(read_keys(&r, &a).1, vec![1, 2, 3]);
        assert_consistent(&r);
    }

    #[test]
    fn read_keys_additional_length_counts_every_key() {
        let r = Reservations::new(None);
        register_ignore(&r, &nexus(1), 1);
        register_ignore(&r, &nexus(2), 2);
        let data = prin(&r, &nexus(1), PRIN_READ_KEYS).unwrap();
        // The caller truncates to ALLOCATION LENGTH; the header still says 16.
        assert_eq!(&data[4..8], &16u32.to_be_bytes());
        assert_eq!(data.len(), 24);
    }

    #[test]
    fn report_capabilities_layout() {
        let r = Reservations::new(None);
        let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
        assert_eq!(data, [0, 8, 0x1c, 0x90, 0xea, 0x01, 0, 0]);
        let dir = tempfile::tempdir().unwrap();
        let r = Reservations::new(Some(dir.path().join("pr")));
        let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
        assert_eq!(data[2], 0x1d, "PTPL_C");
        assert_eq!(data[3] & 1, 0, "PTPL_A off");
        prout(&r, &nexus(1), PROUT_REGISTER, 0, &basic_params(0, 1, 0x01)).unwrap();
        let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
        assert_eq!(data[3] & 1, 1, "PTPL_A on");
    }

    #[test]
    fn prin_service_actions_beyond_read_full_status_are_invalid() {
        let r = Reservations::new(None);
        for sa in 0..4 {
            assert!(prin(&r, &nexus(1), sa).is_ok());
        }
        for sa in 4..0x20 {
            assert_eq!(
                sense_reason(prin(&r, &nexus(1), sa)),
                SenseReason::InvalidFieldInCdb
            );
        }
    }

    #[test]
    fn reserve_and_release_every_type() {
        let r = Reservations::new(None);
        let a = nexus(1);
        register_ignore(&r, &a, 0xabc);
        let generation = r.generation();
        for pr_type in ALL_TYPES {
            reserve(&r, &a, 0xabc, pr_type).unwrap();
            let key = if pr_type >= WE_AR { 0 } else { 0xabc };
            assert_eq!(read_reservation(&r, &a), Some((key, pr_type)));
            // Reserving again with the same type is a no-op.
            reserve(&r, &a, 0xabc, pr_type).unwrap();
            assert!(release(&r, &a, 0xabc, pr_type).unwrap().is_empty());
            assert_eq!(read_reservation(&r, &a), None);
        }
        // RESERVE and RELEASE leave PRGENERATION alone.
        assert_eq!(r.generation(), generation);
    }

    #[test]
    fn reserve_requires_registration_and_its_key() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        assert_eq!(reserve(&r, &a, 0, WE), Err(PrError::Conflict));
        register_ignore(&r, &a, 1);
        assert_eq!(reserve(&r, &a, 2, WE), Err(PrError::Conflict));
        reserve(&r, &a, 1, WE).unwrap();
        // The holder cannot change the type by RESERVE.
        assert_eq!(reserve(&r, &a, 1, EA), Err(PrError::Conflict));
        register_ignore(&r, &b, 2);
        assert_eq!(reserve(&r, &b, 2, WE), Err(PrError::Conflict));
        assert_consistent(&r);
    }

    #[test]
    fn reserve_validates_scope_and_type() {
        let r = Reservations::new(None);
        let a = nexus(1);
        register_ignore(&r, &a, 1);
        for bad_type in [0, 2, 4, 9, 0xf] {
            assert_eq!(
                sense_reason(reserve(&r, &a, 1, bad_type)),
                SenseReason::InvalidFieldInCdb
            );
        }
        assert_eq!(
            sense_reason(reserve(&r, &a, 1, 0x10 | WE)),
            SenseReason::InvalidFieldInCdb
        );
        assert_eq!(read_reservation(&r, &a), None);
    }

    #[test]
    fn all_registrants_reservation_is_held_by_every_registrant() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        reserve(&r, &a, 1, EA_AR).unwrap();
        reserve(&r, &b, 2, EA_AR).unwrap();
        // Another registrant releases it; the remaining registrant learns of it.
        assert_eq!(
            release(&r, &b, 2, EA_AR).unwrap(),
            vec![ua(&a, SenseReason::ReservationsReleased)]
        );
        assert_eq!(read_reservation(&r, &a), None);
    }

    #[test]
    fn release_rules() {
        let r = Reservations::new(None);
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        // Nothing reserved: success without effect; unregistered: conflict.
        assert!(release(&r, &a, 1, WE).unwrap().is_empty());
        assert_eq!(release(&r, &c, 0, WE), Err(PrError::Conflict));
        reserve(&r, &a, 1, WE_RO).unwrap();
        // A registered non-holder: success without effect.
        assert!(release(&r, &b, 2, WE_RO).unwrap().is_empty());
        assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
        // The holder with the wrong type.
        assert_eq!(
            sense_reason(release(&r, &a, 1, EA_RO)),
            SenseReason::InvalidReleaseOfPersistentReservation
        );
        // The holder with the wrong key.
        assert_eq!(release(&r, &a, 2, WE_RO), Err(PrError::Conflict));
        assert_eq!(
            release(&r, &a, 1, WE_RO).unwrap(),
            vec![ua(&b, SenseReason::ReservationsReleased)]
        );
        // WE and EA releases tell nobody.
        reserve(&r, &a, 1, EA).unwrap();
        assert!(release(&r, &a, 1, EA).unwrap().is_empty());
    }

    /// The SPC-4 / SBC-3 access tables as libiscsi's test_prout_reserve_access checks it, plus
    /// the always-allowed commands and MODE SENSE.
    #[test]
    fn access_matrix_for_every_type() {
        // (type, registered can read, registered can write, unregistered can read,
        //  unregistered can write)
        let matrix = [
            (WE, true, false, true, false),
            (EA, false, false, false, false),
            (WE_RO, true, true, true, false),
            (EA_RO, true, true, false, false),
            (WE_AR, true, true, true, false),
            (EA_AR, true, true, false, false),
        ];
        for (pr_type, reg_read, reg_write, unreg_read, unreg_write) in matrix {
            let r = Reservations::new(None);
            let (holder, registered, unregistered) = (nexus(1), nexus(2), nexus(3));
            register_ignore(&r, &holder, 1);
            register_ignore(&r, &registered, 2);
            reserve(&r, &holder, 1, pr_type).unwrap();
            let allowed = |n: &Nexus, cdb: &[u8]| r.check_access(n, cdb).is_ok();
            for cdb in [
                &READ_10[..],
                &WRITE_10,
                &MODE_SENSE_6,
                &SYNCHRONIZE_CACHE_10,
            ] {
                assert!(allowed(&holder, cdb), "type {pr_type} holder {cdb:x?}");
            }
            assert_eq!(allowed(&registered, &READ_10), reg_read, "type {pr_type}");
            assert_eq!(allowed(&registered, &WRITE_10), reg_write, "type {pr_type}");
            assert_eq!(
                allowed(&registered, &MODE_SENSE_6),
                reg_read,
                "type {pr_type}"
            );
            assert_eq!(
                allowed(&unregistered, &READ_10),
                unreg_read,
                "type {pr_type}"
            );
            assert_eq!(
                allowed(&unregistered, &WRITE_10),
                unreg_write,
                "type {pr_type}"
            );
            assert!(
                !allowed(&unregistered, &SYNCHRONIZE_CACHE_10),
                "type {pr_type}"
            );
            for n in [&registered, &unregistered] {
                for cdb in [&INQUIRY[..], &TEST_UNIT_READY, &READ_CAPACITY_16] {
                    assert!(allowed(n, cdb), "type {pr_type} {cdb:x?}");
                }
                assert!(allowed(n, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0]));
                assert!(allowed(n, &prout_cdb(0, 0, 24)));
            }
            // Unregistering the second initiator takes its access away.
            register(&r, &registered, 2, 0).unwrap();
            assert_eq!(allowed(&registered, &READ_10), unreg_read, "type {pr_type}");
            assert_eq!(
                allowed(&registered, &WRITE_10),
                unreg_write,
                "type {pr_type}"
            );
        }
    }

    #[test]
    fn no_reservation_restricts_nothing() {
        let r = Reservations::new(None);
        register_ignore(&r, &nexus(1), 1);
        assert!(r.check_access(&nexus(2), &WRITE_10).is_ok());
        assert!(r.check_access(&nexus(2), &[]).is_ok());
    }

    /// libiscsi test_prout_reserve_ownership: when the holder unregisters, a WE/EA/RO
    /// reservation ends; an all-registrants one stays while anyone is registered.
    #[test]
    fn unregistering_the_holder() {
        for pr_type in ALL_TYPES {
            let r = Reservations::new(None);
            let (a, b) = (nexus(1), nexus(2));
            register_ignore(&r, &a, 1);
            register_ignore(&r, &b, 2);
            reserve(&r, &a, 1, pr_type).unwrap();
            let unit_attentions = prout(&r, &a, PROUT_REGISTER, 0, &basic_params(1, 0, 0)).unwrap();
            assert_consistent(&r);
            match pr_type {
                WE_AR | EA_AR => {
                    assert!(unit_attentions.is_empty());
                    assert_eq!(read_reservation(&r, &a), Some((0, pr_type)));
                    assert!(r.check_access(&b, &WRITE_10).is_ok());
                    release(&r, &b, 2, pr_type).unwrap();
                }
                WE_RO | EA_RO => {
                    assert_eq!(
                        unit_attentions,
                        vec![ua(&b, SenseReason::ReservationsReleased)]
                    );
                    assert_eq!(read_reservation(&r, &a), None);
                }
                _ => {
                    assert!(unit_attentions.is_empty());
                    assert_eq!(read_reservation(&r, &a), None);
                }
            }
            register(&r, &b, 2, 0).unwrap();
            assert_eq!(read_keys(&r, &a).1, Vec::<u64>::new());
        }
    }

    #[test]
    fn last_all_registrants_registrant_leaving_ends_the_reservation() {
        let r = Reservations::new(None);
        let a = nexus(1);
        register_ignore(&r, &a, 1);
        reserve(&r, &a, 1, WE_AR).unwrap();
        register(&r, &a, 1, 0).unwrap();
        assert_eq!(read_reservation(&r, &a), None);
        assert!(r.check_access(&nexus(2), &WRITE_10).is_ok());
        assert_consistent(&r);
    }

    /// libiscsi test_prout_clear_simple.
    #[test]
    fn clear_removes_everything_and_counts_once() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        let generation = r.generation();
        reserve(&r, &a, 1, EA).unwrap();
        assert_eq!(
            prout(&r, &nexus(3), PROUT_CLEAR, 0, &basic_params(0, 0, 0)),
            Err(PrError::Conflict)
        );
        assert_eq!(
            prout(&r, &a, PROUT_CLEAR, 0, &basic_params(2, 0, 0)),
            Err(PrError::Conflict)
        );
        let unit_attentions = prout(&r, &a, PROUT_CLEAR, 0, &basic_params(1, 0, 0)).unwrap();
        assert_eq!(
            unit_attentions,
            vec![ua(&b, SenseReason::ReservationsPreempted)]
        );
        assert_eq!(read_reservation(&r, &a), None);
        assert_eq!(read_keys(&r, &a), (generation + 1, vec![]));
        assert!(r.check_access(&b, &WRITE_10).is_ok());
    }

    /// libiscsi test_prout_preempt_rm_reg.
    #[test]
    fn preempt_removes_registrations() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 0x1);
        register_ignore(&r, &b, 0x2);
        let generation = r.generation();
        let unit_attentions = preempt(&r, &b, 0x2, 0x1, EA).unwrap();
        assert_eq!(
            unit_attentions,
            vec![ua(&a, SenseReason::RegistrationsPreempted)]
        );
        assert_eq!(read_keys(&r, &a), (generation + 1, vec![0x2]));
        // No reservation was created: only registrations were preempted.
        assert_eq!(read_reservation(&r, &a), None);
        // Nothing left with that key; key 0 without a reservation is invalid.
        assert_eq!(preempt(&r, &b, 0x2, 0x1, EA), Err(PrError::Conflict));
        assert_eq!(
            sense_reason(preempt(&r, &b, 0x2, 0, EA)),
            SenseReason::InvalidFieldInParameterList
        );
        // Unregistered senders conflict.
        assert_eq!(preempt(&r, &a, 0x1, 0x2, EA), Err(PrError::Conflict));
        // A nexus never preempts its own registration.
        assert_eq!(preempt(&r, &b, 0x2, 0x2, EA), Err(PrError::Conflict));
    }

    #[test]
    fn preempt_takes_over_the_reservation() {
        let r = Reservations::new(None);
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        register_ignore(&r, &c, 3);
        reserve(&r, &a, 1, WE).unwrap();
        let mut unit_attentions = preempt(&r, &b, 2, 1, EA).unwrap();
        unit_attentions.sort_by(|x, y| x.initiator_port.cmp(&y.initiator_port));
        assert_eq!(
            unit_attentions,
            vec![
                ua(&a, SenseReason::RegistrationsPreempted),
                // The type changed: the remaining registrant learns the old one is gone.
                ua(&c, SenseReason::ReservationsReleased),
            ]
        );
        assert_eq!(read_reservation(&r, &a), Some((2, EA)));
        assert_eq!(read_keys(&r, &a).1, vec![2, 3]);
        assert!(r.check_access(&a, &READ_10).is_err());
        assert!(r.check_access(&b, &WRITE_10).is_ok());
        // The holder preempting its own reservation changes its type.
        assert_eq!(
            preempt(&r, &b, 2, 2, WE).unwrap(),
            vec![ua(&c, SenseReason::ReservationsReleased)]
        );
        assert_eq!(read_reservation(&r, &a), Some((2, WE)));
        assert_eq!(read_keys(&r, &a).1, vec![2, 3]);
        // A non-holder key leaves the reservation alone.
        assert_eq!(
            preempt(&r, &b, 2, 3, WE).unwrap(),
            vec![ua(&c, SenseReason::RegistrationsPreempted)]
        );
        assert_eq!(read_reservation(&r, &a), Some((2, WE)));
        assert_consistent(&r);
    }

    #[test]
    fn preempt_all_registrants_with_key_zero() {
        let r = Reservations::new(None);
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        register_ignore(&r, &c, 3);
        reserve(&r, &a, 1, WE_AR).unwrap();
        // A non-zero key removes that registration only; the reservation stays.
        assert_eq!(
            preempt(&r, &b, 2, 1, WE_AR).unwrap(),
            vec![ua(&a, SenseReason::RegistrationsPreempted)]
        );
        assert_eq!(read_reservation(&r, &b), Some((0, WE_AR)));
        assert_consistent(&r);
        // Key zero removes every other registration and takes the reservation.
        assert_eq!(
            preempt(&r, &b, 2, 0, EA).unwrap(),
            vec![ua(&c, SenseReason::RegistrationsPreempted)]
        );
        assert_eq!(read_reservation(&r, &b), Some((2, EA)));
        assert_eq!(read_keys(&r, &b).1, vec![2]);
        assert_consistent(&r);
    }

    #[test]
    fn preempt_and_abort_behaves_like_preempt() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 1);
        register_ignore(&r, &b, 2);
        reserve(&r, &a, 1, EA).unwrap();
        let params = basic_params(2, 1, 0);
        let unit_attentions = prout(&r, &b, PROUT_PREEMPT_AND_ABORT, EA, &params).unwrap();
        assert_eq!(
            unit_attentions,
            vec![ua(&a, SenseReason::RegistrationsPreempted)]
        );
        assert_eq!(read_reservation(&r, &b), Some((2, EA)));
    }

    #[test]
    fn register_and_move_hands_over_the_reservation() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 1);
        let id_b = iscsi_transport_id(1, &b.initiator_port);
        let params = register_and_move_params(1, 0x22, 0, 1, &id_b);
        // Not the holder (nothing reserved).
        assert_eq!(
            prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, &params),
            Err(PrError::Conflict)
        );
        reserve(&r, &a, 1, WE_RO).unwrap();
        let generation = r.generation();
        assert!(prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, &params)
            .unwrap()
            .is_empty());
        assert_eq!(read_reservation(&r, &a), Some((0x22, WE_RO)));
        assert_eq!(read_keys(&r, &a), (generation + 1, vec![1, 0x22]));
        assert!(r.check_access(&b, &WRITE_10).is_ok());
        assert_consistent(&r);
        // Move back with UNREG: the sender's registration goes.
        let id_a = iscsi_transport_id(1, &a.initiator_port);
        let params = register_and_move_params(0x22, 0x99, 0x02, 1, &id_a);
        prout(&r, &b, PROUT_REGISTER_AND_MOVE, 0, &params).unwrap();
        // A was registered already, so it keeps its key.
        assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
        assert_eq!(read_keys(&r, &a).1, vec![1]);
        assert_consistent(&r);
    }

    #[test]
    fn register_and_move_rejections() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &a, 1);
        reserve(&r, &a, 1, EA).unwrap();
        let id_b = iscsi_transport_id(1, &b.initiator_port);
        let id_a = iscsi_transport_id(1, &a.initiator_port);
        let run = |params: &[u8]| prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, params);
        // To itself.
        assert_eq!(
            sense_reason(run(&register_and_move_params(1, 2, 0, 1, &id_a))),
            SenseReason::InvalidFieldInParameterList
        );
        // Key 0.
        assert_eq!(
            sense_reason(run(&register_and_move_params(1, 0, 0, 1, &id_b))),
            SenseReason::InvalidFieldInParameterList
        );
        // Relative target port 0.
        assert_eq!(
            sense_reason(run(&register_and_move_params(1, 2, 0, 0, &id_b))),
            SenseReason::InvalidFieldInParameterList
        );
        // A name without ISID is no I_T nexus.
        let node_b = iscsi_transport_id(0, &b.initiator_name);
        assert_eq!(
            sense_reason(run(&register_and_move_params(1, 2, 0, 1, &node_b))),
            SenseReason::InvalidFieldInParameterList
        );
        // TRANSPORTID PARAMETER DATA LENGTH disagreeing with the list.
        let mut params = register_and_move_params(1, 2, 0, 1, &id_b);
        params.push(0);
        assert_eq!(
            sense_reason(run(&params)),
            SenseReason::ParameterListLengthError
        );
        // Wrong key.
        assert_eq!(
            run(&register_and_move_params(7, 2, 0, 1, &id_b)),
            Err(PrError::Conflict)
        );
        // All-registrants reservations cannot be moved.
        release(&r, &a, 1, EA).unwrap();
        reserve(&r, &a, 1, EA_AR).unwrap();
        assert_eq!(
            run(&register_and_move_params(1, 2, 0, 1, &id_b)),
            Err(PrError::Conflict)
        );
        assert_eq!(read_keys(&r, &a).1, vec![1]);
    }

    #[test]
    fn spec_i_pt_registers_named_initiators() {
        let r = Reservations::new(None);
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        // B by port (upper-case ISID is normalised), C by name only.
        let port_b = b
            .initiator_port
            .to_ascii_uppercase()
            .replace(",I,0X", ",i,0x");
        let ids = [
            iscsi_transport_id(1, &port_b),
            iscsi_transport_id(0, &c.initiator_name),
        ];
        let params = spec_i_pt_params(0, 0x5, 0, &ids);
        prout(&r, &a, PROUT_REGISTER, 0, &params).unwrap();
        assert_eq!(read_keys(&r, &a), (1, vec![5, 5, 5]));
        // C is registered through any ISID.
        let c_other_isid = Nexus {
            initiator_port: format!("{},i,0x400000000001", c.initiator_name),
            ..c.clone()
        };
        reserve(&r, &a, 5, EA_RO).unwrap();
        for n in [&b, &c, &c_other_isid] {
            assert!(r.check_access(n, &WRITE_10).is_ok());
        }
        assert!(r.check_access(&nexus(4), &READ_10).is_err());
        // READ FULL STATUS: three descriptors with TransportIDs of formats 01b, 01b, 00b.
        let data = prin(&r, &a, PRIN_READ_FULL_STATUS).unwrap();
        assert_eq!(
            u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize,
            data.len() - 8
        );
        let mut at = 8;
        let (mut formats, mut holders) = (Vec::new(), Vec::new());
        while at < data.len() {
            let descriptor = &data[at..];
            assert_eq!(&descriptor[0..8], &5u64.to_be_bytes());
            holders.push((descriptor[12] & 1, descriptor[13]));
            let id_len = u32::from_be_bytes(descriptor[20..24].try_into().unwrap()) as usize;
            formats.push(descriptor[24] >> 6);
            at += 24 + id_len;
        }
        assert_eq!(at, data.len());
        assert_eq!(formats, vec![1, 1, 0]);
        // Only the sender holds the registrants-only reservation.
        assert_eq!(holders, vec![(1, EA_RO), (0, 0), (0, 0)]);
    }

    #[test]
    fn spec_i_pt_rejections() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        register_ignore(&r, &b, 9);
        let id_b = iscsi_transport_id(1, &b.initiator_port);
        // B is registered already: nothing is registered.
        let params = spec_i_pt_params(0, 5, 0, std::slice::from_ref(&id_b));
        assert_eq!(
            sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
            SenseReason::InvalidFieldInParameterList
        );
        assert_eq!(read_keys(&r, &a).1, vec![9]);
        // From a registered sender.
        let params = spec_i_pt_params(9, 5, 0, &[iscsi_transport_id(1, &a.initiator_port)]);
        assert_eq!(
            sense_reason(prout(&r, &b, PROUT_REGISTER, 0, &params)),
            SenseReason::InvalidFieldInParameterList
        );
        // With REGISTER AND IGNORE EXISTING KEY.
        let params = spec_i_pt_params(0, 5, 0, &[]);
        assert_eq!(
            sense_reason(prout(
                &r,
                &a,
                PROUT_REGISTER_AND_IGNORE_EXISTING_KEY,
                0,
                &params
            )),
            SenseReason::InvalidFieldInParameterList
        );
        // Not iSCSI (FCP), malformed lengths, no NUL, bad ISID.
        let mut fcp = iscsi_transport_id(1, "iqn.x:y,i,0x000000000001");
        fcp[0] = 0x00;
        let mut no_nul = iscsi_transport_id(0, "iqn.x:y");
        no_nul[4..].fill(b'a');
        let mut odd = iscsi_transport_id(0, "iqn.x:y");
        odd[3] = 21;
        for bad in [
            fcp,
            no_nul,
            odd,
            iscsi_transport_id(1, "iqn.x:y,i,0xnothex"),
            iscsi_transport_id(1, "iqn.x:y"),
            iscsi_transport_id(0, ""),
            iscsi_transport_id(2, "iqn.x:y"),
        ] {
            let params = spec_i_pt_params(0, 5, 0, std::slice::from_ref(&bad));
            assert_eq!(
                sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
                SenseReason::InvalidFieldInParameterList,
                "{bad:x?}"
            );
        }
        // TRANSPORTID PARAMETER DATA LENGTH larger than what follows.
        let mut params = spec_i_pt_params(0, 5, 0, &[id_b]);
        params.truncate(params.len() - 4);
        assert_eq!(
            sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
            SenseReason::ParameterListLengthError
        );
        assert_eq!(read_keys(&r, &a).1, vec![9]);
        assert_consistent(&r);
    }

    #[test]
    fn all_tg_pt_registers_every_target_port() {
        let r = Reservations::new(None);
        let a = nexus(1);
        prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 4, 0x04)).unwrap();
        let a_on_2 = on_port(a.clone(), 2);
        // Registered through port 2 too, with the same key.
        reserve(&r, &a_on_2, 4, EA).unwrap();
        assert!(r.check_access(&a, &WRITE_10).is_ok());
        let data = prin(&r, &a, PRIN_READ_FULL_STATUS).unwrap();
        assert_eq!(data[8 + 12], 0x03, "ALL_TG_PT and R_HOLDER");
        // Another port of a different initiator is not registered.
        assert!(r.check_access(&on_port(nexus(2), 2), &READ_10).is_err());
        // Through any target port it is the one registration: a key change applies everywhere.
        let a2 = on_port(a, 3);
        register(&r, &a2, 4, 5).unwrap();
        assert_eq!(read_keys(&r, &a2).1, vec![5]);
        // A new registration of one of A's nexuses on its own would overlap it.
        let b = nexus(2);
        let ids = [iscsi_transport_id(1, &a2.initiator_port)];
        let params = spec_i_pt_params(0, 6, 0, &ids);
        assert_eq!(
            sense_reason(prout(&r, &b, PROUT_REGISTER, 0, &params)),
            SenseReason::InvalidFieldInParameterList
        );
    }

    #[test]
    fn parameter_list_validation() {
        let r = Reservations::new(None);
        let a = nexus(1);
        for len in [0, 8, 23, 25, 28] {
            let params = vec![0u8; len];
            for sa in 0..=7 {
                assert_eq!(
                    sense_reason(prout(&r, &a, sa, WE, &params)),
                    SenseReason::ParameterListLengthError,
                    "sa {sa} len {len}"
                );
            }
        }
        // Unknown service actions.
        for sa in 8..0x20 {
            assert_eq!(
                sense_reason(prout(&r, &a, sa, WE, &basic_params(0, 1, 0))),
                SenseReason::InvalidFieldInCdb
            );
        }
        // SPEC_I_PT with anything but REGISTER.
        assert_eq!(
            sense_reason(prout(&r, &a, PROUT_RESERVE, WE, &basic_params(0, 1, 0x08))),
            SenseReason::InvalidFieldInParameterList
        );
        // APTPL without anywhere to persist.
        assert_eq!(
            sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 1, 0x01))),
            SenseReason::InvalidFieldInParameterList
        );
        assert_eq!(r.generation(), 0);
        assert_eq!(
            sense_reason(r.persistent_reserve_out(&a, &[0x5f], &basic_params(0, 1, 0))),
            SenseReason::InvalidFieldInCdb
        );
    }

    #[test]
    fn aptpl_state_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lu0").join("persistent-reservations");
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        {
            let r = Reservations::new(Some(path.clone()));
            register_ignore(&r, &a, 1);
            // APTPL=1 from now on: everything so far and later is saved.
            prout(&r, &b, PROUT_REGISTER, 0, &basic_params(0, 2, 0x01)).unwrap();
            let ids = [iscsi_transport_id(0, &c.initiator_name)];
            // The APTPL bit of the last registration is the one in force.
            let params = spec_i_pt_params(0, 3, 0x05, &ids);
            prout(&r, &on_port(nexus(4), 2), PROUT_REGISTER, 0, &params).unwrap();
            reserve(&r, &b, 2, EA_RO).unwrap();
            assert!(path.exists());
            assert!(!path.with_file_name("persistent-reservations.tmp").exists());
        }
        let r = Reservations::new(Some(path.clone()));
        assert_eq!(r.load_error(), None);
        assert_eq!(read_keys(&r, &a), (0, vec![1, 2, 3, 3]));
        assert_eq!(read_reservation(&r, &a), Some((2, EA_RO)));
        assert!(r.check_access(&b, &WRITE_10).is_ok());
        assert!(r.check_access(&on_port(c.clone(), 7), &WRITE_10).is_ok());
        assert!(r.check_access(&nexus(5), &READ_10).is_err());
        let caps = prin(&r, &a, PRIN_REPORT_CAPABILITIES).unwrap();
        assert_eq!(caps[3] & 1, 1, "PTPL_A");
        assert_consistent(&r);
        // APTPL=0 ends persistence: the file goes.
        prout(&r, &b, PROUT_REGISTER, 0, &basic_params(2, 2, 0)).unwrap();
        assert!(!path.exists());
        let r = Reservations::new(Some(path));
        assert_eq!(read_keys(&r, &a), (0, vec![]));
    }

    #[test]
    fn aptpl_file_that_cannot_be_loaded_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pr");
        for bad in [
            "not json",
            r#"{"version": 2, "registrations": [], "reservation": null}"#,
            r#"{"version": 1, "registrations": [], "reservation": {"holder": 0, "type": 1}}"#,
            r#"{"version": 1, "registrations": [{"initiator": {"node": "iqn.a"},
                "target_port": null, "key": 0}], "reservation": null}"#,
            r#"{"version": 1, "registrations": [
                {"initiator": {"node": "iqn.a"}, "target_port": null, "key": 1},
                {"initiator": {"port": "iqn.a,i,0x000000000001"}, "target_port": 1, "key": 2}
               ], "reservation": null}"#,
            r#"{"version": 1, "registrations": [{"initiator": {"node": "iqn.a"},
                "target_port": 1, "key": 1}], "reservation": {"holder": 0, "type": 4}}"#,
        ] {
            fs::write(&path, bad).unwrap();
            let r = Reservations::new(Some(path.clone()));
            assert!(r.load_error().is_some(), "{bad}");
            assert_eq!(read_keys(&r, &nexus(1)).1, Vec::<u64>::new());
            // The file is left for an operator to look at.
            assert_eq!(fs::read_to_string(&path).unwrap(), bad);
        }
    }

    #[test]
    fn aptpl_file_matches_documented_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pr");
        let r = Reservations::new(Some(path.clone()));
        let a = nexus(1);
        prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 42, 0x01)).unwrap();
        reserve(&r, &a, 42, WE).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "version": 1,
                "registrations": [
                    { "initiator": { "port": a.initiator_port }, "target_port": 1, "key": 42 }
                ],
                "reservation": { "holder": 0, "type": 1 }
            })
        );
    }

    /// libiscsi test_reserve6_2initiators and friends.
    #[test]
    fn reserve6_between_two_initiators() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        r.reserve(&a).unwrap();
        r.reserve(&a).unwrap();
        assert_eq!(r.reserve(&b), Err(PrError::Conflict));
        assert!(r.check_access(&b, &[0x16, 0, 0, 0, 0, 0]).is_err());
        // RELEASE from a non-holder succeeds without effect.
        assert!(r.check_access(&b, &[0x17, 0, 0, 0, 0, 0]).is_ok());
        r.release(&b).unwrap();
        assert!(r.check_access(&a, &MODE_SENSE_6).is_ok());
        assert!(r.check_access(&b, &MODE_SENSE_6).is_err());
        assert!(r.check_access(&b, &TEST_UNIT_READY).is_err());
        assert!(r.check_access(&b, &INQUIRY).is_ok());
        assert!(r
            .check_access(&b, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0])
            .is_ok());
        // The same initiator port through another target port is another nexus.
        assert!(r.check_access(&on_port(a.clone(), 2), &READ_10).is_err());
        r.release(&a).unwrap();
        r.reserve(&b).unwrap();
        r.release(&b).unwrap();
        assert!(r.check_access(&a, &WRITE_10).is_ok());
        assert_consistent(&r);
    }

    #[test]
    fn reserve6_ends_with_reset_and_nexus_loss() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        r.reserve(&a).unwrap();
        r.reset();
        r.reserve(&b).unwrap();
        r.nexus_lost(&a); // not the holder: no effect
        assert_eq!(r.reserve(&a), Err(PrError::Conflict));
        r.nexus_lost(&b);
        r.reserve(&a).unwrap();
        assert_consistent(&r);
    }

    #[test]
    fn persistent_reserve_commands_conflict_under_reserve6() {
        let r = Reservations::new(None);
        let (a, b) = (nexus(1), nexus(2));
        r.reserve(&a).unwrap();
        for n in [&a, &b] {
            assert_eq!(prin(&r, n, PRIN_READ_KEYS), Err(PrError::Conflict));
            assert_eq!(register(&r, n, 0, 1), Err(PrError::Conflict));
            assert!(r
                .check_access(n, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0])
                .is_err());
        }
        assert_eq!(r.generation(), 0);
    }

    #[test]
    fn reserve6_and_release6_under_persistent_registrations() {
        let r = Reservations::new(None);
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        register_ignore(&r, &a, 1);
        // Any registration makes RESERVE conflict.
        assert_eq!(r.reserve(&a), Err(PrError::Conflict));
        assert_eq!(r.reserve(&c), Err(PrError::Conflict));
        // RELEASE: conflict unless holder (or registrant under RO / AR).
        assert_eq!(r.release(&a), Err(PrError::Conflict));
        reserve(&r, &a, 1, WE).unwrap();
        r.release(&a).unwrap();
        assert_eq!(read_reservation(&r, &a), Some((1, WE)), "not released");
        register_ignore(&r, &b, 2);
        assert_eq!(r.release(&b), Err(PrError::Conflict));
        release(&r, &a, 1, WE).unwrap();
        reserve(&r, &a, 1, WE_RO).unwrap();
        r.release(&b).unwrap();
        assert_eq!(r.release(&c), Err(PrError::Conflict));
        assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
        // Persistent reservations survive resets and nexus loss.
        r.reset();
        r.nexus_lost(&a);
        assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
    }

    #[test]
    fn transport_id_round_trip() {
        for initiator in [
            Initiator::Port("iqn.2024-01.test:h,i,0x00023d000001".into()),
            Initiator::Node("iqn.2024-01.test:a-much-longer-initiator-name".into()),
        ] {
            let encoded = encode_transport_id(&initiator);
            assert_eq!(encoded.len() % 4, 0);
            assert!(encoded.len() >= 24);
            assert_eq!(
                parse_transport_id(&encoded, 0),
                Ok((initiator, encoded.len()))
            );
        }
    }

    /// One random PERSISTENT RESERVE OUT, from one of a few nexuses, with random bytes
    /// around a plausible layout.
    fn random_prout(r: &Reservations, sender: u8, sa: u8, pr_type: u8, params: &[u8]) {
        let n = on_port(nexus(sender % 3), u16::from(sender % 2) + 1);
        let cdb = prout_cdb(sa, pr_type, params.len());
        let _ = r.persistent_reserve_out(&n, &cdb, params);
        let _ = r.check_access(&n, &WRITE_10);
        let _ = r.check_access(&n, &cdb);
        for sa in 0..5 {
            let _ = prin(r, &n, sa);
        }
        match sender % 5 {
            0 => drop(r.reserve(&n)),
            1 => drop(r.release(&n)),
            2 => r.nexus_lost(&n),
            _ => {}
        }
    }

    proptest::proptest! {
        #[test]
        fn random_parameter_lists_never_panic(
            commands in proptest::collection::vec(
                (
                    0u8..8,
                    0u8..0x20,
                    0u8..0xff,
                    proptest::collection::vec(0u8..4, 0..80),
                ),
                1..12,
            ),
        ) {
            let r = Reservations::new(None);
            for (sender, sa, pr_type, noise) in commands {
                // Small byte values make keys collide and flags hit; sometimes splice in a
                // valid TransportID so the deeper paths run.
                let mut params: Vec<u8> = noise.iter().map(|b| b & 3).collect();
                if sender % 2 == 0 {
                    params.resize(24, 0);
                    params.extend_from_slice(&[0, 0, 0, 24]);
                    params.extend_from_slice(&iscsi_transport_id(1, &nexus(sa % 3).initiator_port));
                }
                random_prout(&r, sender, sa % 9, pr_type % 10, &params);
                assert_consistent(&r);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            cdb in proptest::collection::vec(proptest::num::u8::ANY, 0..16),
            params in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
        ) {
            let r = Reservations::new(None);
            let _ = r.persistent_reserve_out(&nexus(1), &cdb, &params);
            let _ = r.persistent_reserve_in(&nexus(1), &cdb);
            let _ = r.check_access(&nexus(2), &cdb);
            let _ = parse_transport_ids(&params, 0);
            assert_consistent(&r);
        }
    }
}
