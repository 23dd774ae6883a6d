//! The one reader of parameter lists: the Data-Out of MODE SELECT, UNMAP, SANITIZE, PERSISTENT
//! RESERVE OUT, EXTENDED COPY, POPULATE TOKEN and WRITE USING TOKEN.
//!
//! Every field is read with a bounds check: a field the list is too short to hold is a
//! PARAMETER LIST LENGTH ERROR (SPC-4: "the parameter list length results in the truncation of
//! any parameter"), never a panic or a zero. A list is walked descriptor by descriptor with
//! [`ParamList::sub`], whose offsets are relative to the descriptor while the field pointers
//! it reports still count from the start of the whole list, so every INVALID FIELD IN
//! PARAMETER LIST (and every other sense that points into the list) names the byte the host
//! sent.

use crate::outcome::Failure;
use crate::{Sense, SenseReason};

/// A parameter list, or one descriptor in it, read with bounds checks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParamList<'a> {
    bytes: &'a [u8],
    /// Where `bytes` starts in the whole parameter list.
    base: usize,
}

impl<'a> ParamList<'a> {
    /// The whole parameter list.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        ParamList { bytes, base: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The `len` bytes at `at`, as a reader of their own (offsets relative to them, field
    /// pointers from the start of the list), or PARAMETER LIST LENGTH ERROR when they do not
    /// fit.
    pub(crate) fn sub(&self, at: usize, len: usize) -> Result<ParamList<'a>, Failure> {
        let end = at.checked_add(len).ok_or_else(length_error)?;
        let bytes = self.bytes.get(at..end).ok_or_else(length_error)?;
        Ok(ParamList {
            bytes,
            base: self.base.saturating_add(at),
        })
    }

    /// The field of `N` bytes at `at`.
    pub(crate) fn array<const N: usize>(&self, at: usize) -> Result<[u8; N], Failure> {
        let end = at.checked_add(N).ok_or_else(length_error)?;
        self.bytes
            .get(at..end)
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or_else(length_error)
    }

    pub(crate) fn u8(&self, at: usize) -> Result<u8, Failure> {
        Ok(self.array::<1>(at)?[0])
    }

    pub(crate) fn be16(&self, at: usize) -> Result<u16, Failure> {
        self.array(at).map(u16::from_be_bytes)
    }

    /// A 3-byte field (such as a block length in a block descriptor).
    pub(crate) fn be24(&self, at: usize) -> Result<u32, Failure> {
        let [a, b, c] = self.array(at)?;
        Ok(u32::from_be_bytes([0, a, b, c]))
    }

    pub(crate) fn be32(&self, at: usize) -> Result<u32, Failure> {
        self.array(at).map(u32::from_be_bytes)
    }

    pub(crate) fn be64(&self, at: usize) -> Result<u64, Failure> {
        self.array(at).map(u64::from_be_bytes)
    }

    /// Offset of byte `at` of this reader from the start of the whole list.
    pub(crate) fn offset(&self, at: usize) -> usize {
        self.base.saturating_add(at)
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at byte `at` (and `bit`) of this reader.
    pub(crate) fn invalid(&self, at: usize, bit: Option<u8>) -> Failure {
        Sense::invalid_param(self.offset(at), bit).into()
    }

    /// `reason` with the field pointer at byte `at` of this reader ([`fail_at`]).
    pub(crate) fn fail_at(&self, reason: SenseReason, at: usize) -> Failure {
        fail_at(reason, self.offset(at))
    }
}

/// `reason` with the field pointer at `byte` of the parameter list (C/D = 0); a byte past the
/// pointer's 16 bits points at its end. For COPY ABORTED the same bytes are the segment
/// pointer format with SD = 0 (SPC-4 4.5.2.4.5).
pub(crate) fn fail_at(reason: SenseReason, byte: usize) -> Failure {
    let byte = u16::try_from(byte).unwrap_or(u16::MAX);
    Sense::from(reason)
        .with_field_pointer(false, byte, None)
        .into()
}

