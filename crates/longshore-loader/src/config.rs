//! Loader options that are plain values.

use std::time::Duration;

use crate::placement::{Placement, WorkerPriority};

/// What a batch does when one of its samples fails to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SampleErrorPolicy {
    /// The batch is yielded as an error naming the sample index and the dataset's error
    /// (the default; PyTorch re-raises the worker's exception). Later batches still load.
    #[default]
    FailBatch,
    /// The sample is dropped from its batch (logged, counted in
    /// [`LoaderStats::skipped_samples`](crate::LoaderStats::skipped_samples)); a batch whose
    /// every sample fails is skipped.
    Skip,
}

/// What the loader does when a worker panics inside dataset or collate code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WorkerPanicPolicy {
    /// Yield the panic as [`LoaderError::WorkerPanicked`](crate::LoaderError::WorkerPanicked),
    /// then end the epoch cleanly (the default, like PyTorch).
    #[default]
    Fail,
    /// Yield the error for that batch, reset the worker (`worker_init` runs again) and go on.
    Restart,
}

/// Something about a loader's options that works but is probably not what the user wants.
///
/// Each is logged once with `tracing::warn!` (target `"longshore::loader"`) when the loader is
/// built, and kept in [`LoaderConfig::warnings`] (also [`DataLoader::warnings`](crate::DataLoader::warnings)),
/// so a program or a test can check for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoaderWarning {
    /// `pin_memory(true)` was asked for, but batches are in memory the GPU cannot DMA from
    /// (no CUDA driver, or the given pool is pageable): copies to a device take the driver's
    /// staging path.
    PinMemoryUnavailable {
        /// Why (the driver's load error, or the pool's memory kind).
        reason: String,
    },
    /// More worker threads than the cores this process may run on: they take turns on the
    /// cores (PyTorch warns the same way about worker processes).
    WorkersExceedCores {
        /// The requested `num_workers`.
        num_workers: usize,
        /// What `std::thread::available_parallelism` reports.
        available_parallelism: usize,
    },
    /// `num_workers * prefetch_factor` batches take more pinned memory than the pool's budget
    /// holds: the loader keeps fewer batches in flight (`in_flight`), as many as the budget
    /// backs with one block left for the batch the consumer holds, so that no batch waits for
    /// a block held by a later one. Raise the budget or lower `prefetch_factor` to silence it.
    /// Found at the first batch (its size is not known before).
    PrefetchExceedsBudget {
        /// `num_workers`.
        num_workers: usize,
        /// `prefetch_factor`.
        prefetch_factor: usize,
        /// The pool block one batch takes (its size class).
        batch_bytes: usize,
        /// The pool's budget.
        budget: usize,
        /// The batches the loader keeps in flight instead.
        in_flight: usize,
    },
}

impl std::fmt::Display for LoaderWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoaderWarning::PinMemoryUnavailable { reason } => write!(
                f,
                "pin_memory is set but batches use pageable memory ({reason}): copies to a device are not direct DMA"
            ),
            LoaderWarning::WorkersExceedCores {
                num_workers,
                available_parallelism,
            } => write!(
                f,
                "num_workers is {num_workers} but this process may run on {available_parallelism} cores: workers will take turns"
            ),
            LoaderWarning::PrefetchExceedsBudget {
                num_workers,
                prefetch_factor,
                batch_bytes,
                budget,
                in_flight,
            } => write!(
                f,
                "num_workers {num_workers} x prefetch_factor {prefetch_factor} x {batch_bytes} bytes a batch = {} bytes exceeds the pinned budget of {budget} bytes: keeping {in_flight} batches in flight instead",
                num_workers * prefetch_factor * batch_bytes
            ),
        }
    }
}

/// The options of a built loader, as PyTorch names them, and what they became on this
/// machine ([`pin_memory_effective`](LoaderConfig::pin_memory_effective),
/// [`available_parallelism`](LoaderConfig::available_parallelism),
/// [`warnings`](LoaderConfig::warnings)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// Samples per batch; `None` without automatic batching.
    pub batch_size: Option<usize>,
    /// Shuffle every epoch with the built-in sampler.
    pub shuffle: bool,
    /// Worker threads; 0 loads on the calling thread.
    pub num_workers: usize,
    /// Batches in flight per worker.
    pub prefetch_factor: usize,
    /// Collate into page-locked memory (as asked for).
    pub pin_memory: bool,
    /// Whether batches really are in memory a GPU can DMA from (page-locked or registered).
    /// `false` when `pin_memory` is off, when no CUDA driver is present, or when the given
    /// pool is pageable.
    pub pin_memory_effective: bool,
    /// Drop the last incomplete batch.
    pub drop_last: bool,
    /// Longest wait for one batch; `None` waits forever (but a dead worker is still detected).
    pub timeout: Option<Duration>,
    /// Keep workers alive between epochs.
    pub persistent_workers: bool,
    /// Start the next epoch's first batches while the current one drains (persistent
    /// workers only; see [`DataLoaderBuilder::prefetch_next_epoch`](crate::DataLoaderBuilder::prefetch_next_epoch)).
    pub prefetch_next_epoch: bool,
    /// Deliver batches in sampler order (`true`) or as they are ready.
    pub in_order: bool,
    /// Base seed of the shuffling sampler and of the workers' generators.
    pub seed: u64,
    /// Failing samples.
    pub on_sample_error: SampleErrorPolicy,
    /// Panicking workers.
    pub on_worker_panic: WorkerPanicPolicy,
    /// Longest wait for workers to stop when an iterator is dropped.
    pub shutdown_timeout: Duration,
    /// The cores this process may run on (`std::thread::available_parallelism`), when the
    /// loader was built.
    pub available_parallelism: usize,
    /// What looked wrong when the loader was built; see [`LoaderWarning`].
    pub warnings: Vec<LoaderWarning>,
    /// Where worker threads may run, as asked for; what it became is
    /// [`DataLoader::placement`](crate::DataLoader::placement).
    pub cpu_placement: Placement,
    /// How worker threads are scheduled.
    pub worker_priority: WorkerPriority,
}

impl LoaderConfig {
    /// PyTorch's defaults; `seed`, `prefetch_factor` and the machine-dependent fields are
    /// settled when a loader is built.
    pub(crate) fn pytorch_defaults() -> Self {
        Self {
            batch_size: Some(1),
            shuffle: false,
            num_workers: 0,
            prefetch_factor: 2,
            pin_memory: false,
            pin_memory_effective: false,
            drop_last: false,
            timeout: None,
            persistent_workers: false,
            prefetch_next_epoch: true,
            in_order: true,
            seed: 0,
            on_sample_error: SampleErrorPolicy::default(),
            on_worker_panic: WorkerPanicPolicy::default(),
            shutdown_timeout: Duration::from_secs(5),
            available_parallelism: 1,
            warnings: Vec::new(),
            cpu_placement: Placement::default(),
            worker_priority: WorkerPriority::default(),
        }
    }
}
