//! ROD tokens: token-based third-party copy (SBC-3 POPULATE TOKEN, WRITE USING TOKEN and RECEIVE ROD
//! TOKEN INFORMATION; SPC-4 ROD tokens): what Windows calls Offloaded Data Transfer (ODX).
//!
//! POPULATE TOKEN makes a 512-byte ROD token standing for LBA ranges of this LU. The host
//! fetches it with RECEIVE ROD TOKEN INFORMATION and hands it to WRITE USING TOKEN on any LU
//! of the array, which copies by sharing chunk references, as EXTENDED COPY does.
//!
//! Tokens are point in time, change vulnerable (ROD type 0080_0001h): we keep no old data, so
//! the first command that changes a represented block revokes the token (the LU's range
//! locks watch its ranges, see `RangeLocks::watch`). WRITE USING TOKEN with a revoked token
//! fails with INVALID TOKEN OPERATION, TOKEN REVOKED and the host copies by itself. A copy
//! that saw the revocation only after it ran fails the same way, so a successful WRITE USING
//! TOKEN never mixes data from before and after the token. Access-upon-reference tokens
//! (0001_0000h) are not watched: they copy whatever the ranges hold when used. The
//! well-known zero token (FFFF_0001h) zeroes the destination ranges.
//!
//! Tokens live with the LU they were made from. WRITE USING TOKEN finds that LU by the NAA
//! designator in the token's creator descriptor, through [`CopyTargets`], so only an
//! initiator that may reach the source can use a token; the token's 352 random bytes make
//! it unguessable. Tokens expire after their inactivity timeout and are dropped with the LU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngCore;

use super::copy::{check_other_lu, copy_failure, run_steps, Step, Target};
use super::lid1::CSCD_IDENTIFICATION;
pub use super::tokens::TOKEN_LEN;
use super::tokens::{RodToken, TokenRecord, UseState};
use crate::cdb::{opcode, Command};
use crate::lu::LogicalUnit;
use crate::outcome::{
    data_out_prefix, invalid_cdb, invalid_param, truncated, Done, Failure, Outcome,
};
use crate::param::ParamList;
use crate::{Request, SenseReason, Status};

/// MAXIMUM RANGE DESCRIPTORS we advertise and accept, per command.
pub const MAX_RANGE_DESCRIPTORS: u16 = 64;
/// Inactivity timeout, in seconds, when POPULATE TOKEN asks for 0, and the most it may ask.
pub const DEFAULT_INACTIVITY_SECS: u32 = 60;
pub const MAX_INACTIVITY_SECS: u32 = 600;
/// MAXIMUM TOKEN TRANSFER SIZE in bytes (advertised in blocks). Copies share references, so
/// a gibibyte is one short metadata operation; hosts split larger copies.
pub const MAX_TOKEN_TRANSFER_BYTES: u64 = 1 << 30;
/// ROD types (SPC-4 table "ROD type codes").
pub const ROD_ACCESS_UPON_REFERENCE: u32 = 0x0001_0000;
pub const ROD_POINT_IN_TIME_DEFAULT: u32 = 0x0080_0000;
pub const ROD_POINT_IN_TIME_CHANGE_VULNERABLE: u32 = 0x0080_0001;
pub const ROD_POINT_IN_TIME_ANY: u32 = 0x0080_ffff;
pub const ROD_BLOCK_DEVICE_ZERO: u32 = 0xffff_0001;

/// The ROD TOKEN LENGTH field: the bytes after it.
const TOKEN_LENGTH_FIELD: u16 = (TOKEN_LEN - 8) as u16;
/// Where the random part of a token starts.
const TOKEN_RANDOM_AT: usize = 160;

/// POPULATE TOKEN parameter list: header, then range descriptors.
const PT_HEADER_LEN: usize = 16;
const PT_FLAGS: usize = 2;
const PT_INACTIVITY: usize = 4;
const PT_ROD_TYPE: usize = 8;
const PT_RANGES_LEN: usize = 14;
/// WRITE USING TOKEN parameter list: header, the token, then range descriptors.
const WUT_HEADER_LEN: usize = 536;
const WUT_FLAGS: usize = 2;
const WUT_OFFSET: usize = 8;
const WUT_TOKEN: usize = 16;
const WUT_RANGES_LEN: usize = 534;
const RANGE_LEN: usize = 16;

/// Flag bits.
const PT_RTV: u8 = 0x02;
const WUT_DEL_TKN: u8 = 0x02;

// ---------------------------------------------------------------------------------------------
// Commands

