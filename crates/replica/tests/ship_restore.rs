//! Shipping and restore with a real engine on real files. The store here is a map in memory
//! standing in for the S3 server so that these run in every `cargo test`; the same scenario
//! runs against a real SeaweedFS in `seaweedfs.rs` (`scripts/object-store-test.sh`).

mod store_in_front;

use sliver_engine::{
    Devices, Engine, EngineConfig, FileBackend, LogDevice, MetaArea, RootStore, Tuning,
};
use sliver_replica::catalog::Point;
use sliver_replica::restore::{Mode, Target};
use sliver_replica::ship::{ShipConfig, ShipState, ShipTap, Shipper};
use sliver_replica::store::{MemStore, ObjectStore, StoreError};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use store_in_front::{Change, Created, InFront};

/// The store as a restore keeps it.
fn dynamic<S: ObjectStore + 'static>(store: &Arc<S>) -> Arc<dyn ObjectStore> {
    Arc::clone(store) as Arc<dyn ObjectStore>
}

/// A whole restore (every byte fetched before it returns).
fn restore(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
    config: Option<&Path>,
    target: &Target,
) -> Result<sliver_replica::restore::RestoreReport, sliver_replica::restore::RestoreError> {
    sliver_replica::restore::restore(store, dir, config, target, &Mode::Whole)
}

pub use sliver_test_support::data::unique as noise;

const CAPACITY: u64 = 64 << 20;
const VOLUME: u64 = 16 << 20;

fn config() -> EngineConfig {
    EngineConfig {
        chunk_size: 4096,
        segment_size: 1 << 20,
    }
}

fn fast() -> ShipConfig {
    ShipConfig {
        cut_interval: Duration::from_millis(50),
        max_backlog: 256 << 20,
        points_every: Duration::ZERO,
        ..ShipConfig::default()
    }
}

/// [`fast`] on a clock that moves only when the test moves it, a scheduled point due hourly.
fn on_manual_clock() -> (Arc<sliver_engine::clock::ManualClock>, ShipConfig) {
    let clock = Arc::new(sliver_engine::clock::ManualClock::new());
    let ship = ShipConfig {
        points_every: Duration::from_secs(3600),
        clock: clock.clone(),
        ..fast()
    };
    (clock, ship)
}

fn start<S: ObjectStore + 'static>(dir: &Path, store: &Arc<S>) -> (Devices, Shipper) {
    start_with(dir, store, fast())
}

fn start_with<S: ObjectStore + 'static>(
    dir: &Path,
    store: &Arc<S>,
    config: ShipConfig,
) -> (Devices, Shipper) {
    let fb = FileBackend::open(dir, CAPACITY).unwrap();
    let (tap, s) = ShipTap::start(dir, fb, store.clone(), config, None).unwrap();
    (Arc::new(tap).devices(), s)
}

/// Wait for `what` (polled), failing after a minute with `show`'s description.
fn wait_for(what: impl Fn() -> bool, show: impl Fn() -> String) {
    let end = Instant::now() + Duration::from_secs(60);
    while !what() {
        assert!(Instant::now() < end, "timed out: {}", show());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn numbers(store: &MemStore, folder: &str) -> Vec<u64> {
    store
        .list(folder)
        .unwrap()
        .iter()
        .map(|n| u64::from_str_radix(n.rsplit('/').next().unwrap(), 16).unwrap())
        .collect()
}

fn drained(shipper: &Shipper) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let s = shipper.status();
        if s.backlog_bytes == 0 && s.state == ShipState::Streaming {
            return;
        }
        assert!(Instant::now() < end, "not drained: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Overwrite `n` random 64 KiB pieces of the volume, keeping `model` in step.
fn overwrite(engine: &Engine, v: u32, model: &mut [u8], seed: u64, n: u64) {
    for i in 0..n {
        let at = (seed.wrapping_mul(31).wrapping_add(i * 7919) % (VOLUME / 65536)) * 65536;
        let data = noise(seed * 1000 + i, 65536);
        engine.write(v, at, &data).unwrap();
        model[at as usize..at as usize + 65536].copy_from_slice(&data);
    }
}

/// The first writes to a new volume: `n` pieces overwritten (as by [`overwrite`]) and
/// flushed. Returns the model of the volume after them.
fn first_writes(engine: &Engine, v: u32, seed: u64, n: u64) -> Vec<u8> {
    let mut model = vec![0u8; VOLUME as usize];
    overwrite(engine, v, &mut model, seed, n);
    engine.flush().unwrap();
    model
}

fn read_back(dir: &Path) -> Vec<u8> {
    let fb = FileBackend::open(dir, CAPACITY).unwrap();
    let engine = Engine::open(Arc::new(fb), Tuning::default(), false).unwrap();
    let (v, size) = engine.volumes()[0];
    assert_eq!(size, VOLUME);
    let mut back = vec![0u8; VOLUME as usize];
    engine.read(v, 0, &mut back).unwrap();
    engine.shutdown().unwrap();
    back
}

/// An array that held data before it shipped: the base is read while hosts overwrite it, the
/// array "crashes" (the engine is abandoned without a shutdown), and the restore reads back
/// every write made before the stream drained.
#[test]
fn a_base_taken_under_writes_and_the_stream_after_it_restore_exactly() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let mut model = vec![0u8; VOLUME as usize];
    {
        let fb = Arc::new(FileBackend::open(a.path(), CAPACITY).unwrap());
        let engine = Engine::create(fb, config(), Tuning::default()).unwrap();
        let v = engine.create_volume(VOLUME).unwrap();
        let first = noise(1, VOLUME as usize);
        engine.write(v, 0, &first).unwrap();
        model.copy_from_slice(&first);
        overwrite(&engine, v, &mut model, 2, 64);
        engine.shutdown().unwrap();
    }
    let (backend, shipper) = start(a.path(), &store);
    assert_eq!(shipper.status().state, ShipState::Base);
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    let v = engine.volumes()[0].0;
    // Hosts write while the base is read.
    for round in 0..6 {
        overwrite(&engine, v, &mut model, 10 + round, 24);
        if round == 3 {
            engine.checkpoint().unwrap();
        }
    }
    engine.flush().unwrap();
    drained(&shipper);
    let shipped = shipper.status();
    assert!(shipped.objects > 2, "{shipped:?}");
    // The crash: nothing more reaches the store, nothing is shut down.
    std::mem::forget(engine);
    std::mem::forget(shipper);

    let b = tempfile::tempdir().unwrap();
    let target = b.path().join("restored");
    let report = restore(&dynamic(&store), &target, None, &Target::Newest).unwrap();
    assert_eq!(report.last, shipped.shipped_through);
    assert_eq!(report.left_out, 0);
    assert!(read_back(&target) == model, "the restored volume differs");
}

/// A clean stop lets the next start continue the stream; an unclean one takes a base; a
/// second array on the same prefix is refused.
#[test]
fn a_clean_stop_continues_the_stream_a_crash_takes_a_base_and_a_stranger_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let mut model = vec![0u8; VOLUME as usize];
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    overwrite(&engine, v, &mut model, 1, 40);
    engine.shutdown().unwrap();
    drop(engine);
    let stopped = shipper.stop(Duration::from_secs(30));
    assert!(stopped.shipped_through > 0);

    // Clean: the stream goes on from the next number, no base.
    let (backend, shipper) = start(a.path(), &store);
    let s = shipper.status();
    assert_eq!(s.state, ShipState::Streaming);
    assert_eq!(s.shipped_through, stopped.shipped_through);
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    overwrite(&engine, v, &mut model, 2, 40);
    engine.flush().unwrap();
    drained(&shipper);
    // Beside the array, in a directory of this test's own (never a shared parent).
    let scratch = tempfile::tempdir().unwrap();
    let restored = scratch.path().join("restore-1");
    let r = restore(&dynamic(&store), &restored, None, &Target::Newest).unwrap();
    assert_eq!(r.first, 1, "one base, at the start");
    assert!(read_back(&restored) == model);
    std::fs::remove_dir_all(&restored).unwrap();
    // Crash: the next start must copy the array again.
    std::mem::forget(engine);
    std::mem::forget(shipper);
    let (backend, shipper) = start(a.path(), &store);
    assert_eq!(shipper.status().state, ShipState::Base);
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    overwrite(&engine, v, &mut model, 3, 10);
    engine.flush().unwrap();
    drained(&shipper);
    let r = restore(&dynamic(&store), &restored, None, &Target::Newest).unwrap();
    assert!(r.first > 1, "the restore starts at the new base: {r:?}");
    assert!(read_back(&restored) == model);
    std::fs::remove_dir_all(&restored).unwrap();
    stop_cleanly(engine, shipper);

    // Another array on the same prefix.
    let other = tempfile::tempdir().unwrap();
    let fb = FileBackend::open(other.path(), CAPACITY).unwrap();
    let refused = ShipTap::start(other.path(), fb, store.clone(), fast(), None)
        .err()
        .expect("a second array on the prefix");
    assert!(
        refused
            .to_string()
            .contains("already holds the copy of array"),
        "{refused}"
    );
}

/// A backend's writes reach the batch only once they completed, and a restore into a directory
/// that holds an array is refused.
#[test]
fn a_restore_never_overwrites_an_array() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let (backend, shipper) = start(a.path(), &store);
    let engine = Engine::create(backend.clone(), config(), Tuning::default()).unwrap();
    engine.create_volume(VOLUME).unwrap();
    stop_cleanly(engine, shipper);
    let err = restore(&dynamic(&store), a.path(), None, &Target::Newest).unwrap_err();
    assert!(err.to_string().contains("already holds an array"), "{err}");
    assert!(backend.log.capacity() >= CAPACITY);
}

