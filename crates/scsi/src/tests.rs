//! Behaviour tests: a LogicalUnit over a FileVolume in a temporary directory.

use std::sync::Arc;

use sliver_volume::{FileVolume, Volume};

use crate::test_kit::{
    execute_past_power_on, file_volume, good, lu_config, nexus, sense_codes, TestVolume, BS,
};
use crate::{LogicalUnit, Nexus, Request, Response, Status};

const BLOCKS: u64 = 2048; // 1 MiB

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) lu: LogicalUnit,
}

pub(crate) fn fixture() -> Fixture {
    fixture_with(|v| Arc::new(v))
}

/// A fixture whose FileVolume is wrapped by `wrap`.
fn fixture_with(wrap: impl FnOnce(FileVolume) -> Arc<dyn Volume>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let volume = file_volume(dir.path(), "v", BLOCKS);
    let lu = LogicalUnit::new(wrap(volume), lu_config("serial-1".into(), [0x6a; 16]));
    Fixture { _dir: dir, lu }
}

/// A request from `n`, which sees LUNs 0 and 3 and reaches no other LU for copies.
fn request<'a>(n: &'a Nexus, cdb: &'a [u8], data_out: &'a [u8]) -> Request<'a> {
    crate::test_kit::request(n, cdb, data_out, &[0, 3], &crate::NoCopyTargets)
}

fn run(lu: &LogicalUnit, n: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
    lu.execute(&request(n, cdb, data_out))
}

/// A fixture whose nexus 1 has already consumed its power-on unit attention.
fn ready() -> (Fixture, Nexus) {
    let f = fixture();
    let n = nexus(1);
    let r = run(&f.lu, &n, &[0; 6], &[]);
    assert_eq!(sense_codes(&r), (0x6, 0x29, 0x00));
    (f, n)
}

fn cdb16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn write16(lu: &LogicalUnit, n: &Nexus, lba: u64, data: &[u8]) -> Response {
    run(lu, n, &cdb16(0x8a, lba, (data.len() / BS) as u32), data)
}

fn read16(lu: &LogicalUnit, n: &Nexus, lba: u64, blocks: u32) -> Response {
    run(lu, n, &cdb16(0x88, lba, blocks), &[])
}

fn get_lba_status(lu: &LogicalUnit, n: &Nexus, lba: u64) -> Vec<(u64, u32, u8)> {
    let mut c = cdb16(0x9e, lba, 1024);
    c[1] = 0x12;
    let r = run(lu, n, &c, &[]);
    good(&r);
    r.data_in[8..]
        .chunks_exact(16)
        .map(|d| {
            (
                u64::from_be_bytes(d[0..8].try_into().unwrap()),
                u32::from_be_bytes(d[8..12].try_into().unwrap()),
                d[12] & 0x0f,
            )
        })
        .collect()
}

#[test]
fn write_then_read_round_trips() {
    let (f, n) = ready();
    let data: Vec<u8> = (0..4 * BS).map(|i| (i % 251) as u8).collect();
    good(&write16(&f.lu, &n, 10, &data));
    let r = read16(&f.lu, &n, 10, 4);
    good(&r);
    assert_eq!(r.data_in, data);
}

#[test]
fn out_of_range_lba_is_rejected_before_io() {
    let (f, n) = ready();
    assert_eq!(
        sense_codes(&read16(&f.lu, &n, BLOCKS, 1)),
        (0x5, 0x21, 0x00)
    );
    assert_eq!(
        sense_codes(&read16(&f.lu, &n, u64::MAX, 2)),
        (0x5, 0x21, 0x00)
    );
    assert_eq!(
        sense_codes(&write16(&f.lu, &n, BLOCKS - 1, &[1u8; 2 * BS])),
        (0x5, 0x21, 0x00)
    );
    // Zero blocks at the capacity is fine; one past is not.
    good(&read16(&f.lu, &n, BLOCKS, 0));
    assert_eq!(
        sense_codes(&read16(&f.lu, &n, BLOCKS + 1, 0)),
        (0x5, 0x21, 0x00)
    );
}

#[test]
fn short_data_out_writes_only_the_blocks_sent() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0xaa; 2 * BS]));
    // The CDB says two blocks, the transport delivered one and a half: one block is written
    // and the transport reports the residual overflow from data_out_expected.
    let r = run(&f.lu, &n, &cdb16(0x8a, 0, 2), &[0xbb; BS + BS / 2]);
    good(&r);
    assert_eq!(r.data_out_expected, 2 * BS);
    let mut back = vec![0u8; 2 * BS];
    f.lu.volume().read(0, &mut back).unwrap();
    assert!(back[..BS].iter().all(|&b| b == 0xbb));
    assert!(
        back[BS..].iter().all(|&b| b == 0xaa),
        "the unsent block is untouched"
    );
}

#[test]
fn compare_and_write_miscompare_reports_offset_and_does_not_write() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 5, &[0xaa; 2 * BS]));
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&5u64.to_be_bytes());
    c[13] = 2;
    let mut data = vec![0xaa; 2 * BS];
    data[BS + 7] = 0x00; // first mismatch in the second block
    data.extend_from_slice(&[0x55; 2 * BS]);
    let r = run(&f.lu, &n, &c, &data);
    assert_eq!(sense_codes(&r), (0xe, 0x1d, 0x00));
    assert_eq!(r.sense[0] & 0x80, 0x80, "VALID bit");
    assert_eq!(
        u32::from_be_bytes(r.sense[3..7].try_into().unwrap()),
        (BS + 7) as u32
    );
    assert_eq!(read16(&f.lu, &n, 5, 2).data_in, vec![0xaa; 2 * BS]);

    // Matching compare data writes.
    data[BS + 7] = 0xaa;
    good(&run(&f.lu, &n, &c, &data));
    assert_eq!(read16(&f.lu, &n, 5, 2).data_in, vec![0x55; 2 * BS]);

    // A Data-Out size that disagrees with NUMBER OF LOGICAL BLOCKS is refused.
    c[13] = 1;
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &data)).0, 0x5);
}

fn unmap_params(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut p = vec![0u8; 8];
    p[0..2].copy_from_slice(&((6 + 16 * ranges.len()) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&((16 * ranges.len()) as u16).to_be_bytes());
    for &(lba, n) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p
}

fn unmap_cdb(param_len: usize) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(param_len as u16).to_be_bytes());
    c
}

#[test]
fn unmap_then_reads_zero_and_reports_deallocated() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0x11; 64 * BS]));
    assert_eq!(get_lba_status(&f.lu, &n, 0)[0].2, 0, "mapped after write");
    let p = unmap_params(&[(8, 16)]);
    good(&run(&f.lu, &n, &unmap_cdb(p.len()), &p));
    let r = read16(&f.lu, &n, 0, 64);
    assert!(r.data_in[..8 * BS].iter().all(|&b| b == 0x11));
    assert!(r.data_in[8 * BS..24 * BS].iter().all(|&b| b == 0));
    assert!(r.data_in[24 * BS..].iter().all(|&b| b == 0x11));
    let status = get_lba_status(&f.lu, &n, 8);
    assert_eq!(status[0].0, 8);
    assert_eq!(status[0].2, 1, "deallocated");
    assert_eq!(status[0].1, 16);
    assert_eq!(status[1], (24, status[1].1, 0));
}

#[test]
fn unmap_validates_whole_parameter_list_first() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0x22; 8 * BS]));
    // Second descriptor is beyond capacity: nothing may be unmapped.
    let p = unmap_params(&[(0, 8), (BLOCKS - 1, 2)]);
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &unmap_cdb(p.len()), &p)),
        (0x5, 0x21, 0x00)
    );
    assert!(read16(&f.lu, &n, 0, 8).data_in.iter().all(|&b| b == 0x22));
    // Parameter list shorter than the header.
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &unmap_cdb(4), &p[..4])),
        (0x5, 0x1a, 0x00)
    );
    // Descriptor data length pointing past the parameter list.
    let mut bad = unmap_params(&[(0, 1)]);
    bad[3] = 32;
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &unmap_cdb(bad.len()), &bad)),
        (0x5, 0x1a, 0x00)
    );
    // Zero-length descriptor at the capacity is allowed.
    let p = unmap_params(&[(BLOCKS, 0)]);
    good(&run(&f.lu, &n, &unmap_cdb(p.len()), &p));
}

