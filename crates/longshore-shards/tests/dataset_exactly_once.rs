//! The exactly-once property of `ShardedDataset`, against the in-process S3 server with every
//! kind of fault injected at random (500/503, 429, timeouts, cut and stalled bodies): over 4
//! ranks x 4 loader workers sharing one cache directory, an epoch delivers every sample
//! exactly once plus exactly the documented padding, each rank the same count; resuming after
//! `k` batches on another number of ranks (and workers) delivers the rest exactly once. A cold
//! start lists the bucket once per job, and the cache never holds more than its budget.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longshore_loader::LoaderState;
use longshore_shards::cache::CacheConfig;
use longshore_shards::dataset::{CountSource, ShardedDataset};
use longshore_shards::order::{EpochOrder, EpochPlan, Layout, OrderConfig};
use longshore_shards::store::{Fault, FaultyStore, RetryPolicy, ShardStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::data::{RankLoader, Read, Seen, pattern, rank_loader, take_batches, write_shards};
use support::s3::S3Server;

const WORLD: usize = 4;
const WORKERS: usize = 4;

#[derive(Debug, Clone)]
struct Case {
    counts: Vec<u64>,
    with_index: bool,
    seed: u64,
    shuffle_block: u64,
    batch_size: usize,
    drop_last: bool,
    /// Percent of the resumed epoch's batches taken before the restart.
    k_percent: u64,
    world2: usize,
    workers2: usize,
    budget_shards: u64,
    prefetch: usize,
    faults: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop_oneof![1 => Just(0u64), 6 => 1u64..14], 3..10),
        any::<bool>(),
        any::<u64>(),
        prop_oneof![Just(0u64), Just(9), Just(40), Just(u64::MAX)],
        1usize..5,
        any::<bool>(),
        0u64..=100,
        prop_oneof![Just(2usize), Just(3), Just(5)],
        1usize..5,
        2u64..5,
        0usize..4,
        any::<u64>(),
    )
        .prop_map(
            |(
                counts,
                with_index,
                seed,
                shuffle_block,
                batch_size,
                drop_last,
                k_percent,
                world2,
                workers2,
                budget_shards,
                prefetch,
                faults,
            )| Case {
                counts,
                with_index,
                seed,
                shuffle_block,
                batch_size,
                drop_last,
                k_percent,
                world2,
                workers2,
                budget_shards,
                prefetch,
                faults,
            },
        )
}

/// A client's faults: every kind twice among its first 12 requests, then a fault in about
/// one request of four (a body fault drawn for a `HEAD` or a listing lets it pass).
fn fault_plan(seed: u64) -> Vec<Option<Fault>> {
    let mut rng = rand_like(seed);
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let kind = |k: u64, next: &mut dyn FnMut(u64) -> u64| match k {
        0 => Fault::InternalError,
        1 => Fault::Unavailable,
        2 => Fault::SlowDown,
        3 => Fault::Timeout,
        4 => Fault::CutBody { after: next(2048) },
        _ => Fault::StallBody { after: next(2048) },
    };
    let mut plan: Vec<Option<Fault>> = (0..12).map(|i| Some(kind(i % 6, &mut next))).collect();
    for i in (1..plan.len()).rev() {
        plan.swap(i, next(i as u64 + 1) as usize);
    }
    for _ in 0..600 {
        let f = (next(4) == 0).then(|| {
            // Stalls cost the stall timeout each: fewer of them.
            let k = next(11);
            kind(if k >= 6 { 4 } else { k }, &mut next)
        });
        plan.push(f);
    }
    plan
}

fn rand_like(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Stores whose clients inject faults; every wrapper is kept, to count requests.
struct Faulty {
    wrappers: Arc<Mutex<Vec<Arc<FaultyStore>>>>,
    seed: Arc<AtomicU64>,
}

impl Faulty {
    fn new(seed: u64) -> Self {
        Faulty {
            wrappers: Arc::default(),
            seed: Arc::new(AtomicU64::new(seed)),
        }
    }

    fn store(&self, server: &S3Server) -> ShardStore {
        let (wrappers, seed) = (Arc::clone(&self.wrappers), Arc::clone(&self.seed));
        server
            .store_builder()
            .retry(RetryPolicy {
                max_attempts: 40,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(4),
                stall_timeout: Duration::from_millis(150),
            })
            .wrap_stores(move |_, inner| {
                let s = seed.fetch_add(0x9E37_79B9, Ordering::Relaxed);
                let f = Arc::new(FaultyStore::with_plan(inner, fault_plan(s)));
                wrappers.lock().unwrap().push(Arc::clone(&f));
                f
            })
            .build()
    }

    /// Listings answered (a listing failed by an injected fault is retried: one operation).
    fn lists(&self) -> u64 {
        let w = self.wrappers.lock().unwrap();
        w.iter()
            .map(|f| f.stats().lists - f.stats().failed_lists)
            .sum()
    }

    fn injected(&self) -> u64 {
        self.wrappers
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.stats().injected)
            .sum()
    }
}

