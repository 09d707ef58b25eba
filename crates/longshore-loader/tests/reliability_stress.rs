//! Reliability (issue #7): the reorder buffer and shutdown under randomized delays.
//!
//! loom is not used: the loader's concurrency goes through crossbeam channels, OS threads with
//! timeouts (`recv_deadline`, `JoinHandle::is_finished`, sleeps) and the pool's condvar, none of
//! which loom can model; rewriting them behind loom shims would test the shims, not the loader.
//! Instead each case draws random per-sample delays in the workers and random pauses in the
//! consumer, over many seeds, and checks the invariants on every run: in-order delivery is
//! exactly sampler order, out-of-order delivery is exactly-once, the reorder buffer and the
//! number of batches in flight stay within `num_workers * prefetch_factor`, and an iterator
//! dropped at a random moment, or one whose loader is dropped first, stops within its bound.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Chaos, eventually, ids, watchdog};
use longshore_data::{BatchSampler, BatchSampling, RandomSampler};
use longshore_loader::DataLoader;
use rand::{Rng, SeedableRng, rngs::StdRng};

#[test]
fn reorder_buffer_under_random_delays_keeps_order_and_bounds() {
    watchdog(60, "reorder stress", || {
        let mut rng = StdRng::seed_from_u64(0x5EED_0001);
        let t0 = Instant::now();
        let mut runs = 0;
        while runs < 12 || t0.elapsed() < Duration::from_secs(4) {
            if t0.elapsed() > Duration::from_secs(10) {
                break;
            }
            runs += 1;
            let len = rng.random_range(1..300);
            let batch_size = rng.random_range(1..9);
            let workers = rng.random_range(1..6);
            let prefetch = rng.random_range(1..4);
            let in_order = rng.random_bool(0.5);
            let seed = rng.random();
            let mut ds = Chaos::new(len);
            ds.jitter_us = [50, 400, 2000][rng.random_range(0..3)];
            ds.jitter_seed = rng.random();
            let loader = DataLoader::builder(ds)
                .batch_size(batch_size)
                .num_workers(workers)
                .prefetch_factor(prefetch)
                .in_order(in_order)
                .shuffle(true)
                .seed(seed)
                .build()
                .unwrap();
            // The order the sampler produces, to compare in-order delivery against.
            let mut sampler =
                BatchSampler::new(RandomSampler::new(len, seed).unwrap(), batch_size, false)
                    .unwrap();
            sampler.set_epoch(0);
            let want: Vec<Vec<usize>> = sampler.iter().collect();
            let mut got = Vec::new();
            for b in &loader {
                got.push(ids(&b.unwrap()));
                if rng.random_bool(0.2) {
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
                }
            }
            if in_order {
                assert_eq!(got, want, "in-order delivery differs from sampler order");
            } else {
                let mut g = got.clone();
                let mut w = want.clone();
                g.sort();
                w.sort();
                assert_eq!(g, w, "out-of-order delivery is not exactly-once");
            }
            let s = loader.stats();
            let cap = workers * prefetch;
            assert!(s.peak_in_flight <= cap, "{} > {cap}", s.peak_in_flight);
            assert!(s.peak_reorder <= cap, "reorder {} > {cap}", s.peak_reorder);
            assert_eq!(s.pool.bytes_in_use, 0);
        }
        println!("reorder stress: {runs} randomized epochs");
    });
}

#[test]
fn shutdown_races_with_workers_at_random_moments() {
    watchdog(60, "shutdown stress", || {
        let mut rng = StdRng::seed_from_u64(0x5EED_0002);
        for round in 0..40 {
            let mut ds = Chaos::new(400);
            ds.jitter_us = rng.random_range(1..1500);
            ds.jitter_seed = rng.random();
            let persistent = rng.random_bool(0.5);
            let loader = DataLoader::builder(ds)
                .batch_size(rng.random_range(1..16))
                .num_workers(rng.random_range(1..5))
                .prefetch_factor(rng.random_range(1..4))
                .in_order(rng.random_bool(0.5))
                .persistent_workers(persistent)
                .shutdown_timeout(Duration::from_secs(1))
                .build()
                .unwrap();
            let pool = loader.pool().clone();
            for _ in 0..3 {
                let mut it = loader.iter();
                let take = rng.random_range(0..6);
                let mut seen = BTreeSet::new();
                for _ in 0..take {
                    if let Some(b) = it.next() {
                        for i in ids(&b.unwrap()) {
                            assert!(seen.insert(i));
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(rng.random_range(0..2000)));
                let t0 = Instant::now();
                if rng.random_bool(0.3) {
                    // Drop the iterator from another thread while this one goes on.
                    std::thread::spawn(move || drop(it)).join().unwrap();
                } else {
                    drop(it);
                }
                assert!(
                    t0.elapsed() < Duration::from_millis(1500),
                    "round {round}: drop took {:?}",
                    t0.elapsed()
                );
            }
            // An iterator that outlives its loader still ends cleanly.
            let mut it = loader.iter();
            let _ = it.next();
            drop(loader);
            let _ = it.next();
            drop(it);
            assert!(
                eventually(Duration::from_secs(2), || pool.stats().bytes_in_use == 0),
                "round {round}: leases leaked {:?}",
                pool.stats()
            );
        }
    });
}
