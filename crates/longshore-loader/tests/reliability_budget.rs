//! Reliability (issue #7): a workload that asks for 10x the pinned budget. Under `Wait` it
//! completes, under `FallbackPageable` it completes with the overflow counted, under `Error` the
//! batches that do not fit fail cleanly naming themselves; under every policy the pool never
//! holds more than its budget and every lease comes back.
//!
//! The pool is page-locked when a CUDA driver is present (the GPU machine), pageable otherwise;
//! the test prints which.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{eventually, watchdog};
use longshore_data::{DataError, Dataset};
use longshore_host::{BudgetPolicy, HostError, MemoryKind, PinnedPool, PoolConfig, size_class};
use longshore_loader::{DataLoader, LoaderError};

const SAMPLE: usize = 16 << 10;
const BATCH: usize = 4;
const BATCHES: usize = 40;

/// Sample `i`: its index and 16 KiB of `(i % 251) as u8`.
struct Big;

impl Dataset for Big {
    type Item = ([u32; 1], Vec<u8>);
    fn len(&self) -> usize {
        BATCH * BATCHES
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50;
        std::thread::sleep(Duration::from_micros(h % 300));
        Ok(([i as u32], vec![(i % 251) as u8; SAMPLE]))
    }
}

fn check(b: &longshore_data::Batch<longshore_host::PoolBuffer>) -> usize {
    let ids = b.tensor::<u32>(0).unwrap();
    let data = b.tensor::<u8>(1).unwrap();
    assert_eq!(ids.len(), BATCH);
    assert_eq!(data.len(), BATCH * SAMPLE);
    for (k, &i) in ids.iter().enumerate() {
        assert_eq!(i as usize, ids[0] as usize + k);
        assert!(
            data[k * SAMPLE..(k + 1) * SAMPLE]
                .iter()
                .all(|&v| v == (i % 251) as u8),
            "sample {i} corrupted"
        );
    }
    ids[0] as usize / BATCH
}

fn kind() -> MemoryKind {
    if longshore_host::driver_available() {
        MemoryKind::PageLocked
    } else {
        MemoryKind::Pageable
    }
}

/// Bytes of one batch's block, and a budget ten times smaller than the whole workload.
fn block_and_budget() -> (usize, usize) {
    let block = size_class(BATCH * SAMPLE + 512).unwrap();
    (block, block * BATCHES / 10)
}

fn loader(
    policy: BudgetPolicy,
    in_order: bool,
) -> (
    DataLoader<
        impl longshore_loader::Fetch<Output = longshore_data::Batch<longshore_host::PoolBuffer>>,
    >,
    PinnedPool,
) {
    let (_, budget) = block_and_budget();
    let pool = PinnedPool::new(
        PoolConfig::for_kind(kind())
            .budget(budget)
            .policy(policy)
            .register_above(None),
    )
    .unwrap();
    let l = DataLoader::builder(Big)
        .batch_size(BATCH)
        .num_workers(4)
        .prefetch_factor(3)
        .in_order(in_order)
        .pool(pool.clone())
        .build()
        .unwrap();
    (l, pool)
}

#[test]
fn ten_times_the_budget_under_every_policy() {
    watchdog(60, "oversubscribed budget", || {
        let (block, budget) = block_and_budget();
        println!(
            "pool kind: {} (driver available: {}), block {block} B, budget {budget} B, workload {} B",
            kind(),
            longshore_host::driver_available(),
            block * BATCHES
        );
        for in_order in [true, false] {
            // Wait: the consumer drops each batch as it comes; everything completes.
            let (l, pool) = loader(
                BudgetPolicy::Wait {
                    timeout: Duration::from_secs(20),
                },
                in_order,
            );
            let mut seen = BTreeSet::new();
            for r in &l {
                let b = r.unwrap_or_else(|e| panic!("Wait (in_order {in_order}): {e}"));
                assert!(seen.insert(check(&b)));
            }
            assert_eq!(seen.len(), BATCHES);
            let s = pool.stats();
            assert!(s.peak_bytes_held <= budget, "Wait: {s:?}");
            assert_eq!(s.fallbacks, 0);
            println!(
                "Wait, in_order {in_order}: {} batches, peak held {} B of {budget}, {} waits",
                seen.len(),
                s.peak_bytes_held,
                s.waits
            );
            assert!(eventually(Duration::from_secs(2), || pool
                .stats()
                .bytes_in_use
                == 0));

            // FallbackPageable: the consumer keeps every batch (10x the budget).
            let (l, pool) = loader(BudgetPolicy::FallbackPageable, in_order);
            let all: Vec<_> = l.iter().map(Result::unwrap).collect();
            let seen: BTreeSet<usize> = all.iter().map(check).collect();
            assert_eq!(seen.len(), BATCHES);
            let s = pool.stats();
            let fallbacks = all.iter().filter(|b| b.storage().is_fallback()).count();
            assert!(s.peak_bytes_held <= budget, "Fallback: {s:?}");
            assert_eq!(s.fallbacks as usize, fallbacks);
            assert!(fallbacks >= BATCHES - budget / block, "{fallbacks}");
            for b in all.iter().filter(|b| !b.storage().is_fallback()) {
                assert_eq!(b.storage().kind(), kind());
            }
            println!(
                "FallbackPageable, in_order {in_order}: {} batches, {fallbacks} fell back, peak held {} B",
                seen.len(),
                s.peak_bytes_held
            );
            drop(all);
            assert_eq!(pool.stats().bytes_in_use, 0);

            // Error: the consumer keeps every batch; the ones that do not fit fail cleanly.
            let (l, pool) = loader(BudgetPolicy::Error, in_order);
            let results: Vec<_> = l.iter().collect();
            assert_eq!(results.len(), BATCHES);
            let mut good = BTreeSet::new();
            let mut failed = BTreeSet::new();
            for r in &results {
                match r {
                    Ok(b) => assert!(good.insert(check(b))),
                    Err(LoaderError::Memory {
                        batch,
                        source: HostError::BudgetExceeded { budget: b, .. },
                    }) => {
                        assert_eq!(*b, budget);
                        assert!(failed.insert(*batch as usize));
                    }
                    Err(e) => panic!("Error policy: unexpected {e}"),
                }
            }
            assert_eq!(good.len(), budget / block, "exactly what fits is delivered");
            assert!(good.is_disjoint(&failed));
            assert_eq!(good.len() + failed.len(), BATCHES);
            let s = pool.stats();
            assert!(s.peak_bytes_held <= budget, "Error: {s:?}");
            println!(
                "Error, in_order {in_order}: {} good, {} failed with LoaderError::Memory, peak held {} B",
                good.len(),
                failed.len(),
                s.peak_bytes_held
            );
            drop(results);
            assert_eq!(pool.stats().bytes_in_use, 0);
        }
    });
}
