//! The simulated storage: a [`MemBackend`] (which keeps written bytes apart from durable ones)
//! behind faults drawn from the run's seed. A write, a sync or a root store may fail with EIO;
//! every call takes simulated time on the run's clock; and the power may fail at a chosen
//! call, leaving an image that keeps a seeded, possibly torn subset of the unsynced writes,
//! after which every call fails (the machine is gone until the driver reopens the image).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_clock::ManualClock;
use sliver_engine::{FormatTwoCheckpoint, LogDevice, MemBackend, MetaArea, RootStore};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often each fault is injected, per call of its kind (a run draws one set: some runs
/// see no faults of a kind at all, as a swarm test's configurations do).
#[derive(Debug, Clone, Copy)]
pub struct DiskRates {
    /// A log or metadata write fails (before or after it changed the bytes).
    pub write: f64,
    /// A log or metadata sync fails: its unsynced writes are lost, as after a failed fsync.
    pub sync: f64,
    /// A root store fails, leaving the old root.
    pub root: f64,
    /// A log read fails.
    pub read: f64,
    /// The longest simulated time a call takes.
    pub latency: Duration,
}

impl DiskRates {
    /// No faults, no time.
    pub const NONE: DiskRates = DiskRates {
        write: 0.0,
        sync: 0.0,
        root: 0.0,
        read: 0.0,
        latency: Duration::ZERO,
    };

    /// Rates drawn from `rng`.
    pub fn draw(rng: &mut StdRng) -> DiskRates {
        let mut pick = |choices: &[f64]| choices[rng.gen_range(0..choices.len())];
        DiskRates {
            write: pick(&[0.0, 0.0, 0.001, 0.01]),
            sync: pick(&[0.0, 0.0, 0.01, 0.05]),
            root: pick(&[0.0, 0.02, 0.1]),
            read: pick(&[0.0, 0.0, 0.001]),
            latency: Duration::from_micros(rng.gen_range(0..2_000)),
        }
    }
}

/// A storage that breaks its promises, for the tests that show the simulation catches it:
/// an engine over it must be caught losing data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// A failed sync answers success (its writes are lost all the same).
    HiddenSyncFailure,
    /// A write now and then answers success without writing.
    DroppedWrite,
}

/// The kinds of calls, for the faults and the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Read,
    Write,
    Sync,
    Root,
    Other,
}

struct Faults {
    rng: StdRng,
    rates: DiskRates,
    /// Faults are injected only while on (the driver's own checks run with them off).
    on: bool,
    /// Power fails at the call this counts down to.
    power_fails_in: Option<u32>,
    /// What the power failure left, until the driver takes it.
    image: Option<MemBackend>,
    /// Faults injected so far (power failures included).
    injected: u64,
    lie: Option<Lie>,
}

/// The run's storage. Cheap to share: the engine holds it as its backend, the driver as the
/// place to inject faults and to take the image a power failure left.
pub struct SimDisk {
    inner: MemBackend,
    faults: Mutex<Faults>,
    clock: Arc<ManualClock>,
}

/// The error every injected fault answers.
fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error: {what}"))
}

impl SimDisk {
    pub fn new(inner: MemBackend, seed: u64, rates: DiskRates, clock: Arc<ManualClock>) -> Self {
        SimDisk {
            inner,
            faults: Mutex::new(Faults {
                rng: StdRng::seed_from_u64(seed),
                rates,
                on: false,
                power_fails_in: None,
                image: None,
                injected: 0,
                lie: None,
            }),
            clock,
        }
    }

    /// Turn fault injection on or off (power failures armed stay armed).
    pub fn faults(&self, on: bool) {
        self.faults.lock().unwrap().on = on;
    }

    /// Break a promise from now on (see [`Lie`]).
    pub fn lie(&self, lie: Lie) {
        self.faults.lock().unwrap().lie = Some(lie);
    }

    /// Let the power fail at the `calls`-th changing call from now.
    pub fn power_fails_in(&self, calls: u32) {
        self.faults.lock().unwrap().power_fails_in = Some(calls);
    }

    /// Faults injected so far: an error the engine reports must follow one.
    pub fn injected(&self) -> u64 {
        self.faults.lock().unwrap().injected
    }

    /// Whether the power failed (every call fails until the driver reopens the image).
    pub fn powered_off(&self) -> bool {
        self.faults.lock().unwrap().image.is_some()
    }

    /// Fail the power now, if it has not failed yet, and take the image it left.
    pub fn power_off(&self) -> MemBackend {
        let mut f = self.faults.lock().unwrap();
        if f.image.is_none() {
            let image = crash_image(&self.inner, &mut f.rng);
            f.image = Some(image);
            f.injected += 1;
        }
        f.image.take().expect("just taken")
    }

    /// The unsynced writes a power failure now could lose.
    pub fn pending_writes(&self) -> usize {
        self.inner.pending_writes()
    }