#[test]
fn write_same_zero_with_unmap_deallocates() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0x33; 32 * BS]));
    let mut c = cdb16(0x93, 0, 32);
    c[1] = 0x08; // UNMAP
    good(&run(&f.lu, &n, &c, &[0u8; BS]));
    assert!(read16(&f.lu, &n, 0, 32).data_in.iter().all(|&b| b == 0));
    let status = get_lba_status(&f.lu, &n, 0);
    assert_eq!(status[0], (0, status[0].1, 1));
    assert!(status[0].1 >= 32);
}

#[test]
fn get_lba_status_joins_runs_a_volume_reports_in_pieces() {
    let plain = fixture();
    // Provisioning runs reported in pieces of at most 8 blocks, as the engine cuts long runs
    // to bound its lock hold.
    let pieces = fixture_with(|v| Arc::new(TestVolume::new(v).status_runs_of(8)));
    let n = nexus(1);
    for f in [&plain, &pieces] {
        run(&f.lu, &n, &[0; 6], &[]); // the power-on unit attention
        good(&write16(&f.lu, &n, 96, &[0x5a; 200 * BS]));
        good(&write16(&f.lu, &n, 640, &[0xa5; 64 * BS]));
    }
    let want = get_lba_status(&plain.lu, &n, 0);
    assert!(want.len() >= 4, "{want:?}");
    assert!(want.iter().all(|d| d.1 > 8), "{want:?}");
    assert_eq!(get_lba_status(&pieces.lu, &n, 0), want);
    assert_eq!(
        get_lba_status(&pieces.lu, &n, 100),
        get_lba_status(&plain.lu, &n, 100)
    );
}

#[test]
fn write_same_pattern_and_to_end_of_lun() {
    let (f, n) = ready();
    // NUMBER OF LOGICAL BLOCKS 0: from LBA to the end.
    let c = cdb16(0x93, BLOCKS - 3, 0);
    good(&run(&f.lu, &n, &c, &[0x7e; BS]));
    assert!(read16(&f.lu, &n, BLOCKS - 3, 3)
        .data_in
        .iter()
        .all(|&b| b == 0x7e));
    // ANCHOR is not supported; a Data-Out of two blocks is refused.
    let mut c = cdb16(0x93, 0, 1);
    c[1] = 0x18;
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &c, &[0; BS])),
        (0x5, 0x24, 0x00)
    );
    let c = cdb16(0x93, 0, 1);
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &[0; 2 * BS])).0, 0x5);
}

#[test]
fn verify_miscompare_reports_byte_offset() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0x44; 2 * BS]));
    let mut c = cdb16(0x8f, 0, 2);
    c[1] = 0x02; // BYTCHK = 01b
    good(&run(&f.lu, &n, &c, &[0x44; 2 * BS]));
    let mut data = vec![0x44; 2 * BS];
    data[700] = 0;
    let r = run(&f.lu, &n, &c, &data);
    assert_eq!(sense_codes(&r), (0xe, 0x1d, 0x00));
    assert_eq!(u32::from_be_bytes(r.sense[3..7].try_into().unwrap()), 700);
}

#[test]
fn unit_attention_is_not_consumed_by_inquiry() {
    let f = fixture();
    let n = nexus(1);
    let inquiry = [0x12, 0, 0, 0, 96, 0];
    let r = run(&f.lu, &n, &inquiry, &[]);
    good(&r);
    assert_eq!(&r.data_in[8..14], b"SLIVER");
    assert_eq!(r.data_in[2], 0x06);
    assert_eq!(r.data_in[5] & 0x38, 0x18, "TPGS=01, 3PC");
    // REPORT LUNS does not consume it either.
    good(&run(
        &f.lu,
        &n,
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
    ));
    // TEST UNIT READY reports it, once.
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &[0; 6], &[])),
        (0x6, 0x29, 0x00)
    );
    good(&run(&f.lu, &n, &[0; 6], &[]));
}

#[test]
fn request_sense_returns_and_clears_pending_unit_attention() {
    let (f, n) = ready();
    f.lu.capacity_changed();
    let r = run(&f.lu, &n, &[0x03, 0, 0, 0, 18, 0], &[]);
    good(&r);
    assert_eq!(
        (r.data_in[2], r.data_in[12], r.data_in[13]),
        (0x6, 0x2a, 0x09)
    );
    let r = run(&f.lu, &n, &[0x03, 0, 0, 0, 18, 0], &[]);
    good(&r);
    assert_eq!((r.data_in[2], r.data_in[12]), (0x0, 0x00));
    good(&run(&f.lu, &n, &[0; 6], &[]));
}

#[test]
fn reset_and_nexus_loss_establish_unit_attentions() {
    let (f, n) = ready();
    f.lu.reset(crate::Reset::LogicalUnit);
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &[0; 6], &[])),
        (0x6, 0x29, 0x03)
    );
    good(&run(&f.lu, &n, &[0; 6], &[]));
    f.lu.nexus_lost(&n);
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &[0; 6], &[])),
        (0x6, 0x29, 0x00)
    );
}

#[test]
fn unsupported_opcode_is_invalid_command_operation_code() {
    let (f, n) = ready();
    let r = run(&f.lu, &n, &[0xc1, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(sense_codes(&r), (0x5, 0x20, 0x00));
    // An unknown SERVICE ACTION IN(16) service action too.
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x1f;
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &[])), (0x5, 0x20, 0x00));
}

fn mode_sense6(lu: &LogicalUnit, n: &Nexus, page: u8, pc: u8) -> Response {
    run(lu, n, &[0x1a, 0x08, pc << 6 | page, 0, 255, 0], &[])
}

/// MODE SELECT(6) with PF set of `page` after a header without block descriptors.
fn mode_select6(lu: &LogicalUnit, n: &Nexus, page: &[u8]) -> Response {
    let mut params = vec![0u8, 0, 0, 0];
    params.extend_from_slice(page);
    run(lu, n, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params)
}

/// The current Control mode page (0Ah) with `bits` set in its byte `at`, selected.
fn set_control_page_bits(lu: &LogicalUnit, n: &Nexus, at: usize, bits: u8) {
    let mut page = mode_sense6(lu, n, 0x0a, 0).data_in[4..].to_vec();
    page[at] |= bits;
    good(&mode_select6(lu, n, &page));
}

#[test]
fn the_control_page_says_one_task_set_for_all_and_task_aborted_status() {
    let (f, n) = ready();
    let current = mode_sense6(&f.lu, &n, 0x0a, 0).data_in[4..].to_vec();
    assert_eq!(
        current[2] >> 5,
        0,
        "TST=000: one task set shared by every nexus"
    );
    assert_eq!(current[5] & 0x40, 0x40, "TAS=1: {current:02x?}");
    let changeable = mode_sense6(&f.lu, &n, 0x0a, 1).data_in[4..].to_vec();
    assert_eq!(changeable[5], 0, "nothing in byte 5 is changeable");
    // Selecting the page back as it is works; clearing TAS is refused.
    good(&mode_select6(&f.lu, &n, &current));
    let mut cleared = current.clone();
    cleared[5] &= !0x40;
    assert_eq!(
        sense_codes(&mode_select6(&f.lu, &n, &cleared)),
        (0x5, 0x26, 0x00),
        "INVALID FIELD IN PARAMETER LIST"
    );
}

#[test]
fn mode_select_round_trip_and_unit_attention_for_others() {
    let (f, n) = ready();
    let other = nexus(2);
    // The first command of `other` gets its power-on unit attention.
    assert_eq!(
        sense_codes(&run(&f.lu, &other, &[0; 6], &[])),
        (0x6, 0x29, 0x00)
    );

    let r = mode_sense6(&f.lu, &n, 0x08, 0);
    good(&r);
    let page = r.data_in[4..].to_vec();
    assert_eq!(page[0], 0x08);
    assert_eq!(page[2] & 0x04, 0x04, "WCE on by default");
    let changeable = mode_sense6(&f.lu, &n, 0x08, 1);
    assert_eq!(changeable.data_in[4 + 2], 0x04);

    let mut new_page = page.clone();
    new_page[2] &= !0x04;
    good(&mode_select6(&f.lu, &n, &new_page));
    assert_eq!(mode_sense6(&f.lu, &n, 0x08, 0).data_in[4 + 2] & 0x04, 0);
    // Other nexus learns about it; the changer does not.
    assert_eq!(
        sense_codes(&run(&f.lu, &other, &[0; 6], &[])),
        (0x6, 0x2a, 0x01)
    );
    good(&run(&f.lu, &n, &[0; 6], &[]));

    // Changing a bit that is not changeable is refused.
    let mut bad = new_page.clone();
    bad[2] |= 0x01; // RCD
    assert_eq!(
        sense_codes(&mode_select6(&f.lu, &n, &bad)),
        (0x5, 0x26, 0x00)
    );
    // Saved values are not supported by an LU with nowhere to keep them.
    assert_eq!(
        sense_codes(&mode_sense6(&f.lu, &n, 0x08, 3)),
        (0x5, 0x39, 0x00)
    );
}

