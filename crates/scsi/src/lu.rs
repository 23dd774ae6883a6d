//! The logical unit: state shared by every nexus (unit attentions, mode parameters, LBA
//! range locks, reservations) and the dispatcher that runs one command. How a command ends
//! and the helpers the families share are in `outcome`, the LBA range locks in
//! `range_lock`: a family needs this module only for the LU's state.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sliver_volume::{Pool, Volume};

use crate::cdb::{self, Command};
use crate::mode::ModeParams;
use crate::outcome::{Failure, Outcome};
use crate::pr::{PendingUa, Reservations};
use crate::range_lock::{lock_unpoisoned, RangeLocks};
use crate::stats::{CommandClass, LuStats, StatsSnapshot};
use crate::tpc::CopyManager;
use crate::{sbc, spc, tpc, Nexus, Request, Response, Sense, SenseReason, Status};

/// Identity and naming of one logical unit.
#[derive(Debug, Clone)]
pub struct LuConfig {
    /// T10 vendor identification ("SLIVER"); space-padded to 8 bytes in INQUIRY.
    pub vendor: String,
    /// Product identification ("sliver"); padded to 16. Identical for all LUNs (ESXi
    /// requires it for EXTENDED COPY between them).
    pub product: String,
    /// Product revision level, 4 characters.
    pub revision: String,
    /// VPD 0x80 unit serial number, stable per volume.
    pub serial: String,
    /// NAA IEEE Registered Extended (type 6) designator, stable per volume (VPD 0x83).
    pub naa: [u8; 16],
    /// iSCSI target name, for the SCSI name string designators in VPD 0x83.
    pub target_name: String,
    /// Target port group of every port (we have one group).
    pub target_port_group: u16,
    /// Where LU state that must survive restarts lives (the PR APTPL file).
    pub state_dir: Option<PathBuf>,
}

/// The kinds of reset a task management function can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    LogicalUnit,
    TargetWarm,
    TargetCold,
}

/// Unit attention conditions are queued per I_T nexus.
type NexusKey = (String, u16);

fn key(n: &Nexus) -> NexusKey {
    (n.initiator_port.clone(), n.relative_target_port)
}

/// Nexuses seen so far and the unit attentions each has pending. A nexus absent from the
/// map has never sent a command and gets POWER ON, RESET occurred first.
#[derive(Default)]
struct UnitAttentions {
    pending: HashMap<NexusKey, VecDeque<SenseReason>>,
}

impl UnitAttentions {
    fn queue_for(&mut self, n: &Nexus) -> &mut VecDeque<SenseReason> {
        self.pending
            .entry(key(n))
            .or_insert_with(|| VecDeque::from([SenseReason::PowerOnResetOccurred]))
    }

    fn push(queue: &mut VecDeque<SenseReason>, reason: SenseReason) {
        if !queue.contains(&reason) {
            queue.push_back(reason);
        }
    }
}

/// The statistics class of a command.
fn classify(cmd: &Command) -> CommandClass {
    match cmd {
        Command::Read { .. } => CommandClass::Read,
        Command::Write { .. }
        | Command::WriteAtomic { .. }
        | Command::WriteAndVerify { .. }
        | Command::OrWrite { .. } => CommandClass::Write,
        Command::CompareAndWrite { .. } => CommandClass::CompareAndWrite,
        Command::WriteSame { .. } => CommandClass::WriteSame,
        Command::Unmap { .. } => CommandClass::Unmap,
        Command::ExtendedCopy { .. }
        | Command::PopulateToken { .. }
        | Command::WriteUsingToken { .. } => CommandClass::ExtendedCopy,
        _ => CommandClass::Other,
    }
}

/// One SCSI logical unit backed by a volume.
pub struct LogicalUnit {
    pub(crate) volume: Arc<dyn Volume>,
    pub(crate) config: LuConfig,
    pub(crate) mode: ModeParams,
    pub(crate) locks: RangeLocks,
    pub(crate) reservations: Reservations,
    unit_attentions: Mutex<UnitAttentions>,
    /// When each nexus was last told the soft threshold is exceeded.
    soft_threshold_told: Mutex<HashMap<NexusKey, std::time::Instant>>,
    /// Set while a SANITIZE runs: media access commands then get NOT READY, SANITIZE IN
    /// PROGRESS (SBC-3 4.11), while INQUIRY, REPORT LUNS and REQUEST SENSE still work.
    pub(crate) sanitizing: std::sync::atomic::AtomicBool,
    /// Third-party copy: outcomes of recent EXTENDED COPY and token commands, and the ROD
    /// tokens made from this LU.
    pub(crate) copy_manager: CopyManager,
    pub(crate) stats: LuStats,
    /// The pool behind the volume: its soft threshold raises 38/07, LOG SENSE reports its
    /// free space, MODE SENSE its threshold and MODE SELECT changes it (through its owner,
    /// which keeps it); `None`: no pool, none of that.
    pub(crate) pool: Option<Arc<dyn Pool>>,
}

