//! Scenario tests: a scripted initiator drives a [`Connection`] through login and full feature
//! phase and checks every PDU the target sends.

use std::sync::{Arc, Mutex};

use crate::chap;
use crate::pdu::{
    self, Bhs, DataInHeader, DataOutHeader, Digests, LoginRequestHeader, LoginResponseHeader,
    LogoutRequestHeader, LogoutResponseHeader, Opcode, Pdu, ReadyToTransferHeader, RejectHeader,
    RejectReason, ReplyHeader, RequestHeader, ScsiCommandHeader, ScsiResponseHeader, SnackHeader,
    TaskManagementRequestHeader, TaskManagementResponseHeader, BHS_LEN, RESERVED_TAG,
};
use crate::text;
use crate::*;

struct TestAuthority {
    chap: Option<ChapCredentials>,
    decision: Option<Authorization>,
    registered: Mutex<Vec<SessionInfo>>,
    /// The next byte of the deterministic random source.
    random: Mutex<u8>,
}

impl TestAuthority {
    fn open() -> Self {
        Self {
            chap: None,
            decision: None,
            registered: Mutex::new(Vec::new()),
            random: Mutex::new(0x40),
        }
    }
    fn with_chap(user: &str, secret: &str) -> Self {
        Self {
            chap: Some(ChapCredentials {
                user: user.into(),
                secret: secret.as_bytes().to_vec(),
            }),
            ..Self::open()
        }
    }
}

impl Authority for TestAuthority {
    fn send_targets(&self, _initiator_name: &str) -> Vec<DiscoveredTarget> {
        vec![
            DiscoveredTarget {
                name: TargetSettings::default().target_name,
                addresses: vec!["127.0.0.1:3260,1".into(), "[::1]:3260,1".into()],
            },
            DiscoveredTarget {
                name: "iqn.2026-11.dev.sliver:other".into(),
                addresses: vec!["127.0.0.1:3261,2".into()],
            },
        ]
    }
    fn authorize(&self, _initiator_name: &str, target_name: Option<&str>) -> Authorization {
        if let Some(d) = &self.decision {
            return d.clone();
        }
        match target_name {
            Some(t) if t != TargetSettings::default().target_name => Authorization::NotFound,
            _ => Authorization::Allow {
                chap: self.chap.clone(),
            },
        }
    }
    fn register_session(&self, info: &SessionInfo) -> Result<u16, LoginStatus> {
        let mut r = self.registered.lock().unwrap();
        r.push(info.clone());
        Ok(0x100 + r.len() as u16)
    }
    fn fill_random(&self, buf: &mut [u8]) {
        let mut next = self.random.lock().unwrap();
        for b in buf {
            *b = *next;
            *next = next.wrapping_add(1);
        }
    }
}

const INITIATOR: &str = "iqn.2026-11.dev.sliver:test-initiator";
const ISID: [u8; 6] = [0x80, 0, 0x12, 0x34, 0, 1];
const LOGIN_ITT: u32 = 0x1000;

/// A scripted initiator.
struct Initiator {
    conn: Connection,
    authority: Arc<TestAuthority>,
    cmd_sn: u32,
    exp_stat_sn: u32,
    /// Digests in force for PDUs in both directions.
    digests: Digests,
    next_itt: u32,
    /// Bytes fed per receive() call, to exercise framing across arbitrary splits.
    chunk: usize,
}

impl Initiator {
    fn new(settings: TargetSettings, authority: TestAuthority) -> Self {
        let authority = Arc::new(authority);
        Self {
            conn: Connection::new(Arc::new(settings), authority.clone()),
            authority,
            cmd_sn: 7,
            exp_stat_sn: 0,
            digests: Digests::default(),
            next_itt: 1,
            chunk: 13,
        }
    }

    fn send(&mut self, pdu: Pdu) -> Result<(), ProtocolError> {
        let mut wire = Vec::new();
        pdu.encode(self.digests, &mut wire);
        self.send_raw(&wire)
    }

    fn send_raw(&mut self, wire: &[u8]) -> Result<(), ProtocolError> {
        for piece in wire.chunks(self.chunk) {
            self.conn.receive(piece)?;
        }
        Ok(())
    }

    /// All PDUs the target queued, decoded.
    fn recv(&mut self) -> Vec<Pdu> {
        let mut out = Vec::new();
        self.conn.take_output(&mut out);
        let mut pdus = Vec::new();
        let mut rest = &out[..];
        while !rest.is_empty() {
            let bhs = Bhs(rest[..BHS_LEN].try_into().unwrap());
            let len = pdu::wire_len(&bhs, self.digests, 1 << 24).unwrap();
            let p = pdu::decode(&rest[..len], self.digests).unwrap();
            assert!(p.data_digest_ok);
            rest = &rest[len..];
            pdus.push(p);
        }
        pdus
    }

