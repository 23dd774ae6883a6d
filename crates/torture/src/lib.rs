//! Crash torture for sliver: run `sliver serve`, drive a random mix of SCSI commands from
//! several sessions while keeping a model of what every block may hold, SIGKILL the server
//! with commands in flight, restart it, and check every block ever written.
//!
//! A cycle is: I/O for a random time -> SIGKILL -> (every few cycles: `sliver check` on the
//! crashed array, then a snapshot or clone taken through the array library) -> restart
//! (recovery time) -> verify every touched block against the model and settle the model to
//! what was read. At the end the server is stopped cleanly, checked, started once more and
//! verified exactly. See [`model`] for the rules of what may survive a crash.

pub mod io;
pub mod load;
pub mod model;
pub mod server;
pub mod verify;

use io::{Kind, Lun, Shared, WorkerConfig, WorkerStats};
use model::Model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use server::ServerProcess;
use sliver_server::array::{ArrayOptions, ANY_HOST};
use sliver_server::Array;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Target name of the arrays the harness creates.
pub const TARGET: &str = "iqn.2026-11.dev.sliver:torture";
/// Failures kept in the report (the rest are counted).
const MAX_REPORTED_FAILURES: usize = 200;

/// What to run.
#[derive(Clone, Debug)]
pub struct TortureOptions {
    /// The `sliver` binary.
    pub sliver: PathBuf,
    /// Kill cycles to run.
    pub cycles: u32,
    /// Start no new cycle after this many seconds.
    pub max_seconds: f64,
    pub seed: u64,
    /// Where the array lives; `None`: a temporary directory, removed unless a failure is
    /// found. Must be empty or absent.
    pub data_dir: Option<PathBuf>,
    /// Concurrent I/O sessions.
    pub sessions: usize,
    /// Engine volumes created at the start (LUN 0..n).
    pub volumes: usize,
    pub volume_bytes: u64,
    /// Blocks of each LUN the sessions use (the working set), split in one stripe per
    /// session.
    pub working_blocks: u64,
    /// I/O time per cycle before the kill, random in this range (ms).
    pub io_ms: (u64, u64),
    pub max_queue_depth: usize,
    /// Run `sliver check` (and take a snapshot or clone) every this many cycles; 0: never
    /// (still at the end).
    pub check_every: u32,
    /// Take snapshots and clones.
    pub snapshots: bool,
    /// Snapshots and clones kept at once; the oldest is deleted beyond that.
    pub max_copies: usize,
    /// Print a line per cycle on stderr.
    pub verbose: bool,
}

impl Default for TortureOptions {
    fn default() -> Self {
        Self {
            sliver: server::default_sliver(),
            cycles: 20,
            max_seconds: 600.0,
            seed: 1,
            data_dir: None,
            sessions: 3,
            volumes: 3,
            volume_bytes: 256 << 20,
            working_blocks: 16 * 1024,
            io_ms: (50, 800),
            max_queue_depth: 8,
            check_every: 5,
            snapshots: true,
            max_copies: 2,
            verbose: false,
        }
    }
}

/// A problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// The cycle (0: preparation, cycles + 1: the final clean stop).
    pub cycle: u32,
    /// io, verify, check, server, shutdown, setup.
    pub phase: String,
    pub detail: String,
}

/// One kill cycle.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CycleReport {
    pub cycle: u32,
    /// I/O time before the kill.
    pub io_ms: u64,
    pub commands: u64,
    /// Commands in flight when the SIGKILL was sent.
    pub inflight_at_kill: usize,
    pub killed: bool,
    /// Blocks whose content was uncertain (unflushed or in flight) at the kill.
    pub uncertain_blocks: usize,
    /// `sliver check` on the crashed array, when run this cycle.
    pub check_ok: Option<bool>,
    /// Snapshot or clone taken after the kill.
    pub copy: Option<String>,
    /// Restart after the kill: spawn to accepting connections.
    pub recovery_ms: f64,
    /// The engine's recovery log line, if any.
    pub engine_recovered: Option<String>,
    /// Blocks read back and checked after the restart.
    pub blocks_verified: u64,
    /// Of those, blocks that could hold several versions, and how many read as the newest.
    pub uncertain_verified: u64,
    pub uncertain_newest: u64,
    pub failures: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Distribution {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub mean: f64,
}

