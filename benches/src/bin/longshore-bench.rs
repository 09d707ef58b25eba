//! `longshore-bench`: what longshore does on this machine, in one run.
//!
//! Runs the sections below, prints a compact table for each as it goes, and writes every
//! figure to `<out>/results.json` (rendered into `report.md` and SVG plots by
//! `cargo xtask report`). Usually started through `cargo xtask bench`.
//!
//! * `bandwidth`: host<->device copies per memory kind and size against the bare driver copy.
//! * `pool`: a pool hit against a raw allocation, per memory kind and size.
//! * `loader`: the DataLoader over two memory-mapped workloads, num_workers x pin_memory.
//! * `overlap`: how long the consumer waits for data when compute outlasts the copy.
//! * `pytorch`: PyTorch's DataLoader on the same files, when `torch` imports.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use longshore::data::{Batch, DirectCollate, ImageLayout, Normalize, NpyDataset, Zip};
use longshore::host::{HostBuffer, MemoryKind, PinnedPool, PoolBuffer, PoolConfig};
use longshore::loader::{DataLoader, Fetch};
use longshore::transfer::bench_support::{bare_dtoh, bare_htod};
use longshore::transfer::{Device, Stream, UploadMode};
use longshore_benches::measure::{gbps, median, ns_label, print_table, size_label};
use longshore_benches::results::{Machine, Results, SCHEMA};
use longshore_benches::workload;
use serde_json::json;

const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;

/// A section of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Bandwidth,
    Pool,
    Loader,
    Overlap,
    Pytorch,
}

impl Section {
    const ALL: [Section; 5] = [
        Section::Bandwidth,
        Section::Pool,
        Section::Loader,
        Section::Overlap,
        Section::Pytorch,
    ];

    fn name(self) -> &'static str {
        match self {
            Section::Bandwidth => "bandwidth",
            Section::Pool => "pool",
            Section::Loader => "loader",
            Section::Overlap => "overlap",
            Section::Pytorch => "pytorch",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "longshore-bench",
    about = "Measure what longshore does on this machine; writes results.json"
)]
struct Args {
    /// Small sizes and few repetitions: proves every section runs (CI).
    #[arg(long)]
    quick: bool,
    /// Only these sections (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Section>,
    /// Where results.json goes.
    #[arg(long, default_value = "target/longshore-bench")]
    out: PathBuf,
    /// Where the loader workloads are generated and reused (default: `<out>/data`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The Python interpreter for the PyTorch baseline.
    #[arg(long, default_value = "python3")]
    python: String,
    /// The PyTorch baseline script (default: `xtask/pytorch/dataloader_bench.py`).
    #[arg(long)]
    pytorch_script: Option<PathBuf>,
}

/// The best configuration found for a workload by the loader sweep.
#[derive(Debug, Clone, Copy)]
struct Best {
    samples_per_s: f64,
    num_workers: usize,
    pin_memory: bool,
}

struct Ctx {
    quick: bool,
    out: PathBuf,
    data_dir: PathBuf,
    cuda: Option<Device>,
    results: Results,
    best: BTreeMap<&'static str, Best>,
    args: Args,
}

