//! Text keys: the `key=value\0` codec of login and text PDUs (RFC 7143 §6.1) and the target side of
//! operational parameter negotiation (RFC 7143 §6.2, §13).

use std::collections::HashSet;

use base64::Engine;

use crate::{LoginStatus, TargetSettings};

/// Upper bound on accumulated text across continued PDUs (our own limit; RFC says "implementation
/// specific").
pub const MAX_TEXT_LEN: usize = 64 * 1024;
/// RFC 7143 §6.1: key names are at most 63 bytes.
const MAX_KEY_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("text key/value pair without '='")]
    MissingEquals,
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("invalid key name")]
    BadKey,
    #[error("text exceeds {MAX_TEXT_LEN} bytes")]
    TooLong,
}

/// Parses a data segment of `key=value` pairs separated by NULs. Empty pairs (padding, a missing
/// final NUL) are tolerated.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    if data.len() > MAX_TEXT_LEN {
        return Err(TextError::TooLong);
    }
    let mut pairs = Vec::new();
    for item in data.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let text = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (key, value) = text.split_once('=').ok_or(TextError::MissingEquals)?;
        if !valid_key(key) {
            return Err(TextError::BadKey);
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+@_#".contains(&b))
}

/// Serializes pairs as `key=value\0` each.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses a numerical value: decimal or `0x` hexadecimal (RFC 7143 §6.1).
pub fn parse_number(value: &str) -> Option<u64> {
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(v: bool) -> String {
    if v { "Yes" } else { "No" }.to_owned()
}

/// Decodes a binary value: `0x` hex (an odd digit count means a leading zero nibble) or `0b`
/// base64 (RFC 7143 §6.1).
pub fn decode_binary(value: &str) -> Option<Vec<u8>> {
    let (prefix, body) = (value.get(..2)?, value.get(2..)?);
    match prefix {
        "0x" | "0X" => {
            if body.is_empty() {
                return None;
            }
            let mut digits = Vec::with_capacity(body.len() + 1);
            if body.len() % 2 == 1 {
                digits.push(0);
            }
            for c in body.chars() {
                digits.push(c.to_digit(16)? as u8);
            }
            Some(digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect())
        }
        "0b" | "0B" => base64::engine::general_purpose::STANDARD
            .decode(body)
            .ok()
            .filter(|v| !v.is_empty()),
        _ => None,
    }
}

/// Encodes bytes as a `0x` hex binary value.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Encodes bytes in the same representation (`0x` or `0b`) as `like`.
pub fn encode_binary_like(bytes: &[u8], like: &str) -> String {
    if like.starts_with("0b") || like.starts_with("0B") {
        format!(
            "0b{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    } else {
        encode_hex(bytes)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    Discovery,
}

/// The outcome of operational negotiation: every parameter that matters after login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiatedParams {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// The initiator's declared limit: every data segment we send must fit in it.
    pub initiator_max_recv_data_segment_length: u32,
    /// Our declared limit for data segments we receive.
    pub target_max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
}

impl Default for NegotiatedParams {
    /// The RFC 7143 defaults, in force for keys nobody negotiates.
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

/// Our answer to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAnswer {
    /// Reply `key=value`.
    Reply(String),
    /// Declarative key: accepted, nothing to say.
    Silent,
}

const RANGE_DATA_LEN: (u64, u64) = (512, (1 << 24) - 1);

/// Target-side state of operational negotiation across the PDUs of one login (or text exchange).
#[derive(Debug, Default)]
pub struct Negotiator {
    pub params: NegotiatedParams,
    seen: HashSet<String>,
}

impl Negotiator {
    pub fn new(settings: &TargetSettings) -> Self {
        let params = NegotiatedParams {
            target_max_recv_data_segment_length: settings
                .max_recv_data_segment_length
                .clamp(512, (1 << 24) - 1),
            ..NegotiatedParams::default()
        };
        Self {
            params,
            seen: HashSet::new(),
        }
    }

    /// Records that `key` was negotiated; false if it already was (a protocol error).
    pub fn first_time(&mut self, key: &str) -> bool {
        self.seen.insert(key.to_owned())
    }

    /// Answers one operational key. `batch_max_burst` is a MaxBurstLength offered in the same
    /// request, so FirstBurstLength can be kept below it whatever the key order.
    pub fn answer(
        &mut self,
        settings: &TargetSettings,
        key: &str,
        value: &str,
        discovery: bool,
        batch_max_burst: Option<u64>,
    ) -> Result<KeyAnswer, LoginStatus> {
        use KeyAnswer::*;
        // Answers to keys we never offered carry no information.
        if matches!(value, "NotUnderstood" | "Irrelevant" | "Reject") {
            return Ok(Silent);
        }
        let reject = || Ok(Reply("Reject".to_owned()));
        let session_wide_irrelevant = discovery
            && matches!(
                key,
                "MaxConnections"
                    | "InitialR2T"
                    | "ImmediateData"
                    | "MaxBurstLength"
                    | "FirstBurstLength"
                    | "MaxOutstandingR2T"
                    | "DataPDUInOrder"
                    | "DataSequenceInOrder"
            );
        if session_wide_irrelevant {
            return Ok(Reply("Irrelevant".to_owned()));
        }
        let p = &mut self.params;
        match key {
            "HeaderDigest" | "DataDigest" => {
                let choice = value.split(',').find(|v| matches!(*v, "CRC32C" | "None"));
                let Some(choice) = choice else {
                    return reject();
                };
                let on = choice == "CRC32C";
                if key == "HeaderDigest" {
                    p.header_digest = on;
                } else {
                    p.data_digest = on;
                }
                Ok(Reply(choice.to_owned()))
            }
            "MaxConnections" => {
                let Some(_) = parse_number(value).filter(|v| (1..=65535).contains(v)) else {
                    return reject();
                };
                // One connection per session: we don't do MC/S.
                p.max_connections = 1;
                Ok(Reply("1".to_owned()))
            }
            "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
                let Some(offered) = parse_bool(value) else {
                    return reject();
                };
                // OR: we prefer in-order delivery, so those always result in Yes.
                let result = match key {
                    "InitialR2T" => {
                        p.initial_r2t = offered || settings.initial_r2t;
                        p.initial_r2t
                    }
                    "DataPDUInOrder" => {
                        p.data_pdu_in_order = true;
                        true
                    }
                    _ => {
                        p.data_sequence_in_order = true;
                        true
                    }
                };
                Ok(Reply(yes_no(result)))
            }
            "ImmediateData" => {
                let Some(offered) = parse_bool(value) else {
                    return reject();
                };
                p.immediate_data = offered && settings.immediate_data;
                Ok(Reply(yes_no(p.immediate_data)))
            }
            "IFMarker" | "OFMarker" => match parse_bool(value) {
                Some(_) => Ok(Reply("No".to_owned())),
                None => reject(),
            },
            "IFMarkInt" | "OFMarkInt" => Ok(Reply("Irrelevant".to_owned())),
            "MaxRecvDataSegmentLength" => {
                let Some(v) = in_range(value, RANGE_DATA_LEN) else {
                    return reject();
                };
                p.initiator_max_recv_data_segment_length = v as u32;
                Ok(Silent)
            }
            "MaxBurstLength" => {
                let Some(v) = in_range(value, RANGE_DATA_LEN) else {
                    return reject();
                };
                p.max_burst_length = v.min(u64::from(settings.max_burst_length)).max(512) as u32;
                p.first_burst_length = p.first_burst_length.min(p.max_burst_length);
                Ok(Reply(p.max_burst_length.to_string()))
            }
            "FirstBurstLength" => {
                let Some(v) = in_range(value, RANGE_DATA_LEN) else {
                    return reject();
                };
                let mut result = v.min(u64::from(settings.first_burst_length));
                if let Some(max_burst) = batch_max_burst {
                    result = result.min(max_burst.min(u64::from(settings.max_burst_length)));
                }
                p.first_burst_length = (result.max(512) as u32).min(p.max_burst_length.max(512));
                Ok(Reply(p.first_burst_length.to_string()))
            }
            "MaxOutstandingR2T" => {
                let Some(v) = in_range(value, (1, 65535)) else {
                    return reject();
                };
                p.max_outstanding_r2t =
                    v.min(u64::from(settings.max_outstanding_r2t.max(1))) as u32;
                Ok(Reply(p.max_outstanding_r2t.to_string()))
            }
            "DefaultTime2Wait" => {
                let Some(v) = in_range(value, (0, 3600)) else {
                    return reject();
                };
                // Max of both; ours is the default of 2 seconds.
                p.default_time2wait = (v as u32).max(2);
                Ok(Reply(p.default_time2wait.to_string()))
            }
            "DefaultTime2Retain" => {
                if in_range(value, (0, 3600)).is_none() {
                    return reject();
                }
                // Min of both; at ERL 0 nothing is retained, so ours is 0.
                p.default_time2retain = 0;
                Ok(Reply(p.default_time2retain.to_string()))
            }
            "ErrorRecoveryLevel" => {
                let Some(_) = in_range(value, (0, 2)) else {
                    return reject();
                };
                p.error_recovery_level = 0;
                Ok(Reply("0".to_owned()))
            }
            // Target-only declaratives and discovery-only keys an initiator has no business sending.
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" | "SendTargets" => {
                Ok(Reply("Irrelevant".to_owned()))
            }
            _ => Ok(Reply("NotUnderstood".to_owned())),
        }
    }
}

