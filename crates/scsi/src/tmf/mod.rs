//! Task management (SAM-5 7.1): which of a nexus's tasks a function aborts, what it resets, and
//! when its response may go. A transport feeds a [`TaskSet`] the commands it starts and
//! finishes and the functions it receives, and sends what comes back; the semantics live here
//! once (as in LIO's target_core_tmr.c), so a second transport reuses them. No sockets, no
//! clocks: the state machine is tested on its own. The task set is the nexus's; `unit`
//! counts every nexus's tasks on a logical unit, for the functions that reach across nexuses.
//!
//! Our commands run to completion on their own threads (a synchronous device server cannot
//! stop one halfway), so "aborting" a task means: its result is dropped, and the function's
//! response waits until it has finished, so the initiator never sees the task's effect after
//! being told it was aborted. What a function changes in the logical units (a reset's
//! reservations, mode pages and unit attentions; a cleared task set's unit attention for the
//! other initiators) happens only after the tasks it aborted have ended, as LIO drains a LUN
//! before it resets it: a RESERVE still running when the reset came must not leave the LU
//! reserved after it. SANITIZE continues through aborts and resets (SBC-3 4.11): nothing waits
//! for it, and its eventual response is dropped. Its tag is free again once the function is
//! answered (the initiator may reuse it), so tasks are told apart by a [`TaskId`], not by tag.

mod unit;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::range_lock::lock_unpoisoned;
use crate::{LogicalUnit, Nexus, Reset};
pub use unit::UnitTask;
pub(crate) use unit::UnitTasks;
use unit::{Drained, Elsewhere, Owner};

/// A task management function, as a transport decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    /// ABORT TASK of the task tagged `tag`.
    AbortTask {
        tag: u32,
    },
    AbortTaskSet,
    ClearTaskSet,
    LogicalUnitReset,
    TargetWarmReset,
    TargetColdReset,
}

/// How a function ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// FUNCTION COMPLETE: every task the function names has ended. For ABORT TASK of a task
    /// that had already finished this is all the core knows; the transport, which knows
    /// whether the task's response went out, answers TASK DOES NOT EXIST then (iSCSI:
    /// `Connection::complete_task_management`).
    Complete,
    /// The function names a logical unit the nexus cannot address.
    NoSuchLun,
}

/// A function's response, ready to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The function's own tag.
    pub tag: u32,
    pub outcome: Outcome,
    /// The nexus ends once the response is sent (TARGET COLD RESET ends every connection).
    pub ends_nexus: bool,
}

/// What [`TaskSet::finish`] says about a finished task.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Its response goes to the initiator (it was not aborted).
    pub deliver: bool,
    /// Functions that were waiting for it and may be answered now.
    pub answers: Vec<Answer>,
}

/// A task [`TaskSet::start`] started.
#[derive(Debug)]
pub struct Started {
    /// Its name in the task set, for [`TaskSet::finish`].
    pub id: TaskId,
    /// Its place among its logical unit's tasks from every nexus, which the transport ends
    /// with the task's response ([`UnitTask::end`]); `None` for a task without a unit, and
    /// for SANITIZE, which no abort stops.
    pub on_unit: Option<UnitTask>,
}

/// One started task, as [`TaskSet::start`] names it; [`TaskSet::finish`] takes it back. Tags
/// are the initiator's and may come again (after an aborted SANITIZE, while it still runs);
/// an id is never reused within a task set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId(u64);

#[derive(Debug)]
struct Task {
    tag: u32,
    lun: u64,
    survives_abort: bool,
    aborted: bool,
}

/// What a function changes in the logical units, once the tasks it aborted have ended.
enum Effect {
    Nothing,
    /// LOGICAL UNIT RESET, or a target reset of every unit the nexus can address.
    Reset(Vec<Arc<LogicalUnit>>, Reset),
}

impl Effect {
    fn apply(self) {
        match self {
            Effect::Nothing => {}
            Effect::Reset(units, kind) => units.iter().for_each(|unit| unit.reset(kind)),
        }
    }
}

impl std::fmt::Debug for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Effect::Nothing => f.write_str("Nothing"),
            Effect::Reset(units, kind) => write!(f, "Reset({} units, {kind:?})", units.len()),
        }
    }
}

