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

pub mod answers;
mod passthrough;

pub use passthrough::FileVolume;

use std::io;

/// A buffer of `len` zero bytes for data about to be read into it, zeroed by writing rather
/// than allocated zeroed. `vec![0; len]` asks the allocator for zeroed memory, and jemalloc
/// (sliver's allocator) zeroes a reused block of that size by discarding its pages
/// (`MADV_DONTNEED`): every 1 MiB read then faulted 256 fresh pages in, a sixth of a core
/// on sequential reads. Writing zeros into a block in use costs far less.
// Clippy's `slow_vector_initialization` advises exactly the allocation this avoids.
#[allow(clippy::slow_vector_initialization)]
pub fn io_buffer(len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(len);
    buf.resize(len, 0);
    buf
}

/// The soft thresholds a pool accepts, as a share of its capacity in use: from 1 % (below
/// that every write would report it) to 1 (never raised). The API, the configuration file and
/// MODE SELECT all take this range.
pub const SOFT_THRESHOLD_RANGE: std::ops::RangeInclusive<f64> = 0.01..=1.0;

/// The pool behind volumes: what belongs to it rather than to one volume (its free space, its
/// thin-provisioning soft threshold). One owner keeps its settings: the array applies them to
/// its engine and persists them, whichever way they change (the API, the configuration file,
/// MODE SELECT), so a change from any of them survives a restart and is seen by every volume
/// of the pool. A volume without a pool (a passthrough file) has none of this.
pub trait Pool: Send + Sync {
    /// Whether the pool has crossed its soft threshold. Called for every command: must be
    /// cheap.
    fn soft_threshold_exceeded(&self) -> bool;

    /// Bytes the pool can still allocate.
    fn available_bytes(&self) -> u64;

    /// (share of capacity in use that raises the soft threshold, pool capacity in bytes).
    fn soft_threshold(&self) -> (f64, u64);

    /// Change the soft threshold and keep it; `share` must lie in [`SOFT_THRESHOLD_RANGE`].
    fn set_soft_threshold(&self, share: f64) -> std::result::Result<(), SettingError>;
}

/// Why a pool setting was not changed.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    #[error("soft threshold {0} is not between 0.01 and 1")]
    SoftThresholdOutOfRange(f64),
    /// Valid, but it could not be kept (the configuration could not be written).
    #[error("the setting could not be kept: {0}")]
    NotKept(String),
}

/// Why a volume operation failed. The SCSI layer maps each variant to one sense code.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The range lies (partly) beyond the end of the volume.
    #[error("block range {lba}+{blocks} is beyond the end of the volume ({capacity} blocks)")]
    OutOfRange {
        lba: u64,
        blocks: u64,
        capacity: u64,
    },
    /// The write needs new physical space and the array has none left.
    #[error("out of space")]
    NoSpace,
    /// The volume does not accept writes (a snapshot).
    #[error("volume is read-only")]
    ReadOnly,
    /// A previous durability failure (failed fsync) makes every later write unsafe.
    #[error("volume is poisoned after an earlier I/O failure: {0}")]
    Poisoned(String),
    /// Stored data of the request cannot be read back (a failed read of the medium, a bad
    /// checksum); `lba` is the first block affected, which hosts use to fail only the
    /// blocks from there on.
    #[error("block {lba} is unreadable: {reason}")]
    Unreadable { lba: u64, reason: String },
    /// The backing store failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, VolumeError>;

/// Bytes moved per read/write pair by the default [`Volume::copy_from`].
const COPY_CHUNK_BYTES: u64 = 1 << 20;

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

/// Space figures of one volume, in bytes (see docs/design.md, "Space accounting").
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VolumeSpace {
    /// Size the host sees.
    pub provisioned_bytes: u64,
    /// Logical bytes the host has written and not unmapped (zero data excluded where the
    /// volume eliminates zeros).
    pub mapped_bytes: u64,
    /// Physical bytes that deleting this volume alone would free (data nothing else references).
    pub unique_bytes: u64,
    /// Physical bytes referenced by this volume and by others (snapshots, clones, dedup).
    pub shared_bytes: u64,
    /// mapped_bytes / physical bytes referenced (dedup x compression); 1.0 when nothing is stored.
    pub data_reduction: f64,
}

impl VolumeSpace {
    /// Share of the volume never written (FlashArray's "thin provisioning"), 0..1.
    pub fn thin_provisioning(&self) -> f64 {
        if self.provisioned_bytes == 0 {
            return 0.0;
        }
        1.0 - (self.mapped_bytes.min(self.provisioned_bytes) as f64 / self.provisioned_bytes as f64)
    }
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

    /// [`Volume::read`] if it can be done without waiting for a device: `Ok(true)` when `buf`
    /// was filled, `Ok(false)` when the read would wait (then `buf` holds nothing useful and
    /// the caller reads with [`Volume::read`] on a thread that may wait). A transport runs
    /// such reads on the thread that received them; by default every read would wait.
    fn read_cached(&self, _lba: u64, _buf: &mut [u8]) -> Result<bool> {
        Ok(false)
    }

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

    /// Run `done` once every write completed before this call is durable, with what
    /// [`Volume::flush`] would have returned. A volume that can wait without holding the
    /// caller's thread (the engine's group commit) runs `done` later, on a thread of its own,
    /// so a transport answers write-through commands without a thread waiting for each
    /// sync; by default this flushes here and runs `done` before returning. A volume that
    /// answers many `done` after one sync answers them as one round ([`answers::in_round`]);
    /// answers of a volume shutting down may come outside a round.
    fn flush_then(&self, done: Box<dyn FnOnce(Result<()>) + Send>) {
        done(self.flush())
    }

