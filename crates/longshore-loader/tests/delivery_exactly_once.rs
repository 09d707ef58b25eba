//! proptest: every index is delivered exactly once per epoch for any (len, batch_size,
//! drop_last, num_workers, prefetch_factor, in_order, shuffle) under worker timing jitter,
//! in sampler order when `in_order`; and resuming from any point yields exactly the rest.

mod common;

use std::collections::BTreeSet;

use common::{Probe, ids};
use longshore_loader::{DataLoader, LoaderState};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Opts {
    len: usize,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch: usize,
    in_order: bool,
    shuffle: bool,
    jitter_us: u64,
}

fn opts() -> impl Strategy<Value = Opts> {
    (
        0usize..120,
        1usize..17,
        any::<bool>(),
        0usize..5,
        1usize..4,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0u64), Just(300u64)],
    )
        .prop_map(
            |(len, batch_size, drop_last, num_workers, prefetch, in_order, shuffle, jitter_us)| {
                Opts {
                    len,
                    batch_size,
                    drop_last,
                    num_workers,
                    prefetch,
                    in_order,
                    shuffle,
                    jitter_us,
                }
            },
        )
}

fn build(
    o: &Opts,
) -> DataLoader<
    longshore_loader::MapFetch<Probe, longshore_data::FetchCollate<longshore_data::StackCollate>>,
> {
    let mut p = Probe::new(o.len);
    p.jitter_us = o.jitter_us;
    let mut b = DataLoader::builder(p)
        .batch_size(o.batch_size)
        .drop_last(o.drop_last)
        .num_workers(o.num_workers)
        .in_order(o.in_order)
        .shuffle(o.shuffle)
        .seed(1234);
    if o.num_workers > 0 {
        b = b.prefetch_factor(o.prefetch);
    }
    b.build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_index_exactly_once(o in opts()) {
        if o.len == 0 && o.shuffle {
            // PyTorch's RandomSampler refuses an empty dataset too.
            let e = DataLoader::builder(Probe::new(0)).shuffle(true).build().unwrap_err();
            prop_assert!(e.to_string().contains("empty"), "{}", e);
            return Ok(());
        }
        let loader = build(&o);
        // The reference order: the same loader options without workers.
        let reference: Vec<Vec<usize>> = {
            let mut r = o.clone();
            r.num_workers = 0;
            r.jitter_us = 0;
            build(&r).iter().map(|b| ids(&b.unwrap())).collect()
        };
        let batches: Vec<Vec<usize>> = loader.iter().map(|b| ids(&b.unwrap())).collect();
        let expect_batches = if o.drop_last { o.len / o.batch_size } else { o.len.div_ceil(o.batch_size) };
        prop_assert_eq!(batches.len(), expect_batches);
        let mut all: Vec<usize> = batches.iter().flatten().copied().collect();
        let n = all.len();
        all.sort();
        all.dedup();
        prop_assert_eq!(all.len(), n, "an index was delivered twice");
        let expect_n = if o.drop_last { expect_batches * o.batch_size } else { o.len };
        prop_assert_eq!(n, expect_n);
        if o.in_order {
            prop_assert_eq!(&batches, &reference);
        } else {
            let a: BTreeSet<Vec<usize>> = batches.into_iter().collect();
            let b: BTreeSet<Vec<usize>> = reference.into_iter().collect();
            prop_assert_eq!(a, b);
        }
        let s = loader.stats();
        prop_assert_eq!(s.pool.bytes_in_use, 0, "leases not returned: {:?}", s.pool);
        prop_assert_eq!(s.batches as usize, expect_batches);
    }

    #[test]
    fn resume_yields_exactly_the_remaining_batches(o in opts(), stop_frac in 0.0f64..1.0, epoch in 0u64..3) {
        prop_assume!(!(o.len == 0 && o.shuffle));
        let full: Vec<Vec<usize>> = {
            let l = build(&o);
            l.set_epoch(epoch);
            l.iter().map(|b| ids(&b.unwrap())).collect()
        };
        let stop = ((full.len() as f64) * stop_frac) as usize;
        let first = build(&o);
        first.set_epoch(epoch);
        let mut seen = Vec::new();
        let state: LoaderState = {
            let mut it = first.iter();
            for _ in 0..stop {
                seen.push(ids(&it.next().unwrap().unwrap()));
            }
            first.state_dict().unwrap()
        };
        // Through serde, as a checkpoint would.
        let json = serde_json::to_string(&state).unwrap();
        let state: LoaderState = serde_json::from_str(&json).unwrap();
        let resumed = build(&o);
        resumed.load_state_dict(&state).unwrap();
        let rest: Vec<Vec<usize>> = resumed.iter().map(|b| ids(&b.unwrap())).collect();
        let mut got: Vec<Vec<usize>> = seen.clone();
        got.extend(rest.iter().cloned());
        if o.in_order {
            prop_assert_eq!(&got, &full);
        } else {
            let a: BTreeSet<Vec<usize>> = got.iter().cloned().collect();
            let b: BTreeSet<Vec<usize>> = full.iter().cloned().collect();
            prop_assert_eq!(got.len(), full.len());
            prop_assert_eq!(a, b);
        }
        // After the resumed epoch the state points at the next one (an empty epoch is
        // complete as soon as it starts).
        let expect_state_epoch = if full.is_empty() { epoch + 1 } else { epoch };
        prop_assert_eq!(state.epoch, expect_state_epoch);
        prop_assert_eq!(resumed.state_dict().unwrap().epoch, state.epoch + 1);
    }
}

#[test]
fn epochs_reshuffle_and_set_epoch_reproduces() {
    let o = Opts {
        len: 50,
        batch_size: 5,
        drop_last: false,
        num_workers: 2,
        prefetch: 2,
        in_order: true,
        shuffle: true,
        jitter_us: 0,
    };
    let l = build(&o);
    let e0: Vec<Vec<usize>> = l.iter().map(|b| ids(&b.unwrap())).collect();
    let e1: Vec<Vec<usize>> = l.iter().map(|b| ids(&b.unwrap())).collect();
    assert_ne!(e0, e1, "a new epoch reshuffles");
    l.set_epoch(0);
    let again: Vec<Vec<usize>> = l.iter().map(|b| ids(&b.unwrap())).collect();
    assert_eq!(e0, again, "same seed and epoch reproduce the order");
    assert_eq!(l.stats().epochs, 3);
}
