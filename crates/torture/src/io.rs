//! The I/O sessions of one cycle: each drives a random mix of commands at a random queue depth
//! over its own stripe of every LUN, keeping the shared [`Model`] up to date, until the server
//! is killed under it.
//!
//! Every session owns the LBA stripe `[stripe_start, stripe_start + stripe_len)` of every LUN
//! and never has two commands touching one block in flight at once, so the block's current
//! content is always known: COMPARE AND WRITE compares with it, EXTENDED COPY knows what it
//! copies, and READ checks it live.

use crate::model::{self, Model, Vid, BLOCK, ZEROS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_initiator::sense::status;
use sliver_initiator::{
    cdb, Completion, Error, OutgoingCommand, SenseKey, Session, SessionOptions,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Failures one session reports at most (the rest are counted).
const MAX_SESSION_FAILURES: usize = 20;

/// The kinds of command the harness issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Write,
    WriteFua,
    Read,
    SynchronizeCache,
    Unmap,
    WriteSameZero,
    WriteSameUnmap,
    WriteSamePattern,
    CompareAndWrite,
    ExtendedCopy,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Write,
        Kind::WriteFua,
        Kind::Read,
        Kind::SynchronizeCache,
        Kind::Unmap,
        Kind::WriteSameZero,
        Kind::WriteSameUnmap,
        Kind::WriteSamePattern,
        Kind::CompareAndWrite,
        Kind::ExtendedCopy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Write => "write",
            Kind::WriteFua => "write_fua",
            Kind::Read => "read",
            Kind::SynchronizeCache => "synchronize_cache",
            Kind::Unmap => "unmap",
            Kind::WriteSameZero => "write_same_zero",
            Kind::WriteSameUnmap => "write_same_unmap",
            Kind::WriteSamePattern => "write_same_pattern",
            Kind::CompareAndWrite => "compare_and_write",
            Kind::ExtendedCopy => "extended_copy",
        }
    }

    /// Relative frequency in the mix.
    fn weight(self) -> u32 {
        match self {
            Kind::Write => 26,
            Kind::WriteFua => 8,
            Kind::Read => 10,
            Kind::SynchronizeCache => 6,
            Kind::Unmap => 8,
            Kind::WriteSameZero => 4,
            Kind::WriteSameUnmap => 4,
            Kind::WriteSamePattern => 6,
            Kind::CompareAndWrite => 10,
            Kind::ExtendedCopy => 10,
        }
    }
}

/// A LUN the harness drives.
#[derive(Clone, Debug)]
pub struct Lun {
    pub lun: u64,
    pub volume: String,
    /// False for snapshots: read and copied from, never written.
    pub writable: bool,
    /// The LU's NAA designation descriptor (4-byte header and 16 bytes), from VPD page 83h.
    pub designator: Option<[u8; 20]>,
}

/// State shared by the sessions of one cycle and the main thread.
pub struct Shared {
    pub model: Mutex<Model>,
    /// Set just before the SIGKILL: connection losses after it are expected.
    pub killed: AtomicBool,
    /// Sessions logged in and ready.
    pub ready: AtomicUsize,
    /// Start issuing commands.
    pub go: AtomicBool,
    /// Stop (used when the cycle is abandoned).
    pub stop: AtomicBool,
    /// Commands submitted and not yet completed, over all sessions.
    pub inflight: AtomicUsize,
    pub next_op: AtomicU64,
    pub failures: Mutex<Vec<String>>,
}

impl Shared {
    pub fn new(model: Model) -> Self {
        Self {
            model: Mutex::new(model),
            killed: AtomicBool::new(false),
            ready: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            next_op: AtomicU64::new(1),
            failures: Mutex::new(Vec::new()),
        }
    }
}

