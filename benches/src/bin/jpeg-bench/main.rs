//! `jpeg-bench`: the `jpeg` section of `cargo xtask bench` — an ImageNet-like JPEG folder
//! through longshore's CPU decoding pipelines and through PyTorch + torchvision.
//!
//! 1. Generates the folder once (`longshore::vision::synth`, 10,000 JPEGs in 100 classes,
//!    about 400x350 and 110 KB each; `--quick`: 64 small ones), reused while its spec holds.
//! 2. Per core: decode-only, decode + train pipeline and decode + val pipeline rates on one
//!    thread, over files already in memory (what one worker can do): the median of 5
//!    rounds, stages interleaved, into an f32-aligned slot as a batch buffer's.
//! 3. The loader, steady state: persistent workers, one warm-up epoch, then whole epochs
//!    timed, for PyTorch's ImageNet train (`RandomResizedCrop(224)`, flip, normalise) and val
//!    (`Resize(256)`, `CenterCrop(224)`, normalise) pipelines, swept over `num_workers` x
//!    `pin_memory`, delivered to the GPU when one is present; samples/s and the machine's CPU
//!    share (from /proc/stat) over the timed epochs.
//! 4. PyTorch: `xtask/pytorch/imagefolder_bench.py` on the same folder (torchvision's
//!    ImageFolder and transforms through DataLoader, workers {0,4,8,16,32} x pin_memory, same
//!    steady-state protocol), when `python -c "import torchvision"` works.
//!
//! 5. With `--decode nvjpeg` (or `both`) and a GPU: the same pipelines with nvJPEG decoding
//!    on the device (`longshore::nvjpeg`: workers only read files into pinned memory,
//!    nvJPEG's hardware engines or default backend decode, one kernel crops, resizes and
//!    normalises), pinned, swept over `num_workers`; the torchvision script then also
//!    measures `torchvision.io.decode_jpeg(device="cuda")` + resize on batches of 256.
//!
//! Writes `jpeg.json` and `jpeg.md` under `--out`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use longshore::data::rng::epoch_rng;
use longshore::data::{AlignedBuf, DirectCollate};
use longshore::host::HostBuffer;
use longshore::nvjpeg::{CeilingStage, EncodedCollate, EncodedImages, NvjpegDecoder, NvjpegStats};
use longshore::prelude::*;
use longshore::vision::decode::{DecodeOptions, decode_rgb, decode_rgb_into};
use longshore::vision::synth::{FolderSpec, write_folder};
use longshore::vision::{Compose, ImageFolder};
use serde_json::{Value, json};

mod ranks;
mod report;

use report::markdown;

#[derive(Debug, Parser)]
#[command(
    name = "jpeg-bench",
    about = "ImageNet-like JPEG pipelines: longshore vs torchvision"
)]
struct Args {
    /// A tiny folder and one timed epoch: proves the section runs (CI), in seconds.
    #[arg(long)]
    quick: bool,
    /// Where jpeg.json and jpeg.md go.
    #[arg(long, default_value = "target/longshore-bench")]
    out: PathBuf,
    /// Where the folder is generated and reused (default: `<out>/data`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// longshore worker counts to sweep (default: cores/2, cores, 2 x cores).
    #[arg(long, value_delimiter = ',')]
    workers: Vec<usize>,
    /// Timed epochs after the warm-up epoch.
    #[arg(long)]
    epochs: Option<usize>,
    /// Samples per batch.
    #[arg(long)]
    batch_size: Option<usize>,
    /// The Python interpreter for the torchvision baseline.
    #[arg(long, default_value = "python3")]
    python: String,
    /// PyTorch worker counts to sweep.
    #[arg(long, default_value = "0,4,8,16,32")]
    torch_workers: String,
    /// Skip the torchvision baseline.
    #[arg(long)]
    no_pytorch: bool,
    /// Where longshore decodes: `cpu` (the workers), `nvjpeg` (the GPU), or `both`.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "nvjpeg", "both"])]
    decode: String,
    /// nvJPEG device-stage threads to sweep (`NvjpegLoader::nvjpeg_lanes`).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    nvjpeg_lanes: Vec<usize>,
    /// nvJPEG: shares of the hardware-routed JPEGs the workers decode on the CPU, beside the
    /// GPU's engines, to sweep (`EncodedImages::cpu_share`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    cpu_share: Vec<f64>,
    /// Also measure what nvJPEG itself does on this GPU, one thread, no loader: the hardware
    /// batched decode alone on a batch of the folder's JPEGs in page-locked memory, with the
    /// routing checks, and the whole device stage (`NvjpegDecoder::ceiling`).
    #[arg(long)]
    nvjpeg_ceiling: bool,
    /// Only the ceiling (with `--nvjpeg-ceiling`): skip the loader runs and PyTorch.
    #[arg(long)]
    ceiling_only: bool,
    /// World sizes for the ranks section (e.g. `1,2`): the train pipeline with one loader per
    /// GPU, for each decode mode of `--decode` (see `ranks.rs`). Default: not run.
    #[arg(long, value_delimiter = ',')]
    ranks: Vec<usize>,
    /// With `--ranks`: skip the single-loader sweeps (the per-core rates and PyTorch still run).
    #[arg(long)]
    ranks_only: bool,
    /// With `--ranks`: nvJPEG workers per rank to try (default 1, 2, 4, 8 within the cores).
    #[arg(long, value_delimiter = ',')]
    ranks_nvjpeg_workers: Vec<usize>,
}

