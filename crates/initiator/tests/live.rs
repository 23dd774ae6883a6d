//! The initiator against a real sliver target on loopback (in-process `Server` on an ephemeral
//! port), cross-checked with libiscsi's tools where they overlap.

use sliver_initiator::cdb;
use sliver_initiator::sense::status;
use sliver_initiator::{Error, Provisioning, Residual, SenseKey, Session, SessionOptions};
use sliver_server::array::ChapSecret;
use sliver_server::Array;
use sliver_test_support::data::unique as pattern;
use sliver_test_support::hosts::iqn;
use sliver_test_support::target::Running;
use sliver_volume::Volume;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.test.sliver:initiator";
const MIB: usize = 1 << 20;

/// The volume `name` of the running target's array.
fn volume(t: &Running, name: &str) -> Arc<dyn Volume> {
    t.array.unit(name).expect("volume exists").volume().clone()
}

fn start(setup: impl FnOnce(&Array)) -> Running {
    Running::start(TARGET, setup)
}

fn one_volume(size: u64) -> impl FnOnce(&Array) {
    move |array: &Array| {
        array.create_volume("v", size, 512).unwrap();
        array.connect("v", "*", Some(0)).unwrap();
    }
}

#[test]
fn read_capacity_matches_libiscsi_and_data_round_trips() {
    let t = start(one_volume(64 * MIB as u64));
    let mut s = Session::connect(&t.url(0), SessionOptions::default()).unwrap();
    let cap = s.read_capacity16().unwrap();
    assert_eq!(cap.block_size, 512);
    assert_eq!(cap.blocks(), (64 * MIB / 512) as u64);
    assert!(
        cap.lbpme && cap.lbprz,
        "sliver volumes are thin and read zeros"
    );
    assert_eq!(cap.lbppbe, 3);

    let out = std::process::Command::new("iscsi-readcapacity16")
        .args(["-i", "iqn.2026-11.test:libiscsi", &t.url(0)])
        .output()
        .expect("iscsi-readcapacity16 must be installed (Debian libiscsi-bin)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("Total size:{}", cap.bytes())),
        "libiscsi and our initiator disagree: {text}"
    );

    // 4 MiB + one block: immediate data, unsolicited Data-Out and R2T-solicited Data-Out.
    let data = pattern(1, 4 * MIB + 512);
    s.write16(1000, data.clone()).unwrap();
    let back = s.read16(1000, (data.len() / 512) as u32).unwrap();
    assert!(back == data, "read back differs from what was written");
    // Neighbouring blocks stay zero.
    assert_eq!(s.read16(999, 1).unwrap(), vec![0; 512]);
    s.synchronize_cache16(0, 0).unwrap();
    s.logout().unwrap();
}

#[test]
fn every_data_out_mode_negotiates_and_transfers() {
    let t = start(one_volume(16 * MIB as u64));
    for (i, (immediate, initial_r2t)) in
        [(true, false), (true, true), (false, false), (false, true)]
            .into_iter()
            .enumerate()
    {
        let options = SessionOptions {
            immediate_data: immediate,
            initial_r2t,
            first_burst_length: 65_536,
            max_recv_data_segment_length: 16_384,
            ..SessionOptions::default()
        };
        let mut s = Session::connect(&t.url(0), options).unwrap();
        let n = s.negotiated();
        // sliver prefers ImmediateData=Yes (AND) and InitialR2T=No (OR).
        assert_eq!(n.immediate_data, immediate, "mode {i}");
        assert_eq!(n.initial_r2t, initial_r2t, "mode {i}");
        assert_eq!(n.first_burst_length, 65_536);
        assert_eq!(n.our_max_recv_data_segment_length, 16_384);
        assert!(n.target_max_recv_data_segment_length >= 8192);
        let data = pattern(10 + i as u64, MIB + 3 * 512);
        let lba = (i * 4096) as u64;
        s.write16(lba, data.clone()).unwrap();
        // Data-In arrives in 16 KiB PDUs (our declared limit).
        let back = s.read16(lba, (data.len() / 512) as u32).unwrap();
        assert!(back == data, "mode {i}: read back differs");
        s.logout().unwrap();
    }
}

