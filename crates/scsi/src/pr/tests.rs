use std::fs;

use super::model::Initiator;
use super::prout::{encode_transport_id, parse_transport_id, parse_transport_ids};
use super::*;
use crate::cdb::opcode::{
    SA_PRIN_READ_FULL_STATUS as PRIN_READ_FULL_STATUS, SA_PRIN_READ_KEYS as PRIN_READ_KEYS,
    SA_PRIN_READ_RESERVATION as PRIN_READ_RESERVATION,
    SA_PRIN_REPORT_CAPABILITIES as PRIN_REPORT_CAPABILITIES, SA_PROUT_CLEAR as PROUT_CLEAR,
    SA_PROUT_PREEMPT as PROUT_PREEMPT, SA_PROUT_PREEMPT_AND_ABORT as PROUT_PREEMPT_AND_ABORT,
    SA_PROUT_REGISTER as PROUT_REGISTER,
    SA_PROUT_REGISTER_AND_IGNORE_EXISTING_KEY as PROUT_REGISTER_AND_IGNORE_EXISTING_KEY,
    SA_PROUT_REGISTER_AND_MOVE as PROUT_REGISTER_AND_MOVE, SA_PROUT_RELEASE as PROUT_RELEASE,
    SA_PROUT_RESERVE as PROUT_RESERVE,
};
use crate::cdb::{self, Command};
use crate::param::ParamList;

const WE: u8 = 1;
const EA: u8 = 3;
const WE_RO: u8 = 5;
const EA_RO: u8 = 6;
const WE_AR: u8 = 7;
const EA_AR: u8 = 8;
const ALL_TYPES: [u8; 6] = [WE, EA, WE_RO, EA_RO, WE_AR, EA_AR];

const READ_10: [u8; 10] = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
const WRITE_10: [u8; 10] = [0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0];
const MODE_SENSE_6: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 0xff, 0];
const TEST_UNIT_READY: [u8; 6] = [0; 6];
const READ_CAPACITY_16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
const SYNCHRONIZE_CACHE_10: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn nexus(n: u8) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.2024-01.test:host{n},i,0x00023d00000{n}"),
        initiator_name: format!("iqn.2024-01.test:host{n}"),
        relative_target_port: 1,
    }
}

fn on_port(mut nexus: Nexus, port: u16) -> Nexus {
    nexus.relative_target_port = port;
    nexus
}

fn prout_cdb(service_action: u8, pr_type: u8, len: usize) -> [u8; 10] {
    let len = u32::try_from(len).unwrap().to_be_bytes();
    [
        0x5f,
        service_action,
        pr_type,
        0,
        0,
        len[0],
        len[1],
        len[2],
        len[3],
        0,
    ]
}

fn basic_params(key: u64, service_action_key: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&service_action_key.to_be_bytes());
    p[20] = flags;
    p
}

fn prout(
    r: &Reservations,
    n: &Nexus,
    service_action: u8,
    pr_type: u8,
    params: &[u8],
) -> Result<Vec<PendingUa>, PrError> {
    prout_effects(r, n, service_action, pr_type, params).map(|e| e.unit_attentions)
}

fn prout_effects(
    r: &Reservations,
    n: &Nexus,
    service_action: u8,
    pr_type: u8,
    params: &[u8],
) -> Result<ProutEffects, PrError> {
    let cdb = parsed_prout(&prout_cdb(service_action, pr_type, params.len())).unwrap();
    r.persistent_reserve_out(n, &cdb, params)
}

/// The PERSISTENT RESERVE OUT `cdb` parses into, if it parses into one.
fn parsed_prout(cdb: &[u8]) -> Option<ProutCdb> {
    match cdb::parse(cdb) {
        Ok(Command::PersistentReserveOut(prout)) => Some(prout),
        _ => None,
    }
}

/// The service action of the PERSISTENT RESERVE IN `cdb` parses into, if it parses into one.
fn parsed_prin(cdb: &[u8]) -> Option<Result<PrinAction, Sense>> {
    match cdb::parse(cdb) {
        Ok(Command::PersistentReserveIn { action, .. }) => Some(action),
        _ => None,
    }
}

fn register(r: &Reservations, n: &Nexus, key: u64, new_key: u64) -> Result<(), PrError> {
    prout(r, n, PROUT_REGISTER, 0, &basic_params(key, new_key, 0)).map(|_| ())
}

fn register_ignore(r: &Reservations, n: &Nexus, new_key: u64) {
    let params = basic_params(0, new_key, 0);
    prout(r, n, PROUT_REGISTER_AND_IGNORE_EXISTING_KEY, 0, &params).unwrap();
}

/// Reservations without APTPL where nexus 1, 2, ... registered `keys` in that order (REGISTER
/// AND IGNORE EXISTING KEY), and those nexuses.
fn with_registrations<const N: usize>(keys: [u64; N]) -> (Reservations, [Nexus; N]) {
    let r = Reservations::new(None);
    let nexuses = std::array::from_fn(|i| nexus(i as u8 + 1));
    for (n, key) in nexuses.iter().zip(keys) {
        register_ignore(&r, n, key);
    }
    (r, nexuses)
}

/// Reservations where nexus 1 holds a RESERVE(6) reservation, and nexuses 1 and 2.
fn reserved6_by_nexus_1() -> (Reservations, [Nexus; 2]) {
    let r = Reservations::new(None);
    let nexuses = [nexus(1), nexus(2)];
    r.reserve(&nexuses[0]).unwrap();
    (r, nexuses)
}

fn reserve(r: &Reservations, n: &Nexus, key: u64, pr_type: u8) -> Result<(), PrError> {
    prout(r, n, PROUT_RESERVE, pr_type, &basic_params(key, 0, 0)).map(|_| ())
}

fn release(r: &Reservations, n: &Nexus, key: u64, pr_type: u8) -> Result<Vec<PendingUa>, PrError> {
    prout(r, n, PROUT_RELEASE, pr_type, &basic_params(key, 0, 0))
}

fn preempt(
    r: &Reservations,
    n: &Nexus,
    key: u64,
    preempted: u64,
    pr_type: u8,
) -> Result<Vec<PendingUa>, PrError> {
    prout(
        r,
        n,
        PROUT_PREEMPT,
        pr_type,
        &basic_params(key, preempted, 0),
    )
}

