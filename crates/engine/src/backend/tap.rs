//! [`WriteTap`]: what sees the engine's writes after they complete (the off-site copy's
//! recording, and next a synchronous mirror), and the wrappers that call it: [`TappedLog`],
//! [`TappedMeta`] and [`TappedRoot`] forward each call to the device they wrap once, then tell
//! the tap what succeeded. A failed call is not told: the engine sees the error and poisons
//! itself or retries, as it would without a tap.
//!
//! Not told, because nothing of the array's contents changes: reads, allocations, the zeros a
//! segment is written ahead with and their sync (the range is free and its contents
//! undefined; the records later written there are told as any others, and the log's next
//! sync covers them again), and the format 2 checkpoint, which only open and the migration
//! touch.

use super::{Devices, LogDevice, MetaArea, RootStore};
use std::io;
use std::sync::Arc;

/// Told of every write, discard and sync the engine's devices complete, after they did, in
/// the order the wrappers' calls return: under concurrent writers a sync may be told before a
/// write that finished before it, but never before a write the engine counts durable by that
/// sync (a flush counts only writes whose call had returned when the sync began).
pub trait WriteTap: Send + Sync {
    /// `bytes` were written to the log at `offset`.
    fn log_written(&self, offset: u64, bytes: &[u8]);
    /// `len` bytes of log at `offset` were given back (their contents are undefined now).
    fn log_discarded(&self, offset: u64, len: u64);
    /// The log's writes so far are durable. It may block, and an error fails the sync: the
    /// engine takes it as the device's own (a flush fails, and the engine is poisoned), so a
    /// flush can wait for a second copy.
    fn log_synced(&self) -> io::Result<()>;
    /// `bytes` were written to the metadata area at `offset`.
    fn meta_written(&self, offset: u64, bytes: &[u8]);
    /// The metadata area's writes so far are durable.
    fn meta_synced(&self);
    /// The root was replaced by `bytes`, durably.
    fn root_stored(&self, bytes: &[u8]);
}

/// A [`LogDevice`] whose completed writes, discards and syncs are told to a [`WriteTap`].
pub struct TappedLog<L: ?Sized> {
    tap: Arc<dyn WriteTap>,
    inner: Arc<L>,
}

impl<L: LogDevice + ?Sized> TappedLog<L> {
    pub fn new(inner: Arc<L>, tap: Arc<dyn WriteTap>) -> Self {
        TappedLog { tap, inner }
    }
}

impl<L: LogDevice + ?Sized> LogDevice for TappedLog<L> {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        self.inner.read_vectored_at(bufs, offset)
    }

    fn read_vectored_cached(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<bool> {
        self.inner.read_vectored_cached(bufs, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(data, offset)?;
        self.tap.log_written(offset, data);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()?;
        // Said apart from the device's own failure: the engine's poison message names it.
        self.tap
            .log_synced()
            .map_err(|e| io::Error::new(e.kind(), format!("the write tap failed the sync: {e}")))
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }

    fn allocation_reserves(&self) -> bool {
        self.inner.allocation_reserves()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)?;
        self.tap.log_discarded(offset, len);
        Ok(())
    }

    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_ahead(offset, len)
    }

    fn sync_written_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.sync_written_ahead(offset, len)
    }

    fn has_room(&self, len: u64, keep: u64) -> bool {
        self.inner.has_room(len, keep)
    }
}

/// A [`MetaArea`] whose completed writes and syncs are told to a [`WriteTap`].
pub struct TappedMeta<M: ?Sized> {
    tap: Arc<dyn WriteTap>,
    inner: Arc<M>,
}

impl<M: MetaArea + ?Sized> TappedMeta<M> {
    pub fn new(inner: Arc<M>, tap: Arc<dyn WriteTap>) -> Self {
        TappedMeta { tap, inner }
    }
}

impl<M: MetaArea + ?Sized> MetaArea for TappedMeta<M> {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.meta_write(data, offset)?;
        self.tap.meta_written(offset, data);
        Ok(())
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.inner.meta_sync()?;
        self.tap.meta_synced();
        Ok(())
    }

    fn reserve_meta(&self, bytes: u64) {
        self.inner.reserve_meta(bytes)
    }
}

