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
use crate::shared::{Inner, Parts, PlacementState, Plan, SamplerSource, stream_layout};
use crate::state::{LoaderState, Progress, STATE_VERSION, StreamProgress, StreamState};
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
            sources,
        } = parts;
        let explicit = topology.is_some();
        let threads = ThreadSetup::new(config.options.worker_priority);
        let mut stats = LoaderStats::default();
        if let Some(c) = &sources {
            stats.sources = vec![0; c.count];
        }
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
                stats: Mutex::new(stats),
                persistent: Mutex::new(None),
                threads,
                block_bytes: AtomicUsize::new(crate::iter::UNKNOWN_BLOCK),
                sources,
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
        let requested = lock(&self.inner.plan).config.options.cpu_placement.clone();
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

    /// Batches per epoch. For an iterable dataset, what the dataset says its next epoch yields
    /// ([`IterableDataset::begin_epoch`](longshore_data::IterableDataset::begin_epoch), for
    /// the loader's batch size, `drop_last` and workers; a resumed epoch counts its batches
    /// delivered before the checkpoint), or `None` when it does not know.
    pub fn len(&self) -> Option<usize> {
        if self.inner.fetch.indexed() {
            return lock(&self.inner.plan).sampler.len();
        }
        let (layout, base, resume) = {
            let plan = lock(&self.inner.plan);
            match plan.restored.as_ref().and_then(|r| r.stream.as_ref()) {
                Some(s) => (Some(s.layout), s.base, s.resume.clone()),
                None => (
                    stream_layout(&*self.inner.fetch, &plan.config, plan.next_epoch),
                    0,
                    None,
                ),
            }
        };
        match self.inner.fetch.begin_epoch(&layout?, resume.as_ref()) {
            Ok(n) => n.map(|n| (base + n) as usize),
            Err(e) => {
                tracing::warn!(target: "longshore::loader", error = %crate::error::chain(&e), "the dataset cannot lay out its next epoch");
                None
            }
        }
    }

    /// Whether an epoch yields no batch (`None` when [`len`](DataLoader::len) is).
    pub fn is_empty(&self) -> Option<bool> {
        self.len().map(|n| n == 0)
    }

    /// Sets the epoch the next iteration runs (reaches the sampler's `set_epoch`, as
    /// `DistributedSampler.set_epoch` in PyTorch, and an iterable dataset's
    /// [`begin_epoch`](longshore_data::IterableDataset::begin_epoch) and workers'
    /// [`WorkerInfo::epoch`](longshore_data::WorkerInfo::epoch)). Without it, each iteration
    /// runs the epoch after the previous one, starting from 0.
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
        let mut s = LoaderStats::default();
        if let Some(c) = &self.inner.sources {
            s.sources = vec![0; c.count];
        }
        *lock(&self.inner.stats) = s;
    }

    /// Where the loader stands: the epoch in progress and which of its batches were
    /// delivered (for an iterable dataset, also the epoch's layout and the dataset's position,
    /// see [`LoaderState`]). Serialise it with serde in a checkpoint.
    ///
    /// # Errors
    /// [`LoaderError::Data`] when an iterable dataset cannot say where it stands.
    pub fn state_dict(&self) -> Result<LoaderState, LoaderError> {
        let (next_epoch, pending, config) = {
            let plan = lock(&self.inner.plan);
            (plan.next_epoch, plan.restored.clone(), plan.config.clone())
        };
        let p = lock(&self.inner.progress).clone();
        // Mid-epoch: the progress of an iterator (owner 0 is a restore not yet run, which
        // `set_epoch` may have dropped). Between epochs: the next epoch, with what a restore
        // left.
        let mid = p.owner != 0 && p.num_batches > 0 && !p.complete() && p.epoch + 1 == next_epoch;
        let current = if mid { Some(p) } else { pending };
        let (epoch, prefix, extra, num_batches, stream) = match &current {
            Some(r) => (
                r.epoch,
                r.prefix,
                r.extra.iter().copied().collect(),
                r.num_batches,
                r.stream.clone(),
            ),
            None => (next_epoch, 0, Vec::new(), 0, None),
        };
        let stream = match (stream, self.inner.fetch.indexed()) {
            (_, true) => None,
            // The epoch under way: where the dataset stands after what was delivered.
            (Some(s), false) if mid => Some(StreamState {
                layout: s.layout,
                position: self.inner.fetch.position(
                    &s.layout,
                    s.resume.as_ref(),
                    prefix.saturating_sub(s.base),
                )?,
            }),
            // Restored, not yet run: the restored position.
            (Some(s), false) => Some(StreamState {
                layout: s.layout,
                position: s.resume,
            }),
            (None, false) => {
                stream_layout(&*self.inner.fetch, &config, epoch).map(|layout| StreamState {
                    layout,
                    position: None,
                })
            }
        };
        // One rank's share: its number of ranks, batch size and the epoch's offset.
        let (num_replicas, batch_size, share_offset) = {
            let mut plan = lock(&self.inner.plan);
            match plan.sampler.get() {
                Some(s) if s.num_replicas().is_some() => {
                    // The offset of the epoch the state is of (a resumed epoch's, or 0).
                    let offset = match s.resumed_share() {
                        Some((e, offset)) if e == epoch => offset,
                        _ => 0,
                    };
                    (s.num_replicas(), Some(s.batch_size()), offset as u64)
                }
                _ => (None, None, 0),
            }
        };
        let num_batches = match (&current, self.inner.fetch.indexed()) {
            (_, true) => lock(&self.inner.plan).sampler.len().unwrap_or(0) as u64,
            (Some(_), false) => num_batches,
            // A fresh epoch's count is not asked of the dataset here (`len()` does).
            (None, false) => u64::MAX,
        };
        Ok(LoaderState {
            version: STATE_VERSION,
            epoch,
            seed: config.seed,
            dataset_len: self.inner.fetch.dataset_len(),
            num_batches,
            done_prefix: prefix,
            done_extra: extra,
            stream,
            num_replicas,
            batch_size,
            share_offset,
        })
    }

    /// Restores a position saved by [`state_dict`](DataLoader::state_dict): the next
    /// iteration runs the saved epoch and yields exactly the batches not delivered then.
    ///
    /// An iterable dataset resumes from its position (on another number of workers too, when
    /// the dataset supports it); one without a position is replayed up to the checkpoint,
    /// which needs the checkpoint's batch size, `drop_last` and workers.
    ///
    /// # Errors
    /// [`LoaderError::State`] naming what differs: a state of another version, of a map-style
    /// dataset given to a loader of an iterable one (or the reverse), of another dataset
    /// length or batch count, or a position the dataset refuses. A refused state leaves the
    /// loader as it was.
    pub fn load_state_dict(&self, state: &LoaderState) -> Result<(), LoaderError> {
        if state.version == 0 || state.version > STATE_VERSION {
            return Err(LoaderError::State(format!(
                "unknown state version {} (this loader reads 1 to {STATE_VERSION})",
                state.version
            )));
        }
        let indexed = self.inner.fetch.indexed();
        match (&state.stream, indexed) {
            (Some(_), true) => {
                return Err(LoaderError::State(
                    "the state was taken on a loader of an iterable dataset, this loader's \
                     dataset is map-style"
                        .into(),
                ));
            }
            (None, false) => {
                return Err(LoaderError::State(
                    "the state was taken on a loader of a map-style dataset, this loader's \
                     dataset is iterable"
                        .into(),
                ));
            }
            (Some(stream), false) => return self.load_stream_state(state, stream),
            (None, true) => {}
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
        // A checkpoint of one rank's share (a DistributedSampler): on another number of ranks
        // or batch size, the epoch resumes from what every rank together consumed.
        let share = match (state.num_replicas, plan.sampler.get()) {
            (Some(saved), Some(s)) if s.num_replicas().is_some() => {
                Some(share_resume(state, saved, &**s, len)?)
            }
            _ => None,
        };
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
        // The share's sampler takes the epoch's consumed entries out (and puts them back if
        // the state is refused below).
        let undo = match (&share, plan.sampler.get()) {
            (Some(r), Some(s)) => {
                let undo = (s.epoch(), s.resumed_share());
                s.resume_share(state.epoch, r.consumed)?;
                Some(undo)
            }
            _ => None,
        };
        let n = match reseeded.as_mut() {
            Some(s) => s.len(),
            None => plan.sampler.len(),
        }
        .unwrap_or(0) as u64;
        let (num_batches, prefix, extra) = match &share {
            Some(r) if r.elastic => (n, 0, Vec::new()),
            _ => (
                state.num_batches,
                state.done_prefix,
                state.done_extra.clone(),
            ),
        };
        if n != num_batches {
            if let (Some((epoch, resumed)), Some(s)) = (undo, plan.sampler.get()) {
                // Put back what resume_share changed: a refused state changes nothing.
                let (e, offset) = resumed.unwrap_or((state.epoch, 0));
                s.resume_share(e, offset)?;
                s.set_epoch(epoch);
            }
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
        let mut p = Progress::new(state.epoch, num_batches);
        p.prefix = prefix.min(num_batches);
        p.extra = extra
            .iter()
            .copied()
            .filter(|&s| s >= p.prefix && s < num_batches)
            .collect();
        // Lock order: plan (held) -> progress.
        *lock(&self.inner.progress) = p.clone();
        plan.next_epoch = state.epoch;
        plan.restored = Some(p);
        Ok(())
    }

    /// [`load_state_dict`](DataLoader::load_state_dict) of an iterable dataset's state.
    fn load_stream_state(
        &self,
        state: &LoaderState,
        stream: &StreamState,
    ) -> Result<(), LoaderError> {
        let mut config = lock(&self.inner.plan).config.clone();
        config.seed = state.seed;
        let Some(layout) = stream_layout(&*self.inner.fetch, &config, state.epoch) else {
            return Err(LoaderError::State(
                "this loader's dataset has no streams".into(),
            ));
        };
        let saved = stream.layout;
        if saved.epoch != state.epoch {
            return Err(LoaderError::State(format!(
                "the state is of epoch {} but its stream layout of epoch {}",
                state.epoch, saved.epoch
            )));
        }
        // Nothing delivered yet (a state taken between epochs, or at an epoch's start): the
        // epoch starts afresh on this loader's layout, whatever the checkpoint's was.
        let fresh = state.done_prefix == 0 && state.done_extra.is_empty();
        if stream.position.is_none() && !fresh {
            // A replay yields the same batches only from the same streams.
            let differs = [
                ("batch_size", saved.batch_size, layout.batch_size),
                ("num_workers", saved.num_workers, layout.num_workers),
                (
                    "drop_last",
                    usize::from(saved.drop_last),
                    usize::from(layout.drop_last),
                ),
            ]
            .into_iter()
            .find(|(_, a, b)| a != b);
            if let Some((option, a, b)) = differs {
                return Err(LoaderError::State(format!(
                    "the dataset has no stream position, so its epoch is resumed by replay, \
                     which needs the checkpoint's {option}: the state has {a}, this loader {b}"
                )));
            }
        }
        // The dataset checks its position (another dataset, epoch, seed or option is refused)
        // before anything changes here.
        let resume = stream.position.clone();
        let n = self
            .inner
            .fetch
            .begin_epoch(&layout, resume.as_ref())
            .map_err(|e| LoaderError::State(crate::error::chain(&e)))?;
        let base = if resume.is_some() {
            state.done_prefix
        } else {
            0
        };
        let mut p = Progress::new(state.epoch, n.map_or(u64::MAX, |n| base + n));
        p.prefix = state.done_prefix;
        p.stream = Some(StreamProgress {
            layout,
            base,
            resume,
            ended: false,
        });
        let mut plan = lock(&self.inner.plan);
        if plan.config.seed != state.seed {
            tracing::info!(target: "longshore::loader", from = plan.config.seed, to = state.seed, "the restored state sets the loader's seed");
        }
        plan.config.seed = state.seed;
        plan.revision += 1;
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

/// How a map-style checkpoint of one rank's share resumes on this loader's sampler.
#[derive(Debug)]
struct ShareResume {
    /// Entries of the epoch's global order to take out before the shares are split.
    consumed: usize,
    /// On another number of ranks or batch size: the epoch's batches are all of what is left
    /// (no batch of it delivered yet); else the state's own positions apply.
    elastic: bool,
}

/// The share resume of `state` (taken with a sampler over `saved` ranks) on `sampler`.
///
/// Ranks step together (data-parallel training checkpoints after the same step on every
/// rank), so after `done_prefix` batches of `batch_size` on each of `saved` ranks the first
/// `saved * done_prefix * batch_size` entries of the epoch's global order were consumed,
/// after those the state's own epoch had already taken out (`share_offset`).
fn share_resume(
    state: &LoaderState,
    saved: usize,
    sampler: &dyn longshore_data::BatchSampling,
    dataset_len: usize,
) -> Result<ShareResume, LoaderError> {
    let here = sampler.num_replicas().unwrap_or(saved);
    let same = here == saved && state.batch_size.is_none_or(|b| b == sampler.batch_size());
    if same {
        return Ok(ShareResume {
            consumed: state.share_offset as usize,
            elastic: false,
        });
    }
    let Some(batch_size) = state.batch_size else {
        return Err(LoaderError::State(format!(
            "the state was taken with a DistributedSampler over {saved} ranks, this loader's is \
             over {here}, and the state does not say its batch size (a state of an older \
             version): it resumes on {saved} ranks only"
        )));
    };
    if !state.done_extra.is_empty() {
        return Err(LoaderError::State(format!(
            "the state was taken with a DistributedSampler over {saved} ranks, this loader's is \
             over {here}, after batches delivered out of order (in_order=false): such a \
             checkpoint resumes on {saved} ranks with batch size {batch_size} only"
        )));
    }
    let consumed = if state.done_prefix >= state.num_batches {
        // The epoch was done: nothing of it is left.
        dataset_len
    } else {
        let per_rank = state.done_prefix as usize * batch_size;
        (state.share_offset as usize + saved * per_rank).min(dataset_len)
    };
    tracing::info!(target: "longshore::loader", from_ranks = saved, to_ranks = here, from_batch = batch_size, to_batch = sampler.batch_size(), consumed, epoch = state.epoch, "resuming a checkpoint of another number of ranks or batch size");
    Ok(ShareResume {
        consumed,
        elastic: true,
    })
}
