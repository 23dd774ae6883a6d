//! The Third-party Copy VPD page (SPC-4 7.8.17): what the copy manager takes, for EXTENDED
//! COPY and for ROD tokens. The token copy limits come first: Windows looks for them before
//! using ODX.

use super::lid1::{
    IMPLEMENTED_DESCRIPTORS, MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_BYTES, MAX_SEGMENT_BYTES,
    MAX_SEGMENT_DESCRIPTORS,
};
use super::receive::data_segment_granularity;
use super::results::RETAINED_RESULTS;
use super::rod::{
    DEFAULT_INACTIVITY_SECS, MAX_INACTIVITY_SECS, MAX_RANGE_DESCRIPTORS, MAX_TOKEN_TRANSFER_BYTES,
    ROD_ACCESS_UPON_REFERENCE, ROD_BLOCK_DEVICE_ZERO, ROD_POINT_IN_TIME_CHANGE_VULNERABLE,
};
use crate::cdb::opcode;
use crate::lu::LogicalUnit;

/// Third-party copy descriptor type codes.
const TPC_BLOCK_DEVICE_ROD_LIMITS: u16 = 0x0000;
const TPC_SUPPORTED_COMMANDS: u16 = 0x0001;
const TPC_PARAMETER_DATA: u16 = 0x0004;
const TPC_SUPPORTED_DESCRIPTORS: u16 = 0x0008;
const TPC_SUPPORTED_CSCD_IDS: u16 = 0x000c;
const TPC_ROD_TOKEN_FEATURES: u16 = 0x0106;
const TPC_SUPPORTED_ROD_TYPES: u16 = 0x0108;
const TPC_GENERAL_COPY_OPERATIONS: u16 = 0x8001;

/// One third-party copy descriptor, its body padded to a multiple of 4 bytes.
pub(crate) fn tpc_descriptor(out: &mut Vec<u8>, kind: u16, mut body: Vec<u8>) {
    body.resize(body.len().next_multiple_of(4), 0);
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(u16::try_from(body.len()).unwrap_or(u16::MAX)).to_be_bytes());
    out.extend_from_slice(&body);
}

/// The page body (after the 4-byte VPD header). The token copy limits come first: Windows
/// looks for them before using ODX.
pub(crate) fn third_party_copy_page(lu: &LogicalUnit) -> Vec<u8> {
    let mut page = Vec::new();

    tpc_descriptor(
        &mut page,
        TPC_BLOCK_DEVICE_ROD_LIMITS,
        block_device_rod_limits(lu),
    );

    let commands = [
        opcode::EXTENDED_COPY,
        3,
        opcode::SA_EXTENDED_COPY_LID1,
        opcode::SA_POPULATE_TOKEN,
        opcode::SA_WRITE_USING_TOKEN,
        opcode::RECEIVE_COPY_RESULTS,
        4,
        opcode::SA_COPY_STATUS,
        opcode::SA_OPERATING_PARAMETERS,
        opcode::SA_FAILED_SEGMENT_DETAILS,
        opcode::SA_RECEIVE_ROD_TOKEN_INFORMATION,
    ];
    let mut body = vec![commands.len() as u8];
    body.extend_from_slice(&commands);
    tpc_descriptor(&mut page, TPC_SUPPORTED_COMMANDS, body);

    let mut body = vec![0u8; 28];
    body[4..6].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    body[6..8].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    body[8..12].copy_from_slice(&MAX_DESCRIPTOR_LIST_BYTES.to_be_bytes());
    // MAXIMUM INLINE DATA LENGTH (body 12..16): 0.
    tpc_descriptor(&mut page, TPC_PARAMETER_DATA, body);

    let mut body = vec![IMPLEMENTED_DESCRIPTORS.len() as u8];
    body.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
    tpc_descriptor(&mut page, TPC_SUPPORTED_DESCRIPTORS, body);

    // No CSCD descriptor IDs (such as FFFFh, "this copy manager") are supported.
    tpc_descriptor(&mut page, TPC_SUPPORTED_CSCD_IDS, vec![0, 0]);

    tpc_descriptor(&mut page, TPC_ROD_TOKEN_FEATURES, rod_token_features(lu));

    tpc_descriptor(&mut page, TPC_SUPPORTED_ROD_TYPES, supported_rod_types());

    let mut body = vec![0u8; 32];
    body[0..4].copy_from_slice(&(RETAINED_RESULTS as u32).to_be_bytes());
    body[4..8].copy_from_slice(&(RETAINED_RESULTS as u32).to_be_bytes());
    body[8..12].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    body[12] = data_segment_granularity(lu);
    tpc_descriptor(&mut page, TPC_GENERAL_COPY_OPERATIONS, body);

    page
}

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
    let granularity = crate::limits::unmap_granularity_blocks(lu.volume.block_size());
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