impl Distribution {
    fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        Some(Self {
            min: v[0],
            median: v[v.len() / 2],
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }
}

/// What a run found.
#[derive(Clone, Debug, Serialize)]
pub struct TortureReport {
    pub seed: u64,
    pub sliver: String,
    pub data_dir: String,
    pub data_dir_kept: bool,
    pub cycles_requested: u32,
    pub cycles_run: u32,
    pub sessions: usize,
    pub commands_issued: BTreeMap<String, u64>,
    pub commands_completed: BTreeMap<String, u64>,
    /// UNIT ATTENTION / BUSY answers (not executed).
    pub commands_not_executed: u64,
    pub blocks_verified: u64,
    /// Verified blocks that could hold several versions (written but not flushed, or in
    /// flight, at the kill), and how many of them read back as the newest version.
    pub uncertain_verified: u64,
    pub uncertain_newest: u64,
    pub checks_run: u32,
    pub snapshots: u32,
    pub clones: u32,
    /// First start of the fresh array (ms).
    pub initial_start_ms: f64,
    /// Restarts after SIGKILL: spawn to accepting connections (ms).
    pub recovery_ms: Option<Distribution>,
    pub failure_count: usize,
    pub failures: Vec<Failure>,
    /// Lines the server logged at ERROR level (the first few; "poisoned" ones are failures).
    pub server_errors: Vec<String>,
    pub cycles: Vec<CycleReport>,
    pub total_seconds: f64,
}

impl TortureReport {
    pub fn passed(&self) -> bool {
        self.failure_count == 0
    }

    /// A human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let issued: u64 = self.commands_issued.values().sum();
        s.push_str(&format!(
            "sliver-torture: seed {}, {} of {} cycles in {:.1} s, {} sessions\n",
            self.seed, self.cycles_run, self.cycles_requested, self.total_seconds, self.sessions
        ));
        s.push_str(&format!("commands issued: {issued}\n"));
        for (k, n) in &self.commands_issued {
            let done = self.commands_completed.get(k).copied().unwrap_or(0);
            s.push_str(&format!("  {k:<20} {n:>9} issued {done:>9} completed\n"));
        }
        s.push_str(&format!(
            "  not executed (UA/BUSY): {}\n",
            self.commands_not_executed
        ));
        let inflight: usize = self.cycles.iter().map(|c| c.inflight_at_kill).sum();
        s.push_str(&format!(
            "kills: {} ({} commands in flight in total at the kills)\n",
            self.cycles.iter().filter(|c| c.killed).count(),
            inflight
        ));
        s.push_str(&format!(
            "blocks verified: {} ({} of them unflushed or in flight at a kill: {} read back new, {} old); sliver check runs: {}; snapshots: {}; clones: {}\n",
            self.blocks_verified,
            self.uncertain_verified,
            self.uncertain_newest,
            self.uncertain_verified - self.uncertain_newest,
            self.checks_run,
            self.snapshots,
            self.clones
        ));
        if let Some(r) = &self.recovery_ms {
            s.push_str(&format!(
                "recovery (spawn to accepting) ms: min {:.0} median {:.0} max {:.0} mean {:.0}; first start {:.0}\n",
                r.min, r.median, r.max, r.mean, self.initial_start_ms
            ));
        }
        if !self.server_errors.is_empty() {
            s.push_str("server ERROR log lines:\n");
            for l in &self.server_errors {
                s.push_str(&format!("  {l}\n"));
            }
        }
        s.push_str(&format!("failures: {}\n", self.failure_count));
        for f in &self.failures {
            s.push_str(&format!(
                "  cycle {} [{}]: {}\n",
                f.cycle, f.phase, f.detail
            ));
        }
        if self.data_dir_kept {
            s.push_str(&format!("data directory kept: {}\n", self.data_dir));
        }
        s
    }
}

