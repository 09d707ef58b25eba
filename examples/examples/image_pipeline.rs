//! Where should `u8` images become normalised `f32`? Compares, on 3x224x224 images memory-mapped
//! from a `.npy` file:
//!
//! * (a) normalising on the CPU in the loader's workers (`Normalize` transform), then copying
//!   `f32` batches to the device;
//! * (b) copying the `u8` batches (a quarter of the bytes) and normalising on the device with
//!   `longshore_ops::normalize_u8`.
//!
//! ```text
//! cargo run --release --example image_pipeline
//! cargo run --release --example image_pipeline -- --images 2048 --workers 8 --device cuda
//! ```
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, ensure};
use clap::Parser;
use longshore::data::{
    DType, DatasetExt, DirectCollate, ImageLayout, Normalize, NpyDataset, write_npy,
};
use longshore::loader::DataLoader;
use longshore::transfer::{Device, Event};
use longshore_examples::{
    DeviceChoice, data_root, expect_tensor, npy_has_shape, pick_device, progress, write_atomically,
};
use longshore_ops::{self as ops, NormalizeU8, View, ViewMut};

const C: usize = 3;
const H: usize = 224;
const W: usize = 224;
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Compare CPU-side and device-side normalisation of u8 images.
#[derive(Debug, Parser)]
struct Args {
    /// Images in the generated dataset (each 3x224x224 u8, 147 KiB).
    #[arg(long, default_value_t = 1024)]
    images: usize,
    /// Images per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Timed passes over the data per variant (after one untimed warm-up pass).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Where to generate (or find) the data; default target/longshore-examples.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The device.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,
}

struct Run {
    images_per_sec: f64,
    wait_fraction: f64,
    first_batch: Vec<f32>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.images > 0 && args.batch_size > 0 && args.epochs > 0,
        "sizes must be positive"
    );
    let (device, note) = pick_device(args.device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let path = data_root(args.data_dir.as_deref())
        .join(format!("images-n{}", args.images))
        .join("images.npy");
    if !npy_has_shape(&path, &[args.images, C, H, W]) {
        println!("generating {} images into {}", args.images, path.display());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let pixels: Vec<u8> = (0..args.images * C * H * W)
            .map(|i| {
                // A gradient plus xorshift noise: cheap, and not constant.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((i % W) as u64 + (x & 63)) as u8
            })
            .collect();
        write_atomically(&path, |p| {
            Ok(write_npy(p, &[args.images, C, H, W], &pixels)?)
        })?;
    }
    println!(
        "{} images of {C}x{H}x{W} u8, batch {}, {} workers, on {}",
        args.images,
        args.batch_size,
        args.workers,
        device.name()
    );

    let a = run_cpu_normalize(&args, &device, &path)?;
    let b = run_device_normalize(&args, &device, &path)?;
    let max_diff = a
        .first_batch
        .iter()
        .zip(&b.first_batch)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    ensure!(
        max_diff < 1e-4,
        "the two pipelines disagree: max |diff| {max_diff}"
    );

    let image_f32 = (C * H * W * 4) as f64;
    println!();
    println!(
        "variant                                   images/s   copied per image   waited for data"
    );
    println!(
        "(a) normalise in workers, copy f32      {:>10.0}   {:>10.0} KiB   {:>14.1}%",
        a.images_per_sec,
        image_f32 / 1024.0,
        100.0 * a.wait_fraction
    );
    println!(
        "(b) copy u8, normalise on the device    {:>10.0}   {:>10.0} KiB   {:>14.1}%",
        b.images_per_sec,
        image_f32 / 4.0 / 1024.0,
        100.0 * b.wait_fraction
    );
    println!(
        "ratio (b)/(a): {:.2}x; both produce the same tensors (max |diff| {max_diff:.1e})",
        b.images_per_sec / a.images_per_sec
    );
    if device.is_cpu() {
        println!(
            "on the cpu device the \"copy\" is a memcpy and the device is this CPU: the ratio shows \
             the cost of the workers' extra f32 writes, not the PCIe saving (run with a GPU for that)"
        );
    }
    Ok(())
}

