//! Portable seeded randomness: the same seed gives the same numbers on every machine.
//!
//! Everything random in this crate draws from [`rand_chacha::ChaCha8Rng`], whose output
//! stream is specified, through the integer algorithms below (not through `rand`'s
//! distributions, whose exact outputs may change between releases).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// The random number generator used by samplers and transforms.
pub type Rng = ChaCha8Rng;

/// The generator for `seed` at `epoch`: one ChaCha stream per epoch of one seed.
pub fn epoch_rng(seed: u64, epoch: u64) -> Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch);
    rng
}

/// A uniform integer in `0..n` (Lemire's nearly divisionless method); 0 when `n == 0`.
pub fn below(rng: &mut Rng, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mut m = u128::from(rng.next_u64()) * u128::from(n);
    let mut low = m as u64;
    if low < n {
        let threshold = n.wrapping_neg() % n;
        while low < threshold {
            m = u128::from(rng.next_u64()) * u128::from(n);
            low = m as u64;
        }
    }
    (m >> 64) as u64
}

/// A uniform float in `[0, 1)` with 53 random bits.
pub fn unit_f64(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform float in `[0, 1)` with 24 random bits: one `u32` draw, as `torch.rand` draws a
/// float32.
pub fn unit_f32(rng: &mut Rng) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Shuffles `v` in place (Fisher-Yates).
///
/// The swap targets depend only on the generator, not on the data, so they are drawn a few
/// steps ahead and the swaps then run back to back: on an array larger than the caches the
/// swaps' cache misses overlap instead of each waiting behind the generator's arithmetic. The
/// permutation is exactly the one-at-a-time algorithm's.
pub fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    const AHEAD: usize = 64;
    let mut targets = [0usize; AHEAD];
    let mut i = v.len();
    while i > 1 {
        // Steps i-1, i-2, ..., down to 1 (at most AHEAD of them).
        let k = (i - 1).min(AHEAD);
        for (t, target) in targets[..k].iter_mut().enumerate() {
            let step = i - 1 - t;
            *target = below(rng, step as u64 + 1) as usize;
        }
        for (t, &j) in targets[..k].iter().enumerate() {
            v.swap(i - 1 - t, j);
        }
        i -= k;
    }
}

/// A random permutation of `0..n`, like `torch.randperm(n)`.
pub fn permutation(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    shuffle(&mut v, rng);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{ProptestConfig, any, prop_assert_eq, proptest};

    /// Fisher-Yates one step at a time: the permutation `shuffle` must keep.
    fn reference<T>(v: &mut [T], rng: &mut Rng) {
        for i in (1..v.len()).rev() {
            let j = below(rng, i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn shuffle_draws_ahead_yet_keeps_the_one_step_permutation(
            n in 0usize..2_000,
            seed in any::<u64>(),
            epoch in 0u64..4,
        ) {
            let mut a: Vec<usize> = (0..n).collect();
            let mut b = a.clone();
            let (mut ra, mut rb) = (epoch_rng(seed, epoch), epoch_rng(seed, epoch));
            shuffle(&mut a, &mut ra);
            reference(&mut b, &mut rb);
            prop_assert_eq!(&a, &b);
            // The generators are left at the same point too.
            prop_assert_eq!(ra.next_u64(), rb.next_u64());
        }
    }
}
