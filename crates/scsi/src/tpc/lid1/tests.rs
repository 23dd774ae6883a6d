use std::sync::Arc;

use super::*;
use crate::test_kit::{file_volume, good, nexus, request, sense_codes, TestVolume, BS};
use crate::tpc::test_kit::*;
use crate::Status;
use crate::{NoCopyTargets, Response};

fn cscd(naa: [u8; 16], block_length: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xe4;
    d[4] = 0x01; // binary
    d[5] = 0x03; // association LU, NAA
    d[7] = 16;
    d[8..24].copy_from_slice(&naa);
    d[29..32].copy_from_slice(&block_length.to_be_bytes()[1..]);
    d
}

/// A segment descriptor of type `code` and `len` bytes with the fields block-to-block types
/// share: the CSCD indexes and the LBAs.
fn segment(
    code: u8,
    len: usize,
    (src, dst): (u16, u16),
    (src_lba, dst_lba): (u64, u64),
) -> Vec<u8> {
    let mut d = vec![0u8; len];
    d[0] = code;
    // DESCRIPTOR LENGTH counts the bytes after it.
    d[2..4].copy_from_slice(&(len as u16 - 4).to_be_bytes());
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

fn b2b(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = segment(0x02, 28, (src, dst), (src_lba, dst_lba));
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d
}

fn b2b_offsets(src: u16, dst: u16, bytes: u32, lbas: (u64, u64), offsets: (u16, u16)) -> Vec<u8> {
    let mut d = segment(0x0a, 32, (src, dst), lbas);
    d[8..12].copy_from_slice(&bytes.to_be_bytes());
    d[28..30].copy_from_slice(&offsets.0.to_be_bytes());
    d[30..32].copy_from_slice(&offsets.1.to_be_bytes());
    d
}

/// A parameter list with LIST ID USAGE `usage` (2 bits).
fn params(list_id: u8, usage: u8, cscds: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
    let cscd_len: usize = cscds.iter().map(Vec::len).sum();
    let segment_len: usize = segments.iter().map(Vec::len).sum();
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    p[2..4].copy_from_slice(&(cscd_len as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(segment_len as u32).to_be_bytes());
    p.extend(cscds.iter().flatten());
    p.extend(segments.iter().flatten());
    p
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn xcopy(lu: &LogicalUnit, targets: &dyn CopyTargets, p: &[u8]) -> Response {
    run(lu, targets, &xcopy_cdb(p.len()), p)
}

/// EXTENDED COPY received by `lu`, which reaches no other LU, of a list with identifier
/// `list_id` whose result is kept (LIST ID USAGE 00b).
fn xcopy_alone(lu: &LogicalUnit, list_id: u8, cscds: &[Vec<u8>], segments: &[Vec<u8>]) -> Response {
    xcopy(lu, &NoCopyTargets, &params(list_id, 0, cscds, segments))
}

/// Writes `data` at `src_lba` of `lu` (LU 0 of its array), copies it to `dst_lba` with an
/// EXTENDED COPY of list identifier `list_id`, and checks that it arrived.
fn copy_within(lu: &LogicalUnit, list_id: u8, data: &[u8], src_lba: u64, dst_lba: u64) {
    let blocks = data.len() / BS;
    write(lu, src_lba, data);
    let segment = b2b(0, 0, blocks as u16, src_lba, dst_lba);
    good(&xcopy_alone(lu, list_id, &[cscd(naa(0), 512)], &[segment]));
    assert!(read(lu, dst_lba, blocks) == data);
}

fn results(lu: &LogicalUnit, action: u8, list_id: u8) -> Response {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = action;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    run(lu, &NoCopyTargets, &c, &[])
}
const COPY_TARGET_NOT_REACHABLE: (u8, u8, u8) = (0xa, 0x0d, 0x02);
const PARAMETER_LIST_LENGTH_ERROR: (u8, u8, u8) = (0x5, 0x1a, 0x00);
const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8, u8) = (0x5, 0x26, 0x00);

/// The bound on what the whole of `list` copies, as dispatch reads it.
fn copy_bytes_at_most(list: &[u8]) -> Option<u64> {
    CopyList::read(list.len(), list).bytes_at_most()
}

#[test]
fn the_copy_bound_counts_every_segment_at_the_largest_block_size() {
    let targets = [cscd(naa(0), 512), cscd(naa(1), 512)];
    let one = params(0, 0b11, &targets, &[b2b(0, 1, 4096, 0, 0)]);
    assert_eq!(copy_bytes_at_most(&one), Some(4096 * 4096));
    let two = params(
        0,
        0b11,
        &targets,
        &[b2b(0, 1, 8, 0, 0), b2b_offsets(0, 1, 1000, (0, 0), (3, 7))],
    );
    assert_eq!(copy_bytes_at_most(&two), Some(8 * 4096 + 1000 + 2 * 4096));
    assert_eq!(copy_bytes_at_most(&one[..one.len() - 1]), None, "cut short");
    assert_eq!(
        copy_bytes_at_most(&[]),
        Some(0),
        "a zero-length list copies nothing"
    );
}

#[test]
fn copy_within_one_lu_and_its_copy_status() {
    let a = array(1);
    let lu = &a.lus[0];
    copy_within(lu, 5, &pattern(100, 7), 10, 1000);

    let r = results(lu, 0x00, 5);
    good(&r);
    assert_eq!(r.data_in.len(), 12);
    assert_eq!(u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()), 8);
    assert_eq!(r.data_in[4], 0x01, "completed without errors");
    assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 1);
    assert_eq!(r.data_in[7], 0, "bytes");
    assert_eq!(
        u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
        100 * 512
    );
    // No failure to detail: status GOOD, no sense.
    let r = results(lu, 0x04, 5);
    good(&r);
    assert_eq!(r.data_in.len(), 60);
    assert_eq!((r.data_in[56], r.data_in[58], r.data_in[59]), (0, 0, 0));
}

