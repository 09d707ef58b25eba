//! Reliability (issue #7): fault injection inside the loader. Datasets that fail on chosen
//! indices, panic, sleep past the timeout, or return samples of the wrong shape; the pool's
//! budget exhausted under each policy. Each test runs under a watchdog (a hang fails the test
//! instead of blocking CI), checks every delivered batch's contents, and checks that every
//! lease went back to the pool.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Chaos, eventually, ids, watchdog};
use longshore_host::{BudgetPolicy, HostError, MemoryKind, PinnedPool, PoolConfig};
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy, WorkerPanicPolicy};

const PAGE_BATCH: usize = 4096; // a batch of <= 64 Chaos samples fits one page-sized block

fn expected(batch: u64, batch_size: usize, len: usize) -> Vec<usize> {
    let s = batch as usize * batch_size;
    (s..(s + batch_size).min(len)).collect()
}

fn leases_back(pool: &PinnedPool) -> bool {
    eventually(Duration::from_secs(2), || pool.stats().bytes_in_use == 0)
}

#[test]
fn failing_indices_fail_exactly_their_batches_in_every_mode() {
    watchdog(30, "failing indices", || {
        let fail: BTreeSet<usize> = [0, 13, 14, 31, 59].into();
        for workers in [0usize, 1, 3] {
            for in_order in [true, false] {
                if workers == 0 && !in_order {
                    continue; // needs workers
                }
                let mut ds = Chaos::new(60);
                ds.fail = fail.iter().copied().collect();
                ds.jitter_us = 300;
                let loader = DataLoader::builder(ds)
                    .batch_size(8)
                    .num_workers(workers)
                    .in_order(in_order)
                    .build()
                    .unwrap();
                let mut good = BTreeSet::new();
                let mut bad = BTreeSet::new();
                let mut order = Vec::new();
                for r in &loader {
                    match r {
                        Ok(b) => {
                            let got = ids(&b);
                            let batch = (got[0] / 8) as u64;
                            assert_eq!(got, expected(batch, 8, 60), "batch {batch} contents");
                            assert!(got.iter().all(|i| !fail.contains(i)));
                            good.insert(batch);
                            order.push(batch);
                        }
                        Err(LoaderError::Sample {
                            index,
                            batch,
                            source,
                        }) => {
                            assert!(fail.contains(&index), "blamed good sample {index}");
                            assert_eq!(index / 8, batch as usize, "index {index} not in {batch}");
                            assert!(source.to_string().contains("is corrupt"));
                            bad.insert(batch);
                            order.push(batch);
                        }
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
                // Batches 0 (0), 1 (13, 14), 3 (31) and 7 (59) fail; the rest load.
                assert_eq!(bad, [0u64, 1, 3, 7].into(), "workers {workers}");
                assert_eq!(good, [2u64, 4, 5, 6].into(), "workers {workers}");
                if in_order {
                    assert_eq!(order, (0..8).collect::<Vec<u64>>());
                }
                assert_eq!(loader.stats().errors, 4);
                assert!(leases_back(loader.pool()), "leases leaked");
            }
        }
    });
}

#[test]
fn skip_policy_keeps_good_samples_of_failing_batches() {
    watchdog(20, "skip policy", || {
        let mut ds = Chaos::new(40);
        ds.fail.extend([3, 4, 5, 6, 7, 17, 39]);
        let loader = DataLoader::builder(ds)
            .batch_size(5)
            .num_workers(3)
            .in_order(false)
            .on_sample_error(SampleErrorPolicy::Skip)
            .build()
            .unwrap();
        let mut seen = BTreeSet::new();
        for b in &loader {
            for i in ids(&b.unwrap()) {
                assert!(seen.insert(i), "sample {i} twice");
            }
        }
        let want: BTreeSet<usize> = (0..40)
            .filter(|i| ![3, 4, 5, 6, 7, 17, 39].contains(i))
            .collect();
        assert_eq!(seen, want);
        // Batch 1 (5..10) lost samples 5, 6, 7; batch 0 lost 3, 4.
        assert_eq!(loader.stats().skipped_samples, 7);
        assert!(leases_back(loader.pool()));
    });
}

#[test]
fn wrong_shaped_sample_gives_a_collate_error_never_a_partial_batch() {
    watchdog(30, "ragged samples", || {
        for (workers, policy) in [
            (0, SampleErrorPolicy::FailBatch),
            (2, SampleErrorPolicy::FailBatch),
            (2, SampleErrorPolicy::Skip),
        ] {
            let mut ds = Chaos::new(24);
            ds.ragged.extend([5, 22]);
            let loader = DataLoader::builder(ds)
                .batch_size(4)
                .num_workers(workers)
                .on_sample_error(policy)
                .build()
                .unwrap();
            let results: Vec<_> = loader.iter().collect();
            assert_eq!(results.len(), 6, "every batch answers");
            for (i, r) in results.iter().enumerate() {
                match r {
                    Ok(b) => {
                        assert!(i != 1 && i != 5, "batch {i} has a ragged sample");
                        assert_eq!(ids(b), expected(i as u64, 4, 24));
                        assert_eq!(b.shape(1).unwrap(), &[4, 3]);
                    }
                    Err(LoaderError::Collate { batch, source }) => {
                        assert!(i == 1 || i == 5, "batch {i} wrongly failed: {source}");
                        assert_eq!(*batch, i as u64);
                        // What failed is in the message, the cause in `source()`.
                        let msg = r.as_ref().unwrap_err().to_string();
                        assert!(msg.contains(&format!("batch {i}")), "{msg}");
                        assert!(source.to_string().contains("field 1"), "{source}");
                    }
                    Err(e) => panic!("batch {i}: unexpected {e}"),
                }
            }
            assert_eq!(
                loader.stats().skipped_samples,
                0,
                "a shape error is no skip"
            );
            drop(results);
            assert!(leases_back(loader.pool()));
        }
    });
}

#[test]
fn panics_under_fail_and_restart_out_of_order() {
    watchdog(30, "panics", || {
        // Fail: the epoch ends at the panic; nothing after it is delivered as good, the next
        // epoch starts clean.
        let mut ds = Chaos::new(64);
        ds.panic_on.insert(21);
        ds.jitter_us = 200;
        let loader = DataLoader::builder(ds)
            .batch_size(4)
            .num_workers(3)
            .in_order(false)
            .build()
            .unwrap();
        for _epoch in 0..2 {
            let mut panics = 0;
            let mut good = BTreeSet::new();
            for r in &loader {
                match r {
                    Ok(b) => {
                        let got = ids(&b);
                        assert!(!got.contains(&21));
                        assert!(good.insert(got[0] / 4));
                        assert_eq!(got, expected((got[0] / 4) as u64, 4, 64));
                    }
                    Err(LoaderError::WorkerPanicked { batch, message, .. }) => {
                        assert_eq!(batch, 5);
                        assert!(message.contains("sample 21"), "{message}");
                        panics += 1;
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            assert_eq!(panics, 1, "the epoch ends at the first panic");
            assert!(!good.contains(&5));
            assert!(leases_back(loader.pool()));
        }

        // Restart: every other batch loads, each panic is reported once per epoch.
        let mut ds = Chaos::new(64);
        ds.panic_on.extend([2, 33, 63]);
        let loader = DataLoader::builder(ds)
            .batch_size(4)
            .num_workers(2)
            .in_order(false)
            .persistent_workers(true)
            .on_worker_panic(WorkerPanicPolicy::Restart)
            .build()
            .unwrap();
        for epoch in 0..3 {
            let mut good = BTreeSet::new();
            let mut panicked = BTreeSet::new();
            for r in &loader {
                match r {
                    Ok(b) => {
                        let got = ids(&b);
                        assert_eq!(got, expected((got[0] / 4) as u64, 4, 64));
                        assert!(good.insert(got[0] / 4));
                    }
                    Err(LoaderError::WorkerPanicked { batch, .. }) => {
                        assert!(panicked.insert(batch))
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            assert_eq!(panicked, [0u64, 8, 15].into(), "epoch {epoch}");
            assert_eq!(good.len(), 13, "epoch {epoch}");
        }
        assert_eq!(loader.stats().worker_restarts, 9);
        // The loader keeps the next epoch's first batches (prefetch_next_epoch) until dropped.
        let pool = loader.pool().clone();
        drop(loader);
        assert!(leases_back(&pool));
    });
}

#[test]
fn sleeping_past_the_timeout_ends_the_epoch_and_the_next_one_recovers() {
    watchdog(30, "timeouts", || {
        for (in_order, persistent) in [(true, false), (false, false), (true, true)] {
            let mut ds = Chaos::new(32);
            ds.sleep_on.insert(9);
            ds.sleep = Duration::from_millis(700);
            let loader = DataLoader::builder(ds)
                .batch_size(4)
                .num_workers(2)
                .in_order(in_order)
                .persistent_workers(persistent)
                .timeout(Duration::from_millis(150))
                .shutdown_timeout(Duration::from_millis(50))
                .build()
                .unwrap();
            let t0 = Instant::now();
            let results: Vec<_> = loader.iter().collect();
            assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
            let last = results.last().unwrap();
            match last {
                Err(LoaderError::Timeout { waited, .. }) => {
                    assert!(*waited >= Duration::from_millis(150))
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
            for r in &results[..results.len() - 1] {
                let b = r.as_ref().expect("only the last result fails");
                let got = ids(b);
                assert!(!got.contains(&9));
                assert_eq!(got, expected((got[0] / 4) as u64, 4, 32));
            }
            drop(results);
            // The sleeping worker was detached (or is reused, persistent); once it wakes, its
            // lease comes back. The next epoch, with the sleep gone past, works.
            std::thread::sleep(Duration::from_millis(800));
            let n = loader.iter().count();
            assert!(n >= 1);
            assert!(leases_back(loader.pool()), "in_order {in_order}");
        }
    });
}

fn pool_with(budget: usize, policy: BudgetPolicy) -> PinnedPool {
    PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(budget)
            .policy(policy),
    )
    .unwrap()
}

/// Consumes an epoch, checking contents and dropping each batch as it comes (so the budget is
/// what the loader holds in flight); returns (good batches, errors).
fn drain(
    loader: &DataLoader<
        impl longshore_loader::Fetch<Output = longshore_data::Batch<longshore_host::PoolBuffer>>,
    >,
    batch_size: usize,
    len: usize,
) -> (BTreeSet<u64>, Vec<LoaderError>) {
    let mut good = BTreeSet::new();
    let mut errs = Vec::new();
    for r in loader {
        match r {
            Ok(b) => {
                let got = ids(&b);
                let seq = (got[0] / batch_size) as u64;
                assert_eq!(got, expected(seq, batch_size, len));
                assert!(good.insert(seq), "batch {seq} twice");
            }
            Err(e) => errs.push(e),
        }
    }
    (good, errs)
}

#[test]
fn budget_exhausted_inside_the_loader_under_each_policy() {
    watchdog(40, "budget policies", || {
        const LEN: usize = 256;
        for in_order in [true, false] {
            // Wait: the budget holds two batches; 4 workers x prefetch 2 compete for it.
            let pool = pool_with(
                2 * PAGE_BATCH,
                BudgetPolicy::Wait {
                    timeout: Duration::from_secs(10),
                },
            );
            let mut ds = Chaos::new(LEN);
            ds.jitter_us = 200;
            let loader = DataLoader::builder(ds)
                .batch_size(8)
                .num_workers(4)
                .in_order(in_order)
                .pool(pool.clone())
                .build()
                .unwrap();
            let (good, errs) = drain(&loader, 8, LEN);
            assert!(errs.is_empty(), "Wait (in_order {in_order}): {errs:?}");
            println!(
                "Wait, in_order {in_order}: {} batches reloaded to unstarve the pool",
                loader.stats().reloaded
            );
            assert_eq!(good.len(), LEN / 8);
            let s = pool.stats();
            assert!(s.peak_bytes_held <= 2 * PAGE_BATCH, "{s:?}");
            assert!(leases_back(&pool));

            // FallbackPageable: completes, and counts what did not fit.
            let pool = pool_with(PAGE_BATCH, BudgetPolicy::FallbackPageable);
            let mut ds = Chaos::new(LEN);
            ds.jitter_us = 200;
            let loader = DataLoader::builder(ds)
                .batch_size(8)
                .num_workers(4)
                .in_order(in_order)
                .pool(pool.clone())
                .build()
                .unwrap();
            // Hold every batch: the budget (one batch) is exceeded 31 times over.
            let all: Vec<_> = loader.iter().map(|r| r.unwrap()).collect();
            assert_eq!(all.len(), LEN / 8);
            let mut seen = BTreeSet::new();
            for b in &all {
                let got = ids(b);
                assert_eq!(got, expected((got[0] / 8) as u64, 8, LEN));
                seen.insert(got[0]);
            }
            assert_eq!(seen.len(), LEN / 8);
            let fallbacks = all.iter().filter(|b| b.storage().is_fallback()).count();
            let s = pool.stats();
            assert!(fallbacks >= LEN / 8 - 1, "{fallbacks} fallbacks");
            assert_eq!(s.fallbacks, fallbacks as u64, "{s:?}");
            assert!(s.peak_bytes_held <= PAGE_BATCH, "{s:?}");
            drop(all);
            assert!(leases_back(&pool));

            // Error: batches that do not fit fail as LoaderError::Memory naming the batch;
            // the others are good; nothing is lost or duplicated.
            let pool = pool_with(PAGE_BATCH, BudgetPolicy::Error);
            let loader = DataLoader::builder(Chaos::new(LEN))
                .batch_size(8)
                .num_workers(4)
                .in_order(in_order)
                .pool(pool.clone())
                .build()
                .unwrap();
            let results: Vec<_> = loader.iter().collect();
            assert_eq!(results.len(), LEN / 8);
            let mut failed = BTreeSet::new();
            let mut good = BTreeSet::new();
            for r in &results {
                match r {
                    Ok(b) => {
                        let got = ids(b);
                        let seq = (got[0] / 8) as u64;
                        assert_eq!(got, expected(seq, 8, LEN));
                        good.insert(seq);
                    }
                    Err(
                        e @ LoaderError::Memory {
                            batch,
                            source: HostError::BudgetExceeded { budget, .. },
                        },
                    ) => {
                        assert_eq!(*budget, PAGE_BATCH);
                        assert!(e.to_string().contains(&format!("batch {batch}")), "{e}");
                        failed.insert(*batch);
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            assert_eq!(good.len(), 1, "only one batch fits while all are held");
            assert!(good.is_disjoint(&failed));
            assert_eq!(good.len() + failed.len(), LEN / 8);
            drop(results);
            assert!(leases_back(&pool));
        }
    });
}

/// Regression: with persistent workers, a batch a worker finished after the iterator was
/// dropped used to be sent into the parked engine's reply channel and keep its lease until the
/// next epoch started. Now a reply of a cancelled epoch is dropped by the worker.
#[test]
fn persistent_workers_return_leases_of_batches_finished_after_a_drop() {
    watchdog(20, "persistent drop", || {
        let mut ds = Chaos::new(64);
        ds.sleep_on.extend([1, 9, 13]);
        ds.sleep = Duration::from_millis(250);
        let loader = DataLoader::builder(ds)
            .batch_size(4)
            .num_workers(2)
            .prefetch_factor(2)
            .persistent_workers(true)
            .build()
            .unwrap();
        let mut it = loader.iter();
        let first = it.next().unwrap().unwrap();
        assert_eq!(ids(&first), vec![0, 1, 2, 3]);
        drop(first);
        // Workers 0 and 1 are now inside batches 2 (sample 9) and 3 (sample 13).
        std::thread::sleep(Duration::from_millis(50));
        drop(it);
        // Let worker 0 finish batch 2 (its sample 9 sleeps until ~500 ms) and reply.
        std::thread::sleep(Duration::from_millis(450));
        assert!(
            leases_back(loader.pool()),
            "leases parked with the persistent workers: {:?}",
            loader.pool().stats()
        );
        // The kept workers serve the next epoch in full.
        let n = loader.iter().map(|b| ids(&b.unwrap()).len()).sum::<usize>();
        assert_eq!(n, 64);
    });
}

/// Regression: in order, batches held back in the reorder buffer were not counted against the
/// `num_workers * prefetch_factor` bound, so behind one slow batch the loader kept sending
/// work and sent-but-undelivered batches (each holding a pool block) went past the bound.
#[test]
fn batches_held_back_for_order_count_against_the_prefetch_bound() {
    watchdog(20, "reorder bound", || {
        let mut ds = Chaos::new(96);
        ds.sleep_on.insert(0);
        ds.sleep = Duration::from_millis(100);
        let loader = DataLoader::builder(ds)
            .batch_size(4)
            .num_workers(2)
            .prefetch_factor(4)
            .build()
            .unwrap();
        let mut n = 0;
        for b in &loader {
            n += ids(&b.unwrap()).len();
            // A consumer slower than the workers: whatever is sent gets loaded meanwhile.
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(n, 96);
        let cap = 2 * 4;
        let s = loader.stats();
        // Every block in use at once: the bound, plus the batch the consumer holds.
        assert!(
            s.pool.peak_bytes_in_use <= (cap + 1) * PAGE_BATCH,
            "{} blocks in use at once, bound {cap} + 1 (peak reorder {}, peak in flight {})",
            s.pool.peak_bytes_in_use / PAGE_BATCH,
            s.peak_reorder,
            s.peak_in_flight
        );
    });
}
