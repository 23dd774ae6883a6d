//! The narrow storage interfaces under the engine, one trait each: the log area addressed by
//! byte offset ([`LogDevice`]), the metadata area (4 KiB page slots, see
//! [`crate::meta::page_store`]; [`MetaArea`]), and one atomically replaced root blob naming
//! the newest consistent set of metadata pages ([`RootStore`]). The format 2 checkpoint blob
//! is still read, for the migration ([`FormatTwoCheckpoint`]). [`Devices`] hands the four to
//! the engine; a [`WriteTap`] sees the writes, syncs and discards that change the array's
//! contents once they complete (`tap.rs` lists what it is not told).
//!
//! [`FileBackend`] is what ships: (sparse) log files, a metadata file and a root file in the
//! array's data directory. [`MemBackend`] is the test double that makes crash testing honest:
//! it keeps the bytes written apart from the bytes made durable, and a simulated crash keeps an
//! arbitrary, possibly torn, subset of what was not yet synced, in both areas.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(any(test, feature = "testing"))]
mod mem;
mod tap;
#[cfg(any(test, feature = "testing"))]
pub use mem::MemBackend;
pub use tap::{TappedLog, TappedMeta, TappedRoot, WriteTap};

/// The log area: bytes addressed by offset, written, synced, reserved and given back, and
/// whether the storage has room for more. The engine holds one and reads and writes its
/// segments through it.
pub trait LogDevice: Send + Sync {
    /// Size of the log area in bytes.
    fn capacity(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Read `bufs` back to back from `offset` (a scatter read: one system call where the
    /// device can, so chunks land in the host's buffer without a copy). By default one read
    /// into a buffer of their own and a copy.
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        read_then_scatter(bufs, |all| self.read_at(all, offset))
    }
    /// [`LogDevice::read_vectored_at`] if it can be done without waiting for a device (the
    /// bytes are in the page cache): `Ok(true)` when `bufs` were filled, `Ok(false)` when the
    /// read would wait (`bufs` then hold nothing useful). Lets a read that costs a few
    /// microseconds run on the thread that received it, and one that waits for the disk go
    /// to a thread that may wait. By default it would always wait.
    fn read_vectored_cached(&self, _bufs: &mut [&mut [u8]], _offset: u64) -> io::Result<bool> {
        Ok(false)
    }
    /// Write; not durable until [`LogDevice::sync`] returns.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Reserve space for a range about to be written, so running out of space shows up here
    /// (ENOSPC) and not in the middle of a record.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Whether a range [`LogDevice::allocate`] accepted can be written without running out
    /// of space. False once the file system turned out to have no fallocate: space then shows
    /// up as ENOSPC on write, which the engine must see before it applies a record, so it
    /// writes under the metadata lock again.
    fn allocation_reserves(&self) -> bool {
        true
    }
    /// Give a range's space back (its contents become undefined).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Write a range [`LogDevice::allocate`] reserved once before it is used (its contents
    /// become undefined, as after a discard). The writes may still be under way when this
    /// returns; the next [`LogDevice::sync`] waits for them and makes them durable. On a file
    /// system, blocks fallocate reserved are converted to written ones by their first write,
    /// and the sync after that write must record the conversion as well: an extent block and
    /// the inode, written one after the other after the data. A range written ahead (and
    /// synced once) spares every later sync there those two writes. By default nothing.
    fn write_ahead(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Make a range [`LogDevice::write_ahead`] wrote durable, with the file system's record
    /// of the blocks it converted, without taking an error that the log's next
    /// [`LogDevice::sync`] must report: write-back errors are reported once per file
    /// description, and the failed page may be a host's write in the same file. By default
    /// nothing (nothing was written ahead).
    fn sync_written_ahead(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Whether the storage can take `len` more bytes of log and still hold `keep` bytes more
    /// plus a new checkpoint. The engine asks before it takes space for new data, so that a
    /// full file system keeps room for what frees space: metadata records, a checkpoint, the
    /// collector. A device that cannot tell answers yes (allocation then decides).
    fn has_room(&self, _len: u64, _keep: u64) -> bool {
        true
    }
}

/// The metadata area: 4 KiB page slots (see [`crate::meta::page_store`]) that checkpoints
/// write and the page cache reads back.
pub trait MetaArea: Send + Sync {
    /// Read the metadata area; bytes never written read as zeros.
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write the metadata area (it grows as needed); not durable until
    /// [`MetaArea::meta_sync`].
    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed metadata write durable.
    fn meta_sync(&self) -> io::Result<()>;
    /// Bytes a metadata flush may add to the metadata area: [`LogDevice::has_room`] keeps
    /// room for them (where the two share a file system).
    fn reserve_meta(&self, _bytes: u64) {}
}

/// The root: one blob, replaced atomically, naming the newest consistent set of metadata
/// pages.
pub trait RootStore: Send + Sync {
    /// The last stored root, if any.
    fn load_root(&self) -> io::Result<Option<Vec<u8>>>;
    /// Replace the root atomically and durably: after a crash, either the old or the new one
    /// is found, complete.
    fn store_root(&self, bytes: &[u8]) -> io::Result<()>;
}

/// The format 2 checkpoint, read only by [`crate::Engine::open`] and the migration to
/// format 3, which retires it.
pub trait FormatTwoCheckpoint: Send + Sync {
    /// The format 2 checkpoint, if the storage still holds one (an array to migrate).
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>>;
    /// Store a format 2 checkpoint (tests that build old arrays).
    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()>;
    /// Keep the format 2 checkpoint under another name once a root has replaced it (the
    /// migration's last step: from then on the array opens as format 3).
    fn retire_checkpoint(&self) -> io::Result<()>;
}

/// What an engine is created or opened on: the log device, the metadata area and the root
/// store, which it keeps, and the format 2 checkpoint, which only open and the migration read.
/// Usually all four are one storage ([`Devices::of`], or `From` an `Arc` of it); a
/// [`WriteTap`] wraps the first three ([`Devices::tapped`]).
#[derive(Clone)]
pub struct Devices {
    pub log: Arc<dyn LogDevice>,
    pub meta: Arc<dyn MetaArea>,
    pub root: Arc<dyn RootStore>,
    pub checkpoint: Arc<dyn FormatTwoCheckpoint>,
}

impl Devices {
    /// The four parts of one storage.
    pub fn of<S>(storage: Arc<S>) -> Devices
    where
        S: LogDevice + MetaArea + RootStore + FormatTwoCheckpoint + 'static,
    {
        Devices {
            log: storage.clone(),
            meta: storage.clone(),
            root: storage.clone(),
            checkpoint: storage,
        }
    }
}

impl<S> From<Arc<S>> for Devices
where
    S: LogDevice + MetaArea + RootStore + FormatTwoCheckpoint + 'static,
{
    fn from(storage: Arc<S>) -> Devices {
        Devices::of(storage)
    }
}

/// A scatter read done as one read of `bufs`' total length (by `read`) and a copy into them.
fn read_then_scatter(
    bufs: &mut [&mut [u8]],
    read: impl FnOnce(&mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut all = sliver_volume::io_buffer(bufs.iter().map(|b| b.len()).sum());
    read(&mut all)?;
    let mut at = 0;
    for b in bufs.iter_mut() {
        b.copy_from_slice(&all[at..at + b.len()]);
        at += b.len();
    }
    Ok(())
}

/// The log in `<dir>/log`, `<dir>/log.1`, `<dir>/log.2`... (sparse, [`LOG_FILE_SPAN`] bytes
/// each, `capacity` bytes in all), metadata pages in `<dir>/meta`, the root in `<dir>/root`
/// (format 2: the checkpoint in `<dir>/checkpoint`).
pub struct FileBackend {
    dir: PathBuf,
    log: LogFiles,
    meta: File,
    capacity: u64,
    /// Size of the last checkpoint loaded or stored, or the bytes a metadata flush may add:
    /// room [`LogDevice::has_room`] keeps.
    checkpoint_len: AtomicU64,
    /// Bytes of the metadata file allocated so far (it grows by [`META_GROWTH`] steps, so a
    /// full file system shows as ENOSPC from fallocate, not in the middle of a page).
    meta_allocated: AtomicU64,
    /// Set once fallocate answered EOPNOTSUPP (see [`LogDevice::allocation_reserves`]).
    no_fallocate: AtomicBool,
}

/// The metadata file grows by this much at a time.
const META_GROWTH: u64 = 4 << 20;

/// Room [`FileBackend::has_room`] keeps beyond a checkpoint, for the file system's own
/// metadata and the array's small files.
const ROOM_SLACK: u64 = 1 << 20;

const LOG_FILE: &str = "log";

/// What [`FileBackend::write_ahead`] writes from: one buffer for the process, whose pages stay
/// mapped. A buffer allocated per call had pages never touched, and the kernel, copying from
/// them, stopped at each to fault it in, zeroed the file's new blocks and copied again: half
/// of the preparer's CPU (4 KiB write-through random writes at QD 32, `perf`).
static WRITE_AHEAD_ZEROS: [u8; 256 << 10] = [0; 256 << 10];

/// Bytes of log one file holds: ext4 limits a file to 16 TiB (with 4 KiB blocks), so a log
/// larger than that is several files. A segment of a size that does not divide it straddles
/// two files; reads and writes are split where they cross.
pub const LOG_FILE_SPAN: u64 = 8 << 40;

/// The log's files: byte `o` of the log is byte `o % span` of file `o / span` (`log`, then
/// `log.1`, `log.2`...). A log created before it was split keeps its one file, whatever its
/// size (its span is then unbounded).
struct LogFiles {
    span: u64,
    files: Vec<File>,
    /// The same files opened again, for writing ahead: a file description of its own keeps
    /// its own cursor of write-back errors, so the sync after zeros written ahead
    /// ([`LogDevice::sync_written_ahead`]) can never take an error that the log's next sync
    /// must report.
    ahead: Vec<File>,
    /// Files written since their last sync: a sync waits for those only.
    written: Vec<AtomicBool>,
    /// One sync at a time: one that found a file's flag cleared by another still syncing it
    /// would otherwise return before that file is durable.
    syncing: Mutex<()>,
}

impl LogFiles {
    fn name(k: usize) -> String {
        match k {
            0 => LOG_FILE.to_string(),
            k => format!("{LOG_FILE}.{k}"),
        }
    }

    /// Open the log's files in `dir`, creating and growing them (sparse) to hold `capacity`
    /// bytes; returns them and the log's size (at least `capacity`).
    fn open(dir: &Path, capacity: u64, span: u64) -> io::Result<(LogFiles, u64)> {
        let open = |k: usize, create: bool| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .open(dir.join(Self::name(k)))
        };
        let first = open(0, true)?;
        let first_len = first.metadata()?.len();
        let mut files = vec![first];
        // Files of a log already split, whatever the capacity asked now.
        while let Ok(f) = open(files.len(), false) {
            files.push(f);
        }
        // A file missing in the middle would silently shift the log: refuse.
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let k = name
                .to_str()
                .and_then(|n| n.strip_prefix(&format!("{LOG_FILE}.")))
                .and_then(|k| k.parse::<usize>().ok());
            if let Some(k) = k.filter(|&k| k > files.len()) {
                return Err(io::Error::other(format!(
                    "log file {} exists but {} is missing",
                    Self::name(k),
                    Self::name(files.len())
                )));
            }
        }
        let span = if files.len() == 1 && first_len > span {
            u64::MAX
        } else {
            span
        };
        let mut size = 0;
        for (k, f) in files.iter().enumerate() {
            size = k as u64 * span + f.metadata()?.len();
        }
        let size = size.max(capacity);
        let mut grown = false;
        for k in 0..size.div_ceil(span).max(1) as usize {
            if k == files.len() {
                files.push(open(k, true)?);
            }
            let want = (size - k as u64 * span).min(span);
            if files[k].metadata()?.len() < want {
                files[k].set_len(want)?;
                files[k].sync_all()?;
                grown = true;
            }
        }
        if grown {
            sync_dir(dir)?;
        }
        let written = files.iter().map(|_| AtomicBool::new(false)).collect();
        let ahead = (0..files.len())
            .map(|k| OpenOptions::new().write(true).open(dir.join(Self::name(k))))
            .collect::<io::Result<_>>()?;
        Ok((
            LogFiles {
                span,
                files,
                ahead,
                written,
                syncing: Mutex::new(()),
            },
            size,
        ))
    }

    /// The pieces of `len` bytes at `offset`: (file, offset in it, offset in the range, length).
    fn pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = (usize, u64, usize, usize)> + '_ {
        let mut at = 0u64;
        std::iter::from_fn(move || {
            if at >= len {
                return None;
            }
            let o = offset + at;
            let (k, within) = ((o / self.span) as usize, o % self.span);
            let n = (len - at).min(self.span - within);
            let piece = (k, within, at as usize, n as usize);
            at += n;
            Some(piece)
        })
    }

    fn file(&self, k: usize) -> io::Result<&File> {
        self.files
            .get(k)
            .ok_or_else(|| io::Error::other("beyond the end of the log"))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        for (k, within, at, n) in self.pieces(offset, buf.len() as u64) {
            self.file(k)?.read_exact_at(&mut buf[at..at + n], within)?;
        }
        Ok(())
    }

    /// One `preadv` loop when the range lies in one file; else piece by piece.
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let mut pieces = self.pieces(offset, total);
        let (Some((k, within, _, _)), None) = (pieces.next(), pieces.next()) else {
            return read_then_scatter(bufs, |all| self.read_at(all, offset));
        };
        let file = self.file(k)?;
        let mut vecs: Vec<std::io::IoSliceMut<'_>> = bufs
            .iter_mut()
            .map(|b| std::io::IoSliceMut::new(b))
            .collect();
        let mut vecs = &mut vecs[..];
        let mut at = within;
        while !vecs.is_empty() {
            let count = vecs.len().min(1024) as libc::c_int;
            let offset = libc::off_t::try_from(at).map_err(io::Error::other)?;
            // SAFETY: IoSliceMut is ABI-compatible with iovec (std guarantees it on unix); the
            // slices are valid, distinct and writable for the call.
            let n = unsafe {
                libc::preadv(
                    file.as_raw_fd(),
                    vecs.as_ptr() as *const libc::iovec,
                    count,
                    offset,
                )
            };
            match n {
                -1 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    at += n as u64;
                    std::io::IoSliceMut::advance_slices(&mut vecs, n as usize);
                }
            }
        }
        Ok(())
    }

    /// One `preadv2(RWF_NOWAIT)` when the range lies in one file: the kernel fills the
    /// buffers only from the page cache and says EAGAIN (or reads short) where it would wait.
    fn read_vectored_cached(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<bool> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let mut pieces = self.pieces(offset, total);
        let (Some((k, within, _, _)), None) = (pieces.next(), pieces.next()) else {
            return Ok(false);
        };
        if bufs.len() > 1024 {
            return Ok(false);
        }
        let file = self.file(k)?;
        let vecs: Vec<std::io::IoSliceMut<'_>> = bufs
            .iter_mut()
            .map(|b| std::io::IoSliceMut::new(b))
            .collect();
        let offset = libc::off_t::try_from(within).map_err(io::Error::other)?;
        // SAFETY: as in `read_vectored_at`; at most 1,024 (IOV_MAX) slices.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                vecs.as_ptr() as *const libc::iovec,
                vecs.len() as libc::c_int,
                offset,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // Not cached; or a kernel or file system without RWF_NOWAIT for reads.
                Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL | libc::EINTR) => Ok(false),
                _ => Err(e),
            };
        }
        // Short: part of the range is not cached (or lies past the end, which the waiting
        // read reports).
        Ok(n as u64 == total)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        for (k, within, at, n) in self.pieces(offset, data.len() as u64) {
            self.file(k)?.write_all_at(&data[at..at + n], within)?;
            self.written[k].store(true, Ordering::Release);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        for (f, written) in self.files.iter().zip(&self.written) {
            if written.swap(false, Ordering::AcqRel) {
                if let Err(e) = f.sync_data() {
                    written.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Zeros over the range through the page cache (which then holds them for the appends
    /// that follow: a partial page appended later needs no read), their write-back started
    /// with `sync_file_range`, which takes none of the inode's locks; through the files'
    /// second descriptors ([`LogFiles::ahead`]). Not waiting for each piece lets the preparer
    /// (on a core shared with everything else) stay ahead of the head; see
    /// `Engine::write_segment_ahead`.
    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        const PIECE: u64 = WRITE_AHEAD_ZEROS.len() as u64;
        let zeros = &WRITE_AHEAD_ZEROS[..];
        for (k, within, _, n) in self.pieces(offset, len) {
            let file = self
                .ahead
                .get(k)
                .ok_or_else(|| io::Error::other("beyond the end of the log"))?;
            let mut at = 0;
            while at < n as u64 {
                let piece = (n as u64 - at).min(PIECE);
                file.write_all_at(&zeros[..piece as usize], within + at)?;
                at += piece;
            }
            let (start, n) = (
                libc::off64_t::try_from(within).map_err(io::Error::other)?,
                libc::off64_t::try_from(n).map_err(io::Error::other)?,
            );
            // SAFETY: plain syscall on an open descriptor we own.
            let rc = unsafe {
                libc::sync_file_range(file.as_raw_fd(), start, n, libc::SYNC_FILE_RANGE_WRITE)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            // The conversion to written blocks is made durable by `sync_ahead`, or else by
            // the log's next sync.
            self.written[k].store(true, Ordering::Release);
        }
        Ok(())
    }

    /// `fdatasync` of the files holding `offset..offset + len`, through their second
    /// descriptors ([`LogFiles::ahead`]): it writes and waits for every dirty page of the
    /// file, hosts' included, but an error it reports is still reported to the log's own
    /// descriptors by their next sync.
    fn sync_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        for (k, _, _, _) in self.pieces(offset, len) {
            self.ahead
                .get(k)
                .ok_or_else(|| io::Error::other("beyond the end of the log"))?
                .sync_data()?;
        }
        Ok(())
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        for (k, within, _, n) in self.pieces(offset, len) {
            fallocate(self.file(k)?, mode, within, n as u64)?;
            // A sync makes allocations and holes durable too.
            self.written[k].store(true, Ordering::Release);
        }
        Ok(())
    }
}
const META_FILE: &str = "meta";
const ROOT_FILE: &str = "root";
const CHECKPOINT_FILE: &str = "checkpoint";
/// Where the migration keeps the format 2 checkpoint (kept for one release, for forensics).
const RETIRED_CHECKPOINT_FILE: &str = "checkpoint.v2";

/// Whether `dir` holds an engine (format 3, or format 2 awaiting migration).
pub fn holds_engine(dir: &Path) -> bool {
    dir.join(ROOT_FILE).exists() || dir.join(CHECKPOINT_FILE).exists()
}

impl FileBackend {
    /// Open or create the backend in `dir`; a new log file gets `capacity` bytes (sparse). An
    /// existing one keeps its size unless `capacity` is larger (growing the array).
    pub fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        Self::open_with_span(dir, capacity, LOG_FILE_SPAN)
    }

    /// [`FileBackend::open`] with log files of `span` bytes (tests split small logs).
    #[doc(hidden)]
    pub fn open_with_span(dir: &Path, capacity: u64, span: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (log, capacity) = LogFiles::open(dir, capacity, span)?;
        let meta = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(META_FILE))?;
        let meta_len = meta.metadata()?.len();
        // Whether the file system has fallocate at all, known before the first segment is
        // allocated (the head segment of a reopened array is written into without one). The
        // log's first 4 KiB: at most a page of a free segment's space, given back when it is.
        let no_fallocate = matches!(
            log.fallocate(libc::FALLOC_FL_KEEP_SIZE, 0, 4096),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP)
        );
        Ok(Self {
            dir: dir.to_path_buf(),
            capacity,
            log,
            meta,
            checkpoint_len: AtomicU64::new(0),
            meta_allocated: AtomicU64::new(meta_len),
            no_fallocate: AtomicBool::new(no_fallocate),
        })
    }

    /// Bytes this process may still allocate on the file system (root may use the blocks
    /// reserved for it).
    fn free_bytes(&self) -> io::Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: geteuid has no preconditions.
        let blocks = if unsafe { libc::geteuid() } == 0 {
            st.f_bfree
        } else {
            st.f_bavail
        };
        Ok(blocks as u64 * st.f_frsize as u64)
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        self.log.fallocate(mode, offset, len)
    }

    fn load_file(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.dir.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replace `name` atomically and durably (temporary file, fsync, rename, directory fsync).
    fn store_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, bytes)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            // A full file system: give back what the partial copy took.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, self.dir.join(name))?;
        sync_dir(&self.dir)
    }
}

fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor we own.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The ranges of `file` that hold data (`SEEK_DATA` / `SEEK_HOLE`): holes of a sparse file
/// cost nothing to skip. A file system without them reports the whole file as data.
fn data_extents(file: &File) -> io::Result<Vec<(u64, u64)>> {
    let len = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut extents = Vec::new();
    let mut at = 0u64;
    while at < len {
        // SAFETY: lseek on a descriptor this function borrows; it only moves the offset,
        // which no other code of the backend uses (all I/O is positioned).
        let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if start < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // No data after `at`.
                Some(libc::ENXIO) => Ok(extents),
                Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(vec![(0, len)]),
                _ => Err(e),
            };
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        if end < 0 {
            return Err(io::Error::last_os_error());
        }
        let (start, end) = (start as u64, (end as u64).min(len));
        if end > start {
            extents.push((start, end - start));
        }
        at = end.max(start + 1);
    }
    Ok(extents)
}

impl FileBackend {
    /// The log ranges that hold data, as (log offset, length): what a full copy of the array
    /// must read (a sparse log of terabytes holds only what was written and not discarded).
    pub fn log_data_extents(&self) -> io::Result<Vec<(u64, u64)>> {
        let mut all = Vec::new();
        for (k, f) in self.log.files.iter().enumerate() {
            let base = (k as u64).saturating_mul(self.log.span);
            for (o, n) in data_extents(f)? {
                // The log's own capacity bounds what belongs to it.
                let o = base.saturating_add(o);
                if o < self.capacity {
                    all.push((o, n.min(self.capacity - o)));
                }
            }
        }
        Ok(all)
    }

