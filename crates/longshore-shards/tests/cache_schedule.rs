//! A cache that knows the schedule (range reads off: every read of a shard not on disk a
//! download): with a budget below the shuffle window's working set, the downloads per epoch
//! stay within a few percent of Belady's bound computed offline from the
//! same order (where least-recently-used eviction makes ~28% more), every sample still read
//! exactly once; with a budget that holds the working set, each shard is downloaded once per
//! epoch; the stats count downloads, re-downloads, evictions and bytes per epoch; the warning
//! names the budget that would suffice, once; and another process's published schedule keeps
//! the shards it needs.

#[path = "support/schedule.rs"]
mod schedule;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longshore_data::{IterableDataset, WorkerInfo};
use longshore_loader::SampleErrorPolicy;
use longshore_shards::cache::{CacheConfig, ShardCache};
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::store::ShardStore;
use support::data::{Read, largest_shard, pattern, run_rank, write_shards};
use support::{local_list, write_local_shards};

const SHARDS: usize = 20;

/// 20 shards of 100 samples in `src`, a cache of `budget_shards` times the largest shard (the
/// loaders read batches of [`schedule::BATCH`]).
fn dataset(
    src: &Path,
    cache: &Path,
    block: u64,
    budget_shards: f64,
    prefetch: usize,
) -> (ShardedDataset, u64) {
    let largest = largest_shard(src, SHARDS);
    let budget = (largest as f64 * budget_shards) as u64;
    let ds = ShardedDataset::webdataset([pattern(&src.display().to_string(), SHARDS)])
        .seed(1)
        .shuffle_block(block)
        .rank(0)
        .world_size(1)
        .prefetch_shards(prefetch)
        // Every read of a shard not on disk a download: the eviction rule under test.
        .range_reads(false)
        .cache_config(CacheConfig::new(cache, budget))
        .build()
        .unwrap();
    (ds, budget)
}

/// Runs epoch `epoch` through a loader, checks every sample came exactly once, and returns the
/// cache's downloads in it and Belady's bound for the same order and budget.
fn epoch(ds: &ShardedDataset, epoch: u64, workers: usize, budget: u64) -> (u64, u64) {
    let read = Read::new(schedule::BATCH, workers)
        .epoch(epoch)
        .policy(SampleErrorPolicy::default());
    let batches = run_rank(ds, read, None);
    let mut seen: Vec<u64> = batches
        .into_iter()
        .flat_map(|b| b.unwrap())
        .map(|s| {
            assert_eq!(s.val, s.global);
            s.global
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..(SHARDS as u64 * 100)).collect::<Vec<_>>());
    let stats = ds.cache().epoch_stats();
    let this = stats
        .iter()
        .find(|e| e.epoch == epoch)
        .expect("epoch counted");
    let refs = schedule::node_refs(ds, epoch, &[0], workers);
    let (belady, _) = schedule::bounds(ds, &refs, budget);
    (this.downloads, belady)
}

#[test]
fn one_reader_under_a_small_budget_downloads_what_belady_does() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[100; SHARDS]);
    for prefetch in [0, 2] {
        let cache = tempfile::tempdir().unwrap();
        // The default shuffle: one block of the 20 shards, a working set of ~17 shards.
        let (ds, budget) = dataset(src.path(), cache.path(), u64::MAX, 3.0, prefetch);
        for e in 0..2 {
            let (downloads, belady) = epoch(&ds, e, 1, budget);
            eprintln!("prefetch {prefetch}, epoch {e}: {downloads} downloads, Belady {belady}");
            // Least recently used makes ~1,680 here (28% above the bound).
            assert!(
                downloads as f64 <= belady as f64 * 1.02,
                "{downloads} downloads, Belady's bound {belady}"
            );
        }
        let per_epoch = ds.cache().epoch_stats();
        let total = ds.cache().stats();
        assert_eq!(per_epoch.len(), 2);
        assert_eq!(
            per_epoch.iter().map(|e| e.downloads).sum::<u64>(),
            total.downloads
        );
        assert_eq!(
            per_epoch.iter().map(|e| e.redownloads).sum::<u64>(),
            total.redownloads
        );
        let e0 = per_epoch[0];
        // A cold cache: each shard's first download is none again, the others are.
        assert_eq!(e0.redownloads, e0.downloads - SHARDS as u64, "{e0:?}");
        assert!(e0.evictions >= e0.downloads - 3, "{e0:?}");
        assert!(e0.forced_evictions >= e0.redownloads, "{e0:?}");
        let sizes = schedule::sizes(&ds);
        let (small, big) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
        assert!(
            (small * e0.downloads..=big * e0.downloads).contains(&e0.downloaded_bytes),
            "{e0:?}"
        );
        assert!(cache_bytes(cache.path()) <= budget);
    }
}

