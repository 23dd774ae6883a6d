//! The APTPL file: the persistent reservation state saved across restarts, written and
//! removed durably.
//!
//! # File format (version 1)
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
//! `version`, or that fails validation, is not loaded (see
//! [`Reservations::load_error`](super::Reservations::load_error)).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SenseReason;

use super::model::{Initiator, PrType, Registrant, Registration, Reservation};
use super::model::{PrError, MAX_REGISTRATIONS};
use super::prout::validate_iscsi_name;
use super::state::PrState;

/// Version of the APTPL file format written by this code.
const APTPL_FILE_VERSION: u32 = 1;

impl PrState {
    pub(super) fn to_aptpl_file(&self) -> Result<Vec<u8>, PrError> {
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
pub(super) fn load_aptpl_file(path: &Path) -> Result<Option<PrState>, String> {
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
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
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

pub(super) fn remove_durably(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => File::open(parent_dir(path))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
