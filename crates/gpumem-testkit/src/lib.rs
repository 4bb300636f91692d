//! Deterministic helpers shared by gpumem's tests and benchmarks: one random generator, so
//! that synthetic workloads are the same on every machine and in every crate without a
//! random-number dependency, the [`conformance`] suite that every device backend runs, and
//! [`deps`], the one rule for a test whose system dependency (a compiler, tmux, Chromium,
//! Mesa's Vulkan driver …) is missing.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
pub mod deps;

/// A small deterministic generator (SplitMix64), so that workloads are the same on every
/// machine without a dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Fills `out` with random bytes.
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes()[..chunk.len()]);
        }
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform in `[lo, hi)`, rounded up to a multiple of 4 bytes (fp32 elements).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let x = (a + self.unit() * (b - a)).exp() as u64;
        (x.clamp(lo, hi - 1).div_ceil(4) * 4).max(4)
    }
}
