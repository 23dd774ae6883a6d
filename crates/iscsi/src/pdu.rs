//! PDU codec: the 48-byte Basic Header Segment (RFC 7143 §11) and framing of whole PDUs.
//!
//! Parsing works on borrowed slices and never panics: every field is read at a fixed offset of a
//! `[u8; 48]`, and framing validates lengths with checked arithmetic before trusting them.

use crate::ProtocolError;

/// Size of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Size of a CRC32C digest.
pub const DIGEST_LEN: usize = 4;
/// The "reserved" task tag: no task / no response expected.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// PDU opcodes (RFC 7143 §11.2.1.2). Unknown values round-trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskManagementRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    Snack,
    NopIn,
    ScsiResponse,
    TaskManagementResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    ReadyToTransfer,
    AsyncMessage,
    Reject,
    Unknown(u8),
}

/// The opcode of an all-zero byte 0, where a header's fields start before a parse fills them.
impl Default for Opcode {
    fn default() -> Self {
        Self::from_u8(0)
    }
}

impl Opcode {
    pub fn from_u8(v: u8) -> Self {
        match v & 0x3f {
            0x00 => Self::NopOut,
            0x01 => Self::ScsiCommand,
            0x02 => Self::TaskManagementRequest,
            0x03 => Self::LoginRequest,
            0x04 => Self::TextRequest,
            0x05 => Self::DataOut,
            0x06 => Self::LogoutRequest,
            0x10 => Self::Snack,
            0x20 => Self::NopIn,
            0x21 => Self::ScsiResponse,
            0x22 => Self::TaskManagementResponse,
            0x23 => Self::LoginResponse,
            0x24 => Self::TextResponse,
            0x25 => Self::DataIn,
            0x26 => Self::LogoutResponse,
            0x31 => Self::ReadyToTransfer,
            0x32 => Self::AsyncMessage,
            0x3f => Self::Reject,
            other => Self::Unknown(other),
        }
    }

    pub fn to_u8(self) -> u8 {
        match self {
            Self::NopOut => 0x00,
            Self::ScsiCommand => 0x01,
            Self::TaskManagementRequest => 0x02,
            Self::LoginRequest => 0x03,
            Self::TextRequest => 0x04,
            Self::DataOut => 0x05,
            Self::LogoutRequest => 0x06,
            Self::Snack => 0x10,
            Self::NopIn => 0x20,
            Self::ScsiResponse => 0x21,
            Self::TaskManagementResponse => 0x22,
            Self::LoginResponse => 0x23,
            Self::TextResponse => 0x24,
            Self::DataIn => 0x25,
            Self::LogoutResponse => 0x26,
            Self::ReadyToTransfer => 0x31,
            Self::AsyncMessage => 0x32,
            Self::Reject => 0x3f,
            Self::Unknown(v) => v & 0x3f,
        }
    }
}

/// A Basic Header Segment with typed accessors for the fields every opcode shares, and raw
/// big-endian accessors for the opcode-specific ones.
#[derive(Clone, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bhs")
            .field("opcode", &self.opcode())
            .field("itt", &format_args!("{:#x}", self.itt()))
            .field("data_len", &self.data_segment_length())
            .finish()
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Self([0; BHS_LEN])
    }
}

impl Bhs {
    pub fn new(opcode: Opcode) -> Self {
        let mut b = Self::default();
        b.0[0] = opcode.to_u8();
        b
    }
    pub fn opcode(&self) -> Opcode {
        Opcode::from_u8(self.0[0])
    }
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }
    pub fn set_immediate(&mut self, on: bool) {
        self.set_bit(0, 0x40, on);
    }
    /// The F (final) bit, byte 1 bit 7 (T for login PDUs).
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }
    pub fn set_final(&mut self, on: bool) {
        self.set_bit(1, 0x80, on);
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        if let Some(b) = self.0.get_mut(byte) {
            if on {
                *b |= mask;
            } else {
                *b &= !mask;
            }
        }
    }
    /// TotalAHSLength in bytes (the wire field counts 4-byte words).
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }
    pub fn data_segment_length(&self) -> u32 {
        u32::from_be_bytes([0, self.0[5], self.0[6], self.0[7]])
    }
    /// Sets DataSegmentLength; values beyond 24 bits are a caller bug and are truncated.
    pub fn set_data_segment_length(&mut self, len: u32) {
        let b = len.to_be_bytes();
        self.0[5..8].copy_from_slice(&b[1..4]);
    }
    pub fn lun(&self) -> [u8; 8] {
        let mut l = [0; 8];
        l.copy_from_slice(&self.0[8..16]);
        l
    }
    pub fn set_lun(&mut self, lun: [u8; 8]) {
        self.0[8..16].copy_from_slice(&lun);
    }
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }
    pub fn set_itt(&mut self, v: u32) {
        self.set_u32(16, v)
    }
    /// Big-endian u32 at a fixed offset; offsets are compile-time constants below 45.
    pub fn u32_at(&self, off: usize) -> u32 {
        let mut b = [0; 4];
        if let Some(s) = self.0.get(off..off + 4) {
            b.copy_from_slice(s);
        }
        u32::from_be_bytes(b)
    }
    pub fn set_u32(&mut self, off: usize, v: u32) {
        if let Some(s) = self.0.get_mut(off..off + 4) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }
    pub fn u16_at(&self, off: usize) -> u16 {
        let mut b = [0; 2];
        if let Some(s) = self.0.get(off..off + 2) {
            b.copy_from_slice(s);
        }
        u16::from_be_bytes(b)
    }
    pub fn set_u16(&mut self, off: usize, v: u16) {
        if let Some(s) = self.0.get_mut(off..off + 2) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }
}

