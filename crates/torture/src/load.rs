//! Load: many sessions of mixed, verified I/O against a live `sliver serve` for a fixed time.
//!
//! Each session is its own TCP connection and login, owns one stripe of one LUN, and keeps the
//! version of every block of its stripe, so every READ is checked against what that session
//! last wrote there. The mix: 4–64 KiB writes (some FUA), 4–64 KiB reads, UNMAP, WRITE SAME
//! (UNMAP bit and pattern), COMPARE AND WRITE (comparing with the known content) and
//! SYNCHRONIZE CACHE, at a fixed queue depth per session. After the timed phase every session
//! reads its whole stripe back; then the server is stopped with SIGTERM (it must exit cleanly)
//! and `sliver check` must find the array consistent.
//!
//! Reported: commands per kind, errors (any status but GOOD, any transport failure),
//! mismatches, IOPS and throughput, latency percentiles (per command, submit to completion),
//! and the server's memory (VmRSS sampled, VmHWM), threads and open files.

use crate::server::{self, ServerProcess};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sliver_initiator::sense::status;
use sliver_initiator::{cdb, Completion, Error, OutgoingCommand, Session, SessionOptions};
use sliver_server::array::{ArrayOptions, ANY_HOST};
use sliver_server::Array;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Target name of the arrays the load run creates.
pub const TARGET: &str = "iqn.2026-11.dev.sliver:load";
const BLOCK: usize = 512;
/// Failures one session lists at most (the rest are counted).
const MAX_SESSION_FAILURES: usize = 10;
/// Failures the report lists at most.
const MAX_REPORTED_FAILURES: usize = 100;

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The `sliver` binary.
    pub sliver: PathBuf,
    /// Concurrent sessions (one TCP connection and login each).
    pub sessions: usize,
    /// Engine volumes (LUNs); sessions are spread over them round robin.
    pub volumes: usize,
    pub volume_bytes: u64,
    /// Bytes of its LUN each session owns (its stripe); less when the volume is too small.
    pub session_bytes: u64,
    /// Length of the timed I/O phase.
    pub duration: Duration,
    /// Commands each session keeps in flight.
    pub queue_depth: usize,
    pub seed: u64,
    /// Where the array lives; `None`: a temporary directory, removed unless a failure is
    /// found. Must be empty or absent.
    pub data_dir: Option<PathBuf>,
    /// Engine log capacity (sparse).
    pub capacity_bytes: u64,
    /// How often the server's memory is sampled.
    pub sample_interval: Duration,
    /// Progress lines on stderr.
    pub verbose: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            sliver: server::default_sliver(),
            sessions: 64,
            volumes: 4,
            volume_bytes: 2 << 30,
            session_bytes: 4 << 20,
            duration: Duration::from_secs(60),
            queue_depth: 4,
            seed: 1,
            data_dir: None,
            capacity_bytes: 8 << 30,
            sample_interval: Duration::from_millis(100),
            verbose: false,
        }
    }
}

/// The kinds of command in the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Write,
    WriteFua,
    Read,
    Unmap,
    WriteSameUnmap,
    WriteSamePattern,
    CompareAndWrite,
    SynchronizeCache,
}

impl Kind {
    const MIX: [(Kind, u32); 8] = [
        (Kind::Write, 38),
        (Kind::WriteFua, 5),
        (Kind::Read, 35),
        (Kind::Unmap, 6),
        (Kind::WriteSameUnmap, 3),
        (Kind::WriteSamePattern, 4),
        (Kind::CompareAndWrite, 7),
        (Kind::SynchronizeCache, 2),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Write => "write",
            Kind::WriteFua => "write_fua",
            Kind::Read => "read",
            Kind::Unmap => "unmap",
            Kind::WriteSameUnmap => "write_same_unmap",
            Kind::WriteSamePattern => "write_same_pattern",
            Kind::CompareAndWrite => "compare_and_write",
            Kind::SynchronizeCache => "synchronize_cache",
        }
    }

    fn class(self) -> Class {
        match self {
            Kind::Read => Class::Read,
            Kind::Write
            | Kind::WriteFua
            | Kind::WriteSamePattern
            | Kind::WriteSameUnmap
            | Kind::CompareAndWrite => Class::Write,
            Kind::Unmap | Kind::SynchronizeCache => Class::Other,
        }
    }
}

#[derive(Clone, Copy)]
enum Class {
    Read,
    Write,
    Other,
}

// ---------------------------------------------------------------- latency histogram

/// Sub-buckets per power of two: values are kept to within 1/32 (about 3%).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;

/// A log-linear histogram of microseconds: exact below 64 µs, then 32 buckets per power of
/// two. Bounded memory whatever the run length.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum: u128,
    max: u64,
}

fn bucket_of(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    ((u64::from(shift) + 1) * SUB + (v >> shift) - SUB) as usize
}

/// The largest value bucket `i` holds.
fn bucket_top(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let shift = i / SUB - 1;
    let top = i % SUB + SUB;
    ((top + 1) << shift) - 1
}

impl Histogram {
    pub fn record(&mut self, us: u64) {
        let b = bucket_of(us);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0);
        }
        self.buckets[b] += 1;
        self.count += 1;
        self.sum += u128::from(us);
        self.max = self.max.max(us);
    }

    pub fn merge(&mut self, other: &Histogram) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The value at quantile `q` (0..=1): the smallest bucket bound with at least
    /// `q * count` values at or below it (never above the maximum seen).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return bucket_top(i).min(self.max);
            }
        }
        self.max
    }

    fn summary(&self) -> Latency {
        Latency {
            count: self.count,
            mean_us: if self.count == 0 {
                0.0
            } else {
                self.sum as f64 / self.count as f64
            },
            p50_us: self.quantile(0.50),
            p99_us: self.quantile(0.99),
            p999_us: self.quantile(0.999),
            max_us: self.max,
        }
    }
}

