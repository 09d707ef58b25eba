//! [`DataLoaderBuilder`]: PyTorch's `DataLoader` options, checked with PyTorch's rules.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use longshore_data::{
    BatchSampler, BatchSampling, Collate, Dataset, DatasetCollate, FetchCollate, IterableDataset,
    Sampler, StackCollate, WorkerInfo,
};
use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
use longshore_transfer::GpuTopology;

use crate::collate::{IntoCollate, IterableSource};
use crate::config::{LoaderConfig, LoaderWarning};
use crate::error::LoaderError;
use crate::fetch::{ItemFetch, IterableFetch, MapFetch};
use crate::loader::{BoxedLoader, DataLoader};
use crate::options::{LoaderOptions, SampleErrorPolicy, WorkerPanicPolicy};
use crate::placement::{Placement, WorkerPriority};
use crate::shared::{Parts, SamplerSource};
use crate::stats::SourceCounter;
use crate::worker::WorkerInit;

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Everything a builder holds besides its dataset and collate function, in one struct, so
/// that [`DataLoaderBuilder::collate`] moves it whole: the plain options, and what is not a
/// plain value.
struct Options {
    /// The plain options, as set (checked by [`DataLoaderBuilder::validate`] at build time).
    options: LoaderOptions,
    sampler: Option<Box<dyn Sampler>>,
    batch_sampler: Option<Box<dyn BatchSampling>>,
    worker_init: Option<WorkerInit>,
    pool: Option<PinnedPool>,
    /// The GPU's topology, given to the builder (then `to_device` does not replace it).
    topology: Option<GpuTopology>,
    /// Whether the pool was made by the loader (it may then set the pool's NUMA node).
    own_pool: bool,
    /// Counts delivered samples by source.
    sources: Option<SourceCounter>,
}

/// What a build makes, for [`DataLoaderBuilder::validate`]: the rules differ by kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A map-style dataset, batched.
    Map,
    /// A map-style dataset, unbatched (PyTorch's `batch_size=None`).
    Unbatched,
    /// An iterable dataset.
    Iterable,
}

fn config_err(option: &'static str, reason: impl Into<String>) -> LoaderError {
    LoaderError::Config {
        option,
        reason: reason.into(),
    }
}

/// Builds a [`DataLoader`]; every option has PyTorch's name and default.
///
/// The options are checked by `build` with PyTorch's rules and messages (a
/// [`LoaderError::Config`] naming the option). Things that work but are probably not meant
/// (`pin_memory` without a CUDA driver, more workers than cores) are not errors: they are
/// logged once with `tracing::warn!` (target `"longshore::loader"`) and listed in
/// [`DataLoader::warnings`].
pub struct DataLoaderBuilder<D, C> {
    dataset: D,
    collate: C,
    opts: Options,
}

impl<D, C> fmt::Debug for DataLoaderBuilder<D, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataLoaderBuilder")
            .field("options", &self.opts.options)
            .field("sampler", &self.opts.sampler)
            .field("batch_sampler", &self.opts.batch_sampler)
            .finish_non_exhaustive()
    }
}

impl DataLoader<ItemFetch<longshore_data::VecDataset<()>>> {
    /// A builder for a map-style dataset, with PyTorch's defaults: `batch_size` 1, no shuffle,
    /// no workers, stacking collate ([`StackCollate`], like `default_collate`). The stacking
    /// is written straight from the dataset's fields when it has a
    /// [`DirectPlan`](longshore_data::DirectPlan) (`NpyDataset::open(..)?.transform(Normalize::
    /// imagenet(..))`, an `ImageFolder` with a pipeline): the same batches as
    /// `.collate(DirectCollate::new()..)`, at its speed.
    #[allow(clippy::new_ret_no_self)]
    pub fn builder<D: Dataset + 'static>(
        dataset: D,
    ) -> DataLoaderBuilder<D, FetchCollate<StackCollate>> {
        DataLoaderBuilder::new(dataset, FetchCollate(StackCollate::new()))
    }

    /// A builder for an iterable dataset (PyTorch's `IterableDataset`): each worker gets its
    /// [`WorkerInfo`] and yields its own share; samplers and `shuffle` are refused.
    pub fn iterable<D: IterableDataset + 'static>(
        dataset: D,
    ) -> DataLoaderBuilder<IterableSource<D>, StackCollate> {
        DataLoaderBuilder::new(IterableSource(dataset), StackCollate::new())
    }
}