fn prin(r: &Reservations, n: &Nexus, service_action: u8) -> Result<Vec<u8>, PrError> {
    let action = parsed_prin(&[0x5e, service_action, 0, 0, 0, 0, 0, 0x40, 0, 0]).unwrap();
    r.persistent_reserve_in(n, action)
}

/// (PRGENERATION, keys) from READ KEYS.
fn read_keys(r: &Reservations, n: &Nexus) -> (u32, Vec<u64>) {
    let data = prin(r, n, PRIN_READ_KEYS).unwrap();
    let generation = u32::from_be_bytes(data[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize;
    assert_eq!(len, data.len() - 8);
    let keys = data[8..]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    (generation, keys)
}

/// (key, scope/type byte) from READ RESERVATION, if reserved.
fn read_reservation(r: &Reservations, n: &Nexus) -> Option<(u64, u8)> {
    let data = prin(r, n, PRIN_READ_RESERVATION).unwrap();
    match u32::from_be_bytes(data[4..8].try_into().unwrap()) {
        0 => {
            assert_eq!(data.len(), 8);
            None
        }
        16 => {
            assert_eq!(data.len(), 24);
            Some((
                u64::from_be_bytes(data[8..16].try_into().unwrap()),
                data[21],
            ))
        }
        other => panic!("additional length {other}"),
    }
}

fn ua(n: &Nexus, reason: SenseReason) -> PendingUa {
    PendingUa {
        initiator_port: n.initiator_port.clone(),
        reason,
    }
}

fn sense_reason(result: Result<impl std::fmt::Debug, PrError>) -> SenseReason {
    match result {
        Err(PrError::Sense(sense)) => sense.reason,
        other => panic!("expected CHECK CONDITION, got {other:?}"),
    }
}

fn iscsi_transport_id(format: u8, text: &str) -> Vec<u8> {
    let padded = (text.len() + 1).next_multiple_of(4).max(20);
    let mut id = vec![format << 6 | 0x05, 0];
    id.extend_from_slice(&u16::try_from(padded).unwrap().to_be_bytes());
    id.extend_from_slice(text.as_bytes());
    id.resize(4 + padded, 0);
    id
}

fn spec_i_pt_params(key: u64, new_key: u64, flags: u8, ids: &[Vec<u8>]) -> Vec<u8> {
    let ids: Vec<u8> = ids.concat();
    let mut params = basic_params(key, new_key, flags | 0x08);
    params.extend_from_slice(&u32::try_from(ids.len()).unwrap().to_be_bytes());
    params.extend_from_slice(&ids);
    params
}

fn register_and_move_params(
    key: u64,
    new_key: u64,
    flags: u8,
    target_port: u16,
    id: &[u8],
) -> Vec<u8> {
    let mut params = basic_params(key, new_key, 0);
    params[17] = flags;
    params[18..20].copy_from_slice(&target_port.to_be_bytes());
    params[20..24].copy_from_slice(&u32::try_from(id.len()).unwrap().to_be_bytes());
    params.extend_from_slice(id);
    params
}

/// The invariants every state must keep, whatever commands ran.
fn assert_consistent(r: &Reservations) {
    let state = r.read();
    let pr = &state.persistent;
    for (i, a) in pr.registrations.iter().enumerate() {
        assert_ne!(a.key, 0);
        for b in &pr.registrations[i + 1..] {
            assert!(
                !a.registrant.overlaps(&b.registrant),
                "{a:?} overlaps {b:?}"
            );
        }
    }
    if let Some(reservation) = &pr.reservation {
        assert!(pr
            .registrations
            .iter()
            .any(|reg| reg.registrant == reservation.holder));
    }
    let restricted = state.reserved_by.is_some() || pr.reservation.is_some();
    assert_eq!(r.restricted.load(Ordering::Acquire), restricted);
}

#[test]
fn reservations_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Reservations>();
}

#[test]
fn register_read_keys_change_key_and_unregister() {
    let r = Reservations::new(None);
    let a = nexus(1);
    assert_eq!(read_keys(&r, &a), (0, vec![]));
    register(&r, &a, 0, 0x1111).unwrap();
    assert_eq!(read_keys(&r, &a), (1, vec![0x1111]));
    // Registering again without naming the current key conflicts (libiscsi
    // prout_reregister_key_fails).
    assert_eq!(register(&r, &a, 0, 0x1112), Err(PrError::Conflict));
    assert_eq!(register(&r, &a, 0x9999, 0x1112), Err(PrError::Conflict));
    register(&r, &a, 0x1111, 0x2222).unwrap();
    assert_eq!(read_keys(&r, &a), (2, vec![0x2222]));
    register(&r, &a, 0x2222, 0).unwrap();
    assert_eq!(read_keys(&r, &a), (3, vec![]));
    assert_eq!(r.generation(), 3);
}

#[test]
fn register_from_unregistered_nexus() {
    let r = Reservations::new(None);
    let a = nexus(1);
    // A non-zero RESERVATION KEY from an unregistered nexus conflicts.
    assert_eq!(register(&r, &a, 5, 6), Err(PrError::Conflict));
    // Unregistering what is not registered succeeds and changes nothing.
    register(&r, &a, 0, 0).unwrap();
    assert_eq!(read_keys(&r, &a), (0, vec![]));
}

#[test]
fn register_and_ignore_existing_key_replaces_any_key() {
    let (r, [a]) = with_registrations([7]);
    register_ignore(&r, &a, 8);
    assert_eq!(read_keys(&r, &a), (2, vec![8]));
    let params = basic_params(0xdead, 0, 0);
    prout(&r, &a, PROUT_REGISTER_AND_IGNORE_EXISTING_KEY, 0, &params).unwrap();
    assert_eq!(read_keys(&r, &a).1, Vec::<u64>::new());
}

#[test]
fn registrations_are_per_i_t_nexus() {
    let r = Reservations::new(None);
    let a = nexus(1);
    // Same initiator name, another ISID: another initiator port.
    let a2 = Nexus {
        initiator_port: "iqn.2024-01.test:host1,i,0x00023d000009".into(),
        ..nexus(1)
    };
    register_ignore(&r, &a, 1);
    register_ignore(&r, &a2, 2);
    register_ignore(&r, &on_port(a.clone(), 2), 3);
    assert_eq!(read_keys(&r, &a).1, vec![1, 2, 3]);
    assert_consistent(&r);
}

#[test]
fn read_keys_additional_length_counts_every_key() {
    let (r, _) = with_registrations([1, 2]);
    let data = prin(&r, &nexus(1), PRIN_READ_KEYS).unwrap();
    // The caller truncates to ALLOCATION LENGTH; the header still says 16.
    assert_eq!(&data[4..8], &16u32.to_be_bytes());
    assert_eq!(data.len(), 24);
}

#[test]
fn report_capabilities_layout() {
    let r = Reservations::new(None);
    let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
    assert_eq!(data, [0, 8, 0x1c, 0x90, 0xea, 0x01, 0, 0]);
    let dir = tempfile::tempdir().unwrap();
    let r = Reservations::new(Some(dir.path().join("pr")));
    let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
    assert_eq!(data[2], 0x1d, "PTPL_C");
    assert_eq!(data[3] & 1, 0, "PTPL_A off");
    prout(&r, &nexus(1), PROUT_REGISTER, 0, &basic_params(0, 1, 0x01)).unwrap();
    let data = prin(&r, &nexus(1), PRIN_REPORT_CAPABILITIES).unwrap();
    assert_eq!(data[3] & 1, 1, "PTPL_A on");
}

#[test]
fn prin_service_actions_beyond_read_full_status_are_invalid() {
    let r = Reservations::new(None);
    for sa in 0..4 {
        assert!(prin(&r, &nexus(1), sa).is_ok());
    }
    for sa in 4..0x20 {
        assert_eq!(
            sense_reason(prin(&r, &nexus(1), sa)),
            SenseReason::InvalidFieldInCdb
        );
    }
}

#[test]
fn reserve_and_release_every_type() {
    let (r, [a]) = with_registrations([0xabc]);
    let generation = r.generation();
    for pr_type in ALL_TYPES {
        reserve(&r, &a, 0xabc, pr_type).unwrap();
        let key = if pr_type >= WE_AR { 0 } else { 0xabc };
        assert_eq!(read_reservation(&r, &a), Some((key, pr_type)));
        // Reserving again with the same type is a no-op.
        reserve(&r, &a, 0xabc, pr_type).unwrap();
        assert!(release(&r, &a, 0xabc, pr_type).unwrap().is_empty());
        assert_eq!(read_reservation(&r, &a), None);
    }
    // RESERVE and RELEASE leave PRGENERATION alone.
    assert_eq!(r.generation(), generation);
}

#[test]
fn reserve_requires_registration_and_its_key() {
    let r = Reservations::new(None);
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(reserve(&r, &a, 0, WE), Err(PrError::Conflict));
    register_ignore(&r, &a, 1);
    assert_eq!(reserve(&r, &a, 2, WE), Err(PrError::Conflict));
    reserve(&r, &a, 1, WE).unwrap();
    // The holder cannot change the type by RESERVE.
    assert_eq!(reserve(&r, &a, 1, EA), Err(PrError::Conflict));
    register_ignore(&r, &b, 2);
    assert_eq!(reserve(&r, &b, 2, WE), Err(PrError::Conflict));
    assert_consistent(&r);
}

#[test]
fn reserve_validates_scope_and_type() {
    let (r, [a]) = with_registrations([1]);
    for bad_type in [0, 2, 4, 9, 0xf] {
        assert_eq!(
            sense_reason(reserve(&r, &a, 1, bad_type)),
            SenseReason::InvalidFieldInCdb
        );
    }
    assert_eq!(
        sense_reason(reserve(&r, &a, 1, 0x10 | WE)),
        SenseReason::InvalidFieldInCdb
    );
    assert_eq!(read_reservation(&r, &a), None);
}

#[test]
fn all_registrants_reservation_is_held_by_every_registrant() {
    let (r, [a, b]) = with_registrations([1, 2]);
    reserve(&r, &a, 1, EA_AR).unwrap();
    reserve(&r, &b, 2, EA_AR).unwrap();
    // Another registrant releases it; the remaining registrant learns of it.
    assert_eq!(
        release(&r, &b, 2, EA_AR).unwrap(),
        vec![ua(&a, SenseReason::ReservationsReleased)]
    );
    assert_eq!(read_reservation(&r, &a), None);
}

#[test]
fn release_rules() {
    let (r, [a, b]) = with_registrations([1, 2]);
    let c = nexus(3);
    // Nothing reserved: success without effect; unregistered: conflict.
    assert!(release(&r, &a, 1, WE).unwrap().is_empty());
    assert_eq!(release(&r, &c, 0, WE), Err(PrError::Conflict));
    reserve(&r, &a, 1, WE_RO).unwrap();
    // A registered non-holder: success without effect.
    assert!(release(&r, &b, 2, WE_RO).unwrap().is_empty());
    assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
    // The holder with the wrong type.
    assert_eq!(
        sense_reason(release(&r, &a, 1, EA_RO)),
        SenseReason::InvalidReleaseOfPersistentReservation
    );
    // The holder with the wrong key.
    assert_eq!(release(&r, &a, 2, WE_RO), Err(PrError::Conflict));
    assert_eq!(
        release(&r, &a, 1, WE_RO).unwrap(),
        vec![ua(&b, SenseReason::ReservationsReleased)]
    );
    // WE and EA releases tell nobody.
    reserve(&r, &a, 1, EA).unwrap();
    assert!(release(&r, &a, 1, EA).unwrap().is_empty());
}

/// The SPC-4 / SBC-3 access tables as libiscsi's test_prout_reserve_access checks it, plus
/// the always-allowed commands and MODE SENSE.
#[test]
fn access_matrix_for_every_type() {
    // (type, registered can read, registered can write, unregistered can read,
    //  unregistered can write)
    let matrix = [
        (WE, true, false, true, false),
        (EA, false, false, false, false),
        (WE_RO, true, true, true, false),
        (EA_RO, true, true, false, false),
        (WE_AR, true, true, true, false),
        (EA_AR, true, true, false, false),
    ];
    for (pr_type, reg_read, reg_write, unreg_read, unreg_write) in matrix {
        let (r, [holder, registered]) = with_registrations([1, 2]);
        let unregistered = nexus(3);
        reserve(&r, &holder, 1, pr_type).unwrap();
        let allowed = |n: &Nexus, cdb: &[u8]| r.check_access(n, cdb).is_ok();
        for cdb in [
            &READ_10[..],
            &WRITE_10,
            &MODE_SENSE_6,
            &SYNCHRONIZE_CACHE_10,
        ] {
            assert!(allowed(&holder, cdb), "type {pr_type} holder {cdb:x?}");
        }
        assert_eq!(allowed(&registered, &READ_10), reg_read, "type {pr_type}");
        assert_eq!(allowed(&registered, &WRITE_10), reg_write, "type {pr_type}");
        assert_eq!(
            allowed(&registered, &MODE_SENSE_6),
            reg_read,
            "type {pr_type}"
        );
        assert_eq!(
            allowed(&unregistered, &READ_10),
            unreg_read,
            "type {pr_type}"
        );
        assert_eq!(
            allowed(&unregistered, &WRITE_10),
            unreg_write,
            "type {pr_type}"
        );
        assert!(
            !allowed(&unregistered, &SYNCHRONIZE_CACHE_10),
            "type {pr_type}"
        );
        for n in [&registered, &unregistered] {
            for cdb in [&INQUIRY[..], &TEST_UNIT_READY, &READ_CAPACITY_16] {
                assert!(allowed(n, cdb), "type {pr_type} {cdb:x?}");
            }
            assert!(allowed(n, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0]));
            assert!(allowed(n, &prout_cdb(0, 0, 24)));
        }
        // Unregistering the second initiator takes its access away.
        register(&r, &registered, 2, 0).unwrap();
        assert_eq!(allowed(&registered, &READ_10), unreg_read, "type {pr_type}");
        assert_eq!(
            allowed(&registered, &WRITE_10),
            unreg_write,
            "type {pr_type}"
        );
    }
}

