//! [`ShardedDataset`]: WebDataset, MDS or Parquet shards in object storage as a loader
//! [`IterableDataset`], in the global order of [`crate::order`], read through the node's
//! [`ShardCache`], exactly resumable on the same or another number of ranks.
//!
//! ```
//! use longshore_data::{IterableDataset, WorkerInfo};
//! use longshore_shards::dataset::ShardedDataset;
//! use longshore_shards::webdataset::ShardWriter;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let mut writer = ShardWriter::new(dir.path(), 4096)?; // also writes shard-index.json
//! for i in 0..40 {
//!     writer.write(&format!("{i:04}"), &[("cls", (i % 3).to_string().as_bytes())])?;
//! }
//! let shards = writer.finish()?.shardlist.len();
//!
//! let pattern = format!("{}/shard-{{000000..{:06}}}.tar", dir.path().display(), shards - 1);
//! let dataset = ShardedDataset::webdataset([pattern])
//!     .seed(7)
//!     .batch_size(4)
//!     .rank(0)
//!     .world_size(1)
//!     .cache_dir(dir.path().join("cache"))
//!     .build()?;
//! dataset.set_epoch(0);
//! let mut labels = 0;
//! for sample in dataset.iter(WorkerInfo::single(0)) {
//!     let sample = sample?;
//!     labels += sample.sample.int("cls")?;
//!     assert!(!sample.pad);
//! }
//! assert_eq!(labels, (0..40).map(|i| i % 3).sum::<i64>());
//! # Ok(())
//! # }
//! ```
//!
//! # Building
//!
//! [`ShardedDataset::webdataset`] takes shard URL patterns (`s3://bucket/train-{000..099}.tar`,
//! see [`crate::url`]), [`ShardedDataset::mds`] the roots of MDS datasets (each holding an
//! `index.json`). [`build`](ShardedDatasetBuilder::build) resolves them **once**: one listing
//! per directory of shards (see [`ShardStore::resolve`]), and the per-shard sample counts,
//! from
//!
//! - for WebDataset, a wids shard index (`wids-shard-index-v1`): the one given with
//!   [`index`](ShardedDatasetBuilder::index), else the one a
//!   [`ShardWriter`](crate::webdataset::ShardWriter) writes next to its shards
//!   (`shard-000000.tar` -> `shard-index.json`) or an `index.json` there, when present (a
//!   `HEAD` each); shards that no index counts (or whose size differs from the index's) are
//!   **downloaded once at build and their tar headers scanned** — write an index to avoid
//!   that;
//! - for MDS, the dataset's `index.json` (no listing at all).
//!
//! The result is a [`DatasetSpec`] (serialisable): resolve it on one rank and build the other
//! ranks' datasets with [`ShardedDataset::from_spec`], and the job lists the bucket once.
//! Stores are configured through [`ShardStore`] (endpoints, credentials, retries; the S3
//! variables `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ... by default).
//!
//! # Options and the loader
//!
//! `seed`, `shuffle`, `shuffle_block` and `drop_last` are [`OrderConfig`]'s: see
//! [`crate::order`] for the order, shuffle blocks and their quality numbers, and
//! [`EpochPlan`] for the equal split over ranks and workers and its padding rule. `rank` and
//! `world_size` default to the launcher's environment ([`Layout::from_env`]).
//!
//! **`batch_size` must be the loader's** (and `drop_last` should be too): each worker's
//! stream is laid out in whole batches of `batch_size`, which the loader's round-robin over
//! workers delivers in the planned order only if it batches by the same size. The dataset
//! cannot see the loader's batch size; build the loader from the dataset's
//! ([`batch_size`](ShardedDataset::batch_size), [`drop_last`](ShardedDataset::drop_last)).
//! The number of workers is taken from the loader ([`WorkerInfo::num_workers`]); when
//! [`num_workers`](ShardedDatasetBuilder::num_workers) is given, a loader with another count
//! is refused (an error item). [`num_batches`](ShardedDataset::num_batches) is what each
//! rank's loader yields per epoch.
//!
//! # Epochs and resume
//!
//! [`set_epoch`](ShardedDataset::set_epoch) selects the epoch the next iteration reads, as
//! `DistributedSampler.set_epoch` does (without it every epoch reads epoch 0's order; a
//! warning says so). [`state_dict`](ShardedDataset::state_dict)`(k)`, after every rank took
//! `k` batches of this iteration, is a [`ResumeState`] (serde); a dataset given it with
//! [`load_state_dict`](ShardedDataset::load_state_dict) — on the same or another number of
//! ranks or workers — reads exactly the samples not yet delivered, each once (see
//! [`EpochPlan`]), until `set_epoch` moves to another epoch.
//!
//! # Items and errors
//!
//! Items are [`ShardSample`]s (turn them into the loader's items with
//! [`decode_with`](ShardedDataset::decode_with), or for images the `vision` module, feature
//! `vision`): the fields' bytes, the [`SampleId`](crate::order::SampleId),
//! the per-sample seed ([`crate::order::sample_seed`]) for reproducible augmentation, and
//! [`pad`](ShardSample::pad) marking padding repeats. A sample that cannot be read (a
//! download that failed for good, a damaged tar, a field required with
//! [`require`](ShardedDatasetBuilder::require) that is missing) is an `Err(DataError)` item
//! whose cause is the [`ShardError`] naming the shard, member and byte offset; the loader's
//! `on_sample_error` policy handles it, and the dataset must be told the same
//! ([`on_sample_error`](ShardedDatasetBuilder::on_sample_error)): under
//! [`OnSampleError::Skip`] each failed sample is counted and logged ([`ShardedDataset::stats`])
//! and made up for by a padding repeat at the end of its worker's stream, so every rank yields
//! exactly [`num_batches`](ShardedDataset::num_batches) batches whatever is skipped (ranks of
//! a DDP job stay equal). Damage is never a smaller dataset: a shard whose size disagrees with
//! its index keeps the index's count (the samples it lacks fail when read), and a damaged
//! shard no index counts is recorded in the spec ([`DatasetSpec::damaged`]), which
//! [`OnSampleError::Raise`] refuses at build with [`ShardError::Damaged`]. Under `FailBatch`
//! the failed batch's other samples are dropped with it. A resume state counts batches as
//! planned, so resume from a state taken before an error.
//!
//! # Cache and prefetch
//!
//! Shards are read from the node's [`ShardCache`] (one directory shared by every rank and
//! worker on the node): by default `longshore-shards/<job>` under the system temp directory,
//! `<job>` being [`job`](ShardedDatasetBuilder::job) or the spec's fingerprint, with a budget
//! of the dataset's size capped at 16 GiB (at least its largest shard). A worker reads ahead
//! in its stream, prefetches the next
//! [`prefetch_shards`](ShardedDatasetBuilder::prefetch_shards) shards it will read, keeps a
//! lease on each shard until its look-ahead holds no more of that shard's samples, and
//! releases every lease before waiting for a download, so readers never wait for room they
//! hold. A WebDataset shard's tar headers are scanned once when a worker opens it; each
//! sample is then one read of its byte span. Give the cache room for the shards the node's
//! workers read at once (with shuffle blocks: a block's shards per rank) to avoid
//! downloading a shard twice.
//!
//! # Fork and thread safety
//!
//! Building does its I/O on a current-thread tokio runtime made for it and dropped before
//! `build` returns, with clients of its own (dropped with it): after `build` the process has
//! no store runtime, no I/O thread and no pooled connection. The store runtime that workers
//! read through is created lazily, by the first worker that downloads, through the store's
//! runtime holder ([`crate::store::runtime`]): one per process, rebuilt in a process forked
//! after it existed; the store's clients and the cache's prefetch threads are likewise per
//! process. So a dataset may be built before a loader forks or spawns its workers.
//! `ShardedDataset` is `Send + Sync` and cheap to clone (clones share the epoch and resume
//! state): give the loader a clone and keep one for `set_epoch` and `state_dict`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use longshore_data::{DataError, ItemIter, IterableDataset, WorkerInfo};