/// The array's record of a volume's saved caching page, for the tests: what was saved, and
/// whether saving fails.
#[derive(Default)]
struct SavedPages {
    saved: std::sync::Mutex<Vec<bool>>,
    fail: std::sync::atomic::AtomicBool,
}

impl crate::SavedModePages for SavedPages {
    fn save_write_cache(&self, write_cache: bool) -> Result<(), String> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("the disk is gone".into());
        }
        self.saved.lock().unwrap().push(write_cache);
        Ok(())
    }
}

/// MODE SELECT(6) of `page` with SP (save pages) set.
fn mode_select6_saving(lu: &LogicalUnit, n: &Nexus, page: &[u8]) -> Response {
    let mut params = vec![0u8, 0, 0, 0];
    params.extend_from_slice(page);
    run(lu, n, &[0x15, 0x11, 0, 0, params.len() as u8, 0], &params)
}

#[test]
fn the_caching_page_is_saveable_when_the_lu_has_a_place_to_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let volume = file_volume(dir.path(), "v", BLOCKS);
    let store = Arc::new(SavedPages::default());
    // A write-through volume: WCE=0 current and saved.
    let lu = LogicalUnit::new(Arc::new(volume), lu_config("serial-2".into(), [0x6b; 16]))
        .with_saved_mode_pages(false, store.clone());
    let (n, other) = (nexus(1), nexus(2));
    for nexus in [&n, &other] {
        assert_eq!(
            sense_codes(&run(&lu, nexus, &[0; 6], &[])),
            (0x6, 0x29, 0x00)
        );
    }
    let caching = |pc: u8| mode_sense6(&lu, &n, 0x08, pc).data_in[4..].to_vec();
    let current = caching(0);
    assert_eq!(current[0], 0x88, "PS set: the page is saveable");
    assert_eq!(current[2] & 0x04, 0, "WCE off: write-through");
    assert_eq!(caching(3)[2] & 0x04, 0, "saved WCE off");
    assert_eq!(caching(2)[2] & 0x04, 0x04, "the default stays WCE on");

    // A host turns the cache on without saving: current only, and the other nexus is told.
    let mut on = current.clone();
    on[2] |= 0x04;
    good(&mode_select6(&lu, &n, &on));
    assert!(lu.write_cache() && !lu.saved_write_cache());
    assert_eq!(caching(3)[2] & 0x04, 0, "not saved");
    assert!(store.saved.lock().unwrap().is_empty());
    assert_eq!(
        sense_codes(&run(&lu, &other, &[0; 6], &[])),
        (0x6, 0x2a, 0x01),
        "MODE PARAMETERS CHANGED"
    );

    // Saving the same page keeps it, without telling anyone again (nothing changed now).
    good(&mode_select6_saving(&lu, &n, &on));
    assert_eq!(*store.saved.lock().unwrap(), vec![true]);
    assert_eq!(caching(3)[2] & 0x04, 0x04, "saved WCE on");
    good(&run(&lu, &other, &[0; 6], &[]));

    // A save that cannot be kept changes nothing.
    store.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut off = on.clone();
    off[2] &= !0x04;
    assert_eq!(
        sense_codes(&mode_select6_saving(&lu, &n, &off)),
        (0x4, 0x44, 0x00),
        "INTERNAL TARGET FAILURE"
    );
    assert!(lu.write_cache() && lu.saved_write_cache());
    good(&run(&lu, &other, &[0; 6], &[]));

    // The administrator's change (the API): current and saved, every nexus told.
    lu.set_write_cache(false).unwrap();
    assert!(!lu.write_cache() && !lu.saved_write_cache());
    for nexus in [&n, &other] {
        assert_eq!(
            sense_codes(&run(&lu, nexus, &[0; 6], &[])),
            (0x6, 0x2a, 0x01)
        );
    }
}

#[test]
fn saving_pages_is_refused_where_nothing_keeps_them() {
    let (f, n) = ready();
    let page = mode_sense6(&f.lu, &n, 0x08, 0).data_in[4..].to_vec();
    assert_eq!(page[0], 0x08, "PS clear");
    assert_eq!(
        sense_codes(&mode_select6_saving(&f.lu, &n, &page)),
        (0x5, 0x24, 0x00),
        "INVALID FIELD IN CDB"
    );
}

#[test]
fn write_through_answers_wait_for_durability_and_write_back_answers_do_not() {
    let (f, n) = ready();
    let lu = Arc::new(f.lu);
    let deferred = |cdb: &[u8], data: &[u8]| {
        let answer = lu.execute_deferring(&request(&n, cdb, data));
        let waits = answer.waits_for_durability();
        let (tx, rx) = std::sync::mpsc::channel();
        answer.then(move |r| tx.send(r).unwrap());
        let r = rx.recv().unwrap();
        good(&r);
        waits
    };
    let block = [7u8; BS];
    let mut fua = cdb16(0x8a, 2, 1);
    fua[1] = 0x08;
    assert!(!deferred(&cdb16(0x8a, 1, 1), &block), "write-back WRITE");
    assert!(deferred(&fua, &block), "WRITE with FUA");
    assert!(deferred(&cdb16(0x91, 0, 0), &[]), "SYNCHRONIZE CACHE");
    assert!(!deferred(&cdb16(0x28, 0, 0)[..10], &[]), "READ(10)");

    // Write-through: every command that changes the medium waits.
    lu.set_write_cache(false).unwrap();
    assert_eq!(sense_codes(&run(&lu, &n, &[0; 6], &[])), (0x6, 0x2a, 0x01));
    assert!(deferred(&cdb16(0x8a, 1, 1), &block), "WRITE");
    assert!(deferred(&cdb16(0x93, 8, 4), &block), "WRITE SAME");
    let mut unmap = vec![0u8; 24];
    unmap[1] = 22;
    unmap[3] = 16;
    unmap[15] = 8;
    unmap[19] = 4;
    assert!(
        deferred(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap),
        "UNMAP"
    );
    let mut caw = cdb16(0x89, 1, 0);
    caw[13] = 1;
    caw[10..13].fill(0);
    assert!(
        deferred(&caw, &[block, [9u8; BS]].concat()),
        "COMPARE AND WRITE"
    );
}

#[test]
fn d_sense_switches_to_descriptor_format() {
    let (f, n) = ready();
    set_control_page_bits(&f.lu, &n, 2, 0x04); // D_SENSE
    let r = read16(&f.lu, &n, BLOCKS, 1);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(&r.sense[..4], &[0x72, 0x05, 0x21, 0x00]);
}

#[test]
fn software_write_protect_blocks_writes() {
    let (f, n) = ready();
    set_control_page_bits(&f.lu, &n, 4, 0x08); // SWP
    assert_eq!(
        sense_codes(&write16(&f.lu, &n, 0, &[1; BS])),
        (0x7, 0x27, 0x00)
    );
    assert_eq!(mode_sense6(&f.lu, &n, 0x3f, 0).data_in[2] & 0x80, 0x80);
}

