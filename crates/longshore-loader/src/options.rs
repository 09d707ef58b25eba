//! [`LoaderOptions`]: PyTorch's `DataLoader` arguments as one value, for code that builds
//! loaders from a configuration (a language binding, a config file) instead of a chain of
//! builder calls.

use std::time::Duration;

use crate::builder::DataLoaderBuilder;
use crate::config::SampleErrorPolicy;
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
    /// Deliver batches in sampler order (PyTorch's `in_order`, default `true`); `false` hands
    /// each batch over as soon as it is ready.
    pub in_order: bool,
    /// What a sample that fails to load does to its batch (longshore's; default: the batch
    /// fails, as PyTorch re-raises the worker's exception).
    pub on_sample_error: SampleErrorPolicy,
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
            in_order: true,
            on_sample_error: SampleErrorPolicy::default(),
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
            .in_order(o.in_order)
            .on_sample_error(o.on_sample_error)
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
            .options(&opts)
            .build()
            .expect("valid options");
        let c = loader.config();
        assert_eq!(
            (c.batch_size, c.drop_last, c.num_workers, c.prefetch_factor),
            (Some(4), true, 2, 3)
        );
        assert!(c.persistent_workers && !c.in_order);
        assert_eq!(c.on_sample_error, SampleErrorPolicy::Skip);
        assert_eq!((c.seed, c.timeout), (11, Some(Duration::from_secs(9))));
        // The defaults are PyTorch's (and the builder's).
        let d = LoaderOptions::default();
        assert!(d.in_order && d.on_sample_error == SampleErrorPolicy::FailBatch);
    }
}
