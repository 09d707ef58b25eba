//! The shard cache's byte budget: a budget smaller than a shard is refused up front; a cache
//! full of leased shards fails after its wait limit instead of hanging, and proceeds when a
//! lease is released; and, under random shard sizes, access orders, leases and prefetches,
//! the bytes on disk (complete and in progress) never exceed the budget.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use longshore_shards::ShardError;
use longshore_shards::cache::{CacheConfig, ShardCache};
use longshore_shards::store::{ShardInfo, ShardList, ShardStore};
use proptest::prelude::*;
use support::{cache_disk_bytes, local_list, write_local_shards};

fn config(dir: &std::path::Path, budget: u64, wait_ms: u64) -> CacheConfig {
    CacheConfig {
        wait_timeout: Duration::from_millis(wait_ms),
        ..CacheConfig::new(dir, budget)
    }
}

#[test]
fn a_budget_smaller_than_the_largest_shard_is_refused() {
    let src = tempfile::tempdir().unwrap();
    write_local_shards(src.path(), &[100, 250, 80]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 3);
    let cache_dir = tempfile::tempdir().unwrap();
    let err =
        ShardCache::open(config(cache_dir.path(), 249, 10), store.clone(), &list).unwrap_err();
    assert!(
        matches!(&err, ShardError::BudgetTooSmall { budget: 249, shard_size: 250, url }
            if url.ends_with("shard-0001.bin")),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("249") && msg.contains("250") && msg.contains("shard-0001.bin"),
        "{msg}"
    );

    // Equal to the largest is enough; a shard outside the list that is larger is refused.
    let cache = ShardCache::open(config(cache_dir.path(), 250, 10), store, &list).unwrap();
    let big = ShardInfo {
        url: "file:///nowhere/big.bin".into(),
        size: 251,
        etag: None,
    };
    assert!(matches!(
        cache.get(&big),
        Err(ShardError::BudgetTooSmall { .. })
    ));
}

#[test]
fn a_cache_full_of_leased_shards_fails_after_the_wait_limit_and_frees_on_release() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[60, 60]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 2);
    let dir = tempfile::tempdir().unwrap();
    let cache = ShardCache::open(config(dir.path(), 100, 150), store, &list).unwrap();

    let a = cache.get(&list.shards[0]).unwrap();
    assert_eq!(a.read_all().unwrap(), bytes[0]);
    let err = cache.get(&list.shards[1]).unwrap_err();
    assert!(
        matches!(
            err,
            ShardError::CacheFull {
                needed: 60,
                budget: 100,
                leased: 60,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("shard-0001.bin"), "{err}");

    // A reader releases its shard while another waits: the waiter proceeds.
    let cache = ShardCache::open(
        config(dir.path(), 100, 10_000),
        ShardStore::from_env(),
        &list,
    )
    .unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&released);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.store(true, Ordering::SeqCst);
        a.release();
    });
    let b = cache.get(&list.shards[1]).unwrap();
    assert!(
        released.load(Ordering::SeqCst),
        "b fit only after a was released"
    );
    assert_eq!(b.read_all().unwrap(), bytes[1]);
    assert!(cache.stats().waits > 0 && cache.stats().evictions == 1);
    t.join().unwrap();
}

#[test]
fn prefetch_fills_the_budget_in_order_and_evicts_only_consumed_shards() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[100; 8]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 8);
    let dir = tempfile::tempdir().unwrap();
    let cache = ShardCache::open(config(dir.path(), 300, 1000), store, &list).unwrap();
    cache.prefetch(&list.shards);
    let settled = |downloads: u64| {
        for _ in 0..1000 {
            let u = cache.usage().unwrap();
            if cache.stats().downloads == downloads && u.reserved_bytes == 0 {
                assert_eq!(u.complete_bytes, 300, "{u:?}");
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!(
            "prefetch did not reach {downloads} downloads: {:?}",
            cache.stats()
        );
    };
    settled(3);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(cache.stats().downloads, 3, "the first three, then no room");
    for (i, want) in bytes.iter().enumerate().take(3) {
        let s = cache.get(&list.shards[i]).unwrap();
        assert_eq!(&s.read_all().unwrap(), want);
        // Consumed: the next prefetch may take its room, and no other.
        s.release();
        cache.prefetch(&list.shards[i + 1..]);
    }
    settled(6);
    let st = cache.stats();
    assert_eq!((st.hits, st.downloads, st.evictions), (3, 6, 3), "{st:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Release(usize),
    Prefetch(usize),
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..n).prop_map(Op::Get),
        2 => (0..8usize).prop_map(Op::Release),
        1 => (0..n).prop_map(Op::Prefetch),
    ]
}

