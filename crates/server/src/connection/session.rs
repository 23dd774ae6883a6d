//! The iSCSI session of one connection: its nexus, its tasks, and what it does with each
//! event the protocol core yields.

use super::*;

pub(super) struct Session {
    pub(super) server: Arc<Server>,
    pub(super) info: Option<SessionInfo>,
    pub(super) nexus: Option<Nexus>,
    /// Commands started and not finished, and task management waiting for them (the SCSI
    /// core's state machine; this session only routes to it).
    pub(super) tasks: TaskSet,
    /// Logical units this session touched, told about nexus loss at the end.
    pub(super) touched: HashMap<u64, Arc<LogicalUnit>>,
    pub(super) budget: Arc<Semaphore>,
    pub(super) close_after_output: bool,
    /// Commands handed straight to the quick pool and not completed. While some are and more
    /// wait in the pool's queue, a completion leaves its response for a later one to
    /// announce: the loop then writes the burst's responses in one system call, instead of
    /// being woken, and switched to, once per command (on one core, half the target's time
    /// went to those switches). Once the queue is empty the response is announced at once: a
    /// thread about to wait for work never holds one back. Only commands already in the pool
    /// count, so the one that announces never waits for anything the connection holds.
    pub(super) quick_running: usize,
    /// Quick commands the events just handled started (counted in `quick_running`), run
    /// once the loop has released the connection's lock: see [`run_ready`].
    pub(super) ready: Vec<(Task, OwnedSemaphorePermit)>,
    /// SCSI commands started on this connection, ever (for `crate::poll::Pacing`).
    pub(super) started: u64,
    /// When a completion left nothing in flight, with `started` then: the loop may have
    /// slept through the quiet period that began there (`crate::poll::Pacing::quiet_at`).
    pub(super) went_quiet: Option<(std::time::Instant, u64)>,
    /// The LUN table and the array generation it was built at ([`Session::luns`]).
    pub(super) lun_table: Option<(u64, Arc<LunTable>)>,
}

impl Session {
    pub(super) fn handle_event(
        &mut self,
        conn: &mut Connection,
        event: Event,
        shared: &Arc<Shared>,
    ) {
        match event {
            Event::LoggedIn(info) => {
                tracing::info!(
                    initiator = %info.initiator_name,
                    tsih = info.tsih,
                    discovery = matches!(info.session_type, SessionType::Discovery),
                    "login"
                );
                let isid: String = info.isid.iter().map(|b| format!("{b:02x}")).collect();
                let nexus = Nexus {
                    initiator_port: format!("{},i,0x{isid}", info.initiator_name),
                    initiator_name: info.initiator_name.clone(),
                    relative_target_port: 1,
                };
                self.tasks.logged_in(&nexus);
                self.nexus = Some(nexus);
                self.info = Some(info);
                self.lun_table = None;
            }
            Event::Command(cmd) => self.start_command(conn, cmd, shared),
            Event::TaskManagement(tmf) => self.task_management(conn, tmf),
            Event::LoggedOut => {
                // Release the nexus before the Logout response goes out, so an initiator that
                // logs in again right away finds its RESERVE(6) reservations gone.
                self.release_nexus();
                self.close_after_output = true;
            }
        }
    }

    /// The LUNs this session sees, rebuilt only when the array's configuration moved (a
    /// command used to rebuild them: two locks, a map and a clone of every name).
    pub(super) fn luns(&mut self) -> Arc<LunTable> {
        let generation = self.server.lun_map.generation();
        if let Some((seen, table)) = &self.lun_table {
            if *seen == generation {
                return table.clone();
            }
        }
        let luns = match &self.info {
            Some(info) if matches!(info.session_type, SessionType::Normal) => {
                self.server.lun_map.luns_for(&info.initiator_name)
            }
            _ => vec![],
        };
        let table = Arc::new(LunTable {
            numbers: luns.iter().map(|l| l.lun).collect(),
            units: MappedUnits(luns.iter().map(|l| l.unit.clone()).collect()),
            luns,
        });
        self.lun_table = Some((generation, table.clone()));
        table
    }

    /// The logical unit at `lun`, if this session sees one there.
    pub(super) fn unit_at(table: &LunTable, lun: u64) -> Option<Arc<LogicalUnit>> {
        table
            .luns
            .iter()
            .find(|l| l.lun == lun)
            .map(|l| l.unit.clone())
    }

