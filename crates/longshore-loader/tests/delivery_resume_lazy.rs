//! proptest: batches are pulled from the sampler as they are dealt (not materialised at the
//! start of an epoch); a restored state with any set of delivered positions (a prefix and
//! scattered ones, as out-of-order delivery leaves) yields exactly the batches not delivered,
//! in sampler order, with any number of workers.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Probe, ids};
use longshore_data::{BatchIter, BatchSampler, BatchSampling, RandomSampler, SequentialSampler};
use longshore_loader::{DataLoader, LoaderState};
use proptest::prelude::*;

fn loader(
    len: usize,
    batch_size: usize,
    workers: usize,
    in_order: bool,
    shuffle: bool,
) -> longshore_loader::StackLoader<Probe> {
    DataLoader::builder(Probe::new(len))
        .batch_size(batch_size)
        .num_workers(workers)
        .in_order(in_order)
        .shuffle(shuffle)
        .seed(99)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn restored_scattered_progress_yields_the_rest_in_order(
        len in 1usize..200,
        batch_size in 1usize..9,
        workers in 0usize..4,
        shuffle in any::<bool>(),
        epoch in 0u64..3,
        prefix_frac in 0.0f64..1.0,
        extra_mask in any::<u64>(),
    ) {
        let full: Vec<Vec<usize>> = {
            let l = loader(len, batch_size, 0, true, shuffle);
            l.set_epoch(epoch);
            l.iter().map(|b| ids(&b.unwrap())).collect()
        };
        let n = full.len() as u64;
        let prefix = ((n as f64) * prefix_frac) as u64;
        let extra: Vec<u64> = (prefix..n).filter(|s| extra_mask >> (s % 64) & 1 == 1).collect();
        let done: BTreeSet<u64> = (0..prefix).chain(extra.iter().copied()).collect();
        let state = LoaderState {
            version: 1,
            epoch,
            seed: 99,
            dataset_len: len,
            num_batches: n,
            done_prefix: prefix,
            done_extra: extra,
            stream: None,
            num_replicas: None,
            batch_size: None,
            share_offset: 0,
        };
        let resumed = loader(len, batch_size, workers, true, shuffle);
        resumed.load_state_dict(&state).unwrap();
        let got: Vec<Vec<usize>> = resumed.iter().map(|b| ids(&b.unwrap())).collect();
        let expect: Vec<Vec<usize>> = full
            .iter()
            .enumerate()
            .filter(|(i, _)| !done.contains(&(*i as u64)))
            .map(|(_, b)| b.clone())
            .collect();
        prop_assert_eq!(&got, &expect);
        // Out of order: the same batches, in any order.
        let ooo = loader(len, batch_size, workers.max(1), false, shuffle);
        ooo.load_state_dict(&state).unwrap();
        let got: BTreeSet<Vec<usize>> = ooo.iter().map(|b| ids(&b.unwrap())).collect();
        prop_assert_eq!(got, expect.into_iter().collect::<BTreeSet<_>>());
        prop_assert_eq!(ooo.stats().pool.bytes_in_use, 0);
    }

    #[test]
    fn owned_batch_iterators_match_borrowed_ones(
        len in 1usize..300,
        batch_size in 1usize..40,
        drop_last in any::<bool>(),
        seed in any::<u64>(),
        epoch in 0u64..4,
        done in 0usize..30,
    ) {
        let mut r = BatchSampler::new(RandomSampler::new(len, seed).unwrap(), batch_size, drop_last).unwrap();
        r.set_epoch(epoch);
        let mut s = BatchSampler::new(SequentialSampler::new(len), batch_size, drop_last).unwrap();
        s.set_epoch(epoch);
        let boxed: Box<dyn BatchSampling> = Box::new(r.clone());
        for b in [&r as &dyn BatchSampling, &s, &boxed] {
            let owned = b.iter_owned_from(done);
            prop_assert_eq!(owned.collect::<Vec<_>>(), b.iter_from(done).collect::<Vec<_>>());
        }
        // The owned iterator keeps its epoch when the sampler moves on.
        let owned = r.iter_owned_from(0);
        let before: Vec<Vec<usize>> = r.iter().collect();
        r.set_epoch(epoch + 1);
        prop_assert_eq!(owned.collect::<Vec<_>>(), before);
    }
}