use crate::ShardError;
use crate::cache::{CacheConfig, ShardCache};
use crate::mds::Columns;
use crate::order::{EpochOrder, EpochPlan, Layout, OrderConfig, ResumeState};
use crate::store::ShardStore;

mod decoded;
mod leases;
mod reader;
mod sample;
mod spec;
mod stats;

pub use decoded::Decoded;
pub use sample::ShardSample;
pub use spec::{CountSource, DatasetSpec, ShardDamage, ShardFormat};
pub use stats::ShardStats;

use reader::WorkerReader;
use spec::Source;

const TARGET: &str = "longshore::shards";

/// The default cache budget's cap: 16 GiB.
pub const DEFAULT_CACHE_BUDGET: u64 = 16 << 30;

/// What the loader does with a sample that cannot be read: the dataset must know it, since it
/// decides how damage is reported and how each rank keeps its count (the loader's
/// `on_sample_error`; give the dataset the same).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnSampleError {
    /// A failed sample is an error item, which the loader raises (default). A dataset whose
    /// spec records damaged shards ([`DatasetSpec::damaged`]) is refused at build with
    /// [`ShardError::Damaged`] naming the shard, member and byte offset.
    #[default]
    Raise,
    /// The loader skips failed samples: each is counted ([`ShardedDataset::stats`]) and
    /// logged (a warning per shard), and made up for at the end of its worker's stream by a
    /// padding repeat of a sample that read (marked [`ShardSample::pad`]), so that every rank
    /// still yields its planned number of batches (a DDP job's ranks stay equal). Damaged
    /// shards of the spec are warned about and counted, and their readable samples read.
    Skip,
}

