//! Volumes: creating them (thin engine volumes, passthrough files, snapshots and clones),
//! renaming, growing and deleting them, their storage, and the logical unit each is served as.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use sliver_api_types::WriteCache;
use sliver_engine::EngineVolume;
use sliver_scsi::{LogicalUnit, LuConfig};
use sliver_volume::{FileVolume, Volume};

use super::error::engine_error;
use super::{
    quoted_list, size_text, validate_name, write_cache, Array, ArrayError, Result, VolumeKind,
    VolumeRecord, PRODUCT, VENDOR,
};
use crate::events::NewEvent;

/// Locally chosen 24-bit company ID (the IEEE "CID" form: X bit set) for NAA type 6 names.
const NAA_COMPANY_ID: u32 = 0xDA_5C_11;

impl Array {
    /// Create a thin engine volume of `size_bytes` (a multiple of the engine's chunk size),
    /// write-through.
    pub fn create_volume(&self, name: &str, size_bytes: u64, block_size: u32) -> Result<()> {
        self.create_volume_caching(name, size_bytes, block_size, WriteCache::WriteThrough)
    }

    /// [`Array::create_volume`] with the write cache `write_cache`.
    pub fn create_volume_caching(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        write_cache: WriteCache,
    ) -> Result<()> {
        self.create_volume_unrecorded(name, size_bytes, block_size, write_cache)
            .inspect(|_| {
                self.volume_event(
                    "volume_created",
                    name,
                    format!("volume {name} created ({})", size_text(size_bytes)),
                )
            })
    }

    fn create_volume_unrecorded(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        write_cache: WriteCache,
    ) -> Result<()> {
        self.check_new_volume(name, size_bytes, block_size)?;
        let chunk = self.engine.chunk_size() as u64;
        if !size_bytes.is_multiple_of(chunk) || !chunk.is_multiple_of(block_size as u64) {
            return Err(ArrayError::InvalidSize(size_bytes));
        }
        let volume = self
            .engine
            .create_volume(size_bytes)
            .map_err(engine_error)?;
        self.add_volume(
            name,
            size_bytes,
            block_size,
            VolumeKind::Engine {
                volume,
                read_only: false,
            },
            None,
            write_cache,
        )
        .inspect_err(|_| {
            let _ = self.engine.delete_volume(volume);
        })
    }

