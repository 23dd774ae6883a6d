//! SCSI status and sense data decoding (SPC-4 §4.5: fixed and descriptor formats).

use std::fmt;

/// SAM status codes as the status bytes a SCSI Response carries; the values are the target's
/// [`sliver_scsi::Status`].
pub mod status {
    use sliver_scsi::Status;

    pub const GOOD: u8 = Status::Good as u8;
    pub const CHECK_CONDITION: u8 = Status::CheckCondition as u8;
    pub const CONDITION_MET: u8 = Status::ConditionMet as u8;
    pub const BUSY: u8 = Status::Busy as u8;
    pub const RESERVATION_CONFLICT: u8 = Status::ReservationConflict as u8;
    pub const TASK_SET_FULL: u8 = Status::TaskSetFull as u8;
    pub const ACA_ACTIVE: u8 = Status::AcaActive as u8;
    pub const TASK_ABORTED: u8 = Status::TaskAborted as u8;

    /// A readable name for a status byte.
    pub fn name(status: u8) -> &'static str {
        match status {
            GOOD => "GOOD",
            CHECK_CONDITION => "CHECK CONDITION",
            CONDITION_MET => "CONDITION MET",
            BUSY => "BUSY",
            RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            TASK_SET_FULL => "TASK SET FULL",
            ACA_ACTIVE => "ACA ACTIVE",
            TASK_ABORTED => "TASK ABORTED",
            _ => "unknown status",
        }
    }
}

/// The sense key (4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenseKey {
    NoSense,
    RecoveredError,
    NotReady,
    MediumError,
    HardwareError,
    IllegalRequest,
    UnitAttention,
    DataProtect,
    BlankCheck,
    VendorSpecific,
    CopyAborted,
    AbortedCommand,
    VolumeOverflow,
    Miscompare,
    Reserved(u8),
}

impl SenseKey {
    pub fn from_code(v: u8) -> Self {
        match v & 0x0f {
            0x0 => Self::NoSense,
            0x1 => Self::RecoveredError,
            0x2 => Self::NotReady,
            0x3 => Self::MediumError,
            0x4 => Self::HardwareError,
            0x5 => Self::IllegalRequest,
            0x6 => Self::UnitAttention,
            0x7 => Self::DataProtect,
            0x8 => Self::BlankCheck,
            0x9 => Self::VendorSpecific,
            0xa => Self::CopyAborted,
            0xb => Self::AbortedCommand,
            0xd => Self::VolumeOverflow,
            0xe => Self::Miscompare,
            other => Self::Reserved(other),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::NoSense => "NO SENSE",
            Self::RecoveredError => "RECOVERED ERROR",
            Self::NotReady => "NOT READY",
            Self::MediumError => "MEDIUM ERROR",
            Self::HardwareError => "HARDWARE ERROR",
            Self::IllegalRequest => "ILLEGAL REQUEST",
            Self::UnitAttention => "UNIT ATTENTION",
            Self::DataProtect => "DATA PROTECT",
            Self::BlankCheck => "BLANK CHECK",
            Self::VendorSpecific => "VENDOR SPECIFIC",
            Self::CopyAborted => "COPY ABORTED",
            Self::AbortedCommand => "ABORTED COMMAND",
            Self::VolumeOverflow => "VOLUME OVERFLOW",
            Self::Miscompare => "MISCOMPARE",
            Self::Reserved(_) => "RESERVED",
        }
    }
}

/// Decoded sense data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sense {
    pub key: SenseKey,
    pub asc: u8,
    pub ascq: u8,
    /// The INFORMATION field when valid (fixed format VALID bit, or an information descriptor).
    pub information: Option<u64>,
    /// The raw bytes as received.
    pub raw: Vec<u8>,
}

impl Sense {
    /// Decodes fixed (70h/71h) or descriptor (72h/73h) sense data. `None` for anything shorter
    /// than the fields it needs or of an unknown response code.
    pub fn parse(raw: &[u8]) -> Option<Self> {
        let code = raw.first()? & 0x7f;
        let (key, asc, ascq, information) = match code {
            0x70 | 0x71 => {
                let key = SenseKey::from_code(*raw.get(2)?);
                // ASC/ASCQ sit at 12/13; short sense (additional length < 6) leaves them zero.
                let asc = raw.get(12).copied().unwrap_or(0);
                let ascq = raw.get(13).copied().unwrap_or(0);
                let information = if raw[0] & 0x80 != 0 {
                    raw.get(3..7)
                        .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
                } else {
                    None
                };
                (key, asc, ascq, information)
            }
            0x72 | 0x73 => {
                let key = SenseKey::from_code(*raw.get(1)?);
                let asc = raw.get(2).copied().unwrap_or(0);
                let ascq = raw.get(3).copied().unwrap_or(0);
                let additional = usize::from(raw.get(7).copied().unwrap_or(0));
                let end = (8 + additional).min(raw.len());
                let mut information = None;
                let mut pos = 8;
                while pos + 2 <= end {
                    let kind = raw[pos];
                    let len = usize::from(raw[pos + 1]);
                    let body = raw.get(pos + 2..(pos + 2 + len).min(end)).unwrap_or(&[]);
                    if kind == 0x00 && body.len() >= 10 && body[0] & 0x80 != 0 {
                        let mut b = [0; 8];
                        b.copy_from_slice(&body[2..10]);
                        information = Some(u64::from_be_bytes(b));
                    }
                    pos += 2 + len;
                }
                (key, asc, ascq, information)
            }
            _ => return None,
        };
        Some(Self {
            key,
            asc,
            ascq,
            information,
            raw: raw.to_vec(),
        })
    }