/// Busy and total jiffies of the whole machine (/proc/stat), for the CPU share.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = (before?, after?);
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Single-thread rates over files in memory: every stage once per round, stages interleaved,
/// the median round of each (5 rounds; `--quick`: 1).
fn per_core(folder: &ImageFolder, quick: bool) -> Result<Value> {
    let n = folder.len().min(if quick { 32 } else { 400 });
    let rounds = if quick { 1 } else { 5 };
    let files: Vec<Vec<u8>> = (0..n)
        .map(|i| folder.read(i).map(|(_, b, _)| b))
        .collect::<Result<_, _>>()?;
    let opts = DecodeOptions::default();
    let decoded: Vec<_> = files
        .iter()
        .map(|f| decode_rgb(f, &opts))
        .collect::<Result<_, _>>()?;
    let pixels: usize = decoded.iter().map(|d| d.width() * d.height()).sum();
    let bytes: usize = files.iter().map(Vec::len).sum();
    let (train, val) = (Compose::imagenet_train(), Compose::imagenet_val());
    // Slots aligned for f32, as a batch buffer's are.
    let mut out = AlignedBuf::zeroed(train.output_bytes());
    let mut buf = Vec::new();
    let stages = [
        "decode_images_per_s",
        "decode_into_images_per_s",
        "train_transform_images_per_s",
        "val_transform_images_per_s",
        "train_decode_transform_images_per_s",
        "val_decode_transform_images_per_s",
    ];
    let mut samples = vec![Vec::new(); stages.len()];
    for round in 0..rounds {
        let mut rng = epoch_rng(0, round as u64);
        for (k, rates) in samples.iter_mut().enumerate() {
            let t = Instant::now();
            for (f, img) in files.iter().zip(&decoded) {
                match k {
                    0 => drop(black_box(decode_rgb(f, &opts)?)),
                    1 => drop(black_box(decode_rgb_into(f, &opts, &mut buf)?)),
                    2 => train.apply_into(img, &mut rng, &mut out)?,
                    3 => val.apply_into(img, &mut rng, &mut out)?,
                    4 => train.decode_into(Path::new("mem"), f, &opts, &mut rng, &mut out)?,
                    _ => val.decode_into(Path::new("mem"), f, &opts, &mut rng, &mut out)?,
                }
                black_box(&out);
            }
            rates.push(n as f64 / t.elapsed().as_secs_f64());
        }
    }
    let mut rates = serde_json::Map::new();
    rates.insert("mean_pixels".into(), json!(pixels as f64 / n as f64));
    rates.insert("mean_file_bytes".into(), json!(bytes as f64 / n as f64));
    rates.insert("rounds".into(), json!(rounds));
    for (name, mut r) in stages.iter().zip(samples) {
        r.sort_by(f64::total_cmp);
        rates.insert((*name).into(), json!(r[r.len() / 2]));
    }
    Ok(Value::Object(rates))
}

