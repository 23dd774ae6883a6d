//! The HTTP management API's JSON: the bodies `sliver serve` answers with and accepts, and
//! the error body every refusal carries. Plain serde types with no server behind them, so a
//! client (the `sliver` CLI's admin commands) can speak the API without linking the server,
//! the engine or an HTTP stack.
//!
//! The server builds these from its own state (`sliver_server::api`); the routes are in its
//! `openapi.json`. Field names and order are the wire format: changing one changes the API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod names;
pub mod units;
pub use names::{InvalidIscsiName, IscsiName};

// ---- errors ----

/// The body of every error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A stable code (`volume_not_found`, `unauthorized`, ...) and one readable sentence.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

// ---- array ----

/// `GET /api/v1/array`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ArrayInfo {
    pub version: String,
    pub target_name: String,
    pub portals: Vec<String>,
    pub capacity_bytes: u64,
    pub physical_used_bytes: u64,
    /// Log space held for anchored blocks (SBC ANCHOR).
    #[serde(default)]
    pub anchored_bytes: u64,
    pub live_bytes: u64,
    pub reclaimable_bytes: u64,
    pub provisioned_bytes: u64,
    pub mapped_bytes: u64,
    pub data_reduction: f64,
    pub total_reduction: f64,
    pub soft_threshold: f64,
    pub soft_threshold_exceeded: bool,
    pub gc: GcInfo,
    pub volumes: usize,
    pub hosts: usize,
    /// When this process opened the array (ms since the Unix epoch).
    #[serde(default)]
    pub started_ms: u64,
    /// Why the engine stopped accepting writes, if it did (a failed write or sync of the
    /// log): the array then serves reads only until it is restarted.
    #[serde(default)]
    pub poisoned: Option<String>,
    /// The SHA-256 fingerprint of the certificate the API serves over HTTPS (colon-separated
    /// hex), absent over plain HTTP: what a client pins, and what an administrator compares
    /// with the one `sliver serve` printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct GcInfo {
    pub priority: String,
    pub write_amplification: f64,
    pub host_written_bytes: u64,
    pub relocated_bytes: u64,
}

/// `PATCH /api/v1/array`: settings kept across restarts.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateArray {
    /// Share of capacity in use that raises the thin-provisioning soft threshold (0.01..=1;
    /// 1 disables it).
    #[serde(default)]
    pub soft_threshold: Option<f64>,
    /// `off`, `low`, `medium`, `high` or a rate such as `100MB/s`.
    #[serde(default)]
    pub gc_priority: Option<String>,
}

// ---- volumes ----

/// When a volume answers a write: `write-through` once it is durable (WCE=0; safe for every
/// host, VMware ESXi included, which never flushes), or `write-back` once it is in the array's
/// memory, durable at the host's next SYNCHRONIZE CACHE or FUA write (WCE=1; only for hosts
/// that flush: Linux, QEMU/Proxmox with a cache mode that passes flushes on, Windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteCache {
    #[default]
    WriteThrough,
    WriteBack,
}

impl WriteCache {
    /// The caching mode page's WCE bit for this setting.
    pub fn wce(self) -> bool {
        self == WriteCache::WriteBack
    }

    /// The setting a WCE bit stands for.
    pub fn from_wce(wce: bool) -> Self {
        if wce {
            WriteCache::WriteBack
        } else {
            WriteCache::WriteThrough
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WriteCache::WriteThrough => "write-through",
            WriteCache::WriteBack => "write-back",
        }
    }
}

impl std::fmt::Display for WriteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WriteCache {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write-through" => Ok(WriteCache::WriteThrough),
            "write-back" => Ok(WriteCache::WriteBack),
            _ => Err(format!(
                "'{s}' is not a write cache setting (write-through or write-back)"
            )),
        }
    }
}

