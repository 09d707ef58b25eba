//! The loader drives an iterable dataset's epochs (`IterableDataset::begin_epoch` with its
//! layout, `WorkerInfo::epoch`) and checkpoints: `set_epoch` reaches the dataset and its
//! workers, `len()` is the dataset's count, and a dataset without a stream position resumes by
//! replay, yielding exactly the uninterrupted run's remaining batches (proptest over workers,
//! batch sizes, `drop_last` and the resume point).

use std::sync::Mutex;

use longshore_data::{
    DataError, EpochLayout, ItemIter, IterableDataset, StreamPosition, VecDataset, WorkerInfo,
};
use longshore_loader::{DataLoader, IterableLoader, LoaderError, LoaderState};
use proptest::prelude::*;

/// A stream that is a function of (epoch, worker, workers) alone, and records what the loader
/// told it.
#[derive(Debug, Default)]
struct Numbers {
    len: u64,
    begun: Mutex<Vec<EpochLayout>>,
    opened: Mutex<Vec<(u64, usize, usize)>>,
}

impl Numbers {
    fn new(len: u64) -> Numbers {
        Numbers {
            len,
            ..Numbers::default()
        }
    }
}

impl IterableDataset for Numbers {
    type Item = ([u64; 2],);

    /// Worker `w` of `n` yields `(epoch, i)` for `i = w, w + n, ...`, the epoch's order
    /// rotated by the epoch.
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, ([u64; 2],)> {
        self.opened
            .lock()
            .unwrap()
            .push((worker.epoch, worker.id, worker.num_workers));
        let (len, epoch) = (self.len, worker.epoch);
        Box::new(
            worker
                .shard(len as usize)
                .map(move |i| Ok(([epoch, (i as u64 + epoch) % len],))),
        )
    }

    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        assert!(resume.is_none(), "no position was ever given out");
        self.begun.lock().unwrap().push(*layout);
        Ok(None)
    }
}

type Loader = IterableLoader<std::sync::Arc<Numbers>>;

fn loader(ds: &std::sync::Arc<Numbers>, batch: usize, workers: usize, drop_last: bool) -> Loader {
    DataLoader::iterable(std::sync::Arc::clone(ds))
        .batch_size(batch)
        .num_workers(workers)
        .drop_last(drop_last)
        .seed(5)
        .build()
        .unwrap()
}

fn batches(
    it: impl Iterator<Item = Result<longshore_data::Batch<longshore_host::PoolBuffer>, LoaderError>>,
) -> Vec<Vec<u64>> {
    it.map(|b| b.unwrap().tensor::<u64>(0).unwrap().to_vec())
        .collect()
}

#[test]
fn set_epoch_reaches_the_dataset_and_its_workers() {
    let ds = std::sync::Arc::new(Numbers::new(23));
    let l = loader(&ds, 4, 3, true);
    l.set_epoch(5);
    let got = batches(l.iter());
    assert!(got.iter().flatten().step_by(2).all(|&e| e == 5), "{got:?}");
    let begun = ds.begun.lock().unwrap().clone();
    assert_eq!(begun, [EpochLayout::new(5, 5, 4, true, 3)]);
    let mut opened = ds.opened.lock().unwrap().clone();
    opened.sort_unstable();
    assert_eq!(opened, [(5, 0, 3), (5, 1, 3), (5, 2, 3)]);
    // The next iteration runs epoch 6, laid out again.
    ds.opened.lock().unwrap().clear();
    let got = batches(l.iter());
    assert!(got.iter().flatten().step_by(2).all(|&e| e == 6));
    assert_eq!(ds.begun.lock().unwrap().last().unwrap().epoch, 6);
    assert!(ds.opened.lock().unwrap().iter().all(|o| o.0 == 6));
    // Without workers, one stream.
    let single = loader(&ds, 4, 0, false);
    single.set_epoch(1);
    assert_eq!(batches(single.iter()).concat().len(), 2 * 23);
    assert_eq!(ds.begun.lock().unwrap().last().unwrap().num_workers, 1);
}

/// A dataset that knows its count.
#[derive(Debug)]
struct Counted;

impl IterableDataset for Counted {
    type Item = ([u8; 1],);
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, ([u8; 1],)> {
        Box::new(worker.shard(10).map(|i| Ok(([i as u8],))))
    }
    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        _: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        if layout.epoch == 3 {
            return Err(DataError::Other("epoch 3 cannot be laid out".into()));
        }
        Ok(Some(layout.epoch + 1))
    }
}

#[test]
fn len_is_the_datasets_count_and_a_refused_epoch_is_its_first_item() {
    let l = DataLoader::iterable(Counted).batch_size(2).build().unwrap();
    assert_eq!(l.len(), Some(1));
    l.set_epoch(2);
    assert_eq!(l.len(), Some(3));
    l.set_epoch(3);
    assert_eq!(l.len(), None);
    let items: Vec<_> = l.iter().collect();
    assert_eq!(items.len(), 1);
    let e = items[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("epoch 3 cannot be laid out"), "{e}");
    // That epoch is over: a checkpoint names the next.
    assert_eq!(l.state_dict().unwrap().epoch, 4);
    // A map-style dataset's sharded stream knows its batches.
    let sharded =
        longshore_data::Sharded::new(VecDataset::new((0..10u8).map(|i| ([i],)).collect()));
    let l = DataLoader::iterable(sharded)
        .batch_size(3)
        .num_workers(3)
        .build()
        .unwrap();
    assert_eq!(l.len(), Some(l.iter().count()));
}

