//! The global order's split over ranks and workers: complete, equal per rank, deterministic,
//! and resumable on another world size or worker count, also twice.

use std::collections::HashMap;
use std::sync::Arc;

use longshore_shards::order::{EpochOrder, EpochPlan, Layout, OrderConfig, ResumeState, Slot};
use proptest::prelude::*;

/// Every rank's batches, in delivery order.
fn deliver(plan: &EpochPlan, batches: Option<u64>) -> Vec<Vec<Vec<Slot>>> {
    (0..plan.layout().world_size())
        .map(|r| {
            let it = plan.rank(r).unwrap().batches();
            match batches {
                Some(k) => it.take(k as usize).collect(),
                None => it.collect(),
            }
        })
        .collect()
}

/// Checks what every segment must hold: equal counts per rank, slots that name the sample at
/// their position, the batch size; returns the non-padding global ids and the padding count.
fn check_segment(plan: &EpochPlan, ranks: &[Vec<Vec<Slot>>], whole: bool) -> (Vec<u64>, u64) {
    let order = plan.order();
    let b = plan.layout().batch_size();
    let first = ranks[0].iter().map(Vec::len).collect::<Vec<_>>();
    let (mut real, mut pads) = (Vec::new(), 0);
    for batches in ranks {
        // Same batch structure on every rank.
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), first);
        if whole {
            assert_eq!(batches.len() as u64, plan.remaining_batches());
        }
        for (i, batch) in batches.iter().enumerate() {
            assert!(!batch.is_empty() && batch.len() <= b);
            if order.config().drop_last || i + 1 < batches.len() {
                assert!(batch.len() == b || !order.config().drop_last);
            }
            for slot in batch {
                assert_eq!(order.at(slot.position), Some(slot.sample));
                if slot.pad {
                    pads += 1;
                } else {
                    real.push(slot.sample.global);
                }
            }
        }
    }
    (real, pads)
}

fn config() -> impl Strategy<Value = OrderConfig> {
    (
        any::<u64>(),
        any::<bool>(),
        prop_oneof![Just(0u64), 1u64..40, Just(u64::MAX)],
        any::<bool>(),
    )
        .prop_map(|(seed, shuffle, shuffle_block, drop_last)| OrderConfig {
            seed,
            shuffle,
            shuffle_block,
            drop_last,
        })
}

fn layout() -> impl Strategy<Value = Layout> {
    (1usize..=8, 1usize..=4, 1usize..=6).prop_map(|(w, n, b)| Layout::new(w, n, b).unwrap())
}

fn counts() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..25, 0..12)
}

