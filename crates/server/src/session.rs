//! One TCP connection: socket I/O around a sans-I/O [`Connection`], SCSI commands on the
//! executor's threads (which also send their responses), task management bookkeeping.

use crate::array::MappedLun;
use crate::target::{ConnectionAuthority, Server, Timeouts};
use sliver_iscsi::{
    Command, CommandResult, Connection, Event, SessionInfo, SessionType, TaskManagement,
    TmfFunction, TmfResponse,
};
use sliver_scsi::tmf::{self, TaskSet};
use sliver_scsi::{CopyTargets, LogicalUnit, Nexus, Request, TaskAttr};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Dead initiators are found with TCP keepalive, answered by the initiator's kernel. NOP-In
/// pings are not used for that: a single-threaded initiator that sleeps between commands
/// (libiscsi's synchronous API does, for a minute at a time) cannot answer them, and dropping
/// it costs it its nexus and a unit attention on every reconnect.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// Bounded queue of output chunks between the protocol loop and the socket writer.
/// Kept short: each chunk can hold a whole Data-In sequence, and a slow reader must stall
/// the loop (and so command execution) rather than let output pile up.
const WRITE_QUEUE: usize = 4;
/// KiB of Data-In plus Data-Out that commands of one connection may hold from the start of
/// their execution until the socket has taken their responses; further commands wait. This
/// bounds the memory of a connection whose initiator queues many large reads and then reads
/// its socket slowly.
const EXECUTION_BUDGET_KIB: u32 = 64 * 1024;

struct Session {
    server: Arc<Server>,
    info: Option<SessionInfo>,
    nexus: Option<Nexus>,
    /// Commands started and not finished, and task management waiting for them (the SCSI
    /// core's state machine; this session only routes to it).
    tasks: TaskSet,
    /// Logical units this session touched, told about nexus loss at the end.
    touched: HashMap<u64, Arc<LogicalUnit>>,
    budget: Arc<Semaphore>,
    close_after_output: bool,
    /// Commands handed straight to the quick pool and not completed. While some are and more
    /// wait in the pool's queue, a completion leaves its response for a later one to
    /// announce: the loop then writes the burst's responses in one system call, instead of
    /// being woken, and switched to, once per command (on one core, half the target's time
    /// went to those switches). Once the queue is empty the response is announced at once: a
    /// thread about to wait for work never holds one back. Only commands already in the pool
    /// count, so the one that announces never waits for anything the connection holds.
    quick_running: usize,
    /// Quick commands the events just handled started (counted in `quick_running`), run
    /// once the loop has released the connection's lock: see [`run_ready`].
    ready: Vec<(Task, OwnedSemaphorePermit)>,
    /// SCSI commands started on this connection, ever (for `crate::poll::Pacing`).
    started: u64,
    /// When a completion left nothing in flight, with `started` then: the loop may have
    /// slept through the quiet period that began there (`crate::poll::Pacing::quiet_at`).
    went_quiet: Option<(std::time::Instant, u64)>,
    /// The LUN table and the array generation it was built at ([`Session::luns`]).
    lun_table: Option<(u64, Arc<LunTable>)>,
}

/// What the connection loop and the threads that finish its commands share.
///
/// A command completes on the thread that executed it: that thread builds the response
/// and, when nothing is queued ahead of it, writes it to the socket itself. Handing every
/// result back to the connection loop cost a wake-up of a tokio worker per command, on the
/// round trip of every client that waits for each answer (docs/design.md).
struct Shared {
    core: Mutex<Core>,
    writer: OwnedWriteHalf,
    /// Output chunks handed to the writer task and not yet written in full. Only holders of
    /// `core` add to it, so when a holder reads zero nothing is queued or half-written and
    /// it may write to the socket directly without overtaking anything.
    queued: AtomicUsize,
    /// Wakes the connection loop when a completion left it work: output the socket did not
    /// take, or a connection to close; or left it quiet while it would poll (`poll_soon`).
    kick: Notify,
    /// The loop would poll its socket once quiet ([`crate::poll::Pacing::would_poll`]): a
    /// completion that leaves nothing in flight wakes it to, while the initiator is still
    /// taking the response, so that the wake-up is not on the next command's path.
    poll_soon: AtomicBool,
}