/// Steady state: one warm-up epoch, then `epochs` whole epochs timed.
fn steady(
    dataset: &longshore::vision::ImageDataset,
    workers: usize,
    pin: bool,
    batch: usize,
    epochs: usize,
    device: Option<&Device>,
) -> Result<Value> {
    let mut b = DataLoader::builder(dataset.clone())
        .collate(DirectCollate::new())
        .batch_size(batch)
        .shuffle(true)
        .num_workers(workers)
        .pin_memory(pin)
        .seed(0);
    if workers > 0 {
        b = b.persistent_workers(true);
    }
    let loader = b.build()?;
    let compute = device.map(|d| d.new_stream()).transpose()?;
    let run_epoch = || -> Result<usize> {
        let mut n = 0;
        match (device, &compute) {
            (Some(d), Some(s)) => {
                for item in loader.to_device(d, 2)? {
                    let batch = item?.wait_on(s)?;
                    n += batch.batch_size();
                }
                s.synchronize()?;
            }
            _ => {
                for item in loader.iter() {
                    let batch = item?;
                    black_box(batch.bytes().first().copied());
                    n += batch.batch_size();
                }
            }
        }
        Ok(n)
    };
    let (rate, cpu) = time_epochs(epochs, run_epoch, || loader.reset_stats())?;
    Ok(run_json(
        workers,
        pin,
        rate,
        cpu,
        loader.stats().wait_fraction(),
        epochs,
    ))
}

/// Steady state with nvJPEG decoding on `device`: workers read files into pinned batches.
fn steady_nvjpeg(
    files: &EncodedImages,
    workers: usize,
    lanes: usize,
    cpu_share: f64,
    batch: usize,
    epochs: usize,
    device: &Device,
) -> Result<Value> {
    let mut b = DataLoader::builder(files.clone().cpu_share(cpu_share))
        .collate(EncodedCollate)
        .batch_size(batch)
        .shuffle(true)
        .num_workers(workers)
        .pin_memory(true)
        .seed(0);
    if workers > 0 {
        b = b.persistent_workers(true);
    }
    let loader = b.build()?;
    let compute = device.new_stream()?;
    // The decoder is the loader's device stage, kept (with its lanes) across epochs.
    let on_gpu = loader
        .with_stage(NvjpegDecoder::new(device, files)?)
        .lanes(lanes)
        .depth(2);
    // Where each epoch's wall time goes, outside the device stage's own phases: starting the
    // epoch's iterator, its first batch, the rest, the final synchronise, ending the epoch
    // (the lanes back to the loader); the warm-up epoch (index 0) apart from the timed ones
    // (index 1).
    let mut epoch_phases = [[std::time::Duration::ZERO; 5]; 2];
    let mut epochs_run = 0usize;
    let run_epoch = || -> Result<usize> {
        let epoch_phases = &mut epoch_phases[usize::from(epochs_run > 0)];
        epochs_run += 1;
        let t = Instant::now();
        let mut it = on_gpu.iter()?;
        epoch_phases[0] += t.elapsed();
        let t = Instant::now();
        let mut n = 0;
        let mut first = true;
        for item in &mut it {
            n += item?.wait_on(&compute)?.batch_size();
            if std::mem::take(&mut first) {
                epoch_phases[1] += t.elapsed();
            }
        }
        epoch_phases[2] += t.elapsed();
        let t = Instant::now();
        compute.synchronize()?;
        epoch_phases[3] += t.elapsed();
        let t = Instant::now();
        drop(it);
        epoch_phases[4] += t.elapsed();
        Ok(n)
    };
    let (rate, cpu) = time_epochs(epochs, run_epoch, || loader.reset_stats())?;
    let ms = |d: std::time::Duration, n: usize| d.as_secs_f64() * 1e3 / n.max(1) as f64;
    let epoch_json = |p: &[std::time::Duration; 5], n: usize| {
        json!({
            "start_iterator": ms(p[0], n),
            "first_batch": ms(p[1], n),
            "all_batches": ms(p[2], n),
            "synchronize": ms(p[3], n),
            "end_epoch": ms(p[4], n),
        })
    };
    let stats = on_gpu
        .lanes_kept(|l| l.iter().map(|d| d.stats()).sum::<NvjpegStats>())
        .unwrap_or_default();
    let delivery = on_gpu.stats();
    let mut run = run_json(
        workers,
        true,
        rate,
        cpu,
        loader.stats().wait_fraction(),
        epochs,
    );
    let images = stats.images().max(1) as f64;
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / images;
    run["lanes"] = json!(lanes);
    run["decoded"] = json!({
        "hardware": stats.hardware,
        "default_backend": stats.default_backend,
        "cpu_fallback": stats.cpu_fallback,
        "worker": stats.worker,
        "checked_by_nvjpeg": stats.checked,
        "hardware_batch_failures": stats.hardware_batch_failures,
    });
    // The device stage, per image over every epoch (warm-up included): the decoder's phases
    // (summed over lanes), then the delivery's (the iterating thread's).
    let mut phases = serde_json::Map::new();
    for (name, d) in stats.phases() {
        phases.insert(name.into(), json!(us(d)));
    }
    phases.insert("source_wait".into(), json!(us(delivery.source_wait)));
    phases.insert("lane_wait".into(), json!(us(delivery.lane_wait)));
    phases.insert("consumer".into(), json!(us(delivery.consumer_time)));
    phases.insert("wall".into(), json!(us(delivery.wall_time)));
    run["device_stage_us_per_image"] = Value::Object(phases);
    run["cpu_share_of_jpegs"] = json!(cpu_share);
    // Per timed epoch, and the warm-up epoch (the decoder's states made, the workers started)
    // on its own.
    run["epoch_ms"] = epoch_json(&epoch_phases[1], epochs);
    run["warmup_epoch_ms"] = epoch_json(&epoch_phases[0], 1);
    Ok(run)
}

