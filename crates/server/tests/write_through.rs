//! Write-through (issue 40): every command a write-through volume answers GOOD survives a
//! power failure taken at the very moment of the answer, whatever that failure keeps of the
//! writes not yet synced (none, all, each write whole or not, each 512-byte sector on its own).
//!
//! The commands run as the iSCSI target runs them ([`LogicalUnit::execute_deferring`]: the
//! answer comes from the engine's group-commit thread), and the crash image is taken inside
//! the completion, before the answer could reach the initiator. Every image is opened as
//! an engine and must hold everything acknowledged so far: writes, WRITE SAME, UNMAP, COMPARE
//! AND WRITE, EXTENDED COPY, and POPULATE TOKEN / WRITE USING TOKEN. A write-back volume run
//! through the same check loses its acknowledged write, which is what the check is for: an
//! answer sent before its sync fails it.

mod engine_lu;

use engine_lu::{cdb16, codes, good, tuning, Identity, MIB};
use sliver_engine::test_data::xorshift64;
use sliver_engine::{Engine, LogDevice, MemBackend};
use sliver_scsi::{LogicalUnit, NoCopyTargets, Request, Response, Status, TaskAttr};
use std::sync::mpsc;
use std::sync::Arc;

const BS: usize = 512;
/// What a power failure keeps of the unsynced writes.
const KEEP_NONE: u64 = 0;
const KEEP_ALL: u64 = 1;
const KEEP_WHOLE_WRITES: u64 = 2;
const KEEP_SECTORS: u64 = 3;

struct Rig {
    mem: Arc<MemBackend>,
    lu: Arc<LogicalUnit>,
    volume: u32,
    naa: [u8; 16],
    nexus: sliver_scsi::Nexus,
}

fn rig(write_cache: bool) -> Rig {
    let mem = Arc::new(MemBackend::new(64 * MIB));
    let engine = engine_lu::create_engine(mem.clone());
    let volume = engine.create_volume(16 * MIB).unwrap();
    engine.flush().unwrap();
    let naa = [
        0x60, 0xda, 0x5c, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x01,
    ];
    let who = Identity {
        serial: "write-through-1",
        naa,
        target_name: "iqn.2026-11.dev.sliver:wt",
    };
    let lu = Arc::new(engine_lu::lu_over(&engine, volume, BS as u32, &who));
    lu.set_write_cache(write_cache).unwrap();
    let nexus = engine_lu::nexus("iqn.test:write-through");
    let rig = Rig {
        mem,
        lu,
        volume,
        naa,
        nexus,
    };
    // The nexus's first command hears POWER ON, RESET.
    assert_eq!(codes(&rig.run_plain(&[0; 6], &[])), (0x6, 0x29, 0x00));
    rig
}

impl Rig {
    fn request<'a>(&'a self, cdb: &'a [u8], data_out: &'a [u8]) -> Request<'a> {
        Request {
            nexus: &self.nexus,
            cdb,
            data_out,
            attr: TaskAttr::Simple,
            luns: &[0],
            copy_targets: &NoCopyTargets,
        }
    }

    /// A command answered here (no crash image).
    fn run_plain(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        engine_lu::run(&self.lu, &self.nexus, cdb, data_out)
    }

    /// Run `cdb` as the target does; at the moment it is answered, take a crash image for
    /// each way of keeping unsynced writes. Returns the answer and the images.
    fn run(&self, cdb: &[u8], data_out: &[u8], seed: u64) -> (Response, Vec<MemBackend>) {
        let (tx, rx) = mpsc::channel();
        let mem = self.mem.clone();
        self.lu
            .execute_deferring(&self.request(cdb, data_out))
            .then(move |response| {
                let images = [KEEP_NONE, KEEP_ALL, KEEP_WHOLE_WRITES, KEEP_SECTORS]
                    .iter()
                    .map(|&mode| crash(&mem, mode, seed))
                    .collect::<Vec<_>>();
                tx.send((response, images)).unwrap();
            });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the command was never answered")
    }
}

