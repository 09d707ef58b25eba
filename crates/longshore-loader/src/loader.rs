//! [`DataLoader`], its builder and its iterator.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam::channel::RecvTimeoutError;
use longshore_data::worker::WorkerGuard;
use longshore_data::{
    BatchSampler, BatchSampling, Collate, Dataset, DatasetCollate, FetchCollate, IterableDataset,
    RandomSampler, Sampler, SequentialSampler, StackCollate, WorkerInfo,
};
use longshore_host::{MemoryKind, PinnedPool, PoolConfig};

use crate::config::{LoaderConfig, SampleErrorPolicy, WorkerPanicPolicy};
use crate::engine::{Engine, Outcome, Reply, Task, WorkerBody, WorkerCtx, guarded};
use crate::error::LoaderError;
use crate::fetch::{CollateFetch, Fetch, ItemFetch, IterableFetch};
use crate::state::{LoaderState, Progress};
use crate::stats::LoaderStats;

/// A function run once in each worker thread when it starts (and again after a restart),
/// like PyTorch's `worker_init_fn`.
pub type WorkerInit = Arc<dyn Fn(&WorkerInfo) + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// SplitMix64 finaliser: decorrelates seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of worker `id` in `epoch`: distinct per worker and per epoch (so workers never
/// share random streams, pytorch#5059), and a pure function of (seed, epoch, id), so a resumed
/// run draws the same augmentations.
pub fn worker_seed(seed: u64, epoch: u64, id: usize) -> u64 {
    mix(seed ^ mix(epoch ^ 0xA5A5_A5A5) ^ mix((id as u64).wrapping_add(0x5EED)))
}

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

/// Where a loader's batches of indices come from.
enum SamplerSource {
    /// Built from `shuffle`, `batch_size` and `drop_last`; rebuilt when a state changes the seed.
    Builtin {
        len: usize,
        shuffle: bool,
        batch_size: usize,
        drop_last: bool,
        sampler: Box<dyn BatchSampling>,
    },
    /// A user sampler or batch sampler.
    User(Box<dyn BatchSampling>),
    /// Iterable datasets have none.
    None,
}

impl SamplerSource {
    fn builtin(
        len: usize,
        shuffle: bool,
        batch_size: usize,
        drop_last: bool,
        seed: u64,
    ) -> Result<Self, LoaderError> {
        let sampler: Box<dyn BatchSampling> = if shuffle {
            Box::new(BatchSampler::new(
                RandomSampler::new(len, seed)?,
                batch_size,
                drop_last,
            )?)
        } else {
            Box::new(BatchSampler::new(
                SequentialSampler::new(len),
                batch_size,
                drop_last,
            )?)
        };
        Ok(SamplerSource::Builtin {
            len,
            shuffle,
            batch_size,
            drop_last,
            sampler,
        })
    }

    fn get(&mut self) -> Option<&mut Box<dyn BatchSampling>> {
        match self {
            SamplerSource::Builtin { sampler, .. } | SamplerSource::User(sampler) => Some(sampler),
            SamplerSource::None => None,
        }
    }
}

struct Inner<F: Fetch> {
    fetch: Arc<F>,
    config: Mutex<LoaderConfig>,
    sampler: Mutex<SamplerSource>,
    pool: PinnedPool,
    worker_init: Option<WorkerInit>,
    /// The epoch the next iteration runs, and what of it is already done (after a restore).
    next: Mutex<(u64, Option<Progress>)>,
    progress: Mutex<Progress>,
    stats: Mutex<LoaderStats>,
    persistent: Mutex<Option<Engine<F::Output>>>,
}

/// A multi-worker data loader with PyTorch's options: `for batch in &loader`.
///
/// Built with [`DataLoader::builder`] (map-style datasets) or [`DataLoader::iterable`].
/// Each iteration is one epoch; iterating again runs the next epoch (reshuffled when
/// `shuffle` is on). Workers are threads: no pickling, no shared-memory files, no GIL.
///
/// ```
/// use longshore_data::VecDataset;
/// use longshore_loader::DataLoader;
///
/// // 10 samples of ([f32; 4] features, i64 label).
/// let data: Vec<([f32; 4], i64)> = (0..10).map(|i| ([i as f32; 4], i as i64)).collect();
/// let loader = DataLoader::builder(VecDataset::new(data)).batch_size(4).num_workers(2).seed(7).build()?;
/// let mut seen = 0;
/// for batch in &loader {
///     let batch = batch?;
///     let labels = batch.tensor::<i64>(1)?;
///     seen += labels.len();
/// }
/// assert_eq!(seen, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataLoader<F: Fetch> {
    inner: Arc<Inner<F>>,
}

impl<F: Fetch> Clone for DataLoader<F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<F: Fetch> fmt::Debug for DataLoader<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataLoader")
            .field("config", &*lock(&self.inner.config))
            .field("pool", &self.inner.pool)
            .finish()
    }
}

/// Builds a [`DataLoader`]; every option has PyTorch's name and default.
pub struct DataLoaderBuilder<D, C> {
    dataset: D,
    collate: C,
    batch_size: Option<usize>,
    shuffle: bool,
    sampler: Option<Box<dyn Sampler>>,
    batch_sampler: Option<Box<dyn BatchSampling>>,
    num_workers: usize,
    pin_memory: bool,
    drop_last: bool,
    timeout: Option<Duration>,
    worker_init: Option<WorkerInit>,
    seed: Option<u64>,
    prefetch_factor: Option<usize>,
    persistent_workers: bool,
    in_order: bool,
    on_sample_error: SampleErrorPolicy,
    on_worker_panic: WorkerPanicPolicy,
    pool: Option<PinnedPool>,
    shutdown_timeout: Duration,
    explicit: Vec<&'static str>,
}

