//! Checking an array offline (`sliver check`): the engine's own check, and the configuration's
//! references into the engine.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use sliver_engine::{Engine, FileBackend, Tuning};

use super::error::engine_error;
use super::{lock_data_dir, ArrayConfig, ArrayError, Result, VolumeKind, CONFIG_FILE, ENGINE_DIR};

/// Verify an array offline: the engine (reference counts, segment usage, every stored chunk)
/// and the configuration's references into it. Returns the problems found (empty: healthy).
pub fn check_array(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Vec<String>> {
    if !dir.join(CONFIG_FILE).exists() {
        return Err(ArrayError::Config {
            path: dir.join(CONFIG_FILE),
            message: "no array here".into(),
        });
    }
    let _lock = lock_data_dir(dir)?;
    let bytes = fs::read(dir.join(CONFIG_FILE)).map_err(|source| ArrayError::Io {
        path: dir.join(CONFIG_FILE),
        source,
    })?;
    let config: ArrayConfig = serde_json::from_slice(&bytes).map_err(|e| ArrayError::Config {
        path: dir.join(CONFIG_FILE),
        message: e.to_string(),
    })?;
    let engine_dir = dir.join(ENGINE_DIR);
    if sliver_replica::hydrate::folder_exists(&engine_dir) {
        // Its files still have holes where the data is in the store: they would read as
        // damage that is not there.
        return Err(ArrayError::Config {
            path: engine_dir,
            message: "the array is still fetching its data from the store it was restored from: check it once GET /api/v1/hydration says done".into(),
        });
    }
    let backend = Arc::new(
        FileBackend::open(&engine_dir, 0).map_err(|source| ArrayError::Io {
            path: engine_dir.clone(),
            source,
        })?,
    );
    let engine = Engine::open(backend, Tuning::default(), true).map_err(engine_error)?;
    let mut problems = engine.check(progress);
    let engine_volumes: Vec<u32> = engine.volumes().into_iter().map(|(id, _)| id).collect();
    for v in &config.volumes {
        if let VolumeKind::Engine { volume, .. } = v.kind {
            match engine.volume_size(volume) {
                Err(_) => problems.push(format!(
                    "volume '{}' refers to missing engine volume {volume}",
                    v.name
                )),
                Ok(size) if size != v.size_bytes => problems.push(format!(
                    "volume '{}' is {} bytes in the configuration but {size} in the engine",
                    v.name, v.size_bytes
                )),
                Ok(_) => {}
            }
        }
    }
    for id in engine_volumes {
        let used = config
            .volumes
            .iter()
            .any(|v| matches!(v.kind, VolumeKind::Engine { volume, .. } if volume == id));
        if !used {
            // Left by a crash between the engine and the configuration update: not damage.
            tracing::warn!(
                "engine volume {id} is not in the configuration; the next start deletes it"
            );
        }
    }
    if engine.recovery().torn_tail {
        // Not damage: the tail after the last flush was incomplete, as after any crash.
        tracing::info!("the log ends in a torn record (unflushed writes at a crash); the next start repairs it");
    }
    Ok(problems)
}