#[test]
fn no_reservation_restricts_nothing() {
    let (r, _) = with_registrations([1]);
    assert!(r.check_access(&nexus(2), &WRITE_10).is_ok());
    assert!(r.check_access(&nexus(2), &[]).is_ok());
}

/// libiscsi test_prout_reserve_ownership: when the holder unregisters, a WE/EA/RO
/// reservation ends; an all-registrants one stays while anyone is registered.
#[test]
fn unregistering_the_holder() {
    for pr_type in ALL_TYPES {
        let (r, [a, b]) = with_registrations([1, 2]);
        reserve(&r, &a, 1, pr_type).unwrap();
        let unit_attentions = prout(&r, &a, PROUT_REGISTER, 0, &basic_params(1, 0, 0)).unwrap();
        assert_consistent(&r);
        match pr_type {
            WE_AR | EA_AR => {
                assert!(unit_attentions.is_empty());
                assert_eq!(read_reservation(&r, &a), Some((0, pr_type)));
                assert!(r.check_access(&b, &WRITE_10).is_ok());
                release(&r, &b, 2, pr_type).unwrap();
            }
            WE_RO | EA_RO => {
                assert_eq!(
                    unit_attentions,
                    vec![ua(&b, SenseReason::ReservationsReleased)]
                );
                assert_eq!(read_reservation(&r, &a), None);
            }
            _ => {
                assert!(unit_attentions.is_empty());
                assert_eq!(read_reservation(&r, &a), None);
            }
        }
        register(&r, &b, 2, 0).unwrap();
        assert_eq!(read_keys(&r, &a).1, Vec::<u64>::new());
    }
}