impl LogicalUnit {
    pub fn new(volume: Arc<dyn Volume>, config: LuConfig) -> Self {
        let persist = config
            .state_dir
            .as_ref()
            .map(|d| d.join("persistent-reservations"));
        LogicalUnit {
            volume,
            config,
            mode: ModeParams::default(),
            locks: RangeLocks::default(),
            reservations: Reservations::new(persist),
            unit_attentions: Mutex::new(UnitAttentions::default()),
            soft_threshold_told: Mutex::new(HashMap::new()),
            sanitizing: std::sync::atomic::AtomicBool::new(false),
            copy_manager: CopyManager::default(),
            stats: LuStats::default(),
            pool: None,
        }
    }

    /// This LU with its volume in `pool`, whose settings it reports and changes through it.
    pub fn with_pool(mut self, pool: Arc<dyn Pool>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The NAA designator (VPD 0x83) that names this LU, also in EXTENDED COPY descriptors.
    pub fn naa(&self) -> [u8; 16] {
        self.config.naa
    }

    pub fn volume(&self) -> &Arc<dyn Volume> {
        &self.volume
    }

    /// Run one command to completion. Safe to call concurrently from many threads.
    pub fn execute(&self, req: &Request) -> Response {
        let started = std::time::Instant::now();
        let parsed = cdb::parse(req.cdb);
        let (data_out_expected, class) = match &parsed {
            Ok(cmd) => (self.data_out_len(cmd), classify(cmd)),
            Err(_) => (0, CommandClass::Other),
        };
        let outcome = self.run(req, parsed);
        self.conclude(started, class, outcome, data_out_expected)
    }

    /// Execute `req` only if it is a READ that completes without waiting for a device (its
    /// data and metadata are cached; [`Volume::read_cached`]): the response, or `None` when it
    /// is another command or would wait. Then nothing was done or counted: the caller runs
    /// [`LogicalUnit::execute`] on a thread that may wait. A READ refused before it reads (a
    /// unit attention, a reservation conflict, a bad range) is answered here.
    ///
    /// [`Volume::read_cached`]: sliver_volume::Volume::read_cached
    pub fn execute_cached(&self, req: &Request) -> Option<Response> {
        let parsed = cdb::parse(req.cdb);
        if !matches!(parsed, Ok(Command::Read { .. })) {
            return None;
        }
        let started = std::time::Instant::now();
        let outcome = match self.admit(req, parsed) {
            Err(answered) => answered,
            Ok(Command::Read { range, .. }) => sbc::read_cached(self, range)?,
            Ok(_) => return None,
        };
        Some(self.conclude(started, CommandClass::Read, outcome, 0))
    }

    /// Count a command's outcome in the statistics and build its response.
    fn conclude(
        &self,
        started: std::time::Instant,
        class: CommandClass,
        outcome: Outcome,
        data_out_expected: usize,
    ) -> Response {
        // A command refused for a pending unit attention was never attempted: count it, but
        // not as a failed VAAI primitive (hosts simply retry it).
        let class = match &outcome {
            Err(Failure::Check(sense))
                if sense.reason.code().0 == crate::SenseKey::UnitAttention =>
            {
                CommandClass::Other
            }
            _ => class,
        };
        let (ok, bytes) = match &outcome {
            Ok(done) if done.status == Status::Good => (
                true,
                match class {
                    CommandClass::Read | CommandClass::Other => done.data_in.len() as u64,
                    _ => done.affected_bytes,
                },
            ),
            _ => (false, 0),
        };
        let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.stats.record(class, ok, bytes, latency_us);
        self.respond(outcome, data_out_expected)
    }

    /// Cumulative statistics of this LU.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// What every command goes through before it runs: the soft threshold's unit attention,
    /// a pending unit attention, a CDB that did not parse, a sanitize in progress, a
    /// reservation. `Err` carries the command's answer when one of them decides it.
    fn admit(&self, req: &Request, parsed: Result<Command, Sense>) -> Result<Command, Outcome> {
        let opcode = req.cdb.first().copied().unwrap_or(0);
        // SPC-4 5.14: INQUIRY, REPORT LUNS and REQUEST SENSE neither report nor clear a
        // unit attention (REQUEST SENSE returns it as its data instead).
        let reports_ua = !matches!(
            opcode,
            cdb::opcode::INQUIRY | cdb::opcode::REPORT_LUNS | cdb::opcode::REQUEST_SENSE
        );
        self.check_soft_threshold(req.nexus);
        {
            let mut uas = lock_unpoisoned(&self.unit_attentions);
            let queue = uas.queue_for(req.nexus);
            if reports_ua {
                if let Some(reason) = queue.pop_front() {
                    return Err(Err(reason.into()));
                }
            }
        }
        let cmd = parsed.map_err(|sense| Err(sense.into()))?;
        if self.sanitizing.load(std::sync::atomic::Ordering::Acquire) {
            match cmd {
                Command::Inquiry { .. } | Command::ReportLuns { .. } => {}
                Command::RequestSense { descriptor, .. } => {
                    return Err(spc::request_sense(
                        SenseReason::NotReadySanitizeInProgress,
                        descriptor,
                        &cmd,
                    ));
                }
                _ => return Err(Err(SenseReason::NotReadySanitizeInProgress.into())),
            }
        }
        if self.reservations.check_access(req.nexus, req.cdb).is_err() {
            return Err(Err(Failure::Conflict));
        }
        Ok(cmd)
    }

    fn run(&self, req: &Request, parsed: Result<Command, Sense>) -> Outcome {
        let cmd = match self.admit(req, parsed) {
            Ok(cmd) => cmd,
            Err(answered) => return answered,
        };
        match cmd {
            Command::RequestSense { descriptor, .. } => {
                let reason = lock_unpoisoned(&self.unit_attentions)
                    .queue_for(req.nexus)
                    .pop_front()
                    .unwrap_or(SenseReason::NoAdditionalSense);
                spc::request_sense(reason, descriptor, &cmd)
            }
            Command::Inquiry { .. }
            | Command::ReportLuns { .. }
            | Command::TestUnitReady
            | Command::ModeSense { .. }
            | Command::ModeSelect { .. }
            | Command::Reserve
            | Command::Release
            | Command::PersistentReserveIn { .. }
            | Command::PersistentReserveOut { .. }
            | Command::ReportTargetPortGroups { .. }
            | Command::ReportSupportedOpcodes { .. }
            | Command::ReportSupportedTmfs { .. }
            | Command::LogSense { .. }
            | Command::Unsupported { .. } => spc::execute(self, req, &cmd),
            Command::ExtendedCopy { .. }
            | Command::ReceiveCopyResults { .. }
            | Command::PopulateToken { .. }
            | Command::WriteUsingToken { .. }
            | Command::ReceiveRodTokenInformation { .. } => tpc::execute(self, req, &cmd),
            _ => sbc::execute(self, req, &cmd),
        }
    }

    fn respond(&self, outcome: Outcome, data_out_expected: usize) -> Response {
        match outcome {
            Ok(done) => Response {
                status: done.status,
                sense: Vec::new(),
                data_in: done.data_in,
                data_out_expected,
            },
            Err(Failure::Conflict) => Response {
                status: Status::ReservationConflict,
                sense: Vec::new(),
                data_in: Vec::new(),
                data_out_expected,
            },
            Err(Failure::Check(sense)) => Response {
                status: Status::CheckCondition,
                sense: if self.mode.descriptor_sense() {
                    sense.to_descriptor()
                } else {
                    sense.to_fixed()
                },
                data_in: Vec::new(),
                data_out_expected,
            },
        }
    }

    /// Bytes of Data-Out the command asks for.
    fn data_out_len(&self, cmd: &Command) -> usize {
        let bs = self.volume.block_size() as u64;
        let blocks_bytes = |n: u64| usize::try_from(n.saturating_mul(bs)).unwrap_or(usize::MAX);
        match *cmd {
            Command::Write { range, .. }
            | Command::WriteAtomic { range, .. }
            | Command::WriteAndVerify { range }
            | Command::OrWrite { range, .. } => blocks_bytes(range.blocks),
            Command::CompareAndWrite { range, .. } => blocks_bytes(range.blocks.saturating_mul(2)),
            Command::Verify { range, byte_check } => match byte_check {
                1 => blocks_bytes(range.blocks),
                3 if range.blocks > 0 => blocks_bytes(1),
                _ => 0,
            },
            Command::WriteSame { ndob, .. } => {
                if ndob {
                    0
                } else {
                    blocks_bytes(1)
                }
            }
            Command::Unmap { param_len, .. }
            | Command::ModeSelect { param_len, .. }
            | Command::Sanitize { param_len, .. }
            | Command::PersistentReserveOut { param_len }
            | Command::ExtendedCopy { param_len }
            | Command::PopulateToken { param_len, .. }
            | Command::WriteUsingToken { param_len, .. } => param_len,
            _ => 0,
        }
    }

    /// Queue a unit attention for every nexus that has talked to this LU, optionally
    /// sparing one (the nexus whose command caused the change).
    pub(crate) fn unit_attention_all(&self, reason: SenseReason, except: Option<&Nexus>) {
        let spared = except.map(key);
        let mut uas = lock_unpoisoned(&self.unit_attentions);
        for (k, queue) in uas.pending.iter_mut() {
            if Some(k) != spared.as_ref() {
                UnitAttentions::push(queue, reason);
            }
        }
    }

    /// Queue the unit attentions a PERSISTENT RESERVE OUT produced.
    pub(crate) fn queue_pending(&self, pending: Vec<PendingUa>) {
        let mut uas = lock_unpoisoned(&self.unit_attentions);
        for ua in pending {
            for ((port, _), queue) in uas.pending.iter_mut() {
                if *port == ua.initiator_port {
                    UnitAttentions::push(queue, ua.reason);
                }
            }
        }
    }

    /// A reset: every nexus gets the reset unit attention (replacing what was pending,
    /// which the reset supersedes) and RESERVE(6) reservations are dropped.
    pub fn reset(&self, kind: Reset) {
        let reason = match kind {
            Reset::LogicalUnit => SenseReason::BusDeviceResetOccurred,
            Reset::TargetWarm => SenseReason::PowerOnResetOccurred,
            Reset::TargetCold => SenseReason::PowerOnOccurred,
        };
        self.reservations.reset();
        self.copy_manager.reset();
        let mut uas = lock_unpoisoned(&self.unit_attentions);
        for queue in uas.pending.values_mut() {
            queue.clear();
            queue.push_back(reason);
        }
    }

    /// CLEAR TASK SET / ABORT TASK SET by `by`: with TST=000 (one task set shared by all
    /// nexuses) and CLEAR TASK SET, other nexuses lose commands and get COMMANDS CLEARED BY
    /// ANOTHER INITIATOR. Our commands run to completion on their own threads, so we queue
    /// the unit attention for the other nexuses.
    pub fn task_set_cleared(&self, by: &Nexus) {
        self.unit_attention_all(SenseReason::CommandsClearedByAnotherInitiator, Some(by));
    }

    /// The nexus is gone (logout, connection drop): forget its unit attentions, so a new
    /// login gets POWER ON, RESET again, and drop what it held by RESERVE(6).
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.reservations.nexus_lost(nexus);
        self.copy_manager.nexus_lost(nexus);
        lock_unpoisoned(&self.unit_attentions)
            .pending
            .remove(&key(nexus));
    }

