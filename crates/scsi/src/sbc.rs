//! Block commands (SBC-3 / SBC-4): data transfer, thin provisioning, capacity, cache.
//!
//! Every command validates its whole request (range with checked arithmetic, transfer
//! limits, Data-Out size) before touching the volume. Writes hold an LBA range lock so
//! read-modify-write commands (COMPARE AND WRITE, ORWRITE) are atomic against them.

use crate::outcome::invalid_cdb;
use crate::param::ParamList;
use sliver_volume::{BlockStatus, ProvisioningState};

use crate::cdb::{BlockRange, Command, SanitizeAction, StartStop};
use crate::limits::{
    max_transfer_blocks, MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BLOCKS,
};
use crate::lu::LogicalUnit;
use crate::outcome::{
    data_out_prefix, read_failure, truncated, write_failure, Done, Failure, Outcome,
};
use crate::{Request, Sense, SenseReason};

/// Bytes per volume call when one command covers many blocks (WRITE SAME, SANITIZE).
const CHUNK_BYTES: usize = 1 << 20;

pub(crate) fn execute(lu: &LogicalUnit, req: &Request, cmd: &Command) -> Outcome {
    match *cmd {
        Command::Read { range, .. } => read(lu, range),
        Command::Write { range, fua } => write(lu, range, fua, req.data_out),
        Command::WriteAtomic {
            range,
            fua,
            boundary,
        } => write_atomic(lu, range, fua, boundary, req.data_out),
        Command::Verify { range, byte_check } => verify(lu, range, byte_check, req.data_out),
        Command::WriteAndVerify { range } => write_and_verify(lu, range, req.data_out),
        Command::OrWrite { range, fua } => or_write(lu, range, fua, req.data_out),
        Command::CompareAndWrite { range, fua } => compare_and_write(lu, range, fua, req.data_out),
        Command::WriteSame {
            range,
            unmap,
            anchor,
            ndob,
        } => write_same(lu, range, unmap, anchor, ndob, req.data_out),
        Command::Unmap { anchor, param_len } => unmap(lu, anchor, param_len, req.data_out),
        Command::GetLbaStatus { lba, alloc_len } => get_lba_status(lu, lba, alloc_len),
        Command::ReadCapacity10 => Ok(Done::data(read_capacity_10(lu))),
        Command::ReadCapacity16 { alloc_len } => {
            Ok(Done::data(truncated(read_capacity_16(lu), alloc_len)))
        }
        Command::SynchronizeCache { range } => {
            check_range(lu, range)?;
            Ok(Done::good().once_durable(&lu.volume))
        }
        Command::PreFetch { range } => {
            // Nothing is staged in a cache for later, so GOOD rather than CONDITION MET
            // (SBC-3 5.9: CONDITION MET promises the blocks fit the cache).
            check_range(lu, range)?;
            Ok(Done::good())
        }
        Command::StartStopUnit(s) => start_stop_unit(s),
        Command::ReadDefectData {
            ten,
            format,
            alloc_len,
        } => Ok(Done::data(truncated(
            read_defect_data(ten, format),
            alloc_len,
        ))),
        Command::Sanitize { action, param_len } => sanitize(lu, action, param_len, req.data_out),
        _ => Err(SenseReason::InvalidOpcode.into()),
    }
}

fn block_size(lu: &LogicalUnit) -> usize {
    lu.volume.block_size() as usize
}

/// LBA OUT OF RANGE unless `lba + blocks` is within capacity.
fn check_range(lu: &LogicalUnit, r: BlockRange) -> Result<(), Failure> {
    match r.lba.checked_add(r.blocks) {
        Some(end) if end <= lu.volume.num_blocks() => Ok(()),
        _ => Err(SenseReason::LbaOutOfRange.into()),
    }
}

/// Range check plus the MAXIMUM TRANSFER LENGTH limit; returns the byte count.
fn check_transfer(lu: &LogicalUnit, r: BlockRange) -> Result<usize, Failure> {
    check_range(lu, r)?;
    if r.blocks > max_transfer_blocks(lu.volume.block_size()) {
        return Err(invalid_cdb(7, None));
    }
    // Bounded by MAX_TRANSFER_BYTES, so this cannot overflow.
    Ok(r.blocks as usize * block_size(lu))
}