/// Builds a [`ShardedDataset`]; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct ShardedDatasetBuilder {
    source: Source,
    store: Option<ShardStore>,
    config: OrderConfig,
    batch_size: usize,
    rank: Option<usize>,
    world_size: Option<usize>,
    num_workers: Option<usize>,
    cache_dir: Option<PathBuf>,
    cache_budget: Option<u64>,
    cache_config: Option<CacheConfig>,
    job: Option<String>,
    prefetch_shards: usize,
    required: Vec<String>,
    on_sample_error: OnSampleError,
}

impl ShardedDatasetBuilder {
    fn new(source: Source) -> Self {
        ShardedDatasetBuilder {
            source,
            store: None,
            config: OrderConfig::default(),
            batch_size: 1,
            rank: None,
            world_size: None,
            num_workers: None,
            cache_dir: None,
            cache_budget: None,
            cache_config: None,
            job: None,
            prefetch_shards: 2,
            required: Vec::new(),
            on_sample_error: OnSampleError::Raise,
        }
    }

    /// What the loader does with a sample that cannot be read (default
    /// [`OnSampleError::Raise`]): use the loader's policy.
    #[must_use]
    pub fn on_sample_error(mut self, policy: OnSampleError) -> Self {
        self.on_sample_error = policy;
        self
    }

    /// The store the shards are read from (default [`ShardStore::from_env`]).
    #[must_use]
    pub fn store(mut self, store: ShardStore) -> Self {
        self.store = Some(store);
        self
    }