    fn recv_one(&mut self) -> Pdu {
        let mut v = self.recv();
        assert_eq!(v.len(), 1, "expected one PDU, got {v:?}");
        v.remove(0)
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.next_event()).collect()
    }

    fn login_pdu(&mut self, csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)]) -> Pdu {
        let h = LoginRequestHeader {
            transit,
            cont: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: ISID,
            tsih: 0,
            itt: LOGIN_ITT,
            cid: 1,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        Pdu::with_data(h.to_bhs(), encode_keys(keys))
    }

    /// Sends one Login Request and returns the response header and its keys.
    fn login_step(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        keys: &[(&str, &str)],
    ) -> (LoginResponseHeader, Vec<(String, String)>) {
        let pdu = self.login_pdu(csg, nsg, transit, keys);
        let _ = self.send(pdu);
        let reply = self.recv_one();
        assert_eq!(reply.bhs.opcode(), Opcode::LoginResponse);
        let h = LoginResponseHeader::parse(&reply.bhs);
        assert_eq!(h.itt, LOGIN_ITT);
        assert_eq!(h.sn.exp_cmd_sn, self.cmd_sn);
        self.exp_stat_sn = h.sn.stat_sn.wrapping_add(1);
        (h, text::parse(&reply.data).unwrap())
    }

    fn leading_keys(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("InitiatorName", INITIATOR),
            ("SessionType", "Normal"),
            ("TargetName", "iqn.2026-11.dev.sliver:array"),
        ]
    }

    /// Full login without authentication, negotiating `op_keys`; returns the session.
    fn login(&mut self, op_keys: &[(&str, &str)]) -> SessionInfo {
        let mut keys = self.leading_keys();
        keys.push(("AuthMethod", "None"));
        let (h, reply) = self.login_step(0, 1, true, &keys);
        assert_eq!(h.status_class, 0);
        assert!(h.transit && h.nsg == 1);
        assert_eq!(get(&reply, "AuthMethod"), Some("None"));
        assert_eq!(get(&reply, "TargetPortalGroupTag"), Some("1"));
        self.finish_login(op_keys)
    }

    fn finish_login(&mut self, op_keys: &[(&str, &str)]) -> SessionInfo {
        let (h, reply) = self.login_step(1, 3, true, op_keys);
        assert_eq!((h.status_class, h.status_detail), (0, 0), "{reply:?}");
        assert!(h.transit && h.nsg == 3);
        assert_ne!(h.tsih, 0);
        assert!(get(&reply, "MaxRecvDataSegmentLength").is_some());
        let events = self.events();
        let Some(Event::LoggedIn(info)) = events.into_iter().next() else {
            panic!("no LoggedIn event");
        };
        assert_eq!(info.tsih, h.tsih);
        self.digests = Digests {
            header: info.params.header_digest,
            data: info.params.data_digest,
        };
        info
    }

    fn itt(&mut self) -> u32 {
        self.next_itt += 1;
        self.next_itt
    }

    /// A SCSI Command PDU consuming the next CmdSN.
    fn command(&mut self, cdb: &[u8], edtl: u32, read: bool, write: bool) -> (u32, Pdu) {
        let itt = self.itt();
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let h = ScsiCommandHeader {
            immediate: false,
            final_bit: true,
            read,
            write,
            attr: 1,
            lun: pdu::encode_lun(3),
            itt,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        (itt, Pdu::new(h.to_bhs()))
    }

    fn data_out(
        &self,
        itt: u32,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        data: Vec<u8>,
        last: bool,
    ) -> Pdu {
        let h = DataOutHeader {
            final_bit: last,
            lun: pdu::encode_lun(3),
            itt,
            ttt,
            exp_stat_sn: self.exp_stat_sn,
            data_sn,
            buffer_offset: offset,
        };
        Pdu::with_data(h.to_bhs(), data)
    }

    /// Sends a WRITE of `edtl` bytes without data; returns its ITT and the R2T that solicits its
    /// first burst.
    fn solicit_write(&mut self, edtl: u32) -> (u32, ReadyToTransferHeader) {
        let (itt, cmd) = self.command(&[0x2a], edtl, false, true);
        self.send(cmd).unwrap();
        (itt, ReadyToTransferHeader::parse(&self.recv_one().bhs))
    }

    /// A NOP-Out or Text Request header, tagged `itt`, that starts an exchange (final, TTT
    /// reserved, no LUN) at the current CmdSN.
    fn request(&self, opcode: Opcode, immediate: bool, itt: u32) -> RequestHeader {
        RequestHeader::opening(opcode, immediate, itt, self.cmd_sn, self.exp_stat_sn)
    }

    /// An immediate ABORT TASK, tagged `itt`, of the task tagged `referenced`: the last command
    /// sent, whose CmdSN is therefore RefCmdSN.
    fn abort_task(&self, itt: u32, referenced: u32) -> Pdu {
        let h = TaskManagementRequestHeader {
            immediate: true,
            function: 1,
            lun: pdu::encode_lun(3),
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn: self.cmd_sn - 1,
            exp_data_sn: 0,
        };
        Pdu::new(h.to_bhs())
    }

    /// Sends a SCSI command (see [`Self::command`]) and takes the core's delivery of it;
    /// returns its ITT.
    fn deliver(&mut self, cdb: &[u8], edtl: u32, read: bool, write: bool) -> u32 {
        let (itt, cmd) = self.command(cdb, edtl, read, write);
        self.send(cmd).unwrap();
        self.command_event();
        itt
    }

    fn command_event(&mut self) -> IncomingCommand {
        let mut events = self.events();
        assert_eq!(events.len(), 1, "{events:?}");
        match events.remove(0) {
            Event::Command(c) => c,
            other => panic!("expected a command, got {other:?}"),
        }
    }
}

fn encode_keys(keys: &[(&str, &str)]) -> Vec<u8> {
    let pairs: Vec<(String, String)> = keys
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    text::encode(&pairs)
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

// ---- login ----

#[test]
fn login_without_authentication() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let info = ini.login(&[
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxRecvDataSegmentLength", "65536"),
        ("MaxBurstLength", "1048576"),
        ("FirstBurstLength", "65536"),
        ("MaxOutstandingR2T", "4"),
        ("ErrorRecoveryLevel", "0"),
    ]);
    assert_eq!(info.initiator_name, INITIATOR);
    assert_eq!(info.isid, ISID);
    assert_eq!(info.session_type, SessionType::Normal);
    assert_eq!(info.params.initiator_max_recv_data_segment_length, 65536);
    assert_eq!(info.params.target_max_recv_data_segment_length, 262144);
    assert_eq!(info.params.max_burst_length, 1048576);
    assert_eq!(info.params.max_outstanding_r2t, 4);
    assert!(!info.params.initial_r2t && info.params.immediate_data);
    assert_eq!(ini.authority.registered.lock().unwrap().len(), 1);
    assert!(!ini.conn.is_closing());
}

#[test]
fn login_may_skip_security_stage_when_no_auth_required() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let mut keys = ini.leading_keys();
    keys.push(("MaxRecvDataSegmentLength", "8192"));
    let (h, reply) = ini.login_step(1, 3, true, &keys);
    assert_eq!((h.status_class, h.status_detail), (0, 0));
    assert!(h.transit && h.nsg == 3 && h.tsih != 0);
    assert_eq!(get(&reply, "TargetPortalGroupTag"), Some("1"));
    assert!(matches!(ini.events()[..], [Event::LoggedIn(_)]));
}

#[test]
fn login_without_transit_stays_in_stage_and_answers_unknown_keys() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let mut keys = ini.leading_keys();
    keys.push(("X-com.example.Foo", "1"));
    keys.push(("MaxBurstLength", "100"));
    let (h, reply) = ini.login_step(1, 3, false, &keys);
    assert_eq!(h.status_class, 0);
    assert!(!h.transit);
    assert_eq!(get(&reply, "X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(get(&reply, "MaxBurstLength"), Some("Reject"));
    assert!(ini.events().is_empty());
}

fn login_failure(ini: &mut Initiator, keys: &[(&str, &str)], csg: u8, nsg: u8) -> (u8, u8) {
    let (h, _) = ini.login_step(csg, nsg, true, keys);
    assert!(ini.conn.is_closing());
    assert!(ini.events().is_empty());
    (h.status_class, h.status_detail)
}

#[test]
fn login_failures_use_the_right_status() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let keys = [("SessionType", "Normal"), ("TargetName", "iqn.x")];
    assert_eq!(
        login_failure(&mut ini, &keys, 1, 3),
        (2, 7),
        "missing InitiatorName"
    );

    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let keys = [
        ("InitiatorName", INITIATOR),
        ("TargetName", "iqn.2026-11.nope"),
    ];
    assert_eq!(
        login_failure(&mut ini, &keys, 1, 3),
        (2, 3),
        "unknown target"
    );

    let mut denied = TestAuthority::open();
    denied.decision = Some(Authorization::Denied);
    let mut ini = Initiator::new(TargetSettings::default(), denied);
    let keys = ini.leading_keys();
    assert_eq!(
        login_failure(&mut ini, &keys, 1, 3),
        (2, 2),
        "not authorized"
    );

    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let mut keys = ini.leading_keys();
    keys.push(("MaxBurstLength", "65536"));
    keys.push(("MaxBurstLength", "65536"));
    assert_eq!(
        login_failure(&mut ini, &keys, 1, 3),
        (2, 0),
        "key negotiated twice"
    );
}

#[test]
fn login_with_unknown_tsih_or_version_is_refused() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let keys = ini.leading_keys();
    let mut pdu = ini.login_pdu(1, 3, true, &keys);
    pdu.bhs.set_u16(14, 0x55);
    let _ = ini.send(pdu);
    let h = LoginResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((h.status_class, h.status_detail), (2, 0x0a));

    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let mut pdu = ini.login_pdu(1, 3, true, &keys);
    pdu.bhs.0[3] = 1; // VersionMin
    assert!(ini.send(pdu).is_err());
    let h = LoginResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((h.status_class, h.status_detail), (2, 5));
}