#[test]
fn last_all_registrants_registrant_leaving_ends_the_reservation() {
    let (r, [a]) = with_registrations([1]);
    reserve(&r, &a, 1, WE_AR).unwrap();
    register(&r, &a, 1, 0).unwrap();
    assert_eq!(read_reservation(&r, &a), None);
    assert!(r.check_access(&nexus(2), &WRITE_10).is_ok());
    assert_consistent(&r);
}

/// libiscsi test_prout_clear_simple.
#[test]
fn clear_removes_everything_and_counts_once() {
    let (r, [a, b]) = with_registrations([1, 2]);
    let generation = r.generation();
    reserve(&r, &a, 1, EA).unwrap();
    assert_eq!(
        prout(&r, &nexus(3), PROUT_CLEAR, 0, &basic_params(0, 0, 0)),
        Err(PrError::Conflict)
    );
    assert_eq!(
        prout(&r, &a, PROUT_CLEAR, 0, &basic_params(2, 0, 0)),
        Err(PrError::Conflict)
    );
    let unit_attentions = prout(&r, &a, PROUT_CLEAR, 0, &basic_params(1, 0, 0)).unwrap();
    assert_eq!(
        unit_attentions,
        vec![ua(&b, SenseReason::ReservationsPreempted)]
    );
    assert_eq!(read_reservation(&r, &a), None);
    assert_eq!(read_keys(&r, &a), (generation + 1, vec![]));
    assert!(r.check_access(&b, &WRITE_10).is_ok());
}

/// libiscsi test_prout_preempt_rm_reg.
#[test]
fn preempt_removes_registrations() {
    let (r, [a, b]) = with_registrations([0x1, 0x2]);
    let generation = r.generation();
    let unit_attentions = preempt(&r, &b, 0x2, 0x1, EA).unwrap();
    assert_eq!(
        unit_attentions,
        vec![ua(&a, SenseReason::RegistrationsPreempted)]
    );
    assert_eq!(read_keys(&r, &a), (generation + 1, vec![0x2]));
    // No reservation was created: only registrations were preempted.
    assert_eq!(read_reservation(&r, &a), None);
    // Nothing left with that key; key 0 without a reservation is invalid.
    assert_eq!(preempt(&r, &b, 0x2, 0x1, EA), Err(PrError::Conflict));
    assert_eq!(
        sense_reason(preempt(&r, &b, 0x2, 0, EA)),
        SenseReason::InvalidFieldInParameterList
    );
    // Unregistered senders conflict.
    assert_eq!(preempt(&r, &a, 0x1, 0x2, EA), Err(PrError::Conflict));
    // A nexus never preempts its own registration.
    assert_eq!(preempt(&r, &b, 0x2, 0x2, EA), Err(PrError::Conflict));
}