/// One volume as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    pub id: String,
    /// `engine`, `snapshot` (read-only engine volume) or `passthrough`.
    pub kind: String,
    pub read_only: bool,
    pub block_size: u32,
    pub provisioned_bytes: u64,
    /// Bytes hosts wrote and did not unmap (zeros excluded).
    pub mapped_bytes: u64,
    /// Share of the volume never written, 0..1.
    pub thin_provisioning: f64,
    /// Physical bytes this volume alone references: what deleting it frees.
    pub physical_bytes: u64,
    /// Physical bytes shared with other volumes (snapshots, clones, dedup).
    pub shared_bytes: u64,
    /// Host bytes per physical byte referenced (dedup x compression).
    pub data_reduction: f64,
    pub connections: Vec<ConnectionInfo>,
    pub vaai: VaaiCounters,
    /// Milliseconds since the Unix epoch; null for volumes made before it was recorded.
    #[serde(default)]
    pub created_ms: Option<u64>,
    /// The id of the volume this one was snapshotted or cloned from (kept after it is deleted).
    #[serde(default)]
    pub source_id: Option<String>,
    /// That volume's current name; null once it is deleted.
    #[serde(default)]
    pub source: Option<String>,
    /// The write cache in effect (a host's MODE SELECT may have changed it until restart).
    #[serde(default)]
    pub write_cache: WriteCache,
    /// The write cache the volume starts with (set by the API, the CLI, the console, the
    /// configuration file, or a host saving the caching mode page).
    #[serde(default)]
    pub write_cache_saved: WriteCache,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ConnectionInfo {
    pub host: String,
    pub lun: u64,
    /// iSCSI URL of the LUN on the first portal (libiscsi / QEMU syntax).
    pub url: String,
}

/// `POST /api/v1/volumes`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    /// 512 (default) or 4096.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// `engine` (default) or `passthrough`.
    #[serde(default)]
    pub kind: Option<String>,
    /// `write-through` (default) or `write-back`.
    #[serde(default)]
    pub write_cache: Option<WriteCache>,
}

/// `PATCH /api/v1/volumes/{name}`: grow, rename, and/or change the write cache.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateVolume {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub size_bytes: Option<u64>,
    #[serde(default)]
    pub write_cache: Option<WriteCache>,
}

/// Body of snapshot and clone requests.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewName {
    pub name: String,
}

/// `POST /api/v1/volumes/{name}/connections`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connect {
    /// A host name, or `*` for every initiator.
    pub host: String,
    #[serde(default)]
    pub lun: Option<u64>,
}

/// The VAAI counters, named after esxtop's VAAI columns: what an LU's statistics snapshot
/// holds (`sliver_scsi` re-exports the type), so the API sends them as the LU counted them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VaaiCounters {
    /// COMPARE AND WRITE that succeeded (ATS).
    pub ats: u64,
    /// COMPARE AND WRITE that failed: miscompare or any other error (ATSF).
    pub ats_failed: u64,
    /// EXTENDED COPY segments read from this LU (CLONE_RD).
    pub clone_read: u64,
    /// EXTENDED COPY segments written to this LU (CLONE_WR).
    pub clone_write: u64,
    /// EXTENDED COPY commands received by this LU that failed (CLONE_F).
    pub clone_failed: u64,
    /// WRITE SAME that succeeded (ZERO; every pattern counts, as in esxtop).
    pub zero: u64,
    pub zero_failed: u64,
    /// UNMAP that succeeded (DELETE).
    pub delete: u64,
    pub delete_failed: u64,
    /// Bytes of successful UNMAP descriptors (MBDEL = deleted_bytes / 2^20).
    pub deleted_bytes: u64,
    /// Bytes copied into this LU by EXTENDED COPY.
    pub cloned_bytes: u64,
    /// Bytes covered by successful WRITE SAME.
    pub zeroed_bytes: u64,
}

impl VaaiCounters {
    /// Adds `other`'s counts (a volume's into the array's total).
    pub fn add(&mut self, other: &VaaiCounters) {
        self.ats += other.ats;
        self.ats_failed += other.ats_failed;
        self.clone_read += other.clone_read;
        self.clone_write += other.clone_write;
        self.clone_failed += other.clone_failed;
        self.zero += other.zero;
        self.zero_failed += other.zero_failed;
        self.delete += other.delete;
        self.delete_failed += other.delete_failed;
        self.deleted_bytes += other.deleted_bytes;
        self.cloned_bytes += other.cloned_bytes;
        self.zeroed_bytes += other.zeroed_bytes;
    }
}

// ---- hosts ----

/// A host as the API shows it (CHAP secrets are never returned).
#[derive(Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub name: String,
    pub iqns: Vec<String>,
    pub chap_user: Option<String>,
    pub volumes: Vec<String>,
}

/// `POST /api/v1/hosts`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateHost {
    pub name: String,
    pub iqns: Vec<String>,
    #[serde(default)]
    pub chap_user: Option<String>,
    #[serde(default)]
    pub chap_secret: Option<String>,
}