    /// The metadata file's ranges that hold data, as (offset, length).
    pub fn meta_data_extents(&self) -> io::Result<Vec<(u64, u64)>> {
        data_extents(&self.meta)
    }
}

impl LogDevice for FileBackend {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.log.read_at(buf, offset)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        self.log.read_vectored_at(bufs, offset)
    }

    fn read_vectored_cached(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<bool> {
        self.log.read_vectored_cached(bufs, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.log.write_at(data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.log.sync()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(0, offset, len) {
            // File systems without fallocate: space shows up as ENOSPC on write instead.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.no_fallocate.store(true, Ordering::Release);
                Ok(())
            }
            other => other,
        }
    }

    fn allocation_reserves(&self) -> bool {
        !self.no_fallocate.load(Ordering::Acquire)
    }

    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.log.write_ahead(offset, len)
    }

    fn sync_written_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.log.sync_ahead(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            // Without hole punching the space stays allocated but is reused by later segments.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            other => other,
        }
    }

    fn has_room(&self, len: u64, keep: u64) -> bool {
        match self.free_bytes() {
            // The new checkpoint is written before the old one goes; leave room for growth.
            Ok(free) => {
                free >= len + keep + 2 * self.checkpoint_len.load(Ordering::Relaxed) + ROOM_SLACK
            }
            Err(_) => true,
        }
    }
}