#[test]
fn full_feature_pdu_before_login_is_fatal() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let (_, cmd) = ini.command(&[0], 0, false, false);
    assert!(ini.send(cmd).is_err());
    assert!(ini.conn.is_closing());
}

#[test]
fn login_request_text_may_span_pdus() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let keys = ini.leading_keys();
    let whole = encode_keys(&keys);
    let (first, second) = whole.split_at(10);
    let mut p1 = ini.login_pdu(1, 3, false, &[]);
    p1.bhs.0[1] |= 0x40; // C bit
    p1.data = first.to_vec();
    ini.send(p1).unwrap();
    let r1 = ini.recv_one();
    assert!(r1.data.is_empty());
    assert_eq!(LoginResponseHeader::parse(&r1.bhs).status_class, 0);
    let mut p2 = ini.login_pdu(1, 3, true, &[]);
    p2.data = second.to_vec();
    ini.send(p2).unwrap();
    let h = LoginResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(h.status_class, 0);
    assert!(h.transit && h.nsg == 3);
}

/// An initiator to a target that requires CHAP of user `alice`, secret `secret-of-alice`.
fn chap_initiator(settings: TargetSettings) -> Initiator {
    Initiator::new(
        settings,
        TestAuthority::with_chap("alice", "secret-of-alice"),
    )
}

/// Runs the CHAP exchange up to our challenge; returns (identifier, challenge).
fn chap_challenge(ini: &mut Initiator) -> (u8, Vec<u8>) {
    let mut keys = ini.leading_keys();
    keys.push(("AuthMethod", "CHAP,None"));
    let (h, reply) = ini.login_step(0, 1, true, &keys);
    assert_eq!(h.status_class, 0);
    assert!(!h.transit, "must not leave security stage before CHAP");
    assert_eq!(get(&reply, "AuthMethod"), Some("CHAP"));
    let (h, reply) = ini.login_step(0, 1, true, &[("CHAP_A", "7,5")]);
    assert!(!h.transit);
    assert_eq!(get(&reply, "CHAP_A"), Some("5"));
    let id: u8 = get(&reply, "CHAP_I").unwrap().parse().unwrap();
    let challenge = text::decode_binary(get(&reply, "CHAP_C").unwrap()).unwrap();
    assert!(challenge.len() >= 16);
    (id, challenge)
}

#[test]
fn a_chap_challenge_is_drawn_from_the_authority_s_random_source() {
    // The core has no randomness of its own: with the test authority's counter, the
    // identifier is its first byte and the challenge the next 32, byte for byte.
    let mut ini = chap_initiator(TargetSettings::default());
    let (id, challenge) = chap_challenge(&mut ini);
    assert_eq!(id, 0x40);
    let expected: Vec<u8> = (0x41..0x41 + chap::CHALLENGE_LEN as u8).collect();
    assert_eq!(challenge, expected);
}

#[test]
fn chap_login_succeeds_with_the_right_secret() {
    let mut ini = chap_initiator(TargetSettings::default());
    let (id, challenge) = chap_challenge(&mut ini);
    let r = chap::response(id, b"secret-of-alice", &challenge);
    let r_hex = text::encode_hex(&r);
    let (h, _) = ini.login_step(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &r_hex)]);
    assert_eq!(h.status_class, 0);
    assert!(h.transit && h.nsg == 1);
    ini.finish_login(&[]);
}

#[test]
fn chap_accepts_base64_responses() {
    let mut ini = chap_initiator(TargetSettings::default());
    let (id, challenge) = chap_challenge(&mut ini);
    let r = chap::response(id, b"secret-of-alice", &challenge);
    let r64 = text::encode_binary_like(&r, "0b");
    let (h, _) = ini.login_step(0, 3, true, &[("CHAP_N", "alice"), ("CHAP_R", &r64)]);
    assert_eq!(h.status_class, 0);
    assert!(h.transit && h.nsg == 3);
}

#[test]
fn chap_with_wrong_secret_is_refused() {
    let mut ini = chap_initiator(TargetSettings::default());
    let (id, challenge) = chap_challenge(&mut ini);
    let r = text::encode_hex(&chap::response(id, b"guessed-secret", &challenge));
    let keys = [("CHAP_N", "alice"), ("CHAP_R", r.as_str())];
    assert_eq!(login_failure(&mut ini, &keys, 0, 1), (2, 1));
}

#[test]
fn chap_required_cannot_be_skipped() {
    let mut ini = chap_initiator(TargetSettings::default());
    let keys = ini.leading_keys();
    assert_eq!(login_failure(&mut ini, &keys, 1, 3), (2, 1));

    let mut ini = chap_initiator(TargetSettings::default());
    let mut keys = ini.leading_keys();
    keys.push(("AuthMethod", "None"));
    assert_eq!(login_failure(&mut ini, &keys, 0, 1), (2, 1));
}

fn mutual_settings() -> TargetSettings {
    TargetSettings {
        mutual_chap: Some(ChapCredentials {
            user: "array".into(),
            secret: b"secret-of-array".to_vec(),
        }),
        ..TargetSettings::default()
    }
}

#[test]
fn mutual_chap_proves_the_target() {
    let mut ini = chap_initiator(mutual_settings());
    let (id, challenge) = chap_challenge(&mut ini);
    let r = text::encode_hex(&chap::response(id, b"secret-of-alice", &challenge));
    let our_challenge: Vec<u8> = (100..124).collect();
    let c = text::encode_hex(&our_challenge);
    let keys = [
        ("CHAP_N", "alice"),
        ("CHAP_R", r.as_str()),
        ("CHAP_I", "77"),
        ("CHAP_C", c.as_str()),
    ];
    let (h, reply) = ini.login_step(0, 1, true, &keys);
    assert_eq!(h.status_class, 0);
    assert_eq!(get(&reply, "CHAP_N"), Some("array"));
    let expected = chap::response(77, b"secret-of-array", &our_challenge);
    assert_eq!(
        text::decode_binary(get(&reply, "CHAP_R").unwrap()).unwrap(),
        expected
    );
}

#[test]
fn mutual_chap_refuses_reflection_and_missing_target_secret() {
    // Alice's challenge to the target: her copy of the target's own (a reflection), or any
    // challenge to a target with no secret of its own to answer it.
    for (settings, reflect) in [
        (mutual_settings(), true),
        (TargetSettings::default(), false),
    ] {
        let mut ini = chap_initiator(settings);
        let (id, challenge) = chap_challenge(&mut ini);
        let r = text::encode_hex(&chap::response(id, b"secret-of-alice", &challenge));
        let c = if reflect {
            text::encode_hex(&challenge)
        } else {
            "0x00112233445566778899aabbccddeeff".to_string()
        };
        let keys = [
            ("CHAP_N", "alice"),
            ("CHAP_R", r.as_str()),
            ("CHAP_I", "1"),
            ("CHAP_C", c.as_str()),
        ];
        let refusal = login_failure(&mut ini, &keys, 0, 1);
        assert_eq!(refusal, (2, 1), "reflection {reflect}");
    }
}

#[test]
fn digests_are_negotiated_and_enforced() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let info = ini.login(&[("HeaderDigest", "CRC32C,None"), ("DataDigest", "CRC32C")]);
    assert!(info.params.header_digest && info.params.data_digest);
    // A ping with data round-trips with both digests.
    let nop = ini.request(Opcode::NopOut, true, 0x42);
    ini.send(Pdu::with_data(nop.to_bhs(), b"hello".to_vec()))
        .unwrap();
    let reply = ini.recv_one();
    assert_eq!(reply.data, b"hello");
    // A corrupted header digest is fatal.
    let mut wire = Vec::new();
    Pdu::new(nop.to_bhs()).encode(ini.digests, &mut wire);
    wire[48] ^= 0xff;
    assert!(matches!(
        ini.send_raw(&wire),
        Err(ProtocolError::HeaderDigest)
    ));
    assert!(ini.conn.is_closing());
}

