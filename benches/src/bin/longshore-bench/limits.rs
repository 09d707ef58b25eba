//! `limits`: what the hardware allows, measured in the same run, so every loader figure can be
//! read as a fraction of the limit that bounds it (the `roofline` section):
//!
//! * the host-to-device link: a bare `cuMemcpyHtoDAsync` from page-locked memory, at each
//!   workload's batch size (without a GPU: not measured);
//! * host memory bandwidth: a streaming read and a copy, one thread per core, best of a few;
//! * random-row gather from the page-cached tabular files, all cores: a tabular sample's
//!   feature row and label copied into a batch-sized buffer, rows in random order;
//! * the image normalise rate, all cores: random page-cached `u8` images normalised by the
//!   kernel the loader uses into batch slots.

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use anyhow::Result;
use longshore::data::normalize::NormalizeKernel;
use longshore::data::{Dataset, NpyDataset};
use longshore::data::{ImageLayout, Normalize};
use longshore::host::{HostBuffer, MemoryKind};
use longshore_benches::bare::bare_htod;
use longshore_benches::measure::{gbps, print_table, size_label};
use longshore_benches::workload::SplitMix64;
use serde_json::json;

use crate::drive::{Workload, ensure_data};
use crate::timing::median_secs;
use crate::{Ctx, MIB};

/// The limits of this machine, for the roofline.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// Bare page-locked H2D GB/s at the image (f32, u8) and tabular batch sizes.
    pub(crate) link_images_gbps: Option<f64>,
    pub(crate) link_images_u8_gbps: Option<f64>,
    pub(crate) link_tabular_gbps: Option<f64>,
    /// Streaming read and copy over all cores, GB/s (a copy counts its bytes once).
    pub(crate) mem_read_gbps: f64,
    pub(crate) mem_copy_gbps: f64,
    /// Tabular samples (feature row + label) gathered per second, all cores.
    pub(crate) gather_samples_per_s: f64,
    /// Images normalised per second by the loader's kernel, all cores.
    pub(crate) normalize_images_per_s: f64,
}

