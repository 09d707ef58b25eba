//! Dropping the iterator mid-epoch under load stops every worker within a bounded time and
//! returns every pooled lease; no thread outlives the loader. (Alone in its binary so the
//! thread count is not disturbed by other tests.)

mod common;

use std::time::{Duration, Instant};

use common::{Probe, thread_count};
use longshore_loader::DataLoader;

#[test]
fn dropping_the_iterator_mid_epoch_stops_workers_and_returns_every_lease() {
    // With pin_memory on a CUDA host the first page-locked allocation initialises the driver,
    // which starts threads of its own for the life of the process: start it before counting.
    drop(
        longshore_host::PinnedPool::new(longshore_host::PoolConfig::default())
            .and_then(|p| p.alloc(4096)),
    );
    let before = thread_count();
    for persistent in [false, true] {
        let mut p = Probe::new(10_000);
        p.jitter_us = 200;
        let mut b = DataLoader::builder(p)
            .batch_size(8)
            .num_workers(4)
            .prefetch_factor(4)
            .pin_memory(true);
        if persistent {
            b = b.persistent_workers(true);
        }
        let loader = b.build().unwrap();
        for stop in [0usize, 1, 5, 17] {
            let mut it = loader.iter();
            for _ in 0..stop {
                it.next().unwrap().unwrap();
            }
            let t0 = Instant::now();
            drop(it);
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "drop took {:?}",
                t0.elapsed()
            );
            // Replies still in flight when the iterator dropped come back and are discarded.
            let deadline = Instant::now() + Duration::from_secs(2);
            while loader.pool().stats().bytes_in_use != 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
                if persistent {
                    // Persistent workers drain into the kept engine; a new epoch clears it.
                    drop(loader.iter());
                }
            }
            assert_eq!(
                loader.pool().stats().bytes_in_use,
                0,
                "leases leaked (persistent {persistent}, stop {stop})"
            );
        }
        drop(loader);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        thread_count() <= before,
        "threads leaked: {} before, {} after",
        before,
        thread_count()
    );
}
