//! Resource limits against hostile or broken initiators, on a real listener.

use sliver_server::array::ANY_HOST;
use sliver_server::{Array, Server, ServerOptions};
use sliver_test_support::target::{runtime, serve_on_loopback};
use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_connection_that_never_logs_in_is_closed_and_others_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let target = "iqn.2026-11.test.sliver:limits";
    let array = Arc::new(Array::open(dir.path(), target).unwrap());
    array.create_volume("v", 64 << 20, 512).unwrap();
    array.connect("v", ANY_HOST, Some(0)).unwrap();
    let server = Server::new(array);
    server.set_login_timeout(Duration::from_millis(300));
    let (addr, thread) = serve_on_loopback(&server, "sliver-test");

    // A slow-loris peer: connects, sends half a header, then nothing.
    let mut idle = TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut idle, &[0x43, 0x87, 0, 0]).unwrap();
    // Bounded wait so a regression fails instead of hanging the suite.
    idle.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut byte = [0u8; 1];
    let n = idle
        .read(&mut byte)
        .expect("closed by the server, not timed out");
    assert_eq!(n, 0, "the server closes the connection");

    // A well-behaved initiator logs in fine meanwhile.
    let out = std::process::Command::new("iscsi-inq")
        .arg(format!("iscsi://{addr}/{target}/0"))
        .output()
        .expect("iscsi-inq (libiscsi-bin) must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("sliver"));

    server.shutdown();
    thread.join().unwrap();
}

/// A shutdown requested before the accept loops start still stops them: `run` returns. (The
/// loops once waited for a change of the shutdown flag after subscribing, and a flag already
/// set never changed again.)
#[test]
fn a_shutdown_before_run_still_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let array = Arc::new(Array::open(dir.path(), "iqn.2026-11.test.sliver:early").unwrap());
    let server = Server::new(array);
    let runtime = runtime(2);
    let listeners = runtime
        .block_on(server.bind(&ServerOptions {
            portals: vec!["127.0.0.1:0".parse().unwrap()],
        }))
        .unwrap();
    server.shutdown();
    let (tx, rx) = std::sync::mpsc::channel();
    let s = server.clone();
    std::thread::spawn(move || {
        runtime.block_on(s.run(listeners));
        let _ = tx.send(());
    });
    // Bounded wait so a regression fails instead of hanging the suite.
    rx.recv_timeout(Duration::from_secs(60))
        .expect("run() returned after an early shutdown");
}
