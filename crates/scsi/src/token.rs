//! Token-based third-party copy (SBC-3 POPULATE TOKEN, WRITE USING TOKEN and RECEIVE ROD
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

use crate::outcome::{invalid_cdb, invalid_param};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;

use crate::cdb::{opcode, Command};
use crate::lu::LogicalUnit;
use crate::outcome::{data_out_prefix, truncated, Done, Failure, Outcome};
use crate::range_lock::lock_unpoisoned;
use crate::xcopy::{
    at_param, be16, be32, be64, check_other_lu, copy_failure, run_steps, Step, Target,
    CSCD_IDENTIFICATION,
};
use crate::{Nexus, Request, Sense, SenseReason, Status};

/// MAXIMUM RANGE DESCRIPTORS we advertise and accept, per command.
pub const MAX_RANGE_DESCRIPTORS: u16 = 64;
/// Inactivity timeout, in seconds, when POPULATE TOKEN asks for 0, and the most it may ask.
pub const DEFAULT_INACTIVITY_SECS: u32 = 60;
pub const MAX_INACTIVITY_SECS: u32 = 600;
/// MAXIMUM TOKEN TRANSFER SIZE in bytes (advertised in blocks). Copies share references, so
/// a gibibyte is one short metadata operation; hosts split larger copies.
pub const MAX_TOKEN_TRANSFER_BYTES: u64 = 1 << 30;
/// Live tokens kept per LU; making one more drops the oldest not in use. Every write to
/// the LU looks at the ranges of its live point-in-time tokens, so this also bounds that.
const MAX_TOKENS: usize = 64;
/// Finished token command results kept per LU for RECEIVE ROD TOKEN INFORMATION.
const RETAINED_RESULTS: usize = 64;

/// ROD types (SPC-4 table "ROD type codes").
pub const ROD_ACCESS_UPON_REFERENCE: u32 = 0x0001_0000;
pub const ROD_POINT_IN_TIME_DEFAULT: u32 = 0x0080_0000;
pub const ROD_POINT_IN_TIME_CHANGE_VULNERABLE: u32 = 0x0080_0001;
pub const ROD_POINT_IN_TIME_ANY: u32 = 0x0080_ffff;
pub const ROD_BLOCK_DEVICE_ZERO: u32 = 0xffff_0001;

/// A ROD token's size, and the ROD TOKEN LENGTH field (the bytes after it).
pub const TOKEN_LEN: usize = 512;
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
// Per-LU state

/// One live token made by POPULATE TOKEN on this LU.
struct RodToken {
    bytes: Box<[u8; TOKEN_LEN]>,
    /// (lba, blocks) on this LU, in the order the token represents them.
    ranges: Vec<(u64, u64)>,
    block_size: u32,
    /// Set when a represented block changes (point-in-time tokens only).
    revoked: Arc<AtomicBool>,
    timeout: Duration,
    use_state: Mutex<UseState>,
}

struct UseState {
    /// WRITE USING TOKEN commands using it now; it does not expire meanwhile.
    in_use: usize,
    last_active: Instant,
    deleted: bool,
}

impl RodToken {
    fn blocks(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    fn expired(&self, now: Instant) -> bool {
        let u = lock_unpoisoned(&self.use_state);
        u.deleted || (u.in_use == 0 && now.duration_since(u.last_active) > self.timeout)
    }
}

/// Outcome of one POPULATE TOKEN or WRITE USING TOKEN, by (I_T nexus, LIST IDENTIFIER).
#[derive(Clone)]
struct TokenRecord {
    initiator_port: String,
    relative_target_port: u16,
    list_id: u32,
    service_action: u8,
    /// None while the command runs.
    outcome: Option<(Status, Option<Sense>)>,
    transfer_blocks: u64,
    token: Option<Box<[u8; TOKEN_LEN]>>,
}

impl TokenRecord {
    fn belongs_to(&self, nexus: &Nexus) -> bool {
        self.initiator_port == nexus.initiator_port
            && self.relative_target_port == nexus.relative_target_port
    }
}

/// Tokens made from one LU, and results of token commands received by it.
#[derive(Default)]
pub(crate) struct TokenCopy {
    tokens: Mutex<Vec<Arc<RodToken>>>,
    results: Mutex<VecDeque<TokenRecord>>,
    next_token_id: AtomicU64,
}

impl TokenCopy {
    /// Register a command about to run. A LIST IDENTIFIER still in use by a running command
    /// of this nexus is refused with OPERATION IN PROGRESS (SPC-4): its outcome would land
    /// in the wrong record. Windows makes a new identifier per command.
    fn record(&self, nexus: &Nexus, list_id: u32, service_action: u8) -> Result<(), SenseReason> {
        let mut results = lock_unpoisoned(&self.results);
        let same = |r: &TokenRecord| r.list_id == list_id && r.belongs_to(nexus);
        if results.iter().any(|r| same(r) && r.outcome.is_none()) {
            return Err(SenseReason::OperationInProgress);
        }
        results.retain(|r| !same(r));
        results.push_back(TokenRecord {
            initiator_port: nexus.initiator_port.clone(),
            relative_target_port: nexus.relative_target_port,
            list_id,
            service_action,
            outcome: None,
            transfer_blocks: 0,
            token: None,
        });
        while results.len() > RETAINED_RESULTS {
            let Some(oldest) = results.iter().position(|r| r.outcome.is_some()) else {
                break;
            };
            results.remove(oldest);
        }
        Ok(())
    }

