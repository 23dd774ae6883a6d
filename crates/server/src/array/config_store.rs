//! The array's configuration: held in memory, kept in `array.json` (replaced atomically) and,
//! when the array ships off site, recorded in the stream so a restore gets it back. The array
//! and the pool's settings owner ([`super::pool::Pool`]) both change it here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sliver_replica::ship::ShippingBackend;

use super::{write_atomically, ArrayConfig, Result, Settings, CONFIG_FILE};
use crate::events::EventLog;

pub(super) struct ConfigStore {
    dir: PathBuf,
    current: RwLock<ArrayConfig>,
    /// Bumped whenever the configuration (or the array's units, [`ConfigStore::moved`]) is
    /// changed: sessions keep their LUN table until it moves.
    generation: AtomicU64,
    /// The off-site copy that records every saved configuration.
    mirror: Option<Arc<ShippingBackend>>,
}

impl ConfigStore {
    pub(super) fn new(
        dir: &Path,
        config: ArrayConfig,
        mirror: Option<Arc<ShippingBackend>>,
    ) -> Self {
        ConfigStore {
            dir: dir.to_path_buf(),
            current: RwLock::new(config),
            generation: AtomicU64::new(0),
            mirror,
        }
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, ArrayConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration, to change: the generation moves (callers save before they assign).
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, ArrayConfig> {
        self.moved(self.current.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Move the generation while `guard` is held, and hand it back.
    pub(super) fn moved<G>(&self, guard: G) -> G {
        self.generation.fetch_add(1, Ordering::AcqRel);
        guard
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Write `config` to `array.json` (and the off-site copy's stream); the caller holds the
    /// write lock and assigns it once this succeeded.
    pub(super) fn save(&self, config: &ArrayConfig) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(config).expect("config serialises");
        write_atomically(&self.dir, CONFIG_FILE, &bytes)?;
        if let Some(mirror) = &self.mirror {
            mirror.record_config(&bytes);
        }
        Ok(())
    }

    /// Apply `change` to the kept settings and save them; whether they changed.
    pub(super) fn update_settings(&self, change: impl FnOnce(&mut Settings)) -> Result<bool> {
        let mut config = self.write();
        let mut updated = config.clone();
        change(&mut updated.settings);
        if updated.settings == config.settings {
            return Ok(false);
        }
        self.save(&updated)?;
        *config = updated;
        Ok(true)
    }
}

/// The event log, locked; a panic under the lock leaves it usable.
pub(super) fn lock_events(events: &Mutex<EventLog>) -> MutexGuard<'_, EventLog> {
    events.lock().unwrap_or_else(|e| e.into_inner())
}