fn check_writable(lu: &LogicalUnit) -> Result<(), Failure> {
    if lu.mode.write_protected() {
        return Err(SenseReason::WriteProtected.into());
    }
    Ok(())
}

/// Write `data` at `lba` (into the volume's cache: [`durable_if`] decides when it is answered).
fn store(lu: &LogicalUnit, lba: u64, data: &[u8]) -> Result<(), Failure> {
    lu.volume.write(lba, data).map_err(write_failure)
}

/// `done`, answered only once durable when FUA or the caching mode page (WCE=0) asks it.
fn durable_if(lu: &LogicalUnit, fua: bool, done: Done) -> Done {
    if fua || !lu.mode.write_cache() {
        done.once_durable(&lu.volume)
    } else {
        done
    }
}

fn read(lu: &LogicalUnit, r: BlockRange) -> Outcome {
    let bytes = check_transfer(lu, r)?;
    let mut data = sliver_volume::io_buffer(bytes);
    if bytes > 0 {
        lu.volume.read(r.lba, &mut data).map_err(read_failure)?;
    }
    Ok(Done::data(data))
}

/// [`read`] if it completes without waiting for a device; `None` when it would wait.
pub(crate) fn read_cached(lu: &LogicalUnit, r: BlockRange) -> Option<Outcome> {
    let bytes = match check_transfer(lu, r) {
        Ok(bytes) => bytes,
        Err(refused) => return Some(Err(refused)),
    };
    let mut data = sliver_volume::io_buffer(bytes);
    if bytes > 0 {
        // An error is the waiting read's to report, as it always has been.
        if !lu.volume.read_cached(r.lba, &mut data).unwrap_or(false) {
            return None;
        }
    }
    Some(Ok(Done::data(data)))
}

/// The part of a write the initiator really sent. When the transport's expected transfer
/// length is shorter than the CDB's (an iSCSI residual overflow), only the whole blocks that
/// arrived are written, as libiscsi's residual tests and other targets expect; the transport
/// reports the overflow.
fn sent_blocks<'a>(lu: &LogicalUnit, r: BlockRange, data_out: &'a [u8]) -> (BlockRange, &'a [u8]) {
    let bs = block_size(lu).max(1);
    let blocks = r.blocks.min((data_out.len() / bs) as u64);
    let r = BlockRange { lba: r.lba, blocks };
    (r, &data_out[..blocks as usize * bs])
}

fn write(lu: &LogicalUnit, r: BlockRange, fua: bool, data_out: &[u8]) -> Outcome {
    check_transfer(lu, r)?;
    let (r, data) = sent_blocks(lu, r, data_out);
    let bytes = data.len();
    check_writable(lu)?;
    if bytes > 0 {
        let _lock = lu.locks.lock(r.lba, r.blocks);
        store(lu, r.lba, data)?;
    }
    Ok(durable_if(lu, fua, Done::affected(bytes as u64)))
}

/// WRITE ATOMIC(16): the volume applies the write as one unit (crash-atomic), and the LBA
/// range lock keeps overlapping commands from seeing or making a mix. Atomic boundaries are
/// not supported (MAXIMUM ATOMIC BOUNDARY SIZE 0), so a non-zero ATOMIC BOUNDARY is refused.
fn write_atomic(
    lu: &LogicalUnit,
    r: BlockRange,
    fua: bool,
    boundary: u16,
    data_out: &[u8],
) -> Outcome {
    let limit = lu.volume.max_atomic_write_bytes() / block_size(lu) as u64;
    if limit == 0 {
        return Err(SenseReason::InvalidOpcode.into());
    }
    check_range(lu, r)?;
    if boundary != 0 {
        return Err(invalid_cdb(10, None));
    }
    if r.blocks > limit {
        return Err(invalid_cdb(12, None));
    }
    write(lu, r, fua, data_out)
}

/// MISCOMPARE with INFORMATION = offset of the first differing byte, if any.
fn compare(expected: &[u8], actual: &[u8]) -> Result<(), Failure> {
    match expected.iter().zip(actual).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(offset) => Err(Sense::from(SenseReason::MiscompareDuringVerify)
            .with_information(offset as u64)
            .into()),
    }
}

