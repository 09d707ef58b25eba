//! Shared driver code: the two loader workloads, building their loaders, and the
//! steady-state driver every loader figure comes from.
//!
//! The method (issue 14): a loader is built with persistent workers, one whole epoch is
//! consumed untimed (worker start-up, page cache, pool), then whole epochs are timed. Each
//! timed epoch starts and ends with an empty pipeline, so no pre-filled queue is ever timed,
//! and each pays its own fill as a training run does. Epochs are added until the window holds
//! at least [`Window::Epochs::min_epochs`] epochs, `min_secs` seconds and 10x the batches that
//! can be in flight (`num_workers x prefetch_factor`).

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use longshore::data::{
    Batch, Dataset, DirectCollate, DistributedSampler, ImageLayout, Normalize, NpyDataset, Zip,
};
use longshore::host::PoolBuffer;
use longshore::loader::{DataLoader, DataLoaderBuilder, Fetch, Placement, WorkerPriority};
use longshore::transfer::{Device, DeviceBuffer, Event, Stream};
use longshore_benches::workload;
use longshore_ops::{self as ops, NormalizeU8, View, ViewMut};

use crate::Ctx;
use crate::profile::Profile;

/// ImageNet's per-channel mean and standard deviation (torchvision's `Normalize` constants),
/// for the `images-u8` workload's device-side normalisation.
const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Epochs of one run are never more than this (a guard against a broken clock or loader).
const MAX_EPOCHS: usize = 10_000;

/// What a run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    /// Samples per second over the timed window.
    pub(crate) samples_per_s: f64,
    /// Share of the consumer's time spent waiting for a batch, over the timed window.
    pub(crate) wait_fraction: f64,
    /// Batches in the timed window.
    pub(crate) batches: usize,
    /// Whole epochs in the timed window (0 for [`Window::Batches`]).
    pub(crate) epochs: usize,
    /// Length of the timed window.
    pub(crate) secs: f64,
    /// Worker time per delivered batch over the window, in ms (the loader's `worker_busy`:
    /// loading and collating, summed over workers): it grows when workers slow each other.
    pub(crate) worker_ms_per_batch: f64,
}

/// Which batches are timed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Window {
    /// One untimed warm-up epoch, then whole epochs until all three minimums are reached
    /// (`min_batches` is raised to 10x the batches in flight).
    Epochs {
        min_epochs: usize,
        min_secs: f64,
        min_batches: usize,
    },
    /// Within epochs: `warmup` untimed batches, then `batches` timed ones (the overlap
    /// section, which asks how the copy overlaps compute once the pipeline is full).
    Batches { warmup: usize, batches: usize },
}

impl Window {
    /// The loader sweep's window: 2 epochs and 1 s at least (quick: 2 epochs).
    pub(crate) fn steady(quick: bool) -> Window {
        Window::Epochs {
            min_epochs: 2,
            min_secs: if quick { 0.0 } else { 1.0 },
            min_batches: 0,
        }
    }
}

/// The loader options a run varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Opts {
    pub(crate) num_workers: usize,
    pub(crate) pin_memory: bool,
}

/// Consumes batches the way a training step does: delivered to `device` through `to_device`
/// and `wait_on` a compute stream, or read on the CPU without a device; with `compute`, each
/// batch is followed by a simulated step of that length (a host function sleeping on the
/// compute stream, at most two steps in flight, or a sleep on the consumer thread).
pub(crate) struct Consumer<'d> {
    device: Option<&'d Device>,
    compute_stream: Option<Stream>,
    compute: Option<Duration>,
    steps: VecDeque<Event>,
    /// The `images-u8` workload on a device: each batch is normalised there into `out`.
    normalize: Option<(NormalizeU8, DeviceBuffer)>,
}

impl<'d> Consumer<'d> {
    pub(crate) fn new(
        device: Option<&'d Device>,
        compute: Option<Duration>,
        w: Workload,
    ) -> Result<Self> {
        let compute_stream = device.map(Device::new_stream).transpose()?;
        let normalize = match (&compute_stream, w) {
            (Some(cs), Workload::ImagesU8) => {
                let [c, h, wd] = workload::IMAGE_SHAPE;
                let norm = NormalizeU8::new(cs, &IMAGENET_MEAN, &IMAGENET_STD, h, wd)?;
                let out = cs.alloc(w.batch_size() * c * h * wd * 4)?;
                Some((norm, out))
            }
            _ => None,
        };
        Ok(Consumer {
            device,
            compute_stream,
            compute,
            steps: VecDeque::new(),
            normalize,
        })
    }