/// Latency percentiles of one class of commands, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

// ---------------------------------------------------------------- block contents

const MAGIC: [u8; 8] = *b"SLVLOAD1";
/// Version flag: the block holds the WRITE SAME pattern of that version (the same bytes at
/// every LBA).
const SAME: u32 = 1 << 31;
/// The block's content is not known (a command on it failed).
const UNKNOWN: u32 = u32::MAX;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 512 bytes of `version` of block `lba` written by `session`; zeros for version 0.
/// Incompressible and unique per (session, LBA, version), so nothing deduplicates.
fn fill(out: &mut [u8], session: u32, lba: u64, version: u32) {
    debug_assert_eq!(out.len(), BLOCK);
    if version == 0 {
        out.fill(0);
        return;
    }
    let lba = if version & SAME != 0 { u64::MAX } else { lba };
    out[..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&session.to_be_bytes());
    out[12..16].copy_from_slice(&version.to_be_bytes());
    out[16..24].copy_from_slice(&lba.to_be_bytes());
    let mut state = (u64::from(session) << 32 | u64::from(version)) ^ lba.rotate_left(17);
    for word in out[24..].chunks_exact_mut(8) {
        word.copy_from_slice(&splitmix(&mut state).to_le_bytes());
    }
}

/// What a block that did not match holds, for the failure message.
fn describe(block: &[u8]) -> String {
    if block.iter().all(|&b| b == 0) {
        return "zeros".into();
    }
    if block.len() >= 24 && block[..8] == MAGIC {
        let n = |r: std::ops::Range<usize>| block[r].iter().fold(0u64, |a, &b| a << 8 | b as u64);
        let (session, version, lba) = (n(8..12), n(12..16), n(16..24));
        let mut expected = [0u8; BLOCK];
        fill(&mut expected, session as u32, lba, version as u32);
        let intact = if expected[..] == *block { "" } else { ", torn" };
        return format!("session {session} version {version:#x} of LBA {lba:#x}{intact}");
    }
    format!(
        "unrecognisable data ({:02x?}...)",
        &block[..16.min(block.len())]
    )
}

fn describe_version(session: u32, version: u32) -> String {
    match version {
        0 => "zeros".into(),
        v => format!("session {session} version {v:#x}"),
    }
}

// ---------------------------------------------------------------- one session

/// State shared by the sessions and the main thread.
struct Shared {
    ready: AtomicUsize,
    go: AtomicBool,
    /// Set by the main thread when the run must end early (setup failed).
    abort: AtomicBool,
    completed: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    deadline: Mutex<Option<Instant>>,
}

/// One session's assignment.
#[derive(Clone)]
struct SessionConfig {
    id: u32,
    url: String,
    lun: u64,
    stripe_start: u64,
    stripe_blocks: u64,
    queue_depth: usize,
    seed: u64,
}

/// What one session did.
#[derive(Clone, Debug, Default)]
struct SessionStats {
    completed: BTreeMap<Kind, u64>,
    /// UNIT ATTENTION answers by ASC/ASCQ: the command was not executed (hosts retry it).
    unit_attentions: BTreeMap<(u8, u8), u64>,
    errors: u64,
    mismatches: u64,
    failures: Vec<String>,
    failure_count: usize,
    read: Histogram,
    write: Histogram,
    other: Histogram,
    bytes_read: u64,
    bytes_written: u64,
    /// When the timed phase (with its drain) ended.
    timed_end: Option<Instant>,
    verified_blocks: u64,
    logged_in: bool,
}

struct Pending {
    kind: Kind,
    /// Stripe-relative first block and count.
    first: u64,
    blocks: u64,
    /// Written versions, applied when GOOD.
    new: Option<Vec<u32>>,
    /// What a READ must find (versions at submission; nothing else touches these blocks
    /// meanwhile).
    expect: Option<Vec<u32>>,
    /// Other busy ranges (a second UNMAP descriptor).
    also: Vec<(u64, u64)>,
    started: Instant,
    bytes: u64,
}

struct Worker {
    cfg: SessionConfig,
    shared: Arc<Shared>,
    rng: StdRng,
    versions: Vec<u32>,
    next_version: u32,
    stats: SessionStats,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

impl Worker {
    fn fail(&mut self, message: String) {
        self.stats.failure_count += 1;
        if self.stats.failures.len() < MAX_SESSION_FAILURES {
            self.stats
                .failures
                .push(format!("session {}: {message}", self.cfg.id));
        }
    }

    fn version(&mut self) -> u32 {
        let v = self.next_version;
        self.next_version = (self.next_version + 1) & !SAME;
        if self.next_version == 0 {
            self.next_version = 1;
        }
        v
    }

    /// A free range of `blocks` blocks in the stripe (4 KiB aligned when `aligned`).
    fn pick(&mut self, busy: &[(u64, u64)], blocks: u64, aligned: bool) -> Option<u64> {
        let span = self.cfg.stripe_blocks.checked_sub(blocks)?;
        for _ in 0..8 {
            let mut first = self.rng.gen_range(0..=span);
            if aligned {
                first &= !7;
            }
            if !busy.iter().any(|&r| overlaps(r, (first, blocks))) {
                return Some(first);
            }
        }
        None
    }

    fn kind(&mut self) -> Kind {
        let total: u32 = Kind::MIX.iter().map(|(_, w)| w).sum();
        let mut r = self.rng.gen_range(0..total);
        for (k, w) in Kind::MIX {
            if r < w {
                return k;
            }
            r -= w;
        }
        Kind::Read
    }

    fn content(&self, first: u64, versions: &[u32]) -> Vec<u8> {
        let mut data = vec![0u8; versions.len() * BLOCK];
        for (i, (v, out)) in versions
            .iter()
            .zip(data.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            fill(out, self.cfg.id, self.lba(first + i as u64), *v);
        }
        data
    }

