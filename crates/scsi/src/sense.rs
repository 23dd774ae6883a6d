//! Every reason a command can fail, and the one table mapping each to SENSE KEY / ASC / ASCQ.
//!
//! Command code returns a [`SenseReason`]; only [`SenseReason::code`] knows the numbers, so a
//! reason is spelled the same way by every command family.

/// SCSI status byte values (SAM-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    ConditionMet = 0x04,
    Busy = 0x08,
    ReservationConflict = 0x18,
    TaskSetFull = 0x28,
    AcaActive = 0x30,
    TaskAborted = 0x40,
}

/// Sense keys (SPC-4 table 49).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SenseKey {
    NoSense = 0x0,
    RecoveredError = 0x1,
    NotReady = 0x2,
    MediumError = 0x3,
    HardwareError = 0x4,
    IllegalRequest = 0x5,
    UnitAttention = 0x6,
    DataProtect = 0x7,
    BlankCheck = 0x8,
    VendorSpecific = 0x9,
    CopyAborted = 0xa,
    AbortedCommand = 0xb,
    VolumeOverflow = 0xd,
    Miscompare = 0xe,
}

/// Why a command ended in CHECK CONDITION (or why a unit attention is pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseReason {
    // ILLEGAL REQUEST
    InvalidOpcode,
    InvalidFieldInCdb,
    InvalidFieldInParameterList,
    ParameterListLengthError,
    LbaOutOfRange,
    LogicalUnitNotSupported,
    InvalidReleaseOfPersistentReservation,
    SavingParametersNotSupported,
    InsufficientRegistrationResources,
    TooManyTargetDescriptors,
    UnsupportedTargetDescriptorType,
    TooManySegmentDescriptors,
    UnsupportedSegmentDescriptorType,
    InvalidCopyTargetDescriptor,
    CopyTargetDeviceNotReachable,
    OperationInProgress,
    /// A ROD token that is not usable (SPC-4 INVALID TOKEN OPERATION, 23h): the cause
    /// cannot be reported, the ROD type is unsupported, the token is unknown, revoked or
    /// expired.
    TokenCauseNotReportable,
    UnsupportedTokenType,
    TokenUnknown,
    TokenRevoked,
    TokenExpired,
    /// Data-Out does not match what the CDB describes (too short, or a fixed-size buffer
    /// such as WRITE SAME's one block of the wrong size).
    InvalidFieldInInformationUnit,
    // Not ready / hardware / medium
    NotReadyManualIntervention,
    NotReadyFormatInProgress,
    NotReadySanitizeInProgress,
    NotReadyStopped,
    MediumNotPresent,
    WriteError,
    UnrecoveredReadError,
    InternalTargetFailure,
    // DATA PROTECT
    WriteProtected,
    SpaceAllocationFailedWriteProtect,
    // MISCOMPARE
    MiscompareDuringVerify,
    // UNIT ATTENTION
    PowerOnResetOccurred,
    PowerOnOccurred,
    BusResetOccurred,
    BusDeviceResetOccurred,
    ItNexusLossOccurred,
    CapacityDataChanged,
    ModeParametersChanged,
    ReservationsPreempted,
    ReservationsReleased,
    RegistrationsPreempted,
    ThinProvisioningSoftThresholdReached,
    InquiryDataChanged,
    ReportedLunsDataChanged,
    // ABORTED COMMAND
    CommandsClearedByAnotherInitiator,
    CommandsClearedByPowerLoss,
    // NO SENSE (REQUEST SENSE with nothing pending)
    NoAdditionalSense,
}