impl<D, C> fmt::Debug for DataLoaderBuilder<D, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataLoaderBuilder")
            .field("batch_size", &self.batch_size)
            .field("shuffle", &self.shuffle)
            .field("num_workers", &self.num_workers)
            .field("pin_memory", &self.pin_memory)
            .field("drop_last", &self.drop_last)
            .field("prefetch_factor", &self.prefetch_factor)
            .field("persistent_workers", &self.persistent_workers)
            .field("in_order", &self.in_order)
            .finish_non_exhaustive()
    }
}

impl DataLoader<ItemFetch<longshore_data::VecDataset<()>>> {
    /// A builder for a map-style dataset, with PyTorch's defaults: `batch_size` 1, no shuffle,
    /// no workers, stacking collate ([`StackCollate`], like `default_collate`).
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

/// Marks a builder's dataset as iterable.
#[derive(Debug)]
pub struct IterableSource<D>(D);

impl<D, C> DataLoaderBuilder<D, C> {
    fn new(dataset: D, collate: C) -> Self {
        Self {
            dataset,
            collate,
            batch_size: Some(1),
            shuffle: false,
            sampler: None,
            batch_sampler: None,
            num_workers: 0,
            pin_memory: false,
            drop_last: false,
            timeout: None,
            worker_init: None,
            seed: None,
            prefetch_factor: None,
            persistent_workers: false,
            in_order: true,
            on_sample_error: SampleErrorPolicy::default(),
            on_worker_panic: WorkerPanicPolicy::default(),
            pool: None,
            shutdown_timeout: Duration::from_secs(5),
            explicit: Vec::new(),
        }
    }

    /// Samples per batch (default 1).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = Some(batch_size);
        self.explicit.push("batch_size");
        self
    }

    /// Shuffle every epoch (a seeded [`RandomSampler`]).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        if shuffle {
            self.explicit.push("shuffle");
        }
        self
    }

    /// The sampler of indices (mutually exclusive with `shuffle`).
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> Self {
        self.sampler = Some(Box::new(sampler));
        self
    }

    /// The sampler of whole batches (mutually exclusive with `batch_size`, `shuffle`,
    /// `sampler` and `drop_last`, as in PyTorch).
    pub fn batch_sampler(mut self, batch_sampler: impl BatchSampling + 'static) -> Self {
        self.batch_sampler = Some(Box::new(batch_sampler));
        self
    }

    /// Worker threads (0: load on the calling thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }

    /// Collate straight into page-locked memory leased from the loader's pool, so the copy to
    /// the GPU is a direct DMA. Without a CUDA driver the pool is pageable (logged once).
    pub fn pin_memory(mut self, pin: bool) -> Self {
        self.pin_memory = pin;
        self
    }

    /// Drop the last incomplete batch.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        if drop_last {
            self.explicit.push("drop_last");
        }
        self
    }

    /// Longest wait for one batch; past it the iterator yields [`LoaderError::Timeout`] naming
    /// the worker and batch, and ends the epoch.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Runs `f` in each worker thread as it starts (PyTorch's `worker_init_fn`).
    pub fn worker_init(mut self, f: impl Fn(&WorkerInfo) + Send + Sync + 'static) -> Self {
        self.worker_init = Some(Arc::new(f));
        self
    }

    /// The base seed (PyTorch's `generator`): shuffling order and worker seeds derive from it.
    /// Without it a random seed is drawn, recorded in [`LoaderState`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Batches in flight per worker (default 2; invalid without workers, as in PyTorch).
    pub fn prefetch_factor(mut self, factor: usize) -> Self {
        self.prefetch_factor = Some(factor);
        self
    }

    /// Keep the worker threads between epochs.
    pub fn persistent_workers(mut self, keep: bool) -> Self {
        self.persistent_workers = keep;
        self
    }

    /// Deliver batches in sampler order (default) or as soon as they are ready.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.in_order = in_order;
        self
    }

    /// What to do with samples that fail to load.
    pub fn on_sample_error(mut self, policy: SampleErrorPolicy) -> Self {
        self.on_sample_error = policy;
        self
    }

    /// What to do when a worker panics.
    pub fn on_worker_panic(mut self, policy: WorkerPanicPolicy) -> Self {
        self.on_worker_panic = policy;
        self
    }

    /// The pool batches are leased from (default: one sized for this loader; page-locked with
    /// `pin_memory` when a CUDA driver is present). Share one pool between loaders to share
    /// the pinned budget.
    pub fn pool(mut self, pool: PinnedPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Longest wait for workers to stop when an iterator is dropped (default 5 s); a worker
    /// still inside dataset code then is detached and exits when that code returns.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Replaces the collate function.
    pub fn collate<C2>(self, collate: C2) -> DataLoaderBuilder<D, C2> {
        DataLoaderBuilder {
            dataset: self.dataset,
            collate,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            sampler: self.sampler,
            batch_sampler: self.batch_sampler,
            num_workers: self.num_workers,
            pin_memory: self.pin_memory,
            drop_last: self.drop_last,
            timeout: self.timeout,
            worker_init: self.worker_init,
            seed: self.seed,
            prefetch_factor: self.prefetch_factor,
            persistent_workers: self.persistent_workers,
            in_order: self.in_order,
            on_sample_error: self.on_sample_error,
            on_worker_panic: self.on_worker_panic,
            pool: self.pool,
            shutdown_timeout: self.shutdown_timeout,
            explicit: self.explicit,
        }
    }

    fn validate_common(&self) -> Result<(usize, u64), LoaderError> {
        if let Some(f) = self.prefetch_factor {
            if self.num_workers == 0 {
                return Err(LoaderError::Config {
                    option: "prefetch_factor",
                    reason: "prefetch_factor option could only be specified in multiprocessing: \
                             set num_workers > 0"
                        .into(),
                });
            }
            if f == 0 {
                return Err(LoaderError::Config {
                    option: "prefetch_factor",
                    reason: "must be at least 1".into(),
                });
            }
        }
        if self.persistent_workers && self.num_workers == 0 {
            return Err(LoaderError::Config {
                option: "persistent_workers",
                reason: "persistent_workers option needs num_workers > 0".into(),
            });
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(LoaderError::Config {
                option: "timeout",
                reason: "must be positive".into(),
            });
        }
        if self.batch_size == Some(0) {
            return Err(LoaderError::Config {
                option: "batch_size",
                reason: "must be a positive integer, got 0".into(),
            });
        }
        Ok((
            self.prefetch_factor.unwrap_or(2),
            self.seed.unwrap_or_else(random_seed),
        ))
    }

    fn make_pool(&mut self) -> Result<PinnedPool, LoaderError> {
        if let Some(p) = self.pool.take() {
            return Ok(p);
        }
        let kind = if self.pin_memory {
            if longshore_host::driver_available() {
                MemoryKind::PageLocked
            } else {
                tracing::warn!(target: "longshore::loader", reason = ?longshore_host::driver_unavailable_reason(), "pin_memory is set but no CUDA driver is available: batches use pageable memory");
                MemoryKind::Pageable
            }
        } else {
            MemoryKind::Pageable
        };
        Ok(PinnedPool::new(PoolConfig::for_kind(kind))?)
    }

    fn config(&self, prefetch_factor: usize, seed: u64) -> LoaderConfig {
        LoaderConfig {
            batch_size: self.batch_size,
            num_workers: self.num_workers,
            prefetch_factor,
            pin_memory: self.pin_memory,
            drop_last: self.drop_last,
            timeout: self.timeout,
            persistent_workers: self.persistent_workers,
            in_order: self.in_order,
            seed,
            on_sample_error: self.on_sample_error,
            on_worker_panic: self.on_worker_panic,
            shutdown_timeout: self.shutdown_timeout,
        }
    }
}

