//! One iSCSI connection (and its single-connection session): framing, the login phase hand-off,
//! and the full feature phase — CmdSN ordering, Data-Out gathering with R2Ts, Data-In and status,
//! task management, text, NOP and logout.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::Arc;

use bytes::Bytes;

use crate::login::{Login, LoginOutcome, LoginReply, LOGIN_MAX_DATA};
use crate::output::{self, Output};
use crate::pdu::{
    self, AsyncMessageHeader, Bhs, DataInHeader, DataOutHeader, Digests, LoginRequestHeader,
    LoginResponseHeader, LogoutRequestHeader, LogoutResponseHeader, Opcode, Pdu,
    ReadyToTransferHeader, RejectHeader, RejectReason, ReplyHeader, RequestHeader,
    ScsiCommandHeader, ScsiResponseHeader, StatusSn, TaskManagementRequestHeader,
    TaskManagementResponseHeader, BHS_LEN, RESERVED_TAG,
};
use crate::text::{self, SessionType, MAX_TEXT_LEN};
use crate::{
    Authority, CommandResult, Event, IncomingCommand, ProtocolError, SessionInfo, TargetSettings,
    TaskAttr, TaskManagement, TmfFunction, TmfResponse,
};

/// Cap on Data-Out bytes a connection may have solicited (via R2T) for commands that have not
/// completed yet: the reservation is held from the first R2T until the command's status is
/// sent (or the task is dropped), so it bounds Data-Out being gathered and Data-Out handed to
/// the server and still executing. Further R2T sequences wait until earlier tasks complete.
pub const MAX_SOLICITED_BYTES: u64 = 64 << 20;
/// Immediate SCSI commands (which bypass the CmdSN window) a connection may have outstanding;
/// more are rejected with "immediate command reject" (RFC 7143 §11.17.1). RFC 7143 §3.2.2.1
/// requires a target to take at least one.
pub const MAX_IMMEDIATE_TASKS: usize = 16;
/// Task management requests handed to the server and not yet answered; more get "function
/// rejected".
pub const MAX_PENDING_TMFS: usize = 16;
/// Seconds the initiator is given to log out after our Async Message (event 1).
const ASYNC_LOGOUT_SECONDS: u16 = 10;
/// SCSI status CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;

/// Sense keys and additional sense codes used by the core itself.
mod sense {
    pub const ILLEGAL_REQUEST: u8 = 0x05;
    pub const ABORTED_COMMAND: u8 = 0x0b;
    /// INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// PROTOCOL SERVICE CRC ERROR (a data digest failed).
    pub const CRC_ERROR: (u8, u8) = (0x47, 0x05);
    /// DATA PHASE ERROR (Data-Out out of sequence).
    pub const DATA_PHASE_ERROR: (u8, u8) = (0x4b, 0x00);

    /// Fixed-format sense data (SPC-4 §4.5.3).
    pub fn fixed(key: u8, (asc, ascq): (u8, u8)) -> Vec<u8> {
        let mut s = vec![0; 18];
        s[0] = 0x70;
        s[2] = key;
        s[7] = 10;
        s[12] = asc;
        s[13] = ascq;
        s
    }
}

enum Phase {
    Login(Box<Login>),
    FullFeature(Box<SessionInfo>),
}

/// A PDU (or placeholder) waiting for its CmdSN turn.
enum Ordered {
    /// A SCSI command: its task is already gathering data; ordering lets it proceed.
    Task(u32),
    Pdu(Pdu),
    /// A CmdSN consumed without anything left to run (rejected or aborted before arrival).
    Nothing,
}

/// One outstanding R2T.
struct R2t {
    ttt: u32,
    offset: u32,
    length: u32,
    received: u32,
    next_data_sn: u32,
}

/// A SCSI command known to the core: gathering Data-Out, or delivered and awaiting completion.
struct Task {
    lun: u64,
    lun_field: [u8; 8],
    cdb: Vec<u8>,
    attr: TaskAttr,
    cmd_sn: u32,
    immediate: bool,
    edtl: u32,
    read: bool,
    write: bool,
    /// Data-Out received so far, always contiguous from offset 0 (DataPDUInOrder=Yes).
    data: Vec<u8>,
    /// Total Data-Out to gather.
    expected_out: u32,
    /// Unsolicited Data-Out may still arrive (the command had F=0 and no final Data-Out yet).
    unsolicited_open: bool,
    unsolicited_end: u32,
    unsolicited_data_sn: u32,
    next_r2t_offset: u32,
    next_r2t_sn: u32,
    r2ts: Vec<R2t>,
    /// Bytes reserved against MAX_SOLICITED_BYTES, until the task completes.
    reserved: u64,
    ordered: bool,
    /// A non-immediate command that has run in CmdSN order: it occupies a slot of the CmdSN
    /// window until it completes, so MaxCmdSN bounds the commands outstanding at the target.
    holds_slot: bool,
    delivered: bool,
}

impl Task {
    fn data_complete(&self) -> bool {
        self.data.len() as u64 >= u64::from(self.expected_out)
    }
}

/// A task management request handed to the server.
struct PendingTmf {
    function: TmfFunction,
    lun: u64,
    referenced_task_tag: u32,
}

/// State of a multi-PDU Text exchange.
#[derive(Default)]
struct TextExchange {
    itt: u32,
    ttt: u32,
    request: Vec<u8>,
    reply_rest: Vec<u8>,
}

/// A sans-I/O iSCSI target connection.
pub struct Connection {
    settings: Arc<TargetSettings>,
    authority: Arc<dyn Authority>,
    phase: Phase,
    /// The header part of the PDU being received (BHS, AHS, header digest).
    rx: Vec<u8>,
    /// The rest of it (data segment, padding, data digest).
    rx_data: Vec<u8>,
    /// (header part, whole PDU) lengths, once the BHS is in.
    rx_frame_len: Option<(usize, usize)>,
    digests: Digests,
    events: VecDeque<Event>,
    output: Output,
    closing: bool,
    failed: bool,
    login_started: bool,
    cid: u16,
    stat_sn: u32,
    exp_cmd_sn: u32,
    held: HashMap<u32, Ordered>,
    /// Non-immediate commands past ExpCmdSN and not yet completed (see [`Task::holds_slot`]).
    slots_in_use: u32,
    tasks: HashMap<u32, Task>,
    r2t_waiting: VecDeque<u32>,
    solicited_bytes: u64,
    next_ttt: u32,
    pending_tmfs: HashMap<u32, PendingTmf>,
    ping_ttt: Option<u32>,
    text: Option<TextExchange>,
    logout_requested: bool,
}

