//! What each 512-byte block of a volume may read: its content as of the last flush that
//! covered it, or one of the contents written to it since (the engine's crash test's rule).
//! An acknowledged flush narrows every block to what it reads now.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

pub const BLOCK: usize = 512;

/// A block's fingerprint (SipHash with fixed keys: the same in every run).
pub fn block_hash(block: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(block);
    h.finish()
}

/// One volume of the model.
#[derive(Clone, Debug)]
pub struct Vol {
    /// What the volume reads now.
    pub cur: Vec<u8>,
    /// Per block, the fingerprints it may read after a power failure.
    pub allowed: Vec<Vec<u64>>,
}

impl Vol {
    /// A new volume: zeros.
    pub fn new(size: usize) -> Self {
        Vol::from_content(vec![0; size])
    }

    /// A volume that reads `cur`, durably.
    pub fn from_content(cur: Vec<u8>) -> Self {
        let allowed = cur.chunks(BLOCK).map(|b| vec![block_hash(b)]).collect();
        Vol { cur, allowed }
    }

    /// `data` may be (partly) written at `offset` from now on.
    pub fn may_write(&mut self, offset: usize, data: &[u8]) {
        for (i, block) in data.chunks(BLOCK).enumerate() {
            let h = block_hash(block);
            let allowed = &mut self.allowed[offset / BLOCK + i];
            if !allowed.contains(&h) {
                allowed.push(h);
            }
        }
    }

    /// `data` was written at `offset` (acknowledged, not yet durable).
    pub fn wrote(&mut self, offset: usize, data: &[u8]) {
        self.may_write(offset, data);
        self.cur[offset..offset + data.len()].copy_from_slice(data);
    }

    /// A flush covered every write so far.
    pub fn flushed(&mut self) {
        *self = Vol::from_content(std::mem::take(&mut self.cur));
    }

    /// The first block of `got` (read at `offset`) that the model does not allow, if any.
    pub fn disallowed(&self, offset: usize, got: &[u8]) -> Option<usize> {
        got.chunks(BLOCK)
            .enumerate()
            .map(|(i, b)| (offset / BLOCK + i, b))
            .find(|(n, b)| !self.allowed[*n].contains(&block_hash(b)))
            .map(|(n, _)| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_narrows_blocks_to_what_they_read() {
        let mut v = Vol::new(4 * BLOCK);
        v.wrote(BLOCK, &[7; BLOCK]);
        assert_eq!(v.disallowed(0, &[0; 2 * BLOCK]), None, "not flushed: old");
        let mut new = vec![0; 2 * BLOCK];
        new[BLOCK..].fill(7);
        assert_eq!(v.disallowed(0, &new), None, "not flushed: new");
        assert_eq!(v.disallowed(BLOCK, &[8; BLOCK]), Some(1), "never written");
        v.flushed();
        assert_eq!(
            v.disallowed(BLOCK, &[0; BLOCK]),
            Some(1),
            "flushed: old gone"
        );
        assert_eq!(v.disallowed(BLOCK, &[7; BLOCK]), None);
    }
}