    /// Create a passthrough volume: data stored as is in a sparse file under the data dir.
    pub fn create_passthrough_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        write_cache: WriteCache,
    ) -> Result<()> {
        self.create_passthrough_volume_unrecorded(name, size_bytes, block_size, write_cache)
            .inspect(|_| {
                self.volume_event(
                    "volume_created",
                    name,
                    format!(
                        "passthrough volume {name} created ({})",
                        size_text(size_bytes)
                    ),
                )
            })
    }

    fn create_passthrough_volume_unrecorded(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        write_cache: WriteCache,
    ) -> Result<()> {
        self.check_new_volume(name, size_bytes, block_size)?;
        let path = PathBuf::from("volumes").join(format!("{:032x}.img", rand::random::<u128>()));
        self.add_volume(
            name,
            size_bytes,
            block_size,
            VolumeKind::Passthrough { path },
            None,
            write_cache,
        )
    }

    /// A read-only, point-in-time copy of `source` named `name`, sharing all its data.
    pub fn snapshot_volume(&self, source: &str, name: &str) -> Result<()> {
        self.copy_engine_volume(source, name, true)
    }

    /// A writable copy of `source` named `name`, sharing all its data until either changes.
    pub fn clone_volume(&self, source: &str, name: &str) -> Result<()> {
        self.copy_engine_volume(source, name, false)
    }

    /// A snapshot (`read_only`) or clone of `source` named `name`, and its event.
    fn copy_engine_volume(&self, source: &str, name: &str, read_only: bool) -> Result<()> {
        let (kind, copy) = if read_only {
            ("snapshot_created", "snapshot")
        } else {
            ("clone_created", "clone")
        };
        self.clone_engine_volume(source, name, read_only)
            .inspect(|_| {
                self.volume_event(kind, name, format!("{copy} {name} of {source} created"))
            })
    }

    fn clone_engine_volume(&self, source: &str, name: &str, read_only: bool) -> Result<()> {
        let record = self
            .volumes()
            .into_iter()
            .find(|v| v.name == source)
            .ok_or_else(|| ArrayError::NoSuchVolume(source.into()))?;
        let VolumeKind::Engine { volume: src, .. } = record.kind else {
            return Err(ArrayError::NotSupported(format!(
                "volume '{source}' is a passthrough volume: snapshots and clones need engine volumes"
            )));
        };
        self.check_new_volume(name, record.size_bytes, record.block_size)?;
        let volume = self.engine.clone_volume(src).map_err(engine_error)?;
        self.add_volume(
            name,
            record.size_bytes,
            record.block_size,
            VolumeKind::Engine { volume, read_only },
            Some(record.id.clone()),
            // A clone starts as its source is set up (a snapshot has no writes to cache).
            record.write_cache,
        )
        .inspect_err(|_| {
            let _ = self.engine.delete_volume(volume);
        })
    }

    fn check_new_volume(&self, name: &str, size_bytes: u64, block_size: u32) -> Result<()> {
        validate_name(name)?;
        if size_bytes == 0 || !size_bytes.is_multiple_of(block_size as u64) {
            return Err(ArrayError::InvalidSize(size_bytes));
        }
        if self.config.read().volumes.iter().any(|v| v.name == name) {
            return Err(ArrayError::VolumeExists(name.into()));
        }
        Ok(())
    }

    /// Record a volume whose storage exists and open its logical unit.
    fn add_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        kind: VolumeKind,
        source_id: Option<String>,
        write_cache: WriteCache,
    ) -> Result<()> {
        let mut config = self.config_mut();
        if config.volumes.iter().any(|v| v.name == name) {
            return Err(ArrayError::VolumeExists(name.into()));
        }
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64);
        let record = VolumeRecord {
            name: name.into(),
            id: format!("{:032x}", rand::random::<u128>()),
            size_bytes,
            block_size,
            kind,
            created_ms,
            source_id,
            write_cache,
        };
        let unit = self.open_unit(&record, &config.target_name)?;
        self.commit(&mut config, |c| c.volumes.push(record))?;
        self.units_mut().insert(name.into(), unit);
        Ok(())
    }

    /// Release a volume's storage after its record left the configuration (engine: delete the
    /// volume, freeing what nothing else shares; passthrough: remove the file).
    pub fn destroy_storage(&self, record: &VolumeRecord) -> Result<()> {
        match &record.kind {
            VolumeKind::Engine { volume, .. } => {
                self.engine.delete_volume(*volume).map_err(engine_error)
            }
            VolumeKind::Passthrough { path } => {
                let path = self.dir.join(path);
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(ArrayError::Io { path, source: e })
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Resize a volume's storage (engine volumes only; passthrough files keep their size).
    pub fn resize_storage(&self, record: &VolumeRecord, size_bytes: u64) -> Result<()> {
        match &record.kind {
            VolumeKind::Engine {
                volume,
                read_only: false,
            } => {
                if !size_bytes.is_multiple_of(self.engine.chunk_size() as u64) {
                    return Err(ArrayError::InvalidSize(size_bytes));
                }
                self.engine
                    .resize_volume(*volume, size_bytes)
                    .map_err(engine_error)
            }
            VolumeKind::Engine { .. } => Err(ArrayError::NotSupported(
                "snapshots cannot be resized".into(),
            )),
            VolumeKind::Passthrough { .. } => Err(ArrayError::NotSupported(
                "passthrough volumes cannot be resized".into(),
            )),
        }
    }

    /// Delete a volume (or snapshot): refused while it is connected to a host. Shared data
    /// stays with the volumes that still reference it.
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        self.delete_volume_unrecorded(name).inspect(|_| {
            self.volume_event("volume_deleted", name, format!("volume {name} deleted"))
        })
    }

    fn delete_volume_unrecorded(&self, name: &str) -> Result<()> {
        let record = {
            let mut config = self.config_mut();
            let connected = config.connections.iter().filter(|c| c.volume == name);
            if let Some(hosts) = quoted_list(connected.map(|c| c.host.as_str())) {
                return Err(ArrayError::VolumeConnected {
                    volume: name.into(),
                    hosts,
                });
            }
            let index = config
                .volumes
                .iter()
                .position(|v| v.name == name)
                .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
            let record = config.volumes[index].clone();
            // The record leaves the configuration first: a crash before the engine delete
            // leaves an orphan engine volume, which the next open deletes.
            self.commit(&mut config, |c| {
                c.volumes.remove(index);
            })?;
            self.units_mut().remove(name);
            record
        };
        self.destroy_storage(&record)
    }

    /// Rename a volume; hosts keep seeing the same disk (serial and NAA derive from its id).
    pub fn rename_volume(&self, name: &str, new_name: &str) -> Result<()> {
        self.rename_volume_unrecorded(name, new_name).inspect(|_| {
            self.volume_event(
                "volume_renamed",
                new_name,
                format!("volume {name} renamed {new_name}"),
            )
        })
    }

    fn rename_volume_unrecorded(&self, name: &str, new_name: &str) -> Result<()> {
        validate_name(new_name)?;
        let mut config = self.config_mut();
        if config.volumes.iter().any(|v| v.name == new_name) {
            return Err(ArrayError::VolumeExists(new_name.into()));
        }
        self.try_commit(&mut config, |c| {
            let record = c
                .volumes
                .iter_mut()
                .find(|v| v.name == name)
                .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
            record.name = new_name.into();
            for c in c.connections.iter_mut().filter(|c| c.volume == name) {
                c.volume = new_name.into();
            }
            Ok(())
        })?;
        let mut units = self.units_mut();
        if let Some(unit) = units.remove(name) {
            units.insert(new_name.into(), unit);
        }
        Ok(())
    }

    /// Grow a volume to `size_bytes`; connected hosts get CAPACITY DATA HAS CHANGED.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<()> {
        self.resize_volume_unrecorded(name, size_bytes)
            .inspect(|_| {
                self.volume_event(
                    "volume_resized",
                    name,
                    format!("volume {name} resized to {}", size_text(size_bytes)),
                )
            })
    }

    fn resize_volume_unrecorded(&self, name: &str, size_bytes: u64) -> Result<()> {
        let mut config = self.config_mut();
        let index = config
            .volumes
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
        let record = config.volumes[index].clone();
        if size_bytes == record.size_bytes {
            return Ok(());
        }
        if size_bytes < record.size_bytes {
            return Err(ArrayError::Shrink {
                volume: name.into(),
                from: record.size_bytes,
                to: size_bytes,
            });
        }
        if !size_bytes.is_multiple_of(record.block_size as u64) {
            return Err(ArrayError::InvalidSize(size_bytes));
        }
        // Engine first: the open reconciles the configured size with the engine's.
        self.resize_storage(&record, size_bytes)?;
        self.commit(&mut config, |c| c.volumes[index].size_bytes = size_bytes)?;
        if let Some(unit) = self.units.read().unwrap().get(name) {
            unit.capacity_changed();
        }
        Ok(())
    }

    /// Space figures of one volume.
    pub fn volume_space(&self, name: &str) -> Result<sliver_volume::VolumeSpace> {
        let unit = self
            .unit(name)
            .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
        Ok(unit.volume().space()?)
    }

    fn volume_event(&self, kind: &'static str, volume: &str, message: String) {
        self.record_event(NewEvent {
            kind,
            message,
            volume: Some(volume.into()),
            ..NewEvent::default()
        });
    }

    pub(super) fn open_unit(
        &self,
        record: &VolumeRecord,
        target_name: &str,
    ) -> Result<Arc<LogicalUnit>> {
        let volume: Arc<dyn Volume> = match &record.kind {
            VolumeKind::Passthrough { path } => Arc::new(FileVolume::open(
                &self.dir.join(path),
                record.size_bytes,
                record.block_size,
            )?),
            VolumeKind::Engine { volume, read_only } => Arc::new(
                EngineVolume::new(self.engine.clone(), *volume, record.block_size, *read_only)
                    .map_err(engine_error)?,
            ),
        };
        let state_dir = self.dir.join("units").join(&record.id);
        fs::create_dir_all(&state_dir).map_err(|source| ArrayError::Io {
            path: state_dir.clone(),
            source,
        })?;
        let config = LuConfig {
            vendor: VENDOR.into(),
            product: PRODUCT.into(),
            revision: env!("CARGO_PKG_VERSION").chars().take(4).collect(),
            serial: record.id[..16].to_string(),
            naa: naa_designator(&record.id),
            target_name: target_name.to_string(),
            target_port_group: 1,
            state_dir: Some(state_dir),
        };
        let saved = write_cache::SavedCachingPage::new(
            self.config.clone(),
            self.events.clone(),
            &record.id,
        );
        let unit = LogicalUnit::new(volume, config)
            .with_saved_mode_pages(record.write_cache.wce(), Arc::new(saved));
        // An engine volume lives in the array's pool; a passthrough file has none.
        Ok(Arc::new(match record.kind {
            VolumeKind::Engine { .. } => unit.with_pool(self.pool.clone()),
            VolumeKind::Passthrough { .. } => unit,
        }))
    }
}

/// NAA IEEE Registered Extended designator: NAA=6, 24-bit company ID, then 100 bits taken from
/// the volume's random id.
fn naa_designator(id_hex: &str) -> [u8; 16] {
    let id = u128::from_str_radix(id_hex, 16).unwrap_or(0);
    let vendor = id >> 28; // 100 bits of vendor-specific identifier + extension
    let value = (6u128 << 124) | ((NAA_COMPANY_ID as u128) << 100) | vendor;
    value.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::naa_designator;

    #[test]
    fn naa_designator_is_type_6_and_stable() {
        let d = naa_designator("0123456789abcdef0123456789abcdef");
        assert_eq!(d[0] >> 4, 6);
        assert_eq!(d, naa_designator("0123456789abcdef0123456789abcdef"));
        assert_ne!(d, naa_designator("f123456789abcdef0123456789abcdef"));
    }
}
