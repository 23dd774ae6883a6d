//! Out of space end to end: a small array filled through iSCSI until writes fail with
//! DATA PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT (27/07); reads, UNMAP and overwrites with
//! data already stored keep working; after freeing space writes succeed
//! again, and the offline checker finds the array consistent.

use sliver_engine::{EngineConfig, Tuning};
use sliver_initiator::sense::SenseKey;
use sliver_initiator::{cdb, Error, Provisioning, Session, SessionOptions};
use sliver_server::array::{check_array, ArrayOptions, ANY_HOST};
use sliver_server::{Array, Server};
use sliver_test_support::target::serve_on_loopback;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.test.sliver:full";
const MIB: u64 = 1 << 20;

/// A MiB unique to `seed`.
fn unique(seed: u64) -> Vec<u8> {
    sliver_test_support::data::unique(seed, MIB as usize)
}

/// (sense key, ASC, ASCQ) of a failed command.
fn sense_of(e: &Error) -> Option<(SenseKey, u8, u8)> {
    match e {
        Error::Check { sense: Some(s), .. } => Some((s.key, s.asc, s.ascq)),
        _ => None,
    }
}

/// A 64 MiB array (64 segments of 1 MiB, 2 kept for the collector) served on loopback with
/// volumes "big" (LUN 0, 256 MiB) and "other" (LUN 1, 16 MiB).
struct Running {
    dir: tempfile::TempDir,
    array: Arc<Array>,
    server: Arc<Server>,
    thread: std::thread::JoinHandle<()>,
    addr: std::net::SocketAddr,
}

impl Running {
    fn url(&self, lun: u32) -> String {
        format!("iscsi://{}/{TARGET}/{lun}", self.addr)
    }

    /// Stop everything and run the offline checker.
    fn stop_and_check(self) {
        self.server.shutdown();
        self.thread.join().unwrap();
        self.array.shutdown().unwrap();
        drop(self.server);
        drop(self.array);
        let problems = check_array(self.dir.path(), &mut |_, _| {}).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }
}

fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let options = ArrayOptions {
        // 64 segments of 1 MiB: a 64 MiB array, 2 segments reserved for the collector.
        capacity_bytes: Some(64 * MIB),
        engine: EngineConfig {
            chunk_size: 4096,
            segment_size: MIB as u32,
        },
        tuning: Tuning::default(),
        replication: None,
        hydrate: Default::default(),
    };
    let array = Arc::new(Array::open_with(dir.path(), TARGET, options).unwrap());
    array.create_volume("big", 256 * MIB, 512).unwrap();
    array.create_volume("other", 16 * MIB, 512).unwrap();
    array.connect("big", ANY_HOST, Some(0)).unwrap();
    array.connect("other", ANY_HOST, Some(1)).unwrap();
    let server = Server::new(array.clone());
    let (addr, thread) = serve_on_loopback(&server, "sliver-test");
    Running {
        dir,
        array,
        server,
        thread,
        addr,
    }
}

/// Write unique MiBs from `from` until a write fails; returns where it stopped and the error.
fn fill_until_full(s: &mut Session, from: u64) -> (u64, Error) {
    let mut at = from;
    loop {
        match s.write16(at / 512, unique(at / MIB)) {
            Ok(()) => at += MIB,
            Err(e) => return (at, e),
        }
        assert!(at < 256 * MIB, "a 64 MiB array took 256 MiB");
    }
}

#[test]
fn a_full_array_refuses_new_data_with_27_07_and_recovers_when_space_is_freed() {
    let r = start();
    let url = |lun: u32| r.url(lun);
    let mut big = Session::connect(&url(0), SessionOptions::default()).unwrap();
    let mut other = Session::connect(&url(1), SessionOptions::default()).unwrap();
    other.write16(0, unique(1000)).unwrap();

    // Fill with unique data until the array says it is full.
    let (written, failure) = fill_until_full(&mut big, 0);
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
    r.stop_and_check();
}

#[test]
fn anchored_blocks_hold_space_so_their_writes_succeed_on_a_full_array() {
    let r = start();
    let mut big = Session::connect(&r.url(0), SessionOptions::default()).unwrap();
    // VPD 0xB2: ANC_SUP with LBPU / LBPWS / LBPWS10 / LBPRZ.
    let lbp = big.inquiry(Some(0xb2)).unwrap();
    assert_eq!(lbp[5], 0x80 | 0x40 | 0x20 | 0x04 | 0x02, "{lbp:?}");

    // Anchor 8 MiB by UNMAP with ANCHOR and 8 MiB by WRITE SAME(16) with ANCHOR + UNMAP.
    big.write16(0, unique(1)).unwrap();
    let mut unmap = cdb::unmap(&[(0, (8 * MIB / 512) as u32)]).unwrap();
    unmap.cdb[1] |= 0x01;
    big.execute_checked(unmap).unwrap();
    let mut same = cdb::write_same16(8 * MIB / 512, (8 * MIB / 512) as u32, vec![0; 512], true);
    same.cdb[1] |= 0x10;
    big.execute_checked(same).unwrap();
    // ANCHOR without UNMAP is refused (SBC-4 table 122).
    let mut bad = cdb::write_same16(0, 8, vec![0; 512], false);
    bad.cdb[1] |= 0x10;
    let e = big.execute_checked(bad).unwrap_err();
    assert_eq!(sense_of(&e), Some((SenseKey::IllegalRequest, 0x24, 0x00)));

    let status = big.get_lba_status(0).unwrap();
    assert_eq!(
        (status[0].lba, status[0].blocks, status[0].state),
        (0, (16 * MIB / 512) as u32, Provisioning::Anchored),
        "{status:?}"
    );
    assert_eq!(status[1].state, Provisioning::Deallocated);
    assert!(big.read16(0, 2048).unwrap().iter().all(|&b| b == 0));

    // Fill the rest with unique data until the array is full.
    let (at, failure) = fill_until_full(&mut big, 16 * MIB);
    assert_eq!(
        sense_of(&failure),
        Some((SenseKey::DataProtect, 0x27, 0x07))
    );
    // More anchoring needs space that is not there.
    let mut more = cdb::unmap(&[(at / 512 + 2048, 2048)]).unwrap();
    more.cdb[1] |= 0x01;
    let e = big.execute_checked(more).unwrap_err();
    assert_eq!(sense_of(&e), Some((SenseKey::DataProtect, 0x27, 0x07)));
    // The anchored 16 MiB still take unique data.
    for m in 0..16 {
        big.write16(m * MIB / 512, unique(5000 + m))
            .unwrap_or_else(|e| panic!("write into anchored MiB {m}: {e}"));
    }
    assert_eq!(big.read16(15 * MIB / 512, 2048).unwrap(), unique(5015));
    assert_eq!(
        big.get_lba_status(0).unwrap()[0].state,
        Provisioning::Mapped
    );
    big.logout().unwrap();
    r.stop_and_check();
}
