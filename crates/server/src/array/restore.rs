//! Restoring an array from its off-site copy into a new data directory (`sliver restore`).

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::{ArrayError, Result, CONFIG_FILE, ENGINE_DIR};

/// Restore an array from its off-site copy into `dir`, a new data directory: the engine's
/// files and the configuration (RFC 0003). The copy's pool stays with the source: the restored
/// array ships nowhere until it is given a prefix of its own.
pub fn restore(
    store: &Arc<dyn sliver_replica::store::ObjectStore>,
    dir: &Path,
    target: &sliver_replica::restore::Target,
    mode: &sliver_replica::restore::Mode,
) -> Result<sliver_replica::restore::RestoreReport> {
    // A configuration without an engine root is what a restore that stopped leaves: it is
    // written again.
    if sliver_engine::holds_engine(&dir.join(ENGINE_DIR)) {
        return Err(ArrayError::RestoreIntoArray(dir.to_path_buf()));
    }
    fs::create_dir_all(dir).map_err(|source| ArrayError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(sliver_replica::restore::restore(
        store,
        &dir.join(ENGINE_DIR),
        Some(&dir.join(CONFIG_FILE)),
        target,
        mode,
    )?)
}