/// Decodes the LUN number from an 8-byte SAM LUN field: peripheral device addressing (method 00b)
/// with bus 0 and flat space addressing (method 01b). Anything else is returned as the raw field so
/// the SCSI layer reports it as an unknown LUN rather than aliasing a real one.
pub fn decode_lun(lun: [u8; 8]) -> u64 {
    match lun[0] >> 6 {
        0b00 if lun[0] == 0 => u64::from(lun[1]),
        0b01 => (u64::from(lun[0] & 0x3f) << 8) | u64::from(lun[1]),
        _ => u64::from_be_bytes(lun),
    }
}

/// Encodes a LUN number as the SAM LUN field: peripheral addressing below 256, flat above.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut out = [0; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else if lun < 0x4000 {
        out[0] = 0x40 | ((lun >> 8) as u8 & 0x3f);
        out[1] = lun as u8;
    } else {
        out = lun.to_be_bytes();
    }
    out
}

/// Which digests are in force on a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// One framed PDU: header, AHS and data segment (without padding and digests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
    /// False when the data digest did not match; the header is still trustworthy.
    pub data_digest_ok: bool,
}

impl Pdu {
    pub fn new(bhs: Bhs) -> Self {
        Self {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
            data_digest_ok: true,
        }
    }
    pub fn with_data(bhs: Bhs, data: Vec<u8>) -> Self {
        Self {
            data,
            ..Self::new(bhs)
        }
    }

    /// Appends the wire form to `out`: sets TotalAHSLength and DataSegmentLength, pads, adds digests.
    pub fn encode(&self, digests: Digests, out: &mut Vec<u8>) {
        encode_header(&self.bhs, &self.ahs, self.data.len(), digests, out);
        out.extend_from_slice(&self.data);
        encode_trailer(&self.data, digests, out);
    }
}

