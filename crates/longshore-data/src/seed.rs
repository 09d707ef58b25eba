//! Seeds: SplitMix64 and the seed schemes every longshore crate derives its random streams
//! from, written once.
//!
//! Each scheme is a pure function of its inputs, so a sample, worker or epoch gets the same
//! seed on every machine, rank, worker count and resume. Their values are part of longshore's
//! behaviour (shuffled orders, random crops and saved resume states depend on them) and are
//! pinned by this module's tests: they must not change.
//!
//! | scheme | value | used by |
//! | --- | --- | --- |
//! | [`mix`] | SplitMix64's step from `z`: add [`GAMMA`], then its finaliser | every scheme below |
//! | [`SplitMix64`] | the SplitMix64 stream (state advanced by [`GAMMA`] per draw) | fault injection, benchmark content |
//! | [`epoch_rng`](crate::rng::epoch_rng) | ChaCha8 seeded with `seed`, stream `epoch` | samplers, shuffles |
//! | [`worker_seed`] | `mix(seed ^ mix(epoch ^ 0xA5A5_A5A5) ^ mix(id + 0x5EED))` | the loader's per-worker generators |
//! | [`sample_rng`] | ChaCha8 seeded with `mix(seed ^ mix(epoch))`, stream `index` | longshore-vision's per-sample transforms |
//! | [`sample_seed`] | `mix(mix(mix(seed) ^ epoch) ^ global)` | longshore-shards' per-sample seeds |
//! | [`block_seed`] | `mix(seed ^ mix(block + 1))` | longshore-shards' within-block shuffles |
//!
//! ```
//! use longshore_data::seed::{SplitMix64, mix, sample_seed};
//!
//! // The stream's draws are `mix` of its successive states.
//! let mut s = SplitMix64::new(7);
//! assert_eq!(s.next_u64(), mix(7));
//! // A sample's seed depends on (seed, epoch, sample) alone.
//! assert_eq!(sample_seed(1, 2, 3), mix(mix(mix(1) ^ 2) ^ 3));
//! ```

use rand_chacha::rand_core::SeedableRng;

use crate::rng::Rng;

/// SplitMix64's increment: 2^64 divided by the golden ratio, odd.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's step from `z`: adds [`GAMMA`], then applies its finaliser (a bijective,
/// well-mixed hash of 64 bits). `mix(z)` is the first draw of [`SplitMix64::new`]`(z)`.
pub fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(GAMMA);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 stream: fast and seedable, for content and schedules that need no
/// cryptographic or statistical strength (fault injection, benchmark data). Samplers and
/// transforms draw from [`Rng`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits: the state advances by [`GAMMA`] and is finalised.
    pub fn next_u64(&mut self) -> u64 {
        let draw = mix(self.0);
        self.0 = self.0.wrapping_add(GAMMA);
        draw
    }

    /// Fills `out` with random bytes: each draw's little-endian bytes in turn (the last draw
    /// truncated, and one draw made even when `out.len()` is a multiple of 8).
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// The seed of worker `id` in `epoch` of a loader seeded with `seed`:
/// `mix(seed ^ mix(epoch ^ 0xA5A5_A5A5) ^ mix(id + 0x5EED))`. Distinct per worker and per
/// epoch (so workers never share random streams, pytorch#5059), and a pure function of
/// (seed, epoch, id), so a resumed run draws the same augmentations.
pub fn worker_seed(seed: u64, epoch: u64, id: usize) -> u64 {
    mix(seed ^ mix(epoch ^ 0xA5A5_A5A5) ^ mix((id as u64).wrapping_add(0x5EED)))
}

/// The generator of sample `index` in `epoch` (longshore-vision's per-sample transforms):
/// ChaCha8 seeded with `mix(seed ^ mix(epoch))`, on stream `index`.
pub fn sample_rng(seed: u64, epoch: u64, index: usize) -> Rng {
    let mut rng = Rng::seed_from_u64(mix(seed ^ mix(epoch)));
    rng.set_stream(index as u64);
    rng
}

