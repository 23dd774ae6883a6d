//! `sliver top`: an esxtop-style view of every volume's I/O and VAAI activity.
//!
//! Interactive mode redraws a table every interval; batch mode (`-b`) prints CSV, one row per
//! volume per sample, for later analysis (like `esxtop -b -d 5 -n 50 > stats.csv`). Rates are
//! computed from the deltas of the cumulative counters at `/api/v1/stats`; the VAAI columns
//! are cumulative counts, as in esxtop.

use crate::client::{ApiArgs, Client};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

#[derive(clap::Args)]
pub struct TopArgs {
    /// Batch mode: print CSV to stdout instead of a live screen.
    #[arg(short = 'b', long)]
    batch: bool,
    /// Seconds between samples.
    #[arg(short = 'd', long, default_value_t = 5.0)]
    delay: f64,
    /// Number of samples, then exit (default: until interrupted).
    #[arg(short = 'n', long)]
    iterations: Option<u64>,
}

/// The cumulative counters of one volume at one time.
#[derive(Clone, Debug, Default)]
struct Counters {
    commands: u64,
    reads: u64,
    writes: u64,
    read_bytes: u64,
    write_bytes: u64,
    latency_us: u64,
    ats: u64,
    ats_failed: u64,
    clone_read: u64,
    clone_write: u64,
    clone_failed: u64,
    zero: u64,
    zero_failed: u64,
    delete: u64,
    delete_failed: u64,
    deleted_bytes: u64,
    reduction: f64,
}

impl Counters {
    fn from_json(v: &Value) -> Counters {
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        let classes = v["classes"].as_object();
        let mut c = Counters {
            reduction: v["data_reduction"].as_f64().unwrap_or(1.0),
            ..Counters::default()
        };
        if let Some(classes) = classes {
            for (name, s) in classes {
                c.commands += n(&s["commands"]);
                c.latency_us += n(&s["latency_sum_us"]);
                match name.as_str() {
                    "read" => {
                        c.reads += n(&s["commands"]);
                        c.read_bytes += n(&s["bytes"]);
                    }
                    "write" | "compare_and_write" => {
                        c.writes += n(&s["commands"]);
                        c.write_bytes += n(&s["bytes"]);
                    }
                    _ => {}
                }
            }
        }
        let a = &v["vaai"];
        c.ats = n(&a["ats"]);
        c.ats_failed = n(&a["ats_failed"]);
        c.clone_read = n(&a["clone_read"]);
        c.clone_write = n(&a["clone_write"]);
        c.clone_failed = n(&a["clone_failed"]);
        c.zero = n(&a["zero"]);
        c.zero_failed = n(&a["zero_failed"]);
        c.delete = n(&a["delete"]);
        c.delete_failed = n(&a["delete_failed"]);
        c.deleted_bytes = n(&a["deleted_bytes"]);
        c
    }
}

/// One row: rates over the interval plus cumulative VAAI counts.
#[derive(Debug, PartialEq)]
struct Row {
    volume: String,
    cmds_per_s: f64,
    reads_per_s: f64,
    writes_per_s: f64,
    mb_read_per_s: f64,
    mb_written_per_s: f64,
    /// Average latency of the interval's commands, milliseconds.
    avg_ms: f64,
    ats: u64,
    ats_failed: u64,
    clone_read: u64,
    clone_write: u64,
    clone_failed: u64,
    zero: u64,
    zero_failed: u64,
    delete: u64,
    delete_failed: u64,
    mb_deleted_per_s: f64,
    reduction: f64,
}

fn row(volume: &str, before: &Counters, now: &Counters, seconds: f64) -> Row {
    let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
    let per_s = |a: u64, b: u64| {
        if seconds > 0.0 {
            d(a, b) / seconds
        } else {
            0.0
        }
    };
    let commands = d(now.commands, before.commands);
    Row {
        volume: volume.to_string(),
        cmds_per_s: per_s(now.commands, before.commands),
        reads_per_s: per_s(now.reads, before.reads),
        writes_per_s: per_s(now.writes, before.writes),
        mb_read_per_s: per_s(now.read_bytes, before.read_bytes) / 1e6,
        mb_written_per_s: per_s(now.write_bytes, before.write_bytes) / 1e6,
        avg_ms: if commands > 0.0 {
            d(now.latency_us, before.latency_us) / commands / 1000.0
        } else {
            0.0
        },
        ats: now.ats,
        ats_failed: now.ats_failed,
        clone_read: now.clone_read,
        clone_write: now.clone_write,
        clone_failed: now.clone_failed,
        zero: now.zero,
        zero_failed: now.zero_failed,
        delete: now.delete,
        delete_failed: now.delete_failed,
        mb_deleted_per_s: per_s(now.deleted_bytes, before.deleted_bytes) / 1e6,
        reduction: now.reduction,
    }
}