struct Core {
    session: Session,
    conn: Connection,
    /// Budget permits of commands whose responses are still in `conn`'s output: they keep
    /// the connection's memory bounded while the loop waits for a slow reader, as they did
    /// when results queued for the loop.
    held: Vec<OwnedSemaphorePermit>,
    /// The loop has ended or is closing the connection: late completions are dropped.
    ended: bool,
}

/// Counts a quick command out of `Session::quick_running` if it ends without completing (a
/// panic on the pool), and announces what its connection has to write then.
struct QuickGuard(Option<Arc<Shared>>);

impl QuickGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for QuickGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            let mut core = shared.lock();
            core.session.quick_running = core.session.quick_running.saturating_sub(1);
            drop(core);
            shared.kick.notify_one();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        // Commands execute outside the lock; a panic under it would be a bug in the protocol
        // bookkeeping. Later holders carry on with the state as it was left rather than turn
        // every command of the connection into another panic.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write what the socket takes of the connection's output, unless output is queued for
    /// the writer task (which must go first).
    fn write_direct(&self, conn: &mut Connection) {
        if conn.has_output() && self.queued.load(Ordering::Acquire) == 0 {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let n = conn.output_slices(&mut slices);
            if let Ok(n) = self.writer.try_write_vectored(&slices[..n]) {
                conn.consume_output(n);
            }
        }
    }

    /// The connection's pending output for the writer task, with the budget permits of the
    /// commands it answers (the budget counts responses until the socket has taken them);
    /// counted in `queued` from here. Permits of responses already written are dropped.
    fn take_for_writer(&self, core: &mut Core) -> Option<Output> {
        let permits = std::mem::take(&mut core.held);
        if !core.conn.has_output() {
            return None;
        }
        let out = core.conn.take_output_parts();
        self.queued.fetch_add(1, Ordering::AcqRel);
        Some((out, permits))
    }

    /// Finish a command on the thread that executed it; `permit` is its share of the
    /// connection's execution budget.
    fn complete(
        &self,
        itt: u32,
        result: CommandResult,
        permit: OwnedSemaphorePermit,
        counted: bool,
    ) {
        let mut core = self.lock();
        if counted {
            core.session.quick_running = core.session.quick_running.saturating_sub(1);
        }
        if core.ended {
            return;
        }
        let Core {
            session,
            conn,
            held,
            ..
        } = &mut *core;
        session.finish(conn, itt, result);
        if session.tasks.is_empty() {
            session.went_quiet = Some((std::time::Instant::now(), session.started));
        }
        // With other commands of this connection still running, the loop writes: it gathers
        // the responses that complete meanwhile into one write instead of a system call per
        // response on the I/O threads.
        if session.tasks.is_empty() && !conn.is_closing() {
            self.write_direct(conn);
        }
        if conn.has_output() {
            held.push(permit);
        } else {
            held.clear();
        }
        // The loop also arms the stall timer when the completion released deferred R2Ts.
        if (conn.has_output()
            && (session.quick_running == 0 || crate::executor::quick_queued() == 0))
            || conn.is_closing()
            || session.close_after_output
            || conn.is_waiting_for_initiator()
            || (session.tasks.is_empty() && self.poll_soon.load(Ordering::Relaxed))
        {
            self.kick.notify_one();
        }
    }
}

