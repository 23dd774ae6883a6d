//! The array: volumes, hosts and the connections (LUN mappings) between them.
//!
//! Configuration lives in `<data-dir>/array.json`, rewritten atomically (temp file, fsync,
//! rename, fsync of the directory) on every change, so a crash leaves either the old or the
//! new configuration, never a torn one. Volume data lives beside it, one file per
//! passthrough volume under `volumes/`.

use crate::events::{EventLog, NewEvent};

mod chap;
mod check;
mod config_store;
mod error;
mod hosts;
mod mapping;
mod open;
mod pool;
mod replication;
mod restore;
mod volumes;
mod write_cache;

pub use chap::{ChapSecret, StoredChap};
pub use check::check_array;
use config_store::{lock_events, ConfigStore};
use error::engine_error;
pub use error::{ArrayError, ReplicationError, Result};
pub use mapping::{Access, LunMap, MappedLun};
pub use open::{free_space, lock_data_dir};
use pool::Pool;
pub use pool::{gc_priority_name, parse_gc_priority, BadGcPriority};
use replication::{Hydration, Replication};
pub use replication::{ReplicationOptions, ReplicationReport};
pub use restore::restore;
use serde::{Deserialize, Serialize};
use sliver_api_types::WriteCache;
use sliver_engine::{Engine, EngineConfig, EngineSpace, GcPriority, Tuning};
use sliver_scsi::LogicalUnit;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// The host name that matches every initiator (labs and the demo).
pub const ANY_HOST: &str = "*";
const CONFIG_FILE: &str = "array.json";
const FORMAT_VERSION: u32 = 1;
/// The product identification reported for every LUN (ESXi requires one value across LUNs
/// for XCOPY between them).
pub const PRODUCT: &str = "sliver";
pub const VENDOR: &str = "SLIVER";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum VolumeKind {
    /// Data stored byte for byte in a file (sparse) or block device.
    Passthrough { path: PathBuf },
    /// A volume of the array's engine (thin, deduplicated, compressed). Snapshots are
    /// read-only engine volumes.
    Engine {
        volume: u32,
        #[serde(default)]
        read_only: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    /// 128-bit random identity, hex; the source of the serial number and NAA designator, so
    /// hosts see the same disk after a rename or restart.
    pub id: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub kind: VolumeKind,
    /// When the volume was created, milliseconds since the Unix epoch (absent for volumes
    /// made before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// The `id` of the volume this one was snapshotted or cloned from; kept after that volume
    /// is deleted, so siblings still group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// When writes are answered (the saved WCE). Volumes recorded before the setting existed
    /// were write-back, and stay so until changed: an upgrade changes no volume's behaviour.
    #[serde(default = "write_cache::recorded_before_the_setting")]
    pub write_cache: WriteCache,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostRecord {
    pub name: String,
    pub iqns: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<StoredChap>,
}

/// What an edit does to a host's CHAP credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChapChange {
    Keep,
    Clear,
    Set(ChapSecret),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub volume: String,
    pub host: String,
    pub lun: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ArrayConfig {
    format_version: u32,
    target_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_chap: Option<StoredChap>,
    volumes: Vec<VolumeRecord>,
    hosts: Vec<HostRecord>,
    connections: Vec<ConnectionRecord>,
    /// Tuning changed at run time (API, MODE SELECT): applied at every open.
    #[serde(default, skip_serializing_if = "Settings::is_empty")]
    settings: Settings,
}

impl ArrayConfig {
    /// A new array's configuration: no volumes, hosts or connections yet.
    fn new(target_name: &str) -> Self {
        ArrayConfig {
            format_version: FORMAT_VERSION,
            target_name: target_name.to_string(),
            target_chap: None,
            volumes: vec![],
            hosts: vec![],
            connections: vec![],
            settings: Settings::default(),
        }
    }
}

/// Array settings kept across restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// Share of capacity in use that raises the thin-provisioning soft threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_threshold: Option<f64>,
    /// Garbage-collection priority as `off`, `low`, `medium`, `high` or bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_priority: Option<String>,
}

impl Settings {
    fn is_empty(&self) -> bool {
        *self == Settings::default()
    }
}

/// How a new array's engine is laid out, and where its off-site copy goes.
#[derive(Debug, Clone, Default)]
pub struct ArrayOptions {
    /// Log capacity in bytes; `None`: 90% of the free space of the data directory's file
    /// system at creation (the log file is sparse and grows segment by segment).
    pub capacity_bytes: Option<u64>,
    pub engine: EngineConfig,
    pub tuning: Tuning,
    /// Ship every write to an object store (RFC 0003); `None`: no off-site copy.
    pub replication: Option<ReplicationOptions>,
    /// A restored array whose data is still in the store: how it fetches the rest.
    pub hydrate: sliver_replica::hydrate::HydrateConfig,
}

const ENGINE_DIR: &str = "engine";

pub struct Array {
    dir: PathBuf,
    /// Exclusive lock on the data directory: two processes must never write one array.
    _lock: fs::File,
    engine: Arc<Engine>,
    /// The configuration and its file (shared with the pool's settings owner).
    config: Arc<ConfigStore>,
    units: RwLock<BTreeMap<String, Arc<LogicalUnit>>>,
    /// The pool's settings and their one owner (the soft threshold and the GC priority):
    /// the API, the configuration file and MODE SELECT change them through it.
    pool: Arc<Pool>,
    /// What happened, for the API and the console (`events.jsonl`).
    events: Arc<Mutex<EventLog>>,
    /// When this process opened the array (ms since the Unix epoch).
    opened_ms: u64,
    replication: Option<Replication>,
    hydration: Option<Hydration>,
}

impl Array {
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    pub fn target_name(&self) -> String {
        self.config.read().target_name.clone()
    }

    pub fn target_chap(&self) -> Option<StoredChap> {
        self.config.read().target_chap.clone()
    }

    pub fn volumes(&self) -> Vec<VolumeRecord> {
        self.config.read().volumes.clone()
    }

    pub fn hosts(&self) -> Vec<HostRecord> {
        self.config.read().hosts.clone()
    }

    pub fn connections(&self) -> Vec<ConnectionRecord> {
        self.config.read().connections.clone()
    }

    pub fn unit(&self, volume: &str) -> Option<Arc<LogicalUnit>> {
        self.units.read().unwrap().get(volume).cloned()
    }

    /// Change the soft threshold (a share of capacity in use, in
    /// [`sliver_volume::SOFT_THRESHOLD_RANGE`]) and keep it.
    pub fn set_soft_threshold(&self, share: f64) -> Result<()> {
        self.pool.change_soft_threshold(share)
    }

    /// Change the garbage collector's priority and keep it.
    pub fn set_gc_priority(&self, priority: GcPriority) -> Result<()> {
        self.pool.change_gc_priority(priority)
    }

    /// The event log (RFC 0002): the API reads it, the target reports refused logins to it.
    pub fn events(&self) -> MutexGuard<'_, EventLog> {
        lock_events(&self.events)
    }

    /// Records one event now.
    pub fn record_event(&self, e: NewEvent) {
        self.events().record(now_ms(), e);
    }

    /// When this process opened the array (ms since the Unix epoch).
    pub fn opened_ms(&self) -> u64 {
        self.opened_ms
    }

    /// The engine behind engine volumes.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Array-wide space figures from the engine.
    pub fn engine_space(&self) -> EngineSpace {
        self.engine.space()
    }

    /// Flush and checkpoint the engine (clean shutdown makes the next start fast), then ship
    /// what is left to the off-site copy (up to 30 s), so that the next start continues it.
    pub fn shutdown(&self) -> Result<()> {
        let result = self.engine.shutdown().map_err(engine_error);
        if let Some(h) = &self.hydration {
            // What was fetched stays; the rest is fetched after the next start.
            if let Some(hydrator) = h.hydrator.lock().unwrap().take() {
                hydrator.stop();
            }
        }
        if let Some(r) = &self.replication {
            if let Some(shipper) = r.shipper.lock().unwrap().take() {
                let s = shipper.stop(std::time::Duration::from_secs(30));
                tracing::info!(
                    "replication stopped: {} objects shipped through number {}, {} bytes left",
                    s.objects,
                    s.shipped_through,
                    s.backlog_bytes
                );
            }
        }
        result
    }

    /// The configuration, to change: the generation moves first, so a session that sees the
    /// new generation builds its LUN table after the change (the lock orders them).
    fn config_mut(&self) -> std::sync::RwLockWriteGuard<'_, ArrayConfig> {
        self.config.write()
    }

    /// The logical units, to change (see [`Array::config_mut`]).
    fn units_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<LogicalUnit>>> {
        self.moved(self.units.write().unwrap())
    }

    /// Move the generation while `guard` is held, and hand it back.
    fn moved<G>(&self, guard: G) -> G {
        self.config.moved(guard)
    }

    fn save(&self) -> Result<()> {
        let config = self.config.read();
        self.save_locked(&config)
    }

    fn save_locked(&self, config: &ArrayConfig) -> Result<()> {
        self.config.save(config)
    }

    /// Apply `change` to a copy of `config` (held under the write lock), save the copy, and
    /// only then make it the configuration: a failed save changes nothing, in memory or in
    /// the file.
    fn commit(
        &self,
        config: &mut ArrayConfig,
        change: impl FnOnce(&mut ArrayConfig),
    ) -> Result<()> {
        self.try_commit(config, |c| {
            change(c);
            Ok(())
        })
    }

    /// [`Array::commit`] for a change that can refuse, seeing the configuration as it goes
    /// (a name that is missing, a connection that is not there): a refusal saves nothing.
    fn try_commit<T>(
        &self,
        config: &mut ArrayConfig,
        change: impl FnOnce(&mut ArrayConfig) -> Result<T>,
    ) -> Result<T> {
        let mut updated = config.clone();
        let outcome = change(&mut updated)?;
        self.save_locked(&updated)?;
        *config = updated;
        Ok(outcome)
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    use sliver_engine::clock::Clock;
    sliver_engine::clock::SystemClock.wall_ms()
}