/// One session's assignment.
#[derive(Clone)]
pub struct WorkerConfig {
    pub cycle: u32,
    pub session: usize,
    pub url: String,
    pub luns: Arc<Vec<Lun>>,
    pub stripe_start: u64,
    pub stripe_len: u64,
    /// MAXIMUM COMPARE AND WRITE LENGTH (VPD B0h).
    pub max_caw: u64,
    pub max_queue_depth: usize,
    pub seed: u64,
}

/// What one session did.
#[derive(Clone, Debug, Default)]
pub struct WorkerStats {
    pub issued: BTreeMap<Kind, u64>,
    pub completed: BTreeMap<Kind, u64>,
    /// UNIT ATTENTION / BUSY / TASK SET FULL: not executed, nothing changed.
    pub not_executed: u64,
}

impl WorkerStats {
    pub fn add(&mut self, other: &WorkerStats) {
        for (k, n) in &other.issued {
            *self.issued.entry(*k).or_default() += n;
        }
        for (k, n) in &other.completed {
            *self.completed.entry(*k).or_default() += n;
        }
        self.not_executed += other.not_executed;
    }
    pub fn total_issued(&self) -> u64 {
        self.issued.values().sum()
    }
}

/// (lun, lba, blocks)
type Range = (u64, u64, u64);

struct Pending {
    kind: Kind,
    token: u64,
    /// Ranges whose model entries this command staged.
    writes: Vec<Range>,
    /// Ranges reserved while it runs (writes and what it reads).
    busy: Vec<Range>,
    durable: bool,
    /// SYNCHRONIZE CACHE: its LUN.
    sync_lun: Option<u64>,
    /// READ: what the blocks hold now.
    read: Option<(u64, u64, Vec<Vid>)>,
    describe: String,
}

/// The COMPARE AND WRITE CDB (SBC-3 5.2).
pub fn compare_and_write(lba: u64, compare: &[Vid], new: &[Vid], fua: bool) -> OutgoingCommand {
    assert_eq!(compare.len(), new.len());
    let mut c = vec![0u8; 16];
    c[0] = 0x89;
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = new.len() as u8;
    let mut data = model::blocks_of(compare);
    data.extend_from_slice(&model::blocks_of(new));
    OutgoingCommand::new(c).with_data_out(data)
}

/// One block-to-block segment: (source CSCD index, destination CSCD index, blocks, source
/// LBA, destination LBA).
pub type Segment = (u16, u16, u16, u64, u64);

