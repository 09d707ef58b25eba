//! `ShardedDataset` through the loader's own API only (`set_epoch`, `len`, `state_dict`,
//! `load_state_dict`), property-tested over shard counts, ranks, workers, batch sizes,
//! `drop_last` and resume points: an epoch delivers every sample exactly once (plus the planned
//! padding) in `len()` batches per rank; a checkpoint taken after `k` batches, through JSON,
//! resumes in a new loader of the same layout with exactly the uninterrupted run's remaining
//! batches, and in loaders of another worker count with every sample not yet delivered exactly
//! once.

mod support;

use std::collections::BTreeSet;

use longshore_shards::dataset::ShardedDataset;
use proptest::prelude::*;
use support::data::{
    Read, Seen, checkpoint_after, delivered, epoch_of_ranks, pattern, rank_loader, ranks_of,
    resume_ranks, take_batches, write_shards,
};

#[derive(Debug, Clone)]
struct Case {
    counts: Vec<u64>,
    world: usize,
    workers: usize,
    workers2: usize,
    batch_size: usize,
    drop_last: bool,
    seed: u64,
    shuffle_block: u64,
    epoch: u64,
    cut: f64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0u64..12, 1..6)
            .prop_filter("some samples", |c| c.iter().sum::<u64>() > 0),
        1usize..3,
        0usize..4,
        0usize..4,
        1usize..6,
        any::<bool>(),
        any::<u64>(),
        prop_oneof![Just(0u64), Just(5), Just(u64::MAX)],
        0u64..3,
        0.0f64..1.0,
    )
        .prop_map(
            |(
                counts,
                world,
                workers,
                workers2,
                batch_size,
                drop_last,
                seed,
                shuffle_block,
                epoch,
                cut,
            )| Case {
                counts,
                world,
                workers,
                workers2,
                batch_size,
                drop_last,
                seed,
                shuffle_block,
                epoch,
                cut,
            },
        )
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &c.counts);
    let total: u64 = c.counts.iter().sum();
    let url = pattern(&dir.path().display().to_string(), c.counts.len());
    let ranks = |world| {
        ranks_of(world, || {
            ShardedDataset::webdataset([url.clone()])
                .seed(c.seed)
                .shuffle_block(c.shuffle_block)
                .cache_dir(dir.path().join("cache"))
        })
    };
    let read = Read::new(c.batch_size, c.workers)
        .drop_last(c.drop_last)
        .epoch(c.epoch);

    // The uninterrupted epoch, per rank.
    let datasets = ranks(c.world);
    let full = epoch_of_ranks(&datasets, read);
    let n = full[0].len();
    let plan = datasets[0].plan(c.epoch).unwrap();
    let all: Vec<Seen> = full.iter().flatten().flatten().copied().collect();
    prop_assert!(
        all.iter().all(|s| s.val == s.global),
        "the samples read are the planned"
    );
    let real: Vec<u64> = all.iter().filter(|s| !s.pad).map(|s| s.global).collect();
    let distinct: BTreeSet<u64> = real.iter().copied().collect();
    prop_assert_eq!(distinct.len(), real.len(), "no sample twice");
    prop_assert_eq!(real.len() as u64, total - plan.dropped());
    prop_assert_eq!(all.iter().filter(|s| s.pad).count() as u64, plan.padding());
    if !c.drop_last {
        prop_assert_eq!(distinct, (0..total).collect::<BTreeSet<_>>());
    }

    if n == 0 {
        // An epoch without a batch (drop_last of too few samples) has no middle.
        return Ok(());
    }
    // Interrupted after k batches: every rank's checkpoint is the same.
    let k = ((n as f64) * c.cut) as usize;
    let state = checkpoint_after(&ranks(c.world), read, &full, k);
    prop_assert_eq!(state.done_prefix, k as u64);

    // The same layout: exactly the rest of the uninterrupted run, from the position.
    for (rank, ds) in ranks(c.world).iter().enumerate() {
        let loader = rank_loader(ds, read.epoch(0));
        loader.load_state_dict(&state).unwrap();
        prop_assert_eq!(loader.len(), Some(n));
        let rest = delivered(take_batches(&loader, None));
        prop_assert_eq!(&rest[..], &full[rank][k..], "rank {}'s rest", rank);
        prop_assert_eq!(
            loader.stats().replayed_batches,
            0,
            "resumed from the position"
        );
    }

    // Another worker count: every sample not yet delivered, exactly once.
    let mut seen: Vec<Seen> = full
        .iter()
        .flat_map(|f| f[..k].iter().flatten().copied())
        .collect();
    let rest = resume_ranks(&ranks(c.world), read.workers(c.workers2), &state);
    seen.extend(rest.into_iter().flatten().flatten());
    let real: Vec<u64> = seen.iter().filter(|s| !s.pad).map(|s| s.global).collect();
    let distinct: BTreeSet<u64> = real.iter().copied().collect();
    prop_assert_eq!(
        distinct.len(),
        real.len(),
        "no sample twice across the resume"
    );
    if !c.drop_last {
        prop_assert_eq!(distinct, (0..total).collect::<BTreeSet<_>>());
    } else {
        // Only what drop_last leaves out (at most a batch per rank, per segment) is missing.
        let missing = total - real.len() as u64;
        prop_assert!(
            missing < 2 * (c.world * c.batch_size) as u64,
            "{} missing",
            missing
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn epochs_and_resume_through_the_loader(c in case()) {
        run(&c)?;
    }
}

/// With persistent workers, the next epoch's first batches are started while an epoch drains
/// (the dataset lays that epoch out first, its workers read it by `WorkerInfo::epoch`): every
/// epoch, and one `set_epoch` chose instead of the predicted, yields what a loader without it
/// yields.
#[test]
fn the_next_epoch_started_ahead_is_that_epochs_data() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &[7, 0, 12, 5, 9]);
    let ds = ShardedDataset::webdataset([pattern(&dir.path().display().to_string(), 5)])
        .seed(4)
        .shuffle_block(6)
        .rank(0)
        .world_size(1)
        .cache_dir(dir.path().join("cache"))
        .build()
        .unwrap();
    let make = |ahead: bool| {
        longshore_loader::DataLoader::iterable(
            ds.clone()
                .decode_with(|s| Ok((s.id.global as i64, s.seed as i64))),
        )
        .batch_size(3)
        .num_workers(2)
        .persistent_workers(true)
        .prefetch_next_epoch(ahead)
        .build()
        .unwrap()
    };
    let (ahead, plain) = (make(true), make(false));
    let epoch = |l: &longshore_loader::IterableLoader<_>| -> Vec<Vec<i64>> {
        l.iter()
            .map(|b| {
                let b = b.unwrap();
                [b.tensor::<i64>(0).unwrap(), b.tensor::<i64>(1).unwrap()].concat()
            })
            .collect()
    };
    for e in 0..3 {
        assert_eq!(epoch(&ahead), epoch(&plain), "epoch {e}");
    }
    assert!(ahead.stats().speculative_batches > 0);
    ahead.set_epoch(9);
    plain.set_epoch(9);
    assert_eq!(epoch(&ahead), epoch(&plain), "epoch 9");
    assert!(ahead.stats().speculative_discarded > 0);
}

