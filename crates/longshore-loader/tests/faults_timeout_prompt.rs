//! A timeout is yielded at the timeout, not after the workers were joined: the join (up to
//! `shutdown_timeout`) runs in the background, and still cleans up.

mod common;

use std::time::{Duration, Instant};

use common::{Probe, eventually, thread_count};
use longshore_loader::{DataLoader, LoaderError};

#[test]
fn the_timeout_error_arrives_at_the_timeout_and_cleanup_follows_in_the_background() {
    let before = thread_count();
    let timeout = Duration::from_millis(300);
    let shutdown_timeout = Duration::from_secs(10);
    for persistent in [false, true] {
        let mut p = Probe::new(16);
        // Sample 4 (batch 1) sleeps far longer than the timeout, in dataset code the worker
        // cannot be pulled out of.
        p.sleep_on.insert(4);
        p.sleep = Duration::from_secs(4);
        let loader = DataLoader::builder(p)
            .batch_size(4)
            .num_workers(2)
            .persistent_workers(persistent)
            .timeout(timeout)
            .shutdown_timeout(shutdown_timeout)
            .build()
            .unwrap();
        let mut it = loader.iter();
        assert!(it.next().unwrap().is_ok(), "batch 0 loads");
        let t0 = Instant::now();
        let err = loop {
            match it.next() {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break e,
                None => panic!("the epoch ended without the timeout"),
            }
        };
        let took = t0.elapsed();
        match err {
            LoaderError::Timeout { batch, waited, .. } => {
                assert_eq!(batch, 1);
                assert!(waited >= timeout, "{waited:?}");
            }
            other => panic!("expected a timeout, got {other}"),
        }
        // Before: the error came only after joining the workers, bounded by the sleeping
        // sample (4 s) and `shutdown_timeout` (10 s). Generous slack for a loaded CI machine,
        // well below both.
        assert!(
            took < Duration::from_millis(2_500),
            "timeout yielded after {took:?}"
        );
        assert!(it.next().is_none(), "the epoch ends after the timeout");
        let t1 = Instant::now();
        drop(it);
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "drop waited {:?}",
            t1.elapsed()
        );
        // The stuck worker finishes its sample; the background join then ends every thread
        // and every lease is back.
        assert!(
            eventually(Duration::from_secs(8), || loader
                .pool()
                .stats()
                .bytes_in_use
                == 0),
            "leases: {:?}",
            loader.pool().stats()
        );
    }
    assert!(
        eventually(Duration::from_secs(8), || thread_count() <= before),
        "threads: {before} before, {} after",
        thread_count()
    );
}