/// The rule that makes a base taken under writes exact: a base's bytes never cover a write
/// made since the base started, whatever their order in the stream (the base read the range
/// before the write, or while it was under way, and recorded it after). A newer base that
/// never completed is left out with everything after it.
#[test]
fn base_bytes_go_only_where_no_write_since_the_base_start_went() {
    base_rule(true);
}

/// The same, from objects in the interleaved layout (shipped before objects had a table).
#[test]
fn interleaved_objects_restore_by_the_same_rule() {
    base_rule(false);
}

fn base_rule(indexed: bool) {
    use sliver_replica::object::{encode, encode_indexed, Kind, ObjectName};
    use sliver_replica::stream::Record;
    let store = Arc::new(MemStore::default());
    let pool = [7u8; 16];
    let put = |n: u64, records: &[Record]| {
        let mut body = Vec::new();
        for r in records {
            r.encode(&mut body);
        }
        let name = ObjectName::new(Kind::Stream, n).to_string();
        let object = if indexed {
            let (body, table) = sliver_replica::stream::index(&body).unwrap();
            encode_indexed(Kind::Stream, pool, 0, n, &body, table)
        } else {
            encode(Kind::Stream, pool, 0, n, &body)
        };
        assert!(store.put_if_absent(&name, object).unwrap());
    };
    let new = [b'n'; 8192];
    let old = [b'o'; 16384];
    put(
        1,
        &[
            Record::BaseStart {
                capacity: 1 << 20,
                continues: false,
            },
            Record::Log {
                offset: 4096,
                bytes: &new,
                base: false,
            },
            Record::Root {
                bytes: b"new root",
                base: false,
            },
            Record::Config {
                bytes: b"config 2",
                base: false,
            },
        ],
    );
    put(
        2,
        &[
            Record::Log {
                offset: 0,
                bytes: &old,
                base: true,
            },
            Record::Root {
                bytes: b"old root",
                base: true,
            },
            Record::Config {
                bytes: b"config 1",
                base: true,
            },
            Record::BaseEnd,
            Record::Discard {
                offset: 65536,
                len: 4096,
            },
        ],
    );
    // A base that never completed, and a write after it that must not be applied.
    put(
        3,
        &[
            Record::BaseStart {
                capacity: 1 << 20,
                continues: false,
            },
            Record::Log {
                offset: 0,
                bytes: &[b'x'; 4096],
                base: false,
            },
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("r");
    let report = restore(
        &dynamic(&store),
        &target,
        Some(&dir.path().join("array.json")),
        &Target::Newest,
    )
    .unwrap();
    assert_eq!((report.first, report.last, report.left_out), (1, 2, 1));
    let fb = FileBackend::open(&target, 1 << 20).unwrap();
    let mut back = vec![0u8; 16384];
    fb.read_at(&mut back, 0).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == b'o'),
        "base bytes before the write"
    );
    assert!(
        back[4096..12288].iter().all(|&b| b == b'n'),
        "the write kept"
    );
    assert!(
        back[12288..].iter().all(|&b| b == b'o'),
        "base bytes after it"
    );
    assert_eq!(fb.load_root().unwrap().as_deref(), Some(&b"new root"[..]));
    assert!(report.config);
    assert_eq!(
        std::fs::read(dir.path().join("array.json")).unwrap(),
        b"config 2"
    );
}

