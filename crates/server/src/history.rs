//! Statistics history: what the console's charts and any other client draw, kept on the
//! server so it survives page loads (RFC 0002).
//!
//! Every few seconds the sampler reads the cumulative counters (per volume: commands, bytes,
//! latency histograms and VAAI counters by command class; the array's space and GC figures)
//! and [`History::record`] turns the difference from the previous reading into one point of
//! rates. Two rings per scope: fine points (every sample, the last hour for the array) and
//! coarse ones (one per minute, the last day), the coarse ones computed from the counters at
//! minute boundaries rather than averaged from fine points, so they are exact. The whole
//! history is bounded: `FINE_POINTS + COARSE_POINTS` points for the array and
//! `VOLUME_POINTS` of each kind per volume, a few hundred bytes each.
//!
//! Pure and clock-free: the caller passes the time, so tests drive it without sleeping. It is
//! not persisted: an idle array writes nothing (RFC 0001), and long-term history belongs in
//! the Prometheus that scrapes `/metrics`.

// The points are the API's JSON types (`GET /api/v1/stats/history`).
pub use sliver_api_types::{Point, SpaceReading};
use sliver_scsi::{ClassStats, CommandClass, VaaiCounters, LATENCY_BOUNDS_US};
use std::collections::{BTreeMap, VecDeque};

/// Seconds between samples.
pub const SAMPLE_SECONDS: u64 = 5;
/// Seconds per coarse point.
pub const COARSE_SECONDS: u64 = 60;
/// Fine array points kept: one hour.
pub const FINE_POINTS: usize = 720;
/// Coarse array points kept: one day.
pub const COARSE_POINTS: usize = 1_440;
/// Points of each kind kept per volume (five minutes fine, one hour coarse).
pub const VOLUME_POINTS: usize = 60;

/// One reading of a scope's cumulative counters.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// By command class, as the LU counts them (summed over volumes for the array).
    pub classes: BTreeMap<&'static str, ClassStats>,
    pub vaai: VaaiCounters,
    /// Array only: space and GC (cumulative where the name says so).
    pub space: Option<SpaceReading>,
}

/// The rates between two readings of one scope. Counters that went backwards (a volume
/// deleted and created again under its name) count from zero.
pub fn rates(before: &Counters, after: &Counters, seconds: f64, time_ms: u64) -> Point {
    let secs = seconds.max(1e-3);
    let empty = ClassStats::default();
    let d = |a: u64, b: u64| if b >= a { b - a } else { b };
    let class = |name: &str| {
        let b = before.classes.get(name).unwrap_or(&empty);
        let a = after.classes.get(name).unwrap_or(&empty);
        (b, a)
    };
    let mut p = Point {
        time_ms,
        seconds,
        ..Point::default()
    };
    let mut buckets = vec![0u64; LATENCY_BOUNDS_US.len() + 1];
    let mut errors = 0;
    for c in CommandClass::ALL {
        let (b, a) = class(c.name());
        let n = d(b.commands, a.commands);
        let bytes = d(b.bytes, a.bytes);
        let lat = d(b.latency_sum_us, a.latency_sum_us);
        errors += d(b.errors, a.errors);
        for (i, slot) in buckets.iter_mut().enumerate() {
            let x = |s: &ClassStats| s.latency_buckets.get(i).copied().unwrap_or(0);
            *slot += d(x(b), x(a));
        }
        let mean = if n > 0 { lat as f64 / n as f64 } else { 0.0 };
        match c {
            CommandClass::Read => {
                p.read_iops = n as f64 / secs;
                p.read_bytes_per_s = bytes as f64 / secs;
                p.read_latency_us = mean;
            }
            CommandClass::Write => {
                p.write_iops = n as f64 / secs;
                p.write_bytes_per_s = bytes as f64 / secs;
                p.write_latency_us = mean;
            }
            _ => p.other_iops += n as f64 / secs,
        }
    }
    p.errors_per_s = errors as f64 / secs;
    p.p99_latency_us = percentile_bound(&buckets, 0.99);
    let (vb, va) = (&before.vaai, &after.vaai);
    let r = |x: u64, y: u64| d(x, y) as f64 / secs;
    p.ats_per_s = r(vb.ats, va.ats);
    p.ats_failed_per_s = r(vb.ats_failed, va.ats_failed);
    p.clone_write_per_s = r(vb.clone_write, va.clone_write);
    p.zero_per_s = r(vb.zero, va.zero);
    p.delete_per_s = r(vb.delete, va.delete);
    p.deleted_bytes_per_s = r(vb.deleted_bytes, va.deleted_bytes);
    p.zeroed_bytes_per_s = r(vb.zeroed_bytes, va.zeroed_bytes);
    p.cloned_bytes_per_s = r(vb.cloned_bytes, va.cloned_bytes);
    if let Some(sa) = &after.space {
        let sb = before.space.clone().unwrap_or_default();
        let host = d(sb.host_written_bytes, sa.host_written_bytes);
        let moved = d(sb.gc_relocated_bytes, sa.gc_relocated_bytes);
        p.host_written_bytes_per_s = Some(host as f64 / secs);
        p.gc_relocated_bytes_per_s = Some(moved as f64 / secs);
        p.write_amplification = (host > 0).then(|| (host + moved) as f64 / host as f64);
        p.space = Some(sa.clone());
    }
    p
}

