//! [`Tuner`]: measure and pick `num_workers` and `pin_memory` for a dataset on this machine
//! (the sweep script people write for PyTorch, as a feature).

use std::sync::{Condvar, Mutex};
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
        pick(trials)
    }

    /// Measures `devices.len()` loaders at once, one thread per rank delivering to
    /// `devices[rank]`, as the ranks of a data-parallel job on one host share its cores, memory
    /// bandwidth and links; every trial uses the same `(num_workers, pin_memory)` on every rank
    /// and the pick follows [`run`](Tuner::run)'s rule on the **aggregate** samples/s.
    ///
    /// `build(rank, num_workers, pin_memory)` makes rank `rank`'s loader (typically with a
    /// [`DistributedSampler`](longshore_data::DistributedSampler) of that rank); it runs on
    /// the rank's own thread, so the loader need not be `Send`. Each rank takes one warm-up
    /// batch, then all ranks start their timed window together and take
    /// [`batches`](Tuner::batches) batches each. A trial's `samples_per_second` is the sum of
    /// the ranks' samples over the longest rank's window, its `wait_fraction` the mean of the
    /// ranks', its `batches` the sum. The prefetch depth is [`device`](Tuner::device)'s (2 by
    /// default); its device is ignored. A rank that fails ends the trial: the others are
    /// released (never left waiting for it) and the first error in rank order is returned.
    ///
    /// ```
    /// use longshore_data::VecDataset;
    /// use longshore_data::DistributedSampler;
    /// use longshore_loader::{DataLoader, Tuner};
    /// use longshore_transfer::Device;
    ///
    /// let data: Vec<([f32; 16], i64)> = (0..2048).map(|i| ([i as f32; 16], i)).collect();
    /// let dataset = std::sync::Arc::new(VecDataset::new(data));
    /// let devices = [Device::cpu(), Device::cpu()];
    /// let report = Tuner::new().workers([1, 2]).pin_memory([false]).batches(4).run_ranks(
    ///     &devices,
    ///     |rank, workers, pin| {
    ///         let sampler = DistributedSampler::builder(2048, 2, rank).build()?;
    ///         DataLoader::builder(dataset.clone())
    ///             .batch_size(64)
    ///             .sampler(sampler)
    ///             .num_workers(workers)
    ///             .pin_memory(pin)
    ///             .build()
    ///     },
    /// )?;
    /// assert_eq!(report.trials.len(), 2);
    /// assert_eq!(report.trials[0].batches, 8); // 4 per rank
    /// # Ok::<(), longshore_loader::LoaderError>(())
    /// ```
    pub fn run_ranks<F, B>(&self, devices: &[Device], build: B) -> Result<TuneReport, LoaderError>
    where
        F: Fetch<Output = Batch<PoolBuffer>>,
        B: Fn(usize, usize, bool) -> Result<DataLoader<F>, LoaderError> + Sync,
    {
        if devices.is_empty() {
            return Err(LoaderError::Config {
                option: "tuner",
                reason: "run_ranks needs at least one device (one per rank)".into(),
            });
        }
        let mut trials = Vec::new();
        for &w in &self.workers {
            for &pin in &self.pin {
                let trial = self.measure_ranks(devices, &build, w, pin)?;
                tracing::info!(target: "longshore::loader", ranks = devices.len(), num_workers = w, pin_memory = pin, samples_per_second = trial.samples_per_second, wait_fraction = trial.wait_fraction, "tuner trial (all ranks)");
                trials.push(trial);
            }
        }
        pick(trials)
    }

    fn measure_ranks<F, B>(
        &self,
        devices: &[Device],
        build: &B,
        w: usize,
        pin: bool,
    ) -> Result<Trial, LoaderError>
    where
        F: Fetch<Output = Batch<PoolBuffer>>,
        B: Fn(usize, usize, bool) -> Result<DataLoader<F>, LoaderError> + Sync,
    {
        let gate = Gate::new(devices.len());
        let outcomes: Vec<Result<RankRun, LoaderError>> = std::thread::scope(|s| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, dev)| {
                    let gate = &gate;
                    s.spawn(move || {
                        // A panicking `build` must release the other ranks at once: they wait
                        // at the gate, and this thread is only joined after them.
                        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.rank_trial(rank, dev, build, w, pin, gate)
                        }))
                        .unwrap_or_else(|p| {
                            Err(LoaderError::Config {
                                option: "tuner",
                                reason: format!(
                                    "rank {rank} panicked: {}",
                                    longshore_data::worker::panic_message(p)
                                ),
                            })
                        });
                        if out.is_err() {
                            gate.break_open();
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        // The root cause first: a rank released from the gate only reports another's failure.
        let mut runs = Vec::with_capacity(outcomes.len());
        let mut released = None;
        for o in outcomes {
            match o {
                Ok(r) => runs.push(r),
                Err(e) if is_release(&e) => {
                    released.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = released {
            return Err(e);
        }
        let samples: usize = runs.iter().map(|r| r.samples).sum();
        let secs = runs.iter().map(|r| r.secs).fold(0.0, f64::max);
        Ok(Trial {
            num_workers: w,
            pin_memory: pin,
            samples_per_second: if secs > 0.0 {
                samples as f64 / secs
            } else {
                0.0
            },
            wait_fraction: runs.iter().map(|r| r.wait_fraction).sum::<f64>() / runs.len() as f64,
            batches: runs.iter().map(|r| r.batches).sum(),
        })
    }

    /// One rank of a [`run_ranks`](Tuner::run_ranks) trial, on its own thread.
    fn rank_trial<F, B>(
        &self,
        rank: usize,
        dev: &Device,
        build: &B,
        w: usize,
        pin: bool,
        gate: &Gate,
    ) -> Result<RankRun, LoaderError>
    where
        F: Fetch<Output = Batch<PoolBuffer>>,
        B: Fn(usize, usize, bool) -> Result<DataLoader<F>, LoaderError> + Sync,
    {
        let loader = build(rank, w, pin)?;
        let compute = dev.new_stream()?;
        let mut it = loader.to_device(dev, self.depth)?;
        if let Some(first) = it.next() {
            first?.wait()?;
        }
        loader.reset_stats();
        if !gate.wait() {
            return Err(LoaderError::Config {
                option: "tuner",
                reason: format!("rank {rank}: {RELEASED}"),
            });
        }
        let t0 = Instant::now();
        let (mut samples, mut batches) = (0usize, 0usize);
        for item in it.by_ref().take(self.batches) {
            let b = item?.wait_on(&compute)?;
            samples += b.batch_size();
            batches += 1;
        }
        compute.synchronize()?;
        Ok(RankRun {
            samples,
            batches,
            secs: t0.elapsed().as_secs_f64(),
            wait_fraction: loader.stats().wait_fraction(),
        })
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

/// The fastest trial, preferring fewer workers and no pinning within 3% of it.
fn pick(trials: Vec<Trial>) -> Result<TuneReport, LoaderError> {
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

/// The reason of a rank released from the gate because another rank failed.
const RELEASED: &str = "another rank failed before the timed window";

fn is_release(e: &LoaderError) -> bool {
    matches!(e, LoaderError::Config { option: "tuner", reason } if reason.ends_with(RELEASED))
}

/// What one rank measured in a [`Tuner::run_ranks`] trial.
struct RankRun {
    samples: usize,
    batches: usize,
    secs: f64,
    wait_fraction: f64,
}

/// A barrier for the ranks of a trial that a failing rank can break open, so no rank waits
/// for one that will never arrive.
struct Gate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
    ranks: usize,
}

impl Gate {
    fn new(ranks: usize) -> Self {
        Self {
            state: Mutex::new((0, false)),
            cv: Condvar::new(),
            ranks,
        }
    }

    /// Waits for every rank; `false` when the gate was broken open instead.
    fn wait(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 += 1;
        if st.0 >= self.ranks {
            self.cv.notify_all();
        }
        while st.0 < self.ranks && !st.1 {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        !st.1 || st.0 >= self.ranks
    }

    /// Releases every waiting rank (with `false`).
    fn break_open(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.1 = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use longshore_data::{DistributedSampler, VecDataset};

    use super::*;

    fn dataset() -> Arc<VecDataset<([f32; 8], i64)>> {
        Arc::new(VecDataset::new(
            (0..1024).map(|i| ([i as f32; 8], i as i64)).collect(),
        ))
    }

    #[test]
    fn ranks_are_measured_together_and_summed() {
        let ds = dataset();
        let devices = [Device::cpu(), Device::cpu(), Device::cpu()];
        let report = Tuner::new()
            .workers([0, 2])
            .pin_memory([false, true])
            .batches(3)
            .run_ranks(&devices, |rank, w, pin| {
                let sampler = DistributedSampler::builder(1024, 3, rank).build()?;
                DataLoader::builder(ds.clone())
                    .batch_size(16)
                    .sampler(sampler)
                    .num_workers(w)
                    .pin_memory(pin)
                    .build()
            })
            .unwrap();
        assert_eq!(report.trials.len(), 4);
        for t in &report.trials {
            assert_eq!(t.batches, 9, "3 batches on each of 3 ranks: {t:?}");
            assert!(t.samples_per_second > 0.0);
            assert!((0.0..=1.0).contains(&t.wait_fraction));
        }
        assert!(report.trials.contains(&report.best));
    }

    #[test]
    fn a_failing_rank_ends_the_trial_with_its_error() {
        let ds = dataset();
        let devices = [Device::cpu(), Device::cpu()];
        let err = Tuner::new()
            .workers([1])
            .pin_memory([false])
            .batches(2)
            .run_ranks(&devices, |rank, w, _| {
                // Rank 1 asks for an impossible batch size: its build fails while rank 0
                // already waits at the gate.
                DataLoader::builder(ds.clone())
                    .batch_size(if rank == 1 { 0 } else { 16 })
                    .num_workers(w)
                    .build()
            })
            .unwrap_err();
        assert!(err.to_string().contains("batch_size"), "{err}");
    }

    #[test]
    fn a_panicking_rank_is_an_error_naming_it() {
        let ds = dataset();
        let devices = [Device::cpu(), Device::cpu()];
        let err = Tuner::new()
            .workers([0])
            .pin_memory([false])
            .batches(2)
            .run_ranks(&devices, |rank, w, _| {
                assert!(rank != 1, "rank one's build blew up");
                DataLoader::builder(ds.clone())
                    .batch_size(16)
                    .num_workers(w)
                    .build()
            })
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("rank 1 panicked") && text.contains("blew up"),
            "{text}"
        );
    }

    #[test]
    fn no_device_is_a_config_error() {
        let ds = dataset();
        let err = Tuner::new()
            .run_ranks(&[], |_, w, _| {
                DataLoader::builder(ds.clone()).num_workers(w).build()
            })
            .unwrap_err();
        assert!(err.to_string().contains("at least one device"), "{err}");
    }
}
