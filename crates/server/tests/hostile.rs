//! Hostile and broken initiators against a live listener: a stateful fuzzer that logs in and
//! then sends valid, mutated and random PDUs; initiators that stall, go silent or stop
//! reading; session and connection limits; access control around EXTENDED COPY, RECEIVE COPY
//! RESULTS and task management; names that try to reach outside the data directory. Through
//! all of it the server must not panic, must release what hostile connections held, and must
//! keep serving a well-behaved session.
//!
//! The fuzzer's choices are deterministic for a seed (which R2Ts it has seen when depends on
//! timing). `SLIVER_HOSTILE_ITERATIONS=N` runs N rounds instead of the default,
//! `SLIVER_HOSTILE_SEED=S` changes the seed; the ignored test `stateful_fuzzer_long` runs 200
//! rounds of four connections.

use sliver_initiator::{
    cdb, Error, OutgoingCommand, RawConnection, SenseKey, Session, SessionOptions,
};
use sliver_iscsi::pdu::{
    self, Bhs, DataOutHeader, Digests, LogoutRequestHeader, Opcode, Pdu, ReadyToTransferHeader,
    ReplyHeader, RequestHeader, ScsiCommandHeader, SnackHeader, TaskManagementRequestHeader,
    BHS_LEN, RESERVED_TAG,
};
use sliver_server::array::ArrayError;
use sliver_server::{Array, Server, Timeouts};
use sliver_test_support::hosts::{self, iqn, HOST_A, HOST_B};
use sliver_test_support::target::{Running, Start};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.test.sliver:hostile";
/// The fuzzer's initiators see only the `fuzz` volume; the well-behaved check uses `check`,
/// so late hostile writes can never race with what it verifies.
const HOSTILE: &str = "iqn.2026-11.test:hostile";
const GOOD: &str = "iqn.2026-11.test:good";
const VOLUME_BYTES: u64 = 64 << 20;
/// Upper bound for anything the server should do promptly; a hang fails instead of blocking.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// A server in this process, and panic detection

/// The runtime threads of the servers under test carry this name; the server's own threads
/// (its I/O pool) are named `sliver-...` as well.
const SERVER_THREAD: &str = "sliver-hostile-srv";
const SERVER_THREAD_PREFIX: &str = "sliver-";
static SERVER_PANICKED: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// A panic on a server thread (a connection task, a SCSI command on the blocking pool) does not
/// stop the process: tokio catches it. The hook records it so the tests can fail on it.
fn watch_for_server_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().map(str::to_owned);
            if name.is_some_and(|n| n.starts_with(SERVER_THREAD_PREFIX)) {
                SERVER_PANICKED.store(true, SeqCst);
            }
            previous(info);
        }));
    });
}

/// The target under attack, and what the tests ask of it.
struct Target(Running);

impl std::ops::Deref for Target {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.0
    }
}

impl Target {
    /// The server task is still running and no server thread panicked.
    fn assert_healthy(&self) {
        assert!(
            !SERVER_PANICKED.load(SeqCst),
            "a server thread panicked (see the output above)"
        );
        assert!(!self.stopped(), "the server stopped");
    }

    /// Waits until the server holds at most `n` connections.
    fn wait_for_connections(&self, n: usize) {
        self.wait_for_at_most(n, "connections still open", Server::open_connections);
    }

    /// Waits until the server holds at most `n` sessions.
    fn wait_for_sessions(&self, n: usize) {
        self.wait_for_at_most(n, "sessions still registered", Server::session_count);
    }