#[test]
fn preempt_takes_over_the_reservation() {
    let (r, [a, b, c]) = with_registrations([1, 2, 3]);
    reserve(&r, &a, 1, WE).unwrap();
    let mut unit_attentions = preempt(&r, &b, 2, 1, EA).unwrap();
    unit_attentions.sort_by(|x, y| x.initiator_port.cmp(&y.initiator_port));
    assert_eq!(
        unit_attentions,
        vec![
            ua(&a, SenseReason::RegistrationsPreempted),
            // The type changed: the remaining registrant learns the old one is gone.
            ua(&c, SenseReason::ReservationsReleased),
        ]
    );
    assert_eq!(read_reservation(&r, &a), Some((2, EA)));
    assert_eq!(read_keys(&r, &a).1, vec![2, 3]);
    assert!(r.check_access(&a, &READ_10).is_err());
    assert!(r.check_access(&b, &WRITE_10).is_ok());
    // The holder preempting its own reservation changes its type.
    assert_eq!(
        preempt(&r, &b, 2, 2, WE).unwrap(),
        vec![ua(&c, SenseReason::ReservationsReleased)]
    );
    assert_eq!(read_reservation(&r, &a), Some((2, WE)));
    assert_eq!(read_keys(&r, &a).1, vec![2, 3]);
    // A non-holder key leaves the reservation alone.
    assert_eq!(
        preempt(&r, &b, 2, 3, WE).unwrap(),
        vec![ua(&c, SenseReason::RegistrationsPreempted)]
    );
    assert_eq!(read_reservation(&r, &a), Some((2, WE)));
    assert_consistent(&r);
}

#[test]
fn preempt_all_registrants_with_key_zero() {
    let (r, [a, b, c]) = with_registrations([1, 2, 3]);
    reserve(&r, &a, 1, WE_AR).unwrap();
    // A non-zero key removes that registration only; the reservation stays.
    assert_eq!(
        preempt(&r, &b, 2, 1, WE_AR).unwrap(),
        vec![ua(&a, SenseReason::RegistrationsPreempted)]
    );
    assert_eq!(read_reservation(&r, &b), Some((0, WE_AR)));
    assert_consistent(&r);
    // Key zero removes every other registration and takes the reservation.
    assert_eq!(
        preempt(&r, &b, 2, 0, EA).unwrap(),
        vec![ua(&c, SenseReason::RegistrationsPreempted)]
    );
    assert_eq!(read_reservation(&r, &b), Some((2, EA)));
    assert_eq!(read_keys(&r, &b).1, vec![2]);
    assert_consistent(&r);
}

#[test]
fn preempt_and_abort_preempts_like_preempt_and_names_the_nexuses_whose_tasks_it_aborts() {
    let (r, [a, b, c]) = with_registrations([1, 2, 3]);
    reserve(&r, &a, 1, EA).unwrap();
    let params = basic_params(2, 1, 0);
    let effects = prout_effects(&r, &b, PROUT_PREEMPT_AND_ABORT, EA, &params).unwrap();
    assert_eq!(
        effects.unit_attentions,
        vec![ua(&a, SenseReason::RegistrationsPreempted)]
    );
    assert_eq!(read_reservation(&r, &b), Some((2, EA)));
    assert!(effects.aborts_tasks());
    assert!(effects.aborts_tasks_of(&a));
    assert!(!effects.aborts_tasks_of(&b) && !effects.aborts_tasks_of(&c));
    // PREEMPT alone aborts nothing.
    let params = basic_params(2, 3, 0);
    let effects = prout_effects(&r, &b, PROUT_PREEMPT, EA, &params).unwrap();
    assert_eq!(
        effects.unit_attentions,
        vec![ua(&c, SenseReason::RegistrationsPreempted)]
    );
    assert!(!effects.aborts_tasks() && !effects.aborts_tasks_of(&c));
}

#[test]
fn register_and_move_hands_over_the_reservation() {
    let (r, [a]) = with_registrations([1]);
    let b = nexus(2);
    let id_b = iscsi_transport_id(1, &b.initiator_port);
    let params = register_and_move_params(1, 0x22, 0, 1, &id_b);
    // Not the holder (nothing reserved).
    assert_eq!(
        prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, &params),
        Err(PrError::Conflict)
    );
    reserve(&r, &a, 1, WE_RO).unwrap();
    let generation = r.generation();
    assert!(prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, &params)
        .unwrap()
        .is_empty());
    assert_eq!(read_reservation(&r, &a), Some((0x22, WE_RO)));
    assert_eq!(read_keys(&r, &a), (generation + 1, vec![1, 0x22]));
    assert!(r.check_access(&b, &WRITE_10).is_ok());
    assert_consistent(&r);
    // Move back with UNREG: the sender's registration goes.
    let id_a = iscsi_transport_id(1, &a.initiator_port);
    let params = register_and_move_params(0x22, 0x99, 0x02, 1, &id_a);
    prout(&r, &b, PROUT_REGISTER_AND_MOVE, 0, &params).unwrap();
    // A was registered already, so it keeps its key.
    assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
    assert_eq!(read_keys(&r, &a).1, vec![1]);
    assert_consistent(&r);
}

#[test]
fn register_and_move_rejections() {
    let (r, [a]) = with_registrations([1]);
    let b = nexus(2);
    reserve(&r, &a, 1, EA).unwrap();
    let id_b = iscsi_transport_id(1, &b.initiator_port);
    let id_a = iscsi_transport_id(1, &a.initiator_port);
    let run = |params: &[u8]| prout(&r, &a, PROUT_REGISTER_AND_MOVE, 0, params);
    // To itself.
    assert_eq!(
        sense_reason(run(&register_and_move_params(1, 2, 0, 1, &id_a))),
        SenseReason::InvalidFieldInParameterList
    );
    // Key 0.
    assert_eq!(
        sense_reason(run(&register_and_move_params(1, 0, 0, 1, &id_b))),
        SenseReason::InvalidFieldInParameterList
    );
    // Relative target port 0.
    assert_eq!(
        sense_reason(run(&register_and_move_params(1, 2, 0, 0, &id_b))),
        SenseReason::InvalidFieldInParameterList
    );
    // A name without ISID is no I_T nexus.
    let node_b = iscsi_transport_id(0, &b.initiator_name);
    assert_eq!(
        sense_reason(run(&register_and_move_params(1, 2, 0, 1, &node_b))),
        SenseReason::InvalidFieldInParameterList
    );
    // TRANSPORTID PARAMETER DATA LENGTH disagreeing with the list.
    let mut params = register_and_move_params(1, 2, 0, 1, &id_b);
    params.push(0);
    assert_eq!(
        sense_reason(run(&params)),
        SenseReason::ParameterListLengthError
    );
    // Wrong key.
    assert_eq!(
        run(&register_and_move_params(7, 2, 0, 1, &id_b)),
        Err(PrError::Conflict)
    );
    // All-registrants reservations cannot be moved.
    release(&r, &a, 1, EA).unwrap();
    reserve(&r, &a, 1, EA_AR).unwrap();
    assert_eq!(
        run(&register_and_move_params(1, 2, 0, 1, &id_b)),
        Err(PrError::Conflict)
    );
    assert_eq!(read_keys(&r, &a).1, vec![1]);
}