#[test]
fn overlapping_copy_within_one_lu_is_a_memmove() {
    let a = array(1);
    let lu = &a.lus[0];
    // Destination overlaps the end of the source: a forward copy would re-read its own
    // output.
    copy_within(lu, 1, &pattern(3000, 1), 0, 500);
}

#[test]
fn copy_across_lus_in_both_directions_and_several_segments() {
    let a = array(3);
    let (receiving, other) = (&a.lus[0], &a.lus[1]);
    let reachable = Reachable(a.lus.clone());
    let data = pattern(64, 3);
    write(other, 0, &data);
    // QEMU's shape: sent to the destination LU, CSCD 0 = source, CSCD 1 = destination.
    let cscds = [cscd(naa(1), 512), cscd(naa(0), 512)];
    let p = params(1, 2, &cscds, &[b2b(0, 1, 64, 0, 200)]);
    good(&xcopy(receiving, &reachable, &p));
    assert!(read(receiving, 200, 64) == data);

    // Receiving LU as the source, other LUs as destinations, three segments.
    let cscds = [cscd(naa(0), 512), cscd(naa(1), 512), cscd(naa(2), 512)];
    let segments = [
        b2b(0, 1, 32, 200, 1000),
        b2b(0, 2, 32, 232, 2000),
        b2b(2, 1, 32, 2000, 1032),
    ];
    good(&xcopy(
        receiving,
        &reachable,
        &params(2, 0, &cscds, &segments),
    ));
    assert!(read(other, 1000, 64) == data);
    assert!(read(&a.lus[2], 2000, 32) == data[32 * BS..]);
    let r = results(receiving, 0x00, 2);
    good(&r);
    assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 3);

    // esxtop's CLONE_RD / CLONE_WR: segments read from and written to each LU.
    let vaai = |i: usize| a.lus[i].stats().vaai;
    assert_eq!((vaai(0).clone_read, vaai(0).clone_write), (2, 1));
    assert_eq!((vaai(1).clone_read, vaai(1).clone_write), (1, 2));
    assert_eq!((vaai(2).clone_read, vaai(2).clone_write), (1, 1));
    assert_eq!(vaai(1).cloned_bytes, 64 * BS as u64);
    assert_eq!(vaai(0).clone_failed, 0);
    let copies = receiving.stats();
    let c = copies.class(crate::CommandClass::ExtendedCopy);
    assert_eq!((c.commands, c.errors, c.bytes), (2, 0, 160 * BS as u64));
}