/// `PATCH /api/v1/hosts/{name}`: what is given changes, the rest stays. CHAP: both
/// `chap_user` and `chap_secret` to set them, `clear_chap: true` to remove them.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateHost {
    #[serde(default)]
    pub iqns: Option<Vec<String>>,
    #[serde(default)]
    pub chap_user: Option<String>,
    #[serde(default)]
    pub chap_secret: Option<String>,
    #[serde(default)]
    pub clear_chap: bool,
}

// ---- statistics and events ----

/// `GET /api/v1/stats`: cumulative counters per volume; clients compute rates from deltas.
#[derive(Debug, Serialize)]
pub struct Stats {
    /// Milliseconds since the Unix epoch when the counters were read.
    pub time_ms: u64,
    /// Upper bounds of the latency histogram buckets (one more bucket holds the rest).
    pub latency_bounds_us: &'static [u64],
    pub volumes: Vec<VolumeStats>,
}

#[derive(Debug, Serialize)]
pub struct VolumeStats {
    pub name: String,
    pub data_reduction: f64,
    /// By command class name (`read`, `write`, `compare_and_write`, `write_same`, `unmap`,
    /// `extended_copy`, `other`).
    pub classes: BTreeMap<&'static str, ClassStats>,
    pub vaai: VaaiCounters,
}

/// `?after=SEQ&limit=N` of `GET /api/v1/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events with a larger sequence number (default 0: all kept).
    #[serde(default)]
    pub after: Option<u64>,
    /// At most this many, oldest first (default and maximum 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Events, oldest first; `next` is the `after` to poll with for what follows.
#[derive(Debug, Serialize)]
pub struct EventsInfo {
    pub events: Vec<Event>,
    pub next: u64,
}

/// One command class's cumulative counters: what an LU's statistics snapshot holds
/// (`sliver_scsi` re-exports the type), so the API sends them as the LU counted them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassStats {
    /// Completed commands.
    pub commands: u64,
    /// Commands completed with CHECK CONDITION or RESERVATION CONFLICT.
    pub errors: u64,
    /// Data-In bytes for reads; bytes written for writes; bytes of the LBA ranges affected
    /// for WRITE SAME, UNMAP and EXTENDED COPY.
    pub bytes: u64,
    pub latency_sum_us: u64,
    /// Non-cumulative counts per bucket of `latency_bounds_us`, then one above the last.
    pub latency_buckets: Vec<u64>,
}

impl ClassStats {
    /// Adds `other`'s counts (a volume's into the array's total).
    pub fn add(&mut self, other: &ClassStats) {
        self.commands += other.commands;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.latency_sum_us += other.latency_sum_us;
        if self.latency_buckets.len() < other.latency_buckets.len() {
            self.latency_buckets.resize(other.latency_buckets.len(), 0);
        }
        for (a, b) in self.latency_buckets.iter_mut().zip(&other.latency_buckets) {
            *a += b;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One event: an entry of `GET /api/v1/events`, and a line of the array's `events.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Increasing, never reused within one file's history (continued from the file at open).
    pub seq: u64,
    pub time_ms: u64,
    /// A stable name: `volume_created`, `login_refused`, `soft_threshold_crossed`, ...
    pub kind: String,
    pub severity: Severity,
    /// One sentence.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiator: Option<String>,
}

// ---- history ----

/// `?since=MS&step=5|60` of the history routes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// Only points after this time (milliseconds since the Unix epoch); default all.
    #[serde(default)]
    pub since: Option<u64>,
    /// Seconds per point: 5 (the last hour for the array, five minutes for a volume) or 60
    /// (the last day, the last hour); default 5.
    #[serde(default)]
    pub step: Option<u64>,
}

/// Points of rates, oldest first.
#[derive(Debug, Serialize)]
pub struct HistoryInfo {
    pub step_seconds: u64,
    /// Upper bounds of the latency histogram buckets the percentiles are taken from.
    pub latency_bounds_us: &'static [u64],
    pub points: Vec<Point>,
}

/// The array's space figures at a reading.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpaceReading {
    pub physical_used_bytes: u64,
    pub live_bytes: u64,
    pub reclaimable_bytes: u64,
    pub mapped_bytes: u64,
    pub provisioned_bytes: u64,
    pub data_reduction: f64,
    /// Cumulative.
    pub host_written_bytes: u64,
    /// Cumulative.
    pub gc_relocated_bytes: u64,
}