/// A [`RootStore`] whose stored roots are told to a [`WriteTap`].
pub struct TappedRoot<R: ?Sized> {
    tap: Arc<dyn WriteTap>,
    inner: Arc<R>,
}

impl<R: RootStore + ?Sized> TappedRoot<R> {
    pub fn new(inner: Arc<R>, tap: Arc<dyn WriteTap>) -> Self {
        TappedRoot { tap, inner }
    }
}

impl<R: RootStore + ?Sized> RootStore for TappedRoot<R> {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.store_root(bytes)?;
        self.tap.root_stored(bytes);
        Ok(())
    }
}

impl Devices {
    /// The same devices with the log, the metadata area and the root told to `tap` (the
    /// format 2 checkpoint is not: see the module's description). Tapped again, a second tap
    /// is told after the first.
    pub fn tapped(self, tap: Arc<dyn WriteTap>) -> Devices {
        Devices {
            log: Arc::new(TappedLog::new(self.log, tap.clone())),
            meta: Arc::new(TappedMeta::new(self.meta, tap.clone())),
            root: Arc::new(TappedRoot::new(self.root, tap)),
            checkpoint: self.checkpoint,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;
    use crate::FormatTwoCheckpoint;
    use std::sync::Mutex;

    /// What a tap was told, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Told {
        Log(u64, Vec<u8>),
        Discarded(u64, u64),
        LogSynced,
        Meta(u64, Vec<u8>),
        MetaSynced,
        Root(Vec<u8>),
    }

    #[derive(Default)]
    struct Recorder {
        told: Mutex<Vec<Told>>,
        /// Fail every log sync from now on.
        fail_syncs: std::sync::atomic::AtomicBool,
    }

    impl Recorder {
        fn told(&self) -> Vec<Told> {
            self.told.lock().unwrap().clone()
        }
    }

    impl WriteTap for Recorder {
        fn log_written(&self, offset: u64, bytes: &[u8]) {
            self.told
                .lock()
                .unwrap()
                .push(Told::Log(offset, bytes.to_vec()));
        }
        fn log_discarded(&self, offset: u64, len: u64) {
            self.told.lock().unwrap().push(Told::Discarded(offset, len));
        }
        fn log_synced(&self) -> io::Result<()> {
            if self.fail_syncs.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(io::Error::other("the mirror is away"));
            }
            self.told.lock().unwrap().push(Told::LogSynced);
            Ok(())
        }
        fn meta_written(&self, offset: u64, bytes: &[u8]) {
            self.told
                .lock()
                .unwrap()
                .push(Told::Meta(offset, bytes.to_vec()));
        }
        fn meta_synced(&self) {
            self.told.lock().unwrap().push(Told::MetaSynced);
        }
        fn root_stored(&self, bytes: &[u8]) {
            self.told.lock().unwrap().push(Told::Root(bytes.to_vec()));
        }
    }

    /// Each wrapper forwards to its device and tells the tap what completed, in order; reads,
    /// allocations and writes ahead reach the device and are not told.
    #[test]
    fn the_wrappers_forward_and_tell_what_completed() {
        let mem = Arc::new(MemBackend::new(1 << 20));
        let tap = Arc::new(Recorder::default());
        let devices = Devices::of(mem.clone()).tapped(tap.clone());
        let log = &devices.log;
        assert_eq!(log.capacity(), 1 << 20);
        log.allocate(0, 65536).unwrap();
        log.write_at(b"abc", 100).unwrap();
        log.write_ahead(65536, 4096).unwrap();
        log.sync_written_ahead(65536, 4096).unwrap();
        log.sync().unwrap();
        log.discard(8192, 4096).unwrap();
        let mut back = [0u8; 3];
        log.read_at(&mut back, 100).unwrap();
        assert_eq!(&back, b"abc");
        let (mut a, mut b) = ([0u8; 1], [0u8; 2]);
        log.read_vectored_at(&mut [&mut a[..], &mut b[..]], 100)
            .unwrap();
        assert_eq!((a, b), ([b'a'], [b'b', b'c']));
        assert!(log.has_room(1, 1) && log.allocation_reserves());
        devices.meta.meta_write(b"page", 4096).unwrap();
        devices.meta.meta_sync().unwrap();
        let mut page = [0u8; 4];
        devices.meta.meta_read(&mut page, 4096).unwrap();
        assert_eq!(&page, b"page");
        devices.root.store_root(b"root").unwrap();
        assert_eq!(devices.root.load_root().unwrap().unwrap(), b"root");
        // The checkpoint is not tapped.
        devices.checkpoint.store_checkpoint(b"v2").unwrap();
        assert_eq!(
            tap.told(),
            [
                Told::Log(100, b"abc".to_vec()),
                Told::LogSynced,
                Told::Discarded(8192, 4096),
                Told::Meta(4096, b"page".to_vec()),
                Told::MetaSynced,
                Told::Root(b"root".to_vec()),
            ]
        );
        // The device underneath holds it all, the zeros written ahead too.
        assert_eq!(mem.written_ahead(), 4096);
        assert_eq!(mem.load_root().unwrap().unwrap(), b"root");
        assert_eq!(mem.load_checkpoint().unwrap().unwrap(), b"v2");
    }