    /// The seed of the shuffles and of the per-sample seeds (default 0).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Whether to shuffle (default `true`); see [`OrderConfig::shuffle`].
    #[must_use]
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.config.shuffle = shuffle;
        self
    }

    /// Samples per shuffle block (default [`crate::order::DEFAULT_SHUFFLE_BLOCK`]); see
    /// [`OrderConfig::shuffle_block`].
    #[must_use]
    pub fn shuffle_block(mut self, samples: u64) -> Self {
        self.config.shuffle_block = samples;
        self
    }

    /// Drop the samples that do not fill every rank's last batch instead of padding
    /// (default `false`); see [`EpochPlan`]. Use the same value for the loader.
    #[must_use]
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.config.drop_last = drop_last;
        self
    }

    /// The loader's batch size (default 1): it **must** be the loader's.
    #[must_use]
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// This process's rank (default: from the launcher's environment, else 0).
    #[must_use]
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The number of ranks (default: from the launcher's environment, else 1).
    #[must_use]
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = Some(world_size);
        self
    }

    /// The loader's number of workers, checked when a worker starts (default: whatever the
    /// loader runs; `0` counts as 1).
    #[must_use]
    pub fn num_workers(mut self, num_workers: usize) -> Self {
        self.num_workers = Some(num_workers.max(1));
        self
    }

    /// The node's cache directory (default: `longshore-shards/<job>` under the system temp
    /// directory).
    #[must_use]
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// The cache's byte budget (default: the dataset's size, at most
    /// [`DEFAULT_CACHE_BUDGET`], at least its largest shard). A budget smaller than the
    /// largest shard is refused at build.
    #[must_use]
    pub fn cache_budget(mut self, bytes: u64) -> Self {
        self.cache_budget = Some(bytes);
        self
    }

    /// The whole cache configuration (concurrent downloads, wait limit); `cache_dir` and
    /// `cache_budget`, when also given, override its directory and budget.
    #[must_use]
    pub fn cache_config(mut self, config: CacheConfig) -> Self {
        self.cache_config = Some(config);
        self
    }

    /// Names the job's default cache directory (default: the spec's fingerprint, so every
    /// process of the node reading this dataset shares it, and a rerun reuses it).
    #[must_use]
    pub fn job(mut self, name: impl Into<String>) -> Self {
        self.job = Some(name.into());
        self
    }

    /// Shards each worker prefetches ahead of the one it reads (default 2; 0 turns prefetch
    /// off).
    #[must_use]
    pub fn prefetch_shards(mut self, shards: usize) -> Self {
        self.prefetch_shards = shards;
        self
    }

    /// Fields every sample must have (WebDataset extensions such as `jpg`, MDS column
    /// names); a sample without one is an error item naming the shard, key and offset.
    #[must_use]
    pub fn require<I: IntoIterator<Item = S>, S: Into<String>>(mut self, fields: I) -> Self {
        self.required = fields.into_iter().map(Into::into).collect();
        self
    }

    /// The wids shard index that counts the WebDataset shards' samples, instead of looking
    /// for one next to the shards. Shard URLs in it are relative to its directory.
    #[must_use]
    pub fn index(mut self, url: impl Into<String>) -> Self {
        if let Source::WebDataset { index, .. } = &mut self.source {
            *index = Some(url.into());
        }
        self
    }

    /// Resolves the shards (once; see the [module docs](self)) and opens the cache.
    ///
    /// # Errors
    /// [`ShardError::Order`] for a batch size of 0 or a rank out of range, or launcher
    /// variables that cannot be read; the resolution's errors (pattern, URL, listing, index);
    /// [`ShardError::BudgetTooSmall`] for a cache budget below the largest shard;
    /// [`ShardError::Runtime`] when called inside an async runtime.
    pub fn build(self) -> Result<ShardedDataset, ShardError> {
        let (env, env_rank) = match (self.rank, self.world_size) {
            (Some(r), Some(w)) => (Layout::new(w, 1, self.batch_size)?, r),
            _ => Layout::from_env(1, self.batch_size)?,
        };
        let world_size = self.world_size.unwrap_or(env.world_size());
        let rank = self.rank.unwrap_or(env_rank);
        let layout = Layout::new(world_size, 1, self.batch_size)?;
        if rank >= layout.world_size() {
            return Err(ShardError::Order {
                option: "rank",
                reason: format!("rank {rank} must be less than world_size {world_size}"),
            });
        }
        let store = self.store.unwrap_or_else(ShardStore::from_env);
        let spec = spec::resolve(&store, &self.source)?;
        let stats = stats::Counters::default();
        for d in &spec.damaged {
            match self.on_sample_error {
                OnSampleError::Raise => {
                    return Err(ShardError::Damaged {
                        shard: d.url.clone(),
                        member: d.member.clone(),
                        offset: d.offset,
                        reason: format!(
                            "{} (skip the samples that cannot be read with \
                             on_sample_error=\"skip\", or repair the shard)",
                            d.reason
                        ),
                    });
                }
                OnSampleError::Skip => {
                    tracing::warn!(target: TARGET, damage = %d, "damaged shard: its readable samples are read, the others skipped and counted");
                    stats.damaged(d.shard);
                }
            }
        }
        let columns = spec
            .mds
            .iter()
            .map(|info| info.columns().map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let job = self.job.unwrap_or_else(|| spec.fingerprint());
        let mut cache = self.cache_config.unwrap_or_else(|| {
            let total = spec.shards.total_bytes();
            let largest = spec.shards.largest().map_or(0, |s| s.size);
            CacheConfig::new(
                std::env::temp_dir().join("longshore-shards").join(&job),
                total.min(DEFAULT_CACHE_BUDGET).max(largest),
            )
        });
        if let Some(dir) = self.cache_dir {
            cache.dir = dir;
        }
        if let Some(budget) = self.cache_budget {
            cache.budget_bytes = budget;
        }
        tracing::info!(
            target: TARGET,
            rank,
            world_size,
            batch_size = self.batch_size,
            cache = %cache.dir.display(),
            budget = cache.budget_bytes,
            "sharded dataset"
        );
        let cache = ShardCache::open(cache, store.clone(), &spec.shards)?;
        Ok(ShardedDataset {
            inner: Arc::new(Inner {
                spec,
                columns,
                store,
                leases: leases::LeaseBoard::new(cache.clone()),
                layouts: reader::SharedLayouts::default(),
                cache,
                config: self.config,
                batch_size: self.batch_size,
                rank,
                world_size,
                num_workers: self.num_workers,
                prefetch_shards: self.prefetch_shards,
                required: self.required,
                on_sample_error: self.on_sample_error,
                stats,
                epoch: AtomicU64::new(0),
                epoch_set: AtomicBool::new(false),
                warned_epoch: AtomicBool::new(false),
                state: Mutex::default(),
                prefetch: Mutex::default(),
            }),
        })
    }
}

