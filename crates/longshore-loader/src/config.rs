//! Loader options that are plain values.

use std::time::Duration;

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

/// The options of a built loader, as PyTorch names them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// Samples per batch; `None` without automatic batching.
    pub batch_size: Option<usize>,
    /// Worker threads; 0 loads on the calling thread.
    pub num_workers: usize,
    /// Batches in flight per worker.
    pub prefetch_factor: usize,
    /// Collate into page-locked memory.
    pub pin_memory: bool,
    /// Drop the last incomplete batch.
    pub drop_last: bool,
    /// Longest wait for one batch; `None` waits forever (but a dead worker is still detected).
    pub timeout: Option<Duration>,
    /// Keep workers alive between epochs.
    pub persistent_workers: bool,
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
}