/// A power failure now: the durable bytes plus what `mode` keeps of each unsynced write.
fn crash(mem: &MemBackend, mode: u64, seed: u64) -> MemBackend {
    let mut rng = seed | 1;
    mem.crash(|_, sectors| match mode {
        KEEP_NONE => vec![false; sectors],
        KEEP_ALL => vec![true; sectors],
        KEEP_WHOLE_WRITES => vec![xorshift64(&mut rng) & 1 == 1; sectors],
        _ => (0..sectors)
            .map(|_| xorshift64(&mut rng) & 1 == 1)
            .collect(),
    })
}

/// What each acknowledged block must read: (lba, content) of every block written so far.
#[derive(Default)]
struct Acknowledged(std::collections::BTreeMap<u64, Vec<u8>>);

impl Acknowledged {
    fn set(&mut self, lba: u64, data: &[u8]) {
        for (i, block) in data.chunks(BS).enumerate() {
            self.0.insert(lba + i as u64, block.to_vec());
        }
    }

    fn get(&self, lba: u64, blocks: u64) -> Vec<u8> {
        (lba..lba + blocks)
            .flat_map(|b| self.0.get(&b).cloned().unwrap_or_else(|| vec![0; BS]))
            .collect()
    }

    /// Every image, opened after its crash, reads back every acknowledged block; `Err` names
    /// the first image and block that lost one.
    fn check(&self, images: Vec<MemBackend>, volume: u32, what: &str) -> Result<(), String> {
        for (mode, image) in images.into_iter().enumerate() {
            let engine = Engine::open(Arc::new(image), tuning(), false)
                .map_err(|e| format!("{what}: image {mode} does not open: {e}"))?;
            for (&lba, expected) in &self.0 {
                let mut block = vec![0u8; BS];
                engine
                    .read(volume, lba * BS as u64, &mut block)
                    .map_err(|e| format!("{what}: image {mode}: {e}"))?;
                if block != *expected {
                    return Err(format!(
                        "{what}: after a crash keeping {} of the unsynced writes, block {lba} \
                         lost what was acknowledged",
                        ["none", "all", "whole writes", "sectors"][mode]
                    ));
                }
            }
        }
        Ok(())
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len).map(|_| xorshift64(&mut x) as u8).collect()
}

fn unmap_list(lba: u64, blocks: u32) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&lba.to_be_bytes());
    p[16..20].copy_from_slice(&blocks.to_be_bytes());
    p
}

fn unmap_cdb(len: usize) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    c
}

