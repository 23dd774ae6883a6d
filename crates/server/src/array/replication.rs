//! The off-site copy (RFC 0003) and hydration: starting the shipper under the engine, its
//! status and restore points, and opening a restored array that still fetches its data from
//! the store.

use std::path::Path;
use std::sync::{Arc, Mutex};

use sliver_engine::{Devices, Engine, FileBackend, FormatTwoCheckpoint, RootStore};

use super::error::engine_error;
use super::open::log_recovery;
use super::{size_text, Array, ArrayError, ArrayOptions, ReplicationError, Result};

/// The off-site copy: the store and the shipper's settings.
#[derive(Debug, Clone)]
pub struct ReplicationOptions {
    pub s3: sliver_replica::store::S3Config,
    pub ship: sliver_replica::ship::ShipConfig,
}

/// A running off-site copy.
pub(super) struct Replication {
    pub(super) tap: Arc<sliver_replica::ship::ShipTap>,
    pub(super) shipper: Mutex<Option<sliver_replica::ship::Shipper>>,
    target: String,
}

/// A restored array fetching its data from the store (RFC 0003, "Hydration on demand").
pub(super) struct Hydration {
    handle: sliver_replica::hydrate::HydrationHandle,
    pub(super) hydrator: Mutex<Option<sliver_replica::hydrate::Hydrator>>,
}

/// What the API reports of the off-site copy.
#[derive(Debug, Clone)]
pub struct ReplicationReport {
    /// `s3://BUCKET/PREFIX`.
    pub target: String,
    pub status: sliver_replica::ship::ShipStatus,
}

impl Array {
    /// A restored array's progress fetching its data from the store (`None`: the array's
    /// data was all local when it opened).
    pub fn hydration(&self) -> Option<sliver_replica::hydrate::HydrationStatus> {
        Some(self.hydration.as_ref()?.handle.status())
    }

    /// The off-site copy's target and progress, when one is configured.
    pub fn replication(&self) -> Option<ReplicationReport> {
        let r = self.replication.as_ref()?;
        let shipper = r.shipper.lock().unwrap();
        Some(ReplicationReport {
            target: r.target.clone(),
            status: shipper.as_ref()?.status(),
        })
    }

    /// The off-site copy's restore points, oldest first (`None`: no copy configured).
    pub fn replication_points(&self) -> Option<Vec<sliver_replica::catalog::Point>> {
        let r = self.replication.as_ref()?;
        let shipper = r.shipper.lock().unwrap();
        Some(shipper.as_ref()?.points())
    }

    /// Run `f` on a handle of the running shipper (an error when no copy is configured or it
    /// stopped), without holding the shipper's lock: `f` may wait for the store.
    fn with_shipper<T>(
        &self,
        f: impl FnOnce(&sliver_replica::ship::ShipHandle) -> Result<T>,
    ) -> Result<T> {
        let r = self
            .replication
            .as_ref()
            .ok_or(ReplicationError::NotConfigured)?;
        let handle = r
            .shipper
            .lock()
            .unwrap()
            .as_ref()
            .map(|s| s.handle())
            .ok_or(ReplicationError::Stopped)?;
        f(&handle)
    }

    /// Ask for a restore point named `name`; the receiver answers once the store holds it.
    /// The engine is flushed first, so every write acknowledged to a host before this call is
    /// in the point (scheduled points hold what was durable when they were taken). Blocks on
    /// the flush.
    pub fn take_replication_point(
        &self,
        name: &str,
    ) -> Result<
        std::sync::mpsc::Receiver<std::result::Result<sliver_replica::catalog::Point, String>>,
    > {
        sliver_replica::catalog::check_name(name).map_err(ReplicationError::InvalidPointName)?;
        self.engine.flush().map_err(ReplicationError::Flush)?;
        self.with_shipper(|s| {
            // Asked here so that the refusal has its own cause; the shipper asks again, and a
            // point of that name taken in between comes back as its refusal.
            if s.points().iter().any(|p| p.name == name) {
                return Err(ReplicationError::PointExists(name.into()).into());
            }
            Ok(s.take_point(name).map_err(ReplicationError::Refused)?)
        })
    }

    /// Delete the restore point `name` (`Ok(None)`: there is none).
    pub fn delete_replication_point(
        &self,
        name: &str,
    ) -> Result<Option<sliver_replica::catalog::Point>> {
        self.with_shipper(|s| Ok(s.delete_point(name).map_err(ReplicationError::from)?))
    }
}