/// Appends what precedes a data segment of `data_len` bytes on the wire: the BHS (with
/// TotalAHSLength and DataSegmentLength set), the AHS and the header digest if in force. With
/// [`encode_trailer`], a PDU whose data segment is sent from a buffer of its own.
pub fn encode_header(bhs: &Bhs, ahs: &[u8], data_len: usize, digests: Digests, out: &mut Vec<u8>) {
    let mut bhs = bhs.clone();
    // AHS we emit is always a multiple of 4 and far below 1020 bytes.
    bhs.0[4] = (ahs.len() / 4) as u8;
    bhs.set_data_segment_length(data_len as u32);
    let start = out.len();
    out.extend_from_slice(&bhs.0);
    out.extend_from_slice(ahs);
    if digests.header {
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Appends what follows the data segment `data` on the wire: padding to 4 bytes and the data
/// digest (over data and padding) if in force. Nothing for an empty segment.
pub fn encode_trailer(data: &[u8], digests: Digests, out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    let pad = [0u8; 3];
    let pad = &pad[..padded(data.len()) - data.len()];
    out.extend_from_slice(pad);
    if digests.data {
        let crc = crc32c::crc32c_append(crc32c::crc32c(data), pad);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Rounds a length up to the 4-byte boundary of the wire format.
pub fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Size of the whole PDU on the wire, computed from its header, or an error if it exceeds
/// `max_data` (the data segment limit in force).
pub fn wire_len(bhs: &Bhs, digests: Digests, max_data: u32) -> Result<usize, ProtocolError> {
    let data_len = bhs.data_segment_length();
    if data_len > max_data {
        return Err(ProtocolError::DataSegmentTooLong {
            length: data_len,
            limit: max_data,
        });
    }
    let mut len = header_len(bhs, digests);
    if data_len > 0 {
        len += padded(data_len as usize);
        if digests.data {
            len += DIGEST_LEN;
        }
    }
    Ok(len)
}

/// Bytes of a PDU before its data segment: BHS, AHS and the header digest if in force.
pub fn header_len(bhs: &Bhs, digests: Digests) -> usize {
    BHS_LEN + bhs.ahs_len() + if digests.header { DIGEST_LEN } else { 0 }
}

/// Parses one complete PDU whose wire length was computed by [`wire_len`] from the same header.
pub fn decode(buf: &[u8], digests: Digests) -> Result<Pdu, ProtocolError> {
    let header: [u8; BHS_LEN] = buf
        .get(..BHS_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(ProtocolError::Truncated)?;
    let split = header_len(&Bhs(header), digests).min(buf.len());
    decode_parts(&buf[..split], buf[split..].to_vec(), digests)
}

/// Parses one complete PDU received in two parts: `header` (see [`header_len`]) and `data`,
/// the rest of the wire bytes (data segment, padding, data digest). The data segment stays in
/// `data`'s allocation: a connection receives a Data-Out's payload straight into the buffer
/// the command keeps, with no copy here.
pub fn decode_parts(
    header: &[u8],
    mut data: Vec<u8>,
    digests: Digests,
) -> Result<Pdu, ProtocolError> {
    let bhs_bytes: [u8; BHS_LEN] = header
        .get(..BHS_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(ProtocolError::Truncated)?;
    let bhs = Bhs(bhs_bytes);
    let ahs_end = BHS_LEN + bhs.ahs_len();
    let ahs = header
        .get(BHS_LEN..ahs_end)
        .ok_or(ProtocolError::Truncated)?;
    if digests.header {
        let got = read_le_u32(header, ahs_end)?;
        let want = crc32c::crc32c(&header[..ahs_end]);
        if got != want {
            return Err(ProtocolError::HeaderDigest);
        }
    }
    let data_len = bhs.data_segment_length() as usize;
    let mut data_digest_ok = true;
    if data_len > 0 {
        let padded_len = padded(data_len);
        let with_pad = data.get(..padded_len).ok_or(ProtocolError::Truncated)?;
        if digests.data {
            let got = read_le_u32(&data, padded_len)?;
            data_digest_ok = got == crc32c::crc32c(with_pad);
        }
        data.truncate(data_len);
    } else {
        data.clear();
    }
    Ok(Pdu {
        bhs,
        ahs: ahs.to_vec(),
        data,
        data_digest_ok,
    })
}

fn read_le_u32(buf: &[u8], at: usize) -> Result<u32, ProtocolError> {
    let b: [u8; 4] = buf
        .get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .ok_or(ProtocolError::Truncated)?;
    Ok(u32::from_le_bytes(b))
}

/// Reject reasons (RFC 7143 §11.17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    DataDigestError,
    SnackReject,
    ProtocolError,
    CommandNotSupported,
    ImmediateCommandRejected,
    TaskInProgress,
    InvalidDataAck,
    InvalidPduField,
    LongOperationReject,
    DeprecatedNegotiationReset,
    WaitingForLogout,
    Unknown(u8),
}

/// The reason of an all-zero byte 2, where a header's fields start before a parse fills them.
impl Default for RejectReason {
    fn default() -> Self {
        Self::from_code(0)
    }
}

impl RejectReason {
    pub fn code(self) -> u8 {
        match self {
            Self::DataDigestError => 0x02,
            Self::SnackReject => 0x03,
            Self::ProtocolError => 0x04,
            Self::CommandNotSupported => 0x05,
            Self::ImmediateCommandRejected => 0x06,
            Self::TaskInProgress => 0x07,
            Self::InvalidDataAck => 0x08,
            Self::InvalidPduField => 0x09,
            Self::LongOperationReject => 0x0a,
            Self::DeprecatedNegotiationReset => 0x0b,
            Self::WaitingForLogout => 0x0c,
            Self::Unknown(v) => v,
        }
    }
    pub fn from_code(v: u8) -> Self {
        match v {
            0x02 => Self::DataDigestError,
            0x03 => Self::SnackReject,
            0x04 => Self::ProtocolError,
            0x05 => Self::CommandNotSupported,
            0x06 => Self::ImmediateCommandRejected,
            0x07 => Self::TaskInProgress,
            0x08 => Self::InvalidDataAck,
            0x09 => Self::InvalidPduField,
            0x0a => Self::LongOperationReject,
            0x0b => Self::DeprecatedNegotiationReset,
            0x0c => Self::WaitingForLogout,
            other => Self::Unknown(other),
        }
    }
}

// ---- Typed views of each opcode's header. `parse` reads a BHS, `to_bhs` writes one. ----
//
// Each header states its layout once, in a `fields` method that hands every field to a
// [`BhsFields`] visitor: `parse` runs it with a [`BhsReader`], `to_bhs` with a [`BhsWriter`], so
// the two directions cannot disagree about an offset or a mask.

/// A pass over a header's fields at their offsets in the BHS. The reader fills the fields from
/// the bytes; the writer copies them into the bytes and leaves them as they are.
trait BhsFields {
    /// The bits of `mask` in byte `at`, as a number counted from the mask's lowest bit. Value bits
    /// beyond the mask are not written.
    fn bits(&mut self, at: usize, mask: u8, value: &mut u8);
    /// `value.len()` bytes from offset `at`.
    fn bytes(&mut self, at: usize, value: &mut [u8]);
    /// Bits every PDU of the type carries (opcode, F bit): written, not read.
    fn fixed(&mut self, at: usize, mask: u8, value: u8);

    fn u8(&mut self, at: usize, value: &mut u8) {
        self.bits(at, 0xff, value);
    }
    fn bit(&mut self, at: usize, mask: u8, value: &mut bool) {
        let mut bit = u8::from(*value);
        self.bits(at, mask, &mut bit);
        *value = bit != 0;
    }
    fn u16(&mut self, at: usize, value: &mut u16) {
        let mut be = value.to_be_bytes();
        self.bytes(at, &mut be);
        *value = u16::from_be_bytes(be);
    }
    fn u32(&mut self, at: usize, value: &mut u32) {
        let mut be = value.to_be_bytes();
        self.bytes(at, &mut be);
        *value = u32::from_be_bytes(be);
    }
    fn fixed_u32(&mut self, at: usize, value: u32) {
        for (i, byte) in value.to_be_bytes().into_iter().enumerate() {
            self.fixed(at + i, 0xff, byte);
        }
    }
    /// The opcode of a layout several opcodes share.
    fn opcode(&mut self, value: &mut Opcode) {
        let mut code = value.to_u8();
        self.bits(0, 0x3f, &mut code);
        *value = Opcode::from_u8(code);
    }
    /// The opcode of a layout that belongs to one.
    fn fixed_opcode(&mut self, opcode: Opcode) {
        self.fixed(0, 0x3f, opcode.to_u8());
    }
    /// The I bit.
    fn immediate(&mut self, value: &mut bool) {
        self.bit(0, 0x40, value);
    }
    /// The F bit of PDUs that may have a sequel.
    fn final_bit(&mut self, value: &mut bool) {
        self.bit(1, 0x80, value);
    }
    /// The F bit of PDUs that are always final.
    fn fixed_final(&mut self) {
        self.fixed(1, 0x80, 0x80);
    }
    /// Byte 1 of Login Request and Response: T, C, CSG and NSG.
    fn login_stages(&mut self, transit: &mut bool, cont: &mut bool, csg: &mut u8, nsg: &mut u8) {
        self.bit(1, 0x80, transit);
        self.bit(1, 0x40, cont);
        self.bits(1, 0x0c, csg);
        self.bits(1, 0x03, nsg);
    }
    fn lun(&mut self, value: &mut [u8; 8]) {
        self.bytes(8, value);
    }
    fn itt(&mut self, value: &mut u32) {
        self.u32(16, value);
    }
}

/// Fills a header's fields from a BHS; bits the header does not define are ignored. Offsets and
/// masks are constants inside the 48 bytes, so it never panics.
struct BhsReader<'a>(&'a [u8; BHS_LEN]);

impl BhsFields for BhsReader<'_> {
    fn bits(&mut self, at: usize, mask: u8, value: &mut u8) {
        *value = (self.0[at] & mask) >> mask.trailing_zeros();
    }
    fn bytes(&mut self, at: usize, value: &mut [u8]) {
        value.copy_from_slice(&self.0[at..at + value.len()]);
    }
    fn fixed(&mut self, _at: usize, _mask: u8, _value: u8) {}
}

/// Writes a header's fields into a BHS that starts zeroed, so reserved bytes stay zero.
struct BhsWriter(Bhs);

impl BhsFields for BhsWriter {
    fn bits(&mut self, at: usize, mask: u8, value: &mut u8) {
        self.fixed(at, mask, *value << mask.trailing_zeros());
    }
    fn bytes(&mut self, at: usize, value: &mut [u8]) {
        self.0 .0[at..at + value.len()].copy_from_slice(value);
    }
    fn fixed(&mut self, at: usize, mask: u8, value: u8) {
        let byte = &mut self.0 .0[at];
        *byte = (*byte & !mask) | (value & mask);
    }
}

/// `parse` and `to_bhs` of header types, from their `fields`.
macro_rules! bhs_codec {
    ($($header:ident),+ $(,)?) => {$(
        impl $header {
            /// Reads the header's fields out of `b`; bits the header does not define are ignored.
            pub fn parse(b: &Bhs) -> Self {
                let mut header = Self::default();
                header.fields(&mut BhsReader(&b.0));
                header
            }
            /// The header's fields and fixed bits (opcode, F bit) in a BHS that is zero elsewhere.
            pub fn to_bhs(&self) -> Bhs {
                let mut writer = BhsWriter(Bhs::default());
                // `fields` takes `&mut self` for the reader's sake; the writer changes nothing.
                self.clone().fields(&mut writer);
                writer.0
            }
        }
    )+};
}

bhs_codec!(
    ScsiCommandHeader,
    ScsiResponseHeader,
    TaskManagementRequestHeader,
    TaskManagementResponseHeader,
    LoginRequestHeader,
    LoginResponseHeader,
    RequestHeader,
    ReplyHeader,
    DataOutHeader,
    DataInHeader,
    LogoutRequestHeader,
    LogoutResponseHeader,
    SnackHeader,
    ReadyToTransferHeader,
    AsyncMessageHeader,
    RejectHeader,
);

/// Sequence numbers every target-to-initiator PDU carries at offsets 24/28/32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusSn {
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl StatusSn {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.u32(24, &mut self.stat_sn);
        f.u32(28, &mut self.exp_cmd_sn);
        f.u32(32, &mut self.max_cmd_sn);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiCommandHeader {
    pub immediate: bool,
    pub final_bit: bool,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub expected_data_transfer_length: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub cdb: [u8; 16],
}

impl ScsiCommandHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::ScsiCommand);
        f.immediate(&mut self.immediate);
        f.final_bit(&mut self.final_bit);
        f.bit(1, 0x40, &mut self.read);
        f.bit(1, 0x20, &mut self.write);
        f.bits(1, 0x07, &mut self.attr);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.expected_data_transfer_length);
        f.u32(24, &mut self.cmd_sn);
        f.u32(28, &mut self.exp_stat_sn);
        f.bytes(32, &mut self.cdb);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiResponseHeader {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub sn: StatusSn,
    pub exp_data_sn: u32,
    pub bidi_residual_count: u32,
    pub residual_count: u32,
}

impl ScsiResponseHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::ScsiResponse);
        f.fixed_final();
        f.bit(1, 0x10, &mut self.bidi_overflow);
        f.bit(1, 0x08, &mut self.bidi_underflow);
        f.bit(1, 0x04, &mut self.overflow);
        f.bit(1, 0x02, &mut self.underflow);
        f.u8(2, &mut self.response);
        f.u8(3, &mut self.status);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.snack_tag);
        self.sn.fields(f);
        f.u32(36, &mut self.exp_data_sn);
        f.u32(40, &mut self.bidi_residual_count);
        f.u32(44, &mut self.residual_count);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskManagementRequestHeader {
    pub immediate: bool,
    pub function: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

impl TaskManagementRequestHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::TaskManagementRequest);
        f.immediate(&mut self.immediate);
        f.fixed_final();
        f.bits(1, 0x7f, &mut self.function);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.referenced_task_tag);
        f.u32(24, &mut self.cmd_sn);
        f.u32(28, &mut self.exp_stat_sn);
        f.u32(32, &mut self.ref_cmd_sn);
        f.u32(36, &mut self.exp_data_sn);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskManagementResponseHeader {
    pub response: u8,
    pub itt: u32,
    pub sn: StatusSn,
}

