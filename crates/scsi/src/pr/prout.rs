//! PERSISTENT RESERVE OUT parsing: the parsed CDB and the parameter list validated into a
//! [`ProutRequest`], and the iSCSI TransportIDs they carry (parsed, and encoded for READ FULL
//! STATUS).

use crate::cdb::{ProutCdb, ProutServiceAction};
use crate::outcome::{invalid_cdb, Failure};
use crate::param::{length_error, ParamList};
use crate::SenseReason;

use super::model::MAX_REGISTRATIONS;
use super::model::{find_ignore_ascii_case, Initiator, PrType, ISID_SEPARATOR, SCOPE_LU};

/// Longest iSCSI name (RFC 7143).
const MAX_ISCSI_NAME_LEN: usize = 223;

/// TransportID protocol identifier for iSCSI (SPC-4).
const PROTOCOL_ID_ISCSI: u8 = 0x5;

/// Length of the basic PERSISTENT RESERVE OUT parameter list (and of the REGISTER AND MOVE
/// header before its TransportID).
pub(super) const BASIC_PARAMETER_LIST_LEN: usize = 24;

/// A validated PERSISTENT RESERVE OUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProutRequest {
    /// RESERVATION KEY: the key the sending nexus is registered with.
    pub(super) key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub(super) service_action_key: u64,
    pub(super) action: ProutAction,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProutAction {
    Register {
        ignore_existing_key: bool,
        /// SPEC_I_PT=1: further initiators to register along with the sender.
        also_register: Option<Vec<Initiator>>,
        all_target_ports: bool,
        aptpl: bool,
    },
    Reserve(PrType),
    Release {
        scope: u8,
        type_code: u8,
    },
    Clear,
    /// PREEMPT, or PREEMPT AND ABORT (`abort`): the preempted nexuses' tasks are aborted too.
    Preempt {
        pr_type: PrType,
        abort: bool,
    },
    RegisterAndMove {
        destination: Initiator,
        target_port: u16,
        unregister: bool,
        aptpl: bool,
    },
}

impl ProutRequest {
    /// Validates the parsed CDB and the parameter list (SPC-4): a reserved service action
    /// first, then the parameter list's length, then SCOPE and TYPE where the service action
    /// uses them. `persist_capable`: APTPL=1 can be honoured.
    pub(super) fn parse(
        cdb: &ProutCdb,
        params: ParamList,
        persist_capable: bool,
    ) -> Result<Self, Failure> {
        let service_action = cdb.action?;
        let (scope, type_code) = (cdb.scope, cdb.type_code);
        if params.len() < BASIC_PARAMETER_LIST_LEN {
            return Err(length_error());
        }
        let key = params.be64(0)?;
        let service_action_key = params.be64(8)?;
        // SCOPE, then TYPE, for the service actions that take them.
        let valid_scope_and_type = || {
            if scope != SCOPE_LU {
                return Err(invalid_cdb(2, Some(7)));
            }
            PrType::from_code(type_code).ok_or_else(|| invalid_cdb(2, Some(3)))
        };
        let action = match service_action {
            ProutServiceAction::RegisterAndMove => {
                parse_register_and_move(params, persist_capable)?
            }
            ProutServiceAction::Register | ProutServiceAction::RegisterAndIgnoreExistingKey => {
                let is_register = service_action == ProutServiceAction::Register;
                parse_register(is_register, params, persist_capable)?
            }
            ProutServiceAction::Reserve => {
                basic_flags(params, false)?;
                ProutAction::Reserve(valid_scope_and_type()?)
            }
            ProutServiceAction::Release => {
                basic_flags(params, false)?;
                ProutAction::Release { scope, type_code }
            }
            ProutServiceAction::Clear => {
                basic_flags(params, false)?;
                ProutAction::Clear
            }
            ProutServiceAction::Preempt | ProutServiceAction::PreemptAndAbort => {
                basic_flags(params, false)?;
                ProutAction::Preempt {
                    pr_type: valid_scope_and_type()?,
                    abort: service_action == ProutServiceAction::PreemptAndAbort,
                }
            }
        };
        Ok(ProutRequest {
            key,
            service_action_key,
            action,
        })
    }
}