/// Named points restore exactly the state they were taken in; a scheduled base lets retention
/// delete the older objects once no point needs them, and nothing a point or the newest state
/// needs; a restore to a deleted point is refused with a clear message.
#[test]
fn points_restore_their_state_and_retention_deletes_only_what_nothing_needs() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let ship = ShipConfig {
        keep_points: 0,
        rebase_ratio: 1.0,
        rebase_min_bytes: 4 << 20,
        ..fast()
    };
    let (engine, v, shipper) = shipping_array_with(a.path(), &store, ship);
    let mut model = first_writes(&engine, v, 1, 64);
    let take = |name: &str| {
        point_within(&shipper, name, Duration::from_secs(60))
            .unwrap()
            .unwrap()
    };
    let one = take("one");
    let model_one = model.clone();
    assert_eq!(one.base, 1, "built on the first base");
    assert!(shipper.take_point("one").unwrap_err().contains("exists"));
    assert!(shipper.take_point("auto-x").is_err());
    // Enough writes for a scheduled base (the stream since the first base passes 4 MiB and
    // the base's own bytes).
    for round in 0..8 {
        overwrite(&engine, v, &mut model, 10 + round, 64);
        engine.flush().unwrap();
    }
    wait_for(
        || numbers(&store, "bases").len() >= 2,
        || format!("{:?}", shipper.status()),
    );
    overwrite(&engine, v, &mut model, 30, 16);
    engine.flush().unwrap();
    let two = take("two");
    let model_two = model.clone();
    assert!(two.base > 1, "built on the scheduled base: {two:?}");
    overwrite(&engine, v, &mut model, 40, 16);
    engine.flush().unwrap();
    drained(&shipper);

    // Both points restore their own state, the newest state its own.
    let r = tempfile::tempdir().unwrap();
    let at = |name: &str| r.path().join(name);
    let restore_at =
        |name: &str, target: Target| restore(&dynamic(&store), &at(name), None, &target);
    let rep = restore_at("one", Target::Point("one".into())).unwrap();
    assert_eq!(rep.point.as_ref().map(|p| p.name.as_str()), Some("one"));
    assert!(read_back(&at("one")) == model_one, "point one differs");
    let t = two.time_ms;
    restore_at("two", Target::At(t)).unwrap();
    assert!(read_back(&at("two")) == model_two, "point two differs");
    restore_at("newest", Target::Newest).unwrap();
    assert!(
        read_back(&at("newest")) == model,
        "the newest state differs"
    );
    let before = numbers(&store, "stream");
    assert_eq!(
        before.iter().min(),
        Some(&1),
        "point one keeps the first base"
    );

    // Point one goes: everything before the base point two builds on goes with it, and
    // nothing else (point two and the newest state need the rest).
    assert!(shipper.delete_point("one").unwrap().is_some());
    wait_for(
        || {
            numbers(&store, "stream").iter().min() == Some(&two.base)
                && numbers(&store, "bases").len() <= 2
        },
        || format!("{:?} {:?}", numbers(&store, "stream"), shipper.status()),
    );
    // What is left: point two's objects and everything from the newest base on (another
    // scheduled base may have completed meanwhile, and the objects between point two and it
    // then go too). The shipper may create another object meanwhile: the listing is checked
    // up to its own newest object, which is at least what was shipped.
    let through = shipper.status().shipped_through;
    let cat = sliver_replica::catalog::load(store.as_ref()).unwrap();
    let newest_base = sliver_replica::catalog::newest_base(&cat.bases)
        .unwrap()
        .start;
    let listed = numbers(&store, "stream");
    let newest = *listed.last().unwrap();
    assert!(newest >= through, "{listed:?} {through}");
    let needed: Vec<u64> = (two.base..=newest)
        .filter(|&n| two.needs().contains(&n) || n >= newest_base)
        .collect();
    assert_eq!(
        listed, needed,
        "newest base {newest_base}, point two {two:?}"
    );
    let bases = numbers(&store, "bases");
    assert_eq!(bases.iter().min(), Some(&two.base), "{bases:?}");
    assert!(
        bases.len() <= 2,
        "only point two's base and the newest: {bases:?}"
    );
    let err = restore_at("one-again", Target::Point("one".into())).unwrap_err();
    assert!(err.to_string().contains("no restore point named"), "{err}");
    let err = restore_at("early", Target::At(one.time_ms)).unwrap_err();
    assert!(err.to_string().contains("at or before"), "{err}");
    restore_at("two-again", Target::Point("two".into())).unwrap();
    assert!(read_back(&at("two-again")) == model_two);
    restore_at("newest-again", Target::Newest).unwrap();
    assert!(read_back(&at("newest-again")) == model);
    stop_cleanly(engine, shipper);
}

/// Scheduled points are taken while writes reach the store and none while nothing new does;
/// retention keeps the newest `keep_points` of them, and each one kept restores. Time is the
/// shipper's manual clock: a point is due exactly when the test says so.
#[test]
fn scheduled_points_are_kept_to_their_count_and_each_restores() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let (clock, ship) = on_manual_clock();
    let ship = ShipConfig {
        keep_points: 2,
        ..ship
    };
    let (engine, v, shipper) = shipping_array_with(a.path(), &store, ship);
    let mut model = vec![0u8; VOLUME as usize];
    for round in 0..5 {
        overwrite(&engine, v, &mut model, 100 + round, 8);
        engine.flush().unwrap();
        // The batch is due, and ships; then the point is due, and covers it.
        clock.advance(Duration::from_secs(1));
        drained(&shipper);
        let through = shipper.status().shipped_through;
        clock.advance(Duration::from_secs(3600));
        wait_for(
            || {
                shipper
                    .status()
                    .newest_point
                    .is_some_and(|p| p.through >= through)
            },
            || format!("{:?}", shipper.status()),
        );
    }
    let taken = shipper.status().newest_point.unwrap();
    assert!(taken.number >= 5 && taken.scheduled, "{taken:?}");
    wait_for(
        || numbers(&store, "points").len() == 2,
        || format!("{:?}", numbers(&store, "points")),
    );
    // Idle: hours pass and nothing new reaches the store, so no point is taken.
    clock.advance(Duration::from_secs(3 * 3600));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(shipper.status().newest_point.unwrap().number, taken.number);
    let kept = shipper.points();
    assert_eq!(kept.len(), 2);
    let r = tempfile::tempdir().unwrap();
    for p in &kept {
        let at = r.path().join(&p.name);
        restore(&dynamic(&store), &at, None, &Target::Point(p.name.clone())).unwrap();
        assert_eq!(read_back(&at).len(), VOLUME as usize);
    }
    // The newest point was taken after the last writes reached the store: it is the model.
    let newest = kept.iter().max_by_key(|p| p.number).unwrap();
    assert!(read_back(&r.path().join(&newest.name)) == model);
    stop_cleanly(engine, shipper);
}

