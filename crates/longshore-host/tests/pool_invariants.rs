//! proptest: random sequences of alloc / free (with or without a pending fence) / fence
//! completion / collect / trim keep the pool's invariants.

use std::collections::HashMap;
use std::sync::Arc;

use longshore_host::{
    BudgetPolicy, CpuFence, HostError, MemoryKind, PinnedPool, PoolBuffer, PoolConfig, size_class,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free { lease: usize, fenced: bool },
    Complete(usize),
    Collect,
    Trim(usize),
    Reserve { len: usize, count: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..300_000).prop_map(Op::Alloc),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(lease, fenced)| Op::Free { lease, fenced }),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::Collect),
        1 => (0usize..1_000_000).prop_map(Op::Trim),
        1 => (1usize..300_000, 0usize..6).prop_map(|(len, count)| Op::Reserve { len, count }),
    ]
}

fn policy() -> impl Strategy<Value = BudgetPolicy> {
    prop_oneof![
        Just(BudgetPolicy::Error),
        Just(BudgetPolicy::FallbackPageable)
    ]
}

struct Model {
    pool: PinnedPool,
    live: Vec<PoolBuffer>,
    /// Fences not yet signalled, with the start address of the block they guard.
    fences: Vec<(Arc<CpuFence>, usize)>,
    budget: usize,
}

impl Model {
    fn check(&self) {
        let s = self.pool.stats();
        assert_eq!(
            s.bytes_in_use + s.bytes_cached + s.bytes_pending,
            s.bytes_held,
            "{s:?}"
        );
        assert!(
            s.bytes_held <= self.budget,
            "held {} > budget {}",
            s.bytes_held,
            self.budget
        );
        assert!(s.peak_bytes_held <= self.budget);
        let pooled: Vec<&PoolBuffer> = self.live.iter().filter(|b| !b.is_fallback()).collect();
        let in_use: usize = pooled.iter().map(|b| b.capacity()).sum();
        assert_eq!(in_use, s.bytes_in_use);
        assert_eq!(pooled.len(), s.blocks_in_use);
        // No two live leases overlap.
        let mut ranges: Vec<(usize, usize)> = self
            .live
            .iter()
            .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.capacity()))
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "leases overlap: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
        // A block is never handed out while a fence on it is pending.
        let guarded: HashMap<usize, ()> = self
            .fences
            .iter()
            .filter(|(f, _)| !longshore_host::Fence::is_complete(&**f))
            .map(|(_, a)| (*a, ()))
            .collect();
        for b in &pooled {
            assert!(
                !guarded.contains_key(&(b.as_ptr() as usize)),
                "a block was reused while its fence was pending"
            );
        }
    }
}

