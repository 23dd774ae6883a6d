//! One iSCSI session over one TCP connection: login, pipelined commands, logout.

use crate::cdb::{self, BlockLimits, Capacity, LbaStatus, OutgoingCommand};
use crate::sense::{status, Sense, SenseKey};
use crate::url::IscsiUrl;
use crate::{Error, TaskFailure};
use sliver_iscsi::pdu::{
    self, encode_lun, AsyncMessageHeader, Bhs, DataInHeader, DataOutHeader, Digests,
    LoginRequestHeader, LoginResponseHeader, LogoutRequestHeader, LogoutResponseHeader, Opcode,
    Pdu, ReadyToTransferHeader, RejectHeader, ReplyHeader, RequestHeader, ScsiCommandHeader,
    ScsiResponseHeader, StatusSn, BHS_LEN, RESERVED_TAG, STAGE_FULL_FEATURE, STAGE_OPERATIONAL,
    STAGE_SECURITY,
};
use sliver_iscsi::{chap, text, LoginStatus};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// Default initiator name of sliver's tools.
pub const DEFAULT_INITIATOR_NAME: &str = "iqn.2026-11.dev.sliver:initiator";

/// Rounds of a login stage we go through before calling the target broken.
const MAX_LOGIN_ROUNDS: usize = 16;
/// Largest data segment we accept during login, whatever we declare later.
const LOGIN_DATA_LIMIT: u32 = 65_536;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 256 * 1024;

/// What we ask for at login.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub initiator_name: String,
    /// One-way CHAP (user, secret); overrides credentials in the URL.
    pub chap: Option<(String, String)>,
    /// The MaxRecvDataSegmentLength we declare (512..=16777215).
    pub max_recv_data_segment_length: u32,
    /// Our MaxBurstLength offer.
    pub max_burst_length: u32,
    /// Our FirstBurstLength offer.
    pub first_burst_length: u32,
    /// Our ImmediateData offer (the result is the AND of both sides).
    pub immediate_data: bool,
    /// Our InitialR2T offer (the result is the OR of both sides).
    pub initial_r2t: bool,
    /// How long to wait for the target before giving up on the connection.
    pub timeout: Duration,
    /// The address to connect from (default: the system's choice); tests log in from
    /// 127.0.0.2 and the like to be another source on one machine.
    pub local_address: Option<std::net::IpAddr>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            initiator_name: DEFAULT_INITIATOR_NAME.to_owned(),
            chap: None,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 16_776_192,
            first_burst_length: 262_144,
            immediate_data: true,
            initial_r2t: false,
            timeout: Duration::from_secs(30),
            local_address: None,
        }
    }
}

/// The operational parameters in force after login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    /// Largest data segment we may send (the target's declaration).
    pub target_max_recv_data_segment_length: u32,
    /// Largest data segment the target may send us (our declaration).
    pub our_max_recv_data_segment_length: u32,
}

impl Default for Negotiated {
    /// RFC 7143 defaults for keys the target does not answer.
    fn default() -> Self {
        Self {
            immediate_data: true,
            initial_r2t: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            target_max_recv_data_segment_length: 8192,
            our_max_recv_data_segment_length: 8192,
        }
    }
}

/// A logged-in connection taken over by the caller (see [`Session::into_raw`]): the socket, in
/// blocking mode, and the sequence numbers in force.
#[derive(Debug)]
pub struct RawConnection {
    pub stream: TcpStream,
    /// The next CmdSN to use.
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub max_cmd_sn: u32,
    /// The next unused Initiator Task Tag.
    pub next_itt: u32,
    pub negotiated: Negotiated,
    pub isid: [u8; 6],
    pub tsih: u16,
    /// Bytes already read from the socket and not handled yet.
    pub pending: Vec<u8>,
}

impl RawConnection {
    /// The NOP-Out that answers the target's NOP-In `ping` as a [`Session`] would. It
    /// acknowledges the StatSN the ping carries, which a caller reading PDUs itself may not have
    /// folded into `exp_stat_sn`.
    pub fn ping_answer(&self, ping: &ReplyHeader) -> RequestHeader {
        ping_answer(ping, self.cmd_sn, ping.sn.stat_sn)
    }
}

/// The NOP-Out that answers a NOP-In `ping` of the target (RFC 7143 §11.18): immediate, with the
/// ping's LUN and Target Transfer Tag and no task tag of its own.
fn ping_answer(ping: &ReplyHeader, cmd_sn: u32, exp_stat_sn: u32) -> RequestHeader {
    RequestHeader {
        opcode: Opcode::NopOut,
        immediate: true,
        final_bit: true,
        cont: false,
        lun: ping.lun,
        itt: RESERVED_TAG,
        ttt: ping.ttt,
        cmd_sn,
        exp_stat_sn,
    }
}

/// Handle of a submitted command (its Initiator Task Tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(pub u32);

/// Residual reported with the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    None,
    /// The target transferred this many bytes less than expected.
    Underflow(u32),
    /// The command wanted this many bytes more than expected.
    Overflow(u32),
}

