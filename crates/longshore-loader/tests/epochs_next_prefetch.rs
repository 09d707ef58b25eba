//! Cross-epoch prefetch (`prefetch_next_epoch`): with persistent workers the next epoch's first
//! batches are loaded while the current epoch drains. The next epoch yields exactly what it
//! would without it (the worker generators' draws included), anything that changes the next
//! epoch discards them, nothing leaks, and the dataset really is called early.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, watchdog};
use longshore_data::{Batch, DataError, Dataset, ItemIter, IterableDataset, WorkerInfo, worker};
use longshore_host::{MemoryKind, PinnedPool, PoolBuffer, PoolConfig};
use longshore_loader::{DataLoader, Fetch, worker_seed};
use proptest::prelude::*;

/// Sample `i` is `[i, a draw from the worker's generator]`; it records the seed of the worker
/// that loaded it (which names the epoch: `worker_seed(seed, epoch, id)`), and fails for the
/// indices in `fail`.
#[derive(Debug, Default)]
struct Draws {
    len: usize,
    fail: HashSet<usize>,
    seeds: Mutex<Vec<u64>>,
}

impl Draws {
    fn new(len: usize) -> Self {
        Self {
            len,
            ..Self::default()
        }
    }
}

impl Dataset for Draws {
    type Item = ([u64; 2],);
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        let info = worker::current().expect("inside a worker");
        self.seeds.lock().unwrap().push(info.seed);
        if self.fail.contains(&index) {
            return Err(DataError::InvalidArgument {
                name: "index",
                reason: format!("sample {index} is corrupt"),
            });
        }
        let draw = worker::with_rng(|r| r.random::<u64>());
        Ok(([index as u64, draw],))
    }
}

/// One epoch's results: each batch's samples, or its error's message.
type Epoch = Vec<Result<Vec<[u64; 2]>, String>>;

fn run_epoch<F: Fetch<Output = Batch<PoolBuffer>>>(loader: &DataLoader<F>) -> Epoch {
    loader
        .iter()
        .map(|r| {
            r.map(|b| {
                b.tensor::<u64>(0)
                    .unwrap()
                    .chunks_exact(2)
                    .map(|c| [c[0], c[1]])
                    .collect()
            })
            .map_err(|e| e.to_string())
        })
        .collect()
}

fn pageable() -> PinnedPool {
    PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    len: usize,
    batch_size: usize,
    workers: usize,
    prefetch: usize,
    shuffle: bool,
    drop_last: bool,
    in_order: bool,
    seed: u64,
    fail: Vec<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..70, 1usize..9, 1usize..5, 1usize..4),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<u64>()),
        proptest::collection::vec(0usize..70, 0..3),
    )
        .prop_map(
            |((len, batch_size, workers, prefetch), (shuffle, drop_last, in_order, seed), fail)| {
                Case {
                    len,
                    batch_size,
                    workers,
                    prefetch,
                    shuffle,
                    drop_last,
                    in_order,
                    seed,
                    fail,
                }
            },
        )
}

type Loader = longshore_loader::StackLoader<Arc<Draws>>;

/// A loader over a `Draws` of the case (its record shared with the caller).
fn build_with(c: &Case, next_epoch: bool, pool: &PinnedPool) -> (Loader, Arc<Draws>) {
    let mut ds = Draws::new(c.len);
    ds.fail = c.fail.iter().copied().collect();
    let ds = Arc::new(ds);
    let loader = DataLoader::builder(ds.clone())
        .batch_size(c.batch_size)
        .num_workers(c.workers)
        .prefetch_factor(c.prefetch)
        .persistent_workers(true)
        .prefetch_next_epoch(next_epoch)
        .shuffle(c.shuffle)
        .drop_last(c.drop_last)
        .in_order(c.in_order)
        .seed(c.seed)
        .pool(pool.clone())
        .build()
        .unwrap();
    (loader, ds)
}

fn build(c: &Case, next_epoch: bool, pool: &PinnedPool) -> Loader {
    build_with(c, next_epoch, pool).0
}

/// Out of order, which worker loads a batch after the first ones depends on timing (with or
/// without this option), so only the batches' samples are compared, as a set.
fn comparable(e: Epoch, in_order: bool) -> Epoch {
    if in_order {
        return e;
    }
    let mut e: Epoch = e
        .into_iter()
        .map(|r| r.map(|b| b.into_iter().map(|s| [s[0], 0]).collect()))
        .collect();
    e.sort();
    e
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn next_epoch_prefetch_yields_the_same_batches(c in case()) {
        let pool = pageable();
        let (on, off) = (build(&c, true, &pool), build(&c, false, &pool));
        for epoch in 0..4 {
            let a = comparable(run_epoch(&on), c.in_order);
            let b = comparable(run_epoch(&off), c.in_order);
            prop_assert_eq!(a, b, "epoch {}", epoch);
        }
        let batches = on.len().unwrap();
        let s = on.stats();
        if batches > 0 {
            // Epochs 1..4 each started with batches loaded while the one before drained.
            prop_assert!(s.speculative_batches >= 3, "{:?}", s);
        }
        prop_assert_eq!(s.speculative_discarded, 0);
        prop_assert_eq!(off.stats().speculative_batches, 0);
        drop((on, off));
        prop_assert!(eventually(Duration::from_secs(3), || pool.stats().bytes_in_use == 0), "{:?}", pool.stats());
    }
}