#[test]
fn spec_i_pt_registers_named_initiators() {
    let r = Reservations::new(None);
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    // B by port (upper-case ISID is normalised), C by name only.
    let port_b = b
        .initiator_port
        .to_ascii_uppercase()
        .replace(",I,0X", ",i,0x");
    let ids = [
        iscsi_transport_id(1, &port_b),
        iscsi_transport_id(0, &c.initiator_name),
    ];
    let params = spec_i_pt_params(0, 0x5, 0, &ids);
    prout(&r, &a, PROUT_REGISTER, 0, &params).unwrap();
    assert_eq!(read_keys(&r, &a), (1, vec![5, 5, 5]));
    // C is registered through any ISID.
    let c_other_isid = Nexus {
        initiator_port: format!("{},i,0x400000000001", c.initiator_name),
        ..c.clone()
    };
    reserve(&r, &a, 5, EA_RO).unwrap();
    for n in [&b, &c, &c_other_isid] {
        assert!(r.check_access(n, &WRITE_10).is_ok());
    }
    assert!(r.check_access(&nexus(4), &READ_10).is_err());
    // READ FULL STATUS: three descriptors with TransportIDs of formats 01b, 01b, 00b.
    let data = prin(&r, &a, PRIN_READ_FULL_STATUS).unwrap();
    assert_eq!(
        u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize,
        data.len() - 8
    );
    let mut at = 8;
    let (mut formats, mut holders) = (Vec::new(), Vec::new());
    while at < data.len() {
        let descriptor = &data[at..];
        assert_eq!(&descriptor[0..8], &5u64.to_be_bytes());
        holders.push((descriptor[12] & 1, descriptor[13]));
        let id_len = u32::from_be_bytes(descriptor[20..24].try_into().unwrap()) as usize;
        formats.push(descriptor[24] >> 6);
        at += 24 + id_len;
    }
    assert_eq!(at, data.len());
    assert_eq!(formats, vec![1, 1, 0]);
    // Only the sender holds the registrants-only reservation.
    assert_eq!(holders, vec![(1, EA_RO), (0, 0), (0, 0)]);
}

#[test]
fn spec_i_pt_rejections() {
    let r = Reservations::new(None);
    let (a, b) = (nexus(1), nexus(2));
    register_ignore(&r, &b, 9);
    let id_b = iscsi_transport_id(1, &b.initiator_port);
    // B is registered already: nothing is registered.
    let params = spec_i_pt_params(0, 5, 0, std::slice::from_ref(&id_b));
    assert_eq!(
        sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
        SenseReason::InvalidFieldInParameterList
    );
    assert_eq!(read_keys(&r, &a).1, vec![9]);
    // From a registered sender.
    let params = spec_i_pt_params(9, 5, 0, &[iscsi_transport_id(1, &a.initiator_port)]);
    assert_eq!(
        sense_reason(prout(&r, &b, PROUT_REGISTER, 0, &params)),
        SenseReason::InvalidFieldInParameterList
    );
    // With REGISTER AND IGNORE EXISTING KEY.
    let params = spec_i_pt_params(0, 5, 0, &[]);
    assert_eq!(
        sense_reason(prout(
            &r,
            &a,
            PROUT_REGISTER_AND_IGNORE_EXISTING_KEY,
            0,
            &params
        )),
        SenseReason::InvalidFieldInParameterList
    );
    // Not iSCSI (FCP), malformed lengths, no NUL, bad ISID.
    let mut fcp = iscsi_transport_id(1, "iqn.x:y,i,0x000000000001");
    fcp[0] = 0x00;
    let mut no_nul = iscsi_transport_id(0, "iqn.x:y");
    no_nul[4..].fill(b'a');
    let mut odd = iscsi_transport_id(0, "iqn.x:y");
    odd[3] = 21;
    for bad in [
        fcp,
        no_nul,
        odd,
        iscsi_transport_id(1, "iqn.x:y,i,0xnothex"),
        iscsi_transport_id(1, "iqn.x:y"),
        iscsi_transport_id(0, ""),
        iscsi_transport_id(2, "iqn.x:y"),
    ] {
        let params = spec_i_pt_params(0, 5, 0, std::slice::from_ref(&bad));
        assert_eq!(
            sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
            SenseReason::InvalidFieldInParameterList,
            "{bad:x?}"
        );
    }
    // TRANSPORTID PARAMETER DATA LENGTH larger than what follows.
    let mut params = spec_i_pt_params(0, 5, 0, &[id_b]);
    params.truncate(params.len() - 4);
    assert_eq!(
        sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &params)),
        SenseReason::ParameterListLengthError
    );
    assert_eq!(read_keys(&r, &a).1, vec![9]);
    assert_consistent(&r);
}

