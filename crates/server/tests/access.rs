//! Access control and CHAP, judged by an independent initiator (libiscsi's command-line
//! tools from Debian's libiscsi-bin) against a real listener on loopback.

use sliver_server::array::ChapSecret;
use sliver_server::Array;
use sliver_test_support::hosts::{self, iqn, HOST_A};
use sliver_test_support::target::Running;
use std::process::{Command, Output};

const TARGET: &str = "iqn.2026-11.test.sliver:access";

fn start(setup: impl FnOnce(&Array)) -> Running {
    Running::start(TARGET, setup)
}

fn run(tool: &str, args: &[&str]) -> Output {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} must be installed (Debian libiscsi-bin): {e}"));
    eprintln!(
        "$ {tool} {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn two_hosts(array: &Array) {
    hosts::two_hosts(
        array,
        &[("a0", 1 << 20), ("a3", 2 << 20), ("b0", 4 << 20)],
        &[
            ("a0", "host-a", 0),
            ("a3", "host-a", 3),
            ("b0", "host-b", 0),
        ],
    );
}

#[test]
fn report_luns_shows_only_the_hosts_volumes() {
    let t = start(two_hosts);
    let portal = format!("iscsi://{}", t.addr);
    let out = run("iscsi-ls", &["-i", HOST_A, "-s", &portal]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(TARGET), "{text}");
    let luns: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Lun:"))
        .collect();
    assert_eq!(
        luns.len(),
        2,
        "host-a must see exactly its two LUNs: {text}"
    );
    assert!(
        luns[0].starts_with('0') && luns[1].starts_with('3'),
        "{text}"
    );
    // 1 MiB and 2 MiB volumes, never host-b's 4 MiB one.
    assert!(!text.contains("4M"), "{text}");
}

#[test]
fn unmapped_lun_cannot_be_addressed() {
    let t = start(two_hosts);
    let url = |lun: u32| format!("iscsi://{}/{TARGET}/{lun}", t.addr);
    let ok = run("iscsi-readcapacity16", &["-i", HOST_A, &url(3)]);
    assert!(ok.status.success());
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("Total size:2097152"),
        "LUN 3 of host-a is the 2 MiB volume"
    );
    let refused = run("iscsi-readcapacity16", &["-i", HOST_A, &url(1)]);
    assert!(!refused.status.success(), "LUN 1 is not mapped for host-a");
}

#[test]
fn unknown_initiator_is_refused_login() {
    let t = start(two_hosts);
    let url = format!("iscsi://{}/{TARGET}/0", t.addr);
    let stranger = "iqn.2026-11.test:stranger";
    let out = run("iscsi-inq", &["-i", stranger, &url]);
    assert!(!out.status.success());
    // The refusal is an event and the initiator is offered for adding, once however often
    // it retries.
    let out = run("iscsi-inq", &["-i", stranger, &url]);
    assert!(!out.status.success());
    let refused = t.array.events().refused();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].initiator, stranger);
    assert_eq!(refused[0].reason, "no host lists this initiator");
    assert_eq!(refused[0].count, 2);
    assert!(refused[0].remote.starts_with("127.0.0.1:"));
    let events = t.array.events().after(0, 1000);
    let logins: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "login_refused")
        .collect();
    assert_eq!(logins.len(), 1, "{events:?}");
    assert!(logins[0].message.contains(stranger));
    assert_eq!(logins[0].initiator.as_deref(), Some(stranger));
    // Adding it to a host takes it off the list.
    t.array
        .create_host("stranger", vec![iqn(stranger)], None)
        .unwrap();
    assert!(t.array.events().refused().is_empty());
}

#[test]
fn chap_secret_is_checked() {
    let t = start(|array| {
        array.create_volume("v", 1 << 20, 512).unwrap();
        array
            .create_host(
                "h",
                vec![iqn(HOST_A)],
                Some(ChapSecret::new("alice", "correct-horse-battery").unwrap()),
            )
            .unwrap();
        array.connect("v", "h", Some(0)).unwrap();
    });
    let url = |cred: &str| format!("iscsi://{cred}@{}/{TARGET}/0", t.addr);
    let good = run(
        "iscsi-inq",
        &["-i", HOST_A, &url("alice%correct-horse-battery")],
    );
    assert!(good.status.success(), "right secret logs in");
    let bad = run("iscsi-inq", &["-i", HOST_A, &url("alice%wrong-secret-123")]);
    assert!(!bad.status.success(), "wrong secret is refused");
    let none = run(
        "iscsi-inq",
        &["-i", HOST_A, &format!("iscsi://{}/{TARGET}/0", t.addr)],
    );
    assert!(
        !none.status.success(),
        "no CHAP where CHAP is required is refused"
    );
}

