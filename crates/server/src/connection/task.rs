//! A SCSI command from its receipt to its completion, and where it runs.

use super::*;
use sliver_scsi::{Answer, Inline, Parsed, Placement};

/// Run the quick commands one receive started, where the SCSI core placed them
/// ([`Placement`]) and this connection's load allows. A READ whose data and metadata are cached
/// completes here, on the connection's task, in microseconds: handing it to the pool cost
/// more than the read (a wake-up and two switches per command; on one core, 4 KiB random
/// reads at QD32 went from 83k to 134k IOPS without them, docs/benchmarks.md). Linux LIO's
/// receive thread executes file-backed commands itself; SPDK's reactor runs every command to
/// completion. Reads that would wait for the disk or the object store go to the pool.
///
/// A small write runs here too, but only the write of an initiator that waits for each
/// answer (`waiting_alone`: QD1, a database's log) while nothing else of the connection
/// runs, and only on half the cores at once: its hand-off to the pool and back was a third
/// of its latency (per core, QD1 4 KiB writes 112-115 -> 81-90 us p50). Such a write can
/// wait (the kernel's dirty-page throttling, a range lock held by an overlapping command, a
/// metadata page read), and while it does this runtime thread serves nobody else; the slots
/// leave the other half of the workers free for every other connection, and writes of
/// initiators that keep many commands in flight always go to the pool, where waiting is
/// harmless.
pub(super) fn run_ready(ready: Vec<(Task, OwnedSemaphorePermit)>, waiting_alone: bool) {
    if waiting_alone && ready.len() == 1 && placed(&ready[0].0, Inline::MayWait) {
        if let Some(_slot) = INLINE_WRITES.take(crate::poll::slots()) {
            for (task, permit) in ready {
                task.execute_here(permit);
            }
            return;
        }
    }
    // Writes and large reads first, to the pool (a large read's hand-off is small beside
    // it), so that the pool works on them while the small reads run here.
    let (small_reads, rest): (Vec<_>, Vec<_>) = ready
        .into_iter()
        .partition(|(task, _)| placed(task, Inline::IfCached));
    for (task, permit) in rest {
        crate::executor::run_quick(move || task.execute(permit, true));
    }
    for (task, permit) in small_reads {
        if let Some((task, permit)) = task.execute_cached(permit) {
            crate::executor::run_quick(move || task.execute(permit, true));
        }
    }
}

/// Writes running on connections' tasks now, across the target (see [`run_ready`]).
static INLINE_WRITES: crate::poll::Slots = crate::poll::Slots::new();

/// Whether the SCSI core lets `task` complete on the connection's task in the way `inline`
/// says (a small READ or WRITE; never decided from the PDU's R and W bits).
fn placed(task: &Task, inline: Inline) -> bool {
    task.parsed.placement == Placement::Inline(inline)
}

/// A SCSI command with what it executes against, from its receipt to its completion.
pub(super) struct Task {
    pub(super) shared: Arc<Shared>,
    pub(super) nexus: Nexus,
    pub(super) cmd: IncomingCommand,
    /// What the SCSI core decided the command is, once ([`sliver_scsi::dispatch`]): where it
    /// may run, and what executes.
    pub(super) parsed: Parsed,
    /// Its name in the session's task set (its tag may come again once it is aborted).
    pub(super) id: TaskId,
    /// Its place among its unit's tasks from every nexus: another nexus's CLEAR TASK SET or
    /// reset may abort it, and waits until it has ended (dropped with the task if it never
    /// completes).
    pub(super) on_unit: Option<UnitTask>,
    /// LUNs the nexus may see, for REPORT LUNS.
    /// What the session's LUNs were when it was received.
    pub(super) luns: Arc<LunTable>,
    pub(super) unit: Option<Arc<LogicalUnit>>,
}

