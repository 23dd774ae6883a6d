//! Prometheus text exposition (format 0.0.4) of the array's counters and gauges.
//!
//! The counters already live in atomics (per-LU statistics, engine counters); a scrape reads
//! a snapshot and prints it. Hand-written because the format is a few lines of text and a
//! registry crate would only duplicate state we keep anyway.

use crate::array::{Array, ArrayError, ReplicationReport};
use sliver_engine::meta::pager::PagerStats;
use sliver_engine::EngineSpace;
use sliver_replica::hydrate::HydrationStatus;
use sliver_scsi::{ClassStats, CommandClass, StatsSnapshot, LATENCY_BOUNDS_US};
use std::fmt::Write;

/// Metric text for every volume and the array, in this order: each volume's commands,
/// VAAI counters and space, the array's space, the engine's counters and metadata lock,
/// then replication and hydration when the array has them.
pub fn render(array: &Array) -> Result<String, ArrayError> {
    let mut out = Text::default();
    let mut volumes = Vec::new();
    for record in array.volumes() {
        let Some(unit) = array.unit(&record.name) else {
            continue;
        };
        let space = unit.volume().space()?;
        volumes.push(VolumeRow {
            name: record.name,
            stats: unit.stats(),
            space,
            write_back: unit.write_cache(),
        });
    }
    volume_commands(&mut out, &volumes);
    volume_vaai(&mut out, &volumes);
    volume_space(&mut out, &volumes);
    let space = array.engine_space();
    let engine = array.engine();
    let cache = engine.cache_stats();
    array_space(&mut out, &space);
    engine_counters(&mut out, &space, &cache);
    metadata_lock(&mut out, engine);
    if let Some(r) = array.replication() {
        replication(&mut out, &r);
    }
    if let Some(h) = array.hydration() {
        hydration(&mut out, &h);
    }
    Ok(out.0)
}

/// One volume's numbers, read once per scrape.
struct VolumeRow {
    name: String,
    stats: StatsSnapshot,
    space: sliver_volume::VolumeSpace,
    /// Writes are answered before they are durable (WCE=1).
    write_back: bool,
}

/// Commands, errors and bytes by command class, and the latency histogram, of each volume.
fn volume_commands(out: &mut Text, volumes: &[VolumeRow]) {
    for (metric, help, pick) in [
        (
            "sliver_volume_commands_total",
            "SCSI commands completed, by command class.",
            (|s: &ClassStats| s.commands) as fn(&_) -> u64,
        ),
        (
            "sliver_volume_command_errors_total",
            "SCSI commands that completed with CHECK CONDITION or RESERVATION CONFLICT.",
            |s| s.errors,
        ),
        (
            "sliver_volume_bytes_total",
            "Bytes read or written by hosts; for WRITE SAME, UNMAP and EXTENDED COPY the bytes of the ranges affected.",
            |s| s.bytes,
        ),
    ] {
        out.help(metric, "counter", help);
        for VolumeRow { name, stats, .. } in volumes {
            for (class, s) in &stats.classes {
                out.sample(
                    metric,
                    &[("volume", name), ("class", class.name())],
                    pick(s) as f64,
                );
            }
        }
    }
    out.help(
        "sliver_volume_command_latency_seconds",
        "histogram",
        "Time from command arrival at the SCSI device server to its completion.",
    );
    for VolumeRow { name, stats, .. } in volumes {
        for class in CommandClass::ALL {
            let s = stats.class(class);
            let mut cumulative = 0u64;
            for (i, count) in s.latency_buckets.iter().enumerate() {
                cumulative += count;
                let le = match LATENCY_BOUNDS_US.get(i) {
                    Some(us) => format!("{}", *us as f64 / 1e6),
                    None => "+Inf".into(),
                };
                out.sample(
                    "sliver_volume_command_latency_seconds_bucket",
                    &[("volume", name), ("class", class.name()), ("le", &le)],
                    cumulative as f64,
                );
            }
            out.sample(
                "sliver_volume_command_latency_seconds_sum",
                &[("volume", name), ("class", class.name())],
                s.latency_sum_us as f64 / 1e6,
            );
            out.sample(
                "sliver_volume_command_latency_seconds_count",
                &[("volume", name), ("class", class.name())],
                s.commands as f64,
            );
        }
    }
}