#[test]
fn wildcard_host_serves_any_initiator() {
    let t = start(|array| {
        array.create_volume("demo", 8 << 20, 512).unwrap();
        array.connect("demo", "*", Some(0)).unwrap();
    });
    let url = format!("iscsi://{}/{TARGET}/0", t.addr);
    let out = run(
        "iscsi-readcapacity16",
        &["-i", "iqn.2026-11.test:anyone", &url],
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Total size:8388608"));
}

/// The session list (`GET /api/v1/sessions` reads it): a logged-in host appears with its
/// host name, addresses and TSIH, and disappears when it logs out.
#[test]
fn live_sessions_are_listed_with_their_host() {
    let t = start(two_hosts);
    assert!(t.server.sessions().is_empty());
    let url = format!("iscsi://{}/{TARGET}/0", t.addr);
    let options = sliver_initiator::SessionOptions {
        initiator_name: HOST_A.into(),
        ..Default::default()
    };
    let s = sliver_initiator::Session::connect(&url, options).unwrap();
    let list = t.server.sessions();
    assert_eq!(list.len(), 1, "{list:?}");
    let one = &list[0];
    assert_eq!(one.initiator, HOST_A);
    assert_eq!(one.host.as_deref(), Some("host-a"));
    assert_eq!((one.kind, one.chap), ("normal", false));
    assert!(one.tsih > 0);
    assert_eq!(one.isid.len(), 12);
    assert!(one.remote.starts_with("127.0.0.1:"));
    assert_eq!(one.portal, t.addr.to_string());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(one.login_ms <= now && one.login_ms + 60_000 > now);
    s.logout().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !t.server.sessions().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the session stayed listed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A logged-in session sees the LUNs mapped and unmapped for its host from then on: the LUN
/// table a session keeps is rebuilt whenever the array's configuration moves.
#[test]
fn a_live_session_sees_luns_mapped_and_unmapped_for_its_host() {
    use sliver_initiator::{OutgoingCommand, Session, SessionOptions};
    let t = start(two_hosts);
    let url = format!("iscsi://{}/{TARGET}/0", t.addr);
    let options = SessionOptions {
        initiator_name: HOST_A.into(),
        ..Default::default()
    };
    let mut s = Session::connect(&url, options).unwrap();
    let luns = |s: &mut Session| -> Vec<u64> {
        let mut cdb = vec![0u8; 12];
        cdb[0] = 0xa0; // REPORT LUNS
        cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
        let c = s
            .execute(OutgoingCommand::new(cdb).with_data_in(4096).on_lun(0))
            .unwrap();
        assert!(c.is_good(), "{:?}", c.sense);
        let len = u32::from_be_bytes(c.data[0..4].try_into().unwrap()) as usize;
        c.data[8..8 + len]
            .chunks(8)
            .map(|e| u64::from(u16::from_be_bytes([e[0] & 0x3f, e[1]])))
            .collect()
    };
    // READ(10) of one block; a new LU's power-on unit attention is answered first.
    let read = |s: &mut Session, lun: u64| {
        let cdb = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let mut c = s
            .execute(
                OutgoingCommand::new(cdb.clone())
                    .with_data_in(512)
                    .on_lun(lun),
            )
            .unwrap();
        for _ in 0..3 {
            if c.sense
                .as_ref()
                .is_some_and(|k| k.asc == 0x29 || k.asc == 0x3f)
            {
                c = s
                    .execute(
                        OutgoingCommand::new(cdb.clone())
                            .with_data_in(512)
                            .on_lun(lun),
                    )
                    .unwrap();
            }
        }
        c
    };
    assert_eq!(luns(&mut s), vec![0, 3]);
    t.array.create_volume("a5", 1 << 20, 512).unwrap();
    t.array.connect("a5", "host-a", Some(5)).unwrap();
    assert_eq!(luns(&mut s), vec![0, 3, 5], "mapped while logged in");
    assert!(read(&mut s, 5).is_good());
    t.array.disconnect("a3", "host-a").unwrap();
    assert_eq!(luns(&mut s), vec![0, 5], "unmapped while logged in");
    let gone = read(&mut s, 3);
    let sense = gone.sense.expect("a LUN no longer mapped fails with sense");
    assert_eq!(
        (sense.asc, sense.ascq),
        (0x25, 0x00),
        "LOGICAL UNIT NOT SUPPORTED"
    );
    s.logout().unwrap();
}