    /// SBC-3 4.7.3.7: while the pool is past its soft threshold, every nexus gets THIN
    /// PROVISIONING SOFT THRESHOLD REACHED on its next command, and again every
    /// [`SOFT_THRESHOLD_REPEAT`] while it holds (hosts that missed it, or logged in since,
    /// hear it too). Dips below the threshold in between do not tell a nexus again sooner:
    /// a busy log-structured pool hovers around its threshold as the collector frees
    /// segments and writes fill them, and every crossing would fail a command of every
    /// initiator (a load run saw a dozen per session in 90 seconds).
    fn check_soft_threshold(&self, nexus: &Nexus) {
        if !self
            .pool
            .as_ref()
            .is_some_and(|p| p.soft_threshold_exceeded())
        {
            let mut told = lock_unpoisoned(&self.soft_threshold_told);
            if !told.is_empty() {
                told.retain(|_, at| at.elapsed() < SOFT_THRESHOLD_REPEAT);
            }
            return;
        }
        let mut told = lock_unpoisoned(&self.soft_threshold_told);
        let now = std::time::Instant::now();
        let due = told
            .get(&key(nexus))
            .is_none_or(|at| now.duration_since(*at) >= SOFT_THRESHOLD_REPEAT);
        if !due {
            return;
        }
        if told.is_empty() {
            tracing::warn!("thin provisioning soft threshold reached: telling every initiator");
        }
        told.insert(key(nexus), now);
        drop(told);
        let mut uas = lock_unpoisoned(&self.unit_attentions);
        UnitAttentions::push(
            uas.queue_for(nexus),
            SenseReason::ThinProvisioningSoftThresholdReached,
        );
    }