/// EXTENDED COPY (LID1) with identification CSCD descriptors naming LUs by their NAA
/// designation descriptors, and block-to-block segments. LIST ID USAGE 11b: nothing is kept
/// for RECEIVE COPY RESULTS, so concurrent copies never collide on a list identifier.
pub fn extended_copy(cscds: &[[u8; 20]], segments: &[Segment], block_size: u32) -> OutgoingCommand {
    let mut descriptors = Vec::new();
    for d in cscds {
        let mut c = [0u8; 32];
        c[0] = 0xe4; // identification descriptor
        c[4..24].copy_from_slice(d);
        c[4] &= 0x0f; // code set only: no protocol identifier
        c[29..32].copy_from_slice(&block_size.to_be_bytes()[1..]);
        descriptors.extend_from_slice(&c);
    }
    let cscd_len = descriptors.len();
    for &(src, dst, blocks, src_lba, dst_lba) in segments {
        let mut s = [0u8; 28];
        s[0] = 0x02; // block to block
        s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        s[4..6].copy_from_slice(&src.to_be_bytes());
        s[6..8].copy_from_slice(&dst.to_be_bytes());
        s[10..12].copy_from_slice(&blocks.to_be_bytes());
        s[12..20].copy_from_slice(&src_lba.to_be_bytes());
        s[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        descriptors.extend_from_slice(&s);
    }
    let mut p = vec![0u8; 16];
    p[1] = 0x3 << 3;
    p[2..4].copy_from_slice(&(cscd_len as u16).to_be_bytes());
    p[8..12].copy_from_slice(&((descriptors.len() - cscd_len) as u32).to_be_bytes());
    p.extend_from_slice(&descriptors);
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    OutgoingCommand::new(c).with_data_out(p)
}

/// The LU's NAA designation descriptor in a Device Identification VPD page.
pub fn naa_designator(page: &[u8]) -> Option<[u8; 20]> {
    let end = page
        .get(2..4)
        .map(|b| 4 + usize::from(u16::from_be_bytes([b[0], b[1]])))?
        .min(page.len());
    let mut at = 4;
    while at + 4 <= end {
        let len = usize::from(page[at + 3]);
        let association = (page[at + 1] >> 4) & 0x3;
        let kind = page[at + 1] & 0x0f;
        if association == 0 && kind == 0x3 && len == 16 && at + 20 <= end {
            return page[at..at + 20].try_into().ok();
        }
        at += 4 + len;
    }
    None
}

struct Worker {
    cfg: WorkerConfig,
    shared: Arc<Shared>,
    rng: StdRng,
    stats: WorkerStats,
    failures: usize,
}

fn lost(shared: &Shared) -> bool {
    shared.killed.load(SeqCst)
}

impl Worker {
    fn fail(&mut self, message: String) {
        self.failures += 1;
        if self.failures <= MAX_SESSION_FAILURES {
            self.shared
                .failures
                .lock()
                .unwrap()
                .push(format!("session {}: {message}", self.cfg.session));
        }
    }

    fn length(&mut self, max: u64) -> u64 {
        let r = self.rng.gen_range(0..100);
        let n = if r < 55 {
            self.rng.gen_range(1..=16)
        } else if r < 90 {
            self.rng.gen_range(17..=128)
        } else {
            self.rng.gen_range(129..=512)
        };
        n.min(max).min(self.cfg.stripe_len).max(1)
    }

    /// A free LBA for `blocks` blocks of `lun` in our stripe.
    fn pick(&mut self, busy: &[Range], lun: u64, blocks: u64) -> Option<u64> {
        let span = self.cfg.stripe_len.checked_sub(blocks)?;
        for _ in 0..8 {
            let mut off = self.rng.gen_range(0..=span);
            if self.rng.gen_bool(0.5) {
                off &= !7;
            }
            let lba = self.cfg.stripe_start + off;
            if !busy
                .iter()
                .any(|&(l, b, n)| l == lun && lba < b + n && b < lba + blocks)
            {
                return Some(lba);
            }
        }
        None
    }

    fn any_lun(&mut self, writable: bool) -> Option<Lun> {
        let luns: Vec<&Lun> = self
            .cfg
            .luns
            .iter()
            .filter(|l| l.writable || !writable)
            .collect();
        if luns.is_empty() {
            return None;
        }
        Some(luns[self.rng.gen_range(0..luns.len())].clone())
    }

    fn choose_kind(&mut self) -> Kind {
        let total: u32 = Kind::ALL.iter().map(|k| k.weight()).sum();
        let mut r = self.rng.gen_range(0..total);
        for k in Kind::ALL {
            if r < k.weight() {
                return k;
            }
            r -= k.weight();
        }
        Kind::Write
    }

    fn next_op(&self) -> u64 {
        self.shared.next_op.fetch_add(1, SeqCst)
    }

    /// Builds one command and stages it in the model; `None` when no free range was found.
    fn build(&mut self, busy: &[Range]) -> Option<(OutgoingCommand, Pending)> {
        let kind = self.choose_kind();
        let cycle = self.cfg.cycle;
        let shared = self.shared.clone();
        let mut pending = Pending {
            kind,
            token: 0,
            writes: Vec::new(),
            busy: Vec::new(),
            durable: false,
            sync_lun: None,
            read: None,
            describe: String::new(),
        };
        let cmd = match kind {
            Kind::Write | Kind::WriteFua => {
                let lun = self.any_lun(true)?;
                let n = self.length(512);
                let lba = self.pick(busy, lun.lun, n)?;
                let op = self.next_op();
                let vids: Vec<Vid> = (0..n as u32)
                    .map(|i| model::make_vid(cycle, op, i))
                    .collect();
                let fua = kind == Kind::WriteFua;
                let mut m = shared.model.lock().unwrap();
                pending.token = m.begin();
                m.stage(pending.token, lun.lun, lba, &vids);
                pending.writes.push((lun.lun, lba, n));
                pending.durable = fua;
                pending.describe = format!("WRITE(16) op {op} LUN {} LBA {lba} x{n}", lun.lun);
                cdb::write16(lba, model::blocks_of(&vids), BLOCK as u32, fua)
                    .ok()?
                    .on_lun(lun.lun)
            }
            Kind::Read => {
                let lun = self.any_lun(false)?;
                let n = self.length(256);
                let lba = self.pick(busy, lun.lun, n)?;
                let m = shared.model.lock().unwrap();
                let expect: Vec<Vid> = (lba..lba + n).map(|b| m.current(lun.lun, b)).collect();
                pending.read = Some((lun.lun, lba, expect));
                pending.busy.push((lun.lun, lba, n));
                pending.describe = format!("READ(16) LUN {} LBA {lba} x{n}", lun.lun);
                cdb::read16(lba, n as u32, BLOCK as u32)
                    .ok()?
                    .on_lun(lun.lun)
            }
            Kind::SynchronizeCache => {
                let lun = self.any_lun(false)?;
                pending.token = shared.model.lock().unwrap().flush_issued();
                pending.sync_lun = Some(lun.lun);
                pending.describe = format!("SYNCHRONIZE CACHE(16) LUN {}", lun.lun);
                cdb::synchronize_cache16(0, 0).on_lun(lun.lun)
            }
            Kind::Unmap => {
                let lun = self.any_lun(true)?;
                let count = self.rng.gen_range(1..=3);
                let mut ranges = Vec::new();
                let mut taken = busy.to_vec();
                for _ in 0..count {
                    let n = self.length(1024);
                    if let Some(lba) = self.pick(&taken, lun.lun, n) {
                        taken.push((lun.lun, lba, n));
                        ranges.push((lba, n));
                    }
                }
                if ranges.is_empty() {
                    return None;
                }
                let mut m = shared.model.lock().unwrap();
                pending.token = m.begin();
                for &(lba, n) in &ranges {
                    m.stage(pending.token, lun.lun, lba, &vec![ZEROS; n as usize]);
                    pending.writes.push((lun.lun, lba, n));
                }
                pending.describe = format!("UNMAP LUN {} {ranges:?}", lun.lun);
                let ranges: Vec<(u64, u32)> = ranges.iter().map(|&(l, n)| (l, n as u32)).collect();
                cdb::unmap(&ranges).ok()?.on_lun(lun.lun)
            }
            Kind::WriteSameZero | Kind::WriteSameUnmap | Kind::WriteSamePattern => {
                let lun = self.any_lun(true)?;
                let n = self.length(1024) * self.rng.gen_range(1..=2);
                let lba = self.pick(busy, lun.lun, n)?;
                let vid = if kind == Kind::WriteSamePattern {
                    model::make_vid(cycle, self.next_op(), 0)
                } else {
                    ZEROS
                };
                let mut m = shared.model.lock().unwrap();
                pending.token = m.begin();
                m.stage(pending.token, lun.lun, lba, &vec![vid; n as usize]);
                pending.writes.push((lun.lun, lba, n));
                pending.describe = format!(
                    "WRITE SAME(16) {} LUN {} LBA {lba} x{n}",
                    model::describe_vid(vid),
                    lun.lun
                );
                cdb::write_same16(
                    lba,
                    n as u32,
                    model::block_of(vid),
                    kind == Kind::WriteSameUnmap,
                )
                .on_lun(lun.lun)
            }
            Kind::CompareAndWrite => {
                let lun = self.any_lun(true)?;
                let max = self.cfg.max_caw.clamp(1, 8);
                let n = self.rng.gen_range(1..=max);
                let lba = self.pick(busy, lun.lun, n)?;
                let op = self.next_op();
                let fua = self.rng.gen_bool(0.25);
                let new: Vec<Vid> = (0..n as u32)
                    .map(|i| model::make_vid(cycle, op, i))
                    .collect();
                let mut m = shared.model.lock().unwrap();
                let compare: Vec<Vid> = (lba..lba + n).map(|b| m.current(lun.lun, b)).collect();
                pending.token = m.begin();
                m.stage(pending.token, lun.lun, lba, &new);
                pending.writes.push((lun.lun, lba, n));
                pending.durable = fua;
                pending.describe = format!(
                    "COMPARE AND WRITE op {op} LUN {} LBA {lba} x{n} expecting {}",
                    lun.lun,
                    compare
                        .iter()
                        .map(|v| model::describe_vid(*v))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                compare_and_write(lba, &compare, &new, fua).on_lun(lun.lun)
            }
            Kind::ExtendedCopy => {
                let src = self.any_lun(false)?;
                let dst = self.any_lun(true)?;
                let (Some(src_d), Some(dst_d)) = (src.designator, dst.designator) else {
                    return None;
                };
                let same = src.lun == dst.lun;
                let cscds: Vec<[u8; 20]> = if same {
                    vec![src_d]
                } else {
                    vec![src_d, dst_d]
                };
                let dst_index = u16::from(!same);
                let count = self.rng.gen_range(1..=2);
                let mut taken = busy.to_vec();
                let mut segments = Vec::new();
                for _ in 0..count {
                    let n = self.length(256);
                    let Some(s_lba) = self.pick(&taken, src.lun, n) else {
                        continue;
                    };
                    taken.push((src.lun, s_lba, n));
                    let Some(d_lba) = self.pick(&taken, dst.lun, n) else {
                        taken.pop();
                        continue;
                    };
                    taken.push((dst.lun, d_lba, n));
                    segments.push((0u16, dst_index, n as u16, s_lba, d_lba));
                    pending.busy.push((src.lun, s_lba, n));
                }
                if segments.is_empty() {
                    return None;
                }
                let mut m = shared.model.lock().unwrap();
                pending.token = m.begin();
                // Segments run in order: a later segment reading what an earlier one wrote
                // cannot happen (ranges never overlap), so the sources are the current data.
                for &(_, _, n, s_lba, d_lba) in &segments {
                    let n = u64::from(n);
                    let vids: Vec<Vid> =
                        (s_lba..s_lba + n).map(|b| m.current(src.lun, b)).collect();
                    m.stage(pending.token, dst.lun, d_lba, &vids);
                    pending.writes.push((dst.lun, d_lba, n));
                }
                pending.describe = format!(
                    "EXTENDED COPY LUN {} -> LUN {} {:?}",
                    src.lun,
                    dst.lun,
                    segments.iter().map(|s| (s.3, s.4, s.2)).collect::<Vec<_>>()
                );
                let on = if self.rng.gen_bool(0.5) {
                    src.lun
                } else {
                    dst.lun
                };
                extended_copy(&cscds, &segments, BLOCK as u32).on_lun(on)
            }
        };
        pending.busy.extend(pending.writes.iter().copied());
        Some((cmd, pending))
    }

    /// Applies a completion; false when the session should stop.
    fn complete(&mut self, c: Completion, p: Pending) -> bool {
        if c.is_good() {
            *self.stats.completed.entry(p.kind).or_default() += 1;
            {
                let mut m = self.shared.model.lock().unwrap();
                for &(lun, lba, n) in &p.writes {
                    m.complete(p.token, lun, lba, n, p.durable);
                }
                if let Some(lun) = p.sync_lun {
                    m.flush_completed(lun, p.token);
                }
            }
            if let Some((lun, lba, expect)) = &p.read {
                if c.data.len() != expect.len() * BLOCK {
                    self.fail(format!(
                        "{} returned {} bytes, expected {}",
                        p.describe,
                        c.data.len(),
                        expect.len() * BLOCK
                    ));
                    return true;
                }
                for (i, (block, want)) in c.data.chunks_exact(BLOCK).zip(expect).enumerate() {
                    let found = model::identify(block);
                    if found != Some(*want) {
                        self.fail(format!(
                            "live READ of LUN {lun} LBA {}: holds {} but the last completed write left {}",
                            lba + i as u64,
                            found.map_or("unrecognisable data".into(), model::describe_vid),
                            model::describe_vid(*want)
                        ));
                        break;
                    }
                }
            }
            return true;
        }
        let key = c.sense.as_ref().map(|s| s.key);
        let not_executed = matches!(c.status, status::BUSY | status::TASK_SET_FULL)
            || (c.status == status::CHECK_CONDITION && key == Some(SenseKey::UnitAttention));
        if not_executed {
            self.stats.not_executed += 1;
            let mut m = self.shared.model.lock().unwrap();
            for &(lun, lba, n) in &p.writes {
                m.abandon(p.token, lun, lba, n);
            }
            return true;
        }
        let sense = c
            .sense
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "no sense data".into());
        if p.kind == Kind::CompareAndWrite && key == Some(SenseKey::Miscompare) {
            self.fail(format!(
                "{} miscompared ({sense}, offset {:?}): the target does not hold what the last completed write left",
                p.describe,
                c.sense.as_ref().and_then(|s| s.information)
            ));
            let mut m = self.shared.model.lock().unwrap();
            for &(lun, lba, n) in &p.writes {
                m.abandon(p.token, lun, lba, n);
            }
            return false;
        }
        // Its blocks stay uncertain in the model; the verification after the crash settles
        // them.
        self.fail(format!(
            "{} failed: {} {sense}",
            p.describe,
            status::name(c.status)
        ));
        false
    }

    fn run(&mut self) {
        let options = SessionOptions {
            timeout: Duration::from_secs(15),
            ..SessionOptions::default()
        };
        let mut s = match Session::connect(&self.cfg.url, options) {
            Ok(s) => s,
            Err(e) => {
                self.fail(format!("login failed: {e}"));
                self.shared.ready.fetch_add(1, SeqCst);
                return;
            }
        };
        // A new nexus gets a UNIT ATTENTION per LU first.
        let luns = self.cfg.luns.clone();
        for lun in luns.iter() {
            for attempt in 1..=4 {
                match s.execute(cdb::test_unit_ready().on_lun(lun.lun)) {
                    Ok(c) if c.is_good() => break,
                    Ok(c) if attempt == 4 => {
                        self.fail(format!(
                            "TEST UNIT READY of LUN {} keeps failing: {}",
                            lun.lun,
                            status::name(c.status)
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.fail(format!("TEST UNIT READY of LUN {}: {e}", lun.lun));
                        self.shared.ready.fetch_add(1, SeqCst);
                        return;
                    }
                }
            }
        }
        self.shared.ready.fetch_add(1, SeqCst);
        while !self.shared.go.load(SeqCst) {
            if self.shared.stop.load(SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut pending: HashMap<u32, Pending> = HashMap::new();
        let mut depth = self.rng.gen_range(1..=self.cfg.max_queue_depth.max(1));
        let mut submitted = 0u64;
        'run: while !self.shared.stop.load(SeqCst) {
            let mut misses = 0;
            while pending.len() < depth && misses < 4 {
                let busy: Vec<Range> = pending.values().flat_map(|p| p.busy.clone()).collect();
                let Some((cmd, p)) = self.build(&busy) else {
                    misses += 1;
                    continue;
                };
                *self.stats.issued.entry(p.kind).or_default() += 1;
                match s.submit(cmd) {
                    Ok(tag) => {
                        self.shared.inflight.fetch_add(1, SeqCst);
                        pending.insert(tag.0, p);
                    }
                    Err(e) => {
                        if !lost(&self.shared) {
                            self.fail(format!("submitting {} failed: {e}", p.describe));
                        }
                        break 'run;
                    }
                }
                submitted += 1;
                if submitted.is_multiple_of(64) {
                    depth = self.rng.gen_range(1..=self.cfg.max_queue_depth.max(1));
                }
            }
            if pending.is_empty() {
                continue;
            }
            match s.wait_any() {
                Ok(c) => {
                    self.shared.inflight.fetch_sub(1, SeqCst);
                    let Some(p) = pending.remove(&c.tag.0) else {
                        self.fail(format!("completion for unknown tag {:#x}", c.tag.0));
                        break;
                    };
                    if !self.complete(c, p) {
                        break;
                    }
                }
                Err(Error::Task { tag, failure }) => {
                    self.shared.inflight.fetch_sub(1, SeqCst);
                    let p = pending.remove(&tag);
                    if !lost(&self.shared) {
                        self.fail(format!(
                            "{} failed at the transport: {failure:?}",
                            p.map(|p| p.describe).unwrap_or_default()
                        ));
                    }
                    break;
                }
                Err(e) => {
                    if !lost(&self.shared) {
                        self.fail(format!("connection lost before the kill: {e}"));
                    }
                    break;
                }
            }
        }
        self.shared.inflight.fetch_sub(pending.len(), SeqCst);
    }
}

/// Runs one I/O session until the connection dies (the kill) or `stop`.
pub fn worker(cfg: WorkerConfig, shared: Arc<Shared>) -> WorkerStats {
    let rng = StdRng::seed_from_u64(cfg.seed);
    let mut w = Worker {
        cfg,
        shared,
        rng,
        stats: WorkerStats::default(),
        failures: 0,
    };
    w.run();
    if w.failures > MAX_SESSION_FAILURES {
        let extra = w.failures - MAX_SESSION_FAILURES;
        w.shared.failures.lock().unwrap().push(format!(
            "session {}: {extra} more failure(s) not listed",
            w.cfg.session
        ));
    }
    w.stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_copy_parameter_list() {
        let mut d = [0u8; 20];
        d[0] = 0x51; // protocol identifier 5, code set 1
        d[1] = 0x03;
        d[3] = 16;
        d[4] = 0x6a;
        let c = extended_copy(&[d, d], &[(0, 1, 8, 100, 200)], 512);
        assert_eq!(c.cdb[0], 0x83);
        let p = &c.data_out;
        assert_eq!(
            u32::from_be_bytes(c.cdb[10..14].try_into().unwrap()) as usize,
            p.len()
        );
        assert_eq!(p.len(), 16 + 64 + 28);
        assert_eq!(p[1], 0x18);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 64);
        assert_eq!(u32::from_be_bytes(p[8..12].try_into().unwrap()), 28);
        assert_eq!(p[16], 0xe4);
        assert_eq!(p[20], 0x01, "protocol identifier cleared");
        assert_eq!(&p[45..48], &[0, 2, 0]);
        let s = &p[80..];
        assert_eq!((s[0], s[3], s[7], s[11]), (0x02, 0x18, 1, 8));
        assert_eq!(&s[12..20], &100u64.to_be_bytes());
        assert_eq!(&s[20..28], &200u64.to_be_bytes());
    }

    #[test]
    fn designator_is_found_in_vpd_83() {
        let mut page = vec![0, 0x83, 0, 0];
        page.extend_from_slice(&[0x53, 0x98, 0, 4, 1, 2, 3, 4]); // target port, SCSI name
        let mut naa = vec![0x01, 0x03, 0, 16];
        naa.extend(1..=16u8);
        page.extend_from_slice(&naa);
        let len = (page.len() - 4) as u16;
        page[2..4].copy_from_slice(&len.to_be_bytes());
        assert_eq!(naa_designator(&page).unwrap().to_vec(), naa);
        assert_eq!(naa_designator(&page[..10]), None);
    }
}
