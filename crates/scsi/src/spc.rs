//! Primary commands (SPC-4): INQUIRY, REQUEST SENSE, REPORT LUNS, mode parameters,
//! reservations, and the MAINTENANCE IN reports.

use crate::cdb::{self, Command, RsocOptions, SUPPORTED_COMMANDS};
use crate::lu::LogicalUnit;
use crate::outcome::invalid_cdb;
use crate::outcome::{data_out_prefix, truncated, Done, Outcome};
use crate::{mode, vpd, Request, Sense, SenseReason};

/// Version descriptors (SPC-4 table 144): SAM-5, SPC-4, SBC-3, iSCSI (no version claimed).
const VERSION_DESCRIPTORS: [u16; 4] = [0x00a0, 0x0460, 0x04c0, 0x0960];

/// Recommended command timeout reported in RSOC timeouts descriptors, in seconds.
const RECOMMENDED_TIMEOUT_SECS: u32 = 30;
/// SANITIZE rewrites the whole volume.
const SANITIZE_TIMEOUT_SECS: u32 = 3600;

pub(crate) fn execute(lu: &LogicalUnit, req: &Request, cmd: &Command) -> Outcome {
    match *cmd {
        Command::TestUnitReady => Ok(Done::good()),
        Command::Inquiry {
            evpd,
            page,
            alloc_len,
        } => inquiry(lu, req, evpd, page, alloc_len),
        Command::ReportLuns { .. } => report_luns(req, cmd),
        Command::ModeSense {
            ten,
            dbd,
            llbaa,
            control,
            page,
            subpage,
            alloc_len,
        } => mode::mode_sense(lu, ten, dbd, llbaa, control, page, subpage, alloc_len),
        Command::ModeSelect {
            ten,
            save_pages,
            param_len,
        } => mode::mode_select(lu, req.nexus, ten, save_pages, param_len, req.data_out),
        Command::Reserve => {
            lu.reservations.reserve(req.nexus)?;
            Ok(Done::good())
        }
        Command::Release => {
            lu.reservations.release(req.nexus)?;
            Ok(Done::good())
        }
        Command::PersistentReserveIn { action, alloc_len } => {
            let data = lu.reservations.persistent_reserve_in(req.nexus, action)?;
            Ok(Done::data(truncated(data, alloc_len)))
        }
        Command::PersistentReserveOut(ref prout) => {
            let params = data_out_prefix(req.data_out, prout.param_len)?;
            let effects = lu
                .reservations
                .persistent_reserve_out(req.nexus, prout, params)?;
            // PREEMPT AND ABORT: the preempted nexuses' new commands already meet the
            // reservation; their running ones are aborted before the unit attentions are
            // queued (an aborted command that took one would hide it behind TASK ABORTED;
            // `UnitTask::end` keeps those anyway) and end before this command does. Never
            // this nexus's own (this command among them), even if another of its
            // registrations went.
            let aborted = effects.aborts_tasks().then(|| {
                lu.tasks
                    .abort_nexuses(|n| n != req.nexus && effects.aborts_tasks_of(n))
            });
            lu.queue_pending(effects.unit_attentions);
            if let Some(aborted) = aborted {
                aborted.wait();
            }
            Ok(Done::good())
        }
        Command::ReportTargetPortGroups {
            extended,
            alloc_len,
        } => Ok(Done::data(truncated(
            report_target_port_groups(lu, req, extended),
            alloc_len,
        ))),
        Command::ReportSupportedOpcodes {
            rctd,
            options,
            alloc_len,
        } => report_supported_opcodes(lu, rctd, options, alloc_len),
        Command::ReportSupportedTmfs {
            extended,
            alloc_len,
        } => report_supported_tmfs(extended, alloc_len),
        Command::LogSense {
            page_control,
            page,
            subpage,
            alloc_len,
        } => log_sense(lu, page_control, page, subpage, alloc_len),
        Command::Unsupported { .. } => Err(SenseReason::InvalidOpcode.into()),
        // Block commands are dispatched to sbc; reaching here is a dispatcher bug, which we
        // report rather than pretend success.
        _ => Err(SenseReason::InvalidOpcode.into()),
    }
}

