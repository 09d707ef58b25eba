//! `Mixture`: Hugging Face's stopping strategies (the epoch ends at the first draw past a
//! member's last sample, or once every member has given every sample), every pass over a
//! member a permutation of it, proportions within one block's rounding of the weights, and
//! orders that follow the epoch.

use std::collections::{BTreeMap, BTreeSet};

use longshore_data::dataset::mixture::{Mixture, Stop};
use longshore_data::{DataError, Dataset, VecDataset};
use proptest::prelude::*;

/// Members whose items name themselves: member `s`'s item `i` is `(s, i)`.
fn members(sizes: &[usize]) -> Vec<VecDataset<(u32, u32)>> {
    sizes
        .iter()
        .enumerate()
        .map(|(s, &n)| VecDataset::new((0..n as u32).map(|i| (s as u32, i)).collect()))
        .collect()
}

fn items(m: &Mixture<VecDataset<(u32, u32)>>) -> Vec<(u32, u32)> {
    (0..m.len()).map(|p| m.get(p).unwrap()).collect()
}

/// Draws per member in `items`, and whether each pass over a member is a permutation.
fn check_passes(items: &[(u32, u32)], sizes: &[usize]) -> Result<BTreeMap<u32, u64>, String> {
    let mut draws: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &(s, i) in items {
        draws.entry(s).or_default().push(i);
    }
    for (s, seen) in &draws {
        let n = sizes[*s as usize];
        for (pass, chunk) in seen.chunks(n).enumerate() {
            let distinct: BTreeSet<_> = chunk.iter().collect();
            if distinct.len() != chunk.len() || chunk.iter().any(|&i| i as usize >= n) {
                return Err(format!(
                    "member {s} pass {pass} repeats or overruns: {chunk:?}"
                ));
            }
        }
    }
    Ok(draws
        .into_iter()
        .map(|(s, v)| (s, v.len() as u64))
        .collect())
}