#[test]
fn unreachable_copy_targets_abort_the_copy() {
    let a = array(2);
    let (receiving, other) = (&a.lus[0], &a.lus[1]);
    write(other, 0, &pattern(8, 9));
    let cscds = [cscd(naa(1), 512), cscd(naa(0), 512)];
    // The LU exists but this nexus may not reach it: nothing found, nothing copied.
    let r = xcopy_alone(receiving, 1, &cscds, &[b2b(0, 1, 8, 0, 0)]);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    assert!(read(receiving, 0, 8).iter().all(|&b| b == 0));
    // An NAA nobody has.
    let cscds = [cscd(naa(9), 512), cscd(naa(0), 512)];
    let p = params(1, 0, &cscds, &[b2b(0, 1, 8, 0, 0)]);
    let r = xcopy(receiving, &Reachable(a.lus.clone()), &p);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    // The segment pointer (SD = 0) names the designator of CSCD 0.
    assert_eq!(r.sense[15], 0x80);
    assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 16 + 4);
    // A designator that is not an NAA LU designator cannot name one of our LUs.
    let mut t10 = cscd(naa(0), 512);
    t10[5] = 0x01;
    let r = xcopy_alone(receiving, 1, &[t10], &[b2b(0, 0, 8, 0, 8)]);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    // A CSCD index beyond the list (libiscsi ExtendedCopy.ValidateSegDescr).
    let r = xcopy_alone(receiving, 1, &[cscd(naa(0), 512)], &[b2b(0, 1, 8, 0, 8)]);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    // The failure is recorded for the list identifier.
    let r = results(receiving, 0x00, 1);
    good(&r);
    assert_eq!(r.data_in[4], 0x02);
    let vaai = receiving.stats().vaai;
    assert_eq!((vaai.clone_failed, vaai.clone_write), (4, 0));
}

#[test]
fn other_lus_reservations_apply_to_the_copy() {
    let a = array(2);
    let (receiving, other) = (&a.lus[0], &a.lus[1]);
    let reachable = Reachable(a.lus.clone());
    // Another initiator holds LU 1 with RESERVE(6).
    let holder = nexus(2);
    let reserve = |lu: &LogicalUnit| {
        let reserve6 = [0x16, 0, 0, 0, 0, 0];
        lu.execute(&request(&holder, &reserve6, &[], &[0, 1], &NoCopyTargets))
    };
    reserve(other); // power-on unit attention
    good(&reserve(other));
    write(receiving, 0, &pattern(8, 4));
    let cscds = [cscd(naa(0), 512), cscd(naa(1), 512)];
    let p = params(1, 0, &cscds, &[b2b(0, 1, 8, 0, 0)]);
    assert_eq!(
        sense_codes(&xcopy(receiving, &reachable, &p)),
        COPY_TARGET_NOT_REACHABLE
    );
    assert!(read(other, 0, 8).iter().all(|&b| b == 0));
}

#[test]
fn ranges_are_checked_on_both_sides_before_any_copying() {
    let a = array(1);
    let lu = &a.lus[0];
    write(lu, 0, &pattern(16, 2));
    let t = [cscd(naa(0), 512)];
    // First segment fine, second out of range on the destination: nothing is copied.
    let segments = [b2b(0, 0, 16, 0, 100), b2b(0, 0, 16, 0, BLOCKS - 15)];
    let r = xcopy_alone(lu, 1, &t, &segments);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    assert_eq!(
        u16::from_be_bytes([r.sense[16], r.sense[17]]) as usize,
        16 + 32 + 28 + 20
    );
    assert!(read(lu, 100, 16).iter().all(|&b| b == 0));
    let r = results(lu, 0x00, 1);
    assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 0);
    // Source side, and LBAs that overflow.
    for seg in [
        b2b(0, 0, 2, BLOCKS - 1, 0),
        b2b(0, 0, 2, u64::MAX, 0),
        b2b(0, 0, 2, 0, u64::MAX),
    ] {
        let r = xcopy_alone(lu, 1, &t, &[seg]);
        assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);
    }
    // Exactly up to the end is fine.
    good(&xcopy_alone(lu, 1, &t, &[b2b(0, 0, 16, 0, BLOCKS - 16)]));
}