// ---- full feature phase ----

fn logged_in(op_keys: &[(&str, &str)]) -> Initiator {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    ini.login(op_keys);
    ini
}

#[test]
fn write_with_immediate_data_unsolicited_data_and_r2ts() {
    let mut ini = logged_in(&[
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("FirstBurstLength", "4096"),
        ("MaxBurstLength", "8192"),
        ("MaxOutstandingR2T", "2"),
        ("MaxRecvDataSegmentLength", "8192"),
    ]);
    let payload = pattern(24_000);
    let (itt, mut cmd) = ini.command(&[0x2a], 24_000, false, true);
    cmd.bhs.set_final(false);
    cmd.data = payload[..1024].to_vec();
    ini.send(cmd).unwrap();
    assert!(ini.recv().is_empty());
    // Unsolicited Data-Out fills the first burst.
    let d = ini.data_out(
        itt,
        RESERVED_TAG,
        0,
        1024,
        payload[1024..4096].to_vec(),
        true,
    );
    ini.send(d).unwrap();
    assert!(ini.events().is_empty());
    let r2ts: Vec<ReadyToTransferHeader> = ini
        .recv()
        .iter()
        .map(|p| ReadyToTransferHeader::parse(&p.bhs))
        .collect();
    assert_eq!(r2ts.len(), 2, "MaxOutstandingR2T bounds R2Ts in flight");
    assert_eq!(
        (
            r2ts[0].r2t_sn,
            r2ts[0].buffer_offset,
            r2ts[0].desired_length
        ),
        (0, 4096, 8192)
    );
    assert_eq!(
        (
            r2ts[1].r2t_sn,
            r2ts[1].buffer_offset,
            r2ts[1].desired_length
        ),
        (1, 12288, 8192)
    );
    // Answer the first R2T in two PDUs.
    let r = &r2ts[0];
    ini.send(ini.data_out(itt, r.ttt, 0, 4096, payload[4096..8192].to_vec(), false))
        .unwrap();
    ini.send(ini.data_out(itt, r.ttt, 1, 8192, payload[8192..12288].to_vec(), true))
        .unwrap();
    let third = ReadyToTransferHeader::parse(&ini.recv_one().bhs);
    assert_eq!(
        (third.r2t_sn, third.buffer_offset, third.desired_length),
        (2, 20480, 3520)
    );
    let r = &r2ts[1];
    ini.send(ini.data_out(itt, r.ttt, 0, 12288, payload[12288..20480].to_vec(), true))
        .unwrap();
    assert!(ini.events().is_empty());
    ini.send(ini.data_out(itt, third.ttt, 0, 20480, payload[20480..].to_vec(), true))
        .unwrap();
    let c = ini.command_event();
    assert_eq!(c.itt, itt);
    assert_eq!(c.lun, 3);
    assert_eq!(c.data_out, payload);
    assert!(c.write && !c.read);
    ini.conn.complete_command(
        itt,
        CommandResult {
            data_out_expected: 24_000,
            ..CommandResult::default()
        },
    );
    let resp = ScsiResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(
        (resp.status, resp.underflow, resp.overflow),
        (0, false, false)
    );
    assert_eq!(resp.exp_data_sn, 3, "three R2Ts were sent");
}

/// A PDU's header part and its data part are collected apart (the payload goes straight into
/// the buffer the command keeps): however the stream is cut, with digests and padding, the
/// command gets its bytes.
#[test]
fn writes_arrive_whole_however_the_stream_is_cut() {
    for chunk in [1, 3, 47, 48, 49, 52, 1001, 1 << 20] {
        let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
        ini.chunk = chunk;
        ini.login(&[
            ("HeaderDigest", "CRC32C"),
            ("DataDigest", "CRC32C"),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "Yes"),
        ]);
        let payload = pattern(5001);
        let (itt, mut cmd) = ini.command(&[0x2a], 5001, false, true);
        cmd.data = payload[..1001].to_vec();
        ini.send(cmd).unwrap();
        let r2t = ReadyToTransferHeader::parse(&ini.recv_one().bhs);
        assert_eq!((r2t.buffer_offset, r2t.desired_length), (1001, 4000));
        ini.send(ini.data_out(itt, r2t.ttt, 0, 1001, payload[1001..].to_vec(), true))
            .unwrap();
        let c = ini.command_event();
        assert_eq!(c.data_out, payload, "cut every {chunk} bytes");
        assert!(!ini.conn.is_waiting_for_initiator());
    }
}

#[test]
fn bad_data_sn_fails_the_write() {
    let mut ini = logged_in(&[("InitialR2T", "Yes"), ("MaxRecvDataSegmentLength", "8192")]);
    let (itt, r2t) = ini.solicit_write(1024);
    ini.send(ini.data_out(itt, r2t.ttt, 27, 0, vec![0; 1024], true))
        .unwrap();
    let out = ini.recv();
    assert_eq!(out.len(), 2);
    assert_eq!(
        RejectHeader::parse(&out[0].bhs).reason,
        RejectReason::ProtocolError
    );
    let resp = ScsiResponseHeader::parse(&out[1].bhs);
    assert_eq!(resp.status, 0x02);
    assert!(ini.events().is_empty());
}

#[test]
fn data_out_beyond_the_negotiated_bursts_is_refused() {
    let mut ini = logged_in(&[
        ("InitialR2T", "No"),
        ("FirstBurstLength", "4096"),
        ("MaxBurstLength", "8192"),
        ("MaxRecvDataSegmentLength", "65536"),
    ]);
    let expect_failed = |ini: &mut Initiator, reject: RejectReason, itt: u32| {
        let out = ini.recv();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(RejectHeader::parse(&out[0].bhs).reason, reject);
        let resp = ScsiResponseHeader::parse(&out[1].bhs);
        assert_eq!((resp.itt, resp.status), (itt, 0x02));
        assert!(ini.events().is_empty(), "nothing reaches the SCSI layer");
    };
    // Immediate data beyond FirstBurstLength: the command is rejected outright.
    let (_, mut cmd) = ini.command(&[0x2a], 16_384, false, true);
    cmd.data = vec![1; 8192];
    ini.send(cmd).unwrap();
    let reject = ini.recv_one();
    assert_eq!(
        RejectHeader::parse(&reject.bhs).reason,
        RejectReason::ProtocolError
    );
    // Immediate data beyond the expected length: rejected too.
    let (_, mut cmd) = ini.command(&[0x2a], 512, false, true);
    cmd.data = vec![1; 1024];
    ini.send(cmd).unwrap();
    assert_eq!(ini.recv_one().bhs.opcode(), Opcode::Reject);
    // Unsolicited Data-Out past the first burst fails the task.
    let (itt, mut cmd) = ini.command(&[0x2a], 16_384, false, true);
    cmd.bhs.set_final(false);
    ini.send(cmd).unwrap();
    ini.send(ini.data_out(itt, RESERVED_TAG, 0, 0, vec![2; 8192], true))
        .unwrap();
    expect_failed(&mut ini, RejectReason::ProtocolError, itt);
    // Solicited Data-Out past the R2T's desired length fails the task.
    let (itt, cmd) = ini.command(&[0x2a], 16_384, false, true);
    ini.send(cmd).unwrap();
    let r2t = ReadyToTransferHeader::parse(&ini.recv().remove(0).bhs);
    assert_eq!(r2t.desired_length, 8192, "MaxBurstLength bounds one R2T");
    ini.send(ini.data_out(itt, r2t.ttt, 0, 0, vec![3; 12_288], true))
        .unwrap();
    expect_failed(&mut ini, RejectReason::ProtocolError, itt);
    // Data-Out for a task that does not exist is dropped without an answer.
    ini.send(ini.data_out(0xdead, 77, 0, 0, vec![4; 512], true))
        .unwrap();
    assert!(ini.recv().is_empty() && ini.events().is_empty());
    assert_eq!(ini.conn.outstanding_commands(), 0);
    // The connection goes on.
    ini.deliver(&[0], 0, false, false);
}