fn sizes_and_weights() -> impl Strategy<Value = (Vec<usize>, Vec<f64>)> {
    proptest::collection::vec((1usize..120, 0u32..8), 1..5).prop_filter_map(
        "a member with weight",
        |v| {
            let sizes: Vec<usize> = v.iter().map(|x| x.0).collect();
            let weights: Vec<f64> = v.iter().map(|x| f64::from(x.1)).collect();
            weights.iter().any(|&w| w > 0.0).then_some((sizes, weights))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn stopping_strategies_are_hugging_faces(
        (sizes, weights) in sizes_and_weights(),
        samples in 0u64..600,
        epoch in 0u64..3,
        shuffle in any::<bool>(),
    ) {
        let weighted: Vec<usize> = (0..sizes.len()).filter(|&s| weights[s] > 0.0).collect();
        let make = |stop| {
            let m = Mixture::new(members(&sizes), &weights, stop).unwrap().shuffle_members(shuffle);
            m.set_epoch(epoch);
            m
        };
        // One schedule for every stop rule: a longer epoch extends a shorter one.
        let long = make(Stop::Samples(samples.max(20_000)));
        let all = items(&long);

        let first = make(Stop::FirstExhausted);
        let got = items(&first);
        prop_assert_eq!(&got[..], &all[..first.len()]);
        let draws = check_passes(&got, &sizes).map_err(TestCaseError::fail)?;
        // No member past its size, and the next draw is from one that has nothing left.
        for &s in &weighted {
            prop_assert!(draws.get(&(s as u32)).copied().unwrap_or(0) <= sizes[s] as u64);
        }
        let (next, _) = all[first.len()];
        prop_assert_eq!(draws.get(&next).copied().unwrap_or(0), sizes[next as usize] as u64);
        prop_assert_eq!(first.draws().iter().sum::<u64>(), first.len() as u64);
        for (s, d) in first.draws().iter().enumerate() {
            prop_assert_eq!(*d, draws.get(&(s as u32)).copied().unwrap_or(0));
            prop_assert_eq!(first.unused()[s], sizes[s] as u64 - d);
        }

        let every = make(Stop::AllExhausted);
        let got = items(&every);
        prop_assert_eq!(&got[..], &all[..every.len()]);
        let draws = check_passes(&got, &sizes).map_err(TestCaseError::fail)?;
        for &s in &weighted {
            prop_assert!(draws[&(s as u32)] >= sizes[s] as u64, "member {} not exhausted", s);
        }
        // The last position completes some member's first pass.
        let (last, _) = got[got.len() - 1];
        prop_assert_eq!(draws[&last], sizes[last as usize] as u64);
        for (s, r) in every.repeated().iter().enumerate() {
            prop_assert_eq!(*r, draws.get(&(s as u32)).copied().unwrap_or(0).saturating_sub(sizes[s] as u64));
        }

        let fixed = make(Stop::Samples(samples));
        prop_assert_eq!(fixed.len() as u64, samples);
        prop_assert_eq!(&items(&fixed)[..], &all[..samples as usize]);
        check_passes(&all, &sizes).map_err(TestCaseError::fail)?;

        // Proportions: every whole block holds each member's share, within one block's
        // rounding (1/1024 or finer).
        let total: f64 = weights.iter().sum();
        let block = long.block() as usize;
        for (s, &c) in long.block_counts().iter().enumerate() {
            prop_assert!((c as f64 / block as f64 - weights[s] / total).abs() < 1.0 / block as f64);
            let in_first_block = all[..block.min(all.len())].iter().filter(|x| x.0 == s as u32).count();
            if all.len() >= block {
                prop_assert_eq!(in_first_block as u64, c);
            }
        }
    }
}

#[test]
fn member_orders_follow_the_epoch_and_the_seed() {
    let m = Mixture::new(members(&[50, 50]), &[1.0, 1.0], Stop::AllExhausted).unwrap();
    let order = |m: &Mixture<_>, e| {
        m.set_epoch(e);
        items(m)
    };
    let (e0, e1) = (order(&m, 0), order(&m, 1));
    assert_ne!(e0, e1);
    assert_eq!(
        order(&m, 0),
        e0,
        "an epoch's order is a pure function of it"
    );
    let seeded = m.clone().seed(9);
    assert_ne!(order(&seeded, 0), e0);
    // The schedule (which member each position reads) does not change with the epoch.
    let members_of = |v: &[(u32, u32)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(members_of(&e0), members_of(&e1));
    // In index order, a pass reads the member front to back.
    let plain = m.clone().shuffle_members(false);
    let a: Vec<u32> = order(&plain, 3)
        .iter()
        .filter(|x| x.0 == 0)
        .map(|x| x.1)
        .collect();
    assert_eq!(a, (0..50).collect::<Vec<_>>());
}

#[test]
fn arguments_are_checked() {
    let err = |sizes: &[usize], w: &[f64]| {
        Mixture::new(members(sizes), w, Stop::FirstExhausted)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[3, 3], &[1.0]).contains("1 weights for 2 members"));
    assert!(err(&[3], &[-1.0]).contains("not negative"));
    assert!(err(&[3], &[f64::NAN]).contains("finite"));
    assert!(err(&[3, 3], &[0.0, 0.0]).contains("no member has weight"));
    assert!(err(&[0, 3], &[1.0, 1.0]).contains("member 0 is empty"));
    assert!(err(&[3, 3], &[1.0, 1e-9]).contains("too small"));
    let none: Vec<VecDataset<(u32, u32)>> = Vec::new();
    assert!(matches!(
        Mixture::new(none, &[], Stop::AllExhausted),
        Err(DataError::InvalidArgument { .. })
    ));
    // An empty member without weight is fine: it is never drawn.
    let m = Mixture::new(members(&[0, 3]), &[0.0, 1.0], Stop::AllExhausted).unwrap();
    assert_eq!(m.len(), 3);
    assert!(m.get(3).is_err());
}
