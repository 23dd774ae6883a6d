//! Test data.

/// `len` bytes unique to `seed`: no two chunks alike within it or across seeds, and nothing a
/// compressor shrinks (xorshift64, seeded through a multiplication so that neighbouring seeds
/// start far apart).
pub fn unique(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_data_differs_per_seed_and_repeats_no_chunk() {
        let a = unique(1, 1 << 20);
        assert_eq!(a, unique(1, 1 << 20), "the same seed gives the same bytes");
        assert_ne!(a[..4096], unique(2, 4096)[..], "neighbouring seeds differ");
        assert_ne!(
            unique(0, 64),
            unique(1, 64),
            "seed 0 is a seed like any other"
        );
        let mut chunks: Vec<&[u8]> = a.chunks(4096).collect();
        chunks.sort();
        chunks.dedup();
        assert_eq!(chunks.len(), 256);
        let distinct = a[..4096]
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len();
        assert!(distinct > 240, "{distinct} byte values: compressible");
    }
}