#[test]
fn two_workers_under_a_small_budget_stay_near_belady() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[100; SHARDS]);
    let cache = tempfile::tempdir().unwrap();
    let (ds, budget) = dataset(src.path(), cache.path(), u64::MAX, 8.0, 2);
    for e in 0..2 {
        let (downloads, belady) = epoch(&ds, e, 2, budget);
        eprintln!("epoch {e}: {downloads} downloads, Belady {belady}");
        assert!(
            downloads as f64 <= belady as f64 * 1.1,
            "{downloads} downloads, Belady's bound {belady}"
        );
    }
}

#[test]
fn a_budget_that_holds_the_working_set_downloads_each_shard_once() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[100; SHARDS]);
    // Blocks of 3 shards: each worker reads one block at a time.
    let probe = tempfile::tempdir().unwrap();
    let (ds, _) = dataset(src.path(), probe.path(), 250, 20.0, 2);
    let sizes = schedule::sizes(&ds);
    let refs = schedule::node_refs(&ds, 0, &[0], 2);
    let ws = longshore_shards::cache::working_set_bytes(refs.iter().copied(), &sizes);
    let largest = *sizes.iter().max().unwrap();
    drop(ds);
    for room in [0, 2] {
        let cache = tempfile::tempdir().unwrap();
        let shards = (ws + room * largest) as f64 / largest as f64;
        let (ds, budget) = dataset(src.path(), cache.path(), 250, shards, 2);
        for e in 0..3 {
            let (downloads, belady) = epoch(&ds, e, 2, budget);
            eprintln!("room {room}, epoch {e}: {downloads} downloads, Belady {belady}");
            assert!(
                downloads as f64 <= SHARDS as f64 * 1.1,
                "{downloads} downloads of {SHARDS} shards with a budget of {budget} \
                 (working set {ws})"
            );
        }
    }
}

/// Warning events (target, message and the `working_set` field) seen by [`Capture`].
#[derive(Default)]
struct Seen {
    warnings: Vec<(String, String, Option<u64>)>,
}

/// A subscriber that keeps warnings.
struct Capture(Arc<Mutex<Seen>>);