fn case() -> impl Strategy<Value = (Vec<usize>, u64, Vec<Op>)> {
    prop::collection::vec(1usize..2000, 2..8).prop_flat_map(|sizes| {
        let n = sizes.len();
        let largest = *sizes.iter().max().unwrap() as u64;
        let total: u64 = sizes.iter().map(|&s| s as u64).sum();
        (
            Just(sizes),
            largest..=total,
            prop::collection::vec(op(n), 1..24),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn eviction_never_exceeds_the_budget((sizes, budget, ops) in case()) {
        let src = tempfile::tempdir().unwrap();
        let bytes = write_local_shards(src.path(), &sizes);
        let store = ShardStore::from_env();
        let list: ShardList = local_list(&store, src.path(), sizes.len());
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardCache::open(config(dir.path(), budget, 150), store, &list).unwrap();

        // A watcher samples the disk the whole time, prefetch threads included.
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(AtomicU64::new(0));
        let watcher = {
            let (stop, worst) = (Arc::clone(&stop), Arc::clone(&worst));
            let root = dir.path().to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    worst.fetch_max(cache_disk_bytes(&root), Ordering::SeqCst);
                    std::thread::yield_now();
                }
            })
        };
        let mut held: Vec<(usize, longshore_shards::cache::CachedShard)> = Vec::new();
        for op in ops {
            match op {
                Op::Get(i) => match cache.get(&list.shards[i]) {
                    Ok(s) => {
                        prop_assert_eq!(s.read_all().unwrap(), bytes[i].clone());
                        held.push((i, s));
                    }
                    Err(ShardError::CacheFull { needed, leased, .. }) => {
                        // Only when the shards this test holds leave no room.
                        let distinct: std::collections::BTreeSet<usize> =
                            held.iter().map(|(j, _)| *j).collect();
                        let mine: u64 = distinct.iter().map(|j| sizes[*j] as u64).sum();
                        prop_assert_eq!(leased, mine);
                        prop_assert!(mine + needed > budget, "full with {mine} leased of {budget}");
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                },
                Op::Release(k) => {
                    if !held.is_empty() {
                        drop(held.remove(k % held.len()));
                    }
                }
                Op::Prefetch(i) => cache.prefetch(&list.shards[i..]),
            }
            let u = cache.usage().unwrap();
            prop_assert!(u.complete_bytes + u.reserved_bytes <= budget, "{u:?}");
        }
        drop(held);
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        watcher.join().unwrap();
        let worst = worst.load(Ordering::SeqCst);
        prop_assert!(worst <= budget, "{worst} bytes on disk, budget {budget}");
    }
}

#[test]
fn a_shard_leased_again_skips_the_index_but_never_an_eviction() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[60, 60, 60]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 3);
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index.json");
    let cache = ShardCache::open(config(dir.path(), 120, 150), store, &list).unwrap();

    // The first lease and its release go through the index; the next ones do not.
    cache.get(&list.shards[0]).unwrap().release();
    let before = std::fs::read(&index).unwrap();
    for _ in 0..3 {
        let a = cache.get_cached(&list.shards[0]).unwrap().expect("on disk");
        assert_eq!(a.read_all().unwrap(), bytes[0]);
        let b = cache.get(&list.shards[0]).unwrap();
        drop((a, b));
    }
    assert_eq!(std::fs::read(&index).unwrap(), before, "no index write");
    assert_eq!(cache.stats().hits, 6);

    // A lease taken that way still holds the shard against evictions.
    let held = cache.get(&list.shards[0]).unwrap();
    cache.get(&list.shards[1]).unwrap().release();
    cache.get(&list.shards[2]).unwrap().release(); // evicts shard 1, not the held 0
    assert!(held.path().exists());
    assert_eq!(cache.stats().evictions, 1);
    drop(held);

    // Once evicted, the shard is downloaded again, never taken from what the process knew.
    cache.get(&list.shards[1]).unwrap().release(); // evicts 0 (consumed, least recently used)
    assert_eq!(cache.stats().evictions, 2);
    assert!(cache.get_cached(&list.shards[0]).unwrap().is_none());
    let downloads = cache.stats().downloads;
    let again = cache.get(&list.shards[0]).unwrap();
    assert_eq!(again.read_all().unwrap(), bytes[0]);
    assert_eq!(cache.stats().downloads, downloads + 1);
    assert!(cache.usage().unwrap().complete_bytes <= 120);
}