    fn finish(&self, nexus: &Nexus, list_id: u32, f: impl FnOnce(&mut TokenRecord)) {
        let mut results = lock_unpoisoned(&self.results);
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.list_id == list_id && r.belongs_to(nexus))
        {
            f(r);
        }
    }

    fn find(&self, nexus: &Nexus, list_id: u32) -> Option<TokenRecord> {
        lock_unpoisoned(&self.results)
            .iter()
            .find(|r| r.list_id == list_id && r.belongs_to(nexus))
            .cloned()
    }

    /// Keep `token`, dropping expired tokens and, when full, the oldest one not in use.
    fn keep(&self, token: Arc<RodToken>) {
        let now = Instant::now();
        let mut tokens = lock_unpoisoned(&self.tokens);
        tokens.retain(|t| !t.expired(now));
        if tokens.len() >= MAX_TOKENS {
            if let Some(oldest) = tokens
                .iter()
                .position(|t| lock_unpoisoned(&t.use_state).in_use == 0)
            {
                tokens.remove(oldest);
            }
        }
        tokens.push(token);
    }

    /// The live token with exactly these bytes, marked in use.
    fn take(&self, bytes: &[u8]) -> Result<Arc<RodToken>, SenseReason> {
        let now = Instant::now();
        let mut tokens = lock_unpoisoned(&self.tokens);
        let Some(i) = tokens.iter().position(|t| t.bytes[..] == *bytes) else {
            return Err(SenseReason::TokenUnknown);
        };
        if tokens[i].expired(now) {
            tokens.remove(i);
            return Err(SenseReason::TokenExpired);
        }
        if tokens[i].revoked.load(Ordering::SeqCst) {
            tokens.remove(i);
            return Err(SenseReason::TokenRevoked);
        }
        let token = Arc::clone(&tokens[i]);
        lock_unpoisoned(&token.use_state).in_use += 1;
        Ok(token)
    }

    /// A WRITE USING TOKEN is done with `token`; DEL_TKN deletes it.
    fn release(&self, token: &RodToken, delete: bool) {
        let mut u = lock_unpoisoned(&token.use_state);
        u.in_use -= 1;
        u.last_active = Instant::now();
        u.deleted |= delete;
        let gone = u.deleted || token.revoked.load(Ordering::SeqCst);
        drop(u);
        if gone {
            lock_unpoisoned(&self.tokens).retain(|t| !std::ptr::eq(t.as_ref(), token));
        }
    }

    /// The nexus is gone: its results go with it (its tokens stay usable by others).
    pub(crate) fn nexus_lost(&self, nexus: &Nexus) {
        lock_unpoisoned(&self.results).retain(|r| !r.belongs_to(nexus));
    }