    fn lba(&self, first: u64) -> u64 {
        self.cfg.stripe_start + first
    }

    /// The next command, or None when no free range was found.
    fn build(&mut self, busy: &[(u64, u64)]) -> Option<(OutgoingCommand, Pending)> {
        let kind = self.kind();
        let mut p = Pending {
            kind,
            first: 0,
            blocks: 0,
            new: None,
            expect: None,
            also: Vec::new(),
            started: Instant::now(),
            bytes: 0,
        };
        let lun = self.cfg.lun;
        let cmd = match kind {
            Kind::Write | Kind::WriteFua => {
                let blocks = 8 * self.rng.gen_range(1..=16u64);
                let aligned = self.rng.gen_bool(0.9);
                p.first = self.pick(busy, blocks, aligned)?;
                p.blocks = blocks;
                let v = self.version();
                let new = vec![v; blocks as usize];
                let data = self.content(p.first, &new);
                p.bytes = data.len() as u64;
                p.new = Some(new);
                cdb::write16(
                    self.lba(p.first),
                    data,
                    BLOCK as u32,
                    kind == Kind::WriteFua,
                )
                .ok()?
            }
            Kind::Read => {
                let blocks = 8 * self.rng.gen_range(1..=16u64);
                let aligned = self.rng.gen_bool(0.9);
                p.first = self.pick(busy, blocks, aligned)?;
                p.blocks = blocks;
                p.bytes = blocks * BLOCK as u64;
                p.expect =
                    Some(self.versions[p.first as usize..(p.first + blocks) as usize].to_vec());
                cdb::read16(self.lba(p.first), blocks as u32, BLOCK as u32).ok()?
            }
            Kind::Unmap => {
                let blocks = 8 * self.rng.gen_range(1..=8u64);
                p.first = self.pick(busy, blocks, true)?;
                p.blocks = blocks;
                p.new = Some(vec![0; blocks as usize]);
                let mut ranges = vec![(self.lba(p.first), blocks as u32)];
                if self.rng.gen_bool(0.3) {
                    let mut taken = busy.to_vec();
                    taken.push((p.first, blocks));
                    let more = 8 * self.rng.gen_range(1..=8u64);
                    if let Some(f) = self.pick(&taken, more, true) {
                        p.also.push((f, more));
                        ranges.push((self.lba(f), more as u32));
                    }
                }
                cdb::unmap(&ranges).ok()?
            }
            Kind::WriteSameUnmap => {
                let blocks = 8 * self.rng.gen_range(1..=32u64);
                p.first = self.pick(busy, blocks, true)?;
                p.blocks = blocks;
                p.new = Some(vec![0; blocks as usize]);
                cdb::write_same16(self.lba(p.first), blocks as u32, vec![0; BLOCK], true)
            }
            Kind::WriteSamePattern => {
                let blocks = self.rng.gen_range(1..=64u64);
                p.first = self.pick(busy, blocks, false)?;
                p.blocks = blocks;
                let v = self.version() | SAME;
                let mut pattern = vec![0u8; BLOCK];
                fill(&mut pattern, self.cfg.id, 0, v);
                p.new = Some(vec![v; blocks as usize]);
                p.bytes = BLOCK as u64;
                cdb::write_same16(self.lba(p.first), blocks as u32, pattern, false)
            }
            Kind::CompareAndWrite => {
                let blocks = self.rng.gen_range(1..=8u64);
                p.first = self.pick(busy, blocks, false)?;
                p.blocks = blocks;
                let old = self.versions[p.first as usize..(p.first + blocks) as usize].to_vec();
                if old.contains(&UNKNOWN) {
                    return None;
                }
                let v = self.version();
                let new = vec![v; blocks as usize];
                let mut data = self.content(p.first, &old);
                data.extend_from_slice(&self.content(p.first, &new));
                p.bytes = blocks * BLOCK as u64;
                p.new = Some(new);
                let mut c = vec![0u8; 16];
                c[0] = 0x89;
                c[2..10].copy_from_slice(&self.lba(p.first).to_be_bytes());
                c[13] = blocks as u8;
                OutgoingCommand::new(c).with_data_out(data)
            }
            Kind::SynchronizeCache => cdb::synchronize_cache16(0, 0),
        };
        Some((cmd.on_lun(lun), p))
    }

    fn set(&mut self, first: u64, versions: &[u32]) {
        self.versions[first as usize..first as usize + versions.len()].copy_from_slice(versions);
    }

    fn mark_unknown(&mut self, p: &Pending) {
        if p.new.is_some() {
            let unknown = vec![UNKNOWN; p.blocks as usize];
            self.set(p.first, &unknown);
            for &(f, n) in &p.also {
                self.set(f, &vec![UNKNOWN; n as usize]);
            }
        }
    }

    /// Checks READ data against the versions expected; returns the mismatching blocks.
    fn verify(&mut self, first: u64, expect: &[u32], data: &[u8], what: &str) -> u64 {
        if data.len() != expect.len() * BLOCK {
            self.fail(format!(
                "{what} returned {} bytes for {} blocks",
                data.len(),
                expect.len()
            ));
            return expect.len() as u64;
        }
        let mut bad = 0;
        let mut want = [0u8; BLOCK];
        for (i, (v, got)) in expect.iter().zip(data.chunks_exact(BLOCK)).enumerate() {
            if *v == UNKNOWN {
                continue;
            }
            let lba = self.lba(first + i as u64);
            fill(&mut want, self.cfg.id, lba, *v);
            if want[..] != *got {
                bad += 1;
                if bad == 1 {
                    let message = format!(
                        "{what}: LUN {} LBA {lba:#x} holds {} but the session last wrote {}",
                        self.cfg.lun,
                        describe(got),
                        describe_version(self.cfg.id, *v)
                    );
                    self.fail(message);
                }
            }
        }
        bad
    }

