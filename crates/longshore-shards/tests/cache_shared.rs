//! One cache directory shared by threads and by processes (each with its own handle, as a
//! node's ranks and workers have): every shard is downloaded once; the node-wide download
//! limit holds; the budget holds under contention; and the cache works end to end over the
//! in-process S3 server.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use longshore_shards::cache::{CacheConfig, ShardCache};
use longshore_shards::store::{FaultyStore, ShardList, ShardStore};
use support::{cache_disk_bytes, faulty, local_list, shard_bytes, write_local_shards};

/// A shuffled copy of `0..n`, different per `seed`.
fn order(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

#[test]
fn threads_with_their_own_handles_download_each_shard_once() {
    let src = tempfile::tempdir().unwrap();
    let sizes: Vec<usize> = (0..12).map(|i| 20_000 + 1000 * i).collect();
    let bytes = Arc::new(write_local_shards(src.path(), &sizes));
    let (store, slot) = faulty(ShardStore::builder(), |inner| {
        FaultyStore::with_plan(inner, [])
    });
    let list = Arc::new(local_list(&store, src.path(), sizes.len()));
    slot.get().set_latency(Duration::from_millis(20)); // downloads overlap
    let dir = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let (store, list, bytes) = (store.clone(), Arc::clone(&list), Arc::clone(&bytes));
            let dir = dir.path().to_owned();
            std::thread::spawn(move || {
                let mut config = CacheConfig::new(dir, 1 << 30);
                config.max_concurrent_downloads = 3;
                let cache = ShardCache::open(config, store, &list).unwrap();
                for i in order(list.len(), t) {
                    let s = cache.get(&list.shards[i]).unwrap();
                    assert_eq!(s.read_all().unwrap(), bytes[i]);
                }
                cache.stats()
            })
        })
        .collect();
    let stats: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let downloads: u64 = stats.iter().map(|s| s.downloads).sum();
    let hits: u64 = stats.iter().map(|s| s.hits).sum();
    assert_eq!(downloads, 12, "{stats:?}");
    assert_eq!(hits, 6 * 12 - 12, "{stats:?}");
    let st = slot.stats();
    assert_eq!(st.gets, 12, "one GET per shard on the node: {st:?}");
    assert!(st.max_in_flight_gets <= 3, "the node-wide limit: {st:?}");
    assert!(st.max_in_flight_gets >= 2, "downloads did overlap: {st:?}");
}

#[test]
fn threads_under_a_small_budget_never_exceed_it() {
    let src = tempfile::tempdir().unwrap();
    let sizes: Vec<usize> = (0..10).map(|i| 3000 + 700 * (i % 4)).collect();
    let bytes = Arc::new(write_local_shards(src.path(), &sizes));
    let store = ShardStore::from_env();
    let list = Arc::new(local_list(&store, src.path(), sizes.len()));
    let budget = 3 * 5100;
    let dir = tempfile::tempdir().unwrap();
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
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (store, list, bytes) = (store.clone(), Arc::clone(&list), Arc::clone(&bytes));
            let dir = dir.path().to_owned();
            std::thread::spawn(move || {
                let cache = ShardCache::open(CacheConfig::new(dir, budget), store, &list).unwrap();
                for round in 0..3 {
                    let ord = order(list.len(), t * 10 + round);
                    for (k, &i) in ord.iter().enumerate() {
                        let s = cache.get(&list.shards[i]).unwrap();
                        let upcoming: Vec<_> = ord[k + 1..]
                            .iter()
                            .map(|&j| list.shards[j].clone())
                            .collect();
                        cache.prefetch(&upcoming);
                        assert_eq!(s.read_all().unwrap(), bytes[i]);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let worst = worst.load(Ordering::SeqCst);
    assert!(worst <= budget, "{worst} bytes on disk, budget {budget}");
}

/// Run by the test below in child processes: reads every shard once through its own handle,
/// and writes its download count to a report file.
#[test]
fn child_reads_every_shard() {
    let (Ok(cache_dir), Ok(src), Ok(report)) = (
        std::env::var("LONGSHORE_TEST_CACHE"),
        std::env::var("LONGSHORE_TEST_SRC"),
        std::env::var("LONGSHORE_TEST_REPORT"),
    ) else {
        return; // not a child
    };
    let seed: u64 = std::env::var("LONGSHORE_TEST_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let (store, slot) = faulty(ShardStore::builder(), |inner| {
        FaultyStore::with_plan(inner, [])
    });
    let n: usize = std::env::var("LONGSHORE_TEST_SHARDS")
        .unwrap()
        .parse()
        .unwrap();
    let list = local_list(&store, Path::new(&src), n);
    slot.get().set_latency(Duration::from_millis(10));
    let cache = ShardCache::open(CacheConfig::new(&cache_dir, 1 << 30), store, &list).unwrap();
    for i in order(n, seed) {
        let s = cache.get(&list.shards[i]).unwrap();
        assert_eq!(s.read_all().unwrap(), shard_bytes(i as u64 + 1, 10_000 + i));
    }
    std::fs::write(
        report,
        format!("{} {}", cache.stats().downloads, slot.stats().gets),
    )
    .unwrap();
}

#[test]
fn processes_share_one_directory_without_double_downloads() {
    let n = 10;
    let src = tempfile::tempdir().unwrap();
    let sizes: Vec<usize> = (0..n).map(|i| 10_000 + i).collect();
    write_local_shards(src.path(), &sizes);
    let dir = tempfile::tempdir().unwrap();
    let reports = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..3)
        .map(|p| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_reads_every_shard", "--test-threads=1"])
                .env("LONGSHORE_TEST_CACHE", dir.path())
                .env("LONGSHORE_TEST_SRC", src.path())
                .env("LONGSHORE_TEST_SHARDS", n.to_string())
                .env("LONGSHORE_TEST_SEED", p.to_string())
                .env("LONGSHORE_TEST_REPORT", reports.path().join(p.to_string()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child failed");
    }
    let (mut downloads, mut gets) = (0, 0);
    for p in 0..3 {
        let text = std::fs::read_to_string(reports.path().join(p.to_string())).unwrap();
        let (d, g) = text.split_once(' ').unwrap();
        downloads += d.parse::<u64>().unwrap();
        gets += g.parse::<u64>().unwrap();
    }
    assert_eq!(
        downloads, n as u64,
        "each shard downloaded once on the node"
    );
    assert_eq!(gets, n as u64, "one GET per shard on the node");
}

#[test]
fn the_cache_over_s3() {
    let server = support::s3::start();
    let shards: Vec<Vec<u8>> = (0..5)
        .map(|i| shard_bytes(i, 50_000 + 17 * i as usize))
        .collect();
    for (i, b) in shards.iter().enumerate() {
        server.put(&format!("train/shard-{i:06}.tar"), b);
    }
    let store = server.store_builder().build();
    let list: ShardList = store
        .resolve(&[server.url("train/shard-{000000..000004}.tar")])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = ShardCache::open(CacheConfig::new(dir.path(), 120_000), store, &list).unwrap();
    cache.prefetch(&list.shards);
    for (i, s) in list.shards.iter().enumerate() {
        let got = cache.get(s).unwrap();
        assert_eq!(got.read_all().unwrap(), shards[i]);
        assert_eq!(std::fs::read(got.path()).unwrap(), shards[i]);
    }
    let st = cache.stats();
    assert_eq!(st.downloads, 5, "{st:?}");
    assert!(cache.usage().unwrap().complete_bytes <= 120_000);
}