/// Runs `f(thread)` on `threads` threads released together; returns the seconds from the
/// first thread's start to the last thread's end (each thread takes its own clock, so a
/// descheduled coordinator cannot shorten the window).
fn parallel(threads: usize, f: impl Fn(usize) + Sync) -> f64 {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    f(t);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a limits thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min();
    let end = spans.iter().map(|s| s.1).max();
    match (start, end) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// Sum of a slice of words with four accumulators (so the loop is bound by loads).
fn sum(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut c = words.chunks_exact(4);
    for w in &mut c {
        for (a, x) in acc.iter_mut().zip(w) {
            *a = a.wrapping_add(*x);
        }
    }
    c.remainder()
        .iter()
        .fold(acc.iter().fold(0, |s, a| s ^ a), |s, x| s ^ x)
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let cores = ctx.results.machine.cores;
    let quick = ctx.quick;
    let mut lim = Limits::default();
    let mut rows = Vec::new();
    let mut record = |ctx: &mut Ctx, what: &str, case: String, value: f64, unit: &str| {
        rows.push(vec![case.clone(), format!("{value:.2} {unit}")]);
        ctx.results.push(
            "limits",
            case,
            value,
            unit,
            json!({"what": what, "threads": cores}),
        );
    };

    // The link, at each workload's batch size.
    if let Some(dev) = ctx.cuda.clone() {
        let stream = dev.new_stream()?;
        for w in Workload::ALL {
            let bytes = w.batch_size() * w.sample_bytes();
            let src = HostBuffer::alloc(MemoryKind::PageLocked, bytes)?;
            let mut d = stream.alloc_zeroed(bytes)?;
            let per = (64 * MIB / bytes).clamp(1, 64);
            let s = median_secs(if quick { 5 } else { 11 }, per, || {
                bare_htod(&stream, src.as_bytes(), &mut d)
            })?;
            let g = gbps(bytes, s);
            match w {
                Workload::Images => lim.link_images_gbps = Some(g),
                Workload::ImagesU8 => lim.link_images_u8_gbps = Some(g),
                Workload::Tabular => lim.link_tabular_gbps = Some(g),
            }
            record(
                ctx,
                "link",
                format!(
                    "H2D page-locked, {} ({} batch)",
                    size_label(bytes),
                    w.name()
                ),
                g,
                "GB/s",
            );
        }
    } else {
        ctx.results.note(
            "limits",
            "no GPU: the host-to-device link is not measured (no link-bound rows in the roofline)",
        );
    }

    // Host memory: streaming read and copy, one thread per core.
    let bytes = if quick { 64 * MIB } else { 1024 * MIB };
    let per = bytes / 8 / cores;
    let src: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    // Written once now, so the copy below never takes a first-touch page fault.
    let mut dst = vec![1u64; bytes / 8];
    let reps = if quick { 3 } else { 5 };
    let best = |f: &dyn Fn() -> f64| (0..reps).map(|_| f()).fold(f64::MAX, f64::min);
    let read = best(&|| {
        parallel(cores, |t| {
            black_box(sum(&src[t * per..(t + 1) * per]));
        })
    });
    lim.mem_read_gbps = gbps(per * cores * 8, read);
    record(
        ctx,
        "memory",
        format!("host memory read, {} threads", cores),
        lim.mem_read_gbps,
        "GB/s",
    );
    let copy = {
        let chunks: Vec<Mutex<&mut [u64]>> =
            dst.chunks_mut(per).take(cores).map(Mutex::new).collect();
        best(&|| {
            parallel(cores, |t| {
                let mut d = chunks[t].lock().unwrap_or_else(|p| p.into_inner());
                d.copy_from_slice(&src[t * per..(t + 1) * per]);
                black_box(&mut **d);
            })
        })
    };
    lim.mem_copy_gbps = gbps(per * cores * 8, copy);
    record(
        ctx,
        "memory",
        format!("host memory copy, {} threads (bytes copied once)", cores),
        lim.mem_copy_gbps,
        "GB/s",
    );
    drop((src, dst));

    // Gather and normalise from the page-cached workload files.
    let files = ensure_data(ctx)?;
    let x = NpyDataset::open(&files.tabular_x)?;
    let y = NpyDataset::open(&files.tabular_y)?;
    let images = NpyDataset::open(&files.images)?;
    let (xb, yb) = (x.row_bytes(), y.row_bytes());
    let tab = Workload::Tabular.batch_size();
    let per_thread = if quick { 16 * tab } else { 256 * tab };
    // Per-thread destinations, written once before timing (no first-touch faults timed).
    let bufs: Vec<Mutex<Vec<u8>>> = (0..cores)
        .map(|_| Mutex::new(vec![1u8; tab * (xb + yb)]))
        .collect();
    let gather = best(&|| {
        parallel(cores, |t| {
            let mut rng = SplitMix64::new(t as u64 + 1);
            let mut buf = bufs[t].lock().unwrap_or_else(|p| p.into_inner());
            let n = x.len() as u64;
            for k in 0..per_thread {
                let i = (rng.next_u64() % n) as usize;
                let slot = k % tab;
                let (xs, ys) = buf.as_mut_slice().split_at_mut(tab * xb);
                if let (Ok(r), Ok(l)) = (x.row_raw(i), y.row_raw(i)) {
                    xs[slot * xb..(slot + 1) * xb].copy_from_slice(r);
                    ys[slot * yb..(slot + 1) * yb].copy_from_slice(l);
                }
            }
            black_box(&mut **buf);
        })
    });
    drop(bufs);
    lim.gather_samples_per_s = (per_thread * cores) as f64 / gather;
    record(
        ctx,
        "gather",
        format!(
            "random tabular gather ({xb} + {yb} B per sample), {} threads",
            cores
        ),
        lim.gather_samples_per_s,
        "samples/s",
    );
    let kernel = NormalizeKernel::imagenet(ImageLayout::Chw);
    let img = images.row_bytes();
    let slots = if quick { 4 } else { 64 };
    let per_img = if quick { 8 } else { 128 };
    let outs: Vec<Mutex<Vec<f32>>> = (0..cores)
        .map(|_| Mutex::new(vec![1f32; slots * img]))
        .collect();
    let norm = best(&|| {
        parallel(cores, |t| {
            let mut rng = SplitMix64::new(t as u64 + 100);
            let mut out = outs[t].lock().unwrap_or_else(|p| p.into_inner());
            let n = images.len() as u64;
            for k in 0..per_img {
                let i = (rng.next_u64() % n) as usize;
                let slot = &mut out[(k % slots) * img..(k % slots + 1) * img];
                if let Ok(r) = images.row_raw(i) {
                    let _ = kernel.apply(r, slot);
                }
            }
            black_box(&mut **out);
        })
    });
    drop(outs);
    lim.normalize_images_per_s = (per_img * cores) as f64 / norm;
    record(
        ctx,
        "normalize",
        format!(
            "image normalise ({} kernel, u8 CHW -> f32), {} threads",
            kernel.path().name(),
            cores
        ),
        lim.normalize_images_per_s,
        "images/s",
    );
    // The transform's plain loop, for comparison (one thread: how much the kernel buys).
    let plain = Normalize::imagenet(ImageLayout::Chw);
    let mut out = vec![0f32; img];
    let row = images.row_raw(0)?;
    let one = |f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        for _ in 0..per_img {
            f();
        }
        per_img as f64 / t0.elapsed().as_secs_f64()
    };
    let k1 = one(&mut || {
        let _ = kernel.apply(black_box(row), &mut out);
    });
    let p1 = one(&mut || {
        let _ = plain.apply_into(black_box(row), 3, &mut out);
    });
    record(
        ctx,
        "normalize-1",
        format!(
            "image normalise, 1 thread, one reused slot: {} kernel",
            kernel.path().name()
        ),
        k1,
        "images/s",
    );
    record(
        ctx,
        "normalize-1",
        "image normalise, 1 thread, one reused slot: transform::Normalize".to_owned(),
        p1,
        "images/s",
    );
    print_table(
        "limits: measured in this run (best of a few; all cores unless said)",
        &["limit", "value"],
        &rows,
    );
    ctx.limits = Some(lim);
    Ok(())
}