fn in_range(value: &str, (lo, hi): (u64, u64)) -> Option<u64> {
    parse_number(value).filter(|v| (lo..=hi).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parse_and_encode() {
        let data = b"InitiatorName=iqn.x\0SessionType=Normal\0\0\0";
        let p = parse(data).unwrap();
        assert_eq!(
            p,
            pairs(&[("InitiatorName", "iqn.x"), ("SessionType", "Normal")])
        );
        assert_eq!(encode(&p), b"InitiatorName=iqn.x\0SessionType=Normal\0");
        assert_eq!(parse(b"novalue\0"), Err(TextError::MissingEquals));
        assert_eq!(parse(b"=x\0"), Err(TextError::BadKey));
        assert_eq!(parse(b"A=\xff\0"), Err(TextError::NotUtf8));
        assert_eq!(parse(b"A=b=c").unwrap(), pairs(&[("A", "b=c")]));
    }

    #[test]
    fn values() {
        assert_eq!(parse_number("8192"), Some(8192));
        assert_eq!(parse_number("0x2000"), Some(8192));
        assert_eq!(parse_number("-1"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(decode_binary("0x0102ff"), Some(vec![1, 2, 0xff]));
        assert_eq!(decode_binary("0x102"), Some(vec![1, 2]));
        assert_eq!(decode_binary("0bAQL/"), Some(vec![1, 2, 0xff]));
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("12"), None);
        assert_eq!(encode_hex(&[0xab, 1]), "0xab01");
        assert_eq!(encode_binary_like(&[1, 2, 0xff], "0b00"), "0bAQL/");
    }

    #[test]
    fn negotiation_rules() {
        let s = TargetSettings::default();
        let mut n = Negotiator::new(&s);
        // Asked in this order of one negotiator, as an initiator would: each answer is the
        // negotiated outcome of one key (None: a declarative key, accepted without a reply).
        let cases = [
            ("HeaderDigest", "CRC32C,None", Some("CRC32C")),
            ("DataDigest", "None,CRC32C", Some("None")),
            ("DataDigest", "MD5", Some("Reject")),
            ("InitialR2T", "Yes", Some("Yes")),
            ("ImmediateData", "Yes", Some("Yes")),
            ("MaxConnections", "8", Some("1")),
            ("MaxBurstLength", "99999999", Some("Reject")),
            ("MaxBurstLength", "1048576", Some("1048576")),
            ("FirstBurstLength", "16776192", Some("262144")),
            ("DefaultTime2Wait", "0", Some("2")),
            ("ErrorRecoveryLevel", "2", Some("0")),
            ("MaxRecvDataSegmentLength", "65536", None),
            ("X-com.vendor", "1", Some("NotUnderstood")),
        ];
        for (key, offer, reply) in cases {
            let want = reply.map_or(KeyAnswer::Silent, |r| KeyAnswer::Reply(r.into()));
            let got = n.answer(&s, key, offer, false, None).unwrap();
            assert_eq!(got, want, "{key}={offer}");
        }
        assert!(n.params.header_digest && !n.params.data_digest);
        assert!(n.params.initial_r2t && n.params.immediate_data);
        assert_eq!(n.params.initiator_max_recv_data_segment_length, 65536);
        assert_eq!(n.params.max_burst_length, 1_048_576);
        assert!(n.first_time("A") && !n.first_time("A"));
    }

    #[test]
    fn first_burst_never_exceeds_max_burst() {
        let s = TargetSettings::default();
        let mut n = Negotiator::new(&s);
        let a = n
            .answer(&s, "FirstBurstLength", "262144", false, Some(65536))
            .unwrap();
        assert_eq!(a, KeyAnswer::Reply("65536".into()));
    }

    #[test]
    fn discovery_irrelevant_keys() {
        let s = TargetSettings::default();
        let mut n = Negotiator::new(&s);
        let a = n.answer(&s, "InitialR2T", "No", true, None).unwrap();
        assert_eq!(a, KeyAnswer::Reply("Irrelevant".into()));
    }

    proptest! {
        #[test]
        fn parse_never_panics(data: Vec<u8>) {
            let _ = parse(&data);
        }

        #[test]
        fn binary_round_trip(bytes in proptest::collection::vec(any::<u8>(), 1..64)) {
            prop_assert_eq!(decode_binary(&encode_hex(&bytes)), Some(bytes.clone()));
            prop_assert_eq!(decode_binary(&encode_binary_like(&bytes, "0b")), Some(bytes));
        }
    }
}