/// The VAAI primitives and the bytes they affected, of each volume.
fn volume_vaai(out: &mut Text, volumes: &[VolumeRow]) {
    out.help(
        "sliver_volume_vaai_total",
        "counter",
        "VAAI primitives by esxtop column: ats, ats_failed, clone_read, clone_write, clone_failed, zero, zero_failed, delete, delete_failed.",
    );
    for VolumeRow { name, stats, .. } in volumes {
        let v = &stats.vaai;
        for (primitive, value) in [
            ("ats", v.ats),
            ("ats_failed", v.ats_failed),
            ("clone_read", v.clone_read),
            ("clone_write", v.clone_write),
            ("clone_failed", v.clone_failed),
            ("zero", v.zero),
            ("zero_failed", v.zero_failed),
            ("delete", v.delete),
            ("delete_failed", v.delete_failed),
        ] {
            out.sample(
                "sliver_volume_vaai_total",
                &[("volume", name), ("primitive", primitive)],
                value as f64,
            );
        }
    }
    for (metric, help, pick) in [
        (
            "sliver_volume_unmapped_bytes_total",
            "Bytes released by UNMAP (esxtop MBDEL).",
            (|v: &sliver_scsi::VaaiCounters| v.deleted_bytes) as fn(&_) -> u64,
        ),
        (
            "sliver_volume_zeroed_bytes_total",
            "Bytes written by WRITE SAME.",
            |v| v.zeroed_bytes,
        ),
        (
            "sliver_volume_cloned_bytes_total",
            "Bytes copied into this volume by EXTENDED COPY.",
            |v| v.cloned_bytes,
        ),
    ] {
        out.help(metric, "counter", help);
        for VolumeRow { name, stats, .. } in volumes {
            out.sample(metric, &[("volume", name)], pick(&stats.vaai) as f64);
        }
    }
}

/// Space gauges and the write cache setting of each volume.
fn volume_space(out: &mut Text, volumes: &[VolumeRow]) {
    for (metric, help, pick) in [
        (
            "sliver_volume_provisioned_bytes",
            "Size the hosts see.",
            (|s: &sliver_volume::VolumeSpace| s.provisioned_bytes as f64) as fn(&_) -> f64,
        ),
        (
            "sliver_volume_mapped_bytes",
            "Bytes hosts wrote and did not unmap (zeros excluded).",
            |s| s.mapped_bytes as f64,
        ),
        (
            "sliver_volume_unique_bytes",
            "Physical bytes only this volume references (freed by deleting it).",
            |s| s.unique_bytes as f64,
        ),
        (
            "sliver_volume_shared_bytes",
            "Physical bytes shared with other volumes.",
            |s| s.shared_bytes as f64,
        ),
        (
            "sliver_volume_data_reduction_ratio",
            "Mapped bytes per physical byte referenced (dedup x compression).",
            |s| s.data_reduction,
        ),
        (
            "sliver_volume_thin_provisioning_ratio",
            "Share of the volume never written (0..1).",
            |s| s.thin_provisioning(),
        ),
    ] {
        out.help(metric, "gauge", help);
        for VolumeRow { name, space, .. } in volumes {
            out.sample(metric, &[("volume", name)], pick(space));
        }
    }

    // One series per volume, the value saying which setting is in effect: dashboards and
    // alerts find write-back volumes with `sliver_volume_write_back == 1`.
    out.help(
        "sliver_volume_write_back",
        "gauge",
        "1 when the volume answers writes before they are durable (write-back, WCE=1), 0 when write-through.",
    );
    for VolumeRow {
        name, write_back, ..
    } in volumes
    {
        let value = f64::from(u8::from(*write_back));
        out.sample("sliver_volume_write_back", &[("volume", name)], value);
    }
}

