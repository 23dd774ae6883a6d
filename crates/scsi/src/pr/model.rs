//! The reservation model: persistent reservation types, the initiators and I_T nexuses a
//! registration covers, registrations and reservations as the state holds them, and what a
//! reservation command ends with.

use serde::{Deserialize, Serialize};

use crate::outcome::Failure;
use crate::{Nexus, Sense, SenseReason};

/// Separator between the iSCSI name and the ISID in an iSCSI initiator port name.
pub(super) const ISID_SEPARATOR: &str = ",i,0x";

/// LU_SCOPE, the only scope SPC-4 still defines.
pub(super) const SCOPE_LU: u8 = 0x0;

/// Persistent reservation types (SPC-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PrType {
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    pub(super) fn from_code(code: u8) -> Option<Self> {
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

    pub(super) fn code(self) -> u8 {
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
    pub(super) fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registered nexuses that are not the holder still get full access.
    pub(super) fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        )
    }

    /// Registered non-holders have full access (registrants-only and all-registrants types).
    pub(super) fn admits_registrants(self) -> bool {
        self.registrants_only() || self.all_registrants()
    }

    /// Reads are restricted too, not only writes.
    pub(super) fn exclusive_access(self) -> bool {
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
pub(super) enum Initiator {
    /// One SCSI initiator port, "name,i,0xISID" (TransportID format 01b, or the nexus itself).
    Port(String),
    /// Every port of one iSCSI initiator name (TransportID format 00b).
    Node(String),
}

impl Initiator {
    /// iSCSI names are case-insensitive (RFC 3722 folds them to lower case) and the ISID is
    /// hex, so all comparisons ignore ASCII case.
    pub(super) fn matches(&self, nexus: &Nexus) -> bool {
        match self {
            Initiator::Port(port) => port.eq_ignore_ascii_case(&nexus.initiator_port),
            Initiator::Node(name) => name.eq_ignore_ascii_case(&nexus.initiator_name),
        }
    }

    /// The iSCSI name part.
    pub(super) fn name(&self) -> &str {
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

    /// Where unit attentions for this initiator go (see
    /// [`PendingUa::initiator_port`](PendingUa::initiator_port)).
    pub(super) fn ua_port(&self) -> &str {
        match self {
            Initiator::Port(port) => port,
            Initiator::Node(name) => name,
        }
    }
}

pub(super) fn find_ignore_ascii_case(haystack: &str, needle: &str) -> Option<usize> {
    // ASCII lower-casing keeps byte offsets, so the offset is valid in `haystack`.
    haystack
        .to_ascii_lowercase()
        .find(&needle.to_ascii_lowercase())
}

/// The I_T nexuses one registration covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Registrant {
    pub(super) initiator: Initiator,
    /// Relative target port identifier; `None` for every target port (ALL_TG_PT=1).
    pub(super) target_port: Option<u16>,
}

impl Registrant {
    pub(super) fn of(nexus: &Nexus, all_target_ports: bool) -> Self {
        Registrant {
            initiator: Initiator::Port(nexus.initiator_port.clone()),
            target_port: (!all_target_ports).then_some(nexus.relative_target_port),
        }
    }

    pub(super) fn matches(&self, nexus: &Nexus) -> bool {
        self.initiator.matches(nexus)
            && self
                .target_port
                .is_none_or(|port| port == nexus.relative_target_port)
    }

    pub(super) fn covers(&self, other: &Registrant) -> bool {
        self.initiator.covers(&other.initiator)
            && match (self.target_port, other.target_port) {
                (None, _) => true,
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
            }
    }

    pub(super) fn overlaps(&self, other: &Registrant) -> bool {
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
pub(super) struct Registration {
    pub(super) registrant: Registrant,
    pub(super) key: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reservation {
    pub(super) pr_type: PrType,
    /// The registrant that holds it; for the all-registrants types any registrant (kept only
    /// so the invariant "the holder is registered" holds for every type).
    pub(super) holder: Registrant,
}

/// What a PERSISTENT RESERVE OUT asks of the logical unit beyond its reservation state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProutEffects {
    /// Unit attentions to establish for other initiator ports.
    pub unit_attentions: Vec<PendingUa>,
    /// PREEMPT AND ABORT: the registrants it preempted, whose tasks it aborts.
    preempted: Vec<Registrant>,
}

impl ProutEffects {
    pub(super) fn new(unit_attentions: Vec<PendingUa>, preempted: Vec<Registrant>) -> Self {
        ProutEffects {
            unit_attentions,
            preempted,
        }
    }

    /// Whether the command aborts tasks at all.
    pub fn aborts_tasks(&self) -> bool {
        !self.preempted.is_empty()
    }

    /// Whether it aborts the tasks of `nexus`.
    pub fn aborts_tasks_of(&self, nexus: &Nexus) -> bool {
        self.preempted.iter().any(|r| r.matches(nexus))
    }
}

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

impl From<Failure> for PrError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Check(sense) => PrError::Sense(sense),
            Failure::Conflict => PrError::Conflict,
        }
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

impl From<PrError> for Failure {
    fn from(e: PrError) -> Self {
        match e {
            PrError::Conflict => Failure::Conflict,
            PrError::Sense(s) => Failure::Check(s),
        }
    }
}