/// The seed of a sample's random augmentation in a sharded dataset:
/// `mix(mix(mix(seed) ^ epoch) ^ global)`. It depends only on (seed, epoch, global sample id),
/// so every rank, worker and resume gives a sample the same seed.
pub fn sample_seed(seed: u64, epoch: u64, global: u64) -> u64 {
    mix(mix(mix(seed) ^ epoch) ^ global)
}

/// The seed of block `block`'s shuffle in a sharded dataset's order: `mix(seed ^ mix(block +
/// 1))`, used as [`epoch_rng`](crate::rng::epoch_rng)`(block_seed(seed, block), epoch)`.
pub fn block_seed(seed: u64, block: u64) -> u64 {
    mix(seed ^ mix(block.wrapping_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::RngCore;

    // The values below were produced by the copies these functions replaced (longshore-loader's
    // `worker_seed`, longshore-vision's `sample_rng`, longshore-shards' `sample_seed`, block
    // shuffle seed and fault-injection stream, the benches' SplitMix64). They must not change:
    // saved orders, crops and resume states depend on them.

    #[test]
    fn mix_and_the_stream_keep_their_values() {
        assert_eq!(mix(0), MIX[0]);
        assert_eq!(mix(1), MIX[1]);
        assert_eq!(mix(u64::MAX), MIX[2]);
        let mut s = SplitMix64::new(0x1234);
        let draws: Vec<u64> = (0..3).map(|_| s.next_u64()).collect();
        assert_eq!(draws, STREAM);
        let mut bytes = [0u8; 11];
        SplitMix64::new(0x1234).fill_bytes(&mut bytes);
        assert_eq!(bytes[..8], STREAM[0].to_le_bytes());
        assert_eq!(bytes[8..], STREAM[1].to_le_bytes()[..3]);
    }

    #[test]
    fn seed_schemes_keep_their_values() {
        assert_eq!(worker_seed(99, 0, 0), WORKER[0]);
        assert_eq!(worker_seed(99, 3, 2), WORKER[1]);
        assert_eq!(sample_seed(11, 0, 0), SAMPLE[0]);
        assert_eq!(sample_seed(11, 2, 12_345), SAMPLE[1]);
        assert_eq!(block_seed(7, 0), BLOCK[0]);
        assert_eq!(block_seed(7, 5), BLOCK[1]);
        // `sample_rng` seeds ChaCha8 with these (then picks the sample's stream).
        assert_eq!(mix(5 ^ mix(2)), SAMPLE_RNG_SEED[0]);
        assert_eq!(mix(mix(0)), SAMPLE_RNG_SEED[1]);
        assert_eq!(sample_rng(5, 2, 17).next_u64(), SAMPLE_RNG[0]);
        assert_eq!(sample_rng(0, 0, 0).next_u64(), SAMPLE_RNG[1]);
    }

    const MIX: [u64; 3] = [
        0xe220_a839_7b1d_cdaf,
        0x910a_2dec_8902_5cc1,
        0xe4d9_7177_1b65_2c20,
    ];
    const STREAM: [u64; 3] = [
        0x5f64_2f87_d5e2_3888,
        0x5a4d_7853_3d03_4cb5,
        0x8a85_ffda_ea35_a5a6,
    ];
    const WORKER: [u64; 2] = [0x2cf9_06e8_bd0b_f459, 0x0396_eed2_85ae_0bbf];
    const SAMPLE: [u64; 2] = [0x3f5d_8ca9_22ad_211f, 0xa1ca_88aa_9724_c05e];
    const BLOCK: [u64; 2] = [0x7716_da39_cba2_75b2, 0x2b40_f785_f684_cbe3];
    const SAMPLE_RNG_SEED: [u64; 2] = [0x953d_eb0d_47b9_380a, 0xa706_dd2f_4d19_7e6f];
    const SAMPLE_RNG: [u64; 2] = [0x09f0_6fe2_7bd6_1d4e, 0xddfd_9f22_480f_1436];
}