    fn complete(&mut self, c: Completion, p: Pending) {
        let us = p.started.elapsed().as_micros() as u64;
        match p.kind.class() {
            Class::Read => self.stats.read.record(us),
            Class::Write => self.stats.write.record(us),
            Class::Other => self.stats.other.record(us),
        }
        self.shared.completed.fetch_add(1, SeqCst);
        if c.is_good() {
            *self.stats.completed.entry(p.kind).or_default() += 1;
            if let Some(new) = &p.new {
                self.set(p.first, new);
                for &(f, n) in &p.also {
                    self.set(f, &vec![0; n as usize]);
                }
                self.stats.bytes_written += p.bytes;
            }
            if let Some(expect) = &p.expect {
                self.stats.bytes_read += p.bytes;
                let bad = self.verify(p.first, expect, &c.data, "READ");
                if bad > 0 {
                    self.stats.mismatches += bad;
                    self.shared.mismatches.fetch_add(bad, SeqCst);
                }
            }
            return;
        }
        if c.status == status::CHECK_CONDITION {
            if let Some(ua) = c
                .sense
                .as_ref()
                .filter(|s| s.key == sliver_initiator::SenseKey::UnitAttention)
            {
                // Not executed: the blocks hold what they held.
                *self
                    .stats
                    .unit_attentions
                    .entry((ua.asc, ua.ascq))
                    .or_default() += 1;
                return;
            }
        }
        self.stats.errors += 1;
        self.shared.errors.fetch_add(1, SeqCst);
        let sense = c
            .sense
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "no sense data".into());
        if p.kind == Kind::CompareAndWrite
            && c.sense.as_ref().map(|s| s.key) == Some(sliver_initiator::SenseKey::Miscompare)
        {
            self.stats.mismatches += 1;
            self.shared.mismatches.fetch_add(1, SeqCst);
        }
        self.fail(format!(
            "{} of LUN {} LBA {:#x} x{}: {} {sense}",
            p.kind.name(),
            self.cfg.lun,
            self.lba(p.first),
            p.blocks,
            status::name(c.status)
        ));
        self.mark_unknown(&p);
    }

    fn deadline(&self) -> Option<Instant> {
        *self.shared.deadline.lock().unwrap()
    }

