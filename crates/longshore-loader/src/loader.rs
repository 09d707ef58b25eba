//! [`DataLoader`]: the built loader, its shared state and its resumable position.
//!
//! Its shared state lives in `shared.rs` (lock order documented there).

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use longshore_data::{Batch, DirectCollate, FetchCollate, StackCollate};
use longshore_host::{PinnedPool, PoolBuffer};
use longshore_transfer::GpuTopology;

use crate::boxed::BoxedFetch;
use crate::config::{LoaderConfig, LoaderWarning};
use crate::error::LoaderError;
use crate::fetch::{Fetch, ItemFetch, IterableFetch, MapFetch};
use crate::iter::LoaderIter;
use crate::placement::{Placement, ThreadSetup, WorkerPlacement, resolve};
use crate::shared::{Inner, Parts, PlacementState, Plan, SamplerSource};
use crate::state::{LoaderState, Progress};
use crate::stats::LoaderStats;
use crate::sync::lock;

/// A multi-worker data loader with PyTorch's options: `for batch in &loader`.
///
/// Built with [`DataLoader::builder`] (map-style datasets) or [`DataLoader::iterable`].
/// Each iteration is one epoch; iterating again runs the next epoch (reshuffled when
/// `shuffle` is on). Workers are threads: no pickling, no shared-memory files, no GIL.
///
/// To name a loader's type (to return it from a function), use the aliases
/// [`StackLoader`], [`MapLoader`], [`DirectLoader`], [`IterableLoader`] and
/// [`UnbatchedLoader`].
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
    pub(crate) inner: Arc<Inner<F>>,
}

/// A loader over a map-style dataset `D` whose items are collated by the [`Collate`]
/// `C` (default [`StackCollate`]): what `DataLoader::builder(d).collate(c).build()` returns.
///
/// ```
/// use longshore_data::{PadCollate, VecDataset};
/// use longshore_loader::{DataLoader, LoaderError, MapLoader, StackLoader};
///
/// fn tabular(rows: Vec<([f32; 4], i64)>) -> Result<StackLoader<VecDataset<([f32; 4], i64)>>, LoaderError> {
///     DataLoader::builder(VecDataset::new(rows)).batch_size(8).build()
/// }
/// fn ragged(rows: Vec<(Vec<f32>,)>) -> Result<MapLoader<VecDataset<(Vec<f32>,)>, PadCollate>, LoaderError> {
///     DataLoader::builder(VecDataset::new(rows)).batch_size(2).collate(PadCollate::new(0.0)).build()
/// }
/// assert_eq!(tabular(vec![([0.0; 4], 1); 16])?.len(), Some(2));
/// assert_eq!(ragged(vec![(vec![1.0],), (vec![1.0, 2.0],)])?.len(), Some(1));
/// # Ok::<(), LoaderError>(())
/// ```
///
/// [`Collate`]: longshore_data::Collate
pub type MapLoader<D, C = StackCollate> = DataLoader<MapFetch<D, FetchCollate<C>>>;

/// A loader over a map-style dataset `D` with the default stacking collate: what
/// `DataLoader::builder(d).build()` returns.
pub type StackLoader<D> = MapLoader<D, StackCollate>;

/// A loader over a [`DirectDataset`](longshore_data::DirectDataset) `D` whose rows are
/// written straight into the batch: `DataLoader::builder(d).collate(DirectCollate::new())`.
pub type DirectLoader<D> = DataLoader<MapFetch<D, DirectCollate>>;

/// A loader over an iterable dataset `D`, collated by `C` (default [`StackCollate`]): what
/// `DataLoader::iterable(d).build()` returns.
pub type IterableLoader<D, C = StackCollate> = DataLoader<IterableFetch<D, C>>;

/// A loader of any dataset whose batches are `T` (default: collated batches in pooled
/// memory), the dataset's type erased: what the builders' `build_boxed` return
/// ([`DataLoaderBuilder::build_boxed`](crate::DataLoaderBuilder::build_boxed)). Loaders of
/// different datasets then share one type (a `Vec` of them, a field chosen at run time, a
/// binding to another language); each batch costs one more virtual call.
pub type BoxedLoader<T = Batch<PoolBuffer>> = DataLoader<BoxedFetch<T>>;