    /// Consumes one epoch, calling `on_batch(samples)` after each batch until it returns
    /// `false`; returns the batches consumed.
    pub(crate) fn epoch<F: Fetch<Output = Batch<PoolBuffer>>>(
        &mut self,
        loader: &DataLoader<F>,
        mut on_batch: impl FnMut(usize) -> bool,
    ) -> Result<usize> {
        let mut seen = 0;
        match (self.device, &self.compute_stream) {
            (Some(dev), Some(cs)) => {
                // `LONGSHORE_BENCH_MAX_COPIES=off` (or a number) overrides the device iterator's
                // bound on queued copies, to measure what it does in the same run.
                let mut it = loader.to_device(dev, 2)?;
                match std::env::var("LONGSHORE_BENCH_MAX_COPIES").ok().as_deref() {
                    Some("off") => it = it.max_copies(usize::MAX),
                    Some(n) => it = it.max_copies(n.parse().context("LONGSHORE_BENCH_MAX_COPIES")?),
                    None => {}
                }
                for item in it {
                    let batch = item?.wait_on(cs)?;
                    let n = batch.batch_size();
                    if let Some((norm, out)) = &mut self.normalize {
                        let offset = batch.spec(0)?.offset;
                        ops::normalize_u8(
                            cs,
                            norm,
                            View::new(batch.buffer(0)?, offset),
                            ViewMut::from(out),
                            n,
                        )?;
                        // At most two steps in flight, as a training loop's step would.
                        self.steps.push_back(cs.record()?);
                        if self.steps.len() > 2 {
                            self.steps.pop_front().expect("step").synchronize()?;
                        }
                    }
                    if let Some(t) = self.compute {
                        cs.launch_host_fn(move || std::thread::sleep(t))?;
                        self.steps.push_back(cs.record()?);
                        if self.steps.len() > 2 {
                            self.steps.pop_front().expect("step").synchronize()?;
                        }
                    }
                    drop(batch);
                    seen += 1;
                    if !on_batch(n) {
                        break;
                    }
                }
            }
            _ => {
                for item in loader {
                    let batch = item?;
                    let bytes = batch.bytes();
                    black_box(
                        bytes.first().copied().unwrap_or(0) ^ bytes.last().copied().unwrap_or(0),
                    );
                    let n = batch.batch_size();
                    drop(batch);
                    if let Some(t) = self.compute {
                        std::thread::sleep(t);
                    }
                    seen += 1;
                    if !on_batch(n) {
                        break;
                    }
                }
            }
        }
        if seen == 0 {
            bail!("the loader yields no batch");
        }
        Ok(seen)
    }

    /// Waits for the work already given to the device.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Some(cs) = &self.compute_stream {
            cs.synchronize()?;
        }
        self.steps.clear();
        Ok(())
    }
}

/// Drives `loader` over `window` (see the module docs), delivering as [`Consumer`] does.
pub(crate) fn drive<F: Fetch<Output = Batch<PoolBuffer>>>(
    loader: &DataLoader<F>,
    device: Option<&Device>,
    window: Window,
    compute: Option<Duration>,
    profile: Option<PathBuf>,
    w: Workload,
) -> Result<Run> {
    let mut c = Consumer::new(device, compute, w)?;
    let cfg = loader.config();
    let in_flight = cfg.options.num_workers.max(1) * cfg.prefetch_factor;
    match window {
        Window::Epochs {
            min_epochs,
            min_secs,
            min_batches,
        } => {
            c.epoch(loader, |_| true)?;
            c.finish()?;
            loader.reset_stats();
            say_placement(loader);
            let profile = profile.map(Profile::start).transpose()?;
            let min_batches = min_batches.max(10 * in_flight);
            let (mut batches, mut samples, mut epochs) = (0usize, 0usize, 0usize);
            let t0 = Instant::now();
            loop {
                batches += c.epoch(loader, |n| {
                    samples += n;
                    true
                })?;
                epochs += 1;
                let done = epochs >= min_epochs
                    && batches >= min_batches
                    && t0.elapsed().as_secs_f64() >= min_secs;
                if done || epochs >= MAX_EPOCHS {
                    break;
                }
            }
            c.finish()?;
            let secs = t0.elapsed().as_secs_f64();
            if let Some(p) = profile {
                p.finish()?;
            }
            Ok(Run {
                samples_per_s: samples as f64 / secs.max(1e-9),
                wait_fraction: loader.stats().wait_fraction(),
                batches,
                epochs,
                secs,
                worker_ms_per_batch: worker_ms(loader),
            })
        }
        Window::Batches { warmup, batches } => {
            let target = warmup + batches;
            let (mut seen, mut samples) = (0usize, 0usize);
            let mut t0 = Instant::now();
            let mut epochs = 0;
            while seen < target && epochs < MAX_EPOCHS {
                epochs += 1;
                c.epoch(loader, |n| {
                    seen += 1;
                    if seen == warmup {
                        loader.reset_stats();
                        t0 = Instant::now();
                    } else if seen > warmup {
                        samples += n;
                    }
                    seen < target
                })?;
            }
            c.finish()?;
            let secs = t0.elapsed().as_secs_f64();
            Ok(Run {
                samples_per_s: samples as f64 / secs.max(1e-9),
                wait_fraction: loader.stats().wait_fraction(),
                batches,
                epochs: 0,
                secs,
                worker_ms_per_batch: worker_ms(loader),
            })
        }
    }
}

