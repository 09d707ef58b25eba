//! Fault injection: failing samples, panicking workers, slow workers against the timeout,
//! dropping the iterator mid-epoch under load. Each test is bounded in time; none may hang,
//! deliver a partial batch as good, or leak a pooled lease.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Probe, ids};
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy, WorkerPanicPolicy};

#[test]
fn failing_sample_fails_its_batch_naming_the_index_and_later_batches_load() {
    for workers in [0, 3] {
        let mut p = Probe::new(20);
        p.fail.insert(7);
        let loader = DataLoader::builder(p)
            .batch_size(4)
            .num_workers(workers)
            .build()
            .unwrap();
        let results: Vec<_> = loader.iter().collect();
        assert_eq!(results.len(), 5);
        for (i, r) in results.iter().enumerate() {
            match (i, r) {
                (
                    1,
                    Err(LoaderError::Sample {
                        index,
                        batch,
                        source,
                    }),
                ) => {
                    assert_eq!((*index, *batch), (7, 1));
                    assert!(source.to_string().contains("sample 7 is corrupt"));
                }
                (1, other) => panic!("batch 1 should fail, got {other:?}"),
                (_, Ok(b)) => assert_eq!(ids(b), (4 * i..4 * i + 4).collect::<Vec<_>>()),
                (_, Err(e)) => panic!("batch {i} failed: {e}"),
            }
        }
        let msg = results[1].as_ref().unwrap_err().to_string();
        assert!(msg.contains("sample 7") && msg.contains("batch 1"), "{msg}");
        assert_eq!(loader.stats().errors, 1);
        assert_eq!(
            loader.pool().stats().bytes_in_use,
            4 * 4096,
            "the delivered batches hold their leases"
        );
        drop(results);
        assert_eq!(loader.pool().stats().bytes_in_use, 0);
    }
}

#[test]
fn skip_policy_drops_failing_samples_and_counts_them() {
    let mut p = Probe::new(12);
    p.fail.extend([1, 2, 8, 9, 10, 11]);
    let loader = DataLoader::builder(p)
        .batch_size(4)
        .num_workers(2)
        .on_sample_error(SampleErrorPolicy::Skip)
        .build()
        .unwrap();
    let batches: Vec<Vec<usize>> = loader.iter().map(|b| ids(&b.unwrap())).collect();
    // The last batch lost every sample and is skipped.
    assert_eq!(batches, vec![vec![0, 3], vec![4, 5, 6, 7]]);
    let s = loader.stats();
    assert_eq!(s.skipped_samples, 6);
    assert_eq!(s.samples, 6);
}

#[test]
fn panicking_worker_fails_and_ends_the_epoch_by_default() {
    let mut p = Probe::new(40);
    p.panic_on.insert(9);
    let loader = DataLoader::builder(p)
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    let results: Vec<_> = loader.iter().collect();
    let last = results.last().unwrap();
    match last {
        Err(LoaderError::WorkerPanicked {
            worker,
            batch,
            message,
        }) => {
            assert_eq!(*batch, 2);
            assert_eq!(*worker, 0, "batch 2 goes to worker 0 round-robin");
            assert!(message.contains("probe panics on sample 9"), "{message}");
        }
        other => panic!("expected a worker panic, got {other:?}"),
    }
    assert_eq!(results.len(), 3, "the epoch ends after the panic");
    assert!(results[..2].iter().all(|r| r.is_ok()));
    drop(results);
    assert_eq!(loader.pool().stats().bytes_in_use, 0);
    // The next epoch starts with fresh workers and runs up to the same fault again.
    let again: Vec<_> = loader.iter().collect();
    assert_eq!(again.len(), 3);
    assert!(again[0].is_ok() && again[1].is_ok());
}

#[test]
fn restart_policy_reports_and_continues_with_worker_init_rerun() {
    let inits = Arc::new(AtomicUsize::new(0));
    let i2 = inits.clone();
    let mut p = Probe::new(40);
    p.panic_on.extend([9, 30]);
    let loader = DataLoader::builder(p)
        .batch_size(4)
        .num_workers(2)
        .worker_init(move |_| {
            i2.fetch_add(1, Ordering::SeqCst);
        })
        .on_worker_panic(WorkerPanicPolicy::Restart)
        .build()
        .unwrap();
    let results: Vec<_> = loader.iter().collect();
    assert_eq!(results.len(), 10);
    let errs: Vec<u64> = results
        .iter()
        .filter_map(|r| match r {
            Err(LoaderError::WorkerPanicked { batch, .. }) => Some(*batch),
            _ => None,
        })
        .collect();
    assert_eq!(errs, vec![2, 7]);
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 8);
    let s = loader.stats();
    assert_eq!(s.worker_restarts, 2);
    assert_eq!(
        inits.load(Ordering::SeqCst),
        2 + 2,
        "worker_init runs at start and after each restart"
    );
}

#[test]
fn slow_worker_hits_the_timeout_naming_worker_and_batch() {
    let mut p = Probe::new(16);
    p.sleep_on.insert(5);
    p.sleep = Duration::from_millis(1500);
    let loader = DataLoader::builder(p)
        .batch_size(4)
        .num_workers(2)
        .timeout(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let results: Vec<_> = loader.iter().collect();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    match results.last().unwrap() {
        Err(LoaderError::Timeout {
            worker,
            batch,
            waited,
        }) => {
            assert_eq!((*worker, *batch), (1, 1));
            assert!(*waited >= Duration::from_millis(200));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(results.len(), 2);
    // The timed-out batch is not counted as delivered: a resume would load it again.
    let st = loader.state_dict().unwrap();
    assert_eq!(st.done_prefix, 1);
}