    /// The volume was resized.
    pub fn capacity_changed(&self) {
        self.unit_attention_all(SenseReason::CapacityDataChanged, None);
    }
}

/// How often the soft-threshold unit attention is repeated while the threshold holds.
const SOFT_THRESHOLD_REPEAT: std::time::Duration = std::time::Duration::from_secs(600);

/// Commands addressed to a LUN that is not mapped for this nexus: INQUIRY answers peripheral
/// qualifier 011b / type 1Fh, REPORT LUNS and REQUEST SENSE work, everything else gets
/// LOGICAL UNIT NOT SUPPORTED.
pub fn execute_without_lu(req: &Request) -> Response {
    let outcome = match cdb::parse(req.cdb) {
        Ok(cmd @ Command::Inquiry { .. }) => spc::inquiry_without_lu(&cmd),
        Ok(cmd @ Command::ReportLuns { .. }) => spc::report_luns(req, &cmd),
        Ok(cmd @ Command::RequestSense { descriptor, .. }) => {
            spc::request_sense(SenseReason::LogicalUnitNotSupported, descriptor, &cmd)
        }
        Ok(_) => Err(SenseReason::LogicalUnitNotSupported.into()),
        Err(sense) => Err(sense.into()),
    };
    match outcome {
        Ok(done) => Response {
            status: done.status,
            sense: Vec::new(),
            data_in: done.data_in,
            data_out_expected: 0,
        },
        Err(Failure::Conflict) => Response {
            status: Status::ReservationConflict,
            sense: Vec::new(),
            data_in: Vec::new(),
            data_out_expected: 0,
        },
        Err(Failure::Check(sense)) => Response {
            status: Status::CheckCondition,
            sense: sense.to_fixed(),
            data_in: Vec::new(),
            data_out_expected: 0,
        },
    }
}