impl Task {
    pub(super) fn request(&self) -> Request<'_> {
        Request {
            nexus: &self.nexus,
            cdb: &self.cmd.cdb,
            data_out: &self.cmd.data_out,
            attr: task_attr(&self.cmd),
            luns: &self.luns.numbers,
            copy_targets: &self.luns.units,
        }
    }

    /// Execute on a thread that may wait and complete; `permit` is the command's share of
    /// the connection's execution budget, `counted` whether it is in `quick_running`.
    pub(super) fn execute(self, permit: OwnedSemaphorePermit, counted: bool) {
        // A command that panics still counts out of `quick_running`.
        let guard = QuickGuard(counted.then(|| self.shared.clone()));
        let req = self.request();
        let answer = match &self.unit {
            // Aborted by another nexus while it waited for a thread: it need not run, and
            // the function that aborted it is answered sooner (LIO checks before it executes
            // too). Its initiator hears TASK ABORTED either way.
            Some(_) if self.on_unit.as_ref().is_some_and(UnitTask::is_aborted) => {
                Answer::now(sliver_scsi::Response::task_aborted(self.cmd.data_out.len()))
            }
            Some(unit) => unit.execute_deferring_parsed(&req, &self.parsed),
            None => Answer::now(sliver_scsi::execute_without_lu_parsed(&req, &self.parsed)),
        };
        guard.disarm();
        // A write-through command is answered from the engine's group-commit thread once
        // its sync is done; this thread goes on to the next command meanwhile.
        answer.then(move |resp| self.complete(resp, permit, counted));
    }

    /// Execute and complete a quick command here, on the connection's task. A panic fails
    /// the command as it would on the pool, without ending the connection's loop.
    pub(super) fn execute_here(self, permit: OwnedSemaphorePermit) {
        let itt = self.cmd.itt;
        let run = std::panic::AssertUnwindSafe(|| self.execute(permit, true));
        if std::panic::catch_unwind(run).is_err() {
            tracing::error!(itt, "a SCSI command panicked on its connection's thread");
        }
    }

    /// Execute and complete a quick command here if it is a READ that does not wait
    /// ([`LogicalUnit::execute_cached_parsed`]); else give it back for a thread that may wait.
    pub(super) fn execute_cached(
        self,
        permit: OwnedSemaphorePermit,
    ) -> Option<(Self, OwnedSemaphorePermit)> {
        let Some(unit) = &self.unit else {
            return Some((self, permit));
        };
        // A panic here would end the connection's loop; the pool's threads survive one.
        let resp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            unit.execute_cached_parsed(&self.request(), &self.parsed)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("a SCSI command panicked on its connection's thread");
            None
        });
        match resp {
            Some(resp) => {
                self.complete(resp, permit, true);
                None
            }
            None => Some((self, permit)),
        }
    }

    pub(super) fn complete(
        self,
        resp: sliver_scsi::Response,
        permit: OwnedSemaphorePermit,
        counted: bool,
    ) {
        // Ended on the unit before it is delivered: a function of another nexus that aborted
        // it may be answered from now on, and its initiator hears TASK ABORTED instead.
        let resp = match self.on_unit {
            Some(on_unit) => on_unit.end(resp),
            None => resp,
        };
        let result = CommandResult {
            status: resp.status as u8,
            sense: resp.sense,
            data_in: resp.data_in,
            data_out_expected: resp.data_out_expected,
        };
        self.shared
            .complete(self.cmd.itt, self.id, result, permit, counted);
    }
}

/// The LUNs a session sees, as the array's configuration stood at one generation.
pub(super) struct LunTable {
    pub(super) luns: Vec<MappedLun>,
    /// For REPORT LUNS.
    pub(super) numbers: Vec<u64>,
    /// For EXTENDED COPY's copy-target lookup.
    pub(super) units: MappedUnits,
}

/// EXTENDED COPY may only reach LUs this initiator is connected to (an XCOPY that ignored
/// access control was LIO's CVE-2020-28374).
pub(super) struct MappedUnits(pub(super) Vec<Arc<LogicalUnit>>);

impl CopyTargets for MappedUnits {
    fn find_by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|u| u.naa()[..] == *naa).cloned()
    }
}

pub(super) fn task_attr(cmd: &IncomingCommand) -> TaskAttr {
    use sliver_iscsi::TaskAttr as I;
    match cmd.attr {
        I::Untagged | I::Simple => TaskAttr::Simple,
        I::Ordered => TaskAttr::Ordered,
        I::HeadOfQueue => TaskAttr::HeadOfQueue,
        I::Aca => TaskAttr::Aca,
    }
}