/// Rates over one interval, ending at `time_ms`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Point {
    /// Milliseconds since the Unix epoch at the end of the interval.
    pub time_ms: u64,
    /// Length of the interval.
    pub seconds: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    /// Every other class (COMPARE AND WRITE, WRITE SAME, UNMAP, EXTENDED COPY, other).
    pub other_iops: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    /// Mean latency of the reads / writes completed in the interval (0 when none).
    pub read_latency_us: f64,
    pub write_latency_us: f64,
    /// The 99th percentile of every command completed in the interval: the upper bound of
    /// the histogram bucket it falls in (`None` when none completed; the last bound when it
    /// is above it).
    pub p99_latency_us: Option<u64>,
    pub errors_per_s: f64,
    /// VAAI rates, esxtop's names: ATS, CLONE_WR (segments), ZERO, DELETE per second, and
    /// the bytes behind them.
    pub ats_per_s: f64,
    pub ats_failed_per_s: f64,
    pub clone_write_per_s: f64,
    pub zero_per_s: f64,
    pub delete_per_s: f64,
    pub deleted_bytes_per_s: f64,
    pub zeroed_bytes_per_s: f64,
    pub cloned_bytes_per_s: f64,
    /// Array only: space at the end of the interval and GC rates over it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceReading>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_written_bytes_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gc_relocated_bytes_per_s: Option<f64>,
    /// (host + relocated) / host over the interval; `None` without host writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_amplification: Option<f64>,
}

// ---- replication ----

/// A restored array fetching its data from the store (RFC 0003, "Hydration on demand").
#[derive(Debug, Default, Serialize)]
pub struct HydrationInfo {
    /// Whether the array was opened with data still in the store.
    pub active: bool,
    /// Every byte is local (the hydration state is gone); also true when none was active.
    pub done: bool,
    /// The store the data comes from.
    pub source: Option<String>,
    pub bytes_left: u64,
    /// Entries of the map of what is still in the store (runs of its objects).
    pub ranges: u64,
    pub bytes_at_start: u64,
    pub fetched_bytes: u64,
    pub on_demand_fetches: u64,
    pub on_demand_bytes: u64,
    /// Background fetch rate, bytes per second.
    pub rate: u64,
    pub error: Option<String>,
}

/// The off-site copy (RFC 0003).
#[derive(Debug, Serialize)]
pub struct ReplicationInfo {
    pub configured: bool,
    /// `s3://BUCKET/PREFIX`.
    pub target: Option<String>,
    /// `base` (copying the whole array while following it), `streaming`, `waiting` (the store
    /// cannot be used yet: the array serves and the copy starts once it answers), `fenced`,
    /// `broken` (a base could not be read, or the store turned out unusable), `stopped`.
    pub state: Option<&'static str>,
    /// Why it is fenced or broken, or the store's last error while it retries.
    pub error: Option<String>,
    pub pool: Option<String>,
    /// Number of the newest object in the store.
    pub shipped_through: u64,
    pub shipped_objects: u64,
    pub shipped_bytes: u64,
    pub backlog_bytes: u64,
    /// Age of the oldest write the store does not hold yet; 0 when it holds every write.
    pub lag_seconds: f64,
    /// Times the copy started over (a base): the backlog bound was passed, or the store lost
    /// objects the copy needs (a bucket deleted or emptied).
    pub resyncs: u64,
    /// Why it last started over.
    pub last_restart: Option<String>,
    /// The newest restore point.
    pub newest_point: Option<PointInfo>,
    /// Objects retention deleted since the array started (no restore point needed them).
    pub deleted_objects: u64,
}

/// A restore point of the off-site copy.
#[derive(Debug, Serialize)]
pub struct PointInfo {
    pub name: String,
    /// Taken on the schedule (and deleted by retention), not by a user.
    pub scheduled: bool,
    /// UTC, RFC 3339: every write acknowledged before it is in the point.
    pub time: String,
    pub time_ms: u64,
    /// The last stream object it needs, and the first (its base's start).
    pub through: u64,
    pub base: u64,
}

#[cfg(test)]
mod tests {
    //! The wire format, pinned: each type against the JSON the API has always sent.
    use super::*;

    #[test]
    fn error_body_is_code_then_message_under_error() {
        let body = ErrorBody {
            error: ErrorDetail {
                code: "volume_not_found".into(),
                message: "no volume named 'a'".into(),
            },
        };
        let text = r#"{"error":{"code":"volume_not_found","message":"no volume named 'a'"}}"#;
        assert_eq!(serde_json::to_string(&body).unwrap(), text);
        let back: ErrorBody = serde_json::from_str(text).unwrap();
        assert_eq!(back.error.code, "volume_not_found");
    }