fn padded(s: &str, len: usize) -> Vec<u8> {
    // SPC-4 4.4.1: printable ASCII only, left-aligned, space-padded.
    let mut v: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..0x7f).contains(&b) { b } else { b' ' })
        .take(len)
        .collect();
    v.resize(len, b' ');
    v
}

fn standard_inquiry(peripheral: u8, vendor: &str, product: &str, revision: &str) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    d[0] = peripheral;
    d[2] = 0x06; // SPC-4
    d[3] = 0x10 | 0x02; // HISUP, response data format 2
    d[4] = (d.len() - 5) as u8;
    d[5] = 0x10 | 0x08; // TPGS = 01b (implicit ALUA), 3PC
    d[7] = 0x02; // CMDQUE
    d[8..16].copy_from_slice(&padded(vendor, 8));
    d[16..32].copy_from_slice(&padded(product, 16));
    d[32..36].copy_from_slice(&padded(revision, 4));
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    d
}

fn inquiry(lu: &LogicalUnit, req: &Request, evpd: bool, page: u8, alloc_len: usize) -> Outcome {
    let data = if evpd {
        vpd::page(lu, req.nexus, page).ok_or_else(|| invalid_cdb(2, None))?
    } else {
        let c = &lu.config;
        standard_inquiry(0x00, &c.vendor, &c.product, &c.revision)
    };
    Ok(Done::data(truncated(data, alloc_len)))
}

/// INQUIRY for a LUN that does not exist: peripheral qualifier 011b, device type 1Fh.
pub(crate) fn inquiry_without_lu(cmd: &Command) -> Outcome {
    const NO_DEVICE: u8 = 0x7f;
    let Command::Inquiry {
        evpd,
        page,
        alloc_len,
    } = *cmd
    else {
        return Err(SenseReason::InvalidOpcode.into());
    };
    let data = if evpd {
        match page {
            0x00 => vec![NO_DEVICE, 0x00, 0x00, 0x01, 0x00],
            _ => return Err(invalid_cdb(2, None)),
        }
    } else {
        standard_inquiry(NO_DEVICE, "", "", "")
    };
    Ok(Done::data(truncated(data, alloc_len)))
}

/// REQUEST SENSE: the pending unit attention (already taken off the queue by the caller)
/// or NO SENSE, in the format the CDB asks for.
pub(crate) fn request_sense(reason: SenseReason, descriptor: bool, cmd: &Command) -> Outcome {
    let Command::RequestSense { alloc_len, .. } = *cmd else {
        return Err(SenseReason::InvalidOpcode.into());
    };
    let sense = Sense::from(reason);
    let data = if descriptor {
        sense.to_descriptor()
    } else {
        sense.to_fixed()
    };
    Ok(Done::data(truncated(data, alloc_len)))
}

/// SAM-5 4.6: single level LUN structure, peripheral device addressing below 256, flat space
/// addressing below 16384. Larger values are taken as an already encoded 8-byte LUN.
fn encode_lun(lun: u64) -> [u8; 8] {
    match lun {
        0..=0xff => [0, lun as u8, 0, 0, 0, 0, 0, 0],
        0x100..=0x3fff => [0x40 | (lun >> 8) as u8, lun as u8, 0, 0, 0, 0, 0, 0],
        _ => lun.to_be_bytes(),
    }
}