#[test]
fn states_of_the_other_kind_and_replays_of_another_layout_are_refused() {
    let ds = std::sync::Arc::new(Numbers::new(30));
    let l = loader(&ds, 4, 2, false);
    let mut it = l.iter();
    it.next().unwrap().unwrap();
    let state = l.state_dict().unwrap();
    drop(it);
    assert_eq!((state.epoch, state.done_prefix, state.version), (0, 1, 2));
    let map = DataLoader::builder(VecDataset::new(vec![([1u8],); 4]))
        .build()
        .unwrap();
    let e = map.load_state_dict(&state).unwrap_err().to_string();
    assert!(e.contains("iterable dataset"), "{e}");
    let e = l
        .load_state_dict(&map.state_dict().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("map-style"), "{e}");
    for (other, option) in [
        (loader(&ds, 3, 2, false), "batch_size"),
        (loader(&ds, 4, 3, false), "num_workers"),
        (loader(&ds, 4, 2, true), "drop_last"),
    ] {
        let e = other.load_state_dict(&state).unwrap_err().to_string();
        assert!(e.contains(option) && e.contains("replay"), "{e}");
    }
    let mut future = state.clone();
    future.version = 3;
    assert!(
        l.load_state_dict(&future)
            .unwrap_err()
            .to_string()
            .contains("version 3")
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Without a stream position, a restored epoch replays and discards the batches delivered
    /// before the checkpoint: the rest equals the uninterrupted run's, and state_dict after
    /// it composes.
    #[test]
    fn a_stream_without_a_position_resumes_by_replay(
        len in 1u64..60,
        batch in 1usize..7,
        workers in 0usize..4,
        drop_last in any::<bool>(),
        epoch in 0u64..3,
        cut in 0.0f64..1.0,
    ) {
        let ds = std::sync::Arc::new(Numbers::new(len));
        let whole = loader(&ds, batch, workers, drop_last);
        whole.set_epoch(epoch);
        let full = batches(whole.iter());
        let k = ((full.len() as f64) * cut) as usize;
        let first = loader(&ds, batch, workers, drop_last);
        first.set_epoch(epoch);
        let taken = batches(first.iter().take(k));
        prop_assert_eq!(&taken[..], &full[..k]);
        let state = first.state_dict().unwrap();
        prop_assert_eq!((state.epoch, state.done_prefix), (epoch, k as u64));
        prop_assert!(state.stream.as_ref().unwrap().position.is_none());
        let json = serde_json::to_string(&state).unwrap();
        let state: LoaderState = serde_json::from_str(&json).unwrap();

        let resumed = loader(&ds, batch, workers, drop_last);
        resumed.load_state_dict(&state).unwrap();
        prop_assert_eq!(resumed.state_dict().unwrap(), state.clone());
        let mut it = resumed.iter();
        let rest = batches(it.by_ref().take(full.len() - k));
        prop_assert_eq!(&rest[..], &full[k..]);
        prop_assert!(it.next().is_none());
        drop(it);
        prop_assert_eq!(resumed.stats().replayed_batches, k as u64);
        // After the resumed epoch, the next one whole.
        let after = resumed.state_dict().unwrap();
        prop_assert_eq!((after.epoch, after.done_prefix), (epoch + 1, 0));
    }
}

/// A checkpoint with nothing of its epoch delivered (taken at the epoch's start, or after a
/// whole epoch: the next one's start) needs no replay, so it loads on any layout, and the
/// resumed loader runs that epoch whole on its own layout.
#[test]
fn a_checkpoint_at_an_epochs_start_loads_on_another_layout() {
    let ds = std::sync::Arc::new(Numbers::new(23));
    let first = loader(&ds, 4, 3, false);
    let whole = batches(first.iter());
    assert!(!whole.is_empty());
    let state = first.state_dict().unwrap();
    assert_eq!((state.epoch, state.done_prefix), (1, 0), "{state:?}");
    // A replay-only dataset, another worker count: refused mid-epoch, taken here.
    let other = loader(&ds, 4, 1, false);
    other.load_state_dict(&state).unwrap();
    let resumed = batches(other.iter());
    let uninterrupted = loader(&ds, 4, 1, false);
    uninterrupted.set_epoch(1);
    assert_eq!(resumed, batches(uninterrupted.iter()));
}

/// A stream of `len` numbers that counts the items pulled from it.
struct Pulls {
    len: usize,
    pulled: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl IterableDataset for Pulls {
    type Item = (u64,);

    fn iter(&self, _worker: WorkerInfo) -> ItemIter<'_, (u64,)> {
        let pulled = self.pulled.clone();
        Box::new((0..self.len).map(move |i| {
            pulled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok((i as u64,))
        }))
    }
}

#[test]
fn without_workers_a_batch_is_loaded_only_when_asked_for() {
    // PyTorch's num_workers=0 loads in the calling process when a batch is asked for; the
    // stream's thread here pulls a batch's items only then (none ahead, none at the start).
    let pulled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ds = Pulls {
        len: 23,
        pulled: pulled.clone(),
    };
    let loader = DataLoader::iterable(ds).batch_size(4).build().unwrap();
    for epoch in 0..2 {
        let before = pulled.load(std::sync::atomic::Ordering::SeqCst);
        let mut it = loader.iter();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(pulled.load(std::sync::atomic::Ordering::SeqCst), before);
        for k in 1..=5 {
            let b = it.next().unwrap().unwrap();
            assert_eq!(b.tensor::<u64>(0).unwrap().len(), 4);
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(
                pulled.load(std::sync::atomic::Ordering::SeqCst) - before,
                4 * k,
                "epoch {epoch}: after {k} batches"
            );
        }
        let last = it.next().unwrap().unwrap();
        assert_eq!(last.tensor::<u64>(0).unwrap().to_vec(), vec![20, 21, 22]);
        assert!(it.next().is_none());
        assert_eq!(loader.stats().in_flight_limit, 1);
    }
}