/// Prints, once per process, where the workers ended up after the warm-up epoch (the GPU's
/// topology is learnt by `to_device`).
fn say_placement<F: Fetch>(loader: &DataLoader<F>) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let p = loader.placement();
        let cpus = p
            .cpus
            .map_or_else(|| "not pinned".to_owned(), |c| c.to_string());
        eprintln!("loader workers: cpus {cpus} ({})", p.reason);
    });
}

/// The loader's worker time per delivered batch since its stats were reset, in ms.
fn worker_ms<F: Fetch>(loader: &DataLoader<F>) -> f64 {
    let s = loader.stats();
    s.worker_busy.as_secs_f64() * 1e3 / s.batches.max(1) as f64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// u8 images normalised to f32 in the workers, f32 to the device.
    Images,
    /// The same u8 images to the device, normalised there (with a device; read on the CPU
    /// without one).
    ImagesU8,
    Tabular,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Images => "images",
            Workload::ImagesU8 => "images-u8",
            Workload::Tabular => "tabular",
        }
    }

    pub(crate) fn batch_size(self) -> usize {
        match self {
            Workload::Images | Workload::ImagesU8 => 256,
            Workload::Tabular => 1024,
        }
    }

    /// Rows generated (full, quick).
    pub(crate) fn rows(self, quick: bool) -> usize {
        match (self, quick) {
            (Workload::Images | Workload::ImagesU8, false) => 8192,
            (Workload::Images | Workload::ImagesU8, true) => 512,
            (Workload::Tabular, false) => 2_000_000,
            (Workload::Tabular, true) => 65_536,
        }
    }

    /// Bytes of one sample as the loader delivers it: normalised f32 image, or the feature
    /// row plus the i64 label.
    pub(crate) fn sample_bytes(self) -> usize {
        match self {
            Workload::Images => workload::IMAGE_SHAPE.iter().product::<usize>() * 4,
            Workload::ImagesU8 => workload::IMAGE_SHAPE.iter().product::<usize>(),
            Workload::Tabular => workload::TABULAR_FEATURES * 4 + 8,
        }
    }

    /// Both workloads, in report order.
    pub(crate) const ALL: [Workload; 3] = [Workload::Images, Workload::ImagesU8, Workload::Tabular];
}

/// Every workload's loader options: shuffled, `drop_last`, `opts`, persistent workers when
/// there are any, PyTorch's default `prefetch_factor` of 2, seed 0. The next epoch's first
/// batches start while an epoch drains (the loader's default) unless
/// `LONGSHORE_BENCH_NEXT_EPOCH=off`.
fn steady<D, C>(
    b: DataLoaderBuilder<D, C>,
    w: Workload,
    opts: Opts,
) -> Result<DataLoaderBuilder<D, C>> {
    let (placement, priority) = env_toggles()?;
    let next_epoch = std::env::var("LONGSHORE_BENCH_NEXT_EPOCH").map_or(true, |v| v != "off");
    Ok(b.batch_size(w.batch_size())
        .shuffle(true)
        .drop_last(true)
        .num_workers(opts.num_workers)
        .pin_memory(opts.pin_memory)
        .persistent_workers(opts.num_workers > 0)
        .cpu_placement(placement)
        .worker_priority(priority)
        .prefetch_next_epoch(next_epoch)
        .seed(0))
}

/// The loader's worker placement and priority for every steady-state run, from
/// `LONGSHORE_BENCH_PLACEMENT` (`gpu-local`, the library's default, or `off`) and
/// `LONGSHORE_BENCH_WORKER_PRIORITY` (`normal`, the default, or `background`), so one binary
/// measures each setting in the same session. Printed once on stderr.
fn env_toggles() -> Result<(Placement, WorkerPriority)> {
    fn read(name: &str) -> Result<Option<String>> {
        match std::env::var(name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v.trim().to_ascii_lowercase())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => bail!("{name}: {e}"),
        }
    }
    let placement = match read("LONGSHORE_BENCH_PLACEMENT")?.as_deref() {
        None | Some("gpu-local") => Placement::GpuLocal,
        Some("off") => Placement::Off,
        Some(other) => bail!("LONGSHORE_BENCH_PLACEMENT={other:?}: expected gpu-local or off"),
    };
    let priority = match read("LONGSHORE_BENCH_WORKER_PRIORITY")?.as_deref() {
        None | Some("normal") => WorkerPriority::Normal,
        Some("background") => WorkerPriority::Background,
        Some(other) => {
            bail!("LONGSHORE_BENCH_WORKER_PRIORITY={other:?}: expected normal or background")
        }
    };
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("loader workers: placement {placement:?}, priority {priority:?}"));
    Ok((placement, priority))
}

