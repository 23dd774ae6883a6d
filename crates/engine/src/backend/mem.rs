//! [`MemBackend`]: the test double that makes crash testing honest. It keeps the bytes written
//! apart from the bytes made durable, and a simulated crash keeps an arbitrary, possibly torn,
//! subset of what was not yet synced, in both areas; faults can be injected.

use super::{FormatTwoCheckpoint, LogDevice, MetaArea, RootStore};
use std::io;
use std::sync::Mutex;

/// In-memory backend separating written from durable bytes, with injectable faults.
pub struct MemBackend {
    inner: Mutex<MemInner>,
}

/// The log area (index 0) and the metadata area (index 1) of a [`MemBackend`].
const LOG: usize = 0;
const META: usize = 1;

#[derive(Clone, Default)]
struct Area {
    /// What reads see (all completed writes).
    current: Vec<u8>,
    /// What survives a crash for certain.
    durable: Vec<u8>,
}

#[derive(Clone)]
struct MemInner {
    areas: [Area; 2],
    /// Writes since the last sync of their area, oldest first: (area, offset, bytes).
    pending: Vec<(usize, u64, Vec<u8>)>,
    root: Option<Vec<u8>>,
    checkpoint: Option<Vec<u8>>,
    /// Bytes of log space that may be allocated (simulates a full file system).
    space_limit: u64,
    allocated: std::collections::BTreeSet<u64>,
    allocation_unit: u64,
    /// Bytes the metadata area may grow to (simulates a full file system for it).
    meta_limit: u64,
    fail_next_sync: bool,
    fail_next_root: bool,
    /// Bytes [`LogDevice::write_ahead`] wrote so far.
    written_ahead: u64,
    fail_reads_at: Option<(u64, u64)>,
    /// Reads `fail_reads_at` failed so far.
    reads_failed: u64,
}

impl MemBackend {
    pub fn new(capacity: u64) -> Self {
        let log = Area {
            current: vec![0; capacity as usize],
            durable: vec![0; capacity as usize],
        };
        Self {
            inner: Mutex::new(MemInner {
                areas: [log, Area::default()],
                pending: Vec::new(),
                root: None,
                checkpoint: None,
                space_limit: u64::MAX,
                allocated: Default::default(),
                allocation_unit: 4096,
                meta_limit: u64::MAX,
                fail_next_sync: false,
                fail_next_root: false,
                written_ahead: 0,
                fail_reads_at: None,
                reads_failed: 0,
            }),
        }
    }

    /// Let the next root store fail with ENOSPC (a full file system), leaving the old root.
    pub fn fail_next_root(&self) {
        self.inner.lock().unwrap().fail_next_root = true;
    }

    /// Let the next sync (of either area) fail with EIO (an fsync error).
    pub fn fail_next_sync(&self) {
        self.inner.lock().unwrap().fail_next_sync = true;
    }

    /// Make log reads touching `offset..offset+len` fail with EIO.
    pub fn fail_reads(&self, offset: u64, len: u64) {
        self.inner.lock().unwrap().fail_reads_at = Some((offset, len));
    }

