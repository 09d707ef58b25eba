//! Prefetching under a budget: a prefetch that finds no room waits, first in the queue, and
//! runs as soon as a lease lets room go (it used to be dropped, so the shard was missed when
//! read); and, with the readers' schedule, a prefetch may displace a shard that no reader needs
//! before its own last read (the shard straddling two workers' runs) and never one needed
//! sooner.

mod support;

use std::time::{Duration, Instant};

use longshore_shards::cache::{CacheConfig, ShardCache};
use longshore_shards::store::{ShardList, ShardStore};
use support::{local_list, write_local_shards};

/// Waits (bounded) until `shard` is complete on disk; `false` if it never is.
fn arrives(cache: &ShardCache, list: &ShardList, shard: usize, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        let u = cache.usage().unwrap();
        if u.reserved_bytes == 0
            && let Some(lease) = cache.get_cached(&list.shards[shard]).unwrap()
        {
            lease.release_unread();
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn cache_of(
    shards: usize,
    budget_shards: u64,
) -> (tempfile::TempDir, tempfile::TempDir, ShardList, ShardCache) {
    let src = tempfile::tempdir().unwrap();
    write_local_shards(src.path(), &vec![100; shards]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), shards);
    let dir = tempfile::tempdir().unwrap();
    let cache = ShardCache::open(
        CacheConfig::new(dir.path(), 100 * budget_shards),
        store,
        &list,
    )
    .unwrap();
    (src, dir, list, cache)
}

#[test]
fn a_prefetch_without_room_runs_when_a_lease_lets_room_go() {
    let (_src, _dir, list, cache) = cache_of(4, 2);
    let a = cache.get(&list.shards[0]).unwrap();
    let b = cache.get(&list.shards[1]).unwrap();
    cache.prefetch(&list.shards[2..3]);
    // Both shards are leased and unread: no room, and nothing is evicted for a prefetch.
    assert!(!arrives(&cache, &list, 2, Duration::from_millis(200)));
    assert_eq!(cache.stats().downloads, 2);
    // Shard 0 is read and let go: the waiting prefetch takes its room, with no new call.
    a.release();
    assert!(
        arrives(&cache, &list, 2, Duration::from_secs(10)),
        "the prefetch never ran: {:?}",
        cache.stats()
    );
    let st = cache.stats();
    assert_eq!((st.downloads, st.evictions), (3, 1), "{st:?}");
    assert!(cache.get_cached(&list.shards[0]).unwrap().is_none());
    drop(b);
}

/// Two readers on one time axis, as a sharded dataset's two workers register them: reader 0
/// reads shard 0, shard 1, shard 0 again, shard 1 again, then (at `late`) shard 4; reader 1
/// reads shard 4 first, then shard 3. Four shards are live at once (ticks 6-8) and the budget
/// holds 3: below the working set. Shards 0, 3 and 4 are on disk when reader 0 is about to
/// start shard 1.
fn straddle(late: u64) -> (bool, bool, ShardCache, ShardList) {
    let (src, dir, list, cache) = cache_of(5, 3);
    let r0 = cache.schedule_reader(
        0,
        [(0, 0), (2, 0), (4, 0), (6, 1), (8, 0), (10, 1), (late, 4)],
    );
    let r1 = cache.schedule_reader(0, [(1, 4), (3, 3), (5, 3), (7, 3), (9, 3), (11, 3)]);
    r0.advance(0);
    r1.advance(1);
    cache.get(&list.shards[4]).unwrap().release();
    r1.advance(3);
    let held3 = cache.get(&list.shards[3]).unwrap();
    let held0 = cache.get(&list.shards[0]).unwrap();
    r0.advance(2);
    cache.prefetch(&list.shards[1..2]);
    let fetched = arrives(&cache, &list, 1, Duration::from_secs(2));
    let kept = cache.get_cached(&list.shards[4]).unwrap().is_some();
    drop((held0, held3, r0, r1));
    std::mem::forget((src, dir));
    (fetched, kept, cache, list)
}

#[test]
fn a_prefetch_displaces_a_shard_read_only_after_its_own_last_read() {
    // Shard 4 is read again at tick 12, after shard 1's last read (10): Belady's rule evicts it
    // for shard 1, which is then on disk before reader 0 starts it.
    let (fetched, kept, cache, _) = straddle(12);
    assert!(fetched, "shard 1 was not prefetched: {:?}", cache.stats());
    assert!(!kept, "shard 4 should have made room");
    let st = cache.stats();
    assert_eq!((st.downloads, st.evictions), (4, 1), "{st:?}");
}

#[test]
fn a_prefetch_never_displaces_a_shard_read_before_its_own_last_read() {
    // Shard 4 is read again at tick 9, while shard 1 is being read: evicting it for shard 1
    // would download it again, so the prefetch waits.
    let (fetched, kept, cache, _) = straddle(9);
    assert!(
        !fetched,
        "shard 1 took room still needed: {:?}",
        cache.stats()
    );
    assert!(kept);
    assert_eq!(cache.stats().evictions, 0);
}