impl Ctx {
    fn save(&self) -> Result<()> {
        let path = self.out.join("results.json");
        let text = serde_json::to_string_pretty(&self.results)?;
        std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sections: Vec<Section> = if args.only.is_empty() {
        Section::ALL.to_vec()
    } else {
        Section::ALL
            .into_iter()
            .filter(|s| args.only.contains(s))
            .collect()
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| args.out.join("data"));

    let (cuda, cuda_reason) = match Device::cuda(0) {
        Ok(d) => (Some(d), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let machine = machine(args.quick, cuda.as_ref(), cuda_reason);
    println!(
        "longshore-bench{}: {} ({} cores, {:.1} GiB RAM), gpu: {}, {}",
        if args.quick { " --quick" } else { "" },
        machine.cpu,
        machine.cores,
        machine.ram_bytes as f64 / (1u64 << 30) as f64,
        machine.gpu.as_deref().unwrap_or("none"),
        machine.date_utc
    );
    if let Some(r) = &machine.cuda_reason {
        println!("  CUDA unavailable: {r}");
    }
    let mut ctx = Ctx {
        quick: args.quick,
        out: args.out.clone(),
        data_dir,
        cuda,
        results: Results {
            schema: SCHEMA,
            machine,
            sections: Vec::new(),
            figures: Vec::new(),
            notes: Vec::new(),
        },
        best: BTreeMap::new(),
        args,
    };
    let started = Instant::now();
    for s in sections {
        let t0 = Instant::now();
        ctx.results.sections.push(s.name().to_owned());
        let r = match s {
            Section::Bandwidth => bandwidth(&mut ctx),
            Section::Pool => pool(&mut ctx),
            Section::Loader => loader(&mut ctx),
            Section::Overlap => overlap(&mut ctx),
            Section::Pytorch => pytorch(&mut ctx),
        };
        if let Err(e) = r {
            ctx.results.note(s.name(), format!("section failed: {e:#}"));
            ctx.save()?;
            return Err(e.context(format!("section {}", s.name())));
        }
        println!("  ({} took {:.1} s)", s.name(), t0.elapsed().as_secs_f64());
        ctx.save()?;
    }
    println!(
        "\nwrote {} in {:.1} s",
        ctx.out.join("results.json").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Machine description.

fn machine(quick: bool, cuda: Option<&Device>, cuda_reason: Option<String>) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ram_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Machine {
        cpu,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        ram_bytes: ram_kib * 1024,
        gpu: cuda.map(Device::name),
        cuda_available: longshore::host::driver_available(),
        cuda_reason: cuda_reason.or_else(longshore::host::driver_unavailable_reason),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        date_utc: utc_now(),
        quick,
        longshore_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, Howard Hinnant's algorithm).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------------
// Timing helpers.

/// Median seconds per call of `f`, over `samples` samples of `per_sample` calls each.
fn median_secs(
    samples: usize,
    per_sample: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        for _ in 0..per_sample {
            f()?;
        }
        v.push(t0.elapsed().as_secs_f64() / per_sample as f64);
    }
    Ok(median(&v))
}

/// Median nanoseconds per call of `f`, calibrated so that one sample lasts about 2 ms and the
/// whole measurement about `budget`.
fn median_ns_calibrated(budget: Duration, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t0 = Instant::now();
    f()?;
    let one = t0.elapsed().as_secs_f64().max(1e-8);
    let per_sample = ((2e-3 / one) as usize).clamp(1, 100_000);
    let samples = ((budget.as_secs_f64() / (one * per_sample as f64)) as usize).clamp(3, 21);
    Ok(median_secs(samples, per_sample, f)? * 1e9)
}

// ---------------------------------------------------------------------------------------------
// bandwidth

fn bandwidth_sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![MIB, 16 * MIB]
    } else {
        vec![MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    }
}

/// (samples, copies per sample) for a copy of `bytes`.
fn bandwidth_reps(quick: bool, bytes: usize) -> (usize, usize) {
    let per = (16 * MIB / bytes).clamp(1, 16);
    let samples = if bytes >= 256 * MIB {
        5
    } else if quick {
        9
    } else {
        11
    };
    (samples, per)
}

/// Records one (ours, bare) pair and returns its table row.
#[allow(clippy::too_many_arguments)]
fn bw_record(
    ctx: &mut Ctx,
    dir: &str,
    kind: &str,
    bytes: usize,
    ours_s: f64,
    bare_s: f64,
    bare_name: &str,
) -> Vec<String> {
    let (ours, bare) = (gbps(bytes, ours_s), gbps(bytes, bare_s));
    let ratio = if bare > 0.0 { ours / bare } else { 0.0 };
    let size = size_label(bytes);
    let base = json!({"dir": dir, "kind": kind, "bytes": bytes});
    let with = |path: &str| {
        let mut p = base.clone();
        p["path"] = json!(path);
        p
    };
    ctx.results.push(
        "bandwidth",
        format!("{dir} {kind} {size} longshore"),
        ours,
        "GB/s",
        with("longshore"),
    );
    ctx.results.push(
        "bandwidth",
        format!("{dir} {kind} {size} {bare_name}"),
        bare,
        "GB/s",
        with("bare"),
    );
    ctx.results.push(
        "bandwidth",
        format!("{dir} {kind} {size} ratio"),
        ratio,
        "x",
        with("ratio"),
    );
    vec![
        dir.to_owned(),
        kind.to_owned(),
        size,
        format!("{ours:.2}"),
        format!("{bare:.2}"),
        format!("{ratio:.2}x"),
    ]
}

fn bandwidth(ctx: &mut Ctx) -> Result<()> {
    let sizes = bandwidth_sizes(ctx.quick);
    match ctx.cuda.clone() {
        Some(dev) => bandwidth_cuda(ctx, &dev, &sizes),
        None => {
            let why = ctx
                .results
                .machine
                .cuda_reason
                .clone()
                .unwrap_or_else(|| "no CUDA device".to_owned());
            ctx.results.note(
                "bandwidth",
                format!("CUDA matrix skipped ({why}); measured the Cpu backend against a plain copy_from_slice instead"),
            );
            bandwidth_cpu(ctx, &sizes)
        }
    }
}

fn bandwidth_cuda(ctx: &mut Ctx, dev: &Device, sizes: &[usize]) -> Result<()> {
    let stream = dev.new_stream()?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let (samples, per) = bandwidth_reps(ctx.quick, bytes);
        let mut d = stream.alloc_zeroed(bytes)?;
        stream.synchronize()?;
        // Pageable: direct (the driver's own path) and staged, both against the bare copy.
        {
            let mut src = HostBuffer::pageable(bytes)?;
            src.as_bytes_mut().fill(1);
            let bare = median_secs(samples, per, || {
                Ok(bare_htod(&stream, src.as_bytes(), &mut d)?)
            })?;
            let direct = median_secs(samples, per, || {
                stream
                    .upload_slice(src.as_bytes(), &mut d, 0, UploadMode::Direct)?
                    .synchronize()?;
                Ok(())
            })?;
            let staged = median_secs(samples, per, || {
                stream
                    .upload_slice(src.as_bytes(), &mut d, 0, UploadMode::Staged)?
                    .synchronize()?;
                Ok(())
            })?;
            rows.push(bw_record(
                ctx,
                "H2D",
                "pageable direct",
                bytes,
                direct,
                bare,
                "bare",
            ));
            rows.push(bw_record(
                ctx,
                "H2D",
                "pageable staged",
                bytes,
                staged,
                bare,
                "bare",
            ));
            let mut dst = Some(HostBuffer::pageable(bytes)?);
            let bare = median_secs(samples, per, || {
                Ok(bare_dtoh(
                    &stream,
                    &d,
                    dst.as_mut().expect("dst").as_bytes_mut(),
                )?)
            })?;
            let ours = median_secs(samples, per, || {
                dst = Some(stream.download(&d, dst.take().expect("dst"))?.wait()?);
                Ok(())
            })?;
            rows.push(bw_record(
                ctx,
                "D2H",
                "pageable direct",
                bytes,
                ours,
                bare,
                "bare",
            ));
        }
        for kind in [MemoryKind::PageLocked, MemoryKind::Registered] {
            let mut buf = Some(HostBuffer::alloc(kind, bytes)?);
            let bare = median_secs(samples, per, || {
                Ok(bare_htod(
                    &stream,
                    buf.as_ref().expect("buf").as_bytes(),
                    &mut d,
                )?)
            })?;
            let ours = median_secs(samples, per, || {
                buf = Some(stream.upload(buf.take().expect("buf"), &mut d)?.wait()?);
                Ok(())
            })?;
            rows.push(bw_record(
                ctx,
                "H2D",
                kind.as_str(),
                bytes,
                ours,
                bare,
                "bare",
            ));
            let bare = median_secs(samples, per, || {
                Ok(bare_dtoh(
                    &stream,
                    &d,
                    buf.as_mut().expect("buf").as_bytes_mut(),
                )?)
            })?;
            let ours = median_secs(samples, per, || {
                buf = Some(stream.download(&d, buf.take().expect("buf"))?.wait()?);
                Ok(())
            })?;
            rows.push(bw_record(
                ctx,
                "D2H",
                kind.as_str(),
                bytes,
                ours,
                bare,
                "bare",
            ));
        }
    }
    ctx.results.note(
        "bandwidth",
        "D2H has no staged path: pageable downloads go through the driver (\"pageable direct\")",
    );
    let stager = dev.stager()?;
    let ps = stager.pool().stats();
    ctx.results.note(
        "bandwidth",
        format!(
            "staging: {:?}; chunk pool: {} allocations, {} hits, {} pageable fallbacks, peak {} MiB held",
            stager.config(),
            ps.allocations,
            ps.hits,
            ps.fallbacks,
            ps.peak_bytes_held >> 20
        ),
    );
    rows.sort_by(|a, b| a[0].cmp(&b[0]).then(a[1].cmp(&b[1])));
    print_table(
        &format!(
            "bandwidth on {} (median GB/s; bare = cuMemcpy*Async + sync on the same buffer)",
            dev.name()
        ),
        &["dir", "kind", "size", "longshore", "bare", "ratio"],
        &rows,
    );
    Ok(())
}

fn bandwidth_cpu(ctx: &mut Ctx, sizes: &[usize]) -> Result<()> {
    let dev = Device::cpu();
    let stream = dev.new_stream()?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let (samples, per) = bandwidth_reps(ctx.quick, bytes);
        let mut d = stream.alloc_zeroed(bytes)?;
        let src_vec = vec![1u8; bytes];
        let mut dst_vec = vec![0u8; bytes];
        let plain = median_secs(samples, per, || {
            dst_vec.copy_from_slice(black_box(&src_vec));
            black_box(&dst_vec);
            Ok(())
        })?;
        let mut src = Some(HostBuffer::from_slice(MemoryKind::Pageable, &src_vec)?);
        let owned = median_secs(samples, per, || {
            src = Some(stream.upload(src.take().expect("src"), &mut d)?.wait()?);
            Ok(())
        })?;
        let direct = median_secs(samples, per, || {
            stream
                .upload_slice(&src_vec, &mut d, 0, UploadMode::Direct)?
                .synchronize()?;
            Ok(())
        })?;
        let staged = median_secs(samples, per, || {
            stream
                .upload_slice(&src_vec, &mut d, 0, UploadMode::Staged)?
                .synchronize()?;
            Ok(())
        })?;
        let mut dst = Some(HostBuffer::pageable(bytes)?);
        let down = median_secs(samples, per, || {
            dst = Some(stream.download(&d, dst.take().expect("dst"))?.wait()?);
            Ok(())
        })?;
        rows.push(bw_record(
            ctx,
            "H2D",
            "pageable upload",
            bytes,
            owned,
            plain,
            "copy_from_slice",
        ));
        rows.push(bw_record(
            ctx,
            "H2D",
            "pageable direct",
            bytes,
            direct,
            plain,
            "copy_from_slice",
        ));
        rows.push(bw_record(
            ctx,
            "H2D",
            "pageable staged",
            bytes,
            staged,
            plain,
            "copy_from_slice",
        ));
        rows.push(bw_record(
            ctx,
            "D2H",
            "pageable download",
            bytes,
            down,
            plain,
            "copy_from_slice",
        ));
    }
    ctx.results.note(
        "bandwidth",
        "page-locked and registered kinds need a CUDA driver: skipped",
    );
    rows.sort_by(|a, b| a[0].cmp(&b[0]).then(a[1].cmp(&b[1])));
    print_table(
        "bandwidth on the Cpu backend (median GB/s; bare = copy_from_slice between two Vecs)",
        &["dir", "kind", "size", "longshore", "bare", "ratio"],
        &rows,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// pool

fn pool(ctx: &mut Ctx) -> Result<()> {
    let mut sizes = vec![KIB, 64 * KIB, MIB, 16 * MIB];
    if !ctx.quick {
        sizes.push(256 * MIB);
    }
    let mut kinds = vec![MemoryKind::Pageable];
    if longshore::host::driver_available() {
        kinds.extend([MemoryKind::PageLocked, MemoryKind::Registered]);
    } else {
        ctx.results.note(
            "pool",
            "no CUDA driver: page-locked and registered kinds skipped",
        );
    }
    let budget = if ctx.quick {
        Duration::from_millis(60)
    } else {
        Duration::from_millis(300)
    };
    let mut rows = Vec::new();
    for kind in kinds {
        let pool = match PinnedPool::new(
            PoolConfig::for_kind(kind)
                .budget(1 << 30)
                .register_above(None),
        ) {
            Ok(p) => p,
            Err(e) => {
                ctx.results.note("pool", format!("no {kind} pool: {e}"));
                continue;
            }
        };
        for &bytes in &sizes {
            drop(pool.alloc(bytes)?); // warm the cache
            let hit = median_ns_calibrated(budget, || {
                drop(black_box(pool.alloc(black_box(bytes))?));
                Ok(())
            })?;
            let raw = median_ns_calibrated(budget, || {
                drop(black_box(HostBuffer::alloc(kind, black_box(bytes))?));
                Ok(())
            })?;
            let size = size_label(bytes);
            let p = |what: &str| json!({"kind": kind.as_str(), "bytes": bytes, "what": what});
            ctx.results.push(
                "pool",
                format!("{kind} {size} pool hit"),
                hit,
                "ns",
                p("hit"),
            );
            ctx.results.push(
                "pool",
                format!("{kind} {size} raw alloc"),
                raw,
                "ns",
                p("raw"),
            );
            ctx.results.push(
                "pool",
                format!("{kind} {size} raw/hit"),
                raw / hit,
                "x",
                p("ratio"),
            );
            rows.push(vec![
                kind.to_string(),
                size,
                ns_label(hit),
                ns_label(raw),
                format!("{:.1}x", raw / hit),
            ]);
        }
    }
    print_table(
        "pool: alloc + drop of a cached block vs a raw allocation (HostBuffer::alloc + drop), medians",
        &["kind", "size", "pool hit", "raw alloc", "raw/hit"],
        &rows,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// loader

struct Run {
    samples_per_s: f64,
    wait_fraction: f64,
    batches: usize,
}

/// Iterates `loader` (epoch after epoch) for one warm-up batch plus `batches` measured ones,
/// delivering to `device` through `to_device` + `wait_on` when given, else consuming on the
/// CPU. With `compute`, each batch is followed by a simulated step of that length: a host
/// function sleeping on the compute stream (at most two steps in flight), or a sleep on the
/// consumer thread without a device.
fn drive<F: Fetch<Output = Batch<PoolBuffer>>>(
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
enum Workload {
    Images,
    Tabular,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Images => "images",
            Workload::Tabular => "tabular",
        }
    }

    fn batch_size(self) -> usize {
        match self {
            Workload::Images => 256,
            Workload::Tabular => 1024,
        }
    }

    /// Rows generated (full, quick).
    fn rows(self, quick: bool) -> usize {
        match (self, quick) {
            (Workload::Images, false) => 8192,
            (Workload::Images, true) => 256,
            (Workload::Tabular, false) => 2_000_000,
            (Workload::Tabular, true) => 65_536,
        }
    }

    /// Batches measured in the sweep (as the PyTorch script's defaults / quick arguments).
    fn sweep_batches(self, quick: bool) -> usize {
        match (self, quick) {
            (Workload::Images, false) => 40,
            (Workload::Images, true) => 10,
            (Workload::Tabular, false) => 200,
            (Workload::Tabular, true) => 30,
        }
    }
}

/// Builds the loader for `w` and drives it.
fn run_workload(
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
                // u8 CHW rows -> ImageNet-normalised f32, fused into the batch slot.
                .collate(
                    DirectCollate::new()
                        .with_names(["image"])
                        .with_transform(0, Normalize::imagenet(ImageLayout::Chw)),
                )
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

fn ensure_data(ctx: &mut Ctx) -> Result<workload::Workloads> {
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

fn loader(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let workers: Vec<usize> = if ctx.quick {
        vec![0, 2]
    } else {
        vec![0, 4, 8, 16]
    };
    let device = ctx.cuda.clone();
    let target = device.as_ref().map_or_else(
        || "consumed on the CPU".to_owned(),
        |d| format!("delivered to {}", d.name()),
    );
    if device.is_none() {
        ctx.results.note(
            "loader",
            "no GPU: batches are consumed on the CPU, and pin_memory falls back to pageable memory",
        );
    }
    if ctx.quick {
        ctx.results.note("loader", "quick: 256 images make one batch per epoch, so each image batch includes an epoch start");
    }
    let mut rows = Vec::new();
    for w in [Workload::Images, Workload::Tabular] {
        let batches = w.sweep_batches(ctx.quick);
        for &nw in &workers {
            for pin in [false, true] {
                let r = run_workload(w, &files, nw, pin, device.as_ref(), batches, None)?;
                let p = json!({"workload": w.name(), "num_workers": nw, "pin_memory": pin, "batch_size": w.batch_size(), "batches": r.batches});
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin}", w.name()),
                    r.samples_per_s,
                    "samples/s",
                    p.clone(),
                );
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin} wait", w.name()),
                    r.wait_fraction,
                    "fraction",
                    {
                        let mut p = p;
                        p["what"] = json!("wait");
                        p
                    },
                );
                rows.push(vec![
                    w.name().to_owned(),
                    nw.to_string(),
                    pin.to_string(),
                    format!("{:.0}", r.samples_per_s),
                    format!("{:.1}%", 100.0 * r.wait_fraction),
                ]);
                let best = ctx.best.entry(w.name()).or_insert(Best {
                    samples_per_s: 0.0,
                    num_workers: nw,
                    pin_memory: pin,
                });
                if r.samples_per_s > best.samples_per_s {
                    *best = Best {
                        samples_per_s: r.samples_per_s,
                        num_workers: nw,
                        pin_memory: pin,
                    };
                }
            }
        }
    }
    print_table(
        &format!(
            "loader: shuffled, {target}; samples/s over a fixed number of batches after one warm-up batch"
        ),
        &["workload", "workers", "pin", "samples/s", "waited"],
        &rows,
    );
    let mut best_rows = Vec::new();
    for (name, b) in &ctx.best {
        ctx.results.push(
            "loader",
            format!("{name} best (workers={}, pin={})", b.num_workers, b.pin_memory),
            b.samples_per_s,
            "samples/s",
            json!({"workload": name, "num_workers": b.num_workers, "pin_memory": b.pin_memory, "what": "best"}),
        );
        best_rows.push(vec![
            (*name).to_owned(),
            b.num_workers.to_string(),
            b.pin_memory.to_string(),
            format!("{:.0}", b.samples_per_s),
        ]);
    }
    print_table(
        "loader: tuner pick (best of the sweep)",
        &["workload", "workers", "pin", "samples/s"],
        &best_rows,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// overlap

fn overlap(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let device = ctx.cuda.clone();
    let cores = ctx.results.machine.cores;
    let mut workloads = vec![Workload::Tabular];
    if !ctx.quick {
        workloads.push(Workload::Images);
    } else {
        ctx.results.note(
            "overlap",
            "quick: tabular only (the quick image file holds one batch per epoch)",
        );
    }
    let mut rows = Vec::new();
    for w in workloads {
        let nw = (cores / 2).clamp(1, 8);
        let batches = match (w, ctx.quick) {
            (Workload::Tabular, true) => 40,
            (Workload::Tabular, false) => 200,
            // One epoch holds 32 image batches: measure within it, after the pipeline fill.
            (Workload::Images, _) => 32 - nw.max(1) - 1,
        };
        // Calibrate: how long the loader (and copy) takes per batch with nothing else to do.
        let cal = run_workload(w, &files, nw, true, device.as_ref(), batches.min(20), None)?;
        let per_batch = w.batch_size() as f64 / cal.samples_per_s.max(1e-9);
        let t = Duration::from_secs_f64((1.5 * per_batch).max(2e-3));
        let r = run_workload(w, &files, nw, true, device.as_ref(), batches, Some(t))?;
        let p = json!({"workload": w.name(), "num_workers": nw, "pin_memory": true, "compute_ms": t.as_secs_f64() * 1e3, "data_ms": per_batch * 1e3});
        ctx.results.push(
            "overlap",
            format!("{} wait fraction", w.name()),
            r.wait_fraction,
            "fraction",
            p.clone(),
        );
        ctx.results.push(
            "overlap",
            format!("{} compute per batch", w.name()),
            t.as_secs_f64() * 1e3,
            "ms",
            p.clone(),
        );
        ctx.results.push(
            "overlap",
            format!("{} data per batch (unloaded)", w.name()),
            per_batch * 1e3,
            "ms",
            p,
        );
        rows.push(vec![
            w.name().to_owned(),
            nw.to_string(),
            format!("{:.2}", per_batch * 1e3),
            format!("{:.2}", t.as_secs_f64() * 1e3),
            format!("{:.2}%", 100.0 * r.wait_fraction),
            if r.wait_fraction < 0.02 {
                "yes".to_owned()
            } else {
                "NO".to_owned()
            },
        ]);
    }
    let how = if device.is_some() {
        "compute = host fn sleeping on the compute stream"
    } else {
        "compute = sleep on the consumer thread"
    };
    print_table(
        &format!("overlap: consumer wait when compute per batch > data time ({how}; target < 2%)"),
        &[
            "workload",
            "workers",
            "data ms/batch",
            "compute ms",
            "waited",
            "< 2%",
        ],
        &rows,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// pytorch

fn pytorch_script(ctx: &Ctx) -> Option<PathBuf> {
    if let Some(p) = &ctx.args.pytorch_script {
        return Some(p.clone());
    }
    let rel = Path::new("xtask/pytorch/dataloader_bench.py");
    let from_manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    [rel.to_path_buf(), from_manifest]
        .into_iter()
        .find(|p| p.is_file())
}

fn pytorch(ctx: &mut Ctx) -> Result<()> {
    let py = ctx.args.python.clone();
    let probe = Command::new(&py)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output();
    let version = match probe {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("import failed");
            ctx.results.note(
                "pytorch",
                format!(
                    "skipped: `{py} -c \"import torch\"` failed: {}",
                    last.trim()
                ),
            );
            return Ok(());
        }
        Err(e) => {
            ctx.results
                .note("pytorch", format!("skipped: cannot run {py}: {e}"));
            return Ok(());
        }
    };
    let Some(script) = pytorch_script(ctx) else {
        ctx.results.note(
            "pytorch",
            "skipped: xtask/pytorch/dataloader_bench.py not found (pass --pytorch-script)",
        );
        return Ok(());
    };
    ensure_data(ctx)?;
    let mut cmd = Command::new(&py);
    cmd.arg(&script).arg("--dir").arg(&ctx.data_dir);
    if ctx.quick {
        cmd.args([
            "--workers",
            "0,2",
            "--max-batches-images",
            "10",
            "--max-batches-tabular",
            "30",
        ]);
    }
    println!("  running PyTorch {version}: {cmd:?}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        ctx.results.note(
            "pytorch",
            format!("the baseline script failed: {}", out.status),
        );
        return Ok(());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("no JSON line from the PyTorch script")?;
    let v: serde_json::Value =
        serde_json::from_str(line).context("parsing the PyTorch script's JSON")?;
    let on = if v["cuda"].as_bool() == Some(true) {
        "to cuda"
    } else {
        "on the CPU"
    };
    let mut best: BTreeMap<String, (f64, i64, bool)> = BTreeMap::new();
    let mut rows = Vec::new();
    for r in v["results"].as_array().cloned().unwrap_or_default() {
        let (Some(w), Some(nw), Some(pin), Some(sps)) = (
            r["workload"].as_str(),
            r["num_workers"].as_i64(),
            r["pin_memory"].as_bool(),
            r["samples_per_s"].as_f64(),
        ) else {
            continue;
        };
        ctx.results.push(
            "pytorch",
            format!("{w} workers={nw} pin={pin}"),
            sps,
            "samples/s",
            json!({"workload": w, "num_workers": nw, "pin_memory": pin, "torch": version}),
        );
        rows.push(vec![
            w.to_owned(),
            nw.to_string(),
            pin.to_string(),
            format!("{sps:.0}"),
        ]);
        let b = best.entry(w.to_owned()).or_insert((0.0, nw, pin));
        if sps > b.0 {
            *b = (sps, nw, pin);
        }
    }
    print_table(
        &format!("pytorch {version} DataLoader ({on})"),
        &["workload", "workers", "pin", "samples/s"],
        &rows,
    );
    let mut ratio_rows = Vec::new();
    for (w, (sps, nw, pin)) in &best {
        let target = if w == "images" { 10.0 } else { 30.0 };
        match ctx.best.get(w.as_str()).copied() {
            Some(ours) if *sps > 0.0 => {
                let ratio = ours.samples_per_s / sps;
                ctx.results.push(
                    "pytorch",
                    format!("{w} longshore/pytorch (best vs best)"),
                    ratio,
                    "x",
                    json!({"workload": w, "what": "ratio", "target": target, "pytorch_workers": nw, "pytorch_pin": pin,
                           "longshore_workers": ours.num_workers, "longshore_pin": ours.pin_memory}),
                );
                ratio_rows.push(vec![
                    w.clone(),
                    format!("{:.0} (w={}, pin={})", ours.samples_per_s, ours.num_workers, ours.pin_memory),
                    format!("{sps:.0} (w={nw}, pin={pin})"),
                    format!("{ratio:.1}x"),
                    format!(">= {target:.0}x"),
                ]);
            }
            _ => ctx.results.note("pytorch", format!("no ratio for {w}: run the loader section in the same run (or PyTorch measured 0)")),
        }
    }
    if !ratio_rows.is_empty() {
        print_table(
            "longshore vs PyTorch, best vs best",
            &["workload", "longshore", "pytorch", "ratio", "target"],
            &ratio_rows,
        );
    }
    Ok(())
}
