//! `count_sources`: the samples of the delivered batches counted by mixture member, equal to
//! the mixture's draws over an epoch for every worker count, order mode and sampler
//! (shuffled, distributed ranks), across epochs with persistent workers (batches of the next
//! epoch started ahead), with skipped samples, after `reset_stats`, and refused for an
//! iterable dataset.

use longshore_data::dataset::mixture::{Mixture, Stop};
use longshore_data::{
    DataError, Dataset, DistributedSampler, ItemIter, IterableDataset, VecDataset, WorkerInfo,
};
use longshore_loader::{DataLoader, SampleErrorPolicy};

fn mixture(stop: Stop) -> Mixture<VecDataset<u32>> {
    let members = (0..3u32)
        .map(|m| {
            VecDataset::new(
                (0..[60u32, 25, 10][m as usize])
                    .map(|i| m * 1000 + i)
                    .collect(),
            )
        })
        .collect();
    Mixture::new(members, &[5.0, 3.0, 2.0], stop).unwrap()
}

/// Each delivered sample's member, counted from the values (member m's are m*1000..).
fn by_value(values: impl IntoIterator<Item = u32>) -> Vec<u64> {
    let mut n = vec![0u64; 3];
    for v in values {
        n[(v / 1000) as usize] += 1;
    }
    n
}

#[test]
fn counts_equal_the_draws_for_every_worker_count_and_order() {
    for stop in [Stop::FirstExhausted, Stop::AllExhausted, Stop::Samples(77)] {
        for workers in [0usize, 1, 3] {
            for in_order in [true, false] {
                let mix = mixture(stop);
                let draws = mix.draws();
                let member = mix.member_of();
                let mut b = DataLoader::builder(mix)
                    .batch_size(7)
                    .shuffle(true)
                    .seed(5)
                    .num_workers(workers)
                    .count_sources(3, move |p| member.member(p));
                if workers > 0 {
                    b = b.in_order(in_order).persistent_workers(true);
                }
                let loader = b.build().unwrap();
                assert_eq!(
                    loader.stats().sources,
                    [0, 0, 0],
                    "zero before the first batch"
                );
                for epoch in 1..=2u64 {
                    let mut values = Vec::new();
                    for batch in loader.iter() {
                        values.extend_from_slice(batch.unwrap().tensor::<u32>(0).unwrap());
                    }
                    let want: Vec<u64> = draws.iter().map(|d| d * epoch).collect();
                    assert_eq!(by_value(values), draws, "{stop:?} {workers} workers");
                    assert_eq!(
                        loader.stats().sources,
                        want,
                        "{stop:?}, {workers} workers, in order {in_order}, epoch {epoch}"
                    );
                }
                loader.reset_stats();
                assert_eq!(loader.stats().sources, [0, 0, 0]);
            }
        }
    }
}

#[test]
fn each_rank_counts_its_own_share() {
    let mut total = vec![0u64; 3];
    for rank in 0..3 {
        let mix = mixture(Stop::FirstExhausted);
        let member = mix.member_of();
        let sampler = DistributedSampler::builder(mix.len(), 3, rank)
            .shuffle(true)
            .build()
            .unwrap();
        let loader = DataLoader::builder(mix)
            .batch_size(4)
            .sampler(sampler)
            .num_workers(2)
            .count_sources(3, move |p| member.member(p))
            .build()
            .unwrap();
        let mut values = Vec::new();
        for batch in loader.iter() {
            values.extend_from_slice(batch.unwrap().tensor::<u32>(0).unwrap());
        }
        let sources = loader.stats().sources;
        assert_eq!(sources, by_value(values), "rank {rank}");
        for (t, s) in total.iter_mut().zip(sources) {
            *t += s;
        }
    }
    // DistributedSampler pads the ranks to equal shares: at most world_size - 1 repeats.
    let draws = mixture(Stop::FirstExhausted).draws();
    let (t, d): (u64, u64) = (total.iter().sum(), draws.iter().sum());
    assert!(t >= d && t < d + 3, "{total:?} vs {draws:?}");
}

/// Values from 0..n; the multiples of 9 fail.
struct Flaky(usize);

impl Dataset for Flaky {
    type Item = u32;
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, index: usize) -> Result<u32, DataError> {
        if index.is_multiple_of(9) {
            Err(DataError::Other(format!("sample {index} is damaged")))
        } else {
            Ok(index as u32)
        }
    }
}

#[test]
fn skipped_samples_stay_counted_in_their_source() {
    let loader = DataLoader::builder(Flaky(40))
        .batch_size(8)
        .num_workers(2)
        .on_sample_error(SampleErrorPolicy::Skip)
        .count_sources(2, |i| Some(i % 2))
        .build()
        .unwrap();
    let n: usize = loader.iter().map(|b| b.unwrap().batch_size()).sum();
    let stats = loader.stats();
    assert_eq!((n as u64, stats.skipped_samples), (35, 5));
    assert_eq!(
        stats.sources,
        [20, 20],
        "every delivered position is counted"
    );
}

struct Stream;

impl IterableDataset for Stream {
    type Item = u32;
    fn iter(&self, _: WorkerInfo) -> ItemIter<'_, u32> {
        Box::new((0..4).map(Ok))
    }
}

#[test]
fn an_iterable_dataset_refuses_it() {
    let err = DataLoader::iterable(Stream)
        .count_sources(1, |_| Some(0))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("count_sources"), "{err}");
}