    fn run(&mut self) {
        let options = SessionOptions {
            initiator_name: format!("iqn.2026-11.dev.sliver:load-{}", self.cfg.id),
            timeout: Duration::from_secs(30),
            ..SessionOptions::default()
        };
        let mut s = match Session::connect(&self.cfg.url, options) {
            Ok(s) => s,
            Err(e) => {
                self.fail(format!("login failed: {e}"));
                self.stats.errors += 1;
                self.shared.errors.fetch_add(1, SeqCst);
                self.shared.ready.fetch_add(1, SeqCst);
                return;
            }
        };
        self.stats.logged_in = true;
        // A new nexus hears of the power-on first.
        let mut ready = false;
        for _ in 0..4 {
            match s.execute(cdb::test_unit_ready().on_lun(self.cfg.lun)) {
                Ok(c) if c.is_good() => {
                    ready = true;
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    self.fail(format!("TEST UNIT READY: {e}"));
                    break;
                }
            }
        }
        self.shared.ready.fetch_add(1, SeqCst);
        if !ready {
            self.stats.errors += 1;
            self.shared.errors.fetch_add(1, SeqCst);
            self.fail("the LU never became ready".into());
            return;
        }
        while !self.shared.go.load(SeqCst) {
            if self.shared.abort.load(SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let Some(deadline) = self.deadline() else {
            return;
        };
        let mut pending: BTreeMap<u32, Pending> = BTreeMap::new();
        let mut broken = false;
        while Instant::now() < deadline && !self.shared.abort.load(SeqCst) {
            let mut misses = 0;
            while pending.len() < self.cfg.queue_depth && misses < 4 {
                let busy: Vec<(u64, u64)> = pending
                    .values()
                    .flat_map(|p| std::iter::once((p.first, p.blocks)).chain(p.also.clone()))
                    .collect();
                let Some((cmd, mut p)) = self.build(&busy) else {
                    misses += 1;
                    continue;
                };
                p.started = Instant::now();
                match s.submit(cmd) {
                    Ok(tag) => {
                        pending.insert(tag.0, p);
                    }
                    Err(e) => {
                        self.transport_failure(format!("submitting {}: {e}", p.kind.name()));
                        broken = true;
                        break;
                    }
                }
            }
            if broken {
                break;
            }
            if pending.is_empty() {
                continue;
            }
            if !self.collect(&mut s, &mut pending) {
                broken = true;
                break;
            }
        }
        // Drain what is in flight.
        while !broken && !pending.is_empty() {
            if !self.collect(&mut s, &mut pending) {
                broken = true;
            }
        }
        self.stats.timed_end = Some(Instant::now());
        if broken {
            return;
        }
        self.final_verify(&mut s);
        if let Err(e) = s.logout() {
            self.transport_failure(format!("logout: {e}"));
        }
    }

    /// Waits for one completion; false when the session is broken.
    fn collect(&mut self, s: &mut Session, pending: &mut BTreeMap<u32, Pending>) -> bool {
        match s.wait_any() {
            Ok(c) => match pending.remove(&c.tag.0) {
                Some(p) => {
                    self.complete(c, p);
                    true
                }
                None => {
                    self.transport_failure(format!("completion for unknown tag {:#x}", c.tag.0));
                    false
                }
            },
            Err(Error::Task { tag, failure }) => {
                let what = pending
                    .remove(&tag)
                    .map(|p| p.kind.name())
                    .unwrap_or("unknown command");
                self.transport_failure(format!("{what} failed at the transport: {failure:?}"));
                false
            }
            Err(e) => {
                self.transport_failure(format!("connection lost: {e}"));
                false
            }
        }
    }

    fn transport_failure(&mut self, message: String) {
        self.stats.errors += 1;
        self.shared.errors.fetch_add(1, SeqCst);
        self.fail(message);
    }

    /// Reads the whole stripe back and checks every block.
    fn final_verify(&mut self, s: &mut Session) {
        const PIECE: u64 = 128;
        let mut first = 0;
        while first < self.cfg.stripe_blocks {
            let n = PIECE.min(self.cfg.stripe_blocks - first);
            let cmd = match cdb::read16(self.lba(first), n as u32, BLOCK as u32) {
                Ok(c) => c.on_lun(self.cfg.lun),
                Err(e) => {
                    self.fail(format!("final READ: {e}"));
                    return;
                }
            };
            match s.execute(cmd) {
                Ok(c) if c.is_good() => {
                    let expect = self.versions[first as usize..(first + n) as usize].to_vec();
                    let bad = self.verify(first, &expect, &c.data, "final READ");
                    if bad > 0 {
                        self.stats.mismatches += bad;
                        self.shared.mismatches.fetch_add(bad, SeqCst);
                    }
                    self.stats.verified_blocks +=
                        expect.iter().filter(|&&v| v != UNKNOWN).count() as u64;
                }
                Ok(c) => {
                    self.stats.errors += 1;
                    self.shared.errors.fetch_add(1, SeqCst);
                    let message = format!(
                        "final READ of LBA {:#x}: {} {}",
                        self.lba(first),
                        status::name(c.status),
                        c.sense.map(|s| s.to_string()).unwrap_or_default()
                    );
                    self.fail(message);
                }
                Err(e) => {
                    self.transport_failure(format!("final READ: {e}"));
                    return;
                }
            }
            first += n;
        }
    }
}

fn session_main(cfg: SessionConfig, shared: Arc<Shared>) -> SessionStats {
    let blocks = cfg.stripe_blocks as usize;
    let mut w = Worker {
        rng: StdRng::seed_from_u64(cfg.seed),
        cfg,
        shared,
        versions: vec![0; blocks],
        next_version: 1,
        stats: SessionStats::default(),
    };
    w.run();
    w.stats
}

// ---------------------------------------------------------------- server process sampling

/// The server's memory, threads and open files over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerResources {
    /// VmRSS when the sessions were logged in, before I/O (MiB).
    pub rss_before_io_mib: f64,
    /// Largest VmRSS sampled (MiB).
    pub rss_max_sampled_mib: f64,
    /// VmRSS at the end of the timed phase (MiB).
    pub rss_end_mib: f64,
    /// VmHWM (the kernel's peak resident set) just before the server was stopped (MiB).
    pub peak_rss_mib: f64,
    /// VmRSS at each tenth of the timed phase (MiB).
    pub rss_timeline_mib: Vec<f64>,
    pub threads_max: u64,
    pub open_files_max: u64,
    /// The server's soft RLIMIT_NOFILE.
    pub max_open_files: Option<u64>,
    /// CPU time the server used in the timed phase (s).
    pub cpu_seconds: f64,
    pub samples: u64,
}

#[derive(Clone, Copy, Default)]
struct ProcSample {
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut s = ProcSample::default();
    for line in status.lines() {
        let value = |l: &str| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if line.starts_with("VmRSS:") {
            s.rss_kib = value(line);
        } else if line.starts_with("VmHWM:") {
            s.hwm_kib = value(line);
        } else if line.starts_with("Threads:") {
            s.threads = value(line);
        }
    }
    Some(s)
}

/// CPU time (user + system) a process has used, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

fn open_files(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

fn max_open_files(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn own_peak_rss_mib() -> f64 {
    proc_sample(std::process::id()).map_or(0.0, |s| s.hwm_kib as f64 / 1024.0)
}

struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(Instant, ProcSample, u64)>>,
}

impl Sampler {
    fn start(pid: u32, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(SeqCst) {
                if let Some(s) = proc_sample(pid) {
                    samples.push((Instant::now(), s, open_files(pid).unwrap_or(0)));
                }
                std::thread::sleep(every);
            }
            samples
        });
        Self { stop, handle }
    }