impl SenseReason {
    /// The one table: reason -> (sense key, ASC, ASCQ).
    pub const fn code(self) -> (SenseKey, u8, u8) {
        use SenseKey::*;
        use SenseReason::*;
        match self {
            InvalidOpcode => (IllegalRequest, 0x20, 0x00),
            InvalidFieldInCdb => (IllegalRequest, 0x24, 0x00),
            InvalidFieldInParameterList => (IllegalRequest, 0x26, 0x00),
            ParameterListLengthError => (IllegalRequest, 0x1a, 0x00),
            LbaOutOfRange => (IllegalRequest, 0x21, 0x00),
            LogicalUnitNotSupported => (IllegalRequest, 0x25, 0x00),
            InvalidReleaseOfPersistentReservation => (IllegalRequest, 0x26, 0x04),
            SavingParametersNotSupported => (IllegalRequest, 0x39, 0x00),
            InsufficientRegistrationResources => (IllegalRequest, 0x55, 0x04),
            TooManyTargetDescriptors => (IllegalRequest, 0x26, 0x06),
            UnsupportedTargetDescriptorType => (IllegalRequest, 0x26, 0x07),
            TooManySegmentDescriptors => (IllegalRequest, 0x26, 0x08),
            UnsupportedSegmentDescriptorType => (IllegalRequest, 0x26, 0x09),
            InvalidCopyTargetDescriptor => (CopyAborted, 0x0d, 0x00),
            CopyTargetDeviceNotReachable => (CopyAborted, 0x0d, 0x02),
            OperationInProgress => (IllegalRequest, 0x00, 0x16),
            TokenCauseNotReportable => (IllegalRequest, 0x23, 0x00),
            UnsupportedTokenType => (IllegalRequest, 0x23, 0x01),
            TokenUnknown => (IllegalRequest, 0x23, 0x04),
            TokenRevoked => (IllegalRequest, 0x23, 0x06),
            TokenExpired => (IllegalRequest, 0x23, 0x07),
            InvalidFieldInInformationUnit => (IllegalRequest, 0x0e, 0x03),
            NotReadyManualIntervention => (NotReady, 0x04, 0x03),
            NotReadyFormatInProgress => (NotReady, 0x04, 0x04),
            NotReadySanitizeInProgress => (NotReady, 0x04, 0x1b),
            NotReadyStopped => (NotReady, 0x04, 0x02),
            MediumNotPresent => (NotReady, 0x3a, 0x00),
            WriteError => (MediumError, 0x0c, 0x00),
            UnrecoveredReadError => (MediumError, 0x11, 0x00),
            InternalTargetFailure => (HardwareError, 0x44, 0x00),
            WriteProtected => (DataProtect, 0x27, 0x00),
            SpaceAllocationFailedWriteProtect => (DataProtect, 0x27, 0x07),
            MiscompareDuringVerify => (Miscompare, 0x1d, 0x00),
            PowerOnResetOccurred => (UnitAttention, 0x29, 0x00),
            PowerOnOccurred => (UnitAttention, 0x29, 0x01),
            BusResetOccurred => (UnitAttention, 0x29, 0x02),
            BusDeviceResetOccurred => (UnitAttention, 0x29, 0x03),
            ItNexusLossOccurred => (UnitAttention, 0x29, 0x07),
            CapacityDataChanged => (UnitAttention, 0x2a, 0x09),
            ModeParametersChanged => (UnitAttention, 0x2a, 0x01),
            ReservationsPreempted => (UnitAttention, 0x2a, 0x03),
            ReservationsReleased => (UnitAttention, 0x2a, 0x04),
            RegistrationsPreempted => (UnitAttention, 0x2a, 0x05),
            ThinProvisioningSoftThresholdReached => (UnitAttention, 0x38, 0x07),
            InquiryDataChanged => (UnitAttention, 0x3f, 0x03),
            ReportedLunsDataChanged => (UnitAttention, 0x3f, 0x0e),
            CommandsClearedByAnotherInitiator => (UnitAttention, 0x2f, 0x00),
            CommandsClearedByPowerLoss => (UnitAttention, 0x2f, 0x01),
            NoAdditionalSense => (NoSense, 0x00, 0x00),
        }
    }
}

/// Sense data to return with CHECK CONDITION: a reason plus the optional fields some
/// commands fill in (INFORMATION for MISCOMPARE offsets, SENSE-KEY SPECIFIC field pointers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub reason: SenseReason,
    /// INFORMATION field (VALID bit set when present).
    pub information: Option<u64>,
    /// SENSE-KEY SPECIFIC field pointer: (in CDB (true) or parameter list, byte, bit).
    pub field_pointer: Option<FieldPointer>,
}

/// Points at the offending byte (and optionally bit) of a CDB or parameter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    pub in_cdb: bool,
    pub byte: u16,
    pub bit: Option<u8>,
}

impl From<SenseReason> for Sense {
    fn from(reason: SenseReason) -> Self {
        Sense {
            reason,
            information: None,
            field_pointer: None,
        }
    }
}

impl Sense {
    pub fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`) of the CDB.
    pub fn invalid_cdb(byte: u16, bit: Option<u8>) -> Self {
        Sense::from(SenseReason::InvalidFieldInCdb).with_field_pointer(true, byte, bit)
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` (and `bit`) of the parameter list;
    /// a byte past the field pointer's 16 bits points at its end.
    pub fn invalid_param(byte: usize, bit: Option<u8>) -> Self {
        Sense::from(SenseReason::InvalidFieldInParameterList).with_field_pointer(
            false,
            u16::try_from(byte).unwrap_or(u16::MAX),
            bit,
        )
    }

    pub fn with_field_pointer(mut self, in_cdb: bool, byte: u16, bit: Option<u8>) -> Self {
        self.field_pointer = Some(FieldPointer { in_cdb, byte, bit });
        self
    }