    pub(super) fn start_command(
        &mut self,
        conn: &mut Connection,
        cmd: IncomingCommand,
        shared: &Arc<Shared>,
    ) {
        let Some(nexus) = self.nexus.clone() else {
            return;
        };
        let luns = self.luns();
        let unit = Self::unit_at(&luns, cmd.lun);
        if let Some(unit) = &unit {
            self.touched.entry(cmd.lun).or_insert_with(|| unit.clone());
        }
        if self.tasks.contains(cmd.itt) {
            // An initiator reusing a live ITT is broken; answer without running anything.
            tracing::warn!(itt = cmd.itt, "duplicate initiator task tag");
            conn.complete_command(
                cmd.itt,
                CommandResult {
                    status: sliver_scsi::Status::Busy as u8,
                    sense: vec![],
                    data_in: vec![],
                    data_out_expected: 0,
                },
            );
            return;
        }
        self.started += 1;
        let bytes = (cmd.data_out.len() as u64).max(cmd.expected_data_transfer_length as u64);
        // The SCSI core decides what the command is, once; the session only reads it.
        let parsed = sliver_scsi::dispatch(&cmd.cdb, bytes, &cmd.data_out);
        let started = self
            .tasks
            .start(cmd.itt, cmd.lun, parsed.survives_abort, unit.as_ref());
        let budget = self.budget.clone();
        let cost = (bytes / 1024 + 1).min(EXECUTION_BUDGET_KIB as u64) as u32;
        let quick = parsed.placement != sliver_scsi::Placement::Blocking;
        let task = Task {
            shared: shared.clone(),
            nexus,
            cmd,
            parsed,
            id: started.id,
            on_unit: started.on_unit,
            luns,
            unit,
        };
        // A quick command within the budget runs from the loop (see `run_ready`); a task of
        // its own would cost a spawn and often a wake-up of the other tokio worker.
        if quick {
            if let Ok(permit) = budget.clone().try_acquire_many_owned(cost) {
                self.quick_running += 1;
                self.ready.push((task, permit));
                return;
            }
        }
        // Not counted in `quick_running`: a command waiting here for budget may wait for
        // permits that responses held back for the count would keep.
        tokio::spawn(async move {
            let Ok(permit) = budget.acquire_many_owned(cost).await else {
                return;
            };
            crate::executor::run(quick, move || task.execute(permit, false)).await;
        });
    }

    pub(super) fn finish(
        &mut self,
        conn: &mut Connection,
        itt: u32,
        id: TaskId,
        result: CommandResult,
    ) {
        let finished = self.tasks.finish(id);
        if finished.deliver {
            conn.complete_command(itt, result);
        }
        for answer in finished.answers {
            self.answer(conn, answer);
        }
    }

    /// Route a task management request to the SCSI core's task set; answer what iSCSI
    /// decides alone (functions the core does not know).
    pub(super) fn task_management(&mut self, conn: &mut Connection, tmf: TaskManagement) {
        let function = match tmf.function {
            TmfFunction::AbortTask => tmf::Function::AbortTask {
                tag: tmf.referenced_task_tag,
            },
            TmfFunction::AbortTaskSet => tmf::Function::AbortTaskSet,
            TmfFunction::ClearTaskSet => tmf::Function::ClearTaskSet,
            TmfFunction::LogicalUnitReset => tmf::Function::LogicalUnitReset,
            TmfFunction::TargetWarmReset => tmf::Function::TargetWarmReset,
            TmfFunction::TargetColdReset => tmf::Function::TargetColdReset,
            TmfFunction::TaskReassign => {
                conn.complete_task_management(tmf.itt, TmfResponse::ReassignNotSupported);
                return;
            }
            TmfFunction::ClearAca | TmfFunction::Unknown(_) => {
                conn.complete_task_management(tmf.itt, TmfResponse::NotSupported);
                return;
            }
        };
        if self.nexus.is_none() {
            // Task management comes in the full feature phase, after the login that made the
            // nexus; answered all the same, so that nothing waits for a response.
            conn.complete_task_management(tmf.itt, TmfResponse::NotSupported);
            return;
        }
        let luns = self.luns();
        let unit = Self::unit_at(&luns, tmf.lun);
        let units: Vec<Arc<LogicalUnit>> = luns.luns.iter().map(|l| l.unit.clone()).collect();
        if let Some(answer) = self
            .tasks
            .manage(tmf.itt, function, tmf.lun, unit.as_ref(), &units)
        {
            self.answer(conn, answer);
        }
    }

    /// Answer the functions that waited only for other nexuses' tasks, which have ended
    /// (the task set's wake-up kicked the loop).
    pub(super) fn answer_drained(&mut self, conn: &mut Connection) {
        for answer in self.tasks.drained_elsewhere() {
            self.answer(conn, answer);
        }
    }

    /// Send a task management response the core decided.
    pub(super) fn answer(&mut self, conn: &mut Connection, answer: tmf::Answer) {
        let response = match answer.outcome {
            tmf::Outcome::Complete => TmfResponse::FunctionComplete,
            tmf::Outcome::NoSuchLun => TmfResponse::LunDoesNotExist,
        };
        conn.complete_task_management(answer.tag, response);
        if answer.ends_nexus {
            self.close_after_output = true;
        }
    }

    /// The I_T nexus is gone: logical units drop its RESERVE(6) reservation and state.
    pub(super) fn release_nexus(&mut self) {
        if let Some(nexus) = &self.nexus {
            for unit in std::mem::take(&mut self.touched).into_values() {
                unit.nexus_lost(nexus);
            }
        }
    }

    pub(super) fn end(&mut self) {
        self.release_nexus();
        if let Some(info) = &self.info {
            self.server
                .unregister(&info.initiator_name, info.isid, info.tsih);
        }
    }
}