    fn finish(self) -> Vec<(Instant, ProcSample, u64)> {
        self.stop.store(true, SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

// ---------------------------------------------------------------- the report

/// What a load run found.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    pub seed: u64,
    pub sliver: String,
    pub data_dir: String,
    pub data_dir_kept: bool,
    pub sessions: usize,
    pub volumes: usize,
    pub queue_depth: usize,
    pub session_bytes: u64,
    /// Sessions that logged in.
    pub sessions_logged_in: usize,
    /// All logins, concurrently (s).
    pub login_seconds: f64,
    /// The timed phase, from the start to the last session's drain (s).
    pub io_seconds: f64,
    pub commands_completed: BTreeMap<String, u64>,
    pub commands: u64,
    /// UNIT ATTENTION answers after login ("ASC/ASCQ" -> count): not executed, not errors
    /// (the thin provisioning soft threshold, 38/07, on a pool filling with garbage).
    pub unit_attentions: BTreeMap<String, u64>,
    pub errors: u64,
    pub mismatches: u64,
    pub iops: f64,
    pub read_mib_per_s: f64,
    pub write_mib_per_s: f64,
    pub latency_all: Latency,
    pub latency_read: Latency,
    pub latency_write: Latency,
    pub latency_other: Latency,
    /// Commands completed by the least and the busiest session.
    pub session_commands_min: u64,
    pub session_commands_max: u64,
    /// Sessions that completed no command in the timed phase.
    pub idle_sessions: usize,
    /// Blocks read back and checked after the timed phase.
    pub blocks_verified: u64,
    pub server: ServerResources,
    /// The load generator's own VmHWM (MiB).
    pub loader_peak_rss_mib: f64,
    /// CPU time the load generator used in the timed phase (s).
    pub loader_cpu_seconds: f64,
    /// CPUs on this machine (server and load generator share them).
    pub cpus: usize,
    pub clean_exit: bool,
    pub check_ok: bool,
    pub failure_count: usize,
    pub failures: Vec<String>,
    /// Lines the server logged at ERROR level.
    pub server_errors: Vec<String>,
    pub total_seconds: f64,
}

impl LoadReport {
    pub fn passed(&self) -> bool {
        self.failure_count == 0
            && self.errors == 0
            && self.mismatches == 0
            && self.clean_exit
            && self.check_ok
            && self.server_errors.is_empty()
            && self.sessions_logged_in == self.sessions
    }

    pub fn summary(&self) -> String {
        let mut s = String::new();
        let lat = |name: &str, l: &Latency| {
            format!(
                "  {name:<6} {:>10} cmds  mean {:>8.0}  p50 {:>7}  p99 {:>7}  p99.9 {:>7}  max {:>8} us\n",
                l.count, l.mean_us, l.p50_us, l.p99_us, l.p999_us, l.max_us
            )
        };
        s.push_str(&format!(
            "sliver-load: {} sessions ({} logged in in {:.1} s) on {} volumes, queue depth {}, {} KiB per session, seed {}\n",
            self.sessions,
            self.sessions_logged_in,
            self.login_seconds,
            self.volumes,
            self.queue_depth,
            self.session_bytes >> 10,
            self.seed
        ));
        s.push_str(&format!(
            "timed phase {:.1} s: {} commands, {:.0} IOPS, read {:.1} MiB/s, write {:.1} MiB/s\n",
            self.io_seconds, self.commands, self.iops, self.read_mib_per_s, self.write_mib_per_s
        ));
        for (k, n) in &self.commands_completed {
            s.push_str(&format!("  {k:<20} {n:>10}\n"));
        }
        s.push_str(&format!(
            "per session: {} to {} commands, {} idle\n",
            self.session_commands_min, self.session_commands_max, self.idle_sessions
        ));
        s.push_str("latency (submit to completion):\n");
        s.push_str(&lat("all", &self.latency_all));
        s.push_str(&lat("read", &self.latency_read));
        s.push_str(&lat("write", &self.latency_write));
        s.push_str(&lat("other", &self.latency_other));
        let r = &self.server;
        s.push_str(&format!(
            "server memory: VmRSS {:.0} MiB logged in, {:.0} MiB at the end, {:.0} MiB max sampled ({} samples); VmHWM {:.0} MiB\n",
            r.rss_before_io_mib, r.rss_end_mib, r.rss_max_sampled_mib, r.samples, r.peak_rss_mib
        ));
        s.push_str(&format!(
            "  VmRSS by tenth of the run (MiB): {}\n",
            r.rss_timeline_mib
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        s.push_str(&format!(
            "  threads max {}, open files max {} (limit {}); load generator VmHWM {:.0} MiB\n",
            r.threads_max,
            r.open_files_max,
            r.max_open_files.map_or("unknown".into(), |v| v.to_string()),
            self.loader_peak_rss_mib
        ));
        s.push_str(&format!(
            "CPU in the timed phase: server {:.1} s, load generator {:.1} s ({} CPUs shared)\n",
            r.cpu_seconds, self.loader_cpu_seconds, self.cpus
        ));
        s.push_str(&format!(
            "blocks verified after the run: {}; clean exit: {}; sliver check: {}\n",
            self.blocks_verified,
            if self.clean_exit { "yes" } else { "NO" },
            if self.check_ok { "ok" } else { "FAILED" }
        ));
        if !self.unit_attentions.is_empty() {
            s.push_str(&format!(
                "unit attentions (not executed, not errors): {}\n",
                self.unit_attentions
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        s.push_str(&format!(
            "errors: {}, mismatches: {}, failures: {}\n",
            self.errors, self.mismatches, self.failure_count
        ));
        for f in &self.failures {
            s.push_str(&format!("  {f}\n"));
        }
        for l in &self.server_errors {
            s.push_str(&format!("  server: {l}\n"));
        }
        if self.data_dir_kept {
            s.push_str(&format!("data directory kept: {}\n", self.data_dir));
        }
        s
    }
}

// ---------------------------------------------------------------- the run

/// Raises our soft open-file limit to the hard one: every session is a socket.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

fn prepare(dir: &Path, opts: &LoadOptions) -> Result<(), String> {
    let options = ArrayOptions {
        capacity_bytes: Some(opts.capacity_bytes),
        ..ArrayOptions::default()
    };
    let array = Array::open_with(dir, TARGET, options)
        .map_err(|e| format!("cannot create the array in {}: {e}", dir.display()))?;
    for i in 0..opts.volumes {
        let name = format!("load{i}");
        array
            .create_volume(&name, opts.volume_bytes, BLOCK as u32)
            .map_err(|e| format!("cannot create volume {name}: {e}"))?;
        array
            .connect(&name, ANY_HOST, Some(i as u64))
            .map_err(|e| format!("cannot connect volume {name}: {e}"))?;
    }
    array.shutdown().map_err(|e| format!("array shutdown: {e}"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the load; `Err` only when the harness itself cannot run. Problems found in sliver are
/// in the report.
pub fn run(opts: &LoadOptions) -> Result<LoadReport, String> {
    let started = Instant::now();
    server::require_binary(&opts.sliver)?;
    let sessions = opts.sessions.max(1);
    let volumes = opts.volumes.clamp(1, 64);
    let per_volume = sessions.div_ceil(volumes) as u64;
    let volume_blocks = opts.volume_bytes / BLOCK as u64;
    let stripe_blocks = (opts.session_bytes / BLOCK as u64).min(volume_blocks / per_volume) & !7;
    if stripe_blocks < 256 {
        return Err(format!(
            "{} MiB volumes are too small for {per_volume} sessions each",
            opts.volume_bytes >> 20
        ));
    }
    raise_fd_limit();
    let (dir, temp) = server::data_dir(opts.data_dir.as_deref(), "sliver-load-")?;
    prepare(&dir, opts)?;
    let server = ServerProcess::start(&opts.sliver, &dir)?;
    let pid = server.pid();
    let max_files = max_open_files(pid);
    let sampler = Sampler::start(pid, opts.sample_interval);
    let log = |line: String| {
        if opts.verbose {
            eprintln!("{line}");
        }
    };

    let shared = Arc::new(Shared {
        ready: AtomicUsize::new(0),
        go: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        completed: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        mismatches: AtomicU64::new(0),
        deadline: Mutex::new(None),
    });
    let mut seeds = StdRng::seed_from_u64(opts.seed);
    let login_started = Instant::now();
    let mut handles = Vec::with_capacity(sessions);
    let mut spawn_failures = Vec::new();
    for i in 0..sessions {
        let lun = (i % volumes) as u64;
        let slot = (i / volumes) as u64;
        let cfg = SessionConfig {
            id: i as u32,
            url: server.url(TARGET, lun),
            lun,
            stripe_start: slot * stripe_blocks,
            stripe_blocks,
            queue_depth: opts.queue_depth.max(1),
            seed: seeds.gen(),
        };
        let for_session = shared.clone();
        match std::thread::Builder::new()
            .name(format!("load-{i}"))
            .stack_size(512 << 10)
            .spawn(move || session_main(cfg, for_session))
        {
            Ok(h) => handles.push(h),
            Err(e) => {
                spawn_failures.push(format!("cannot start session thread {i}: {e}"));
                shared.ready.fetch_add(1, SeqCst);
            }
        }
    }
    let ready_by = Instant::now() + Duration::from_secs(120);
    while shared.ready.load(SeqCst) < sessions && Instant::now() < ready_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    let login_seconds = login_started.elapsed().as_secs_f64();
    let mut failures = spawn_failures;
    if shared.ready.load(SeqCst) < sessions {
        failures.push(format!(
            "only {} of {sessions} sessions logged in within 120 s",
            shared.ready.load(SeqCst)
        ));
    }
    let before_io = proc_sample(pid).unwrap_or_default();
    log(format!(
        "sliver-load: {} sessions ready in {login_seconds:.1} s; server VmRSS {:.0} MiB; I/O for {:?}",
        shared.ready.load(SeqCst),
        mib(before_io.rss_kib),
        opts.duration
    ));
    let cpu_before = (
        cpu_seconds(pid).unwrap_or(0.0),
        cpu_seconds(std::process::id()).unwrap_or(0.0),
    );
    let io_started = Instant::now();
    let deadline = io_started + opts.duration;
    *shared.deadline.lock().unwrap() = Some(deadline);
    shared.go.store(true, SeqCst);

    // Progress until the sessions finish (they stop by themselves at the deadline).
    let mut last = (Instant::now(), 0u64);
    let mut next_report = Instant::now() + Duration::from_secs(5);
    let hard_stop = deadline + Duration::from_secs(120);
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        if now >= next_report {
            let done = shared.completed.load(SeqCst);
            let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
            let p = proc_sample(pid).unwrap_or_default();
            log(format!(
                "  {:>5.1} s: {done} commands, {rate:.0} IOPS, {} errors, {} mismatches; server VmRSS {:.0} MiB, {} threads",
                now.duration_since(io_started).as_secs_f64(),
                shared.errors.load(SeqCst),
                shared.mismatches.load(SeqCst),
                mib(p.rss_kib),
                p.threads
            ));
            last = (now, done);
            next_report = now + Duration::from_secs(5);
        }
        if now > hard_stop && !shared.abort.load(SeqCst) {
            failures.push("sessions still running 120 s after the deadline".into());
            shared.abort.store(true, SeqCst);
        }
    }
    let mut stats = Vec::with_capacity(handles.len());
    for h in handles {
        match h.join() {
            Ok(s) => stats.push(s),
            Err(_) => failures.push("a session thread panicked".into()),
        }
    }
    let end_sample = proc_sample(pid).unwrap_or_default();
    let cpu_after = (
        cpu_seconds(pid).unwrap_or(0.0),
        cpu_seconds(std::process::id()).unwrap_or(0.0),
    );
    let samples = sampler.finish();

    // Stop the server cleanly, then check the array offline.
    let errors_log = server.error_lines();
    let tail = server.tail();
    let clean_exit = match server.terminate(Duration::from_secs(60)) {
        Ok(status) if status.success() => true,
        Ok(status) => {
            failures.push(format!(
                "sliver serve exited with {status} after SIGTERM:\n{tail}"
            ));
            false
        }
        Err(e) => {
            failures.push(e);
            false
        }
    };
    let server_errors = errors_log.get();
    let check_ok = match server::check(&opts.sliver, &dir) {
        Ok(_) => true,
        Err(e) => {
            failures.push(e);
            false
        }
    };

    // Figures.
    let io_end = stats
        .iter()
        .filter_map(|s| s.timed_end)
        .max()
        .unwrap_or(deadline);
    let io_seconds = io_end.duration_since(io_started).as_secs_f64().max(1e-9);
    let mut completed: BTreeMap<String, u64> = BTreeMap::new();
    let mut unit_attentions: BTreeMap<String, u64> = BTreeMap::new();
    let (mut read, mut write, mut other) = (
        Histogram::default(),
        Histogram::default(),
        Histogram::default(),
    );
    let (mut errors, mut mismatches, mut bytes_read, mut bytes_written, mut verified) =
        (0, 0, 0, 0, 0);
    let mut per_session = Vec::new();
    let mut failure_count = failures.len();
    for s in &stats {
        for (k, n) in &s.completed {
            *completed.entry(k.name().to_string()).or_default() += n;
        }
        for ((asc, ascq), n) in &s.unit_attentions {
            *unit_attentions
                .entry(format!("{asc:02x}/{ascq:02x}"))
                .or_default() += n;
        }
        read.merge(&s.read);
        write.merge(&s.write);
        other.merge(&s.other);
        errors += s.errors;
        mismatches += s.mismatches;
        bytes_read += s.bytes_read;
        bytes_written += s.bytes_written;
        verified += s.verified_blocks;
        per_session.push(s.completed.values().sum::<u64>());
        failure_count += s.failure_count;
        for f in &s.failures {
            if failures.len() < MAX_REPORTED_FAILURES {
                failures.push(f.clone());
            }
        }
    }
    let mut all = read.clone();
    all.merge(&write);
    all.merge(&other);
    let commands: u64 = completed.values().sum();
    let timeline = {
        let mut t = Vec::new();
        for tenth in 1..=10u32 {
            let at = io_started + opts.duration * tenth / 10;
            if let Some((_, s, _)) = samples.iter().rev().find(|(when, _, _)| *when <= at) {
                t.push(mib(s.rss_kib));
            }
        }
        t
    };
    let resources = ServerResources {
        rss_before_io_mib: mib(before_io.rss_kib),
        rss_max_sampled_mib: mib(samples.iter().map(|s| s.1.rss_kib).max().unwrap_or(0)),
        rss_end_mib: mib(end_sample.rss_kib),
        peak_rss_mib: mib(samples
            .iter()
            .map(|s| s.1.hwm_kib)
            .chain([end_sample.hwm_kib])
            .max()
            .unwrap_or(0)),
        rss_timeline_mib: timeline,
        threads_max: samples.iter().map(|s| s.1.threads).max().unwrap_or(0),
        open_files_max: samples.iter().map(|s| s.2).max().unwrap_or(0),
        max_open_files: max_files,
        cpu_seconds: cpu_after.0 - cpu_before.0,
        samples: samples.len() as u64,
    };
    let passed = failure_count == 0 && errors == 0 && mismatches == 0 && server_errors.is_empty();
    let data_dir_kept = server::keep_data_dir(temp, !passed);
    Ok(LoadReport {
        seed: opts.seed,
        sliver: opts.sliver.display().to_string(),
        data_dir: dir.display().to_string(),
        data_dir_kept,
        sessions,
        volumes,
        queue_depth: opts.queue_depth.max(1),
        session_bytes: stripe_blocks * BLOCK as u64,
        sessions_logged_in: stats.iter().filter(|s| s.logged_in).count(),
        login_seconds,
        io_seconds,
        commands_completed: completed,
        commands,
        unit_attentions,
        errors,
        mismatches,
        iops: commands as f64 / io_seconds,
        read_mib_per_s: bytes_read as f64 / io_seconds / (1 << 20) as f64,
        write_mib_per_s: bytes_written as f64 / io_seconds / (1 << 20) as f64,
        latency_all: all.summary(),
        latency_read: read.summary(),
        latency_write: write.summary(),
        latency_other: other.summary(),
        session_commands_min: per_session.iter().copied().min().unwrap_or(0),
        session_commands_max: per_session.iter().copied().max().unwrap_or(0),
        idle_sessions: per_session.iter().filter(|&&n| n == 0).count()
            + sessions.saturating_sub(per_session.len()),
        blocks_verified: verified,
        server: resources,
        loader_peak_rss_mib: own_peak_rss_mib(),
        loader_cpu_seconds: cpu_after.1 - cpu_before.1,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        clean_exit,
        check_ok,
        failure_count,
        failures,
        server_errors,
        total_seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_continuous_and_bound_their_values() {
        let mut prev = 0;
        for v in 0..200_000u64 {
            let b = bucket_of(v);
            assert!(b == prev || b == prev + 1, "bucket jumps at {v}");
            assert!(bucket_top(b) >= v, "{v} above its bucket's top");
            if b > 0 {
                assert!(bucket_top(b - 1) < v, "{v} fits the previous bucket");
            }
            prev = b;
        }
        // Within 1/32 above 64.
        for v in [100u64, 1_000, 65_537, 10_000_000] {
            let top = bucket_top(bucket_of(v));
            assert!((top - v) * 32 <= v, "{v} -> {top}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.0), 1);
        let p50 = h.quantile(0.5);
        assert!((500..=515).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((990..=1000).contains(&p99), "{p99}");
        assert_eq!(h.quantile(1.0), 1000);
        let mut other = Histogram::default();
        other.record(5_000_000);
        h.merge(&other);
        assert_eq!(h.count(), 1001);
        assert_eq!(h.quantile(1.0), 5_000_000);
        assert!(h.quantile(0.5) < 600);
        assert_eq!(Histogram::default().quantile(0.99), 0);
    }

    #[test]
    fn block_contents_identify_their_writer() {
        let mut a = [0u8; BLOCK];
        let mut b = [0u8; BLOCK];
        fill(&mut a, 3, 100, 7);
        fill(&mut b, 3, 101, 7);
        assert_ne!(a, b, "the LBA is part of the content");
        fill(&mut b, 4, 100, 7);
        assert_ne!(a, b, "the session is part of the content");
        assert_eq!(describe(&a), "session 3 version 0x7 of LBA 0x64");
        a[300] ^= 1;
        assert!(describe(&a).ends_with("torn"));
        // WRITE SAME patterns are the same at every LBA.
        fill(&mut a, 3, 100, 9 | SAME);
        fill(&mut b, 3, 5, 9 | SAME);
        assert_eq!(a, b);
        fill(&mut a, 3, 100, 0);
        assert_eq!(describe(&a), "zeros");
    }
}
