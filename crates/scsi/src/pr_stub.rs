//! TEMPORARY stand-in for `pr.rs` (owned by the "pr" helper) with the agreed API, so the
//! rest of the crate compiles before it lands. Implements RESERVE/RELEASE only; PERSISTENT
//! RESERVE IN/OUT answer INVALID COMMAND OPERATION CODE. Delete when pr.rs exists.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::{Nexus, Sense, SenseReason};

pub enum PrError {
    Conflict,
    Sense(Sense),
}

pub struct PendingUa {
    pub initiator_port: String,
    pub reason: SenseReason,
}

pub struct Reservations {
    holder: Mutex<Option<Nexus>>,
}

impl Reservations {
    pub fn new(_persist_path: Option<PathBuf>) -> Self {
        Reservations {
            holder: Mutex::new(None),
        }
    }

    pub fn check_access(&self, nexus: &Nexus, cdb: &[u8]) -> Result<(), ()> {
        let holder = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        match holder.as_ref() {
            Some(h) if h != nexus => match cdb.first() {
                // INQUIRY, REQUEST SENSE, REPORT LUNS, RELEASE, READ CAPACITY etc. pass.
                Some(0x12 | 0x03 | 0xa0 | 0x17 | 0x57 | 0x25 | 0x9e | 0xa3 | 0x5e) => Ok(()),
                _ => Err(()),
            },
            _ => Ok(()),
        }
    }

    pub fn persistent_reserve_in(&self, _nexus: &Nexus, _cdb: &[u8]) -> Result<Vec<u8>, PrError> {
        Err(PrError::Sense(SenseReason::InvalidOpcode.into()))
    }

    pub fn persistent_reserve_out(
        &self,
        _nexus: &Nexus,
        _cdb: &[u8],
        _params: &[u8],
    ) -> Result<Vec<PendingUa>, PrError> {
        Err(PrError::Sense(SenseReason::InvalidOpcode.into()))
    }

    pub fn reserve(&self, nexus: &Nexus) -> Result<(), PrError> {
        let mut holder = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        match holder.as_ref() {
            Some(h) if h != nexus => Err(PrError::Conflict),
            _ => {
                *holder = Some(nexus.clone());
                Ok(())
            }
        }
    }

    pub fn release(&self, nexus: &Nexus) -> Result<(), PrError> {
        let mut holder = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        if holder.as_ref() == Some(nexus) {
            *holder = None;
        }
        Ok(())
    }

    pub fn reset(&self) {
        *self.holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn nexus_lost(&self, nexus: &Nexus) {
        let mut holder = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        if holder.as_ref() == Some(nexus) {
            *holder = None;
        }
    }
}