/// A loader without automatic batching (PyTorch's `batch_size=None`) over a map-style
/// dataset `D`: what `DataLoader::builder(d).build_unbatched()` returns.
pub type UnbatchedLoader<D> = DataLoader<ItemFetch<D>>;

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
            .field("config", &lock(&self.inner.plan).config)
            .field("pool", &self.inner.pool)
            .finish()
    }
}

impl<F: Fetch> DataLoader<F> {
    pub(crate) fn from_parts(parts: Parts<F>) -> Self {
        let Parts {
            fetch,
            config,
            sampler,
            pool,
            worker_init,
            topology,
            own_pool,
        } = parts;
        let explicit = topology.is_some();
        let threads = ThreadSetup::new(config.worker_priority);
        let loader = DataLoader {
            inner: Arc::new(Inner {
                fetch: Arc::new(fetch),
                pool,
                worker_init,
                plan: Mutex::new(Plan {
                    config,
                    sampler,
                    next_epoch: 0,
                    restored: None,
                    prepared: None,
                    revision: 0,
                }),
                progress: Mutex::new(Progress::default()),
                stats: Mutex::new(LoaderStats::default()),
                persistent: Mutex::new(None),
                threads,
                block_bytes: AtomicUsize::new(crate::iter::UNKNOWN_BLOCK),
                placement: Mutex::new(PlacementState {
                    topology: None,
                    explicit: false,
                    own_pool,
                    resolved: WorkerPlacement::default(),
                }),
            }),
        };
        loader.place(topology, explicit);
        loader
    }

    /// Where the workers run (the CPUs they are pinned to, and why), as settled for the GPU
    /// the loader delivers to. Also in [`LoaderStats::placement`].
    pub fn placement(&self) -> WorkerPlacement {
        lock(&self.inner.placement).resolved.clone()
    }

    /// Sets the topology of the GPU the batches go to, for
    /// [`Placement::GpuLocal`](crate::Placement::GpuLocal); workers (persistent ones too)
    /// move before their next batch. `None` forgets a topology given before, so that the next
    /// [`to_device`](DataLoader::to_device) learns it from its device again.
    pub fn set_gpu_topology(&self, topology: Option<GpuTopology>) {
        let explicit = topology.is_some();
        if !explicit {
            lock(&self.inner.placement).explicit = false;
        }
        self.place(topology, explicit);
    }

    /// Places the workers (and the loader's own pool) for delivery to `device`, as
    /// [`to_device`](DataLoader::to_device) does: for adapters that deliver to a device
    /// themselves (the nvJPEG decoder of longshore-vision). A topology given with
    /// [`set_gpu_topology`](DataLoader::set_gpu_topology) is kept; the Cpu device has none.
    pub fn place_for(&self, device: &longshore_transfer::Device) {
        self.place(device.topology(), false);
    }

    /// Settles the placement for `topology` (a topology learnt from a device, `explicit`
    /// false, does not replace one the user gave) and hands it to the workers and the pool.
    pub(crate) fn place(&self, topology: Option<GpuTopology>, explicit: bool) {
        let requested = lock(&self.inner.plan).config.cpu_placement.clone();
        let mut st = lock(&self.inner.placement);
        if st.explicit && !explicit {
            return;
        }
        st.explicit = explicit;
        st.topology = topology;
        let allowed = longshore_host::thread::process_affinity().unwrap_or_else(|e| {
            tracing::warn!(target: "longshore::loader", error = %e, "cannot read the cpus allowed to this process; assuming any");
            longshore_host::CpuSet::from_words(&[u64::MAX; 64])
        });
        let resolved = resolve(&requested, st.topology.as_ref(), &allowed);
        if resolved == st.resolved {
            // The same as before (`to_device` every epoch): nothing to log or hand out.
            return;
        }
        let gpu_local = requested == Placement::GpuLocal;
        let multi_node = st.topology.as_ref().is_some_and(GpuTopology::multi_node);
        match &resolved.cpus {
            Some(cpus) => {
                tracing::info!(target: "longshore::loader", cpus = %cpus, reason = %resolved.reason, "workers pinned")
            }
            None if gpu_local && multi_node => {
                tracing::warn!(target: "longshore::loader", reason = %resolved.reason, "workers not pinned")
            }
            None => {
                tracing::debug!(target: "longshore::loader", reason = %resolved.reason, "workers not pinned")
            }
        }
        if st.own_pool {
            let node = if gpu_local && multi_node {
                resolved.numa_node
            } else {
                None
            };
            self.inner.pool.set_numa_node(node);
        }
        self.inner.threads.set_cpus(resolved.cpus.clone());
        st.resolved = resolved;
    }