/// The shipper keeps time by its clock, not by the system's: with a clock that stands still
/// a batch is not due however long the test waits, and its lag stays zero; moved past the cut
/// interval, the batch ships, and moved past `points_every`, a scheduled point is taken at the
/// clock's calendar time, without an hour's wait.
#[test]
fn the_shipper_keeps_time_by_its_clock() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let (clock, ship) = on_manual_clock();
    let started_ms = {
        use sliver_engine::clock::Clock;
        clock.wall_ms()
    };
    let (engine, v, shipper) = shipping_array_with(a.path(), &store, ship);
    // Whatever the start left in the batch goes now.
    clock.advance(Duration::from_secs(1));
    drained(&shipper);
    let mut model = vec![0u8; VOLUME as usize];
    overwrite(&engine, v, &mut model, 31, 4);
    // Six times the cut interval in real time: the system's clock would have cut the batch.
    std::thread::sleep(Duration::from_millis(300));
    let waiting = shipper.status();
    assert!(waiting.backlog_bytes > 0, "{waiting:?}");
    assert_eq!(waiting.lag, Some(Duration::ZERO), "{waiting:?}");
    clock.advance(Duration::from_secs(1));
    drained(&shipper);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(shipper.status().newest_point, None);
    clock.advance(Duration::from_secs(3600));
    wait_for(
        || shipper.status().newest_point.is_some(),
        || format!("{:?}", shipper.status()),
    );
    let point = shipper.status().newest_point.unwrap();
    assert!(point.scheduled, "{point:?}");
    assert!(
        point.time_ms >= started_ms + 3_602_000,
        "{point:?} (started at {started_ms})"
    );
    stop_cleanly(engine, shipper);
}

/// A store that can be taken down: every call fails while it is down.
type Switchable = InFront<Down, Arc<MemStore>>;

/// Whether the store behind is down.
struct Down(AtomicBool);

impl Switchable {
    fn new(down: bool) -> Arc<Switchable> {
        Arc::new(InFront {
            change: Down(AtomicBool::new(down)),
            inner: Arc::new(MemStore::default()),
        })
    }

    fn set_down(&self, down: bool) {
        self.change.0.store(down, SeqCst);
    }
}

impl Change for Down {
    fn before(&self) -> Result<(), StoreError> {
        if self.0.load(SeqCst) {
            return Err(StoreError::Failed {
                store: "switchable".into(),
                op: "any",
                name: String::new(),
                reason: "connection refused".into(),
            });
        }
        Ok(())
    }
    fn describe(&self, _store: &dyn ObjectStore) -> String {
        "switchable".into()
    }
}

/// A store that is down when the array starts does not stop the array: the shipper waits,
/// says why, and once the store answers copies the array whole (the writes made meanwhile
/// included), so the restore equals every write.
#[test]
fn a_store_down_at_start_is_waited_for_and_the_copy_then_holds_every_write() {
    let a = tempfile::tempdir().unwrap();
    let store = Switchable::new(true);
    let fb = FileBackend::open(a.path(), CAPACITY).unwrap();
    let (backend, shipper) =
        ShipTap::start_or_wait(a.path(), fb, store.clone(), fast(), None).unwrap();
    let s = shipper.status();
    match &s.state {
        ShipState::Waiting(why) => assert!(why.contains("connection refused"), "{why}"),
        other => panic!("not waiting: {other:?}"),
    }
    let engine = Engine::create(Arc::new(backend).devices(), config(), Tuning::default()).unwrap();
    let v = engine.create_volume(VOLUME).unwrap();
    let mut model = first_writes(&engine, v, 7, 32);
    assert!(matches!(shipper.status().state, ShipState::Waiting(_)));
    assert_eq!(
        shipper.status().backlog_bytes,
        0,
        "nothing recorded while waiting"
    );
    store.set_down(false);
    overwrite(&engine, v, &mut model, 8, 32);
    engine.flush().unwrap();
    wait_for(
        || shipper.status().state == ShipState::Streaming,
        || format!("{:?}", shipper.status()),
    );
    overwrite(&engine, v, &mut model, 9, 8);
    engine.flush().unwrap();
    crash_and_restore(engine, shipper, &store.inner, &model);
}

/// The bucket is emptied while the store is failing: once it answers again the shipper finds
/// the objects it held gone, forgets them and copies the array whole again, so the restore
/// still equals every write.
#[test]
fn a_bucket_emptied_while_the_store_failed_is_copied_again() {
    let a = tempfile::tempdir().unwrap();
    let store = Switchable::new(false);
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    let mut model = first_writes(&engine, v, 11, 32);
    drained(&shipper);
    let before = shipper.status();
    // Down, emptied, back.
    store.set_down(true);
    overwrite(&engine, v, &mut model, 12, 16);
    engine.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    store.inner.0.lock().unwrap().clear();
    store.set_down(false);
    wait_for(
        || shipper.status().resyncs > before.resyncs,
        || format!("{:?}", shipper.status()),
    );
    let s = shipper.status();
    assert!(
        s.last_restart.as_deref().unwrap_or("").contains("emptied"),
        "{s:?}"
    );
    overwrite(&engine, v, &mut model, 13, 8);
    engine.flush().unwrap();
    crash_and_restore(engine, shipper, &store.inner, &model);
}

/// The array shut down cleanly, then its shipper.
fn stop_cleanly(engine: Engine, shipper: Shipper) {
    engine.shutdown().unwrap();
    drop(engine);
    shipper.stop(Duration::from_secs(30));
}

/// The restore point `name` taken by `shipper`, waited for at most `wait`.
fn point_within(
    shipper: &Shipper,
    name: &str,
    wait: Duration,
) -> Result<Result<Point, String>, mpsc::RecvTimeoutError> {
    shipper.take_point(name).unwrap().recv_timeout(wait)
}