#[test]
fn report_luns_lists_mapped_luns() {
    let (f, n) = ready();
    let r = run(&f.lu, &n, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    good(&r);
    assert_eq!(&r.data_in[0..4], &16u32.to_be_bytes());
    assert_eq!(&r.data_in[8..16], &[0; 8]);
    assert_eq!(&r.data_in[16..24], &[0, 3, 0, 0, 0, 0, 0, 0]);
    // Well-known LUs only: none.
    let r = run(&f.lu, &n, &[0xa0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(&r.data_in[0..4], &0u32.to_be_bytes());
    // Reserved SELECT REPORT and too small allocation length.
    let r = run(&f.lu, &n, &[0xa0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
    let r = run(&f.lu, &n, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], &[]);
    assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
}

#[test]
fn read_capacity_16_advertises_thin_provisioning() {
    let (f, n) = ready();
    let mut c = cdb16(0x9e, 0, 32);
    c[1] = 0x10; // READ CAPACITY(16)
    let r = run(&f.lu, &n, &c, &[]);
    good(&r);
    assert_eq!(
        u64::from_be_bytes(r.data_in[0..8].try_into().unwrap()),
        BLOCKS - 1
    );
    assert_eq!(
        u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
        512
    );
    assert_eq!(r.data_in[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
}

#[test]
fn vpd_pages_are_listed_and_well_formed() {
    let (f, n) = ready();
    let r = run(&f.lu, &n, &[0x12, 1, 0x00, 0, 255, 0], &[]);
    good(&r);
    let pages = &r.data_in[4..];
    assert_eq!(pages, &[0x00, 0x80, 0x83, 0x86, 0x8f, 0xb0, 0xb1, 0xb2]);
    for &p in pages {
        let r = run(&f.lu, &n, &[0x12, 1, p, 0x04, 0, 0], &[]);
        good(&r);
        assert_eq!(r.data_in[1], p);
        let len = u16::from_be_bytes([r.data_in[2], r.data_in[3]]) as usize;
        assert_eq!(r.data_in.len(), 4 + len, "page {p:#x}");
    }
    // Block limits: CAW 255, unmap granularity 8 blocks, 1 MiB divisible.
    let r = run(&f.lu, &n, &[0x12, 1, 0xb0, 0, 64, 0], &[]);
    assert_eq!(r.data_in[5], 255);
    let granularity = u32::from_be_bytes(r.data_in[28..32].try_into().unwrap());
    assert_eq!(granularity, 8);
    assert!(u32::from_be_bytes(r.data_in[24..28].try_into().unwrap()) >= 256);
    // OPTIMAL TRANSFER LENGTH 4 MiB (QEMU sizes its copies by it), within the maximum and a
    // multiple of the granularity (Linux ignores it otherwise).
    let be32_at = |at: usize| u32::from_be_bytes(r.data_in[at..at + 4].try_into().unwrap());
    let (maximum, optimal) = (be32_at(8), be32_at(12));
    assert_eq!(optimal as usize * BS, 4 << 20);
    assert!(optimal <= maximum);
    let granularity = u16::from_be_bytes([r.data_in[6], r.data_in[7]]);
    assert_eq!(optimal % u32::from(granularity), 0);
    // Unknown page.
    let r = run(&f.lu, &n, &[0x12, 1, 0x99, 0, 255, 0], &[]);
    assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
}

#[test]
fn report_supported_opcodes_all_and_one() {
    let (f, n) = ready();
    let mut c = [0u8; 12];
    c[0] = 0xa3;
    c[1] = 0x0c;
    c[2] = 0x80; // RCTD
    c[6..10].copy_from_slice(&65535u32.to_be_bytes());
    let r = run(&f.lu, &n, &c, &[]);
    good(&r);
    let len = u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()) as usize;
    // Every command in the table except WRITE ATOMIC(16), which a passthrough volume lacks.
    assert_eq!(len, (crate::cdb::SUPPORTED_COMMANDS.len() - 1) * 20);
    // One command: WRITE(16), supported, with usage data starting with its opcode.
    c[2] = 0x01;
    c[3] = 0x8a;
    let r = run(&f.lu, &n, &c, &[]);
    good(&r);
    assert_eq!(r.data_in[1] & 0x07, 0x03);
    assert_eq!(u16::from_be_bytes([r.data_in[2], r.data_in[3]]), 16);
    assert_eq!(r.data_in[4], 0x8a);
    // Option 1 for an opcode with service actions is invalid.
    c[3] = 0x9e;
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &[])), (0x5, 0x24, 0x00));
}

#[test]
fn sanitize_overwrite_and_block_erase() {
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0x12; 4 * BS]));
    let mut params = vec![0x01, 0, 0, 4];
    params.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let mut c = [0u8; 10];
    c[0] = 0x48;
    c[1] = 0x01;
    c[8] = params.len() as u8;
    good(&run(&f.lu, &n, &c, &params));
    let r = read16(&f.lu, &n, BLOCKS - 1, 1);
    assert_eq!(
        &r.data_in[..8],
        &[0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef]
    );
    // Parameter list of 4 bytes (no pattern) is invalid.
    c[8] = 4;
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &c, &params[..4])),
        (0x5, 0x24, 0x00)
    );
    // BLOCK ERASE deallocates everything.
    let c = [0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0];
    good(&run(&f.lu, &n, &c, &[]));
    assert!(read16(&f.lu, &n, 0, 4).data_in.iter().all(|&b| b == 0));
    // Reserved service action.
    let c = [0x48, 0x05, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &[])), (0x5, 0x24, 0x00));
}

#[test]
fn reserve6_conflicts_other_nexus() {
    let (f, n) = ready();
    let other = nexus(2);
    run(&f.lu, &other, &[0; 6], &[]); // power-on UA
    good(&run(&f.lu, &n, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(
        run(&f.lu, &other, &[0; 6], &[]).status,
        Status::ReservationConflict
    );
    good(&run(&f.lu, &other, &[0x12, 0, 0, 0, 36, 0], &[]));
    good(&run(&f.lu, &n, &[0x17, 0, 0, 0, 0, 0], &[]));
    good(&run(&f.lu, &other, &[0; 6], &[]));
}

#[test]
fn command_without_lu() {
    let n = nexus(1);
    let req =
        |cdb: &'static [u8]| crate::test_kit::request(&n, cdb, &[], &[0], &crate::NoCopyTargets);
    let r = crate::execute_without_lu(&req(&[0x12, 0, 0, 0, 36, 0]));
    good(&r);
    assert_eq!(r.data_in[0], 0x7f);
    let r = crate::execute_without_lu(&req(&[0; 6]));
    assert_eq!(sense_codes(&r), (0x5, 0x25, 0x00));
    good(&crate::execute_without_lu(&req(&[
        0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    ])));
}

#[test]
fn concurrent_compare_and_write_is_atomic() {
    // Many threads increment a counter in block 0 with COMPARE AND WRITE, retrying on
    // miscompare; with atomic CAW no increment is lost.
    let (f, n) = ready();
    good(&write16(&f.lu, &n, 0, &[0; BS]));
    let lu = &f.lu;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut c = [0u8; 16];
                c[0] = 0x89;
                c[13] = 1;
                for _ in 0..25 {
                    loop {
                        let current = read16(lu, &n, 0, 1).data_in;
                        let value = u64::from_be_bytes(current[..8].try_into().unwrap());
                        let mut data = current.clone();
                        data[..8].copy_from_slice(&(value + 1).to_be_bytes());
                        let mut buf = current;
                        buf.extend_from_slice(&data);
                        if run(lu, &n, &c, &buf).status == Status::Good {
                            break;
                        }
                    }
                }
            });
        }
    });
    let r = read16(&f.lu, &n, 0, 1);
    assert_eq!(u64::from_be_bytes(r.data_in[..8].try_into().unwrap()), 100);
}

#[test]
fn fuzz_entry_point_survives_garbage() {
    crate::fuzz_cdb(&[]);
    crate::fuzz_cdb(&[
        16, 0x89, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff,
    ]);
    crate::fuzz_cdb(&[10, 0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 1, 2, 3]);
    crate::fuzz_cdb(&[6, 0x15, 0x10, 0, 0, 0xff, 0, 0, 0, 0, 0x40]);
}

fn run_cached(lu: &LogicalUnit, n: &Nexus, cdb: &[u8], data_out: &[u8]) -> Option<Response> {
    lu.execute_cached(&request(n, cdb, data_out))
}

#[test]
fn only_a_read_that_does_not_wait_executes_without_waiting() {
    use crate::CommandClass;
    let waits = fixture_with(|v| Arc::new(TestVolume::new(v)));
    let n = nexus(1);
    // A pending unit attention answers the READ before anything is read, waiting or not.
    let r = run_cached(&waits.lu, &n, &cdb16(0x88, 0, 8), &[]).expect("answered");
    assert_eq!(sense_codes(&r), (0x6, 0x29, 0x00));
    let data: Vec<u8> = (0..8 * BS).map(|i| (i * 7 % 251) as u8).collect();
    good(&write16(&waits.lu, &n, 16, &data));
    let before = waits.lu.stats().class(CommandClass::Read).commands;
    // The volume would wait: nothing is done or counted, for the caller to execute it.
    assert!(run_cached(&waits.lu, &n, &cdb16(0x88, 16, 8), &[]).is_none());
    assert_eq!(waits.lu.stats().class(CommandClass::Read).commands, before);
    // Refused before it reads: answered here.
    let r = run_cached(&waits.lu, &n, &cdb16(0x88, BLOCKS, 1), &[]).expect("answered");
    assert_eq!(sense_codes(&r), (0x5, 0x21, 0x00));
    // Other commands never run here, not even a write of cached data.
    let other = [0u8; BS];
    assert!(run_cached(&waits.lu, &n, &cdb16(0x8a, 0, 1), &other).is_none());
    assert!(
        run_cached(&waits.lu, &n, &[0; 6], &[]).is_none(),
        "TEST UNIT READY"
    );
    assert_eq!(read16(&waits.lu, &n, 16, 8).data_in, data);

    let cached = fixture_with(|v| Arc::new(TestVolume::new(v).reads_cached()));
    let n = nexus(2);
    let _ = run(&cached.lu, &n, &[0; 6], &[]);
    good(&write16(&cached.lu, &n, 16, &data));
    let r = run_cached(&cached.lu, &n, &cdb16(0x88, 16, 8), &[]).expect("read here");
    good(&r);
    assert_eq!(r.data_in, data);
    assert_eq!(cached.lu.stats().class(CommandClass::Read).commands, 1);
}

