//! Readers that hold leases while idle never starve a reader waiting for room: with a cache
//! budget of one shard, two workers' readers that take turns (as a loader's in-order delivery
//! makes them) each need the shard the other holds; the lease keeper lets the idle reader's
//! lease go, in the same process and across processes, so both read everything.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use longshore_data::{IterableDataset, WorkerInfo};
use longshore_shards::cache::CacheConfig;
use longshore_shards::dataset::ShardedDataset;
use support::data::{largest_shard, pattern, write_shards};

const COUNTS: [u64; 4] = [6, 6, 6, 6];

/// A 2-worker, unshuffled dataset over the shards in `src`, with a cache budget of its
/// largest shard and a 5 s wait limit (a starved reader fails instead of hanging).
fn dataset(src: &Path, cache: &Path) -> ShardedDataset {
    let largest = largest_shard(src, COUNTS.len());
    let mut config = CacheConfig::new(cache, largest);
    config.wait_timeout = Duration::from_secs(5);
    ShardedDataset::webdataset([pattern(&src.display().to_string(), COUNTS.len())])
        .shuffle(false)
        .rank(0)
        .world_size(1)
        .cache_config(config)
        .build()
        .unwrap()
}

/// `(global id, shard)` of each sample a reader delivers, failing on an error.
fn take(
    it: &mut dyn Iterator<
        Item = Result<longshore_shards::dataset::ShardSample, longshore_data::DataError>,
    >,
) -> Option<(u64, usize)> {
    it.next().map(|r| {
        let s = r.unwrap_or_else(|e| panic!("a reader failed: {e:?}"));
        assert_eq!(s.sample.int("val").unwrap() as u64, s.id.global);
        (s.id.global, s.id.shard)
    })
}

#[test]
fn readers_taking_turns_under_a_one_shard_budget_read_everything() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &COUNTS);
    let ds = dataset(src.path(), &src.path().join("cache"));
    let mut a = ds.iter(WorkerInfo::new(0, 2, 0).unwrap());
    let mut b = ds.iter(WorkerInfo::new(1, 2, 0).unwrap());
    let mut seen = Vec::new();
    let (mut shards_a, mut shards_b) = (Vec::new(), Vec::new());
    loop {
        let x = take(&mut a);
        let y = take(&mut b);
        if x.is_none() && y.is_none() {
            break;
        }
        for (got, shards) in [(x, &mut shards_a), (y, &mut shards_b)] {
            if let Some((global, shard)) = got {
                seen.push(global);
                shards.push(shard);
            }
        }
    }
    seen.sort_unstable();
    let total: u64 = COUNTS.iter().sum();
    assert_eq!(seen, (0..total).collect::<Vec<_>>());
    // The workers read different shards at each turn, so each waited for the other's lease.
    assert!(
        shards_a.iter().zip(&shards_b).all(|(x, y)| x != y),
        "{shards_a:?} {shards_b:?}"
    );
    assert!(ds.cache().stats().waits > 0, "{:?}", ds.cache().stats());
}

/// Run by the test below in a child process: worker 0 reads one sample, says so, and sits
/// idle (holding its lease) until the parent is done, then reads the rest.
#[test]
fn child_holds_an_idle_reader() {
    let (Ok(src), Ok(cache), Ok(signals)) = (
        std::env::var("LONGSHORE_TEST_SRC"),
        std::env::var("LONGSHORE_TEST_CACHE"),
        std::env::var("LONGSHORE_TEST_SIGNALS"),
    ) else {
        return; // not a child
    };
    let signals = PathBuf::from(signals);
    let ds = dataset(Path::new(&src), Path::new(&cache));
    let mut a = ds.iter(WorkerInfo::new(0, 2, 0).unwrap());
    let mut seen = vec![take(&mut a).unwrap().0];
    std::fs::write(signals.join("ready"), "").unwrap();
    let start = Instant::now();
    while !signals.join("done").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the parent never finished"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    while let Some((global, _)) = take(&mut a) {
        seen.push(global);
    }
    std::fs::write(signals.join("child"), format!("{seen:?}")).unwrap();
}

#[test]
fn a_reader_idle_in_another_process_lets_its_lease_go() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &COUNTS);
    let cache = src.path().join("cache");
    let signals = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_an_idle_reader", "--nocapture"])
        .env("LONGSHORE_TEST_SRC", src.path())
        .env("LONGSHORE_TEST_CACHE", &cache)
        .env("LONGSHORE_TEST_SIGNALS", signals.path())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !signals.path().join("ready").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended before reading"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the child never read"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Worker 1 here needs room the child's idle reader holds.
    let ds = dataset(src.path(), &cache);
    let mut b = ds.iter(WorkerInfo::new(1, 2, 0).unwrap());
    let mut seen = Vec::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        while let Some((global, _)) = take(&mut b) {
            seen.push(global);
        }
    }));
    std::fs::write(signals.path().join("done"), "").unwrap();
    let status = child.wait().unwrap();
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
    assert!(status.success(), "the child failed: {status}");
    assert!(ds.cache().stats().waits > 0, "{:?}", ds.cache().stats());
    let child_seen: Vec<u64> = std::fs::read_to_string(signals.path().join("child"))
        .unwrap()
        .trim_matches(['[', ']'])
        .split(", ")
        .map(|v| v.parse().unwrap())
        .collect();
    seen.extend(child_seen);
    seen.sort_unstable();
    let total: u64 = COUNTS.iter().sum();
    assert_eq!(seen, (0..total).collect::<Vec<_>>());
}