pub(crate) fn execute(lu: &LogicalUnit, req: &Request, cmd: &Command) -> Outcome {
    match *cmd {
        Command::PopulateToken { list_id, param_len } => tracked(
            lu,
            req,
            list_id,
            opcode::SA_POPULATE_TOKEN,
            param_len,
            |params| populate_token(lu, params),
        ),
        Command::WriteUsingToken { list_id, param_len } => tracked(
            lu,
            req,
            list_id,
            opcode::SA_WRITE_USING_TOKEN,
            param_len,
            |params| write_using_token(lu, req, params),
        ),
        Command::ReceiveRodTokenInformation { list_id, alloc_len } => {
            let record = lu
                .copy_manager
                .tokens
                .find(req.nexus, list_id)
                .ok_or_else(|| invalid_cdb(2, None))?;
            Ok(Done::data(truncated(
                token_information(lu, &record),
                alloc_len,
            )))
        }
        _ => Err(SenseReason::InvalidOpcode.into()),
    }
}

/// What a successful token command leaves for RECEIVE ROD TOKEN INFORMATION.
struct Completed {
    blocks: u64,
    token: Option<Box<[u8; TOKEN_LEN]>>,
    /// Bytes written (WRITE USING TOKEN), for the statistics.
    affected_bytes: u64,
}

/// Run a token command with a parameter list, recording its outcome by LIST IDENTIFIER.
/// A zero-length list does nothing and is not an error (SBC-3).
fn tracked(
    lu: &LogicalUnit,
    req: &Request,
    list_id: u32,
    service_action: u8,
    param_len: usize,
    run: impl FnOnce(ParamList) -> Result<Completed, Failure>,
) -> Outcome {
    if param_len == 0 {
        return Ok(Done::good());
    }
    // The list is already in memory (the transport bounds it); only the header and the
    // range descriptors it announces are read.
    let params = ParamList::new(data_out_prefix(req.data_out, param_len)?);
    lu.copy_manager
        .tokens
        .record(req.nexus, list_id, service_action)?;
    let outcome = run(params);
    lu.copy_manager
        .tokens
        .finish(req.nexus, list_id, |r| match &outcome {
            Ok(done) => {
                r.outcome = Some((Status::Good, None));
                r.transfer_blocks = done.blocks;
                r.token = done.token.clone();
            }
            Err(Failure::Check(sense)) => r.outcome = Some((Status::CheckCondition, Some(*sense))),
            Err(Failure::Conflict) => r.outcome = Some((Status::ReservationConflict, None)),
        });
    outcome.map(|done| Done::affected(done.affected_bytes))
}

/// Range descriptors (LBA, NUMBER OF LOGICAL BLOCKS), checked against `capacity`: each fits
/// (LBA OUT OF RANGE otherwise) and none overlaps another (INVALID FIELD IN PARAMETER LIST,
/// pointing at the later one).
fn parse_ranges(list: ParamList, capacity: u64) -> Result<Vec<(u64, u64)>, Failure> {
    let count = list.len() / RANGE_LEN;
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(count);
    for i in 0..count {
        let d = list.sub(i * RANGE_LEN, RANGE_LEN)?;
        let (lba, blocks) = (d.be64(0)?, u64::from(d.be32(8)?));
        if lba.checked_add(blocks).is_none_or(|end| end > capacity) {
            return Err(d.fail_at(SenseReason::LbaOutOfRange, 0));
        }
        if blocks > 0
            && ranges
                .iter()
                .any(|&(l, b)| b > 0 && l < lba + blocks && lba < l + b)
        {
            return Err(d.invalid(0, None));
        }
        ranges.push((lba, blocks));
    }
    Ok(ranges)
}

/// The RANGE DESCRIPTOR LENGTH at `field`, checked: whole descriptors (INVALID FIELD IN
/// PARAMETER LIST), at most the advertised number (TOO MANY SEGMENT DESCRIPTORS, as SBC-3
/// asks and Windows recognises), inside the parameter list.
fn ranges_in<'a>(
    params: ParamList<'a>,
    field: usize,
    start: usize,
) -> Result<ParamList<'a>, Failure> {
    let len = usize::from(params.be16(field)?);
    if !len.is_multiple_of(RANGE_LEN) {
        return Err(params.invalid(field, None));
    }
    if len / RANGE_LEN > MAX_RANGE_DESCRIPTORS as usize {
        return Err(params.fail_at(SenseReason::TooManySegmentDescriptors, field));
    }
    params.sub(start, len)
}