impl<D, C> DataLoaderBuilder<D, C> {
    fn new(dataset: D, collate: C) -> Self {
        Self {
            dataset,
            collate,
            opts: Options {
                options: LoaderOptions::default(),
                sampler: None,
                batch_sampler: None,
                worker_init: None,
                pool: None,
                topology: None,
                own_pool: false,
                sources: None,
            },
        }
    }

    /// Samples per batch (default 1).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.opts.options.batch_size = batch_size;
        self
    }

    /// Shuffle every epoch (a seeded [`RandomSampler`](longshore_data::RandomSampler)).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.opts.options.shuffle = shuffle;
        self
    }

    /// The sampler of indices (mutually exclusive with `shuffle`).
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> Self {
        self.opts.sampler = Some(Box::new(sampler));
        self
    }

    /// The sampler of whole batches. As in PyTorch, it excludes `sampler`, `shuffle(true)`,
    /// `drop_last(true)` and a `batch_size` other than 1 (the default, so `.batch_size(1)`
    /// is accepted).
    pub fn batch_sampler(mut self, batch_sampler: impl BatchSampling + 'static) -> Self {
        self.opts.batch_sampler = Some(Box::new(batch_sampler));
        self
    }

    /// Worker threads (0: load on the calling thread). More than the cores this process may
    /// run on works, with a [`LoaderWarning::WorkersExceedCores`].
    pub fn num_workers(mut self, n: usize) -> Self {
        self.opts.options.num_workers = n;
        self
    }

    /// Collate straight into page-locked memory leased from the loader's pool, so the copy to
    /// the GPU is a direct DMA. Without a CUDA driver the pool is pageable: the loader then
    /// reports [`LoaderConfig::pin_memory_effective`] `false` and a
    /// [`LoaderWarning::PinMemoryUnavailable`] (also logged with `tracing::warn!`).
    pub fn pin_memory(mut self, pin: bool) -> Self {
        self.opts.options.pin_memory = pin;
        self
    }

    /// Drop the last incomplete batch.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.opts.options.drop_last = drop_last;
        self
    }

    /// Longest wait for one batch; past it the iterator yields [`LoaderError::Timeout`] naming
    /// the worker and batch (right at the timeout: the workers are stopped afterwards, in the
    /// background) and ends the epoch.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.opts.options.timeout = Some(timeout);
        self
    }

    /// Runs `f` in each worker thread as it starts (PyTorch's `worker_init_fn`).
    pub fn worker_init(mut self, f: impl Fn(&WorkerInfo) + Send + Sync + 'static) -> Self {
        self.opts.worker_init = Some(Arc::new(f));
        self
    }

    /// Counts the samples of every delivered batch by source in [`LoaderStats::sources`]
    /// (`sources` counters): `source_of(index)` is the source of the dataset's sample `index`
    /// (`None`: none counted). For a
    /// [`Mixture`](longshore_data::dataset::mixture::Mixture), its
    /// [`member_of`](longshore_data::dataset::mixture::Mixture::member_of) counts samples by
    /// member, what Hugging Face's `interleave_datasets` users check proportions with. A
    /// map-style dataset's option: an iterable dataset's build refuses it.
    ///
    /// ```
    /// use longshore_data::VecDataset;
    /// use longshore_data::dataset::mixture::{Mixture, Stop};
    /// use longshore_loader::DataLoader;
    ///
    /// let (a, b) = (VecDataset::new(vec![0u32; 30]), VecDataset::new(vec![1u32; 10]));
    /// let mix = Mixture::new(vec![a, b], &[3.0, 1.0], Stop::FirstExhausted)?;
    /// let member = mix.member_of();
    /// let loader = DataLoader::builder(mix)
    ///     .batch_size(8)
    ///     .shuffle(true)
    ///     .count_sources(2, move |p| member.member(p))
    ///     .build()?;
    /// let n = loader.iter().map(|b| b.unwrap().batch_size()).sum::<usize>();
    /// assert_eq!((n, loader.stats().sources), (40, vec![30, 10]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`LoaderStats::sources`]: crate::LoaderStats::sources
    pub fn count_sources(
        mut self,
        sources: usize,
        source_of: impl Fn(usize) -> Option<usize> + Send + Sync + 'static,
    ) -> Self {
        self.opts.sources = Some(SourceCounter {
            count: sources,
            of: Arc::new(source_of),
        });
        self
    }

    /// The base seed (PyTorch's `generator`): shuffling order and worker seeds derive from it.
    /// Without it a random seed is drawn, recorded in [`LoaderState`](crate::LoaderState).
    pub fn seed(mut self, seed: u64) -> Self {
        self.opts.options.seed = Some(seed);
        self
    }

    /// Batches in flight per worker (default 2; invalid without workers, as in PyTorch).
    pub fn prefetch_factor(mut self, factor: usize) -> Self {
        self.opts.options.prefetch_factor = Some(factor);
        self
    }

    /// Keep the worker threads between epochs.
    pub fn persistent_workers(mut self, keep: bool) -> Self {
        self.opts.options.persistent_workers = keep;
        self
    }

    /// With persistent workers, start the next epoch's first batches on the idle workers
    /// while the current epoch drains its last ones (default `true`; ignored without
    /// persistent workers). An epoch's start otherwise waits for every worker's first batch
    /// at once, while the consumer (and the device link) idles.
    ///
    /// - **Same results**: the next epoch yields exactly the batches it would without this
    ///   option (order, contents, the worker generators' draws: each batch is loaded by the
    ///   worker that epoch deals it to, seeded from `(seed, epoch, worker id)`).
    /// - **Only as predicted**: the batches are for the epoch the loader runs next, as it
    ///   stands when the current epoch deals its last batch. They are discarded (never
    ///   delivered, their memory back in the pool) if the next `iter()` runs anything else:
    ///   [`DataLoader::set_epoch`](crate::DataLoader::set_epoch) to another epoch,
    ///   [`DataLoader::load_state_dict`](crate::DataLoader::load_state_dict), or an epoch
    ///   dropped before its end or ended by an error.
    /// - **Memory**: between epochs the loader holds up to `num_workers * prefetch_factor`
    ///   batches of the pool, the bound that holds during an epoch; they are returned when the
    ///   loader is dropped. A pool starved of budget while the current epoch waits gets them
    ///   back at once.
    /// - **State and errors**: they are not delivered until the next epoch yields them
    ///   ([`DataLoader::state_dict`](crate::DataLoader::state_dict) is unchanged); a failing
    ///   sample or a panic in one surfaces when that epoch reaches the batch.
    /// - **Datasets**: map-style and iterable. An iterable dataset's next epoch starts once
    ///   every worker's stream of the current one has ended: the loader lays it out first
    ///   ([`IterableDataset::begin_epoch`](longshore_data::IterableDataset::begin_epoch)), and
    ///   each worker opens its stream for that epoch
    ///   ([`WorkerInfo::epoch`](longshore_data::WorkerInfo::epoch)), so a dataset that keys
    ///   its streams by epoch is read right. State you
    ///   change between epochs *outside* the loader is not seen by these batches: an epoch
    ///   set on the dataset itself (`ImageDataset::set_epoch` for per-sample randomness in
    ///   longshore-vision) is set after they were loaded. Turn this option off for such
    ///   datasets, or derive per-epoch values from the worker's generator.
    ///   Samplers must be a function of their epoch (as every sampler of longshore-data is):
    ///   the next epoch's order is drawn early.
    ///
    /// [`LoaderStats::speculative_batches`](crate::LoaderStats::speculative_batches) and
    /// [`speculative_discarded`](crate::LoaderStats::speculative_discarded) count what was
    /// used and what was thrown away.
    pub fn prefetch_next_epoch(mut self, on: bool) -> Self {
        self.opts.options.prefetch_next_epoch = on;
        self
    }

    /// Deliver batches in sampler order (default) or as soon as they are ready.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.opts.options.in_order = in_order;
        self
    }

    /// What to do with samples that fail to load.
    pub fn on_sample_error(mut self, policy: SampleErrorPolicy) -> Self {
        self.opts.options.on_sample_error = policy;
        self
    }

    /// What to do when a worker panics.
    pub fn on_worker_panic(mut self, policy: WorkerPanicPolicy) -> Self {
        self.opts.options.on_worker_panic = policy;
        self
    }

    /// The pool batches are leased from (default: one sized for this loader; page-locked with
    /// `pin_memory` when a CUDA driver is present). Share one pool between loaders to share
    /// the pinned budget.
    pub fn pool(mut self, pool: PinnedPool) -> Self {
        self.opts.pool = Some(pool);
        self
    }

    /// Where worker threads may run (default [`Placement::GpuLocal`]: on a host with several
    /// NUMA nodes, pinned to the CPUs nearest the GPU the loader delivers to, with the loader's
    /// own pool allocating on the GPU's node; a no-op elsewhere). [`Placement::Off`] leaves
    /// the threads alone; [`Placement::Cpus`] pins them to a set. What it became is in
    /// [`LoaderStats::placement`](crate::LoaderStats::placement).
    pub fn cpu_placement(mut self, placement: Placement) -> Self {
        self.opts.options.cpu_placement = placement;
        self
    }

    /// How worker threads are scheduled (default [`WorkerPriority::Normal`]);
    /// [`WorkerPriority::Background`] runs them in `SCHED_BATCH` at a higher nice value, so
    /// that with more workers than cores the consumer thread still gets a core when it wakes.
    pub fn worker_priority(mut self, priority: WorkerPriority) -> Self {
        self.opts.options.worker_priority = priority;
        self
    }

    /// The topology of the GPU the batches go to, for [`Placement::GpuLocal`] (without it the
    /// loader learns it from the device given to [`DataLoader::to_device`]). Read it with
    /// [`Device::topology`](longshore_transfer::Device::topology), or from any sysfs tree with
    /// [`GpuTopology::from_sysfs`].
    pub fn gpu_topology(mut self, topology: GpuTopology) -> Self {
        self.opts.topology = Some(topology);
        self
    }

    /// Longest wait for workers to stop when an iterator is dropped (default 5 s); a worker
    /// still inside dataset code then is detached and exits when that code returns.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.opts.options.shutdown_timeout = timeout;
        self
    }

    /// Replaces the collate function (PyTorch's `collate_fn`).
    ///
    /// A map-style dataset takes either a [`Collate`] of its items ([`StackCollate`],
    /// [`PadCollate`](longshore_data::PadCollate), your own), which the loader wraps in
    /// [`FetchCollate`], or a [`DatasetCollate`] of the dataset itself
    /// ([`DirectCollate`](longshore_data::DirectCollate), [`FetchCollate`]). An iterable
    /// dataset takes a [`Collate`] of its items. See [`IntoCollate`].
    ///
    /// ```
    /// use longshore_data::{PadCollate, VecDataset};
    /// use longshore_loader::DataLoader;
    ///
    /// let rows: Vec<(Vec<i64>, f32)> = vec![(vec![1, 2, 3], 0.5), (vec![4], 1.5)];
    /// let loader = DataLoader::builder(VecDataset::new(rows))
    ///     .batch_size(2)
    ///     .collate(PadCollate::new(0.0))
    ///     .build()?;
    /// let batch = loader.iter().next().unwrap()?;
    /// assert_eq!(batch.shape(0)?, &[2, 3]); // padded to the longest row
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn collate<C2, M>(self, collate: C2) -> DataLoaderBuilder<D, C2::Collate>
    where
        C2: IntoCollate<D, M>,
    {
        DataLoaderBuilder {
            dataset: self.dataset,
            collate: collate.into_collate(),
            opts: self.opts,
        }
    }

    /// Replaces every plain option with `options` (the sampler, `worker_init`, the pool and
    /// the topology stay as set).
    pub fn options(mut self, options: LoaderOptions) -> Self {
        self.opts.options = options;
        self
    }

    /// Every rule of PyTorch's on the options (and on the sampler's presence) for a build of
    /// `kind`, in PyTorch's order and words: the one place they are checked.
    fn validate(&self, kind: Kind) -> Result<(), LoaderError> {
        let o = &self.opts.options;
        let sampler = self.opts.sampler.is_some();
        let batch_sampler = self.opts.batch_sampler.is_some();
        if let Some(f) = o.prefetch_factor {
            if o.num_workers == 0 {
                return Err(config_err(
                    "prefetch_factor",
                    "prefetch_factor option could only be specified in multiprocessing.\
                     let num_workers > 0 to enable multiprocessing, otherwise set \
                     prefetch_factor to None.",
                ));
            }
            if f == 0 {
                return Err(config_err(
                    "prefetch_factor",
                    "prefetch_factor must be at least 1",
                ));
            }
        }
        if o.persistent_workers && o.num_workers == 0 {
            return Err(config_err(
                "persistent_workers",
                "persistent_workers option needs num_workers > 0",
            ));
        }
        if o.timeout == Some(Duration::ZERO) {
            return Err(config_err("timeout", "timeout must be positive"));
        }
        if o.batch_size == 0 {
            return Err(config_err(
                "batch_size",
                "batch_size must be a positive integer, got 0",
            ));
        }
        match kind {
            Kind::Iterable => {
                let given = [
                    ("shuffle", o.shuffle),
                    ("sampler", sampler),
                    ("batch_sampler", batch_sampler),
                ];
                if let Some((option, _)) = given.into_iter().find(|(_, g)| *g) {
                    return Err(config_err(
                        option,
                        format!(
                            "DataLoader with IterableDataset: expected unspecified {option} option"
                        ),
                    ));
                }
            }
            Kind::Unbatched if batch_sampler => {
                return Err(config_err(
                    "batch_sampler",
                    "an unbatched loader takes no batch_sampler",
                ));
            }
            Kind::Unbatched if o.batch_size != 1 || o.drop_last => {
                return Err(config_err(
                    "batch_size",
                    "an unbatched loader (batch_size=None) takes no batch_size or drop_last",
                ));
            }
            Kind::Map | Kind::Unbatched => {}
        }
        if batch_sampler {
            // PyTorch: `if batch_size != 1 or shuffle or sampler is not None or drop_last`.
            let conflicts: Vec<String> = [
                (o.batch_size != 1).then(|| format!("batch_size={}", o.batch_size)),
                o.shuffle.then(|| "shuffle=true".to_owned()),
                sampler.then(|| "sampler".to_owned()),
                o.drop_last.then(|| "drop_last=true".to_owned()),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !conflicts.is_empty() {
                return Err(config_err(
                    "batch_sampler",
                    format!(
                        "batch_sampler option is mutually exclusive with batch_size, shuffle, \
                         sampler, and drop_last (got {})",
                        conflicts.join(", ")
                    ),
                ));
            }
        }
        if sampler && o.shuffle {
            return Err(config_err(
                "sampler",
                "sampler option is mutually exclusive with shuffle",
            ));
        }
        Ok(())
    }

    /// Checks the options for a build of `kind` ([`validate`](Self::validate)) and settles
    /// what they become: seed, prefetch factor, the machine's parallelism.
    fn settle(&self, kind: Kind) -> Result<LoaderConfig, LoaderError> {
        self.validate(kind)?;
        let o = &self.opts.options;
        Ok(LoaderConfig {
            options: o.clone(),
            batch_size: (kind != Kind::Unbatched).then_some(o.batch_size),
            prefetch_factor: o.prefetch_factor.unwrap_or(2),
            seed: o.seed.unwrap_or_else(random_seed),
            pin_memory_effective: false,
            available_parallelism: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            warnings: Vec::new(),
        })
    }

    /// The pool (the given one, or a new one), the last step of a build: settles
    /// `pin_memory_effective` and the warnings, and logs each warning once.
    fn make_pool(&mut self, config: &mut LoaderConfig) -> Result<PinnedPool, LoaderError> {
        let pin = config.options.pin_memory;
        self.opts.own_pool = self.opts.pool.is_none();
        let (pool, pin_unavailable) = match self.opts.pool.take() {
            Some(p) => {
                let why = (pin && !p.kind().is_dma_capable())
                    .then(|| format!("the given pool hands out {:?} memory", p.kind()));
                (p, why)
            }
            None if !pin => (
                PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable))?,
                None,
            ),
            None if longshore_host::driver_available() => (
                PinnedPool::new(PoolConfig::for_kind(MemoryKind::PageLocked))?,
                None,
            ),
            None => (
                PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable))?,
                Some(
                    longshore_host::driver_unavailable_reason()
                        .unwrap_or_else(|| "no CUDA driver".to_owned()),
                ),
            ),
        };
        config.pin_memory_effective = pin && pool.kind().is_dma_capable();
        config.warnings.clear();
        if let Some(reason) = pin_unavailable {
            config
                .warnings
                .push(LoaderWarning::PinMemoryUnavailable { reason });
        }
        if config.options.num_workers > config.available_parallelism {
            config.warnings.push(LoaderWarning::WorkersExceedCores {
                num_workers: config.options.num_workers,
                available_parallelism: config.available_parallelism,
            });
        }
        for w in &config.warnings {
            tracing::warn!(target: "longshore::loader", warning = %w, "loader option");
        }
        Ok(pool)
    }
}