fn finish<F: Fetch>(
    fetch: F,
    config: LoaderConfig,
    sampler: SamplerSource,
    pool: PinnedPool,
    worker_init: Option<WorkerInit>,
) -> DataLoader<F> {
    DataLoader {
        inner: Arc::new(Inner {
            fetch: Arc::new(fetch),
            config: Mutex::new(config),
            sampler: Mutex::new(sampler),
            pool,
            worker_init,
            next: Mutex::new((0, None)),
            progress: Mutex::new(Progress::default()),
            stats: Mutex::new(LoaderStats::default()),
            persistent: Mutex::new(None),
        }),
    }
}

impl<D, C> DataLoaderBuilder<D, C>
where
    D: Dataset + 'static,
    C: DatasetCollate<D> + 'static,
{
    /// Checks the options (PyTorch's rules: `batch_sampler` excludes `batch_size`, `shuffle`,
    /// `sampler` and `drop_last`; `sampler` excludes `shuffle`; `prefetch_factor` and
    /// `persistent_workers` need workers) and builds the loader.
    pub fn build(mut self) -> Result<DataLoader<CollateFetch<D, C>>, LoaderError> {
        let (prefetch, seed) = self.validate_common()?;
        let len = self.dataset.len();
        let sampler = self.sampler_source(len, seed)?;
        let pool = self.make_pool()?;
        let config = self.config(prefetch, seed);
        let fetch = CollateFetch {
            dataset: Arc::new(self.dataset),
            collate: self.collate,
            pool: pool.clone(),
            on_error: self.on_sample_error,
        };
        Ok(finish(fetch, config, sampler, pool, self.worker_init))
    }

    /// Builds a loader without automatic batching (PyTorch's `batch_size=None`): it yields the
    /// dataset's items one by one, in sampler order.
    pub fn build_unbatched(mut self) -> Result<DataLoader<ItemFetch<D>>, LoaderError> {
        if self.batch_sampler.is_some() {
            return Err(LoaderError::Config {
                option: "batch_sampler",
                reason: "an unbatched loader takes no batch_sampler".into(),
            });
        }
        if self.explicit.contains(&"batch_size") || self.drop_last {
            return Err(LoaderError::Config {
                option: "batch_size",
                reason: "an unbatched loader (batch_size=None) takes no batch_size or drop_last"
                    .into(),
            });
        }
        self.batch_size = Some(1);
        let (prefetch, seed) = self.validate_common()?;
        let len = self.dataset.len();
        let sampler = self.sampler_source(len, seed)?;
        let pool = self.make_pool()?;
        let mut config = self.config(prefetch, seed);
        config.batch_size = None;
        let fetch = ItemFetch {
            dataset: Arc::new(self.dataset),
        };
        Ok(finish(fetch, config, sampler, pool, self.worker_init))
    }

    fn sampler_source(&mut self, len: usize, seed: u64) -> Result<SamplerSource, LoaderError> {
        if let Some(bs) = self.batch_sampler.take() {
            if !self.explicit.is_empty() || self.sampler.is_some() {
                return Err(LoaderError::Config {
                    option: "batch_sampler",
                    reason: "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
                        .into(),
                });
            }
            return Ok(SamplerSource::User(bs));
        }
        let batch_size = self.batch_size.unwrap_or(1);
        if let Some(s) = self.sampler.take() {
            if self.shuffle {
                return Err(LoaderError::Config {
                    option: "sampler",
                    reason: "sampler option is mutually exclusive with shuffle".into(),
                });
            }
            return Ok(SamplerSource::User(Box::new(BatchSampler::new(
                s,
                batch_size,
                self.drop_last,
            )?)));
        }
        SamplerSource::builtin(len, self.shuffle, batch_size, self.drop_last, seed)
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
    pub fn build(mut self) -> Result<DataLoader<IterableFetch<D, C>>, LoaderError> {
        if self.shuffle {
            return Err(LoaderError::Config {
                option: "shuffle",
                reason: "DataLoader with IterableDataset: expected unspecified shuffle option"
                    .into(),
            });
        }
        if self.sampler.is_some() {
            return Err(LoaderError::Config {
                option: "sampler",
                reason: "DataLoader with IterableDataset: expected unspecified sampler option"
                    .into(),
            });
        }
        if self.batch_sampler.is_some() {
            return Err(LoaderError::Config {
                option: "batch_sampler",
                reason:
                    "DataLoader with IterableDataset: expected unspecified batch_sampler option"
                        .into(),
            });
        }
        let (prefetch, seed) = self.validate_common()?;
        let pool = self.make_pool()?;
        let config = self.config(prefetch, seed);
        let fetch = IterableFetch {
            dataset: Arc::new(self.dataset.0),
            collate: self.collate,
            pool: pool.clone(),
            batch_size: self.batch_size.unwrap_or(1),
            drop_last: self.drop_last,
            on_error: self.on_sample_error,
        };
        Ok(finish(
            fetch,
            config,
            SamplerSource::None,
            pool,
            self.worker_init,
        ))
    }
}

impl<F: Fetch> DataLoader<F> {
    /// The options.
    pub fn config(&self) -> LoaderConfig {
        lock(&self.inner.config).clone()
    }

    /// The pool batches are leased from.
    pub fn pool(&self) -> &PinnedPool {
        &self.inner.pool
    }

    /// Batches per epoch (`None` for iterable datasets, whose length is unknown).
    pub fn len(&self) -> Option<usize> {
        lock(&self.inner.sampler).get().map(|s| s.len())
    }

    /// Whether an epoch yields no batch (`None` for iterable datasets).
    pub fn is_empty(&self) -> Option<bool> {
        self.len().map(|n| n == 0)
    }

    /// Sets the epoch the next iteration runs (reaches the sampler's `set_epoch`, as
    /// `DistributedSampler.set_epoch` in PyTorch). Without it, each iteration runs the epoch
    /// after the previous one, starting from 0.
    pub fn set_epoch(&self, epoch: u64) {
        *lock(&self.inner.next) = (epoch, None);
    }

    /// Counters since the loader was built.
    pub fn stats(&self) -> LoaderStats {
        let mut s = lock(&self.inner.stats).clone();
        s.worker_restarts += lock(&self.inner.persistent).as_ref().map_or(0, |e| {
            e.shared.restarts.load(std::sync::atomic::Ordering::Relaxed)
        });
        s.pool = self.inner.pool.stats();
        s
    }

    /// Resets the counters (not the pool's).
    pub fn reset_stats(&self) {
        *lock(&self.inner.stats) = LoaderStats::default();
    }

    /// Where the loader stands: the epoch in progress and which of its batches were
    /// delivered. Serialise it with serde in a checkpoint.
    pub fn state_dict(&self) -> Result<LoaderState, LoaderError> {
        if !self.inner.fetch.indexed() {
            return Err(LoaderError::State(
                "iterable datasets have no resumable position".into(),
            ));
        }
        let p = lock(&self.inner.progress).clone();
        let (next_epoch, pending) = lock(&self.inner.next).clone();
        let cfg = lock(&self.inner.config);
        let num_batches = self.len().unwrap_or(0) as u64;
        // Mid-epoch: the progress. Between epochs: the next epoch, with what a restore left.
        let (epoch, prefix, extra) =
            if p.num_batches > 0 && !p.complete() && p.epoch + 1 == next_epoch {
                (p.epoch, p.prefix, p.extra.iter().copied().collect())
            } else if let Some(r) = pending {
                (r.epoch, r.prefix, r.extra.iter().copied().collect())
            } else {
                (next_epoch, 0, Vec::new())
            };
        Ok(LoaderState {
            version: 1,
            epoch,
            seed: cfg.seed,
            dataset_len: self.inner.fetch.dataset_len(),
            num_batches,
            done_prefix: prefix,
            done_extra: extra,
        })
    }

    /// Restores a position saved by [`state_dict`](DataLoader::state_dict): the next
    /// iteration runs the saved epoch and yields exactly the batches not delivered then.
    pub fn load_state_dict(&self, state: &LoaderState) -> Result<(), LoaderError> {
        if !self.inner.fetch.indexed() {
            return Err(LoaderError::State(
                "iterable datasets have no resumable position".into(),
            ));
        }
        if state.version != 1 {
            return Err(LoaderError::State(format!(
                "unknown state version {}",
                state.version
            )));
        }
        let len = self.inner.fetch.dataset_len();
        if state.dataset_len != len {
            return Err(LoaderError::State(format!(
                "state was taken on a dataset of {} samples, this one has {len}",
                state.dataset_len
            )));
        }
        {
            let mut src = lock(&self.inner.sampler);
            let mut cfg = lock(&self.inner.config);
            if let SamplerSource::Builtin {
                len,
                shuffle,
                batch_size,
                drop_last,
                ..
            } = &*src
            {
                if cfg.seed != state.seed {
                    *src = SamplerSource::builtin(
                        *len,
                        *shuffle,
                        *batch_size,
                        *drop_last,
                        state.seed,
                    )?;
                }
            } else if cfg.seed != state.seed {
                tracing::warn!(target: "longshore::loader", "restoring a state with another seed: the user sampler keeps its own seed");
            }
            cfg.seed = state.seed;
            let n = src.get().map_or(0, |s| s.len()) as u64;
            if n != state.num_batches {
                return Err(LoaderError::State(format!(
                    "state has {} batches per epoch, this loader {n} (batch_size or drop_last differ?)",
                    state.num_batches
                )));
            }
        }
        let mut p = Progress::new(state.epoch, state.num_batches);
        p.prefix = state.done_prefix.min(state.num_batches);
        p.extra = state
            .done_extra
            .iter()
            .copied()
            .filter(|&s| s >= p.prefix && s < state.num_batches)
            .collect();
        *lock(&self.inner.progress) = p.clone();
        *lock(&self.inner.next) = (state.epoch, Some(p));
        Ok(())
    }

    /// Iterates one epoch.
    pub fn iter(&self) -> LoaderIter<F> {
        LoaderIter::new(self.inner.clone())
    }
}

impl<F: Fetch> IntoIterator for &DataLoader<F> {
    type Item = Result<F::Output, LoaderError>;
    type IntoIter = LoaderIter<F>;
    fn into_iter(self) -> LoaderIter<F> {
        self.iter()
    }
}

fn worker_body<F: Fetch>(
    fetch: Arc<F>,
    init: Option<WorkerInit>,
    num_workers: usize,
    seed: u64,
) -> WorkerBody<F::Output> {
    Arc::new(move |ctx: WorkerCtx<F::Output>| {
        let fetch: &F = &fetch;
        let id = ctx.id;
        let mut epoch: Option<u64> = None;
        let mut guard: Option<WorkerGuard> = None;
        let mut state: Option<F::Worker<'_>> = None;
        let mut needs_init = true;
        let mut init_failed: Option<String> = None;
        let mut stream_broken = false;
        while let Some(task) = ctx.next_task() {
            if epoch != Some(task.epoch) {
                state = None;
                stream_broken = false;
            }
            if state.is_none() {
                let info = WorkerInfo {
                    id,
                    num_workers,
                    seed: worker_seed(seed, task.epoch, id),
                };
                drop(guard.take());
                guard = Some(longshore_data::worker::enter(info));
                if needs_init {
                    needs_init = false;
                    init_failed = None;
                    if let Some(f) = &init {
                        if let Err(m) = guarded(|| f(&info)) {
                            init_failed = Some(format!("worker_init panicked: {m}"));
                        }
                    }
                }
                match guarded(|| fetch.worker(info)) {
                    Ok(s) => state = Some(s),
                    Err(m) => {
                        init_failed = Some(format!("creating the worker's stream panicked: {m}"))
                    }
                }
                epoch = Some(task.epoch);
            }
            let span = tracing::trace_span!(target: "longshore::loader", "batch", epoch = task.epoch, seq = task.seq, samples = task.indices.len());
            let _entered = span.enter();
            let t0 = Instant::now();
            let (outcome, skipped) = if let Some(m) = &init_failed {
                (
                    Outcome::Failed(LoaderError::WorkerPanicked {
                        worker: id,
                        batch: task.seq,
                        message: m.clone(),
                    }),
                    0,
                )
            } else if stream_broken {
                (Outcome::Exhausted, 0)
            } else {
                let cancelled = || ctx.cancelled(&task);
                let st = state.as_mut().expect("state set above");
                match guarded(|| fetch.fetch(st, &task, &cancelled)) {
                    Ok(r) => r,
                    Err(message) => {
                        tracing::error!(target: "longshore::loader", panic = %message, worker.id = id, batch.seq = task.seq, "worker panicked");
                        ctx.note_restart();
                        needs_init = true;
                        if fetch.indexed() {
                            state = None;
                        } else {
                            // A stream cannot be resumed where it panicked: end this worker's share.
                            stream_broken = true;
                        }
                        (
                            Outcome::Failed(LoaderError::WorkerPanicked {
                                worker: id,
                                batch: task.seq,
                                message,
                            }),
                            0,
                        )
                    }
                }
            };
            let reply = Reply {
                generation: task.generation,
                seq: task.seq,
                worker: id,
                outcome,
                busy: t0.elapsed(),
                skipped,
            };
            if !ctx.reply(reply) {
                break;
            }
        }
        drop(state);
        drop(guard);
    })
}

/// One epoch of a [`DataLoader`]: yields `Result<batch, LoaderError>`.
///
/// Dropping it mid-epoch stops the workers (bounded by the loader's `shutdown_timeout`) and
/// returns every leased buffer to the pool; with `persistent_workers` the workers are kept
/// for the next epoch and only the outstanding work is cancelled.
pub struct LoaderIter<F: Fetch> {
    inner: Arc<Inner<F>>,
    engine: Option<Engine<F::Output>>,
    config: LoaderConfig,
    epoch: u64,
    generation: u64,
    /// Batches not yet sent: (position, indices). Empty indices for iterable datasets.
    to_send: VecDeque<(u64, Vec<usize>)>,
    /// Positions sent, in delivery order (in-order mode).
    order: VecDeque<u64>,
    sent_to: HashMap<u64, usize>,
    /// In-order mode: the indices of batches sent and not yet delivered, so a finished batch
    /// held in the reorder buffer can be given back to a starved pool and loaded again.
    indices_of: HashMap<u64, Vec<usize>>,
    outstanding: Vec<usize>,
    in_flight: usize,
    reorder: BTreeMap<u64, Outcome<F::Output>>,
    rr: usize,
    /// Iterable mode: workers whose stream has not ended, and the next position to assign.
    active: Vec<bool>,
    next_seq: u64,
    finished: bool,
    broken: bool,
    started: Option<Instant>,
    last_yield: Instant,
}

impl<F: Fetch> fmt::Debug for LoaderIter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderIter")
            .field("epoch", &self.epoch)
            .field("to_send", &self.to_send.len())
            .field("in_flight", &self.in_flight)
            .field("reorder", &self.reorder.len())
            .field("finished", &self.finished)
            .finish()
    }
}

