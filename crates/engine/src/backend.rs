//! The narrow storage interface under the engine: one log area addressed by byte offset, plus
//! one atomically replaced checkpoint blob.
//!
//! [`FileBackend`] is what ships: a (sparse) log file and a checkpoint file in the array's data
//! directory. [`MemBackend`] is the test double that makes crash testing honest: it keeps the
//! bytes written apart from the bytes made durable, and a simulated crash keeps an arbitrary,
//! possibly torn, subset of what was not yet synced.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub trait Backend: Send + Sync {
    /// Size of the log area in bytes.
    fn capacity(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write; not durable until [`Backend::sync`] returns.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Reserve space for a range about to be written, so running out of space shows up here
    /// (ENOSPC) and not in the middle of a record.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Give a range's space back (its contents become undefined).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// The last stored checkpoint, if any.
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>>;
    /// Replace the checkpoint atomically and durably: after a crash, either the old or the new
    /// one is found, complete.
    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()>;
    /// Whether the storage can take `len` more bytes of log and still hold `keep` bytes more
    /// plus a new checkpoint. The engine asks before it takes space for new data, so that a
    /// full file system keeps room for what frees space: metadata records, a checkpoint, the
    /// collector. A backend that cannot tell answers yes (allocation then decides).
    fn has_room(&self, _len: u64, _keep: u64) -> bool {
        true
    }
}

/// The log in `<dir>/log` (sparse, `capacity` bytes) and the checkpoint in `<dir>/checkpoint`.
pub struct FileBackend {
    dir: PathBuf,
    log: File,
    capacity: u64,
    /// Size of the last checkpoint loaded or stored: a new one needs about as much room.
    checkpoint_len: AtomicU64,
}

/// Room [`FileBackend::has_room`] keeps beyond a checkpoint, for the file system's own
/// metadata and the array's small files.
const ROOM_SLACK: u64 = 1 << 20;

const LOG_FILE: &str = "log";
const CHECKPOINT_FILE: &str = "checkpoint";