#[test]
fn all_tg_pt_registers_every_target_port() {
    let r = Reservations::new(None);
    let a = nexus(1);
    prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 4, 0x04)).unwrap();
    let a_on_2 = on_port(a.clone(), 2);
    // Registered through port 2 too, with the same key.
    reserve(&r, &a_on_2, 4, EA).unwrap();
    assert!(r.check_access(&a, &WRITE_10).is_ok());
    let data = prin(&r, &a, PRIN_READ_FULL_STATUS).unwrap();
    assert_eq!(data[8 + 12], 0x03, "ALL_TG_PT and R_HOLDER");
    // Another port of a different initiator is not registered.
    assert!(r.check_access(&on_port(nexus(2), 2), &READ_10).is_err());
    // Through any target port it is the one registration: a key change applies everywhere.
    let a2 = on_port(a, 3);
    register(&r, &a2, 4, 5).unwrap();
    assert_eq!(read_keys(&r, &a2).1, vec![5]);
    // A new registration of one of A's nexuses on its own would overlap it.
    let b = nexus(2);
    let ids = [iscsi_transport_id(1, &a2.initiator_port)];
    let params = spec_i_pt_params(0, 6, 0, &ids);
    assert_eq!(
        sense_reason(prout(&r, &b, PROUT_REGISTER, 0, &params)),
        SenseReason::InvalidFieldInParameterList
    );
}

#[test]
fn parameter_list_validation() {
    let r = Reservations::new(None);
    let a = nexus(1);
    for len in [0, 8, 23, 25, 28] {
        let params = vec![0u8; len];
        for sa in 0..=7 {
            assert_eq!(
                sense_reason(prout(&r, &a, sa, WE, &params)),
                SenseReason::ParameterListLengthError,
                "sa {sa} len {len}"
            );
        }
    }
    // Unknown service actions.
    for sa in 8..0x20 {
        assert_eq!(
            sense_reason(prout(&r, &a, sa, WE, &basic_params(0, 1, 0))),
            SenseReason::InvalidFieldInCdb
        );
    }
    // SPEC_I_PT with anything but REGISTER.
    assert_eq!(
        sense_reason(prout(&r, &a, PROUT_RESERVE, WE, &basic_params(0, 1, 0x08))),
        SenseReason::InvalidFieldInParameterList
    );
    // APTPL without anywhere to persist.
    assert_eq!(
        sense_reason(prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 1, 0x01))),
        SenseReason::InvalidFieldInParameterList
    );
    assert_eq!(r.generation(), 0);
    // A CDB cut short never reaches the reservations: it does not parse.
    assert_eq!(
        cdb::parse(&[0x5f]).map_err(|sense| sense.reason),
        Err(SenseReason::InvalidFieldInCdb)
    );
}

#[test]
fn aptpl_state_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lu0").join("persistent-reservations");
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    {
        let r = Reservations::new(Some(path.clone()));
        register_ignore(&r, &a, 1);
        // APTPL=1 from now on: everything so far and later is saved.
        prout(&r, &b, PROUT_REGISTER, 0, &basic_params(0, 2, 0x01)).unwrap();
        let ids = [iscsi_transport_id(0, &c.initiator_name)];
        // The APTPL bit of the last registration is the one in force.
        let params = spec_i_pt_params(0, 3, 0x05, &ids);
        prout(&r, &on_port(nexus(4), 2), PROUT_REGISTER, 0, &params).unwrap();
        reserve(&r, &b, 2, EA_RO).unwrap();
        assert!(path.exists());
        assert!(!path.with_file_name("persistent-reservations.tmp").exists());
    }
    let r = Reservations::new(Some(path.clone()));
    assert_eq!(r.load_error(), None);
    assert_eq!(read_keys(&r, &a), (0, vec![1, 2, 3, 3]));
    assert_eq!(read_reservation(&r, &a), Some((2, EA_RO)));
    assert!(r.check_access(&b, &WRITE_10).is_ok());
    assert!(r.check_access(&on_port(c.clone(), 7), &WRITE_10).is_ok());
    assert!(r.check_access(&nexus(5), &READ_10).is_err());
    let caps = prin(&r, &a, PRIN_REPORT_CAPABILITIES).unwrap();
    assert_eq!(caps[3] & 1, 1, "PTPL_A");
    assert_consistent(&r);
    // APTPL=0 ends persistence: the file goes.
    prout(&r, &b, PROUT_REGISTER, 0, &basic_params(2, 2, 0)).unwrap();
    assert!(!path.exists());
    let r = Reservations::new(Some(path));
    assert_eq!(read_keys(&r, &a), (0, vec![]));
}

#[test]
fn aptpl_file_that_cannot_be_loaded_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pr");
    for bad in [
        "not json",
        r#"{"version": 2, "registrations": [], "reservation": null}"#,
        r#"{"version": 1, "registrations": [], "reservation": {"holder": 0, "type": 1}}"#,
        r#"{"version": 1, "registrations": [{"initiator": {"node": "iqn.a"},
            "target_port": null, "key": 0}], "reservation": null}"#,
        r#"{"version": 1, "registrations": [
            {"initiator": {"node": "iqn.a"}, "target_port": null, "key": 1},
            {"initiator": {"port": "iqn.a,i,0x000000000001"}, "target_port": 1, "key": 2}
           ], "reservation": null}"#,
        r#"{"version": 1, "registrations": [{"initiator": {"node": "iqn.a"},
            "target_port": 1, "key": 1}], "reservation": {"holder": 0, "type": 4}}"#,
    ] {
        fs::write(&path, bad).unwrap();
        let r = Reservations::new(Some(path.clone()));
        assert!(r.load_error().is_some(), "{bad}");
        assert_eq!(read_keys(&r, &nexus(1)).1, Vec::<u64>::new());
        // The file is left for an operator to look at.
        assert_eq!(fs::read_to_string(&path).unwrap(), bad);
    }
}

#[test]
fn aptpl_file_matches_documented_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pr");
    let r = Reservations::new(Some(path.clone()));
    let a = nexus(1);
    prout(&r, &a, PROUT_REGISTER, 0, &basic_params(0, 42, 0x01)).unwrap();
    reserve(&r, &a, 42, WE).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "version": 1,
            "registrations": [
                { "initiator": { "port": a.initiator_port }, "target_port": 1, "key": 42 }
            ],
            "reservation": { "holder": 0, "type": 1 }
        })
    );
}