const CSV_HEADER: &str = "time,volume,cmds_per_s,reads_per_s,writes_per_s,mb_read_per_s,mb_written_per_s,avg_latency_ms,ats,ats_failed,clone_rd,clone_wr,clone_f,zero,zero_f,delete,delete_f,mbdel_per_s,data_reduction";

fn csv_line(time: &str, r: &Row) -> String {
    format!(
        "{time},{},{:.1},{:.1},{:.1},{:.3},{:.3},{:.3},{},{},{},{},{},{},{},{},{},{:.3},{:.3}",
        csv_field(&r.volume),
        r.cmds_per_s,
        r.reads_per_s,
        r.writes_per_s,
        r.mb_read_per_s,
        r.mb_written_per_s,
        r.avg_ms,
        r.ats,
        r.ats_failed,
        r.clone_read,
        r.clone_write,
        r.clone_failed,
        r.zero,
        r.zero_failed,
        r.delete,
        r.delete_failed,
        r.mb_deleted_per_s,
        r.reduction
    )
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn sample(client: &Client) -> Result<(u64, BTreeMap<String, Counters>), String> {
    let v: Value = client.get("/api/v1/stats")?;
    let time_ms = v["time_ms"].as_u64().unwrap_or(0);
    let volumes = v["volumes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap_or("?").to_string(),
                        Counters::from_json(v),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((time_ms, volumes))
}

fn rfc3339(ms: u64) -> String {
    sliver_replica::catalog::utc(ms)
}

pub fn run(api: &ApiArgs, args: TopArgs) -> Result<(), String> {
    if !(args.delay >= 0.1 && args.delay <= 3600.0) {
        return Err(format!(
            "the delay must be between 0.1 and 3600 seconds, not {}",
            args.delay
        ));
    }
    let client = Client::new(api);
    let (mut last_time, mut last) = sample(&client)?;
    let mut out = std::io::stdout().lock();
    if args.batch {
        writeln!(out, "{CSV_HEADER}").map_err(|e| e.to_string())?;
    }
    let mut done = 0u64;
    while args.iterations.is_none_or(|n| done < n) {
        std::thread::sleep(Duration::from_secs_f64(args.delay));
        let (time, now) = sample(&client)?;
        let seconds = time.saturating_sub(last_time) as f64 / 1000.0;
        let rows: Vec<Row> = now
            .iter()
            .map(|(name, c)| {
                row(
                    name,
                    last.get(name).unwrap_or(&Counters::default()),
                    c,
                    seconds,
                )
            })
            .collect();
        let written = if args.batch {
            let stamp = rfc3339(time);
            rows.iter()
                .try_for_each(|r| writeln!(out, "{}", csv_line(&stamp, r)))
                .and_then(|()| out.flush())
        } else {
            // The copy's line: absent without one, and a failed read only loses the line.
            let copy = client
                .get::<Value>("/api/v1/replication")
                .ok()
                .and_then(|r| copy_line(&r, time));
            draw(&mut out, &rfc3339(time), copy.as_deref(), &rows)
        };
        // A closed pipe (e.g. `| head`) ends the run quietly.
        if written.is_err() {
            return Ok(());
        }
        last_time = time;
        last = now;
        done += 1;
    }
    Ok(())
}

/// One line on the off-site copy (`GET /api/v1/replication`), or `None` without one: state,
/// lag, backlog, the store's error, and the newest restore point's age at `now_ms`.
fn copy_line(r: &Value, now_ms: u64) -> Option<String> {
    if r["configured"].as_bool() != Some(true) {
        return None;
    }
    let mut line = format!(
        "copy {} {}  lag {:.1} s  backlog {}",
        r["target"].as_str().unwrap_or("?"),
        r["state"].as_str().unwrap_or("?"),
        r["lag_seconds"].as_f64().unwrap_or(0.0),
        sliver_reclaim::units::human_bytes(r["backlog_bytes"].as_u64().unwrap_or(0))
    );
    let p = &r["newest_point"];
    match p["time_ms"].as_u64() {
        Some(t) => {
            line += &format!(
                "  point {} ({} min ago)",
                p["name"].as_str().unwrap_or("?"),
                now_ms.saturating_sub(t) / 60_000
            )
        }
        None => line += "  no restore point yet",
    }
    if let Some(e) = r["error"].as_str() {
        line += &format!("  ERROR {}", truncate(e, 80));
    }
    Some(line)
}

fn draw(out: &mut impl Write, time: &str, copy: Option<&str>, rows: &[Row]) -> std::io::Result<()> {
    // Home the cursor and clear the screen, then one line per volume.
    write!(out, "\x1b[H\x1b[2J")?;
    writeln!(out, "sliver top  {time}  ({} volumes)", rows.len())?;
    if let Some(c) = copy {
        writeln!(out, "{c}")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<20} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>5} {:>8} {:>8} {:>6} {:>7} {:>6} {:>7} {:>8} {:>6} {:>6}",
        "DEVICE", "CMDS/s", "READS/s", "WRITES/s", "MBREAD/s", "MBWRTN/s", "DAVG/ms", "ATS", "ATSF",
        "CLONE_RD", "CLONE_WR", "CLONE_F", "ZERO", "ZERO_F", "DELETE", "DELETE_F", "MBDEL/s", "REDUC"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<20} {:>8.0} {:>8.0} {:>8.0} {:>8.2} {:>8.2} {:>7.2} {:>7} {:>5} {:>8} {:>8} {:>6} {:>7} {:>6} {:>7} {:>8} {:>6.1} {:>5.2}x",
            truncate(&r.volume, 20),
            r.cmds_per_s,
            r.reads_per_s,
            r.writes_per_s,
            r.mb_read_per_s,
            r.mb_written_per_s,
            r.avg_ms,
            r.ats,
            r.ats_failed,
            r.clone_read,
            r.clone_write,
            r.clone_failed,
            r.zero,
            r.zero_failed,
            r.delete,
            r.delete_failed,
            r.mb_deleted_per_s,
            r.reduction
        )?;
    }
    out.flush()
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('~')).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_deltas_and_vaai_counts_are_cumulative() {
        let before = Counters {
            commands: 100,
            reads: 40,
            read_bytes: 4_000_000,
            latency_us: 10_000,
            deleted_bytes: 0,
            ats: 5,
            ..Counters::default()
        };
        let now = Counters {
            commands: 300,
            reads: 140,
            read_bytes: 14_000_000,
            latency_us: 50_000,
            deleted_bytes: 20_000_000,
            ats: 7,
            ..Counters::default()
        };
        let r = row("v", &before, &now, 2.0);
        assert_eq!(r.cmds_per_s, 100.0);
        assert_eq!(r.reads_per_s, 50.0);
        assert_eq!(r.mb_read_per_s, 5.0);
        assert_eq!(r.avg_ms, 0.2);
        assert_eq!(r.mb_deleted_per_s, 10.0);
        assert_eq!(r.ats, 7);
        let line = csv_line("t", &r);
        assert_eq!(
            line.split(',').count(),
            CSV_HEADER.split(',').count(),
            "{line}"
        );
    }

    #[test]
    fn the_copy_line_shows_state_lag_point_and_error() {
        assert_eq!(
            copy_line(&serde_json::json!({"configured": false}), 0),
            None
        );
        let r = serde_json::json!({
            "configured": true, "target": "s3://b/a", "state": "streaming",
            "lag_seconds": 1.25, "backlog_bytes": 3 << 20,
            "newest_point": {"name": "auto-x", "time_ms": 60_000},
            "error": null
        });
        let line = copy_line(&r, 660_000).unwrap();
        assert!(
            line.starts_with("copy s3://b/a streaming  lag 1.2 s  backlog 3"),
            "{line}"
        );
        assert!(line.contains("point auto-x (10 min ago)"), "{line}");
        assert!(!line.contains("ERROR"));
        let mut r = r;
        r["error"] = "store down".into();
        r["newest_point"] = Value::Null;
        let line = copy_line(&r, 0).unwrap();
        assert!(
            line.contains("no restore point yet") && line.ends_with("ERROR store down"),
            "{line}"
        );
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_305_600_000), "2026-11-22T00:00:00Z");
    }
}