impl MetaArea for FileBackend {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.meta.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Past the end of the file: never written.
        buf[done..].fill(0);
        Ok(())
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let allocated = self.meta_allocated.load(Ordering::Acquire);
        if end > allocated {
            let to = end.div_ceil(META_GROWTH) * META_GROWTH;
            match fallocate(&self.meta, 0, allocated, to - allocated) {
                Ok(()) => {
                    self.meta_allocated.fetch_max(to, Ordering::AcqRel);
                }
                // File systems without fallocate: space shows up as ENOSPC on write instead.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => return Err(e),
            }
        }
        self.meta.write_all_at(data, offset)
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.meta.sync_data()
    }

    fn reserve_meta(&self, bytes: u64) {
        self.checkpoint_len.store(bytes, Ordering::Relaxed);
    }
}

impl RootStore for FileBackend {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.load_file(ROOT_FILE)
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.store_file(ROOT_FILE, bytes)
    }
}

impl FormatTwoCheckpoint for FileBackend {
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        let loaded = self.load_file(CHECKPOINT_FILE)?;
        if let Some(bytes) = &loaded {
            self.checkpoint_len
                .fetch_max(bytes.len() as u64, Ordering::Relaxed);
        }
        Ok(loaded)
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.checkpoint_len
            .store(bytes.len() as u64, Ordering::Relaxed);
        self.store_file(CHECKPOINT_FILE, bytes)
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        match std::fs::rename(
            self.dir.join(CHECKPOINT_FILE),
            self.dir.join(RETIRED_CHECKPOINT_FILE),
        ) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        }
        sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// A scatter read fills its buffers in order: within one file in as many `preadv` calls
    /// as it takes (more buffers than one call takes), across files piece by piece, and
    /// past the end of the log not at all.
    #[test]
    fn scatter_reads_fill_their_buffers_in_order() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open_with_span(dir.path(), 4 * MIB, 2 * MIB).unwrap();
        let data = pattern(3 * MIB as usize, 9);
        b.write_at(&data, 0).unwrap();
        for (offset, sizes) in [
            (100u64, vec![7usize; 3000]),
            (2 * MIB - 5000, vec![4096, 16, 4096, 1, 2000]),
        ] {
            let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
            let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|v| &mut v[..]).collect();
            b.read_vectored_at(&mut slices, offset).unwrap();
            let got: Vec<u8> = bufs.concat();
            let at = offset as usize;
            assert!(got == data[at..at + got.len()], "scatter read at {offset}");
        }
        let mut tail = [0u8; 64];
        assert!(b
            .read_vectored_at(&mut [&mut tail[..]], 4 * MIB - 32)
            .is_err());
    }

    #[test]
    fn a_log_larger_than_a_file_spans_several_and_keeps_them() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open_with_span(dir.path(), 5 * MIB, 2 * MIB).unwrap();
        assert_eq!(b.capacity(), 5 * MIB);
        let sizes = |n: usize| -> Vec<u64> {
            (0..n)
                .map(|k| {
                    std::fs::metadata(dir.path().join(LogFiles::name(k))).map_or(0, |m| m.len())
                })
                .collect()
        };
        assert_eq!(sizes(4), [2 * MIB, 2 * MIB, MIB, 0]);
        // A range across a file boundary is written, read and synced as one.
        let data = pattern(3000, 7);
        b.write_at(&data, 2 * MIB - 1000).unwrap();
        b.sync().unwrap();
        let mut back = vec![0; 3000];
        b.read_at(&mut back, 2 * MIB - 1000).unwrap();
        assert_eq!(back, data);
        b.allocate(4 * MIB - 4096, 8192).unwrap();
        b.discard(4 * MIB - 4096, 8192).unwrap();
        assert!(
            b.read_at(&mut back, 5 * MIB - 100).is_err(),
            "beyond the log"
        );
        drop(b);
        // Reopened with no capacity asked: the files say how large the log is; then grown.
        let b = FileBackend::open_with_span(dir.path(), 0, 2 * MIB).unwrap();
        assert_eq!(b.capacity(), 5 * MIB);
        let mut back = vec![0; 1000];
        b.read_at(&mut back, 2 * MIB).unwrap();
        assert_eq!(back, data[1000..2000]);
        drop(b);
        let b = FileBackend::open_with_span(dir.path(), 7 * MIB, 2 * MIB).unwrap();
        assert_eq!(b.capacity(), 7 * MIB);
        assert_eq!(sizes(5), [2 * MIB, 2 * MIB, 2 * MIB, MIB, 0]);
        b.write_at(&data, 7 * MIB - 3000).unwrap();
        b.sync().unwrap();
        let mut back = vec![0; 3000];
        b.read_at(&mut back, 7 * MIB - 3000).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_log_made_as_one_file_larger_than_the_span_stays_one_file() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        drop(FileBackend::open_with_span(dir.path(), 5 * MIB, u64::MAX).unwrap());
        let b = FileBackend::open_with_span(dir.path(), 0, 2 * MIB).unwrap();
        assert_eq!(b.capacity(), 5 * MIB);
        let data = pattern(8192, 3);
        b.write_at(&data, 3 * MIB).unwrap();
        let mut back = vec![0; 8192];
        b.read_at(&mut back, 3 * MIB).unwrap();
        assert_eq!(back, data);
        assert!(!dir.path().join(LogFiles::name(1)).exists());
        assert_eq!(
            std::fs::metadata(dir.path().join("log")).unwrap().len(),
            5 * MIB
        );
    }

    /// A range written ahead reads as zeros and, once synced, is written blocks (data to
    /// SEEK_DATA, where fallocated but unwritten blocks are a hole on ext4), so a later
    /// append's sync has only its data to write.
    #[test]
    fn a_range_written_ahead_is_written_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open(dir.path(), 64 << 20).unwrap();
        b.allocate(8 << 20, 4 << 20).unwrap();
        b.write_at(&pattern(4096, 3), (8 << 20) + 4096).unwrap();
        b.write_ahead(8 << 20, 4 << 20).unwrap();
        b.sync_written_ahead(8 << 20, 4 << 20).unwrap();
        let mut back = vec![1u8; 4 << 20];
        b.read_at(&mut back, 8 << 20).unwrap();
        assert!(back.iter().all(|&x| x == 0));
        let data = data_extents(&b.log.files[0]).unwrap();
        assert!(
            data.iter()
                .any(|&(at, len)| at <= 8 << 20 && at + len >= 12 << 20),
            "not all written: {data:?}"
        );
    }

    #[test]
    fn a_log_file_missing_in_the_middle_is_refused() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        drop(FileBackend::open_with_span(dir.path(), 5 * MIB, 2 * MIB).unwrap());
        std::fs::remove_file(dir.path().join(LogFiles::name(1))).unwrap();
        let e = FileBackend::open_with_span(dir.path(), 0, 2 * MIB)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("log.1 is missing"), "{e}");
    }
}