/// `--nvjpeg-ceiling`: one batch of the folder's JPEGs that the workers route to the hardware
/// engines, in page-locked memory, through each `CeilingStage` on one thread.
fn nvjpeg_ceiling(
    folder: &ImageFolder,
    pipeline: Compose,
    batch: usize,
    quick: bool,
    device: &Device,
) -> Result<Value> {
    use longshore::data::{Collate, Dataset};
    let files = EncodedImages::new(folder.clone().with_transform(pipeline))?;
    let mut indices = Vec::with_capacity(batch);
    for i in 0..folder.len() {
        if indices.len() == batch {
            break;
        }
        if files.read(i)?.hardware {
            indices.push(i);
        }
    }
    anyhow::ensure!(!indices.is_empty(), "no jpeg the hardware engines take");
    let samples = indices
        .iter()
        .map(|&i| files.get(i))
        .collect::<Result<Vec<_>, _>>()?;
    let layout = EncodedCollate.layout(&samples)?;
    let len = layout.total_bytes();
    let host = EncodedCollate.collate_into(&samples, layout, HostBuffer::page_locked(len)?)?;
    let mut decoder = NvjpegDecoder::new(device, &files)?;
    let iterations = if quick { 3 } else { 40 };
    let mut out = serde_json::Map::new();
    out.insert("batch_size".into(), json!(indices.len()));
    out.insert("iterations".into(), json!(iterations));
    for stage in CeilingStage::ALL {
        let r = decoder.ceiling(&host, stage, iterations)?;
        eprintln!(
            "jpeg: nvjpeg ceiling {}: {:.0} images/s ({} images in {:.3} s)",
            stage.name(),
            r.images_per_s(),
            r.images,
            r.seconds
        );
        out.insert(stage.name().into(), json!(r.images_per_s()));
    }
    // The same decode on several threads at once, each with its own states and stream: more
    // than one thread's rate means the host side of nvJPEG's call, not the engines, bounds one
    // thread.
    for threads in [2, 4] {
        for stage in [CeilingStage::Decode, CeilingStage::Pipeline] {
            let r = decoder.ceiling_threads(&host, stage, iterations, threads)?;
            let name = format!("{}_threads_{threads}", stage.name());
            eprintln!(
                "jpeg: nvjpeg ceiling {name}: {:.0} images/s ({} images in {:.3} s)",
                r.images_per_s(),
                r.images,
                r.seconds
            );
            out.insert(name, json!(r.images_per_s()));
        }
    }
    Ok(Value::Object(out))
}