impl<F: Fetch> LoaderIter<F> {
    fn new(inner: Arc<Inner<F>>) -> Self {
        let config = lock(&inner.config).clone();
        let (epoch, restored) = {
            let mut next = lock(&inner.next);
            let e = next.0;
            let r = next.1.take();
            next.0 = e + 1;
            (e, r)
        };
        let indexed = inner.fetch.indexed();
        let mut to_send = VecDeque::new();
        let mut num_batches = 0u64;
        if indexed {
            let mut src = lock(&inner.sampler);
            if let Some(s) = src.get() {
                s.set_epoch(epoch);
                for (i, b) in s.iter().enumerate() {
                    let seq = i as u64;
                    if restored.as_ref().is_none_or(|r| !r.is_done(seq)) {
                        to_send.push_back((seq, b));
                    }
                }
                num_batches = s.len() as u64;
            }
        }
        *lock(&inner.progress) = restored.unwrap_or_else(|| Progress::new(epoch, num_batches));
        lock(&inner.stats).epochs += 1;
        let span = tracing::debug_span!(target: "longshore::loader", "epoch", epoch, batches = num_batches);
        let _e = span.enter();
        // Workers: the persistent set, or a new one; none for map-style with num_workers 0.
        let n = config.num_workers;
        let threads = if n == 0 && indexed { 0 } else { n.max(1) };
        let mut it = Self {
            inner: inner.clone(),
            engine: None,
            config,
            epoch,
            generation: 0,
            to_send,
            order: VecDeque::new(),
            sent_to: HashMap::new(),
            indices_of: HashMap::new(),
            outstanding: vec![0; threads],
            in_flight: 0,
            reorder: BTreeMap::new(),
            rr: 0,
            active: vec![true; threads],
            next_seq: 0,
            finished: false,
            broken: false,
            started: None,
            last_yield: Instant::now(),
        };
        if threads > 0 {
            let existing = if it.config.persistent_workers {
                lock(&inner.persistent).take()
            } else {
                None
            };
            let engine = match existing {
                Some(e) => Ok(e),
                None => Engine::start(
                    threads,
                    worker_body(
                        inner.fetch.clone(),
                        inner.worker_init.clone(),
                        threads,
                        it.config.seed,
                    ),
                    it.config.shutdown_timeout,
                ),
            };
            match engine {
                Ok(e) => {
                    it.generation = e.new_generation();
                    it.engine = Some(e);
                }
                Err(e) => {
                    it.finished = true;
                    it.reorder.insert(0, Outcome::Failed(e));
                    it.order.push_back(0);
                }
            }
        }
        it
    }

