//! [`LoaderConfig`]: a built loader's options as given and what they became, and the
//! [`LoaderWarning`]s about them.

use crate::options::LoaderOptions;

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

/// A built loader's options as given ([`options`](LoaderConfig::options)) and what they
/// became when it was built: the batch size, prefetch factor and seed in force, whether
/// `pin_memory` took effect, the machine's parallelism and the [`warnings`](LoaderConfig::warnings).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// The options as the builder was given them.
    pub options: LoaderOptions,
    /// Samples per batch; `None` without automatic batching.
    pub batch_size: Option<usize>,
    /// Batches in flight per worker (`options.prefetch_factor`, else 2).
    pub prefetch_factor: usize,
    /// Base seed of the shuffling sampler and of the workers' generators (`options.seed`, else
    /// drawn at random when the loader was built).
    pub seed: u64,
    /// Whether batches really are in memory a GPU can DMA from (page-locked or registered).
    /// `false` when `pin_memory` is off, when no CUDA driver is present, or when the given
    /// pool is pageable.
    pub pin_memory_effective: bool,
    /// The cores this process may run on (`std::thread::available_parallelism`), when the
    /// loader was built.
    pub available_parallelism: usize,
    /// What looked wrong when the loader was built; see [`LoaderWarning`].
    pub warnings: Vec<LoaderWarning>,
}