/// The flags byte of the basic parameter list: SPEC_I_PT, ALL_TG_PT and APTPL.
struct BasicFlags {
    spec_i_pt: bool,
    all_target_ports: bool,
    aptpl: bool,
}

/// The flags of a basic parameter list (every service action's but REGISTER AND MOVE's),
/// checked with the list's length: SPEC_I_PT only for REGISTER (`is_register`), and then
/// the TransportIDs' length, else exactly the basic list.
fn basic_flags(params: ParamList, is_register: bool) -> Result<BasicFlags, Failure> {
    let flags = params.u8(20)?;
    let spec_i_pt = flags & 0x08 != 0;
    if spec_i_pt && !is_register {
        // SPEC_I_PT is defined for REGISTER only (SPC-4).
        return Err(params.invalid(20, Some(3)));
    }
    if spec_i_pt {
        // A TRANSPORTID PARAMETER DATA LENGTH and the TransportIDs follow.
        let ids_len = params.be32(24)?;
        let expected = usize::try_from(ids_len)
            .ok()
            .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN + 4));
        if expected != Some(params.len()) {
            return Err(length_error());
        }
    } else if params.len() != BASIC_PARAMETER_LIST_LEN {
        return Err(length_error());
    }
    Ok(BasicFlags {
        spec_i_pt,
        all_target_ports: flags & 0x04 != 0,
        aptpl: flags & 0x01 != 0,
    })
}

/// REGISTER (`is_register`) or REGISTER AND IGNORE EXISTING KEY: the basic parameter list,
/// with SPEC_I_PT's TransportIDs.
fn parse_register(
    is_register: bool,
    params: ParamList,
    persist_capable: bool,
) -> Result<ProutAction, Failure> {
    // SPEC_I_PT is REGISTER's alone: REGISTER AND IGNORE EXISTING KEY with it is invalid.
    let flags = basic_flags(params, is_register)?;
    if flags.aptpl && !persist_capable {
        return Err(params.invalid(20, Some(0)));
    }
    let also_register = if flags.spec_i_pt {
        let at = BASIC_PARAMETER_LIST_LEN + 4;
        let ids = params.sub(at, params.len() - at)?;
        Some(parse_transport_ids(ids)?)
    } else {
        None
    };
    Ok(ProutAction::Register {
        ignore_existing_key: !is_register,
        also_register,
        all_target_ports: flags.all_target_ports,
        aptpl: flags.aptpl,
    })
}

/// The REGISTER AND MOVE parameter list (SPC-4): the basic header with UNREG, APTPL
/// and RELATIVE TARGET PORT IDENTIFIER, then exactly one TransportID.
fn parse_register_and_move(
    params: ParamList,
    persist_capable: bool,
) -> Result<ProutAction, Failure> {
    let flags = params.u8(17)?;
    let unregister = flags & 0x02 != 0;
    let aptpl = flags & 0x01 != 0;
    let target_port = params.be16(18)?;
    let ids_len = params.be32(20)?;
    let expected = usize::try_from(ids_len)
        .ok()
        .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN));
    if expected != Some(params.len()) {
        return Err(length_error());
    }
    if aptpl && !persist_capable {
        return Err(params.invalid(17, Some(0)));
    }
    if target_port == 0 {
        // Relative target port identifier 0 is reserved (SPC-4).
        return Err(params.invalid(18, None));
    }
    let ids = params.sub(
        BASIC_PARAMETER_LIST_LEN,
        params.len() - BASIC_PARAMETER_LIST_LEN,
    )?;
    let (destination, used) = parse_transport_id(ids)?;
    if used != ids.len() {
        return Err(ids.invalid(used, None));
    }
    // The destination is an I_T nexus: a name without ISID names no single port.
    if !matches!(destination, Initiator::Port(_)) {
        return Err(ids.invalid(0, None));
    }
    Ok(ProutAction::RegisterAndMove {
        destination,
        target_port,
        unregister,
        aptpl,
    })
}

