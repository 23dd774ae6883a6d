//! The `Volume` trait: the only way the SCSI device server reaches storage.
//!
//! A volume is a thin array of logical blocks. The trait is synchronous and
//! blocking on purpose: engines stay free of any async runtime, and the server
//! runs device-server work on a blocking thread pool.
//!
//! All addresses are in logical blocks of [`Volume::block_size`] bytes. Callers
//! (the SCSI layer) validate ranges with checked arithmetic before calling;
//! implementations still check and return [`VolumeError::OutOfRange`] rather
//! than trusting them.

mod passthrough;

pub use passthrough::FileVolume;

use std::io;

/// Why a volume operation failed. The SCSI layer maps each variant to one sense code.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The range lies (partly) beyond the end of the volume.
    #[error("block range {lba}+{blocks} is beyond the end of the volume ({capacity} blocks)")]
    OutOfRange { lba: u64, blocks: u64, capacity: u64 },
    /// The write needs new physical space and the array has none left.
    #[error("out of space")]
    NoSpace,
    /// The volume does not accept writes (a snapshot).
    #[error("volume is read-only")]
    ReadOnly,
    /// A previous durability failure (failed fsync) makes every later write unsafe.
    #[error("volume is poisoned after an earlier I/O failure: {0}")]
    Poisoned(String),
    /// The backing store failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, VolumeError>;

/// Provisioning state of a run of blocks, as GET LBA STATUS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisioningState {
    /// Backed by storage; reads return what was written.
    Mapped,
    /// Not backed by storage; reads return zeros (LBPRZ).
    Deallocated,
    /// Not backed by storage but with space reserved for it (SBC anchored).
    Anchored,
}

/// A run of `blocks` consecutive blocks in one provisioning state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatus {
    pub state: ProvisioningState,
    pub blocks: u64,
}

/// A thin logical block device.
pub trait Volume: Send + Sync {
    /// Logical block size in bytes (512 or 4096).
    fn block_size(&self) -> u32;

    /// Number of logical blocks.
    fn num_blocks(&self) -> u64;

    /// log2(physical block size / logical block size), for READ CAPACITY(16).
    fn physical_block_exponent(&self) -> u8 {
        0
    }

    /// Read `buf.len() / block_size` blocks starting at `lba`. Unwritten blocks read as zeros.
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()>;

    /// Write whole blocks starting at `lba`. The data may sit in a volatile cache until [`flush`].
    ///
    /// [`flush`]: Volume::flush
    fn write(&self, lba: u64, data: &[u8]) -> Result<()>;

    /// Write and make durable before returning (FUA).
    fn write_durable(&self, lba: u64, data: &[u8]) -> Result<()> {
        self.write(lba, data)?;
        self.flush()
    }

    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;

    /// Deallocate `blocks` blocks at `lba`; they read back as zeros afterwards.
    fn unmap(&self, lba: u64, blocks: u64) -> Result<()>;

    /// Make `blocks` blocks at `lba` read as zeros. With `deallocate` the volume may (and a
    /// thin volume should) release their space; without it the blocks stay mapped.
    fn write_zeroes(&self, lba: u64, blocks: u64, deallocate: bool) -> Result<()> {
        if deallocate {
            return self.unmap(lba, blocks);
        }
        let bs = self.block_size() as u64;
        let step = (1 << 20) / bs;
        let zeros = vec![0u8; (step * bs) as usize];
        let mut done = 0;
        while done < blocks {
            let n = step.min(blocks - done);
            self.write(lba + done, &zeros[..(n * bs) as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Provisioning state of the run of blocks starting at `lba` (which must be in range).
    fn block_status(&self, lba: u64) -> Result<BlockStatus>;

    /// Check that `lba + blocks` lies inside the volume.
    fn check_range(&self, lba: u64, blocks: u64) -> Result<()> {
        let capacity = self.num_blocks();
        match lba.checked_add(blocks) {
            Some(end) if end <= capacity => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                lba,
                blocks,
                capacity,
            }),
        }
    }
}
