//! Per-LU statistics: commands, bytes, errors and latency by command class, and the VAAI
//! counters named after esxtop's VAAI columns. Relaxed atomics: a few adds per command, no
//! locks; a snapshot is not a consistent cut across counters, which rates do not need.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

// A snapshot's counters are the API's own types, so what the API sends is what the LU counted.
pub use sliver_api_types::{ClassStats, VaaiCounters};

/// Command classes, like esxtop's disk columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandClass {
    Read,
    Write,
    CompareAndWrite,
    WriteSame,
    Unmap,
    ExtendedCopy,
    Other,
}

impl CommandClass {
    pub const ALL: [CommandClass; 7] = [
        CommandClass::Read,
        CommandClass::Write,
        CommandClass::CompareAndWrite,
        CommandClass::WriteSame,
        CommandClass::Unmap,
        CommandClass::ExtendedCopy,
        CommandClass::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CommandClass::Read => "read",
            CommandClass::Write => "write",
            CommandClass::CompareAndWrite => "compare_and_write",
            CommandClass::WriteSame => "write_same",
            CommandClass::Unmap => "unmap",
            CommandClass::ExtendedCopy => "extended_copy",
            CommandClass::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Latency histogram upper bounds in microseconds; one more bucket holds everything above.
pub const LATENCY_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000,
];

const BUCKETS: usize = 15;
const _: () = assert!(LATENCY_BOUNDS_US.len() + 1 == BUCKETS);

/// The bucket a latency falls in: the first bound it does not exceed.
pub fn latency_bucket(us: u64) -> usize {
    LATENCY_BOUNDS_US.partition_point(|&bound| bound < us)
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatsSnapshot {
    /// One entry per [`CommandClass::ALL`], in that order.
    pub classes: Vec<(CommandClass, ClassStats)>,
    pub vaai: VaaiCounters,
}

impl StatsSnapshot {
    pub fn class(&self, c: CommandClass) -> &ClassStats {
        &self.classes[c.index()].1
    }
}

#[derive(Default)]
struct ClassCounters {
    commands: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency_sum_us: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// Lock-free counters updated on every command.
#[derive(Default)]
pub struct LuStats {
    classes: [ClassCounters; 7],
    pub(crate) ats: AtomicU64,
    pub(crate) ats_failed: AtomicU64,
    pub(crate) clone_read: AtomicU64,
    pub(crate) clone_write: AtomicU64,
    pub(crate) clone_failed: AtomicU64,
    pub(crate) zero: AtomicU64,
    pub(crate) zero_failed: AtomicU64,
    pub(crate) delete: AtomicU64,
    pub(crate) delete_failed: AtomicU64,
    pub(crate) deleted_bytes: AtomicU64,
    pub(crate) cloned_bytes: AtomicU64,
    pub(crate) zeroed_bytes: AtomicU64,
}

impl LuStats {
    /// Account one completed command.
    pub(crate) fn record(&self, class: CommandClass, ok: bool, bytes: u64, latency_us: u64) {
        let c = &self.classes[class.index()];
        c.commands.fetch_add(1, Relaxed);
        if !ok {
            c.errors.fetch_add(1, Relaxed);
        }
        c.bytes.fetch_add(bytes, Relaxed);
        c.latency_sum_us.fetch_add(latency_us, Relaxed);
        c.buckets[latency_bucket(latency_us)].fetch_add(1, Relaxed);
        let (done, failed) = match class {
            CommandClass::CompareAndWrite => (&self.ats, &self.ats_failed),
            CommandClass::WriteSame => (&self.zero, &self.zero_failed),
            CommandClass::Unmap => (&self.delete, &self.delete_failed),
            CommandClass::ExtendedCopy if !ok => {
                self.clone_failed.fetch_add(1, Relaxed);
                return;
            }
            _ => return,
        };
        if ok {
            done.fetch_add(1, Relaxed);
            match class {
                CommandClass::WriteSame => self.zeroed_bytes.fetch_add(bytes, Relaxed),
                CommandClass::Unmap => self.deleted_bytes.fetch_add(bytes, Relaxed),
                _ => 0,
            };
        } else {
            failed.fetch_add(1, Relaxed);
        }
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Relaxed);
        StatsSnapshot {
            classes: CommandClass::ALL
                .iter()
                .map(|&class| {
                    let c = &self.classes[class.index()];
                    (
                        class,
                        ClassStats {
                            commands: get(&c.commands),
                            errors: get(&c.errors),
                            bytes: get(&c.bytes),
                            latency_sum_us: get(&c.latency_sum_us),
                            latency_buckets: c.buckets.iter().map(get).collect(),
                        },
                    )
                })
                .collect(),
            vaai: VaaiCounters {
                ats: get(&self.ats),
                ats_failed: get(&self.ats_failed),
                clone_read: get(&self.clone_read),
                clone_write: get(&self.clone_write),
                clone_failed: get(&self.clone_failed),
                zero: get(&self.zero),
                zero_failed: get(&self.zero_failed),
                delete: get(&self.delete),
                delete_failed: get(&self.delete_failed),
                deleted_bytes: get(&self.deleted_bytes),
                cloned_bytes: get(&self.cloned_bytes),
                zeroed_bytes: get(&self.zeroed_bytes),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_boundaries_are_inclusive_upper_bounds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(50), 0);
        assert_eq!(latency_bucket(51), 1);
        assert_eq!(latency_bucket(1_000), 4);
        assert_eq!(latency_bucket(5_000_000), LATENCY_BOUNDS_US.len() - 1);
        assert_eq!(latency_bucket(5_000_001), LATENCY_BOUNDS_US.len());
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BOUNDS_US.len());
    }

    #[test]
    fn vaai_counters_follow_the_class_and_outcome() {
        let s = LuStats::default();
        s.record(CommandClass::CompareAndWrite, true, 512, 10);
        s.record(CommandClass::CompareAndWrite, false, 0, 10);
        s.record(CommandClass::Unmap, true, 4096, 10);
        s.record(CommandClass::WriteSame, true, 8192, 10);
        s.record(CommandClass::ExtendedCopy, false, 0, 10);
        let snap = s.snapshot();
        assert_eq!((snap.vaai.ats, snap.vaai.ats_failed), (1, 1));
        assert_eq!((snap.vaai.delete, snap.vaai.deleted_bytes), (1, 4096));
        assert_eq!((snap.vaai.zero, snap.vaai.zeroed_bytes), (1, 8192));
        assert_eq!(snap.vaai.clone_failed, 1);
        let caw = snap.class(CommandClass::CompareAndWrite);
        assert_eq!((caw.commands, caw.errors, caw.bytes), (2, 1, 512));
        assert_eq!(caw.latency_buckets.iter().sum::<u64>(), 2);
    }
}