proptest! {
    // Under Miri (docs/reliability.md) a handful of cases: each one interprets hundreds of
    // allocations.
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 2 } else { 96 }, ..ProptestConfig::default() })]

    #[test]
    fn pool_invariants_hold(ops in proptest::collection::vec(op(), 1..120), policy in policy(), budget_pages in 64usize..400) {
        let budget = budget_pages * 4096;
        let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(budget).policy(policy)).unwrap();
        let mut m = Model { pool, live: Vec::new(), fences: Vec::new(), budget };
        for op in ops {
            match op {
                Op::Alloc(len) => match m.pool.alloc(len) {
                    Ok(mut b) => {
                        assert_eq!(b.len(), len);
                        assert!(b.capacity() >= len);
                        if !b.is_fallback() {
                            assert_eq!(b.capacity(), size_class(len).unwrap());
                        }
                        // The lease is writable in full.
                        b.as_bytes_mut().fill(0xAB);
                        m.live.push(b);
                    }
                    Err(HostError::BudgetExceeded { budget: bud, block, in_use, cached, pending, .. }) => {
                        prop_assert_eq!(policy, BudgetPolicy::Error);
                        prop_assert_eq!(bud, budget);
                        // Refused only if even evicting the whole cache could not make room.
                        prop_assert!(in_use + pending + block > budget, "refused with room: in_use {} cached {} pending {} block {}", in_use, cached, pending, block);
                    }
                    Err(HostError::LargerThanBudget { block, .. }) => {
                        prop_assert_eq!(policy, BudgetPolicy::Error);
                        prop_assert!(block > budget);
                    }
                    Err(e) => panic!("unexpected error {e}"),
                },
                Op::Free { lease, fenced } => {
                    if !m.live.is_empty() {
                        let mut b = m.live.swap_remove(lease % m.live.len());
                        if fenced {
                            let f = CpuFence::new();
                            b.record_fence(f.clone());
                            if !b.is_fallback() {
                                m.fences.push((f, b.as_ptr() as usize));
                            } else {
                                f.signal(); // a fallback buffer would block in drop otherwise
                            }
                        }
                        drop(b);
                    }
                }
                Op::Complete(i) => {
                    if !m.fences.is_empty() {
                        let (f, _) = m.fences.swap_remove(i % m.fences.len());
                        f.signal();
                    }
                }
                Op::Collect => {
                    m.pool.collect();
                }
                Op::Trim(bytes) => {
                    m.pool.trim_to(bytes);
                    prop_assert!(m.pool.stats().bytes_cached <= bytes);
                }
                Op::Reserve { len, count } => {
                    let class = size_class(len).unwrap();
                    let before = m.pool.stats();
                    let cached = m.pool.reserve(len, count).unwrap();
                    let after = m.pool.stats();
                    // Nothing in use or pending changes; only blocks of the class are added.
                    prop_assert_eq!(after.bytes_in_use, before.bytes_in_use);
                    prop_assert_eq!(after.bytes_pending, before.bytes_pending);
                    prop_assert_eq!(after.fallbacks, before.fallbacks);
                    prop_assert_eq!((after.bytes_cached - before.bytes_cached) % class, 0);
                    let added = (after.bytes_cached - before.bytes_cached) / class;
                    prop_assert_eq!(after.allocations - before.allocations, added as u64);
                    if cached < count {
                        // Stopped by a limit: one more block would not have fit.
                        prop_assert!(after.bytes_held + class > budget, "reserve stopped at {} of {} with room", cached, count);
                    }
                    // The reserved blocks serve leases without allocating.
                    if cached > 0 {
                        let hits = after.hits;
                        let b = m.pool.alloc(len).unwrap();
                        prop_assert!(!b.is_fallback());
                        prop_assert_eq!(m.pool.stats().hits, hits + 1);
                        m.live.push(b);
                    }
                }
            }
            m.check();
        }
        // Every block is eventually reusable once its fences complete.
        for (f, _) in m.fences.drain(..) {
            f.signal();
        }
        m.live.clear();
        m.pool.collect();
        let s = m.pool.stats();
        prop_assert_eq!(s.bytes_in_use, 0);
        prop_assert_eq!(s.bytes_pending, 0);
        prop_assert_eq!(s.bytes_cached, s.bytes_held);
        m.pool.empty_cache();
        prop_assert_eq!(m.pool.stats().bytes_held, 0);
    }

    #[test]
    fn size_classes_waste_at_most_a_quarter(len in 1usize..(1usize << 40)) {
        let c = size_class(len).unwrap();
        let page = longshore_host::sys::page_size();
        prop_assert!(c >= len);
        prop_assert_eq!(c % page, 0);
        if len >= 4 * page {
            prop_assert!((c - len) * 4 <= len, "class {} for {} wastes more than 25%", c, len);
        } else {
            prop_assert!(c - len < page.max(len.next_power_of_two() / 4) + page);
        }
        // Classes are monotone.
        prop_assert!(size_class(len + 1).unwrap() >= c);
    }
}

#[test]
fn size_class_examples() {
    let p = longshore_host::sys::page_size();
    assert_eq!(size_class(1), Some(p));
    assert_eq!(size_class(p), Some(p));
    assert_eq!(size_class(1 << 20), Some(1 << 20));
    assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + (1 << 18)));
    assert_eq!(size_class(3 * 224 * 224 * 4 * 256), Some(160 << 20)); // 147 MiB -> 160 MiB
    assert_eq!(size_class(0), None);
    assert_eq!(size_class(usize::MAX), None);
}

#[test]
fn one_slow_fence_does_not_block_reuse_of_other_blocks() {
    let pool =
        PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(64 << 20)).unwrap();
    let slow = CpuFence::new();
    let fast = CpuFence::new();
    let mut a = pool.alloc(1 << 20).unwrap();
    let mut b = pool.alloc(1 << 20).unwrap();
    let b_addr = b.as_ptr();
    a.record_fence(slow.clone()); // freed first, completes last
    b.record_fence(fast.clone());
    drop(a);
    drop(b);
    fast.signal();
    let c = pool.alloc(1 << 20).unwrap();
    assert_eq!(
        c.as_ptr(),
        b_addr,
        "the block whose fence completed is reused at once"
    );
    assert_eq!(pool.stats().blocks_pending, 1);
    assert_eq!(pool.stats().hits, 1);
    slow.signal();
}

#[test]
fn lifo_reuse_keeps_caches_warm() {
    let pool =
        PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(64 << 20)).unwrap();
    let a = pool.alloc(8192).unwrap();
    let b = pool.alloc(8192).unwrap();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    drop(a);
    drop(b);
    let c = pool.alloc(8192).unwrap();
    let d = pool.alloc(8192).unwrap();
    assert_eq!(c.as_ptr(), pb, "most recently freed first");
    assert_eq!(d.as_ptr(), pa);
}

#[test]
fn cache_cap_evicts_least_recently_used() {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(64 << 20)
            .max_cached_bytes(3 << 20),
    )
    .unwrap();
    let bufs: Vec<_> = (0..5).map(|_| pool.alloc(1 << 20).unwrap()).collect();
    drop(bufs);
    let s = pool.stats();
    assert_eq!(s.bytes_cached, 3 << 20);
    assert_eq!(s.frees, 2);
    assert_eq!(s.bytes_held, 3 << 20);
}
