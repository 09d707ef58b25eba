//! Single-thread rates of the CPU image path, for tuning it: JPEG decode alone, the ImageNet
//! train and val transforms alone, and decode + transform, over ImageNet-like JPEGs from
//! [`longshore_vision::synth`] held in memory.
//!
//! `cargo run --release -p longshore-vision --no-default-features --example per_core -- [N] [ROUNDS]`
//!
//! Each round runs every stage once over the N files, stages interleaved so that a noisy
//! (shared) machine slows them alike; the median round of each stage is printed. Time is the
//! thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time spent descheduled on a busy machine
//! does not count; `--wall` times wall-clock instead.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use longshore_data::rng::epoch_rng;
use longshore_vision::decode::{DecodeOptions, decode_rgb, decode_rgb_into};
use longshore_vision::synth::{FolderSpec, image_jpeg};
use longshore_vision::{Compose, RgbImage};

/// Seconds of CPU time this thread has used (or wall time since the first call with `wall`).
fn now(wall: bool) -> f64 {
    if wall {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        return START.get_or_init(Instant::now).elapsed().as_secs_f64();
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wall = std::env::args().any(|a| a == "--wall");
    let mut args = std::env::args().skip(1).filter(|a| a != "--wall");
    let n: usize = args.next().map_or(Ok(200), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(7), |a| a.parse())?;
    let spec = FolderSpec::imagenet_like();
    let files: Vec<Vec<u8>> = (0..n)
        .map(|i| image_jpeg(&spec, i % spec.classes, i / spec.classes))
        .collect();
    let opts = DecodeOptions::default();
    let decoded: Vec<RgbImage> = files
        .iter()
        .map(|f| decode_rgb(f, &opts))
        .collect::<Result<_, _>>()?;
    let pixels: usize = decoded.iter().map(|d| d.width() * d.height()).sum();
    let bytes: usize = files.iter().map(Vec::len).sum();
    println!(
        "{n} files, mean {:.0} pixels, {:.1} KB; {rounds} rounds",
        pixels as f64 / n as f64,
        bytes as f64 / n as f64 / 1e3
    );
    let train = Compose::imagenet_train();
    let val = Compose::imagenet_val();
    let mut out = vec![0u8; train.output_bytes()];
    let mut buf = Vec::new();
    let names = [
        "decode (alloc)",
        "decode (reused buffer)",
        "train transform",
        "val transform",
        "decode + train",
        "decode + val",
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..rounds {
        let mut rng = epoch_rng(0, round as u64);
        for (k, rate) in rates.iter_mut().enumerate() {
            let t = now(wall);
            for (f, img) in files.iter().zip(&decoded) {
                match k {
                    0 => {
                        black_box(decode_rgb(f, &opts)?);
                    }
                    1 => {
                        black_box(decode_rgb_into(f, &opts, &mut buf)?);
                    }
                    2 => train.apply_into(img, &mut rng, &mut out)?,
                    3 => val.apply_into(img, &mut rng, &mut out)?,
                    4 => train.decode_into(Path::new("mem"), f, &opts, &mut rng, &mut out)?,
                    _ => val.decode_into(Path::new("mem"), f, &opts, &mut rng, &mut out)?,
                }
                black_box(&out);
            }
            rate.push(n as f64 / (now(wall) - t));
        }
    }
    for (name, r) in names.iter().zip(rates) {
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(0.0, f64::max);
        println!(
            "{name:>24}: {:8.1} images/s (median; min {lo:.1}, max {hi:.1})",
            median(r)
        );
    }
    Ok(())
}