    fn capacity(&self) -> usize {
        self.outstanding.len() * self.config.prefetch_factor
    }

    /// Sends tasks until the in-flight bound is reached.
    fn fill(&mut self) -> Result<(), LoaderError> {
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        let indexed = self.inner.fetch.indexed();
        let n = self.outstanding.len();
        // `in_flight` counts every batch sent and not yet yielded, including those held back in
        // the reorder buffer (as PyTorch's outstanding tasks do): otherwise sent-but-undelivered
        // batches, and their pool memory, could reach twice `num_workers * prefetch_factor`.
        while self.in_flight < self.capacity() {
            let (seq, indices) = if indexed {
                match self.to_send.pop_front() {
                    Some(t) => t,
                    None => break,
                }
            } else {
                if !self.active.iter().any(|a| *a) {
                    break;
                }
                let s = self.next_seq;
                self.next_seq += 1;
                (s, Vec::new())
            };
            // In order: round-robin (PyTorch). Out of order: the least loaded worker.
            let w = if self.config.in_order || !indexed {
                let mut w = self.rr % n;
                while !self.active[w] {
                    w = (w + 1) % n;
                }
                self.rr = w + 1;
                w
            } else {
                (0..n)
                    .min_by_key(|&w| (self.outstanding[w], (w + n - self.rr % n) % n))
                    .unwrap_or(0)
            };
            if self.config.in_order && indexed {
                self.indices_of.insert(seq, indices.clone());
            }
            engine.send(
                w,
                Task {
                    generation: self.generation,
                    epoch: self.epoch,
                    seq,
                    indices,
                },
            )?;
            self.outstanding[w] += 1;
            self.in_flight += 1;
            self.sent_to.insert(seq, w);
            self.order.push_back(seq);
        }
        let mut stats = lock(&self.inner.stats);
        stats.peak_in_flight = stats.peak_in_flight.max(self.in_flight);
        Ok(())
    }