struct Run {
    opts: TortureOptions,
    dir: PathBuf,
    luns: Vec<Lun>,
    model: Model,
    /// (source, copy) LUNs to compare at the next verification.
    pairs: Vec<(u64, u64)>,
    /// Snapshots and clones, oldest first: (volume, lun).
    copies: Vec<(String, u64)>,
    max_caw: u64,
    stats: WorkerStats,
    failures: Vec<Failure>,
    failure_count: usize,
    server_errors: Vec<String>,
    rng: StdRng,
    report_cycles: Vec<CycleReport>,
    recoveries: Vec<f64>,
    blocks_verified: u64,
    uncertain: (u64, u64),
    checks_run: u32,
    snapshots: u32,
    clones: u32,
}

impl Run {
    fn fail(&mut self, cycle: u32, phase: &str, detail: impl Into<String>) {
        self.failure_count += 1;
        if self.failures.len() < MAX_REPORTED_FAILURES {
            self.failures.push(Failure {
                cycle,
                phase: phase.into(),
                detail: detail.into(),
            });
        }
    }

    fn prepare(&mut self) -> Result<(), String> {
        let options = ArrayOptions {
            capacity_bytes: Some(8 << 30),
            ..ArrayOptions::default()
        };
        let array = Array::open_with(&self.dir, TARGET, options)
            .map_err(|e| format!("cannot create the array in {}: {e}", self.dir.display()))?;
        for i in 0..self.opts.volumes {
            let name = format!("t{i}");
            array
                .create_volume(&name, self.opts.volume_bytes, model::BLOCK as u32)
                .map_err(|e| format!("cannot create volume {name}: {e}"))?;
            let lun = array
                .connect(&name, ANY_HOST, Some(i as u64))
                .map_err(|e| format!("cannot connect volume {name}: {e}"))?;
            self.luns.push(Lun {
                lun,
                volume: name,
                writable: true,
                designator: None,
            });
            self.model.add_lun(lun);
        }
        array
            .shutdown()
            .map_err(|e| format!("array shutdown: {e}"))?;
        Ok(())
    }

    fn start(&mut self, cycle: u32) -> Option<ServerProcess> {
        match ServerProcess::start(&self.opts.sliver, &self.dir) {
            Ok(s) => Some(s),
            Err(e) => {
                self.fail(cycle, "server", e);
                None
            }
        }
    }

    /// Verifies through `server`; returns the blocks checked, and of those the uncertain ones
    /// and the uncertain ones that read as the newest version.
    fn verify(&mut self, cycle: u32, server: &ServerProcess) -> Option<(u64, u64, u64)> {
        let url = server.url(TARGET, self.luns.first().map_or(0, |l| l.lun));
        let pairs = std::mem::take(&mut self.pairs);
        match verify::verify(&url, &mut self.luns, &mut self.model, &pairs) {
            Ok(v) => {
                for f in v.failures {
                    self.fail(cycle, "verify", f);
                }
                if v.max_caw > 0 {
                    self.max_caw = v.max_caw;
                }
                for lun in &v.dropped {
                    self.fail(
                        cycle,
                        "verify",
                        format!(
                            "read-only LUN {lun} holds unrecognisable data: no longer verified"
                        ),
                    );
                    self.luns.retain(|l| l.lun != *lun);
                }
                self.blocks_verified += v.blocks;
                self.uncertain.0 += v.uncertain;
                self.uncertain.1 += v.uncertain_newest;
                Some((v.blocks, v.uncertain, v.uncertain_newest))
            }
            Err(e) => {
                self.fail(
                    cycle,
                    "verify",
                    format!("{e}\nserver log:\n{}", server.tail()),
                );
                None
            }
        }
    }