impl TaskManagementResponseHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::TaskManagementResponse);
        f.fixed_final();
        f.u8(2, &mut self.response);
        f.itt(&mut self.itt);
        self.sn.fields(f);
    }
}

/// Login stage numbers (CSG/NSG).
pub const STAGE_SECURITY: u8 = 0;
pub const STAGE_OPERATIONAL: u8 = 1;
pub const STAGE_FULL_FEATURE: u8 = 3;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginRequestHeader {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LoginRequestHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::LoginRequest);
        // Login requests are always immediate.
        f.fixed(0, 0x40, 0x40);
        f.login_stages(
            &mut self.transit,
            &mut self.cont,
            &mut self.csg,
            &mut self.nsg,
        );
        f.u8(2, &mut self.version_max);
        f.u8(3, &mut self.version_min);
        f.bytes(8, &mut self.isid);
        f.u16(14, &mut self.tsih);
        f.itt(&mut self.itt);
        f.u16(20, &mut self.cid);
        f.u32(24, &mut self.cmd_sn);
        f.u32(28, &mut self.exp_stat_sn);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginResponseHeader {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub sn: StatusSn,
    pub status_class: u8,
    pub status_detail: u8,
}

impl LoginResponseHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::LoginResponse);
        f.login_stages(
            &mut self.transit,
            &mut self.cont,
            &mut self.csg,
            &mut self.nsg,
        );
        f.u8(2, &mut self.version_max);
        f.u8(3, &mut self.version_active);
        f.bytes(8, &mut self.isid);
        f.u16(14, &mut self.tsih);
        f.itt(&mut self.itt);
        self.sn.fields(f);
        f.u8(36, &mut self.status_class);
        f.u8(37, &mut self.status_detail);
    }
}