fn populate_token(lu: &LogicalUnit, params: ParamList) -> Result<Completed, Failure> {
    let header = params.sub(0, PT_HEADER_LEN)?;
    let flags = header.u8(PT_FLAGS)?;
    let rod_type = if flags & PT_RTV != 0 {
        match header.be32(PT_ROD_TYPE)? {
            ROD_POINT_IN_TIME_DEFAULT
            | ROD_POINT_IN_TIME_CHANGE_VULNERABLE
            | ROD_POINT_IN_TIME_ANY => ROD_POINT_IN_TIME_CHANGE_VULNERABLE,
            ROD_ACCESS_UPON_REFERENCE => ROD_ACCESS_UPON_REFERENCE,
            _ => return Err(header.invalid(PT_ROD_TYPE, None)),
        }
    } else {
        ROD_POINT_IN_TIME_CHANGE_VULNERABLE
    };
    let timeout = match header.be32(PT_INACTIVITY)? {
        0 => DEFAULT_INACTIVITY_SECS,
        s if s > MAX_INACTIVITY_SECS => return Err(header.invalid(PT_INACTIVITY, None)),
        s => s,
    };
    let list = ranges_in(params, PT_RANGES_LEN, PT_HEADER_LEN)?;
    let ranges = parse_ranges(list, lu.volume.num_blocks())?;
    let block_size = lu.volume.block_size();
    let blocks: u64 = ranges.iter().map(|r| r.1).sum();
    if blocks.saturating_mul(u64::from(block_size)) > MAX_TOKEN_TRANSFER_BYTES {
        return Err(header.invalid(PT_RANGES_LEN, None));
    }
    let id = lu
        .copy_manager
        .tokens
        .next_token_id
        .fetch_add(1, Ordering::Relaxed);
    let bytes = token_bytes(lu, rod_type, id, blocks);
    let revoked = Arc::new(AtomicBool::new(false));
    if rod_type != ROD_ACCESS_UPON_REFERENCE {
        lu.locks.watch(&ranges, &revoked);
    }
    let token = Arc::new(RodToken {
        bytes: bytes.clone(),
        ranges,
        block_size,
        revoked,
        timeout: Duration::from_secs(u64::from(timeout)),
        use_state: Mutex::new(UseState {
            in_use: 0,
            last_active: lu.clock.now(),
            deleted: false,
        }),
    });
    lu.copy_manager.tokens.keep(token, lu.clock.now());
    Ok(Completed {
        blocks,
        token: Some(bytes),
        affected_bytes: 0,
    })
}

/// A ROD token (SPC-4 "ROD token format"):
///
/// ```text
///   0..4    ROD TYPE
///   6..8    ROD TOKEN LENGTH (1F8h)
///   8..16   COPY MANAGER ROD TOKEN IDENTIFIER (per LU counter)
///  16..48   CREATOR LOGICAL UNIT DESCRIPTOR: an E4h identification CSCD descriptor with
///           this LU's NAA designator and block length
///  48..64   NUMBER OF BYTES REPRESENTED
///  96..120  device type specific data: READ CAPACITY(16) parameter data bytes 8..32
/// 128..148  TARGET DEVICE DESCRIPTOR: this LU's NAA designation descriptor
/// 160..512  random
/// ```
fn token_bytes(lu: &LogicalUnit, rod_type: u32, id: u64, blocks: u64) -> Box<[u8; TOKEN_LEN]> {
    let mut t = Box::new([0u8; TOKEN_LEN]);
    t[0..4].copy_from_slice(&rod_type.to_be_bytes());
    t[6..8].copy_from_slice(&TOKEN_LENGTH_FIELD.to_be_bytes());
    t[8..16].copy_from_slice(&id.to_be_bytes());
    let c = &mut t[16..48];
    c[0] = CSCD_IDENTIFICATION;
    c[4] = 0x01; // code set binary
    c[5] = 0x03; // association LU, designator type NAA
    c[7] = 16;
    c[8..24].copy_from_slice(&lu.naa());
    c[29..32].copy_from_slice(&lu.volume.block_size().to_be_bytes()[1..]);
    let represented = u128::from(blocks) * u128::from(lu.volume.block_size());
    t[48..64].copy_from_slice(&represented.to_be_bytes());
    t[96..120].copy_from_slice(&crate::sbc::read_capacity_16(lu)[8..32]);
    let d = &mut t[128..148];
    d[0] = 0x01; // code set binary
    d[1] = 0x03; // association LU, designator type NAA
    d[3] = 16;
    d[4..20].copy_from_slice(&lu.naa());
    rand::thread_rng().fill_bytes(&mut t[TOKEN_RANDOM_AT..]);
    t
}