    /// Deallocate `blocks` blocks at `lba`; they read back as zeros afterwards.
    fn unmap(&self, lba: u64, blocks: u64) -> Result<()>;

    /// Whether the volume keeps anchored blocks ([`Volume::anchor`]; VPD 0xB2 ANC_SUP).
    fn supports_anchor(&self) -> bool {
        false
    }

    /// Anchor `blocks` blocks at `lba` (SBC ANCHOR): they read back as zeros, like unmapped
    /// blocks, but keep space held so a later write of them does not run out of it. Fails
    /// with [`VolumeError::NoSpace`] when that space is not free.
    fn anchor(&self, _lba: u64, _blocks: u64) -> Result<()> {
        Err(VolumeError::Io(io::Error::from(io::ErrorKind::Unsupported)))
    }

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

    /// Copy `blocks` blocks from `source` at `src_lba` to this volume at `dst_lba`. Engines that
    /// share data override this to copy by reference; the default reads and writes in bounded
    /// chunks. `source` may be this very volume, with overlapping ranges: the result is then as
    /// if the source range had been read completely before the first write (a memmove).
    fn copy_from(
        &self,
        source: &dyn Volume,
        src_lba: u64,
        dst_lba: u64,
        blocks: u64,
    ) -> Result<()> {
        copy_by_data(self, source, src_lba, dst_lba, blocks)
    }

    /// The concrete type, so an engine can recognise its own volumes (copy by reference).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Provisioning state of the run of blocks starting at `lba` (which must be in range).
    fn block_status(&self, lba: u64) -> Result<BlockStatus>;

    /// Largest write in bytes the volume applies all or nothing, even across a crash, and
    /// atomically against concurrent writes (WRITE ATOMIC); 0 when it cannot promise that.
    fn max_atomic_write_bytes(&self) -> u64 {
        0
    }

    /// Current space figures. Engines compute them from metadata; this may walk the volume's
    /// map, so callers poll it at human rates (API, metrics scrape), not per command.
    fn space(&self) -> Result<VolumeSpace>;

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

/// Copy blocks by reading and writing them in bounded chunks: [`Volume::copy_from`]'s default,
/// and the fallback of engines when a copy cannot be done by reference.
pub fn copy_by_data<V: Volume + ?Sized>(
    dst: &V,
    source: &dyn Volume,
    src_lba: u64,
    dst_lba: u64,
    blocks: u64,
) -> Result<()> {
    let bs = dst.block_size();
    if source.block_size() != bs {
        return Err(VolumeError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "copy between volumes of different block sizes",
        )));
    }
    source.check_range(src_lba, blocks)?;
    dst.check_range(dst_lba, blocks)?;
    let bs = bs.max(1) as u64;
    let step = (COPY_CHUNK_BYTES / bs).max(1);
    let same_volume = std::ptr::addr_eq(source as *const dyn Volume, dst as *const V);
    // Copying forwards into an overlapping range further up would read blocks it already
    // overwrote; walk backwards then. (The range checks above bound every sum below.)
    let backwards = same_volume && dst_lba > src_lba && dst_lba < src_lba + blocks;
    let mut buffer = vec![0u8; (step.min(blocks) * bs) as usize];
    let mut done = 0;
    while done < blocks {
        let n = step.min(blocks - done);
        let offset = if backwards { blocks - done - n } else { done };
        let chunk = &mut buffer[..(n * bs) as usize];
        source.read(src_lba + offset, chunk)?;
        dst.write(dst_lba + offset, chunk)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(dir: &tempfile::TempDir, name: &str, blocks: u64) -> FileVolume {
        FileVolume::open(&dir.path().join(name), blocks * 512, 512).unwrap()
    }

    fn pattern(blocks: usize) -> Vec<u8> {
        (0..blocks * 512).map(|i| (i / 512 + 1) as u8).collect()
    }

    #[test]
    fn copy_between_volumes_spans_several_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (volume(&dir, "a", 8192), volume(&dir, "b", 8192));
        let blocks = 4100; // more than two 1 MiB chunks, not a multiple of one
        let data: Vec<u8> = (0..blocks * 512).map(|i| (i % 253) as u8).collect();
        a.write(3, &data).unwrap();
        b.copy_from(&a, 3, 4000, blocks as u64).unwrap();
        let mut back = vec![0u8; data.len()];
        b.read(4000, &mut back).unwrap();
        assert!(back == data);
    }

    #[test]
    fn overlapping_copy_within_a_volume_behaves_like_memmove() {
        let dir = tempfile::tempdir().unwrap();
        let v = volume(&dir, "v", 8192);
        let blocks = 3000;
        let data = pattern(blocks);
        for (src, dst) in [(0u64, 100u64), (100, 0)] {
            v.write(src, &data).unwrap();
            v.copy_from(&v, src, dst, blocks as u64).unwrap();
            let mut back = vec![0u8; data.len()];
            v.read(dst, &mut back).unwrap();
            assert!(back == data, "src {src} dst {dst}");
        }
    }

    #[test]
    fn copy_checks_both_ranges_and_block_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (volume(&dir, "a", 64), volume(&dir, "b", 32));
        assert!(matches!(
            b.copy_from(&a, 41, 0, 24),
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            b.copy_from(&a, 0, 16, 17),
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            b.copy_from(&a, u64::MAX, 0, 2),
            Err(VolumeError::OutOfRange { .. })
        ));
        let big = FileVolume::open(&dir.path().join("c"), 64 * 4096, 4096).unwrap();
        assert!(matches!(
            b.copy_from(&big, 0, 0, 1),
            Err(VolumeError::Io(_))
        ));
        b.copy_from(&a, 64, 32, 0).unwrap();
    }
}