/// An EXTENDED COPY (LID1) parameter list copying `blocks` blocks from `src` to `dst` within
/// the LU named `naa`.
fn xcopy_list(naa: [u8; 16], blocks: u16, src: u64, dst: u64) -> Vec<u8> {
    let mut cscd = vec![0u8; 32];
    cscd[0] = 0xe4;
    cscd[4] = 0x01;
    cscd[5] = 0x03;
    cscd[7] = 16;
    cscd[8..24].copy_from_slice(&naa);
    cscd[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
    let mut segment = vec![0u8; 28];
    segment[0] = 0x02;
    segment[2..4].copy_from_slice(&24u16.to_be_bytes());
    segment[10..12].copy_from_slice(&blocks.to_be_bytes());
    segment[12..20].copy_from_slice(&src.to_be_bytes());
    segment[20..28].copy_from_slice(&dst.to_be_bytes());
    let mut p = vec![0u8; 16];
    p[1] = 0x18; // LIST ID USAGE 11b: no result kept
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    p[8..12].copy_from_slice(&28u32.to_be_bytes());
    p.extend(cscd);
    p.extend(segment);
    p
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

#[test]
fn every_command_a_write_through_volume_acknowledges_survives_a_crash_at_its_answer() {
    let rig = rig(false);
    let mut acked = Acknowledged::default();
    let mut seed = 0x5eed;
    let mut next_seed = || {
        seed += 1;
        seed
    };

    // WRITE(16), with and without FUA, and WRITE(10).
    for (i, fua) in [false, true, false].into_iter().enumerate() {
        let lba = 64 * i as u64 + 3;
        let data = pattern(next_seed(), 9 * BS);
        let (r, images) = rig.run(&cdb16(0x8a, lba, 9, fua), &data, next_seed());
        good(&r);
        acked.set(lba, &data);
        acked.check(images, rig.volume, "WRITE").unwrap();
    }

    // WRITE SAME(16) with a non-zero block, then zeros over part of it.
    let block = pattern(next_seed(), BS);
    let (r, images) = rig.run(&cdb16(0x93, 300, 40, false), &block, next_seed());
    good(&r);
    acked.set(300, &block.repeat(40));
    acked.check(images, rig.volume, "WRITE SAME").unwrap();
    let (r, images) = rig.run(&cdb16(0x93, 310, 8, false), &[0u8; BS], next_seed());
    good(&r);
    acked.set(310, &[0u8; 8 * BS]);
    acked
        .check(images, rig.volume, "WRITE SAME of zeros")
        .unwrap();

    // UNMAP of acknowledged data: it must not come back.
    let list = unmap_list(64, 9);
    let (r, images) = rig.run(&unmap_cdb(list.len()), &list, next_seed());
    good(&r);
    acked.set(64, &[0u8; 9 * BS]);
    acked.check(images, rig.volume, "UNMAP").unwrap();

    // COMPARE AND WRITE (ATS) over an acknowledged block.
    let old = acked.get(3, 1);
    let new = pattern(next_seed(), BS);
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&3u64.to_be_bytes());
    caw[13] = 1;
    let (r, images) = rig.run(&caw, &[old, new.clone()].concat(), next_seed());
    good(&r);
    acked.set(3, &new);
    acked
        .check(images, rig.volume, "COMPARE AND WRITE")
        .unwrap();

    // EXTENDED COPY of written blocks to new ones.
    let list = xcopy_list(rig.naa, 16, 128, 1024);
    let (r, images) = rig.run(&xcopy_cdb(list.len()), &list, next_seed());
    good(&r);
    let copied = acked.get(128, 16);
    acked.set(1024, &copied);
    acked.check(images, rig.volume, "EXTENDED COPY").unwrap();

    // POPULATE TOKEN, then WRITE USING TOKEN (Windows ODX).
    let populate = sliver_initiator::cdb::populate_token(7, &[(300, 32)], 0).unwrap();
    good(&rig.run_plain(&populate.cdb, &populate.data_out));
    let info = sliver_initiator::cdb::receive_rod_token_information(7);
    let r = rig.run_plain(&info.cdb, &[]);
    good(&r);
    let token = sliver_initiator::cdb::RodTokenInformation::parse(&r.data_in)
        .unwrap()
        .token
        .expect("a token");
    let write = sliver_initiator::cdb::write_using_token(8, &token, 0, &[(2048, 32)]).unwrap();
    let (r, images) = rig.run(&write.cdb, &write.data_out, next_seed());
    good(&r);
    let copied = acked.get(300, 32);
    acked.set(2048, &copied);
    acked
        .check(images, rig.volume, "WRITE USING TOKEN")
        .unwrap();

    // SYNCHRONIZE CACHE is answered once durable too (nothing left to sync here).
    let (r, images) = rig.run(&cdb16(0x91, 0, 0, false), &[], next_seed());
    good(&r);
    acked
        .check(images, rig.volume, "SYNCHRONIZE CACHE")
        .unwrap();
}

/// The check catches an answer given before the sync: a write-back volume answers a WRITE
/// from the cache, and a crash at that moment that keeps none of the unsynced writes loses it.
#[test]
fn an_answer_before_the_sync_fails_the_check() {
    let rig = rig(true);
    let data = pattern(11, 8 * BS);
    let (r, images) = rig.run(&cdb16(0x8a, 40, 8, false), &data, 12);
    good(&r);
    let mut acked = Acknowledged::default();
    acked.set(40, &data);
    let lost = acked
        .check(images, rig.volume, "write-back WRITE")
        .expect_err("a write-back answer is not durable");
    assert!(lost.contains("block 40"), "{lost}");
}

/// A sync that, once armed, waits until the test opens the gate, and counts every sync.
#[derive(Default)]
struct GatedSync {
    armed: std::sync::atomic::AtomicBool,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    syncs: std::sync::atomic::AtomicUsize,
}

impl engine_lu::Model for GatedSync {
    fn sync(&self, mem: &MemBackend) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.armed.load(SeqCst) {
            self.syncs.fetch_add(1, SeqCst);
            let open = self.open.lock().unwrap();
            drop(self.opened.wait_while(open, |open| !*open).unwrap());
        }
        mem.sync()
    }
}

