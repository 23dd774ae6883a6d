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

/// A volume's cumulative VAAI counts: a row shows them as they are, like esxtop.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Vaai {
    ats: u64,
    ats_failed: u64,
    clone_read: u64,
    clone_write: u64,
    clone_failed: u64,
    zero: u64,
    zero_failed: u64,
    delete: u64,
    delete_failed: u64,
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
    vaai: Vaai,
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
        c.vaai = Vaai {
            ats: n(&a["ats"]),
            ats_failed: n(&a["ats_failed"]),
            clone_read: n(&a["clone_read"]),
            clone_write: n(&a["clone_write"]),
            clone_failed: n(&a["clone_failed"]),
            zero: n(&a["zero"]),
            zero_failed: n(&a["zero_failed"]),
            delete: n(&a["delete"]),
            delete_failed: n(&a["delete_failed"]),
        };
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
    vaai: Vaai,
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
        vaai: now.vaai,
        mb_deleted_per_s: per_s(now.deleted_bytes, before.deleted_bytes) / 1e6,
        reduction: now.reduction,
    }
}

/// How a column's value is written: a count as is, a rate with `csv_digits` after the point in
/// the CSV and `screen_digits` on the screen, a ratio with three digits in the CSV and two and
/// an `x` on the screen.
#[derive(Clone, Copy)]
enum Cell {
    Count(fn(&Row) -> u64),
    Rate {
        of: fn(&Row) -> f64,
        csv_digits: usize,
        screen_digits: usize,
    },
    Ratio(fn(&Row) -> f64),
}

/// One column after the volume's. The one list of them keeps the CSV and the screen in the same
/// order with the same measures.
struct Column {
    csv_name: &'static str,
    heading: &'static str,
    /// Screen width, the heading's and the value's.
    width: usize,
    cell: Cell,
}

const fn rate(
    csv_name: &'static str,
    heading: &'static str,
    width: usize,
    of: fn(&Row) -> f64,
    csv_digits: usize,
    screen_digits: usize,
) -> Column {
    Column {
        csv_name,
        heading,
        width,
        cell: Cell::Rate {
            of,
            csv_digits,
            screen_digits,
        },
    }
}

const fn count(
    csv_name: &'static str,
    heading: &'static str,
    width: usize,
    of: fn(&Row) -> u64,
) -> Column {
    Column {
        csv_name,
        heading,
        width,
        cell: Cell::Count(of),
    }
}

const COLUMNS: [Column; 17] = [
    rate("cmds_per_s", "CMDS/s", 8, |r| r.cmds_per_s, 1, 0),
    rate("reads_per_s", "READS/s", 8, |r| r.reads_per_s, 1, 0),
    rate("writes_per_s", "WRITES/s", 8, |r| r.writes_per_s, 1, 0),
    rate("mb_read_per_s", "MBREAD/s", 8, |r| r.mb_read_per_s, 3, 2),
    rate(
        "mb_written_per_s",
        "MBWRTN/s",
        8,
        |r| r.mb_written_per_s,
        3,
        2,
    ),
    rate("avg_latency_ms", "DAVG/ms", 7, |r| r.avg_ms, 3, 2),
    count("ats", "ATS", 7, |r| r.vaai.ats),
    count("ats_failed", "ATSF", 5, |r| r.vaai.ats_failed),
    count("clone_rd", "CLONE_RD", 8, |r| r.vaai.clone_read),
    count("clone_wr", "CLONE_WR", 8, |r| r.vaai.clone_write),
    count("clone_f", "CLONE_F", 6, |r| r.vaai.clone_failed),
    count("zero", "ZERO", 7, |r| r.vaai.zero),
    count("zero_f", "ZERO_F", 6, |r| r.vaai.zero_failed),
    count("delete", "DELETE", 7, |r| r.vaai.delete),
    count("delete_f", "DELETE_F", 8, |r| r.vaai.delete_failed),
    rate("mbdel_per_s", "MBDEL/s", 6, |r| r.mb_deleted_per_s, 3, 1),
    Column {
        csv_name: "data_reduction",
        heading: "REDUC",
        width: 6,
        cell: Cell::Ratio(|r| r.reduction),
    },
];

fn csv_header() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.csv_name).collect();
    format!("time,volume,{}", names.join(","))
}

fn csv_line(time: &str, r: &Row) -> String {
    let mut line = format!("{time},{}", csv_field(&r.volume));
    for c in &COLUMNS {
        line.push(',');
        line += &match c.cell {
            Cell::Count(of) => of(r).to_string(),
            Cell::Rate { of, csv_digits, .. } => format!("{:.*}", csv_digits, of(r)),
            Cell::Ratio(of) => format!("{:.3}", of(r)),
        };
    }
    line
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
    let client = Client::new(api)?;
    let (mut last_time, mut last) = sample(&client)?;
    let mut out = std::io::stdout().lock();
    if args.batch {
        writeln!(out, "{}", csv_header()).map_err(|e| e.to_string())?;
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
        sliver_api_types::units::human_bytes(r["backlog_bytes"].as_u64().unwrap_or(0))
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
    let mut heading = format!("{:<20}", "DEVICE");
    for c in &COLUMNS {
        heading += &format!(" {:>w$}", c.heading, w = c.width);
    }
    writeln!(out, "{heading}")?;
    for r in rows {
        let mut line = format!("{:<20}", truncate(&r.volume, 20));
        for c in &COLUMNS {
            let value = match c.cell {
                Cell::Count(of) => of(r).to_string(),
                Cell::Rate {
                    of, screen_digits, ..
                } => format!("{:.*}", screen_digits, of(r)),
                Cell::Ratio(of) => format!("{:.2}x", of(r)),
            };
            line += &format!(" {:>w$}", value, w = c.width);
        }
        writeln!(out, "{line}")?;
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
        let ats_only = |ats| Vaai {
            ats,
            ..Vaai::default()
        };
        let before = Counters {
            commands: 100,
            reads: 40,
            read_bytes: 4_000_000,
            latency_us: 10_000,
            deleted_bytes: 0,
            vaai: ats_only(5),
            ..Counters::default()
        };
        let now = Counters {
            commands: 300,
            reads: 140,
            read_bytes: 14_000_000,
            latency_us: 50_000,
            deleted_bytes: 20_000_000,
            vaai: ats_only(7),
            ..Counters::default()
        };
        let r = row("v", &before, &now, 2.0);
        assert_eq!(r.cmds_per_s, 100.0);
        assert_eq!(r.reads_per_s, 50.0);
        assert_eq!(r.mb_read_per_s, 5.0);
        assert_eq!(r.avg_ms, 0.2);
        assert_eq!(r.mb_deleted_per_s, 10.0);
        assert_eq!(r.vaai.ats, 7);
        let line = csv_line("t", &r);
        assert_eq!(
            line.split(',').count(),
            csv_header().split(',').count(),
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