fn write_atomic16(lba: u64, blocks: u16, boundary: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..12].copy_from_slice(&boundary.to_be_bytes());
    c[12..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// The Block Limits VPD page (B0h).
fn block_limits(lu: &LogicalUnit, n: &Nexus) -> Vec<u8> {
    let r = run(lu, n, &[0x12, 1, 0xb0, 0, 0xff, 0], &[]);
    good(&r);
    r.data_in
}

/// The SUPPORT field REPORT SUPPORTED OPERATION CODES gives for WRITE ATOMIC(16).
fn write_atomic_support(lu: &LogicalUnit, n: &Nexus) -> u8 {
    let r = run(
        lu,
        n,
        &[0xa3, 0x0c, 0x01, 0x9c, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
    );
    good(&r);
    r.data_in[1] & 0x07
}

#[test]
fn write_atomic_is_unsupported_where_the_volume_cannot_promise_it() {
    let (f, n) = ready();
    let r = run(&f.lu, &n, &write_atomic16(0, 1, 0), &[1; BS]);
    assert_eq!(sense_codes(&r), (0x5, 0x20, 0x00));
    // VPD B0 advertises no atomic length; RSOC does not list the opcode.
    assert_eq!(&block_limits(&f.lu, &n)[44..48], &[0, 0, 0, 0]);
    assert_eq!(write_atomic_support(&f.lu, &n), 0x01, "not supported");
}

#[test]
fn write_atomic_writes_within_the_advertised_limit() {
    let f = fixture_with(|v| Arc::new(TestVolume::new(v).atomic_writes_up_to(16 * BS as u64)));
    let n = nexus(1);
    let _ = run(&f.lu, &n, &[0; 6], &[]);
    assert_eq!(
        u32::from_be_bytes(block_limits(&f.lu, &n)[44..48].try_into().unwrap()),
        16
    );
    good(&run(&f.lu, &n, &write_atomic16(8, 16, 0), &[7; 16 * BS]));
    let r = run(&f.lu, &n, &cdb16(0x88, 8, 16), &[]);
    good(&r);
    assert!(r.data_in.iter().all(|&b| b == 7));
    // Too long, a boundary, beyond the end (the range is checked first), WRPROTECT.
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &write_atomic16(0, 17, 0), &[7; 17 * BS])),
        (0x5, 0x24, 0x00)
    );
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &write_atomic16(0, 4, 4), &[7; 4 * BS])),
        (0x5, 0x24, 0x00)
    );
    assert_eq!(
        sense_codes(&run(
            &f.lu,
            &n,
            &write_atomic16(BLOCKS - 8, 32, 0),
            &[7; 32 * BS]
        )),
        (0x5, 0x21, 0x00)
    );
    let mut wrprotect = write_atomic16(0, 1, 0);
    wrprotect[1] = 0x20;
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &wrprotect, &[7; BS])),
        (0x5, 0x24, 0x00)
    );
    assert_eq!(write_atomic_support(&f.lu, &n), 0x03, "supported");
}

#[test]
fn log_sense_lists_and_reports_logical_block_provisioning() {
    let (f, n) = ready();
    // Supported pages, cumulative values.
    let r = run(&f.lu, &n, &[0x4d, 0, 0x40, 0, 0, 0, 0, 0, 0xff, 0], &[]);
    good(&r);
    assert_eq!(&r.data_in[..6], &[0, 0, 0, 2, 0x00, 0x0c]);
    // The write moves the used-resource count of page 0Ch (1 MiB units).
    good(&run(
        &f.lu,
        &n,
        &cdb16(0x8a, 0, 2048),
        &vec![0x5a; 2048 * BS],
    ));
    let r = run(&f.lu, &n, &[0x4d, 0, 0x4c, 0, 0, 0, 0, 0, 0xff, 0], &[]);
    good(&r);
    assert_eq!(r.data_in[0], 0x0c);
    let params = &r.data_in[4..];
    assert_eq!(
        params.len(),
        u16::from_be_bytes([r.data_in[2], r.data_in[3]]) as usize
    );
    // A passthrough volume knows no pool: only the used count (code 0002h) is reported.
    assert_eq!(&params[..4], &[0x00, 0x02, 0x03, 0x08]);
    assert_eq!(u32::from_be_bytes(params[4..8].try_into().unwrap()), 1);
    // An LU in a pool reports the pool's free space first (code 0001h, scope 10b: shared).
    let (_pool, pooled, _dir) = pool_of(100, true);
    run(&pooled, &n, &[0; 6], &[]);
    let r = run(&pooled, &n, &[0x4d, 0, 0x4c, 0, 0, 0, 0, 0, 0xff, 0], &[]);
    good(&r);
    let params = &r.data_in[4..];
    assert_eq!(&params[..4], &[0x00, 0x01, 0x03, 0x08]);
    assert_eq!(u32::from_be_bytes(params[4..8].try_into().unwrap()), 50);
    assert_eq!(params[11], 0x02);
    assert_eq!(&params[12..16], &[0x00, 0x02, 0x03, 0x08]);
    // Threshold values, unknown pages and SP are refused.
    for (refused, cdb) in [
        ("threshold values", [0x4d, 0, 0x0c, 0, 0, 0, 0, 0, 0xff, 0]),
        ("an unknown page", [0x4d, 0, 0x5f, 0, 0, 0, 0, 0, 0xff, 0]),
        ("SP", [0x4d, 1, 0x4c, 0, 0, 0, 0, 0, 0xff, 0]),
    ] {
        assert_eq!(
            sense_codes(&run(&f.lu, &n, &cdb, &[])),
            (0x5, 0x24, 0x00),
            "{refused}"
        );
    }
}

#[test]
fn soft_threshold_raises_one_unit_attention_per_nexus() {
    let (pool, lu, _dir) = pool_of(100, true);
    pool.exceeded
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (a, b) = (nexus(1), nexus(2));
    // Both nexuses first see power-on; the threshold is raised on the first command.
    assert_eq!(sense_codes(&run(&lu, &a, &[0; 6], &[])), (0x6, 0x29, 0x00));
    assert_eq!(sense_codes(&run(&lu, &b, &[0; 6], &[])), (0x6, 0x29, 0x00));
    assert_eq!(sense_codes(&run(&lu, &a, &[0; 6], &[])), (0x6, 0x38, 0x07));
    good(&run(&lu, &a, &[0; 6], &[]));
    assert_eq!(sense_codes(&run(&lu, &b, &[0; 6], &[])), (0x6, 0x38, 0x07));
    good(&run(&lu, &b, &[0; 6], &[]));
}

#[test]
fn a_pool_hovering_at_its_soft_threshold_tells_each_nexus_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let (pool, lu, _dir) = pool_of(100, true);
    let n = nexus(1);
    assert_eq!(sense_codes(&run(&lu, &n, &[0; 6], &[])), (0x6, 0x29, 0x00));
    good(&run(&lu, &n, &[0; 6], &[]));
    pool.exceeded.store(true, SeqCst);
    assert_eq!(sense_codes(&run(&lu, &n, &[0; 6], &[])), (0x6, 0x38, 0x07));
    // The collector frees segments, writes fill them: below, above, below, above.
    for _ in 0..5 {
        pool.exceeded.store(false, SeqCst);
        good(&run(&lu, &n, &[0; 6], &[]));
        pool.exceeded.store(true, SeqCst);
        good(&run(&lu, &n, &[0; 6], &[]));
    }
    // A nexus that was not told yet still is.
    let m = nexus(2);
    assert_eq!(sense_codes(&run(&lu, &m, &[0; 6], &[])), (0x6, 0x29, 0x00));
    assert_eq!(sense_codes(&run(&lu, &m, &[0; 6], &[])), (0x6, 0x38, 0x07));
    good(&run(&lu, &m, &[0; 6], &[]));
}

