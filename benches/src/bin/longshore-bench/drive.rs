//! Shared driver code: the two workloads, building their loaders and driving them.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use longshore::data::{Batch, DirectCollate, NpyDataset, Zip};
use longshore::host::PoolBuffer;
use longshore::loader::{DataLoader, Fetch};
use longshore::transfer::{Device, Stream};
use longshore_benches::collate::NormalizeCollate;
use longshore_benches::workload;

use crate::Ctx;

pub(crate) struct Run {
    pub(crate) samples_per_s: f64,
    pub(crate) wait_fraction: f64,
    pub(crate) batches: usize,
}

/// Iterates `loader` (epoch after epoch) for one warm-up batch plus `batches` measured ones,
/// delivering to `device` through `to_device` + `wait_on` when given, else consuming on the
/// CPU. With `compute`, each batch is followed by a simulated step of that length: a host
/// function sleeping on the compute stream (at most two steps in flight), or a sleep on the
/// consumer thread without a device.
pub(crate) fn drive<F: Fetch<Output = Batch<PoolBuffer>>>(
    loader: &DataLoader<F>,
    device: Option<&Device>,
    batches: usize,
    compute: Option<Duration>,
) -> Result<Run> {
    // Batches excluded from the measurement: the first (worker start-up) and, when simulating
    // compute, the pipeline fill (one batch per worker), so the overlap figure is steady state.
    let warmup = if compute.is_some() {
        loader.config().num_workers.max(1)
    } else {
        1
    };
    let target = batches + warmup;
    let mut seen = 0usize;
    let mut samples = 0usize;
    let mut t0 = Instant::now();
    let step = |n: usize, seen: &mut usize, samples: &mut usize, t0: &mut Instant| {
        *seen += 1;
        if *seen == warmup {
            loader.reset_stats();
            *t0 = Instant::now();
        } else if *seen > warmup {
            *samples += n;
        }
    };
    match device {
        Some(dev) => {
            let compute_stream: Stream = dev.new_stream()?;
            let mut steps: VecDeque<longshore::transfer::Event> = VecDeque::new();
            'epochs: loop {
                let mut any = false;
                for item in loader.to_device(dev, 2)? {
                    any = true;
                    let batch = item?.wait_on(&compute_stream)?;
                    let n = batch.batch_size();
                    if let Some(t) = compute {
                        compute_stream.launch_host_fn(move || std::thread::sleep(t))?;
                        steps.push_back(compute_stream.record()?);
                        if steps.len() > 2 {
                            steps.pop_front().expect("step").synchronize()?;
                        }
                    }
                    drop(batch);
                    step(n, &mut seen, &mut samples, &mut t0);
                    if seen >= target {
                        break 'epochs;
                    }
                }
                if !any {
                    bail!("the loader yields no batch");
                }
            }
            compute_stream.synchronize()?;
        }
        None => 'epochs: loop {
            let mut any = false;
            for item in loader {
                any = true;
                let batch = item?;
                let bytes = batch.bytes();
                black_box(bytes.first().copied().unwrap_or(0) ^ bytes.last().copied().unwrap_or(0));
                let n = batch.batch_size();
                drop(batch);
                if let Some(t) = compute {
                    std::thread::sleep(t);
                }
                step(n, &mut seen, &mut samples, &mut t0);
                if seen >= target {
                    break 'epochs;
                }
            }
            if !any {
                bail!("the loader yields no batch");
            }
        },
    }
    let secs = t0.elapsed().as_secs_f64();
    let stats = loader.stats();
    Ok(Run {
        samples_per_s: samples as f64 / secs.max(1e-9),
        wait_fraction: stats.wait_fraction(),
        batches,
    })
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Workload {
    Images,
    Tabular,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Images => "images",
            Workload::Tabular => "tabular",
        }
    }

    pub(crate) fn batch_size(self) -> usize {
        match self {
            Workload::Images => 256,
            Workload::Tabular => 1024,
        }
    }

    /// Rows generated (full, quick).
    pub(crate) fn rows(self, quick: bool) -> usize {
        match (self, quick) {
            (Workload::Images, false) => 8192,
            (Workload::Images, true) => 256,
            (Workload::Tabular, false) => 2_000_000,
            (Workload::Tabular, true) => 65_536,
        }
    }

    /// Batches measured in the sweep (as the PyTorch script's defaults / quick arguments).
    pub(crate) fn sweep_batches(self, quick: bool) -> usize {
        match (self, quick) {
            (Workload::Images, false) => 40,
            (Workload::Images, true) => 10,
            (Workload::Tabular, false) => 200,
            (Workload::Tabular, true) => 30,
        }
    }
}

/// Builds the loader for `w` and drives it.
pub(crate) fn run_workload(
    w: Workload,
    files: &workload::Workloads,
    num_workers: usize,
    pin_memory: bool,
    device: Option<&Device>,
    batches: usize,
    compute: Option<Duration>,
) -> Result<Run> {
    match w {
        Workload::Images => {
            let ds = NpyDataset::open(&files.images)?;
            let loader = DataLoader::builder(ds)
                .collate(NormalizeCollate::imagenet(3))
                .batch_size(w.batch_size())
                .shuffle(true)
                .drop_last(true)
                .num_workers(num_workers)
                .pin_memory(pin_memory)
                .seed(0)
                .build()?;
            drive(&loader, device, batches, compute)
        }
        Workload::Tabular => {
            let ds = Zip::direct(
                NpyDataset::open(&files.tabular_x)?,
                NpyDataset::open(&files.tabular_y)?,
            )?;
            let loader = DataLoader::builder(ds)
                .collate(DirectCollate::new().with_names(["x", "y"]))
                .batch_size(w.batch_size())
                .shuffle(true)
                .drop_last(true)
                .num_workers(num_workers)
                .pin_memory(pin_memory)
                .seed(0)
                .build()?;
            drive(&loader, device, batches, compute)
        }
    }
}

pub(crate) fn ensure_data(ctx: &mut Ctx) -> Result<workload::Workloads> {
    let files = workload::ensure(
        &ctx.data_dir,
        Workload::Images.rows(ctx.quick),
        Workload::Tabular.rows(ctx.quick),
    )?;
    if files.generated.is_empty() {
        println!("  reusing workloads in {}", ctx.data_dir.display());
    } else {
        println!(
            "  generated {} file(s) in {}",
            files.generated.len(),
            ctx.data_dir.display()
        );
    }
    Ok(files)
}