/// Paces the host: at most two batches' work outstanding on the compute stream.
fn pace(in_flight: &mut VecDeque<Event>, ev: Event) -> Result<()> {
    in_flight.push_back(ev);
    if in_flight.len() > 2 {
        in_flight.pop_front().map(|e| e.synchronize()).transpose()?;
    }
    Ok(())
}

/// (a): the workers normalise; f32 crosses to the device.
fn run_cpu_normalize(args: &Args, device: &Device, path: &std::path::Path) -> Result<Run> {
    let ds = NpyDataset::open(path)?.transform(Normalize::new(&MEAN, &STD, ImageLayout::Chw)?);
    let mut builder = DataLoader::builder(ds)
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .pin_memory(true);
    if args.workers > 0 {
        builder = builder.persistent_workers(true);
    }
    let loader = builder.build()?;
    let compute = device.new_stream()?;
    let mut first_batch = Vec::new();
    let pb = progress(((args.epochs + 1) * args.images) as u64, "images (a)", true);
    let mut timed = 0.0;
    for epoch in 0..=args.epochs {
        if epoch == 1 {
            loader.reset_stats();
        }
        let start = Instant::now();
        let mut in_flight = VecDeque::new();
        for item in loader.to_device(device, 2)? {
            let batch = item?.wait_on(&compute)?;
            if first_batch.is_empty() {
                expect_tensor(
                    "images",
                    batch.dtype(0)?,
                    DType::F32,
                    batch.shape(0)?,
                    &[C, H, W],
                )?;
                let host = batch.to_host(&compute)?;
                first_batch = host.tensor::<f32>(0)?.to_vec();
            }
            pace(&mut in_flight, compute.record()?)?;
            pb.inc(batch.batch_size() as u64);
        }
        compute.synchronize()?;
        if epoch > 0 {
            timed += start.elapsed().as_secs_f64();
        }
    }
    pb.finish_and_clear();
    Ok(Run {
        images_per_sec: (args.epochs * args.images) as f64 / timed,
        wait_fraction: loader.stats().wait_fraction(),
        first_batch,
    })
}

/// (b): u8 crosses to the device, which normalises.
fn run_device_normalize(args: &Args, device: &Device, path: &std::path::Path) -> Result<Run> {
    let mut builder = DataLoader::builder(NpyDataset::open(path)?)
        .collate(DirectCollate::new())
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .pin_memory(true);
    if args.workers > 0 {
        builder = builder.persistent_workers(true);
    }
    let loader = builder.build()?;
    let compute = device.new_stream()?;
    let norm = NormalizeU8::new(&compute, &MEAN, &STD, H, W)?;
    let mut out = compute.alloc(args.batch_size * norm.image_len() * 4)?;
    let mut first_batch = Vec::new();
    let pb = progress(((args.epochs + 1) * args.images) as u64, "images (b)", true);
    let mut timed = 0.0;
    for epoch in 0..=args.epochs {
        if epoch == 1 {
            loader.reset_stats();
        }
        let start = Instant::now();
        let mut in_flight = VecDeque::new();
        for item in loader.to_device(device, 2)? {
            let batch = item?.wait_on(&compute)?;
            let n = batch.batch_size();
            let offset = batch.spec(0)?.offset;
            ops::normalize_u8(
                &compute,
                &norm,
                View::new(batch.buffer(0)?, offset),
                ViewMut::from(&mut out),
                n,
            )?;
            if first_batch.is_empty() {
                expect_tensor(
                    "images",
                    batch.dtype(0)?,
                    DType::U8,
                    batch.shape(0)?,
                    &[C, H, W],
                )?;
                first_batch = compute.read_to_vec::<f32>(&out)?[..n * norm.image_len()].to_vec();
            }
            pace(&mut in_flight, compute.record()?)?;
            pb.inc(n as u64);
        }
        compute.synchronize()?;
        if epoch > 0 {
            timed += start.elapsed().as_secs_f64();
        }
    }
    pb.finish_and_clear();
    Ok(Run {
        images_per_sec: (args.epochs * args.images) as f64 / timed,
        wait_fraction: loader.stats().wait_fraction(),
        first_batch,
    })
}