/// The plan of the epoch being read, and a resume state to apply.
#[derive(Debug, Default)]
struct EpochState {
    /// A loaded resume state and its generation (bumped by each load).
    resume: Option<(u64, ResumeState)>,
    generation: u64,
    /// The workers the last loader ran.
    workers: Option<usize>,
    /// (epoch, workers, resume generation) -> plan.
    plan: Option<((u64, usize, u64), Arc<EpochPlan>)>,
}

#[derive(Debug)]
struct Inner {
    spec: DatasetSpec,
    columns: Vec<Arc<Columns>>,
    store: ShardStore,
    cache: ShardCache,
    /// The leases of this process's readers, and their keeper.
    leases: Arc<leases::LeaseBoard>,
    /// The cached shards' sample layouts, shared by the readers.
    layouts: reader::SharedLayouts,
    config: OrderConfig,
    batch_size: usize,
    rank: usize,
    world_size: usize,
    num_workers: Option<usize>,
    prefetch_shards: usize,
    required: Vec<String>,
    on_sample_error: OnSampleError,
    /// Failed reads, padding made up for them, damaged shards.
    stats: stats::Counters,
    epoch: AtomicU64,
    epoch_set: AtomicBool,
    warned_epoch: AtomicBool,
    state: Mutex<EpochState>,
    /// Each worker's next shards, merged into the cache's prefetch order.
    prefetch: Mutex<BTreeMap<usize, Vec<usize>>>,
}

impl Inner {
    /// Records worker `worker`'s next shards and hands the cache every worker's, taken in
    /// turns (each worker's next first), so that one worker's prefetch does not displace
    /// another's.
    fn publish_prefetch(&self, worker: usize, next: Vec<usize>) {
        let mut board = self.prefetch.lock().unwrap_or_else(|p| p.into_inner());
        if next.is_empty() {
            board.remove(&worker);
        } else {
            board.insert(worker, next);
        }
        let depth = board.values().map(Vec::len).max().unwrap_or(0);
        let mut merged: Vec<usize> = Vec::new();
        for i in 0..depth {
            for list in board.values() {
                if let Some(&s) = list.get(i)
                    && !merged.contains(&s)
                {
                    merged.push(s);
                }
            }
        }
        let infos: Vec<_> = merged
            .iter()
            .map(|&s| self.spec.shards.shards[s].clone())
            .collect();
        drop(board);
        self.cache.prefetch(&infos);
    }