    fn absorb(&mut self, r: Reply<F::Output>) {
        // The worker is free for more; the batch still counts as in flight (it holds a lease)
        // until it is yielded, as PyTorch counts outstanding tasks.
        if let Some(w) = self.sent_to.remove(&r.seq) {
            self.outstanding[w] -= 1;
        }
        if matches!(r.outcome, Outcome::Exhausted) {
            self.active[r.worker] = false;
        }
        {
            let mut s = lock(&self.inner.stats);
            s.worker_busy += r.busy;
            s.skipped_samples += r.skipped;
        }
        self.reorder.insert(r.seq, r.outcome);
        let mut s = lock(&self.inner.stats);
        s.peak_reorder = s.peak_reorder.max(self.reorder.len());
    }

    /// Waits for a reply, bounded by the timeout; detects dead workers instead of hanging.
    fn wait_reply(&mut self, awaited: Option<u64>) -> Result<(), LoaderError> {
        if self.engine.is_none() {
            return Ok(());
        }
        let t0 = Instant::now();
        loop {
            // With finished batches held back, check often whether they starve the pool.
            let slice = if self.reorder.is_empty() {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(20)
            };
            let wait = match self.config.timeout {
                Some(t) => (t.saturating_sub(t0.elapsed())).min(slice),
                None => slice,
            };
            let Some(engine) = &self.engine else {
                return Ok(());
            };
            match engine.recv(Some(wait)) {
                Ok(r) => {
                    self.absorb(r);
                    return Ok(());
                }
                Err(RecvTimeoutError::Timeout) => {
                    let seq = awaited.or_else(|| self.order.front().copied()).unwrap_or(0);
                    let worker = self.sent_to.get(&seq).copied().unwrap_or(0);
                    if let Some(t) = self.config.timeout {
                        if t0.elapsed() >= t {
                            return Err(LoaderError::Timeout {
                                worker,
                                batch: seq,
                                waited: t0.elapsed(),
                            });
                        }
                    }
                    let dead = engine.dead_workers();
                    if let Some(&w) = dead.iter().find(|&&w| self.outstanding[w] > 0) {
                        let batch = self
                            .sent_to
                            .iter()
                            .find(|(_, ww)| **ww == w)
                            .map_or(seq, |(s, _)| *s);
                        return Err(LoaderError::WorkerGone { worker: w, batch });
                    }
                    self.relieve_budget()?;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let seq = awaited.unwrap_or(0);
                    return Err(LoaderError::WorkerGone {
                        worker: self.sent_to.get(&seq).copied().unwrap_or(0),
                        batch: seq,
                    });
                }
            }
        }
    }

