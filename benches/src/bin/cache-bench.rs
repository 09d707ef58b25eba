//! The shard cache under a budget (issue 36): downloads per epoch as a function of the budget
//! and the shuffle block, against Belady's bound and least-recently-used eviction computed
//! offline from the same order, and the loader's rate with a budget of 4 shards per worker
//! against an unbounded cache, over a store with a per-request latency.
//!
//! `cache-bench [--shards 20] [--samples 100] [--sample-bytes 2048] [--workers 2]
//! [--batch 8] [--epochs 2] [--latency-ms 20] [--work-us 200] [--only downloads,rate]`
//! (`cargo run --release -p longshore-benches --bin cache-bench -- ...`). Prints two
//! tables: per (shuffle block, budget), the downloads of each epoch after the first (cold)
//! one, the offline Belady and LRU figures and the working set; per shuffle block, samples/s
//! with an unbounded cache and with 4 shards per worker (best of `--epochs` epochs after a
//! warm-up epoch, each read through the loader with `--workers` workers).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use clap::Parser;
use longshore::data::{IterableExt, StackCollate};
use longshore::loader::DataLoader;
use longshore::shards::cache::{CacheConfig, EpochCacheStats, belady_downloads, working_set_bytes};
use longshore::shards::dataset::{ShardSample, ShardedDataset};
use longshore::shards::order::{EpochOrder, EpochPlan, Layout};
use longshore::shards::store::{FaultyStore, ShardStore};
use longshore::shards::webdataset::ShardWriter;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 20)]
    shards: usize,
    #[arg(long, default_value_t = 100)]
    samples: u64,
    #[arg(long, default_value_t = 2048)]
    sample_bytes: usize,
    #[arg(long, default_value_t = 2)]
    workers: usize,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Latency of each GET of the store (the rate section).
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// CPU work per sample, as a decode would do (the rate section).
    #[arg(long, default_value_t = 200)]
    work_us: u64,
    /// Sections: downloads, rate, mds (the one `xtask/python/cache_bench.py` runs).
    #[arg(long, default_value = "downloads,rate")]
    only: String,
    /// The `mds` section: an MDS dataset's root, read with a cache of `--mds-budget` bytes and
    /// shuffle blocks of `--block` samples; prints `downloads per epoch;Belady per epoch;range
    /// reads per epoch`.
    #[arg(long)]
    mds: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 0)]
    mds_budget: u64,
    #[arg(long, default_value_t = 1 << 18)]
    block: u64,
    /// The shuffle blocks of the tables, in shards (`0`: shard order, `all`: the whole epoch).
    #[arg(long, default_value = "0,1.5,2.5,10,all")]
    blocks: String,
}

fn write_shards(dir: &Path, args: &Args) -> Result<()> {
    let mut global = 0u64;
    for i in 0..args.shards {
        let sub = dir.join(format!(".w{i}"));
        let mut w = ShardWriter::new(&sub, u64::MAX)?;
        for _ in 0..args.samples {
            let body = vec![(global % 251) as u8; args.sample_bytes];
            w.write(&format!("s{global:08}"), &[("bin", &body)])?;
            global += 1;
        }
        w.finish()?;
        std::fs::rename(
            sub.join("shard-000000.tar"),
            dir.join(format!("shard-{i:06}.tar")),
        )?;
        std::fs::remove_dir_all(&sub)?;
    }
    Ok(())
}

/// Least recently used over the reference string, for comparison.
fn lru_downloads(refs: &[usize], sizes: &[u64], budget: u64) -> u64 {
    let mut cached: VecDeque<usize> = VecDeque::new();
    let (mut used, mut downloads) = (0u64, 0u64);
    let mut last = usize::MAX;
    for &s in refs {
        if s == last {
            continue;
        }
        last = s;
        if let Some(p) = cached.iter().position(|&c| c == s) {
            cached.remove(p);
            cached.push_back(s);
            continue;
        }
        downloads += 1;
        while used + sizes[s] > budget {
            let Some(v) = cached.pop_front() else { break };
            used -= sizes[v];
        }
        cached.push_back(s);
        used += sizes[s];
    }
    downloads
}

/// The node's reads if the workers take turns sample by sample: the order concurrent workers
/// read in when each read takes as long as another's.
fn fine_refs(ds: &ShardedDataset, epoch: u64, workers: usize, batch: usize) -> Result<Vec<usize>> {
    let order = Arc::new(EpochOrder::new(
        &ds.spec().counts,
        ds.order_config(),
        epoch,
    )?);
    let plan = EpochPlan::new(order, Layout::new(1, workers, batch)?);
    let streams = (0..workers)
        .map(|w| Ok(plan.rank(0)?.worker(w)?.map(|s| s.sample.shard).collect()))
        .collect::<Result<Vec<Vec<usize>>>>()?;
    let most = streams.iter().map(Vec::len).max().unwrap_or(0);
    Ok((0..most)
        .flat_map(|i| streams.iter().filter_map(move |s| s.get(i).copied()))
        .collect())
}