/// Fuzzing entry point: the first byte splits the rest into CDB and Data-Out; the command
/// runs against a fresh LU over a small temporary volume.
#[doc(hidden)]
pub fn fuzz_cdb(data: &[u8]) {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let split = (split as usize).min(rest.len());
    let (cdb, data_out) = rest.split_at(split);
    let dir = std::env::temp_dir().join(format!("sliver-fuzz-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let Ok(volume) = sliver_volume::FileVolume::open(&dir.join("lu"), 1 << 20, 512) else {
        return;
    };
    let lu = LogicalUnit::new(
        Arc::new(volume),
        LuConfig {
            vendor: "SLIVER".into(),
            product: "sliver".into(),
            revision: "0001".into(),
            serial: "fuzz".into(),
            naa: [0x60; 16],
            target_name: "iqn.2024-01.io.sliver:fuzz".into(),
            target_port_group: 1,
            state_dir: None,
        },
    );
    let nexus = Nexus {
        initiator_port: "iqn.fuzz,i,0x000000000001".into(),
        initiator_name: "iqn.fuzz".into(),
        relative_target_port: 1,
    };
    let req = Request {
        nexus: &nexus,
        cdb,
        data_out,
        attr: crate::TaskAttr::Simple,
        luns: &[0, 1],
        copy_targets: &crate::NoCopyTargets,
    };
    // The first command consumes the power-on unit attention; the second really runs.
    let _ = lu.execute(&req);
    let response = lu.execute(&req);
    assert!(response.sense.is_empty() == (response.status != Status::CheckCondition));
}
