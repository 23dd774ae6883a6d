//! The limits the LU advertises (Block Limits VPD page, Logical Block Provisioning) and
//! enforces: transfer sizes, COMPARE AND WRITE, UNMAP and WRITE SAME bounds, the granularity
//! of reclaim and of thresholds. Every family reads them from here, below the LU.

/// Largest READ/WRITE we accept, in bytes. libiscsi writes 65536 blocks of 512 bytes in one
/// command; anything larger only costs memory per command.
pub(crate) const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// OPTIMAL TRANSFER LENGTH: 4 MiB, LIO's default and ESXi's default XCOPY size. Hosts size
/// their requests by it: Linux makes it max_sectors_kb and io_opt, and `qemu-img convert`
/// copies in pieces of max(2 MiB, this), so with copy offload it sends one EXTENDED COPY per
/// 4 MiB instead of per 2 MiB, halving a clone's round trips (docs/benchmarks.md, Clone).
pub(crate) const OPTIMAL_TRANSFER_BYTES: u64 = 4 << 20;
/// MAXIMUM COMPARE AND WRITE LENGTH (the NUMBER OF LOGICAL BLOCKS field is one byte).
pub(crate) const MAX_COMPARE_AND_WRITE_BLOCKS: u64 = 255;
/// MAXIMUM UNMAP LBA COUNT: FFFF_FFFFh, no limit (deallocation costs no data movement).
pub(crate) const MAX_UNMAP_BLOCKS: u64 = u32::MAX as u64;
/// MAXIMUM WRITE SAME LENGTH: bounds the work of one command writing a non-zero pattern.
pub(crate) const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 22;
/// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
pub(crate) const MAX_UNMAP_DESCRIPTORS: usize = 1024;
/// OPTIMAL UNMAP GRANULARITY in bytes: 4 KiB, which divides the 1 MiB VMFS-6 reclaim unit.
const UNMAP_GRANULARITY_BYTES: u64 = 4096;

/// OPTIMAL UNMAP GRANULARITY in logical blocks of `block_size` (at least one).
pub(crate) fn unmap_granularity_blocks(block_size: u32) -> u64 {
    (UNMAP_GRANULARITY_BYTES / u64::from(block_size.max(1))).max(1)
}

/// Maximum transfer length in logical blocks for this block size.
pub(crate) fn max_transfer_blocks(block_size: u32) -> u64 {
    MAX_TRANSFER_BYTES / block_size.max(1) as u64
}

/// THRESHOLD EXPONENT: threshold sets of 1 MiB (log page 0Ch and mode page 1Ch/02h count
/// resources in these sets).
pub(crate) fn threshold_exponent(block_size: u32) -> u8 {
    (1u32 << 20)
        .checked_div(block_size.max(1))
        .unwrap_or(1)
        .max(1)
        .trailing_zeros() as u8
}