#[test]
fn many_commands_are_outstanding_at_once() {
    let t = start(one_volume(32 * MIB as u64));
    let mut s = Session::connect(&t.url(0), SessionOptions::default()).unwrap();
    s.test_unit_ready().unwrap(); // absorb the new nexus' unit attention
    let bs = s.block_size().unwrap();
    const N: usize = 48;
    const BLOCKS: u32 = 128; // 64 KiB each
    let mut tags = Vec::new();
    for i in 0..N {
        let data = pattern(100 + i as u64, (BLOCKS * bs) as usize);
        let cmd = cdb::write16(i as u64 * BLOCKS as u64, data, bs, false).unwrap();
        tags.push(s.submit(cmd).unwrap());
    }
    assert_eq!(s.outstanding(), N, "all writes are in flight together");
    let mut done = std::collections::HashSet::new();
    for _ in 0..N {
        let c = s.wait_any().unwrap();
        assert_eq!(c.status, status::GOOD);
        assert!(done.insert(c.tag), "a tag completed twice");
    }
    assert_eq!(done.len(), N);
    assert!(s.wait_any().is_err(), "nothing is left to wait for");

    let mut reads = Vec::new();
    for i in 0..N {
        let cmd = cdb::read16(i as u64 * BLOCKS as u64, BLOCKS, bs).unwrap();
        reads.push((i, s.submit(cmd).unwrap()));
    }
    // Collect in reverse order of submission: completions are matched by tag.
    for (i, tag) in reads.into_iter().rev() {
        let c = s.wait(tag).unwrap();
        assert_eq!(c.residual, Residual::None);
        assert!(
            c.data == pattern(100 + i as u64, (BLOCKS * bs) as usize),
            "read {i} returned another command's data"
        );
    }
    s.logout().unwrap();
}

#[test]
fn unmap_and_write_same_deallocate() {
    let t = start(one_volume(64 * MIB as u64));
    let vol = volume(&t, "v");
    let mut s = Session::connect(&t.url(0), SessionOptions::default()).unwrap();
    s.write16(0, pattern(7, 8 * MIB)).unwrap();
    s.synchronize_cache16(0, 0).unwrap();
    let before = vol.space().unwrap().mapped_bytes;
    assert!(before >= 8 * MIB as u64, "8 MiB written, {before} mapped");
    let st = s.get_lba_status(0).unwrap();
    assert_eq!(st[0].state, Provisioning::Mapped);

    // UNMAP the first 4 MiB in two descriptors, WRITE SAME(UNMAP) the next 2 MiB.
    s.unmap(&[(0, 4096), (4096, 4096)]).unwrap();
    s.write_same16(8192, 4096, true).unwrap();
    let after = vol.space().unwrap().mapped_bytes;
    assert!(
        after + 6 * MIB as u64 <= before,
        "6 MiB deallocated: before {before}, after {after}"
    );
    let st = s.get_lba_status(0).unwrap();
    assert_eq!(st[0].state, Provisioning::Deallocated);
    assert_eq!((st[0].lba, st[0].blocks), (0, 12288));
    let st = s.get_lba_status(12288).unwrap();
    assert_eq!(st[0].state, Provisioning::Mapped);
    assert_eq!(s.read16(100, 8).unwrap(), vec![0; 4096]);
    s.logout().unwrap();
}