    /// I/O until a random moment, then SIGKILL.
    fn io_and_kill(&mut self, cycle: u32, server: ServerProcess, report: &mut CycleReport) {
        let model = std::mem::take(&mut self.model);
        let shared = Arc::new(Shared::new(model));
        let luns = Arc::new(self.luns.clone());
        let sessions = self.opts.sessions.max(1);
        let volume_blocks = self.opts.volume_bytes / model::BLOCK as u64;
        let stripe_len = (self.opts.working_blocks / sessions as u64).max(64) & !7;
        let spacing = (volume_blocks / sessions as u64) & !7;
        let mut handles = Vec::new();
        for s in 0..sessions {
            let cfg = WorkerConfig {
                cycle,
                session: s,
                url: server.url(TARGET, luns[0].lun),
                luns: luns.clone(),
                stripe_start: s as u64 * spacing,
                stripe_len: stripe_len.min(spacing),
                max_caw: self.max_caw,
                max_queue_depth: self.opts.max_queue_depth,
                seed: self.rng.gen(),
            };
            let shared = shared.clone();
            handles.push(std::thread::spawn(move || io::worker(cfg, shared)));
        }
        let ready_by = Instant::now() + Duration::from_secs(60);
        while shared.ready.load(SeqCst) < sessions && Instant::now() < ready_by {
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.go.store(true, SeqCst);
        let (lo, hi) = self.opts.io_ms;
        let io_ms = self.rng.gen_range(lo.min(hi)..=hi.max(lo));
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(io_ms));
        // Kill with commands in flight (wait a little for some if there are none now).
        let wait_until = Instant::now() + Duration::from_millis(500);
        while shared.inflight.load(SeqCst) == 0
            && Instant::now() < wait_until
            && handles.iter().any(|h| !h.is_finished())
        {
            std::thread::yield_now();
        }
        let mut server = server;
        let early_exit = server.exited();
        shared.killed.store(true, SeqCst);
        report.inflight_at_kill = shared.inflight.load(SeqCst);
        report.io_ms = started.elapsed().as_millis() as u64;
        if let Some(status) = early_exit {
            self.fail(
                cycle,
                "server",
                format!(
                    "the server exited by itself ({status}) during I/O:\n{}",
                    server.tail()
                ),
            );
        }
        let tail = server.tail();
        let errors = server.error_lines();
        if let Err(e) = server.kill() {
            self.fail(cycle, "server", e);
        }
        self.server_errors(cycle, errors.get());
        report.killed = early_exit.is_none();
        let mut stats = WorkerStats::default();
        for h in handles {
            match h.join() {
                Ok(s) => stats.add(&s),
                Err(_) => self.fail(cycle, "io", "an I/O session panicked"),
            }
        }
        report.commands = stats.total_issued();
        self.stats.add(&stats);
        let shared = Arc::into_inner(shared).expect("sessions joined");
        let failures = shared.failures.into_inner().unwrap();
        if !failures.is_empty() {
            self.fail(
                cycle,
                "io",
                format!(
                    "{} session failure(s); server log tail:\n{tail}",
                    failures.len()
                ),
            );
        }
        for f in failures {
            self.fail(cycle, "io", f);
        }
        self.model = shared.model.into_inner().unwrap();
        report.uncertain_blocks = self
            .model
            .luns()
            .iter()
            .map(|l| self.model.uncertain(*l))
            .sum();
    }

    /// SIGTERM: the server must exit cleanly.
    fn stop(&mut self, cycle: u32, server: ServerProcess) {
        let errors = server.error_lines();
        match server.terminate(Duration::from_secs(30)) {
            Ok(status) if status.success() => {}
            Ok(status) => self.fail(
                cycle,
                "shutdown",
                format!("sliver serve exited with {status} after SIGTERM"),
            ),
            Err(e) => self.fail(cycle, "shutdown", e),
        }
        self.server_errors(cycle, errors.get());
    }

    /// `sliver check` on the stopped array.
    fn check(&mut self, cycle: u32) -> bool {
        self.checks_run += 1;
        match server::check(&self.opts.sliver, &self.dir) {
            Ok(_) => true,
            Err(e) => {
                self.fail(cycle, "check", e);
                false
            }
        }
    }