/// Every rank's delivered samples (`take` batches each, or all), run concurrently.
fn run_ranks(loaders: &[RankLoader], take: Option<usize>) -> Vec<Vec<Seen>> {
    std::thread::scope(|s| {
        let runs: Vec<_> = loaders
            .iter()
            .map(|l| s.spawn(move || take_batches(l, take)))
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .unwrap()
                    .into_iter()
                    .flat_map(|b| b.unwrap_or_else(|e| panic!("a batch failed: {e}")))
                    .collect()
            })
            .collect()
    })
}

/// Checks that `seen` holds every sample of `want` non-padding once, and `pads` padding.
fn check_once(seen: &[Seen], want: &[u64], pads: u64, what: &str) {
    let mut real: Vec<u64> = seen.iter().filter(|s| !s.pad).map(|s| s.global).collect();
    real.sort_unstable();
    assert_eq!(real, want, "{what}: samples delivered");
    let got_pads = seen.iter().filter(|s| s.pad).count() as u64;
    assert_eq!(got_pads, pads, "{what}: padding");
    assert!(
        seen.iter().all(|s| s.val == s.global),
        "{what}: a sample's bytes"
    );
}

fn run_case(server: &S3Server, n: u64, c: &Case) {
    let local = tempfile::tempdir().unwrap();
    write_shards(local.path(), &c.counts);
    let prefix = format!("case{n}");
    for i in 0..c.counts.len() {
        let name = format!("shard-{i:06}.tar");
        server.put(
            &format!("{prefix}/{name}"),
            &std::fs::read(local.path().join(&name)).unwrap(),
        );
    }
    if c.with_index {
        let index = std::fs::read(local.path().join("shard-index.json")).unwrap();
        server.put(&format!("{prefix}/shard-index.json"), &index);
    }
    let total: u64 = c.counts.iter().sum();
    let largest = (0..c.counts.len())
        .map(|i| {
            std::fs::metadata(local.path().join(format!("shard-{i:06}.tar")))
                .unwrap()
                .len()
        })
        .max()
        .unwrap();
    let budget = largest * c.budget_shards;
    let cache_dir = local.path().join("node-cache");
    let faulty = Faulty::new(c.faults);
    let url = pattern(&server.url(&prefix), c.counts.len());
    let make = |spec: Option<&ShardedDataset>, rank: usize, world: usize| {
        let b = match spec {
            None => ShardedDataset::webdataset([url.clone()]),
            Some(ds) => ShardedDataset::from_spec(ds.spec().clone()),
        };
        b.store(faulty.store(server))
            .seed(c.seed)
            .shuffle_block(c.shuffle_block)
            .rank(rank)
            .world_size(world)
            .prefetch_shards(c.prefetch)
            .cache_config(CacheConfig {
                // A reader starved of room fails the case instead of stalling the suite.
                wait_timeout: Duration::from_secs(90),
                ..CacheConfig::new(&cache_dir, budget)
            })
            .build()
            .unwrap()
    };

    // Watch the cache's disk bytes while the ranks read.
    let done = AtomicBool::new(false);
    let peak = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let bytes = support::cache_disk_bytes(&cache_dir);
                peak.fetch_max(bytes, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A cold start: rank 0 resolves, the others get its spec.
            let first = make(None, 0, WORLD);
            let counted = first.spec().counted_by.iter().all(|s| match s {
                CountSource::WidsIndex(u) => u.ends_with("shard-index.json"),
                CountSource::Scan => !c.with_index,
                _ => false,
            });
            assert!(counted, "{:?}", first.spec().counted_by);
            assert_eq!(first.spec().counts, c.counts);
            let mut ranks = vec![first];
            for r in 1..WORLD {
                ranks.push(make(Some(&ranks[0]), r, WORLD));
            }
            let read = Read::new(c.batch_size, WORKERS).drop_last(c.drop_last);
            let loaders = |datasets: &[ShardedDataset], read: Read| -> Vec<RankLoader> {
                datasets.iter().map(|ds| rank_loader(ds, read)).collect()
            };

            // Epoch 0, whole.
            let seen = run_ranks(&loaders(&ranks, read), None);
            let plan = ranks[0].plan(0).unwrap();
            let per_rank = plan.samples_per_rank() as usize;
            assert!(seen.iter().all(|r| r.len() == per_rank), "equal ranks");
            let all: Vec<Seen> = seen.into_iter().flatten().collect();
            let want: Vec<u64> = if c.drop_last {
                let mut kept: Vec<u64> = plan
                    .order()
                    .iter_range(0..total - plan.dropped())
                    .map(|s| s.sample.global)
                    .collect();
                kept.sort_unstable();
                kept
            } else {
                (0..total).collect()
            };
            check_once(&all, &want, plan.padding(), "epoch 0");
            assert_eq!(faulty.lists(), 1, "one listing per job");

            // Epoch 1: k batches on 4 ranks, then the rest on world2 ranks, from the loaders'
            // checkpoint.
            let first = loaders(&ranks, read.epoch(1));
            let batches = first[0].len().unwrap() as u64;
            let k = batches * c.k_percent / 100;
            let taken = run_ranks(&first, Some(k as usize));
            let state = first[0].state_dict().unwrap();
            // Every batch of epoch 1 taken (or none to take): the checkpoint is epoch 2's start.
            let whole = k == batches;
            if whole {
                assert_eq!((state.epoch, state.done_prefix), (2, 0), "{state:?}");
            } else {
                assert_eq!((state.epoch, state.done_prefix), (1, k), "{state:?}");
            }
            for l in &first[1..] {
                assert_eq!(l.state_dict().unwrap(), state);
            }
            let state: LoaderState =
                serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
            let resumed: Vec<ShardedDataset> = (0..c.world2)
                .map(|r| make(Some(&ranks[0]), r, c.world2))
                .collect();
            let second = loaders(&resumed, read.workers(c.workers2));
            for l in &second {
                l.load_state_dict(&state).unwrap();
            }
            // A checkpoint at the next epoch's start (nothing delivered) loads on any layout;
            // the checks below are of the resumed epoch 1.
            if !whole {
                let rest = run_ranks(&second, None);
                let rest_plan = resumed[0].plan(1).unwrap();
                let rest_per_rank = rest_plan.samples_per_rank() as usize;
                assert!(
                    rest.iter().all(|r| r.len() == rest_per_rank),
                    "equal ranks after resume"
                );
                // What should have been delivered: the uninterrupted plan's first k batches per
                // rank, then the resumed plan's samples.
                let config = OrderConfig {
                    drop_last: c.drop_last,
                    ..ranks[0].order_config()
                };
                let order = Arc::new(EpochOrder::new(&c.counts, config, 1).unwrap());
                let full =
                    EpochPlan::new(order, Layout::new(WORLD, WORKERS, c.batch_size).unwrap());
                let mut first_pads = 0;
                for (rank, got) in taken.iter().enumerate() {
                    let planned: Vec<u64> = full
                        .rank(rank)
                        .unwrap()
                        .batches()
                        .take(k as usize)
                        .flatten()
                        .map(|s| s.sample.global)
                        .collect();
                    let delivered: Vec<u64> = got.iter().map(|s| s.global).collect();
                    assert_eq!(delivered, planned, "rank {rank}'s first {k} batches");
                    first_pads += got.iter().filter(|s| s.pad).count() as u64;
                }
                let everything: Vec<Seen> = taken
                    .into_iter()
                    .flatten()
                    .chain(rest.into_iter().flatten())
                    .collect();
                let mut want: Vec<u64> = if c.drop_last {
                    everything
                        .iter()
                        .filter(|s| !s.pad)
                        .map(|s| s.global)
                        .collect()
                } else {
                    (0..total).collect()
                };
                want.sort_unstable();
                check_once(
                    &everything,
                    &want,
                    first_pads + rest_plan.padding(),
                    "resumed epoch 1",
                );
                if c.drop_last {
                    // Nothing twice, and only what drop_last leaves out is missing.
                    let dropped = total - want.len() as u64;
                    assert!(
                        dropped < (c.world2 * c.batch_size) as u64 + (WORLD * c.batch_size) as u64
                    );
                }
            }
            assert_eq!(faulty.lists(), 1, "workers and resumed ranks never list");
            let stats: Vec<_> = ranks
                .iter()
                .chain(&resumed)
                .map(|d| d.cache().stats())
                .collect();
            eprintln!(
                "  budget {} shards, prefetch {}, block {}, batch {}: downloads {}, evictions {}, waits {}, faults {}, hits {} on disk {:?}",
                c.budget_shards,
                c.prefetch,
                c.shuffle_block,
                c.batch_size,
                stats.iter().map(|s| s.downloads).sum::<u64>(),
                stats.iter().map(|s| s.evictions).sum::<u64>(),
                stats.iter().map(|s| s.waits).sum::<u64>(),
                faulty.injected(),
                stats.iter().map(|s| s.hits).sum::<u64>(),
                resumed[0].cache().usage().unwrap().shards,
            );
            let usage = resumed[0].cache().usage().unwrap();
            assert!(usage.complete_bytes + usage.reserved_bytes <= budget);
        }));
        done.store(true, Ordering::Relaxed);
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    });
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= budget,
        "the cache held {peak} bytes, its budget is {budget}"
    );
    assert!(faulty.injected() >= 6, "faults were injected");
}

#[test]
fn every_sample_once_across_ranks_faults_and_an_elastic_resume() {
    let server = support::s3::start();
    let cases: u32 = std::env::var("LONGSHORE_SHARDS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = AtomicU64::new(0);
    let t0 = std::time::Instant::now();
    runner
        .run(&case(), |c| {
            let i = n.fetch_add(1, Ordering::Relaxed);
            let t = std::time::Instant::now();
            run_case(&server, i, &c);
            eprintln!(
                "case {i}: {:?} ({} samples) in {:?}",
                c.counts,
                c.counts.iter().sum::<u64>(),
                t.elapsed()
            );
            Ok(())
        })
        .unwrap();
    eprintln!("{} cases in {:?}", n.load(Ordering::Relaxed), t0.elapsed());
}