    #[test]
    fn volume_info_round_trips_with_its_field_order() {
        let text = concat!(
            r#"{"name":"v","id":"0a","kind":"engine","read_only":false,"block_size":512,"#,
            r#""provisioned_bytes":1048576,"mapped_bytes":4096,"thin_provisioning":0.5,"#,
            r#""physical_bytes":2048,"shared_bytes":0,"data_reduction":2.0,"#,
            r#""connections":[{"host":"h","lun":0,"url":"iscsi://127.0.0.1:3260/iqn.x/0"}],"#,
            r#""vaai":{"ats":1,"ats_failed":2,"clone_read":3,"clone_write":4,"clone_failed":5,"#,
            r#""zero":6,"zero_failed":7,"delete":8,"delete_failed":9,"deleted_bytes":10,"#,
            r#""cloned_bytes":11,"zeroed_bytes":12},"#,
            r#""created_ms":17,"source_id":null,"source":null,"#,
            r#""write_cache":"write-back","write_cache_saved":"write-through"}"#
        );
        let v: VolumeInfo = serde_json::from_str(text).unwrap();
        assert_eq!(v.vaai.zeroed_bytes, 12);
        assert_eq!(v.write_cache, WriteCache::WriteBack);
        assert_eq!(v.write_cache_saved, WriteCache::WriteThrough);
        assert_eq!(v.connections[0].host, "h");
        assert_eq!(serde_json::to_string(&v).unwrap(), text);
    }

    #[test]
    fn write_cache_settings_are_named_as_the_cli_and_the_configuration_name_them() {
        for setting in [WriteCache::WriteThrough, WriteCache::WriteBack] {
            let json = serde_json::to_string(&setting).unwrap();
            assert_eq!(json, format!("\"{setting}\""));
            assert_eq!(setting.as_str().parse::<WriteCache>().unwrap(), setting);
            assert_eq!(WriteCache::from_wce(setting.wce()), setting);
        }
        assert!(
            !WriteCache::default().wce(),
            "new volumes are write-through"
        );
        let err = "writeback".parse::<WriteCache>().unwrap_err();
        assert!(err.contains("write-through or write-back"), "{err}");
    }

    #[test]
    fn an_event_leaves_out_what_it_does_not_name() {
        let e = Event {
            seq: 3,
            time_ms: 9,
            kind: "volume_created".into(),
            severity: Severity::Warning,
            message: "m".into(),
            volume: Some("v".into()),
            host: None,
            initiator: None,
        };
        let text = r#"{"seq":3,"time_ms":9,"kind":"volume_created","severity":"warning","message":"m","volume":"v"}"#;
        assert_eq!(serde_json::to_string(&e).unwrap(), text);
        assert_eq!(serde_json::from_str::<Event>(text).unwrap(), e);
    }

    #[test]
    fn a_volume_point_has_no_array_fields() {
        let p = Point {
            time_ms: 5,
            seconds: 5.0,
            p99_latency_us: Some(250),
            ..Point::default()
        };
        let text = concat!(
            r#"{"time_ms":5,"seconds":5.0,"read_iops":0.0,"write_iops":0.0,"other_iops":0.0,"#,
            r#""read_bytes_per_s":0.0,"write_bytes_per_s":0.0,"read_latency_us":0.0,"#,
            r#""write_latency_us":0.0,"p99_latency_us":250,"errors_per_s":0.0,"ats_per_s":0.0,"#,
            r#""ats_failed_per_s":0.0,"clone_write_per_s":0.0,"zero_per_s":0.0,"delete_per_s":0.0,"#,
            r#""deleted_bytes_per_s":0.0,"zeroed_bytes_per_s":0.0,"cloned_bytes_per_s":0.0}"#
        );
        assert_eq!(serde_json::to_string(&p).unwrap(), text);
    }

    #[test]
    fn requests_refuse_unknown_fields() {
        let host: UpdateHost = serde_json::from_str(r#"{"clear_chap":true}"#).unwrap();
        assert!(host.clear_chap && host.iqns.is_none());
        assert!(serde_json::from_str::<UpdateHost>(r#"{"chap":"x"}"#).is_err());
        assert!(serde_json::from_str::<CreateVolume>(r#"{"name":"v","size":1}"#).is_err());
    }
}