/// Text Request (0x04) and NOP-Out (0x00) share this layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHeader {
    pub opcode: Opcode,
    pub immediate: bool,
    pub final_bit: bool,
    /// C bit (Text Request only).
    pub cont: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl RequestHeader {
    /// A NOP-Out or Text Request, tagged `itt`, that starts an exchange: final, no LUN, the
    /// target transfer tag reserved (not an answer to the target).
    pub fn opening(
        opcode: Opcode,
        immediate: bool,
        itt: u32,
        cmd_sn: u32,
        exp_stat_sn: u32,
    ) -> Self {
        RequestHeader {
            opcode,
            immediate,
            final_bit: true,
            cont: false,
            lun: [0; 8],
            itt,
            ttt: RESERVED_TAG,
            cmd_sn,
            exp_stat_sn,
        }
    }

    fn fields(&mut self, f: &mut impl BhsFields) {
        f.opcode(&mut self.opcode);
        f.immediate(&mut self.immediate);
        f.final_bit(&mut self.final_bit);
        f.bit(1, 0x40, &mut self.cont);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        f.u32(24, &mut self.cmd_sn);
        f.u32(28, &mut self.exp_stat_sn);
    }
}

/// Text Response (0x24) and NOP-In (0x20) share this layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyHeader {
    pub opcode: Opcode,
    pub final_bit: bool,
    pub cont: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub sn: StatusSn,
}