/// iSCSI TransportIDs packed back to back, filling `ids`.
pub(super) fn parse_transport_ids(ids: ParamList) -> Result<Vec<Initiator>, Failure> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < ids.len() {
        if found.len() >= MAX_REGISTRATIONS {
            return Err(SenseReason::InsufficientRegistrationResources.into());
        }
        let (id, used) = parse_transport_id(ids.sub(at, ids.len() - at)?)?;
        found.push(id);
        at += used;
    }
    Ok(found)
}

/// The iSCSI TransportID (SPC-4) at the start of `list`: returns it and its length in bytes.
/// Anything malformed, a TransportID cut short included, is an invalid field pointing at the
/// TransportID's first byte, its ADDITIONAL LENGTH or its name.
pub(super) fn parse_transport_id(list: ParamList) -> Result<(Initiator, usize), Failure> {
    let (Ok(format_protocol), Ok(additional_len)) = (list.u8(0), list.be16(2)) else {
        return Err(list.invalid(0, None));
    };
    if format_protocol & 0x0f != PROTOCOL_ID_ISCSI {
        return Err(list.invalid(0, None));
    }
    let additional_len = usize::from(additional_len);
    if additional_len == 0 || additional_len % 4 != 0 {
        return Err(list.invalid(2, None));
    }
    let total = additional_len + 4;
    let Ok(name) = list.sub(4, additional_len) else {
        return Err(list.invalid(2, None));
    };
    let body = name.bytes();
    // The text is NUL-terminated and NUL-padded.
    let text_len = body
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| name.invalid(0, None))?;
    let text = std::str::from_utf8(&body[..text_len]).map_err(|_| name.invalid(0, None))?;
    let initiator = match format_protocol >> 6 {
        0b00 => {
            validate_iscsi_name(text).ok_or_else(|| name.invalid(0, None))?;
            Initiator::Node(text.to_string())
        }
        0b01 => {
            let at = find_ignore_ascii_case(text, ISID_SEPARATOR)
                .ok_or_else(|| name.invalid(0, None))?;
            let node = &text[..at];
            let isid = &text[at + ISID_SEPARATOR.len()..];
            validate_iscsi_name(node).ok_or_else(|| name.invalid(0, None))?;
            if isid.is_empty() || isid.len() > 12 || !isid.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(name.invalid(0, None));
            }
            // The form the iSCSI layer builds nexus names in: 12 lower-case hex digits.
            let isid = format!("{:0>12}", isid.to_ascii_lowercase());
            Initiator::Port(format!("{node}{ISID_SEPARATOR}{isid}"))
        }
        _ => return Err(list.invalid(0, None)),
    };
    Ok((initiator, total))
}

pub(super) fn validate_iscsi_name(name: &str) -> Option<()> {
    let plausible = !name.is_empty()
        && name.len() <= MAX_ISCSI_NAME_LEN
        && !name.contains(',')
        && name.bytes().all(|b| b.is_ascii_graphic());
    plausible.then_some(())
}

/// Encodes a TransportID for READ FULL STATUS: format 01b for a port, 00b for a node.
pub(super) fn encode_transport_id(initiator: &Initiator) -> Vec<u8> {
    let (format, text) = match initiator {
        Initiator::Port(port) => (0b01u8, port.as_bytes()),
        Initiator::Node(name) => (0b00u8, name.as_bytes()),
    };
    // Names come from login or from TransportIDs we parsed (both bounded), but never let a
    // long one overflow the 16-bit length.
    let text = text.get(..text.len().min(0xfff0)).unwrap_or(text);
    // NUL-terminated, padded to a multiple of 4, at least 20 bytes (SPC-4).
    let padded_len = (text.len() + 1).next_multiple_of(4).max(20);
    let mut id = Vec::with_capacity(4 + padded_len);
    id.push(format << 6 | PROTOCOL_ID_ISCSI);
    id.push(0);
    id.extend_from_slice(&u16::try_from(padded_len).unwrap_or(u16::MAX).to_be_bytes());
    id.extend_from_slice(text);
    id.resize(4 + padded_len, 0);
    id
}
