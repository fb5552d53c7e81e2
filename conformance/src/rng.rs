//! A small deterministic PRNG, so every random case is reproducible from its printed seed.

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, good enough statistics for test
/// inputs, trivially portable.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator for stream `stream` of `seed`: different streams of one seed are
    /// independent sequences (the seed mixed with the stream id, one value drawn).
    pub fn with_stream(seed: u64, stream: u64) -> Self {
        let mut r = SplitMix64(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next_u64();
        r
    }

    /// Uniform in `[0, 1)` (53 random bits).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`0` when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }

    /// A value in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below((hi - lo) as u64) as i64
        }
    }

    /// A value in `lo..=hi` (`lo` when the range is empty).
    pub fn range_inclusive(&mut self, lo: i64, hi: i64) -> i64 {
        self.range(lo, hi.saturating_add(1))
    }

    /// An `i32` in `lo..hi`.
    pub fn i32_in(&mut self, lo: i32, hi: i32) -> i32 {
        self.range(lo.into(), hi.into()) as i32
    }

    /// A `u32` in `lo..hi`.
    pub fn u32_in(&mut self, lo: u32, hi: u32) -> u32 {
        self.range(lo.into(), hi.into()) as u32
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// `0..n` in a random order.
    pub fn permutation(&mut self, n: u32) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }

    /// Fills `bytes` with random bytes.
    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_in_range() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let v = a.range(-3, 5);
            b.range(-3, 5);
            assert!((-3..5).contains(&v));
            let w = a.range_inclusive(-3, 5);
            b.range_inclusive(-3, 5);
            assert!((-3..=5).contains(&w));
        }
        let mut p = a.permutation(100);
        p.sort_unstable();
        assert!(p.iter().copied().eq(0..100));
        // Reference value of SplitMix64 seeded with 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }
}