    /// A call that fails at the device is not told; a tap's failed log sync fails the sync.
    #[test]
    fn failures_are_not_told_and_a_taps_sync_error_fails_the_sync() {
        let mem = Arc::new(MemBackend::new(1 << 20));
        let tap = Arc::new(Recorder::default());
        let devices = Devices::of(mem.clone()).tapped(tap.clone());
        assert!(
            devices.log.write_at(b"x", 2 << 20).is_err(),
            "beyond the log"
        );
        mem.fail_next_sync();
        assert!(devices.log.sync().is_err());
        mem.fail_next_root();
        assert!(devices.root.store_root(b"r").is_err());
        assert_eq!(tap.told(), []);
        tap.fail_syncs
            .store(true, std::sync::atomic::Ordering::Relaxed);
        devices.log.write_at(b"y", 0).unwrap();
        let e = devices.log.sync().unwrap_err();
        assert!(e.to_string().contains("mirror"), "{e}");
        assert_eq!(tap.told(), [Told::Log(0, b"y".to_vec())]);
    }

    /// A tap's failed log sync fails the engine's flush as a failed fsync does: the engine is
    /// poisoned and refuses writes.
    #[test]
    fn a_taps_failed_sync_fails_the_flush() {
        let mem = Arc::new(MemBackend::new(64 << 20));
        let tap = Arc::new(Recorder::default());
        let config = crate::EngineConfig {
            chunk_size: 4096,
            segment_size: 1 << 20,
        };
        let devices = Devices::of(mem).tapped(tap.clone());
        let engine = crate::Engine::create(devices, config, crate::Tuning::default()).unwrap();
        let v = engine.create_volume(1 << 20).unwrap();
        engine.write(v, 0, &[7u8; 4096]).unwrap();
        engine.flush().unwrap();
        assert!(tap.told().contains(&Told::LogSynced));
        tap.fail_syncs
            .store(true, std::sync::atomic::Ordering::Relaxed);
        engine.write(v, 4096, &[8u8; 4096]).unwrap();
        assert!(engine.flush().is_err());
        let why = engine.poisoned().expect("poisoned");
        assert!(why.contains("mirror"), "{why}");
        assert!(engine.write(v, 0, &[9u8; 4096]).is_err());
    }

    /// Two taps stacked are told the same, the inner one first.
    #[test]
    fn a_second_tap_is_told_the_same() {
        let mem = Arc::new(MemBackend::new(1 << 20));
        let (first, second) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
        let devices = Devices::of(mem)
            .tapped(first.clone())
            .tapped(second.clone());
        devices.log.write_at(b"abc", 0).unwrap();
        devices.log.sync().unwrap();
        devices.meta.meta_write(b"m", 0).unwrap();
        devices.root.store_root(b"r").unwrap();
        assert_eq!(first.told().len(), 4);
        assert_eq!(first.told(), second.told());
        // The second tap's failed sync fails it after the first was told.
        second
            .fail_syncs
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(devices.log.sync().is_err());
        assert_eq!(first.told().last(), Some(&Told::LogSynced));
        assert_eq!(second.told().len(), 4);
    }
}