#[test]
fn statistics_count_each_command_once_by_class_and_outcome() {
    use crate::CommandClass::{self, *};
    let (f, n) = ready();
    let write10 = |lba: u32, blocks: u16| {
        let mut c = [0u8; 10];
        c[0] = 0x2a;
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&blocks.to_be_bytes());
        c
    };
    for i in 0..3 {
        good(&run(&f.lu, &n, &write10(i * 8, 8), &[0x11; 8 * BS]));
    }
    // Data-Out shorter than the CDB (residual overflow): only the 2 blocks sent count.
    good(&run(&f.lu, &n, &write10(300, 8), &[0x33; 2 * BS + 100]));
    good(&read16(&f.lu, &n, 0, 4));
    good(&read16(&f.lu, &n, 4, 2));
    // COMPARE AND WRITE: one success, one miscompare.
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[13] = 1;
    let mut data = vec![0x11; BS];
    data.extend_from_slice(&[0x22; BS]);
    good(&run(&f.lu, &n, &caw, &data));
    assert_eq!(sense_codes(&run(&f.lu, &n, &caw, &data)).1, 0x1d);
    // WRITE SAME of 100 blocks, one of 0 blocks (= to the last LBA, 48 blocks), UNMAP of
    // two ranges (24 blocks).
    good(&run(&f.lu, &n, &cdb16(0x93, 100, 100), &[0u8; BS]));
    good(&run(&f.lu, &n, &cdb16(0x93, BLOCKS - 48, 0), &[0u8; BS]));
    let p = unmap_params(&[(0, 16), (200, 8)]);
    good(&run(&f.lu, &n, &unmap_cdb(p.len()), &p));
    // An UNMAP beyond the end fails and counts as DELETE_F.
    let p = unmap_params(&[(BLOCKS, 8)]);
    assert_eq!(
        sense_codes(&run(&f.lu, &n, &unmap_cdb(p.len()), &p)).1,
        0x21
    );

    let s = f.lu.stats();
    let class = |c| {
        let x = s.class(c);
        (x.commands, x.errors, x.bytes)
    };
    assert_eq!(class(Write), (4, 0, (3 * 8 + 2) * BS as u64));
    assert_eq!(class(Read), (2, 0, 6 * BS as u64));
    assert_eq!(class(CompareAndWrite), (2, 1, BS as u64));
    assert_eq!(class(WriteSame), (2, 0, 148 * BS as u64));
    assert_eq!(class(Unmap), (2, 1, 24 * BS as u64));
    // ready() sent one TEST UNIT READY that got the power-on unit attention.
    assert_eq!(class(Other), (1, 1, 0));
    let v = &s.vaai;
    assert_eq!((v.ats, v.ats_failed), (1, 1));
    assert_eq!(
        (v.zero, v.zero_failed, v.zeroed_bytes),
        (2, 0, 148 * BS as u64)
    );
    assert_eq!(
        (v.delete, v.delete_failed, v.deleted_bytes),
        (1, 1, 24 * BS as u64)
    );
    assert_eq!((v.clone_read, v.clone_write, v.clone_failed), (0, 0, 0));
    let classes: Vec<_> = s.classes.iter().map(|(c, _)| *c).collect();
    assert_eq!(classes, CommandClass::ALL);
    for (_, c) in &s.classes {
        assert_eq!(c.latency_buckets.len(), crate::LATENCY_BOUNDS_US.len() + 1);
        assert_eq!(c.latency_buckets.iter().sum::<u64>(), c.commands);
        assert!(c.latency_sum_us < 60_000_000 * c.commands.max(1));
    }
}

/// A pool of `capacity` bytes whose soft threshold can be read and set, past it while
/// `exceeded`; `keeps: false` makes every change fail as an owner that cannot write its
/// configuration would.
struct TestPool {
    capacity: u64,
    share: std::sync::Mutex<f64>,
    keeps: bool,
    exceeded: std::sync::atomic::AtomicBool,
}

