//! The array's configuration: held in memory, kept in `array.json` (replaced atomically) and,
//! when the array ships off site, recorded in the stream so a restore gets it back. The array
//! and the pool's settings owner ([`super::pool::Pool`]) both change it here.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sliver_replica::ship::ShipTap;

use super::{ArrayConfig, ArrayError, Result, Settings, VolumeRecord, CONFIG_FILE};
use crate::events::EventLog;

pub(super) struct ConfigStore {
    dir: PathBuf,
    current: RwLock<ArrayConfig>,
    /// Bumped whenever the configuration (or the array's units, [`ConfigStore::moved`]) is
    /// changed: sessions keep their LUN table until it moves.
    generation: AtomicU64,
    /// The off-site copy that records every saved configuration.
    mirror: Option<Arc<ShipTap>>,
}

impl ConfigStore {
    pub(super) fn new(dir: &Path, config: ArrayConfig, mirror: Option<Arc<ShipTap>>) -> Self {
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
    /// write lock and assigns it once this succeeded. A failure leaves the file as it was, so
    /// memory kept as it was matches it.
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

impl ConfigStore {
    /// Apply `change` to the record of the volume whose id is `id` and save it; its name, or
    /// `None` when no volume has that id. Like the settings, a volume's own settings do not
    /// move the generation: no session's LUN table depends on them.
    pub(super) fn update_volume(
        &self,
        id: &str,
        change: impl FnOnce(&mut VolumeRecord),
    ) -> Result<Option<String>> {
        let mut config = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut updated = config.clone();
        let Some(record) = updated.volumes.iter_mut().find(|v| v.id == id) else {
            return Ok(None);
        };
        change(record);
        let name = record.name.clone();
        self.save(&updated)?;
        *config = updated;
        Ok(Some(name))
    }
}

/// Replace `dir/name` with `bytes` so that a crash leaves the old or the new content, and a
/// failure the old one: until the directory is synced after the rename, the old file is
/// kept under another name (a hard link), and put back if the sync fails. Without that, a
/// failed sync after a successful rename left the new content in the file while the caller,
/// told the save failed, kept the old configuration in memory, and the next start or save
/// would have brought back a change the administrator was told had failed.
pub(super) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    write_atomically_syncing(dir, name, bytes, |dir| fs::File::open(dir)?.sync_all())
}

fn write_atomically_syncing(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    sync_dir: impl Fn(&Path) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let kept = dir.join(format!(".{name}.old"));
    let target = dir.join(name);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ArrayError::Io { path, source }
    };
    // The configuration holds CHAP secrets: owner-only, like /etc/shadow's spirit.
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?
    };
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    // A link left by a crash in between is stale: the file itself is the newer.
    match fs::remove_file(&kept) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&kept)(e)),
        _ => {}
    }
    let had_old = match fs::hard_link(&target, &kept) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(&kept)(e)),
    };
    fs::rename(&tmp, &target).map_err(io(&target))?;
    if let Err(e) = sync_dir(dir) {
        let put_back = if had_old {
            fs::rename(&kept, &target)
        } else {
            fs::remove_file(&target)
        };
        if let Err(back) = put_back {
            tracing::error!(
                "{}: the new configuration is in place but its directory could not be synced \
                 ({e}), and the old one could not be put back ({back})",
                target.display()
            );
        }
        return Err(io(dir)(e));
    }
    if had_old {
        // Only a name: the old content is not needed any more, and a stale link is removed
        // by the next save.
        let _ = fs::remove_file(&kept);
    }
    Ok(())
}

/// The event log, locked; a panic under the lock leaves it usable.
pub(super) fn lock_events(events: &Mutex<EventLog>) -> MutexGuard<'_, EventLog> {
    events.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_whose_directory_cannot_be_synced_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.json");
        let names = || {
            let mut n: Vec<String> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        let failing = |_: &Path| Err(std::io::Error::other("injected"));
        // No file yet: a failed first save leaves none.
        assert!(write_atomically_syncing(dir.path(), "c.json", b"first", failing).is_err());
        assert!(!file.exists());
        write_atomically(dir.path(), "c.json", b"old").unwrap();
        let refused = write_atomically_syncing(dir.path(), "c.json", b"new", failing);
        assert!(matches!(refused, Err(ArrayError::Io { .. })), "{refused:?}");
        assert_eq!(fs::read(&file).unwrap(), b"old");
        write_atomically(dir.path(), "c.json", b"newer").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"newer");
        // Only the file is left: neither the temporary copy nor the kept link.
        assert_eq!(names(), vec!["c.json".to_string()]);
    }

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