fn verify(lu: &LogicalUnit, r: BlockRange, byte_check: u8, data_out: &[u8]) -> Outcome {
    let bytes = check_transfer(lu, r)?;
    let bs = block_size(lu);
    let expected = match byte_check {
        1 => Some(data_out_prefix(data_out, bytes)?),
        3 if r.blocks > 0 => Some(data_out_prefix(data_out, bs)?),
        _ => None,
    };
    if bytes == 0 {
        return Ok(Done::good());
    }
    // Even without a byte comparison, reading surfaces medium errors.
    let mut medium = sliver_volume::io_buffer(bytes);
    lu.volume.read(r.lba, &mut medium).map_err(read_failure)?;
    match (byte_check, expected) {
        (1, Some(expected)) => compare(expected, &medium)?,
        (3, Some(block)) => {
            for (i, chunk) in medium.chunks(bs).enumerate() {
                compare(block, chunk).map_err(|f| match f {
                    Failure::Check(s) => Failure::Check(Sense {
                        information: s.information.map(|o| o + (i * bs) as u64),
                        ..s
                    }),
                    other => other,
                })?;
            }
        }
        _ => {}
    }
    Ok(Done::good())
}

fn write_and_verify(lu: &LogicalUnit, r: BlockRange, data_out: &[u8]) -> Outcome {
    check_transfer(lu, r)?;
    let (r, data) = sent_blocks(lu, r, data_out);
    let bytes = data.len();
    check_writable(lu)?;
    if bytes == 0 {
        return Ok(Done::good());
    }
    let _lock = lu.locks.lock(r.lba, r.blocks);
    // Verification is of the medium, so the data must be there first.
    lu.volume
        .write_durable(r.lba, data)
        .map_err(write_failure)?;
    let mut medium = sliver_volume::io_buffer(bytes);
    lu.volume.read(r.lba, &mut medium).map_err(read_failure)?;
    compare(data, &medium)?;
    Ok(Done::affected(bytes as u64))
}

fn or_write(lu: &LogicalUnit, r: BlockRange, fua: bool, data_out: &[u8]) -> Outcome {
    let bytes = check_transfer(lu, r)?;
    let data = data_out_prefix(data_out, bytes)?;
    check_writable(lu)?;
    if bytes == 0 {
        return Ok(Done::good());
    }
    let _lock = lu.locks.lock(r.lba, r.blocks);
    let mut merged = sliver_volume::io_buffer(bytes);
    lu.volume.read(r.lba, &mut merged).map_err(read_failure)?;
    for (m, d) in merged.iter_mut().zip(data) {
        *m |= d;
    }
    store(lu, r.lba, &merged)?;
    Ok(durable_if(lu, fua, Done::affected(bytes as u64)))
}

fn compare_and_write(lu: &LogicalUnit, r: BlockRange, fua: bool, data_out: &[u8]) -> Outcome {
    if r.blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
        return Err(invalid_cdb(13, None));
    }
    check_range(lu, r)?;
    // NUMBER OF LOGICAL BLOCKS 0 is not an error and transfers nothing (SBC-3 5.2); Data-Out
    // sent with it means the initiator meant a length the one-byte field cannot hold
    // (libiscsi sends 256 blocks this way and expects the CDB to be refused).
    if r.blocks == 0 {
        if !data_out.is_empty() {
            return Err(invalid_cdb(13, None));
        }
        return Ok(Done::good());
    }
    let half = r.blocks as usize * block_size(lu);
    // The Data-Out buffer is exactly the verify data followed by the write data; any other
    // size means the CDB and the transfer disagree.
    if data_out.len() != 2 * half {
        return Err(SenseReason::InvalidFieldInInformationUnit.into());
    }
    let (expected, new_data) = data_out.split_at(half);
    check_writable(lu)?;
    let _lock = lu.locks.lock(r.lba, r.blocks);
    let mut medium = sliver_volume::io_buffer(half);
    lu.volume.read(r.lba, &mut medium).map_err(read_failure)?;
    compare(expected, &medium)?;
    store(lu, r.lba, new_data)?;
    Ok(durable_if(lu, fua, Done::affected(half as u64)))
}

