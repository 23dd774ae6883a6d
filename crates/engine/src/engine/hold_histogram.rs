//! How long the metadata lock was held, as a histogram: the serial section's p50, p99 and
//! maximum are figures (RFC 0005, "Measured costs"), not only its total.
//!
//! Buckets are 8 to a power of two (each at most 12.5 % wider than the one below) from
//! 256 ns to about 1 s, then one for everything longer; a shorter hold counts in the first. Recording is two relaxed atomic adds, cheap beside the hold itself (a 4 KiB write
//! holds the lock for about 5 us).

use std::sync::atomic::{AtomicU64, Ordering};

/// Sub-buckets per power of two.
const SUB: u32 = 8;
/// The first power of two: 2^8 ns (shorter holds count in the first bucket).
const FIRST: u32 = 8;
/// Powers of two covered: up to 2^30 ns (about 1 s).
const OCTAVES: u32 = 22;
/// Buckets: the octaves' and one for longer holds.
const BUCKETS: usize = (SUB * OCTAVES) as usize + 1;

pub(super) struct HoldHistogram {
    counts: [AtomicU64; BUCKETS],
}

impl Default for HoldHistogram {
    fn default() -> Self {
        HoldHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The bucket of a hold of `ns` nanoseconds.
fn bucket(ns: u64) -> usize {
    let log = 63 - ns.max(1).leading_zeros();
    if log < FIRST {
        return 0;
    }
    let octave = log - FIRST;
    if octave >= OCTAVES {
        return BUCKETS - 1;
    }
    // Which of the SUB steps between 2^log and 2^(log+1): the three bits after the leading one.
    let step = (ns >> (log - 3)) & (SUB as u64 - 1);
    (octave * SUB) as usize + step as usize
}

/// The upper bound of bucket `i` in nanoseconds (`None` for the last, unbounded one).
fn upper_ns(i: usize) -> Option<f64> {
    if i == BUCKETS - 1 {
        return None;
    }
    let (octave, step) = (i as u32 / SUB, i as u32 % SUB);
    Some(2f64.powi((octave + FIRST) as i32) * (1.0 + (step + 1) as f64 / SUB as f64))
}

impl HoldHistogram {
    pub(super) fn record(&self, held: std::time::Duration) {
        let ns = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// Every bucket with its upper bound in seconds (`f64::INFINITY` for the last) and the
    /// holds counted in it and below (cumulative, as Prometheus histograms are).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut sum = 0;
        (0..BUCKETS)
            .map(|i| {
                sum += self.counts[i].load(Ordering::Relaxed);
                (upper_ns(i).map_or(f64::INFINITY, |ns| ns / 1e9), sum)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn buckets_rise_with_the_hold_and_bound_it() {
        let mut last = 0;
        for ns in [
            300,
            1_100,
            2_000,
            3_000,
            7_999,
            8_192,
            9_000,
            100_000,
            4_999_999,
            5_000_000,
            1 << 29,
            1_000_000_000,
        ] {
            let b = bucket(ns);
            assert!(b >= last, "{ns} ns in bucket {b} below {last}");
            last = b;
            let upper = upper_ns(b).unwrap();
            assert!(
                (ns as f64) < upper,
                "{ns} ns not below its bucket's bound {upper}"
            );
            if b > 0 {
                let lower = upper_ns(b - 1).unwrap();
                assert!(
                    ns as f64 >= lower,
                    "{ns} ns below the bucket under it, {lower}"
                );
                assert!(
                    upper / lower <= 1.125 + 1e-9,
                    "bucket {lower}..{upper} too wide"
                );
            }
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(250), 0);
        assert!(bucket(1_000) > 8, "a microsecond is above the first octave");
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket(1 << 31), BUCKETS - 1);
    }

    #[test]
    fn cumulative_counts_end_with_every_hold() {
        let h = HoldHistogram::default();
        for us in [3, 3, 40, 2_000_000] {
            h.record(Duration::from_micros(us));
        }
        let c = h.cumulative();
        assert_eq!(c.last(), Some(&(f64::INFINITY, 4)));
        let at = |s: f64| c.iter().find(|(le, _)| *le >= s).unwrap().1;
        assert_eq!(at(3.3e-6), 2);
        assert_eq!(at(2.7e-6), 0);
        assert_eq!(at(45e-6), 3);
        assert!(c.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    }
}