    /// A snapshot or clone of a random writable volume, through the array library. The oldest
    /// copies beyond `max_copies` are deleted first, so the source is chosen among what is
    /// left (a deleted clone must not be the source).
    fn copy(&mut self, cycle: u32) -> Option<String> {
        let snapshot = self.rng.gen_bool(0.5);
        let name = format!("{}-c{cycle}", if snapshot { "snap" } else { "clone" });
        let pick = self.rng.gen::<u64>();
        let result = (|| -> Result<Option<(Lun, u64)>, String> {
            let array = Array::open(&self.dir, TARGET).map_err(|e| format!("open: {e}"))?;
            while self.copies.len() >= self.opts.max_copies.max(1) {
                let (old, lun) = self.copies.remove(0);
                array
                    .disconnect(&old, ANY_HOST)
                    .map_err(|e| format!("disconnect {old}: {e}"))?;
                array
                    .delete_volume(&old)
                    .map_err(|e| format!("delete {old}: {e}"))?;
                self.luns.retain(|l| l.lun != lun);
                self.model.remove_lun(lun);
            }
            let sources: Vec<&Lun> = self.luns.iter().filter(|l| l.writable).collect();
            if sources.is_empty() {
                array.shutdown().map_err(|e| format!("shutdown: {e}"))?;
                return Ok(None);
            }
            let source = sources[(pick % sources.len() as u64) as usize].clone();
            if snapshot {
                array.snapshot_volume(&source.volume, &name)
            } else {
                array.clone_volume(&source.volume, &name)
            }
            .map_err(|e| format!("{name} of {}: {e}", source.volume))?;
            let lun = array
                .connect(&name, ANY_HOST, None)
                .map_err(|e| format!("connect {name}: {e}"))?;
            array.shutdown().map_err(|e| format!("shutdown: {e}"))?;
            Ok(Some((source, lun)))
        })();
        match result {
            Ok(None) => None,
            Ok(Some((source, lun))) => {
                self.model.clone_lun(source.lun, lun);
                self.luns.push(Lun {
                    lun,
                    volume: name.clone(),
                    writable: !snapshot,
                    designator: None,
                });
                self.copies.push((name.clone(), lun));
                self.pairs.push((source.lun, lun));
                if snapshot {
                    self.snapshots += 1;
                } else {
                    self.clones += 1;
                }
                Some(format!("{name} of {} at LUN {lun}", source.volume))
            }
            Err(e) => {
                self.fail(cycle, "snapshot", e);
                None
            }
        }
    }

    /// Takes note of what a server that is gone logged at ERROR level.
    fn server_errors(&mut self, cycle: u32, lines: Vec<String>) {
        for line in lines {
            if line.contains("poisoned") {
                self.fail(cycle, "server", format!("server log: {line}"));
            }
            if self.server_errors.len() < 50 {
                self.server_errors.push(format!("cycle {cycle}: {line}"));
            }
        }
    }

    fn log(&self, line: String) {
        if self.opts.verbose {
            eprintln!("{line}");
        }
    }
}