/// A command that completed with a SCSI status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub tag: Tag,
    pub status: u8,
    pub sense: Option<Sense>,
    /// Data-In as received.
    pub data: Vec<u8>,
    pub residual: Residual,
}

impl Completion {
    pub fn is_good(&self) -> bool {
        matches!(self.status, status::GOOD | status::CONDITION_MET)
    }
}

struct Task {
    lun: [u8; 8],
    data_out: Vec<u8>,
    data_in: Vec<u8>,
    expected_in: usize,
}

static ISID_COUNTER: AtomicU16 = AtomicU16::new(0);

/// A logged-in session. Not thread-safe by design: one owner drives it; several commands may be
/// outstanding at once.
pub struct Session {
    stream: TcpStream,
    url: IscsiUrl,
    options: SessionOptions,
    isid: [u8; 6],
    tsih: u16,
    params: Negotiated,
    rx: Vec<u8>,
    rx_pos: usize,
    rx_limit: u32,
    tx: Vec<u8>,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task>,
    completed: HashMap<u32, Result<Completion, TaskFailure>>,
    order: VecDeque<u32>,
    pings: HashSet<u32>,
    logout_response: Option<u8>,
    target_wants_logout: bool,
    nop_ins_answered: u64,
    capacity: Option<Capacity>,
    finished: bool,
}

fn serial_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