/// Once the copy holds every write: the array "crashes" (nothing shut down) and the newest
/// state restored from `store` equals `model`.
fn crash_and_restore(engine: Engine, shipper: Shipper, store: &Arc<MemStore>, model: &[u8]) {
    drained(&shipper);
    std::mem::forget(engine);
    std::mem::forget(shipper);
    let r = tempfile::tempdir().unwrap();
    let target = r.path().join("restored");
    restore(&dynamic(store), &target, None, &Target::Newest).unwrap();
    assert!(read_back(&target) == model, "the restore differs");
}

/// A restore from a store that lost an object, holds a damaged one, or fails (objects fetched
/// ahead on threads of their own) says so: the point that needs the lost object is refused,
/// the newest state stops before it and reports it, a damaged object is named, a failing store
/// ends the restore with its error rather than a hang.
#[test]
fn a_restore_from_a_failing_store_ends_with_its_error() {
    let a = tempfile::tempdir().unwrap();
    let store = Switchable::new(false);
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    first_writes(&engine, v, 21, 64);
    let point = point_within(&shipper, "p", Duration::from_secs(60))
        .unwrap()
        .unwrap();
    drained(&shipper);
    stop_cleanly(engine, shipper);
    assert!(point.base == 1 && point.through > 3, "{point:?}");
    // An object after the base goes missing: the point that needs it is refused; the newest
    // state is the state before the gap, with the gap and what it left out reported.
    // (The base was read before the engine was created: the array's first root comes later.)
    let first_root = (1..point.through)
        .find(|&n| {
            let bytes = store.inner.get(&format!("stream/{n:016x}")).unwrap();
            let h = sliver_replica::object::decode_header("", &bytes).unwrap();
            let found = sliver_replica::stream::records(&bytes[64..], h.table_len).any(|r| {
                matches!(
                    r,
                    Ok(sliver_replica::stream::Record::Root { base: false, .. })
                )
            });
            found
        })
        .unwrap();
    let gap = first_root + 1;
    assert!(gap < point.through, "{point:?}, first root in {first_root}");
    let gone = format!("stream/{gap:016x}");
    assert!(store.inner.0.lock().unwrap().remove(&gone).is_some());
    let r = tempfile::tempdir().unwrap();
    let err = restore(
        &dynamic(&store),
        &r.path().join("x"),
        None,
        &Target::Point("p".into()),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("missing stream object {gap}")),
        "{err}"
    );
    let rep = restore(&dynamic(&store), &r.path().join("y"), None, &Target::Newest).unwrap();
    assert_eq!((rep.last, rep.missing), (gap - 1, Some(gap)), "{rep:?}");
    assert!(rep.left_out >= point.through - gap, "{rep:?}");
    // Without the object holding the array's first root, nothing before the gap is an
    // array: the restore says so instead of leaving a directory that cannot open.
    let holder = format!("stream/{first_root:016x}");
    let kept = store.inner.0.lock().unwrap().remove(&holder).unwrap();
    let err = restore(&dynamic(&store), &r.path().join("v"), None, &Target::Newest).unwrap_err();
    assert!(
        err.to_string().contains("no root in stream objects 1.."),
        "{err}"
    );
    store.inner.0.lock().unwrap().insert(holder, kept);
    // A damaged object: refused by its checksum, named in the error. The first byte after the
    // 64-byte header is the one every restore reads: the start of the object's table (which
    // has its own checksum), or of a body without a table (checked whole). A byte further on
    // may lie in a payload the newest state no longer needs, which a restore never fetches
    // (its last byte did, in some of the shipper's batchings, and the restore rightly
    // succeeded).
    let damaged = "stream/0000000000000002";
    {
        let mut objects = store.inner.0.lock().unwrap();
        let object = objects.get_mut(damaged).unwrap();
        assert!(object.len() > 64, "{} bytes", object.len());
        object[64] ^= 1;
    }
    let err = restore(&dynamic(&store), &r.path().join("w"), None, &Target::Newest).unwrap_err();
    assert!(err.to_string().contains(damaged), "{err}");
    // The store down altogether: its error.
    store.set_down(true);
    let err = restore(&dynamic(&store), &r.path().join("z"), None, &Target::Newest).unwrap_err();
    assert!(err.to_string().contains("connection refused"), "{err}");
}

/// A new array in `dir` shipping to `store`, with one volume.
fn shipping_array<S: ObjectStore + 'static>(dir: &Path, store: &Arc<S>) -> (Engine, u32, Shipper) {
    shipping_array_with(dir, store, fast())
}

/// The same, shipping as `ship` says.
fn shipping_array_with<S: ObjectStore + 'static>(
    dir: &Path,
    store: &Arc<S>,
    ship: ShipConfig,
) -> (Engine, u32, Shipper) {
    let (backend, shipper) = start_with(dir, store, ship);
    let engine = Engine::create(backend, config(), Tuning::default()).unwrap();
    let v = engine.create_volume(VOLUME).unwrap();
    (engine, v, shipper)
}