#[test]
fn descriptor_limits() {
    let a = array(1);
    let lu = &a.lus[0];
    let t = cscd(naa(0), 512);
    let s = b2b(0, 0, 1, 0, 1);
    let max_t = MAX_CSCD_DESCRIPTORS as usize;
    let max_s = MAX_SEGMENT_DESCRIPTORS as usize;
    // The advertised maxima are accepted together.
    good(&xcopy_alone(
        lu,
        1,
        &vec![t.clone(); max_t],
        &vec![s.clone(); max_s],
    ));
    let r = xcopy_alone(lu, 1, &vec![t.clone(); max_t + 1], std::slice::from_ref(&s));
    assert_eq!(sense_codes(&r), (0x5, 0x26, 0x06));
    let r = xcopy_alone(lu, 1, std::slice::from_ref(&t), &vec![s.clone(); max_s + 1]);
    assert_eq!(sense_codes(&r), (0x5, 0x26, 0x08));
    // Descriptor lists longer than MAXIMUM DESCRIPTOR LIST LENGTH (libiscsi's third case).
    let r = xcopy_alone(lu, 1, &vec![t.clone(); max_t + 1], &vec![s; 73]);
    assert_eq!(sense_codes(&r), PARAMETER_LIST_LENGTH_ERROR);
    // Refused lists leave the result of the accepted one alone.
    let r = results(lu, 0x00, 1);
    good(&r);
    assert_eq!(r.data_in[4], 0x01);
    assert_eq!(
        u16::from_be_bytes([r.data_in[5], r.data_in[6]]),
        MAX_SEGMENT_DESCRIPTORS
    );
}

#[test]
fn unsupported_descriptor_types() {
    let a = array(1);
    let lu = &a.lus[0];
    let (lu_0, one_block) = (cscd(naa(0), 512), b2b(0, 0, 1, 0, 1));
    let mut fc = lu_0.clone();
    fc[0] = 0xe0;
    let r = xcopy_alone(lu, 1, &[fc], std::slice::from_ref(&one_block));
    assert_eq!(sense_codes(&r), (0x5, 0x26, 0x07));
    assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 16);
    let ipv6 = {
        let mut d = vec![0u8; 64];
        d[0] = 0xea;
        d
    };
    // Stream-to-stream (03h), as libiscsi ExtendedCopy.DescrType sends it.
    let mut stream = vec![0u8; 20];
    stream[0] = 0x03;
    stream[3] = 0x10;
    let mut short = one_block.clone();
    short[3] = 0x14;
    let mut tape = lu_0.clone();
    tape[1] = 0x01;
    for (refused, cscd, segment, expected) in [
        ("an IPv6 CSCD", ipv6, &one_block, (0x5, 0x26, 0x07)),
        (
            "a stream-to-stream segment",
            lu_0.clone(),
            &stream,
            (0x5, 0x26, 0x09),
        ),
        (
            "a known type with the wrong DESCRIPTOR LENGTH",
            lu_0.clone(),
            &short,
            INVALID_FIELD_IN_PARAMETER_LIST,
        ),
        (
            "a non-block peripheral device type",
            tape,
            &one_block,
            INVALID_FIELD_IN_PARAMETER_LIST,
        ),
        (
            "the wrong block length",
            cscd(naa(0), 4096),
            &one_block,
            INVALID_FIELD_IN_PARAMETER_LIST,
        ),
    ] {
        let r = xcopy_alone(lu, 1, &[cscd], std::slice::from_ref(segment));
        assert_eq!(sense_codes(&r), expected, "{refused}");
    }
    // LU ID TYPE is ignored (SPC-4), as libiscsi ExtendedCopy.ValidateTgtDescr expects.
    let mut lu_id = lu_0;
    lu_id[1] = 0xc0;
    good(&xcopy_alone(lu, 1, &[lu_id], &[one_block]));
}

#[test]
fn parameter_list_lengths_and_header_fields() {
    let a = array(1);
    let lu = &a.lus[0];
    let p = params(1, 0, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]);
    // Zero length: nothing to do, not an error.
    good(&run(lu, &NoCopyTargets, &xcopy_cdb(0), &[]));
    // Truncating the CSCD list or the segment list (libiscsi ExtendedCopy.Param).
    for len in [10, 16 + 31, 16 + 32 + 27] {
        let r = run(lu, &NoCopyTargets, &xcopy_cdb(len), &p[..len]);
        assert_eq!(sense_codes(&r), PARAMETER_LIST_LENGTH_ERROR, "{len}");
    }
    // Larger than any list we take.
    let huge = 16 + MAX_DESCRIPTOR_LIST_BYTES as usize + 1;
    let r = run(lu, &NoCopyTargets, &xcopy_cdb(huge), &vec![0; huge]);
    assert_eq!(sense_codes(&r), PARAMETER_LIST_LENGTH_ERROR);
    // Data-Out shorter than the CDB says.
    let r = run(lu, &NoCopyTargets, &xcopy_cdb(p.len()), &p[..20]);
    assert_eq!(sense_codes(&r), (0x5, 0x0e, 0x03));
    // Inline data is not taken.
    let mut inline = p.clone();
    inline[15] = 4;
    inline.extend_from_slice(&[0; 4]);
    let r = xcopy(lu, &NoCopyTargets, &inline);
    assert_eq!(sense_codes(&r), INVALID_FIELD_IN_PARAMETER_LIST);
    assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 12);
    // LIST ID USAGE 01b is reserved; 11b copies without keeping a result.
    let r = xcopy(
        lu,
        &NoCopyTargets,
        &params(7, 1, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]),
    );
    assert_eq!(sense_codes(&r), INVALID_FIELD_IN_PARAMETER_LIST);
    good(&xcopy(
        lu,
        &NoCopyTargets,
        &params(7, 3, &[cscd(naa(0), 512)], &[b2b(0, 0, 8, 0, 8)]),
    ));
    assert_eq!(sense_codes(&results(lu, 0x00, 7)), (0x5, 0x24, 0x00));
}

