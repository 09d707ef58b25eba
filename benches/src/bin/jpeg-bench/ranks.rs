//! `--ranks`: the JPEG train pipeline of a data-parallel job on one host, one loader per GPU
//! (issue 18). For each world size N, every rank is a thread with its own loader over the same
//! folder, sharded by PyTorch's `DistributedSampler` (each rank 1/N of every epoch), decoding
//! on the CPU (the workers) or with nvJPEG on its own GPU. Workers per rank: CPU decoding by
//! the loader's tuner over all N ranks at once ([`Tuner::run_ranks`]); nvJPEG decoding (its
//! batches leave the loader encoded, so `run_ranks` cannot drive them) by the same protocol
//! here: every grid point measured on all ranks at once, the fastest aggregate picked,
//! preferring fewer workers within 3%. Then steady state: one untimed warm-up epoch, then
//! whole epochs, every rank starting each epoch together.

use std::time::Instant;

use anyhow::{Context, Result};
use longshore::data::{Dataset, DirectCollate, DistributedSampler};
use longshore::loader::{DataLoader, Tuner};
use longshore::nvjpeg::{EncodedCollate, EncodedImages, NvjpegDecoder};
use longshore::transfer::Device;
use longshore::vision::{Compose, ImageDataset, ImageFolder};
use longshore_benches::world::{Gate, world};
use serde_json::{Value, json};

use crate::{cores, cpu_jiffies, share};

/// What the ranks section is asked to do.
pub(crate) struct Plan<'a> {
    pub(crate) folder: &'a ImageFolder,
    pub(crate) ranks: &'a [usize],
    pub(crate) cpu_decode: bool,
    pub(crate) nvjpeg: bool,
    pub(crate) batch: usize,
    pub(crate) epochs: usize,
    pub(crate) quick: bool,
    /// Workers per rank to try for nvJPEG decoding (empty: 1, 2, 4, 8 capped by the cores).
    pub(crate) nvjpeg_workers: Vec<usize>,
}

/// One rank's timed epochs.
struct RankRun {
    samples: usize,
    secs: f64,
    wait_fraction: f64,
    cpus: String,
}

/// One world size's measurement.
struct WorldRun {
    ranks: Vec<RankRun>,
    cpu_share: Option<f64>,
}

impl WorldRun {
    fn aggregate(&self) -> f64 {
        let samples: usize = self.ranks.iter().map(|r| r.samples).sum();
        let secs = self.ranks.iter().map(|r| r.secs).fold(0.0, f64::max);
        samples as f64 / secs.max(1e-9)
    }
}

/// Rank `rank` of `world`'s sampler: `DistributedSampler(shuffle=True, seed=0, drop_last=True)`.
fn sampler(len: usize, world: usize, rank: usize) -> Result<DistributedSampler> {
    Ok(DistributedSampler::builder(len, world, rank)
        .shuffle(true)
        .seed(0)
        .drop_last(true)
        .build()?)
}

/// The devices: every CUDA GPU, or two Cpu devices without a driver (CPU decoding only).
fn devices() -> Result<Vec<Device>> {
    match Device::cuda_count() {
        0 => Ok(vec![Device::cpu(), Device::cpu()]),
        n => (0..n)
            .map(|i| Device::cuda(i).with_context(|| format!("opening cuda:{i}")))
            .collect(),
    }
}

