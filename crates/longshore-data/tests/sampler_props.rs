//! Sampler invariants under proptest.

use std::collections::HashSet;

use longshore_data::{
    BatchSampler, BatchSampling, DistributedSampler, RandomSampler, Sampler, SequentialSampler,
    SubsetRandomSampler, WeightedRandomSampler,
};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

/// Checks that `iter_from(k)` after a restore yields exactly the rest of the epoch.
fn check_resume<S: Sampler>(mut s: S, epoch: u64, k: usize) {
    s.set_epoch(epoch);
    let full: Vec<usize> = s.iter().collect();
    assert_eq!(full.len(), s.len());
    let k = k.min(full.len());
    let state = s.state(k);
    let json = serde_json::to_string(&state).unwrap();
    s.set_epoch(epoch + 17);
    let restored = serde_json::from_str(&json).unwrap();
    let pos = s.restore(&restored).unwrap();
    let rest: Vec<usize> = s.iter_from(pos).collect();
    assert_eq!(rest, full[k..].to_vec());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sequential_is_identity(n in 0usize..300, k in 0usize..400) {
        let s = SequentialSampler::new(n);
        prop_assert_eq!(s.iter().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
        check_resume(s, 0, k);
    }

    #[test]
    fn random_without_replacement_is_a_permutation(n in 1usize..300, seed in any::<u64>(), epoch in 0u64..50, k in 0usize..400) {
        let mut s = RandomSampler::new(n, seed).unwrap();
        s.set_epoch(epoch);
        let a: Vec<usize> = s.iter().collect();
        prop_assert_eq!(sorted(a.clone()), (0..n).collect::<Vec<_>>());
        // Same seed + epoch reproduces; another instance agrees.
        let mut t = RandomSampler::new(n, seed).unwrap();
        t.set_epoch(epoch);
        prop_assert_eq!(t.iter().collect::<Vec<_>>(), a.clone());
        if n >= 8 {
            s.set_epoch(epoch + 1);
            prop_assert_ne!(s.iter().collect::<Vec<_>>(), a);
        }
        check_resume(s, epoch, k);
    }

    #[test]
    fn random_num_samples_repeats_whole_permutations(n in 1usize..50, extra in 0usize..120, seed in any::<u64>()) {
        let total = n + extra;
        let s = RandomSampler::with_options(n, false, Some(total), seed).unwrap();
        let v: Vec<usize> = s.iter().collect();
        prop_assert_eq!(v.len(), total);
        for chunk in v.chunks(n) {
            let set: HashSet<_> = chunk.iter().collect();
            prop_assert_eq!(set.len(), chunk.len(), "no repeats within one permutation");
        }
        prop_assert!(v.iter().all(|&i| i < n));
    }

    #[test]
    fn random_with_replacement_is_in_range(n in 1usize..100, total in 1usize..400, seed in any::<u64>(), k in 0usize..500) {
        let s = RandomSampler::with_options(n, true, Some(total), seed).unwrap();
        let v: Vec<usize> = s.iter().collect();
        prop_assert_eq!(v.len(), total);
        prop_assert!(v.iter().all(|&i| i < n));
        check_resume(s, 3, k);
    }

    #[test]
    fn subset_random_is_a_permutation_of_the_subset(indices in proptest::collection::vec(0usize..1000, 0..100), seed in any::<u64>(), k in 0usize..120) {
        let s = SubsetRandomSampler::new(indices.clone(), seed);
        prop_assert_eq!(sorted(s.iter().collect()), sorted(indices));
        check_resume(s, 5, k);
    }

    #[test]
    fn weighted_yields_only_positive_weight_indices(
        weights in proptest::collection::vec(prop_oneof![Just(0.0), 0.001f64..10.0], 1..60),
        total in 1usize..200,
        replacement in any::<bool>(),
        seed in any::<u64>(),
        k in 0usize..250,
    ) {
        let nonzero = weights.iter().filter(|&&w| w > 0.0).count();
        prop_assume!(nonzero > 0);
        let total = if replacement { total } else { total.min(nonzero) };
        let s = WeightedRandomSampler::new(weights.clone(), total, replacement, seed).unwrap();
        let v: Vec<usize> = s.iter().collect();
        prop_assert_eq!(v.len(), total);
        prop_assert!(v.iter().all(|&i| weights[i] > 0.0));
        if !replacement {
            let set: HashSet<_> = v.iter().collect();
            prop_assert_eq!(set.len(), v.len());
        }
        check_resume(s, 1, k);
    }

    #[test]
    fn distributed_ranks_partition_the_padded_set(
        n in 0usize..200, replicas in 1usize..9, shuffle in any::<bool>(), drop_last in any::<bool>(),
        seed in any::<u64>(), epoch in 0u64..20, k in 0usize..40,
    ) {
        let samplers: Vec<DistributedSampler> = (0..replicas)
            .map(|r| {
                let mut s = DistributedSampler::builder(n, replicas, r).shuffle(shuffle).seed(seed).drop_last(drop_last).build().unwrap();
                s.set_epoch(epoch);
                s
            })
            .collect();
        let per_rank: Vec<Vec<usize>> = samplers.iter().map(|s| s.iter().collect()).collect();
        let len = samplers[0].len();
        prop_assert!(per_rank.iter().all(|r| r.len() == len), "equal lengths across ranks");
        let mut all: Vec<usize> = per_rank.iter().flatten().copied().collect();
        prop_assert_eq!(all.len(), len * replicas);
        // Interleaving the ranks rebuilds the global padded list.
        let global = samplers[0].global_indices();
        for (pos, &idx) in global.iter().enumerate() {
            prop_assert_eq!(per_rank[pos % replicas][pos / replicas], idx);
        }
        all.sort_unstable();
        let distinct: HashSet<_> = all.iter().copied().collect();
        if drop_last {
            prop_assert_eq!(distinct.len(), all.len(), "no duplicates when dropping");
            prop_assert_eq!(len, n / replicas);
        } else {
            prop_assert_eq!(distinct, (0..n).collect::<HashSet<_>>(), "every index covered");
            prop_assert_eq!(len, n.div_ceil(replicas));
        }
        if shuffle && n >= 8 {
            let mut other = samplers[0].clone();
            other.set_epoch(epoch + 1);
            prop_assert_ne!(other.global_indices(), global, "set_epoch reshuffles");
            other.set_epoch(epoch);
            prop_assert_eq!(other.global_indices(), samplers[0].global_indices(), "same seed+epoch reproduces");
        }
        check_resume(samplers[replicas - 1].clone(), epoch, k);
    }

    #[test]
    fn batch_sampler_lengths_and_resume(n in 0usize..300, bs in 1usize..40, drop_last in any::<bool>(), seed in any::<u64>(), done in 0usize..20) {
        let inner = RandomSampler::new(n.max(1), seed).unwrap();
        let n = n.max(1);
        let mut b = BatchSampler::new(inner, bs, drop_last).unwrap();
        b.set_epoch(2);
        let batches: Vec<Vec<usize>> = b.iter().collect();
        prop_assert_eq!(batches.len(), b.len());
        prop_assert_eq!(b.len(), if drop_last { n / bs } else { n.div_ceil(bs) });
        let flat: Vec<usize> = batches.iter().flatten().copied().collect();
        for (i, batch) in batches.iter().enumerate() {
            if drop_last || i + 1 < batches.len() {
                prop_assert_eq!(batch.len(), bs);
            } else {
                prop_assert!(!batch.is_empty() && batch.len() <= bs);
            }
        }
        if !drop_last {
            prop_assert_eq!(sorted(flat), (0..n).collect::<Vec<_>>());
        }
        // Resume after `done` batches.
        let done = done.min(b.len());
        let state = b.state(done);
        let mut c = BatchSampler::new(RandomSampler::new(n, seed).unwrap(), bs, drop_last).unwrap();
        let pos = c.restore(&state).unwrap();
        prop_assert_eq!(c.iter_from(pos).collect::<Vec<_>>(), batches[done..].to_vec());
    }
}
