//! PyTorch's ImageNet example, the data side, in Rust: `ImageFolder` train and val folders
//! decoded and augmented by loader workers (`RandomResizedCrop(224)`, flip, normalise; and
//! `Resize(256)`, `CenterCrop(224)`, normalise), delivered to the device, training a linear
//! classifier head on the pixels for a few epochs; `--tune` sweeps `num_workers` x
//! `pin_memory` with the built-in tuner instead, as the seeds' sweep script does.
//!
//! ```text
//! cargo run --release --example imagenet                        # a generated ImageNet-like folder
//! cargo run --release --example imagenet -- --data /data/imagenet   # DIR/train, DIR/val
//! cargo run --release --example imagenet -- --tune
//! ```
//!
//! Without `--data`, a small ImageNet-like folder (the benchmark's generator, fewer and smaller
//! images) is written under `target/longshore-examples/imagenet-like` first and reused.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use longshore::data::{Dataset, DirectCollate};
use longshore::loader::{DataLoader, Tuner};
use longshore::nvjpeg::{EncodedCollate, EncodedImages, NvjpegDecoder};
use longshore::transfer::{DeviceBuffer, Stream};
use longshore::vision::synth::{FolderSpec, write_folder};
use longshore::vision::{Compose, ImageDataset, ImageFolder};
use longshore_examples::{DeviceChoice, data_root, pick_device};
use longshore_ops::{
    self as ops, Activation, CrossEntropyArgs, CrossEntropyStats, GemmArgs, Sgd, View, ViewMut,
};

/// Train a linear head on an ImageFolder with PyTorch's ImageNet transforms.
#[derive(Debug, Parser)]
struct Args {
    /// The dataset: `DIR/train/<class>/*` and `DIR/val/<class>/*` (PyTorch's layout).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Passes over the training folder.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Images per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Loader worker threads (default: the number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Learning rate of SGD with momentum 0.9.
    #[arg(long, default_value_t = 4e-6)]
    lr: f32,
    /// Seed of shuffling and augmentation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The device to train on.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,
    /// Sweep num_workers x pin_memory on the training pipeline and print the best, instead of
    /// training.
    #[arg(long)]
    tune: bool,
    /// Where images are decoded: `cpu` (the loader's workers) or `nvjpeg` (on the GPU with
    /// nvJPEG; the workers only read files into pinned memory).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "nvjpeg"])]
    decode: String,
    /// With `--decode nvjpeg`: the share (0 to 1) of the JPEGs the GPU's engines would take
    /// that the workers decode on the CPU instead, beside them (`EncodedImages::cpu_share`).
    #[arg(long, default_value_t = 0.0)]
    cpu_share: f64,
}

/// A linear classifier `[b, features] -> [b, classes]` with SGD momentum.
struct Head {
    w: DeviceBuffer,
    b: DeviceBuffer,
    vw: DeviceBuffer,
    vb: DeviceBuffer,
    gw: DeviceBuffer,
    gb: DeviceBuffer,
    logits: DeviceBuffer,
    dlogits: DeviceBuffer,
    features: usize,
    classes: usize,
    sgd: Sgd,
}

impl Head {
    fn new(s: &Stream, features: usize, classes: usize, max_batch: usize, lr: f32) -> Result<Head> {
        let z = |n: usize| s.alloc_zeroed(n * 4);
        Ok(Head {
            w: z(features * classes)?,
            b: z(classes)?,
            vw: z(features * classes)?,
            vb: z(classes)?,
            gw: z(features * classes)?,
            gb: z(classes)?,
            logits: z(max_batch * classes)?,
            dlogits: z(max_batch * classes)?,
            features,
            classes,
            sgd: Sgd {
                lr,
                momentum: 0.9,
                weight_decay: 1e-4,
            },
        })
    }

    /// Forward pass and loss; with `train`, backward and the update too.
    fn step(
        &mut self,
        s: &Stream,
        x: View<'_>,
        labels: View<'_>,
        b: usize,
        stats: &mut DeviceBuffer,
        train: bool,
    ) -> Result<()> {
        let (f, c) = (self.features, self.classes);
        ops::gemm(
            s,
            GemmArgs::new(
                b,
                c,
                f,
                x,
                View::from(&self.w),
                ViewMut::from(&mut self.logits),
            ),
        )?;
        ops::bias_act(
            s,
            ViewMut::from(&mut self.logits),
            View::from(&self.b),
            b,
            c,
            Activation::Identity,
        )?;
        ops::softmax_cross_entropy(
            s,
            CrossEntropyArgs {
                logits: View::from(&self.logits),
                labels,
                rows: b,
                classes: c,
                grad: ViewMut::from(&mut self.dlogits),
                grad_scale: 1.0 / b as f32,
                stats: ViewMut::from(stats),
            },
        )?;
        if !train {
            return Ok(());
        }
        ops::gemm(
            s,
            GemmArgs::new(
                f,
                c,
                b,
                x,
                View::from(&self.dlogits),
                ViewMut::from(&mut self.gw),
            )
            .trans_a(true),
        )?;
        ops::bias_grad(
            s,
            View::from(&self.dlogits),
            b,
            c,
            ViewMut::from(&mut self.gb),
        )?;
        ops::sgd_momentum(
            s,
            ViewMut::from(&mut self.w),
            ViewMut::from(&mut self.vw),
            View::from(&self.gw),
            f * c,
            self.sgd,
        )?;
        ops::sgd_momentum(
            s,
            ViewMut::from(&mut self.b),
            ViewMut::from(&mut self.vb),
            View::from(&self.gb),
            c,
            self.sgd,
        )?;
        Ok(())
    }
}

