//! Running one command on a logical unit: what every command goes through first (unit
//! attentions, the soft threshold, a sanitize in progress, reservations), the family that
//! runs it (`spc`, `sbc`, `tpc`), and its response and statistics. This is the only module
//! that knows every family; the families know the LU's state (`lu`) and not this.

use std::sync::Arc;

use crate::cdb::{Command, ProutCdb};
use crate::dispatch::Parsed;
use crate::lu::{LogicalUnit, LuConfig};
use crate::outcome::{write_failure, Done, Failure, Outcome};
use crate::stats::CommandClass;
use crate::{sbc, spc, tpc, Nexus, Request, Response, SenseReason, Status};

/// A command run up to the point where it may wait for its writes to be durable.
struct Ran {
    outcome: Outcome,
    started: std::time::Instant,
    class: CommandClass,
    data_out_expected: usize,
}

/// A command's answer, now or once what it wrote is durable ([`LogicalUnit::execute_deferring`]).
#[must_use = "an answer must be given to its initiator"]
pub struct Answer(Pending);

enum Pending {
    Now(Response),
    Durable {
        lu: Arc<LogicalUnit>,
        volume: Arc<dyn sliver_volume::Volume>,
        done: Done,
        started: std::time::Instant,
        class: CommandClass,
        data_out_expected: usize,
    },
}

impl Answer {
    /// An answer given at once.
    pub fn now(response: Response) -> Self {
        Answer(Pending::Now(response))
    }

    /// Give the answer to `complete`: here and now, or on the thread that made the writes
    /// durable. A failed sync answers the command with WRITE ERROR (or the volume's own
    /// sense), never GOOD.
    pub fn then(self, complete: impl FnOnce(Response) + Send + 'static) {
        match self.0 {
            Pending::Now(response) => complete(response),
            Pending::Durable {
                lu,
                volume,
                done,
                started,
                class,
                data_out_expected,
            } => volume.flush_then(Box::new(move |synced| {
                let outcome = synced.map(|()| done).map_err(write_failure);
                complete(lu.conclude(started, class, outcome, data_out_expected));
            })),
        }
    }