    /// A reset discards the results; tokens survive it, as a host may still hold them.
    pub(crate) fn clear_results(&self) {
        lock_unpoisoned(&self.results).clear();
    }
}

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
                .token_copy
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
    run: impl FnOnce(&[u8]) -> Result<Completed, Failure>,
) -> Outcome {
    if param_len == 0 {
        return Ok(Done::good());
    }
    // The list is already in memory (the transport bounds it); only the header and the
    // range descriptors it announces are read.
    let params = data_out_prefix(req.data_out, param_len)?;
    lu.token_copy.record(req.nexus, list_id, service_action)?;
    let outcome = run(params);
    lu.token_copy
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
/// pointing at the later one). `at` is where the list starts in the parameter list.
fn parse_ranges(list: &[u8], at: usize, capacity: u64) -> Result<Vec<(u64, u64)>, Failure> {
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(list.len() / RANGE_LEN);
    for (i, d) in list.chunks_exact(RANGE_LEN).enumerate() {
        let here = at + i * RANGE_LEN;
        let (lba, blocks) = (be64(d, 0), u64::from(be32(d, 8)));
        if lba.checked_add(blocks).is_none_or(|end| end > capacity) {
            return Err(at_param(SenseReason::LbaOutOfRange, here));
        }
        if blocks > 0
            && ranges
                .iter()
                .any(|&(l, b)| b > 0 && l < lba + blocks && lba < l + b)
        {
            return Err(invalid_param(here, None));
        }
        ranges.push((lba, blocks));
    }
    Ok(ranges)
}

/// The RANGE DESCRIPTOR LENGTH at `field`, checked: whole descriptors (INVALID FIELD IN
/// PARAMETER LIST), at most the advertised number (TOO MANY SEGMENT DESCRIPTORS, as SBC-3
/// asks and Windows recognises), inside the parameter list.
fn ranges_in(params: &[u8], field: usize, start: usize) -> Result<&[u8], Failure> {
    let len = be16(params, field) as usize;
    if !len.is_multiple_of(RANGE_LEN) {
        return Err(invalid_param(field, None));
    }
    if len / RANGE_LEN > MAX_RANGE_DESCRIPTORS as usize {
        return Err(at_param(SenseReason::TooManySegmentDescriptors, field));
    }
    params
        .get(start..start + len)
        .ok_or_else(|| SenseReason::ParameterListLengthError.into())
}

fn populate_token(lu: &LogicalUnit, params: &[u8]) -> Result<Completed, Failure> {
    if params.len() < PT_HEADER_LEN {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    let flags = params[PT_FLAGS];
    let rod_type = if flags & PT_RTV != 0 {
        match be32(params, PT_ROD_TYPE) {
            ROD_POINT_IN_TIME_DEFAULT
            | ROD_POINT_IN_TIME_CHANGE_VULNERABLE
            | ROD_POINT_IN_TIME_ANY => ROD_POINT_IN_TIME_CHANGE_VULNERABLE,
            ROD_ACCESS_UPON_REFERENCE => ROD_ACCESS_UPON_REFERENCE,
            _ => return Err(invalid_param(PT_ROD_TYPE, None)),
        }
    } else {
        ROD_POINT_IN_TIME_CHANGE_VULNERABLE
    };
    let timeout = match be32(params, PT_INACTIVITY) {
        0 => DEFAULT_INACTIVITY_SECS,
        s if s > MAX_INACTIVITY_SECS => return Err(invalid_param(PT_INACTIVITY, None)),
        s => s,
    };
    let list = ranges_in(params, PT_RANGES_LEN, PT_HEADER_LEN)?;
    let ranges = parse_ranges(list, PT_HEADER_LEN, lu.volume.num_blocks())?;
    let block_size = lu.volume.block_size();
    let blocks: u64 = ranges.iter().map(|r| r.1).sum();
    if blocks.saturating_mul(u64::from(block_size)) > MAX_TOKEN_TRANSFER_BYTES {
        return Err(invalid_param(PT_RANGES_LEN, None));
    }
    let id = lu.token_copy.next_token_id.fetch_add(1, Ordering::Relaxed);
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
            last_active: Instant::now(),
            deleted: false,
        }),
    });
    lu.token_copy.keep(token);
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

fn write_using_token(lu: &LogicalUnit, req: &Request, params: &[u8]) -> Result<Completed, Failure> {
    if params.len() < WUT_HEADER_LEN {
        return Err(SenseReason::ParameterListLengthError.into());
    }
    let list = ranges_in(params, WUT_RANGES_LEN, WUT_HEADER_LEN)?;
    let ranges = parse_ranges(list, WUT_HEADER_LEN, lu.volume.num_blocks())?;
    if lu.mode.write_protected() {
        return Err(SenseReason::WriteProtected.into());
    }
    let token = &params[WUT_TOKEN..WUT_TOKEN + TOKEN_LEN];
    if be32(token, 0) == ROD_BLOCK_DEVICE_ZERO {
        return write_zero_token(lu, &ranges);
    }
    let offset = be64(params, WUT_OFFSET);
    let source: Target = match creator_naa(token) {
        Some(naa) if naa == lu.naa() => Target::Receiving(lu),
        Some(naa) => req
            .copy_targets
            .find_by_naa(&naa)
            .map(Target::Other)
            .ok_or(SenseReason::TokenUnknown)?,
        None => return Err(SenseReason::TokenUnknown.into()),
    };
    let rod = source.token_copy.take(token)?;
    let outcome = copy_from_token(lu, req, &source, &rod, offset, &ranges);
    source
        .token_copy
        .release(&rod, params[WUT_FLAGS] & WUT_DEL_TKN != 0);
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

// ---------------------------------------------------------------------------------------------
// Third-party Copy VPD page descriptors

/// Block Device ROD Token Limits descriptor body (SBC-3), which Windows requires before it
/// uses ODX.
pub(crate) fn block_device_rod_limits(lu: &LogicalUnit) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[6..8].copy_from_slice(&MAX_RANGE_DESCRIPTORS.to_be_bytes());
    b[8..12].copy_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes());
    b[12..16].copy_from_slice(&DEFAULT_INACTIVITY_SECS.to_be_bytes());
    let max_blocks = MAX_TOKEN_TRANSFER_BYTES / u64::from(lu.volume.block_size().max(1));
    b[16..24].copy_from_slice(&max_blocks.to_be_bytes());
    b[24..32].copy_from_slice(&max_blocks.to_be_bytes()); // OPTIMAL TRANSFER COUNT
    b
}