struct Fields {
    message: String,
    working_set: Option<u64>,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "working_set" {
            self.working_set = Some(value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        let mut f = Fields {
            message: String::new(),
            working_set: None,
        };
        event.record(&mut f);
        self.0.lock().unwrap().warnings.push((
            event.metadata().target().to_owned(),
            f.message,
            f.working_set,
        ));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_budget_below_the_working_set_is_warned_about_once_naming_what_would_suffice() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[100; SHARDS]);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (ds, budget, ws) = tracing::subscriber::with_default(Capture(Arc::clone(&seen)), || {
        // One reader on this thread, no prefetch: every eviction happens here.
        let cache = tempfile::tempdir().unwrap();
        let (ds, budget) = dataset(src.path(), cache.path(), u64::MAX, 4.0, 0);
        for e in 0..2 {
            for s in ds.iter(WorkerInfo::single(0).with_epoch(e)) {
                s.unwrap();
            }
        }
        // The lease keeper drops a gone reader's schedule within ~20 ms.
        std::thread::sleep(Duration::from_millis(200));
        let ws = ds.cache().working_set();
        (ds, budget, ws)
    });
    let warnings: Vec<_> = std::mem::take(&mut seen.lock().unwrap().warnings)
        .into_iter()
        .filter(|(_, m, _)| m.contains("working set"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (target, message, named) = &warnings[0];
    assert_eq!(target, "longshore::shards");
    let named = named.expect("the working_set field");
    assert!(named > budget, "{named} vs {budget}");
    assert!(message.contains(&named.to_string()), "{message}");
    assert!(message.contains(&budget.to_string()), "{message}");
    assert!(ds.cache().stats().redownloads > 0);
    // The reader is gone: no schedule is left.
    assert_eq!(ws, None);
    // The offline working set of the same order is the one named.
    let refs = schedule::node_refs(&ds, 0, &[0], 1);
    let offline =
        longshore_shards::cache::working_set_bytes(refs.iter().copied(), &schedule::sizes(&ds));
    assert_eq!(named, offline);

    // A budget that holds it: no warning.
    let seen = Arc::new(Mutex::new(Seen::default()));
    tracing::subscriber::with_default(Capture(Arc::clone(&seen)), || {
        let cache = tempfile::tempdir().unwrap();
        let largest = *schedule::sizes(&ds).iter().max().unwrap();
        let (ds, _) = dataset(
            src.path(),
            cache.path(),
            u64::MAX,
            named as f64 / largest as f64 + 0.01,
            0,
        );
        for s in ds.iter(WorkerInfo::single(0)) {
            s.unwrap();
        }
        assert_eq!(ds.cache().epoch_stats()[0].redownloads, 0);
    });
    assert!(seen.lock().unwrap().warnings.is_empty());
}

/// The bytes of a cache directory's shard files.
fn cache_bytes(dir: &Path) -> u64 {
    support::cache_disk_bytes(dir)
}

/// Run by the test below in a child process: registers a schedule that reads shard 0 soon and
/// holds it until the parent is done.
#[test]
fn child_publishes_a_schedule() {
    let (Ok(src), Ok(cache), Ok(signals)) = (
        std::env::var("LONGSHORE_TEST_SRC"),
        std::env::var("LONGSHORE_TEST_CACHE"),
        std::env::var("LONGSHORE_TEST_SIGNALS"),
    ) else {
        return; // not a child
    };
    let signals = PathBuf::from(signals);
    let store = ShardStore::from_env();
    let list = local_list(&store, Path::new(&src), 3);
    let cache = ShardCache::open(CacheConfig::new(&cache, 200), store, &list).unwrap();
    let schedule = cache.schedule_reader(0, [(5, 0), (6, 0)]);
    std::fs::write(signals.join("ready"), "").unwrap();
    let start = Instant::now();
    while !signals.join("done").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no parent");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(schedule);
}

#[test]
fn another_processes_schedule_keeps_the_shards_it_needs() {
    let src = tempfile::tempdir().unwrap();
    write_local_shards(src.path(), &[100, 100, 100]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 3);
    let dir = tempfile::tempdir().unwrap();
    let signals = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_publishes_a_schedule", "--nocapture"])
        .env("LONGSHORE_TEST_SRC", src.path())
        .env("LONGSHORE_TEST_CACHE", dir.path())
        .env("LONGSHORE_TEST_SIGNALS", signals.path())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !signals.path().join("ready").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the child never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let cache = ShardCache::open(CacheConfig::new(dir.path(), 200), store, &list).unwrap();
    // This process reads shards 0, 1, then 2 (registering no schedule of its own). Without the
    // child's schedule, shard 0 (consumed, least recently used) would make room for 2.
    cache.get(&list.shards[0]).unwrap().release();
    cache.get(&list.shards[1]).unwrap().release();
    assert_eq!(cache.working_set(), Some((100, 1)));
    cache.get(&list.shards[2]).unwrap().release();
    std::fs::write(signals.path().join("done"), "").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        cache.get_cached(&list.shards[0]).unwrap().is_some(),
        "the shard the other process needs was evicted"
    );
    assert!(cache.get_cached(&list.shards[1]).unwrap().is_none());
    // The child is gone: its table goes with it.
    assert_eq!(cache.working_set(), None);
    assert!(
        std::fs::read_dir(dir.path().join("plans"))
            .unwrap()
            .next()
            .is_none()
    );
}