#[test]
fn check_conditions_carry_decoded_sense() {
    let t = start(one_volume(MIB as u64));
    let mut s = Session::connect(&t.url(0), SessionOptions::default()).unwrap();
    // The first command of a new I_T nexus reports the power-on unit attention.
    let c = s.execute(cdb::test_unit_ready()).unwrap();
    assert_eq!(c.status, status::CHECK_CONDITION);
    let sense = c.sense.expect("sense data with the check condition");
    assert_eq!(sense.key, SenseKey::UnitAttention);
    assert_eq!(sense.asc, 0x29);

    let err = s.read16(2048, 1).unwrap_err();
    let sense = err.sense().expect("sense of the failed read");
    assert_eq!(sense.key, SenseKey::IllegalRequest);
    assert_eq!((sense.asc, sense.ascq), (0x21, 0x00));
    assert!(
        err.to_string()
            .contains("LOGICAL BLOCK ADDRESS OUT OF RANGE"),
        "{err}"
    );
    // The session survives a failed command.
    assert_eq!(s.read16(2047, 1).unwrap().len(), 512);
    s.ping().unwrap();
    s.logout().unwrap();
}

#[test]
fn chap_and_access_control() {
    let t = start(|array| {
        array.create_volume("v", MIB as u64, 512).unwrap();
        array
            .create_host(
                "h",
                vec![iqn("iqn.2026-11.test:chap-host")],
                Some(ChapSecret::new("alice", "correct-horse-battery").unwrap()),
            )
            .unwrap();
        array.connect("v", "h", Some(0)).unwrap();
    });
    let opts = || SessionOptions {
        initiator_name: "iqn.2026-11.test:chap-host".into(),
        ..SessionOptions::default()
    };
    let good = format!("iscsi://alice%correct-horse-battery@{}/{TARGET}/0", t.addr);
    let mut s = Session::connect(&good, opts()).unwrap();
    assert_eq!(s.read_capacity16().unwrap().bytes(), MIB as u64);
    s.logout().unwrap();

    let bad = format!("iscsi://alice%wrong-secret-1234@{}/{TARGET}/0", t.addr);
    match Session::connect(&bad, opts()) {
        Err(Error::Login { message, .. }) => {
            assert!(message.contains("authentication failed"), "{message}")
        }
        other => panic!("a wrong secret must fail the login: {:?}", other.err()),
    }
    match Session::connect(&t.url(0), opts()) {
        Err(Error::Login { message, .. }) => assert!(message.contains("CHAP"), "{message}"),
        other => panic!("no secret must fail the login: {:?}", other.err()),
    }
    let stranger = SessionOptions {
        initiator_name: "iqn.2026-11.test:stranger".into(),
        ..SessionOptions::default()
    };
    match Session::connect(&t.url(0), stranger) {
        Err(Error::Login { message, .. }) => assert!(message.contains("not allowed"), "{message}"),
        other => panic!("an unknown initiator must be refused: {:?}", other.err()),
    }
}

#[test]
fn connection_refused_is_a_clear_error() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Session::connect(
        &format!("iscsi://127.0.0.1:{port}/{TARGET}/0"),
        SessionOptions::default(),
    )
    .err()
    .expect("nothing listens there");
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    let err = Session::connect("iscsi://127.0.0.1/", SessionOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, Error::Url(_)), "{err}");
}

/// A one-connection target built from sliver's sans-I/O protocol core, so the test controls
/// exactly when the target pings and asks for logout.
mod scripted {
    use sliver_iscsi::{
        Authority, Authorization, CommandResult, Connection, DiscoveredTarget, Event, LoginStatus,
        SessionInfo, TargetSettings,
    };
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;

    struct Open;
    impl Authority for Open {
        fn send_targets(&self, _: &str) -> Vec<DiscoveredTarget> {
            vec![]
        }
        fn authorize(&self, _: &str, _: Option<&str>) -> Authorization {
            Authorization::Allow { chap: None }
        }
        fn register_session(&self, _: &SessionInfo) -> Result<u16, LoginStatus> {
            Ok(7)
        }
    }