/// The NAA designator in a token's creator descriptor, if it has one.
fn creator_naa(token: &[u8]) -> Option<[u8; 16]> {
    let c = token.get(16..48)?;
    (c[0] == CSCD_IDENTIFICATION && c[5] & 0x3f == 0x03 && c[7] == 16)
        .then(|| <[u8; 16]>::try_from(&c[8..24]).ok())
        .flatten()
}

fn write_using_token(
    lu: &LogicalUnit,
    req: &Request,
    params: ParamList,
) -> Result<Completed, Failure> {
    let header = params.sub(0, WUT_HEADER_LEN)?;
    let list = ranges_in(params, WUT_RANGES_LEN, WUT_HEADER_LEN)?;
    let ranges = parse_ranges(list, lu.volume.num_blocks())?;
    if lu.mode.write_protected() {
        return Err(SenseReason::WriteProtected.into());
    }
    let token_field = header.sub(WUT_TOKEN, TOKEN_LEN)?;
    if token_field.be32(0)? == ROD_BLOCK_DEVICE_ZERO {
        return write_zero_token(lu, &ranges);
    }
    let token = token_field.bytes();
    let offset = header.be64(WUT_OFFSET)?;
    let delete = header.u8(WUT_FLAGS)? & WUT_DEL_TKN != 0;
    let source: Target = match creator_naa(token) {
        Some(naa) if naa == lu.naa() => Target::Receiving(lu),
        Some(naa) => req
            .copy_targets
            .find_by_naa(&naa)
            .map(Target::Other)
            .ok_or(SenseReason::TokenUnknown)?,
        None => return Err(SenseReason::TokenUnknown.into()),
    };
    let rod = source.copy_manager.tokens.take(token, source.clock.now())?;
    let outcome = copy_from_token(lu, req, &source, &rod, offset, &ranges);
    source
        .copy_manager
        .tokens
        .release(&rod, delete, source.clock.now());
    outcome
}

fn copy_from_token(
    lu: &LogicalUnit,
    req: &Request,
    source: &Target,
    rod: &RodToken,
    offset: u64,
    ranges: &[(u64, u64)],
) -> Result<Completed, Failure> {
    if rod.block_size != lu.volume.block_size() {
        // Copies between block sizes would need read-modify-write; the host copies itself.
        return Err(SenseReason::TokenCauseNotReportable.into());
    }
    // The source may have shrunk since the token was made.
    if rod
        .ranges
        .iter()
        .any(|&(lba, blocks)| source.volume.check_range(lba, blocks).is_err())
    {
        return Err(SenseReason::TokenRevoked.into());
    }
    let wanted: u64 = ranges.iter().map(|r| r.1).sum();
    if offset >= rod.blocks() && wanted > 0 {
        return Err(invalid_param(WUT_OFFSET, None));
    }
    if wanted > rod.blocks() - offset.min(rod.blocks()) {
        // More destination than the token represents past the offset: refuse before
        // writing rather than leave part of the ranges written.
        return Err(invalid_param(WUT_RANGES_LEN, None));
    }
    check_other_lu(source, req.nexus, false, WUT_TOKEN)?;
    let steps = plan_steps(lu, source, rod, offset, ranges);
    let bytes = run_steps(&steps, |_, _| {})?;
    // Set before a represented block changed: the copy may have read the new data.
    if rod.revoked.load(Ordering::SeqCst) {
        return Err(SenseReason::TokenRevoked.into());
    }
    Ok(Completed {
        blocks: wanted,
        token: None,
        affected_bytes: bytes,
    })
}

/// Pair the destination ranges, in order, with the token's source ranges from `offset`
/// blocks into the token. The caller checked that the token holds enough blocks.
fn plan_steps<'a>(
    lu: &'a LogicalUnit,
    source: &Target<'a>,
    rod: &RodToken,
    offset: u64,
    ranges: &[(u64, u64)],
) -> Vec<Step<'a>> {
    let bs = u64::from(rod.block_size);
    let mut sources = rod.ranges.iter().copied().filter(|r| r.1 > 0);
    let mut skip = offset;
    let mut current: Option<(u64, u64)> = None;
    let mut steps = Vec::new();
    for &(mut dst_lba, mut left) in ranges {
        while left > 0 {
            let (src_lba, avail) = match current.take() {
                Some(c) => c,
                None => match sources.next() {
                    Some((_, blocks)) if skip >= blocks => {
                        skip -= blocks;
                        continue;
                    }
                    Some((lba, blocks)) => {
                        let r = (lba + skip, blocks - skip);
                        skip = 0;
                        r
                    }
                    None => return steps,
                },
            };
            let n = avail.min(left);
            steps.push(Step {
                src: source.clone(),
                dst: Target::Receiving(lu),
                src_lba,
                dst_lba,
                blocks: n,
                bytes: n * bs,
            });
            if avail > n {
                current = Some((src_lba + n, avail - n));
            }
            dst_lba += n;
            left -= n;
        }
    }
    steps
}