/// Write `block` repeatedly over `blocks` blocks at `lba`, a megabyte at a time.
fn fill(lu: &LogicalUnit, lba: u64, blocks: u64, block: &[u8]) -> Result<(), Failure> {
    let bs = block.len().max(1);
    let per_chunk = (CHUNK_BYTES / bs).max(1) as u64;
    let mut buffer = block.repeat(per_chunk.min(blocks) as usize);
    let mut done = 0u64;
    while done < blocks {
        let n = per_chunk.min(blocks - done);
        buffer.truncate(n as usize * bs);
        lu.volume
            .write(lba + done, &buffer)
            .map_err(write_failure)?;
        done += n;
    }
    Ok(())
}

fn write_same(
    lu: &LogicalUnit,
    r: BlockRange,
    unmap: bool,
    anchor: bool,
    ndob: bool,
    data_out: &[u8],
) -> Outcome {
    // SBC-4 5.50 (table 122): ANCHOR needs UNMAP, and a volume that keeps anchored blocks.
    if anchor && (!unmap || !lu.volume.supports_anchor()) {
        return Err(invalid_cdb(1, Some(4)));
    }
    let capacity = lu.volume.num_blocks();
    // NUMBER OF LOGICAL BLOCKS 0 means "to the last LBA" (WSNZ = 0 in VPD 0xB0).
    let blocks = if r.blocks == 0 {
        capacity
            .checked_sub(r.lba)
            .ok_or(Failure::from(SenseReason::LbaOutOfRange))?
    } else {
        r.blocks
    };
    let r = BlockRange { lba: r.lba, blocks };
    check_range(lu, r)?;
    if blocks > MAX_WRITE_SAME_BLOCKS {
        return Err(invalid_cdb(10, None));
    }
    let bs = block_size(lu);
    let zero_block;
    let block = if ndob {
        zero_block = vec![0u8; bs];
        &zero_block[..]
    } else {
        // Exactly one logical block of Data-Out; anything else is a broken transfer.
        if data_out.len() != bs {
            return Err(SenseReason::InvalidFieldInInformationUnit.into());
        }
        data_out
    };
    check_writable(lu)?;
    if blocks == 0 {
        return Ok(Done::good());
    }
    let _lock = lu.locks.lock(r.lba, blocks);
    if anchor {
        // Like UNMAP below, the Data-Out pattern is not consulted: anchored blocks read as
        // zeros (LBPRZ).
        lu.volume.anchor(r.lba, blocks).map_err(write_failure)?;
    } else if unmap {
        // The host asked for deallocation: with LBPRZ=1 the blocks then read as zeros. Like
        // LIO and tgt (and as libiscsi's WriteSame*.UnmapUntilEnd expects) the Data-Out
        // pattern is not consulted; hosts send zeros with the UNMAP bit in practice.
        lu.volume.unmap(r.lba, blocks).map_err(write_failure)?;
    } else if block.iter().all(|&b| b == 0) {
        lu.volume
            .write_zeroes(r.lba, blocks, false)
            .map_err(write_failure)?;
    } else {
        fill(lu, r.lba, blocks, block)?;
    }
    Ok(durable_if(lu, false, Done::affected(blocks * bs as u64)))
}