    /// Serves one connection: answers every command with GOOD (and zeros for reads), queues a
    /// NOP-In after every `ping_every` commands, and asks for logout after `logout_after`.
    /// Returns how many of its pings were answered.
    pub fn serve(listener: TcpListener, ping_every: usize, logout_after: usize) -> usize {
        let (mut sock, _) = listener.accept().unwrap();
        let settings = Arc::new(TargetSettings {
            target_name: super::TARGET.into(),
            ..TargetSettings::default()
        });
        let mut conn = Connection::new(settings, Arc::new(Open));
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::new();
        let mut commands = 0;
        let mut pings_sent = 0;
        let mut pings_answered = 0;
        loop {
            let n = match sock.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if conn.receive(&buf[..n]).is_err() {
                break;
            }
            let mut closing = false;
            while let Some(ev) = conn.next_event() {
                match ev {
                    Event::Command(cmd) => {
                        commands += 1;
                        let len = cmd.expected_data_transfer_length as usize;
                        conn.complete_command(
                            cmd.itt,
                            CommandResult {
                                status: 0,
                                sense: vec![],
                                data_in: if cmd.read { vec![0; len] } else { vec![] },
                                data_out_expected: cmd.data_out.len(),
                            },
                        );
                        if commands % ping_every == 0 {
                            // False while the previous ping is unanswered.
                            if conn.ping() {
                                if pings_sent > 0 {
                                    pings_answered += 1;
                                }
                                pings_sent += 1;
                            }
                        }
                        if commands == logout_after {
                            conn.request_logout();
                        }
                    }
                    Event::LoggedOut => closing = true,
                    _ => {}
                }
            }
            conn.take_output(&mut out);
            if sock.write_all(&out).is_err() {
                break;
            }
            out.clear();
            if closing {
                break;
            }
        }
        pings_answered
    }
}

#[test]
fn target_pings_are_answered_and_logout_requests_seen() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let target = std::thread::spawn(move || scripted::serve(listener, 2, 19));
    let mut s = Session::connect(
        &format!("iscsi://{addr}/{TARGET}/0"),
        SessionOptions::default(),
    )
    .unwrap();
    for i in 0..20u64 {
        let c = s.execute(cdb::read16(i, 1, 512).unwrap()).unwrap();
        assert_eq!(c.data.len(), 512);
    }
    assert!(s.target_requested_logout());
    assert!(
        s.nop_ins_answered() >= 9,
        "answered {}",
        s.nop_ins_answered()
    );
    s.logout().unwrap();
    let answered = target.join().unwrap();
    assert!(answered >= 8, "the target saw {answered} pings answered");
}