/// The torture model for restore points: writers keep overwriting versioned blocks while
/// points are taken (the engine flushed first, as the array does for a named point). Restored,
/// each point holds for every block a version written to it, whole, and never older than the
/// newest one acknowledged before the point was asked for; the newest state holds the last.
#[test]
fn every_write_acknowledged_before_a_point_is_in_it() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const BLOCKS: u64 = 512;
    const WRITERS: u64 = 2;
    let block = |b: u64, version: u64| {
        let mut data = noise(b * 1_000_003 + version, 4096);
        data[..8].copy_from_slice(&b.to_le_bytes());
        data[8..16].copy_from_slice(&version.to_le_bytes());
        data
    };
    let a = tempfile::tempdir().unwrap();
    let store = Switchable::new(false);
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    let acked: Vec<AtomicU64> = (0..BLOCKS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let mut points = Vec::new();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (engine, acked, stop) = (&engine, &acked, &stop);
            s.spawn(move || {
                let mut x = w + 1;
                while !stop.load(Ordering::Acquire) {
                    // Each writer owns the blocks b with b % WRITERS == w: versions of a block
                    // are written in order.
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let b = (x >> 33) % (BLOCKS / WRITERS) * WRITERS + w;
                    let version = acked[b as usize].load(Ordering::Acquire) + 1;
                    engine.write(v, b * 4096, &block(b, version)).unwrap();
                    acked[b as usize].store(version, Ordering::Release);
                }
            });
        }
        for i in 0..3 {
            std::thread::sleep(Duration::from_millis(150));
            let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
            engine.flush().unwrap();
            let p = shipper
                .take_point(&format!("p{i}"))
                .unwrap()
                .recv_timeout(Duration::from_secs(60))
                .unwrap()
                .unwrap();
            points.push((p, before));
        }
        std::thread::sleep(Duration::from_millis(150));
        stop.store(true, Ordering::Release);
    });
    engine.flush().unwrap();
    let last: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
    drained(&shipper);
    std::mem::forget(engine);
    std::mem::forget(shipper);
    let r = tempfile::tempdir().unwrap();
    let check = |target: &Path, floor: &[u64], exact: bool| {
        let back = read_back(target);
        for b in 0..BLOCKS {
            let got = &back[(b * 4096) as usize..((b + 1) * 4096) as usize];
            let version = u64::from_le_bytes(got[8..16].try_into().unwrap());
            if floor[b as usize] == 0 && version == 0 {
                assert!(
                    got.iter().all(|&x| x == 0),
                    "block {b}: neither written nor zero"
                );
                continue;
            }
            assert!(
                got == block(b, version).as_slice(),
                "block {b}: not version {version} whole"
            );
            assert!(
                version >= floor[b as usize],
                "block {b}: version {version}, acknowledged {} before the point",
                floor[b as usize]
            );
            if exact {
                assert_eq!(version, floor[b as usize], "block {b}");
            }
        }
    };
    for (p, before) in &points {
        let target = r.path().join(&p.name);
        restore(
            &dynamic(&store.inner),
            &target,
            None,
            &Target::Point(p.name.clone()),
        )
        .unwrap();
        check(&target, before, false);
    }
    let target = r.path().join("newest");
    restore(&dynamic(&store.inner), &target, None, &Target::Newest).unwrap();
    check(&target, &last, true);
    assert!(
        last.iter().sum::<u64>() > BLOCKS,
        "the writers barely wrote: {}",
        last.iter().sum::<u64>()
    );
}

/// A store slow to create restore points (800 ms each).
struct SlowPoints;

impl Change for SlowPoints {
    fn put_if_absent(&self, store: &dyn ObjectStore, name: &str, bytes: Vec<u8>) -> Created {
        if name.starts_with("points/") {
            std::thread::sleep(Duration::from_millis(800));
        }
        store.put_if_absent(name, bytes)
    }
    fn describe(&self, _store: &dyn ObjectStore) -> String {
        "slow points".into()
    }
}

/// A point asked for while the shipper is still creating the previous one (the object it
/// rode on already in the store) is taken too, not dropped with that object's marks.
#[test]
fn a_point_asked_for_while_another_is_being_created_is_not_lost() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(InFront {
        change: SlowPoints,
        inner: Switchable::new(false),
    });
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    let mut model = first_writes(&engine, v, 1, 8);
    let answer =
        |rx: std::sync::mpsc::Receiver<Result<_, String>>| rx.recv_timeout(Duration::from_secs(30));
    assert!(matches!(
        answer(shipper.take_point("a").unwrap()),
        Ok(Ok(_))
    ));
    drained(&shipper);
    overwrite(&engine, v, &mut model, 2, 8);
    engine.flush().unwrap();
    let b = shipper.take_point("b").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let c = shipper.take_point("c").unwrap();
    assert!(matches!(answer(b), Ok(Ok(_))));
    let c = answer(c);
    assert!(matches!(c, Ok(Ok(_))), "point c lost: {c:?}");
    let names: Vec<String> = shipper.points().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["a", "b", "c"]);
    stop_cleanly(engine, shipper);
}

/// A damaged point object in the store (or one a newer release wrote) is reported, never used,
/// and its number is not taken again: the next point is numbered above it instead of looking
/// like another writer's object (which would fence the copy).
#[test]
fn a_damaged_point_neither_fences_the_copy_nor_loses_its_number() {
    let a = tempfile::tempdir().unwrap();
    let store = Switchable::new(false);
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    let mut model = first_writes(&engine, v, 1, 8);
    let first = point_within(&shipper, "first", Duration::from_secs(30));
    assert!(matches!(first, Ok(Ok(_))));
    stop_cleanly(engine, shipper);
    store
        .inner
        .put("points/0000000000000002", b"not a point".to_vec())
        .unwrap();
    let (backend, shipper) = start(a.path(), &store);
    let engine = Engine::open(backend, Tuning::default(), false).unwrap();
    overwrite(&engine, v, &mut model, 2, 8);
    engine.flush().unwrap();
    let next = point_within(&shipper, "next", Duration::from_secs(30));
    let Ok(Ok(next)) = next else {
        panic!("no point: {next:?} {:?}", shipper.status())
    };
    assert_eq!(next.number, 3);
    assert_eq!(shipper.status().state, ShipState::Streaming);
    stop_cleanly(engine, shipper);
}

/// The copy holds every write; then the array "crashes" (nothing shut down).
fn crash_when_drained(engine: Engine, shipper: Shipper) {
    drained(&shipper);
    std::mem::forget(engine);
    std::mem::forget(shipper);
}

/// Restore the newest state of `store` into `dir` on demand.
fn restore_on_demand(store: &Arc<MemStore>, dir: &Path) -> sliver_replica::restore::RestoreReport {
    let mode = Mode::OnDemand {
        url: "s3://bucket/prefix".into(),
        endpoint: None,
    };
    sliver_replica::restore::restore(&dynamic(store), dir, None, &Target::Newest, &mode).unwrap()
}

/// The backend a server opens over an array restored on demand.
fn hydrating(dir: &Path, store: &Arc<MemStore>) -> Arc<sliver_replica::hydrate::HydratingBackend> {
    let b = sliver_replica::hydrate::HydratingBackend::open(
        dir,
        FileBackend::open(dir, 0).unwrap(),
        dynamic(store),
        sliver_replica::hydrate::HydrateConfig::default(),
    )
    .unwrap();
    Arc::new(b)
}