    /// A short description of the additional sense code, for the codes sliver's tools meet.
    pub fn description(&self) -> Option<&'static str> {
        Some(match (self.asc, self.ascq) {
            (0x00, 0x00) => "NO ADDITIONAL SENSE INFORMATION",
            (0x04, 0x1b) => "LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS",
            (0x1a, 0x00) => "PARAMETER LIST LENGTH ERROR",
            (0x20, 0x00) => "INVALID COMMAND OPERATION CODE",
            (0x21, 0x00) => "LOGICAL BLOCK ADDRESS OUT OF RANGE",
            (0x24, 0x00) => "INVALID FIELD IN CDB",
            (0x25, 0x00) => "LOGICAL UNIT NOT SUPPORTED",
            (0x26, 0x00) => "INVALID FIELD IN PARAMETER LIST",
            (0x27, 0x00) => "WRITE PROTECTED",
            (0x29, _) => "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED",
            (0x2a, 0x09) => "CAPACITY DATA HAS CHANGED",
            (0x1d, 0x00) => "MISCOMPARE DURING VERIFY OPERATION",
            (0x27, 0x07) => "SPACE ALLOCATION FAILED WRITE PROTECT",
            (0x55, 0x03) => "INSUFFICIENT RESOURCES",
            _ => return None,
        })
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (ASC/ASCQ {:02X}h/{:02X}h",
            self.key.name(),
            self.asc,
            self.ascq
        )?;
        if let Some(d) = self.description() {
            write!(f, " {d}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format() {
        // ILLEGAL REQUEST, LBA OUT OF RANGE, VALID with information 0x1234.
        let mut raw = vec![0u8; 18];
        raw[0] = 0xf0;
        raw[2] = 0x05;
        raw[3..7].copy_from_slice(&0x1234u32.to_be_bytes());
        raw[7] = 10;
        raw[12] = 0x21;
        raw[13] = 0x00;
        let s = Sense::parse(&raw).unwrap();
        assert_eq!(s.key, SenseKey::IllegalRequest);
        assert_eq!((s.asc, s.ascq), (0x21, 0x00));
        assert_eq!(s.information, Some(0x1234));
        assert_eq!(
            s.to_string(),
            "ILLEGAL REQUEST (ASC/ASCQ 21h/00h LOGICAL BLOCK ADDRESS OUT OF RANGE)"
        );
    }

    #[test]
    fn descriptor_format_with_information() {
        let mut raw = vec![0x72, 0x06, 0x29, 0x01, 0, 0, 0, 12];
        raw.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
        raw.extend_from_slice(&0xdead_beef_u64.to_be_bytes());
        let s = Sense::parse(&raw).unwrap();
        assert_eq!(s.key, SenseKey::UnitAttention);
        assert_eq!((s.asc, s.ascq), (0x29, 0x01));
        assert_eq!(s.information, Some(0xdead_beef));
    }

    #[test]
    fn garbage_is_not_sense() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x12, 0, 5]), None);
        assert_eq!(Sense::parse(&[0x70, 0]), None);
        // A descriptor length running past the end is clipped, not trusted.
        let s = Sense::parse(&[0x72, 0x05, 0x24, 0x00, 0, 0, 0, 200, 0x00, 0x0a, 0x80]).unwrap();
        assert_eq!(s.key, SenseKey::IllegalRequest);
        assert_eq!(s.information, None);
        assert_eq!(SenseKey::from_code(0xc), SenseKey::Reserved(0xc));
        assert_eq!(SenseKey::from_code(0xf5), SenseKey::IllegalRequest);
        assert_eq!(SenseKey::from_code(0x0e).name(), "MISCOMPARE");
        assert_eq!(status::name(status::TASK_SET_FULL), "TASK SET FULL");
    }
}