pub(crate) fn report_luns(req: &Request, cmd: &Command) -> Outcome {
    let Command::ReportLuns { select, alloc_len } = *cmd else {
        return Err(SenseReason::InvalidOpcode.into());
    };
    if alloc_len < 16 {
        return Err(invalid_cdb(6, None));
    }
    let luns: &[u64] = match select {
        // All logical units (0x02 would add well-known LUs, of which we have none).
        0x00 | 0x02 => req.luns,
        // Well-known logical units only; administrative LUs (SPC-5 0x10..0x12): none.
        0x01 | 0x10..=0x12 => &[],
        _ => return Err(invalid_cdb(2, None)),
    };
    let list_len = luns.len().saturating_mul(8);
    let mut data = Vec::with_capacity(8 + list_len);
    data.extend_from_slice(&u32::try_from(list_len).unwrap_or(u32::MAX).to_be_bytes());
    data.extend_from_slice(&[0; 4]);
    for &lun in luns {
        data.extend_from_slice(&encode_lun(lun));
    }
    Ok(Done::data(truncated(data, alloc_len)))
}

fn report_target_port_groups(lu: &LogicalUnit, req: &Request, extended: bool) -> Vec<u8> {
    let mut d = vec![0u8; 4];
    if extended {
        d.push(0x10); // format type 1: extended header
        d.push(0); // implicit transition time
        d.extend_from_slice(&[0, 0]);
    }
    d.push(0x80); // PREF = 1, asymmetric access state 0h: active/optimized
    d.push(0x01); // AO_SUP: only active/optimized is supported
    d.extend_from_slice(&lu.config.target_port_group.to_be_bytes());
    d.push(0);
    d.push(0); // status code: no status available
    d.push(0); // vendor specific
    d.push(1); // target port count
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(&req.nexus.relative_target_port.to_be_bytes());
    let len = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&len.to_be_bytes());
    d
}

fn timeouts_descriptor(opcode: u8) -> [u8; 12] {
    let secs = if opcode == cdb::opcode::SANITIZE {
        SANITIZE_TIMEOUT_SECS
    } else {
        RECOMMENDED_TIMEOUT_SECS
    };
    let mut t = [0u8; 12];
    t[1] = 0x0a; // descriptor length
                 // Nominal processing timeout 0: not specified.
    t[8..12].copy_from_slice(&secs.to_be_bytes());
    t
}

const LOG_PAGE_SUPPORTED: u8 = 0x00;
const LOG_PAGE_PROVISIONING: u8 = 0x0c;

/// LOG SENSE: the supported-pages page and LOGICAL BLOCK PROVISIONING (SBC-3 6.4.4), whose
/// resource counts are in units of 2^THRESHOLD EXPONENT blocks (1 MiB, VPD B2).
fn log_sense(
    lu: &LogicalUnit,
    page_control: u8,
    page: u8,
    subpage: u8,
    alloc_len: usize,
) -> Outcome {
    // Only cumulative values exist; threshold values are not kept per page.
    if page_control != 1 {
        return Err(invalid_cdb(2, Some(7)));
    }
    if subpage != 0 {
        return Err(invalid_cdb(3, None));
    }
    let params = match page {
        LOG_PAGE_SUPPORTED => vec![LOG_PAGE_SUPPORTED, LOG_PAGE_PROVISIONING],
        LOG_PAGE_PROVISIONING => {
            let mib = |bytes: u64| u32::try_from(bytes >> 20).unwrap_or(u32::MAX);
            let mut p = Vec::new();
            // (parameter code, resource count, scope: 01b dedicated to this LU, 10b shared)
            let mut entries = Vec::new();
            if let Some(available) = lu.pool.as_ref().map(|p| p.available_bytes()) {
                entries.push((0x0001u16, mib(available), 0x02u8));
            }
            let space = lu.volume.space().map_err(crate::outcome::read_failure)?;
            entries.push((0x0002, mib(space.unique_bytes + space.shared_bytes), 0x01));
            for (code, count, scope) in entries {
                p.extend_from_slice(&code.to_be_bytes());
                p.push(0x03); // binary format and linking
                p.push(8);
                p.extend_from_slice(&count.to_be_bytes());
                p.extend_from_slice(&[0, 0, 0, scope]);
            }
            p
        }
        _ => return Err(invalid_cdb(2, Some(5))),
    };
    let mut d = vec![page, 0];
    d.extend_from_slice(&(params.len() as u16).to_be_bytes());
    d.extend_from_slice(&params);
    Ok(Done::data(truncated(d, alloc_len)))
}