impl Connection {
    pub fn new(settings: Arc<TargetSettings>, authority: Arc<dyn Authority>) -> Self {
        let login = Login::new(&settings);
        Self {
            settings,
            authority,
            phase: Phase::Login(Box::new(login)),
            rx: Vec::new(),
            rx_data: Vec::new(),
            rx_frame_len: None,
            digests: Digests::default(),
            events: VecDeque::new(),
            output: Output::new(),
            closing: false,
            failed: false,
            login_started: false,
            cid: 0,
            stat_sn: 0,
            exp_cmd_sn: 0,
            held: HashMap::new(),
            slots_in_use: 0,
            tasks: HashMap::new(),
            r2t_waiting: VecDeque::new(),
            solicited_bytes: 0,
            next_ttt: 1,
            pending_tmfs: HashMap::new(),
            ping_ttt: None,
            text: None,
            logout_requested: false,
        }
    }

    /// Feed bytes read from the socket. Err = fatal: the caller writes any pending output, then
    /// closes.
    pub fn receive(&mut self, mut bytes: &[u8]) -> Result<(), ProtocolError> {
        if self.failed {
            return Err(ProtocolError::Closed);
        }
        while !bytes.is_empty() && !self.closing {
            // The header part (BHS, AHS, header digest) collects in `rx`, the rest (data
            // segment, padding, data digest) in `rx_data`, sized once: the data segment is
            // copied once here and then owned by the command, never copied or regrown.
            let (header_len, frame_len) = self.rx_frame_len.unwrap_or((BHS_LEN, BHS_LEN));
            let (buf, want) = if self.rx.len() < header_len {
                (&mut self.rx, header_len)
            } else {
                (&mut self.rx_data, frame_len - header_len)
            };
            let take = want.saturating_sub(buf.len()).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            buf.extend_from_slice(head);
            bytes = rest;
            if buf.len() < want {
                continue;
            }
            if self.rx_frame_len.is_none() {
                let mut header = [0; BHS_LEN];
                header.copy_from_slice(&self.rx[..BHS_LEN]);
                let bhs = Bhs(header);
                let len = pdu::wire_len(&bhs, self.digests, self.rx_data_limit())
                    .inspect_err(|_| self.failed = true)?;
                let header_len = pdu::header_len(&bhs, self.digests);
                self.rx_frame_len = Some((header_len, len));
                self.rx.reserve_exact(header_len - BHS_LEN);
                self.rx_data = Vec::with_capacity(len - header_len);
                if len > BHS_LEN {
                    continue;
                }
            }
            if self.rx.len() < header_len || self.rx_data.len() < frame_len - header_len {
                continue;
            }
            self.rx_frame_len = None;
            let data = std::mem::take(&mut self.rx_data);
            let parsed = pdu::decode_parts(&self.rx, data, self.digests)
                .inspect_err(|_| self.failed = true)?;
            self.rx.clear();
            if let Err(e) = self.dispatch(parsed) {
                self.failed = true;
                self.closing = true;
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Move all pending outgoing bytes into `out` (appending; one copy, for tests and tools).
    pub fn take_output(&mut self, out: &mut Vec<u8>) {
        self.output.drain_into(out);
    }

    /// Take all pending output as it is held (READ data by reference, no copy).
    pub fn take_output_parts(&mut self) -> Output {
        std::mem::take(&mut self.output)
    }

    /// Fill `dst` with the pending output, front first, for a caller that writes it in place
    /// (`writev`); returns how many slices it filled. See [`Connection::consume_output`].
    pub fn output_slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        self.output.io_slices(dst)
    }

    /// Drop the first `n` bytes of pending output (they were written).
    pub fn consume_output(&mut self, n: usize) {
        self.output.consume(n);
    }

    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// True while the connection cannot make progress without more bytes from the initiator:
    /// a PDU is partly received, a command waits for Data-Out (solicited or unsolicited), or
    /// a CmdSN gap holds later commands back. The server bounds how long this may last
    /// without input, so a stalled initiator cannot pin what those hold. (A half-done text
    /// exchange holds at most a few KiB and does not count.)
    pub fn is_waiting_for_initiator(&self) -> bool {
        !self.rx.is_empty()
            || !self.held.is_empty()
            || self
                .tasks
                .values()
                .any(|t| !t.delivered && (t.unsolicited_open || !t.r2ts.is_empty()))
    }

    /// Commands received and not yet completed (gathering data, waiting for their CmdSN turn,
    /// or handed over and executing).
    pub fn outstanding_commands(&self) -> usize {
        self.tasks.len()
    }

    /// True after a Logout response has been queued or a fatal error: flush output, then close.
    pub fn is_closing(&self) -> bool {
        self.closing || self.failed
    }

    /// Completes a delivered command: Data-In, then status (collapsed into the last Data-In when
    /// there is no sense data). Unknown or aborted ITTs are ignored.
    pub fn complete_command(&mut self, itt: u32, result: CommandResult) {
        match self.tasks.get(&itt) {
            Some(task) if task.delivered => {}
            _ => return,
        }
        let Some(task) = self.remove_task(itt) else {
            return;
        };
        let Phase::FullFeature(info) = &self.phase else {
            return;
        };
        let max_burst = info.params.max_burst_length.max(512) as usize;
        let max_segment = (info.params.initiator_max_recv_data_segment_length as usize)
            .min(max_burst)
            .max(512);

        let mut data_in = if task.read {
            result.data_in
        } else {
            Vec::new()
        };
        let edtl = task.edtl as usize;
        let (mut overflow, mut underflow, mut residual) = (false, false, 0u32);
        if task.read {
            if data_in.len() > edtl {
                overflow = true;
                residual = clamp_u32(data_in.len() - edtl);
                // A copy, not `truncate`: the data leaves by reference, and a `Bytes` made
                // from a truncated Vec keeps its whole allocation alive until the socket has
                // taken the short part. A READ of 32 MiB with an expected length of 8 KiB
                // would otherwise hold 32 MiB against a memory budget charged for 8 KiB.
                data_in = data_in[..edtl].to_vec();
            } else if data_in.len() < edtl {
                underflow = true;
                residual = clamp_u32(edtl - data_in.len());
            }
        } else if task.write {
            let described = result.data_out_expected;
            if described > edtl {
                overflow = true;
                residual = clamp_u32(described - edtl);
            } else if described < edtl {
                underflow = true;
                residual = clamp_u32(edtl - described);
            }
        }

        // Status may ride on the last Data-In only without an exception (RFC 7143 §11.7.4):
        // GOOD, CONDITION MET or INTERMEDIATE-CONDITION MET, and no sense data.
        let collapse = result.sense.is_empty()
            && !data_in.is_empty()
            && matches!(result.status, 0x00 | 0x04 | 0x10);
        let len = data_in.len();
        // Long data leaves by reference (no copy into the output); short data is copied in,
        // which costs less than sharing it (see [`output::SHARE_MIN`]).
        let shared = (len >= output::SHARE_MIN).then(|| Bytes::from(std::mem::take(&mut data_in)));
        let mut data_sn = 0u32;
        let mut offset = 0usize;
        while offset < len {
            let burst_end = (offset / max_burst + 1) * max_burst;
            let end = (offset + max_segment).min(burst_end).min(len);
            let last = end == len;
            let with_status = last && collapse;
            let header = DataInHeader {
                final_bit: last || end == burst_end,
                ack: false,
                overflow: with_status && overflow,
                underflow: with_status && underflow,
                has_status: with_status,
                status: if with_status { result.status } else { 0 },
                lun: task.lun_field,
                itt,
                ttt: RESERVED_TAG,
                sn: self.status_sn(with_status),
                data_sn,
                buffer_offset: clamp_u32(offset),
                residual_count: if with_status { residual } else { 0 },
            };
            match &shared {
                Some(all) => self.send_shared(header.to_bhs(), all.slice(offset..end)),
                None => self.send_copied(header.to_bhs(), &data_in[offset..end]),
            }
            data_sn = data_sn.wrapping_add(1);
            offset = end;
        }
        if collapse {
            return;
        }
        let mut sense_data = Vec::new();
        if !result.sense.is_empty() {
            let max_sense = max_segment.saturating_sub(2).min(u16::MAX as usize);
            let sense = result.sense.get(..max_sense).unwrap_or(&result.sense);
            sense_data.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            sense_data.extend_from_slice(sense);
        }
        let header = ScsiResponseHeader {
            bidi_overflow: false,
            bidi_underflow: false,
            overflow,
            underflow,
            response: 0,
            status: result.status,
            itt,
            snack_tag: 0,
            sn: self.status_sn(true),
            exp_data_sn: data_sn.wrapping_add(task.next_r2t_sn),
            bidi_residual_count: 0,
            residual_count: residual,
        };
        self.send(Pdu::with_data(header.to_bhs(), sense_data));
    }

    /// Answers a task management request delivered as [`Event::TaskManagement`].
    pub fn complete_task_management(&mut self, itt: u32, response: TmfResponse) {
        let Some(tmf) = self.pending_tmfs.remove(&itt) else {
            return;
        };
        let mut response = response;
        if response == TmfResponse::FunctionComplete
            && tmf.function == TmfFunction::AbortTask
            && !self.tasks.contains_key(&tmf.referenced_task_tag)
        {
            // The task completed (status sent) while the abort was being handled.
            response = TmfResponse::TaskDoesNotExist;
        }
        if response == TmfResponse::FunctionComplete {
            // Aborted tasks get no response: forget them so a late completion is discarded.
            let aborted: Vec<u32> = self
                .tasks
                .iter()
                .filter(|(task_itt, task)| match tmf.function {
                    TmfFunction::AbortTask => **task_itt == tmf.referenced_task_tag,
                    TmfFunction::AbortTaskSet
                    | TmfFunction::ClearTaskSet
                    | TmfFunction::LogicalUnitReset => task.lun == tmf.lun,
                    TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => true,
                    _ => false,
                })
                .map(|(task_itt, _)| *task_itt)
                .collect();
            for task_itt in aborted {
                self.drop_task(task_itt);
            }
        }
        let header = TaskManagementResponseHeader {
            response: response.code(),
            itt,
            sn: self.status_sn(true),
        };
        self.send(Pdu::new(header.to_bhs()));
    }

    /// Keepalive: queue a NOP-In that asks for a NOP-Out reply. Returns false if the previous
    /// ping is unanswered.
    pub fn ping(&mut self) -> bool {
        if !matches!(self.phase, Phase::FullFeature(_)) || self.is_closing() {
            return true;
        }
        if self.ping_ttt.is_some() {
            return false;
        }
        let ttt = self.alloc_ttt();
        self.ping_ttt = Some(ttt);
        let header = ReplyHeader {
            opcode: Opcode::NopIn,
            final_bit: true,
            cont: false,
            lun: [0; 8],
            itt: RESERVED_TAG,
            ttt,
            sn: self.status_sn(false),
        };
        self.send(Pdu::new(header.to_bhs()));
        true
    }

    /// Ask the initiator to log out (Async Message, iSCSI event 1), e.g. on shutdown. During
    /// login there is no session to log out of, so the connection just closes.
    pub fn request_logout(&mut self) {
        if !matches!(self.phase, Phase::FullFeature(_)) {
            self.closing = true;
            return;
        }
        if self.logout_requested || self.is_closing() {
            return;
        }
        self.logout_requested = true;
        let header = AsyncMessageHeader {
            lun: [0; 8],
            sn: self.status_sn(true),
            event: 1,
            vendor_code: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: ASYNC_LOGOUT_SECONDS,
        };
        self.send(Pdu::new(header.to_bhs()));
    }

    // ---- plumbing ----

    fn rx_data_limit(&self) -> u32 {
        match &self.phase {
            Phase::Login(_) => LOGIN_MAX_DATA as u32,
            Phase::FullFeature(info) => info.params.target_max_recv_data_segment_length,
        }
    }

    /// Commands the window admits beyond ExpCmdSN: the queue depth less the commands still
    /// outstanding. MaxCmdSN = ExpCmdSN + this - 1 never decreases: a command that runs in
    /// order advances ExpCmdSN and takes a slot, one that completes frees its slot.
    fn window_size(&self) -> u32 {
        self.settings
            .queue_depth
            .max(1)
            .saturating_sub(self.slots_in_use)
    }

    fn max_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
            .wrapping_add(self.window_size())
            .wrapping_sub(1)
    }

    /// Sequence numbers for an outgoing PDU; `consume` advances StatSN (status-bearing PDUs).
    fn status_sn(&mut self, consume: bool) -> StatusSn {
        let sn = StatusSn {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        };
        if consume {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        sn
    }

    fn send(&mut self, pdu: Pdu) {
        let digests = self.digests;
        self.output.encode(|out| pdu.encode(digests, out));
    }

    /// Send a PDU without AHS whose data segment is a part of a buffer held elsewhere: a
    /// long one goes out by reference, a short one is copied in (see [`output::SHARE_MIN`]).
    fn send_shared(&mut self, bhs: Bhs, data: Bytes) {
        if data.len() < output::SHARE_MIN {
            return self.send_copied(bhs, &data);
        }
        let digests = self.digests;
        self.output
            .encode(|out| pdu::encode_header(&bhs, &[], data.len(), digests, out));
        self.output.share(data.clone());
        self.output
            .encode(|out| pdu::encode_trailer(&data, digests, out));
    }

    /// Send a PDU without AHS whose data segment is copied from `data`.
    fn send_copied(&mut self, bhs: Bhs, data: &[u8]) {
        let digests = self.digests;
        self.output.encode(|out| {
            pdu::encode_header(&bhs, &[], data.len(), digests, out);
            out.extend_from_slice(data);
            pdu::encode_trailer(data, digests, out);
        });
    }

    fn alloc_ttt(&mut self) -> u32 {
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        ttt
    }

    fn reject(&mut self, bhs: &Bhs, reason: RejectReason) {
        let header = RejectHeader {
            reason,
            sn: self.status_sn(true),
            data_sn: 0,
        };
        self.send(Pdu::with_data(header.to_bhs(), bhs.0.to_vec()));
    }

    /// Serial-number comparison (RFC 1982): is `sn` within [ExpCmdSN, MaxCmdSN]?
    fn in_window(&self, sn: u32) -> bool {
        sn.wrapping_sub(self.exp_cmd_sn) < self.window_size()
    }

    fn session(&self) -> Option<&SessionInfo> {
        match &self.phase {
            Phase::FullFeature(info) => Some(info),
            Phase::Login(_) => None,
        }
    }

    fn dispatch(&mut self, pdu: Pdu) -> Result<(), ProtocolError> {
        if let Phase::Login(_) = self.phase {
            return self.on_login(pdu);
        }
        match pdu.bhs.opcode() {
            Opcode::ScsiCommand => self.on_scsi_command(pdu),
            Opcode::DataOut => self.on_data_out(pdu),
            Opcode::NopOut => self.on_nop_out(pdu),
            Opcode::TextRequest | Opcode::TaskManagementRequest | Opcode::LogoutRequest => {
                if !pdu.data_digest_ok {
                    self.reject(&pdu.bhs, RejectReason::DataDigestError);
                } else {
                    self.sequence(pdu.bhs.immediate(), pdu.bhs.u32_at(24), Ordered::Pdu(pdu));
                }
            }
            Opcode::Snack => self.reject(&pdu.bhs, RejectReason::SnackReject),
            Opcode::LoginRequest => self.reject(&pdu.bhs, RejectReason::ProtocolError),
            _ => self.reject(&pdu.bhs, RejectReason::CommandNotSupported),
        }
        Ok(())
    }

    // ---- login ----

    fn on_login(&mut self, pdu: Pdu) -> Result<(), ProtocolError> {
        if pdu.bhs.opcode() != Opcode::LoginRequest {
            return Err(ProtocolError::Violation(
                "non-login PDU before login completed",
            ));
        }
        let req = LoginRequestHeader::parse(&pdu.bhs);
        if !self.login_started {
            self.login_started = true;
            self.exp_cmd_sn = req.cmd_sn;
            self.stat_sn = req.exp_stat_sn;
            self.cid = req.cid;
        }
        let Phase::Login(login) = &mut self.phase else {
            return Ok(());
        };
        let outcome = login.on_request(&req, &pdu.data, &self.settings, &*self.authority);
        match outcome {
            LoginOutcome::Continue(reply) => {
                self.send_login_reply(&req, reply);
                Ok(())
            }
            LoginOutcome::Failed(reply) => {
                let status = reply.status;
                self.send_login_reply(&req, reply);
                self.closing = true;
                Err(ProtocolError::LoginFailed(status))
            }
            LoginOutcome::Complete(reply, info) => {
                // The final response goes out without digests; everything after uses them.
                self.send_login_reply(&req, reply);
                self.digests = Digests {
                    header: info.params.header_digest,
                    data: info.params.data_digest,
                };
                self.events.push_back(Event::LoggedIn(info.clone()));
                self.phase = Phase::FullFeature(Box::new(info));
                Ok(())
            }
        }
    }

    fn send_login_reply(&mut self, req: &LoginRequestHeader, reply: LoginReply) {
        let (status_class, status_detail) = reply.status.code();
        let header = LoginResponseHeader {
            transit: reply.transit,
            cont: reply.cont,
            csg: reply.csg,
            nsg: reply.nsg,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: reply.tsih,
            itt: req.itt,
            sn: self.status_sn(true),
            status_class,
            status_detail,
        };
        self.send(Pdu::with_data(header.to_bhs(), reply.data));
    }

    // ---- CmdSN ordering ----

    /// Runs `item` now if immediate, otherwise in CmdSN order; out-of-window and duplicate
    /// CmdSNs are dropped silently (RFC 7143 §4.2.2.1).
    fn sequence(&mut self, immediate: bool, cmd_sn: u32, item: Ordered) {
        if immediate {
            self.run_ordered(item);
            return;
        }
        if !self.in_window(cmd_sn) || self.held.contains_key(&cmd_sn) {
            if let Ordered::Task(itt) = item {
                self.drop_task(itt);
            }
            return;
        }
        self.held.insert(cmd_sn, item);
        self.run_in_order();
    }

    /// Runs held items while the next expected CmdSN is present.
    fn run_in_order(&mut self) {
        while let Some(next) = self.held.remove(&self.exp_cmd_sn) {
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            self.run_ordered(next);
        }
    }

    /// Whether a non-immediate command PDU would be accepted by [`Self::sequence`].
    fn acceptable(&self, immediate: bool, cmd_sn: u32) -> bool {
        immediate || (self.in_window(cmd_sn) && !self.held.contains_key(&cmd_sn))
    }

    fn run_ordered(&mut self, item: Ordered) {
        match item {
            Ordered::Task(itt) => {
                if let Some(task) = self.tasks.get_mut(&itt) {
                    task.ordered = true;
                    if !task.immediate && !task.holds_slot {
                        task.holds_slot = true;
                        self.slots_in_use += 1;
                    }
                    self.advance_task(itt);
                }
            }
            Ordered::Pdu(pdu) => match pdu.bhs.opcode() {
                Opcode::TextRequest => self.run_text(&pdu),
                Opcode::TaskManagementRequest => self.run_tmf(&pdu),
                Opcode::LogoutRequest => self.run_logout(&pdu),
                Opcode::NopOut => self.run_nop(&pdu),
                _ => {}
            },
            Ordered::Nothing => {}
        }
    }

    // ---- SCSI commands and Data-Out ----

    fn on_scsi_command(&mut self, pdu: Pdu) {
        let h = ScsiCommandHeader::parse(&pdu.bhs);
        if !self.acceptable(h.immediate, h.cmd_sn) {
            return;
        }
        if !pdu.data_digest_ok {
            // The initiator resends the command with the same CmdSN.
            self.reject(&pdu.bhs, RejectReason::DataDigestError);
            return;
        }
        let Some(info) = self.session() else {
            return;
        };
        let params = info.params.clone();
        let discovery = info.session_type == SessionType::Discovery;
        let reason = if discovery {
            Some(RejectReason::ProtocolError)
        } else if self.tasks.contains_key(&h.itt) || h.itt == RESERVED_TAG {
            Some(RejectReason::TaskInProgress)
        } else if h.immediate
            && self.tasks.values().filter(|t| t.immediate).count() >= MAX_IMMEDIATE_TASKS
        {
            Some(RejectReason::ImmediateCommandRejected)
        } else if !pdu.data.is_empty()
            && (!h.write
                || !params.immediate_data
                || pdu.data.len() as u64 > u64::from(h.expected_data_transfer_length))
        {
            Some(RejectReason::ProtocolError)
        } else if h.write && !h.final_bit && params.initial_r2t {
            // Unsolicited Data-Out is not allowed when InitialR2T=Yes.
            Some(RejectReason::ProtocolError)
        } else {
            None
        };
        let extended_cdb = match extended_cdb(&pdu.ahs) {
            Ok(ext) => ext,
            Err(()) => {
                self.reject(&pdu.bhs, RejectReason::InvalidPduField);
                self.sequence(h.immediate, h.cmd_sn, Ordered::Nothing);
                return;
            }
        };
        if let Some(reason) = reason {
            self.reject(&pdu.bhs, reason);
            self.sequence(h.immediate, h.cmd_sn, Ordered::Nothing);
            return;
        }
        if h.expected_data_transfer_length > self.settings.max_transfer_length {
            // Answer without reading the data; any unsolicited Data-Out is discarded as it
            // refers to no task.
            self.send_check_condition(
                h.itt,
                sense::fixed(sense::ILLEGAL_REQUEST, sense::INVALID_FIELD_IN_CDB),
            );
            self.sequence(h.immediate, h.cmd_sn, Ordered::Nothing);
            return;
        }
        let mut cdb = h.cdb.to_vec();
        cdb.extend_from_slice(&extended_cdb);
        let expected_out = if h.write {
            h.expected_data_transfer_length
        } else {
            0
        };
        let unsolicited_end = expected_out.min(params.first_burst_length);
        if pdu.data.len() as u64 > u64::from(unsolicited_end) {
            self.reject(&pdu.bhs, RejectReason::ProtocolError);
            self.sequence(h.immediate, h.cmd_sn, Ordered::Nothing);
            return;
        }
        let received = pdu.data.len() as u32;
        let unsolicited_open = h.write && !h.final_bit && received < unsolicited_end;
        let task = Task {
            lun: pdu::decode_lun(h.lun),
            lun_field: h.lun,
            cdb,
            attr: TaskAttr::from_wire(h.attr),
            cmd_sn: h.cmd_sn,
            immediate: h.immediate,
            edtl: h.expected_data_transfer_length,
            read: h.read,
            write: h.write,
            data: pdu.data,
            expected_out,
            unsolicited_open,
            unsolicited_end,
            unsolicited_data_sn: 0,
            next_r2t_offset: received,
            next_r2t_sn: 0,
            r2ts: Vec::new(),
            reserved: 0,
            ordered: false,
            holds_slot: false,
            delivered: false,
        };
        self.tasks.insert(h.itt, task);
        self.sequence(h.immediate, h.cmd_sn, Ordered::Task(h.itt));
    }

    fn send_check_condition(&mut self, itt: u32, sense: Vec<u8>) {
        let mut data = (sense.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&sense);
        let header = ScsiResponseHeader {
            bidi_overflow: false,
            bidi_underflow: false,
            overflow: false,
            underflow: false,
            response: 0,
            status: CHECK_CONDITION,
            itt,
            snack_tag: 0,
            sn: self.status_sn(true),
            exp_data_sn: 0,
            bidi_residual_count: 0,
            residual_count: 0,
        };
        self.send(Pdu::with_data(header.to_bhs(), data));
    }

    fn on_data_out(&mut self, pdu: Pdu) {
        let h = DataOutHeader::parse(&pdu.bhs);
        let Some(task) = self.tasks.get_mut(&h.itt) else {
            // Data for a task we failed, aborted or never accepted: dump it (RFC 7143 §7.1.3).
            return;
        };
        if task.delivered {
            self.reject(&pdu.bhs, RejectReason::ProtocolError);
            return;
        }
        if !pdu.data_digest_ok {
            self.reject(&pdu.bhs, RejectReason::DataDigestError);
            self.fail_task(
                h.itt,
                sense::fixed(sense::ABORTED_COMMAND, sense::CRC_ERROR),
            );
            return;
        }
        match accept_data_out(task, &h, pdu.data) {
            Ok(()) => self.advance_task(h.itt),
            Err(reason) => {
                self.reject(&pdu.bhs, reason);
                self.fail_task(
                    h.itt,
                    sense::fixed(sense::ABORTED_COMMAND, sense::DATA_PHASE_ERROR),
                );
            }
        }
    }

    /// Moves a task forward: deliver it once ordered with all data, else solicit more.
    fn advance_task(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        if task.delivered || !task.ordered {
            return;
        }
        if task.data_complete() {
            // The Data-Out reservation stays with the task until it completes.
            task.delivered = true;
            let command = IncomingCommand {
                itt,
                lun: task.lun,
                cdb: std::mem::take(&mut task.cdb),
                attr: task.attr,
                data_out: std::mem::take(&mut task.data),
                expected_data_transfer_length: task.edtl,
                read: task.read,
                write: task.write,
            };
            self.events.push_back(Event::Command(command));
        } else if !task.unsolicited_open {
            self.solicit(itt);
        }
    }

    fn release(&mut self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.solicited_bytes = self.solicited_bytes.saturating_sub(bytes);
        // Let deferred tasks start their R2T sequences now that there is room.
        let waiting = std::mem::take(&mut self.r2t_waiting);
        for itt in waiting {
            self.solicit(itt);
        }
    }

    /// Issues R2Ts for a task, up to MaxOutstandingR2T, within the connection's budget.
    fn solicit(&mut self, itt: u32) {
        let Some(info) = self.session() else {
            return;
        };
        let max_burst = info.params.max_burst_length.max(512);
        let max_outstanding = info.params.max_outstanding_r2t.max(1) as usize;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        if task.reserved == 0 && task.next_r2t_offset < task.expected_out {
            let need = u64::from(task.expected_out - task.next_r2t_offset);
            // Whole-task reservations guarantee progress: the first task always gets its share.
            if self.solicited_bytes > 0 && self.solicited_bytes + need > MAX_SOLICITED_BYTES {
                if !self.r2t_waiting.contains(&itt) {
                    self.r2t_waiting.push_back(itt);
                }
                return;
            }
            task.reserved = need;
            self.solicited_bytes += need;
            // Room for the whole transfer at once (within the budget just reserved): the
            // Data-Out payloads are appended without the buffer regrowing and copying.
            task.data.reserve_exact(need as usize);
        }
        let mut r2ts = Vec::new();
        while task.r2ts.len() < max_outstanding && task.next_r2t_offset < task.expected_out {
            let length = max_burst.min(task.expected_out - task.next_r2t_offset);
            let ttt = {
                let t = self.next_ttt;
                self.next_ttt = match self.next_ttt.wrapping_add(1) {
                    RESERVED_TAG | 0 => 1,
                    n => n,
                };
                t
            };
            task.r2ts.push(R2t {
                ttt,
                offset: task.next_r2t_offset,
                length,
                received: 0,
                next_data_sn: 0,
            });
            r2ts.push((ttt, task.next_r2t_sn, task.next_r2t_offset, length));
            task.next_r2t_sn = task.next_r2t_sn.wrapping_add(1);
            task.next_r2t_offset += length;
        }
        let lun = task.lun_field;
        for (ttt, r2t_sn, offset, length) in r2ts {
            let header = ReadyToTransferHeader {
                lun,
                itt,
                ttt,
                sn: self.status_sn(false),
                r2t_sn,
                buffer_offset: offset,
                desired_length: length,
            };
            self.send(Pdu::new(header.to_bhs()));
        }
    }

    /// Ends a task still gathering data with CHECK CONDITION.
    fn fail_task(&mut self, itt: u32, sense: Vec<u8>) {
        self.drop_task(itt);
        self.send_check_condition(itt, sense);
    }

    /// Forgets a task, releasing its budget and its place in the CmdSN queue.
    fn drop_task(&mut self, itt: u32) {
        let Some(task) = self.remove_task(itt) else {
            return;
        };
        if !task.ordered && !task.immediate {
            if let Some(slot) = self.held.get_mut(&task.cmd_sn) {
                *slot = Ordered::Nothing;
            }
        }
    }

    /// Removes a task that completed or was dropped: frees its CmdSN slot and its Data-Out
    /// reservation (which may start deferred R2T sequences).
    fn remove_task(&mut self, itt: u32) -> Option<Task> {
        let mut task = self.tasks.remove(&itt)?;
        self.r2t_waiting.retain(|w| *w != itt);
        if task.holds_slot {
            self.slots_in_use = self.slots_in_use.saturating_sub(1);
        }
        self.release(std::mem::take(&mut task.reserved));
        Some(task)
    }

    // ---- NOP, text, task management, logout ----

    fn on_nop_out(&mut self, pdu: Pdu) {
        let h = RequestHeader::parse(&pdu.bhs);
        if h.ttt != RESERVED_TAG && Some(h.ttt) == self.ping_ttt {
            self.ping_ttt = None;
        }
        if h.itt == RESERVED_TAG {
            // An answer to our NOP-In (or a pure ExpStatSN update): no reply.
            return;
        }
        if !pdu.data_digest_ok {
            self.reject(&pdu.bhs, RejectReason::DataDigestError);
            return;
        }
        self.sequence(h.immediate, h.cmd_sn, Ordered::Pdu(pdu));
    }

    fn run_nop(&mut self, pdu: &Pdu) {
        let h = RequestHeader::parse(&pdu.bhs);
        let limit = self.session().map_or(LOGIN_MAX_DATA, |s| {
            s.params.initiator_max_recv_data_segment_length as usize
        });
        let echo = pdu.data.get(..limit).unwrap_or(&pdu.data).to_vec();
        let header = ReplyHeader {
            opcode: Opcode::NopIn,
            final_bit: true,
            cont: false,
            lun: h.lun,
            itt: h.itt,
            ttt: RESERVED_TAG,
            sn: self.status_sn(true),
        };
        self.send(Pdu::with_data(header.to_bhs(), echo));
    }

    fn run_text(&mut self, pdu: &Pdu) {
        let h = RequestHeader::parse(&pdu.bhs);
        let mut exchange = match self.text.take() {
            // A continuation of the exchange in progress.
            Some(x) if h.ttt != RESERVED_TAG && h.ttt == x.ttt && h.itt == x.itt => x,
            _ if h.ttt != RESERVED_TAG => {
                self.reject(&pdu.bhs, RejectReason::InvalidPduField);
                return;
            }
            // A new exchange (an unfinished one is abandoned).
            _ => TextExchange {
                itt: h.itt,
                ttt: RESERVED_TAG,
                ..TextExchange::default()
            },
        };
        if !exchange.reply_rest.is_empty() {
            if !pdu.data.is_empty() {
                self.reject(&pdu.bhs, RejectReason::ProtocolError);
                return;
            }
            self.send_text_chunk(h.lun, exchange);
            return;
        }
        if exchange.request.len().saturating_add(pdu.data.len()) > MAX_TEXT_LEN {
            self.reject(&pdu.bhs, RejectReason::ProtocolError);
            return;
        }
        exchange.request.extend_from_slice(&pdu.data);
        if h.cont {
            // Ask for the rest of the request with an empty response.
            exchange.ttt = self.alloc_ttt();
            let header = ReplyHeader {
                opcode: Opcode::TextResponse,
                final_bit: false,
                cont: false,
                lun: h.lun,
                itt: h.itt,
                ttt: exchange.ttt,
                sn: self.status_sn(true),
            };
            self.text = Some(exchange);
            self.send(Pdu::new(header.to_bhs()));
            return;
        }
        let Ok(pairs) = text::parse(&exchange.request) else {
            self.reject(&pdu.bhs, RejectReason::InvalidPduField);
            return;
        };
        let mut reply: Vec<(String, String)> = Vec::new();
        for (key, value) in &pairs {
            match key.as_str() {
                "SendTargets" => self.send_targets(value, &mut reply),
                "MaxRecvDataSegmentLength" => {
                    // Declarative, may be re-declared in full feature phase.
                    if let Some(v) =
                        text::parse_number(value).filter(|v| (512..1 << 24).contains(v))
                    {
                        if let Phase::FullFeature(info) = &mut self.phase {
                            info.params.initiator_max_recv_data_segment_length = v as u32;
                        }
                    } else {
                        reply.push((key.clone(), "Reject".into()));
                    }
                }
                k if k.starts_with("X-") || k.starts_with("X#") => {
                    reply.push((key.clone(), "NotUnderstood".into()))
                }
                // Everything else is leading-only or login-only: not renegotiable here.
                _ => reply.push((key.clone(), "Reject".into())),
            }
        }
        exchange.request = Vec::new();
        exchange.reply_rest = text::encode(&reply);
        self.send_text_chunk(h.lun, exchange);
    }

    /// Sends the next piece of a text reply, keeping the exchange open if more remains.
    fn send_text_chunk(&mut self, lun: [u8; 8], mut exchange: TextExchange) {
        let limit = self
            .session()
            .map_or(LOGIN_MAX_DATA, |s| {
                s.params.initiator_max_recv_data_segment_length as usize
            })
            .max(512);
        let rest = exchange
            .reply_rest
            .split_off(limit.min(exchange.reply_rest.len()));
        let chunk = std::mem::replace(&mut exchange.reply_rest, rest);
        let more = !exchange.reply_rest.is_empty();
        exchange.ttt = if more { self.alloc_ttt() } else { RESERVED_TAG };
        let header = ReplyHeader {
            opcode: Opcode::TextResponse,
            final_bit: !more,
            cont: more,
            lun,
            itt: exchange.itt,
            ttt: exchange.ttt,
            sn: self.status_sn(true),
        };
        self.send(Pdu::with_data(header.to_bhs(), chunk));
        if more {
            self.text = Some(exchange);
        }
    }

    fn send_targets(&self, value: &str, reply: &mut Vec<(String, String)>) {
        let Some(info) = self.session() else {
            return;
        };
        let targets = self.authority.send_targets(&info.initiator_name);
        let current = info.target_name.as_deref();
        let discovery = info.session_type == SessionType::Discovery;
        for target in targets {
            let wanted = match value {
                "All" if discovery => true,
                // In a normal session only the session's own target is reported.
                "All" | "" => Some(target.name.as_str()) == current,
                name => target.name == name && (discovery || Some(name) == current),
            };
            if !wanted {
                continue;
            }
            reply.push(("TargetName".into(), target.name.clone()));
            for address in target.addresses {
                reply.push(("TargetAddress".into(), address));
            }
        }
    }

    fn run_tmf(&mut self, pdu: &Pdu) {
        let h = TaskManagementRequestHeader::parse(&pdu.bhs);
        let function = TmfFunction::from_code(h.function);
        let lun = pdu::decode_lun(h.lun);
        let discovery = self
            .session()
            .is_some_and(|s| s.session_type == SessionType::Discovery);
        if discovery {
            self.send_tmf_response(h.itt, TmfResponse::NotSupported);
            return;
        }
        if self.pending_tmfs.contains_key(&h.itt) {
            self.reject(&pdu.bhs, RejectReason::TaskInProgress);
            return;
        }
        if self.pending_tmfs.len() >= MAX_PENDING_TMFS {
            self.send_tmf_response(h.itt, TmfResponse::Rejected);
            return;
        }
        let referenced = h.referenced_task_tag;
        match function {
            TmfFunction::AbortTask => {
                if self.tasks.get(&referenced).is_some_and(|t| !t.delivered) {
                    // Still in the core (waiting for data or its CmdSN turn): drop it here.
                    self.drop_task(referenced);
                    self.send_tmf_response(h.itt, TmfResponse::FunctionComplete);
                    return;
                }
                // RefCmdSN in the window means at or after ExpCmdSN: not received yet.
                if !self.tasks.contains_key(&referenced)
                    && self.in_window(h.ref_cmd_sn)
                    && !self.held.contains_key(&h.ref_cmd_sn)
                {
                    // The command never arrived: consume its CmdSN so it is ignored if it does
                    // (RFC 7143 §11.5.1).
                    self.held.insert(h.ref_cmd_sn, Ordered::Nothing);
                    self.send_tmf_response(h.itt, TmfResponse::FunctionComplete);
                    self.run_in_order();
                    return;
                }
                if !self.tasks.contains_key(&referenced) {
                    // Already completed (its response is out) or never existed. Claiming to
                    // have aborted it would contradict the status the initiator already has.
                    self.send_tmf_response(h.itt, TmfResponse::TaskDoesNotExist);
                    return;
                }
            }
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset
            | TmfFunction::TargetWarmReset
            | TmfFunction::TargetColdReset => {
                let whole_target = matches!(
                    function,
                    TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset
                );
                let undelivered: Vec<u32> = self
                    .tasks
                    .iter()
                    .filter(|(_, t)| !t.delivered && (whole_target || t.lun == lun))
                    .map(|(itt, _)| *itt)
                    .collect();
                for itt in undelivered {
                    self.drop_task(itt);
                }
            }
            _ => {}
        }
        self.pending_tmfs.insert(
            h.itt,
            PendingTmf {
                function,
                lun,
                referenced_task_tag: referenced,
            },
        );
        self.events.push_back(Event::TaskManagement(TaskManagement {
            itt: h.itt,
            function,
            lun,
            referenced_task_tag: referenced,
        }));
    }

    fn send_tmf_response(&mut self, itt: u32, response: TmfResponse) {
        let header = TaskManagementResponseHeader {
            response: response.code(),
            itt,
            sn: self.status_sn(true),
        };
        self.send(Pdu::new(header.to_bhs()));
    }

    fn run_logout(&mut self, pdu: &Pdu) {
        let h = LogoutRequestHeader::parse(&pdu.bhs);
        // Logout response codes (RFC 7143 §11.15.1).
        const CLOSED: u8 = 0;
        const CID_NOT_FOUND: u8 = 1;
        const RECOVERY_NOT_SUPPORTED: u8 = 2;
        let (response, closes) = match h.reason {
            0 => (CLOSED, true),
            1 if h.cid == self.cid => (CLOSED, true),
            1 => (CID_NOT_FOUND, false),
            2 => (RECOVERY_NOT_SUPPORTED, false),
            _ => {
                self.reject(&pdu.bhs, RejectReason::InvalidPduField);
                return;
            }
        };
        let header = LogoutResponseHeader {
            response,
            itt: h.itt,
            sn: self.status_sn(true),
            time2wait: 0,
            time2retain: 0,
        };
        self.send(Pdu::new(header.to_bhs()));
        if closes {
            self.closing = true;
            self.events.push_back(Event::LoggedOut);
        }
    }
}

/// Appends one Data-Out PDU to a task after checking TTT, DataSN and BufferOffset.
fn accept_data_out(task: &mut Task, h: &DataOutHeader, data: Vec<u8>) -> Result<(), RejectReason> {
    let len = u32::try_from(data.len()).map_err(|_| RejectReason::ProtocolError)?;
    let received = task.data.len() as u64;
    let end = u64::from(h.buffer_offset) + u64::from(len);
    if u64::from(h.buffer_offset) != received {
        return Err(RejectReason::InvalidPduField);
    }
    if h.ttt == RESERVED_TAG {
        if !task.unsolicited_open {
            return Err(RejectReason::ProtocolError);
        }
        if end > u64::from(task.unsolicited_end) || h.data_sn != task.unsolicited_data_sn {
            return Err(RejectReason::ProtocolError);
        }
        task.data.extend_from_slice(&data);
        task.unsolicited_data_sn = task.unsolicited_data_sn.wrapping_add(1);
        if h.final_bit || end == u64::from(task.unsolicited_end) {
            task.unsolicited_open = false;
            task.next_r2t_offset = task.data.len() as u32;
        }
        return Ok(());
    }
    let index = task
        .r2ts
        .iter()
        .position(|r| r.ttt == h.ttt)
        .ok_or(RejectReason::InvalidPduField)?;
    let r2t = &mut task.r2ts[index];
    let r2t_end = u64::from(r2t.offset) + u64::from(r2t.length);
    if u64::from(r2t.offset) + u64::from(r2t.received) != received
        || end > r2t_end
        || h.data_sn != r2t.next_data_sn
    {
        return Err(RejectReason::ProtocolError);
    }
    r2t.received += len;
    r2t.next_data_sn = r2t.next_data_sn.wrapping_add(1);
    let done = end == r2t_end;
    if h.final_bit && !done {
        return Err(RejectReason::ProtocolError);
    }
    task.data.extend_from_slice(&data);
    if done {
        task.r2ts.remove(index);
    }
    Ok(())
}

/// Extracts the extended CDB bytes from the AHS chain (RFC 7143 §11.3.5), skipping other types.
fn extended_cdb(mut ahs: &[u8]) -> Result<Vec<u8>, ()> {
    const EXTENDED_CDB: u8 = 1;
    let mut cdb = Vec::new();
    while !ahs.is_empty() {
        let [l0, l1, kind, ..] = *ahs else {
            return Err(());
        };
        let length = usize::from(u16::from_be_bytes([l0, l1]));
        // AHSLength counts the AHS-specific bytes, which start with one reserved byte.
        let total = pdu::padded(3 + length);
        let body = ahs.get(3..3 + length).ok_or(())?;
        if kind == EXTENDED_CDB {
            cdb.extend_from_slice(body.get(1..).unwrap_or_default());
        }
        ahs = ahs.get(total..).unwrap_or_default();
    }
    Ok(cdb)
}

fn clamp_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}