/// ROD Token Features descriptor body (SPC-4; offsets below are within the body, i.e. the
/// descriptor's minus 4), which SPC-4 requires of a copy manager that makes ROD tokens:
///
/// ```text
///  0      REMOTE TOKENS (0: tokens are used within this target only)
/// 12..16  MINIMUM TOKEN LIFETIME   16..20 MAXIMUM TOKEN LIFETIME (seconds)
/// 20..24  MAXIMUM TOKEN INACTIVITY TIMEOUT
/// 42..44  ROD DEVICE TYPE SPECIFIC FEATURES DESCRIPTORS LENGTH (48)
/// 44..92  block device descriptor (SBC-3): peripheral device type 0, length 2Ch,
///         OPTIMAL BLOCK ROD LENGTH GRANULARITY (blocks) at +6, then 8-byte MAXIMUM BYTES
///         IN BLOCK ROD, OPTIMAL BYTES IN BLOCK ROD TRANSFER, OPTIMAL BYTES TO TOKEN PER
///         SEGMENT and OPTIMAL BYTES FROM TOKEN PER SEGMENT
/// ```
///
/// A token lives while it is used and expires after its inactivity timeout, so both
/// lifetimes are stated as the range of timeouts POPULATE TOKEN may ask for.
pub(crate) fn rod_token_features(lu: &LogicalUnit) -> Vec<u8> {
    let mut b = vec![0u8; 44 + 48];
    b[12..16].copy_from_slice(&1u32.to_be_bytes());
    b[16..20].copy_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes());
    b[20..24].copy_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes());
    b[42..44].copy_from_slice(&48u16.to_be_bytes());
    let d = &mut b[44..];
    d[2..4].copy_from_slice(&0x2cu16.to_be_bytes());
    let granularity = crate::vpd::unmap_granularity_blocks(lu.volume.block_size());
    d[6..8].copy_from_slice(&(granularity.min(u64::from(u16::MAX)) as u16).to_be_bytes());
    for at in [8, 16, 24, 32] {
        d[at..at + 8].copy_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes());
    }
    b
}