/// Whether this LU implements `c` (some commands depend on what the volume can promise).
fn implemented(lu: &LogicalUnit, c: &cdb::CommandInfo) -> bool {
    c.opcode != cdb::opcode::WRITE_ATOMIC_16 || lu.volume.max_atomic_write_bytes() > 0
}

fn report_supported_opcodes(
    lu: &LogicalUnit,
    rctd: bool,
    options: RsocOptions,
    alloc_len: usize,
) -> Outcome {
    let ctdp = if rctd { 0x02 } else { 0 };
    let data = match options {
        RsocOptions::All => {
            let mut d = vec![0u8; 4];
            for c in SUPPORTED_COMMANDS.iter().filter(|c| implemented(lu, c)) {
                d.push(c.opcode);
                d.push(0);
                d.extend_from_slice(&c.service_action.unwrap_or(0).to_be_bytes());
                d.push(0);
                d.push(ctdp | u8::from(c.service_action.is_some()));
                d.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
                if rctd {
                    d.extend_from_slice(&timeouts_descriptor(c.opcode));
                }
            }
            let len = u32::try_from(d.len() - 4).unwrap_or(u32::MAX);
            d[0..4].copy_from_slice(&len.to_be_bytes());
            d
        }
        RsocOptions::Opcode(op) => {
            if cdb::has_service_actions(op) {
                return Err(invalid_cdb(2, Some(2)));
            }
            one_command(lu, op, None, rctd)
        }
        RsocOptions::OpcodeServiceAction(op, sa) => {
            if !cdb::has_service_actions(op) {
                return Err(invalid_cdb(2, Some(2)));
            }
            one_command(lu, op, Some(sa), rctd)
        }
        RsocOptions::OpcodeMaybeServiceAction(op, sa) => {
            if cdb::has_service_actions(op) {
                one_command(lu, op, Some(sa), rctd)
            } else if sa != 0 {
                // A service action for an opcode that has none: not supported.
                vec![0, 0x01, 0, 0]
            } else {
                one_command(lu, op, None, rctd)
            }
        }
    };
    Ok(Done::data(truncated(data, alloc_len)))
}

/// One-command parameter data (SPC-4 6.35.3).
fn one_command(lu: &LogicalUnit, op: u8, sa: Option<u16>, rctd: bool) -> Vec<u8> {
    let found = SUPPORTED_COMMANDS
        .iter()
        .find(|c| c.opcode == op && c.service_action == sa && implemented(lu, c));
    match found {
        None => vec![0, 0x01, 0, 0], // SUPPORT 001b: not supported
        Some(c) => {
            let mut d = vec![0, 0x03]; // SUPPORT 011b: supported as the standard says
            if rctd {
                d[1] |= 0x80; // CTDP
            }
            d.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
            d.extend_from_slice(c.usage);
            if rctd {
                d.extend_from_slice(&timeouts_descriptor(c.opcode));
            }
            d
        }
    }
}

fn report_supported_tmfs(extended: bool, alloc_len: usize) -> Outcome {
    if alloc_len < 4 {
        return Err(invalid_cdb(6, None));
    }
    // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, TARGET RESET;
    // I_T NEXUS RESET (iSCSI session reinstatement).
    let mut d = vec![0x80 | 0x40 | 0x10 | 0x08 | 0x01, 0x01, 0, 0];
    if extended {
        d[3] = 0x0c; // additional data length
        d.resize(16, 0);
    }
    Ok(Done::data(truncated(d, alloc_len)))
}