/// A restore on demand (RFC 0003, "Hydration on demand"): the array opens over the store's
/// tables with its data still in the store; reads fetch what they touch, writes replace it;
/// a crash keeps what the journal says left the map (and never fetches over a synced write);
/// the background fetches finish, the hydration state goes, and the array is an ordinary one.
#[test]
fn an_array_restored_on_demand_serves_before_its_data_is_local() {
    use sliver_replica::hydrate;
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    let mut model = noise(41, VOLUME as usize);
    engine.write(v, 0, &model).unwrap();
    // A checkpoint, as the engine takes on its timer: the restored array's recovery then
    // replays only the writes after it, and opens without reading the data.
    engine.checkpoint().unwrap();
    overwrite(&engine, v, &mut model, 42, 8);
    engine.flush().unwrap();
    crash_when_drained(engine, shipper);

    let r = tempfile::tempdir().unwrap();
    let dir = r.path().join("restored");
    let report = restore_on_demand(&store, &dir);
    // The data stayed in the store: the restore read tables and small records only.
    assert!(report.bytes_on_demand >= VOLUME / 2, "{report:?}");
    let source = hydrate::pending(&dir).unwrap().expect("hydration state");
    assert_eq!(source.url, "s3://bucket/prefix");
    // The objects still fetched are pinned against the source's retention until done.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (pins, _) = sliver_replica::catalog::load_pins(store.as_ref(), now).unwrap();
    assert_eq!(pins.len(), 1, "{pins:?}");
    assert_eq!(pins[0].needs(), report.first..report.last + 1);
    assert_eq!(source.pin.map(|p| p.number), Some(pins[0].number));
    assert!(report.pin_error.is_none());
    let backend = hydrating(&dir, &store);
    let handle = backend.handle();
    let engine = Engine::open(backend.devices(), Tuning::default(), false).unwrap();
    let before = handle.status();
    assert!(before.bytes_left > 0 && !before.done, "{before:?}");
    // A read of a range not yet fetched: the bytes come from the store.
    let mut got = vec![0u8; 1 << 20];
    engine.read(v, 3 << 20, &mut got).unwrap();
    assert!(got == model[3 << 20..4 << 20]);
    let after = handle.status();
    assert!(after.on_demand_fetches > 0, "{after:?}");
    assert!(after.bytes_left < before.bytes_left, "{after:?}");
    // Writes over data still in the store: theirs win, now and after a crash.
    overwrite(&engine, v, &mut model, 43, 24);
    engine.flush().unwrap();
    std::mem::forget(engine);
    drop(backend);
    let backend = hydrating(&dir, &store);
    let handle = backend.handle();
    let engine = Engine::open(backend.devices(), Tuning::default(), false).unwrap();
    let mut back = vec![0u8; VOLUME as usize];
    engine.read(v, 0, &mut back).unwrap();
    assert!(back == model, "a read after the crash differs");
    // The rest in the background, then the state is gone.
    overwrite(&engine, v, &mut model, 44, 8);
    let hydrator = backend.start();
    wait_for(|| handle.status().done, || format!("{:?}", handle.status()));
    hydrator.stop();
    assert!(hydrate::pending(&dir).unwrap().is_none());
    let (pins, _) = sliver_replica::catalog::load_pins(store.as_ref(), now).unwrap();
    assert!(pins.is_empty(), "the pin outlived the hydration: {pins:?}");
    engine.shutdown().unwrap();
    drop(engine);
    drop(backend);
    assert!(read_back(&dir) == model, "the hydrated array differs");
}

/// A piece whose bytes do not match its table is refused by name, never served.
#[test]
fn a_damaged_piece_is_an_error_naming_its_object() {
    let a = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::default());
    let (engine, v, shipper) = shipping_array(a.path(), &store);
    engine.write(v, 0, &noise(51, VOLUME as usize)).unwrap();
    engine.flush().unwrap();
    crash_when_drained(engine, shipper);
    let r = tempfile::tempdir().unwrap();
    let dir = r.path().join("restored");
    restore_on_demand(&store, &dir);
    // Flip a byte near the end of every stream object: payloads, not tables.
    for (name, bytes) in store.0.lock().unwrap().iter_mut() {
        if name.starts_with("stream/") {
            let at = bytes.len() - 100;
            bytes[at] ^= 0x40;
        }
    }
    let err = hydrating(&dir, &store)
        .hydrate_all(2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stream/") && err.contains("damaged"), "{err}");
}

/// The hydrating backend against a model (RFC 0003's test plan): reads, writes, discards,
/// background fetches, syncs and crashes in any interleaving. Every read returns the newest
/// write, or the store's bytes where nothing wrote since the restore; a crash may lose only
/// writes made since the last sync (as any crash) and never puts the store's bytes over a
/// synced write; once everything is fetched the state is gone and the files hold the model.
mod hydration_model {
    use super::*;
    use proptest::prelude::*;
    use sliver_replica::hydrate::{self, Area, HydrateConfig, HydratingBackend, Maps, Piece};
    use sliver_replica::object::{encode_indexed, Kind, ObjectName};
    use sliver_replica::stream::{self, Record};

    const LOG: usize = 1 << 20;
    const META: usize = 256 << 10;

    #[derive(Debug, Clone)]
    enum Op {
        Write(bool, u32, u32, u8),
        Read(bool, u32, u32),
        Discard(u32, u32),
        Step,
        Sync,
        Crash,
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = |size: usize| {
            (0..size as u32 - 1)
                .prop_flat_map(move |o| (Just(o), 1..(size as u32 - o).min(200_000)))
        };
        prop_oneof![
            3 => (any::<bool>(), range(META), any::<u8>()).prop_map(|(log, (o, l), f)| Op::Write(log, o, l, f)),
            4 => (any::<bool>(), range(META)).prop_map(|(log, (o, l))| Op::Read(log, o, l)),
            1 => range(LOG).prop_map(|(o, l)| Op::Discard(o, l)),
            3 => Just(Op::Step),
            1 => Just(Op::Sync),
            1 => Just(Op::Crash),
        ]
    }

    /// Bytes of one area as the model knows them: `None` where anything may be read (a
    /// discarded range, or a write a crash may have lost).
    struct Model {
        bytes: [Vec<Option<u8>>; 2],
        /// Writes since the last sync, per area.
        unsynced: [Vec<(usize, usize)>; 2],
    }

    /// The two areas hydration serves.
    trait Areas: LogDevice + MetaArea {}
    impl<T: LogDevice + MetaArea> Areas for T {}

    /// The log and metadata as a server opens them: hydrating while the state is there, else
    /// the files.
    fn open(dir: &Path, store: &Arc<MemStore>) -> (Arc<dyn Areas>, Option<Arc<HydratingBackend>>) {
        let fb = FileBackend::open(dir, LOG as u64).unwrap();
        if hydrate::pending(dir).unwrap().is_none() {
            return (Arc::new(fb), None);
        }
        let h = Arc::new(
            HydratingBackend::open(dir, fb, dynamic(store), HydrateConfig::default()).unwrap(),
        );
        (h.clone(), Some(h))
    }