impl sliver_volume::Pool for TestPool {
    fn soft_threshold_exceeded(&self) -> bool {
        self.exceeded.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn available_bytes(&self) -> u64 {
        self.capacity / 2
    }
    fn soft_threshold(&self) -> (f64, u64) {
        (*self.share.lock().unwrap(), self.capacity)
    }
    fn set_soft_threshold(&self, share: f64) -> Result<(), sliver_volume::SettingError> {
        if !sliver_volume::SOFT_THRESHOLD_RANGE.contains(&share) {
            return Err(sliver_volume::SettingError::SoftThresholdOutOfRange(share));
        }
        if !self.keeps {
            return Err(sliver_volume::SettingError::NotKept("disk full".into()));
        }
        *self.share.lock().unwrap() = share;
        Ok(())
    }
}

/// An LU on a file volume in `pool`.
fn pooled_unit(dir: &std::path::Path, pool: Arc<TestPool>) -> LogicalUnit {
    let volume = Arc::new(file_volume(dir, "v", BLOCKS));
    LogicalUnit::new(volume, fixture().lu.config.clone()).with_pool(pool)
}

fn mode_sense10(lu: &LogicalUnit, n: &Nexus, page: u8, subpage: u8, pc: u8) -> Response {
    let mut c = [0u8; 10];
    c[0] = 0x5a;
    c[1] = 0x08; // DBD
    c[2] = (pc << 6) | page;
    c[3] = subpage;
    c[7..9].copy_from_slice(&1024u16.to_be_bytes());
    run(lu, n, &c, &[])
}

/// A pool of `sets` threshold sets at 80 % (`keeps`: see [`TestPool`]) and an LU in it.
fn pool_of(sets: u64, keeps: bool) -> (Arc<TestPool>, LogicalUnit, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(TestPool {
        capacity: sets << 20,
        share: std::sync::Mutex::new(0.8),
        keeps,
        exceeded: false.into(),
    });
    let lu = pooled_unit(dir.path(), pool.clone());
    (pool, lu, dir)
}

/// MODE SELECT(10) of the LBP page as MODE SENSE returns it, with THRESHOLD COUNT `count`.
fn select_threshold_count(lu: &LogicalUnit, n: &Nexus, count: u32) -> Response {
    let page = mode_sense10(lu, n, 0x1c, 0x02, 0).data_in[8..].to_vec();
    let mut params = vec![0u8; 8];
    params.extend_from_slice(&page);
    params[8] &= 0x7f; // PS is not settable
    params[8 + 20..8 + 24].copy_from_slice(&count.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x55;
    c[1] = 0x10; // PF
    c[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    run(lu, n, &c, &params)
}

#[test]
fn the_logical_block_provisioning_mode_page_reads_and_sets_the_pool_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(TestPool {
        capacity: 100 << 20, // 100 threshold sets of 1 MiB
        share: std::sync::Mutex::new(0.8),
        keeps: true,
        exceeded: false.into(),
    });
    let lu = pooled_unit(dir.path(), pool.clone());
    let n = nexus(1);
    run(&lu, &n, &[0; 6], &[]); // absorb the power-on unit attention
    let other = nexus(2);
    run(&lu, &other, &[0; 6], &[]);

    // MODE SENSE(10) 1Ch/02h: one soft-threshold descriptor, 80 sets.
    let r = mode_sense10(&lu, &n, 0x1c, 0x02, 0);
    good(&r);
    let page = &r.data_in[8..];
    assert_eq!(&page[..4], &[0x5c, 0x02, 0x00, 20]);
    let d = &page[16..24];
    assert_eq!(d[0], 0x80 | 0x01, "enabled, soft, arming increasing");
    assert_eq!(d[1], 0x02, "used LBA mapping resources");
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 80);
    // Changeable: ENABLED and THRESHOLD COUNT.
    let mask = mode_sense10(&lu, &n, 0x1c, 0x02, 1).data_in;
    assert_eq!(mask[8 + 16], 0x80);
    assert_eq!(&mask[8 + 20..8 + 24], &[0xff; 4]);
    // 1Ch with all subpages returns both 1Ch pages; 3Fh/00h only pages without subpages.
    let r = mode_sense10(&lu, &n, 0x1c, 0xff, 0);
    assert_eq!(r.data_in.len(), 8 + 12 + 24);
    let r = mode_sense10(&lu, &n, 0x3f, 0x00, 0);
    assert!(!r.data_in[8..].windows(2).any(|w| w == [0x5c, 0x02]));
    let r = mode_sense10(&lu, &n, 0x3f, 0xff, 0);
    assert!(r.data_in[8..].windows(2).any(|w| w == [0x5c, 0x02]));

    // MODE SELECT(10) the page back with 60 sets: the pool's threshold becomes 60%.
    let mut params = vec![0u8; 8];
    params.extend_from_slice(page);
    params[8] &= 0x7f; // PS is not settable
    params[8 + 20..8 + 24].copy_from_slice(&60u32.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x55;
    c[1] = 0x10; // PF
    c[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    good(&run(&lu, &n, &c, &params));
    assert!((*pool.share.lock().unwrap() - 0.6).abs() < 1e-9);
    let r = mode_sense10(&lu, &n, 0x1c, 0x02, 0);
    assert_eq!(
        u32::from_be_bytes(r.data_in[8 + 20..8 + 24].try_into().unwrap()),
        60
    );
    // Others learn that mode parameters changed.
    assert_eq!(
        sense_codes(&run(&lu, &other, &[0; 6], &[])),
        (0x6, 0x2a, 0x01)
    );

    // A count beyond the pool, or a change to a fixed field, is refused and changes nothing.
    params[8 + 20..8 + 24].copy_from_slice(&101u32.to_be_bytes());
    assert_eq!(sense_codes(&run(&lu, &n, &c, &params)), (0x5, 0x26, 0x00));
    params[8 + 20..8 + 24].copy_from_slice(&50u32.to_be_bytes());
    params[8 + 17] = 0x01; // THRESHOLD RESOURCE
    assert_eq!(sense_codes(&run(&lu, &n, &c, &params)), (0x5, 0x26, 0x00));
    assert!((*pool.share.lock().unwrap() - 0.6).abs() < 1e-9);

    // Disabling the threshold: it never triggers.
    params[8 + 17] = 0x02;
    params[8 + 16] &= !0x80;
    good(&run(&lu, &n, &c, &params));
    assert_eq!(*pool.share.lock().unwrap(), 1.0);

    // A threshold under 1 % of the pool is refused as the API refuses it, pointing at the
    // count (1000 sets: 9 is 0.9 %, 10 is 1 %).
    let (big, lu, dir) = pool_of(1000, true);
    run(&lu, &n, &[0; 6], &[]); // the power-on unit attention
    let r = select_threshold_count(&lu, &n, 9);
    assert_eq!(sense_codes(&r), (0x5, 0x26, 0x00));
    assert_eq!(
        r.sense[15], 0x80,
        "SKSV, C/D = 0 (parameter list), no bit pointer"
    );
    assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), 8 + 20);
    assert_eq!(*big.share.lock().unwrap(), 0.8);
    good(&select_threshold_count(&lu, &n, 10));
    assert!((*big.share.lock().unwrap() - 0.01).abs() < 1e-9);
    drop(dir);

    // An owner that cannot keep the change: the command fails and changes nothing else.
    let (stuck, lu, _dir) = pool_of(100, false);
    run(&lu, &n, &[0; 6], &[]);
    let r = select_threshold_count(&lu, &n, 50);
    assert_eq!(sense_codes(&r), (0x4, 0x44, 0x00));
    assert_eq!(*stuck.share.lock().unwrap(), 0.8);

    // A volume without a pool has no such page.
    let f = fixture();
    run(&f.lu, &n, &[0; 6], &[]);
    assert_eq!(
        sense_codes(&mode_sense10(&f.lu, &n, 0x1c, 0x02, 0)),
        (0x5, 0x24, 0x00)
    );
}

/// SENSE-KEY SPECIFIC of an INVALID FIELD IN PARAMETER LIST: (byte, bit) of the list.
fn parameter_pointer(r: &Response) -> (u16, Option<u8>) {
    assert_eq!(sense_codes(r), (0x5, 0x26, 0x00));
    let sks = &r.sense[15..18];
    assert_eq!(sks[0] & 0xc0, 0x80, "SKSV set, C/D = 0 (parameter list)");
    let bit = (sks[0] & 0x08 != 0).then_some(sks[0] & 0x07);
    (u16::from_be_bytes([sks[1], sks[2]]), bit)
}

#[test]
fn invalid_parameter_fields_are_pointed_at_by_byte_and_bit() {
    let (f, n) = ready();
    let sanitize = |params: &[u8]| {
        let mut c = [0u8; 10];
        c[0] = 0x48;
        c[1] = 0x01; // OVERWRITE
        c[8] = params.len() as u8;
        run(&f.lu, &n, &c, params)
    };
    // TEST (bits 6..5) set; PASSES (bits 4..0) zero; a pattern length that disagrees.
    let r = sanitize(&[0x21, 0, 0, 4, 1, 2, 3, 4]);
    assert_eq!(parameter_pointer(&r), (0, Some(6)));
    let r = sanitize(&[0x00, 0, 0, 4, 1, 2, 3, 4]);
    assert_eq!(parameter_pointer(&r), (0, Some(4)));
    let r = sanitize(&[0x01, 0, 0, 3, 1, 2, 3, 4]);
    assert_eq!(parameter_pointer(&r), (2, None));

    // MODE SELECT(10) with a long LBA block descriptor whose block length is not ours: the
    // pointer names the BLOCK LENGTH field, 8 (header) + 12.
    let mut params = vec![0u8; 8 + 16];
    params[4] = 0x01; // LONGLBA
    params[6..8].copy_from_slice(&16u16.to_be_bytes());
    params[8 + 12..8 + 16].copy_from_slice(&4096u32.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x55;
    c[1] = 0x10; // PF
    c[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    let r = run(&f.lu, &n, &c, &params);
    assert_eq!(parameter_pointer(&r), (20, None));
    // The same in a short descriptor: BLOCK LENGTH is bytes 5..8 of it.
    let mut params = vec![0u8; 8 + 8];
    params[6..8].copy_from_slice(&8u16.to_be_bytes());
    params[8 + 5..8 + 8].copy_from_slice(&4096u32.to_be_bytes()[1..]);
    c[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    let r = run(&f.lu, &n, &c, &params);
    assert_eq!(parameter_pointer(&r), (13, None));
    // A page whose length runs past the list is a length error, not a field.
    let mut params = vec![0u8; 8 + 4];
    params[8] = 0x08; // caching page
    params[9] = 0x12;
    c[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    assert_eq!(sense_codes(&run(&f.lu, &n, &c, &params)), (0x5, 0x1a, 0x00));
}

/// A request from `n` whose CDB and Data-Out are empty: what runs is only what `parsed` says.
fn run_parsed(lu: &LogicalUnit, n: &Nexus, parsed: &crate::Parsed) -> Response {
    lu.execute_parsed(&request(n, &[], &[]), parsed)
}

#[test]
fn execution_takes_the_parsed_command_and_never_parses_the_cdb_again() {
    let (f, n) = ready();
    let data: Vec<u8> = (0..8 * BS).map(|i| (i * 13 % 251) as u8).collect();
    let write = crate::dispatch(&cdb16(0x8a, 40, 8), data.len() as u64, &data);
    // The data stays the request's.
    good(&f.lu.execute_parsed(&request(&n, &[], &data), &write));
    let read = crate::dispatch(&cdb16(0x88, 40, 8), 8 * BS as u64, &[]);
    let r = run_parsed(&f.lu, &n, &read);
    good(&r);
    assert!(r.data_in == data);
    let cached = f.lu.execute_cached_parsed(&request(&n, &[], &[]), &read);
    assert!(cached.is_none_or(|r| r.data_in == data));
    // A range check is the LU's, after parsing: still made.
    let past = crate::dispatch(&cdb16(0x88, BLOCKS, 1), BS as u64, &[]);
    assert_eq!(
        sense_codes(&run_parsed(&f.lu, &n, &past)),
        (0x5, 0x21, 0x00)
    );
}

#[test]
fn a_cdb_that_does_not_parse_is_answered_after_a_unit_attention() {
    let f = fixture();
    let n = nexus(1);
    let truncated = crate::dispatch(&[0x88, 0, 0], 4096, &[]);
    let unsupported = crate::dispatch(&[0xc5; 16], 0, &[]);
    let ua = run_parsed(&f.lu, &n, &truncated);
    assert_eq!(sense_codes(&ua), (0x6, 0x29, 0x00));
    for _ in 0..2 {
        let r = run_parsed(&f.lu, &n, &truncated);
        assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
        let r = run_parsed(&f.lu, &n, &unsupported);
        assert_eq!(sense_codes(&r), (0x5, 0x20, 0x00));
    }
    let without_lu = crate::execute_without_lu_parsed(&request(&n, &[], &[]), &truncated);
    assert_eq!(sense_codes(&without_lu), (0x5, 0x24, 0x00));
}

#[test]
fn extended_copy_runs_the_list_dispatch_read() {
    let (f, n) = ready();
    let data: Vec<u8> = (0..4 * BS).map(|i| (i * 7 % 253) as u8).collect();
    good(&write16(&f.lu, &n, 8, &data));
    // One identification CSCD naming this LU, one block-to-block segment: 4 blocks, 8 to 100.
    let mut list = vec![0u8; 16];
    list[1] = 0b11 << 3; // the list identifier is not used
    list[2..4].copy_from_slice(&32u16.to_be_bytes());
    list[8..12].copy_from_slice(&28u32.to_be_bytes());
    let mut cscd = vec![0u8; 32];
    cscd[0] = 0xe4;
    cscd[4] = 0x01;
    cscd[5] = 0x03;
    cscd[7] = 16;
    cscd[8..24].copy_from_slice(&[0x6a; 16]);
    cscd[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
    let mut segment = vec![0u8; 28];
    segment[0] = 0x02;
    segment[2..4].copy_from_slice(&24u16.to_be_bytes());
    segment[10..12].copy_from_slice(&4u16.to_be_bytes());
    segment[12..20].copy_from_slice(&8u64.to_be_bytes());
    segment[20..28].copy_from_slice(&100u64.to_be_bytes());
    list.extend(cscd);
    list.extend(segment);
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(list.len() as u32).to_be_bytes());
    let parsed = crate::dispatch(&c, list.len() as u64, &list);
    assert_eq!(parsed.placement, crate::Placement::Quick);
    // Executed without its Data-Out: the list comes with the parsed command.
    good(&run_parsed(&f.lu, &n, &parsed));
    assert!(read16(&f.lu, &n, 100, 4).data_in == data);
    // A list dispatch refused is refused when it runs, after the checks every command
    // goes through: a unit attention first.
    let short = crate::dispatch(&c, list.len() as u64, &list[..20]);
    f.lu.capacity_changed();
    let r = run_parsed(&f.lu, &n, &short);
    assert_eq!(sense_codes(&r), (0x6, 0x2a, 0x09));
    let r = run_parsed(&f.lu, &n, &short);
    assert_eq!(sense_codes(&r), (0x5, 0x0e, 0x03));
}

/// A PERSISTENT RESERVE OUT CDB: `service_action`, `scope_type` (byte 2) and a PARAMETER LIST
/// LENGTH of `param_len`.
fn prout_cdb(service_action: u8, scope_type: u8, param_len: u32) -> [u8; 10] {
    let mut c = [0x5f, service_action, scope_type, 0, 0, 0, 0, 0, 0, 0];
    c[5..9].copy_from_slice(&param_len.to_be_bytes());
    c
}

/// The basic PERSISTENT RESERVE OUT parameter list: RESERVATION KEY and SERVICE ACTION
/// RESERVATION KEY.
fn prout_params(key: u64, service_action_key: u64) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&service_action_key.to_be_bytes());
    p
}

/// The sense-key specific bytes of fixed-format sense: SKSV, C/D, BPV and BIT POINTER, then
/// FIELD POINTER.
fn field_pointer(r: &Response) -> [u8; 3] {
    r.sense[15..18].try_into().unwrap()
}

/// INVALID FIELD IN CDB at `byte`, `bit`, as fixed-format sense's sense-key specific bytes.
fn in_cdb(byte: u8, bit: u8) -> [u8; 3] {
    [0x80 | 0x40 | 0x08 | bit, 0, byte]
}

#[test]
fn malformed_persistent_reserve_cdbs_are_answered_as_before() {
    let (f, n) = ready();
    let basic = prout_params(0, 0);
    let prout = |sa: u8, scope_type: u8, params: &[u8]| {
        let len = params.len() as u32;
        run(&f.lu, &n, &prout_cdb(sa, scope_type, len), params)
    };
    let prin = |sa: u8| run(&f.lu, &n, &[0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    // A reserved service action: the SERVICE ACTION field, bit 4 of byte 1, before the
    // parameter list is looked at. Bits 7-5 of byte 1 are not part of it.
    for sa in [0x08, 0x1f] {
        for params in [&basic[..], &basic[..8]] {
            let r = prout(sa, 0x01, params);
            assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00), "PROUT {sa:#x}");
            assert_eq!(field_pointer(&r), in_cdb(1, 4));
        }
    }
    for sa in [0x04, 0x1f] {
        let r = prin(sa);
        assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00), "PRIN {sa:#x}");
        assert_eq!(field_pointer(&r), in_cdb(1, 4));
    }
    let r = prin(0xe0);
    good(&r);
    assert_eq!(r.data_in.len(), 8, "READ KEYS of nobody");
    // RESERVE and PREEMPT: the parameter list's length first, then SCOPE (bit 7 of byte 2),
    // then TYPE (bit 3 of byte 2); reserved types are 0, 2, 4 and 9 and up.
    for sa in [0x01, 0x04, 0x05] {
        let r = prout(sa, 0x00, &basic[..23]);
        assert_eq!(sense_codes(&r), (0x5, 0x1a, 0x00), "short list, sa {sa}");
        let r = prout(sa, 0x10, &basic);
        assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00), "scope, sa {sa}");
        assert_eq!(field_pointer(&r), in_cdb(2, 7));
        let r = prout(sa, 0x12, &basic);
        assert_eq!(field_pointer(&r), in_cdb(2, 7), "scope before type");
        for type_code in [0x0, 0x2, 0x4, 0x9, 0xf] {
            let r = prout(sa, type_code, &basic);
            assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00), "type {type_code}");
            assert_eq!(field_pointer(&r), in_cdb(2, 3));
        }
    }
    // REGISTER and CLEAR do not look at SCOPE and TYPE.
    good(&prout(0x00, 0xff, &prout_params(0, 7)));
    good(&prout(0x03, 0xff, &prout_params(7, 0)));
    // A CDB cut short: the opcode's own length is not there.
    let r = run(&f.lu, &n, &prout_cdb(0x00, 0, 24)[..9], &basic);
    assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
    assert_eq!(field_pointer(&r), [0xc0, 0, 0]);
    // Under an SPC-2 reservation PERSISTENT RESERVE IN and OUT conflict before their service
    // action is looked at.
    let other = nexus(2);
    good(&execute_past_power_on(
        &f.lu,
        &request(&other, &[0x16, 0, 0, 0, 0, 0], &[]),
    ));
    assert_eq!(
        prout(0x08, 0x01, &basic).status,
        Status::ReservationConflict
    );
    assert_eq!(prin(0x04).status, Status::ReservationConflict);
}