#[test]
fn data_digest_error_on_data_out_rejects_and_fails_the_task() {
    let mut ini = logged_in(&[("DataDigest", "CRC32C"), ("InitialR2T", "Yes")]);
    let (itt, r2t) = ini.solicit_write(512);
    let mut wire = Vec::new();
    ini.data_out(itt, r2t.ttt, 0, 0, vec![9; 512], true)
        .encode(ini.digests, &mut wire);
    let n = wire.len();
    wire[n - 1] ^= 0x01;
    ini.send_raw(&wire).unwrap();
    let out = ini.recv();
    assert_eq!(
        RejectHeader::parse(&out[0].bhs).reason,
        RejectReason::DataDigestError
    );
    let resp = ScsiResponseHeader::parse(&out[1].bhs);
    assert_eq!(resp.status, 0x02);
    assert_eq!(&out[1].data[2 + 12..2 + 14], &[0x47, 0x05]);
}

#[test]
fn read_is_split_into_data_in_pdus_and_sequences() {
    let mut ini = logged_in(&[
        ("MaxRecvDataSegmentLength", "4096"),
        ("MaxBurstLength", "8192"),
    ]);
    let (itt, cmd) = ini.command(&[0x28], 10_000, true, false);
    ini.send(cmd).unwrap();
    let c = ini.command_event();
    assert!(c.read && c.data_out.is_empty());
    let data = pattern(10_000);
    ini.conn.complete_command(
        itt,
        CommandResult {
            data_in: data.clone(),
            ..CommandResult::default()
        },
    );
    let pdus = ini.recv();
    let headers: Vec<DataInHeader> = pdus.iter().map(|p| DataInHeader::parse(&p.bhs)).collect();
    let shape: Vec<(u32, u32, usize, bool, bool)> = headers
        .iter()
        .zip(&pdus)
        .map(|(h, p)| {
            (
                h.data_sn,
                h.buffer_offset,
                p.data.len(),
                h.final_bit,
                h.has_status,
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, 0, 4096, false, false),
            (1, 4096, 4096, true, false),
            (2, 8192, 1808, true, true),
        ]
    );
    let joined: Vec<u8> = pdus.iter().flat_map(|p| p.data.clone()).collect();
    assert_eq!(joined, data);
    let last = headers.last().unwrap();
    assert_eq!(last.status, 0);
    assert!(!last.underflow && !last.overflow);
}

#[test]
fn read_data_held_by_reference_goes_out_padded_and_digested() {
    // Long data segments leave by reference (not copied into the output): their padding and
    // digests still frame them, whatever the socket takes per write.
    let mut ini = logged_in(&[
        ("HeaderDigest", "CRC32C"),
        ("DataDigest", "CRC32C"),
        ("MaxRecvDataSegmentLength", "65536"),
    ]);
    let len = 2 * 65536 + 3 * crate::output::SHARE_MIN + 3;
    let itt = ini.deliver(&[0x28], len as u32, true, false);
    let data = pattern(len);
    ini.conn.complete_command(
        itt,
        CommandResult {
            data_in: data.clone(),
            ..CommandResult::default()
        },
    );
    let mut parts = ini.conn.take_output_parts();
    assert!(!ini.conn.has_output());
    let mut wire = Vec::new();
    let mut take = 1000;
    while !parts.is_empty() {
        let mut slices = [std::io::IoSlice::new(&[]); 2];
        let n = parts.io_slices(&mut slices);
        let shown: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
        let k = take.min(shown.len());
        wire.extend_from_slice(&shown[..k]);
        parts.consume(k);
        take = take * 2 + 7;
    }
    let mut rest = &wire[..];
    let mut joined = Vec::new();
    while !rest.is_empty() {
        let bhs = Bhs(rest[..BHS_LEN].try_into().unwrap());
        let n = pdu::wire_len(&bhs, ini.digests, 1 << 24).unwrap();
        let p = pdu::decode(&rest[..n], ini.digests).unwrap();
        assert!(p.data_digest_ok);
        joined.extend_from_slice(&p.data);
        rest = &rest[n..];
    }
    assert_eq!(joined, data);
}

#[test]
fn read_residuals_underflow_and_overflow() {
    let mut ini = logged_in(&[]);
    for (len, underflow, overflow, residual, sent) in [
        (100usize, true, false, 100u32, 100usize),
        (300, false, true, 100, 200),
    ] {
        let itt = ini.deliver(&[0x12], 200, true, false);
        ini.conn.complete_command(
            itt,
            CommandResult {
                data_in: vec![1; len],
                ..CommandResult::default()
            },
        );
        let pdu = ini.recv_one();
        let h = DataInHeader::parse(&pdu.bhs);
        assert!(h.has_status);
        assert_eq!(
            (h.underflow, h.overflow, h.residual_count),
            (underflow, overflow, residual)
        );
        assert_eq!(pdu.data.len(), sent);
    }
}

#[test]
fn write_residual_and_sense_go_in_scsi_response() {
    let mut ini = logged_in(&[("ImmediateData", "Yes"), ("InitialR2T", "No")]);
    let (itt, mut cmd) = ini.command(&[0x2a], 1024, false, true);
    cmd.data = vec![5; 1024];
    ini.send(cmd).unwrap();
    assert_eq!(ini.command_event().data_out.len(), 1024);
    let sense = vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
    ini.conn.complete_command(
        itt,
        CommandResult {
            status: 2,
            sense: sense.clone(),
            data_in: vec![],
            data_out_expected: 512,
        },
    );
    let pdu = ini.recv_one();
    let h = ScsiResponseHeader::parse(&pdu.bhs);
    assert_eq!(h.status, 2);
    assert!(h.underflow && !h.overflow);
    assert_eq!(h.residual_count, 512);
    assert_eq!(&pdu.data[..2], &[0, 18]);
    assert_eq!(&pdu.data[2..], &sense[..]);
}

#[test]
fn zero_length_read_and_oversized_edtl() {
    let mut ini = logged_in(&[]);
    let itt = ini.deliver(&[0x28], 0, true, false);
    ini.conn.complete_command(
        itt,
        CommandResult {
            data_in: vec![1; 512],
            ..CommandResult::default()
        },
    );
    let h = ScsiResponseHeader::parse(&ini.recv_one().bhs);
    assert!(h.overflow && h.residual_count == 512);

    let (itt, cmd) = ini.command(&[0x2a], 64 << 20, false, true);
    ini.send(cmd).unwrap();
    assert!(ini.events().is_empty());
    let pdu = ini.recv_one();
    let h = ScsiResponseHeader::parse(&pdu.bhs);
    assert_eq!((h.itt, h.status), (itt, 2));
    assert_eq!(
        (pdu.data[2 + 2], pdu.data[2 + 12], pdu.data[2 + 13]),
        (0x05, 0x24, 0x00)
    );
    // The CmdSN was consumed: the next command runs.
    ini.deliver(&[0], 0, false, false);
}