/// libiscsi test_reserve6_2initiators and friends.
#[test]
fn reserve6_between_two_initiators() {
    let (r, [a, b]) = reserved6_by_nexus_1();
    r.reserve(&a).unwrap(); // the holder may reserve again
    assert_eq!(r.reserve(&b), Err(PrError::Conflict));
    assert!(r.check_access(&b, &[0x16, 0, 0, 0, 0, 0]).is_err());
    // RELEASE from a non-holder succeeds without effect.
    assert!(r.check_access(&b, &[0x17, 0, 0, 0, 0, 0]).is_ok());
    r.release(&b).unwrap();
    assert!(r.check_access(&a, &MODE_SENSE_6).is_ok());
    assert!(r.check_access(&b, &MODE_SENSE_6).is_err());
    assert!(r.check_access(&b, &TEST_UNIT_READY).is_err());
    assert!(r.check_access(&b, &INQUIRY).is_ok());
    assert!(r
        .check_access(&b, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0])
        .is_ok());
    // The same initiator port through another target port is another nexus.
    assert!(r.check_access(&on_port(a.clone(), 2), &READ_10).is_err());
    r.release(&a).unwrap();
    r.reserve(&b).unwrap();
    r.release(&b).unwrap();
    assert!(r.check_access(&a, &WRITE_10).is_ok());
    assert_consistent(&r);
}

#[test]
fn reserve6_ends_with_reset_and_nexus_loss() {
    let (r, [a, b]) = reserved6_by_nexus_1();
    r.reset();
    r.reserve(&b).unwrap();
    r.nexus_lost(&a); // not the holder: no effect
    assert_eq!(r.reserve(&a), Err(PrError::Conflict));
    r.nexus_lost(&b);
    r.reserve(&a).unwrap();
    assert_consistent(&r);
}

#[test]
fn persistent_reserve_commands_conflict_under_reserve6() {
    let (r, [a, b]) = reserved6_by_nexus_1();
    for n in [&a, &b] {
        assert_eq!(prin(&r, n, PRIN_READ_KEYS), Err(PrError::Conflict));
        assert_eq!(register(&r, n, 0, 1), Err(PrError::Conflict));
        assert!(r
            .check_access(n, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0])
            .is_err());
    }
    assert_eq!(r.generation(), 0);
}

#[test]
fn reserve6_and_release6_under_persistent_registrations() {
    let (r, [a]) = with_registrations([1]);
    let (b, c) = (nexus(2), nexus(3));
    // Any registration makes RESERVE conflict.
    assert_eq!(r.reserve(&a), Err(PrError::Conflict));
    assert_eq!(r.reserve(&c), Err(PrError::Conflict));
    // RELEASE: conflict unless holder (or registrant under RO / AR).
    assert_eq!(r.release(&a), Err(PrError::Conflict));
    reserve(&r, &a, 1, WE).unwrap();
    r.release(&a).unwrap();
    assert_eq!(read_reservation(&r, &a), Some((1, WE)), "not released");
    register_ignore(&r, &b, 2);
    assert_eq!(r.release(&b), Err(PrError::Conflict));
    release(&r, &a, 1, WE).unwrap();
    reserve(&r, &a, 1, WE_RO).unwrap();
    r.release(&b).unwrap();
    assert_eq!(r.release(&c), Err(PrError::Conflict));
    assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
    // Persistent reservations survive resets and nexus loss.
    r.reset();
    r.nexus_lost(&a);
    assert_eq!(read_reservation(&r, &a), Some((1, WE_RO)));
}

#[test]
fn transport_id_round_trip() {
    for initiator in [
        Initiator::Port("iqn.2024-01.test:h,i,0x00023d000001".into()),
        Initiator::Node("iqn.2024-01.test:a-much-longer-initiator-name".into()),
    ] {
        let encoded = encode_transport_id(&initiator);
        assert_eq!(encoded.len() % 4, 0);
        assert!(encoded.len() >= 24);
        assert_eq!(
            parse_transport_id(ParamList::new(&encoded)).ok(),
            Some((initiator, encoded.len()))
        );
    }
}

/// One random PERSISTENT RESERVE OUT, from one of a few nexuses, with random bytes
/// around a plausible layout.
fn random_prout(r: &Reservations, sender: u8, sa: u8, pr_type: u8, params: &[u8]) {
    let n = on_port(nexus(sender % 3), u16::from(sender % 2) + 1);
    let cdb = prout_cdb(sa, pr_type, params.len());
    let _ = r.persistent_reserve_out(&n, &parsed_prout(&cdb).unwrap(), params);
    let _ = r.check_access(&n, &WRITE_10);
    let _ = r.check_access(&n, &cdb);
    for sa in 0..5 {
        let _ = prin(r, &n, sa);
    }
    match sender % 5 {
        0 => drop(r.reserve(&n)),
        1 => drop(r.release(&n)),
        2 => r.nexus_lost(&n),
        _ => {}
    }
}

proptest::proptest! {
    #[test]
    fn random_parameter_lists_never_panic(
        commands in proptest::collection::vec(
            (
                0u8..8,
                0u8..0x20,
                0u8..0xff,
                proptest::collection::vec(0u8..4, 0..80),
            ),
            1..12,
        ),
    ) {
        let r = Reservations::new(None);
        for (sender, sa, pr_type, noise) in commands {
            // Small byte values make keys collide and flags hit; sometimes splice in a
            // valid TransportID so the deeper paths run.
            let mut params: Vec<u8> = noise.iter().map(|b| b & 3).collect();
            if sender % 2 == 0 {
                params.resize(24, 0);
                params.extend_from_slice(&[0, 0, 0, 24]);
                params.extend_from_slice(&iscsi_transport_id(1, &nexus(sa % 3).initiator_port));
            }
            random_prout(&r, sender, sa % 9, pr_type % 10, &params);
            assert_consistent(&r);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        cdb in proptest::collection::vec(proptest::num::u8::ANY, 0..16),
        params in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
    ) {
        let r = Reservations::new(None);
        // The bytes as a PERSISTENT RESERVE OUT and IN CDB, where they parse as one.
        let mut as_cdb = cdb.clone();
        as_cdb.resize(10, 0);
        as_cdb[0] = 0x5f;
        if let Some(prout) = parsed_prout(&as_cdb) {
            let _ = r.persistent_reserve_out(&nexus(1), &prout, &params);
        }
        as_cdb[0] = 0x5e;
        if let Some(action) = parsed_prin(&as_cdb) {
            let _ = r.persistent_reserve_in(&nexus(1), action);
        }
        let _ = r.check_access(&nexus(2), &cdb);
        let _ = parse_transport_ids(ParamList::new(&params));
        assert_consistent(&r);
    }
}
