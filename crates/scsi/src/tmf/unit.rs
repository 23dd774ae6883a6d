//! One logical unit's running tasks from every nexus. The control mode page says TST=000: all
//! I_T nexuses share one task set, so CLEAR TASK SET, LOGICAL UNIT RESET and the target
//! resets abort other initiators' tasks too (SAM-5 7.4, 7.6), and their response waits until
//! those tasks have ended, as it waits for the issuing nexus's own (LIO drains every
//! session's commands on the LUN in target_core_tmr.c). Without that, a multipath host that
//! resets the LU through one path and retries its writes there could see a write still
//! running on the other path land after the retry, over newer data.
//!
//! A nexus's own tasks stay in its [`super::TaskSet`]; here they are only counted under
//! their owner, so that another owner's function can abort them. TAS=1 (the control mode
//! page says so): a task aborted by another nexus's function ends with TASK ABORTED status.
//! SANITIZE, which runs on through aborts and resets (SBC-3 4.11), is not registered.
//!
//! PERSISTENT RESERVE OUT PREEMPT AND ABORT aborts the preempted nexuses' tasks the same way
//! (SPC-4 5.12.11.2.5) and ends only once they have: a cluster that fences a node with it
//! (Pacemaker's fence_scsi, Windows failover clustering) knows no write of that node lands
//! afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use crate::range_lock::lock_unpoisoned;
use crate::{Nexus, Response};

/// Who started a task: one [`super::TaskSet`], unique in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Owner(u64);

impl Owner {
    pub(super) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The logical unit's tasks across nexuses ([`crate::LogicalUnit`] holds one).
#[derive(Default)]
pub(crate) struct UnitTasks {
    shared: Arc<Shared>,
}

/// What the unit and its task handles share.
#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    /// Aborts that marked any task here, ever: a task that starts at one count and finds it
    /// unchanged was not aborted, without taking the registry's lock ([`UnitTask::is_aborted`]).
    aborts: AtomicU64,
}

#[derive(Default)]
struct Registry {
    running: HashMap<u64, Running>,
    next_task: u64,
    /// Functions of other owners waiting for aborted tasks here, by drain number.
    drains: HashMap<u64, Drain>,
    next_drain: u64,
}

struct Running {
    owner: Owner,
    /// The owner's nexus (`None` before its login).
    nexus: Option<Arc<Nexus>>,
    /// Aborted by another owner's function: its initiator hears TASK ABORTED.
    aborted: bool,
    /// The drains waiting for it to end.
    drains: Vec<u64>,
}

/// A function waiting for the tasks it aborted on this unit.
struct Drain {
    left: usize,
    done: Drained,
}

/// Who waits for the tasks an abort aborted on one unit, and is told when they have ended.
pub(super) enum Drained {
    /// A task management function, answered by its task set's transport.
    Function {
        to: Arc<Elsewhere>,
        /// The function, as its owner's task set numbers it.
        function: u64,
    },
    /// A command (PREEMPT AND ABORT) whose thread waits.
    Command(Arc<Ended>),
}

impl Drained {
    fn tell(self) {
        match self {
            Drained::Function { to, function } => {
                lock_unpoisoned(&to.drained).push(function);
                to.any.store(true, Ordering::Release);
                if let Some(wake) = to.wake.get() {
                    wake();
                }
            }
            Drained::Command(ended) => {
                *lock_unpoisoned(&ended.done) = true;
                ended.signal.notify_all();
            }
        }
    }
}

/// Set once every task a command aborted has ended.
#[derive(Default)]
pub(super) struct Ended {
    done: Mutex<bool>,
    signal: Condvar,
}

