//! One TCP connection: socket I/O around a sans-I/O [`Connection`], SCSI commands on the
//! executor's threads (which also send their responses), task management bookkeeping.
//!
//! `mod.rs` is the connection's loop (socket input, timers, polling) and what it shares with
//! the threads that complete its commands; `session.rs` the iSCSI session's state and what it
//! does with each event (commands, task management, logout); `task.rs` a command from its
//! receipt to its completion, and where it runs; `output.rs` the socket writer.

mod output;
mod session;
mod task;

use output::{write_output, Output, WRITE_SLICES};
use session::Session;
use task::{run_ready, LunTable, MappedUnits, Task};

use crate::array::MappedLun;
use crate::target::{ConnectionAuthority, Server, Timeouts};
use sliver_iscsi::{
    CommandResult, Connection, Event, IncomingCommand, SessionInfo, SessionType, TaskManagement,
    TmfFunction, TmfResponse,
};
use sliver_scsi::tmf::{self, TaskId, TaskSet, UnitTask};
use sliver_scsi::{CopyTargets, LogicalUnit, Nexus, Request, TaskAttr};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
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

/// What the connection loop and the threads that finish its commands share.
///
/// A command completes on the thread that executed it: that thread builds the response and,
/// when nothing is queued ahead of it, writes it to the socket itself (write-through commands
/// on the engine's group-commit thread, in rounds: [`Shared::announce_after_round`]). Handing
/// every result back to the connection loop cost a wake-up of a tokio worker per command, on
/// the round trip of every client that waits for each answer (docs/design.md).
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
    /// A round of answers will announce this connection's responses at its end.
    announcing: AtomicBool,
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
    fn new(session: Session, conn: Connection, writer: OwnedWriteHalf) -> Self {
        Shared {
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
            announcing: AtomicBool::new(false),
        }
    }

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
    /// connection's execution budget. In a round of answers ([`sliver_volume::answers`],
    /// write-through commands answered after one sync) the response waits for the round's end
    /// and goes out with the others of this connection ([`Shared::announce_after_round`]).
    fn complete(
        self: &Arc<Self>,
        itt: u32,
        id: TaskId,
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
        session.finish(conn, itt, id, result);
        if session.tasks.is_empty() {
            session.went_quiet = Some((std::time::Instant::now(), session.started));
        }
        held.push(permit);
        if sliver_volume::answers::running() {
            if !self.announcing.swap(true, Ordering::AcqRel) {
                let shared = self.clone();
                sliver_volume::answers::at_round_end(move || shared.announce_after_round());
            }
            return;
        }
        // With other commands of this connection still running, the loop writes: it gathers
        // the responses that complete meanwhile into one write instead of a system call per
        // response on the I/O threads.
        let quiet = session.tasks.is_empty();
        self.announce(&mut core, quiet);
    }

    /// Write the responses a round of answers left, all in one write (the round gathered
    /// them), and wake the loop only for what remains.
    fn announce_after_round(&self) {
        self.announcing.store(false, Ordering::Release);
        let mut core = self.lock();
        if core.ended {
            return;
        }
        // The initiator's quiet time starts now, when the answers leave, not when the last
        // of them was answered earlier in the round (the loop's polling pacing reads it).
        let session = &mut core.session;
        if session.tasks.is_empty() && session.went_quiet.is_some() {
            session.went_quiet = Some((std::time::Instant::now(), session.started));
        }
        self.announce(&mut core, true);
    }

    /// Write what the socket takes of the output now if `write`, let go of the budget of
    /// responses written, and wake the loop for what is left to it.
    fn announce(&self, core: &mut Core, write: bool) {
        let Core {
            session,
            conn,
            held,
            ..
        } = core;
        if write && !conn.is_closing() {
            self.write_direct(conn);
        }
        if !conn.has_output() {
            held.clear();
        }
        self.kick_if_needed(session, conn);
    }

    /// Wake the loop when a completion left it work. It also arms the stall timer when the
    /// completion released deferred R2Ts.
    fn kick_if_needed(&self, session: &Session, conn: &Connection) {
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
    let Some(Opened {
        shared,
        mut reader,
        kill,
        timeouts,
    }) = open(&server, stream, peer)
    else {
        return;
    };
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
        let quiet = quiet_since(&shared, &mut pacing);
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
            _ = &mut timer => match deadline_passed(wait, &timeouts, peer, &shared) {
                Some(pinged) => last_ping = pinged,
                None => break,
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
    close(&shared, out_tx, writer_task, writer_done).await;
    tracing::debug!(%peer, "connection closed");
}

/// What [`open`] set up for a connection's loop.
struct Opened {
    shared: Arc<Shared>,
    reader: OwnedReadHalf,
    /// Notified when a new login reinstates this connection's session.
    kill: Arc<Notify>,
    timeouts: Timeouts,
}

/// Set up a new connection: TCP keepalive on its socket, its protocol core and session, and
/// the wake-up of its loop by the end of another nexus's task it aborted. `None`: the
/// socket is already gone.
fn open(server: &Arc<Server>, stream: TcpStream, peer: SocketAddr) -> Option<Opened> {
    let local = stream.local_addr().ok()?;
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
    let (reader, writer) = stream.into_split();
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
    let shared = Arc::new(Shared::new(session, conn, writer));
    // Another nexus's task that a function of this session aborted has ended, on the thread
    // that ran it: the loop answers the function (`send_output`). Only a wake-up here, so
    // that no thread ever holds two connections' locks (two sessions resetting each other's
    // units at once would deadlock).
    let weak = Arc::downgrade(&shared);
    shared.lock().session.tasks.wake_with(move || {
        if let Some(shared) = weak.upgrade() {
            shared.kick.notify_one();
        }
    });
    Some(Opened {
        shared,
        reader,
        kill,
        timeouts,
    })
}

/// The commands started when a logged-in connection went quiet (nothing in flight, nothing
/// to write, nothing queued for the writer), or `None` while it is not. `pacing` first learns
/// when the connection went quiet if a completion saw that while the loop slept.
fn quiet_since(shared: &Shared, pacing: &mut crate::poll::Pacing) -> Option<u64> {
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
}

/// Act on the deadline `wait` when it passes: ping a silent initiator, returning when, or
/// say why the connection closes and return `None`.
fn deadline_passed(
    wait: Wait,
    timeouts: &Timeouts,
    peer: SocketAddr,
    shared: &Shared,
) -> Option<Instant> {
    match wait {
        Wait::Login(_) => {
            tracing::warn!(%peer, "no login within {:?}, closing", timeouts.login);
            None
        }
        Wait::Stalled(_) => {
            tracing::warn!(%peer, "initiator stalled for {:?} in the middle of a PDU or data transfer, closing",
                timeouts.stall);
            None
        }
        Wait::Idle(_) => {
            tracing::warn!(%peer, "nothing from the initiator for {:?} (pings unanswered), closing",
                timeouts.idle);
            None
        }
        Wait::Ping(_) => {
            let pinged = Instant::now();
            shared.lock().conn.ping();
            Some(pinged)
        }
    }
}

/// End a connection whose loop has stopped: late completions are dropped from now on, the
/// writer task (unless it is what failed, `writer_done`) writes what is left and finishes
/// before the FIN, and the session ends.
async fn close(
    shared: &Shared,
    out_tx: mpsc::Sender<Output>,
    writer_task: JoinHandle<()>,
    writer_done: bool,
) {
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
    // Nothing else of this connection is running, and its initiator waits for each answer.
    let waiting_alone = pacing.would_poll() && session.quick_running == ready.len();
    drop(core);
    run_ready(ready, waiting_alone);
}

/// Send what the connection has to say: a response to one command at a time goes to the
/// socket from here; what it does not take goes through the writer task, which waits for
/// the initiator to read (and resets a stalled one). `false`: the connection closes now.
async fn send_output(shared: &Arc<Shared>, out_tx: &mpsc::Sender<Output>) -> bool {
    let (out, close) = {
        let mut core = shared.lock();
        let Core { session, conn, .. } = &mut *core;
        session.answer_drained(conn);
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