    /// The plan of the current epoch for `workers` workers per rank.
    fn plan_for(&self, workers: usize) -> Result<Arc<EpochPlan>, ShardError> {
        let epoch = self.epoch.load(Ordering::SeqCst);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let resume = st.resume.as_ref().filter(|(_, r)| r.epoch() == epoch);
        let key = (epoch, workers, resume.map_or(0, |(g, _)| *g));
        if let Some((k, plan)) = &st.plan
            && *k == key
        {
            return Ok(Arc::clone(plan));
        }
        let order = Arc::new(EpochOrder::new(&self.spec.counts, self.config, epoch)?);
        let layout = Layout::new(self.world_size, workers, self.batch_size)?;
        let plan = Arc::new(match resume {
            Some((_, state)) => EpochPlan::resume(order, state, layout)?,
            None => EpochPlan::new(order, layout),
        });
        st.plan = Some((key, Arc::clone(&plan)));
        Ok(plan)
    }

    fn workers(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.num_workers.or(st.workers).unwrap_or(1)
    }
}

/// WebDataset, MDS or Parquet shards as an [`IterableDataset`] of [`ShardSample`]s; see the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct ShardedDataset {
    inner: Arc<Inner>,
}

impl ShardedDataset {
    /// A dataset of the WebDataset shards the URL patterns name.
    pub fn webdataset<I: IntoIterator<Item = S>, S: Into<String>>(
        patterns: I,
    ) -> ShardedDatasetBuilder {
        ShardedDatasetBuilder::new(Source::WebDataset {
            patterns: patterns.into_iter().map(Into::into).collect(),
            index: None,
        })
    }

    /// A dataset of the Parquet files the URL patterns name (a row per sample; see
    /// [`crate::parquet`]): their row counts are read from their footers at build.
    pub fn parquet<I: IntoIterator<Item = S>, S: Into<String>>(
        patterns: I,
    ) -> ShardedDatasetBuilder {
        ShardedDatasetBuilder::new(Source::Parquet {
            patterns: patterns.into_iter().map(Into::into).collect(),
        })
    }

    /// A dataset of the MDS datasets at these roots (each holding an `index.json`), in order.
    pub fn mds<I: IntoIterator<Item = S>, S: Into<String>>(roots: I) -> ShardedDatasetBuilder {
        ShardedDatasetBuilder::new(Source::Mds {
            roots: roots.into_iter().map(Into::into).collect(),
        })
    }

    /// A dataset of a spec resolved elsewhere (by another rank's
    /// [`spec`](ShardedDataset::spec)): no listing, no index read.
    pub fn from_spec(spec: DatasetSpec) -> ShardedDatasetBuilder {
        ShardedDatasetBuilder::new(Source::Spec(Box::new(spec)))
    }

    /// The resolved shards and counts, to hand to other ranks.
    pub fn spec(&self) -> &DatasetSpec {
        &self.inner.spec
    }

    /// The store the shards are read from.
    pub fn store(&self) -> &ShardStore {
        &self.inner.store
    }

    /// The node's shard cache.
    pub fn cache(&self) -> &ShardCache {
        &self.inner.cache
    }

    /// Samples per epoch in the dataset (all ranks together, before padding or dropping).
    pub fn len(&self) -> u64 {
        self.inner.spec.total_samples()
    }

    /// Whether the dataset holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What became of the samples that could not be read, since the dataset was built: the
    /// failed reads by reason, the padding repeats that made up for them, damaged shards.
    pub fn stats(&self) -> ShardStats {
        self.inner.stats.snapshot()
    }

    /// The policy for samples that cannot be read.
    pub fn on_sample_error(&self) -> OnSampleError {
        self.inner.on_sample_error
    }

    /// The order's options.
    pub fn order_config(&self) -> OrderConfig {
        self.inner.config
    }

    /// The batch size the loader must use.
    pub fn batch_size(&self) -> usize {
        self.inner.batch_size
    }