/// Asserts the union of all segments' real slots is the epoch, each once (or at most once and
/// `dropped` missing, with `drop_last`).
fn assert_complete(order: &EpochOrder, real: &[u64], dropped: u64) {
    let mut seen: HashMap<u64, u32> = HashMap::new();
    for &g in real {
        *seen.entry(g).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "a sample delivered twice");
    assert!(seen.keys().all(|&g| g < order.len()));
    assert_eq!(order.len() - seen.len() as u64, dropped);
    if !order.config().drop_last {
        assert_eq!(dropped, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn an_epoch_is_delivered_once_equally_per_rank(
        counts in counts(), config in config(), layout in layout(), epoch in 0u64..3,
    ) {
        let order = Arc::new(EpochOrder::new(&counts, config, epoch).unwrap());
        let plan = EpochPlan::new(order.clone(), layout);
        let ranks = deliver(&plan, None);
        let (real, pads) = check_segment(&plan, &ranks, true);
        for batches in &ranks {
            let n: usize = batches.iter().map(Vec::len).sum();
            prop_assert_eq!(n as u64, plan.samples_per_rank());
        }
        prop_assert_eq!(pads, plan.padding());
        prop_assert!(pads < layout.world_size() as u64);
        prop_assert!(plan.dropped() < (layout.world_size() * layout.batch_size()) as u64 || !config.drop_last);
        assert_complete(&order, &real, plan.dropped());
        // Padding repeats samples from the start of the sequence.
        let mut padded: Vec<u64> = ranks.iter().flatten().flatten().filter(|s| s.pad).map(|s| s.position).collect();
        padded.sort_unstable();
        let mut expected: Vec<u64> = (0..pads).map(|j| j % order.len()).collect();
        expected.sort_unstable();
        prop_assert_eq!(padded, expected);
        // Deterministic: the same inputs give the same batches.
        let again = Arc::new(EpochOrder::new(&counts, config, epoch).unwrap());
        prop_assert_eq!(deliver(&EpochPlan::new(again, layout), None), ranks);
    }

    #[test]
    fn workers_read_contiguous_runs_that_make_the_rank_span(
        counts in counts(), config in config(), layout in layout(),
    ) {
        let order = Arc::new(EpochOrder::new(&counts, config, 0).unwrap());
        let plan = EpochPlan::new(order, layout);
        for r in 0..layout.world_size() {
            let rank = plan.rank(r).unwrap();
            let mut positions = Vec::new();
            for w in 0..layout.num_workers() {
                let stream = rank.worker(w).unwrap();
                let batches = stream.num_batches();
                let slots: Vec<Slot> = stream.collect();
                prop_assert_eq!(slots.len().div_ceil(layout.batch_size()) as u64, batches);
                positions.extend(slots.iter().map(|s| (s.pad, s.position)));
            }
            // Concatenated in worker order, the runs are the rank's span in order.
            let span = r as u64 * plan.samples_per_rank();
            let n = order_len(&plan);
            for (i, &(pad, p)) in positions.iter().enumerate() {
                let j = span + i as u64;
                prop_assert_eq!(pad, j >= n);
                prop_assert_eq!(p, if j >= n { (j - n) % n } else { j });
            }
        }
    }

    #[test]
    fn resuming_on_the_same_layout_continues_the_run(
        counts in counts(), config in config(), layout in layout(), frac in 0.0f64..=1.0,
    ) {
        let order = Arc::new(EpochOrder::new(&counts, config, 1).unwrap());
        let plan = EpochPlan::new(order.clone(), layout);
        let full = deliver(&plan, None);
        let k = (plan.batches_per_rank() as f64 * frac) as u64;
        let state = roundtrip(&plan.state_after(k).unwrap());
        prop_assert_eq!(state.is_finished(), k == plan.batches_per_rank());
        let resumed = EpochPlan::resume(order, &state, layout).unwrap();
        prop_assert_eq!(resumed.remaining_batches(), plan.batches_per_rank() - k);
        let rest = deliver(&resumed, None);
        for (all, tail) in full.iter().zip(&rest) {
            prop_assert_eq!(&all[k as usize..], &tail[..]);
        }
    }

    #[test]
    fn resuming_on_another_layout_delivers_exactly_the_rest(
        counts in counts(), config in config(), a in layout(), b in layout(), frac in 0.0f64..=1.0,
    ) {
        let order = Arc::new(EpochOrder::new(&counts, config, 2).unwrap());
        let plan = EpochPlan::new(order.clone(), a);
        let k = (plan.batches_per_rank() as f64 * frac) as u64;
        let first = deliver(&plan, Some(k));
        let (mut real, first_pads) = check_segment(&plan, &first, false);
        let state = roundtrip(&plan.state_after(k).unwrap());
        let resumed = EpochPlan::resume(order.clone(), &state, b).unwrap();
        let rest = deliver(&resumed, None);
        let (more, pads) = check_segment(&resumed, &rest, true);
        if b == a {
            // The same segment, continued: its padding may have been delivered already (the
            // round-robin takes a last worker's last batch before the others' later ones).
            prop_assert_eq!(first_pads + pads, resumed.padding());
        } else {
            prop_assert_eq!(pads, resumed.padding());
        }
        real.extend(more);
        assert_complete(&order, &real, resumed.dropped());
    }

    #[test]
    fn resume_composes(
        counts in counts(), config in config(),
        a in layout(), b in layout(), c in layout(),
        f1 in 0.0f64..=1.0, f2 in 0.0f64..=1.0,
    ) {
        let order = Arc::new(EpochOrder::new(&counts, config, 0).unwrap());
        let p1 = EpochPlan::new(order.clone(), a);
        let k1 = (p1.batches_per_rank() as f64 * f1) as u64;
        let (mut real, _) = check_segment(&p1, &deliver(&p1, Some(k1)), false);
        let p2 = EpochPlan::resume(order.clone(), &roundtrip(&p1.state_after(k1).unwrap()), b).unwrap();
        let k2 = (p2.remaining_batches() as f64 * f2) as u64;
        real.extend(check_segment(&p2, &deliver(&p2, Some(k2)), false).0);
        let p3 = EpochPlan::resume(order.clone(), &roundtrip(&p2.state_after(k2).unwrap()), c).unwrap();
        let rest = deliver(&p3, None);
        let (more, _) = check_segment(&p3, &rest, true);
        // Every rank reads as many samples: a new split's share, or after a same-layout
        // resume (c == b) what its batches not yet taken hold.
        let per_rank: Vec<u64> = rest
            .iter()
            .map(|batches| batches.iter().map(Vec::len).sum::<usize>() as u64)
            .collect();
        prop_assert!(per_rank.iter().all(|&n| n == per_rank[0]), "{:?}", per_rank);
        if p3.remaining_batches() == p3.batches_per_rank() {
            prop_assert_eq!(per_rank[0], p3.samples_per_rank());
        }
        real.extend(more);
        assert_complete(&order, &real, p3.dropped());
    }
}

fn roundtrip(state: &ResumeState) -> ResumeState {
    serde_json::from_str(&serde_json::to_string(state).unwrap()).unwrap()
}

/// Real samples in a fresh plan's sequence.
fn order_len(plan: &EpochPlan) -> u64 {
    plan.order().len()
}

#[test]
fn a_state_from_another_dataset_or_seed_is_refused() {
    let order = Arc::new(EpochOrder::new(&[4, 4], OrderConfig::default(), 0).unwrap());
    let layout = Layout::new(2, 1, 2).unwrap();
    let state = EpochPlan::new(order, layout).state_after(1).unwrap();
    let other = Arc::new(EpochOrder::new(&[4, 5], OrderConfig::default(), 0).unwrap());
    assert!(EpochPlan::resume(other, &state, layout).is_err());
    let seed = OrderConfig {
        seed: 1,
        ..OrderConfig::default()
    };
    let other = Arc::new(EpochOrder::new(&[4, 4], seed, 0).unwrap());
    assert!(EpochPlan::resume(other, &state, layout).is_err());
    let next_epoch = Arc::new(EpochOrder::new(&[4, 4], OrderConfig::default(), 1).unwrap());
    let err = EpochPlan::resume(next_epoch, &state, layout).unwrap_err();
    assert!(err.to_string().contains("epoch 0"), "{err}");
}

#[test]
fn too_many_batches_is_an_error() {
    let order = Arc::new(EpochOrder::new(&[4, 4], OrderConfig::default(), 0).unwrap());
    let plan = EpochPlan::new(order, Layout::new(2, 1, 2).unwrap());
    assert!(plan.state_after(2).is_ok());
    assert!(plan.state_after(3).is_err());
    assert!(plan.rank(2).is_err());
}