/// Supported ROD Types descriptor body (SPC-4), in ascending ROD type order: the types
/// POPULATE TOKEN makes (TOKEN_OUT) and WRITE USING TOKEN takes (TOKEN_IN).
pub(crate) fn supported_rod_types() -> Vec<u8> {
    const TOKEN_IN: u8 = 0x02;
    const TOKEN_OUT: u8 = 0x01;
    let types = [
        (ROD_ACCESS_UPON_REFERENCE, TOKEN_IN | TOKEN_OUT),
        (ROD_POINT_IN_TIME_CHANGE_VULNERABLE, TOKEN_IN | TOKEN_OUT),
        (ROD_BLOCK_DEVICE_ZERO, TOKEN_IN),
    ];
    let mut b = vec![0u8; 4];
    b[2..4].copy_from_slice(&((types.len() * 64) as u16).to_be_bytes());
    for (rod_type, flags) in types {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&rod_type.to_be_bytes());
        d[4] = flags;
        b.extend_from_slice(&d);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xcopy::tests::{
        array, good, lu_over, naa, nexus, pattern, read, run, sense, write, Reachable,
        ScriptedVolume, BLOCKS, BS,
    };
    use crate::{CopyTargets, NoCopyTargets};
    use sliver_volume::FileVolume;

    const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8, u8) = (0x5, 0x26, 0x00);
    const TOKEN_UNKNOWN: (u8, u8, u8) = (0x5, 0x23, 0x04);
    const TOKEN_REVOKED: (u8, u8, u8) = (0x5, 0x23, 0x06);

    fn ranges(list: &[(u64, u32)]) -> Vec<u8> {
        let mut d = Vec::new();
        for &(lba, blocks) in list {
            d.extend_from_slice(&lba.to_be_bytes());
            d.extend_from_slice(&blocks.to_be_bytes());
            d.extend_from_slice(&[0; 4]);
        }
        d
    }

    /// A POPULATE TOKEN parameter list; `rod_type` sets RTV.
    fn pt_params(rod_type: Option<u32>, inactivity: u32, list: &[(u64, u32)]) -> Vec<u8> {
        let r = ranges(list);
        let mut p = vec![0u8; PT_HEADER_LEN];
        p[0..2].copy_from_slice(&((PT_HEADER_LEN + r.len() - 2) as u16).to_be_bytes());
        if let Some(t) = rod_type {
            p[PT_FLAGS] = PT_RTV;
            p[PT_ROD_TYPE..PT_ROD_TYPE + 4].copy_from_slice(&t.to_be_bytes());
        }
        p[PT_INACTIVITY..PT_INACTIVITY + 4].copy_from_slice(&inactivity.to_be_bytes());
        p[PT_RANGES_LEN..PT_RANGES_LEN + 2].copy_from_slice(&(r.len() as u16).to_be_bytes());
        p.extend_from_slice(&r);
        p
    }

    fn wut_params(token: &[u8], offset: u64, delete: bool, list: &[(u64, u32)]) -> Vec<u8> {
        let r = ranges(list);
        let mut p = vec![0u8; WUT_HEADER_LEN];
        p[0..2].copy_from_slice(&((WUT_HEADER_LEN + r.len() - 2) as u16).to_be_bytes());
        if delete {
            p[WUT_FLAGS] = WUT_DEL_TKN;
        }
        p[WUT_OFFSET..WUT_OFFSET + 8].copy_from_slice(&offset.to_be_bytes());
        p[WUT_TOKEN..WUT_TOKEN + TOKEN_LEN].copy_from_slice(token);
        p[WUT_RANGES_LEN..WUT_RANGES_LEN + 2].copy_from_slice(&(r.len() as u16).to_be_bytes());
        p.extend_from_slice(&r);
        p
    }

    fn out_cdb(action: u8, list_id: u32, len: usize) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = 0x83;
        c[1] = action;
        c[6..10].copy_from_slice(&list_id.to_be_bytes());
        c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
        c
    }

    fn populate(lu: &LogicalUnit, list_id: u32, p: &[u8]) -> crate::Response {
        run(lu, &NoCopyTargets, &out_cdb(0x10, list_id, p.len()), p)
    }

    fn write_using(
        lu: &LogicalUnit,
        targets: &dyn CopyTargets,
        list_id: u32,
        p: &[u8],
    ) -> crate::Response {
        run(lu, targets, &out_cdb(0x11, list_id, p.len()), p)
    }

    fn information(lu: &LogicalUnit, list_id: u32) -> crate::Response {
        let mut c = [0u8; 16];
        c[0] = 0x84;
        c[1] = 0x07;
        c[2..6].copy_from_slice(&list_id.to_be_bytes());
        c[10..14].copy_from_slice(&4096u32.to_be_bytes());
        run(lu, &NoCopyTargets, &c, &[])
    }

    /// POPULATE TOKEN then RECEIVE ROD TOKEN INFORMATION: the token.
    fn token_for(lu: &LogicalUnit, p: &[u8]) -> Vec<u8> {
        good(&populate(lu, 7, p));
        let r = information(lu, 7);
        good(&r);
        let d = &r.data_in;
        assert_eq!(d[4], 0x10, "response to POPULATE TOKEN");
        assert_eq!(d[5], COPY_STATUS_SUCCESS);
        assert_eq!(be32(d, 32), 514, "ROD TOKEN DESCRIPTORS LENGTH");
        assert_eq!(be32(d, 0) as usize, d.len() - 4);
        d[38..38 + TOKEN_LEN].to_vec()
    }

    /// WRITE(16) through the device server, so the range locks see it.
    fn write16(lu: &LogicalUnit, lba: u64, data: &[u8]) {
        let mut c = [0u8; 16];
        c[0] = 0x8a;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&((data.len() / BS) as u32).to_be_bytes());
        good(&run(lu, &NoCopyTargets, &c, data));
    }

    #[test]
    fn a_token_copies_its_ranges_in_order_within_and_across_lus() {
        let a = array(2);
        let (src, dst) = (&a.lus[0], &a.lus[1]);
        write(src, 0, &pattern(256, 0x11));
        let token = token_for(src, &pt_params(None, 0, &[(10, 8), (100, 4), (50, 0)]));
        assert_eq!(be32(&token, 0), ROD_POINT_IN_TIME_CHANGE_VULNERABLE);
        assert_eq!(creator_naa(&token), Some(naa(0)));
        assert_eq!(be64(&token, 56), 12 * BS as u64, "bytes represented");
        let r = information(src, 7);
        assert_eq!(be64(&r.data_in, 16), 12, "TRANSFER COUNT in blocks");
        assert_eq!(r.data_in[15], UNITS_BLOCKS);

        let mut expected = read(src, 10, 8);
        expected.extend(read(src, 100, 4));
        // Across LUs, split over two destination ranges that cut a source range.
        let targets = Reachable(a.lus.clone());
        let p = wut_params(&token, 0, false, &[(1000, 5), (2000, 7)]);
        good(&write_using(dst, &targets, 9, &p));
        assert_eq!(read(dst, 1000, 5), expected[..5 * BS]);
        assert_eq!(read(dst, 2000, 7), expected[5 * BS..]);
        let r = information(dst, 9);
        good(&r);
        assert_eq!((r.data_in[4], r.data_in[5]), (0x11, COPY_STATUS_SUCCESS));
        assert_eq!(be64(&r.data_in, 16), 12);
        assert_eq!(
            be16(&r.data_in, 24),
            0,
            "SEGMENTS PROCESSED: none, there are no segments"
        );
        assert_eq!(be32(&r.data_in, 32), 0, "no token after WRITE USING TOKEN");

        // Within the source LU, from 9 blocks into the token.
        let p = wut_params(&token, 9, false, &[(3000, 3)]);
        good(&write_using(src, &NoCopyTargets, 9, &p));
        assert_eq!(read(src, 3000, 3), expected[9 * BS..]);
        assert!(src.stats().vaai.clone_read > 0 && dst.stats().vaai.clone_write > 0);
    }

    #[test]
    fn a_change_to_a_represented_block_revokes_a_point_in_time_token() {
        let a = array(1);
        let lu = &a.lus[0];
        write(lu, 0, &pattern(64, 0x22));
        let token = token_for(lu, &pt_params(None, 0, &[(8, 8)]));
        // Blocks next to the range do not matter.
        write16(lu, 0, &pattern(8, 0x33));
        write16(lu, 16, &pattern(8, 0x33));
        good(&write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(100, 8)]),
        ));
        assert_eq!(read(lu, 100, 8), read(lu, 8, 8));
        // One block inside it does.
        write16(lu, 15, &pattern(1, 0x44));
        let r = write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(200, 8)]),
        );
        assert_eq!(sense(&r), TOKEN_REVOKED);
        assert_eq!(read(lu, 200, 8), vec![0; 8 * BS], "nothing written");
        let r = information(lu, 1);
        assert_eq!(r.data_in[5], COPY_STATUS_FAILED);
        assert_eq!(r.data_in[12], Status::CheckCondition as u8);
        assert_eq!((r.data_in[32 + 12], r.data_in[32 + 13]), (0x23, 0x06));
        // So does UNMAP (here through WRITE SAME with UNMAP).
        let token = token_for(lu, &pt_params(None, 0, &[(8, 8)]));
        let mut c = [0u8; 16];
        c[0] = 0x93;
        c[1] = 0x08 | 0x01; // UNMAP, NDOB
        c[2..10].copy_from_slice(&12u64.to_be_bytes());
        c[10..14].copy_from_slice(&1u32.to_be_bytes());
        good(&run(lu, &NoCopyTargets, &c, &[]));
        let r = write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(200, 8)]),
        );
        assert_eq!(sense(&r), TOKEN_REVOKED);
    }

    #[test]
    fn a_successful_copy_never_mixes_data_from_before_and_after_the_token() {
        let a = std::sync::Arc::new(array(1));
        let lu = a.lus[0].clone();
        let old = pattern(256, 0x55);
        let new = pattern(256, 0xaa);
        let before = pattern(256, 0x0f);
        let mut copied = 0;
        for round in 0..40 {
            write(&lu, 0, &old);
            // A copy that wrote nothing or only part of the range shows as `before`.
            write(&lu, 1024, &before);
            let token = token_for(&lu, &pt_params(None, 0, &[(0, 256)]));
            let writer = {
                let lu = lu.clone();
                let new = new.clone();
                std::thread::spawn(move || {
                    for b in (0..8u64).rev().map(|i| i * 32) {
                        write16(&lu, b, &new[b as usize * BS..(b as usize + 32) * BS]);
                    }
                })
            };
            let r = write_using(
                &lu,
                &NoCopyTargets,
                round,
                &wut_params(&token, 0, false, &[(1024, 256)]),
            );
            writer.join().unwrap();
            if r.status == Status::Good {
                assert_eq!(read(&lu, 1024, 256), old, "round {round}: a mix");
                copied += 1;
            } else {
                assert_eq!(sense(&r), TOKEN_REVOKED);
            }
        }
        // Both outcomes are legal; the assertion above is what matters. Which one a round
        // gets depends on scheduling, so the next test forces the race.
        println!("{copied} of 40 copies finished before the writes");
    }

    #[test]
    fn a_change_while_the_token_is_copied_fails_the_copy_with_token_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            FileVolume::open(&dir.path().join(name), BLOCKS * BS as u64, BS as u32).unwrap()
        };
        let src = lu_over(Arc::new(open("src")), 0);
        write(&src, 0, &pattern(16, 0x10));
        let token = token_for(&src, &pt_params(None, 0, &[(0, 16)]));
        let writer = src.clone();
        // The change lands after WRITE USING TOKEN took its token, before any data moved.
        let dst = lu_over(
            Arc::new(ScriptedVolume::new(open("dst")).before_copy(move || {
                write16(&writer, 4, &pattern(1, 0x99));
            })),
            1,
        );
        let targets = Reachable(vec![src.clone(), dst.clone()]);
        let r = write_using(
            &dst,
            &targets,
            1,
            &wut_params(&token, 0, false, &[(100, 16)]),
        );
        // The copy did move the changed block, so only the check after it keeps this
        // from being a GOOD copy of mixed data.
        assert_eq!(read(&dst, 104, 1), pattern(1, 0x99));
        assert_eq!(sense(&r), TOKEN_REVOKED);
    }

    #[test]
    fn a_list_identifier_in_use_is_refused_until_its_command_ends() {
        let a = array(1);
        let lu = &a.lus[0];
        // As if a POPULATE TOKEN with LIST IDENTIFIER 5 were running on this nexus.
        lu.token_copy
            .record(&nexus(), 5, opcode::SA_POPULATE_TOKEN)
            .unwrap();
        let p = pt_params(None, 0, &[(0, 8)]);
        assert_eq!(sense(&populate(lu, 5, &p)), (0x5, 0x00, 0x16));
        assert_eq!(information(lu, 5).data_in[5], COPY_STATUS_IN_PROGRESS);
        good(&populate(lu, 6, &p));
        lu.token_copy.finish(&nexus(), 5, |r| {
            r.outcome = Some((Status::Good, None));
        });
        good(&populate(lu, 5, &p));
        assert_eq!(be32(&information(lu, 5).data_in, 32), 514, "the new result");
    }

    #[test]
    fn an_access_upon_reference_token_copies_what_the_ranges_hold_when_used() {
        let a = array(1);
        let lu = &a.lus[0];
        write(lu, 0, &pattern(16, 0x01));
        let token = token_for(
            lu,
            &pt_params(Some(ROD_ACCESS_UPON_REFERENCE), 0, &[(0, 16)]),
        );
        assert_eq!(be32(&token, 0), ROD_ACCESS_UPON_REFERENCE);
        write16(lu, 0, &pattern(16, 0x02));
        good(&write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(500, 16)]),
        ));
        assert_eq!(read(lu, 500, 16), pattern(16, 0x02));
    }

    #[test]
    fn the_zero_token_zeroes_the_ranges() {
        let a = array(1);
        let lu = &a.lus[0];
        write(lu, 0, &pattern(64, 0x77));
        let mut zero = [0u8; TOKEN_LEN];
        zero[0..4].copy_from_slice(&ROD_BLOCK_DEVICE_ZERO.to_be_bytes());
        zero[6..8].copy_from_slice(&TOKEN_LENGTH_FIELD.to_be_bytes());
        good(&write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&zero, 0, false, &[(4, 8), (40, 4)]),
        ));
        assert_eq!(read(lu, 4, 8), vec![0; 8 * BS]);
        assert_eq!(read(lu, 40, 4), vec![0; 4 * BS]);
        assert_eq!(read(lu, 0, 4), pattern(64, 0x77)[..4 * BS]);
        assert_eq!(read(lu, 12, 28), pattern(64, 0x77)[12 * BS..40 * BS]);
    }

    #[test]
    fn the_zero_token_is_held_to_the_maximum_token_transfer_size() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = 2 * MAX_TOKEN_TRANSFER_BYTES;
        let volume = FileVolume::open(&dir.path().join("big"), bytes, BS as u32).unwrap();
        let lu = lu_over(Arc::new(volume), 0);
        let mut zero = [0u8; TOKEN_LEN];
        zero[0..4].copy_from_slice(&ROD_BLOCK_DEVICE_ZERO.to_be_bytes());
        let max_blocks = (MAX_TOKEN_TRANSFER_BYTES / BS as u64) as u32;
        // Two ranges, together one block over the maximum.
        let p = wut_params(
            &zero,
            0,
            false,
            &[
                (0, max_blocks / 2),
                (u64::from(max_blocks), max_blocks / 2 + 1),
            ],
        );
        let r = write_using(&lu, &NoCopyTargets, 1, &p);
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 534);
    }

    #[test]
    fn unknown_altered_deleted_and_unreachable_tokens_are_refused() {
        let a = array(2);
        let (src, dst) = (&a.lus[0], &a.lus[1]);
        let token = token_for(src, &pt_params(None, 0, &[(0, 8)]));
        let targets = Reachable(a.lus.clone());
        let wut = |t: &[u8], del: bool, targets: &dyn CopyTargets| {
            write_using(dst, targets, 1, &wut_params(t, 0, del, &[(0, 8)]))
        };
        let mut altered = token.clone();
        altered[TOKEN_LEN - 1] ^= 1;
        assert_eq!(sense(&wut(&altered, false, &targets)), TOKEN_UNKNOWN);
        // The source LU is not reachable for this nexus.
        assert_eq!(sense(&wut(&token, false, &NoCopyTargets)), TOKEN_UNKNOWN);
        // DEL_TKN: this use works, the next finds nothing.
        good(&wut(&token, true, &targets));
        assert_eq!(sense(&wut(&token, false, &targets)), TOKEN_UNKNOWN);
        // A token nobody made.
        let mut forged = token.clone();
        forged[16..48].fill(0);
        assert_eq!(sense(&wut(&forged, false, &targets)), TOKEN_UNKNOWN);
    }

    #[test]
    fn a_token_expires_after_its_inactivity_timeout() {
        let a = array(1);
        let lu = &a.lus[0];
        let token = token_for(lu, &pt_params(None, 1, &[(0, 8)]));
        good(&write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(64, 8)]),
        ));
        std::thread::sleep(Duration::from_millis(2100));
        let r = write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 0, false, &[(64, 8)]),
        );
        assert_eq!(sense(&r), (0x5, 0x23, 0x07));
    }

    #[test]
    fn malformed_parameter_lists_are_refused_with_the_field_named() {
        let a = array(1);
        let lu = &a.lus[0];
        let pointer = |r: &crate::Response| u16::from_be_bytes([r.sense[16], r.sense[17]]);
        // Overlapping ranges: the second is named.
        let r = populate(lu, 1, &pt_params(None, 0, &[(0, 8), (4, 8)]));
        assert_eq!(sense(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(pointer(&r), 32);
        // Past the end of the LU.
        let r = populate(lu, 1, &pt_params(None, 0, &[(BLOCKS - 4, 8)]));
        assert_eq!(sense(&r), (0x5, 0x21, 0x00));
        // Inactivity timeout over the maximum; unsupported ROD type.
        let r = populate(lu, 1, &pt_params(None, MAX_INACTIVITY_SECS + 1, &[(0, 8)]));
        assert_eq!(
            (sense(&r), pointer(&r)),
            (INVALID_FIELD_IN_PARAMETER_LIST, 4)
        );
        let r = populate(lu, 1, &pt_params(Some(0x0080_0002), 0, &[(0, 8)]));
        assert_eq!(
            (sense(&r), pointer(&r)),
            (INVALID_FIELD_IN_PARAMETER_LIST, 8)
        );
        // RANGE DESCRIPTOR LENGTH not whole descriptors, or past the list.
        let mut p = pt_params(None, 0, &[(0, 8)]);
        p[PT_RANGES_LEN + 1] = 15;
        let r = populate(lu, 1, &p);
        assert_eq!(
            (sense(&r), pointer(&r)),
            (INVALID_FIELD_IN_PARAMETER_LIST, 14)
        );
        p[PT_RANGES_LEN + 1] = 32;
        assert_eq!(sense(&populate(lu, 1, &p)), (0x5, 0x1a, 0x00));
        // More descriptors than advertised.
        let many: Vec<(u64, u32)> = (0..=u64::from(MAX_RANGE_DESCRIPTORS))
            .map(|i| (i * 2, 1))
            .collect();
        let r = populate(lu, 1, &pt_params(None, 0, &many));
        assert_eq!(
            (sense(&r), pointer(&r)),
            ((0x5, 0x26, 0x08), 14),
            "TOO MANY SEGMENT DESCRIPTORS"
        );
        // A destination longer than the token past the offset; an offset past its end.
        let token = token_for(lu, &pt_params(None, 0, &[(0, 8)]));
        let r = write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 4, false, &[(64, 5)]),
        );
        assert_eq!(
            (sense(&r), pointer(&r)),
            (INVALID_FIELD_IN_PARAMETER_LIST, 534)
        );
        let r = write_using(
            lu,
            &NoCopyTargets,
            1,
            &wut_params(&token, 8, false, &[(64, 1)]),
        );
        assert_eq!(
            (sense(&r), pointer(&r)),
            (INVALID_FIELD_IN_PARAMETER_LIST, 8)
        );
        // A short WRITE USING TOKEN list; an unknown list identifier.
        assert_eq!(
            sense(&write_using(lu, &NoCopyTargets, 1, &[0; 100])),
            (0x5, 0x1a, 0x00)
        );
        assert_eq!(sense(&information(lu, 0xdead)), (0x5, 0x24, 0x00));
        // Zero-length lists do nothing.
        good(&populate(lu, 1, &[]));
    }

    #[test]
    fn the_third_party_copy_page_leads_with_the_block_device_rod_limits() {
        let a = array(1);
        let r = run(&a.lus[0], &NoCopyTargets, &[0x12, 1, 0x8f, 0x10, 0, 0], &[]);
        good(&r);
        let d = &r.data_in;
        assert_eq!(d[1], 0x8f);
        assert_eq!(be16(d, 4), 0x0000, "BDRL descriptor first");
        assert_eq!(be16(d, 6), 0x20);
        assert_eq!(be16(d, 8 + 6), MAX_RANGE_DESCRIPTORS);
        assert_eq!(be32(d, 8 + 8), MAX_INACTIVITY_SECS);
        assert_eq!(be32(d, 8 + 12), DEFAULT_INACTIVITY_SECS);
        assert_eq!(be64(d, 8 + 16), MAX_TOKEN_TRANSFER_BYTES / BS as u64);
        // ROD Token Features (0106h) and Supported ROD Types (0108h), found by walking the
        // page; descriptor offsets as SPC-4 numbers them.
        let mut at = 4;
        let mut found = std::collections::HashMap::new();
        while at + 4 <= d.len() {
            let len = be16(d, at + 2) as usize;
            found.insert(be16(d, at), &d[at..at + 4 + len]);
            at += 4 + len;
        }
        let f = found[&0x0106];
        assert_eq!(f.len(), 96);
        assert_eq!(f[4] & 0x0f, 0, "no remote tokens");
        assert_eq!(be32(f, 24), MAX_INACTIVITY_SECS);
        assert_eq!(be16(f, 46), 48);
        assert_eq!(
            (f[48] & 0x1f, be16(f, 50)),
            (0, 0x2c),
            "block device descriptor"
        );
        assert_eq!(be16(f, 54), 8, "4 KiB granularity in 512-byte blocks");
        assert_eq!(be64(f, 56), MAX_TOKEN_TRANSFER_BYTES);
        let types = found[&0x0108];
        let listed: Vec<u32> = (0..be16(types, 6) as usize / 64)
            .map(|i| be32(types, 8 + i * 64))
            .collect();
        assert!(listed.is_sorted(), "{listed:x?}");
        assert_eq!(listed.len(), 3);
        // INQUIRY says a copy manager is there (3PC).
        let r = run(&a.lus[0], &NoCopyTargets, &[0x12, 0, 0, 0, 96, 0], &[]);
        assert_eq!(r.data_in[5] & 0x08, 0x08);
    }
}
