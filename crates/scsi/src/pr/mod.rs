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
//! With APTPL in force the state is also saved to a file; `aptpl` describes its format.
//!
//! # Layout
//!
//! - this module: the LU-facing [`Reservations`] (locking, copy-then-replace, SPC-2 RESERVE /
//!   RELEASE);
//! - `model`: reservation types, initiators, registrants, registrations and the reservation,
//!   and what a reservation command ends with ([`PrError`], [`PendingUa`]);
//! - `state`: the persistent reservation state and its PERSISTENT RESERVE OUT transitions;
//! - `prout`: the PERSISTENT RESERVE OUT parameter list with the parsed CDB, and iSCSI
//!   TransportIDs;
//! - `prin`: the PERSISTENT RESERVE IN parameter data;
//! - `access`: which commands a reservation lets through;
//! - `aptpl`: the APTPL file.
//!
//! PREEMPT AND ABORT also aborts the preempted nexuses' running commands and ends only once
//! they have ended (`crate::tmf::unit`): they end with TASK ABORTED, and their effects are
//! all in place before the fencing node hears GOOD. The sender's own nexus is spared whole
//! (SPC-4 spares only the command itself; another registration of the sender's own port is
//! a corner no cluster uses).
//!
//! # Not implemented
//!
//! Only the iSCSI TransportID (protocol identifier 5) is accepted.

mod access;
mod aptpl;
mod model;
mod prin;
mod prout;
mod state;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cdb::{PrinAction, ProutCdb};
use crate::param::ParamList;
use crate::{Nexus, Sense, SenseReason};

use aptpl::{load_aptpl_file, remove_durably, write_atomically};
use prout::ProutRequest;
use state::PrState;

pub(crate) use access::{AccessClass, ReservationAccess, Spc2Access};
pub use model::{PendingUa, PrError, ProutEffects, MAX_REGISTRATIONS};

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

    /// Whether `nexus` may run `cdb` given the reservations in force, for a caller that did
    /// not dispatch it: [`Reservations::admits`] with the access [`crate::dispatch()`] decides.
    /// A CDB that does not parse passes: its sense answers it before any reservation.
    #[cfg(test)]
    pub(crate) fn check_access(&self, nexus: &Nexus, cdb: &[u8]) -> Result<(), ()> {
        match crate::dispatch(cdb, 0, &[]).reservation_access {
            Some(access) => self.admits(nexus, access),
            None => Ok(()),
        }
    }

    /// Whether `nexus` may run a command of `access` given the reservations in force.
    /// `Err(())` means the command ends with RESERVATION CONFLICT. RESERVE, RELEASE and
    /// PERSISTENT RESERVE OUT pass here as far as persistent reservations go: their own
    /// methods decide.
    #[allow(clippy::result_unit_err)] // The API agreed with the LU: the only error is a conflict.
    pub(crate) fn admits(&self, nexus: &Nexus, access: ReservationAccess) -> Result<(), ()> {
        if !self.restricted.load(Ordering::Acquire) {
            return Ok(());
        }
        let state = self.read();
        if let Some(holder) = &state.reserved_by {
            return match access.spc2 {
                Spc2Access::Anyone => Ok(()),
                Spc2Access::HolderOnly if is_same_nexus(holder, nexus) => Ok(()),
                Spc2Access::HolderOnly | Spc2Access::Nobody => Err(()),
            };
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
        let allowed = match access.persistent {
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

    /// PERSISTENT RESERVE IN of service `action` (as parsed: a reserved one is its sense): the
    /// complete parameter data (the caller truncates it to the ALLOCATION LENGTH).
    pub fn persistent_reserve_in(
        &self,
        _nexus: &Nexus,
        action: Result<PrinAction, Sense>,
    ) -> Result<Vec<u8>, PrError> {
        let state = self.read();
        if state.reserved_by.is_some() {
            return Err(PrError::Conflict);
        }
        let pr = &state.persistent;
        match action {
            Ok(PrinAction::ReadKeys) => Ok(pr.read_keys()),
            Ok(PrinAction::ReadReservation) => Ok(pr.read_reservation()),
            Ok(PrinAction::ReportCapabilities) => {
                Ok(pr.report_capabilities(self.persist_path.is_some()))
            }
            Ok(PrinAction::ReadFullStatus) => Ok(pr.read_full_status()),
            Err(sense) => Err(PrError::Sense(sense)),
        }
    }

    /// PERSISTENT RESERVE OUT, parsed into `cdb`, with its parameter list (exactly PARAMETER
    /// LIST LENGTH bytes). Returns the unit attentions to establish for other initiator ports, and the nexuses
    /// whose tasks a PREEMPT AND ABORT aborts.
    pub fn persistent_reserve_out(
        &self,
        nexus: &Nexus,
        cdb: &ProutCdb,
        params: &[u8],
    ) -> Result<ProutEffects, PrError> {
        let request =
            ProutRequest::parse(cdb, ParamList::new(params), self.persist_path.is_some())?;
        self.update(|state| {
            if state.reserved_by.is_some() {
                return Err(PrError::Conflict);
            }
            let mut next = state.persistent.clone();
            let effects = next.apply(nexus, &request)?;
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
            Ok(effects)
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