/// A loader's checkpoint names its own epoch's plan, whatever else was begun on the dataset
/// since: a resumed loader's state, after another loader over the same dataset began the
/// same epoch afresh, is the uninterrupted run's.
#[test]
fn a_checkpoint_is_of_the_loaders_own_epoch_plan() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &[9, 4, 13, 7]);
    let ds = ShardedDataset::webdataset([pattern(&dir.path().display().to_string(), 4)])
        .seed(2)
        .shuffle_block(5)
        .rank(0)
        .world_size(1)
        .cache_dir(dir.path().join("cache"))
        .build()
        .unwrap();
    let read = Read::new(3, 2).epoch(1);
    let whole = rank_loader(&ds, read);
    let full = delivered(take_batches(&whole, Some(5)));
    let at5 = whole.state_dict().unwrap();
    let first = rank_loader(&ds, read);
    let taken = delivered(take_batches(&first, Some(2)));
    assert_eq!(taken[..], full[..2]);
    let at2 = first.state_dict().unwrap();
    let resumed = rank_loader(&ds, read.epoch(0));
    resumed.load_state_dict(&at2).unwrap();
    let mut it = resumed.iter();
    let next: Vec<_> = it.by_ref().take(3).map(Result::unwrap).collect();
    assert_eq!(next.len(), 3);
    // Another loader begins epoch 1 afresh, with the same layout.
    let other = rank_loader(&ds, read);
    assert_eq!(delivered(take_batches(&other, Some(1)))[..], full[..1]);
    // The resumed loader still stands where the uninterrupted run stood after 5 batches.
    let at = resumed.state_dict().unwrap();
    assert_eq!(at.done_prefix, 5);
    assert_eq!(at.stream.unwrap().position, at5.stream.unwrap().position);
}