/// The array's capacity, space use, reduction and the garbage collector's work.
fn array_space(out: &mut Text, space: &EngineSpace) {
    for (metric, kind, help, value) in [
        (
            "sliver_array_capacity_bytes",
            "gauge",
            "Bytes hosts can fill (log capacity less the collector's reserve).",
            space.capacity_bytes as f64,
        ),
        (
            "sliver_array_physical_used_bytes",
            "gauge",
            "Bytes of log segments in use.",
            space.physical_used_bytes as f64,
        ),
        (
            "sliver_array_anchored_bytes",
            "gauge",
            "Log space held for anchored blocks (SBC ANCHOR).",
            space.anchored_bytes as f64,
        ),
        (
            "sliver_array_live_bytes",
            "gauge",
            "Bytes of stored data still referenced.",
            space.live_bytes as f64,
        ),
        (
            "sliver_array_reclaimable_bytes",
            "gauge",
            "Bytes in use that garbage collection can return.",
            space.reclaimable_bytes as f64,
        ),
        (
            "sliver_array_provisioned_bytes",
            "gauge",
            "Provisioned bytes of all volumes.",
            space.provisioned_bytes as f64,
        ),
        (
            "sliver_array_mapped_bytes",
            "gauge",
            "Logical bytes mapped by all volumes.",
            space.logical_mapped_bytes as f64,
        ),
        (
            "sliver_array_data_reduction_ratio",
            "gauge",
            "Mapped bytes per live byte (dedup x compression).",
            space.data_reduction,
        ),
        (
            "sliver_array_total_reduction_ratio",
            "gauge",
            "Provisioned bytes per physical byte used (thin provisioning and zeros included).",
            space.total_reduction,
        ),
        (
            "sliver_array_soft_threshold_exceeded",
            "gauge",
            "1 while the thin-provisioning soft threshold is exceeded.",
            u8::from(space.soft_threshold_exceeded) as f64,
        ),
        (
            "sliver_gc_write_amplification_ratio",
            "gauge",
            "(host + relocated bytes) / host bytes since the array was created.",
            space.write_amplification,
        ),
        (
            "sliver_gc_relocated_bytes_total",
            "counter",
            "Bytes the garbage collector relocated.",
            space.gc_relocated_bytes as f64,
        ),
        (
            "sliver_host_written_bytes_total",
            "counter",
            "Bytes the engine stored for hosts (after dedup and compression).",
            space.host_written_bytes as f64,
        ),
    ] {
        out.help(metric, kind, help);
        out.sample(metric, &[], value);
    }
}

/// The engine's data and metadata counters since the process started, and its metadata
/// cache.
fn engine_counters(out: &mut Text, space: &EngineSpace, cache: &PagerStats) {
    for (metric, kind, help, value) in [
        (
            "sliver_engine_data_chunks_written_total",
            "counter",
            "Chunks of data hosts wrote (zeros excluded), since the process started.",
            space.data_chunks_written as f64,
        ),
        (
            "sliver_engine_log_syncs_total",
            "counter",
            "Syncs of the log (SYNCHRONIZE CACHE, FUA, write-through writes, checkpoints), since the process started; writes per sync is what group commit shares.",
            space.log_syncs as f64,
        ),
        (
            "sliver_engine_dedup_chunks_total",
            "counter",
            "Of those, chunks found already stored (deduplicated), since the process started.",
            space.dedup_chunks as f64,
        ),
        (
            "sliver_engine_metadata_written_bytes_total",
            "counter",
            "Bytes of metadata pages checkpoints wrote, since the process started.",
            space.metadata_written_bytes as f64,
        ),
        (
            "sliver_engine_metadata_cache_pages",
            "gauge",
            "Metadata pages in the cache ([engine] metadata_cache).",
            cache.resident as f64,
        ),
        (
            "sliver_engine_metadata_cache_dirty_pages",
            "gauge",
            "Metadata pages changed since the last checkpoint.",
            cache.dirty as f64,
        ),
        (
            "sliver_engine_metadata_journal_words",
            "gauge",
            "Words of metadata pages written as deltas, pending on top of their pages' last whole version.",
            cache.journal_words as f64,
        ),
        (
            "sliver_engine_metadata_journal_pages",
            "gauge",
            "Journal pages in the metadata file holding those words.",
            cache.journal_pages as f64,
        ),
        (
            "sliver_engine_metadata_journal_ram_bytes",
            "gauge",
            "RAM the pending words take (part of [engine] metadata_cache).",
            cache.journal_bytes as f64,
        ),
        (
            "sliver_engine_metadata_cache_faults_total",
            "counter",
            "Metadata pages read from disk, since the process started.",
            cache.faults as f64,
        ),
    ] {
        out.help(metric, kind, help);
        out.sample(metric, &[], value);
    }
}

