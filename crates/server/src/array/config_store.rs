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

    /// Apply `change` to the kept settings and save them, then `apply` them (to the engine)
    /// while the configuration is still locked, so that concurrent changes reach the engine
    /// in the order they were saved and the value in effect is the one in `array.json`.
    /// Returns whether the kept settings changed. Settings do not move the generation: no
    /// session's LUN table depends on them.
    pub(super) fn update_settings(
        &self,
        change: impl FnOnce(&mut Settings),
        apply: impl FnOnce(),
    ) -> Result<bool> {
        let mut config = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut updated = config.clone();
        change(&mut updated.settings);
        let changed = updated.settings != config.settings;
        if changed {
            self.save(&updated)?;
            *config = updated;
        }
        apply();
        Ok(changed)
    }
}

/// The event log, locked; a panic under the lock leaves it usable.
pub(super) fn lock_events(events: &Mutex<EventLog>) -> MutexGuard<'_, EventLog> {
    events.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_applied_under_the_lock_they_are_saved_under_and_keep_the_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConfigStore::new(dir.path(), ArrayConfig::new("iqn.2026-11.test:a"), None);
        let before = store.generation();
        let mut applied = 0;
        let changed = store
            .update_settings(
                |s| s.soft_threshold = Some(0.5),
                || {
                    // A second change (or a reader) waits until this one is in effect.
                    assert!(store.current.try_write().is_err(), "applied under the lock");
                    applied += 1;
                },
            )
            .unwrap();
        assert!(changed);
        assert_eq!(applied, 1);
        assert_eq!(store.read().settings.soft_threshold, Some(0.5));
        let saved = std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap();
        assert!(saved.contains("\"soft_threshold\": 0.5"), "{saved}");
        // The same value again: nothing saved, applied all the same (the engine may have
        // been tuned from elsewhere), and the LUN tables' generation never moved.
        let changed = store
            .update_settings(|s| s.soft_threshold = Some(0.5), || applied += 1)
            .unwrap();
        assert!(!changed);
        assert_eq!(applied, 2);
        assert_eq!(store.generation(), before);
    }
}