#[test]
fn block_to_block_with_offsets_whole_blocks_only() {
    let a = array(1);
    let lu = &a.lus[0];
    let data = pattern(4, 5);
    write(lu, 40, &data);
    let t = [cscd(naa(0), 512)];
    good(&xcopy_alone(
        lu,
        1,
        &t,
        &[b2b_offsets(0, 0, 2048, (40, 80), (0, 0))],
    ));
    assert!(read(lu, 80, 4) == data);
    for (bytes, offsets, field) in [(2048, (1, 0), 28), (2048, (0, 3), 30), (2000, (0, 0), 8)] {
        let seg = b2b_offsets(0, 0, bytes, (40, 80), offsets);
        let r = xcopy_alone(lu, 1, &t, &[seg]);
        assert_eq!(sense_codes(&r), INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(
            u16::from_be_bytes([r.sense[16], r.sense[17]]) as usize,
            16 + 32 + field
        );
    }
    let too_long = b2b_offsets(0, 0, MAX_SEGMENT_BYTES + 512, (0, 0), (0, 0));
    let r = xcopy_alone(lu, 1, &t, &[too_long]);
    assert_eq!(sense_codes(&r), INVALID_FIELD_IN_PARAMETER_LIST);
}

#[test]
fn failed_segment_is_reported_by_receive_copy_results() {
    let dir = tempfile::tempdir().unwrap();
    let inner = file_volume(dir.path(), "f", BLOCKS);
    let lu = lu_over(Arc::new(TestVolume::new(inner).failing_from(2000)), 0);
    let t = [cscd(naa(0), 512)];
    let segments = [
        b2b(0, 0, 8, 0, 1000),
        b2b(0, 0, 8, 0, 1996),
        b2b(0, 0, 8, 0, 100),
    ];
    let r = xcopy_alone(&lu, 9, &t, &segments);
    assert_eq!(sense_codes(&r), COPY_TARGET_NOT_REACHABLE);

    let r = results(&lu, 0x00, 9);
    good(&r);
    assert_eq!(r.data_in[4], 0x02, "completed with errors");
    assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 1);
    assert_eq!(
        u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
        8 * 512
    );

    let r = results(&lu, 0x04, 9);
    good(&r);
    assert_eq!(r.data_in[56], Status::CheckCondition as u8);
    let sense_len = u16::from_be_bytes([r.data_in[58], r.data_in[59]]) as usize;
    assert_eq!(r.data_in.len(), 60 + sense_len);
    assert_eq!(
        u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()) as usize,
        56 + sense_len
    );
    let sense = &r.data_in[60..];
    assert_eq!(
        (sense[2] & 0x0f, sense[12], sense[13]),
        COPY_TARGET_NOT_REACHABLE
    );

    // Other nexuses and unknown list identifiers see nothing.
    assert_eq!(sense_codes(&results(&lu, 0x00, 10)), (0x5, 0x24, 0x00));
    lu.nexus_lost(&nexus(1));
    assert_eq!(sense_codes(&results(&lu, 0x04, 9)), (0x5, 0x24, 0x00));
}