/// Shipping to the object store.
fn replication(out: &mut Text, r: &ReplicationReport) {
    let s = &r.status;
    let lag = Some(s.lag.map_or(0.0, |t| t.as_secs_f64()));
    for (metric, kind, help, value) in [
        (
            "sliver_replication_shipped_objects_total",
            "counter",
            "Stream objects created in the object store since the process started.",
            Some(s.objects as f64),
        ),
        (
            "sliver_replication_shipped_bytes_total",
            "counter",
            "Bytes of writes shipped to the object store since the process started.",
            Some(s.bytes as f64),
        ),
        (
            "sliver_replication_backlog_bytes",
            "gauge",
            "Bytes of writes waiting for the object store.",
            Some(s.backlog_bytes as f64),
        ),
        (
            "sliver_replication_lag_seconds",
            "gauge",
            "Age of the oldest write the object store does not hold yet (0 when it holds all).",
            lag,
        ),
        (
            "sliver_replication_resyncs_total",
            "counter",
            "Times the copy started over with a base because the backlog bound was passed.",
            Some(s.resyncs as f64),
        ),
        (
            "sliver_replication_retention_deleted_objects_total",
            "counter",
            "Objects retention deleted from the store since the process started (no restore point needed them).",
            Some(s.deleted_objects as f64),
        ),
        (
            "sliver_replication_newest_point_age_seconds",
            "gauge",
            "Age of the newest restore point (absent until one exists): alert when it passes the schedule.",
            s.newest_point
                .as_ref()
                .map(|p| crate::array::now_ms().saturating_sub(p.time_ms) as f64 / 1e3),
        ),
        (
            "sliver_replication_healthy",
            "gauge",
            "1 while the copy follows the array (a base or the stream), 0 when fenced or broken.",
            Some(f64::from(u8::from(matches!(
                s.state,
                sliver_replica::ship::ShipState::Base | sliver_replica::ship::ShipState::Streaming
            )))),
        ),
    ] {
        if let Some(v) = value {
            out.help(metric, kind, help);
            out.sample(metric, &[], v);
        }
    }
}

/// Fetching a restored array's data back from the object store.
fn hydration(out: &mut Text, h: &HydrationStatus) {
    for (metric, kind, help, value) in [
        (
            "sliver_hydration_bytes_left",
            "gauge",
            "Bytes of a restored array still only in the object store (0 once every byte is local).",
            h.bytes_left,
        ),
        (
            "sliver_hydration_fetched_bytes_total",
            "counter",
            "Bytes a restored array fetched from the object store since the process started.",
            h.fetched_bytes,
        ),
        (
            "sliver_hydration_on_demand_fetches_total",
            "counter",
            "Reads that waited for data to be fetched from the object store.",
            h.on_demand_fetches,
        ),
    ] {
        out.help(metric, kind, help);
        out.sample(metric, &[], value as f64);
    }
}

#[derive(Default)]
struct Text(String);

impl Text {
    fn help(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", format_value(value));
    }
}

/// The engine's metadata lock: the serial section every command passes (RFC 0005).
fn metadata_lock(out: &mut Text, engine: &sliver_engine::Engine) {
    for (metric, kind, help, value) in [
        (
            "sliver_engine_metadata_lock_longest_hold_seconds",
            "gauge",
            "Longest hold of the engine's metadata lock since the process started.",
            engine.longest_lock_hold_us() as f64 / 1e6,
        ),
        (
            "sliver_engine_metadata_lock_held_seconds_total",
            "counter",
            "Time the engine's metadata lock was held in all, since the process started: \
             its rate is the share of one core the engine's serial part takes.",
            engine.lock_held_ns() as f64 / 1e9,
        ),
    ] {
        out.help(metric, kind, help);
        out.sample(metric, &[], value);
    }
    let metric = "sliver_engine_metadata_lock_hold_seconds";
    out.help(
        metric,
        "histogram",
        "Holds of the engine's metadata lock by length, since the process started (buckets \
         8 to a power of two, from 256 ns to about 1 s).",
    );
    let holds = engine.lock_holds();
    for &(le, count) in &holds {
        let le = if le.is_finite() {
            format!("{le}")
        } else {
            "+Inf".into()
        };
        out.sample(&format!("{metric}_bucket"), &[("le", &le)], count as f64);
    }
    let count = holds.last().map_or(0, |&(_, n)| n);
    out.sample(
        &format!("{metric}_sum"),
        &[],
        engine.lock_held_ns() as f64 / 1e9,
    );
    out.sample(&format!("{metric}_count"), &[], count as f64);
}

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_values_formatted() {
        let mut t = Text::default();
        t.sample("m", &[("volume", "a\"b\\c")], 3.0);
        t.sample("m", &[], 0.25);
        t.sample("m", &[], f64::INFINITY);
        assert_eq!(t.0, "m{volume=\"a\\\"b\\\\c\"} 3\nm 0.25\nm +Inf\n");
    }
}