#[test]
fn commands_are_delivered_in_cmd_sn_order() {
    let mut ini = logged_in(&[]);
    let (a, cmd_a) = ini.command(&[0], 0, false, false);
    let (b, cmd_b) = ini.command(&[0], 0, false, false);
    let (c, cmd_c) = ini.command(&[0], 0, false, false);
    ini.send(cmd_c).unwrap();
    ini.send(cmd_b).unwrap();
    assert!(ini.events().is_empty(), "held until the gap is filled");
    ini.send(cmd_a).unwrap();
    let order: Vec<u32> = ini
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Command(c) => c.itt,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(order, vec![a, b, c]);

    // Outside the window: dropped silently, no CmdSN consumed.
    let (_, mut late) = ini.command(&[0], 0, false, false);
    ini.cmd_sn -= 1;
    late.bhs.set_u32(24, ini.cmd_sn.wrapping_add(128));
    ini.send(late).unwrap();
    assert!(ini.events().is_empty() && ini.recv().is_empty());
    // Immediate commands bypass ordering.
    let (imm, mut cmd) = ini.command(&[0], 0, false, false);
    ini.cmd_sn -= 1;
    cmd.bhs.set_immediate(true);
    ini.send(cmd).unwrap();
    assert_eq!(ini.command_event().itt, imm);
    // A response carries the window: a, b and c are still outstanding and hold three of the
    // 128 slots (the immediate command holds none).
    ini.conn.complete_command(imm, CommandResult::default());
    let h = ScsiResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(h.sn.exp_cmd_sn, ini.cmd_sn);
    assert_eq!(h.sn.max_cmd_sn, ini.cmd_sn + 127 - 3);
    for itt in [a, b, c] {
        ini.conn.complete_command(itt, CommandResult::default());
    }
    let last = ini.recv().pop().unwrap();
    let h = ScsiResponseHeader::parse(&last.bhs);
    assert_eq!(h.sn.max_cmd_sn, ini.cmd_sn + 127);
}