    /// Object 1 holds pieces for both areas (later pieces over earlier ones); the map and the
    /// model follow them.
    fn restored(dir: &Path, store: &Arc<MemStore>, seed: u64) -> Model {
        let mut interleaved = Vec::new();
        let mut placed = Vec::new();
        let mut next_log = 0usize;
        for i in 0..40u64 {
            let meta = i % 4 == 0;
            let size = if meta { META } else { LOG };
            let len = 4096 + (seed.wrapping_mul(i + 7) % 60_000) as usize;
            let mut off =
                (seed.wrapping_mul(31).wrapping_add(i * 7919 * 13) as usize) % (size - len);
            // Some log records continue the one before them in the file as in the body (a
            // large write cut in pieces): the map joins them into one range.
            if !meta && i % 4 == 2 && next_log + len <= LOG {
                off = next_log;
            }
            if !meta {
                next_log = off + len;
            }
            let data = noise(seed * 100 + i, len);
            let r = if meta {
                Record::Meta {
                    offset: off as u64,
                    bytes: &data,
                    base: false,
                }
            } else {
                Record::Log {
                    offset: off as u64,
                    bytes: &data,
                    base: false,
                }
            };
            r.encode(&mut interleaved);
            placed.push((meta, off, data));
        }
        let (body, table_len) = stream::index(&interleaved).unwrap();
        let entries = stream::table(&body[..table_len as usize], body.len() as u64).unwrap();
        let name = ObjectName::new(Kind::Stream, 1).to_string();
        store
            .put(
                &name,
                encode_indexed(Kind::Stream, [3; 16], 0, 1, &body, table_len),
            )
            .unwrap();
        let mut maps = Maps::default();
        let mut model = Model {
            bytes: [vec![Some(0); LOG], vec![Some(0); META]],
            unsynced: [Vec::new(), Vec::new()],
        };
        std::fs::create_dir_all(dir).unwrap();
        let mut tables = hydrate::TablesWriter::create(dir).unwrap();
        let at = tables
            .add(&body[..table_len as usize], body.len() as u64)
            .unwrap();
        tables.finish().unwrap();
        maps.tables.insert(1, at);
        for (e, (meta, off, data)) in entries.iter().zip(&placed) {
            let area = if *meta { Area::Meta } else { Area::Log };
            let piece = Piece {
                object: 1,
                at: e.pos,
            };
            maps.area(area)
                .insert(*off as u64, data.len() as u64, piece);
            for (k, b) in data.iter().enumerate() {
                model.bytes[area as usize][off + k] = Some(*b);
            }
        }
        std::fs::create_dir_all(dir).unwrap();
        drop(FileBackend::open(dir, LOG as u64).unwrap());
        let source = hydrate::Source {
            url: "s3://b/p".into(),
            endpoint: None,
            pool: [3; 16],
            pin: None,
        };
        hydrate::save(dir, &source, &maps).unwrap();
        model
    }

    fn check(b: &dyn Areas, model: &Model, log: bool, o: usize, l: usize) {
        let area = usize::from(!log);
        let mut buf = vec![0u8; l];
        if log {
            b.read_at(&mut buf, o as u64).unwrap();
        } else {
            b.meta_read(&mut buf, o as u64).unwrap();
        }
        for (k, got) in buf.iter().enumerate() {
            if let Some(want) = model.bytes[area][o + k] {
                assert_eq!(*got, want, "area {area} byte {}", o + k);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn reads_see_the_newest_write_or_the_store_through_any_interleaving(
            seed in 1u64..1_000_000,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("engine");
            let store = Arc::new(MemStore::default());
            let mut model = restored(&dir, &store, seed);
            let (mut b, mut h) = open(&dir, &store);
            for op in ops {
                match op {
                    Op::Write(log, o, l, f) => {
                        let (o, l) = (o as usize, l as usize);
                        let area = usize::from(!log);
                        if log { b.write_at(&vec![f; l], o as u64).unwrap() } else { b.meta_write(&vec![f; l], o as u64).unwrap() }
                        model.bytes[area][o..o + l].iter_mut().for_each(|x| *x = Some(f));
                        model.unsynced[area].push((o, l));
                    }
                    Op::Read(log, o, l) => check(b.as_ref(), &model, log, o as usize, l as usize),
                    Op::Discard(o, l) => {
                        b.discard(u64::from(o), u64::from(l)).unwrap();
                        model.bytes[0][o as usize..(o + l) as usize].iter_mut().for_each(|x| *x = None);
                    }
                    Op::Step => {
                        if let Some(h) = &h {
                            h.step().unwrap();
                        }
                    }
                    Op::Sync => {
                        b.sync().unwrap();
                        b.meta_sync().unwrap();
                        model.unsynced = [Vec::new(), Vec::new()];
                    }
                    Op::Crash => {
                        drop(h.take());
                        drop(b);
                        // What was written since the last sync may be old or new now.
                        for area in 0..2 {
                            for (o, l) in std::mem::take(&mut model.unsynced[area]) {
                                model.bytes[area][o..o + l].iter_mut().for_each(|x| *x = None);
                            }
                        }
                        (b, h) = open(&dir, &store);
                    }
                }
            }
            if let Some(h) = &h {
                while h.step().unwrap() {}
            }
            prop_assert!(hydrate::pending(&dir).unwrap().is_none());
            check(b.as_ref(), &model, true, 0, LOG);
            check(b.as_ref(), &model, false, 0, META);
        }
    }
}

/// A pin expires its lifetime after the time its writer gives (the hydration's clock), and
/// retention sees it expired from then on.
#[test]
fn a_pin_expires_its_lifetime_after_the_time_it_was_put() {
    use sliver_replica::catalog::{put_pin, PIN_LIFETIME};
    let store = Arc::new(MemStore::default());
    let pin = sliver_replica::catalog::Pin {
        number: 7,
        expires_ms: 0,
        first: 3,
        through: 9,
    };
    let at = 1_000_000;
    put_pin(store.as_ref(), [5; 16], &pin, at).unwrap();
    let end = at + PIN_LIFETIME.as_millis() as u64;
    let (live, expired) = sliver_replica::catalog::load_pins(store.as_ref(), end - 1).unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!((live[0].expires_ms, live[0].needs()), (end, 3..10));
    assert!(expired.is_empty());
    let (live, expired) = sliver_replica::catalog::load_pins(store.as_ref(), end).unwrap();
    assert!(live.is_empty(), "{live:?}");
    assert_eq!(expired, vec![7]);
}
