//! What a connection has to send: PDU headers and small data segments are encoded into one
//! growing buffer, large data segments (READ data) are queued by reference. A 1 MiB READ's
//! data goes from the buffer the backend read it into to the socket in one `writev`, with no
//! copy in between: copying it into the output cost a memmove per byte sent (three of them
//! before this, docs/benchmarks.md, "The write path per core").

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};

/// Data segments at least this long are queued by reference; shorter ones are copied into the
/// encoded bytes (a copy of a few KiB costs less than another iovec and a reference count).
pub const SHARE_MIN: usize = 8 * 1024;

/// Pending encoded bytes short enough to move to the front of their buffer after a partial
/// write rather than seal it (which gives up its capacity).
const MOVE_MAX: usize = 64 * 1024;

/// Bytes waiting for the socket, in order: `parts`, then `open`.
#[derive(Debug, Default)]
pub struct Output {
    /// Sealed parts: encoded bytes and data segments held by reference, front first.
    parts: VecDeque<Bytes>,
    /// Encoded bytes after the last sealed part, still growing.
    open: Vec<u8>,
    /// Total bytes pending.
    len: usize,
}

impl Output {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes pending.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append bytes that `encode` writes at the end of the buffer.
    pub fn encode(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        let before = self.open.len();
        encode(&mut self.open);
        self.len += self.open.len() - before;
    }

    /// Append `data` without copying it.
    pub fn share(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.seal();
        self.len += data.len();
        self.parts.push_back(data);
    }

    /// Move everything `other` holds to the end of this output (no copy).
    pub fn append(&mut self, other: &mut Output) {
        if other.is_empty() {
            return;
        }
        self.seal();
        self.parts.append(&mut other.parts);
        if !other.open.is_empty() {
            self.parts
                .push_back(Bytes::from(std::mem::take(&mut other.open)));
        }
        self.len += std::mem::take(&mut other.len);
    }

    /// Fill `dst` with the pending bytes, front first, as far as it reaches; returns how many
    /// slices it filled (for `writev`).
    pub fn io_slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let pending = self
            .parts
            .iter()
            .map(|p| &p[..])
            .chain(std::iter::once(&self.open[..]))
            .filter(|p| !p.is_empty());
        let mut n = 0;
        for (slot, part) in dst.iter_mut().zip(pending) {
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }

    /// Drop the first `n` pending bytes (they were written).
    pub fn consume(&mut self, n: usize) {
        if n >= self.len {
            // All written (the common case): the open buffer keeps its capacity for the
            // next responses.
            self.parts.clear();
            self.open.clear();
            self.len = 0;
            return;
        }
        self.len -= n;
        let mut n = n;
        while n > 0 {
            let Some(front) = self.parts.front_mut() else {
                // Within the open bytes: a short rest moves to the front; a long one is
                // sealed and advanced past instead (a partial write of a large output would
                // otherwise memmove what remains, once per write).
                if self.open.len() - n <= MOVE_MAX {
                    self.open.drain(..n);
                    return;
                }
                self.seal();
                continue;
            };
            let k = n.min(front.len());
            front.advance(k);
            n -= k;
            if front.is_empty() {
                self.parts.pop_front();
            }
        }
    }

    /// Move every pending byte to the end of `out` (one copy; tests and tools).
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
        out.reserve(self.len);
        for part in self.parts.drain(..) {
            out.extend_from_slice(&part);
        }
        out.append(&mut self.open);
        self.len = 0;
    }

    /// Turn the open bytes into a sealed part (no copy).
    fn seal(&mut self) {
        if !self.open.is_empty() {
            self.parts
                .push_back(Bytes::from(std::mem::take(&mut self.open)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything `io_slices` shows, concatenated, `max` slices at a time.
    fn shown(out: &Output, max: usize) -> Vec<u8> {
        let mut slots = vec![IoSlice::new(&[]); max];
        let n = out.io_slices(&mut slots);
        slots[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn bytes_come_out_in_the_order_they_went_in_whatever_the_writes_take() {
        let mut out = Output::new();
        let mut expected = Vec::new();
        for round in 0u8..20 {
            let small: Vec<u8> = (0..(round as usize * 7 + 3))
                .map(|i| i as u8 ^ round)
                .collect();
            out.encode(|v| v.extend_from_slice(&small));
            expected.extend_from_slice(&small);
            if round == 10 {
                // Encoded bytes longer than what a partial write moves to the front.
                let long: Vec<u8> = (0..MOVE_MAX * 2 + 5).map(|i| (i % 251) as u8).collect();
                out.encode(|v| v.extend_from_slice(&long));
                expected.extend_from_slice(&long);
            }
            if round % 3 == 0 {
                let big = vec![round; SHARE_MIN + round as usize];
                expected.extend_from_slice(&big);
                out.share(Bytes::from(big));
            }
        }
        assert_eq!(out.len(), expected.len());
        // Writes that take odd amounts, some ending inside the open bytes.
        let mut written = Vec::new();
        let mut step = 1usize;
        while !out.is_empty() {
            let visible = shown(&out, 3);
            assert!(!visible.is_empty());
            let take = step.min(visible.len());
            written.extend_from_slice(&visible[..take]);
            out.consume(take);
            step = step * 3 + 1;
            if step > 20_000 {
                step = 5;
            }
        }
        assert_eq!(written, expected);
        assert_eq!(out.len(), 0);
    }

    #[test]
    fn appending_moves_parts_and_keeps_order() {
        let mut a = Output::new();
        a.encode(|v| v.extend_from_slice(b"head-a"));
        a.share(Bytes::from(vec![1u8; SHARE_MIN]));
        let mut b = Output::new();
        b.encode(|v| v.extend_from_slice(b"head-b"));
        a.append(&mut b);
        assert!(b.is_empty());
        a.encode(|v| v.extend_from_slice(b"tail"));
        let mut all = Vec::new();
        a.drain_into(&mut all);
        let mut expected = b"head-a".to_vec();
        expected.extend(vec![1u8; SHARE_MIN]);
        expected.extend_from_slice(b"head-btail");
        assert_eq!(all, expected);
        assert!(a.is_empty());
    }

    #[test]
    fn shared_data_is_not_copied() {
        let data = Bytes::from(vec![7u8; SHARE_MIN * 2]);
        let mut out = Output::new();
        out.encode(|v| v.push(0));
        out.share(data.slice(SHARE_MIN..));
        let mut slots = [IoSlice::new(&[]); 4];
        assert_eq!(out.io_slices(&mut slots), 2);
        assert_eq!(slots[1].as_ptr(), data[SHARE_MIN..].as_ptr());
    }
}
