//! Reliability (issue #7): the consumer drops the iterator at random points, for random loader
//! options and random faults (proptest). Dropping is bounded in time, every batch taken before
//! the drop is whole and correct, every lease goes back to the pool, and no worker thread
//! outlives its loader. (Alone in its binary so the thread count is not disturbed.)

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Chaos, chaos_ids, eventually, ragged_consistent, thread_count, watchdog};
use longshore_loader::{DataLoader, LoaderError, WorkerPanicPolicy};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    len: usize,
    batch_size: usize,
    workers: usize,
    prefetch: usize,
    in_order: bool,
    persistent: bool,
    shuffle: bool,
    drop_last: bool,
    restart: bool,
    jitter_us: u64,
    faults: Vec<(u8, usize)>,
    /// Items taken before each drop, one entry per epoch attempted.
    drops: Vec<usize>,
    /// Wait this long (us) before dropping, so workers are mid-batch.
    pause_us: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..200, 1usize..12, 0usize..5, 1usize..4),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), prop_oneof![Just(0u64), Just(400)]),
        proptest::collection::vec((0u8..4, any::<usize>()), 0..4),
        proptest::collection::vec(0usize..25, 1..4),
        0u64..3000,
    )
        .prop_map(
            |(
                (len, batch_size, workers, prefetch),
                (in_order, persistent, shuffle, drop_last),
                (restart, jitter_us),
                faults,
                drops,
                pause_us,
            )| Case {
                len,
                batch_size,
                workers,
                prefetch,
                in_order: in_order || workers == 0,
                persistent: persistent && workers > 0,
                shuffle,
                drop_last,
                restart,
                jitter_us,
                faults,
                drops,
                pause_us,
            },
        )
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let mut ds = Chaos::new(c.len);
    ds.jitter_us = c.jitter_us;
    ds.sleep = Duration::from_millis(30);
    for &(kind, at) in &c.faults {
        let i = at % c.len;
        match kind {
            0 => ds.fail.insert(i),
            1 => ds.panic_on.insert(i),
            2 => ds.ragged.insert(i),
            _ => ds.sleep_on.insert(i),
        };
    }
    // Samples no good batch may hold (ragged ones may, in a batch of only ragged ones).
    let bad: BTreeSet<usize> = ds.fail.iter().chain(&ds.panic_on).copied().collect();
    let ragged = ds.ragged.clone();
    let mut b = DataLoader::builder(ds)
        .batch_size(c.batch_size)
        .num_workers(c.workers)
        .shuffle(c.shuffle)
        .drop_last(c.drop_last)
        .in_order(c.in_order)
        .seed(7)
        .shutdown_timeout(Duration::from_secs(1));
    if c.workers > 0 {
        b = b
            .prefetch_factor(c.prefetch)
            .persistent_workers(c.persistent);
    }
    if c.restart {
        b = b.on_worker_panic(WorkerPanicPolicy::Restart);
    }
    let loader = b.build().unwrap();
    for &stop in &c.drops {
        let mut it = loader.iter();
        let mut held = Vec::new();
        let mut ended = false;
        for _ in 0..stop {
            match it.next() {
                None => {
                    ended = true;
                    break;
                }
                Some(Ok(batch)) => {
                    let (got, width) = chaos_ids(&batch);
                    prop_assert!(!got.is_empty());
                    prop_assert!(got.len() <= c.batch_size);
                    prop_assert!(got.iter().all(|i| !bad.contains(i)), "bad sample delivered");
                    prop_assert!(ragged_consistent(&got, width, &ragged));
                    held.push(batch);
                }
                Some(Err(
                    LoaderError::Sample { .. }
                    | LoaderError::Collate { .. }
                    | LoaderError::WorkerPanicked { .. },
                )) => {}
                Some(Err(e)) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        if c.pause_us > 0 {
            std::thread::sleep(Duration::from_micros(c.pause_us));
        }
        let t0 = Instant::now();
        drop(it);
        // Bounded by the shutdown timeout (1 s) plus scheduling slack.
        prop_assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "drop took {:?}",
            t0.elapsed()
        );
        let in_use = held.iter().map(|b| b.storage().capacity()).sum::<usize>();
        prop_assert!(loader.pool().stats().bytes_in_use >= in_use);
        drop(held);
        let pool = loader.pool().clone();
        if ended && c.persistent {
            // An epoch run to its end with persistent workers keeps the next epoch's first
            // batches (prefetch_next_epoch): at most the in-flight bound, returned when the
            // loader is dropped (checked below).
            let cap = c.workers * c.prefetch;
            prop_assert!(
                pool.stats().blocks_in_use <= cap,
                "more than {cap} blocks held between epochs: {:?}",
                pool.stats()
            );
            continue;
        }
        let back = eventually(Duration::from_secs(2), || pool.stats().bytes_in_use == 0);
        prop_assert!(back, "leases leaked: {:?}", pool.stats());
    }
    // One full epoch afterwards: every batch answers once (unless a panic ends the epoch under
    // the Fail policy), no sample twice, no bad sample in a good batch.
    let mut seen = BTreeSet::new();
    let (mut answers, mut fatal) = (0usize, false);
    for r in &loader {
        answers += 1;
        match r {
            Ok(b) => {
                let (got, width) = chaos_ids(&b);
                prop_assert!(ragged_consistent(&got, width, &ragged));
                for i in got {
                    prop_assert!(seen.insert(i), "sample {i} twice");
                }
            }
            Err(LoaderError::WorkerPanicked { .. }) => fatal |= !c.restart,
            Err(LoaderError::Sample { .. } | LoaderError::Collate { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
    prop_assert!(seen.is_disjoint(&bad));
    if !fatal {
        prop_assert_eq!(answers, loader.len().unwrap());
    }
    if bad.is_empty() && ragged.is_empty() {
        let full = if c.drop_last {
            c.len / c.batch_size * c.batch_size
        } else {
            c.len
        };
        prop_assert_eq!(seen.len(), full);
    }
    let pool = loader.pool().clone();
    drop(loader);
    let back = eventually(Duration::from_secs(2), || pool.stats().bytes_in_use == 0);
    prop_assert!(back, "leases leaked after the loader: {:?}", pool.stats());
    Ok(())
}

#[test]
fn dropping_the_iterator_anywhere_is_bounded_and_leak_free() {
    let before = thread_count();
    watchdog(120, "drop points", || {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 48,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner.run(&case(), |c| run(&c)).unwrap();
    });
    // Detached workers (at most one per sleeping fault) finish their sleep and exit.
    let ok = eventually(Duration::from_secs(3), || thread_count() <= before);
    assert!(
        ok,
        "threads leaked: {before} before, {} after",
        thread_count()
    );
}