/// The node's reads in delivery order (the loader's round-robin over the workers).
fn refs(ds: &ShardedDataset, epoch: u64, workers: usize, batch: usize) -> Result<Vec<usize>> {
    let order = Arc::new(EpochOrder::new(
        &ds.spec().counts,
        ds.order_config(),
        epoch,
    )?);
    let plan = EpochPlan::new(order, Layout::new(1, workers, batch)?);
    Ok(plan
        .rank(0)?
        .batches()
        .flat_map(|b| b.into_iter().map(|s| s.sample.shard))
        .collect())
}

fn build(
    src: &Path,
    cache: &Path,
    args: &Args,
    block: u64,
    budget: u64,
    latency: Duration,
) -> Result<ShardedDataset> {
    let builder = if src.join("index.json").exists() {
        ShardedDataset::mds([src.display().to_string()])
    } else {
        ShardedDataset::webdataset([format!(
            "{}/shard-{{000000..{:06}}}.tar",
            src.display(),
            args.shards - 1
        )])
    };
    let store = ShardStore::builder()
        .wrap_stores(move |_, inner| {
            let f = FaultyStore::with_plan(inner, []);
            f.set_latency(latency);
            Arc::new(f)
        })
        .build();
    Ok(builder
        .store(store)
        .seed(3)
        .shuffle_block(block)
        .rank(0)
        .world_size(1)
        .cache_config(CacheConfig::new(cache, budget))
        .build()?)
}

/// Reads epoch `epoch` through the loader, `work` of CPU per sample; returns samples/s and
/// the node's reads as they happened (each sample's shard, in the order the workers read them).
fn run_epoch(
    ds: &ShardedDataset,
    args: &Args,
    epoch: u64,
    work: Duration,
) -> Result<(f64, Vec<usize>)> {
    let trace = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&trace);
    let loader = DataLoader::iterable(ds.clone().map(move |s: ShardSample| {
        seen.lock().unwrap().push(s.id.shard);
        let t = Instant::now();
        let mut sum = 0i64;
        while t.elapsed() < work {
            sum = sum.wrapping_add(i64::from(s.sample.fields["bin"][0]));
        }
        (s.id.global as i64, sum)
    }))
    .batch_size(args.batch)
    .num_workers(args.workers)
    .collate(StackCollate::new())
    .build()?;
    loader.set_epoch(epoch);
    let t = Instant::now();
    let mut n = 0usize;
    for b in loader.iter() {
        n += b.map_err(|e| anyhow!("{e}"))?.tensor::<i64>(0)?.len();
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    drop(loader);
    let trace = std::mem::take(&mut *trace.lock().unwrap());
    Ok((rate, trace))
}

/// A fresh directory under the bench's root.
fn fresh(root: &Path, n: &mut usize) -> Result<std::path::PathBuf> {
    *n += 1;
    let d = root.join(format!("cache-{n}"));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let root = std::env::temp_dir().join(format!("longshore-cache-bench-{}", std::process::id()));
    let result = bench(&args, &root);
    let _ = std::fs::remove_dir_all(&root);
    result
}

