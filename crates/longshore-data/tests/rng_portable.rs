//! The portable generator: bounded draws stay in range and the stream is pinned.

use longshore_data::rng::{below, epoch_rng, permutation, unit_f64};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn below_is_in_range(seed in any::<u64>(), n in 0u64..u64::MAX) {
        let mut r = epoch_rng(seed, 0);
        for _ in 0..16 {
            let v = below(&mut r, n);
            prop_assert!(v < n.max(1));
        }
        let u = unit_f64(&mut r);
        prop_assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn permutation_is_a_permutation(seed in any::<u64>(), n in 0usize..500) {
        let mut p = permutation(n, &mut epoch_rng(seed, 1));
        p.sort_unstable();
        prop_assert_eq!(p, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn small_bounds_are_roughly_uniform() {
    let mut r = epoch_rng(1, 2);
    let mut counts = [0u32; 6];
    for _ in 0..60_000 {
        counts[below(&mut r, 6) as usize] += 1;
    }
    // Expected 10,000 each, sd ~91: allow 6 sd.
    assert!(
        counts.iter().all(|&c| (9_450..=10_550).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn epochs_are_distinct_streams() {
    let a: Vec<u64> = (0..4)
        .map(|_| below(&mut epoch_rng(5, 0), 1 << 50))
        .collect();
    let mut r0 = epoch_rng(5, 0);
    let mut r1 = epoch_rng(5, 1);
    let s0: Vec<u64> = (0..8).map(|_| below(&mut r0, 1 << 50)).collect();
    let s1: Vec<u64> = (0..8).map(|_| below(&mut r1, 1 << 50)).collect();
    assert_ne!(s0, s1);
    assert_eq!(a[0], s0[0]);
}