/// The block device zero ROD token: zero every range, as WRITE SAME with NDOB would, up to
/// the MAXIMUM TOKEN TRANSFER SIZE every token command is held to.
fn write_zero_token(lu: &LogicalUnit, ranges: &[(u64, u64)]) -> Result<Completed, Failure> {
    let wanted: u64 = ranges.iter().map(|r| r.1).sum();
    if wanted.saturating_mul(u64::from(lu.volume.block_size())) > MAX_TOKEN_TRANSFER_BYTES {
        return Err(invalid_param(WUT_RANGES_LEN, None));
    }
    let mut blocks = 0;
    for &(lba, n) in ranges.iter().filter(|r| r.1 > 0) {
        let _lock = lu.locks.lock(lba, n);
        lu.volume
            .write_zeroes(lba, n, false)
            .map_err(copy_failure)?;
        blocks += n;
    }
    if !lu.mode.write_cache() {
        lu.volume.flush().map_err(copy_failure)?;
    }
    let bytes = blocks * u64::from(lu.volume.block_size());
    lu.stats.zero.fetch_add(1, Ordering::Relaxed);
    lu.stats.zeroed_bytes.fetch_add(bytes, Ordering::Relaxed);
    Ok(Completed {
        blocks,
        token: None,
        affected_bytes: bytes,
    })
}

// ---------------------------------------------------------------------------------------------
// RECEIVE ROD TOKEN INFORMATION

/// COPY STATUS values.
const COPY_STATUS_SUCCESS: u8 = 0x01;
const COPY_STATUS_FAILED: u8 = 0x02;
const COPY_STATUS_IN_PROGRESS: u8 = 0x10;
/// TRANSFER COUNT UNITS: logical blocks.
const UNITS_BLOCKS: u8 = 0xf1;

/// The response (SBC-3 "RECEIVE ROD TOKEN INFORMATION parameter data"):
///
/// ```text
///  0..4   AVAILABLE DATA          12     COMPLETION STATUS (SCSI status)
///  4      RESPONSE TO SERVICE ACT 13     SENSE DATA FIELD LENGTH
///  5      COPY STATUS             14     SENSE DATA LENGTH
///  6..8   OPERATION COUNTER       15     TRANSFER COUNT UNITS
///  8..12  EST. STATUS UPDATE DELAY 16..24 TRANSFER COUNT   24..26 SEGMENTS PROCESSED (0)
///  32..   sense data, then ROD TOKEN DESCRIPTORS LENGTH (4), then per token 2 reserved
///         bytes and the 512-byte token
/// ```
fn token_information(lu: &LogicalUnit, r: &TokenRecord) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[4] = r.service_action;
    let sense = match &r.outcome {
        None => {
            d[5] = COPY_STATUS_IN_PROGRESS;
            Vec::new()
        }
        Some((status, sense)) => {
            d[5] = if *status == Status::Good {
                COPY_STATUS_SUCCESS
            } else {
                COPY_STATUS_FAILED
            };
            d[12] = *status as u8;
            match sense {
                Some(s) if lu.mode.descriptor_sense() => s.to_descriptor(),
                Some(s) => s.to_fixed(),
                None => Vec::new(),
            }
        }
    };
    let field = sense.len().next_multiple_of(4);
    d[13] = field as u8;
    d[14] = sense.len() as u8;
    d[15] = UNITS_BLOCKS;
    d[16..24].copy_from_slice(&r.transfer_blocks.to_be_bytes());
    // SEGMENTS PROCESSED (24..26) stays zero: token commands have no segments (Windows
    // checks).
    d.extend_from_slice(&sense);
    d.resize(32 + field, 0);
    match &r.token {
        Some(token) => {
            d.extend_from_slice(&((TOKEN_LEN + 2) as u32).to_be_bytes());
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&token[..]);
        }
        None => d.extend_from_slice(&0u32.to_be_bytes()),
    }
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    d
}

#[cfg(test)]
mod tests;