/// A function waiting for aborted tasks to finish.
#[derive(Debug)]
struct Pending {
    /// Its number in [`Elsewhere`]'s reports.
    id: u64,
    tag: u32,
    waiting: HashSet<TaskId>,
    /// Units where it aborted other nexuses' tasks that have not all ended.
    elsewhere: usize,
    ends_nexus: bool,
    /// Applied when `waiting` empties, before the answer goes.
    effect: Effect,
}

/// One nexus's tasks that have started and not finished, and the functions waiting for them.
#[derive(Debug)]
pub struct TaskSet {
    tasks: HashMap<TaskId, Task>,
    /// The tag of every task the initiator may still refer to: all but aborted ones that run
    /// on (SANITIZE), whose tag it may reuse.
    by_tag: HashMap<u32, TaskId>,
    next_id: u64,
    pending: Vec<Pending>,
    /// This task set among the units' tasks from every nexus.
    owner: Owner,
    /// Its nexus, once logged in (a PREEMPT AND ABORT names nexuses).
    nexus: Option<Arc<Nexus>>,
    /// Where units report that other nexuses' tasks a function aborted have ended.
    elsewhere: Arc<Elsewhere>,
}

impl Default for TaskSet {
    fn default() -> Self {
        TaskSet {
            tasks: HashMap::new(),
            by_tag: HashMap::new(),
            next_id: 0,
            pending: Vec::new(),
            owner: Owner::new(),
            nexus: None,
            elsewhere: Arc::default(),
        }
    }
}