/// A size as events show it: GiB or MiB.
fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// `'a', 'b'` of `names`, or `None` without any: what a refused delete says is still connected.
fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> Option<String> {
    let quoted: Vec<String> = names.map(|n| format!("'{n}'")).collect();
    (!quoted.is_empty()).then(|| quoted.join(", "))
}

/// Volume and host names: 1-63 characters from `A-Z a-z 0-9 . _ -`, starting with a letter or
/// digit. Names never become paths (storage files are named by random ids), and the first
/// character rule also keeps out `.`, `..`, hidden-file names and names a command line would
/// take for an option.
fn validate_name(name: &str) -> Result<()> {
    let ok = name.len() <= 63
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ArrayError::InvalidName(name.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sliver_api_types::IscsiName;

    #[test]
    fn the_configuration_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        a.create_host(
            "h",
            vec![iqn("iqn.2026-11.test:h")],
            Some(ChapSecret::new("h", "a-chap-secret").unwrap()),
        )
        .unwrap();
        let mode = fs::metadata(dir.path().join(CONFIG_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// THRESHOLD COUNT of the LBP mode page (1Ch/02h) of `lu`, and the page as MODE SENSE(10)
    /// returned it.
    fn threshold_page(lu: &LogicalUnit) -> (u32, Vec<u8>) {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x5a;
        cdb[1] = 0x08; // DBD
        cdb[2] = 0x1c;
        cdb[3] = 0x02;
        cdb[7..9].copy_from_slice(&1024u16.to_be_bytes());
        let r = scsi(lu, &cdb, &[]);
        assert_eq!(r.status, sliver_scsi::Status::Good, "{:02x?}", r.sense);
        let page = r.data_in[8..].to_vec();
        (u32::from_be_bytes(page[20..24].try_into().unwrap()), page)
    }

    fn scsi(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> sliver_scsi::Response {
        let nexus = sliver_scsi::Nexus {
            initiator_port: "iqn.2026-11.test:h,i,0x1".into(),
            initiator_name: "iqn.2026-11.test:h".into(),
            relative_target_port: 1,
        };
        lu.execute(&sliver_scsi::Request {
            nexus: &nexus,
            cdb,
            data_out,
            attr: sliver_scsi::TaskAttr::Simple,
            luns: &[0],
            copy_targets: &sliver_scsi::NoCopyTargets,
        })
    }

    /// MODE SELECT of the LBP page with THRESHOLD COUNT `count`.
    fn select_threshold(lu: &LogicalUnit, page: &[u8], count: u32) -> sliver_scsi::Response {
        let mut params = vec![0u8; 8];
        params.extend_from_slice(page);
        params[8] &= 0x7f; // PS is not settable
        params[8 + 20..8 + 24].copy_from_slice(&count.to_be_bytes());
        let mut cdb = [0u8; 10];
        cdb[0] = 0x55;
        cdb[1] = 0x10; // PF
        cdb[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
        scsi(lu, &cdb, &params)
    }

    #[test]
    fn a_soft_threshold_set_by_mode_select_or_the_api_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (count, sets) = {
            let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
            a.create_volume("v", 1 << 20, 512).unwrap();
            let lu = a.unit("v").unwrap();
            scsi(&lu, &[0; 6], &[]); // the power-on unit attention
            let (count, page) = threshold_page(&lu);
            let sets = a.engine.capacity_bytes() >> 20;
            assert_eq!(count as u64, (sets as f64 * 0.8).round() as u64);
            // MODE SELECT halves it: the pool's owner applies and keeps it.
            let half = count / 2;
            let r = select_threshold(&lu, &page, half);
            assert_eq!(r.status, sliver_scsi::Status::Good, "{:02x?}", r.sense);
            let share = a.engine.tuning().soft_threshold;
            assert!((share - half as f64 / sets as f64).abs() < 1e-9, "{share}");
            // Under 1 % of the pool is refused here as the API refuses it.
            let r = select_threshold(&lu, &page, (sets / 200).max(1) as u32);
            assert_eq!(r.status, sliver_scsi::Status::CheckCondition);
            assert_eq!((r.sense[2] & 0x0f, r.sense[12]), (0x5, 0x26));
            assert!(matches!(
                a.set_soft_threshold(0.005),
                Err(ArrayError::InvalidSetting(_))
            ));
            (half, sets)
        };
        let a = Array::open(dir.path(), "ignored").unwrap();
        let lu = a.unit("v").unwrap();
        scsi(&lu, &[0; 6], &[]);
        assert_eq!(threshold_page(&lu).0, count, "of {sets} sets");
        // The API's change, too, survives, and MODE SENSE reports it.
        a.set_soft_threshold(0.3).unwrap();
        drop((lu, a));
        let a = Array::open(dir.path(), "ignored").unwrap();
        assert!((a.engine.tuning().soft_threshold - 0.3).abs() < 1e-9);
        let lu = a.unit("v").unwrap();
        scsi(&lu, &[0; 6], &[]);
        assert_eq!(
            threshold_page(&lu).0 as u64,
            (sets as f64 * 0.3).round() as u64
        );
    }

    #[test]
    fn volumes_hosts_and_luns_persist() {
        let dir = tempfile::tempdir().unwrap();
        {
            let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
            a.create_volume("v1", 1 << 20, 512).unwrap();
            a.create_volume("v2", 1 << 20, 512).unwrap();
            a.create_host("esx1", vec![iqn("iqn.1998-01.com.vmware:esx1")], None)
                .unwrap();
            assert_eq!(a.connect("v1", "*", None).unwrap(), 0);
            assert_eq!(a.connect("v2", "esx1", Some(5)).unwrap(), 5);
            assert!(matches!(
                a.connect("v1", "esx1", Some(5)),
                Err(ArrayError::LunInUse { .. })
            ));
        }
        let a = Array::open(dir.path(), "ignored").unwrap();
        assert_eq!(a.target_name(), "iqn.2026-11.test:a");
        let esx: Vec<u64> = a
            .luns_for("iqn.1998-01.com.vmware:esx1")
            .iter()
            .map(|l| l.lun)
            .collect();
        assert_eq!(esx, vec![0, 5]);
        let other: Vec<String> = a
            .luns_for("iqn.other")
            .into_iter()
            .map(|l| l.volume)
            .collect();
        assert_eq!(other, vec!["v1".to_string()]);
    }

    #[test]
    fn bad_names_and_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        assert!(matches!(
            a.create_volume("a/b", 1 << 20, 512),
            Err(ArrayError::InvalidName(_))
        ));
        assert!(matches!(
            a.create_volume("ok", 1000, 512),
            Err(ArrayError::InvalidSize(1000))
        ));
        a.create_volume("ok", 4096, 512).unwrap();
        assert!(matches!(
            a.create_volume("ok", 4096, 512),
            Err(ArrayError::VolumeExists(_))
        ));
    }

    #[test]
    fn unknown_initiator_without_any_host_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        a.create_volume("v", 4096, 512).unwrap();
        assert!(matches!(a.access("iqn.x"), Access::Unknown));
        a.connect("v", ANY_HOST, None).unwrap();
        assert!(matches!(a.access("iqn.x"), Access::Allowed(None)));
    }

    #[test]
    fn a_point_is_refused_with_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        let refused = |r: Result<_>| match r {
            Err(ArrayError::Replication(cause)) => cause,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("taken"),
        };
        assert!(matches!(
            refused(a.take_replication_point("a b").map(|_| ())),
            ReplicationError::InvalidPointName(_)
        ));
        assert!(matches!(
            refused(a.take_replication_point("p1").map(|_| ())),
            ReplicationError::NotConfigured
        ));
        assert!(matches!(
            refused(a.delete_replication_point("p1").map(|_| ())),
            ReplicationError::NotConfigured
        ));
    }

    /// A name the tests know to be an iSCSI name.
    fn iqn(name: &str) -> IscsiName {
        IscsiName::new(name).unwrap()
    }

    #[test]
    fn a_host_is_given_only_iscsi_names() {
        // The array takes names only as `IscsiName`s; a string becomes one only if it is
        // one, and the refusal is the array's error (the API's `invalid_iqn`).
        for bad in [
            "host-a",
            "iqn.",
            "iqn.2026-11.test:a b",
            &format!("iqn.{}", "x".repeat(220)),
        ] {
            let refused: ArrayError = IscsiName::new(bad).unwrap_err().into();
            assert!(
                matches!(&refused, ArrayError::InvalidIscsiName(name) if name == bad),
                "{bad}: {refused}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        a.create_host("h", vec![iqn("iqn.2026-11.test:h")], None)
            .unwrap();
        assert_eq!(a.hosts()[0].iqns, vec!["iqn.2026-11.test:h".to_string()]);
        a.update_host(
            "h",
            Some(vec![
                iqn("naa.52004567BA64678D"),
                iqn("eui.02004567A425678D"),
            ]),
            ChapChange::Keep,
        )
        .unwrap();
        assert_eq!(
            a.hosts()[0].iqns,
            vec![
                "naa.52004567BA64678D".to_string(),
                "eui.02004567A425678D".to_string()
            ]
        );
    }

    #[test]
    fn a_change_whose_save_fails_is_not_made_in_memory_either() {
        let dir = tempfile::tempdir().unwrap();
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        a.create_volume("v", 1 << 20, 512).unwrap();
        // The save's temporary file cannot be created: a directory stands in its place.
        let tmp = dir.path().join(format!(".{CONFIG_FILE}.tmp"));
        fs::create_dir(&tmp).unwrap();
        assert!(a
            .create_host("h", vec![iqn("iqn.2026-11.test:h")], None)
            .is_err());
        assert!(a.connect("v", ANY_HOST, Some(3)).is_err());
        assert!(a.create_volume("w", 1 << 20, 512).is_err());
        assert!(
            a.hosts().is_empty(),
            "no host in memory the file does not have"
        );
        assert!(a.connections().is_empty());
        assert_eq!(a.volumes().len(), 1);
        fs::remove_dir(&tmp).unwrap();
        // Saves work again, and what memory holds is what a restart finds.
        a.create_host("h", vec![iqn("iqn.2026-11.test:h")], None)
            .unwrap();
        drop(a);
        let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
        assert_eq!(a.hosts().len(), 1);
        assert!(a.connections().is_empty());
        assert_eq!(a.volumes().len(), 1);
    }

    #[test]
    fn an_array_whose_file_holds_a_secret_older_versions_took_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        {
            let a = Array::open(dir.path(), "iqn.2026-11.test:a").unwrap();
            a.create_host("h", vec![iqn("iqn.2026-11.test:h")], None)
                .unwrap();
        }
        // The configuration file once set credentials without the API's rule.
        let path = dir.path().join(CONFIG_FILE);
        let mut file: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let short = serde_json::json!({ "user": "h", "secret": "short" });
        file["hosts"][0]["chap"] = short.clone();
        file["target_chap"] = short;
        fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        let a = Array::open(dir.path(), "ignored").unwrap();
        let Access::Allowed(Some(chap)) = a.access("iqn.2026-11.test:h") else {
            panic!("the host's credentials are gone");
        };
        assert_eq!(chap.secret, "short");
        assert_eq!(a.target_chap().unwrap().secret, "short");
        // Replacing them takes only credentials that pass today's rule.
        let good = ChapSecret::new("h", "twelve-bytes").unwrap();
        a.update_host("h", None, ChapChange::Set(good.clone()))
            .unwrap();
        assert_eq!(a.hosts()[0].chap, Some(StoredChap::from(good)));
    }
}
