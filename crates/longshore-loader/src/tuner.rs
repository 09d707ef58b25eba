//! [`Tuner`]: measure and pick `num_workers` and `pin_memory` for a dataset on this machine
//! (the sweep script people write for PyTorch, as a feature).

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_transfer::Device;

use crate::device::{DeviceLoader, DeviceStage, Upload};
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
    /// Share of that wait spent on pinned memory ([`LoaderStats::pinned_wait_fraction`]):
    /// near one, the pool's budget, not the workers, limits this configuration.
    ///
    /// [`LoaderStats::pinned_wait_fraction`]: crate::LoaderStats::pinned_wait_fraction
    pub pinned_wait_fraction: f64,
    /// The batches the loader kept in flight: `num_workers * prefetch_factor`, or fewer where
    /// the budget could not back them (then at most that many workers load at once, and more
    /// workers buy nothing: the pick prefers fewer).
    pub in_flight: usize,
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

    /// Batches measured per trial (at least twice the batches the loader can have in flight,
    /// `num_workers x prefetch_factor`, so every worker delivers within the window), after a
    /// warm-up of the batches in flight plus one, so a trial times what the workers produce
    /// rather than a queue filled before it; both run over as many epochs as needed.
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

    /// [`run`](Tuner::run) through a device stage: each trial's loader delivers through
    /// `stage()` (a new stage per trial: nvJPEG decoding, your own kernel), `depth` batches in
    /// flight as set by [`device`](Tuner::device) (2 by default; its device is not used, the
    /// stage's is), and the consumer waits on the stage's device as a training step would.
    ///
    /// ```
    /// use longshore_data::VecDataset;
    /// use longshore_loader::{DataLoader, Tuner, Upload};
    /// use longshore_transfer::Device;
    ///
    /// let rows: Vec<([f32; 4], i64)> = (0..512).map(|i| ([i as f32; 4], i)).collect();
    /// let report = Tuner::new().workers([0, 2]).pin_memory([false]).batches(8).run_stage(
    ///     |w, pin| DataLoader::builder(VecDataset::new(rows.clone())).batch_size(32)
    ///         .num_workers(w).pin_memory(pin).build(),
    ///     || Upload::new(&Device::cpu()),
    /// )?;
    /// assert_eq!(report.trials.len(), 2);
    /// # Ok::<(), longshore_loader::LoaderError>(())
    /// ```
    pub fn run_stage<F, S, B, M>(
        &self,
        mut build: B,
        mut stage: M,
    ) -> Result<TuneReport, LoaderError>
    where
        F: Fetch<Output = Batch<PoolBuffer>>,
        S: DeviceStage,
        B: FnMut(usize, bool) -> Result<DataLoader<F>, LoaderError>,
        M: FnMut() -> Result<S, LoaderError>,
    {
        let mut trials = Vec::new();
        for &w in &self.workers {
            for &pin in &self.pin {
                let loader = build(w, pin)?;
                let on_device = loader.with_stage(stage()?).depth(self.depth);
                let trial = self.trial(&loader, Via::Stage(&on_device), w, pin)?;
                tracing::info!(target: "longshore::loader", num_workers = w, pin_memory = pin, samples_per_second = trial.samples_per_second, wait_fraction = trial.wait_fraction, "tuner trial (device stage)");
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
    /// the rank's own thread, so the loader need not be `Send`. Each rank takes its warm-up
    /// (see [`batches`](Tuner::batches)), then all ranks start their timed window together
    /// and take [`batches`](Tuner::batches) batches each. A trial's `samples_per_second` is the sum of
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
            pinned_wait_fraction: runs.iter().map(|r| r.pinned_wait_fraction).sum::<f64>()
                / runs.len() as f64,
            in_flight: runs.iter().map(|r| r.in_flight).min().unwrap_or(0),
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
        let on_device = loader.with_stage(Upload::new(dev)?).depth(self.depth);
        let window = self.consume(&loader, Via::Stage(&on_device), || {
            loader.reset_stats();
            if gate.wait() {
                Ok(())
            } else {
                Err(LoaderError::Config {
                    option: "tuner",
                    reason: format!("rank {rank}: {RELEASED}"),
                })
            }
        })?;
        Ok(RankRun {
            samples: window.samples,
            batches: window.batches,
            secs: window.secs,
            wait_fraction: loader.stats().wait_fraction(),
            pinned_wait_fraction: loader.stats().pinned_wait_fraction(),
            in_flight: loader.stats().in_flight_limit,
        })
    }

    fn measure<F: Fetch<Output = Batch<PoolBuffer>>>(
        &self,
        loader: &DataLoader<F>,
        w: usize,
        pin: bool,
    ) -> Result<Trial, LoaderError> {
        match &self.device {
            Some(dev) => {
                let on_device = loader.with_stage(Upload::new(dev)?).depth(self.depth);
                self.trial(loader, Via::Stage(&on_device), w, pin)
            }
            None => self.trial(loader, Via::<F, Upload>::Host, w, pin),
        }
    }

    fn trial<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage>(
        &self,
        loader: &DataLoader<F>,
        via: Via<'_, F, S>,
        w: usize,
        pin: bool,
    ) -> Result<Trial, LoaderError> {
        let window = self.consume(loader, via, || {
            loader.reset_stats();
            Ok(())
        })?;
        let stats = loader.stats();
        Ok(Trial {
            num_workers: w,
            pin_memory: pin,
            samples_per_second: window.rate(),
            wait_fraction: stats.wait_fraction(),
            pinned_wait_fraction: stats.pinned_wait_fraction(),
            in_flight: stats.in_flight_limit,
            batches: window.batches,
        })
    }

    /// Batches timed per trial: [`batches`](Tuner::batches), and at least twice the batches
    /// that can be in flight. Workers started together finish their batches in bursts, so a
    /// window shorter than a round of every worker would time one burst.
    fn timed_batches(&self, in_flight: usize) -> usize {
        self.batches.max(2 * in_flight)
    }

    /// Consumes `loader` (on the host, or through a device stage) over as many
    /// epochs as it takes: first a warm-up of the batches that can be in flight
    /// (`num_workers x prefetch_factor`) plus one, so the timed window does not drain a queue
    /// filled before it, then `at_window()`, then [`batches`](Tuner::batches) timed batches.
    fn consume<F: Fetch<Output = Batch<PoolBuffer>>, S: DeviceStage>(
        &self,
        loader: &DataLoader<F>,
        via: Via<'_, F, S>,
        mut at_window: impl FnMut() -> Result<(), LoaderError>,
    ) -> Result<Window, LoaderError> {
        let cfg = loader.config();
        // The budget may keep fewer batches in flight (known once a batch came back).
        let in_flight = match loader.stats().in_flight_limit {
            0 => cfg.options.num_workers.max(1) * cfg.prefetch_factor.max(1),
            n => n,
        };
        let warm = in_flight + 1;
        let total = warm + self.timed_batches(in_flight);
        let compute = match &via {
            Via::Stage(on) => Some(
                on.stage(|s| s.device().new_stream())
                    .ok_or_else(|| LoaderError::State("the device stage is in use".into()))??,
            ),
            Via::Host => None,
        };
        let mut seen = 0usize;
        let mut window = Window {
            samples: 0,
            batches: 0,
            secs: 0.0,
        };
        let mut t0 = None;
        // Counts one delivered batch; whether to go on.
        let mut step = |n: usize, sync: &dyn Fn() -> Result<(), LoaderError>| {
            seen += 1;
            if seen == warm {
                sync()?;
                at_window()?;
                t0 = Some(Instant::now());
            } else if seen > warm {
                window.samples += n;
                window.batches += 1;
            }
            Ok::<bool, LoaderError>(seen < total)
        };
        let mut empty_epochs = 0;
        loop {
            let mut delivered = 0usize;
            let more = match (&via, &compute) {
                (Via::Stage(on), Some(cs)) => {
                    let mut more = true;
                    for item in on.iter()? {
                        let n = item?.wait_on(cs)?.batch_size();
                        delivered += 1;
                        more = step(n, &|| cs.synchronize().map_err(Into::into))?;
                        if !more {
                            break;
                        }
                    }
                    more
                }
                _ => {
                    let mut more = true;
                    for item in loader.iter() {
                        let n = item?.batch_size();
                        delivered += 1;
                        more = step(n, &|| Ok(()))?;
                        if !more {
                            break;
                        }
                    }
                    more
                }
            };
            if !more {
                break;
            }
            if delivered == 0 {
                empty_epochs += 1;
                if empty_epochs > 1 {
                    return Err(LoaderError::Config {
                        option: "tuner",
                        reason: "the loader yields no batch".into(),
                    });
                }
            }
        }
        if let Some(cs) = &compute {
            cs.synchronize()?;
        }
        window.secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
        Ok(window)
    }
}

/// How a trial takes its batches.
enum Via<'a, F: Fetch, S: DeviceStage> {
    /// On the host, from the loader's iterator.
    Host,
    /// Through a device stage, the consumer's stream waiting on each batch.
    Stage(&'a DeviceLoader<F, S>),
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
    // Workers past the budget's in-flight bound do not load at once: say so rather than let
    // the pick be read as "more workers do not help".
    if best.pinned_wait_fraction > 0.5 || (best.in_flight > 0 && best.in_flight < best.num_workers)
    {
        tracing::warn!(target: "longshore::loader", num_workers = best.num_workers, in_flight = best.in_flight, pinned_wait_fraction = best.pinned_wait_fraction, "tuner: the pinned budget bounds the batches in flight below the worker count; a larger budget may be faster");
    }
    Ok(TuneReport { trials, best })
}

/// The reason of a rank released from the gate because another rank failed.
const RELEASED: &str = "another rank failed before the timed window";

fn is_release(e: &LoaderError) -> bool {
    matches!(e, LoaderError::Config { option: "tuner", reason } if reason.ends_with(RELEASED))
}

/// A timed window of [`Tuner::consume`].
struct Window {
    samples: usize,
    batches: usize,
    secs: f64,
}

impl Window {
    fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.samples as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// What one rank measured in a [`Tuner::run_ranks`] trial.
struct RankRun {
    samples: usize,
    batches: usize,
    secs: f64,
    wait_fraction: f64,
    pinned_wait_fraction: f64,
    in_flight: usize,
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
            // At least twice the batches in flight (workers x prefetch_factor 2) per rank.
            let per_rank = 3.max(2 * t.num_workers.max(1) * 2);
            assert_eq!(
                t.batches,
                3 * per_rank,
                "{per_rank} on each of 3 ranks: {t:?}"
            );
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
    fn trials_run_past_the_epoch_and_time_only_what_follows_the_warm_up() {
        // 16 batches an epoch; warm-up 2 x 2 + 1 = 5 batches, then 40 timed: three epochs.
        let ds = Arc::new(VecDataset::new(
            (0..256).map(|i| ([i as f32; 8], i as i64)).collect(),
        ));
        let report = Tuner::new()
            .workers([2])
            .pin_memory([false])
            .batches(40)
            .run(|w, pin| {
                DataLoader::builder(ds.clone())
                    .batch_size(16)
                    .num_workers(w)
                    .pin_memory(pin)
                    .persistent_workers(true)
                    .build()
            })
            .unwrap();
        assert_eq!(report.trials[0].batches, 40);
        assert!(report.trials[0].samples_per_second > 0.0);
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