/// Run an independent decoder on bytes sliver produced, when it is installed (CI installs
/// sg3-utils and ddpt; elsewhere the check is skipped with a note).
fn decode_with(tool: &str, args: &[&str], bytes: &[u8], hex: bool) -> Option<String> {
    if std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "{tool} is missing on CI");
        eprintln!("{tool} not installed: skipping its decoding");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in");
    if hex {
        let text: Vec<String> = bytes
            .chunks(16)
            .map(|l| {
                l.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        std::fs::write(&path, text.join("\n")).unwrap();
    } else {
        std::fs::write(&path, bytes).unwrap();
    }
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{}", path.to_str().unwrap()))
        .collect();
    let out = std::process::Command::new(tool)
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{tool} {args:?}: {out:?}");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn token_copy_between_volumes_shares_data_and_a_change_revokes_the_token() {
    let t = start(|array| {
        for (name, lun) in [("a", 0), ("b", 1)] {
            array.create_volume(name, 64 * MIB as u64, 512).unwrap();
            array.connect(name, "*", Some(lun)).unwrap();
        }
    });
    let mut s = Session::connect(&t.url(0), SessionOptions::default()).unwrap();
    // What Windows checks before it uses ODX: 3PC, and the token limits in VPD page 0x8F,
    // decoded by sg3-utils.
    assert_eq!(s.inquiry(None).unwrap()[5] & 0x08, 0x08, "3PC");
    let page = s
        .execute_checked(cdb::inquiry(Some(0x8f), 4096))
        .unwrap()
        .data;
    assert_eq!(
        u16::from_be_bytes([page[2], page[3]]) as usize + 4,
        page.len()
    );
    if let Some(text) = decode_with("sg_vpd", &["--inhex={}", "-p", "tpc"], &page, true) {
        // sg3-utils versions differ in capitalisation.
        let lower = text.to_lowercase();
        for line in [
            "block device rod token limits",
            "maximum range descriptors: 64",
            "default inactivity timeout: 60 seconds",
            "populate token",
            "write using token",
            "receive rod token information",
            "point in time copy - change vulnerable",
            "rod token features",
            "maximum token inactivity timeout: 600",
        ] {
            assert!(lower.contains(line), "sg_vpd lacks {line:?}:\n{text}");
        }
    }

    let data = pattern(11, 8 * MIB);
    s.write16(0, data.clone()).unwrap();
    s.synchronize_cache16(0, 0).unwrap();
    let before = t.array.engine_space();

    // POPULATE TOKEN for two ranges of "a", out of order, and fetch the token.
    s.execute_checked(cdb::populate_token(5, &[(4096, 8192), (0, 4096)], 0).unwrap())
        .unwrap();
    let info = s
        .execute_checked(cdb::receive_rod_token_information(5))
        .unwrap();
    let info = cdb::RodTokenInformation::parse(&info.data).unwrap();
    assert_eq!((info.service_action, info.copy_status), (0x10, 0x01));
    assert_eq!(info.transfer_blocks, 12288);
    let token = info.token.expect("a token");
    if let Some(text) = decode_with("ddptctl", &["--info", "--rtf={}"], &token, false) {
        for line in [
            "point in time copy - change vulnerable",
            "Number of bytes represented: 6291456",
            "block size: 512",
            "designator type: NAA",
        ] {
            assert!(text.contains(line), "ddptctl lacks {line:?}:\n{text}");
        }
    }

    // WRITE USING TOKEN on "b" (LUN 1) through the same session.
    s.execute_checked(
        cdb::write_using_token(6, &token, 0, &[(16384, 12288)])
            .unwrap()
            .on_lun(1),
    )
    .unwrap();
    let info = s
        .execute_checked(cdb::receive_rod_token_information(6).on_lun(1))
        .unwrap();
    let info = cdb::RodTokenInformation::parse(&info.data).unwrap();
    assert_eq!((info.service_action, info.copy_status), (0x11, 0x01));
    assert_eq!(info.transfer_blocks, 12288);
    let copied = s
        .execute_checked(cdb::read16(16384, 12288, 512).unwrap().on_lun(1))
        .unwrap()
        .data;
    assert!(copied[..4 * MIB] == data[2 * MIB..6 * MIB], "first range");
    assert!(copied[4 * MIB..] == data[..2 * MIB], "second range");
    // Shared, not copied: 6 MiB more mapped, no more data stored.
    let after = t.array.engine_space();
    assert_eq!(
        after.live_bytes, before.live_bytes,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        after.logical_mapped_bytes,
        before.logical_mapped_bytes + 6 * MIB as u64,
        "{before:?} -> {after:?}"
    );
    let b = t.array.unit("b").unwrap().stats();
    assert!(b.vaai.clone_write > 0, "{:?}", b.vaai);

    // A write to one represented block revokes the token: the host must copy by itself.
    s.write16(5000, pattern(12, 512)).unwrap();
    let c = s
        .execute(
            cdb::write_using_token(7, &token, 0, &[(20000, 8)])
                .unwrap()
                .on_lun(1),
        )
        .unwrap();
    assert_eq!(c.status, status::CHECK_CONDITION);
    let sense = c.sense.expect("sense");
    assert_eq!(
        (sense.key, sense.asc, sense.ascq),
        (SenseKey::IllegalRequest, 0x23, 0x06)
    );
    s.logout().unwrap();
}