pub(crate) async fn drive(
    server: Arc<Server>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
        tracing::warn!(%peer, "cannot enable TCP keepalive: {e}");
    }
    let kill = Arc::new(Notify::new());
    let authority = Arc::new(ConnectionAuthority {
        server: server.clone(),
        local,
        peer,
        chap: Default::default(),
        kill: kill.clone(),
    });
    let conn = Connection::new(server.settings.clone(), authority);
    let timeouts = server.timeouts();
    let (mut reader, writer) = stream.into_split();
    let session = Session {
        server: server.clone(),
        info: None,
        nexus: None,
        tasks: TaskSet::new(),
        touched: HashMap::new(),
        budget: Arc::new(Semaphore::new(EXECUTION_BUDGET_KIB as usize)),
        close_after_output: false,
        quick_running: 0,
        ready: Vec::new(),
        started: 0,
        went_quiet: None,
        lun_table: None,
    };
    let shared = Arc::new(Shared {
        core: Mutex::new(Core {
            session,
            conn,
            held: Vec::new(),
            ended: false,
        }),
        writer,
        queued: AtomicUsize::new(0),
        kick: Notify::new(),
        poll_soon: AtomicBool::new(false),
    });
    let (out_tx, out_rx) = mpsc::channel::<Output>(WRITE_QUEUE);
    let mut writer_task = tokio::spawn(write_output(shared.clone(), out_rx, timeouts.stall, peer));
    let mut writer_done = false;
    let mut logout_requested = false;
    let mut buf = vec![0u8; 256 * 1024];
    let mut pacing = crate::poll::Pacing::new(server.poll());
    let mut polled_in_a_row = 0u32;
    // The select returned for a completion's kick (see the poll below).
    let mut woken = false;
    tracing::debug!(%peer, "connection opened");
    let opened = Instant::now();
    // The last time the initiator sent anything, and the last ping we sent.
    let mut last_input = opened;
    let mut last_ping = opened;
    let timer = tokio::time::sleep_until(opened + timeouts.login);
    tokio::pin!(timer);
    loop {
        let wait = {
            let core = shared.lock();
            next_wait(
                &core.session,
                &core.conn,
                &timeouts,
                opened,
                last_input,
                last_ping,
            )
        };
        if timer.deadline() != wait.at() {
            timer.as_mut().reset(wait.at());
        }
        // A quiet connection whose initiator answered quickly last time looks at its socket
        // for a moment before sleeping (see `crate::poll`).
        let quiet = {
            let mut core = shared.lock();
            let Core {
                session: s, conn, ..
            } = &mut *core;
            if let Some((at, started)) = s.went_quiet.take() {
                pacing.quiet_at(at, started);
            }
            (s.info.is_some()
                && s.tasks.is_empty()
                && !conn.has_output()
                && !conn.is_closing()
                && shared.queued.load(Ordering::Acquire) == 0)
                .then_some(s.started)
        };
        shared
            .poll_soon
            .store(pacing.would_poll(), Ordering::Relaxed);
        let kicked = std::mem::take(&mut woken);
        // Every so many inputs found by polling, the loop goes through the select below, so
        // that a shutdown, a reinstatement or a failed writer is seen even while the
        // initiator keeps answering within the window.
        let poll_now = quiet.filter(|_| polled_in_a_row < POLLED_IN_A_ROW);
        if poll_now.is_none() {
            polled_in_a_row = 0;
        }
        if let Some(started) = poll_now {
            if let Some(until) = pacing.quiet(std::time::Instant::now(), started) {
                match crate::poll::poll_input(&reader, &mut buf, until).await {
                    Some((Ok(0) | Err(_), _)) => break,
                    Some((Ok(n), waiting)) => {
                        // Waiting at the first look, right after this loop answered: the
                        // initiator sent it before it could see the answer. After a wake-up
                        // (a completion on the pool) a quick initiator's next command is
                        // expected to be there.
                        if waiting && !kicked {
                            pacing.pipelined();
                        }
                        last_input = Instant::now();
                        receive(&shared, &buf[..n], peer, &mut pacing);
                        if !send_output(&shared, &out_tx).await {
                            break;
                        }
                        // Input found at the first look never returns to the runtime
                        // otherwise: other connections on this thread get their turn.
                        tokio::task::coop::consume_budget().await;
                        polled_in_a_row += 1;
                        continue;
                    }
                    None => {
                        pacing.missed();
                        polled_in_a_row = 0;
                    }
                }
            }
        }
        tokio::select! {
            _ = &mut timer => match wait {
                Wait::Login(_) => {
                    tracing::warn!(%peer, "no login within {:?}, closing", timeouts.login);
                    break;
                }
                Wait::Stalled(_) => {
                    tracing::warn!(%peer, "initiator stalled for {:?} in the middle of a PDU or data transfer, closing",
                        timeouts.stall);
                    break;
                }
                Wait::Idle(_) => {
                    tracing::warn!(%peer, "nothing from the initiator for {:?} (pings unanswered), closing",
                        timeouts.idle);
                    break;
                }
                Wait::Ping(_) => {
                    last_ping = Instant::now();
                    shared.lock().conn.ping();
                }
            },
            read = reader.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                last_input = Instant::now();
                receive(&shared, &buf[..n], peer, &mut pacing);
            }
            _ = shared.kick.notified() => woken = true,
            _ = kill.notified() => {
                tracing::info!(%peer, "session reinstated by a new login, closing");
                break;
            }
            // wait_for also sees a shutdown that came before this connection subscribed.
            _ = async { shutdown.wait_for(|stop| *stop).await.is_ok() }, if !logout_requested => {
                logout_requested = true;
                shared.lock().conn.request_logout();
            }
            _ = &mut writer_task => {
                // The initiator stopped taking output, or the socket failed.
                writer_done = true;
                break;
            }
        }
        if !send_output(&shared, &out_tx).await {
            break;
        }
    }
    // Output left by a completion that the loop did not get to (a partial direct write
    // right before a timeout or a reinstatement) still goes out whole, before the FIN.
    let rest = {
        let mut core = shared.lock();
        core.ended = true;
        shared.take_for_writer(&mut core)
    };
    if let (Some(rest), false) = (rest, writer_done) {
        let _ = out_tx.send(rest).await;
    }
    drop(out_tx);
    if !writer_done {
        let _ = writer_task.await;
    }
    shared.lock().session.end();
    tracing::debug!(%peer, "connection closed");
}

