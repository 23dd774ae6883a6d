//! Setup shared by the engine's integration tests: the tuning of the randomized tests, and a
//! backend that takes a power-failure image in the middle of whatever the engine is doing.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use sliver_engine::{FormatTwoCheckpoint, LogDevice, MemBackend, MetaArea, RootStore, Tuning};
use std::io;

/// The tuning of the randomized tests: checkpoints only when the test asks (or the collector
/// needs one), and a journal budget of a few pages' worth, so that checkpoints consolidate
/// pending words and clean journal pages (with the default budget they never would here).
pub fn test_paced_tuning() -> Tuning {
    Tuning {
        checkpoint_bytes: u64::MAX,
        metadata_journal: 4 << 10,
        ..Tuning::default()
    }
}

/// The backend calls after which a crash image may be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Write,
    Sync,
    Discard,
    MetaWrite,
    MetaSync,
    StoreRoot,
    StoreCheckpoint,
    RetireCheckpoint,
}

/// When a [`CrashTap`] takes its image, told of each call that changes the backend.
pub trait CrashPoints: Send + Sync {
    /// `call` is about to change `inner`, or has just changed it: a crash image taken now
    /// holds the backend as a power failure at this point would leave it.
    fn reached(&self, inner: &MemBackend, call: Call);
}

/// A memory backend that tells `points` of every write, sync, discard and root or checkpoint
/// change (on both sides of a root or checkpoint change, whose crash before and after differ),
/// so that a crash image can be taken in the middle of an operation.
pub struct CrashTap<P> {
    pub inner: MemBackend,
    pub points: P,
}

/// Which sides of a call its crash points are on: after a write or discard (whose bytes are
/// then among the unsynced ones a crash may keep), before a sync (a crash just ahead of it
/// loses what it would have made durable), on both sides of a root or checkpoint change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sides {
    Before,
    After,
    Both,
}

impl<P: CrashPoints> CrashTap<P> {
    /// `op` on the inner backend, with crash points on the `sides` of it.
    fn crash_points<T>(&self, call: Call, sides: Sides, op: impl FnOnce(&MemBackend) -> T) -> T {
        if sides != Sides::After {
            self.points.reached(&self.inner, call);
        }
        let r = op(&self.inner);
        if sides != Sides::Before {
            self.points.reached(&self.inner, call);
        }
        r
    }
}

impl<P: CrashPoints> LogDevice for CrashTap<P> {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.crash_points(Call::Write, Sides::After, |b| b.write_at(data, offset))
    }

    fn sync(&self) -> io::Result<()> {
        self.crash_points(Call::Sync, Sides::Before, MemBackend::sync)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.crash_points(Call::Discard, Sides::After, |b| b.discard(offset, len))
    }
}

impl<P: CrashPoints> MetaArea for CrashTap<P> {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.crash_points(Call::MetaWrite, Sides::After, |b| {
            b.meta_write(data, offset)
        })
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.crash_points(Call::MetaSync, Sides::Before, MemBackend::meta_sync)
    }
}

impl<P: CrashPoints> RootStore for CrashTap<P> {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.crash_points(Call::StoreRoot, Sides::Both, |b| b.store_root(bytes))
    }
}

impl<P: CrashPoints> FormatTwoCheckpoint for CrashTap<P> {
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_checkpoint()
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.crash_points(Call::StoreCheckpoint, Sides::Both, |b| {
            b.store_checkpoint(bytes)
        })
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        self.crash_points(
            Call::RetireCheckpoint,
            Sides::Both,
            MemBackend::retire_checkpoint,
        )
    }
}
