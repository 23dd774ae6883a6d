//! PERSISTENT RESERVE OUT parsing: the CDB and parameter list validated into a
//! [`ProutRequest`], and the iSCSI TransportIDs they carry (parsed, and encoded for READ FULL
//! STATUS).

use crate::{Sense, SenseReason};

use super::model::{find_ignore_ascii_case, Initiator, PrType, ISID_SEPARATOR, SCOPE_LU};
use super::{PrError, MAX_REGISTRATIONS};

/// Longest iSCSI name (RFC 7143).
const MAX_ISCSI_NAME_LEN: usize = 223;

/// TransportID protocol identifier for iSCSI (SPC-4).
const PROTOCOL_ID_ISCSI: u8 = 0x5;

/// PERSISTENT RESERVE OUT service actions.
pub(super) const PROUT_REGISTER: u8 = 0x00;
pub(super) const PROUT_RESERVE: u8 = 0x01;
pub(super) const PROUT_RELEASE: u8 = 0x02;
pub(super) const PROUT_CLEAR: u8 = 0x03;
pub(super) const PROUT_PREEMPT: u8 = 0x04;
pub(super) const PROUT_PREEMPT_AND_ABORT: u8 = 0x05;
pub(super) const PROUT_REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
pub(super) const PROUT_REGISTER_AND_MOVE: u8 = 0x07;

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
    Preempt(PrType),
    RegisterAndMove {
        destination: Initiator,
        target_port: u16,
        unregister: bool,
        aptpl: bool,
    },
}

fn invalid_cdb_field(byte: u16, bit: u8) -> PrError {
    PrError::Sense(Sense::invalid_cdb(byte, Some(bit)))
}

pub(super) fn invalid_parameter(byte: usize) -> PrError {
    PrError::Sense(Sense::invalid_param(byte, None))
}

fn parameter_list_length_error() -> PrError {
    SenseReason::ParameterListLengthError.into()
}

fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let field = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_be_bytes(field.try_into().ok()?))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(field.try_into().ok()?))
}

impl ProutRequest {
    /// Validates the CDB and parameter list (SPC-4). `persist_capable`: APTPL=1 can be
    /// honoured.
    pub(super) fn parse(cdb: &[u8], params: &[u8], persist_capable: bool) -> Result<Self, PrError> {
        let service_action = cdb.get(1).ok_or_else(|| invalid_cdb_field(1, 4))? & 0x1f;
        let scope_type = cdb.get(2).copied().unwrap_or(0);
        let (scope, type_code) = (scope_type >> 4, scope_type & 0x0f);
        if service_action > PROUT_REGISTER_AND_MOVE {
            return Err(invalid_cdb_field(1, 4));
        }
        if params.len() < BASIC_PARAMETER_LIST_LEN {
            return Err(parameter_list_length_error());
        }
        let key = be_u64(params, 0).ok_or_else(parameter_list_length_error)?;
        let service_action_key = be_u64(params, 8).ok_or_else(parameter_list_length_error)?;

        if service_action == PROUT_REGISTER_AND_MOVE {
            let action = parse_register_and_move(params, persist_capable)?;
            return Ok(ProutRequest {
                key,
                service_action_key,
                action,
            });
        }

        let flags = params.get(20).copied().unwrap_or(0);
        let spec_i_pt = flags & 0x08 != 0;
        let all_target_ports = flags & 0x04 != 0;
        let aptpl = flags & 0x01 != 0;
        let is_register = service_action == PROUT_REGISTER;
        if spec_i_pt && !is_register {
            // SPEC_I_PT is defined for REGISTER only (SPC-4).
            return Err(invalid_parameter(20));
        }
        if spec_i_pt {
            // A TRANSPORTID PARAMETER DATA LENGTH and the TransportIDs follow.
            let ids_len = be_u32(params, 24).ok_or_else(parameter_list_length_error)?;
            let expected = usize::try_from(ids_len)
                .ok()
                .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN + 4));
            if expected != Some(params.len()) {
                return Err(parameter_list_length_error());
            }
        } else if params.len() != BASIC_PARAMETER_LIST_LEN {
            return Err(parameter_list_length_error());
        }

        let valid_type = || PrType::from_code(type_code).ok_or_else(|| invalid_cdb_field(2, 3));
        let valid_scope = || {
            if scope == SCOPE_LU {
                Ok(())
            } else {
                Err(invalid_cdb_field(2, 7))
            }
        };
        let action = match service_action {
            PROUT_REGISTER | PROUT_REGISTER_AND_IGNORE_EXISTING_KEY => {
                if aptpl && !persist_capable {
                    return Err(invalid_parameter(20));
                }
                let also_register = if spec_i_pt {
                    let ids = params.get(BASIC_PARAMETER_LIST_LEN + 4..).unwrap_or(&[]);
                    Some(parse_transport_ids(ids, BASIC_PARAMETER_LIST_LEN + 4)?)
                } else {
                    None
                };
                ProutAction::Register {
                    ignore_existing_key: !is_register,
                    also_register,
                    all_target_ports,
                    aptpl,
                }
            }
            PROUT_RESERVE => {
                valid_scope()?;
                ProutAction::Reserve(valid_type()?)
            }
            PROUT_RELEASE => ProutAction::Release { scope, type_code },
            PROUT_CLEAR => ProutAction::Clear,
            PROUT_PREEMPT | PROUT_PREEMPT_AND_ABORT => {
                valid_scope()?;
                ProutAction::Preempt(valid_type()?)
            }
            _ => return Err(invalid_cdb_field(1, 4)),
        };
        Ok(ProutRequest {
            key,
            service_action_key,
            action,
        })
    }
}

