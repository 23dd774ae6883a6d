//! Vital product data pages (INQUIRY with EVPD=1). The limits they advertise are in `limits`.

use crate::limits::{
    max_transfer_blocks, threshold_exponent, unmap_granularity_blocks,
    MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS,
    OPTIMAL_TRANSFER_BYTES,
};
use crate::lu::LogicalUnit;
use crate::Nexus;

const PAGE_SUPPORTED: u8 = 0x00;
const PAGE_SERIAL: u8 = 0x80;
const PAGE_DEVICE_ID: u8 = 0x83;
const PAGE_EXTENDED_INQUIRY: u8 = 0x86;
const PAGE_THIRD_PARTY_COPY: u8 = 0x8f;
const PAGE_BLOCK_LIMITS: u8 = 0xb0;
const PAGE_BLOCK_CHARACTERISTICS: u8 = 0xb1;
const PAGE_LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;

const SUPPORTED_PAGES: [u8; 8] = [
    PAGE_SUPPORTED,
    PAGE_SERIAL,
    PAGE_DEVICE_ID,
    PAGE_EXTENDED_INQUIRY,
    PAGE_THIRD_PARTY_COPY,
    PAGE_BLOCK_LIMITS,
    PAGE_BLOCK_CHARACTERISTICS,
    PAGE_LOGICAL_BLOCK_PROVISIONING,
];

/// The full page (header included), or `None` if we do not have it.
pub(crate) fn page(lu: &LogicalUnit, nexus: &Nexus, code: u8) -> Option<Vec<u8>> {
    let body = match code {
        PAGE_SUPPORTED => SUPPORTED_PAGES.to_vec(),
        PAGE_SERIAL => lu.config.serial.as_bytes().to_vec(),
        PAGE_DEVICE_ID => device_identification(lu, nexus),
        PAGE_EXTENDED_INQUIRY => extended_inquiry(),
        PAGE_THIRD_PARTY_COPY => crate::tpc::third_party_copy_page(lu),
        PAGE_BLOCK_LIMITS => block_limits(lu),
        PAGE_BLOCK_CHARACTERISTICS => block_characteristics(),
        PAGE_LOGICAL_BLOCK_PROVISIONING => logical_block_provisioning(lu),
        _ => return None,
    };
    let mut page = Vec::with_capacity(4 + body.len());
    page.push(0x00); // peripheral qualifier 000b, direct access block device
    page.push(code);
    page.extend_from_slice(&(u16::try_from(body.len()).unwrap_or(u16::MAX)).to_be_bytes());
    page.extend_from_slice(&body);
    Some(page)
}

/// Designator header fields (SPC-4 7.8.6.1).
const PROTOCOL_ISCSI: u8 = 0x5;
const CODE_SET_BINARY: u8 = 0x1;
const CODE_SET_UTF8: u8 = 0x3;
const ASSOC_LU: u8 = 0x0;
const ASSOC_TARGET_PORT: u8 = 0x1;
const ASSOC_TARGET_DEVICE: u8 = 0x2;
const TYPE_NAA: u8 = 0x3;
const TYPE_RELATIVE_TARGET_PORT: u8 = 0x4;
const TYPE_TARGET_PORT_GROUP: u8 = 0x5;
const TYPE_SCSI_NAME: u8 = 0x8;