impl ReplyHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.opcode(&mut self.opcode);
        f.final_bit(&mut self.final_bit);
        f.bit(1, 0x40, &mut self.cont);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        self.sn.fields(f);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataOutHeader {
    pub final_bit: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataOutHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::DataOut);
        f.final_bit(&mut self.final_bit);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        f.u32(28, &mut self.exp_stat_sn);
        f.u32(36, &mut self.data_sn);
        f.u32(40, &mut self.buffer_offset);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataInHeader {
    pub final_bit: bool,
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// S bit: the status field is valid and the command is complete.
    pub has_status: bool,
    pub status: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    /// Only meaningful with the S bit; otherwise StatSN is reserved (ExpCmdSN/MaxCmdSN always valid).
    pub sn: StatusSn,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual_count: u32,
}

impl DataInHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::DataIn);
        f.final_bit(&mut self.final_bit);
        f.bit(1, 0x40, &mut self.ack);
        f.bit(1, 0x04, &mut self.overflow);
        f.bit(1, 0x02, &mut self.underflow);
        f.bit(1, 0x01, &mut self.has_status);
        f.u8(3, &mut self.status);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        self.sn.fields(f);
        f.u32(36, &mut self.data_sn);
        f.u32(40, &mut self.buffer_offset);
        f.u32(44, &mut self.residual_count);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutRequestHeader {
    pub immediate: bool,
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LogoutRequestHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::LogoutRequest);
        f.immediate(&mut self.immediate);
        f.fixed_final();
        f.bits(1, 0x7f, &mut self.reason);
        f.itt(&mut self.itt);
        f.u16(20, &mut self.cid);
        f.u32(24, &mut self.cmd_sn);
        f.u32(28, &mut self.exp_stat_sn);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutResponseHeader {
    pub response: u8,
    pub itt: u32,
    pub sn: StatusSn,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl LogoutResponseHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::LogoutResponse);
        f.fixed_final();
        f.u8(2, &mut self.response);
        f.itt(&mut self.itt);
        self.sn.fields(f);
        f.u16(40, &mut self.time2wait);
        f.u16(42, &mut self.time2retain);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnackHeader {
    pub snack_type: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

impl SnackHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::Snack);
        f.fixed_final();
        f.bits(1, 0x0f, &mut self.snack_type);
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        f.u32(28, &mut self.exp_stat_sn);
        f.u32(40, &mut self.beg_run);
        f.u32(44, &mut self.run_length);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyToTransferHeader {
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub sn: StatusSn,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_length: u32,
}

impl ReadyToTransferHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::ReadyToTransfer);
        f.fixed_final();
        f.lun(&mut self.lun);
        f.itt(&mut self.itt);
        f.u32(20, &mut self.ttt);
        self.sn.fields(f);
        f.u32(36, &mut self.r2t_sn);
        f.u32(40, &mut self.buffer_offset);
        f.u32(44, &mut self.desired_length);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AsyncMessageHeader {
    pub lun: [u8; 8],
    pub sn: StatusSn,
    pub event: u8,
    pub vendor_code: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

impl AsyncMessageHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::AsyncMessage);
        f.fixed_final();
        f.lun(&mut self.lun);
        f.fixed_u32(16, RESERVED_TAG);
        self.sn.fields(f);
        f.u8(36, &mut self.event);
        f.u8(37, &mut self.vendor_code);
        f.u16(38, &mut self.parameter1);
        f.u16(40, &mut self.parameter2);
        f.u16(42, &mut self.parameter3);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RejectHeader {
    pub reason: RejectReason,
    pub sn: StatusSn,
    pub data_sn: u32,
}