/// The steady-state method of both decoding paths: one untimed warm-up epoch, `reset` (the
/// loader's stats), then `epochs` whole epochs timed; samples/s and the CPU share meanwhile.
fn time_epochs(
    epochs: usize,
    mut run_epoch: impl FnMut() -> Result<usize>,
    reset: impl FnOnce(),
) -> Result<(f64, Option<f64>)> {
    run_epoch()?;
    reset();
    let (cpu0, t0) = (cpu_jiffies(), Instant::now());
    let mut samples = 0;
    for _ in 0..epochs {
        samples += run_epoch()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((samples as f64 / secs, share(cpu0, cpu_jiffies())))
}

/// One run's row of jpeg.json.
fn run_json(
    workers: usize,
    pin: bool,
    rate: f64,
    cpu: Option<f64>,
    wait: f64,
    epochs: usize,
) -> Value {
    json!({
        "num_workers": workers,
        "pin_memory": pin,
        "samples_per_s": rate,
        "cpu_share": cpu,
        "wait_fraction": wait,
        "epochs": epochs,
    })
}

fn best(runs: &[Value]) -> Option<&Value> {
    runs.iter().max_by(|a, b| {
        a["samples_per_s"]
            .as_f64()
            .partial_cmp(&b["samples_per_s"].as_f64())
            .unwrap_or(std::cmp::Ordering::Equal)
    })
}

fn script() -> Option<PathBuf> {
    let rel = Path::new("xtask/pytorch/imagefolder_bench.py");
    let from_manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    [rel.to_path_buf(), from_manifest]
        .into_iter()
        .find(|p| p.is_file())
}

fn pytorch(
    args: &Args,
    root: &Path,
    batch: usize,
    epochs: usize,
    gpu_decode: bool,
) -> Result<Value> {
    let probe = Command::new(&args.python)
        .args(["-c", "import torch, torchvision"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("import failed");
            return Ok(
                json!({"skipped": format!("`{} -c \"import torch, torchvision\"` failed: {}", args.python, last.trim())}),
            );
        }
        Err(e) => return Ok(json!({"skipped": format!("cannot run {}: {e}", args.python)})),
    }
    let script = script().context("xtask/pytorch/imagefolder_bench.py not found")?;
    let workers = if args.quick {
        "0,2".to_owned()
    } else {
        args.torch_workers.clone()
    };
    let out = Command::new(&args.python)
        .arg(&script)
        .arg("--root")
        .arg(root)
        .args(if gpu_decode {
            &["--gpu-decode"][..]
        } else {
            &[][..]
        })
        .args([
            "--workers",
            &workers,
            "--batch-size",
            &batch.to_string(),
            "--epochs",
            &epochs.to_string(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    serde_json::from_slice(&out.stdout).context("parsing the torchvision script's JSON")
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let data = args
        .data_dir
        .clone()
        .unwrap_or_else(|| args.out.join("data"));
    let spec = if args.quick {
        FolderSpec {
            classes: 4,
            per_class: 16,
            mean_area: 60_000.0,
            ..FolderSpec::imagenet_like()
        }
    } else {
        FolderSpec::imagenet_like()
    };
    let root = data.join(if args.quick {
        "jpeg-quick"
    } else {
        "jpeg-imagenet-like"
    });
    let t = Instant::now();
    let made =
        write_folder(&root, &spec).with_context(|| format!("generating {}", root.display()))?;
    eprintln!(
        "jpeg: folder {} ({} images, {:.1} KB mean, {} in {:.1} s)",
        root.display(),
        made.images,
        made.bytes as f64 / made.images as f64 / 1e3,
        if made.reused { "reused" } else { "generated" },
        t.elapsed().as_secs_f64()
    );
    let folder = ImageFolder::new(&root)?;
    let device = Device::cuda(0).ok();
    let per_core = per_core(&folder, args.quick)?;
    eprintln!("jpeg: one core: {per_core}");

    let batch = args.batch_size.unwrap_or(if args.quick { 16 } else { 256 });
    let epochs = args.epochs.unwrap_or(if args.quick { 1 } else { 2 });
    let c = cores();
    let workers = if !args.workers.is_empty() {
        args.workers.clone()
    } else if args.quick {
        vec![c.min(2)]
    } else {
        let mut w = vec![(c / 2).max(1), c, 2 * c];
        w.dedup();
        w
    };
    let cpu_decode = args.decode != "nvjpeg";
    let nvjpeg = args.decode != "cpu";
    let mut pipelines = serde_json::Map::new();
    let mut nv_pipelines = serde_json::Map::new();
    let ceiling = match (&device, args.nvjpeg_ceiling) {
        (_, false) => Value::Null,
        (None, true) => json!({"skipped": "no cuda device"}),
        (Some(d), true) => {
            nvjpeg_ceiling(&folder, Compose::imagenet_train(), batch, args.quick, d)?
        }
    };
    if args.ceiling_only {
        let result =
            json!({"machine": {"cores": c, "cuda": device.is_some()}, "nvjpeg_ceiling": ceiling});
        std::fs::write(
            args.out.join("jpeg.json"),
            serde_json::to_string_pretty(&result)? + "\n",
        )?;
        eprintln!("jpeg: nvjpeg ceiling (train pipeline): {ceiling}");
        return Ok(());
    }
    let sweeps = if args.ranks_only {
        vec![]
    } else {
        vec![
            ("train", Compose::imagenet_train()),
            ("val", Compose::imagenet_val()),
        ]
    };
    for (name, pipeline) in sweeps {
        if nvjpeg {
            match &device {
                Some(d) => {
                    let files =
                        EncodedImages::new(folder.clone().with_transform(pipeline.clone()))?;
                    let mut runs = Vec::new();
                    let shares = &args.cpu_share;
                    let grid = workers.iter().flat_map(|&w| {
                        args.nvjpeg_lanes
                            .iter()
                            .flat_map(move |&l| shares.iter().map(move |&s| (w, l, s)))
                    });
                    for (w, lanes, share) in grid {
                        let r = steady_nvjpeg(&files, w, lanes, share, batch, epochs, d)?;
                        eprintln!(
                            "jpeg: longshore nvjpeg {name} workers={w} lanes={lanes} cpu_share={share}: {:.0} images/s, cpu {:.0}%, decoded {}, device stage us/image {}, epoch ms {}",
                            r["samples_per_s"].as_f64().unwrap_or(0.0),
                            100.0 * r["cpu_share"].as_f64().unwrap_or(0.0),
                            r["decoded"],
                            r["device_stage_us_per_image"],
                            r["epoch_ms"]
                        );
                        runs.push(r);
                    }
                    let b = best(&runs).cloned();
                    nv_pipelines.insert(name.into(), json!({"runs": runs, "best": b}));
                }
                None => {
                    nv_pipelines.insert(name.into(), json!({"skipped": "no cuda device"}));
                }
            }
        }
        if !cpu_decode {
            continue;
        }
        let dataset = folder.clone().with_transform(pipeline);
        let mut runs = Vec::new();
        for &w in &workers {
            for pin in [false, true] {
                let r = steady(&dataset, w, pin, batch, epochs, device.as_ref())?;
                eprintln!(
                    "jpeg: longshore {name} workers={w} pin={pin}: {:.0} images/s, cpu {:.0}%",
                    r["samples_per_s"].as_f64().unwrap_or(0.0),
                    100.0 * r["cpu_share"].as_f64().unwrap_or(0.0)
                );
                runs.push(r);
            }
        }
        let b = best(&runs).cloned();
        pipelines.insert(name.into(), json!({"runs": runs, "best": b}));
    }
    let torch = if args.no_pytorch {
        json!({"skipped": "--no-pytorch"})
    } else {
        pytorch(&args, &root, batch, epochs, nvjpeg && device.is_some())?
    };
    let ranks = if args.ranks.is_empty() {
        Value::Null
    } else {
        ranks::run(&ranks::Plan {
            folder: &folder,
            ranks: &args.ranks,
            cpu_decode,
            nvjpeg,
            batch,
            epochs,
            quick: args.quick,
            nvjpeg_workers: args.ranks_nvjpeg_workers.clone(),
        })?
    };
    let mut ratios = serde_json::Map::new();
    for name in ["train", "val"] {
        // A pipeline not run (`--decode nvjpeg` runs only its own) has no entry.
        let ours = pipelines
            .get(name)
            .and_then(|p| p["best"]["samples_per_s"].as_f64());
        let theirs = torch["best"][name]["samples_per_s"].as_f64();
        if let (Some(o), Some(t)) = (ours, theirs) {
            ratios.insert(name.into(), json!(o / t));
        }
        let nv = nv_pipelines
            .get(name)
            .and_then(|p| p["best"]["samples_per_s"].as_f64());
        if let (Some(o), Some(t)) = (nv, theirs) {
            ratios.insert(format!("nvjpeg_{name}"), json!(o / t));
        }
        let gpu = torch["gpu_decode"][name]["samples_per_s"].as_f64();
        if let (Some(o), Some(t)) = (nv, gpu) {
            ratios.insert(
                format!("nvjpeg_{name}_vs_torchvision_gpu_decode"),
                json!(o / t),
            );
        }
    }
    let result = json!({
        "machine": {"cores": c, "cuda": device.is_some()},
        "folder": {"root": root, "images": made.images, "bytes": made.bytes},
        "quick": args.quick,
        "batch_size": batch,
        "per_core": per_core,
        "longshore": pipelines,
        "longshore_nvjpeg": nv_pipelines,
        "pytorch": torch,
        "ratio_vs_pytorch": ratios,
        "nvjpeg_ceiling": ceiling,
        "ranks": ranks,
    });
    std::fs::write(
        args.out.join("jpeg.json"),
        serde_json::to_string_pretty(&result)? + "\n",
    )?;
    let md = markdown(&result)
        + &ranks::markdown(
            &result["ranks"],
            result["per_core"]["train_decode_transform_images_per_s"].as_f64(),
        );
    std::fs::write(args.out.join("jpeg.md"), &md)?;
    eprintln!("{md}");
    Ok(())
}
