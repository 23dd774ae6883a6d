//! The persistent reservation state of one LU and its transitions: what each PERSISTENT
//! RESERVE OUT service action does to registrations and the reservation, and the unit
//! attentions it establishes.

use crate::outcome::invalid_param;
use crate::{Nexus, SenseReason};

use super::model::{Initiator, PrType, Registrant, Registration, Reservation, SCOPE_LU};
use super::model::{PendingUa, PrError, ProutEffects, MAX_REGISTRATIONS};
use super::prout::{ProutAction, ProutRequest, BASIC_PARAMETER_LIST_LEN};

/// Persistent reservation state. Invariants: registrations do not overlap, keys are
/// non-zero, and a reservation's holder is one of the registrants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PrState {
    pub(super) registrations: Vec<Registration>,
    pub(super) reservation: Option<Reservation>,
    /// Activate persist through power loss: the APTPL bit of the last REGISTER, REGISTER AND
    /// IGNORE EXISTING KEY or REGISTER AND MOVE.
    pub(super) aptpl: bool,
    /// PRGENERATION: counts the PERSISTENT RESERVE OUT commands that changed registrations.
    pub(super) generation: u32,
}

impl PrState {
    pub(super) fn registration_of(&self, nexus: &Nexus) -> Option<usize> {
        self.registrations
            .iter()
            .position(|r| r.registrant.matches(nexus))
    }

    pub(super) fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            None => false,
            Some(r) if r.pr_type.all_registrants() => self.registration_of(nexus).is_some(),
            Some(r) => r.holder.matches(nexus),
        }
    }

    pub(super) fn holder_key(&self) -> Option<u64> {
        let holder = &self.reservation.as_ref()?.holder;
        self.registrations
            .iter()
            .find(|r| r.registrant == *holder)
            .map(|r| r.key)
    }

    // ---- PERSISTENT RESERVE OUT ----

    pub(super) fn apply(
        &mut self,
        nexus: &Nexus,
        request: &ProutRequest,
    ) -> Result<ProutEffects, PrError> {
        // Every service action but the registering ones needs the sender registered under
        // the key it names.
        let sender = match self.registration_of(nexus) {
            Some(index) if self.registrations[index].key == request.key => {
                Ok(self.registrations[index].registrant.clone())
            }
            _ => Err(PrError::Conflict),
        };
        // PREEMPT AND ABORT: whom it preempted.
        let mut preempted = Vec::new();
        let unit_attentions = match &request.action {
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
            ProutAction::Preempt { pr_type, abort } => {
                let (unit_attentions, removed) =
                    self.preempt(nexus, sender?, request.service_action_key, *pr_type)?;
                if *abort {
                    preempted = removed.into_iter().map(|r| r.registrant).collect();
                }
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
        }?;
        Ok(ProutEffects::new(unit_attentions, preempted))
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
                    return Err(PrError::from(invalid_param(
                        BASIC_PARAMETER_LIST_LEN + 4,
                        None,
                    )));
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
                    PrError::from(invalid_param(BASIC_PARAMETER_LIST_LEN + 4, None))
                } else {
                    PrError::from(invalid_param(20, None)) // ALL_TG_PT over another port's registration
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
            return Err(PrError::from(invalid_param(20, None)));
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
    /// removed. Returns the unit attentions and the registrations it removed.
    fn preempt(
        &mut self,
        nexus: &Nexus,
        own_registrant: Registrant,
        preempted_key: u64,
        pr_type: PrType,
    ) -> Result<(Vec<PendingUa>, Vec<Registration>), PrError> {
        let not_own = |r: &Registration| r.registrant != own_registrant;
        let takes_reservation = match &self.reservation {
            None => false,
            Some(r) if r.pr_type.all_registrants() => preempted_key == 0,
            Some(_) => Some(preempted_key) == self.holder_key(),
        };
        if !takes_reservation {
            // Only registrations go; the reservation (if any) stays as it is.
            if preempted_key == 0 {
                return Err(PrError::from(invalid_param(8, None)));
            }
            let removed = self.remove_registrations(|_, r| r.key == preempted_key && not_own(r));
            if removed.is_empty() {
                return Err(PrError::Conflict);
            }
            let unit_attentions =
                unit_attentions_for(nexus, SenseReason::RegistrationsPreempted, removed.iter());
            return Ok((unit_attentions, removed));
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
        Ok((unit_attentions, removed))
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
            return Err(PrError::from(invalid_param(8, None)));
        }
        let destination_is_sender = destination.initiator.matches(nexus)
            && destination.target_port == Some(nexus.relative_target_port);
        if destination_is_sender {
            return Err(PrError::from(invalid_param(BASIC_PARAMETER_LIST_LEN, None)));
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
            Some(_) => return Err(PrError::from(invalid_param(BASIC_PARAMETER_LIST_LEN, None))),
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
