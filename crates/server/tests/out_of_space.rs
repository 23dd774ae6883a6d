//! Out of space end to end: a small array filled through iSCSI until writes fail with
//! DATA PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT (27/07); reads, UNMAP and overwrites with
//! data already stored keep working; after freeing space writes succeed
//! again, and the offline checker finds the array consistent.

use sliver_engine::{EngineConfig, Tuning};
use sliver_initiator::sense::SenseKey;
use sliver_initiator::{Error, Session, SessionOptions};
use sliver_server::array::{check_array, ArrayOptions, ANY_HOST};
use sliver_server::{Array, Server, ServerOptions};
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.test.sliver:full";
const MIB: u64 = 1 << 20;

fn unique(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// (sense key, ASC, ASCQ) of a failed command.
fn sense_of(e: &Error) -> Option<(SenseKey, u8, u8)> {
    match e {
        Error::Check { sense: Some(s), .. } => Some((s.key, s.asc, s.ascq)),
        _ => None,
    }
}

#[test]
fn a_full_array_refuses_new_data_with_27_07_and_recovers_when_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let options = ArrayOptions {
        // 64 segments of 1 MiB: a 64 MiB array, 2 segments reserved for the collector.
        capacity_bytes: Some(64 * MIB),
        engine: EngineConfig {
            chunk_size: 4096,
            segment_size: MIB as u32,
        },
        tuning: Tuning::default(),
    };
    let array = Arc::new(Array::open_with(dir.path(), TARGET, options).unwrap());
    array.create_volume("big", 256 * MIB, 512).unwrap();
    array.create_volume("other", 16 * MIB, 512).unwrap();
    array.connect("big", ANY_HOST, Some(0)).unwrap();
    array.connect("other", ANY_HOST, Some(1)).unwrap();
    let server = Server::new(array.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listeners = runtime
        .block_on(server.bind(&ServerOptions {
            portals: vec!["127.0.0.1:0".parse().unwrap()],
        }))
        .unwrap();
    let addr = server.portals()[0];
    let s = server.clone();
    let thread = std::thread::spawn(move || runtime.block_on(s.run(listeners)));

    let url = |lun: u32| format!("iscsi://{addr}/{TARGET}/{lun}");
    let mut big = Session::connect(&url(0), SessionOptions::default()).unwrap();
    let mut other = Session::connect(&url(1), SessionOptions::default()).unwrap();
    other.write16(0, unique(1000)).unwrap();

    // Fill with unique data until the array says it is full.
    let mut written = 0u64;
    let failure = loop {
        match big.write16(written / 512, unique(written / MIB)) {
            Ok(()) => written += MIB,
            Err(e) => break e,
        }
        assert!(written < 256 * MIB, "a 64 MiB array took 256 MiB");
    };
    assert_eq!(
        sense_of(&failure),
        Some((SenseKey::DataProtect, 0x27, 0x07)),
        "{failure}"
    );
    assert!(written >= 48 * MIB, "only {written} bytes fit");

    // Everything else keeps working on the full array.
    assert_eq!(big.read16(0, 2048).unwrap(), unique(0));
    assert_eq!(other.read16(0, 2048).unwrap(), unique(1000));
    big.write16(written / 512, unique(0))
        .expect("data already stored needs no new space");
    big.synchronize_cache16(0, 0).unwrap();
    big.unmap(&[(0, (32 * MIB / 512) as u32)])
        .expect("UNMAP works when full");

    // The freed space comes back (the collector runs for the writer) and writes succeed.
    big.write16((written + MIB) / 512, unique(77_777))
        .expect("write after freeing space");
    assert_eq!(
        big.read16((written + MIB) / 512, 2048).unwrap(),
        unique(77_777)
    );
    big.logout().unwrap();
    other.logout().unwrap();

    server.shutdown();
    thread.join().unwrap();
    array.shutdown().unwrap();
    drop(server);
    drop(array);
    let problems = check_array(dir.path(), &mut |_, _| {}).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