impl FileBackend {
    /// Open or create the backend in `dir`; a new log file gets `capacity` bytes (sparse). An
    /// existing one keeps its size unless `capacity` is larger (growing the array).
    pub fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let len = log.metadata()?.len();
        if len < capacity {
            log.set_len(capacity)?;
            log.sync_all()?;
            sync_dir(dir)?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            capacity: capacity.max(len),
            log,
            checkpoint_len: AtomicU64::new(0),
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
        // SAFETY: plain syscall on an open descriptor we own.
        let rc = unsafe {
            libc::fallocate(
                self.log.as_raw_fd(),
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
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Backend for FileBackend {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.log.read_exact_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.log.write_all_at(data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.log.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(0, offset, len) {
            // File systems without fallocate: space shows up as ENOSPC on write instead.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            other => other,
        }
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

    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.dir.join(CHECKPOINT_FILE)) {
            Ok(bytes) => {
                self.checkpoint_len
                    .fetch_max(bytes.len() as u64, Ordering::Relaxed);
                Ok(Some(bytes))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.checkpoint_len
            .store(bytes.len() as u64, Ordering::Relaxed);
        let tmp = self.dir.join("checkpoint.tmp");
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
        std::fs::rename(&tmp, self.dir.join(CHECKPOINT_FILE))?;
        sync_dir(&self.dir)
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

/// In-memory backend separating written from durable bytes, with injectable faults.
pub struct MemBackend {
    inner: Mutex<MemInner>,
}

#[derive(Clone)]
struct MemInner {
    /// What reads see (all completed writes).
    current: Vec<u8>,
    /// What survives a crash for certain.
    durable: Vec<u8>,
    /// Writes since the last sync, oldest first.
    pending: Vec<(u64, Vec<u8>)>,
    checkpoint: Option<Vec<u8>>,
    /// Bytes of log space that may be allocated (simulates a full file system).
    space_limit: u64,
    allocated: std::collections::BTreeSet<u64>,
    allocation_unit: u64,
    fail_next_sync: bool,
    fail_reads_at: Option<(u64, u64)>,
}

impl MemBackend {
    pub fn new(capacity: u64) -> Self {
        Self {
            inner: Mutex::new(MemInner {
                current: vec![0; capacity as usize],
                durable: vec![0; capacity as usize],
                pending: Vec::new(),
                checkpoint: None,
                space_limit: u64::MAX,
                allocated: Default::default(),
                allocation_unit: 4096,
                fail_next_sync: false,
                fail_reads_at: None,
            }),
        }
    }

    /// Let the next sync fail with EIO (an fsync error).
    pub fn fail_next_sync(&self) {
        self.inner.lock().unwrap().fail_next_sync = true;
    }

    /// Make reads touching `offset..offset+len` fail with EIO.
    pub fn fail_reads(&self, offset: u64, len: u64) {
        self.inner.lock().unwrap().fail_reads_at = Some((offset, len));
    }

    /// Log space allocated now (allocation units in use).
    pub fn allocated_bytes(&self) -> u64 {
        let m = self.inner.lock().unwrap();
        m.allocated.len() as u64 * m.allocation_unit
    }

    /// Allow at most `bytes` of allocated log space, counted in `unit`-sized allocations.
    pub fn limit_space(&self, bytes: u64, unit: u64) {
        let mut m = self.inner.lock().unwrap();
        m.space_limit = bytes;
        m.allocation_unit = unit.max(1);
    }

    /// The state a power failure now would leave behind: durable bytes plus, for each write not
    /// yet synced, nothing, all of it, or a random subset of its 512-byte sectors (`choose`
    /// decides: it gets the write's index and sector count and returns a per-sector mask).
    pub fn crash(&self, mut choose: impl FnMut(usize, usize) -> Vec<bool>) -> MemBackend {
        let m = self.inner.lock().unwrap();
        let mut image = m.durable.clone();
        for (i, (offset, data)) in m.pending.iter().enumerate() {
            let sectors = data.len().div_ceil(512);
            let mask = choose(i, sectors);
            for (s, keep) in mask.iter().enumerate().take(sectors) {
                if *keep {
                    let a = s * 512;
                    let b = (a + 512).min(data.len());
                    let o = *offset as usize + a;
                    image[o..o + (b - a)].copy_from_slice(&data[a..b]);
                }
            }
        }
        MemBackend {
            inner: Mutex::new(MemInner {
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
                checkpoint: m.checkpoint.clone(),
                space_limit: m.space_limit,
                allocated: m.allocated.clone(),
                allocation_unit: m.allocation_unit,
                fail_next_sync: false,
                fail_reads_at: None,
            }),
        }
    }

    /// Number of writes not yet synced.
    pub fn pending_writes(&self) -> usize {
        self.inner.lock().unwrap().pending.len()
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected I/O error: {what}"))
}

fn range_check(capacity: usize, offset: u64, len: usize) -> io::Result<usize> {
    let o = usize::try_from(offset).map_err(|_| eio("offset"))?;
    match o.checked_add(len) {
        Some(end) if end <= capacity => Ok(o),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "access beyond the end of the log",
        )),
    }
}

impl Backend for MemBackend {
    fn capacity(&self) -> u64 {
        self.inner.lock().unwrap().current.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let m = self.inner.lock().unwrap();
        if let Some((o, l)) = m.fail_reads_at {
            if offset < o + l && o < offset + buf.len() as u64 {
                return Err(eio("read"));
            }
        }
        let o = range_check(m.current.len(), offset, buf.len())?;
        buf.copy_from_slice(&m.current[o..o + buf.len()]);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let o = range_check(m.current.len(), offset, data.len())?;
        m.current[o..o + data.len()].copy_from_slice(data);
        m.pending.push((offset, data.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        if std::mem::take(&mut m.fail_next_sync) {
            // Like Linux after a failed fsync: the dirty data may be gone for good.
            m.pending.clear();
            return Err(eio("sync"));
        }
        let pending = std::mem::take(&mut m.pending);
        for (offset, data) in pending {
            let o = offset as usize;
            m.durable[o..o + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        range_check(m.current.len(), offset, len as usize)?;
        let unit = m.allocation_unit;
        let first = offset / unit;
        let last = (offset + len).div_ceil(unit);
        let new: Vec<u64> = (first..last).filter(|u| !m.allocated.contains(u)).collect();
        if (m.allocated.len() + new.len()) as u64 * unit > m.space_limit {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        m.allocated.extend(new);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let o = range_check(m.current.len(), offset, len as usize)?;
        let zeros = vec![0u8; len as usize];
        m.current[o..o + len as usize].copy_from_slice(&zeros);
        m.pending.push((offset, zeros));
        let unit = m.allocation_unit;
        let (first, last) = (offset.div_ceil(unit), (offset + len) / unit);
        for u in first..last {
            m.allocated.remove(&u);
        }
        Ok(())
    }

    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self.inner.lock().unwrap().checkpoint.clone())
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.lock().unwrap().checkpoint = Some(bytes.to_vec());
        Ok(())
    }
}
