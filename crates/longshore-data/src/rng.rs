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

/// Shuffles `v` in place (Fisher-Yates).
pub fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        let j = below(rng, i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// A random permutation of `0..n`, like `torch.randperm(n)`.
pub fn permutation(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    shuffle(&mut v, rng);
    v
}