    /// Waits until `count` of the server, `what` it counts, is at most `n`; fails if it is not
    /// within [`PATIENCE`].
    fn wait_for_at_most(&self, n: usize, what: &str, count: impl Fn(&Server) -> usize) {
        let deadline = Instant::now() + PATIENCE;
        while count(&self.server) > n {
            assert!(
                Instant::now() < deadline,
                "{} {what}, expected at most {n}",
                count(&self.server)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn start(setup: impl FnOnce(&Array), tune: impl FnOnce(&Server)) -> Target {
    watch_for_server_panics();
    Target(
        Start::new(TARGET)
            .thread_name(SERVER_THREAD)
            .run(setup, tune),
    )
}

/// `fuzz` for the hostile initiator at LUN 0, `check` for the good one at LUN 0.
fn fuzz_and_check_volumes(array: &Array) {
    array.create_volume("fuzz", VOLUME_BYTES, 512).unwrap();
    array.create_volume("check", VOLUME_BYTES, 512).unwrap();
    array
        .create_host("hostile", vec![iqn(HOSTILE)], None)
        .unwrap();
    array.create_host("good", vec![iqn(GOOD)], None).unwrap();
    array.connect("fuzz", "hostile", Some(0)).unwrap();
    array.connect("check", "good", Some(0)).unwrap();
}

fn options(initiator: &str) -> SessionOptions {
    SessionOptions {
        initiator_name: initiator.into(),
        timeout: PATIENCE,
        ..SessionOptions::default()
    }
}

/// A fresh, well-behaved session writes a pattern and reads it back.
fn well_behaved_session(t: &Target, seed: u64) {
    let mut s = Session::connect(&t.url(0), options(GOOD))
        .unwrap_or_else(|e| panic!("a well-behaved initiator cannot log in: {e}"));
    let mut rng = Rng::new(seed);
    let data = rng.bytes(64 << 10);
    let lba = rng.below(VOLUME_BYTES / 512 - 128);
    s.write16(lba, data.clone()).unwrap();
    assert_eq!(
        s.read16(lba, 128).unwrap(),
        data,
        "read back what was written"
    );
    s.logout().unwrap();
}

fn raw_login(t: &Target, initiator: &str) -> RawConnection {
    let mut s = Session::connect(&t.url(0), options(initiator)).unwrap();
    // Take the nexus's unit attention here, so raw commands later get plain answers.
    s.test_unit_ready().unwrap();
    s.into_raw().unwrap()
}

/// Reads until the server closes the connection; fails if it does not within [`PATIENCE`].
fn expect_closed_by_server(stream: &mut TcpStream) {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

/// Resident memory of this process, in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness (SplitMix64): the same seed replays the same session

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// The stateful fuzzer

/// What the reader thread learns from the target's PDUs.
struct Observed {
    exp_cmd_sn: AtomicU32,
    exp_stat_sn: AtomicU32,
    pdus: AtomicU64,
    /// PDUs by opcode (the low 6 bits).
    by_opcode: [AtomicU64; 64],
    /// Output that does not frame as iSCSI PDUs: a server bug.
    malformed: Mutex<Vec<String>>,
}

impl Observed {
    fn new(exp_cmd_sn: u32, exp_stat_sn: u32) -> Self {
        Self {
            exp_cmd_sn: AtomicU32::new(exp_cmd_sn),
            exp_stat_sn: AtomicU32::new(exp_stat_sn),
            pdus: AtomicU64::new(0),
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
            malformed: Mutex::new(Vec::new()),
        }
    }
}

/// Largest data segment the target may send us: what our initiator declared.
const OUR_MAX_RECV: u32 = 262_144;

/// Drains and decodes what the target sends; R2Ts go to the fuzzer so it can answer them.
fn read_target(
    mut stream: TcpStream,
    observed: Arc<Observed>,
    r2ts: mpsc::Sender<ReadyToTransferHeader>,
) {
    let mut rx: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        rx.extend_from_slice(&buf[..n]);
        let mut pos = 0;
        while rx.len() - pos >= BHS_LEN {
            let bhs = Bhs(rx[pos..pos + BHS_LEN].try_into().unwrap());
            let len = match pdu::wire_len(&bhs, Digests::default(), OUR_MAX_RECV) {
                Ok(len) => len,
                Err(e) => {
                    observed
                        .malformed
                        .lock()
                        .unwrap()
                        .push(format!("{e}: {bhs:?}"));
                    return;
                }
            };
            if rx.len() - pos < len {
                break;
            }
            let p = match pdu::decode(&rx[pos..pos + len], Digests::default()) {
                Ok(p) => p,
                Err(e) => {
                    observed.malformed.lock().unwrap().push(e.to_string());
                    return;
                }
            };
            pos += len;
            observed.pdus.fetch_add(1, SeqCst);
            observed.by_opcode[usize::from(p.bhs.0[0] & 0x3f)].fetch_add(1, SeqCst);
            if !matches!(
                p.bhs.opcode(),
                Opcode::NopIn
                    | Opcode::ScsiResponse
                    | Opcode::TaskManagementResponse
                    | Opcode::TextResponse
                    | Opcode::DataIn
                    | Opcode::LogoutResponse
                    | Opcode::ReadyToTransfer
                    | Opcode::AsyncMessage
                    | Opcode::Reject
            ) {
                observed
                    .malformed
                    .lock()
                    .unwrap()
                    .push(format!("unexpected opcode from the target: {:?}", p.bhs));
            }
            observed.exp_cmd_sn.store(p.bhs.u32_at(28), SeqCst);
            observed
                .exp_stat_sn
                .store(p.bhs.u32_at(24).wrapping_add(1), SeqCst);
            if p.bhs.opcode() == Opcode::ReadyToTransfer {
                let _ = r2ts.send(ReadyToTransferHeader::parse(&p.bhs));
            }
        }
        rx.drain(..pos);
    }
}

/// SCSI opcodes worth aiming at (their CDB fields then get fuzzed).
const OPCODES: &[u8] = &[
    0x00, 0x03, 0x04, 0x12, 0x15, 0x16, 0x17, 0x1a, 0x1b, 0x1d, 0x25, 0x28, 0x2a, 0x2e, 0x2f, 0x35,
    0x41, 0x42, 0x48, 0x4d, 0x55, 0x56, 0x57, 0x5a, 0x5e, 0x5f, 0x83, 0x84, 0x88, 0x89, 0x8a, 0x8e,
    0x8f, 0x91, 0x93, 0x9c, 0x9e, 0xa0, 0xa3, 0xa4,
];

struct Fuzzer {
    stream: TcpStream,
    rng: Rng,
    cmd_sn: u32,
    next_itt: u32,
    recent_itts: Vec<u32>,
    r2ts: mpsc::Receiver<ReadyToTransferHeader>,
    pending_r2ts: Vec<ReadyToTransferHeader>,
    observed: Arc<Observed>,
    /// Negotiated limits, so that most valid PDUs are within them.
    first_burst: u32,
    max_send: u32,
}

/// Why a hostile connection ended.
enum End {
    /// The server closed it (a fatal protocol error is a fine answer to garbage).
    ClosedByServer,
    /// We closed it on purpose (logout, truncated PDU).
    Done,
}

impl Fuzzer {
    fn itt(&mut self) -> u32 {
        let itt = if self.rng.chance(3) && !self.recent_itts.is_empty() {
            // Reuse a tag that may still be live.
            let i = self.rng.below(self.recent_itts.len() as u64) as usize;
            self.recent_itts[i]
        } else {
            self.next_itt = self.next_itt.wrapping_add(1);
            self.next_itt
        };
        if self.recent_itts.len() >= 32 {
            self.recent_itts.remove(0);
        }
        self.recent_itts.push(itt);
        itt
    }

    /// The CmdSN for a non-immediate request: usually the right one, sometimes far outside the
    /// window, a duplicate or a gap.
    fn cmd_sn(&mut self) -> u32 {
        if self.rng.chance(5) {
            // Catch up with the target after dropped commands.
            self.cmd_sn = self.observed.exp_cmd_sn.load(SeqCst);
        }
        let sn = match self.rng.below(100) {
            0..=3 => self.cmd_sn.wrapping_add(self.rng.u32()),
            4..=6 => self.cmd_sn.wrapping_sub(1 + self.rng.below(4) as u32),
            7..=8 => self.cmd_sn.wrapping_add(1 + self.rng.below(3) as u32),
            _ => self.cmd_sn,
        };
        if sn == self.cmd_sn {
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
        }
        sn
    }

    /// The CmdSN of a request: the next one unconsumed for an immediate request (immediate
    /// requests do not advance it), else [`Fuzzer::cmd_sn`]'s.
    fn cmd_sn_for(&mut self, immediate: bool) -> u32 {
        if immediate {
            self.cmd_sn
        } else {
            self.cmd_sn()
        }
    }

    /// The reserved tag `percent` % of the time, else any tag at all.
    fn reserved_tag_or_any(&mut self, percent: u64) -> u32 {
        if self.rng.chance(percent) {
            RESERVED_TAG
        } else {
            self.rng.u32()
        }
    }

    fn lun(&mut self) -> [u8; 8] {
        if self.rng.chance(90) {
            pdu::encode_lun(0)
        } else if self.rng.chance(50) {
            pdu::encode_lun(self.rng.below(4))
        } else {
            self.rng.bytes(8).try_into().unwrap()
        }
    }

    fn exp_stat_sn(&self) -> u32 {
        self.observed.exp_stat_sn.load(SeqCst)
    }

    /// A plausible CDB and its data direction and length.
    fn scsi_cdb(&mut self) -> ([u8; 16], u32, bool, bool) {
        let mut c = [0u8; 16];
        let blocks = 1 + self.rng.below(128) as u32;
        let lba = if self.rng.chance(90) {
            self.rng.below(VOLUME_BYTES / 512)
        } else {
            self.rng.next()
        };
        let (len, read, write) = match self.rng.below(12) {
            0 => (0, false, false), // TEST UNIT READY
            1 => {
                c[0] = 0x12;
                c[1] = self.rng.below(2) as u8;
                c[2] = self
                    .rng
                    .pick(&[0x00, 0x80, 0x83, 0x86, 0x8f, 0xb0, 0xb1, 0xb2, 0xff]);
                let alloc = self.rng.below(1024) as u16;
                c[3..5].copy_from_slice(&alloc.to_be_bytes());
                (u32::from(alloc), true, false)
            }
            2 | 3 => {
                c[0] = 0x88;
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[10..14].copy_from_slice(&blocks.to_be_bytes());
                (blocks * 512, true, false)
            }
            4 | 5 => {
                // Up to 1 MiB, so that R2T sequences span several bursts and PDUs.
                let blocks = if self.rng.chance(30) {
                    1 + self.rng.below(2048) as u32
                } else {
                    blocks
                };
                c[0] = 0x8a;
                c[1] = if self.rng.chance(20) { 0x08 } else { 0 };
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[10..14].copy_from_slice(&blocks.to_be_bytes());
                (blocks * 512, false, true)
            }
            6 => {
                c[0] = 0x93; // WRITE SAME(16), sometimes with UNMAP
                c[1] = if self.rng.chance(50) { 0x08 } else { 0 };
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[10..14].copy_from_slice(&(blocks * 8).to_be_bytes());
                (512, false, true)
            }
            7 => {
                c[0] = 0x42; // UNMAP: parameter list of one descriptor
                c[7..9].copy_from_slice(&24u16.to_be_bytes());
                (24, false, true)
            }
            8 => {
                c[0] = 0x89; // COMPARE AND WRITE
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[13] = blocks.min(4) as u8;
                (blocks.min(4) * 1024, false, true)
            }
            9 => {
                c[0] = 0x9e;
                c[1] = 0x10; // READ CAPACITY(16)
                c[13] = 32;
                (32, true, false)
            }
            _ => {
                // Anything: a known opcode with random fields, or random bytes.
                let random = self.rng.bytes(16);
                c.copy_from_slice(&random);
                if self.rng.chance(70) {
                    c[0] = self.rng.pick(OPCODES);
                }
                let len = match self.rng.below(4) {
                    0 => 0,
                    1 => self.rng.below(512) as u32,
                    2 => self.rng.below(64 << 10) as u32,
                    _ => self.rng.u32(),
                };
                let dir = self.rng.below(4);
                (len, dir == 1 || dir == 3, dir == 2 || dir == 3)
            }
        };
        (c, len, read, write)
    }

    /// A SCSI Command PDU, with immediate data and possibly a following unsolicited Data-Out.
    fn scsi_command(&mut self) -> Vec<u8> {
        let (cdb, mut edtl, read, write) = self.scsi_cdb();
        if self.rng.chance(5) {
            edtl = self.rng.u32() >> self.rng.below(32);
        }
        let itt = self.itt();
        let immediate = self.rng.chance(5);
        let cmd_sn = self.cmd_sn_for(immediate);
        let payload_len = if write { edtl.min(1 << 20) as usize } else { 0 };
        let payload = self.rng.bytes(payload_len);
        let most_immediate = (payload_len as u32)
            .min(self.first_burst)
            .min(self.max_send) as usize;
        // All the data as immediate data where it fits; or some of it and the rest solicited
        // by R2T; or some, then unsolicited Data-Out up to the first burst, then R2Ts; or an
        // amount that breaks the rules.
        let (first, unsolicited) = match self.rng.below(10) {
            0..=3 => (most_immediate, most_immediate),
            4..=6 => {
                let first = self.rng.below(most_immediate as u64 + 1) as usize;
                (first, first)
            }
            7..=8 => {
                let first = self.rng.below(most_immediate as u64 + 1) as usize;
                (first, payload_len.min(self.first_burst as usize).max(first))
            }
            _ => {
                let first = self.rng.below(payload_len as u64 + 1) as usize;
                (first, payload_len.max(first))
            }
        };
        let h = ScsiCommandHeader {
            immediate,
            final_bit: unsolicited == first || self.rng.chance(5),
            read,
            write,
            attr: if self.rng.chance(90) {
                1
            } else {
                self.rng.below(8) as u8
            },
            lun: self.lun(),
            itt,
            expected_data_transfer_length: edtl,
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn(),
            cdb,
        };
        let mut wire = Vec::new();
        let mut p = Pdu::with_data(h.to_bhs(), payload[..first].to_vec());
        if self.rng.chance(3) {
            // An extended CDB AHS (type 1), sometimes with a lying length.
            let extra = self.rng.below(16) as usize;
            let mut ahs = vec![0u8; 4 + extra];
            ahs[0..2].copy_from_slice(&((1 + extra) as u16).to_be_bytes());
            ahs[2] = if self.rng.chance(80) {
                1
            } else {
                self.rng.below(256) as u8
            };
            ahs[4..].copy_from_slice(&self.rng.bytes(extra));
            if self.rng.chance(30) {
                ahs[1] = self.rng.below(256) as u8;
            }
            ahs.resize(pdu::padded(ahs.len()), 0);
            p.ahs = ahs;
        }
        p.encode(Digests::default(), &mut wire);
        // Unsolicited Data-Out for the rest of the first burst.
        let mut offset = first;
        let mut data_sn = 0;
        while offset < unsolicited && !h.final_bit {
            let n = (unsolicited - offset).min(self.max_send as usize);
            let d = DataOutHeader {
                final_bit: offset + n == unsolicited,
                lun: h.lun,
                itt,
                ttt: RESERVED_TAG,
                exp_stat_sn: self.exp_stat_sn(),
                data_sn,
                buffer_offset: offset as u32,
            };
            Pdu::with_data(d.to_bhs(), payload[offset..offset + n].to_vec())
                .encode(Digests::default(), &mut wire);
            offset += n;
            data_sn += 1;
        }
        wire
    }

    /// Data-Out: the right answer to an R2T, a wrong one, or data nobody asked for.
    fn data_out(&mut self) -> Vec<u8> {
        while let Ok(r) = self.r2ts.try_recv() {
            self.pending_r2ts.push(r);
        }
        let mut wire = Vec::new();
        if let Some(r) = self.pending_r2ts.pop() {
            let honest = self.rng.chance(75);
            let mut offset = r.buffer_offset;
            let end = r.buffer_offset.saturating_add(r.desired_length);
            let mut data_sn = 0u32;
            while offset < end {
                let n = (end - offset).min(self.max_send);
                let mut h = DataOutHeader {
                    final_bit: offset + n == end,
                    lun: r.lun,
                    itt: r.itt,
                    ttt: r.ttt,
                    exp_stat_sn: self.exp_stat_sn(),
                    data_sn,
                    buffer_offset: offset,
                };
                let mut len = n as usize;
                if !honest && self.rng.chance(30) {
                    match self.rng.below(6) {
                        0 => h.ttt = self.rng.u32(),
                        1 => h.buffer_offset = self.rng.u32(),
                        2 => h.data_sn = self.rng.u32(),
                        3 => h.final_bit = !h.final_bit,
                        4 => h.itt = self.rng.u32(),
                        _ => {
                            len =
                                (len + 1 + self.rng.below(4096) as usize).min(OUR_MAX_RECV as usize)
                        }
                    }
                }
                Pdu::with_data(h.to_bhs(), self.rng.bytes(len))
                    .encode(Digests::default(), &mut wire);
                offset += n;
                data_sn += 1;
                if !honest && self.rng.chance(20) {
                    break; // leave the R2T half answered
                }
            }
            return wire;
        }
        // Unsolicited data for a random or recent task, at a random offset.
        let itt = self.itt();
        let h = DataOutHeader {
            final_bit: self.rng.chance(50),
            lun: self.lun(),
            itt,
            ttt: self.reserved_tag_or_any(50),
            exp_stat_sn: self.exp_stat_sn(),
            data_sn: self.rng.below(4) as u32,
            buffer_offset: if self.rng.chance(50) {
                0
            } else {
                self.rng.u32()
            },
        };
        let len = self.rng.below(u64::from(self.max_send) + 1) as usize;
        Pdu::with_data(h.to_bhs(), self.rng.bytes(len)).encode(Digests::default(), &mut wire);
        wire
    }

    fn nop_out(&mut self) -> Vec<u8> {
        let immediate = self.rng.chance(50);
        let itt = if self.rng.chance(20) {
            RESERVED_TAG
        } else {
            self.itt()
        };
        let h = RequestHeader {
            opcode: Opcode::NopOut,
            immediate,
            final_bit: true,
            cont: false,
            lun: self.lun(),
            itt,
            ttt: self.reserved_tag_or_any(80),
            cmd_sn: self.cmd_sn_for(immediate),
            exp_stat_sn: self.exp_stat_sn(),
        };
        let len = if self.rng.chance(80) {
            self.rng.below(256)
        } else {
            self.rng.below(u64::from(self.max_send) + 1)
        } as usize;
        encode(Pdu::with_data(h.to_bhs(), self.rng.bytes(len)))
    }

    fn text(&mut self) -> Vec<u8> {
        let keys: &[&[u8]] = &[
            b"SendTargets=All\0",
            b"SendTargets=\0",
            b"MaxRecvDataSegmentLength=512\0",
            b"MaxRecvDataSegmentLength=99999999999\0",
            b"X-foo=bar\0",
            b"HeaderDigest=CRC32C\0",
            b"=\0",
            b"novalue\0",
        ];
        let mut data = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            data.extend_from_slice(self.rng.pick(keys));
        }
        if self.rng.chance(20) {
            let n = self.rng.below(2048) as usize;
            data = self.rng.bytes(n);
        }
        let immediate = self.rng.chance(30);
        let h = RequestHeader {
            opcode: Opcode::TextRequest,
            immediate,
            final_bit: self.rng.chance(80),
            cont: self.rng.chance(20),
            lun: [0; 8],
            itt: self.itt(),
            ttt: self.reserved_tag_or_any(80),
            cmd_sn: self.cmd_sn_for(immediate),
            exp_stat_sn: self.exp_stat_sn(),
        };
        encode(Pdu::with_data(h.to_bhs(), data))
    }

    fn task_management(&mut self) -> Vec<u8> {
        let immediate = self.rng.chance(80);
        let referenced = if self.rng.chance(70) && !self.recent_itts.is_empty() {
            self.rng.pick(&self.recent_itts.clone())
        } else {
            self.rng.u32()
        };
        let h = TaskManagementRequestHeader {
            immediate,
            // Functions 1-8 and some undefined ones; cold resets end the connection.
            function: self
                .rng
                .pick(&[1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 15, 127]),
            lun: self.lun(),
            itt: self.itt(),
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn_for(immediate),
            exp_stat_sn: self.exp_stat_sn(),
            ref_cmd_sn: self.cmd_sn.wrapping_sub(self.rng.below(8) as u32),
            exp_data_sn: self.rng.below(4) as u32,
        };
        encode(Pdu::new(h.to_bhs()))
    }

    fn snack_or_unknown(&mut self) -> Vec<u8> {
        let mut wire = Vec::new();
        if self.rng.chance(30) {
            let h = SnackHeader {
                snack_type: self.rng.below(4) as u8,
                lun: self.lun(),
                itt: self.itt(),
                ttt: self.rng.u32(),
                exp_stat_sn: self.exp_stat_sn(),
                beg_run: self.rng.below(4) as u32,
                run_length: self.rng.below(4) as u32,
            };
            Pdu::new(h.to_bhs()).encode(Digests::default(), &mut wire);
        } else {
            // Any opcode, consistent framing, random fields.
            let mut bhs = Bhs(self.rng.bytes(BHS_LEN).try_into().unwrap());
            bhs.0[0] = self.rng.below(0x40) as u8 | if self.rng.chance(50) { 0x40 } else { 0 };
            bhs.0[4] = 0;
            let len = self.rng.below(1024) as usize;
            Pdu::with_data(bhs, self.rng.bytes(len)).encode(Digests::default(), &mut wire);
        }
        wire
    }

    /// A valid PDU with its header damaged.
    fn mutated(&mut self) -> Vec<u8> {
        let mut wire = match self.rng.below(4) {
            0 => self.scsi_command(),
            1 => self.nop_out(),
            2 => self.task_management(),
            _ => self.data_out(),
        };
        match self.rng.below(4) {
            0 => {
                for _ in 0..1 + self.rng.below(4) {
                    let bit = self.rng.below(BHS_LEN as u64 * 8) as usize;
                    wire[bit / 8] ^= 1 << (bit % 8);
                }
            }
            1 => {
                // DataSegmentLength that disagrees with what follows.
                let len = match self.rng.below(3) {
                    0 => self.rng.below(1 << 24) as u32,
                    1 => self.rng.below(u64::from(self.max_send) + 1) as u32,
                    _ => 0,
                };
                wire[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
            }
            2 => {
                // TotalAHSLength that disagrees with what follows.
                wire[4] = self.rng.below(256) as u8;
            }
            _ => {
                let at = self.rng.below(wire.len() as u64) as usize;
                wire[at] = self.rng.below(256) as u8;
            }
        }
        wire
    }

    /// A well-framed PDU whose every header field is random except the framing ones.
    fn padded_garbage(&mut self) -> Vec<u8> {
        let mut bhs = Bhs(self.rng.bytes(BHS_LEN).try_into().unwrap());
        bhs.0[0] &= 0x7f;
        let ahs = if self.rng.chance(20) {
            let n = 4 * self.rng.below(8) as usize;
            self.rng.bytes(n)
        } else {
            Vec::new()
        };
        let n = self.rng.below(u64::from(self.max_send.min(8192)) + 1) as usize;
        let mut p = Pdu::with_data(bhs, self.rng.bytes(n));
        p.ahs = ahs;
        encode(p)
    }

    fn logout(&mut self) -> Vec<u8> {
        let h = LogoutRequestHeader {
            immediate: self.rng.chance(50),
            reason: self.rng.below(4) as u8,
            itt: self.itt(),
            cid: self.rng.below(3) as u16,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn(),
        };
        encode(Pdu::new(h.to_bhs()))
    }

    fn send(&mut self, wire: &[u8]) -> Result<(), End> {
        self.stream.write_all(wire).map_err(|_| End::ClosedByServer)
    }

    fn step(&mut self) -> Result<(), End> {
        // Damaged framing usually ends the connection (the byte stream cannot be trusted
        // any more), so it is rarer than well-framed nonsense.
        let wire = match self.rng.below(1000) {
            0..=399 => self.scsi_command(),
            400..=629 => self.data_out(),
            630..=719 => self.nop_out(),
            720..=779 => self.text(),
            780..=869 => self.task_management(),
            870..=929 => self.snack_or_unknown(),
            930..=969 => self.mutated(),
            970..=990 => self.padded_garbage(),
            991..=993 => {
                let n = 1 + self.rng.below(300) as usize;
                self.rng.bytes(n)
            }
            994..=996 => {
                let wire = self.logout();
                self.send(&wire)?;
                return Err(End::Done);
            }
            _ => {
                // A truncated PDU, then close.
                let wire = self.scsi_command();
                let cut = self.rng.below(wire.len() as u64) as usize;
                self.send(&wire[..cut])?;
                return Err(End::Done);
            }
        };
        self.send(&wire)
    }
}

/// Hostile connections one after the other until `steps` fuzz steps are done.
fn hostile_initiator(t: &Target, seed: u64, steps: usize) -> Result<Stats, String> {
    let mut total = Stats {
        steps: 0,
        pdus: 0,
        by_opcode: [0; 64],
        connections: 0,
        closed_by_server: 0,
    };
    while total.steps < steps {
        let s = hostile_connection(
            t,
            seed.wrapping_add(total.connections as u64),
            steps - total.steps,
        )?;
        total.steps += s.steps.max(1);
        total.pdus += s.pdus;
        for (t, n) in total.by_opcode.iter_mut().zip(s.by_opcode) {
            *t += n;
        }
        total.connections += 1;
        total.closed_by_server += s.closed_by_server;
    }
    Ok(total)
}

/// One hostile connection: logs in properly, then runs at most `steps` fuzz steps.
fn hostile_connection(t: &Target, seed: u64, steps: usize) -> Result<Stats, String> {
    let raw = Session::connect(&t.url(0), options(HOSTILE))
        .and_then(Session::into_raw)
        .map_err(|e| format!("hostile login failed: {e}"))?;
    let observed = Arc::new(Observed::new(raw.cmd_sn, raw.exp_stat_sn));
    let (r2t_tx, r2t_rx) = mpsc::channel();
    let reader_stream = raw.stream.try_clone().unwrap();
    let reader_observed = observed.clone();
    let reader = std::thread::spawn(move || read_target(reader_stream, reader_observed, r2t_tx));
    raw.stream.set_write_timeout(Some(PATIENCE)).unwrap();
    let mut f = Fuzzer {
        stream: raw.stream,
        rng: Rng::new(seed),
        cmd_sn: raw.cmd_sn,
        next_itt: raw.next_itt,
        recent_itts: Vec::new(),
        r2ts: r2t_rx,
        pending_r2ts: Vec::new(),
        observed: observed.clone(),
        first_burst: raw.negotiated.first_burst_length,
        max_send: raw.negotiated.target_max_recv_data_segment_length,
    };
    let mut done = 0;
    let mut closed_by_server = 0;
    for _ in 0..steps {
        done += 1;
        match f.step() {
            Ok(()) => {}
            Err(End::ClosedByServer) => {
                closed_by_server = 1;
                break;
            }
            Err(End::Done) => break,
        }
    }
    let _ = f.stream.shutdown(Shutdown::Both);
    reader
        .join()
        .map_err(|_| "reader thread panicked".to_string())?;
    let malformed = observed.malformed.lock().unwrap();
    if !malformed.is_empty() {
        return Err(format!("the target sent malformed output: {malformed:?}"));
    }
    Ok(Stats {
        steps: done,
        pdus: observed.pdus.load(SeqCst),
        by_opcode: std::array::from_fn(|i| observed.by_opcode[i].load(SeqCst)),
        connections: 1,
        closed_by_server,
    })
}

struct Stats {
    steps: usize,
    pdus: u64,
    by_opcode: [u64; 64],
    connections: usize,
    closed_by_server: usize,
}

fn fuzz(rounds: usize, connections: usize, steps: usize) {
    let seed: u64 = std::env::var("SLIVER_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0f51_17e5);
    eprintln!(
        "hostile fuzz: seed {seed}, {rounds} rounds of {connections} connections x {steps} steps"
    );
    let t = start(fuzz_and_check_volumes, |server| {
        server.set_timeouts(Timeouts {
            login: Duration::from_secs(5),
            stall: Duration::from_secs(2),
            ping_after: Duration::from_millis(500),
            idle: Duration::from_secs(10),
        })
    });
    well_behaved_session(&t, seed);
    let baseline = resident_bytes();
    let (mut total_steps, mut total_pdus) = (0, 0);
    let mut by_opcode = [0u64; 64];
    for round in 0..rounds {
        let seeds: Vec<u64> = (0..connections)
            .map(|c| {
                seed.wrapping_mul(1_000_003)
                    .wrapping_add((round * connections + c) as u64)
            })
            .collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = seeds
                .iter()
                .map(|&conn_seed| {
                    let t = &t;
                    scope.spawn(move || (conn_seed, hostile_initiator(t, conn_seed, steps)))
                })
                .collect();
            for h in handles {
                let (conn_seed, result) = h.join().expect("hostile connection thread");
                match result {
                    Ok(stats) => {
                        total_steps += stats.steps;
                        total_pdus += stats.pdus;
                        for (t, n) in by_opcode.iter_mut().zip(stats.by_opcode) {
                            *t += n;
                        }
                        eprintln!(
                            "round {round} seed {conn_seed}: {} steps, {} PDUs back, {} connections ({} closed by the server)",
                            stats.steps, stats.pdus, stats.connections, stats.closed_by_server
                        );
                    }
                    Err(e) => panic!("round {round}, connection seed {conn_seed}: {e}"),
                }
            }
        });
        t.assert_healthy();
        well_behaved_session(&t, seed.wrapping_add(round as u64));
        t.assert_healthy();
        eprintln!(
            "round {round}: resident memory {} MiB",
            resident_bytes() >> 20
        );
    }
    let answers: Vec<String> = by_opcode
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(op, n)| format!("{:?} {n}", Opcode::from_u8(op as u8)))
        .collect();
    eprintln!(
        "{total_steps} hostile steps, {total_pdus} PDUs from the target: {}",
        answers.join(", ")
    );
    // Every hostile connection ended with our close: the server let go of all of them.
    t.wait_for_connections(0);
    t.wait_for_sessions(0);
    t.assert_healthy();
    let grown = resident_bytes().saturating_sub(baseline);
    eprintln!("resident memory grew by {} MiB", grown >> 20);
    assert!(
        grown < 1 << 30,
        "resident memory grew by {} MiB over the fuzz run",
        grown >> 20
    );
}

fn rounds_from_env(default: usize) -> usize {
    std::env::var("SLIVER_HOSTILE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn stateful_fuzzer_against_a_live_server() {
    fuzz(rounds_from_env(6), 3, 500);
}

#[test]
#[ignore = "long run: cargo test -p sliver-server --test hostile -- --ignored"]
fn stateful_fuzzer_long() {
    fuzz(rounds_from_env(200), 4, 1000);
}

// ---------------------------------------------------------------------------------------------
// Stalled, silent and non-reading initiators

fn encode(p: Pdu) -> Vec<u8> {
    let mut wire = Vec::new();
    p.encode(Digests::default(), &mut wire);
    wire
}

/// A SCSI command PDU on LUN 0 from a raw connection, consuming its next CmdSN.
fn raw_command(raw: &mut RawConnection, cdb: &[u8], edtl: u32, read: bool, write: bool) -> Pdu {
    let mut c = [0u8; 16];
    c[..cdb.len()].copy_from_slice(cdb);
    let h = ScsiCommandHeader {
        immediate: false,
        final_bit: true,
        read,
        write,
        attr: 1,
        lun: pdu::encode_lun(0),
        itt: raw.next_itt,
        expected_data_transfer_length: edtl,
        cmd_sn: raw.cmd_sn,
        exp_stat_sn: raw.exp_stat_sn,
        cdb: c,
    };
    raw.next_itt += 1;
    raw.cmd_sn = raw.cmd_sn.wrapping_add(1);
    Pdu::new(h.to_bhs())
}

/// A READ(16) CDB.
fn read16_cdb(lba: u64, blocks: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// A Data-In or SCSI Response PDU from a raw connection.
struct Reply {
    itt: u32,
    /// A Data-In's buffer offset and data.
    data_in: Option<(u32, Vec<u8>)>,
    /// Set when the PDU ends its command.
    status: Option<u8>,
}

/// Reads until the next Data-In or SCSI Response.
fn next_reply(raw: &mut RawConnection) -> Reply {
    let p = read_until(raw, |p| {
        matches!(p.bhs.opcode(), Opcode::DataIn | Opcode::ScsiResponse)
    });
    if p.bhs.opcode() == Opcode::DataIn {
        let h = pdu::DataInHeader::parse(&p.bhs);
        Reply {
            itt: h.itt,
            data_in: Some((h.buffer_offset, p.data)),
            status: h.has_status.then_some(h.status),
        }
    } else {
        let h = pdu::ScsiResponseHeader::parse(&p.bhs);
        Reply {
            itt: h.itt,
            data_in: None,
            status: Some(h.status),
        }
    }
}

/// Reads PDUs from a raw connection until `want` matches one (which is returned).
fn read_until(raw: &mut RawConnection, want: impl Fn(&Pdu) -> bool) -> Pdu {
    raw.stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if raw.pending.len() >= BHS_LEN {
            let bhs = Bhs(raw.pending[..BHS_LEN].try_into().unwrap());
            let len = pdu::wire_len(&bhs, Digests::default(), OUR_MAX_RECV).unwrap();
            if raw.pending.len() >= len {
                let p = pdu::decode(&raw.pending[..len], Digests::default()).unwrap();
                raw.pending.drain(..len);
                if want(&p) {
                    return p;
                }
                continue;
            }
        }
        let n = raw.stream.read(&mut buf).expect("a PDU from the target");
        assert!(n > 0, "the target closed the connection");
        raw.pending.extend_from_slice(&buf[..n]);
    }
}

/// A target over the `fuzz` and `check` volumes with `timeouts`.
fn start_with_timeouts(timeouts: Timeouts) -> Target {
    start(fuzz_and_check_volumes, |s| s.set_timeouts(timeouts))
}

/// A target over the `fuzz` and `check` volumes whose stall timeout is `stall`.
fn start_with_stall(stall: Duration) -> Target {
    start_with_timeouts(Timeouts {
        stall,
        ..Timeouts::default()
    })
}

fn short_stall() -> Timeouts {
    Timeouts {
        stall: Duration::from_millis(300),
        ping_after: Duration::from_secs(60),
        idle: Duration::from_secs(120),
        ..Timeouts::default()
    }
}

/// A hostile initiator logs in to a target with [`short_stall`] timeouts and does `stall`;
/// the target closes its connection and lets go of it.
fn stalled_initiator_is_disconnected(stall: impl FnOnce(&mut RawConnection)) -> Target {
    let t = start_with_timeouts(short_stall());
    let mut raw = raw_login(&t, HOSTILE);
    stall(&mut raw);
    expect_closed_by_server(&mut raw.stream);
    t.wait_for_connections(0);
    t
}

#[test]
fn an_initiator_stalled_in_the_middle_of_a_pdu_is_disconnected() {
    let t = stalled_initiator_is_disconnected(|raw| {
        let wire = encode(raw_command(raw, &[0x88], 512, true, false));
        // Half a header, then nothing.
        raw.stream.write_all(&wire[..20]).unwrap();
    });
    t.wait_for_sessions(0);
    well_behaved_session(&t, 1);
    t.assert_healthy();
}

#[test]
fn an_initiator_that_never_sends_solicited_data_is_disconnected() {
    let t = stalled_initiator_is_disconnected(|raw| {
        // WRITE(16) of 64 KiB without immediate data: the target asks with an R2T.
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        cdb[13] = 128;
        let cmd = raw_command(raw, &cdb, 64 << 10, false, true);
        raw.stream.write_all(&encode(cmd)).unwrap();
        read_until(raw, |p| p.bhs.opcode() == Opcode::ReadyToTransfer);
    });
    well_behaved_session(&t, 2);
    t.assert_healthy();
}

#[test]
fn an_initiator_that_leaves_a_cmd_sn_gap_is_disconnected() {
    let t = stalled_initiator_is_disconnected(|raw| {
        // CmdSN n is never sent; n+1 waits for it, holding its slot and data.
        raw.cmd_sn = raw.cmd_sn.wrapping_add(1);
        let cmd = raw_command(raw, &[0x00], 0, false, false);
        raw.stream.write_all(&encode(cmd)).unwrap();
    });
    well_behaved_session(&t, 3);
    t.assert_healthy();
}

#[test]
fn an_idle_session_with_nothing_pending_is_not_a_stall() {
    // The stall timeout is short, the idle timeout long: a logged-in initiator that simply has
    // nothing to do keeps its session.
    let t = start_with_timeouts(short_stall());
    let mut s = Session::connect(&t.url(0), options(GOOD)).unwrap();
    s.test_unit_ready().unwrap();
    std::thread::sleep(short_stall().stall * 5);
    s.test_unit_ready()
        .expect("the idle session is still served");
    assert_eq!(t.server.session_count(), 1);
    s.logout().unwrap();
}

#[test]
fn a_silent_initiator_is_pinged_and_disconnected_one_that_answers_stays() {
    let timeouts = Timeouts {
        ping_after: Duration::from_millis(200),
        idle: Duration::from_secs(2),
        ..Timeouts::default()
    };
    let t = start_with_timeouts(timeouts);
    let mut answering = raw_login(&t, GOOD);
    let mut silent = raw_login(&t, HOSTILE);

    // One that ignores the pings is disconnected.
    let silent_thread = std::thread::spawn(move || {
        let ping = read_until(&mut silent, |p| p.bhs.opcode() == Opcode::NopIn);
        let h = ReplyHeader::parse(&ping.bhs);
        assert_ne!(
            h.ttt, RESERVED_TAG,
            "an unsolicited NOP-In asks for an answer"
        );
        expect_closed_by_server(&mut silent.stream);
    });

    // One that answers every ping keeps its session well past the idle timeout.
    let until = Instant::now() + timeouts.idle * 2;
    let mut answered = 0;
    answering
        .stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = vec![0u8; 4096];
    while Instant::now() < until {
        match answering.stream.read(&mut buf) {
            Ok(0) => panic!("the session that answers its pings was closed"),
            Ok(n) => answering.pending.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
        while answering.pending.len() >= BHS_LEN {
            let ping = pdu::decode(&answering.pending[..BHS_LEN], Digests::default()).unwrap();
            answering.pending.drain(..BHS_LEN);
            assert_eq!(ping.bhs.opcode(), Opcode::NopIn, "only pings while idle");
            let h = ReplyHeader::parse(&ping.bhs);
            let answer = answering.ping_answer(&h);
            answering
                .stream
                .write_all(&encode(Pdu::new(answer.to_bhs())))
                .unwrap();
            answered += 1;
        }
    }
    assert!(answered >= 2, "{answered} pings answered");
    let cmd = raw_command(&mut answering, &[0x00], 0, false, false);
    let itt = cmd.bhs.itt();
    answering.stream.write_all(&encode(cmd)).unwrap();
    read_until(&mut answering, |p| {
        p.bhs.opcode() == Opcode::ScsiResponse && p.bhs.itt() == itt
    });
    silent_thread.join().unwrap();
    t.wait_for_connections(1);
    t.assert_healthy();
}

#[test]
fn an_initiator_that_stops_reading_is_disconnected() {
    let t = start_with_stall(Duration::from_millis(500));
    let mut raw = raw_login(&t, HOSTILE);
    // Queue 64 MiB of reads and never read the answers: the socket buffers fill, the
    // target's writer cannot make progress and gives up.
    let mut wire = Vec::new();
    for i in 0..64u64 {
        let cdb = read16_cdb(i * 2048, 2048);
        wire.extend(encode(raw_command(&mut raw, &cdb, 1 << 20, true, false)));
    }
    raw.stream.write_all(&wire).unwrap();
    t.wait_for_connections(0);
    t.wait_for_sessions(0);
    // What the kernel had buffered for us may still be readable; then the connection ends
    // with a reset or an end of file.
    expect_closed_by_server(&mut raw.stream);
    well_behaved_session(&t, 4);
    t.assert_healthy();
}

/// An initiator that queues a full CmdSN window of 1 MiB reads and reads nothing: commands
/// hold their share of the connection's 64 MiB execution budget until the socket has taken
/// their responses, so at most about that much is executed and held, not the whole window.
#[test]
fn a_reader_that_does_not_read_holds_at_most_the_execution_budget() {
    let t = start_with_stall(Duration::from_secs(60));
    let mut raw = raw_login(&t, HOSTILE);
    let unit = t
        .array
        .unit("fuzz")
        .expect("the fuzz volume's logical unit");
    let reads = || {
        unit.stats()
            .class(sliver_scsi::stats::CommandClass::Read)
            .commands
    };
    let before = reads();
    let mut wire = Vec::new();
    for i in 0..120u64 {
        let cdb = read16_cdb((i % 60) * 2048, 2048);
        wire.extend(encode(raw_command(&mut raw, &cdb, 1 << 20, true, false)));
    }
    raw.stream.write_all(&wire).unwrap();
    // Wait until execution stops making progress.
    let mut last = reads();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = reads();
        if now == last {
            break;
        }
        last = now;
    }
    let executed = last - before;
    // 64 MiB of budget, plus what the kernel's socket buffers took (a few MiB on loopback).
    assert!(
        (32..=96).contains(&executed),
        "{executed} of 120 queued 1 MiB reads executed while the initiator read nothing"
    );
    // Reading now lets the rest through.
    let mut completed = 0;
    while completed < 120 {
        completed += next_reply(&mut raw).status.is_some() as usize;
    }
    t.assert_healthy();
}

/// Responses are written by the threads that execute commands when nothing is queued ahead
/// of them, and by the connection's writer task otherwise. An initiator that reads slowly
/// while it keeps sending makes both happen on one connection all the time: every Data-In
/// must still arrive whole, in order and with the right bytes, and every command complete.
#[test]
fn responses_stay_whole_and_in_order_when_the_initiator_reads_slowly() {
    let t = start(fuzz_and_check_volumes, |_| {});
    const SPAN: u64 = 8 << 20;
    const COMMANDS: usize = 600;
    const OUTSTANDING: usize = 48;
    let mut rng = Rng::new(11);
    let pattern = Arc::new(rng.bytes(SPAN as usize));
    let mut s = Session::connect(&t.url(0), options(GOOD)).unwrap();
    s.test_unit_ready().unwrap();
    for (i, piece) in pattern.chunks(1 << 20).enumerate() {
        s.write16(i as u64 * 2048, piece.to_vec()).unwrap();
    }
    let mut raw = s.into_raw().unwrap();
    // Reads of 256 KiB and more run on the blocking pool, 4 KiB reads on the quick pool:
    // their completions race to write.
    let mut expected = std::collections::HashMap::new();
    let mut pdus = Vec::new();
    for i in 0..COMMANDS {
        let blocks: u32 = if i % 4 == 0 { 1024 } else { 8 };
        let lba = rng.below(SPAN / 512 - blocks as u64);
        let cdb = read16_cdb(lba, blocks);
        let start = lba as usize * 512;
        expected.insert(raw.next_itt, start..start + blocks as usize * 512);
        pdus.push(encode(raw_command(
            &mut raw,
            &cdb,
            blocks * 512,
            true,
            false,
        )));
    }
    let completed = Arc::new(AtomicU64::new(0));
    let mut sender = raw.stream.try_clone().unwrap();
    let sent = {
        let completed = completed.clone();
        std::thread::spawn(move || {
            for (i, p) in pdus.iter().enumerate() {
                let deadline = Instant::now() + PATIENCE;
                while i as u64 >= completed.load(SeqCst) + OUTSTANDING as u64 {
                    assert!(Instant::now() < deadline, "no progress after {i} commands");
                    std::thread::sleep(Duration::from_micros(200));
                }
                sender.write_all(p).unwrap();
            }
        })
    };
    let mut received: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    let mut reads = 0u32;
    while (completed.load(SeqCst) as usize) < COMMANDS {
        // Read late now and then, so the socket fills and output queues for the writer.
        reads += 1;
        if reads.is_multiple_of(16) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let Reply {
            itt,
            data_in,
            status,
        } = next_reply(&mut raw);
        if let Some((offset, data)) = data_in {
            let got = received.entry(itt).or_default();
            assert_eq!(
                offset as usize,
                got.len(),
                "Data-In for ITT {itt} out of order"
            );
            got.extend_from_slice(&data);
        }
        if let Some(status) = status {
            assert_eq!(status, 0, "ITT {itt} did not complete with GOOD");
            let range = expected
                .get(&itt)
                .expect("a response for a command we sent");
            assert!(
                received.remove(&itt).as_deref() == Some(&pattern[range.clone()]),
                "ITT {itt} read back the wrong bytes"
            );
            completed.fetch_add(1, SeqCst);
        }
    }
    sent.join().unwrap();
    t.assert_healthy();
}

// ---------------------------------------------------------------------------------------------
// Session and connection limits

#[test]
fn sessions_past_the_limit_are_refused_with_out_of_resources() {
    let t = start(fuzz_and_check_volumes, |s| s.set_max_sessions(2));
    let first = Session::connect(&t.url(0), options(GOOD)).unwrap();
    let second = Session::connect(&t.url(0), options(GOOD)).unwrap();
    match Session::connect(&t.url(0), options(GOOD)) {
        Err(Error::Login { message, .. }) => {
            assert!(message.contains("OutOfResources"), "{message}")
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a third session was admitted past the limit of two"),
    }
    assert_eq!(t.server.session_count(), 2);
    first.logout().unwrap();
    t.wait_for_sessions(1);
    let mut third =
        Session::connect(&t.url(0), options(GOOD)).expect("a session slot is free again");
    third.test_unit_ready().unwrap();
    drop(second);
    drop(third);
    t.wait_for_sessions(0);
    t.assert_healthy();
}

#[test]
fn connections_past_the_limit_are_closed_at_once() {
    let t = start(fuzz_and_check_volumes, |s| s.set_max_connections(2));
    let session = Session::connect(&t.url(0), options(GOOD)).unwrap();
    let idle = TcpStream::connect(t.addr).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while t.server.open_connections() < 2 {
        assert!(
            Instant::now() < deadline,
            "the idle connection was not counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut refused = TcpStream::connect(t.addr).unwrap();
    expect_closed_by_server(&mut refused);
    assert!(
        Session::connect(&t.url(0), options(GOOD)).is_err(),
        "no login past the connection limit"
    );
    drop(idle);
    t.wait_for_connections(1);
    let mut again =
        Session::connect(&t.url(0), options(GOOD)).expect("a connection slot is free again");
    again.test_unit_ready().unwrap();
    again.logout().unwrap();
    session.logout().unwrap();
    t.assert_healthy();
}

// ---------------------------------------------------------------------------------------------
// Access control on third-party copy

/// EXTENDED COPY (LID1) parameter list: identification CSCDs by NAA, block-to-block segments
/// (source CSCD, destination CSCD, blocks, source LBA, destination LBA).
fn xcopy_list(
    list_id: u8,
    tracked: bool,
    naas: &[[u8; 16]],
    segments: &[(u16, u16, u16, u64, u64)],
) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = if tracked { 0 } else { 0x18 }; // LIST ID USAGE 00b or 11b
    p[2..4].copy_from_slice(&((32 * naas.len()) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&((28 * segments.len()) as u32).to_be_bytes());
    for naa in naas {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01; // binary
        d[5] = 0x03; // LU association, NAA
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[29..32].copy_from_slice(&512u32.to_be_bytes()[1..]);
        p.extend_from_slice(&d);
    }
    for &(src, dst, blocks, src_lba, dst_lba) in segments {
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        p.extend_from_slice(&d);
    }
    p
}

fn extended_copy(list: Vec<u8>) -> OutgoingCommand {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(list.len() as u32).to_be_bytes());
    OutgoingCommand::new(cdb).with_data_out(list)
}

fn receive_copy_status(list_id: u8) -> OutgoingCommand {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x84;
    cdb[1] = 0x00; // COPY STATUS
    cdb[2] = list_id;
    cdb[10..14].copy_from_slice(&64u32.to_be_bytes());
    OutgoingCommand::new(cdb).with_data_in(64)
}

fn check(c: &sliver_initiator::Completion) -> (SenseKey, u8, u8) {
    assert_eq!(c.status, 0x02, "CHECK CONDITION expected, got {c:?}");
    let s = c.sense.as_ref().expect("sense data");
    (s.key, s.asc, s.ascq)
}

const COPY_TARGET_NOT_REACHABLE: (SenseKey, u8, u8) = (SenseKey::CopyAborted, 0x0d, 0x02);

fn session_as(t: &Target, initiator: &str, lun: u64) -> Session {
    let mut s = Session::connect(&t.url(lun), options(initiator)).unwrap();
    s.test_unit_ready().unwrap();
    s
}

#[test]
fn extended_copy_cannot_reach_a_volume_the_initiator_is_not_connected_to() {
    let t = start(two_hosts_two_volumes, |_| {});
    let naa_a = t.array.unit("a").unwrap().naa();
    let naa_b = t.array.unit("b").unwrap().naa();
    let mut a = session_as(&t, HOST_A, 0);
    let mut b = session_as(&t, HOST_B, 0);
    let secret = vec![0x5b; 8 * 512];
    b.write16(0, secret.clone()).unwrap();
    let mine = vec![0xa1; 8 * 512];
    a.write16(0, mine.clone()).unwrap();

    // Host A copies b into a (reading someone else's volume) and a into b (writing it).
    let steal = || extended_copy(xcopy_list(1, true, &[naa_b, naa_a], &[(0, 1, 8, 0, 0)]));
    let clobber = || extended_copy(xcopy_list(2, true, &[naa_a, naa_b], &[(0, 1, 8, 0, 0)]));
    for cmd in [steal(), clobber()] {
        let c = a.execute(cmd).unwrap();
        assert_eq!(check(&c), COPY_TARGET_NOT_REACHABLE);
    }
    assert_eq!(a.read16(0, 8).unwrap(), mine, "nothing of b reached a");
    assert_eq!(b.read16(0, 8).unwrap(), secret, "b is untouched");

    // The same lists work once host A is connected to b: the descriptors were right, only
    // access was missing.
    t.array.connect("b", "host-a", Some(1)).unwrap();
    let c = a.execute(steal()).unwrap();
    assert!(c.is_good(), "{c:?}");
    assert_eq!(a.read16(0, 8).unwrap(), secret);
    // Disconnecting takes the access away again, for the session already logged in.
    t.array.disconnect("b", "host-a").unwrap();
    let c = a.execute(clobber()).unwrap();
    assert_eq!(check(&c), COPY_TARGET_NOT_REACHABLE);
    assert_eq!(b.read16(0, 8).unwrap(), secret);
    t.assert_healthy();
}

#[test]
fn copy_results_belong_to_the_nexus_that_ran_the_copy() {
    let t = start(
        |array| {
            hosts::two_hosts(
                array,
                &[("shared", 8 << 20), ("own", 8 << 20)],
                &[
                    ("shared", "host-a", 0),
                    ("shared", "host-b", 0),
                    ("own", "host-a", 1),
                ],
            )
        },
        |_| {},
    );
    let naa = t.array.unit("shared").unwrap().naa();
    let mut a = session_as(&t, HOST_A, 0);
    let c = a
        .execute(extended_copy(xcopy_list(
            0x42,
            true,
            &[naa],
            &[(0, 0, 16, 0, 1024)],
        )))
        .unwrap();
    assert!(c.is_good(), "{c:?}");
    let status = a.execute(receive_copy_status(0x42)).unwrap();
    assert!(status.is_good(), "{status:?}");
    assert_eq!(
        status.data[4], 0x01,
        "COPY STATUS: completed without errors"
    );

    // Another initiator on the same LU, and another session (another ISID, so another I_T
    // nexus) of the same initiator, see no copy with that list identifier.
    let mut b = session_as(&t, HOST_B, 0);
    let mut a2 = session_as(&t, HOST_A, 0);
    for s in [&mut b, &mut a2] {
        let c = s.execute(receive_copy_status(0x42)).unwrap();
        assert_eq!(check(&c), (SenseKey::IllegalRequest, 0x24, 0x00));
    }
    // An LU the initiator is not connected to does not answer at all.
    let c = b.execute(receive_copy_status(0x42).on_lun(1)).unwrap();
    assert_eq!(check(&c), (SenseKey::IllegalRequest, 0x25, 0x00));
    // The owner still can.
    let status = a.execute(receive_copy_status(0x42)).unwrap();
    assert!(status.is_good(), "{status:?}");
    t.assert_healthy();
}

fn two_hosts_two_volumes(array: &Array) {
    hosts::two_hosts(
        array,
        &[("a", 8 << 20), ("b", 8 << 20)],
        &[("a", "host-a", 0), ("b", "host-b", 0)],
    );
}

/// Sends a task management request on a raw connection and returns the response code.
fn raw_tmf(raw: &mut RawConnection, function: u8, lun: u64) -> u8 {
    let itt = raw.next_itt;
    raw.next_itt += 1;
    let h = TaskManagementRequestHeader {
        immediate: true,
        function,
        lun: pdu::encode_lun(lun),
        itt,
        referenced_task_tag: RESERVED_TAG,
        cmd_sn: raw.cmd_sn,
        exp_stat_sn: raw.exp_stat_sn,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    raw.stream.write_all(&encode(Pdu::new(h.to_bhs()))).unwrap();
    let r = read_until(raw, |p| {
        p.bhs.opcode() == Opcode::TaskManagementResponse && p.bhs.itt() == itt
    });
    r.bhs.0[2]
}

#[test]
fn task_management_reaches_only_the_initiators_own_logical_units() {
    let t = start(two_hosts_two_volumes, |_| {});
    let mut a = raw_login(&t, HOST_A);
    let mut b = session_as(&t, HOST_B, 0);
    const LUN_DOES_NOT_EXIST: u8 = 2;
    for function in [2, 4, 5] {
        // ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET on a LUN host A does not have.
        assert_eq!(raw_tmf(&mut a, function, 5), LUN_DOES_NOT_EXIST);
    }
    // A target warm reset from host A resets host A's logical units, not host B's.
    assert_eq!(raw_tmf(&mut a, 6, 0), 0);
    let c = b.execute(cdb::test_unit_ready()).unwrap();
    assert!(c.is_good(), "host B sees no reset: {c:?}");
    // Positive control: host A's own LU reports the reset.
    assert_eq!(
        raw_sense_of_test_unit_ready(&mut a).0,
        SenseKey::UnitAttention
    );
    t.assert_healthy();
}

/// TEST UNIT READY on a raw connection, which must end in CHECK CONDITION: its sense key,
/// ASC and ASCQ.
fn raw_sense_of_test_unit_ready(raw: &mut RawConnection) -> (SenseKey, u8, u8) {
    let tur = raw_command(raw, &[0x00], 0, false, false);
    let itt = tur.bhs.itt();
    raw.stream.write_all(&encode(tur)).unwrap();
    let r = read_until(raw, |p| {
        p.bhs.opcode() == Opcode::ScsiResponse && p.bhs.itt() == itt
    });
    assert_eq!(r.bhs.0[3], 0x02, "CHECK CONDITION");
    let sense = sliver_initiator::Sense::parse(&r.data[2..]).expect("sense data");
    (sense.key, sense.asc, sense.ascq)
}

/// A target where host A and host B both see one 8 MiB volume at LUN 0 (a cluster's
/// datastore, or two paths of one host), and its block size.
fn shared_volume() -> (Target, u32) {
    let t = start(
        |array| {
            hosts::two_hosts(
                array,
                &[("shared", 8 << 20)],
                &[("shared", "host-a", 0), ("shared", "host-b", 0)],
            )
        },
        |_| {},
    );
    let bs = session_as(&t, HOST_B, 0).block_size().unwrap();
    (t, bs)
}

/// Sends a command with `data` as immediate data; returns its task tag.
fn raw_send_with_data(raw: &mut RawConnection, cdb: &[u8], data: Vec<u8>) -> u32 {
    let mut cmd = raw_command(raw, cdb, data.len() as u32, false, true);
    let itt = cmd.bhs.itt();
    cmd.bhs.set_data_segment_length(data.len() as u32);
    cmd.data = data;
    raw.stream.write_all(&encode(cmd)).unwrap();
    itt
}

/// The status of the SCSI Response to `itt`.
fn raw_status(raw: &mut RawConnection, itt: u32) -> u8 {
    let r = read_until(raw, |p| {
        p.bhs.opcode() == Opcode::ScsiResponse && p.bhs.itt() == itt
    });
    pdu::ScsiResponseHeader::parse(&r.bhs).status
}

/// PERSISTENT RESERVE OUT `service_action` (type WRITE EXCLUSIVE) with a basic parameter list.
fn raw_prout(raw: &mut RawConnection, service_action: u8, key: u64, sa_key: u64) -> u8 {
    let mut params = vec![0u8; 24];
    params[..8].copy_from_slice(&key.to_be_bytes());
    params[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let cdb = [0x5f, service_action, 0x01, 0, 0, 0, 0, 0, 24, 0];
    let itt = raw_send_with_data(raw, &cdb, params);
    raw_status(raw, itt)
}

/// A command's status, and its sense key, ASC and ASCQ if it has sense data.
type Ended = (u8, Option<(SenseKey, u8, u8)>);

/// WRITE SAMEs of the whole volume (8 MiB of a pattern each) that one host keeps running.
struct RunningWrites {
    itts: Vec<u32>,
    /// Statuses (and sense key, ASC, ASCQ) of those that have ended.
    ended: Vec<Ended>,
}

impl RunningWrites {
    const COUNT: usize = 8;

    /// Sends them with a ping behind: once the ping is answered, the target has started all.
    fn start(raw: &mut RawConnection, bs: u32) -> Self {
        let blocks = ((8u64 << 20) / bs as u64) as u32;
        let itts = (0..Self::COUNT)
            .map(|i| {
                let mut cdb = [0u8; 16];
                cdb[0] = 0x93; // WRITE SAME(16), without UNMAP: the pattern is written
                cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
                raw_send_with_data(raw, &cdb, vec![i as u8 + 1; bs as usize])
            })
            .collect();
        let ping_itt = raw.next_itt;
        raw.next_itt += 1;
        let ping =
            RequestHeader::opening(Opcode::NopOut, true, ping_itt, raw.cmd_sn, raw.exp_stat_sn);
        raw.stream
            .write_all(&encode(Pdu::new(ping.to_bhs())))
            .unwrap();
        let mut running = RunningWrites {
            itts,
            ended: Vec::new(),
        };
        while let Some(reply) = running.next_reply(raw) {
            running.ended.push(reply);
        }
        running
    }

    /// The status and sense of the next SCSI Response; `None` for the ping's answer.
    fn next_reply(&self, raw: &mut RawConnection) -> Option<Ended> {
        let p = read_until(raw, |p| {
            matches!(p.bhs.opcode(), Opcode::NopIn | Opcode::ScsiResponse)
        });
        (p.bhs.opcode() == Opcode::ScsiResponse).then(|| {
            let h = pdu::ScsiResponseHeader::parse(&p.bhs);
            assert!(self.itts.contains(&h.itt), "{}", h.itt);
            let sense = (p.data.len() > 2)
                .then(|| sliver_initiator::Sense::parse(&p.data[2..]))
                .flatten()
                .map(|s| (s.key, s.asc, s.ascq));
            (h.status, sense)
        })
    }

    /// After another host's abort: every one was answered, never left without an answer:
    /// done (it ended before the abort), TASK ABORTED (TAS=1), or one of `also` (what a
    /// write that reached the unit between the abort's change and its marking the tasks
    /// answers, having done nothing). Returns how many were aborted (some must have been, as
    /// 64 MiB of writes take far longer than the abort's round trip) and whether one
    /// reported a unit attention.
    fn finish(mut self, raw: &mut RawConnection, also: &[Ended]) -> (usize, bool) {
        while self.ended.len() < Self::COUNT {
            let reply = self.next_reply(raw).expect("one ping only");
            self.ended.push(reply);
        }
        let ended = &self.ended;
        let reported = ended.iter().filter(|(s, _)| *s == 0x02).count();
        assert!(
            ended
                .iter()
                .all(|e| e.0 == 0x00 || e.0 == 0x40 || also.contains(e)),
            "{ended:02x?}"
        );
        assert!(
            reported <= 1,
            "a unit attention is reported once: {ended:02x?}"
        );
        let aborted = ended.iter().filter(|(s, _)| *s == 0x40).count();
        assert!(aborted > 0, "{ended:02x?}");
        (aborted, reported == 1)
    }
}

/// The shared volume as host A reads it right after its function was answered.
struct VolumeAt {
    reader: Session,
    blocks: u32,
    data: Vec<u8>,
}

impl VolumeAt {
    fn read(t: &Target, bs: u32) -> Self {
        let mut reader = session_as(t, HOST_A, 0);
        let blocks = ((8u64 << 20) / bs as u64) as u32;
        let data = reader.read16(0, blocks).unwrap();
        VolumeAt {
            reader,
            blocks,
            data,
        }
    }

    /// Once every write of the other host has been answered, the volume is as it was: no
    /// write the function aborted landed after the function's answer (the eight writes'
    /// patterns differ, so a late one would show).
    fn unchanged(mut self) {
        let now = self.reader.read16(0, self.blocks).unwrap();
        assert!(
            now == self.data,
            "a write of the other host landed after the function was answered"
        );
    }
}

#[test]
fn a_unit_reset_from_one_host_aborts_the_other_hosts_commands_and_waits_for_them() {
    let (t, bs) = shared_volume();
    let mut a = raw_login(&t, HOST_A);
    let mut b = raw_login(&t, HOST_B);
    let writes = RunningWrites::start(&mut b, bs);
    // Host A resets the LU while they run: its answer waits until every command of host B
    // that the reset aborted has ended.
    const LOGICAL_UNIT_RESET: u8 = 5;
    assert_eq!(
        raw_tmf(&mut a, LOGICAL_UNIT_RESET, 0),
        0,
        "FUNCTION COMPLETE"
    );
    let settled = VolumeAt::read(&t, bs);
    // The reset's unit attention is queued once they have all ended: none reports it.
    let (aborted, _) = writes.finish(&mut b, &[]);
    settled.unchanged();
    eprintln!("the reset aborted {aborted} of host B's writes");
    // Host B then hears of the reset: BUS DEVICE RESET FUNCTION OCCURRED.
    assert_eq!(
        raw_sense_of_test_unit_ready(&mut b),
        (SenseKey::UnitAttention, 0x29, 0x03)
    );
    t.assert_healthy();
}

#[test]
fn preempt_and_abort_fences_a_host_once_its_running_commands_have_ended() {
    const REGISTER: u8 = 0x00;
    const RESERVE: u8 = 0x01;
    const PREEMPT_AND_ABORT: u8 = 0x05;
    const GOOD: u8 = 0x00;
    const REGISTRATIONS_PREEMPTED: (SenseKey, u8, u8) = (SenseKey::UnitAttention, 0x2a, 0x05);
    let (t, bs) = shared_volume();
    let mut a = raw_login(&t, HOST_A);
    let mut b = raw_login(&t, HOST_B);
    assert_eq!(raw_prout(&mut a, REGISTER, 0, 1), GOOD);
    assert_eq!(raw_prout(&mut b, REGISTER, 0, 2), GOOD);
    assert_eq!(raw_prout(&mut b, RESERVE, 2, 0), GOOD);
    // Host B writes; host A fences it (as Pacemaker's fence_scsi does).
    let writes = RunningWrites::start(&mut b, bs);
    assert_eq!(raw_prout(&mut a, PREEMPT_AND_ABORT, 1, 2), GOOD);
    let settled = VolumeAt::read(&t, bs);
    // A write that reached the unit between the preemption and the abort: RESERVATION
    // CONFLICT, or the unit attention if it came after that was queued.
    let between = [(0x18, None), (0x02, Some(REGISTRATIONS_PREEMPTED))];
    let (aborted, reported) = writes.finish(&mut b, &between);
    settled.unchanged();
    eprintln!("the fence aborted {aborted} of host B's writes");
    // Host B hears it was preempted (once: from a write, or else now), and its writes meet
    // host A's reservation.
    if !reported {
        assert_eq!(
            raw_sense_of_test_unit_ready(&mut b),
            REGISTRATIONS_PREEMPTED
        );
    }
    let itt = raw_send_with_data(
        &mut b,
        &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        vec![0; bs as usize],
    );
    assert_eq!(raw_status(&mut b, itt), 0x18, "RESERVATION CONFLICT");
    t.assert_healthy();
}

// ---------------------------------------------------------------------------------------------
// Names

const BAD_NAMES: &[&str] = &[
    "",
    ".",
    "..",
    "../x",
    "../../etc/passwd",
    "a/b",
    "/abs",
    "a\\b",
    "a\0b",
    "\0",
    "a b",
    "a\nb",
    "-rf",
    ".hidden",
    "_x",
    "é",
    "vol*",
    "*x",
];

fn tree(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn names_that_are_not_plain_are_refused_by_the_array() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("array");
    let array = Array::open(&dir, TARGET).unwrap();
    array.create_volume("ok", 1 << 20, 512).unwrap();
    array.create_host("h", vec![iqn(HOST_A)], None).unwrap();
    let long = "x".repeat(64);
    let before = tree(parent.path());
    let invalid = |r: Result<(), ArrayError>, what: &str, name: &str| match r {
        Err(ArrayError::InvalidName(n)) => assert_eq!(n, name),
        other => panic!("{what} {name:?}: {other:?}"),
    };
    for name in BAD_NAMES.iter().copied().chain([long.as_str()]) {
        invalid(
            array.create_volume(name, 1 << 20, 512),
            "create volume",
            name,
        );
        invalid(array.rename_volume("ok", name), "rename to", name);
        invalid(array.snapshot_volume("ok", name), "snapshot as", name);
        invalid(array.clone_volume("ok", name), "clone as", name);
        invalid(
            array.create_host(name, vec![iqn(HOST_B)], None),
            "create host",
            name,
        );
        invalid(
            array.ensure_host(name, vec![iqn(HOST_B)], None),
            "ensure host",
            name,
        );
    }
    let volumes: Vec<String> = array.volumes().into_iter().map(|v| v.name).collect();
    assert_eq!(volumes, ["ok"]);
    let hosts: Vec<String> = array.hosts().into_iter().map(|h| h.name).collect();
    assert_eq!(hosts, ["h"]);
    assert_eq!(tree(parent.path()), before, "no file appeared or moved");
    // Plain names with dots, dashes and underscores inside are fine.
    array.create_volume("db-01.data_v2", 1 << 20, 512).unwrap();
    array.rename_volume("ok", "9lives").unwrap();
}
