//! Opening an array: its data directory and that directory's lock, the configuration read
//! and reconciled with the engine, and the engine opened or created (with the off-site copy or
//! hydration when there is one), sized by the file system's free space.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use sliver_engine::{Devices, Engine, FileBackend};

use super::config_store::ConfigStore;
use super::error::engine_error;
use super::pool::{self, Pool};
use super::replication::{open_hydrating, start_shipping, Hydration, Replication};
use super::{
    now_ms, parse_gc_priority, Array, ArrayConfig, ArrayError, ArrayOptions, Result, VolumeKind,
    CONFIG_FILE, ENGINE_DIR, FORMAT_VERSION,
};
use crate::events::EventLog;

impl Array {
    /// Open the array in `dir`, creating an empty one with `target_name` if none exists.
    pub fn open(dir: &Path, target_name: &str) -> Result<Self> {
        Self::open_with(dir, target_name, ArrayOptions::default())
    }

    /// Open or create the array in `dir`; `options` shape a new array's engine (an existing
    /// engine keeps its geometry; its tuning is replaced).
    pub fn open_with(dir: &Path, target_name: &str, options: ArrayOptions) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ArrayError::Io { path, source }
        };
        fs::create_dir_all(dir.join("volumes")).map_err(io(dir))?;
        let lock = lock_data_dir(dir)?;
        let path = dir.join(CONFIG_FILE);
        let config = match fs::read(&path) {
            Ok(bytes) => {
                let config: ArrayConfig =
                    serde_json::from_slice(&bytes).map_err(|e| ArrayError::Config {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                if config.format_version != FORMAT_VERSION {
                    return Err(ArrayError::Config {
                        path,
                        message: format!(
                            "format version {} is not supported (expected {FORMAT_VERSION})",
                            config.format_version
                        ),
                    });
                }
                config
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ArrayConfig::new(target_name),
            Err(e) => return Err(io(&path)(e)),
        };
        let mut options = options;
        if let Some(t) = config.settings.soft_threshold {
            pool::check_soft_threshold(t).map_err(|e| ArrayError::Config {
                path: path.clone(),
                message: e.to_string(),
            })?;
            options.tuning.soft_threshold = t;
        }
        if let Some(p) = &config.settings.gc_priority {
            options.tuning.gc = parse_gc_priority(p).map_err(|e| ArrayError::Config {
                path: path.clone(),
                message: e.to_string(),
            })?;
        }
        let config_bytes = serde_json::to_vec_pretty(&config).expect("config serialises");
        let (engine, replication, hydration) =
            open_engine(&dir.join(ENGINE_DIR), &options, config_bytes)?;
        let engine = Arc::new(engine);
        // Volumes the configuration does not know were created or half-deleted when a crash
        // interrupted an operation (the engine commits first on create, last on delete).
        let known: Vec<u32> = config
            .volumes
            .iter()
            .filter_map(|v| match v.kind {
                VolumeKind::Engine { volume, .. } => Some(volume),
                _ => None,
            })
            .collect();
        for (id, _) in engine.volumes() {
            if !known.contains(&id) {
                tracing::warn!("deleting engine volume {id}, which no configured volume uses");
                engine.delete_volume(id).map_err(engine_error)?;
            }
        }
        // A crash between the engine's resize and the configuration's leaves the engine's
        // size, which is the one the data lives in.
        let mut config = config;
        for record in config.volumes.iter_mut() {
            if let VolumeKind::Engine { volume, .. } = record.kind {
                match engine.volume_size(volume) {
                    Ok(size) if size != record.size_bytes => {
                        tracing::warn!(
                            "volume '{}': size {} in the configuration, {size} in the engine; using the engine's",
                            record.name,
                            record.size_bytes
                        );
                        record.size_bytes = size;
                    }
                    _ => {}
                }
            }
        }
        engine.start_background();
        let (events, skipped) = EventLog::open(dir).map_err(io(dir))?;
        if skipped > 0 {
            tracing::warn!("{skipped} damaged lines of the event log skipped");
        }
        let config = Arc::new(ConfigStore::new(
            dir,
            config,
            replication.as_ref().map(|r| r.tap.clone()),
        ));
        let events = Arc::new(Mutex::new(events));
        let array = Array {
            dir: dir.to_path_buf(),
            _lock: lock,
            pool: Arc::new(Pool::new(engine.clone(), config.clone(), events.clone())),
            engine,
            config,
            units: RwLock::new(BTreeMap::new()),
            events,
            opened_ms: now_ms(),
            replication,
            hydration,
        };
        let (volumes, target) = {
            let config = array.config.read();
            (config.volumes.clone(), config.target_name.clone())
        };
        for record in &volumes {
            let unit = array.open_unit(record, &target)?;
            array
                .units
                .write()
                .unwrap()
                .insert(record.name.clone(), unit);
        }
        array.save()?;
        Ok(array)
    }
}

/// Open the engine in `dir`, creating it when the directory holds none; with replication
/// configured, under a backend that ships every write (the store probed first).
/// `array_config` is the configuration as saved now, for the copy's base.
fn open_engine(
    dir: &Path,
    options: &ArrayOptions,
    array_config: Vec<u8>,
) -> Result<(Engine, Option<Replication>, Option<Hydration>)> {
    let io = |source| ArrayError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::create_dir_all(dir).map_err(io)?;
    let exists = sliver_engine::holds_engine(dir);
    let capacity = match (exists, options.capacity_bytes) {
        (true, _) => 0,
        (false, Some(c)) => c,
        (false, None) => free_space(dir).map_err(io)? / 10 * 9,
    };
    if !exists && sliver_replica::hydrate::folder_exists(dir) {
        // Creating an array here would later have the old map's bytes fetched over it.
        return Err(ArrayError::Config {
            path: dir.to_path_buf(),
            message: "holds a restore that stopped before it finished (hydration state but no root): run `sliver restore` into this directory again, or remove it".into(),
        });
    }
    let files = FileBackend::open(dir, capacity).map_err(io)?;
    let source = if exists {
        sliver_replica::hydrate::pending(dir).map_err(io)?
    } else {
        None
    };
    if let Some(source) = source {
        return open_hydrating(dir, options, files, source);
    }
    if options.hydrate.rate_limit > 0 {
        tracing::warn!(
            "--hydrate-rate ignored: the array holds every byte locally (nothing to fetch)"
        );
    }
    let (devices, replication): (Devices, _) = match &options.replication {
        None => (Arc::new(files).into(), None),
        Some(r) => {
            let (devices, replication) = start_shipping(dir, files, r, options, array_config)?;
            (devices, Some(replication))
        }
    };
    let engine = if exists {
        Engine::open(devices, options.tuning, false)
    } else {
        Engine::create(devices, options.engine, options.tuning)
    }
    .map_err(engine_error)?;
    log_recovery(&engine);
    Ok((engine, replication, None))
}

pub(super) fn log_recovery(engine: &Engine) {
    let r = engine.recovery();
    if r.records_replayed > 0 {
        tracing::info!(
            "engine recovered: {} log records ({} bytes) replayed in {:?}{}",
            r.records_replayed,
            r.bytes_replayed,
            r.duration,
            if r.torn_tail {
                ", torn tail repaired"
            } else {
                ""
            }
        );
    }
}

/// Bytes available to unprivileged users on the file system holding `dir`.
pub fn free_space(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Take the data directory's lock (`<dir>/lock`, flock), refusing when another process holds it.
pub fn lock_data_dir(dir: &Path) -> Result<fs::File> {
    use std::os::unix::io::AsRawFd;
    let path = dir.join("lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ArrayError::Io {
            path: path.clone(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(ArrayError::Locked(dir.to_path_buf()));
    }
    Ok(file)
}