/// The upper bound of the bucket holding the `q` quantile of `buckets` (counts per bucket of
/// [`LATENCY_BOUNDS_US`], then one above the last).
pub fn percentile_bound(buckets: &[u64], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= want {
            return Some(LATENCY_BOUNDS_US[i.min(LATENCY_BOUNDS_US.len() - 1)]);
        }
    }
    LATENCY_BOUNDS_US.last().copied()
}

/// One scope's rings (the array, or one volume).
#[derive(Debug)]
struct Rings {
    fine: VecDeque<Point>,
    coarse: VecDeque<Point>,
    fine_cap: usize,
    coarse_cap: usize,
    /// The previous reading and its time.
    last: Option<(u64, Counters)>,
    /// The reading at the last coarse boundary.
    minute: Option<(u64, Counters)>,
}

impl Rings {
    fn new(fine_cap: usize, coarse_cap: usize) -> Self {
        Rings {
            fine: VecDeque::with_capacity(fine_cap),
            coarse: VecDeque::with_capacity(coarse_cap),
            fine_cap,
            coarse_cap,
            last: None,
            minute: None,
        }
    }

    fn record(&mut self, now_ms: u64, counters: Counters) {
        if let Some((t, prev)) = &self.last {
            if now_ms <= *t {
                return; // the clock went back or stood still: no interval to rate
            }
            push(
                &mut self.fine,
                self.fine_cap,
                rates(prev, &counters, (now_ms - t) as f64 / 1e3, now_ms),
            );
        }
        match &self.minute {
            Some((t, prev)) if now_ms >= t + COARSE_SECONDS * 1000 => {
                push(
                    &mut self.coarse,
                    self.coarse_cap,
                    rates(prev, &counters, (now_ms - t) as f64 / 1e3, now_ms),
                );
                self.minute = Some((now_ms, counters.clone()));
            }
            Some((t, _)) if now_ms < *t => self.minute = Some((now_ms, counters.clone())),
            Some(_) => {}
            None => self.minute = Some((now_ms, counters.clone())),
        }
        self.last = Some((now_ms, counters));
    }

    fn points(&self, coarse: bool, since_ms: u64) -> Vec<Point> {
        let ring = if coarse { &self.coarse } else { &self.fine };
        let start = ring.partition_point(|p| p.time_ms <= since_ms);
        ring.range(start..).cloned().collect()
    }
}

fn push(ring: &mut VecDeque<Point>, cap: usize, p: Point) {
    if ring.len() == cap {
        ring.pop_front();
    }
    ring.push_back(p);
}

/// The array's and every volume's history.
#[derive(Debug)]
pub struct History {
    array: Rings,
    volumes: BTreeMap<String, Rings>,
}

impl Default for History {
    fn default() -> Self {
        History {
            array: Rings::new(FINE_POINTS, COARSE_POINTS),
            volumes: BTreeMap::new(),
        }
    }
}

/// Which ring a query reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every sample ([`SAMPLE_SECONDS`]).
    Fine,
    /// One point per [`COARSE_SECONDS`].
    Coarse,
}

impl Step {
    /// From the API's `step` parameter in seconds.
    pub fn from_seconds(s: u64) -> Option<Step> {
        match s {
            SAMPLE_SECONDS => Some(Step::Fine),
            COARSE_SECONDS => Some(Step::Coarse),
            _ => None,
        }
    }
}