/// Inputs in a row the loop may find by polling before it goes through its select.
const POLLED_IN_A_ROW: u32 = 32;

/// Hand `input` to the protocol core, handle the events it yields and run the quick
/// commands they started. `pacing` learns that input arrived now, and when the connection
/// went quiet before it if a completion saw that while the loop slept.
fn receive(shared: &Arc<Shared>, input: &[u8], peer: SocketAddr, pacing: &mut crate::poll::Pacing) {
    let mut core = shared.lock();
    let Core { session, conn, .. } = &mut *core;
    if let Some((at, started)) = session.went_quiet.take() {
        pacing.quiet_at(at, started);
    }
    pacing.input(std::time::Instant::now());
    if let Err(e) = conn.receive(input) {
        tracing::warn!(%peer, "protocol error, closing: {e}");
        session.close_after_output = true;
    }
    while let Some(event) = conn.next_event() {
        session.handle_event(conn, event, shared);
    }
    let ready = std::mem::take(&mut session.ready);
    drop(core);
    run_ready(ready);
}

/// Send what the connection has to say: a response to one command at a time goes to the
/// socket from here; what it does not take goes through the writer task, which waits for
/// the initiator to read (and resets a stalled one). `false`: the connection closes now.
async fn send_output(shared: &Arc<Shared>, out_tx: &mpsc::Sender<Output>) -> bool {
    let (out, close) = {
        let mut core = shared.lock();
        shared.write_direct(&mut core.conn);
        let out = shared.take_for_writer(&mut core);
        let close = core.conn.is_closing() || core.session.close_after_output;
        // Nothing may follow the last output (a Logout response): completions from now on
        // are dropped.
        core.ended |= close;
        (out, close)
    };
    if let Some(out) = out {
        if out_tx.send(out).await.is_err() {
            return false;
        }
    }
    !close
}

