//! `ranks`: the image pipelines of a data-parallel job on one host — one loader per GPU, as
//! torchrun's ranks each build one — on 1, 2, ... GPUs at once (issue 18).
//!
//! For each world size N up to the GPUs present (Cpu devices stand in without a driver, N = 1
//! and 2, so the section runs in CI), every rank is a thread with its own loader over the same
//! file, sharded by PyTorch's `DistributedSampler` (each rank 1/N of every epoch), delivering
//! to its own GPU. Workers per rank come from the loader's tuner measuring all N ranks at once
//! ([`Tuner::run_ranks`]: the ranks share the cores, memory bandwidth and links). Then the
//! steady-state method of the other sections: one untimed warm-up epoch, then whole epochs,
//! every rank starting each epoch together (a data-parallel step keeps the ranks in step).
//! Each N runs with the workers placed near their GPU (the default) and unplaced, in the same
//! run.

use std::time::Instant;

use anyhow::{Context, Result};
use longshore::loader::{Placement, Tuner};
use longshore::transfer::Device;
use longshore_benches::measure::print_table;
use longshore_benches::world::{Gate, world};
use serde_json::json;

use crate::Ctx;
use crate::drive::{Consumer, Opts, Workload, ensure_data, rank_images_loader};

/// What one rank measured over the timed epochs.
struct RankRun {
    samples: usize,
    secs: f64,
    wait_fraction: f64,
    cpus: String,
}

/// The devices of the world sizes to measure: every CUDA GPU, or two Cpu devices.
fn devices(ctx: &Ctx) -> Result<Vec<Device>> {
    if ctx.cuda.is_none() {
        return Ok(vec![Device::cpu(), Device::cpu()]);
    }
    (0..Device::cuda_count())
        .map(|i| Device::cuda(i).with_context(|| format!("opening cuda:{i}")))
        .collect()
}

/// `num_workers` per rank to try: a quarter, half, one and two times the cores per rank.
fn worker_grid(cores: usize, ranks: usize) -> Vec<usize> {
    let per = (cores / ranks.max(1)).max(1);
    let mut g: Vec<usize> = [per / 4, per / 2, per, 2 * per]
        .into_iter()
        .filter(|&n| n > 0)
        .collect();
    g.dedup();
    g
}

/// Timed epochs so the window lasts about `secs` at `rate` samples/s over all ranks.
fn epochs_for(secs: f64, rate: f64, epoch_samples: usize, quick: bool) -> usize {
    if quick {
        return 2;
    }
    ((secs * rate / epoch_samples.max(1) as f64).ceil() as usize).clamp(3, 200)
}

#[allow(clippy::too_many_arguments)]
/// Rank `rank`'s steady-state run: warm-up epoch, then `epochs` epochs, each started with
/// every other rank.
fn rank_run(
    rank: usize,
    world: usize,
    dev: &Device,
    w: Workload,
    files: &longshore_benches::workload::Workloads,
    opts: Opts,
    placement: Placement,
    epochs: usize,
    gate: &Gate,
) -> Result<RankRun> {
    let loader = rank_images_loader(w, files, opts, rank, world, placement)?;
    let mut c = Consumer::new(Some(dev), None, w)?;
    c.epoch(&loader, |_| true)?;
    c.finish()?;
    loader.reset_stats();
    gate.wait()?;
    let t0 = Instant::now();
    let mut samples = 0usize;
    for _ in 0..epochs {
        gate.wait()?;
        c.epoch(&loader, |n| {
            samples += n;
            true
        })?;
    }
    c.finish()?;
    let secs = t0.elapsed().as_secs_f64();
    let p = loader.placement();
    Ok(RankRun {
        samples,
        secs,
        wait_fraction: loader.stats().wait_fraction(),
        cpus: p
            .cpus
            .map_or_else(|| "not pinned".to_owned(), |c| c.to_string()),
    })
}