/// What a task set hears from units where its functions aborted other owners' tasks. Told
/// from the thread where the last such task ended, which may hold nothing of the owner's:
/// `wake` must only wake it (never take a lock the owner may hold while it aborts).
#[derive(Default)]
pub(super) struct Elsewhere {
    pub(super) drained: Mutex<Vec<u64>>,
    pub(super) any: AtomicBool,
    pub(super) wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Elsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elsewhere")
            .field("any", &self.any.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl UnitTasks {
    /// A task of `owner` starts on this unit; it is counted until the returned handle ends
    /// or is dropped (a task that panics still ends here).
    pub(super) fn start(&self, owner: Owner, nexus: Option<Arc<Nexus>>) -> UnitTask {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        // Read under the lock: an abort that marks tasks bumps it under the lock too.
        let aborts_seen = self.shared.aborts.load(Ordering::Relaxed);
        let id = registry.next_task;
        registry.next_task += 1;
        registry.running.insert(
            id,
            Running {
                owner,
                nexus,
                aborted: false,
                drains: Vec::new(),
            },
        );
        UnitTask {
            shared: self.shared.clone(),
            id: Some(id),
            aborts_seen,
        }
    }

    /// Abort every task here that `owner` did not start; `done` is told once all of them
    /// have ended. `false`: none was running, and `done` is dropped untold.
    pub(super) fn abort_others(&self, owner: Owner, done: Drained) -> bool {
        self.abort_where(|task| task.owner != owner, done)
    }

    /// Abort the tasks of the nexuses `aborts` names (they must not include the caller's);
    /// [`AbortedTasks::wait`] returns once all of them have ended.
    pub(crate) fn abort_nexuses(&self, aborts: impl Fn(&Nexus) -> bool) -> AbortedTasks {
        let ended = Arc::new(Ended::default());
        let named = |task: &Running| task.nexus.as_deref().is_some_and(&aborts);
        let any = self.abort_where(named, Drained::Command(ended.clone()));
        AbortedTasks(any.then_some(ended))
    }

    /// Abort the running tasks `filter` picks; `done` is told once all have ended. `false`:
    /// it picked none, and `done` is dropped untold.
    fn abort_where(&self, filter: impl Fn(&Running) -> bool, done: Drained) -> bool {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        let drain = registry.next_drain;
        let mut left = 0;
        for task in registry.running.values_mut() {
            if filter(task) {
                task.aborted = true;
                task.drains.push(drain);
                left += 1;
            }
        }
        if left == 0 {
            return false;
        }
        self.shared.aborts.fetch_add(1, Ordering::Relaxed);
        registry.next_drain += 1;
        registry.drains.insert(drain, Drain { left, done });
        true
    }

    /// Tasks running here now, from every owner.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock_unpoisoned(&self.shared.registry).running.len()
    }
}

/// Tasks a command aborted ([`UnitTasks::abort_nexuses`]).
pub(crate) struct AbortedTasks(Option<Arc<Ended>>);

impl AbortedTasks {
    /// Block until every one of them has ended.
    pub(crate) fn wait(self) {
        let Some(ended) = self.0 else {
            return;
        };
        let mut done = lock_unpoisoned(&ended.done);
        while !*done {
            done = ended.signal.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A running task as its unit counts it: [`UnitTask::end`] takes its response.
pub struct UnitTask {
    shared: Arc<Shared>,
    /// `None` once ended.
    id: Option<u64>,
    /// The unit's abort count when it started.
    aborts_seen: u64,
}

impl std::fmt::Debug for UnitTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitTask").field("id", &self.id).finish()
    }
}

impl UnitTask {
    /// Another nexus's function has aborted the task: if it has not run yet, it need not
    /// (its initiator hears TASK ABORTED from [`UnitTask::end`] all the same). One atomic
    /// load while no abort has touched the unit since the task started.
    pub fn is_aborted(&self) -> bool {
        let Some(id) = self.id else {
            return false;
        };
        if self.shared.aborts.load(Ordering::Relaxed) == self.aborts_seen {
            return false;
        }
        lock_unpoisoned(&self.shared.registry)
            .running
            .get(&id)
            .is_some_and(|task| task.aborted)
    }

    /// The task ended with `response`; what its initiator is to hear: the response, or
    /// TASK ABORTED if another nexus's function aborted it meanwhile. A unit attention the
    /// task reported stays as it is: reporting it cleared it, and the task did nothing else.
    pub fn end(mut self, response: Response) -> Response {
        if !self.release() || response.reports_unit_attention() {
            return response;
        }
        Response::task_aborted(response.data_out_expected)
    }

    /// Stop counting the task; tells the functions that waited for it last. `true`: it was
    /// aborted by another owner.
    fn release(&mut self) -> bool {
        let Some(id) = self.id.take() else {
            return false;
        };
        let mut done = Vec::new();
        let aborted = {
            let mut registry = lock_unpoisoned(&self.shared.registry);
            let Some(task) = registry.running.remove(&id) else {
                return false;
            };
            for drain in task.drains {
                let last = registry.drains.get_mut(&drain).is_some_and(|d| {
                    d.left -= 1;
                    d.left == 0
                });
                if last {
                    done.extend(registry.drains.remove(&drain).map(|d| d.done));
                }
            }
            task.aborted
        };
        // Told outside the registry's lock: the owner may be aborting on this unit now.
        done.into_iter().for_each(Drained::tell);
        aborted
    }
}

impl Drop for UnitTask {
    fn drop(&mut self) {
        self.release();
    }
}
