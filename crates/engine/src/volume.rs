//! `EngineVolume`: one engine volume seen through the `Volume` trait, in logical blocks.

use crate::engine::{ChunkState, Engine, EngineError};
use sliver_volume::{BlockStatus, ProvisioningState, Volume, VolumeError, VolumeSpace};
use std::sync::Arc;

pub struct EngineVolume {
    engine: Arc<Engine>,
    id: u32,
    block_size: u32,
    /// Snapshots are read-only.
    read_only: bool,
}

impl EngineVolume {
    /// `block_size` must divide the engine's chunk size (512 or 4096 with 4 KiB chunks).
    pub fn new(
        engine: Arc<Engine>,
        id: u32,
        block_size: u32,
        read_only: bool,
    ) -> Result<Self, EngineError> {
        if !block_size.is_power_of_two()
            || block_size < 512
            || !engine.chunk_size().is_multiple_of(block_size)
        {
            return Err(EngineError::Invalid(format!(
                "block size {block_size} does not divide the chunk size {}",
                engine.chunk_size()
            )));
        }
        engine.volume_size(id)?;
        Ok(Self {
            engine,
            id,
            block_size,
            read_only,
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    fn bytes(&self, lba: u64, blocks: u64) -> sliver_volume::Result<(u64, u64)> {
        self.check_range(lba, blocks)?;
        Ok((
            lba * self.block_size as u64,
            blocks * self.block_size as u64,
        ))
    }

    fn writable(&self) -> sliver_volume::Result<()> {
        if self.read_only {
            Err(VolumeError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn whole_blocks(&self, len: usize) -> sliver_volume::Result<u64> {
        if !len.is_multiple_of(self.block_size as usize) {
            return Err(VolumeError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "buffer is not a whole number of blocks",
            )));
        }
        Ok((len / self.block_size as usize) as u64)
    }
}

fn to_volume_error(e: EngineError) -> VolumeError {
    match e {
        EngineError::NoSpace => VolumeError::NoSpace,
        EngineError::Poisoned(why) => VolumeError::Poisoned(why),
        EngineError::Io(e) => VolumeError::Io(e),
        other => VolumeError::Io(std::io::Error::other(other.to_string())),
    }
}

impl EngineVolume {
    /// [`to_volume_error`] for a request starting at block `lba`: damaged data becomes
    /// [`VolumeError::Unreadable`] naming the first block of the request that it affects
    /// (the engine names the chunk, which may start before the request).
    fn request_error(&self, lba: u64) -> impl Fn(EngineError) -> VolumeError + '_ {
        move |e| match e {
            EngineError::Corrupt { offset, reason } => {
                let lba = (offset / self.block_size as u64).max(lba);
                tracing::error!(volume = self.id, lba, "unreadable data: {reason}");
                VolumeError::Unreadable { lba, reason }
            }
            other => to_volume_error(other),
        }
    }
}

impl Volume for EngineVolume {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.engine.volume_size(self.id).unwrap_or(0) / self.block_size as u64
    }

    fn physical_block_exponent(&self) -> u8 {
        (self.engine.chunk_size() / self.block_size).trailing_zeros() as u8
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<()> {
        let blocks = self.whole_blocks(buf.len())?;
        let (offset, _) = self.bytes(lba, blocks)?;
        self.engine
            .read(self.id, offset, buf)
            .map_err(self.request_error(lba))
    }

    fn read_cached(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<bool> {
        let blocks = self.whole_blocks(buf.len())?;
        let (offset, _) = self.bytes(lba, blocks)?;
        self.engine
            .read_cached(self.id, offset, buf)
            .map_err(self.request_error(lba))
    }

    fn write(&self, lba: u64, data: &[u8]) -> sliver_volume::Result<()> {
        self.writable()?;
        let blocks = self.whole_blocks(data.len())?;
        let (offset, _) = self.bytes(lba, blocks)?;
        self.engine
            .write(self.id, offset, data)
            .map_err(self.request_error(lba))
    }

    fn flush(&self) -> sliver_volume::Result<()> {
        self.engine.flush().map_err(to_volume_error)
    }

    fn flush_then(&self, done: Box<dyn FnOnce(sliver_volume::Result<()>) + Send>) {
        self.engine
            .flush_then(Box::new(move |r| done(r.map_err(to_volume_error))));
    }

    fn unmap(&self, lba: u64, blocks: u64) -> sliver_volume::Result<()> {
        self.writable()?;
        let (offset, len) = self.bytes(lba, blocks)?;
        self.engine
            .unmap(self.id, offset, len)
            .map_err(to_volume_error)
    }

    fn supports_anchor(&self) -> bool {
        true
    }

    fn anchor(&self, lba: u64, blocks: u64) -> sliver_volume::Result<()> {
        self.writable()?;
        let (offset, len) = self.bytes(lba, blocks)?;
        self.engine
            .anchor(self.id, offset, len)
            .map_err(to_volume_error)
    }

    /// Zeros are never stored: zeroing is unmapping, with or without the host asking for it.
    fn write_zeroes(&self, lba: u64, blocks: u64, _deallocate: bool) -> sliver_volume::Result<()> {
        self.unmap(lba, blocks)
    }

    fn copy_from(
        &self,
        source: &dyn Volume,
        src_lba: u64,
        dst_lba: u64,
        blocks: u64,
    ) -> sliver_volume::Result<()> {
        self.writable()?;
        let same_engine = source
            .as_any()
            .and_then(|a| a.downcast_ref::<EngineVolume>())
            .filter(|s| Arc::ptr_eq(&s.engine, &self.engine) && s.block_size == self.block_size);
        if let Some(src) = same_engine {
            let (src_offset, len) = src.bytes(src_lba, blocks)?;
            let (dst_offset, _) = self.bytes(dst_lba, blocks)?;
            if self
                .engine
                .copy(src.id, src_offset, self.id, dst_offset, len)
                .map_err(to_volume_error)?
            {
                return Ok(());
            }
        }
        sliver_volume::copy_by_data(self, source, src_lba, dst_lba, blocks)
    }

    /// One engine batch is applied all or nothing; an unaligned write may straddle one more
    /// chunk than an aligned one, so one chunk less than a batch is promised.
    fn max_atomic_write_bytes(&self) -> u64 {
        if self.read_only {
            return 0;
        }
        self.engine
            .atomic_write_limit()
            .saturating_sub(self.engine.chunk_size() as u64)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn block_status(&self, lba: u64) -> sliver_volume::Result<BlockStatus> {
        self.check_range(lba, 1)?;
        let per = (self.engine.chunk_size() / self.block_size) as u64;
        let (state, chunks) = self
            .engine
            .chunk_status(self.id, lba / per)
            .map_err(to_volume_error)?;
        let end = ((lba / per + chunks) * per).min(self.num_blocks());
        Ok(BlockStatus {
            state: match state {
                ChunkState::Mapped => ProvisioningState::Mapped,
                ChunkState::Deallocated => ProvisioningState::Deallocated,
                ChunkState::Anchored => ProvisioningState::Anchored,
            },
            blocks: end - lba,
        })
    }

    fn space(&self) -> sliver_volume::Result<VolumeSpace> {
        let u = self.engine.volume_usage(self.id).map_err(to_volume_error)?;
        let physical = u.unique_bytes + u.shared_bytes;
        Ok(VolumeSpace {
            provisioned_bytes: u.provisioned_bytes,
            mapped_bytes: u.mapped_bytes,
            unique_bytes: u.unique_bytes,
            shared_bytes: u.shared_bytes,
            data_reduction: if physical == 0 {
                1.0
            } else {
                u.mapped_bytes as f64 / physical as f64
            },
        })
    }
}
