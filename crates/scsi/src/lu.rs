//! The logical unit's state, shared by every nexus: unit attentions, mode parameters, LBA
//! range locks, reservations, the copy manager's results and tokens, statistics. Each family
//! keeps its own part of the state in a module of its own (`mode::ModeParams`,
//! `pr::Reservations`, `tpc::CopyManager`) that does not know the LU; the families' commands
//! take the LU, and `execute` runs a command on it. So nothing here reaches up to a command.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sliver_clock::{Clock, SystemClock};
use sliver_volume::{Pool, Volume};

use crate::mode::ModeParams;
use crate::pr::{PendingUa, Reservations};
use crate::range_lock::{lock_unpoisoned, RangeLocks};
use crate::stats::{LuStats, StatsSnapshot};
use crate::tmf::UnitTasks;
use crate::tpc::CopyManager;
use crate::{Nexus, SenseReason};

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
    /// Every nexus's running tasks here, for task management that reaches across nexuses.
    pub(crate) tasks: UnitTasks,
    /// The pool behind the volume: its soft threshold raises 38/07, LOG SENSE reports its
    /// free space, MODE SENSE its threshold and MODE SELECT changes it (through its owner,
    /// which keeps it); `None`: no pool, none of that.
    pub(crate) pool: Option<Arc<dyn Pool>>,
    /// Where the LU reads the time: ROD tokens' inactivity timeouts, how often a nexus is
    /// told the soft threshold is exceeded.
    pub(crate) clock: Arc<dyn Clock>,
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
            tasks: Default::default(),
            pool: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// This LU reading the time from `clock` (the system's by default).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
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

    /// Cumulative statistics of this LU.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The unit attention this nexus is to hear next, taken from its queue when `take`;
    /// with `take` false only registers the nexus (its first command then finds POWER ON,
    /// RESET OCCURRED queued).
    pub(crate) fn next_unit_attention(&self, nexus: &Nexus, take: bool) -> Option<SenseReason> {
        let mut uas = lock_unpoisoned(&self.unit_attentions);
        let queue = uas.queue_for(nexus);
        if take {
            queue.pop_front()
        } else {
            None
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
    pub(crate) fn check_soft_threshold(&self, nexus: &Nexus) {
        if !self
            .pool
            .as_ref()
            .is_some_and(|p| p.soft_threshold_exceeded())
        {
            let mut told = lock_unpoisoned(&self.soft_threshold_told);
            if !told.is_empty() {
                let now = self.clock.now();
                told.retain(|_, at| now.saturating_duration_since(*at) < SOFT_THRESHOLD_REPEAT);
            }
            return;
        }
        let mut told = lock_unpoisoned(&self.soft_threshold_told);
        let now = self.clock.now();
        let due = told
            .get(&key(nexus))
            .is_none_or(|at| now.saturating_duration_since(*at) >= SOFT_THRESHOLD_REPEAT);
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
