//! [`LoaderOptions`]: every plain option of a loader, PyTorch's `DataLoader` arguments and
//! longshore's own, as one value. The builder's setters write it; a language binding or a
//! configuration file fills it whole and hands it to
//! [`DataLoaderBuilder::options`](crate::DataLoaderBuilder::options).

use std::time::Duration;

use crate::placement::{Placement, WorkerPriority};

/// Every plain option of a loader, with PyTorch's names and defaults. The builder holds one
/// (its setters of the same names write its fields) beside what is not a plain value (the
/// sampler, `worker_init`, the pool), and checks it once, at `build()`, with PyTorch's rules.
/// A built loader's [`LoaderConfig`](crate::LoaderConfig) keeps it as given.
///
/// ```
/// use longshore_data::VecDataset;
/// use longshore_loader::{DataLoader, LoaderOptions};
///
/// let opts = LoaderOptions { batch_size: 8, shuffle: true, num_workers: 2, seed: Some(7), ..Default::default() };
/// let rows: Vec<([f32; 2], i64)> = (0..32).map(|i| ([i as f32; 2], i)).collect();
/// let loader = DataLoader::builder(VecDataset::new(rows)).options(opts).build()?;
/// assert_eq!((loader.len(), loader.config().options.num_workers), (Some(4), 2));
/// # Ok::<(), longshore_loader::LoaderError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderOptions {
    /// Samples per batch (PyTorch's default 1; an unbatched loader takes only 1).
    pub batch_size: usize,
    /// Reshuffle every epoch (a seeded [`RandomSampler`](longshore_data::RandomSampler)).
    pub shuffle: bool,
    /// Worker threads (0: each batch is loaded when the consumer asks for it, nothing ahead,
    /// as PyTorch loads in the calling process: a map-style dataset on the consumer's thread,
    /// an iterable dataset's stream on one thread of its own).
    pub num_workers: usize,
    /// Batches each worker loads ahead (`None`: 2 with workers, as PyTorch; refused without
    /// workers).
    pub prefetch_factor: Option<usize>,
    /// Collate into page-locked memory.
    pub pin_memory: bool,
    /// Drop the last incomplete batch.
    pub drop_last: bool,
    /// How long to wait for a batch from the workers (`None`: no limit).
    pub timeout: Option<Duration>,
    /// Keep the workers between epochs.
    pub persistent_workers: bool,
    /// With persistent workers, start the next epoch's first batches while the current one
    /// drains (default `true`; see
    /// [`DataLoaderBuilder::prefetch_next_epoch`](crate::DataLoaderBuilder::prefetch_next_epoch)).
    pub prefetch_next_epoch: bool,
    /// Deliver batches in sampler order (PyTorch's `in_order`, default `true`); `false` hands
    /// each batch over as soon as it is ready.
    pub in_order: bool,
    /// The base seed of shuffling and of the workers' generators (`None`: drawn at random).
    pub seed: Option<u64>,
    /// What a sample that fails to load does to its batch (default: the batch fails, as
    /// PyTorch re-raises the worker's exception).
    pub on_sample_error: SampleErrorPolicy,
    /// What a panicking worker does to the epoch.
    pub on_worker_panic: WorkerPanicPolicy,
    /// Longest wait for workers to stop when an iterator is dropped (default 5 s).
    pub shutdown_timeout: Duration,
    /// Where worker threads may run, as asked for; what it became is
    /// [`DataLoader::placement`](crate::DataLoader::placement).
    pub cpu_placement: Placement,
    /// How the workers are scheduled.
    pub worker_priority: WorkerPriority,
}

impl Default for LoaderOptions {
    /// PyTorch's defaults.
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1,
            shuffle: false,
            num_workers: 0,
            prefetch_factor: None,
            pin_memory: false,
            drop_last: false,
            timeout: None,
            persistent_workers: false,
            prefetch_next_epoch: true,
            in_order: true,
            seed: None,
            on_sample_error: SampleErrorPolicy::default(),
            on_worker_panic: WorkerPanicPolicy::default(),
            shutdown_timeout: Duration::from_secs(5),
            cpu_placement: Placement::default(),
            worker_priority: WorkerPriority::default(),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use longshore_data::VecDataset;

    use super::*;
    use crate::DataLoader;

    #[test]
    fn every_option_reaches_the_config() {
        let opts = LoaderOptions {
            batch_size: 4,
            drop_last: true,
            num_workers: 2,
            prefetch_factor: Some(3),
            persistent_workers: true,
            in_order: false,
            on_sample_error: SampleErrorPolicy::Skip,
            seed: Some(11),
            timeout: Some(Duration::from_secs(9)),
            ..Default::default()
        };
        let rows: Vec<([f32; 2], i64)> = (0..10).map(|i| ([i as f32; 2], i)).collect();
        let loader = DataLoader::builder(VecDataset::new(rows))
            .options(opts.clone())
            .build()
            .expect("valid options");
        let c = loader.config();
        assert_eq!(c.options, opts);
        assert_eq!((c.batch_size, c.prefetch_factor, c.seed), (Some(4), 3, 11));
        // The defaults are PyTorch's (and the builder's).
        let d = LoaderOptions::default();
        assert!(d.in_order && d.on_sample_error == SampleErrorPolicy::FailBatch);
    }
}