impl History {
    /// Adds one reading taken at `now_ms`: the array's counters and each volume's. Volumes
    /// absent from `volumes` are forgotten (deleted, or renamed: a renamed volume starts a new
    /// history under its new name).
    pub fn record(&mut self, now_ms: u64, array: Counters, volumes: Vec<(String, Counters)>) {
        self.array.record(now_ms, array);
        let names: std::collections::BTreeSet<&String> = volumes.iter().map(|(n, _)| n).collect();
        self.volumes.retain(|n, _| names.contains(n));
        for (name, c) in volumes {
            self.volumes
                .entry(name)
                .or_insert_with(|| Rings::new(VOLUME_POINTS, VOLUME_POINTS))
                .record(now_ms, c);
        }
    }

    /// The array's points after `since_ms`, oldest first.
    pub fn array(&self, step: Step, since_ms: u64) -> Vec<Point> {
        self.array.points(step == Step::Coarse, since_ms)
    }

    /// A volume's points after `since_ms`; `None` for a volume without history.
    pub fn volume(&self, name: &str, step: Step, since_ms: u64) -> Option<Vec<Point>> {
        self.volumes
            .get(name)
            .map(|r| r.points(step == Step::Coarse, since_ms))
    }
}

/// Sums per-volume class counters into the array's.
pub fn add_classes(
    total: &mut BTreeMap<&'static str, ClassStats>,
    classes: &[(CommandClass, ClassStats)],
) {
    for (c, s) in classes {
        total.entry(c.name()).or_default().add(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(reads: u64, writes: u64, write_bytes: u64, slow: u64) -> Counters {
        let mut classes = BTreeMap::new();
        let mut buckets = vec![0; LATENCY_BOUNDS_US.len() + 1];
        buckets[1] = reads + writes - slow; // <= 100 us
        buckets[8] = slow; // <= 25 ms
        classes.insert(
            "read",
            ClassStats {
                commands: reads,
                bytes: reads * 4096,
                latency_sum_us: reads * 80,
                latency_buckets: vec![0; LATENCY_BOUNDS_US.len() + 1],
                ..ClassStats::default()
            },
        );
        classes.insert(
            "write",
            ClassStats {
                commands: writes,
                bytes: write_bytes,
                latency_sum_us: writes * 100,
                latency_buckets: buckets,
                ..ClassStats::default()
            },
        );
        Counters {
            classes,
            vaai: VaaiCounters {
                delete: writes / 10,
                ..VaaiCounters::default()
            },
            space: Some(SpaceReading {
                host_written_bytes: write_bytes,
                gc_relocated_bytes: write_bytes / 4,
                physical_used_bytes: write_bytes / 2,
                ..SpaceReading::default()
            }),
        }
    }

    #[test]
    fn rates_come_from_counter_differences() {
        let a = reading(1_000, 2_000, 2_000 * 4096, 0);
        let b = reading(6_000, 12_000, 12_000 * 4096, 100);
        let p = rates(&a, &b, 5.0, 10_000);
        assert_eq!(p.read_iops, 1_000.0);
        assert_eq!(p.write_iops, 2_000.0);
        assert_eq!(p.write_bytes_per_s, 2_000.0 * 4096.0);
        assert_eq!(p.read_latency_us, 80.0);
        assert_eq!(p.write_latency_us, 100.0);
        assert_eq!(p.delete_per_s, 200.0);
        // 100 slow commands among 15,000: the 99th percentile's rank (14,850) is still a
        // fast one; with 200 slow among 10,000 (rank 9,900) it is a slow one.
        assert_eq!(p.p99_latency_us, Some(100));
        let c = reading(6_000, 22_000, 22_000 * 4096, 300);
        let p = rates(&b, &c, 5.0, 15_000);
        assert_eq!(p.p99_latency_us, Some(25_000));
        assert_eq!(p.write_amplification, Some(1.25));
        assert_eq!(p.space.unwrap().physical_used_bytes, 22_000 * 4096 / 2);
        // Nothing completed: no percentile, no amplification.
        let p = rates(&c, &c, 5.0, 20_000);
        assert_eq!((p.p99_latency_us, p.write_amplification), (None, None));
    }

    #[test]
    fn counters_that_went_back_count_from_zero() {
        let a = reading(5_000, 5_000, 5_000 * 4096, 0);
        let b = reading(10, 20, 20 * 4096, 0);
        let p = rates(&a, &b, 1.0, 1_000);
        assert_eq!((p.read_iops, p.write_iops), (10.0, 20.0));
    }

    #[test]
    fn percentile_takes_the_bucket_bound() {
        let mut b = vec![0; LATENCY_BOUNDS_US.len() + 1];
        assert_eq!(percentile_bound(&b, 0.99), None);
        b[0] = 99;
        b[LATENCY_BOUNDS_US.len()] = 1; // above the last bound
        assert_eq!(percentile_bound(&b, 0.99), Some(50));
        assert_eq!(percentile_bound(&b, 1.0), LATENCY_BOUNDS_US.last().copied());
    }

    #[test]
    fn rings_are_bounded_and_coarse_points_are_exact_minutes() {
        let mut h = History::default();
        let mut writes = 0;
        let mut now = 1_000_000;
        for _ in 0..(FINE_POINTS + 100) {
            writes += 500; // 100 writes/s over 5 s
            h.record(
                now,
                reading(0, writes, writes * 4096, 0),
                vec![("v1".into(), reading(0, writes, writes * 4096, 0))],
            );
            now += SAMPLE_SECONDS * 1000;
        }
        let fine = h.array(Step::Fine, 0);
        assert_eq!(fine.len(), FINE_POINTS);
        assert!(fine.iter().all(|p| (p.write_iops - 100.0).abs() < 1e-9));
        assert!(fine.windows(2).all(|w| w[0].time_ms < w[1].time_ms));
        let coarse = h.array(Step::Coarse, 0);
        // (FINE_POINTS + 100 - 1) intervals of 5 s, one coarse point per 12 of them.
        assert_eq!(coarse.len(), (FINE_POINTS + 99) / 12);
        assert!(coarse
            .iter()
            .all(|p| p.seconds == 60.0 && (p.write_iops - 100.0).abs() < 1e-9));
        assert_eq!(h.volume("v1", Step::Fine, 0).unwrap().len(), VOLUME_POINTS);
        // `since` returns only newer points.
        let last = fine.last().unwrap().time_ms;
        assert!(h.array(Step::Fine, last).is_empty());
        assert_eq!(h.array(Step::Fine, last - 1).len(), 1);
        // A volume that disappears loses its history; the clock going back adds nothing.
        h.record(now, reading(0, writes, writes * 4096, 0), vec![]);
        assert!(h.volume("v1", Step::Fine, 0).is_none());
        h.record(now - 1, reading(0, writes, writes * 4096, 0), vec![]);
        assert_eq!(h.array(Step::Fine, 0).len(), FINE_POINTS);
        assert_eq!(Step::from_seconds(5), Some(Step::Fine));
        assert_eq!(Step::from_seconds(7), None);
    }

    #[test]
    fn sums_cover_every_counter() {
        let mut total = BTreeMap::new();
        let s = ClassStats {
            commands: 2,
            errors: 1,
            bytes: 3,
            latency_sum_us: 4,
            latency_buckets: vec![1, 2],
        };
        add_classes(&mut total, &[(CommandClass::Write, s.clone())]);
        add_classes(&mut total, &[(CommandClass::Write, s)]);
        let w = &total["write"];
        assert_eq!(
            (w.commands, w.errors, w.bytes, w.latency_sum_us),
            (4, 2, 6, 8)
        );
        assert_eq!(w.latency_buckets, [2, 4]);
        let mut v = VaaiCounters::default();
        let one = VaaiCounters {
            ats: 1,
            ats_failed: 1,
            clone_read: 1,
            clone_write: 1,
            clone_failed: 1,
            zero: 1,
            zero_failed: 1,
            delete: 1,
            delete_failed: 1,
            deleted_bytes: 1,
            cloned_bytes: 1,
            zeroed_bytes: 1,
        };
        v.add(&one);
        v.add(&one);
        assert_eq!(serde_json::to_value(&v).unwrap(), {
            let mut all = serde_json::to_value(&one).unwrap();
            for (_, x) in all.as_object_mut().unwrap() {
                *x = 2.into();
            }
            all
        });
    }
}