fn pairs(items: &[(&str, String)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_owned()
}

impl Session {
    /// Connects to `url` (`iscsi://[USER%SECRET@]HOST[:PORT]/TARGET/LUN`) and logs in.
    pub fn connect(url: &str, options: SessionOptions) -> Result<Self, Error> {
        let url = IscsiUrl::parse(url)?;
        Self::connect_url(url, options)
    }

    /// Like [`Session::connect`] with an already parsed URL.
    pub fn connect_url(url: IscsiUrl, mut options: SessionOptions) -> Result<Self, Error> {
        if options.chap.is_none() {
            options.chap = url.chap.clone();
        }
        if !(512..=(1 << 24) - 1).contains(&options.max_recv_data_segment_length) {
            return Err(Error::Invalid(
                "MaxRecvDataSegmentLength must be in 512..=16777215".into(),
            ));
        }
        let address = url.address();
        let connect_err = |source| Error::Connect {
            address: address.clone(),
            source,
        };
        let addrs: Vec<_> = address.to_socket_addrs().map_err(connect_err)?.collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match connect_from(options.local_address, &a, options.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| {
            connect_err(last.unwrap_or_else(|| {
                std::io::Error::new(ErrorKind::NotFound, "the host name has no address")
            }))
        })?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let pid = std::process::id();
        let n = ISID_COUNTER.fetch_add(1, Ordering::Relaxed);
        // Type 10b (random) ISID: qualifier from the pid and a per-process counter, so that
        // sessions of one process never reinstate each other.
        let isid = [
            0x80,
            (pid >> 16) as u8,
            (pid >> 8) as u8,
            pid as u8,
            (n >> 8) as u8,
            n as u8,
        ];
        let mut s = Self {
            stream,
            url,
            options,
            isid,
            tsih: 0,
            params: Negotiated::default(),
            rx: Vec::new(),
            rx_pos: 0,
            rx_limit: LOGIN_DATA_LIMIT,
            tx: Vec::new(),
            cmd_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 1,
            tasks: HashMap::new(),
            completed: HashMap::new(),
            order: VecDeque::new(),
            pings: HashSet::new(),
            logout_response: None,
            target_wants_logout: false,
            nop_ins_answered: 0,
            capacity: None,
            finished: false,
        };
        if let Err(e) = s.login() {
            s.finished = true;
            return Err(e);
        }
        Ok(s)
    }

    pub fn url(&self) -> &IscsiUrl {
        &self.url
    }
    pub fn negotiated(&self) -> Negotiated {
        self.params
    }
    pub fn tsih(&self) -> u16 {
        self.tsih
    }
    pub fn isid(&self) -> [u8; 6] {
        self.isid
    }
    /// Commands submitted and not yet collected by `wait`/`wait_any`.
    pub fn outstanding(&self) -> usize {
        self.tasks.len() + self.completed.len()
    }
    /// Whether the target asked us to log out (an Async Message).
    pub fn target_requested_logout(&self) -> bool {
        self.target_wants_logout
    }
    /// NOP-In pings of the target answered so far.
    pub fn nop_ins_answered(&self) -> u64 {
        self.nop_ins_answered
    }
    /// Hands the logged-in connection over to a caller that speaks the protocol itself (tests
    /// that send hand-made or hostile PDUs). Nothing is logged out; no command may be
    /// outstanding.
    pub fn into_raw(mut self) -> Result<RawConnection, Error> {
        self.check_usable()?;
        if !self.tasks.is_empty() || !self.completed.is_empty() {
            return Err(Error::Invalid("commands are outstanding".into()));
        }
        let stream = self.stream.try_clone()?;
        stream.set_nonblocking(false)?;
        self.finished = true;
        Ok(RawConnection {
            stream,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            max_cmd_sn: self.max_cmd_sn,
            next_itt: self.next_itt,
            negotiated: self.params,
            isid: self.isid,
            tsih: self.tsih,
            pending: self.rx.split_off(self.rx_pos),
        })
    }

    /// How many commands the target's CmdSN window admits right now.
    pub fn window(&self) -> u32 {
        if serial_lt(self.max_cmd_sn, self.cmd_sn) {
            0
        } else {
            self.max_cmd_sn.wrapping_sub(self.cmd_sn).wrapping_add(1)
        }
    }

    // ---------------------------------------------------------------- login

    fn login_fail(&self, message: impl Into<String>) -> Error {
        Error::Login {
            target: self.url.to_string(),
            message: message.into(),
        }
    }

    fn login(&mut self) -> Result<(), Error> {
        let mut first = pairs(&[
            ("InitiatorName", self.options.initiator_name.clone()),
            ("SessionType", "Normal".into()),
            ("TargetName", self.url.target.clone()),
        ]);
        let chap = self.options.chap.clone();
        let (mut resp, mut keys) = if let Some((user, secret)) = chap {
            first.push(("AuthMethod".into(), "CHAP".into()));
            let (_, keys) =
                self.login_exchange(STAGE_SECURITY, STAGE_OPERATIONAL, false, &first)?;
            match find(&keys, "AuthMethod") {
                Some("CHAP") => {}
                other => {
                    return Err(self.login_fail(format!(
                        "the target does not accept CHAP (AuthMethod={})",
                        other.unwrap_or("missing")
                    )))
                }
            }
            let (_, keys) = self.login_exchange(
                STAGE_SECURITY,
                STAGE_OPERATIONAL,
                false,
                &pairs(&[("CHAP_A", chap::ALGORITHM_MD5.into())]),
            )?;
            if find(&keys, "CHAP_A") != Some(chap::ALGORITHM_MD5) {
                return Err(self.login_fail("the target did not choose CHAP with MD5"));
            }
            let id = find(&keys, "CHAP_I")
                .and_then(text::parse_number)
                .filter(|v| *v <= 255)
                .ok_or_else(|| self.login_fail("CHAP_I missing or invalid"))?;
            let challenge = find(&keys, "CHAP_C")
                .and_then(text::decode_binary)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| self.login_fail("CHAP_C missing or invalid"))?;
            let answer = chap::response(id as u8, secret.as_bytes(), &challenge);
            self.login_exchange(
                STAGE_SECURITY,
                STAGE_OPERATIONAL,
                true,
                &pairs(&[("CHAP_N", user), ("CHAP_R", text::encode_hex(&answer))]),
            )?
        } else {
            first.push(("AuthMethod".into(), "None".into()));
            let (resp, keys) =
                self.login_exchange(STAGE_SECURITY, STAGE_OPERATIONAL, true, &first)?;
            if find(&keys, "AuthMethod") == Some("CHAP") {
                return Err(
                    self.login_fail("the target requires CHAP (give iscsi://USER%SECRET@HOST/...)")
                );
            }
            (resp, keys)
        };
        let mut rounds = 0;
        while !(resp.transit && resp.nsg == STAGE_OPERATIONAL) {
            rounds += 1;
            if rounds > MAX_LOGIN_ROUNDS {
                return Err(self.login_fail("the target never left the security stage"));
            }
            (resp, keys) = self.login_exchange(STAGE_SECURITY, STAGE_OPERATIONAL, true, &[])?;
        }
        let _ = keys;

        let o = &self.options;
        let offer = pairs(&[
            ("HeaderDigest", "None".into()),
            ("DataDigest", "None".into()),
            ("MaxConnections", "1".into()),
            ("InitialR2T", yes_no(o.initial_r2t)),
            ("ImmediateData", yes_no(o.immediate_data)),
            (
                "MaxRecvDataSegmentLength",
                o.max_recv_data_segment_length.to_string(),
            ),
            ("MaxBurstLength", o.max_burst_length.to_string()),
            ("FirstBurstLength", o.first_burst_length.to_string()),
            ("DefaultTime2Wait", "0".into()),
            ("DefaultTime2Retain", "0".into()),
            ("MaxOutstandingR2T", "1".into()),
            ("DataPDUInOrder", "Yes".into()),
            ("DataSequenceInOrder", "Yes".into()),
            ("ErrorRecoveryLevel", "0".into()),
        ]);
        let offered: HashSet<String> = offer.iter().map(|(k, _)| k.clone()).collect();
        let mut params = Negotiated {
            our_max_recv_data_segment_length: o.max_recv_data_segment_length,
            ..Negotiated::default()
        };
        let mut request = offer;
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > MAX_LOGIN_ROUNDS {
                return Err(self.login_fail("operational negotiation does not converge"));
            }
            let (resp, keys) =
                self.login_exchange(STAGE_OPERATIONAL, STAGE_FULL_FEATURE, true, &request)?;
            request = Vec::new();
            for (k, v) in &keys {
                self.apply_key(&mut params, k, v)?;
                // Keys the target offers on its own get an answer (we accept its value).
                let declarative = matches!(
                    k.as_str(),
                    "TargetAlias"
                        | "TargetPortalGroupTag"
                        | "TargetAddress"
                        | "MaxRecvDataSegmentLength"
                );
                if !offered.contains(k) && !declarative {
                    request.push((k.clone(), "NotUnderstood".into()));
                }
            }
            if resp.transit && resp.nsg == STAGE_FULL_FEATURE {
                self.tsih = resp.tsih;
                break;
            }
        }
        params.first_burst_length = params.first_burst_length.min(params.max_burst_length);
        self.params = params;
        self.rx_limit = params.our_max_recv_data_segment_length;
        Ok(())
    }

    fn apply_key(&self, p: &mut Negotiated, key: &str, value: &str) -> Result<(), Error> {
        if matches!(value, "Reject" | "NotUnderstood" | "Irrelevant") {
            return Ok(());
        }
        let number = || {
            text::parse_number(value)
                .filter(|v| (512..(1 << 24)).contains(v))
                .map(|v| v as u32)
                .ok_or_else(|| self.login_fail(format!("invalid {key}={value}")))
        };
        let boolean = || {
            text::parse_bool(value).ok_or_else(|| self.login_fail(format!("invalid {key}={value}")))
        };
        match key {
            "HeaderDigest" | "DataDigest" if value != "None" => {
                return Err(self.login_fail(format!("the target insists on {key}={value}")))
            }
            "ErrorRecoveryLevel" if value != "0" => {
                return Err(self.login_fail(format!("the target insists on {key}={value}")))
            }
            "MaxRecvDataSegmentLength" => p.target_max_recv_data_segment_length = number()?,
            "MaxBurstLength" => p.max_burst_length = number()?,
            "FirstBurstLength" => p.first_burst_length = number()?,
            "ImmediateData" => p.immediate_data = boolean()?,
            "InitialR2T" => p.initial_r2t = boolean()?,
            _ => {}
        }
        Ok(())
    }

    /// Sends one login request (plus continuation requests while the target answers with C=1)
    /// and returns the final response header and all its keys.
    fn login_exchange(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        keys: &[(String, String)],
    ) -> Result<(LoginResponseHeader, Vec<(String, String)>), Error> {
        let mut data = text::encode(keys);
        let mut collected = Vec::new();
        loop {
            let req = LoginRequestHeader {
                transit,
                cont: false,
                csg,
                nsg: if transit { nsg } else { 0 },
                version_max: 0,
                version_min: 0,
                isid: self.isid,
                tsih: 0,
                itt: 0,
                cid: 0,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            };
            self.write_pdu(&req.to_bhs(), &data)?;
            data.clear();
            let pdu = self.next_pdu()?;
            if pdu.bhs.opcode() != Opcode::LoginResponse {
                return Err(self.login_fail(format!(
                    "expected a login response, got {:?}",
                    pdu.bhs.opcode()
                )));
            }
            let resp = LoginResponseHeader::parse(&pdu.bhs);
            self.exp_stat_sn = resp.sn.stat_sn.wrapping_add(1);
            self.exp_cmd_sn = resp.sn.exp_cmd_sn;
            self.max_cmd_sn = resp.sn.max_cmd_sn;
            if resp.status_class != 0 {
                let status = LoginStatus::from_code(resp.status_class, resp.status_detail);
                let why = match status {
                    LoginStatus::AuthenticationFailure => {
                        "authentication failed (wrong or missing CHAP user or secret)".to_owned()
                    }
                    LoginStatus::AuthorizationFailure => format!(
                        "initiator {} is not allowed to log in to this target",
                        self.options.initiator_name
                    ),
                    LoginStatus::NotFound => "no such target".to_owned(),
                    other => format!("status {other:?}"),
                };
                return Err(self.login_fail(why));
            }
            collected.extend_from_slice(&pdu.data);
            if !resp.cont {
                let keys = text::parse(&collected)
                    .map_err(|e| self.login_fail(format!("bad text in login response: {e}")))?;
                return Ok((resp, keys));
            }
            if collected.len() > 4 * LOGIN_DATA_LIMIT as usize {
                return Err(self.login_fail("login response text too long"));
            }
        }
    }

    // ---------------------------------------------------------------- socket

    fn poll(&mut self, want_write: bool) -> Result<(), Error> {
        let mut fds = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN | if want_write { libc::POLLOUT } else { 0 },
            revents: 0,
        };
        let ms = self.options.timeout.as_millis().min(i32::MAX as u128) as i32;
        loop {
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fds, 1, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Io(e));
            }
            if n == 0 {
                return Err(Error::Timeout(self.options.timeout));
            }
            break;
        }
        if fds.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            self.read_available()?;
        }
        Ok(())
    }

    fn read_available(&mut self) -> Result<(), Error> {
        if self.rx_pos > 0 && self.rx_pos * 2 >= self.rx.len() {
            self.rx.drain(..self.rx_pos);
            self.rx_pos = 0;
        }
        loop {
            let len = self.rx.len();
            self.rx.resize(len + READ_CHUNK, 0);
            match self.stream.read(&mut self.rx[len..]) {
                Ok(0) => {
                    self.rx.truncate(len);
                    return Err(Error::Closed);
                }
                Ok(n) => {
                    self.rx.truncate(len + n);
                    if n < READ_CHUNK {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.rx.truncate(len);
                    return match e.kind() {
                        ErrorKind::WouldBlock => Ok(()),
                        ErrorKind::Interrupted => continue,
                        _ => Err(Error::Io(e)),
                    };
                }
            }
        }
    }

    fn write_pdu(&mut self, bhs: &Bhs, data: &[u8]) -> Result<(), Error> {
        let mut tx = std::mem::take(&mut self.tx);
        tx.clear();
        let mut bhs = bhs.clone();
        bhs.0[4] = 0;
        bhs.set_data_segment_length(data.len() as u32);
        tx.extend_from_slice(&bhs.0);
        tx.extend_from_slice(data);
        tx.resize(BHS_LEN + pdu::padded(data.len()), 0);
        let result = self.write_all(&tx);
        self.tx = tx;
        result
    }

    fn write_all(&mut self, mut buf: &[u8]) -> Result<(), Error> {
        while !buf.is_empty() {
            match self.stream.write(buf) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.poll(true)?,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
        Ok(())
    }

    fn parse_buffered(&mut self) -> Result<Option<Pdu>, Error> {
        let avail = &self.rx[self.rx_pos..];
        if avail.len() < BHS_LEN {
            return Ok(None);
        }
        let mut header = [0u8; BHS_LEN];
        header.copy_from_slice(&avail[..BHS_LEN]);
        let len = pdu::wire_len(&Bhs(header), Digests::default(), self.rx_limit)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        if avail.len() < len {
            return Ok(None);
        }
        let p = pdu::decode(&avail[..len], Digests::default())
            .map_err(|e| Error::Protocol(e.to_string()))?;
        self.rx_pos += len;
        if self.rx_pos == self.rx.len() {
            self.rx.clear();
            self.rx_pos = 0;
        }
        Ok(Some(p))
    }

    fn next_pdu(&mut self) -> Result<Pdu, Error> {
        loop {
            if let Some(p) = self.parse_buffered()? {
                return Ok(p);
            }
            self.poll(false)?;
        }
    }

    /// Receives and handles one PDU.
    fn pump(&mut self) -> Result<(), Error> {
        let p = self.next_pdu()?;
        self.handle(p)
    }

    // ---------------------------------------------------------------- full feature phase

    fn update_window(&mut self, sn: &StatusSn) {
        // MaxCmdSN < ExpCmdSN - 1 (serial) is invalid: ignore both (RFC 7143 §4.2.2.1).
        if serial_lt(sn.max_cmd_sn, sn.exp_cmd_sn.wrapping_sub(1)) {
            return;
        }
        if serial_lt(self.exp_cmd_sn, sn.exp_cmd_sn) {
            self.exp_cmd_sn = sn.exp_cmd_sn;
        }
        if serial_lt(self.max_cmd_sn, sn.max_cmd_sn) {
            self.max_cmd_sn = sn.max_cmd_sn;
        }
    }

    fn status_received(&mut self, sn: &StatusSn) {
        self.exp_stat_sn = sn.stat_sn.wrapping_add(1);
        self.update_window(sn);
    }

    fn handle(&mut self, p: Pdu) -> Result<(), Error> {
        match p.bhs.opcode() {
            Opcode::DataIn => {
                let h = DataInHeader::parse(&p.bhs);
                if h.has_status {
                    self.status_received(&h.sn);
                } else {
                    self.update_window(&h.sn);
                }
                let task = self.tasks.get_mut(&h.itt).ok_or_else(|| {
                    Error::Protocol(format!("Data-In for unknown task {:#x}", h.itt))
                })?;
                let start = h.buffer_offset as usize;
                let end = start.saturating_add(p.data.len());
                if end > task.expected_in {
                    return Err(Error::Protocol(format!(
                        "Data-In at {start}..{end} beyond the expected {} bytes",
                        task.expected_in
                    )));
                }
                if task.data_in.len() < end {
                    task.data_in.resize(end, 0);
                }
                task.data_in[start..end].copy_from_slice(&p.data);
                if h.has_status {
                    let residual = residual(h.overflow, h.underflow, h.residual_count);
                    self.complete(h.itt, Ok((h.status, None, residual)));
                }
            }
            Opcode::ScsiResponse => {
                let h = ScsiResponseHeader::parse(&p.bhs);
                self.status_received(&h.sn);
                if !self.tasks.contains_key(&h.itt) {
                    return Err(Error::Protocol(format!(
                        "SCSI Response for unknown task {:#x}",
                        h.itt
                    )));
                }
                if h.response != 0 {
                    self.complete(h.itt, Err(TaskFailure::ServiceResponse(h.response)));
                } else {
                    let sense = if p.data.len() >= 2 {
                        let len = usize::from(u16::from_be_bytes([p.data[0], p.data[1]]));
                        p.data.get(2..2 + len).and_then(Sense::parse)
                    } else {
                        None
                    };
                    let residual = residual(h.overflow, h.underflow, h.residual_count);
                    self.complete(h.itt, Ok((h.status, sense, residual)));
                }
            }
            Opcode::ReadyToTransfer => {
                let h = ReadyToTransferHeader::parse(&p.bhs);
                self.update_window(&h.sn);
                let task = self
                    .tasks
                    .get_mut(&h.itt)
                    .ok_or_else(|| Error::Protocol(format!("R2T for unknown task {:#x}", h.itt)))?;
                let start = h.buffer_offset as usize;
                let end = start.saturating_add(h.desired_length as usize);
                if end > task.data_out.len() || h.desired_length == 0 {
                    return Err(Error::Protocol(format!(
                        "R2T for bytes {start}..{end} of a {}-byte Data-Out",
                        task.data_out.len()
                    )));
                }
                let lun = task.lun;
                self.send_data_out(h.itt, h.ttt, lun, start, end)?;
            }
            Opcode::NopIn => {
                let h = ReplyHeader::parse(&p.bhs);
                if h.itt != RESERVED_TAG {
                    // The answer to our ping.
                    self.status_received(&h.sn);
                    self.pings.remove(&h.itt);
                } else {
                    self.update_window(&h.sn);
                }
                if h.ttt != RESERVED_TAG {
                    let reply = ping_answer(&h, self.cmd_sn, self.exp_stat_sn);
                    let data = p.data.clone();
                    self.write_pdu(&reply.to_bhs(), &data)?;
                    self.nop_ins_answered += 1;
                }
            }
            Opcode::LogoutResponse => {
                let h = LogoutResponseHeader::parse(&p.bhs);
                self.status_received(&h.sn);
                self.logout_response = Some(h.response);
            }
            Opcode::AsyncMessage => {
                let h = AsyncMessageHeader::parse(&p.bhs);
                self.status_received(&h.sn);
                match h.event {
                    1 => self.target_wants_logout = true,
                    2 | 3 => {
                        return Err(Error::Protocol(
                            "the target is dropping the connection".into(),
                        ))
                    }
                    _ => {}
                }
            }
            Opcode::Reject => {
                let h = RejectHeader::parse(&p.bhs);
                self.status_received(&h.sn);
                let itt = p
                    .data
                    .get(16..20)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                match itt {
                    Some(itt) if self.tasks.contains_key(&itt) => {
                        self.complete(itt, Err(TaskFailure::Rejected(h.reason.code())));
                    }
                    _ => {
                        return Err(Error::Protocol(format!(
                            "the target rejected a PDU: {:?}",
                            h.reason
                        )))
                    }
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {other:?} PDU in the full feature phase"
                )))
            }
        }
        Ok(())
    }

    fn complete(&mut self, itt: u32, outcome: Result<(u8, Option<Sense>, Residual), TaskFailure>) {
        if let Some(task) = self.tasks.remove(&itt) {
            let result = outcome.map(|(status, sense, residual)| Completion {
                tag: Tag(itt),
                status,
                sense,
                data: task.data_in,
                residual,
            });
            self.completed.insert(itt, result);
            self.order.push_back(itt);
        }
    }

    fn send_data_out(
        &mut self,
        itt: u32,
        ttt: u32,
        lun: [u8; 8],
        start: usize,
        end: usize,
    ) -> Result<(), Error> {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(());
        };
        let data = std::mem::take(&mut task.data_out);
        let step = self.params.target_max_recv_data_segment_length.max(512) as usize;
        let mut offset = start;
        let mut data_sn = 0u32;
        let mut result = Ok(());
        while offset < end {
            let n = step.min(end - offset);
            let h = DataOutHeader {
                final_bit: offset + n == end,
                lun,
                itt,
                ttt,
                exp_stat_sn: self.exp_stat_sn,
                data_sn,
                buffer_offset: offset as u32,
            };
            result = self.write_pdu(&h.to_bhs(), &data[offset..offset + n]);
            if result.is_err() {
                break;
            }
            offset += n;
            data_sn += 1;
        }
        if let Some(task) = self.tasks.get_mut(&itt) {
            task.data_out = data;
        }
        result
    }

    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG
                && !self.tasks.contains_key(&itt)
                && !self.completed.contains_key(&itt)
                && !self.pings.contains(&itt)
            {
                return itt;
            }
        }
    }

    fn check_usable(&self) -> Result<(), Error> {
        if self.finished {
            return Err(Error::Invalid("the session is logged out or broken".into()));
        }
        Ok(())
    }

    /// Submits a command and returns at once (after its immediate and unsolicited data are
    /// sent). Blocks only while the target's CmdSN window is closed.
    pub fn submit(&mut self, cmd: OutgoingCommand) -> Result<Tag, Error> {
        self.check_usable()?;
        if cmd.cdb.is_empty() || cmd.cdb.len() > 16 {
            return Err(Error::Invalid(format!(
                "CDB of {} bytes (1..=16 supported)",
                cmd.cdb.len()
            )));
        }
        if !cmd.data_out.is_empty() && cmd.data_in_len > 0 {
            return Err(Error::Invalid(
                "bidirectional commands are not supported".into(),
            ));
        }
        let out_len = u32::try_from(cmd.data_out.len())
            .map_err(|_| Error::Invalid("Data-Out larger than 4 GiB".into()))?;
        let r = self.submit_inner(cmd, out_len);
        if r.is_err() {
            self.finished = true;
        }
        r
    }

    fn submit_inner(&mut self, cmd: OutgoingCommand, out_len: u32) -> Result<Tag, Error> {
        while self.window() == 0 {
            self.pump()?;
        }
        let itt = self.alloc_itt();
        let lun = encode_lun(cmd.lun.unwrap_or(self.url.lun));
        let p = self.params;
        let len = cmd.data_out.len();
        let immediate = if p.immediate_data {
            len.min(p.first_burst_length as usize)
                .min(p.target_max_recv_data_segment_length as usize)
        } else {
            0
        };
        let unsolicited = if p.initial_r2t {
            immediate
        } else {
            len.min(p.first_burst_length as usize)
        };
        let mut cdb = [0u8; 16];
        cdb[..cmd.cdb.len()].copy_from_slice(&cmd.cdb);
        let header = ScsiCommandHeader {
            immediate: false,
            final_bit: unsolicited == immediate,
            read: cmd.data_in_len > 0,
            write: len > 0,
            attr: 1,
            lun,
            itt,
            expected_data_transfer_length: if len > 0 { out_len } else { cmd.data_in_len },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb,
        };
        self.tasks.insert(
            itt,
            Task {
                lun,
                data_out: Vec::new(),
                data_in: Vec::new(),
                expected_in: cmd.data_in_len as usize,
            },
        );
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.write_pdu(&header.to_bhs(), &cmd.data_out[..immediate])?;
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.data_out = cmd.data_out;
        }
        if unsolicited > immediate {
            self.send_data_out(itt, RESERVED_TAG, lun, immediate, unsolicited)?;
        }
        Ok(Tag(itt))
    }

    fn collect(&mut self, itt: u32) -> Option<Result<Completion, Error>> {
        let r = self.completed.remove(&itt)?;
        Some(r.map_err(|failure| Error::Task { tag: itt, failure }))
    }

    /// Waits for the command `tag` to complete.
    pub fn wait(&mut self, tag: Tag) -> Result<Completion, Error> {
        loop {
            if let Some(r) = self.collect(tag.0) {
                self.order.retain(|t| *t != tag.0);
                return r;
            }
            if !self.tasks.contains_key(&tag.0) {
                return Err(Error::Invalid(format!(
                    "no outstanding command {:#x}",
                    tag.0
                )));
            }
            self.check_usable()?;
            if let Err(e) = self.pump() {
                self.finished = true;
                return Err(e);
            }
        }
    }

    /// Waits for any outstanding command to complete, in completion order. A task-level
    /// failure comes back as [`Error::Task`] carrying its tag.
    pub fn wait_any(&mut self) -> Result<Completion, Error> {
        loop {
            while let Some(itt) = self.order.pop_front() {
                if let Some(r) = self.collect(itt) {
                    return r;
                }
            }
            if self.tasks.is_empty() {
                return Err(Error::Invalid("no command is outstanding".into()));
            }
            self.check_usable()?;
            if let Err(e) = self.pump() {
                self.finished = true;
                return Err(e);
            }
        }
    }

    /// Submits and waits.
    pub fn execute(&mut self, cmd: OutgoingCommand) -> Result<Completion, Error> {
        let tag = self.submit(cmd)?;
        self.wait(tag)
    }

    /// Executes and turns any status but GOOD/CONDITION MET into [`Error::Check`]. A UNIT
    /// ATTENTION (a new nexus, a reset) is reported once per event by SCSI: the command is
    /// retried a few times before giving up.
    pub fn execute_checked(&mut self, cmd: OutgoingCommand) -> Result<Completion, Error> {
        const ATTEMPTS: usize = 4;
        let opcode = cmd.cdb.first().copied().unwrap_or(0);
        let mut attempt = 1;
        loop {
            let c = self.execute(cmd.clone())?;
            if c.is_good() {
                return Ok(c);
            }
            let ua = c.status == status::CHECK_CONDITION
                && c.sense.as_ref().map(|s| s.key) == Some(SenseKey::UnitAttention);
            if !ua || attempt == ATTEMPTS {
                return Err(Error::Check {
                    command: command_name(opcode),
                    status: c.status,
                    sense: c.sense,
                });
            }
            attempt += 1;
        }
    }

    /// Sends a NOP-Out ping and waits for the target's NOP-In.
    pub fn ping(&mut self) -> Result<(), Error> {
        self.check_usable()?;
        let itt = self.alloc_itt();
        let h = RequestHeader::opening(Opcode::NopOut, true, itt, self.cmd_sn, self.exp_stat_sn);
        self.pings.insert(itt);
        self.write_pdu(&h.to_bhs(), b"sliver-ping")?;
        while self.pings.contains(&itt) {
            if let Err(e) = self.pump() {
                self.finished = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Logs out (closing the session), after the outstanding commands complete.
    pub fn logout(mut self) -> Result<(), Error> {
        self.logout_inner()
    }

    fn logout_inner(&mut self) -> Result<(), Error> {
        self.check_usable()?;
        self.finished = true;
        while !self.tasks.is_empty() {
            self.pump()?;
        }
        let itt = self.alloc_itt();
        let h = LogoutRequestHeader {
            immediate: true,
            reason: 0,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        self.write_pdu(&h.to_bhs(), &[])?;
        while self.logout_response.is_none() {
            self.pump()?;
        }
        match self.logout_response {
            Some(0) => Ok(()),
            Some(r) => Err(Error::Protocol(format!("logout refused with response {r}"))),
            None => Err(Error::Closed),
        }
    }

    // ---------------------------------------------------------------- SCSI helpers

    fn run(&mut self, cmd: OutgoingCommand) -> Result<Completion, Error> {
        self.execute_checked(cmd)
    }

    /// Block size, from a READ CAPACITY(16) issued on first use.
    pub fn block_size(&mut self) -> Result<u32, Error> {
        match self.capacity {
            Some(c) => Ok(c.block_size),
            None => Ok(self.read_capacity16()?.block_size),
        }
    }

    pub fn test_unit_ready(&mut self) -> Result<(), Error> {
        self.run(cdb::test_unit_ready()).map(|_| ())
    }

    pub fn inquiry(&mut self, page: Option<u8>) -> Result<Vec<u8>, Error> {
        Ok(self.run(cdb::inquiry(page, 255))?.data)
    }

    pub fn block_limits(&mut self) -> Result<BlockLimits, Error> {
        BlockLimits::parse(&self.inquiry(Some(0xb0))?)
    }

    pub fn read_capacity16(&mut self) -> Result<Capacity, Error> {
        let c = Capacity::parse(&self.run(cdb::read_capacity16())?.data)?;
        self.capacity = Some(c);
        Ok(c)
    }

    pub fn read16(&mut self, lba: u64, blocks: u32) -> Result<Vec<u8>, Error> {
        let bs = self.block_size()?;
        let c = self.run(cdb::read16(lba, blocks, bs)?)?;
        Ok(c.data)
    }

    pub fn write16(&mut self, lba: u64, data: Vec<u8>) -> Result<(), Error> {
        let bs = self.block_size()?;
        self.run(cdb::write16(lba, data, bs, false)?).map(|_| ())
    }

    pub fn unmap(&mut self, ranges: &[(u64, u32)]) -> Result<(), Error> {
        self.run(cdb::unmap(ranges)?).map(|_| ())
    }

    /// WRITE SAME(16) of zeros; `unmap` = deallocate.
    pub fn write_same16(&mut self, lba: u64, blocks: u32, unmap: bool) -> Result<(), Error> {
        let bs = self.block_size()?;
        let pattern = vec![0u8; bs as usize];
        self.run(cdb::write_same16(lba, blocks, pattern, unmap))
            .map(|_| ())
    }

    pub fn synchronize_cache16(&mut self, lba: u64, blocks: u32) -> Result<(), Error> {
        self.run(cdb::synchronize_cache16(lba, blocks)).map(|_| ())
    }

    pub fn get_lba_status(&mut self, lba: u64) -> Result<Vec<LbaStatus>, Error> {
        let c = self.run(cdb::get_lba_status(lba, 8 + 16 * 64))?;
        cdb::parse_lba_status(&c.data)
    }
}

fn residual(overflow: bool, underflow: bool, count: u32) -> Residual {
    if overflow {
        Residual::Overflow(count)
    } else if underflow {
        Residual::Underflow(count)
    } else {
        Residual::None
    }
}

fn find<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn command_name(opcode: u8) -> String {
    use cdb::opcode::*;
    match opcode {
        TEST_UNIT_READY => "TEST UNIT READY".into(),
        INQUIRY => "INQUIRY".into(),
        UNMAP => "UNMAP".into(),
        READ_16 => "READ(16)".into(),
        WRITE_16 => "WRITE(16)".into(),
        SYNCHRONIZE_CACHE_16 => "SYNCHRONIZE CACHE(16)".into(),
        WRITE_SAME_16 => "WRITE SAME(16)".into(),
        SERVICE_ACTION_IN_16 => "SERVICE ACTION IN(16)".into(),
        other => format!("command {other:02X}h"),
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort, bounded: a dead target must not hang the caller's drop.
            self.options.timeout = self.options.timeout.min(Duration::from_secs(2));
            let _ = self.logout_inner();
        }
    }
}

/// A TCP connection to `to`, from `from` when given.
fn connect_from(
    from: Option<std::net::IpAddr>,
    to: &std::net::SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let Some(from) = from else {
        return TcpStream::connect_timeout(to, timeout);
    };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(*to),
        socket2::Type::STREAM,
        None,
    )?;
    socket.bind(&std::net::SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&(*to).into(), timeout)?;
    Ok(socket.into())
}