fn bench(args: &Args, root: &Path) -> Result<()> {
    let mut n = 0;
    if let Some(mds) = &args.mds {
        let cache = fresh(root, &mut n)?;
        let ds = build(
            mds,
            &cache,
            args,
            args.block,
            args.mds_budget,
            Duration::ZERO,
        )?;
        let sizes: Vec<u64> = ds.spec().shards.shards.iter().map(|s| s.size).collect();
        let (mut ours, mut bound, mut ranged) = (Vec::new(), Vec::new(), Vec::new());
        for e in 0..=args.epochs {
            run_epoch(&ds, args, e, Duration::ZERO)?;
            let st = ds.cache().epoch_stats();
            let st = st.iter().find(|s| s.epoch == e);
            ours.push(st.map_or(0, |s| s.downloads).to_string());
            ranged.push(st.map_or(0, |s| s.range_reads).to_string());
            let r = refs(&ds, e, args.workers, args.batch)?;
            bound.push(belady_downloads(r, &sizes, args.mds_budget).to_string());
        }
        println!(
            "{};{};{}",
            ours.join(", "),
            bound.join(", "),
            ranged.join(", ")
        );
        return Ok(());
    }
    let src = root.join("src");
    std::fs::create_dir_all(&src)?;
    write_shards(&src, args)?;
    let blocks = args
        .blocks
        .split(',')
        .map(|b| match b.trim() {
            "0" => Ok((0, "0 (shard order)".to_owned())),
            "all" => Ok((u64::MAX, "all (default here)".to_owned())),
            b => {
                let shards: f64 = b.parse().map_err(|e| anyhow!("--blocks {b}: {e}"))?;
                Ok(((shards * args.samples as f64) as u64, format!("{b} shards")))
            }
        })
        .collect::<Result<Vec<(u64, String)>>>()?;
    if args.only.contains("downloads") {
        println!(
            "## downloads per epoch ({} shards, {} workers, batch {})\n",
            args.shards, args.workers, args.batch
        );
        println!(
            "| shuffle block | budget (shards) | working set (shards) | downloads (epochs 1..) | range reads | Belady, as read | as read, one shard less | Belady, delivery order | Belady, workers interleaved | LRU |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (block, label) in &blocks {
            let block = *block;
            for budget_shards in [2u64, 3, 4, 8, 12, 20] {
                let cache = fresh(root, &mut n)?;
                let probe = build(&src, &cache, args, block, u64::MAX, Duration::ZERO)?;
                let sizes: Vec<u64> = probe.spec().shards.shards.iter().map(|s| s.size).collect();
                let largest = *sizes.iter().max().unwrap_or(&1);
                let budget = largest * budget_shards;
                drop(probe);
                let ds = build(&src, &cache, args, block, budget, Duration::ZERO)?;
                let (mut online, mut ranged) = (Vec::new(), Vec::new());
                let (mut bel, mut lru, mut ws) = (Vec::new(), Vec::new(), 0.0f64);
                let (mut fine, mut read, mut less) = (Vec::new(), Vec::new(), Vec::new());
                for e in 0..=args.epochs {
                    let (_, trace) = run_epoch(&ds, args, e, Duration::ZERO)?;
                    let r = refs(&ds, e, args.workers, args.batch)?;
                    if e == 0 {
                        ws = working_set_bytes(r.iter().copied(), &sizes) as f64 / largest as f64;
                        continue;
                    }
                    let stats = ds.cache().epoch_stats();
                    let st = stats.iter().find(|s| s.epoch == e);
                    online.push(st.map_or(0, |s| s.downloads).to_string());
                    ranged.push(st.map_or(0, |s| s.range_reads).to_string());
                    read.push(belady_downloads(trace.iter().copied(), &sizes, budget).to_string());
                    // The room one download in flight reserves: what another worker's
                    // concurrent miss leaves the rest of the node.
                    less.push(
                        belady_downloads(trace, &sizes, budget.saturating_sub(largest).max(1))
                            .to_string(),
                    );
                    bel.push(belady_downloads(r.iter().copied(), &sizes, budget).to_string());
                    lru.push(lru_downloads(&r, &sizes, budget).to_string());
                    let f = fine_refs(&ds, e, args.workers, args.batch)?;
                    fine.push(belady_downloads(f, &sizes, budget).to_string());
                }
                println!(
                    "| {label} | {budget_shards} | {ws:.1} | {} | {} | {} | {} | {} | {} | {} |",
                    online.join(", "),
                    ranged.join(", "),
                    read.join(", "),
                    less.join(", "),
                    bel.join(", "),
                    fine.join(", "),
                    lru.join(", ")
                );
            }
        }
        println!();
    }
    if args.only.contains("rate") {
        let latency = Duration::from_millis(args.latency_ms);
        let work = Duration::from_micros(args.work_us);
        println!(
            "## samples/s, {} ms per GET, {} us of work per sample, {} workers\n",
            args.latency_ms, args.work_us, args.workers
        );
        println!(
            "| shuffle block | unbounded | 4 shards per worker | ratio | downloads/epoch (4 per worker) | range reads/epoch | misses/epoch (ms waited) |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for (block, label) in &blocks {
            let block = *block;
            let mut rates = Vec::new();
            let (mut downloads, mut ranged, mut misses) =
                (String::new(), String::new(), String::new());
            for bounded in [false, true] {
                let cache = fresh(root, &mut n)?;
                let total =
                    (args.shards as u64) * (args.samples + 2) * (args.sample_bytes as u64 + 2048);
                let largest = {
                    let probe = build(&src, &cache, args, block, total, Duration::ZERO)?;
                    probe.spec().shards.largest().map_or(1, |s| s.size)
                };
                let budget = if bounded {
                    largest * 4 * args.workers as u64
                } else {
                    total
                };
                let ds = build(&src, &cache, args, block, budget, latency)?;
                run_epoch(&ds, args, 0, work)?; // warm-up: the unbounded cache fills here
                let mut best = 0.0f64;
                for e in 1..=args.epochs {
                    best = best.max(run_epoch(&ds, args, e, work)?.0);
                }
                if bounded {
                    let st = ds.cache().epoch_stats();
                    // The timed epochs' counts (epoch 0 is the warm-up).
                    let timed = |f: fn(&EpochCacheStats) -> u64| {
                        let v: Vec<String> = st.iter().skip(1).map(|s| f(s).to_string()).collect();
                        v.join(", ")
                    };
                    downloads = timed(|s| s.downloads);
                    ranged = timed(|s| s.range_reads);
                    let m: Vec<String> = st
                        .iter()
                        .skip(1)
                        .map(|s| format!("{} ({:.0})", s.misses, s.miss_wait.as_secs_f64() * 1e3))
                        .collect();
                    misses = m.join(", ");
                }
                rates.push(best);
            }
            println!(
                "| {label} | {:.0} | {:.0} | {:.2}x | {downloads} | {ranged} | {misses} |",
                rates[0],
                rates[1],
                rates[1] / rates[0]
            );
        }
    }
    Ok(())
}