/// A batch sampler of `0..len` in batches of `batch_size` that counts the batches its owned
/// iterators yielded.
#[derive(Debug)]
struct Counting {
    inner: BatchSampler<SequentialSampler>,
    pulled: Arc<AtomicUsize>,
}

impl BatchSampling for Counting {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }
    fn drop_last(&self) -> bool {
        false
    }
    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.inner.set_epoch(epoch);
    }
    fn iter(&self) -> BatchIter<'_> {
        self.inner.iter()
    }
    fn iter_from(&self, done: usize) -> BatchIter<'_> {
        self.inner.iter_from(done)
    }
    fn iter_owned_from(&self, done: usize) -> BatchIter<'static> {
        let pulled = self.pulled.clone();
        Box::new(self.inner.iter_owned_from(done).inspect(move |_| {
            pulled.fetch_add(1, Ordering::SeqCst);
        }))
    }
}

/// An epoch's batches are drawn from the sampler as they are dealt: when the first batch
/// arrives, at most the in-flight bound has been drawn, not the whole epoch; the whole epoch
/// is still delivered in order.
#[test]
fn batches_are_pulled_as_they_are_dealt() {
    for workers in [0usize, 1, 3] {
        let pulled = Arc::new(AtomicUsize::new(0));
        let sampler = Counting {
            inner: BatchSampler::new(SequentialSampler::new(5_000), 10, false).unwrap(),
            pulled: pulled.clone(),
        };
        let mut b = DataLoader::builder(Probe::new(5_000))
            .batch_sampler(sampler)
            .num_workers(workers);
        if workers > 0 {
            b = b.prefetch_factor(2);
        }
        let l = b.build().unwrap();
        let mut it = l.iter();
        assert_eq!(
            pulled.load(Ordering::SeqCst),
            0,
            "nothing drawn before the first next()"
        );
        let first = ids(&it.next().unwrap().unwrap());
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        let bound = (workers * 2).max(1);
        assert!(
            pulled.load(Ordering::SeqCst) <= bound,
            "{} batches drawn for the first with {workers} workers",
            pulled.load(Ordering::SeqCst)
        );
        let rest: Vec<Vec<usize>> = it.map(|b| ids(&b.unwrap())).collect();
        assert_eq!(rest.len(), 499);
        assert_eq!(rest[498], (4990..5000).collect::<Vec<_>>());
        assert_eq!(pulled.load(Ordering::SeqCst), 500);
    }
}

/// A large shuffled dataset's next epoch order is drawn in the background while an epoch
/// runs: consecutive epochs, a jump with `set_epoch`, a restore with another seed and an
/// epoch abandoned half-way still yield exactly the sampler's order for (seed, epoch).
#[test]
fn background_drawn_orders_equal_the_samplers() {
    let len = 70_000;
    let reference = |seed: u64, epoch: u64| -> Vec<Vec<usize>> {
        let mut s =
            BatchSampler::new(RandomSampler::new(len, seed).unwrap(), 5_000, false).unwrap();
        s.set_epoch(epoch);
        s.iter().collect()
    };
    for workers in [0usize, 2] {
        let l = DataLoader::builder(Probe::new(len))
            .batch_size(5_000)
            .shuffle(true)
            .num_workers(workers)
            .seed(3)
            .build()
            .unwrap();
        let epoch = |l: &longshore_loader::StackLoader<Probe>| -> Vec<Vec<usize>> {
            l.iter().map(|b| ids(&b.unwrap())).collect()
        };
        assert_eq!(epoch(&l), reference(3, 0));
        assert_eq!(epoch(&l), reference(3, 1));
        // Abandon epoch 2 after one batch; epoch 3 is still right.
        {
            let mut it = l.iter();
            assert_eq!(ids(&it.next().unwrap().unwrap()), reference(3, 2)[0]);
        }
        assert_eq!(epoch(&l), reference(3, 3));
        l.set_epoch(1);
        assert_eq!(epoch(&l), reference(3, 1));
        // A restore with another seed rebuilds the sampler: epoch 2 of seed 11.
        let mut state = l.state_dict().unwrap();
        state.seed = 11;
        l.load_state_dict(&state).unwrap();
        assert_eq!(state.epoch, 2);
        assert_eq!(epoch(&l), reference(11, 2));
        assert_eq!(epoch(&l), reference(11, 3));
        assert_eq!(l.stats().pool.bytes_in_use, 0);
    }
}