/// Start the off-site copy of the engine in `dir`: the store is connected, an array still in
/// format 2 migrated, and the engine's writes go through the returned devices, whose tap
/// ships them. `array_config` is the configuration as saved now, for the copy's base.
pub(super) fn start_shipping(
    dir: &Path,
    files: FileBackend,
    r: &ReplicationOptions,
    options: &ArrayOptions,
    array_config: Vec<u8>,
) -> Result<(Devices, Replication)> {
    use sliver_replica::{ship, store};
    let replication = |m: String| ArrayError::Config {
        path: dir.to_path_buf(),
        message: format!("replication to {}: {m}", r.s3.url),
    };
    let s3 = store::S3Store::connect(&r.s3).map_err(|e| replication(e.to_string()))?;
    let s3: Arc<dyn store::ObjectStore> = Arc::new(s3);
    let files = migrate_unshipped(dir, files, options)?;
    // The store is probed first; one that cannot be reached does not keep the array from
    // serving (the copy waits for it and says so).
    let (tap, shipper) =
        ship::ShipTap::start_or_wait(dir, files, s3, r.ship.clone(), Some(array_config))
            .map_err(|e| replication(e.to_string()))?;
    let tap = Arc::new(tap);
    Ok((
        tap.devices(),
        Replication {
            tap,
            shipper: Mutex::new(Some(shipper)),
            target: r.s3.url.clone(),
        },
    ))
}

/// Open a restored array whose data is partly still in the store it was restored from: the
/// engine over a backend that fetches what a read needs, and a thread that fetches the rest.
pub(super) fn open_hydrating(
    dir: &Path,
    options: &ArrayOptions,
    files: FileBackend,
    source: sliver_replica::hydrate::Source,
) -> Result<(Engine, Option<Replication>, Option<Hydration>)> {
    use sliver_replica::{hydrate, store};
    let config = |message: String| ArrayError::Config {
        path: dir.to_path_buf(),
        message,
    };
    if options.replication.is_some() {
        // A base read now would copy holes where the data is still in the store.
        return Err(config(format!(
            "the array is still fetching its data from {} (restored on demand): serve it without an off-site copy until GET /api/v1/hydration says done, then turn the copy on",
            source.url
        )));
    }
    let s3 = store::S3Store::connect(&store::S3Config {
        url: source.url.clone(),
        endpoint: source.endpoint.clone(),
        ..store::S3Config::default()
    })
    .map_err(|e| config(format!("the store the array was restored from: {e}")))?;
    let backend =
        hydrate::HydratingBackend::open(dir, files, Arc::new(s3), options.hydrate.clone())
            .map_err(|source| ArrayError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
    let backend = Arc::new(backend);
    let handle = backend.handle();
    let left = handle.status().bytes_left;
    tracing::info!(
        "restored array: {} still in {}, fetched on demand and in the background",
        size_text(left),
        source.url
    );
    let engine = Engine::open(backend.devices(), options.tuning, false).map_err(engine_error)?;
    log_recovery(&engine);
    let hydrator = backend.start();
    Ok((
        engine,
        None,
        Some(Hydration {
            handle,
            hydrator: Mutex::new(Some(hydrator)),
        }),
    ))
}

/// An array still in format 2 keeps its metadata in a checkpoint file that the copy does not
/// ship (the shipper copies format 4's metadata, root and log): it is migrated first,
/// opened and shut down without shipping, so the copy's base holds format 4's files and no
/// prefix of the stream depends on the old checkpoint. Other arrays are returned as they are.
fn migrate_unshipped(
    dir: &Path,
    files: FileBackend,
    options: &ArrayOptions,
) -> Result<FileBackend> {
    let io = |source| ArrayError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let format_2 =
        files.load_root().map_err(io)?.is_none() && files.load_checkpoint().map_err(io)?.is_some();
    if !format_2 {
        return Ok(files);
    }
    tracing::info!(
        "the array in {} is in format 2: migrating it before its off-site copy starts",
        dir.display()
    );
    let engine = Engine::open(Arc::new(files), options.tuning, false).map_err(engine_error)?;
    engine.shutdown().map_err(engine_error)?;
    drop(engine);
    FileBackend::open(dir, 0).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A format 2 array (the committed fixture of the engine's tests) is migrated before its
    /// copy starts: afterwards its files are format 4's (a root, no checkpoint), which the
    /// shipper copies whole; a format 4 array is left as it is.
    #[test]
    fn a_format_2_array_is_migrated_before_it_is_shipped() {
        use sliver_engine::{FormatTwoCheckpoint, RootStore};
        let dir = tempfile::tempdir().unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine/tests/fixtures/engine-v2-d8313b3.tar.gz");
        let status = std::process::Command::new("tar")
            .arg("-xzf")
            .arg(&fixture)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
        let engine_dir = dir.path().join("engine");
        let files = FileBackend::open(&engine_dir, 0).unwrap();
        assert!(files.load_root().unwrap().is_none());
        assert!(files.load_checkpoint().unwrap().is_some());
        let options = ArrayOptions::default();
        let files = migrate_unshipped(&engine_dir, files, &options).unwrap();
        assert!(
            files.load_root().unwrap().is_some(),
            "no root after the migration"
        );
        assert!(
            files.load_checkpoint().unwrap().is_none(),
            "the old checkpoint is still there"
        );
        // The migrated array opens and holds its volumes; a second call changes nothing.
        let root = files.load_root().unwrap();
        let files = migrate_unshipped(&engine_dir, files, &options).unwrap();
        assert_eq!(files.load_root().unwrap(), root);
        let engine = Engine::open(Arc::new(files), options.tuning, false).unwrap();
        assert!(!engine.volumes().is_empty());
        engine.shutdown().unwrap();
    }
}
