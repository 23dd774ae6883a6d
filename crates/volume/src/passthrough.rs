//! The passthrough volume: a plain file (sparse where the file system allows) or block device.
//!
//! UNMAP punches holes (`fallocate(PUNCH_HOLE | KEEP_SIZE)`) so space really returns to the file
//! system; where that is not supported it writes zeros, which keeps the LBPRZ promise. Provisioning state comes from `SEEK_DATA`/`SEEK_HOLE`.
//! If the file system cannot punch holes the error is reported, never swallowed.

use crate::{BlockStatus, ProvisioningState, Result, Volume, VolumeError, VolumeSpace};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// A volume stored in one file, byte for byte.
pub struct FileVolume {
    file: File,
    block_size: u32,
    num_blocks: u64,
    /// Set when an fsync failed: the page cache may have dropped dirty data, so nothing later
    /// can be promised durable. Writes and flushes fail from then on.
    poisoned: AtomicBool,
}

impl FileVolume {
    /// Open `path`, creating it as a sparse file of `size_bytes` if it does not exist.
    /// An existing file keeps its size; `size_bytes` is then only used if the file is empty.
    pub fn open(path: &Path, size_bytes: u64, block_size: u32) -> Result<Self> {
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(VolumeError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid block size {block_size}"),
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut len = file.metadata()?.len();
        if len == 0 {
            file.set_len(size_bytes)?;
            file.sync_all()?;
            len = size_bytes;
        }
        Ok(Self {
            file,
            block_size,
            num_blocks: len / block_size as u64,
            poisoned: AtomicBool::new(false),
        })
    }

    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(VolumeError::Poisoned("an earlier fsync failed".into()));
        }
        Ok(())
    }

    fn byte_range(&self, lba: u64, bytes: usize) -> Result<u64> {
        let bs = self.block_size as u64;
        let blocks = bytes as u64 / bs;
        if !(bytes as u64).is_multiple_of(bs) {
            return Err(VolumeError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "buffer is not a whole number of blocks",
            )));
        }
        self.check_range(lba, blocks)?;
        Ok(lba * bs)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on an owned descriptor; the shared file offset is not used elsewhere
        // (all data I/O is positional).
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
        if rc >= 0 {
            return Ok(Some(rc as u64));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        }
    }
}

impl Volume for FileVolume {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    /// File systems allocate and punch holes in 4 KiB pages: report 4 KiB physical blocks so
    /// hosts align I/O and discards to them (512e).
    fn physical_block_exponent(&self) -> u8 {
        (4096u32 / self.block_size).max(1).trailing_zeros() as u8
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let off = self.byte_range(lba, buf.len())?;
        self.file.read_exact_at(buf, off)?;
        Ok(())
    }

    fn write(&self, lba: u64, data: &[u8]) -> Result<()> {
        self.check_poisoned()?;
        let off = self.byte_range(lba, data.len())?;
        self.file.write_all_at(data, off)?;
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.check_poisoned()?;
        if let Err(e) = self.file.sync_data() {
            self.poisoned.store(true, Ordering::Release);
            return Err(VolumeError::Poisoned(format!("fsync failed: {e}")));
        }
        Ok(())
    }

    fn unmap(&self, lba: u64, blocks: u64) -> Result<()> {
        self.check_poisoned()?;
        self.check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let bs = self.block_size as u64;
        match self.punch_hole(lba * bs, blocks * bs) {
            Ok(()) => Ok(()),
            // Not a regular file on a hole-capable file system: zero instead, so reads still
            // return zeros as READ CAPACITY's LBPRZ promises.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.write_zeroes(lba, blocks, false)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn block_status(&self, lba: u64) -> Result<BlockStatus> {
        self.check_range(lba, 1)?;
        let bs = self.block_size as u64;
        let end = self.num_blocks * bs;
        let off = lba * bs;
        let data = self.seek(off, libc::SEEK_DATA)?.unwrap_or(end).min(end);
        if data > off {
            // A hole from `off` up to the next data, rounded down to whole blocks; partial-block
            // holes count as mapped since the block still holds data.
            let blocks = (data - off) / bs;
            if blocks > 0 {
                return Ok(BlockStatus {
                    state: ProvisioningState::Deallocated,
                    blocks,
                });
            }
        }
        let hole = self.seek(off, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
        let blocks = (hole.div_ceil(bs)).saturating_sub(lba).max(1);
        Ok(BlockStatus {
            state: ProvisioningState::Mapped,
            blocks,
        })
    }

    /// A passthrough file stores data as is: its data extents are both mapped and physical,
    /// and nothing is shared or reduced. Extents come from `SEEK_DATA`/`SEEK_HOLE`, not
    /// `st_blocks`, which also counts the file system's own extent-tree blocks.
    fn space(&self) -> Result<VolumeSpace> {
        let provisioned = self.num_blocks * self.block_size as u64;
        let mut allocated = 0u64;
        let mut offset = 0u64;
        while offset < provisioned {
            let Some(data) = self.seek(offset, libc::SEEK_DATA)? else {
                break;
            };
            if data >= provisioned {
                break;
            }
            let hole = self
                .seek(data, libc::SEEK_HOLE)?
                .unwrap_or(provisioned)
                .min(provisioned);
            allocated += hole.saturating_sub(data);
            offset = hole.max(data + 1);
        }
        Ok(VolumeSpace {
            provisioned_bytes: provisioned,
            mapped_bytes: allocated,
            unique_bytes: allocated,
            shared_bytes: 0,
            data_reduction: 1.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_unmap_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let v = FileVolume::open(&dir.path().join("v"), 64 << 20, 512).unwrap();
        assert_eq!(v.num_blocks(), (64 << 20) / 512);
        let data = vec![0xabu8; 8192];
        v.write(100, &data).unwrap();
        let mut buf = vec![0u8; 8192];
        v.read(100, &mut buf).unwrap();
        assert_eq!(buf, data);
        v.flush().unwrap();
        v.unmap(100, 16).unwrap();
        v.read(100, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn out_of_range_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let v = FileVolume::open(&dir.path().join("v"), 1 << 20, 512).unwrap();
        let mut buf = vec![0u8; 1024];
        assert!(matches!(
            v.read(2047, &mut buf),
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            v.unmap(u64::MAX, 2),
            Err(VolumeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn block_status_reports_holes_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let v = FileVolume::open(&dir.path().join("v"), 16 << 20, 512).unwrap();
        let st = v.block_status(0).unwrap();
        assert_eq!(st.state, ProvisioningState::Deallocated);
        assert_eq!(st.blocks, v.num_blocks());
        // Write 1 MiB at 4 MiB: file systems allocate at least whole fs blocks.
        v.write(8192, &vec![1u8; 1 << 20]).unwrap();
        let st = v.block_status(8192).unwrap();
        assert_eq!(st.state, ProvisioningState::Mapped);
        assert!(st.blocks >= 2048, "{st:?}");
        let st = v.block_status(0).unwrap();
        assert_eq!(st.state, ProvisioningState::Deallocated);
        assert!(st.blocks <= 8192);
        v.unmap(8192, 2048).unwrap();
        assert_eq!(
            v.block_status(8192).unwrap().state,
            ProvisioningState::Deallocated
        );
    }
}