/// PARAMETER LIST LENGTH ERROR: the list is shorter than a field it must hold.
pub(crate) fn length_error() -> Failure {
    SenseReason::ParameterListLengthError.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field pointer: (C/D, byte, bit).
    type Pointer = (bool, u16, Option<u8>);

    /// (sense key, ASC, ASCQ, field pointer) of a failure, from fixed-format sense.
    fn sense_of(f: Failure) -> (u8, u8, u8, Option<Pointer>) {
        let Failure::Check(s) = f else {
            panic!("a check condition");
        };
        let fixed = s.to_fixed();
        let sks = &fixed[15..18];
        let pointer = (sks[0] & 0x80 != 0).then(|| {
            let bit = (sks[0] & 0x08 != 0).then_some(sks[0] & 0x07);
            (
                sks[0] & 0x40 != 0,
                u16::from_be_bytes([sks[1], sks[2]]),
                bit,
            )
        });
        (fixed[2] & 0x0f, fixed[12], fixed[13], pointer)
    }

    const INVALID_FIELD: (u8, u8, u8) = (0x5, 0x26, 0x00);
    const LENGTH_ERROR: (u8, u8, u8) = (0x5, 0x1a, 0x00);

    #[test]
    fn fields_read_big_endian_and_past_the_end_is_a_length_error() {
        let list = ParamList::new(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(list.u8(0).ok(), Some(1));
        assert_eq!(list.be16(1).ok(), Some(0x0203));
        assert_eq!(list.be24(1).ok(), Some(0x02_0304));
        assert_eq!(list.be32(0).ok(), Some(0x0102_0304));
        assert_eq!(list.be64(1).ok(), Some(0x0203_0405_0607_0809));
        for failure in [
            list.u8(9).err(),
            list.be16(8).err(),
            list.be32(6).err(),
            list.be64(2).err(),
            list.be64(usize::MAX).err(),
            list.sub(4, 6).err(),
            list.sub(usize::MAX, 2).err(),
        ] {
            let (key, asc, ascq, pointer) = sense_of(failure.expect("past the end"));
            assert_eq!((key, asc, ascq), LENGTH_ERROR);
            assert_eq!(pointer, None, "a length error points at no field");
        }
    }

    #[test]
    fn a_descriptor_reads_from_its_own_start_and_points_from_the_lists() {
        let mut bytes = vec![0u8; 48];
        bytes[16 + 8..16 + 10].copy_from_slice(&0xbeefu16.to_be_bytes());
        let list = ParamList::new(&bytes);
        let descriptor = list.sub(16, 32).unwrap();
        assert_eq!(descriptor.len(), 32);
        assert_eq!(descriptor.be16(8).ok(), Some(0xbeef));
        assert!(
            descriptor.be16(31).is_err(),
            "the descriptor ends before the list"
        );
        let (key, asc, ascq, pointer) = sense_of(descriptor.invalid(8, None));
        assert_eq!((key, asc, ascq), INVALID_FIELD);
        assert_eq!(pointer, Some((false, 24, None)), "C/D = 0, byte 16 + 8");
        // A descriptor inside a descriptor still counts from the start of the list.
        let field = descriptor.sub(4, 8).unwrap();
        assert_eq!(
            sense_of(field.invalid(3, Some(5))).3,
            Some((false, 23, Some(5)))
        );
        assert_eq!(field.offset(0), 20);
    }

    #[test]
    fn other_reasons_carry_the_pointer_and_large_offsets_saturate() {
        let bytes = vec![0u8; 16];
        let list = ParamList::new(&bytes);
        let (key, asc, ascq, pointer) = sense_of(
            list.sub(4, 4)
                .unwrap()
                .fail_at(SenseReason::CopyTargetDeviceNotReachable, 2),
        );
        assert_eq!((key, asc, ascq), (0xa, 0x0d, 0x02));
        assert_eq!(pointer, Some((false, 6, None)));
        let far = ParamList {
            bytes: &bytes,
            base: 70_000,
        };
        assert_eq!(
            sense_of(far.invalid(0, None)).3,
            Some((false, u16::MAX, None))
        );
    }
}