    /// In-order mode, while the awaited batch does not come: if the pool has requests blocked
    /// on its budget and the reorder buffer holds later batches in pool memory, those batches
    /// may be what starves the awaited one (its worker waits for budget they hold: a deadlock
    /// until the pool's wait timeout). Gives the latest such batch back to the pool and loads
    /// it again later.
    fn relieve_budget(&mut self) -> Result<(), LoaderError> {
        if !self.config.in_order || self.inner.pool.stats().waiting == 0 {
            return Ok(());
        }
        let fetch = &self.inner.fetch;
        let Some(seq) = self.reorder.iter().rev().find_map(|(&s, o)| match o {
            Outcome::Batch(b) if fetch.output_bytes(b) > 0 && self.indices_of.contains_key(&s) => {
                Some(s)
            }
            _ => None,
        }) else {
            return Ok(());
        };
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        drop(self.reorder.remove(&seq));
        let indices = self.indices_of.get(&seq).cloned().unwrap_or_default();
        let n = self.outstanding.len();
        let w = (0..n).min_by_key(|&w| self.outstanding[w]).unwrap_or(0);
        tracing::debug!(target: "longshore::loader", reloaded = true, batch.seq = seq, worker.id = w, "pool budget starved: reloading a held-back batch later");
        engine.send(
            w,
            Task {
                generation: self.generation,
                epoch: self.epoch,
                seq,
                indices,
            },
        )?;
        // The batch was already counted in `in_flight` (it is sent and not yielded).
        self.outstanding[w] += 1;
        self.sent_to.insert(seq, w);
        lock(&self.inner.stats).reloaded += 1;
        Ok(())
    }