impl RejectHeader {
    fn fields(&mut self, f: &mut impl BhsFields) {
        f.fixed_opcode(Opcode::Reject);
        f.fixed_final();
        let mut code = self.reason.code();
        f.u8(2, &mut code);
        self.reason = RejectReason::from_code(code);
        f.fixed_u32(16, RESERVED_TAG);
        self.sn.fields(f);
        f.u32(36, &mut self.data_sn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn opcodes_round_trip() {
        for v in 0..=0x3fu8 {
            assert_eq!(Opcode::from_u8(v).to_u8(), v);
        }
        assert_eq!(Opcode::from_u8(0x43), Opcode::LoginRequest);
        assert_eq!(Opcode::from_u8(0x1c), Opcode::Unknown(0x1c));
    }

    #[test]
    fn lun_decoding() {
        assert_eq!(decode_lun([0, 5, 0, 0, 0, 0, 0, 0]), 5);
        assert_eq!(decode_lun([0x41, 0x02, 0, 0, 0, 0, 0, 0]), 0x102);
        for lun in [0u64, 1, 255, 256, 0x3fff] {
            assert_eq!(decode_lun(encode_lun(lun)), lun);
        }
    }

    #[test]
    fn encode_pads_and_digests() {
        let pdu = Pdu::with_data(Bhs::new(Opcode::NopIn), vec![1, 2, 3, 4, 5]);
        let digests = Digests {
            header: true,
            data: true,
        };
        let mut wire = Vec::new();
        pdu.encode(digests, &mut wire);
        assert_eq!(wire.len(), 48 + 4 + 8 + 4);
        let bhs = Bhs(wire[..48].try_into().unwrap());
        assert_eq!(wire_len(&bhs, digests, 8192).unwrap(), wire.len());
        let back = decode(&wire, digests).unwrap();
        assert_eq!(back.data, vec![1, 2, 3, 4, 5]);
        assert!(back.data_digest_ok);
        // Corrupting the header is fatal, corrupting data is reported.
        let mut bad = wire.clone();
        bad[20] ^= 1;
        assert!(matches!(
            decode(&bad, digests),
            Err(ProtocolError::HeaderDigest)
        ));
        let mut bad = wire.clone();
        bad[53] ^= 1;
        assert!(!decode(&bad, digests).unwrap().data_digest_ok);
    }

    #[test]
    fn data_segment_limit_enforced() {
        let mut bhs = Bhs::new(Opcode::DataOut);
        bhs.set_data_segment_length(9000);
        assert!(wire_len(&bhs, Digests::default(), 8192).is_err());
        assert_eq!(wire_len(&bhs, Digests::default(), 9000).unwrap(), 48 + 9000);
    }

    /// For any 48 bytes, what `parse` reads `to_bhs` writes back where `parse` finds it again:
    /// each header reads and writes the same bits.
    macro_rules! parse_write_agree {
        ($b:expr, $($header:ident),+ $(,)?) => {$(
            let header = $header::parse(&$b);
            prop_assert_eq!($header::parse(&header.to_bhs()), header);
        )+};
    }

    proptest! {
        #[test]
        fn any_bhs_parses_and_writes_back(b in prop::collection::vec(any::<u8>(), BHS_LEN)) {
            let b = Bhs(b.try_into().unwrap());
            parse_write_agree!(b, ScsiCommandHeader, ScsiResponseHeader, TaskManagementRequestHeader,
                TaskManagementResponseHeader, LoginRequestHeader, LoginResponseHeader, RequestHeader,
                ReplyHeader, DataOutHeader, DataInHeader, LogoutRequestHeader, LogoutResponseHeader,
                SnackHeader, ReadyToTransferHeader, AsyncMessageHeader, RejectHeader);
        }
    }

    proptest! {
        #[test]
        fn scsi_command_round_trip(imm: bool, f: bool, r: bool, w: bool, attr in 0u8..8, lun: [u8; 8],
                                   itt: u32, edtl: u32, cmd_sn: u32, exp: u32, cdb: [u8; 16]) {
            let h = ScsiCommandHeader { immediate: imm, final_bit: f, read: r, write: w, attr, lun, itt,
                expected_data_transfer_length: edtl, cmd_sn, exp_stat_sn: exp, cdb };
            prop_assert_eq!(ScsiCommandHeader::parse(&h.to_bhs()), h);
        }

        #[test]
        fn login_round_trip(t: bool, c: bool, csg in 0u8..4, nsg in 0u8..4, vmax: u8, vmin: u8, isid: [u8; 6],
                            tsih: u16, itt: u32, cid: u16, cmd_sn: u32, exp: u32, class: u8, detail: u8) {
            let h = LoginRequestHeader { transit: t, cont: c, csg, nsg, version_max: vmax, version_min: vmin,
                isid, tsih, itt, cid, cmd_sn, exp_stat_sn: exp };
            prop_assert_eq!(LoginRequestHeader::parse(&h.to_bhs()), h);
            let r = LoginResponseHeader { transit: t, cont: c, csg, nsg, version_max: vmax, version_active: vmin,
                isid, tsih, itt, sn: StatusSn { stat_sn: cmd_sn, exp_cmd_sn: exp, max_cmd_sn: itt },
                status_class: class, status_detail: detail };
            prop_assert_eq!(LoginResponseHeader::parse(&r.to_bhs()), r);
        }

        #[test]
        fn data_round_trip(f: bool, a: bool, o: bool, u: bool, s: bool, status: u8, lun: [u8; 8], itt: u32,
                           ttt: u32, sn: u32, dsn: u32, off: u32, res: u32) {
            let h = DataInHeader { final_bit: f, ack: a, overflow: o, underflow: u, has_status: s, status, lun,
                itt, ttt, sn: StatusSn { stat_sn: sn, exp_cmd_sn: sn ^ 1, max_cmd_sn: sn ^ 2 }, data_sn: dsn,
                buffer_offset: off, residual_count: res };
            prop_assert_eq!(DataInHeader::parse(&h.to_bhs()), h);
            let d = DataOutHeader { final_bit: f, lun, itt, ttt, exp_stat_sn: sn, data_sn: dsn, buffer_offset: off };
            prop_assert_eq!(DataOutHeader::parse(&d.to_bhs()), d);
        }

        #[test]
        fn other_headers_round_trip(flag: bool, byte: u8, lun: [u8; 8], a: u32, b: u32, c: u32, d: u32, e: u32,
                                    h16: u16, g16: u16) {
            let sn = StatusSn { stat_sn: a, exp_cmd_sn: b, max_cmd_sn: c };
            let resp = ScsiResponseHeader { bidi_overflow: flag, bidi_underflow: !flag, overflow: flag,
                underflow: !flag, response: byte, status: byte ^ 0x55, itt: a, snack_tag: b, sn, exp_data_sn: c,
                bidi_residual_count: d, residual_count: e };
            prop_assert_eq!(ScsiResponseHeader::parse(&resp.to_bhs()), resp);
            let tmf = TaskManagementRequestHeader { immediate: flag, function: byte & 0x7f, lun, itt: a,
                referenced_task_tag: b, cmd_sn: c, exp_stat_sn: d, ref_cmd_sn: e, exp_data_sn: a ^ e };
            prop_assert_eq!(TaskManagementRequestHeader::parse(&tmf.to_bhs()), tmf);
            let tmr = TaskManagementResponseHeader { response: byte, itt: a, sn };
            prop_assert_eq!(TaskManagementResponseHeader::parse(&tmr.to_bhs()), tmr);
            for opcode in [Opcode::TextRequest, Opcode::NopOut] {
                let req = RequestHeader { opcode, immediate: flag, final_bit: !flag, cont: flag, lun, itt: a,
                    ttt: b, cmd_sn: c, exp_stat_sn: d };
                prop_assert_eq!(RequestHeader::parse(&req.to_bhs()), req);
            }
            for opcode in [Opcode::TextResponse, Opcode::NopIn] {
                let rep = ReplyHeader { opcode, final_bit: flag, cont: !flag, lun, itt: a, ttt: b, sn };
                prop_assert_eq!(ReplyHeader::parse(&rep.to_bhs()), rep);
            }
            let lo = LogoutRequestHeader { immediate: flag, reason: byte & 0x7f, itt: a, cid: h16, cmd_sn: b,
                exp_stat_sn: c };
            prop_assert_eq!(LogoutRequestHeader::parse(&lo.to_bhs()), lo);
            let lr = LogoutResponseHeader { response: byte, itt: a, sn, time2wait: h16, time2retain: g16 };
            prop_assert_eq!(LogoutResponseHeader::parse(&lr.to_bhs()), lr);
            let sn_h = SnackHeader { snack_type: byte & 0x0f, lun, itt: a, ttt: b, exp_stat_sn: c, beg_run: d,
                run_length: e };
            prop_assert_eq!(SnackHeader::parse(&sn_h.to_bhs()), sn_h);
            let r2t = ReadyToTransferHeader { lun, itt: a, ttt: b, sn, r2t_sn: c, buffer_offset: d,
                desired_length: e };
            prop_assert_eq!(ReadyToTransferHeader::parse(&r2t.to_bhs()), r2t);
            let am = AsyncMessageHeader { lun, sn, event: byte, vendor_code: !byte, parameter1: h16,
                parameter2: g16, parameter3: h16 ^ g16 };
            prop_assert_eq!(AsyncMessageHeader::parse(&am.to_bhs()), am);
            let rj = RejectHeader { reason: RejectReason::from_code(byte), sn, data_sn: d };
            prop_assert_eq!(RejectHeader::parse(&rj.to_bhs()), rj);
        }
    }
}