fn designator(out: &mut Vec<u8>, code_set: u8, assoc: u8, kind: u8, value: &[u8]) {
    // PIV = 1 (the protocol identifier is valid) for port and device associations.
    let (protocol, piv) = if assoc == ASSOC_LU {
        (0, 0)
    } else {
        (PROTOCOL_ISCSI, 0x80)
    };
    out.push(protocol << 4 | code_set);
    out.push(piv | assoc << 4 | kind);
    out.push(0);
    out.push(u8::try_from(value.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(value);
}

/// A SCSI name string: UTF-8, null terminated, padded with nulls to a multiple of 4 bytes
/// and at most 256 bytes (SPC-4 7.8.6.11).
fn scsi_name(name: &str) -> Vec<u8> {
    let mut v: Vec<u8> = name.as_bytes().iter().copied().take(252).collect();
    v.push(0);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

fn device_identification(lu: &LogicalUnit, nexus: &Nexus) -> Vec<u8> {
    let c = &lu.config;
    let mut d = Vec::new();
    designator(&mut d, CODE_SET_BINARY, ASSOC_LU, TYPE_NAA, &c.naa);
    let port_name = format!("{},t,0x{:04x}", c.target_name, c.target_port_group);
    designator(
        &mut d,
        CODE_SET_UTF8,
        ASSOC_TARGET_PORT,
        TYPE_SCSI_NAME,
        &scsi_name(&port_name),
    );
    let rtp = nexus.relative_target_port.to_be_bytes();
    designator(
        &mut d,
        CODE_SET_BINARY,
        ASSOC_TARGET_PORT,
        TYPE_RELATIVE_TARGET_PORT,
        &[0, 0, rtp[0], rtp[1]],
    );
    let tpg = c.target_port_group.to_be_bytes();
    designator(
        &mut d,
        CODE_SET_BINARY,
        ASSOC_TARGET_PORT,
        TYPE_TARGET_PORT_GROUP,
        &[0, 0, tpg[0], tpg[1]],
    );
    designator(
        &mut d,
        CODE_SET_UTF8,
        ASSOC_TARGET_DEVICE,
        TYPE_SCSI_NAME,
        &scsi_name(&c.target_name),
    );
    d
}

fn extended_inquiry() -> Vec<u8> {
    let mut b = vec![0u8; 60];
    // Byte 5 (body offset 1): HEADSUP, ORDSUP, SIMPSUP.
    b[1] = 0x07;
    // Byte 6: V_SUP (volatile cache supported; SYNCHRONIZE CACHE makes it durable).
    b[2] = 0x01;
    // Byte 7: LUICLR (unit attentions are kept and cleared per I_T nexus).
    b[3] = 0x01;
    b
}

fn block_limits(lu: &LogicalUnit) -> Vec<u8> {
    let bs = lu.volume.block_size().max(1) as u64;
    let put32 = |b: &mut Vec<u8>, at: usize, v: u64| {
        let v = u32::try_from(v).unwrap_or(u32::MAX);
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    };
    let mut b = vec![0u8; 60];
    // Body offsets are page offsets - 4.
    b[1] = MAX_COMPARE_AND_WRITE_BLOCKS as u8;
    let physical = 1u16 << lu.volume.physical_block_exponent().min(15);
    b[2..4].copy_from_slice(&physical.to_be_bytes()); // optimal transfer length granularity
    put32(&mut b, 4, max_transfer_blocks(lu.volume.block_size()));
    put32(&mut b, 8, OPTIMAL_TRANSFER_BYTES / bs);
    put32(&mut b, 16, MAX_UNMAP_BLOCKS);
    put32(&mut b, 20, MAX_UNMAP_DESCRIPTORS as u64);
    put32(&mut b, 24, unmap_granularity_blocks(lu.volume.block_size()));
    b[28] = 0x80; // UGAVALID, alignment 0
    b[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
    // MAXIMUM ATOMIC TRANSFER LENGTH; alignment and granularity 0 (none required); atomic
    // boundaries unsupported (both boundary fields 0).
    put32(&mut b, 40, lu.volume.max_atomic_write_bytes() / bs);
    b
}

fn block_characteristics() -> Vec<u8> {
    let mut b = vec![0u8; 60];
    b[1] = 0x01; // MEDIUM ROTATION RATE 1: non-rotating (solid state)
                 // WABEREQ=01b: after SANITIZE BLOCK ERASE reads succeed (and return zeros: LBPRZ).
                 // WACEREQ=00b: CRYPTO ERASE is not supported.
    b[3] = 0x40;
    b
}

fn logical_block_provisioning(lu: &LogicalUnit) -> Vec<u8> {
    vec![
        threshold_exponent(lu.volume.block_size()),
        // LBPU, LBPWS, LBPWS10, LBPRZ=001b (unmapped blocks, deallocated or anchored, read
        // as zeros); ANC_SUP when the volume keeps anchored blocks; DP=0.
        0x80 | 0x40 | 0x20 | 0x04 | if lu.volume.supports_anchor() { 0x02 } else { 0 },
        0x02, // PROVISIONING TYPE: thin
        0,
    ]
}