/// Runs `epoch()` once untimed, then `epochs` times with every rank starting together; rank
/// 0 reads the machine's CPU time around the window. The rank's run and (rank 0) the CPU share.
fn timed<F: longshore::loader::Fetch>(
    loader: &DataLoader<F>,
    rank: usize,
    gate: &Gate,
    epochs: usize,
    mut epoch: impl FnMut() -> Result<usize>,
) -> Result<(RankRun, Option<f64>)> {
    epoch()?;
    loader.reset_stats();
    gate.wait()?;
    let (cpu0, t0) = (cpu_jiffies(), Instant::now());
    let mut samples = 0;
    for _ in 0..epochs {
        gate.wait()?;
        samples += epoch()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    gate.wait()?;
    let cpu = if rank == 0 {
        share(cpu0, cpu_jiffies())
    } else {
        None
    };
    let cpus = loader
        .placement()
        .cpus
        .map_or_else(|| "not pinned".to_owned(), |c| c.to_string());
    let run = RankRun {
        samples,
        secs,
        wait_fraction: loader.stats().wait_fraction(),
        cpus,
    };
    Ok((run, cpu))
}

fn cpu_world(
    devs: &[Device],
    dataset: &ImageDataset,
    workers: usize,
    batch: usize,
    epochs: usize,
) -> Result<WorldRun> {
    let n = devs.len();
    let runs = world(n, |rank, gate| {
        let loader = cpu_loader(dataset, n, rank, workers, batch)?;
        let dev = &devs[rank];
        let compute = dev.new_stream()?;
        let epoch = || -> Result<usize> {
            let mut seen = 0;
            for item in loader.to_device(dev, 2)? {
                seen += item?.wait_on(&compute)?.batch_size();
            }
            compute.synchronize()?;
            Ok(seen)
        };
        timed(&loader, rank, gate, epochs, epoch)
    })?;
    Ok(split(runs))
}

fn split(runs: Vec<(RankRun, Option<f64>)>) -> WorldRun {
    let cpu_share = runs.first().and_then(|r| r.1);
    WorldRun {
        ranks: runs.into_iter().map(|r| r.0).collect(),
        cpu_share,
    }
}

fn cpu_loader(
    dataset: &ImageDataset,
    world: usize,
    rank: usize,
    workers: usize,
    batch: usize,
) -> Result<
    DataLoader<
        impl longshore::loader::Fetch<Output = longshore::data::Batch<longshore::host::PoolBuffer>>
        + use<>,
    >,
    longshore::loader::LoaderError,
> {
    DataLoader::builder(dataset.clone())
        .collate(DirectCollate::new())
        .batch_size(batch)
        .sampler(sampler(dataset.len(), world, rank).map_err(|e| {
            longshore::loader::LoaderError::Config {
                option: "sampler",
                reason: format!("{e:#}"),
            }
        })?)
        .drop_last(true)
        .num_workers(workers)
        .pin_memory(true)
        .persistent_workers(workers > 0)
        .seed(0)
        .build()
}

fn nvjpeg_world(
    devs: &[Device],
    files: &EncodedImages,
    workers: usize,
    batch: usize,
    epochs: usize,
) -> Result<WorldRun> {
    let n = devs.len();
    let runs = world(n, |rank, gate| {
        let dev = &devs[rank];
        let loader = DataLoader::builder(files.clone())
            .collate(EncodedCollate)
            .batch_size(batch)
            .sampler(sampler(files.len(), n, rank)?)
            .drop_last(true)
            .num_workers(workers)
            .pin_memory(true)
            .persistent_workers(workers > 0)
            .seed(0)
            .build()?;
        let compute = dev.new_stream()?;
        let on_gpu = loader.with_stage(NvjpegDecoder::new(dev, files)?).depth(2);
        let epoch = || -> Result<usize> {
            let mut seen = 0;
            for item in on_gpu.iter()? {
                seen += item?.wait_on(&compute)?.batch_size();
            }
            compute.synchronize()?;
            Ok(seen)
        };
        timed(&loader, rank, gate, epochs, epoch)
    })?;
    Ok(split(runs))
}

/// The pick of a sweep: the fastest, preferring fewer workers within 3% of it.
fn pick(trials: &[(usize, f64)]) -> usize {
    let top = trials.iter().map(|t| t.1).fold(0.0, f64::max);
    trials
        .iter()
        .filter(|t| t.1 >= 0.97 * top)
        .map(|t| t.0)
        .min()
        .unwrap_or(1)
}

/// Workers per rank to try: half, one and two times the cores per rank.
fn cpu_grid(cores: usize, ranks: usize) -> Vec<usize> {
    let per = (cores / ranks.max(1)).max(1);
    let mut g = vec![(per / 2).max(1), per, 2 * per];
    g.dedup();
    g
}

/// Runs the section; its JSON (rows and notes) for jpeg.json.
pub(crate) fn run(plan: &Plan<'_>) -> Result<Value> {
    let all = devices()?;
    let cuda = Device::cuda_count() > 0;
    let c = cores();
    let pipeline = Compose::imagenet_train();
    let mut rows = Vec::new();
    let mut modes = Vec::new();
    if plan.cpu_decode {
        modes.push("cpu");
    }
    if plan.nvjpeg && cuda {
        modes.push("nvjpeg");
    }
    for mode in modes {
        let mut base = None;
        for &n in plan.ranks {
            if n == 0 || n > all.len() {
                eprintln!("jpeg ranks: {n} ranks skipped ({} devices here)", all.len());
                continue;
            }
            let devs = &all[..n];
            let (workers, trials, run) = if mode == "cpu" {
                let dataset = plan.folder.clone().with_transform(pipeline.clone());
                let grid = if plan.quick { vec![1] } else { cpu_grid(c, n) };
                let tune = Tuner::new()
                    .workers(grid)
                    .pin_memory([true])
                    .batches(if plan.quick { 1 } else { 8 })
                    .run_ranks(devs, |rank, w, _| {
                        cpu_loader(&dataset, n, rank, w, plan.batch)
                    })
                    .with_context(|| format!("tuning cpu decoding on {n} ranks"))?;
                let w = tune.best.num_workers;
                let trials: Vec<(usize, f64)> = tune
                    .trials
                    .iter()
                    .map(|t| (t.num_workers, t.samples_per_second))
                    .collect();
                (
                    w,
                    trials,
                    cpu_world(devs, &dataset, w, plan.batch, plan.epochs)?,
                )
            } else {
                let files =
                    EncodedImages::new(plan.folder.clone().with_transform(pipeline.clone()))?;
                let grid: Vec<usize> = if plan.nvjpeg_workers.is_empty() {
                    [1, 2, 4, 8].into_iter().filter(|&w| w * n <= c).collect()
                } else {
                    plan.nvjpeg_workers.clone()
                };
                let mut trials = Vec::new();
                for &w in &grid {
                    // One warm-up and one timed epoch on every rank at once.
                    let r = nvjpeg_world(devs, &files, w, plan.batch, 1)?;
                    eprintln!(
                        "jpeg ranks: tuning nvjpeg, {n} ranks x {w} workers: {:.0} images/s",
                        r.aggregate()
                    );
                    trials.push((w, r.aggregate()));
                }
                let w = pick(&trials);
                (
                    w,
                    trials,
                    nvjpeg_world(devs, &files, w, plan.batch, plan.epochs)?,
                )
            };
            let agg = run.aggregate();
            let base_rate = *base.get_or_insert(agg);
            let per_rank: Vec<f64> = run
                .ranks
                .iter()
                .map(|r| r.samples as f64 / r.secs.max(1e-9))
                .collect();
            let waits: Vec<f64> = run.ranks.iter().map(|r| r.wait_fraction).collect();
            let cpus: Vec<&str> = run.ranks.iter().map(|r| r.cpus.as_str()).collect();
            eprintln!(
                "jpeg ranks: {mode} train, {n} ranks x {workers} workers: {agg:.0} images/s \
                 ({:.2}x 1 rank), per rank {per_rank:.0?}, waited {waits:.2?}, cpu {:.0}%",
                agg / base_rate.max(1e-9),
                100.0 * run.cpu_share.unwrap_or(0.0)
            );
            rows.push(json!({
                "decode": mode,
                "pipeline": "train",
                "ranks": n,
                "num_workers_per_rank": workers,
                "samples_per_s": agg,
                "scaling_vs_1": agg / base_rate.max(1e-9),
                "rank_samples_per_s": per_rank,
                "rank_wait": waits,
                "rank_cpus": cpus,
                "cpu_share": run.cpu_share,
                "tuner_trials": trials.iter().map(|t| json!({"num_workers": t.0, "samples_per_s": t.1})).collect::<Vec<_>>(),
                "devices": if cuda { "cuda" } else { "cpu" },
            }));
        }
    }
    Ok(json!({"epochs": plan.epochs, "batch_size": plan.batch, "cores": c, "rows": rows}))
}

/// The ranks table of jpeg.md.
pub(crate) fn markdown(r: &Value, per_core_train: Option<f64>) -> String {
    let Some(rows) = r["rows"].as_array() else {
        return String::new();
    };
    let cores = r["cores"].as_u64().unwrap_or(0);
    let mut md = String::from(
        "\n## Ranks: one loader per GPU (train pipeline)\n\n\
         | decode | ranks | workers/rank | images/s (all) | vs 1 rank | per rank | waited | CPU share |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        let list = |k: &str, f: &dyn Fn(f64) -> String| {
            row[k]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_f64)
                        .map(f)
                        .collect::<Vec<_>>()
                        .join(" / ")
                })
                .unwrap_or_default()
        };
        md += &format!(
            "| {} | {} | {} | {:.0} | {:.2}x | {} | {} | {} |\n",
            row["decode"].as_str().unwrap_or("?"),
            row["ranks"],
            row["num_workers_per_rank"],
            row["samples_per_s"].as_f64().unwrap_or(0.0),
            row["scaling_vs_1"].as_f64().unwrap_or(0.0),
            list("rank_samples_per_s", &|x| format!("{x:.0}")),
            list("rank_wait", &|x| format!("{:.0}%", 100.0 * x)),
            row["cpu_share"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |x| format!("{:.0}%", 100.0 * x)),
        );
    }
    if let Some(pc) = per_core_train {
        md += &format!(
            "\nBounds: CPU decoding cannot beat one core's decode + train pipeline rate \
             ({pc:.0} images/s) x {cores} cores = {:.0} images/s for all ranks together; \
             nvJPEG decoding is bound per GPU by its hardware decoder (`--nvjpeg-ceiling`), so \
             its aggregate can grow with the GPUs until the workers' file reads or the cores \
             run out.\n",
            pc * cores as f64
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pick_prefers_fewer_workers_within_three_percent() {
        assert_eq!(pick(&[(1, 90.0), (2, 98.0), (4, 100.0)]), 2);
        assert_eq!(pick(&[(1, 50.0), (2, 96.0), (4, 100.0)]), 4);
        assert_eq!(pick(&[]), 1);
    }

    #[test]
    fn the_cpu_grid_divides_the_cores() {
        assert_eq!(cpu_grid(32, 2), vec![8, 16, 32]);
        assert_eq!(cpu_grid(2, 2), vec![1, 2]);
    }
}