    /// Loads the next batch on the calling thread (`num_workers == 0`).
    fn next_sync(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        let (seq, indices) = self.to_send.pop_front()?;
        let info = WorkerInfo {
            id: 0,
            num_workers: 1,
            seed: worker_seed(self.config.seed, self.epoch, 0),
        };
        let _guard = longshore_data::worker::enter(info);
        let task = Task {
            generation: 0,
            epoch: self.epoch,
            seq,
            indices,
        };
        let fetch = &*self.inner.fetch;
        let t0 = Instant::now();
        let outcome = match guarded(|| {
            let mut w = fetch.worker(info);
            fetch.fetch(&mut w, &task, &|| false)
        }) {
            Ok((o, skipped)) => {
                lock(&self.inner.stats).skipped_samples += skipped;
                o
            }
            Err(message) => Outcome::Failed(LoaderError::WorkerPanicked {
                worker: 0,
                batch: seq,
                message,
            }),
        };
        lock(&self.inner.stats).worker_busy += t0.elapsed();
        Some((seq, outcome))
    }

    /// The next delivered outcome of this epoch, or `None` at its end.
    fn next_outcome(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        if self.engine.is_none() {
            if self.finished {
                let seq = self.order.pop_front()?;
                return self.reorder.remove(&seq).map(|o| (seq, o));
            }
            return self.next_sync();
        }
        if let Err(e) = self.fill() {
            return Some((0, Outcome::Failed(e)));
        }
        loop {
            if self.config.in_order || !self.inner.fetch.indexed() {
                let &seq = self.order.front()?;
                if let Some(o) = self.reorder.remove(&seq) {
                    self.order.pop_front();
                    self.in_flight -= 1;
                    self.indices_of.remove(&seq);
                    return Some((seq, o));
                }
                if let Err(e) = self.wait_reply(Some(seq)) {
                    return Some((seq, Outcome::Failed(e)));
                }
            } else {
                if let Some((&seq, _)) = self.reorder.iter().next() {
                    let o = self.reorder.remove(&seq).expect("present");
                    self.order.retain(|s| *s != seq);
                    self.in_flight -= 1;
                    return Some((seq, o));
                }
                if self.in_flight == 0 {
                    return None;
                }
                if let Err(e) = self.wait_reply(None) {
                    let seq = self.order.front().copied().unwrap_or(0);
                    return Some((seq, Outcome::Failed(e)));
                }
            }
        }
    }

    fn end_epoch(&mut self, broken: bool) {
        self.finished = true;
        self.broken |= broken;
        self.to_send.clear();
        self.order.clear();
        self.indices_of.clear();
        self.release_engine();
    }
}

impl<F: Fetch> LoaderIter<F> {
    fn release_engine(&mut self) {
        let Some(mut engine) = self.engine.take() else {
            return;
        };
        // Leases held in the reorder buffer go back to the pool now.
        self.reorder.clear();
        let restarts = engine
            .shared
            .restarts
            .swap(0, std::sync::atomic::Ordering::Relaxed);
        lock(&self.inner.stats).worker_restarts += restarts;
        if self.config.persistent_workers && !self.broken {
            engine.new_generation();
            *lock(&self.inner.persistent) = Some(engine);
        } else {
            engine.shutdown();
        }
    }
}

impl<F: Fetch> Iterator for LoaderIter<F> {
    type Item = Result<F::Output, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        let now = Instant::now();
        let since_last = if self.started.is_some() {
            now - self.last_yield
        } else {
            Duration::ZERO
        };
        self.started.get_or_insert(now);
        loop {
            if self.finished && self.engine.is_none() && self.order.is_empty() {
                return None;
            }
            let next = self.next_outcome();
            let Some((seq, outcome)) = next else {
                self.end_epoch(false);
                return None;
            };
            let end = Instant::now();
            // A batch counts as delivered (for resume) unless it never came back at all.
            let delivered = !matches!(
                outcome,
                Outcome::Failed(
                    LoaderError::Timeout { .. }
                        | LoaderError::WorkerGone { .. }
                        | LoaderError::Spawn { .. }
                )
            );
            let item = match outcome {
                Outcome::Batch(b) => Some(Ok(b)),
                Outcome::Empty | Outcome::Exhausted => None,
                Outcome::Failed(e) => Some(Err(e)),
            };
            if delivered && self.inner.fetch.indexed() {
                lock(&self.inner.progress).mark(seq);
            }
            let Some(item) = item else { continue };
            {
                let mut s = lock(&self.inner.stats);
                s.batches += 1;
                match &item {
                    Ok(b) => s.samples += self.inner.fetch.output_samples(b) as u64,
                    Err(_) => s.errors += 1,
                }
                s.consumer_wait += end - now;
                s.consumer_time += since_last + (end - now);
            }
            self.last_yield = end;
            if let Err(e) = &item {
                let fatal = match e {
                    LoaderError::WorkerPanicked { .. } => {
                        self.config.on_worker_panic == WorkerPanicPolicy::Fail
                    }
                    LoaderError::Timeout { .. }
                    | LoaderError::WorkerGone { .. }
                    | LoaderError::Spawn { .. } => true,
                    _ => false,
                };
                if fatal {
                    tracing::error!(target: "longshore::loader", error = %e, epoch = self.epoch, "ending the epoch");
                    self.end_epoch(true);
                }
            }
            return Some(item);
        }
    }
}

impl<F: Fetch> Drop for LoaderIter<F> {
    fn drop(&mut self) {
        self.release_engine();
    }
}
