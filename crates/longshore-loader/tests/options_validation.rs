//! Builder options follow PyTorch's rules; invalid combinations are clear errors.

mod common;

use common::Probe;
use longshore_data::{BatchSampler, IterableDataset, SequentialSampler, WorkerInfo};
use longshore_loader::{DataLoader, LoaderError};

fn option_of(e: LoaderError) -> &'static str {
    match e {
        LoaderError::Config { option, .. } => option,
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn batch_sampler_is_exclusive_with_batch_size_shuffle_sampler_drop_last() {
    let bs = || BatchSampler::new(SequentialSampler::new(10), 3, false).unwrap();
    for b in [
        DataLoader::builder(Probe::new(10))
            .batch_sampler(bs())
            .batch_size(4)
            .build()
            .map(|_| ()),
        DataLoader::builder(Probe::new(10))
            .batch_sampler(bs())
            .shuffle(true)
            .build()
            .map(|_| ()),
        DataLoader::builder(Probe::new(10))
            .batch_sampler(bs())
            .drop_last(true)
            .build()
            .map(|_| ()),
        DataLoader::builder(Probe::new(10))
            .batch_sampler(bs())
            .sampler(SequentialSampler::new(10))
            .build()
            .map(|_| ()),
    ] {
        let e = b.unwrap_err();
        assert!(e.to_string().contains("mutually exclusive"), "{e}");
        assert_eq!(option_of(e), "batch_sampler");
    }
    let loader = DataLoader::builder(Probe::new(10))
        .batch_sampler(bs())
        .build()
        .unwrap();
    assert_eq!(loader.len(), Some(4));
}

#[test]
fn batch_sampler_accepts_what_pytorch_accepts_and_names_each_conflict() {
    let bs = || BatchSampler::new(SequentialSampler::new(10), 3, false).unwrap();
    // PyTorch rejects only batch_size != 1, shuffle, sampler and drop_last: the explicit
    // defaults are fine, in either order.
    let loader = DataLoader::builder(Probe::new(10))
        .batch_size(1)
        .shuffle(false)
        .drop_last(false)
        .batch_sampler(bs())
        .build()
        .unwrap();
    let sizes: Vec<usize> = loader.iter().map(|b| b.unwrap().batch_size()).collect();
    assert_eq!(sizes, [3, 3, 3, 1], "the batch sampler decides the batches");
    DataLoader::builder(Probe::new(10))
        .batch_sampler(bs())
        .batch_size(1)
        .build()
        .unwrap();
    // Every conflicting option is named, with its value.
    let e = DataLoader::builder(Probe::new(10))
        .batch_size(4)
        .drop_last(true)
        .shuffle(true)
        .sampler(SequentialSampler::new(10))
        .batch_sampler(bs())
        .build()
        .unwrap_err();
    let msg = e.to_string();
    for part in [
        "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last",
        "batch_size=4",
        "shuffle=true",
        "sampler",
        "drop_last=true",
    ] {
        assert!(msg.contains(part), "{part:?} missing from {msg:?}");
    }
    let e = DataLoader::builder(Probe::new(10))
        .drop_last(true)
        .batch_sampler(bs())
        .build()
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.ends_with("(got drop_last=true)"), "{msg}");
    assert_eq!(option_of(e), "batch_sampler");
}

#[test]
fn sampler_excludes_shuffle_and_workers_options_need_workers() {
    let e = DataLoader::builder(Probe::new(10))
        .sampler(SequentialSampler::new(10))
        .shuffle(true)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "sampler");
    let e = DataLoader::builder(Probe::new(10))
        .prefetch_factor(2)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "prefetch_factor");
    let e = DataLoader::builder(Probe::new(10))
        .num_workers(2)
        .prefetch_factor(0)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "prefetch_factor");
    let e = DataLoader::builder(Probe::new(10))
        .persistent_workers(true)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "persistent_workers");
    let e = DataLoader::builder(Probe::new(10))
        .batch_size(0)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "batch_size");
    let e = DataLoader::builder(Probe::new(10))
        .timeout(std::time::Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "timeout");
    assert!(
        DataLoader::builder(Probe::new(10))
            .num_workers(2)
            .prefetch_factor(4)
            .build()
            .is_ok()
    );
}

#[test]
fn lengths_follow_batch_size_and_drop_last() {
    for (len, bs, drop_last, expect) in [
        (10, 3, false, 4),
        (10, 3, true, 3),
        (9, 3, true, 3),
        (0, 3, false, 0),
        (2, 5, true, 0),
    ] {
        let loader = DataLoader::builder(Probe::new(len))
            .batch_size(bs)
            .drop_last(drop_last)
            .build()
            .unwrap();
        assert_eq!(
            loader.len(),
            Some(expect),
            "len {len} bs {bs} drop_last {drop_last}"
        );
        assert_eq!(loader.iter().count(), expect);
    }
}

#[derive(Debug)]
struct Stream(usize);

impl IterableDataset for Stream {
    type Item = ([u32; 1],);
    fn iter(&self, worker: WorkerInfo) -> longshore_data::ItemIter<'_, ([u32; 1],)> {
        Box::new(worker.shard(self.0).map(|i| Ok(([i as u32],))))
    }
}

#[test]
fn iterable_datasets_reject_samplers_and_shuffle() {
    let e = DataLoader::iterable(Stream(10))
        .shuffle(true)
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "shuffle");
    let e = DataLoader::iterable(Stream(10))
        .sampler(SequentialSampler::new(10))
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "sampler");
    let e = DataLoader::iterable(Stream(10))
        .batch_sampler(BatchSampler::new(SequentialSampler::new(10), 2, false).unwrap())
        .build()
        .unwrap_err();
    assert_eq!(option_of(e), "batch_sampler");
}

#[test]
fn iterable_dataset_shards_across_workers_exactly_once() {
    for workers in [0, 1, 3] {
        let loader = DataLoader::iterable(Stream(101))
            .batch_size(4)
            .num_workers(workers)
            .build()
            .unwrap();
        let mut seen: Vec<u32> = Vec::new();
        for b in &loader {
            let b = b.unwrap();
            assert!(b.batch_size() <= 4);
            seen.extend_from_slice(b.tensor::<u32>(0).unwrap());
        }
        seen.sort();
        assert_eq!(seen, (0..101).collect::<Vec<u32>>(), "workers {workers}");
        // After a whole epoch the checkpoint is the next epoch's start; the stream has no
        // position of its own (a resume replays).
        let state = loader.state_dict().unwrap();
        assert_eq!(
            (state.epoch, state.done_prefix),
            (1, 0),
            "workers {workers}"
        );
        let stream = state
            .stream
            .expect("an iterable loader's state has its layout");
        assert_eq!(stream.layout.batch_size, 4);
        assert_eq!(stream.position, None);
    }
}

#[test]
fn unbatched_loader_yields_items_in_sampler_order() {
    let loader = DataLoader::builder(Probe::new(7))
        .num_workers(2)
        .build_unbatched()
        .unwrap();
    let items: Vec<u32> = loader.iter().map(|r| r.unwrap().0[0]).collect();
    assert_eq!(items, (0..7).collect::<Vec<u32>>());
    let e = DataLoader::builder(Probe::new(7))
        .batch_size(2)
        .build_unbatched()
        .unwrap_err();
    assert_eq!(option_of(e), "batch_size");
}
