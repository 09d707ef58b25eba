//! WeightedRandomSampler's frequencies converge to the weights (fixed seeds, so
//! the test is deterministic; the tolerance is ~6 standard deviations).

use longshore_data::{Sampler, WeightedRandomSampler};

#[test]
fn with_replacement_frequencies_match_weights() {
    let weights = vec![1.0, 2.0, 0.0, 4.0, 8.0, 0.5];
    let total_w: f64 = weights.iter().sum();
    let n = 200_000;
    for seed in [0u64, 1, 2] {
        let s = WeightedRandomSampler::new(weights.clone(), n, true, seed).unwrap();
        let mut counts = vec![0usize; weights.len()];
        for i in s.iter() {
            counts[i] += 1;
        }
        for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
            let p = w / total_w;
            let expected = p * n as f64;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (c as f64 - expected).abs() <= 6.0 * sd + 1.0,
                "seed {seed}: index {i} drawn {c} times, expected {expected:.0} +- {:.0}",
                6.0 * sd
            );
        }
        assert_eq!(counts[2], 0, "zero weight never drawn");
    }
}

#[test]
fn without_replacement_first_draw_follows_weights() {
    // The first index of each draw without replacement is distributed like the weights.
    let weights = vec![1.0, 3.0, 6.0];
    let trials = 20_000;
    let mut first = [0usize; 3];
    for seed in 0..trials {
        let s = WeightedRandomSampler::new(weights.clone(), 2, false, seed).unwrap();
        let v: Vec<usize> = s.iter().collect();
        assert_eq!(v.len(), 2);
        assert_ne!(v[0], v[1]);
        first[v[0]] += 1;
    }
    for (i, &c) in first.iter().enumerate() {
        let p = weights[i] / 10.0;
        let expected = p * trials as f64;
        let sd = (trials as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (c as f64 - expected).abs() <= 6.0 * sd,
            "index {i}: {c} vs {expected}"
        );
    }
}