    /// Before a call of kind `call`: the time it takes, then the fault to inject, if any.
    fn enter(&self, call: Call) -> io::Result<()> {
        let mut f = self.faults.lock().unwrap();
        let latency = f.rates.latency;
        if !latency.is_zero() {
            let t = f.rng.gen_range(0..=latency.as_micros() as u64);
            self.clock.advance(Duration::from_micros(t));
        }
        if f.image.is_some() {
            return Err(eio("the power failed"));
        }
        if !f.on {
            return Ok(());
        }
        if call != Call::Read {
            if let Some(n) = f.power_fails_in.as_mut() {
                if *n == 0 {
                    f.power_fails_in = None;
                    let image = crash_image(&self.inner, &mut f.rng);
                    f.image = Some(image);
                    f.injected += 1;
                    return Err(eio("the power failed"));
                }
                *n -= 1;
            }
        }
        let rate = match call {
            Call::Read => f.rates.read,
            Call::Write => f.rates.write,
            Call::Sync => f.rates.sync,
            Call::Root => f.rates.root,
            Call::Other => 0.0,
        };
        if rate > 0.0 && f.rng.gen_bool(rate) {
            f.injected += 1;
            return Err(eio(match call {
                Call::Read => "read",
                Call::Write => "write",
                Call::Sync => "sync",
                _ => "root",
            }));
        }
        Ok(())
    }

    /// A failed write may have changed the bytes before it failed: decided by the seed.
    fn write_fails_after(&self) -> bool {
        self.faults.lock().unwrap().rng.gen_bool(0.5)
    }

    /// Whether `lie` is told, and now.
    fn lies(&self, lie: Lie) -> bool {
        let mut f = self.faults.lock().unwrap();
        f.on && f.lie == Some(lie) && f.rng.gen_bool(0.05)
    }

    fn write(&self, op: impl FnOnce(&MemBackend) -> io::Result<()>) -> io::Result<()> {
        if self.lies(Lie::DroppedWrite) {
            return Ok(());
        }
        match self.enter(Call::Write) {
            Err(e) if !self.powered_off() && self.write_fails_after() => {
                op(&self.inner)?;
                Err(e)
            }
            Err(e) => Err(e),
            Ok(()) => op(&self.inner),
        }
    }

    fn sync_with(&self, op: impl FnOnce(&MemBackend) -> io::Result<()>) -> io::Result<()> {
        match self.enter(Call::Sync) {
            Err(e) if self.powered_off() => Err(e),
            // A failed fsync: what it would have made durable is lost (MemBackend drops it).
            Err(e) => {
                self.inner.fail_next_sync();
                let r = op(&self.inner);
                if self.faults.lock().unwrap().lie == Some(Lie::HiddenSyncFailure) {
                    return Ok(());
                }
                debug_assert!(r.is_err(), "{e}: MemBackend fails the sync");
                r
            }
            Ok(()) => op(&self.inner),
        }
    }
}

/// Which unsynced writes a power failure keeps (the engine's crash test's rule): decided per
/// failure (none, all, each write whole or not, each sector, a prefix with a torn write at its
/// end), then per write and sector.
pub fn crash_image(backend: &MemBackend, rng: &mut StdRng) -> MemBackend {
    let mode = rng.gen_range(0..5);
    let pending = backend.pending_writes();
    let cut = rng.gen_range(0..=pending);
    let mut r = StdRng::seed_from_u64(rng.gen());
    backend.crash(move |i, sectors| match mode {
        0 => vec![false; sectors],
        1 => vec![true; sectors],
        2 => vec![r.gen_bool(0.5); sectors],
        3 => (0..sectors).map(|_| r.gen_bool(0.5)).collect(),
        _ if i < cut => vec![true; sectors],
        _ if i == cut => {
            let keep = r.gen_range(0..=sectors);
            (0..sectors).map(|s| s < keep).collect()
        }
        _ => vec![false; sectors],
    })
}

impl LogDevice for SimDisk {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.enter(Call::Read)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.write(|b| b.write_at(data, offset))
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_with(MemBackend::sync)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.enter(Call::Other)?;
        self.inner.allocate(offset, len)
    }

    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write(|b| b.write_ahead(offset, len))
    }

    fn sync_written_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.sync_with(|b| b.sync_written_ahead(offset, len))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.enter(Call::Other)?;
        self.inner.discard(offset, len)
    }
}

impl MetaArea for SimDisk {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.enter(Call::Read)?;
        self.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.write(|b| b.meta_write(data, offset))
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.sync_with(MemBackend::meta_sync)
    }
}

impl RootStore for SimDisk {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.enter(Call::Read)?;
        self.inner.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.enter(Call::Root)?;
        self.inner.store_root(bytes)
    }
}

impl FormatTwoCheckpoint for SimDisk {
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_checkpoint()
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.enter(Call::Root)?;
        self.inner.store_checkpoint(bytes)
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        self.enter(Call::Root)?;
        self.inner.retire_checkpoint()
    }
}