/// Write-through costs one sync per group of waiting commands, not one per command: the
/// commands that arrive while a sync runs all share the next one, and none holds a thread
/// meanwhile (the 64 writes here are issued from one thread while the first sync is stuck).
#[test]
fn writes_that_arrive_during_a_sync_share_the_next_one() {
    use std::sync::atomic::Ordering::SeqCst;
    let backend = Arc::new(engine_lu::Modelled {
        mem: MemBackend::new(64 * MIB),
        model: GatedSync::default(),
    });
    let engine = engine_lu::create_engine(backend.clone());
    let volume = engine.create_volume(16 * MIB).unwrap();
    engine.flush().unwrap();
    let who = Identity {
        serial: "write-through-2",
        naa: [
            0x60, 0xda, 0x5c, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x02,
        ],
        target_name: "iqn.2026-11.dev.sliver:wt",
    };
    let lu = Arc::new(engine_lu::lu_over(&engine, volume, BS as u32, &who));
    lu.set_write_cache(false).unwrap();
    let nexus = engine_lu::nexus("iqn.test:group-commit");
    let run = |cdb: &[u8], data: &[u8], tx: mpsc::Sender<Status>| {
        lu.execute_deferring(&Request {
            nexus: &nexus,
            cdb,
            data_out: data,
            attr: TaskAttr::Simple,
            luns: &[0],
            copy_targets: &NoCopyTargets,
        })
        .then(move |r| tx.send(r.status).unwrap());
    };
    let (tx, rx) = mpsc::channel();
    run(&[0; 6], &[], tx.clone()); // POWER ON, RESET
    assert_eq!(rx.recv().unwrap(), Status::CheckCondition);
    backend.model.armed.store(true, SeqCst);
    let writes = 64u64;
    for i in 0..writes {
        run(
            &cdb16(0x8a, i * 8, 8, false),
            &pattern(100 + i, BS * 8),
            tx.clone(),
        );
    }
    // Every write was applied and handed over without waiting; none is answered while the
    // first sync is held.
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(200))
            .is_err(),
        "a write-through write was answered before its sync"
    );
    *backend.model.open.lock().unwrap() = true;
    backend.model.opened.notify_all();
    for _ in 0..writes {
        let status = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("every write is answered");
        assert_eq!(status, Status::Good);
    }
    let syncs = backend.model.syncs.load(SeqCst);
    assert_eq!(
        engine.space().log_syncs,
        syncs as u64 + 1,
        "the engine counts its syncs (the one before the gate, and these)"
    );
    assert!(
        (1..=2).contains(&syncs),
        "{writes} writes waiting together took {syncs} syncs"
    );
    assert_eq!(
        backend.mem.pending_writes(),
        0,
        "all answered writes are synced"
    );
}