fn base(len: usize) -> Case {
    Case {
        len,
        batch_size: 4,
        workers: 3,
        prefetch: 2,
        shuffle: true,
        drop_last: false,
        in_order: true,
        seed: 17,
        fail: Vec::new(),
    }
}

/// Waits until the workers have loaded what was started ahead (no timing is asserted: only
/// that the dataset went quiet, polled up to a bound).
fn quiet(ds: &Draws) {
    let mut last = usize::MAX;
    eventually(Duration::from_secs(5), || {
        std::thread::sleep(Duration::from_millis(20));
        let now = ds.seeds.lock().unwrap().len();
        let same = now == last;
        last = now;
        same
    });
}

#[test]
fn set_epoch_to_another_epoch_discards_and_matches_a_fresh_loader() {
    watchdog(60, "set_epoch", || {
        let pool = pageable();
        let c = base(50);
        let (on, ds) = build_with(&c, true, &pool);
        run_epoch(&on);
        quiet(&ds);
        on.set_epoch(5);
        let got = run_epoch(&on);
        let fresh = build(&c, false, &pool);
        fresh.set_epoch(5);
        assert_eq!(got, run_epoch(&fresh));
        let s = on.stats();
        assert!(s.speculative_discarded > 0, "{s:?}");
        assert_eq!(
            s.speculative_batches, 0,
            "epoch 5 adopted batches of epoch 1"
        );
        // Setting the epoch it predicted keeps them.
        let keep = build(&c, true, &pool);
        let reference = build(&c, false, &pool);
        for _ in 0..2 {
            run_epoch(&keep);
            run_epoch(&reference);
            keep.set_epoch(keep.state_dict().unwrap().epoch);
            assert_eq!(run_epoch(&keep), run_epoch(&reference));
        }
        assert!(keep.stats().speculative_batches > 0);
        assert_eq!(keep.stats().speculative_discarded, 0);
        drop((on, fresh, keep, reference));
        assert!(eventually(Duration::from_secs(3), || pool
            .stats()
            .bytes_in_use
            == 0));
    });
}

#[test]
fn load_state_dict_discards_and_resumes_like_a_fresh_loader() {
    watchdog(60, "load_state_dict", || {
        let pool = pageable();
        let c = base(60);
        // A checkpoint two batches into epoch 1.
        let reference = build(&c, false, &pool);
        run_epoch(&reference);
        let mut it = reference.iter();
        it.next().unwrap().unwrap();
        it.next().unwrap().unwrap();
        let state = reference.state_dict().unwrap();
        drop(it);
        assert_eq!((state.epoch, state.done_prefix), (1, 2));

        let on = build(&c, true, &pool);
        run_epoch(&on);
        // Between epochs the state is the next epoch from its start, as without prefetch.
        let between = on.state_dict().unwrap();
        assert_eq!((between.epoch, between.done_prefix), (1, 0));
        on.load_state_dict(&state).unwrap();
        let resumed = run_epoch(&on);
        let fresh = build(&c, false, &pool);
        fresh.load_state_dict(&state).unwrap();
        assert_eq!(resumed, run_epoch(&fresh));
        assert_eq!(resumed.len(), 13);
        assert!(on.stats().speculative_discarded > 0);
        // The epoch after the restored one is prefetched again, and mid-epoch state counts
        // only what was delivered.
        let mut it = on.iter();
        it.next().unwrap().unwrap();
        let mid = on.state_dict().unwrap();
        assert_eq!((mid.epoch, mid.done_prefix), (2, 1));
        drop(it);
        assert!(on.stats().speculative_batches > 0);
    });
}

