//! The --watch daemon on a real ext4 file system (root only).

mod common;

use common::{LoopFs, MIB};
use sliver_reclaim::limiter::RateSpec;
use sliver_reclaim::watch::{self, MountSettings, WatchConfig, WatchEvent};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);

#[test]
fn watch_reruns_when_free_space_grows_and_stops_on_request() {
    let fs = LoopFs::new("ext4", 512 * MIB, |_| {});
    fs.write_file("data", 96 * MIB);
    let config = WatchConfig {
        interval: Duration::from_millis(200),
        mounts: vec![MountSettings {
            path: fs.path().to_path_buf(),
            limit: RateSpec::unlimited(),
            min_extent: None,
            window: None,
            min_growth: 32 * MIB,
        }],
    };
    let (tx, rx) = mpsc::channel();
    let daemon = std::thread::spawn(move || {
        watch::watch(&config, &STOP, &mut |ev| match ev {
            WatchEvent::Pass(r) => tx.send(Ok(r.bytes_trimmed)).unwrap(),
            WatchEvent::Error { message, .. } => tx.send(Err(message.to_owned())).unwrap(),
        })
    });
    // Generous bound against a hang; no timing is asserted.
    let next = || rx.recv_timeout(Duration::from_secs(120)).expect("a pass");
    let first = next().unwrap();
    assert!(first > 0, "the first pass trims the initial free space");
    fs.remove_file("data");
    let second = next().unwrap();
    assert!(second >= 96 * MIB, "the freed file is reclaimed: {second}");
    STOP.store(true, Ordering::Relaxed);
    daemon.join().unwrap().unwrap();
    // No pass ran without new free space.
    assert!(rx.try_recv().is_err());
}