/// Run the quick commands one receive started. A READ whose data and metadata are cached
/// completes here, on the connection's task, in microseconds: handing it to the pool cost
/// more than the read (a wake-up and two switches per command; on one core, 4 KiB random
/// reads at QD32 went from 83k to 134k IOPS without them, docs/benchmarks.md). Linux LIO's
/// receive thread executes file-backed commands itself; SPDK's reactor runs every command to
/// completion. Nothing that may wait runs here (the task shares a runtime thread with other
/// connections): writes, and reads that would wait for the disk or the object store, go to
/// the pool.
fn run_ready(ready: Vec<(Task, OwnedSemaphorePermit)>) {
    // Writes and large reads first, to the pool (a large read's hand-off is small beside
    // it), so that the pool works on them while the small reads run here.
    let (small_reads, rest): (Vec<_>, Vec<_>) = ready.into_iter().partition(|(task, _)| {
        task.cmd.read
            && !task.cmd.write
            && task.cmd.expected_data_transfer_length <= INLINE_MAX_BYTES
    });
    for (task, permit) in rest {
        crate::executor::run_quick(move || task.execute(permit, true));
    }
    for (task, permit) in small_reads {
        if let Some((task, permit)) = task.execute_cached(permit) {
            crate::executor::run_quick(move || task.execute(permit, true));
        }
    }
}

/// Largest READ that may complete on the connection's task.
const INLINE_MAX_BYTES: u32 = 64 * 1024;

/// What the connection loop waits for besides I/O, and until when.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Login must be complete by then.
    Login(Instant),
    /// The initiator owes bytes (a partial PDU, Data-Out, a CmdSN gap).
    Stalled(Instant),
    /// Time to ping a silent initiator.
    Ping(Instant),
    /// Silent for too long: close.
    Idle(Instant),
}

impl Wait {
    fn at(self) -> Instant {
        match self {
            Wait::Login(t) | Wait::Stalled(t) | Wait::Ping(t) | Wait::Idle(t) => t,
        }
    }
}

fn next_wait(
    s: &Session,
    conn: &Connection,
    t: &Timeouts,
    opened: Instant,
    last_input: Instant,
    last_ping: Instant,
) -> Wait {
    if s.info.is_none() {
        return Wait::Login(opened + t.login);
    }
    let stall = Wait::Stalled(last_input + t.stall);
    if conn.is_waiting_for_initiator() {
        return stall;
    }
    if !s.tasks.is_empty() {
        // Commands are executing: the next thing to happen is ours. Keep pinging a silent
        // initiator, but do not call it idle.
        return Wait::Ping(last_input.max(last_ping) + t.ping_after);
    }
    let idle = last_input + t.idle;
    let ping = last_input.max(last_ping) + t.ping_after;
    if ping < idle {
        Wait::Ping(ping)
    } else {
        Wait::Idle(idle)
    }
}

/// Output smaller than this is topped up with what else is queued before it is written.
const COALESCE_BYTES: usize = 256 * 1024;

/// Slices per `writev` (Linux takes up to 1024; a few dozen PDUs' worth is plenty per call).
const WRITE_SLICES: usize = 64;

/// Output for the socket writer, with the budget permits of the commands it answers
/// (released once the socket has taken it).
type Output = (sliver_iscsi::output::Output, Vec<OwnedSemaphorePermit>);