    /// Whether ranks drop their uneven ends (the loader should use the same value).
    pub fn drop_last(&self) -> bool {
        self.inner.config.drop_last
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// Sets the epoch the next iteration reads (shared by clones), like
    /// `DistributedSampler.set_epoch`. A loaded resume state of another epoch is dropped.
    pub fn set_epoch(&self, epoch: u64) {
        let inner = &self.inner;
        inner.epoch.store(epoch, Ordering::SeqCst);
        inner.epoch_set.store(true, Ordering::Relaxed);
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.resume.as_ref().is_some_and(|(_, r)| r.epoch() != epoch) {
            st.resume = None;
        }
    }

    /// The epoch the next iteration reads.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch.load(Ordering::SeqCst)
    }

    /// The current epoch's plan (after a resume: what is left of it), for the loader's number
    /// of workers (the one last seen, or [`num_workers`](ShardedDatasetBuilder::num_workers),
    /// or 1).
    ///
    /// # Errors
    /// [`ShardError::Order`] or [`ShardError::Resume`] when the plan cannot be made.
    pub fn plan(&self) -> Result<Arc<EpochPlan>, ShardError> {
        self.inner.plan_for(self.inner.workers())
    }

    /// Batches each rank's loader yields in the current epoch (after a resume: what is left).
    ///
    /// # Errors
    /// As [`plan`](Self::plan).
    pub fn num_batches(&self) -> Result<u64, ShardError> {
        Ok(self.plan()?.remaining_batches())
    }

    /// Where the epoch stands after every rank took `batches_taken` batches from its loader in
    /// this iteration (count what the training loop received, not what workers prefetched).
    /// Every rank computes the same state; save one.
    ///
    /// # Errors
    /// [`ShardError::Resume`] when that is more batches than the iteration has.
    pub fn state_dict(&self, batches_taken: u64) -> Result<ResumeState, ShardError> {
        self.plan()?.state_after(batches_taken)
    }

    /// Resumes from `state` (of this dataset, any layout): the epoch becomes the state's, and
    /// its iterations read exactly the samples not delivered before the state was taken,
    /// until [`set_epoch`](Self::set_epoch) selects another epoch.
    ///
    /// # Errors
    /// [`ShardError::Resume`] when the state is of another dataset, seed or option.
    pub fn load_state_dict(&self, state: &ResumeState) -> Result<(), ShardError> {
        let inner = &self.inner;
        let order = Arc::new(EpochOrder::new(
            &inner.spec.counts,
            inner.config,
            state.epoch(),
        )?);
        let layout = Layout::new(inner.world_size, inner.workers(), inner.batch_size)?;
        EpochPlan::resume(order, state, layout)?;
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.generation += 1;
        st.resume = Some((st.generation, state.clone()));
        inner.epoch.store(state.epoch(), Ordering::SeqCst);
        inner.epoch_set.store(true, Ordering::Relaxed);
        tracing::info!(target: TARGET, epoch = state.epoch(), batches = state.batches(), "resume state loaded");
        Ok(())
    }
}

impl IterableDataset for ShardedDataset {
    type Item = ShardSample;

    /// Worker `worker.id`'s stream of this rank's part of the epoch, in order (an error item
    /// if the plan cannot be made).
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, ShardSample> {
        let inner = &self.inner;
        let workers = worker.num_workers.max(1);
        let stream = (|| {
            if let Some(n) = inner.num_workers
                && n != workers
            {
                return Err(ShardError::Order {
                    option: "num_workers",
                    reason: format!(
                        "the loader runs {workers} workers, the dataset was built for {n}"
                    ),
                });
            }
            inner
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .workers = Some(workers);
            let plan = inner.plan_for(workers)?;
            let epoch = plan.order().epoch();
            let order = Arc::clone(plan.order());
            Ok((epoch, plan.rank(inner.rank)?.worker(worker.id)?, order))
        })();
        match stream {
            Ok((epoch, stream, order)) => Box::new(WorkerReader::new(
                Arc::clone(inner),
                worker.id,
                epoch,
                stream,
                order,
            )),
            Err(e) => Box::new(std::iter::once(Err(DataError::custom(
                format!("starting worker {} of a sharded dataset", worker.id),
                e,
            )))),
        }
    }
}