    /// Whether the answer waits for a sync (tests).
    pub fn waits_for_durability(&self) -> bool {
        matches!(self.0, Pending::Durable { .. })
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

impl LogicalUnit {
    /// [`LogicalUnit::execute_parsed`] for a command not dispatched before (tests, the
    /// array's own commands): parsed here, once.
    pub fn execute(&self, req: &Request) -> Response {
        self.execute_parsed(req, &Parsed::of(req))
    }

    /// Run one command, `parsed` from its CDB by [`crate::dispatch()`], to completion, waiting
    /// here for what it wrote to be durable where it must be (FUA, WCE=0, SYNCHRONIZE CACHE).
    /// Safe to call concurrently from many threads.
    pub fn execute_parsed(&self, req: &Request, parsed: &Parsed) -> Response {
        let ran = self.start(req, parsed);
        let outcome = ran.outcome.and_then(|mut done| match done.durable.take() {
            Some(volume) => volume.flush().map(|()| done).map_err(write_failure),
            None => Ok(done),
        });
        self.conclude(ran.started, ran.class, outcome, ran.data_out_expected)
    }

    /// [`LogicalUnit::execute_deferring_parsed`] for a command not dispatched before: parsed
    /// here, once.
    pub fn execute_deferring(self: &Arc<Self>, req: &Request) -> Answer {
        self.execute_deferring_parsed(req, &Parsed::of(req))
    }

    /// Run one command, `parsed` by [`crate::dispatch()`]; its answer once it may be given. A
    /// command that must wait for its writes to be durable does not wait on this thread: the
    /// [`Answer`] is given to the transport's completion when the volume has synced (the
    /// engine's group commit answers every write waiting for a sync from one thread), so a
    /// queue of write-through commands shares syncs instead of holding a thread each.
    pub fn execute_deferring_parsed(self: &Arc<Self>, req: &Request, parsed: &Parsed) -> Answer {
        let ran = self.start(req, parsed);
        match ran.outcome {
            Ok(mut done) if done.durable.is_some() => {
                let volume = done.durable.take().expect("checked");
                Answer(Pending::Durable {
                    lu: self.clone(),
                    volume,
                    done,
                    started: ran.started,
                    class: ran.class,
                    data_out_expected: ran.data_out_expected,
                })
            }
            outcome => {
                Answer::now(self.conclude(ran.started, ran.class, outcome, ran.data_out_expected))
            }
        }
    }

    /// Run `req`, which is `parsed`, up to the point where it may wait for durability.
    fn start(&self, req: &Request, parsed: &Parsed) -> Ran {
        let started = std::time::Instant::now();
        let (data_out_expected, class) = match &parsed.command {
            Ok(cmd) => (self.data_out_len(cmd), classify(cmd)),
            Err(_) => (0, CommandClass::Other),
        };
        Ran {
            outcome: self.run(req, parsed),
            started,
            class,
            data_out_expected,
        }
    }

    /// [`LogicalUnit::execute_cached_parsed`] for a command not dispatched before: parsed
    /// here, once.
    pub fn execute_cached(&self, req: &Request) -> Option<Response> {
        self.execute_cached_parsed(req, &Parsed::of(req))
    }

    /// Execute `req`, which is `parsed`, only if it is a READ that completes without waiting
    /// for a device (its data and metadata are cached; [`Volume::read_cached`]): the response,
    /// or `None` when it is another command or would wait. Then nothing was done or counted:
    /// the caller runs [`LogicalUnit::execute_parsed`] on a thread that may wait. A READ
    /// refused before it reads (a unit attention, a reservation conflict, a bad range) is
    /// answered here.
    ///
    /// [`Volume::read_cached`]: sliver_volume::Volume::read_cached
    pub fn execute_cached_parsed(&self, req: &Request, parsed: &Parsed) -> Option<Response> {
        if !matches!(parsed.command, Ok(Command::Read { .. })) {
            return None;
        }
        let started = std::time::Instant::now();
        let outcome = match self.admit(req, parsed) {
            Err(answered) => answered,
            Ok(&Command::Read { range, .. }) => sbc::read_cached(self, range)?,
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

    /// What every command goes through before it runs: the soft threshold's unit attention,
    /// a pending unit attention, a CDB that did not parse, a sanitize in progress, a
    /// reservation. `Err` carries the command's answer when one of them decides it.
    fn admit<'p>(&self, req: &Request, parsed: &'p Parsed) -> Result<&'p Command, Outcome> {
        self.check_soft_threshold(req.nexus);
        let pending = self.next_unit_attention(req.nexus, parsed.reports_unit_attention);
        if let Some(reason) = pending {
            return Err(Err(reason.into()));
        }
        let cmd = parsed
            .command
            .as_ref()
            .map_err(|&sense| Err(sense.into()))?;
        if self.sanitizing.load(std::sync::atomic::Ordering::Acquire) {
            match cmd {
                Command::Inquiry { .. } | Command::ReportLuns { .. } => {}
                Command::RequestSense { descriptor, .. } => {
                    return Err(spc::request_sense(
                        SenseReason::NotReadySanitizeInProgress,
                        *descriptor,
                        cmd,
                    ));
                }
                _ => return Err(Err(SenseReason::NotReadySanitizeInProgress.into())),
            }
        }
        let access = parsed.reservation_access;
        if access.is_some_and(|access| self.reservations.admits(req.nexus, access).is_err()) {
            return Err(Err(Failure::Conflict));
        }
        Ok(cmd)
    }

    fn run(&self, req: &Request, parsed: &Parsed) -> Outcome {
        let cmd = match self.admit(req, parsed) {
            Ok(cmd) => cmd,
            Err(answered) => return answered,
        };
        match cmd {
            Command::RequestSense { descriptor, .. } => {
                let reason = self
                    .next_unit_attention(req.nexus, true)
                    .unwrap_or(SenseReason::NoAdditionalSense);
                spc::request_sense(reason, *descriptor, cmd)
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
            | Command::Unsupported { .. } => spc::execute(self, req, cmd),
            Command::ExtendedCopy { .. }
            | Command::ReceiveCopyResults { .. }
            | Command::PopulateToken { .. }
            | Command::WriteUsingToken { .. }
            | Command::ReceiveRodTokenInformation { .. } => {
                tpc::execute(self, req, cmd, parsed.copy_list.as_ref())
            }
            _ => sbc::execute(self, req, cmd),
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
            | Command::PersistentReserveOut(ProutCdb { param_len, .. })
            | Command::ExtendedCopy { param_len }
            | Command::PopulateToken { param_len, .. }
            | Command::WriteUsingToken { param_len, .. } => param_len,
            _ => 0,
        }
    }
}

/// [`execute_without_lu_parsed`] for a command not dispatched before: parsed here, once.
pub fn execute_without_lu(req: &Request) -> Response {
    execute_without_lu_parsed(req, &Parsed::of(req))
}

/// Commands addressed to a LUN that is not mapped for this nexus, `parsed` by
/// [`crate::dispatch()`]: INQUIRY answers peripheral qualifier 011b / type 1Fh, REPORT LUNS
/// and REQUEST SENSE work, everything else gets LOGICAL UNIT NOT SUPPORTED.
pub fn execute_without_lu_parsed(req: &Request, parsed: &Parsed) -> Response {
    let outcome = match &parsed.command {
        Ok(cmd @ Command::Inquiry { .. }) => spc::inquiry_without_lu(cmd),
        Ok(cmd @ Command::ReportLuns { .. }) => spc::report_luns(req, cmd),
        Ok(cmd @ Command::RequestSense { descriptor, .. }) => {
            spc::request_sense(SenseReason::LogicalUnitNotSupported, *descriptor, cmd)
        }
        Ok(_) => Err(SenseReason::LogicalUnitNotSupported.into()),
        Err(sense) => Err((*sense).into()),
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
    let parsed = Parsed::of(&req);
    let _ = lu.execute_parsed(&req, &parsed);
    let response = lu.execute_parsed(&req, &parsed);
    assert!(response.sense.is_empty() == (response.status != Status::CheckCondition));
}