#[test]
fn operating_parameters_and_vpd_page() {
    let a = array(1);
    let lu = &a.lus[0];
    let r = results(lu, 0x03, 0);
    good(&r);
    let d = &r.data_in;
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        d.len() - 4
    );
    assert_eq!(u16::from_be_bytes([d[8], d[9]]), 64);
    assert_eq!(u16::from_be_bytes([d[10], d[11]]), 64);
    assert_eq!(u32::from_be_bytes(d[12..16].try_into().unwrap()), 4096);
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), 256 << 20);
    assert_eq!(
        u32::from_be_bytes(d[20..24].try_into().unwrap()),
        0,
        "no inline data"
    );
    assert_eq!(d[37], 9, "granularity: one 512-byte block");
    assert_eq!(d[43], 3);
    assert_eq!(&d[44..47], &[0x02, 0x0a, 0xe4]);
    // The largest lists the parameters allow must fit the descriptor list length.
    assert!(64 * 32 + 64 * 32 <= u32::from_be_bytes(d[12..16].try_into().unwrap()));

    // RECEIVE DATA (01h) is not implemented.
    assert_eq!(sense_codes(&results(lu, 0x01, 0)), (0x5, 0x20, 0x00));

    let r = run(lu, &NoCopyTargets, &[0x12, 1, 0x8f, 0x04, 0, 0], &[]);
    good(&r);
    let page = &r.data_in;
    assert_eq!(
        u16::from_be_bytes([page[2], page[3]]) as usize,
        page.len() - 4
    );
    let mut at = 4;
    let mut kinds = Vec::new();
    while at < page.len() {
        let kind = u16::from_be_bytes([page[at], page[at + 1]]);
        let len = u16::from_be_bytes([page[at + 2], page[at + 3]]) as usize;
        assert_eq!(len % 4, 0);
        if kind == 0x0001 {
            // libiscsi looks for RECEIVE COPY RESULTS / COPY STATUS here; the token
            // commands (10h, 11h, 07h) follow the LID1 ones.
            let list = &page[at + 5..at + 5 + page[at + 4] as usize];
            assert_eq!(
                list,
                &[0x83, 3, 0x00, 0x10, 0x11, 0x84, 4, 0x00, 0x03, 0x04, 0x07]
            );
        }
        kinds.push(kind);
        at += 4 + len;
    }
    assert_eq!(at, page.len());
    assert_eq!(
        kinds,
        [0x0000, 0x0001, 0x0004, 0x0008, 0x000c, 0x0106, 0x0108, 0x8001]
    );
}

#[test]
fn report_supported_operation_codes_lists_the_copy_commands() {
    let a = array(1);
    let lu = &a.lus[0];
    let rsoc = |op: u8, sa: u16| {
        let mut c = [0u8; 12];
        c[0] = 0xa3;
        c[1] = 0x0c;
        c[2] = 0x02;
        c[3] = op;
        c[4..6].copy_from_slice(&sa.to_be_bytes());
        c[9] = 64;
        run(lu, &NoCopyTargets, &c, &[])
    };
    for (op, sa) in [(0x83, 0x00), (0x84, 0x00), (0x84, 0x03), (0x84, 0x04)] {
        let r = rsoc(op, sa);
        good(&r);
        assert_eq!(r.data_in[1] & 0x07, 0x03, "{op:#x}/{sa:#x}");
        assert_eq!(&r.data_in[4..6], &[op, sa as u8]);
    }
    for (op, sa) in [(0x83, 0x01), (0x84, 0x01)] {
        assert_eq!(rsoc(op, sa).data_in[1] & 0x07, 0x01);
    }
}

/// Deterministic xorshift, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn malformed_parameter_lists_never_panic() {
    let a = array(2);
    let lu = &a.lus[0];
    let reachable = Reachable(a.lus.clone());
    let valid = params(
        1,
        0,
        &[cscd(naa(0), 512), cscd(naa(1), 512)],
        &[b2b(0, 1, 4, 0, 8), b2b_offsets(1, 0, 1024, (8, 16), (0, 0))],
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut outcomes = [0usize; 2];
    for round in 0..3000 {
        let p: Vec<u8> = if round % 2 == 0 {
            // Random bytes behind a header whose lengths are small enough to matter.
            let mut p: Vec<u8> = (0..rng.below(400)).map(|_| rng.next() as u8).collect();
            if p.len() >= 16 && round % 4 == 0 {
                p[2..4].copy_from_slice(&(rng.below(200) as u16).to_be_bytes());
                p[8..12].copy_from_slice(&(rng.below(200) as u32).to_be_bytes());
                p[12..16].fill(0);
            }
            p
        } else {
            // A valid list with a few bytes changed.
            let mut p = valid.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(p.len());
                p[i] = rng.next() as u8;
            }
            p
        };
        let r = xcopy(lu, &reachable, &p);
        assert_eq!(r.sense.is_empty(), r.status == Status::Good, "{r:?}");
        outcomes[usize::from(r.status == Status::Good)] += 1;
    }
    // Both outcomes occur, so the loop reaches the copy and not just the first check.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}