/// Runs the torture; `Err` only when the harness itself cannot run (no binary, bad data
/// directory). Problems found in sliver are in the report's failures.
pub fn run(opts: &TortureOptions) -> Result<TortureReport, String> {
    let started = Instant::now();
    server::require_binary(&opts.sliver)?;
    let (dir, temp) = server::data_dir(opts.data_dir.as_deref(), "sliver-torture-")?;
    let mut r = Run {
        opts: opts.clone(),
        dir: dir.clone(),
        luns: Vec::new(),
        model: Model::new(),
        pairs: Vec::new(),
        copies: Vec::new(),
        max_caw: 1,
        stats: WorkerStats::default(),
        failures: Vec::new(),
        failure_count: 0,
        server_errors: Vec::new(),
        rng: StdRng::seed_from_u64(opts.seed),
        report_cycles: Vec::new(),
        recoveries: Vec::new(),
        blocks_verified: 0,
        uncertain: (0, 0),
        checks_run: 0,
        snapshots: 0,
        clones: 0,
    };
    r.prepare()?;
    let mut initial_start_ms = 0.0;
    let mut server = r.start(0);
    if let Some(s) = &server {
        initial_start_ms = s.ready_ms;
        r.verify(0, s);
    }
    let mut cycle = 0;
    while cycle < opts.cycles {
        let Some(s) = server.take() else { break };
        if started.elapsed().as_secs_f64() > opts.max_seconds {
            server = Some(s);
            break;
        }
        cycle += 1;
        let failures_before = r.failure_count;
        let mut report = CycleReport {
            cycle,
            ..CycleReport::default()
        };
        r.io_and_kill(cycle, s, &mut report);
        if opts.check_every > 0 && cycle.is_multiple_of(opts.check_every) {
            report.check_ok = Some(r.check(cycle));
            if opts.snapshots {
                report.copy = r.copy(cycle);
            }
        }
        server = r.start(cycle);
        if let Some(s) = &server {
            report.recovery_ms = s.ready_ms;
            r.recoveries.push(s.ready_ms);
            if let Some((blocks, uncertain, newest)) = r.verify(cycle, s) {
                report.blocks_verified = blocks;
                report.uncertain_verified = uncertain;
                report.uncertain_newest = newest;
            }
            report.engine_recovered = s
                .recovered()
                .map(|(ms, line)| format!("{ms:.0} ms: {line}"));
        }
        report.failures = r.failure_count - failures_before;
        r.log(format!(
            "cycle {cycle}: {} ms I/O, {} commands, {} in flight at kill, {} uncertain blocks, recovery {:.0} ms, {} blocks verified ({} uncertain, {} read new), {} failure(s){}",
            report.io_ms,
            report.commands,
            report.inflight_at_kill,
            report.uncertain_blocks,
            report.recovery_ms,
            report.blocks_verified,
            report.uncertain_verified,
            report.uncertain_newest,
            report.failures,
            report.copy.as_ref().map(|c| format!(", {c}")).unwrap_or_default()
        ));
        r.report_cycles.push(report);
    }
    // The end: a clean stop, an offline check, one more start and an exact verification.
    let last = cycle + 1;
    if let Some(s) = server.take() {
        r.stop(last, s);
        r.check(last);
        if let Some(s) = r.start(last) {
            r.verify(last, &s);
            r.stop(last, s);
        }
    }
    let name = |m: &BTreeMap<Kind, u64>| -> BTreeMap<String, u64> {
        m.iter().map(|(k, v)| (k.name().to_string(), *v)).collect()
    };
    let data_dir_kept = server::keep_data_dir(temp, r.failure_count > 0);
    Ok(TortureReport {
        seed: opts.seed,
        sliver: opts.sliver.display().to_string(),
        data_dir: dir.display().to_string(),
        data_dir_kept,
        cycles_requested: opts.cycles,
        cycles_run: cycle,
        sessions: opts.sessions,
        commands_issued: name(&r.stats.issued),
        commands_completed: name(&r.stats.completed),
        commands_not_executed: r.stats.not_executed,
        blocks_verified: r.blocks_verified,
        uncertain_verified: r.uncertain.0,
        uncertain_newest: r.uncertain.1,
        checks_run: r.checks_run,
        snapshots: r.snapshots,
        clones: r.clones,
        initial_start_ms,
        recovery_ms: Distribution::of(&r.recoveries),
        failure_count: r.failure_count,
        failures: r.failures,
        server_errors: r.server_errors,
        cycles: r.report_cycles,
        total_seconds: started.elapsed().as_secs_f64(),
    })
}

/// A run's outcome as the command-line tools print it.
pub trait Report: Serialize {
    fn summary(&self) -> String;
    fn passed(&self) -> bool;
}

impl Report for TortureReport {
    fn summary(&self) -> String {
        TortureReport::summary(self)
    }
    fn passed(&self) -> bool {
        TortureReport::passed(self)
    }
}

impl Report for load::LoadReport {
    fn summary(&self) -> String {
        load::LoadReport::summary(self)
    }
    fn passed(&self) -> bool {
        load::LoadReport::passed(self)
    }
}

/// Print `outcome` (JSON or the summary) and turn it into the exit status: 0 passed, 1 a
/// problem found in sliver, 2 the run itself failed.
pub fn exit_with(
    tool: &str,
    outcome: Result<impl Report, String>,
    json: bool,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    match outcome {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(j) => println!("{j}"),
                    Err(e) => eprintln!("{tool}: cannot encode the report: {e}"),
                }
            } else {
                print!("{}", report.summary());
            }
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{tool}: {e}");
            ExitCode::from(2)
        }
    }
}