    /// The options, and what they became on this machine (see [`LoaderConfig`]).
    pub fn config(&self) -> LoaderConfig {
        lock(&self.inner.plan).config.clone()
    }

    /// What looked wrong when the loader was built (also logged then with `tracing::warn!`,
    /// target `"longshore::loader"`): `pin_memory` without page-locked memory, more workers
    /// than cores. Empty when all is well.
    pub fn warnings(&self) -> Vec<LoaderWarning> {
        lock(&self.inner.plan).config.warnings.clone()
    }

    /// The pool batches are leased from.
    pub fn pool(&self) -> &PinnedPool {
        &self.inner.pool
    }

    /// Batches per epoch (`None` for iterable datasets, whose length is unknown).
    pub fn len(&self) -> Option<usize> {
        lock(&self.inner.plan).sampler.len()
    }

    /// Whether an epoch yields no batch (`None` for iterable datasets).
    pub fn is_empty(&self) -> Option<bool> {
        self.len().map(|n| n == 0)
    }

    /// Sets the epoch the next iteration runs (reaches the sampler's `set_epoch`, as
    /// `DistributedSampler.set_epoch` in PyTorch). Without it, each iteration runs the epoch
    /// after the previous one, starting from 0.
    ///
    /// The next epoch's first batches may already be loading
    /// ([`prefetch_next_epoch`](crate::DataLoaderBuilder::prefetch_next_epoch)): they were
    /// started for the epoch the loader would run next, so setting that same epoch keeps
    /// them and setting another discards them (they are never delivered).
    pub fn set_epoch(&self, epoch: u64) {
        let mut plan = lock(&self.inner.plan);
        plan.next_epoch = epoch;
        plan.restored = None;
    }

    /// Counters since the loader was built.
    pub fn stats(&self) -> LoaderStats {
        let mut s = lock(&self.inner.stats).clone();
        s.pool = self.inner.pool.stats();
        s.placement = self.placement();
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
        let (next_epoch, pending, seed, num_batches) = {
            let mut plan = lock(&self.inner.plan);
            let n = plan.sampler.len().unwrap_or(0) as u64;
            (plan.next_epoch, plan.restored.clone(), plan.config.seed, n)
        };
        let p = lock(&self.inner.progress).clone();
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
            seed,
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
        let mut plan = lock(&self.inner.plan);
        let plan = &mut *plan;
        // Everything is checked before anything changes: a refused state leaves the loader as
        // it was (its seed and sampler included).
        let reseeded: Option<SamplerSource> = match &plan.sampler {
            SamplerSource::Builtin {
                len,
                shuffle,
                batch_size,
                drop_last,
                ..
            } if plan.config.seed != state.seed => Some(SamplerSource::builtin(
                *len,
                *shuffle,
                *batch_size,
                *drop_last,
                state.seed,
            )?),
            _ => None,
        };
        let mut reseeded = reseeded;
        let n = match reseeded.as_mut() {
            Some(s) => s.len(),
            None => plan.sampler.len(),
        }
        .unwrap_or(0) as u64;
        if n != state.num_batches {
            return Err(LoaderError::State(format!(
                "state has {} batches per epoch, this loader {n} (batch_size or drop_last differ?)",
                state.num_batches
            )));
        }
        if let Some(sampler) = reseeded {
            plan.sampler = sampler;
            plan.prepared = None;
        } else if plan.config.seed != state.seed {
            tracing::warn!(target: "longshore::loader", "restoring a state with another seed: the user sampler keeps its own seed");
        }
        plan.config.seed = state.seed;
        // A next epoch started ahead is not what the restored position runs.
        plan.revision += 1;
        let mut p = Progress::new(state.epoch, state.num_batches);
        p.prefix = state.done_prefix.min(state.num_batches);
        p.extra = state
            .done_extra
            .iter()
            .copied()
            .filter(|&s| s >= p.prefix && s < state.num_batches)
            .collect();
        // Lock order: plan (held) -> progress.
        *lock(&self.inner.progress) = p.clone();
        plan.next_epoch = state.epoch;
        plan.restored = Some(p);
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