impl<D, C> DataLoaderBuilder<D, C>
where
    D: Dataset + 'static,
{
    /// Replaces the collate function with one that reads the dataset itself (a
    /// [`DatasetCollate`], such as [`DirectCollate`](longshore_data::DirectCollate)).
    /// [`collate`](DataLoaderBuilder::collate) accepts these too; this method is for generic
    /// code, where the compiler cannot tell which kind of collate a type parameter is.
    pub fn dataset_collate<C2: DatasetCollate<D>>(self, collate: C2) -> DataLoaderBuilder<D, C2> {
        DataLoaderBuilder {
            dataset: self.dataset,
            collate,
            opts: self.opts,
        }
    }
}

impl<D, C> DataLoaderBuilder<D, C>
where
    D: Dataset + 'static,
    C: DatasetCollate<D> + 'static,
{
    /// Checks the options with PyTorch's rules (`batch_sampler` excludes `sampler`,
    /// `shuffle(true)`, `drop_last(true)` and a `batch_size` other than 1; `sampler` excludes
    /// `shuffle`; `prefetch_factor` and `persistent_workers` need workers) and builds the
    /// loader.
    pub fn build(self) -> Result<DataLoader<MapFetch<D, C>>, LoaderError> {
        Ok(DataLoader::from_parts(self.parts()?))
    }

    /// [`build`](Self::build), with the dataset's type erased: loaders of different datasets
    /// (a training set and a validation set of other types, a dataset chosen at run time)
    /// then share one type, [`BoxedLoader`]. Everything else is the same: options, workers,
    /// [`to_device`](DataLoader::to_device), [`with_stage`](DataLoader::with_stage), resume.
    ///
    /// ```
    /// use longshore_data::VecDataset;
    /// use longshore_loader::{BoxedLoader, DataLoader};
    ///
    /// let train = DataLoader::builder(VecDataset::new(vec![([1.0f32; 4], 0i64); 64]))
    ///     .batch_size(8)
    ///     .build_boxed()?;
    /// let val = DataLoader::builder(VecDataset::new(vec![([2u8; 4],); 16]))
    ///     .batch_size(8)
    ///     .build_boxed()?;
    /// let loaders: Vec<BoxedLoader> = vec![train, val];
    /// assert_eq!(loaders.iter().map(|l| l.iter().count()).sum::<usize>(), 10);
    /// # Ok::<(), longshore_loader::LoaderError>(())
    /// ```
    pub fn build_boxed(self) -> Result<BoxedLoader, LoaderError> {
        Ok(DataLoader::from_parts(self.parts()?.boxed()))
    }

    fn parts(mut self) -> Result<Parts<MapFetch<D, C>>, LoaderError> {
        let mut config = self.settle(Kind::Map)?;
        let sampler = self.sampler_source(self.dataset.len(), config.seed)?;
        let pool = self.make_pool(&mut config)?;
        let fetch = MapFetch {
            dataset: Arc::new(self.dataset),
            collate: self.collate,
            pool: pool.clone(),
            on_error: config.options.on_sample_error,
        };
        Ok(Parts {
            fetch,
            config,
            sampler,
            pool,
            worker_init: self.opts.worker_init,
            topology: self.opts.topology,
            own_pool: self.opts.own_pool,
            sources: self.opts.sources,
        })
    }

    /// Builds a loader without automatic batching (PyTorch's `batch_size=None`): it yields the
    /// dataset's items one by one, in sampler order.
    pub fn build_unbatched(mut self) -> Result<DataLoader<ItemFetch<D>>, LoaderError> {
        let mut config = self.settle(Kind::Unbatched)?;
        let sampler = self.sampler_source(self.dataset.len(), config.seed)?;
        let pool = self.make_pool(&mut config)?;
        let fetch = ItemFetch {
            dataset: Arc::new(self.dataset),
        };
        Ok(DataLoader::from_parts(Parts {
            fetch,
            config,
            sampler,
            pool,
            worker_init: self.opts.worker_init,
            topology: self.opts.topology,
            own_pool: self.opts.own_pool,
            sources: self.opts.sources,
        }))
    }

    /// The epoch's batches of indices, from the options [`validate`](Self::validate) passed.
    fn sampler_source(&mut self, len: usize, seed: u64) -> Result<SamplerSource, LoaderError> {
        let o = &self.opts.options;
        if let Some(bs) = self.opts.batch_sampler.take() {
            return Ok(SamplerSource::User(bs));
        }
        if let Some(s) = self.opts.sampler.take() {
            return Ok(SamplerSource::User(Box::new(BatchSampler::new(
                s,
                o.batch_size,
                o.drop_last,
            )?)));
        }
        SamplerSource::builtin(len, o.shuffle, o.batch_size, o.drop_last, seed)
    }
}