/// The socket writer: sends output chunks in order. An initiator that takes no bytes at all
/// for `stall` (it stopped reading its socket) gets its connection reset, which ends the
/// connection loop and releases everything the connection holds.
async fn write_output(
    shared: Arc<Shared>,
    mut out_rx: mpsc::Receiver<Output>,
    stall: Duration,
    peer: SocketAddr,
) {
    let writer = &shared.writer;
    while let Some((mut chunk, mut permits)) = out_rx.recv().await {
        let mut chunks = 1;
        // Output queued meanwhile goes out in the same system call (its parts are moved, not
        // copied).
        while chunk.len() < COALESCE_BYTES {
            match out_rx.try_recv() {
                Ok((mut next, more)) => {
                    chunk.append(&mut next);
                    permits.extend(more);
                    chunks += 1;
                }
                Err(_) => break,
            }
        }
        while !chunk.is_empty() {
            match tokio::time::timeout(stall, write_some(writer, &chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => chunk.consume(n),
                Err(_) => {
                    tracing::warn!(%peer, "initiator took no output for {stall:?}, resetting the connection");
                    // Unsent data would otherwise linger in the kernel for a peer that never
                    // reads: reset instead of a graceful close.
                    let _ =
                        socket2::SockRef::from(writer.as_ref()).set_linger(Some(Duration::ZERO));
                    return;
                }
            }
        }
        shared.queued.fetch_sub(chunks, Ordering::AcqRel);
        drop(permits);
    }
    let _ = socket2::SockRef::from(writer.as_ref()).shutdown(std::net::Shutdown::Write);
}

/// Writes what the socket takes of `out` (one `writev`) once it is writable.
async fn write_some(
    writer: &OwnedWriteHalf,
    out: &sliver_iscsi::output::Output,
) -> std::io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
    let n = out.io_slices(&mut slices);
    loop {
        writer.writable().await?;
        match writer.try_write_vectored(&slices[..n]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

impl Session {
    fn handle_event(&mut self, conn: &mut Connection, event: Event, shared: &Arc<Shared>) {
        match event {
            Event::LoggedIn(info) => {
                tracing::info!(
                    initiator = %info.initiator_name,
                    tsih = info.tsih,
                    discovery = matches!(info.session_type, SessionType::Discovery),
                    "login"
                );
                let isid: String = info.isid.iter().map(|b| format!("{b:02x}")).collect();
                self.nexus = Some(Nexus {
                    initiator_port: format!("{},i,0x{isid}", info.initiator_name),
                    initiator_name: info.initiator_name.clone(),
                    relative_target_port: 1,
                });
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
    fn luns(&mut self) -> Arc<LunTable> {
        let generation = self.server.array.generation();
        if let Some((seen, table)) = &self.lun_table {
            if *seen == generation {
                return table.clone();
            }
        }
        let luns = match &self.info {
            Some(info) if matches!(info.session_type, SessionType::Normal) => {
                self.server.array.luns_for(&info.initiator_name)
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
    fn unit_at(table: &LunTable, lun: u64) -> Option<Arc<LogicalUnit>> {
        table
            .luns
            .iter()
            .find(|l| l.lun == lun)
            .map(|l| l.unit.clone())
    }

    fn start_command(&mut self, conn: &mut Connection, cmd: Command, shared: &Arc<Shared>) {
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
        // The SCSI core decides what the command is; the session only reads it.
        let facts = sliver_scsi::dispatch(&cmd.cdb, bytes, &cmd.data_out);
        self.tasks.start(cmd.itt, cmd.lun, facts);
        let budget = self.budget.clone();
        let cost = (bytes / 1024 + 1).min(EXECUTION_BUDGET_KIB as u64) as u32;
        let quick = facts.quick;
        let task = Task {
            shared: shared.clone(),
            nexus,
            cmd,
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

    fn finish(&mut self, conn: &mut Connection, itt: u32, result: CommandResult) {
        let finished = self.tasks.finish(itt);
        if finished.deliver {
            conn.complete_command(itt, result);
        }
        for answer in finished.answers {
            self.answer(conn, answer);
        }
    }

    /// Route a task management request to the SCSI core's task set; answer what iSCSI
    /// decides alone (functions the core does not know).
    fn task_management(&mut self, conn: &mut Connection, tmf: TaskManagement) {
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
        let Some(nexus) = self.nexus.clone() else {
            // Task management comes in the full feature phase, after the login that made the
            // nexus; answered all the same, so that nothing waits for a response.
            conn.complete_task_management(tmf.itt, TmfResponse::NotSupported);
            return;
        };
        let luns = self.luns();
        let unit = Self::unit_at(&luns, tmf.lun);
        let units: Vec<Arc<LogicalUnit>> = luns.luns.iter().map(|l| l.unit.clone()).collect();
        if let Some(answer) =
            self.tasks
                .manage(tmf.itt, function, tmf.lun, unit.as_ref(), &units, &nexus)
        {
            self.answer(conn, answer);
        }
    }

    /// Send a task management response the core decided.
    fn answer(&mut self, conn: &mut Connection, answer: tmf::Answer) {
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
    fn release_nexus(&mut self) {
        if let Some(nexus) = &self.nexus {
            for unit in std::mem::take(&mut self.touched).into_values() {
                unit.nexus_lost(nexus);
            }
        }
    }

    fn end(&mut self) {
        self.release_nexus();
        if let Some(info) = &self.info {
            self.server
                .unregister(&info.initiator_name, info.isid, info.tsih);
        }
    }
}

/// A SCSI command with what it executes against, from its receipt to its completion.
struct Task {
    shared: Arc<Shared>,
    nexus: Nexus,
    cmd: Command,
    /// LUNs the nexus may see, for REPORT LUNS.
    /// What the session's LUNs were when it was received.
    luns: Arc<LunTable>,
    unit: Option<Arc<LogicalUnit>>,
}

impl Task {
    fn request(&self) -> Request<'_> {
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
    fn execute(self, permit: OwnedSemaphorePermit, counted: bool) {
        // A command that panics still counts out of `quick_running`.
        let guard = QuickGuard(counted.then(|| self.shared.clone()));
        let req = self.request();
        let resp = match &self.unit {
            Some(unit) => unit.execute(&req),
            None => sliver_scsi::execute_without_lu(&req),
        };
        guard.disarm();
        self.complete(resp, permit, counted);
    }

    /// Execute and complete a quick command here if it is a READ that does not wait
    /// ([`LogicalUnit::execute_cached`]); else give it back for a thread that may wait.
    fn execute_cached(self, permit: OwnedSemaphorePermit) -> Option<(Self, OwnedSemaphorePermit)> {
        let Some(unit) = &self.unit else {
            return Some((self, permit));
        };
        // A panic here would end the connection's loop; the pool's threads survive one.
        let resp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            unit.execute_cached(&self.request())
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

    fn complete(self, resp: sliver_scsi::Response, permit: OwnedSemaphorePermit, counted: bool) {
        let result = CommandResult {
            status: resp.status as u8,
            sense: resp.sense,
            data_in: resp.data_in,
            data_out_expected: resp.data_out_expected,
        };
        self.shared.complete(self.cmd.itt, result, permit, counted);
    }
}

/// The LUNs a session sees, as the array's configuration stood at one generation.
struct LunTable {
    luns: Vec<MappedLun>,
    /// For REPORT LUNS.
    numbers: Vec<u64>,
    /// For EXTENDED COPY's copy-target lookup.
    units: MappedUnits,
}

/// EXTENDED COPY may only reach LUs this initiator is connected to (an XCOPY that ignored
/// access control was LIO's CVE-2020-28374).
struct MappedUnits(Vec<Arc<LogicalUnit>>);

impl CopyTargets for MappedUnits {
    fn find_by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|u| u.naa()[..] == *naa).cloned()
    }
}

fn task_attr(cmd: &Command) -> TaskAttr {
    use sliver_iscsi::TaskAttr as I;
    match cmd.attr {
        I::Untagged | I::Simple => TaskAttr::Simple,
        I::Ordered => TaskAttr::Ordered,
        I::HeadOfQueue => TaskAttr::HeadOfQueue,
        I::Aca => TaskAttr::Aca,
    }
}