    /// Fixed-format sense data (response code 0x70), 18 bytes.
    pub fn to_fixed(&self) -> Vec<u8> {
        let (key, asc, ascq) = self.reason.code();
        let mut s = vec![0u8; 18];
        s[0] = 0x70;
        s[2] = key as u8;
        // Fixed format holds 4 bytes. A larger value (an LBA past 2 TiB at 512-byte blocks)
        // is not reported (VALID 0), as disks do: a saturated one would name the wrong block.
        // Descriptor format (D_SENSE) holds 8.
        if let Some(info) = self.information.and_then(|i| u32::try_from(i).ok()) {
            s[0] |= 0x80;
            s[3..7].copy_from_slice(&info.to_be_bytes());
        }
        s[7] = 10; // additional sense length
        s[12] = asc;
        s[13] = ascq;
        if let Some(fp) = self.field_pointer {
            s[15] = 0x80 | if fp.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = fp.bit {
                s[15] |= 0x08 | (bit & 7);
            }
            s[16..18].copy_from_slice(&fp.byte.to_be_bytes());
        }
        s
    }

    /// Descriptor-format sense data (response code 0x72), used when the control mode page
    /// sets D_SENSE.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let (key, asc, ascq) = self.reason.code();
        let mut s = vec![0x72, key as u8, asc, ascq, 0, 0, 0, 0];
        if let Some(info) = self.information {
            s.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
            s.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(fp) = self.field_pointer {
            let mut b = 0x80 | if fp.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = fp.bit {
                b |= 0x08 | (bit & 7);
            }
            let ptr = fp.byte.to_be_bytes();
            s.extend_from_slice(&[0x02, 0x06, 0, 0, b, ptr[0], ptr[1], 0]);
        }
        s[7] = (s.len() - 8) as u8;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = Sense::from(SenseReason::MiscompareDuringVerify).with_information(513);
        let b = s.to_fixed();
        assert_eq!(b[0], 0xf0);
        assert_eq!(b[2], 0x0e);
        assert_eq!(u32::from_be_bytes(b[3..7].try_into().unwrap()), 513);
        assert_eq!((b[12], b[13]), (0x1d, 0x00));
    }

    #[test]
    fn information_past_four_bytes_is_not_valid_in_fixed_format_but_is_in_descriptor_format() {
        let s = Sense::from(SenseReason::UnrecoveredReadError).with_information(1 << 32);
        let b = s.to_fixed();
        assert_eq!(b[0], 0x70, "VALID must be clear");
        assert_eq!(&b[3..7], &[0, 0, 0, 0]);
        let d = s.to_descriptor();
        assert_eq!(&d[8..12], &[0x00, 0x0a, 0x80, 0]);
        assert_eq!(u64::from_be_bytes(d[12..20].try_into().unwrap()), 1 << 32);
    }

    #[test]
    fn field_pointer_encoding() {
        let b = Sense::from(SenseReason::InvalidFieldInCdb)
            .with_field_pointer(true, 2, Some(3))
            .to_fixed();
        assert_eq!(b[15], 0x80 | 0x40 | 0x08 | 3);
        assert_eq!(&b[16..18], &[0, 2]);
    }

    #[test]
    fn invalid_field_senses_point_into_the_cdb_or_the_parameter_list() {
        let cdb = Sense::invalid_cdb(1, Some(4)).to_fixed();
        assert_eq!((cdb[2] & 0x0f, cdb[12], cdb[13]), (0x5, 0x24, 0x00));
        assert_eq!(cdb[15], 0x80 | 0x40 | 0x08 | 4, "C/D set: the CDB");
        assert_eq!(&cdb[16..18], &[0, 1]);
        let param = Sense::invalid_param(300, None).to_fixed();
        assert_eq!((param[2] & 0x0f, param[12], param[13]), (0x5, 0x26, 0x00));
        assert_eq!(
            param[15], 0x80,
            "C/D clear, no bit: the parameter list, whole byte"
        );
        assert_eq!(&param[16..18], &300u16.to_be_bytes());
        // A byte past what the field pointer holds points at its end, not at a wrapped byte.
        let far = Sense::invalid_param(70_000, Some(1)).to_fixed();
        assert_eq!(&far[16..18], &[0xff, 0xff]);
        assert_eq!(far[15], 0x80 | 0x08 | 1);
    }

    #[test]
    fn descriptor_format_layout() {
        let b = Sense::from(SenseReason::SpaceAllocationFailedWriteProtect)
            .with_information(7)
            .to_descriptor();
        assert_eq!(&b[..4], &[0x72, 0x07, 0x27, 0x07]);
        assert_eq!(b[7] as usize, b.len() - 8);
        assert_eq!(&b[8..12], &[0x00, 0x0a, 0x80, 0]);
    }
}