fn unmap(lu: &LogicalUnit, anchor: bool, param_len: usize, data_out: &[u8]) -> Outcome {
    if anchor && !lu.volume.supports_anchor() {
        return Err(invalid_cdb(1, Some(0)));
    }
    if param_len == 0 {
        return Ok(Done::good());
    }
    if param_len < 8 {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    let params = ParamList::new(data_out_prefix(data_out, param_len)?);
    let descriptors_len = usize::from(params.be16(2)?);
    let descriptors = params.sub(8, descriptors_len)?;
    // A trailing partial descriptor is ignored (SBC-3 5.28.2).
    let count = descriptors_len / 16;
    if count > MAX_UNMAP_DESCRIPTORS {
        return Err(params.invalid(2, None));
    }
    let capacity = lu.volume.num_blocks();
    let mut ranges = Vec::with_capacity(count);
    let mut total = 0u64;
    for i in 0..count {
        let d = descriptors.sub(i * 16, 16)?;
        let lba = d.be64(0)?;
        let blocks = u64::from(d.be32(8)?);
        match lba.checked_add(blocks) {
            Some(end) if end <= capacity => {}
            _ => return Err(SenseReason::LbaOutOfRange.into()),
        }
        total += blocks; // at most 1024 * u32::MAX: cannot overflow u64
        if total > MAX_UNMAP_BLOCKS {
            return Err(d.invalid(8, None));
        }
        if blocks > 0 {
            ranges.push(BlockRange { lba, blocks });
        }
    }
    check_writable(lu)?;
    for r in ranges {
        let _lock = lu.locks.lock(r.lba, r.blocks);
        if anchor {
            lu.volume.anchor(r.lba, r.blocks).map_err(write_failure)?;
        } else {
            lu.volume.unmap(r.lba, r.blocks).map_err(write_failure)?;
        }
    }
    // With WCE=0 an unmap is durable before GOOD like a write: a crash must not bring back
    // data the host was told reads as zeros (LBPRZ).
    Ok(durable_if(
        lu,
        false,
        Done::affected(total * lu.volume.block_size() as u64),
    ))
}

fn get_lba_status(lu: &LogicalUnit, lba: u64, alloc_len: usize) -> Outcome {
    let capacity = lu.volume.num_blocks();
    if lba >= capacity {
        return Err(SenseReason::LbaOutOfRange.into());
    }
    // As many descriptors as the allocation length holds, at least one, at most 1024.
    let wanted = (alloc_len.saturating_sub(8) / 16).clamp(1, 1024);
    let mut data = vec![0u8; 8];
    let mut at = lba;
    let status_at = |at: u64| -> Result<BlockStatus, Failure> {
        let s = lu.volume.block_status(at).map_err(read_failure)?;
        Ok(BlockStatus {
            blocks: s.blocks.min(capacity - at),
            ..s
        })
    };
    let mut next = None;
    for _ in 0..wanted {
        if at >= capacity {
            break;
        }
        let status = match next.take() {
            Some(s) => s,
            None => status_at(at)?,
        };
        // A volume may report a long run in pieces (the engine bounds each lookup): join
        // pieces in the same state so each descriptor covers a whole extent.
        let mut run = status.blocks;
        while run < u32::MAX as u64 && at + run < capacity {
            let s = status_at(at + run)?;
            if s.state != status.state {
                next = Some(s);
                break;
            }
            run += s.blocks;
        }
        let run = run.min(u32::MAX as u64);
        if run == 0 {
            break;
        }
        let provisioning = match status.state {
            ProvisioningState::Mapped => 0,
            ProvisioningState::Deallocated => 1,
            ProvisioningState::Anchored => 2,
        };
        data.extend_from_slice(&at.to_be_bytes());
        data.extend_from_slice(&(run as u32).to_be_bytes());
        data.extend_from_slice(&[provisioning, 0, 0, 0]);
        at += run;
    }
    let len = (data.len() - 4) as u32;
    data[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(Done::data(truncated(data, alloc_len)))
}

fn read_capacity_10(lu: &LogicalUnit) -> Vec<u8> {
    // Capacities beyond 32 bits report 0xFFFFFFFF, telling the host to use READ CAPACITY(16).
    let last = lu.volume.num_blocks().saturating_sub(1);
    let last = u32::try_from(last).unwrap_or(u32::MAX);
    let mut d = Vec::with_capacity(8);
    d.extend_from_slice(&last.to_be_bytes());
    d.extend_from_slice(&lu.volume.block_size().to_be_bytes());
    d
}

pub(crate) fn read_capacity_16(lu: &LogicalUnit) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    let last = lu.volume.num_blocks().saturating_sub(1);
    d[0..8].copy_from_slice(&last.to_be_bytes());
    d[8..12].copy_from_slice(&lu.volume.block_size().to_be_bytes());
    d[13] = lu.volume.physical_block_exponent() & 0x0f;
    d[14] = 0x80 | 0x40; // LBPME, LBPRZ; lowest aligned LBA 0
    d
}

fn start_stop_unit(s: StartStop) -> Outcome {
    // Power conditions we do not have (anything but START_VALID / ACTIVE / IDLE / STANDBY
    // and their forced forms) are invalid.
    if !matches!(s.power_condition, 0x0..=0x3 | 0x7 | 0xa | 0xb) {
        return Err(invalid_cdb(4, Some(7)));
    }
    // A flash LU has no medium to stop or eject, and stays ready: libiscsi only expects
    // a stopped state for removable media (RMB = 1).
    let _ = (s.immed, s.load_eject, s.start);
    Ok(Done::good())
}

fn read_defect_data(ten: bool, format: u8) -> Vec<u8> {
    // An empty defect list in the requested format.
    if ten {
        vec![0, format, 0, 0]
    } else {
        vec![0, format, 0, 0, 0, 0, 0, 0]
    }
}

fn sanitize(
    lu: &LogicalUnit,
    action: SanitizeAction,
    param_len: usize,
    data_out: &[u8],
) -> Outcome {
    let bs = block_size(lu);
    // Other commands see NOT READY, SANITIZE IN PROGRESS until this one ends.
    struct InProgress<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for InProgress<'_> {
        fn drop(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::Release);
        }
    }
    let _in_progress = (action != SanitizeAction::ExitFailureMode).then(|| {
        lu.sanitizing
            .store(true, std::sync::atomic::Ordering::Release);
        InProgress(&lu.sanitizing)
    });
    match action {
        // We cannot erase keys we do not have; the opcode is not reported for it.
        SanitizeAction::CryptoErase => Err(invalid_cdb(1, Some(4))),
        SanitizeAction::ExitFailureMode => {
            if param_len != 0 {
                return Err(invalid_cdb(7, None));
            }
            // A sanitize never leaves us in the failure mode, so there is nothing to exit.
            Ok(Done::good())
        }
        SanitizeAction::BlockErase => {
            if param_len != 0 {
                return Err(invalid_cdb(7, None));
            }
            check_writable(lu)?;
            let capacity = lu.volume.num_blocks();
            let _lock = lu.locks.lock(0, u64::MAX);
            lu.volume.unmap(0, capacity).map_err(write_failure)?;
            lu.volume.flush().map_err(write_failure)?;
            Ok(Done::good())
        }
        SanitizeAction::Overwrite => {
            // The parameter list is a 4-byte header and a pattern of 1..=block size bytes.
            if param_len <= 4 || param_len > bs + 4 {
                return Err(invalid_cdb(7, None));
            }
            let params = ParamList::new(data_out_prefix(data_out, param_len)?);
            let flags = params.u8(0)?;
            let invert = flags & 0x80 != 0;
            let test = (flags >> 5) & 0x03;
            let passes = flags & 0x1f;
            let pattern_len = usize::from(params.be16(2)?);
            if test != 0 {
                return Err(params.invalid(0, Some(6))); // TEST, bits 6..5
            }
            if passes == 0 {
                return Err(params.invalid(0, Some(4))); // PASSES, bits 4..0
            }
            if pattern_len == 0 || pattern_len > bs || pattern_len + 4 != param_len {
                return Err(params.invalid(2, None));
            }
            check_writable(lu)?;
            let pattern = params.sub(4, pattern_len)?.bytes();
            let mut block: Vec<u8> = pattern.iter().copied().cycle().take(bs).collect();
            // With INVERT the pattern alternates between passes; only the last pass is
            // observable, and it is inverted when the pass count is even.
            if invert && passes % 2 == 0 {
                block.iter_mut().for_each(|b| *b = !*b);
            }
            let capacity = lu.volume.num_blocks();
            let _lock = lu.locks.lock(0, u64::MAX);
            if block.iter().all(|&b| b == 0) {
                lu.volume
                    .write_zeroes(0, capacity, false)
                    .map_err(write_failure)?;
            } else {
                fill(lu, 0, capacity, &block)?;
            }
            lu.volume.flush().map_err(write_failure)?;
            Ok(Done::good())
        }
    }
}