    /// Reads that [`MemBackend::fail_reads`] made fail so far.
    pub fn reads_failed(&self) -> u64 {
        self.inner.lock().unwrap().reads_failed
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

    /// Let the metadata area grow to at most `bytes` (writes beyond fail with ENOSPC).
    pub fn limit_meta(&self, bytes: u64) {
        self.inner.lock().unwrap().meta_limit = bytes;
    }

    /// Bytes of the metadata area written so far (its size).
    pub fn meta_bytes(&self) -> u64 {
        self.inner.lock().unwrap().areas[META].current.len() as u64
    }

    /// Flip one byte of the metadata area as it is now and after a crash (damage).
    pub fn corrupt_meta(&self, offset: u64) {
        let mut m = self.inner.lock().unwrap();
        let Area { current, durable } = &mut m.areas[META];
        for area in [current, durable] {
            if let Some(b) = area.get_mut(offset as usize) {
                *b ^= 0x5a;
            }
        }
    }

    /// The state a power failure now would leave behind: durable bytes plus, for each write not
    /// yet synced (log and metadata areas alike, in the order they were issued), nothing, all
    /// of it, or a random subset of its 512-byte sectors (`choose` decides: it gets the write's
    /// index and sector count and returns a per-sector mask).
    pub fn crash(&self, mut choose: impl FnMut(usize, usize) -> Vec<bool>) -> MemBackend {
        let m = self.inner.lock().unwrap();
        let mut images = [m.areas[LOG].durable.clone(), m.areas[META].durable.clone()];
        for (i, (area, offset, data)) in m.pending.iter().enumerate() {
            let sectors = data.len().div_ceil(512);
            let mask = choose(i, sectors);
            let image = &mut images[*area];
            for (s, keep) in mask.iter().enumerate().take(sectors) {
                if *keep {
                    let a = s * 512;
                    let b = (a + 512).min(data.len());
                    let o = *offset as usize + a;
                    if image.len() < o + (b - a) {
                        image.resize(o + (b - a), 0);
                    }
                    image[o..o + (b - a)].copy_from_slice(&data[a..b]);
                }
            }
        }
        let [log, meta] = images;
        MemBackend {
            inner: Mutex::new(MemInner {
                areas: [
                    Area {
                        current: log.clone(),
                        durable: log,
                    },
                    Area {
                        current: meta.clone(),
                        durable: meta,
                    },
                ],
                pending: Vec::new(),
                root: m.root.clone(),
                checkpoint: m.checkpoint.clone(),
                space_limit: m.space_limit,
                allocated: m.allocated.clone(),
                allocation_unit: m.allocation_unit,
                meta_limit: m.meta_limit,
                fail_next_sync: false,
                fail_next_root: false,
                written_ahead: 0,
                fail_reads_at: None,
                reads_failed: 0,
            }),
        }
    }

    /// Bytes written ahead ([`LogDevice::write_ahead`]) so far.
    pub fn written_ahead(&self) -> u64 {
        self.inner.lock().unwrap().written_ahead
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

impl MemInner {
    /// Move the pending writes of `area` to its durable image; EIO when a failure was
    /// injected (the pending writes of that area are then lost, as after a failed fsync).
    fn sync(&mut self, area: usize) -> io::Result<()> {
        let fail = std::mem::take(&mut self.fail_next_sync);
        let pending = std::mem::take(&mut self.pending);
        let (mine, others): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.0 == area);
        self.pending = others;
        if fail {
            // Like Linux after a failed fsync: the dirty data may be gone for good.
            return Err(eio("sync"));
        }
        let durable = &mut self.areas[area].durable;
        for (_, offset, data) in mine {
            let o = offset as usize;
            if durable.len() < o + data.len() {
                durable.resize(o + data.len(), 0);
            }
            durable[o..o + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
}

impl LogDevice for MemBackend {
    fn capacity(&self) -> u64 {
        self.inner.lock().unwrap().areas[LOG].current.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        if let Some((o, l)) = m.fail_reads_at {
            if offset < o + l && o < offset + buf.len() as u64 {
                m.reads_failed += 1;
                return Err(eio("read"));
            }
        }
        let log = &m.areas[LOG].current;
        let o = range_check(log.len(), offset, buf.len())?;
        buf.copy_from_slice(&log[o..o + buf.len()]);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let log = &mut m.areas[LOG].current;
        let o = range_check(log.len(), offset, data.len())?;
        log[o..o + data.len()].copy_from_slice(data);
        m.pending.push((LOG, offset, data.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.lock().unwrap().sync(LOG)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        range_check(m.areas[LOG].current.len(), offset, len as usize)?;
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

    /// Zeros, written but not synced: a simulated crash keeps any (torn) part of them.
    fn write_ahead(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_at(&vec![0u8; len as usize], offset)?;
        self.inner.lock().unwrap().written_ahead += len;
        Ok(())
    }

    /// Syncs the log as a file description of its own would: an injected failure loses the
    /// unsynced writes and is reported here, and again by the log's next [`LogDevice::sync`].
    fn sync_written_ahead(&self, _offset: u64, _len: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let failing = m.fail_next_sync;
        let result = m.sync(LOG);
        // `sync` consumed the failure: the log's own description has not seen it yet.
        m.fail_next_sync = failing;
        result
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let log = &mut m.areas[LOG].current;
        let o = range_check(log.len(), offset, len as usize)?;
        let zeros = vec![0u8; len as usize];
        log[o..o + len as usize].copy_from_slice(&zeros);
        m.pending.push((LOG, offset, zeros));
        let unit = m.allocation_unit;
        let (first, last) = (offset.div_ceil(unit), (offset + len) / unit);
        for u in first..last {
            m.allocated.remove(&u);
        }
        Ok(())
    }
}

impl MetaArea for MemBackend {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let m = self.inner.lock().unwrap();
        let meta = &m.areas[META].current;
        let from = (offset as usize).min(meta.len());
        let n = buf.len().min(meta.len() - from);
        buf[..n].copy_from_slice(&meta[from..from + n]);
        buf[n..].fill(0);
        Ok(())
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        let end = offset as usize + data.len();
        if end as u64 > m.meta_limit {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let meta = &mut m.areas[META].current;
        if meta.len() < end {
            meta.resize(end, 0);
        }
        meta[offset as usize..end].copy_from_slice(data);
        m.pending.push((META, offset, data.to_vec()));
        Ok(())
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.inner.lock().unwrap().sync(META)
    }
}

impl RootStore for MemBackend {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self.inner.lock().unwrap().root.clone())
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        let mut m = self.inner.lock().unwrap();
        if std::mem::take(&mut m.fail_next_root) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        m.root = Some(bytes.to_vec());
        Ok(())
    }
}

impl FormatTwoCheckpoint for MemBackend {
    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self.inner.lock().unwrap().checkpoint.clone())
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.lock().unwrap().checkpoint = Some(bytes.to_vec());
        Ok(())
    }

    fn retire_checkpoint(&self) -> io::Result<()> {
        self.inner.lock().unwrap().checkpoint = None;
        Ok(())
    }
}