#[test]
fn reservations_and_unit_attentions_read_the_parsed_command() {
    let (f, n) = ready();
    let params = prout_params(0, 0x1234);
    let register = crate::dispatch(&prout_cdb(0x00, 0, 24), 24, &params);
    let lu = &f.lu;
    let r = lu.execute_parsed(&request(&n, &[], &params), &register);
    good(&r);
    let read_keys = crate::dispatch(&[0x5e, 0x00, 0, 0, 0, 0, 0, 0, 0x10, 0], 0, &[]);
    let r = run_parsed(lu, &n, &read_keys);
    good(&r);
    assert_eq!(&r.data_in[8..16], &0x1234u64.to_be_bytes());
    // Neither INQUIRY nor REPORT LUNS reports a pending unit attention, even one whose CDB
    // does not parse (CMDDT), which is answered with its own sense; TEST UNIT READY does.
    lu.capacity_changed();
    let inquiry = crate::dispatch(&[0x12, 0, 0, 0, 96, 0], 0, &[]);
    good(&run_parsed(lu, &n, &inquiry));
    let cmddt = crate::dispatch(&[0x12, 0x02, 0, 0, 96, 0], 0, &[]);
    let r = run_parsed(lu, &n, &cmddt);
    assert_eq!(sense_codes(&r), (0x5, 0x24, 0x00));
    let report_luns = crate::dispatch(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 0, &[]);
    good(&run_parsed(lu, &n, &report_luns));
    let tur = crate::dispatch(&[0; 6], 0, &[]);
    assert_eq!(sense_codes(&run_parsed(lu, &n, &tur)), (0x6, 0x2a, 0x09));
    good(&run_parsed(lu, &n, &tur));
}
