//! [`LoaderOptions`]: PyTorch's `DataLoader` arguments as one value, for code that builds
//! loaders from a configuration (a language binding, a config file) instead of a chain of
//! builder calls.

use std::time::Duration;

use crate::builder::DataLoaderBuilder;
use crate::placement::WorkerPriority;

/// PyTorch's `DataLoader` arguments as one value: `builder.options(&opts)` applies them as the
/// builder's methods of the same names would (and checks them at `build()` the same way).
///
/// ```
/// use longshore_data::VecDataset;
/// use longshore_loader::{DataLoader, LoaderOptions};
///
/// let opts = LoaderOptions { batch_size: 8, shuffle: true, num_workers: 2, seed: Some(7), ..Default::default() };
/// let rows: Vec<([f32; 2], i64)> = (0..32).map(|i| ([i as f32; 2], i)).collect();
/// let loader = DataLoader::builder(VecDataset::new(rows)).options(&opts).build()?;
/// assert_eq!((loader.len(), loader.config().num_workers), (Some(4), 2));
/// # Ok::<(), longshore_loader::LoaderError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderOptions {
    /// Samples per batch (PyTorch's default 1).
    pub batch_size: usize,
    /// Reshuffle every epoch.
    pub shuffle: bool,
    /// Worker threads (0: load on the consumer's thread).
    pub num_workers: usize,
    /// Collate into page-locked memory.
    pub pin_memory: bool,
    /// Drop the last incomplete batch.
    pub drop_last: bool,
    /// Batches each worker loads ahead (`None`: 2 with workers, as PyTorch).
    pub prefetch_factor: Option<usize>,
    /// Keep the workers between epochs.
    pub persistent_workers: bool,
    /// How long to wait for a batch from the workers (`None`: no limit).
    pub timeout: Option<Duration>,
    /// The base seed of shuffling and of the workers' generators (`None`: drawn at random).
    pub seed: Option<u64>,
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
            pin_memory: false,
            drop_last: false,
            prefetch_factor: None,
            persistent_workers: false,
            timeout: None,
            seed: None,
            worker_priority: WorkerPriority::default(),
        }
    }
}

impl<D, C> DataLoaderBuilder<D, C> {
    /// Applies `options`, as the builder's methods of the same names.
    pub fn options(self, options: &LoaderOptions) -> Self {
        let o = options;
        let mut b = self
            .batch_size(o.batch_size)
            .shuffle(o.shuffle)
            .num_workers(o.num_workers)
            .pin_memory(o.pin_memory)
            .drop_last(o.drop_last)
            .persistent_workers(o.persistent_workers)
            .worker_priority(o.worker_priority);
        if let Some(p) = o.prefetch_factor {
            b = b.prefetch_factor(p);
        }
        if let Some(t) = o.timeout {
            b = b.timeout(t);
        }
        if let Some(s) = o.seed {
            b = b.seed(s);
        }
        b
    }
}
