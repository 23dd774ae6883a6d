//! Little-endian cursors over bytes: what the log's record payloads, the root and format 2's
//! checkpoints are read from and written to.

/// Reads integers and byte runs from the front of a slice; `.0` is what is left.
pub(crate) struct LeReader<'a>(pub(crate) &'a [u8]);

/// Why a [`LeReader`] could not give what was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Short {
    /// Fewer bytes are left than asked for.
    Truncated,
    /// A count of items more than what is left could hold.
    CountBeyondEnd,
}

impl Short {
    /// What is wrong, for the error of the reader's caller.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Short::Truncated => "truncated",
            Short::CountBeyondEnd => "count beyond the end",
        }
    }
}

impl<'a> LeReader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.0.len() < n {
            return Err(Short::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count of items of at least `item` bytes each: bounded by what is left.
    pub(crate) fn count(&mut self, item: usize) -> Result<usize, Short> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item) > self.0.len() {
            return Err(Short::CountBeyondEnd);
        }
        Ok(n)
    }
}

/// Appends integers and byte runs to `.0`.
pub(crate) struct LeWriter(pub(crate) Vec<u8>);

impl LeWriter {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
}