impl TaskSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// The set's tasks are from now on `nexus`'s (the login made it).
    pub fn logged_in(&mut self, nexus: &Nexus) {
        self.nexus = Some(Arc::new(nexus.clone()));
    }

    /// `wake` is called, from any thread, when other nexuses' tasks that a function of this
    /// set aborted have ended; the transport then calls [`TaskSet::drained_elsewhere`] from
    /// where it calls the set's other methods. `wake` must not block on anything the
    /// transport holds while calling them. Set once; later calls are ignored.
    pub fn wake_with(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.elsewhere.wake.set(Box::new(wake));
    }

    /// No task is running (nor waiting to be dropped).
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// A task tagged `tag` is running (a new command reusing the tag is the initiator's error).
    pub fn contains(&self, tag: u32) -> bool {
        self.by_tag.contains_key(&tag)
    }

    /// The command tagged `tag` for `lun` starts on `unit` (the LU at `lun` for this nexus;
    /// `None`: not mapped); `survives_abort` as its parser decided ([`crate::Parsed`]). The
    /// caller checked [`TaskSet::contains`] first.
    pub fn start(
        &mut self,
        tag: u32,
        lun: u64,
        survives_abort: bool,
        unit: Option<&Arc<LogicalUnit>>,
    ) -> Started {
        let id = TaskId(self.next_id);
        self.next_id += 1;
        self.tasks.insert(
            id,
            Task {
                tag,
                lun,
                survives_abort,
                aborted: false,
            },
        );
        self.by_tag.insert(tag, id);
        let on_unit = unit
            .filter(|_| !survives_abort)
            .map(|unit| unit.tasks.start(self.owner, self.nexus.clone()));
        Started { id, on_unit }
    }

    /// The task `id` finished. Unknown ids (never started here) are neither delivered nor
    /// waited for.
    pub fn finish(&mut self, id: TaskId) -> Finished {
        let Some(task) = self.tasks.remove(&id) else {
            return Finished::default();
        };
        if self.by_tag.get(&task.tag) == Some(&id) {
            self.by_tag.remove(&task.tag);
        }
        if !task.aborted {
            return Finished {
                deliver: true,
                answers: Vec::new(),
            };
        }
        self.pending.iter_mut().for_each(|p| {
            p.waiting.remove(&id);
        });
        Finished {
            deliver: false,
            answers: self.settle(),
        }
    }

    /// Other nexuses' tasks some functions aborted have ended on a unit (the set's `wake`
    /// said so): the responses of the functions that waited for nothing else.
    pub fn drained_elsewhere(&mut self) -> Vec<Answer> {
        if !self.elsewhere.any.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        let drained = std::mem::take(&mut *lock_unpoisoned(&self.elsewhere.drained));
        for function in drained {
            if let Some(p) = self.pending.iter_mut().find(|p| p.id == function) {
                p.elsewhere = p.elsewhere.saturating_sub(1);
            }
        }
        self.settle()
    }

    /// Answer the functions that wait for nothing any more, after applying their effects.
    fn settle(&mut self) -> Vec<Answer> {
        let mut answers = Vec::new();
        let mut ready = Vec::new();
        self.pending.retain_mut(|p| {
            if !p.waiting.is_empty() || p.elsewhere > 0 {
                return true;
            }
            answers.push(Answer {
                tag: p.tag,
                outcome: Outcome::Complete,
                ends_nexus: p.ends_nexus,
            });
            ready.push(std::mem::replace(&mut p.effect, Effect::Nothing));
            false
        });
        ready.into_iter().for_each(Effect::apply);
        answers
    }

    /// Carry out `function` (tagged `tag`) from this nexus on `lun`: `unit` is the LU at `lun`
    /// for this nexus (`None`: not mapped) and `units` every LU the nexus can address (a target
    /// reset resets them all). Returns the response when it may go now; `None` when it waits
    /// for aborted tasks, and [`TaskSet::finish`] hands it back once they have finished.
    pub fn manage(
        &mut self,
        tag: u32,
        function: Function,
        lun: u64,
        unit: Option<&Arc<LogicalUnit>>,
        units: &[Arc<LogicalUnit>],
    ) -> Option<Answer> {
        let answer = |outcome, ends_nexus| {
            Some(Answer {
                tag,
                outcome,
                ends_nexus,
            })
        };
        // The units whose task set (shared by every nexus: TST=000) the function clears.
        let mut shared: &[Arc<LogicalUnit>] = &[];
        let (waiting, ends_nexus, effect) = match function {
            Function::AbortTask { tag: referenced } => {
                (self.abort(|t| t.tag == referenced), false, Effect::Nothing)
            }
            Function::AbortTaskSet | Function::ClearTaskSet | Function::LogicalUnitReset => {
                let Some(unit) = unit else {
                    return answer(Outcome::NoSuchLun, false);
                };
                let effect = match function {
                    // CLEAR TASK SET queues no COMMANDS CLEARED BY ANOTHER INITIATOR: that
                    // is for TAS=0; with TAS=1 the cleared commands end with TASK ABORTED.
                    Function::LogicalUnitReset => {
                        Effect::Reset(vec![unit.clone()], Reset::LogicalUnit)
                    }
                    _ => Effect::Nothing,
                };
                // ABORT TASK SET is the nexus's own tasks only (SAM-5 7.3).
                if function != Function::AbortTaskSet {
                    shared = std::slice::from_ref(unit);
                }
                (self.abort(|t| t.lun == lun), false, effect)
            }
            Function::TargetWarmReset | Function::TargetColdReset => {
                let cold = function == Function::TargetColdReset;
                let kind = if cold {
                    Reset::TargetCold
                } else {
                    Reset::TargetWarm
                };
                shared = units;
                (
                    self.abort(|_| true),
                    cold,
                    Effect::Reset(units.to_vec(), kind),
                )
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut elsewhere = 0;
        for unit in shared {
            let done = Drained::Function {
                to: self.elsewhere.clone(),
                function: id,
            };
            if unit.tasks.abort_others(self.owner, done) {
                elsewhere += 1;
            }
        }
        if waiting.is_empty() && elsewhere == 0 {
            effect.apply();
            return answer(Outcome::Complete, ends_nexus);
        }
        self.pending.push(Pending {
            id,
            tag,
            waiting,
            elsewhere,
            ends_nexus,
            effect,
        });
        None
    }

    /// Mark the tasks matching `filter` aborted; returns those the function must wait for
    /// (all but the ones that survive aborts, whose tags are free from now on).
    fn abort(&mut self, filter: impl Fn(&Task) -> bool) -> HashSet<TaskId> {
        let mut waiting = HashSet::new();
        for (&id, task) in self.tasks.iter_mut() {
            if filter(task) {
                task.aborted = true;
                if task.survives_abort {
                    if self.by_tag.get(&task.tag) == Some(&id) {
                        self.by_tag.remove(&task.tag);
                    }
                } else {
                    waiting.insert(id);
                }
            }
        }
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a task survives aborts: a plain command, and SANITIZE.
    const PLAIN: bool = false;
    const SANITIZE: bool = true;

    /// A task set where `(tag, lun, survives_abort)` tasks have started, in that order, and their
    /// ids in the same order.
    fn running(tasks: &[(u32, u64, bool)]) -> (TaskSet, Vec<TaskId>) {
        let mut set = TaskSet::new();
        let ids = tasks
            .iter()
            .map(|&(tag, lun, lasting)| set.start(tag, lun, lasting, None).id)
            .collect();
        (set, ids)
    }

    fn nexus() -> Nexus {
        Nexus {
            initiator_port: "iqn.2026-11.test:i,i,0x1".into(),
            initiator_name: "iqn.2026-11.test:i".into(),
            relative_target_port: 1,
        }
    }

    fn complete(tag: u32) -> Option<Answer> {
        Some(Answer {
            tag,
            outcome: Outcome::Complete,
            ends_nexus: false,
        })
    }

    #[test]
    fn abort_task_answers_once_the_task_has_finished_and_drops_its_result() {
        let (mut set, id) = running(&[(1, 0, PLAIN), (2, 0, PLAIN)]);
        let f = Function::AbortTask { tag: 1 };
        assert_eq!(set.manage(100, f, 0, None, &[]), None);
        // The other task is untouched; the aborted one's end releases the answer.
        assert_eq!(
            set.finish(id[1]),
            Finished {
                deliver: true,
                answers: vec![]
            }
        );
        let done = set.finish(id[0]);
        assert!(!done.deliver);
        assert_eq!(done.answers, vec![complete(100).unwrap()]);
        assert!(set.is_empty());
    }

    #[test]
    fn abort_task_of_a_finished_or_unknown_task_completes_at_once() {
        let mut set = TaskSet::new();
        let f = Function::AbortTask { tag: 7 };
        assert_eq!(set.manage(100, f, 0, None, &[]), complete(100));
        assert_eq!(set.finish(TaskId(7)), Finished::default(), "never started");
    }

    #[test]
    fn a_task_set_abort_waits_for_its_lun_only_and_sanitize_runs_on() {
        let (mut set, id) = running(&[(1, 0, PLAIN), (2, 1, PLAIN), (3, 0, SANITIZE)]);
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let answer = set.manage(100, Function::AbortTaskSet, 0, Some(&unit), &[]);
        assert_eq!(answer, None, "task 1 still runs");
        assert!(set.finish(id[1]).deliver, "another LUN's task");
        assert_eq!(set.finish(id[0]).answers, vec![complete(100).unwrap()]);
        // SANITIZE was aborted (its result is dropped) but nothing waited for it.
        assert_eq!(set.finish(id[2]), Finished::default());
    }

    #[test]
    fn an_aborted_sanitize_frees_its_tag_and_a_new_task_with_it_is_told_apart() {
        let (mut set, id) = running(&[(3, 0, SANITIZE)]);
        let f = Function::AbortTask { tag: 3 };
        assert_eq!(set.manage(100, f, 0, None, &[]), complete(100));
        assert!(
            !set.contains(3),
            "the initiator may reuse the tag once answered"
        );
        let reused = set.start(3, 0, PLAIN, None).id;
        assert!(set.contains(3));
        // The sanitize ends first: dropped, and the new task is still the tag's.
        assert_eq!(set.finish(id[0]), Finished::default());
        assert!(set.contains(3));
        assert!(set.finish(reused).deliver);
        assert!(set.is_empty() && !set.contains(3));
    }

    #[test]
    fn a_function_on_a_lun_the_nexus_cannot_address_says_so() {
        let (mut set, id) = running(&[(1, 5, PLAIN)]);
        for f in [
            Function::AbortTaskSet,
            Function::ClearTaskSet,
            Function::LogicalUnitReset,
        ] {
            let answer = set.manage(100, f, 5, None, &[]).unwrap();
            assert_eq!(answer.outcome, Outcome::NoSuchLun);
        }
        assert!(set.finish(id[0]).deliver, "nothing was aborted");
    }

    #[test]
    fn a_cold_reset_aborts_everything_and_ends_the_nexus_once_answered() {
        let (mut set, id) = running(&[(1, 0, PLAIN), (2, 3, PLAIN)]);
        let units = [Arc::new(crate::tests::fixture().lu)]; // its file stays open
        assert_eq!(
            set.manage(100, Function::TargetColdReset, 0, None, &units),
            None
        );
        assert!(set.finish(id[0]).answers.is_empty());
        assert_eq!(
            set.finish(id[1]).answers,
            vec![Answer {
                tag: 100,
                outcome: Outcome::Complete,
                ends_nexus: true
            }]
        );
        // A warm reset with nothing running answers at once and keeps the nexus.
        assert_eq!(
            set.manage(101, Function::TargetWarmReset, 0, None, &units),
            complete(101)
        );
    }

    #[test]
    fn two_functions_waiting_for_one_task_are_both_answered() {
        let (mut set, id) = running(&[(1, 0, PLAIN)]);
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        assert_eq!(
            set.manage(100, Function::AbortTask { tag: 1 }, 0, None, &[]),
            None
        );
        assert_eq!(
            set.manage(101, Function::LogicalUnitReset, 0, Some(&unit), &[]),
            None
        );
        let tags: Vec<u32> = set.finish(id[0]).answers.iter().map(|a| a.tag).collect();
        assert_eq!(tags, vec![100, 101]);
    }

    /// A request from `nexus`, which sees LUN 0 and reaches no other LU for copies.
    fn request<'a>(nexus: &'a Nexus, cdb: &'a [u8]) -> crate::Request<'a> {
        crate::test_kit::request(nexus, cdb, &[], &[0], &crate::NoCopyTargets)
    }

    /// Runs `cdb` on `unit` from `nexus`, as a transport would, past the power-on attention.
    fn run(unit: &LogicalUnit, nexus: &Nexus, cdb: &[u8]) -> crate::Response {
        crate::test_kit::execute_past_power_on(unit, &request(nexus, cdb))
    }

    #[test]
    fn a_reset_takes_effect_after_the_tasks_it_aborted_have_ended() {
        let mut set = TaskSet::new();
        let n = nexus();
        let other = Nexus {
            initiator_port: "iqn.2026-11.test:j,i,0x2".into(),
            initiator_name: "iqn.2026-11.test:j".into(),
            relative_target_port: 1,
        };
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let test_unit_ready = [0u8; 6];
        assert_eq!(
            run(&unit, &other, &test_unit_ready).status,
            crate::Status::Good
        );
        // A RESERVE(6) is running when the LOGICAL UNIT RESET arrives.
        let reserving = set.start(1, 0, PLAIN, None).id;
        assert_eq!(
            set.manage(100, Function::LogicalUnitReset, 0, Some(&unit), &[]),
            None
        );
        // Nothing is reset while it runs; then it reserves the unit and ends.
        assert_eq!(
            run(&unit, &other, &test_unit_ready).status,
            crate::Status::Good
        );
        let reserve = [0x16, 0, 0, 0, 0, 0];
        assert_eq!(run(&unit, &n, &reserve).status, crate::Status::Good);
        let finished = set.finish(reserving);
        assert_eq!(finished.answers, vec![complete(100).unwrap()]);
        // The reset came after it: the reservation is gone, and the other initiator sees
        // BUS DEVICE RESET FUNCTION OCCURRED before its next command runs.
        let r = unit.execute(&request(&other, &test_unit_ready));
        assert_eq!((r.sense[12], r.sense[13]), (0x29, 0x03), "{r:?}");
        let write = [0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            run(&unit, &other, &write).status,
            crate::Status::Good,
            "not reserved"
        );
    }

    /// Another initiator's nexus, and a task set for it.
    fn other_nexus() -> (Nexus, TaskSet) {
        let other = Nexus {
            initiator_port: "iqn.2026-11.test:j,i,0x2".into(),
            initiator_name: "iqn.2026-11.test:j".into(),
            relative_target_port: 1,
        };
        (other, TaskSet::new())
    }

    /// A task set that counts its wake-ups.
    fn waking_set() -> (TaskSet, Arc<std::sync::atomic::AtomicUsize>) {
        let set = TaskSet::new();
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = woken.clone();
        set.wake_with(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        (set, woken)
    }

    fn good() -> crate::Response {
        crate::Response {
            status: crate::Status::Good,
            sense: Vec::new(),
            data_in: vec![1, 2, 3],
            data_out_expected: 0,
        }
    }

    #[test]
    fn a_unit_reset_aborts_other_nexuses_tasks_and_answers_once_they_have_ended() {
        let (other, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let tur = [0u8; 6];
        assert_eq!(run(&unit, &other, &tur).status, crate::Status::Good);
        // The other initiator's write runs (on another path of a multipath host, say).
        let write = theirs.start(1, 0, PLAIN, Some(&unit));
        let (mut mine, woken) = waking_set();
        let f = Function::LogicalUnitReset;
        assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), None);
        assert!(mine.drained_elsewhere().is_empty());
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        // Nothing is reset while it runs.
        assert_eq!(run(&unit, &other, &tur).status, crate::Status::Good);
        // It ends: its initiator hears TASK ABORTED (TAS=1), not its result.
        let heard = write.on_unit.unwrap().end(good());
        assert_eq!(heard.status, crate::Status::TaskAborted);
        assert!(heard.data_in.is_empty() && heard.sense.is_empty());
        assert!(
            theirs.finish(write.id).deliver,
            "its own set did not abort it"
        );
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert_eq!(mine.drained_elsewhere(), vec![complete(100).unwrap()]);
        assert!(mine.drained_elsewhere().is_empty(), "answered once");
        // Then the reset took effect.
        let r = unit.execute(&request(&other, &tur));
        assert_eq!((r.sense[12], r.sense[13]), (0x29, 0x03), "{r:?}");
        assert_eq!(unit.tasks.len(), 0);
    }

    #[test]
    fn a_clear_task_set_waits_for_its_own_and_other_nexuses_tasks_in_either_order() {
        let (_, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        for own_first in [true, false] {
            let (mut mine, _) = waking_set();
            let own = mine.start(1, 0, PLAIN, Some(&unit));
            let their = theirs.start(1, 0, PLAIN, Some(&unit));
            let f = Function::ClearTaskSet;
            assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), None);
            // The own task's handle says nothing of aborts by its own nexus: the set does.
            assert_eq!(own.on_unit.unwrap().end(good()).status, crate::Status::Good);
            if own_first {
                assert_eq!(mine.finish(own.id).answers, vec![]);
                their.on_unit.unwrap().end(good());
                assert_eq!(mine.drained_elsewhere(), vec![complete(100).unwrap()]);
            } else {
                their.on_unit.unwrap().end(good());
                assert!(mine.drained_elsewhere().is_empty(), "its own task runs");
                let finished = mine.finish(own.id);
                assert!(!finished.deliver);
                assert_eq!(finished.answers, vec![complete(100).unwrap()]);
            }
            theirs.finish(their.id);
        }
    }

    #[test]
    fn abort_task_set_and_abort_task_leave_other_nexuses_tasks_alone() {
        let (_, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let their = theirs.start(1, 0, PLAIN, Some(&unit));
        let (mut mine, _) = waking_set();
        let f = Function::AbortTaskSet;
        assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), complete(100));
        let f = Function::AbortTask { tag: 1 };
        assert_eq!(mine.manage(101, f, 0, Some(&unit), &[]), complete(101));
        let heard = their.on_unit.unwrap().end(good());
        assert_eq!(heard, good());
    }

    #[test]
    fn a_task_that_starts_after_the_function_is_not_aborted_by_it() {
        let (_, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let before = theirs.start(1, 0, PLAIN, Some(&unit));
        let (mut mine, _) = waking_set();
        let f = Function::LogicalUnitReset;
        assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), None);
        let after = theirs.start(2, 0, PLAIN, Some(&unit));
        assert_eq!(after.on_unit.unwrap().end(good()), good());
        assert!(mine.drained_elsewhere().is_empty());
        let heard = before.on_unit.unwrap().end(good());
        assert_eq!(heard.status, crate::Status::TaskAborted);
        assert_eq!(mine.drained_elsewhere(), vec![complete(100).unwrap()]);
    }

    #[test]
    fn a_target_reset_waits_for_other_nexuses_on_every_unit_it_resets() {
        let (_, mut theirs) = other_nexus();
        let units = [
            Arc::new(crate::tests::fixture().lu), // their files stay open
            Arc::new(crate::tests::fixture().lu),
        ];
        let first = theirs.start(1, 0, PLAIN, Some(&units[0]));
        let second = theirs.start(2, 1, PLAIN, Some(&units[1]));
        let (mut mine, woken) = waking_set();
        let f = Function::TargetWarmReset;
        assert_eq!(mine.manage(100, f, 0, None, &units), None);
        first.on_unit.unwrap().end(good());
        assert!(
            mine.drained_elsewhere().is_empty(),
            "the second unit's task runs"
        );
        // A task that never gets to end (its thread panicked) ends when dropped.
        drop(second.on_unit);
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert_eq!(mine.drained_elsewhere(), vec![complete(100).unwrap()]);
    }

    #[test]
    fn sanitize_of_another_nexus_is_neither_aborted_nor_waited_for() {
        let (_, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let sanitize = theirs.start(1, 0, SANITIZE, Some(&unit));
        assert!(sanitize.on_unit.is_none());
        let (mut mine, _) = waking_set();
        let f = Function::LogicalUnitReset;
        assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), complete(100));
        assert!(theirs.finish(sanitize.id).deliver);
    }

    #[test]
    fn two_nexuses_resetting_at_once_each_wait_for_the_others_task() {
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let (mut a, _) = waking_set();
        let (mut b, _) = waking_set();
        let a_task = a.start(1, 0, PLAIN, Some(&unit));
        let b_task = b.start(1, 0, PLAIN, Some(&unit));
        let f = Function::LogicalUnitReset;
        assert_eq!(a.manage(100, f, 0, Some(&unit), &[]), None);
        assert_eq!(b.manage(200, f, 0, Some(&unit), &[]), None);
        // Each task was aborted by the other nexus's reset.
        let heard = a_task.on_unit.unwrap().end(good());
        assert_eq!(heard.status, crate::Status::TaskAborted);
        assert_eq!(a.finish(a_task.id).answers, vec![], "b's task runs");
        assert_eq!(b.drained_elsewhere(), vec![], "b's own task runs");
        b_task.on_unit.unwrap().end(good());
        assert_eq!(a.drained_elsewhere(), vec![complete(100).unwrap()]);
        assert_eq!(b.finish(b_task.id).answers, vec![complete(200).unwrap()]);
    }

    /// PERSISTENT RESERVE OUT `service_action` from `nexus` with a basic parameter list.
    fn prout(
        unit: &LogicalUnit,
        nexus: &Nexus,
        service_action: u8,
        key: u64,
        sa_key: u64,
    ) -> crate::Response {
        let mut params = [0u8; 24];
        params[..8].copy_from_slice(&key.to_be_bytes());
        params[8..16].copy_from_slice(&sa_key.to_be_bytes());
        // Type 1 (WRITE EXCLUSIVE) for the actions that take one.
        let cdb = [0x5f, service_action, 0x01, 0, 0, 0, 0, 0, 24, 0];
        let req = crate::test_kit::request(nexus, &cdb, &params, &[0], &crate::NoCopyTargets);
        crate::test_kit::execute_past_power_on(unit, &req)
    }

    #[test]
    fn preempt_and_abort_ends_once_the_preempted_nexus_tasks_have_ended() {
        const REGISTER: u8 = 0x00;
        const RESERVE: u8 = 0x01;
        const PREEMPT_AND_ABORT: u8 = 0x05;
        let n = nexus();
        let (other, mut theirs) = other_nexus();
        theirs.logged_in(&other);
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        assert_eq!(prout(&unit, &n, REGISTER, 0, 1).status, crate::Status::Good);
        assert_eq!(
            prout(&unit, &other, REGISTER, 0, 2).status,
            crate::Status::Good
        );
        assert_eq!(
            prout(&unit, &other, RESERVE, 2, 0).status,
            crate::Status::Good
        );
        // The other node's write is running when this one fences it.
        let write = theirs.start(1, 0, PLAIN, Some(&unit));
        let (returned_tx, returned) = std::sync::mpsc::channel();
        let fencing = {
            let (unit, n) = (unit.clone(), n.clone());
            std::thread::spawn(move || {
                let r = prout(&unit, &n, PREEMPT_AND_ABORT, 1, 2);
                returned_tx.send(()).unwrap();
                r
            })
        };
        // It does not return while the write runs (however long this thread takes to look).
        assert!(returned
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        let heard = write.on_unit.unwrap().end(good());
        assert_eq!(heard.status, crate::Status::TaskAborted);
        assert_eq!(fencing.join().unwrap().status, crate::Status::Good);
        assert!(returned.try_recv().is_ok());
        // The fenced node hears it was preempted, and its next write meets the reservation.
        let write10 = [0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let r = run(&unit, &other, &write10);
        assert_eq!((r.sense[12], r.sense[13]), (0x2a, 0x05), "{r:?}");
        assert_eq!(
            run(&unit, &other, &write10).status,
            crate::Status::ReservationConflict
        );
        assert_eq!(unit.tasks.len(), 0);
    }

    #[test]
    fn preempt_and_abort_with_nothing_running_returns_at_once_and_spares_its_own_nexus() {
        let n = nexus();
        let (other, _) = other_nexus();
        let mut mine = TaskSet::new();
        mine.logged_in(&n);
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        assert_eq!(prout(&unit, &n, 0x00, 0, 1).status, crate::Status::Good);
        assert_eq!(prout(&unit, &other, 0x00, 0, 2).status, crate::Status::Good);
        // A task of the fencing nexus itself runs; it is neither aborted nor waited for.
        let own = mine.start(1, 0, PLAIN, Some(&unit));
        assert_eq!(prout(&unit, &n, 0x05, 1, 2).status, crate::Status::Good);
        assert_eq!(own.on_unit.unwrap().end(good()), good());
    }

    #[test]
    fn an_aborted_task_that_reported_a_unit_attention_keeps_it_and_one_not_yet_run_knows() {
        let (other, mut theirs) = other_nexus();
        let unit = Arc::new(crate::tests::fixture().lu); // its file stays open
        let queued = theirs.start(1, 0, PLAIN, Some(&unit));
        let reporting = theirs.start(2, 0, PLAIN, Some(&unit));
        assert!(!queued.on_unit.as_ref().unwrap().is_aborted());
        let (mut mine, _) = waking_set();
        let f = Function::ClearTaskSet;
        assert_eq!(mine.manage(100, f, 0, Some(&unit), &[]), None);
        // One still waiting for a thread learns it need not run.
        assert!(queued.on_unit.as_ref().unwrap().is_aborted());
        // One that ran and reported a unit attention: that is what its initiator hears.
        let tur = [0u8; 6];
        let ua = unit.execute(&request(&other, &tur));
        assert_eq!(ua.sense[2] & 0x0f, 0x06, "{ua:?}");
        assert_eq!(reporting.on_unit.unwrap().end(ua.clone()), ua);
        let heard = queued.on_unit.unwrap().end(good());
        assert_eq!(heard.status, crate::Status::TaskAborted);
        assert_eq!(mine.drained_elsewhere(), vec![complete(100).unwrap()]);
        // A task that starts after the clear is not aborted, though the unit counted one.
        let later = theirs.start(3, 0, PLAIN, Some(&unit));
        assert!(!later.on_unit.as_ref().unwrap().is_aborted());
        // TAS=1: no COMMANDS CLEARED BY ANOTHER INITIATOR for the other nexus.
        assert_eq!(run(&unit, &other, &tur).status, crate::Status::Good);
    }
}