#[test]
fn the_cmd_sn_window_bounds_commands_until_they_complete() {
    let settings = TargetSettings {
        queue_depth: 4,
        ..TargetSettings::default()
    };
    let mut ini = Initiator::new(settings, TestAuthority::open());
    ini.login(&[]);
    let mut delivered = Vec::new();
    for _ in 0..4 {
        let (itt, cmd) = ini.command(&[0], 0, false, false);
        ini.send(cmd).unwrap();
        assert_eq!(ini.command_event().itt, itt);
        delivered.push(itt);
    }
    assert_eq!(ini.conn.outstanding_commands(), 4);
    // ExpCmdSN moved past all four, but they still execute: a fifth is beyond MaxCmdSN and is
    // dropped without consuming its CmdSN.
    let (_, fifth) = ini.command(&[0], 0, false, false);
    ini.send(fifth.clone()).unwrap();
    assert!(ini.events().is_empty() && ini.recv().is_empty());
    assert_eq!(ini.conn.outstanding_commands(), 4);
    // One completes: its response opens the window by one and the fifth is taken.
    ini.conn
        .complete_command(delivered[0], CommandResult::default());
    let h = ScsiResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(h.sn.exp_cmd_sn, ini.cmd_sn - 1);
    assert_eq!(
        h.sn.max_cmd_sn,
        ini.cmd_sn - 1,
        "room for exactly the fifth"
    );
    ini.send(fifth).unwrap();
    ini.command_event();
    // A task dropped by ABORT TASK SET frees its slot as well.
    let (gathering, write) = ini.command(&[0x2a], 4096, false, true);
    ini.conn
        .complete_command(delivered[1], CommandResult::default());
    ini.recv();
    ini.send(write).unwrap();
    assert!(ini.events().is_empty(), "{gathering} waits for Data-Out");
    assert_eq!(ini.recv_one().bhs.opcode(), Opcode::ReadyToTransfer);
    let tmf = TaskManagementRequestHeader {
        immediate: true,
        function: 2,
        lun: pdu::encode_lun(3),
        itt: 0x555,
        referenced_task_tag: RESERVED_TAG,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    ini.send(Pdu::new(tmf.to_bhs())).unwrap();
    assert!(matches!(ini.events()[..], [Event::TaskManagement(_)]));
    ini.conn
        .complete_task_management(0x555, TmfResponse::FunctionComplete);
    let r = TaskManagementResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(r.response, 0);
    assert_eq!(ini.conn.outstanding_commands(), 0);
    assert_eq!(r.sn.max_cmd_sn, ini.cmd_sn + 3, "all four slots free again");
}

#[test]
fn immediate_commands_are_bounded() {
    let mut ini = logged_in(&[("InitialR2T", "No")]);
    // Immediate writes that never send their unsolicited Data-Out stay in the core.
    for i in 0..MAX_IMMEDIATE_TASKS {
        let (_, mut cmd) = ini.command(&[0x2a], 65_536, false, true);
        ini.cmd_sn -= 1;
        cmd.bhs.set_immediate(true);
        cmd.bhs.set_final(false);
        cmd.data = vec![0; 512];
        ini.send(cmd).unwrap();
        assert!(ini.recv().is_empty(), "immediate command {i} is taken");
    }
    let (_, mut cmd) = ini.command(&[0x2a], 65_536, false, true);
    ini.cmd_sn -= 1;
    cmd.bhs.set_immediate(true);
    cmd.bhs.set_final(false);
    ini.send(cmd).unwrap();
    let reject = ini.recv_one();
    assert_eq!(reject.bhs.opcode(), Opcode::Reject);
    assert_eq!(
        RejectHeader::parse(&reject.bhs).reason,
        RejectReason::ImmediateCommandRejected
    );
    assert_eq!(ini.conn.outstanding_commands(), MAX_IMMEDIATE_TASKS);
    // Non-immediate commands still go through the window.
    ini.deliver(&[0], 0, false, false);
}

#[test]
fn pending_task_management_requests_are_bounded() {
    let mut ini = logged_in(&[]);
    let tmf = |itt: u32, cmd_sn: u32| TaskManagementRequestHeader {
        immediate: true,
        function: 5,
        lun: pdu::encode_lun(3),
        itt,
        referenced_task_tag: RESERVED_TAG,
        cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    for i in 0..MAX_PENDING_TMFS as u32 {
        ini.send(Pdu::new(tmf(0x100 + i, ini.cmd_sn).to_bhs()))
            .unwrap();
    }
    assert_eq!(ini.events().len(), MAX_PENDING_TMFS);
    assert!(ini.recv().is_empty());
    // The same ITT again while the first is pending: rejected, not a second request.
    ini.send(Pdu::new(tmf(0x100, ini.cmd_sn).to_bhs())).unwrap();
    let reject = ini.recv_one();
    assert_eq!(
        RejectHeader::parse(&reject.bhs).reason,
        RejectReason::TaskInProgress
    );
    ini.send(Pdu::new(tmf(0x999, ini.cmd_sn).to_bhs())).unwrap();
    assert!(ini.events().is_empty());
    let r = TaskManagementResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((r.itt, r.response), (0x999, 255), "function rejected");
    // Answering one makes room for the next.
    ini.conn
        .complete_task_management(0x100, TmfResponse::FunctionComplete);
    ini.recv_one();
    ini.send(Pdu::new(tmf(0x99a, ini.cmd_sn).to_bhs())).unwrap();
    assert_eq!(ini.events().len(), 1);
}

#[test]
fn waiting_for_the_initiator_is_reported() {
    let mut ini = logged_in(&[("InitialR2T", "Yes")]);
    assert!(!ini.conn.is_waiting_for_initiator());
    // Half a header.
    let (itt, cmd) = ini.command(&[0x2a], 4096, false, true);
    let mut wire = Vec::new();
    cmd.encode(ini.digests, &mut wire);
    ini.conn.receive(&wire[..20]).unwrap();
    assert!(ini.conn.is_waiting_for_initiator());
    // The rest: the command is taken and solicits its data.
    ini.conn.receive(&wire[20..]).unwrap();
    let r2t = ReadyToTransferHeader::parse(&ini.recv_one().bhs);
    assert!(ini.conn.is_waiting_for_initiator(), "an R2T is outstanding");
    ini.send(ini.data_out(itt, r2t.ttt, 0, 0, vec![0; 4096], true))
        .unwrap();
    ini.command_event();
    assert!(
        !ini.conn.is_waiting_for_initiator(),
        "executing is the target's business"
    );
    // A CmdSN gap holds a later command back.
    ini.cmd_sn += 1;
    let (_, later) = ini.command(&[0], 0, false, false);
    ini.send(later).unwrap();
    assert!(ini.events().is_empty());
    assert!(ini.conn.is_waiting_for_initiator());
}

#[test]
fn abort_task_held_in_core_is_answered_by_the_core() {
    let mut ini = logged_in(&[("InitialR2T", "Yes")]);
    let (itt, cmd) = ini.command(&[0x2a], 4096, false, true);
    ini.send(cmd).unwrap();
    let _r2t = ini.recv_one();
    ini.send(ini.abort_task(0x999, itt)).unwrap();
    assert!(ini.events().is_empty());
    let r = TaskManagementResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((r.itt, r.response), (0x999, 0));
    // Late Data-Out for the aborted task is dumped.
    ini.send(ini.data_out(itt, 1, 0, 0, vec![0; 512], false))
        .unwrap();
    assert!(ini.recv().is_empty());
}

#[test]
fn abort_of_delivered_task_discards_its_late_completion() {
    let mut ini = logged_in(&[]);
    let itt = ini.deliver(&[0x28], 512, true, false);
    ini.send(ini.abort_task(0x777, itt)).unwrap();
    let events = ini.events();
    let [Event::TaskManagement(t)] = &events[..] else {
        panic!("{events:?}");
    };
    assert_eq!(
        (t.function, t.referenced_task_tag, t.lun),
        (TmfFunction::AbortTask, itt, 3)
    );
    ini.conn
        .complete_task_management(0x777, TmfResponse::FunctionComplete);
    let r = TaskManagementResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!(r.response, 0);
    ini.conn.complete_command(
        itt,
        CommandResult {
            data_in: vec![0; 512],
            ..CommandResult::default()
        },
    );
    assert!(ini.recv().is_empty());
}

#[test]
fn nop_ping_both_ways() {
    let mut ini = logged_in(&[]);
    let nop = ini.request(Opcode::NopOut, true, 0x31);
    ini.send(Pdu::with_data(nop.to_bhs(), b"ping-data".to_vec()))
        .unwrap();
    let reply = ini.recv_one();
    let h = ReplyHeader::parse(&reply.bhs);
    assert_eq!(
        (h.opcode, h.itt, h.ttt),
        (Opcode::NopIn, 0x31, RESERVED_TAG)
    );
    assert_eq!(reply.data, b"ping-data");

    assert!(ini.conn.ping());
    assert!(!ini.conn.ping(), "previous ping unanswered");
    let ping = ReplyHeader::parse(&ini.recv_one().bhs);
    assert_eq!(ping.itt, RESERVED_TAG);
    assert_ne!(ping.ttt, RESERVED_TAG);
    let answer = RequestHeader {
        itt: RESERVED_TAG,
        ttt: ping.ttt,
        ..nop
    };
    ini.send(Pdu::new(answer.to_bhs())).unwrap();
    assert!(ini.recv().is_empty());
    assert!(ini.conn.ping());
}

#[test]
fn discovery_session_send_targets() {
    let mut ini = Initiator::new(TargetSettings::default(), TestAuthority::open());
    let keys = [("InitiatorName", INITIATOR), ("SessionType", "Discovery")];
    let (h, reply) = ini.login_step(1, 3, true, &keys);
    assert_eq!(h.status_class, 0);
    assert_eq!(get(&reply, "TargetPortalGroupTag"), None);
    let Some(Event::LoggedIn(info)) = ini.events().into_iter().next() else {
        panic!("no login");
    };
    assert_eq!(info.session_type, SessionType::Discovery);
    assert_eq!(info.target_name, None);
    let req = ini.request(Opcode::TextRequest, true, 0x50);
    ini.send(Pdu::with_data(
        req.to_bhs(),
        encode_keys(&[("SendTargets", "All")]),
    ))
    .unwrap();
    let reply = ini.recv_one();
    let h = ReplyHeader::parse(&reply.bhs);
    assert!(h.final_bit && h.ttt == RESERVED_TAG);
    let pairs = text::parse(&reply.data).unwrap();
    assert_eq!(pairs.iter().filter(|(k, _)| k == "TargetName").count(), 2);
    assert!(pairs.contains(&("TargetAddress".into(), "[::1]:3260,1".into())));
    // SCSI commands are not allowed in a discovery session.
    let (_, cmd) = ini.command(&[0], 0, false, false);
    ini.send(cmd).unwrap();
    assert_eq!(ini.recv_one().bhs.opcode(), Opcode::Reject);
}

#[test]
fn send_targets_in_normal_session_reports_only_this_target() {
    let mut ini = logged_in(&[]);
    let req = ini.request(Opcode::TextRequest, false, 0x51);
    ini.cmd_sn += 1;
    ini.send(Pdu::with_data(
        req.to_bhs(),
        encode_keys(&[("SendTargets", "All")]),
    ))
    .unwrap();
    let pairs = text::parse(&ini.recv_one().data).unwrap();
    let names: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "TargetName")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(names, vec!["iqn.2026-11.dev.sliver:array"]);
}

#[test]
fn logout_closes_and_reports() {
    let mut ini = logged_in(&[]);
    let req = LogoutRequestHeader {
        immediate: true,
        reason: 2,
        itt: 0x61,
        cid: 1,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
    };
    ini.send(Pdu::new(req.to_bhs())).unwrap();
    assert_eq!(LogoutResponseHeader::parse(&ini.recv_one().bhs).response, 2);
    assert!(!ini.conn.is_closing());
    let req = LogoutRequestHeader { reason: 0, ..req };
    ini.send(Pdu::new(req.to_bhs())).unwrap();
    let r = LogoutResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((r.itt, r.response), (0x61, 0));
    assert!(matches!(ini.events()[..], [Event::LoggedOut]));
    assert!(ini.conn.is_closing());
}

#[test]
fn request_logout_sends_async_event() {
    let mut ini = logged_in(&[]);
    ini.conn.request_logout();
    let pdu = ini.recv_one();
    assert_eq!(pdu.bhs.opcode(), Opcode::AsyncMessage);
    assert_eq!(pdu.bhs.0[36], 1);
}

#[test]
fn snack_and_unknown_opcodes_are_rejected() {
    let mut ini = logged_in(&[]);
    let snack = SnackHeader {
        snack_type: 0,
        lun: [0; 8],
        itt: 5,
        ttt: 0,
        exp_stat_sn: ini.exp_stat_sn,
        beg_run: 0,
        run_length: 0,
    };
    ini.send(Pdu::new(snack.to_bhs())).unwrap();
    let r = ini.recv_one();
    assert_eq!(
        RejectHeader::parse(&r.bhs).reason,
        RejectReason::SnackReject
    );
    assert_eq!(&r.data[..], &snack.to_bhs().0[..]);
    ini.send(Pdu::new(Bhs::new(Opcode::Unknown(0x1d)))).unwrap();
    let r = ini.recv_one();
    assert_eq!(
        RejectHeader::parse(&r.bhs).reason,
        RejectReason::CommandNotSupported
    );
}

#[test]
fn oversized_data_segment_is_fatal() {
    let mut ini = logged_in(&[]);
    let mut bhs = DataOutHeader {
        final_bit: true,
        lun: [0; 8],
        itt: 1,
        ttt: RESERVED_TAG,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    }
    .to_bhs();
    bhs.set_data_segment_length(262_145);
    assert!(matches!(
        ini.send_raw(&bhs.0),
        Err(ProtocolError::DataSegmentTooLong { .. })
    ));
}

/// Logged in, negotiating `op_keys`, to a target that takes WRITEs of up to 40 MiB.
fn large_transfers_logged_in(op_keys: &[(&str, &str)]) -> Initiator {
    let settings = TargetSettings {
        max_transfer_length: 40 << 20,
        ..TargetSettings::default()
    };
    let mut ini = Initiator::new(settings, TestAuthority::open());
    ini.login(op_keys);
    ini
}

#[test]
fn r2ts_are_deferred_beyond_the_connection_budget() {
    let mut ini = large_transfers_logged_in(&[("InitialR2T", "Yes"), ("MaxBurstLength", "262144")]);
    let (_, a) = ini.command(&[0x2a], 40 << 20, false, true);
    let (_, b) = ini.command(&[0x2a], 40 << 20, false, true);
    ini.send(a).unwrap();
    assert_eq!(
        ini.recv().len(),
        1,
        "first task solicits (MaxOutstandingR2T=1)"
    );
    ini.send(b).unwrap();
    assert!(ini.recv().is_empty(), "second task waits for budget");
}

#[test]
fn solicited_data_out_stays_reserved_until_the_command_completes() {
    let mut ini = large_transfers_logged_in(&[
        ("InitialR2T", "Yes"),
        ("MaxBurstLength", "16776192"),
        ("MaxRecvDataSegmentLength", "262144"),
    ]);
    let len = 40u32 << 20;
    let (a, cmd_a) = ini.command(&[0x2a], len, false, true);
    let (b, cmd_b) = ini.command(&[0x2a], len, false, true);
    ini.send(cmd_a).unwrap();
    ini.send(cmd_b).unwrap();
    let r2ts: Vec<ReadyToTransferHeader> = ini
        .recv()
        .iter()
        .map(|p| ReadyToTransferHeader::parse(&p.bhs))
        .collect();
    assert!(!r2ts.is_empty() && r2ts.iter().all(|r| r.itt == a));
    // Send all of a's data, R2T by R2T.
    let mut pending = r2ts;
    let chunk = vec![0x5a; 262_144];
    while let Some(r) = pending.pop() {
        let mut offset = r.buffer_offset;
        let end = r.buffer_offset + r.desired_length;
        let mut data_sn = 0;
        while offset < end {
            let n = (end - offset).min(chunk.len() as u32);
            let last = offset + n == end;
            ini.send(ini.data_out(
                a,
                r.ttt,
                data_sn,
                offset,
                chunk[..n as usize].to_vec(),
                last,
            ))
            .unwrap();
            offset += n;
            data_sn += 1;
        }
        for p in ini.recv() {
            let r = ReadyToTransferHeader::parse(&p.bhs);
            assert_eq!(r.itt, a, "b gets no R2T while a holds the budget");
            pending.push(r);
        }
    }
    assert_eq!(ini.command_event().data_out.len(), len as usize);
    // a is handed over but executing: its 40 MiB are still held, so b still waits.
    assert!(ini.recv().is_empty());
    ini.conn.complete_command(
        a,
        CommandResult {
            data_out_expected: len as usize,
            ..CommandResult::default()
        },
    );
    let out = ini.recv();
    assert!(out.iter().any(|p| p.bhs.opcode() == Opcode::ScsiResponse));
    let r2t_b = out
        .iter()
        .filter(|p| p.bhs.opcode() == Opcode::ReadyToTransfer)
        .map(|p| ReadyToTransferHeader::parse(&p.bhs))
        .next()
        .expect("b solicits once a completed");
    assert_eq!(r2t_b.itt, b);
}

proptest::proptest! {
    #[test]
    fn random_bytes_never_panic(data: Vec<u8>) {
        crate::fuzz_receive(&data);
        crate::fuzz_text(&data);
    }

    #[test]
    fn random_pdus_after_login_never_panic(pdus in proptest::collection::vec(
        (0u8..0x40, proptest::collection::vec(proptest::prelude::any::<u8>(), 47), 0usize..600), 1..20))
    {
        let mut ini = logged_in(&[("InitialR2T", "No")]);
        for (opcode, rest, data_len) in pdus {
            let mut bhs = Bhs::default();
            bhs.0[0] = opcode;
            bhs.0[1..].copy_from_slice(&rest);
            bhs.0[4] = 0;
            let pdu = Pdu::with_data(bhs, vec![0xab; data_len]);
            if ini.send(pdu).is_err() {
                break;
            }
            while let Some(e) = ini.conn.next_event() {
                if let Event::Command(c) = e {
                    ini.conn.complete_command(c.itt, CommandResult { data_in: vec![1; 700], ..CommandResult::default() });
                }
            }
            let mut out = Vec::new();
            ini.conn.take_output(&mut out);
        }
    }
}

#[test]
fn abort_of_completed_task_reports_task_does_not_exist() {
    let mut ini = logged_in(&[]);
    let itt = ini.deliver(&[0], 0, false, false);
    ini.conn.complete_command(itt, CommandResult::default());
    assert_eq!(ini.recv().len(), 1);
    ini.send(ini.abort_task(0x778, itt)).unwrap();
    assert!(ini.events().is_empty());
    let r = TaskManagementResponseHeader::parse(&ini.recv_one().bhs);
    assert_eq!((r.itt, r.response), (0x778, 1));
}

#[test]
fn abort_racing_with_completion_reports_task_does_not_exist() {
    let mut ini = logged_in(&[]);
    let itt = ini.deliver(&[0], 0, false, false);
    ini.send(ini.abort_task(0x779, itt)).unwrap();
    assert!(matches!(ini.events()[..], [Event::TaskManagement(_)]));
    ini.conn.complete_command(itt, CommandResult::default());
    ini.conn
        .complete_task_management(0x779, TmfResponse::FunctionComplete);
    let out = ini.recv();
    assert_eq!(out.len(), 2);
    let r = TaskManagementResponseHeader::parse(&out[1].bhs);
    assert_eq!((r.itt, r.response), (0x779, 1));
}
