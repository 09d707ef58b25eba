//! Timing helpers: medians of repeated calls.

use std::time::{Duration, Instant};

use anyhow::Result;
use longshore_benches::measure::median;

/// Median seconds per call of `f`, over `samples` samples of `per_sample` calls each.
pub(crate) fn median_secs(
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
pub(crate) fn median_ns_calibrated(
    budget: Duration,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let t0 = Instant::now();
    f()?;
    let one = t0.elapsed().as_secs_f64().max(1e-8);
    let per_sample = ((2e-3 / one) as usize).clamp(1, 100_000);
    let samples = ((budget.as_secs_f64() / (one * per_sample as f64)) as usize).clamp(3, 21);
    Ok(median_secs(samples, per_sample, f)? * 1e9)
}
