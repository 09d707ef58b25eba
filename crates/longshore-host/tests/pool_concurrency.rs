//! Many threads allocating and freeing with random fence delays; the pool's accounting returns
//! to zero in use, and the budget is never exceeded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use longshore_host::{BudgetPolicy, CpuFence, Fence, MemoryKind, PinnedPool, PoolConfig};
use rand::{Rng, SeedableRng};

#[test]
fn concurrent_alloc_free_with_random_fences() {
    let budget = 48 << 20;
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(budget)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_secs(20),
            }),
    )
    .unwrap();
    // A "device" thread completes fences after random delays, out of order.
    let (tx, rx) = std::sync::mpsc::channel::<Arc<CpuFence>>();
    let stop = Arc::new(AtomicBool::new(false));
    let device = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let mut queue: Vec<Arc<CpuFence>> = Vec::new();
            loop {
                while let Ok(f) = rx.try_recv() {
                    queue.push(f);
                }
                if !queue.is_empty() {
                    let i = rng.random_range(0..queue.len());
                    queue.swap_remove(i).signal();
                } else if stop.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_micros(rng.random_range(0..200)));
            }
        })
    };
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let pool = pool.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for i in 0..300 {
                    let len = rng.random_range(1..(4 << 20));
                    let mut b = pool.alloc(len).expect("wait policy within timeout");
                    // Our lease is ours alone: write a pattern and read it back.
                    let tag = (t as u8).wrapping_mul(31).wrapping_add(i as u8);
                    b.as_bytes_mut().fill(tag);
                    std::thread::yield_now();
                    assert!(
                        b.as_bytes().iter().all(|&x| x == tag),
                        "another thread wrote into our lease"
                    );
                    if rng.random_bool(0.5) {
                        let f = CpuFence::new();
                        b.record_fence(f.clone());
                        tx.send(f).unwrap();
                    }
                    drop(b);
                    let s = pool.stats();
                    assert!(s.bytes_held <= budget, "held {} over budget", s.bytes_held);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    drop(tx);
    stop.store(true, Ordering::SeqCst);
    device.join().unwrap();
    pool.collect();
    let s = pool.stats();
    assert_eq!(s.bytes_in_use, 0, "{s:?}");
    assert_eq!(s.blocks_in_use, 0);
    assert_eq!(s.bytes_pending, 0);
    assert_eq!(s.hits + s.misses, 8 * 300);
    assert!(s.hits > 0);
    assert!(s.peak_bytes_held <= budget);
}

#[test]
fn wait_policy_blocks_until_a_lease_returns() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(4 << 20)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_secs(10),
            }),
    )
    .unwrap();
    let first = pool.alloc(3 << 20).unwrap();
    let fence = CpuFence::new();
    let mut first = first;
    first.record_fence(fence.clone());
    let p2 = pool.clone();
    let waiter = std::thread::spawn(move || p2.alloc(3 << 20).map(|b| b.as_ptr() as usize));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !waiter.is_finished(),
        "the second request must wait for the budget"
    );
    drop(first); // pending on the fence: still no room
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !waiter.is_finished(),
        "a block with a pending fence is not reusable"
    );
    fence.signal();
    let got = waiter.join().unwrap().unwrap();
    assert_ne!(got, 0);
    let s = pool.stats();
    assert_eq!(s.waits, 1);
    assert!(s.wait_time >= Duration::from_millis(50));
    assert!(fence.is_complete());
}

#[test]
fn wait_policy_times_out_with_a_clear_error() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(4 << 20)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_millis(50),
            }),
    )
    .unwrap();
    let _held = pool.alloc(3 << 20).unwrap();
    let err = pool.alloc(3 << 20).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("timed out") && msg.contains("budget 4194304"),
        "{msg}"
    );
}

#[test]
fn error_and_fallback_policies() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(4 << 20)
            .policy(BudgetPolicy::Error),
    )
    .unwrap();
    let _held = pool.alloc(3 << 20).unwrap();
    let msg = pool.alloc(3 << 20).unwrap_err().to_string();
    assert!(
        msg.contains("requested 3145728")
            && msg.contains("3145728 in use")
            && msg.contains("budget 4194304"),
        "{msg}"
    );
    let msg = pool.alloc(5 << 20).unwrap_err().to_string();
    assert!(msg.contains("larger than the whole pinned budget"), "{msg}");

    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(4 << 20)
            .policy(BudgetPolicy::FallbackPageable),
    )
    .unwrap();
    let _held = pool.alloc(3 << 20).unwrap();
    let fb = pool.alloc(3 << 20).unwrap();
    assert!(fb.is_fallback());
    assert_eq!(fb.kind(), MemoryKind::Pageable);
    let huge = pool.alloc(64 << 20).unwrap();
    assert!(huge.is_fallback());
    let s = pool.stats();
    assert_eq!(s.fallbacks, 2);
    assert_eq!(s.fallback_bytes, (3 << 20) + (64 << 20));
    assert_eq!(s.bytes_held, 3 << 20);
}

#[test]
fn budget_evicts_cached_blocks_of_other_classes_before_refusing() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(4 << 20)
            .policy(BudgetPolicy::Error),
    )
    .unwrap();
    drop(pool.alloc(3 << 20).unwrap());
    assert_eq!(pool.stats().bytes_cached, 3 << 20);
    let b = pool.alloc(2 << 20).unwrap(); // another class: the cached 3 MiB block is freed
    let s = pool.stats();
    assert_eq!(s.bytes_cached, 0);
    assert_eq!(s.bytes_in_use, 2 << 20);
    assert_eq!(s.frees, 1);
    drop(b);
}

#[test]
fn zero_size_and_zero_budget_are_errors() {
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap();
    assert!(pool.alloc(0).unwrap_err().to_string().contains("zero-byte"));
    assert!(pool.alloc(usize::MAX).is_err());
    let err = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(0)).unwrap_err();
    assert!(err.to_string().contains("budget"));
}

/// Regression: a thread reclaiming completed blocks used to take the whole pending list out of
/// the pool while it queried fences; another thread allocating meanwhile saw the budget full of
/// blocks it could not reach and failed (`Error`) or fell back to pageable memory (staging hit
/// this with a budget-full pool of completed chunks).
#[test]
fn reclaim_by_one_thread_never_makes_another_fail_for_nothing() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3000;
    let block = 16 << 10;
    // Two blocks a thread: one leased, one awaiting its fence. Always enough.
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(2 * THREADS * block)
            .policy(BudgetPolicy::Error),
    )
    .unwrap();
    assert_eq!(pool.reserve(block, 2 * THREADS).unwrap(), 2 * THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let pool = &pool;
            s.spawn(move || {
                for round in 0..ROUNDS {
                    let mut lease = pool
                        .alloc(block)
                        .unwrap_or_else(|e| panic!("thread {t}, round {round}: {e}"));
                    lease.as_bytes_mut()[0] = t as u8;
                    let fence = CpuFence::new();
                    lease.record_fence(fence.clone());
                    drop(lease);
                    fence.signal();
                }
            });
        }
    });
    let s = pool.stats();
    assert_eq!(s.fallbacks, 0, "{s:?}");
    assert_eq!(s.allocations as usize, 2 * THREADS, "{s:?}");
    assert_eq!(s.bytes_in_use, 0);
}