impl<D, C> DataLoaderBuilder<IterableSource<D>, C>
where
    D: IterableDataset + 'static,
    D::Item: 'static,
    C: Collate<D::Item> + 'static,
{
    /// Builds a loader over the iterable dataset. Samplers and `shuffle` are refused, as
    /// PyTorch refuses them for an `IterableDataset`.
    pub fn build(self) -> Result<DataLoader<IterableFetch<D, C>>, LoaderError> {
        Ok(DataLoader::from_parts(self.parts()?))
    }

    /// [`build`](Self::build), with the dataset's type erased: the loader has the same type,
    /// [`BoxedLoader`], as a boxed loader of a map-style dataset.
    pub fn build_boxed(self) -> Result<BoxedLoader, LoaderError> {
        Ok(DataLoader::from_parts(self.parts()?.boxed()))
    }

    fn parts(mut self) -> Result<Parts<IterableFetch<D, C>>, LoaderError> {
        if self.opts.sources.is_some() {
            return Err(config_err(
                "count_sources",
                "counts samples by their index: a map-style dataset's option",
            ));
        }
        let mut config = self.settle(Kind::Iterable)?;
        let pool = self.make_pool(&mut config)?;
        let fetch = IterableFetch {
            dataset: Arc::new(self.dataset.0),
            collate: self.collate,
            pool: pool.clone(),
            batch_size: config.options.batch_size,
            drop_last: config.options.drop_last,
            on_error: config.options.on_sample_error,
        };
        Ok(Parts {
            fetch,
            config,
            sampler: SamplerSource::None,
            pool,
            worker_init: self.opts.worker_init,
            topology: self.opts.topology,
            own_pool: self.opts.own_pool,
            sources: None,
        })
    }
}