#[test]
fn the_next_epoch_is_loaded_before_its_iterator_is_created() {
    watchdog(60, "early", || {
        let pool = pageable();
        let c = base(48); // 12 batches; 3 workers x prefetch 2 = 6 in flight
        let (on, shared) = build_with(&c, true, &pool);
        let of_epoch = |e: u64| -> HashSet<u64> {
            (0..c.workers).map(|w| worker_seed(c.seed, e, w)).collect()
        };
        let count = |e: u64| {
            let seeds = of_epoch(e);
            shared
                .seeds
                .lock()
                .unwrap()
                .iter()
                .filter(|s| seeds.contains(s))
                .count()
        };
        assert_eq!(run_epoch(&on).len(), 12);
        assert_eq!(count(0), 48);
        quiet(&shared);
        let early = count(1);
        assert!(early > 0, "no sample of epoch 1 loaded before its iterator");
        assert!(
            early <= 6 * 4,
            "{early} samples: more than the in-flight bound"
        );
        assert!(pool.stats().blocks_in_use > 0);
        assert_eq!(run_epoch(&on).len(), 12);
        // Every sample of epoch 1 loaded exactly once: the early batches were used, not redone.
        assert_eq!(count(1), 48);
        let s = on.stats();
        assert_eq!(s.speculative_batches as usize * 4, early);
        drop(on);
        assert!(eventually(Duration::from_secs(3), || pool
            .stats()
            .bytes_in_use
            == 0));
    });
}

#[test]
fn dropping_an_epoch_in_its_tail_discards_the_next_one_and_returns_every_lease() {
    watchdog(60, "tail drop", || {
        let pool = pageable();
        let c = base(40); // 10 batches
        let on = build(&c, true, &pool);
        let reference = build(&c, false, &pool);
        let mut it = on.iter();
        for _ in 0..10 {
            it.next().unwrap().unwrap();
        }
        // Every batch of epoch 0 was dealt: epoch 1 is under way. Drop before the end.
        drop(it);
        assert!(eventually(Duration::from_secs(3), || pool
            .stats()
            .bytes_in_use
            == 0));
        assert!(on.stats().speculative_discarded > 0);
        // Epoch 1 runs whole, as without prefetch.
        run_epoch(&reference);
        assert_eq!(run_epoch(&on), run_epoch(&reference));
        // Dropping the loader between epochs returns what it held.
        drop((on, reference));
        assert!(eventually(Duration::from_secs(3), || pool
            .stats()
            .bytes_in_use
            == 0));
    });
}

#[test]
fn errors_of_early_batches_surface_when_their_epoch_reaches_them() {
    let pool = pageable();
    let mut c = base(24);
    c.shuffle = false;
    c.fail = vec![1, 22];
    let on = build(&c, true, &pool);
    let off = build(&c, false, &pool);
    for _ in 0..3 {
        let a = run_epoch(&on);
        assert_eq!(a, run_epoch(&off));
        assert!(a[0].is_err() && a[5].is_err() && a[1..5].iter().all(Result::is_ok));
    }
    let s = on.stats();
    assert_eq!(s.errors, 6, "each failing batch counted once per epoch");
    assert!(s.speculative_batches > 0);
}

/// A stream of `n` numbers per worker, of the epoch its worker opens it for.
#[derive(Debug)]
struct Stream(u64);

impl IterableDataset for Stream {
    type Item = ([u64; 1],);
    fn iter(&self, w: WorkerInfo) -> ItemIter<'_, Self::Item> {
        let base = w.epoch * 1_000_000 + w.id as u64 * 1000;
        Box::new((0..self.0).map(move |i| Ok(([base + i],))))
    }
}

#[test]
fn iterable_datasets_start_their_next_epoch_ahead() {
    watchdog(60, "iterable ahead", iterable_ahead);
}

fn iterable_ahead() {
    let make = |ahead: bool| {
        DataLoader::iterable(Stream(10))
            .batch_size(3)
            .num_workers(2)
            .persistent_workers(true)
            .prefetch_next_epoch(ahead)
            .build()
            .unwrap()
    };
    let epoch = |l: &longshore_loader::IterableLoader<Stream>| -> Vec<Vec<u64>> {
        l.iter()
            .map(|b| b.unwrap().tensor::<u64>(0).unwrap().to_vec())
            .collect()
    };
    let (ahead, plain) = (make(true), make(false));
    for e in 0..3u64 {
        let got = epoch(&ahead);
        assert_eq!(
            got,
            epoch(&plain),
            "epoch {e}: the same batches as without it"
        );
        assert_eq!(got.concat().len(), 20);
        assert!(
            got.concat().iter().all(|v| v / 1_000_000 == e),
            "epoch {e}: {got:?}"
        );
    }
    let s = ahead.stats();
    assert!(s.speculative_batches > 0, "{s:?}");
    assert_eq!(plain.stats().speculative_batches, 0);
    // Another epoch than predicted: what was started for epoch 3 is discarded.
    ahead.set_epoch(7);
    plain.set_epoch(7);
    let got = epoch(&ahead);
    assert_eq!(got, epoch(&plain));
    assert!(got.concat().iter().all(|v| v / 1_000_000 == 7), "{got:?}");
    assert!(ahead.stats().speculative_discarded > 0);
    drop(plain);
    drop(ahead);
}