/// An older epoch's iterator that is still alive (abandoned by a consumer that started the next
/// epoch, or drained by another thread) does not mark batches in the newer epoch's progress: a
/// resume from the newer epoch's state would skip them.
#[test]
fn an_old_epochs_iterator_does_not_mark_the_new_epochs_progress() {
    for workers in [0, 2] {
        let l = loader(40, 4, workers, true, true);
        let mut old = l.iter();
        old.next().unwrap().unwrap();
        let mut new = l.iter(); // epoch 1 starts while epoch 0's iterator lives
        old.next().unwrap().unwrap(); // epoch 0's batch 1: must not count for epoch 1
        old.next().unwrap().unwrap();
        let s = l.state_dict().unwrap();
        assert_eq!((s.epoch, s.done_prefix), (1, 0), "workers={workers}: {s:?}");
        assert!(s.done_extra.is_empty(), "workers={workers}: {s:?}");
        new.next().unwrap().unwrap();
        let s = l.state_dict().unwrap();
        assert_eq!((s.epoch, s.done_prefix), (1, 1), "workers={workers}: {s:?}");
        drop(old);
        drop(new);
    }
}

/// A refused state (here: another batch count) changes nothing, not even the seed it carries.
#[test]
fn a_refused_state_leaves_the_loader_as_it_was() {
    let (a, b) = (loader(40, 4, 0, true, true), loader(40, 4, 0, true, true));
    let mut bad = b.state_dict().unwrap();
    bad.seed = 12345;
    bad.num_batches += 1;
    assert!(b.load_state_dict(&bad).is_err());
    let order = |l: &longshore_loader::StackLoader<Probe>| -> Vec<Vec<usize>> {
        l.iter().map(|x| ids(&x.unwrap())).collect()
    };
    assert_eq!(order(&a), order(&b));
    assert_eq!(b.state_dict().unwrap().seed, 99);
}

/// Under `to_device`, a batch counts as delivered when the device iterator hands it out, not
/// when the prefetcher takes it: a checkpoint after k batches resumes at batch k, whatever the
/// prefetch depth.
#[test]
fn to_device_counts_only_the_batches_handed_out() {
    use longshore_transfer::Device;
    for (workers, depth) in [(0, 1), (0, 3), (2, 2)] {
        let full: Vec<Vec<usize>> = {
            let l = loader(40, 4, 0, true, true);
            l.iter().map(|b| ids(&b.unwrap())).collect()
        };
        let l = loader(40, 4, workers, true, true);
        let dev = Device::cpu();
        let mut it = l.to_device(&dev, depth).unwrap();
        for _ in 0..3 {
            it.next().unwrap().unwrap().wait().unwrap();
        }
        let state = l.state_dict().unwrap();
        assert_eq!(
            (state.epoch, state.done_prefix),
            (0, 3),
            "workers={workers} depth={depth}: {state:?}"
        );
        drop(it);
        let resumed = loader(40, 4, workers, true, true);
        resumed.load_state_dict(&state).unwrap();
        let rest: Vec<Vec<usize>> = resumed.iter().map(|b| ids(&b.unwrap())).collect();
        assert_eq!(rest, full[3..].to_vec(), "workers={workers} depth={depth}");
        // A whole epoch through the device leaves the next one as the position.
        let l = loader(40, 4, workers, true, true);
        assert_eq!(l.to_device(&dev, depth).unwrap().count(), full.len());
        let s = l.state_dict().unwrap();
        assert_eq!((s.epoch, s.done_prefix), (1, 0), "{s:?}");
    }
}
