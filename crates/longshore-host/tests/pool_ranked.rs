//! Ranked waiting (issue 29): under `BudgetPolicy::Wait`, a block coming back goes to the
//! best-ranked waiting request (plain `alloc` ranks last), and a pending block's fence
//! completing wakes the waiter through the pool's reaper.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longshore_host::{BudgetPolicy, CpuFence, MemoryKind, PinnedPool, PoolConfig, UNRANKED};

const BLOCK: usize = 1 << 20;

fn pool(blocks: usize) -> PinnedPool {
    PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(blocks * BLOCK)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_secs(20),
            }),
    )
    .unwrap()
}

/// Waits until `n` requests are queued on the pool's budget.
fn until_waiting(pool: &PinnedPool, n: usize) {
    let t0 = Instant::now();
    while pool.stats().waiting < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", pool.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_returning_block_goes_to_the_best_ranked_waiter() {
    let pool = pool(1);
    pool.record_grants(true);
    let held = pool.alloc_ranked(BLOCK, 0).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    // Queued in this order; served by rank, plain `alloc` last.
    for (i, rank) in [9u64, UNRANKED, 3, 5].into_iter().enumerate() {
        let (p, order) = (pool.clone(), order.clone());
        threads.push(std::thread::spawn(move || {
            let b = if rank == UNRANKED {
                p.alloc(BLOCK).unwrap()
            } else {
                p.alloc_ranked(BLOCK, rank).unwrap()
            };
            order.lock().unwrap().push(rank);
            assert!(b.waited() > Duration::ZERO);
            drop(b); // hands the block to the next one
        }));
        until_waiting(&pool, i + 1);
    }
    drop(held);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![3, 5, 9, UNRANKED]);
    let grants = pool.grants();
    // The first lease (an allocation, through the queue), then the four waiters by rank.
    let ranks: Vec<u64> = grants.iter().map(|g| g.rank).collect();
    assert_eq!(ranks, vec![0, 3, 5, 9, UNRANKED], "{grants:?}");
    assert_eq!(grants[2].best_waiting, Some(9), "{grants:?}");
    let s = pool.stats();
    assert_eq!(s.waits, 4);
    assert_eq!(s.allocations, 1, "one block, handed on four times");
    assert!(s.peak_bytes_held <= BLOCK);
}

#[test]
fn a_better_ranked_arrival_goes_before_the_queue() {
    let pool = pool(1);
    let held = pool.alloc(BLOCK).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |rank: u64| {
        let (pool, order) = (pool.clone(), order.clone());
        std::thread::spawn(move || {
            let b = pool.alloc_ranked(BLOCK, rank).unwrap();
            order.lock().unwrap().push(rank);
            drop(b);
        })
    };
    let late = spawn(7);
    until_waiting(&pool, 1);
    let early = spawn(2);
    until_waiting(&pool, 2);
    drop(held);
    late.join().unwrap();
    early.join().unwrap();
    assert_eq!(*order.lock().unwrap(), vec![2, 7]);
}

#[test]
fn a_fence_completing_wakes_the_waiter_without_a_new_release() {
    let pool = pool(1);
    let mut b = pool.alloc(BLOCK).unwrap();
    let addr = b.as_ptr() as usize;
    let fence = CpuFence::new();
    b.record_fence(fence.clone());
    let waiter = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let b = pool.alloc_ranked(BLOCK, 1).unwrap();
            (b.as_ptr() as usize, b.waited())
        })
    };
    until_waiting(&pool, 1);
    drop(b); // pending on the fence: nothing to hand out yet
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !waiter.is_finished(),
        "a block under a pending fence is not reused"
    );
    assert_eq!(pool.stats().blocks_pending, 1);
    fence.signal(); // the reaper sees it complete and hands the block on
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, addr, "the same block, reused once its fence completed");
    assert!(waited >= Duration::from_millis(30));
    let s = pool.stats();
    assert_eq!((s.allocations, s.blocks_pending), (1, 0));
}

#[test]
fn a_timed_out_waiter_lets_the_ones_behind_it_through() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(2 * BLOCK)
            .policy(BudgetPolicy::Wait {
                timeout: Duration::from_millis(200),
            }),
    )
    .unwrap();
    // Two blocks in use: a request for two more cannot be served, and one of them first in
    // line must not hold back a smaller one behind it forever.
    let a = pool.alloc(BLOCK).unwrap();
    let big = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.alloc_ranked(2 * BLOCK, 0).map(|_| ()))
    };
    until_waiting(&pool, 1);
    // The small request's own timeout ends well after the big one's.
    std::thread::sleep(Duration::from_millis(60));
    let small = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.alloc_ranked(BLOCK, 1).map(|b| b.len()))
    };
    until_waiting(&pool, 2);
    assert!(big.join().unwrap().is_err(), "the big request times out");
    // Behind it, the small one fits in the budget's room.
    assert_eq!(small.join().unwrap().unwrap(), BLOCK);
    drop(a);
}

/// A block that went through the free list once and later came back pending is reused once
/// its fence completes, instead of a new allocation (the free list of its class is there but
/// empty: found on the GPU, where every lease of a prefetcher's steady state allocated anew).
#[test]
fn a_completed_pending_block_is_reused_after_its_class_was_free_before() {
    let pool = pool(64);
    // Through the free list once: the class now has an (empty) free list.
    drop(pool.alloc(BLOCK).unwrap());
    for round in 0..4 {
        let mut b = pool.alloc(BLOCK).unwrap();
        let fence = CpuFence::new();
        b.record_fence(fence.clone());
        drop(b); // pending behind its fence
        fence.signal();
        let s = pool.stats();
        assert_eq!(s.allocations, 1, "round {round}: {s:?}");
    }
    let again = pool.alloc(BLOCK).unwrap();
    let s = pool.stats();
    assert_eq!((s.allocations, s.blocks_pending), (1, 0), "{s:?}");
    drop(again);
}