/// Rank `rank` of `world`'s loader for an image workload (`images` or `images-u8`), as a
/// data-parallel job builds it: PyTorch's `DistributedSampler(shuffle=True, seed=0,
/// drop_last=True)` of that rank, otherwise [`steady`]'s options, with the worker placement
/// given (the `ranks` section measures both).
pub(crate) fn rank_images_loader(
    w: Workload,
    files: &workload::Workloads,
    opts: Opts,
    rank: usize,
    world: usize,
    placement: Placement,
) -> Result<
    DataLoader<impl Fetch<Output = Batch<PoolBuffer>> + use<>>,
    longshore::loader::LoaderError,
> {
    let ds = NpyDataset::open(&files.images)?;
    let sampler = DistributedSampler::builder(ds.len(), world, rank)
        .shuffle(true)
        .seed(0)
        .drop_last(true)
        .build()?;
    let collate = DirectCollate::new().with_names(["image"]);
    let collate = if w == Workload::Images {
        collate.with_transform(0, Normalize::imagenet(ImageLayout::Chw))
    } else {
        collate
    };
    let next_epoch = std::env::var("LONGSHORE_BENCH_NEXT_EPOCH").map_or(true, |v| v != "off");
    DataLoader::builder(ds)
        .collate(collate)
        .batch_size(w.batch_size())
        .sampler(sampler)
        .drop_last(true)
        .num_workers(opts.num_workers)
        .pin_memory(opts.pin_memory)
        .persistent_workers(opts.num_workers > 0)
        .cpu_placement(placement)
        .prefetch_next_epoch(next_epoch)
        .seed(0)
        .build()
}

/// Builds the loader for `w` (shuffled, `drop_last`, persistent workers when there are any,
/// the default `prefetch_factor` of 2) and drives it over `window`.
pub(crate) fn run_workload(
    w: Workload,
    files: &workload::Workloads,
    opts: Opts,
    device: Option<&Device>,
    window: Window,
    compute: Option<Duration>,
    profile: Option<PathBuf>,
) -> Result<Run> {
    match w {
        Workload::Images | Workload::ImagesU8 => {
            let ds = NpyDataset::open(&files.images)?;
            let collate = DirectCollate::new().with_names(["image"]);
            // f32 normalised in the workers, or u8 for the device to normalise.
            let collate = if w == Workload::Images {
                collate.with_transform(0, Normalize::imagenet(ImageLayout::Chw))
            } else {
                collate
            };
            let loader = steady(DataLoader::builder(ds).collate(collate), w, opts)?.build()?;
            drive(&loader, device, window, compute, profile, w)
        }
        Workload::Tabular => {
            let ds = Zip::direct(
                NpyDataset::open(&files.tabular_x)?,
                NpyDataset::open(&files.tabular_y)?,
            )?;
            let collate = DirectCollate::new().with_names(["x", "y"]);
            let loader = steady(DataLoader::builder(ds).collate(collate), w, opts)?.build()?;
            drive(&loader, device, window, compute, profile, w)
        }
    }
}

pub(crate) fn ensure_data(ctx: &mut Ctx) -> Result<workload::Workloads> {
    let files = workload::ensure(
        &ctx.data_dir,
        ctx.args
            .image_rows
            .unwrap_or(Workload::Images.rows(ctx.quick)),
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

/// A steady-state run of `w` with `opts` (window [`Window::steady`], no compute), measured
/// once per bench run: the loader sweep and the scaling curve share their common points.
pub(crate) fn steady_run(
    ctx: &mut Ctx,
    files: &workload::Workloads,
    w: Workload,
    opts: Opts,
) -> Result<Run> {
    if let Some(r) = ctx.runs.get(&(w.name(), opts)) {
        return Ok(*r);
    }
    let device = ctx.cuda.clone();
    let profile = ctx.args.profile.as_ref().map(|dir| {
        crate::profile::prefix(
            dir,
            &format!(
                "{}-w{}-pin{}",
                w.name(),
                opts.num_workers,
                u8::from(opts.pin_memory)
            ),
        )
    });
    let r = run_workload(
        w,
        files,
        opts,
        device.as_ref(),
        Window::steady(ctx.quick),
        None,
        profile,
    )?;
    ctx.runs.insert((w.name(), opts), r);
    Ok(r)
}

/// What the steady-state window means, for notes and table titles.
pub(crate) const METHOD: &str = "whole epochs timed after one untimed warm-up epoch, persistent workers, prefetch_factor 2; at least 2 epochs, 1 s and 10 x num_workers x prefetch_factor batches (quick: no 1 s minimum)";