/// The REGISTER AND MOVE parameter list (SPC-4): the basic header with UNREG, APTPL
/// and RELATIVE TARGET PORT IDENTIFIER, then exactly one TransportID.
fn parse_register_and_move(params: &[u8], persist_capable: bool) -> Result<ProutAction, PrError> {
    let flags = params.get(17).copied().unwrap_or(0);
    let unregister = flags & 0x02 != 0;
    let aptpl = flags & 0x01 != 0;
    let target_port = match params.get(18..20) {
        Some(&[hi, lo]) => u16::from_be_bytes([hi, lo]),
        _ => return Err(parameter_list_length_error()),
    };
    let ids_len = be_u32(params, 20).ok_or_else(parameter_list_length_error)?;
    let expected = usize::try_from(ids_len)
        .ok()
        .and_then(|n| n.checked_add(BASIC_PARAMETER_LIST_LEN));
    if expected != Some(params.len()) {
        return Err(parameter_list_length_error());
    }
    if aptpl && !persist_capable {
        return Err(invalid_parameter(17));
    }
    if target_port == 0 {
        // Relative target port identifier 0 is reserved (SPC-4).
        return Err(invalid_parameter(18));
    }
    let ids = params.get(BASIC_PARAMETER_LIST_LEN..).unwrap_or(&[]);
    let (destination, used) = parse_transport_id(ids, BASIC_PARAMETER_LIST_LEN)?;
    if used != ids.len() {
        return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN + used));
    }
    // The destination is an I_T nexus: a name without ISID names no single port.
    if !matches!(destination, Initiator::Port(_)) {
        return Err(invalid_parameter(BASIC_PARAMETER_LIST_LEN));
    }
    Ok(ProutAction::RegisterAndMove {
        destination,
        target_port,
        unregister,
        aptpl,
    })
}

/// iSCSI TransportIDs packed back to back; `base` is their offset in the parameter list
/// (for the sense field pointer).
pub(super) fn parse_transport_ids(
    mut bytes: &[u8],
    base: usize,
) -> Result<Vec<Initiator>, PrError> {
    let mut ids = Vec::new();
    let mut offset = base;
    while !bytes.is_empty() {
        if ids.len() >= MAX_REGISTRATIONS {
            return Err(SenseReason::InsufficientRegistrationResources.into());
        }
        let (id, used) = parse_transport_id(bytes, offset)?;
        ids.push(id);
        bytes = bytes.get(used..).unwrap_or(&[]);
        offset = offset.saturating_add(used);
    }
    Ok(ids)
}

/// One iSCSI TransportID (SPC-4): returns it and its length in bytes.
pub(super) fn parse_transport_id(
    bytes: &[u8],
    offset: usize,
) -> Result<(Initiator, usize), PrError> {
    let &[format_protocol, _, len_hi, len_lo, ..] = bytes else {
        return Err(invalid_parameter(offset));
    };
    if format_protocol & 0x0f != PROTOCOL_ID_ISCSI {
        return Err(invalid_parameter(offset));
    }
    let additional_len = usize::from(u16::from_be_bytes([len_hi, len_lo]));
    if additional_len == 0 || additional_len % 4 != 0 {
        return Err(invalid_parameter(offset.saturating_add(2)));
    }
    let total = additional_len + 4;
    let body = bytes
        .get(4..total)
        .ok_or_else(|| invalid_parameter(offset.saturating_add(2)))?;
    let name_field = offset.saturating_add(4);
    // The text is NUL-terminated and NUL-padded.
    let text_len = body
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| invalid_parameter(name_field))?;
    let text = std::str::from_utf8(&body[..text_len]).map_err(|_| invalid_parameter(name_field))?;
    let initiator = match format_protocol >> 6 {
        0b00 => {
            validate_iscsi_name(text).ok_or_else(|| invalid_parameter(name_field))?;
            Initiator::Node(text.to_string())
        }
        0b01 => {
            let at = find_ignore_ascii_case(text, ISID_SEPARATOR)
                .ok_or_else(|| invalid_parameter(name_field))?;
            let name = &text[..at];
            let isid = &text[at + ISID_SEPARATOR.len()..];
            validate_iscsi_name(name).ok_or_else(|| invalid_parameter(name_field))?;
            if isid.is_empty() || isid.len() > 12 || !isid.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid_parameter(name_field));
            }
            // The form the iSCSI layer builds nexus names in: 12 lower-case hex digits.
            let isid = format!("{:0>12}", isid.to_ascii_lowercase());
            Initiator::Port(format!("{name}{ISID_SEPARATOR}{isid}"))
        }
        _ => return Err(invalid_parameter(offset)),
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