/// The dataset folders: `--data` or a generated ImageNet-like pair.
fn folders(data: Option<&Path>) -> Result<(PathBuf, PathBuf)> {
    if let Some(d) = data {
        return Ok((d.join("train"), d.join("val")));
    }
    let root = data_root(None).join("imagenet-like");
    let small = |per_class, seed| FolderSpec {
        classes: 10,
        per_class,
        mean_area: 60_000.0,
        quality: 90,
        seed,
    };
    let t = Instant::now();
    let train = write_folder(&root.join("train"), &small(48, 1))?;
    write_folder(&root.join("val"), &small(12, 2))?;
    if !train.reused {
        println!(
            "generated an ImageNet-like folder in {} ({:.1} s)",
            root.display(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok((root.join("train"), root.join("val")))
}

fn loader(
    ds: &ImageDataset,
    batch: usize,
    workers: usize,
    pin: bool,
    shuffle: bool,
    seed: u64,
) -> Result<longshore::loader::DirectLoader<ImageDataset>, longshore::loader::LoaderError> {
    let mut b = DataLoader::builder(ds.clone())
        .collate(DirectCollate::new())
        .batch_size(batch)
        .shuffle(shuffle)
        .num_workers(workers)
        .pin_memory(pin)
        .seed(seed);
    if workers > 0 {
        b = b.persistent_workers(true);
    }
    b.build()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (device, note) = pick_device(args.device)?;
    if let Some(n) = note {
        println!("{n}");
    }
    let (train_dir, val_dir) = folders(args.data.as_deref())?;
    let train_folder =
        ImageFolder::new(&train_dir).with_context(|| format!("reading {}", train_dir.display()))?;
    let val_folder =
        ImageFolder::new(&val_dir).with_context(|| format!("reading {}", val_dir.display()))?;
    ensure!(
        train_folder.classes() == val_folder.classes(),
        "train and val have different classes"
    );
    let classes = train_folder.classes().len();
    println!(
        "{} train and {} val images in {classes} classes, on {device:?}",
        train_folder.len(),
        val_folder.len()
    );
    let train = train_folder.with_transform(Compose::imagenet_train());
    let val = val_folder.with_transform(Compose::imagenet_val());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = args.workers.unwrap_or(cores);

    if args.tune {
        let mut grid = vec![0, 1];
        let mut w = 2;
        while w <= 2 * cores {
            grid.push(w);
            w *= 2;
        }
        // The tuner times batches within one epoch. Steady state needs ten times the batches
        // that can be in flight (workers x prefetch_factor 2), so the folder's samples are
        // repeated until one epoch holds that many.
        let batches = 10 * 2 * grid.iter().copied().max().unwrap_or(1);
        let needed = (batches + 1) * args.batch_size;
        let samples = train.folder().samples();
        let repeated = samples
            .iter()
            .cycle()
            .take(needed.max(samples.len()))
            .cloned();
        let tune_set =
            ImageFolder::from_samples(repeated).with_transform(Compose::imagenet_train());
        println!(
            "tuning on {} samples ({batches} batches timed per configuration)",
            tune_set.len()
        );
        let report = Tuner::new()
            .workers(grid)
            .pin_memory([false, true])
            .batches(batches)
            .device(device.clone(), 2)
            .run(|w, pin| loader(&tune_set, args.batch_size, w, pin, true, args.seed))?;
        for t in &report.trials {
            println!(
                "num_workers={:>2} pin_memory={:<5} {:>8.0} images/s  waited {:>5.1}%",
                t.num_workers,
                t.pin_memory,
                t.samples_per_second,
                100.0 * t.wait_fraction
            );
        }
        let b = &report.best;
        println!(
            "best: num_workers={} pin_memory={} ({:.0} images/s)",
            b.num_workers, b.pin_memory, b.samples_per_second
        );
        return Ok(());
    }

    if args.decode == "nvjpeg" {
        return train_nvjpeg(&args, &device, &train, &val, classes, workers);
    }
    let train_loader = loader(&train, args.batch_size, workers, true, true, args.seed)?;
    let val_loader = loader(&val, args.batch_size, workers, true, false, args.seed)?;
    let compute = device.new_stream()?;
    let (_, h, w) = (3, 224, 224);
    let mut head = Head::new(&compute, 3 * h * w, classes, args.batch_size, args.lr)?;
    let mut stats = compute.alloc_zeroed(CrossEntropyStats::LEN * 4)?;
    for epoch in 0..args.epochs {
        for (phase, l, training) in [("train", &train_loader, true), ("val", &val_loader, false)] {
            let t = Instant::now();
            l.set_epoch(epoch as u64);
            l.reset_stats();
            compute.memset(&mut stats, 0)?;
            let mut seen = 0;
            for item in l.to_device(&device, 2)? {
                let batch = item?.wait_on(&compute)?;
                let b = batch.batch_size();
                let (xo, yo) = (batch.spec(0)?.offset, batch.spec(1)?.offset);
                head.step(
                    &compute,
                    View::new(batch.buffer(0)?, xo),
                    View::new(batch.buffer(1)?, yo),
                    b,
                    &mut stats,
                    training,
                )?;
                seen += b;
            }
            let st = CrossEntropyStats::from_slice(&compute.read_to_vec::<f32>(&stats)?)?;
            println!(
                "epoch {} {phase:<5}: loss {:.4}  accuracy {:>5.1}%  {:>6.0} images/s  waited {:>4.1}% for data",
                epoch + 1,
                st.loss_sum / seen.max(1) as f64,
                100.0 * st.correct as f64 / seen.max(1) as f64,
                seen as f64 / t.elapsed().as_secs_f64(),
                100.0 * l.stats().wait_fraction()
            );
        }
    }
    Ok(())
}

/// Training with nvJPEG decoding: the workers read files into pinned batches
/// ([`EncodedCollate`]), the GPU decodes, crops, resizes and normalises.
fn train_nvjpeg(
    args: &Args,
    device: &longshore::transfer::Device,
    train: &ImageDataset,
    val: &ImageDataset,
    classes: usize,
    workers: usize,
) -> Result<()> {
    ensure!(!device.is_cpu(), "--decode nvjpeg needs a CUDA device");
    let encoded =
        |ds: &ImageDataset| EncodedImages::new(ds.clone()).map(|e| e.cpu_share(args.cpu_share));
    let (train, val) = (encoded(train)?, encoded(val)?);
    let build = |files: &EncodedImages, shuffle: bool| {
        let mut b = DataLoader::builder(files.clone())
            .collate(EncodedCollate)
            .batch_size(args.batch_size)
            .shuffle(shuffle)
            .num_workers(workers)
            .pin_memory(true)
            .seed(args.seed);
        if workers > 0 {
            b = b.persistent_workers(true);
        }
        b.build()
    };
    // Each loader keeps its decoder (the device stage) across epochs.
    let loaders = [
        (
            "train",
            build(&train, true)?.with_stage(NvjpegDecoder::new(device, &train)?),
            true,
        ),
        (
            "val",
            build(&val, false)?.with_stage(NvjpegDecoder::new(device, &val)?),
            false,
        ),
    ];
    let compute = device.new_stream()?;
    let mut head = Head::new(&compute, 3 * 224 * 224, classes, args.batch_size, args.lr)?;
    let mut stats = compute.alloc_zeroed(CrossEntropyStats::LEN * 4)?;
    for epoch in 0..args.epochs {
        for (phase, on_gpu, training) in &loaders {
            let t = Instant::now();
            let l = on_gpu.loader();
            l.set_epoch(epoch as u64);
            l.reset_stats();
            compute.memset(&mut stats, 0)?;
            let mut seen = 0;
            let before = on_gpu.stage(|d| d.stats()).context("the decoder")?;
            for item in on_gpu.iter()? {
                let batch = item?.wait_on(&compute)?;
                let b = batch.batch_size();
                head.step(
                    &compute,
                    View::new(batch.buffer(0)?, 0),
                    View::new(batch.buffer(1)?, 0),
                    b,
                    &mut stats,
                    *training,
                )?;
                seen += b;
            }
            let after = on_gpu.stage(|d| d.stats()).context("the decoder")?;
            let (hardware, default, cpu) = (
                after.hardware - before.hardware,
                after.default_backend - before.default_backend,
                after.cpu_fallback + after.worker - before.cpu_fallback - before.worker,
            );
            let st = CrossEntropyStats::from_slice(&compute.read_to_vec::<f32>(&stats)?)?;
            println!(
                "epoch {} {phase:<5} (nvjpeg: {} hardware, {} default, {} cpu): loss {:.4}  accuracy {:>5.1}%  {:>6.0} images/s  waited {:>4.1}% for data",
                epoch + 1,
                hardware,
                default,
                cpu,
                st.loss_sum / seen.max(1) as f64,
                100.0 * st.correct as f64 / seen.max(1) as f64,
                seen as f64 / t.elapsed().as_secs_f64(),
                100.0 * l.stats().wait_fraction()
            );
        }
    }
    Ok(())
}
