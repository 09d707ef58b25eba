//! [`Tuner`]: measure and pick `num_workers` and `pin_memory` for a dataset on this machine
//! (the sweep script people write for PyTorch, as a feature).

use std::time::Instant;

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_transfer::Device;

use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::loader::DataLoader;

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Worker threads.
    pub num_workers: usize,
    /// Page-locked batches.
    pub pin_memory: bool,
    /// Samples per second delivered (to the device, when one was given).
    pub samples_per_second: f64,
    /// Share of the time the consumer waited for data.
    pub wait_fraction: f64,
    /// Batches measured.
    pub batches: usize,
}

/// Every trial, and the pick.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneReport {
    /// Every configuration, in the order tried.
    pub trials: Vec<Trial>,
    /// The pick: the fastest, preferring fewer workers and no pinning when within 3% of it.
    pub best: Trial,
}

/// Measures a loader over a grid of `num_workers` x `pin_memory`.
///
/// ```
/// use longshore_data::VecDataset;
/// use longshore_loader::{DataLoader, Tuner};
///
/// let data: Vec<([f32; 16], i64)> = (0..2048).map(|i| ([i as f32; 16], i)).collect();
/// let dataset = std::sync::Arc::new(VecDataset::new(data));
/// let report = Tuner::new().workers([0, 2]).pin_memory([false]).batches(8).run(|workers, pin| {
///     DataLoader::builder(dataset.clone()).batch_size(64).num_workers(workers).pin_memory(pin).build()
/// })?;
/// assert_eq!(report.trials.len(), 2);
/// assert!(report.best.samples_per_second > 0.0);
/// # Ok::<(), longshore_loader::LoaderError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tuner {
    workers: Vec<usize>,
    pin: Vec<bool>,
    batches: usize,
    device: Option<Device>,
    depth: usize,
}

impl Default for Tuner {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mut workers = vec![0];
        let mut w = 1;
        while w <= cores * 2 {
            workers.push(w);
            w *= 2;
        }
        Self {
            workers,
            pin: vec![false, true],
            batches: 50,
            device: None,
            depth: 2,
        }
    }
}

impl Tuner {
    /// `num_workers` 0, 1, 2, 4, ... up to twice the cores, each with and without pinning,
    /// 50 batches per trial, consumed on the host.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `num_workers` values to try.
    pub fn workers(mut self, w: impl IntoIterator<Item = usize>) -> Self {
        self.workers = w.into_iter().collect();
        self
    }

    /// The `pin_memory` values to try.
    pub fn pin_memory(mut self, p: impl IntoIterator<Item = bool>) -> Self {
        self.pin = p.into_iter().collect();
        self
    }

    /// Batches measured per trial (after one warm-up batch).
    pub fn batches(mut self, n: usize) -> Self {
        self.batches = n.max(1);
        self
    }

    /// Deliver to `device` (through `to_device` with `depth` in flight) while measuring.
    pub fn device(mut self, device: Device, depth: usize) -> Self {
        self.device = Some(device);
        self.depth = depth.max(1);
        self
    }

    /// Builds a loader per configuration with `build(num_workers, pin_memory)` and measures it.
    pub fn run<F, B>(&self, mut build: B) -> Result<TuneReport, LoaderError>
    where
        F: Fetch<Output = Batch<PoolBuffer>>,
        B: FnMut(usize, bool) -> Result<DataLoader<F>, LoaderError>,
    {
        let mut trials = Vec::new();
        for &w in &self.workers {
            for &pin in &self.pin {
                let loader = build(w, pin)?;
                let trial = self.measure(&loader, w, pin)?;
                tracing::info!(target: "longshore::loader", num_workers = w, pin_memory = pin, samples_per_second = trial.samples_per_second, wait_fraction = trial.wait_fraction, "tuner trial");
                trials.push(trial);
            }
        }
        let top = trials
            .iter()
            .map(|t| t.samples_per_second)
            .fold(0.0, f64::max);
        let best = trials
            .iter()
            .filter(|t| t.samples_per_second >= 0.97 * top)
            .min_by_key(|t| (t.num_workers, t.pin_memory))
            .cloned()
            .ok_or(LoaderError::Config {
                option: "tuner",
                reason: "no configuration to try".into(),
            })?;
        Ok(TuneReport { trials, best })
    }

    fn measure<F: Fetch<Output = Batch<PoolBuffer>>>(
        &self,
        loader: &DataLoader<F>,
        w: usize,
        pin: bool,
    ) -> Result<Trial, LoaderError> {
        let mut samples = 0usize;
        let mut batches = 0usize;
        let t0;
        loader.reset_stats();
        match &self.device {
            Some(dev) => {
                let compute = dev.new_stream()?;
                let mut it = loader.to_device(dev, self.depth)?;
                if let Some(first) = it.next() {
                    first?.wait()?;
                }
                t0 = Instant::now();
                for item in it.take(self.batches) {
                    let b = item?.wait_on(&compute)?;
                    samples += b.batch_size();
                    batches += 1;
                }
                compute.synchronize()?;
            }
            None => {
                let mut it = loader.iter();
                if let Some(first) = it.next() {
                    first?;
                }
                t0 = Instant::now();
                for item in it.take(self.batches) {
                    samples += item?.batch_size();
                    batches += 1;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        Ok(Trial {
            num_workers: w,
            pin_memory: pin,
            samples_per_second: if secs > 0.0 {
                samples as f64 / secs
            } else {
                0.0
            },
            wait_fraction: loader.stats().wait_fraction(),
            batches,
        })
    }
}