/// Runs one rank per device together; their runs in rank order, or the first failure.
fn world_run(
    devs: &[Device],
    w: Workload,
    files: &longshore_benches::workload::Workloads,
    opts: Opts,
    placement: &Placement,
    epochs: usize,
) -> Result<Vec<RankRun>> {
    let n = devs.len();
    world(n, |rank, gate| {
        rank_run(
            rank,
            n,
            &devs[rank],
            w,
            files,
            opts,
            placement.clone(),
            epochs,
            gate,
        )
    })
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let cores = ctx.results.machine.cores;
    let all = devices(ctx)?;
    let kind = if ctx.cuda.is_some() {
        "GPUs"
    } else {
        "Cpu devices"
    };
    ctx.results.note(
        "ranks",
        format!(
            "1..{} {kind}, one loader per rank (DistributedSampler), workers per rank from \
             Tuner::run_ranks; whole epochs after a warm-up epoch, ranks starting each epoch \
             together; placement gpu-local (default) and off in the same run",
            all.len()
        ),
    );
    let mut rows = Vec::new();
    for w in [Workload::Images, Workload::ImagesU8] {
        let mut base: [Option<f64>; 2] = [None, None];
        for n in 1..=all.len() {
            let devs = &all[..n];
            let tune = Tuner::new()
                .workers(worker_grid(cores, n))
                .pin_memory([true])
                .batches(if ctx.quick { 2 } else { 40 })
                .run_ranks(devs, |rank, nw, pin| {
                    rank_images_loader(
                        w,
                        &files,
                        Opts {
                            num_workers: nw,
                            pin_memory: pin,
                        },
                        rank,
                        n,
                        Placement::GpuLocal,
                    )
                })
                .with_context(|| format!("tuning {} on {n} ranks", w.name()))?;
            let opts = Opts {
                num_workers: tune.best.num_workers,
                pin_memory: tune.best.pin_memory,
            };
            // Every rank's epoch holds 1/n of the file: size the window from the tuner's rate.
            let rows_per_rank = ctx
                .args
                .image_rows
                .unwrap_or(Workload::Images.rows(ctx.quick))
                / n;
            let epochs = epochs_for(
                3.0,
                tune.best.samples_per_second / n as f64,
                rows_per_rank,
                ctx.quick,
            );
            for (pi, placement) in [Placement::GpuLocal, Placement::Off]
                .into_iter()
                .enumerate()
            {
                let runs = world_run(devs, w, &files, opts, &placement, epochs)
                    .with_context(|| format!("{} on {n} ranks, {placement:?}", w.name()))?;
                let samples: usize = runs.iter().map(|r| r.samples).sum();
                let secs = runs.iter().map(|r| r.secs).fold(0.0, f64::max);
                let agg = samples as f64 / secs.max(1e-9);
                let gbps = agg * w.sample_bytes() as f64 / 1e9;
                let base_rate = *base[pi].get_or_insert(agg);
                let per_rank: Vec<f64> = runs
                    .iter()
                    .map(|r| r.samples as f64 / r.secs.max(1e-9))
                    .collect();
                let waits: Vec<f64> = runs.iter().map(|r| r.wait_fraction).collect();
                let cpus: Vec<&str> = runs.iter().map(|r| r.cpus.as_str()).collect();
                let place = match placement {
                    Placement::GpuLocal => "gpu-local",
                    _ => "off",
                };
                ctx.results.push(
                    "ranks",
                    format!("{} ranks={n} placement={place}", w.name()),
                    agg,
                    "samples/s",
                    json!({"workload": w.name(), "ranks": n, "placement": place,
                           "num_workers_per_rank": opts.num_workers, "pin_memory": opts.pin_memory,
                           "epochs": epochs, "secs": secs, "gb_per_s": gbps,
                           "scaling_vs_1": agg / base_rate.max(1e-9),
                           "rank_samples_per_s": per_rank, "rank_wait": waits, "rank_cpus": cpus,
                           "tuner_trials": tune.trials.iter().map(|t| json!({
                               "num_workers": t.num_workers,
                               "samples_per_s": t.samples_per_second,
                               "wait": t.wait_fraction})).collect::<Vec<_>>()}),
                );
                rows.push(vec![
                    w.name().to_owned(),
                    n.to_string(),
                    place.to_owned(),
                    opts.num_workers.to_string(),
                    format!("{agg:.0}"),
                    format!("{:.2}x", agg / base_rate.max(1e-9)),
                    format!("{gbps:.1}"),
                    per_rank
                        .iter()
                        .map(|r| format!("{r:.0}"))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    waits
                        .iter()
                        .map(|x| format!("{:.0}%", 100.0 * x))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    cpus.join(" / "),
                ]);
            }
        }
    }
    print_table(
        &format!(
            "ranks: one loader per {} ({cores} cores)",
            if ctx.cuda.is_some() {
                "GPU"
            } else {
                "Cpu device"
            }
        ),
        &[
            "workload",
            "ranks",
            "placement",
            "workers/rank",
            "samples/s (all)",
            "vs 1 rank",
            "GB/s (all)",
            "per rank",
            "rank waited",
            "worker cpus",
        ],
        &rows,
    );
    if let Some(l) = &ctx.limits {
        println!(
            "  limits of this host: host memory read {:.1} GB/s, copy {:.1} GB/s; one GPU's link \
             {} GB/s (images f32 batch); {cores} cores",
            l.mem_read_gbps,
            l.mem_copy_gbps,
            l.link_images_gbps
                .map_or_else(|| "?".to_owned(), |g| format!("{g:.1}"))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_divides_the_cores_between_ranks() {
        assert_eq!(worker_grid(32, 1), vec![8, 16, 32, 64]);
        assert_eq!(worker_grid(32, 2), vec![4, 8, 16, 32]);
        assert_eq!(worker_grid(2, 2), vec![1, 2]);
    }

    #[test]
    fn the_window_is_sized_from_the_rate() {
        assert_eq!(epochs_for(3.0, 10_000.0, 1000, false), 30);
        assert_eq!(epochs_for(3.0, 10.0, 1000, false), 3);
        assert_eq!(epochs_for(3.0, 1e9, 10, false), 200);
        assert_eq!(epochs_for(3.0, 1e9, 10, true), 2);
    }
}
