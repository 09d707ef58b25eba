//! What a loader's clones and live iterators share ([`Inner`]): the plan (options, sampler,
//! position), the resumable progress, the stats, the persistent workers and the placement.
//!
//! # Locks
//!
//! A loader's state is shared by its clones and its live iterators through [`Inner`], behind
//! four mutexes. **Lock order: `plan` -> `progress` -> `stats` -> `persistent`.** A thread that
//! holds one of them may only take those after it in this list. Today only
//! [`DataLoader::load_state_dict`] holds two at once (`plan`, then `progress`, so a restore is
//! seen whole by the next epoch); every other path takes one at a time. The hot path (one
//! batch) takes `progress` once and `stats` once (counters gathered since the previous batch),
//! both on the consumer thread, so they are uncontended; workers never touch them.
//!
//! Two other locks are on a loader's paths, and neither is taken while one of the four above
//! is held: the engine's reply gate (`engine.rs`, an `RwLock` whose read side every worker
//! shares around each reply and whose write side the consumer takes when it starts a new
//! generation) and the pool's state lock (taken to lease a block and when a batch is dropped;
//! a batch is never dropped under a loader lock).
//!
//! The placement lock ([`Inner::placement`]) is taken alone, after reading the options under
//! `plan` and releasing it.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use longshore_data::{BatchSampler, BatchSampling, EpochLayout, RandomSampler, SequentialSampler};
use longshore_host::PinnedPool;
use longshore_transfer::GpuTopology;

use crate::config::LoaderConfig;
use crate::engine::Engine;
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::next_epoch::Ahead;
use crate::placement::{ThreadSetup, WorkerPlacement};
use crate::prepare::Prepared;
use crate::state::Progress;
use crate::stats::LoaderStats;
use crate::worker::WorkerInit;

/// Where a loader's batches of indices come from.
pub(crate) enum SamplerSource {
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
    pub(crate) fn builtin(
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

    pub(crate) fn get(&mut self) -> Option<&mut Box<dyn BatchSampling>> {
        match self {
            SamplerSource::Builtin { sampler, .. } | SamplerSource::User(sampler) => Some(sampler),
            SamplerSource::None => None,
        }
    }

    pub(crate) fn len(&mut self) -> Option<usize> {
        self.get().map(|s| s.len())
    }

    /// Whether the next epoch's order is worth drawing in the background: the built-in
    /// shuffled sampler over a large dataset.
    pub(crate) fn prepares(&self) -> bool {
        matches!(self, SamplerSource::Builtin { shuffle: true, len, .. } if *len >= crate::prepare::MIN_LEN)
    }
}

/// What the next epoch runs: the options, the sampler, the epoch number and what of it a
/// restore marked done. One mutex, since a restore changes them together.
pub(crate) struct Plan {
    pub(crate) config: LoaderConfig,
    pub(crate) sampler: SamplerSource,
    /// The epoch the next iteration runs.
    pub(crate) next_epoch: u64,
    /// What of `next_epoch` is already done (after a restore).
    pub(crate) restored: Option<Progress>,
    /// The built-in shuffled sampler's order for the epoch after the one in progress, drawn
    /// in the background (see `prepare.rs`).
    pub(crate) prepared: Option<Prepared>,
    /// Bumped by every change of the order that `next_epoch` and the seed do not show
    /// (`load_state_dict`): a next epoch started ahead under another revision is discarded.
    pub(crate) revision: u64,
}

/// The workers kept between epochs (`persistent_workers`), with the next epoch's first
/// batches when they were started ahead (`next_epoch.rs`).
pub(crate) struct Parked<O> {
    /// Dropped first: its leases go back before the workers are joined.
    pub(crate) ahead: Option<Ahead<O>>,
    pub(crate) engine: Engine<O>,
}

/// The state a loader, its clones and its iterators share. See the module docs for the lock
/// order of its mutexes.
pub(crate) struct Inner<F: Fetch> {
    pub(crate) fetch: Arc<F>,
    pub(crate) pool: PinnedPool,
    pub(crate) worker_init: Option<WorkerInit>,
    /// First in the lock order.
    pub(crate) plan: Mutex<Plan>,
    /// The positions of the epoch in progress delivered so far. Second.
    pub(crate) progress: Mutex<Progress>,
    /// Third.
    pub(crate) stats: Mutex<LoaderStats>,
    /// The workers kept between epochs (`persistent_workers`), with the next epoch's first
    /// batches started ahead. Last.
    pub(crate) persistent: Mutex<Option<Parked<F::Output>>>,
    /// What every worker thread applies to itself (placement, priority).
    pub(crate) threads: Arc<ThreadSetup>,
    /// The GPU topology and what the placement became. Taken alone.
    pub(crate) placement: Mutex<PlacementState>,
    /// The pool block a batch takes, learned from the first batch ([`UNKNOWN_BLOCK`]: not yet;
    /// 0: batches hold no pool memory); with the pool's budget it bounds the batches in
    /// flight (`iter/budget.rs`).
    ///
    /// [`UNKNOWN_BLOCK`]: crate::iter::UNKNOWN_BLOCK
    pub(crate) block_bytes: AtomicUsize,
    /// Counts delivered samples by source ([`LoaderStats::sources`]), when asked.
    pub(crate) sources: Option<crate::stats::SourceCounter>,
}

/// The layout of epoch `epoch` of an iterable dataset as a loader with `config` reads it
/// (`None` for an indexed dataset): the loader's seed, batch size, `drop_last` and streams.
pub(crate) fn stream_layout<F: Fetch>(
    fetch: &F,
    config: &LoaderConfig,
    epoch: u64,
) -> Option<EpochLayout> {
    let (batch_size, drop_last) = fetch.stream_batching()?;
    Some(EpochLayout::new(
        epoch,
        config.seed,
        batch_size,
        drop_last,
        config.options.num_workers.max(1),
    ))
}

/// The GPU the loader places its workers for, and the settled placement.
#[derive(Debug)]
pub(crate) struct PlacementState {
    pub(crate) topology: Option<GpuTopology>,
    /// Given by the user (builder or [`DataLoader::set_gpu_topology`]): `to_device` keeps it.
    pub(crate) explicit: bool,
    /// The pool was made by the loader, so the loader may choose its NUMA node.
    pub(crate) own_pool: bool,
    pub(crate) resolved: WorkerPlacement,
}

/// What a builder hands to [`DataLoader::from_parts`].
pub(crate) struct Parts<F> {
    pub(crate) fetch: F,
    pub(crate) config: LoaderConfig,
    pub(crate) sampler: SamplerSource,
    pub(crate) pool: PinnedPool,
    pub(crate) worker_init: Option<WorkerInit>,
    pub(crate) topology: Option<GpuTopology>,
    pub(crate) own_pool: bool,
    pub(crate) sources: Option<crate::stats::SourceCounter>,
}

impl<F: crate::fetch::sealed::Sealed> Parts<F> {
    /// The same parts with the fetch's type erased.
    pub(crate) fn boxed(self) -> Parts<crate::boxed::BoxedFetch<F::Out>> {
        Parts {
            fetch: crate::boxed::BoxedFetch::new(self.fetch),
            config: self.config,
            sampler: self.sampler,
            pool: self.pool,
            worker_init: self.worker_init,
            topology: self.topology,
            own_pool: self.own_pool,
            sources: self.sources,
        }
    }
}
