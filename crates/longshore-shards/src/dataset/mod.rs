//! [`ShardedDataset`]: WebDataset, MDS or Parquet shards in object storage as a loader
//! [`IterableDataset`](longshore_data::IterableDataset), in the global order of [`crate::order`], read through the node's
//! [`ShardCache`], exactly resumable on the same or another number of ranks.
//!
//! ```
//! use longshore_loader::DataLoader;
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
//!     .rank(0)
//!     .world_size(1)
//!     .cache_dir(dir.path().join("cache"))
//!     .build()?;
//! let labels = dataset.decode_with(|s| Ok(([s.sample.int("cls")?],)));
//! // The loader owns batch size, epochs and checkpoints.
//! let loader = DataLoader::iterable(labels).batch_size(4).num_workers(2).build()?;
//! assert_eq!(loader.len(), Some(10));
//! loader.set_epoch(0);
//! let mut sum = 0;
//! for batch in &loader {
//!     sum += batch?.tensor::<i64>(0)?.iter().sum::<i64>();
//! }
//! assert_eq!(sum, (0..40).map(|i| i % 3).sum::<i64>());
//! let checkpoint = loader.state_dict()?; // serde: the epoch, and the dataset's position
//! assert_eq!(checkpoint.epoch, 1);
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
//! `seed`, `shuffle` and `shuffle_block` are [`OrderConfig`]'s: see [`crate::order`] for the
//! order, shuffle blocks and their quality numbers, and [`EpochPlan`] for the equal split over
//! ranks and workers and its padding rule. `rank` and `world_size` default to the launcher's
//! environment ([`Layout::from_env`]).
//!
//! The loader owns the rest, through the [`IterableDataset`](longshore_data::IterableDataset) seam: before it opens an epoch's
//! streams it calls [`begin_epoch`](longshore_data::IterableDataset::begin_epoch) with its
//! [`EpochLayout`](longshore_data::EpochLayout), and the dataset splits the epoch by the
//! loader's batch size, `drop_last` (pad or drop the ranks' uneven ends, `OrderConfig`'s
//! `drop_last`) and number of workers; `loader.len()` is the batches each rank's loader
//! yields. The plans are kept by epoch, and each worker reads the epoch its
//! [`WorkerInfo::epoch`](longshore_data::WorkerInfo::epoch) names, so the loader's next epoch
//! may be begun while the current one drains.
//!
//! # Epochs and resume
//!
//! `loader.set_epoch(e)` selects the epoch (as `DistributedSampler.set_epoch` does; without it
//! each iteration reads the next). `loader.state_dict()` holds this dataset's position
//! ([`IterableDataset::position`](longshore_data::IterableDataset::position): a [`ResumeState`](crate::order::ResumeState), every rank
//! computes the same); a loader given it with `load_state_dict` — on the same or another
//! number of ranks or workers — reads exactly the samples not yet delivered, each once (see
//! [`EpochPlan`]). Outside a loader, [`iter`](longshore_data::IterableDataset::iter) reads an epoch that was
//! not begun whole, in batches of one. A worker reads its epoch as last begun for its number
//! of workers: two loaders that read the same epoch of one dataset (or of its clones) at once,
//! with the same number of workers but another batch size or resume point, each need a
//! dataset of their own (build the second [`from_spec`](ShardedDataset::from_spec)).
//!
//! # Items and errors
//!
//! Items are [`ShardSample`]s (turn them into the loader's items with
//! [`decode_with`](ShardedDataset::decode_with), or for images longshore-vision's `shards`
//! module): the fields' bytes, the [`SampleId`](crate::order::SampleId),
//! the per-sample seed ([`crate::order::sample_seed`]) for reproducible augmentation, and
//! [`pad`](ShardSample::pad) marking padding repeats. A sample that cannot be read (a
//! download that failed for good, a damaged tar, a field required with
//! [`require`](ShardedDatasetBuilder::require) that is missing) is an `Err(DataError)` item
//! whose cause is the [`ShardError`] naming the shard, member and byte offset; the loader's
//! `on_sample_error` policy handles it, and the dataset must be told the same
//! ([`on_sample_error`](ShardedDatasetBuilder::on_sample_error)): under
//! [`OnSampleError::Skip`] each failed sample is counted and logged ([`ShardedDataset::stats`])
//! and made up for by a padding repeat at the end of its worker's stream, so every rank yields
//! exactly its planned batches (`loader.len()`) whatever is skipped (ranks of
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
//! # Range reads
//!
//! Below the working set ([`ShardCache::below_working_set`]: the budget cannot keep every
//! shard from its first read in the epoch to its last), a read whose shard is not on disk may
//! be a range `GET` of that sample's bytes instead of a download of its shard. Which reads:
//!
//! - every read of a *sparse* shard (one read thinly over a long span of the reader's stream,
//!   as under a wide shuffle, where the shards the reader reads at once do not fit its share
//!   of the budget): whatever the cache holds serves its share of reads, and a download would
//!   only displace another shard;
//! - of a *dense* shard (a shuffle block's, whose shards fit the readers' shares), which the
//!   cache's prefetch brings whole as before: the reads that find no room for it (rather than
//!   waiting), and up to an eighth of its reads issued while it is not on disk yet (a block's
//!   first samples touch every one of its shards before their downloads are done); when those
//!   are spent and it is still not on disk, the worker starts its download itself, while it
//!   reads them, rather than when it reaches the shard's next read.
//!
//! Below the working set a worker keeps its leases of the shards it reads within its next 64
//! samples when it opens another one, and lets the others go for the cache to evict.
//!
//! Each worker issues the range reads of its look-ahead (at least 256 samples; up to 256
//! reads and 64 MiB in flight), so a wide shuffle over a small cache reads at about the
//! unbounded rate (docs/benchmarks.md) where whole-shard downloads per read made it a few
//! percent of it. A range read needs the sample's place in the shard: a tar's comes from a
//! scan of the shard downloaded once in this process (a tar no reader of the process has
//! scanned is downloaded whole), an MDS shard's from its header, itself read by range. Range
//! reads are counted per epoch ([`EpochCacheStats::range_reads`](crate::cache::EpochCacheStats::range_reads)
//! and `range_bytes`; Python `loader.stats["shards"]["range_reads"]`); the first warns, as an
//! eviction of a shard still needed does, naming the budget that would suffice. A range read
//! that fails is the sample's error, as a failed download is.
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
//! `ShardedDataset` is `Send + Sync` and cheap to clone (clones share the epochs begun).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::ShardError;
use crate::cache::{CacheConfig, ShardCache};
use crate::mds::Columns;
use crate::order::{EpochPlan, Layout, OrderConfig};
use crate::store::ShardStore;

mod decoded;
mod epochs;
mod layout;
mod leases;
mod ranged;
mod reader;
mod sample;
mod spec;
mod stats;

pub use decoded::Decoded;
pub use sample::ShardSample;
pub use spec::{CountSource, DatasetSpec, ShardDamage, ShardFormat};
pub use stats::ShardStats;

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
    rank: Option<usize>,
    world_size: Option<usize>,
    cache_dir: Option<PathBuf>,
    cache_budget: Option<u64>,
    cache_config: Option<CacheConfig>,
    job: Option<String>,
    prefetch_shards: usize,
    range_reads: bool,
    required: Vec<String>,
    on_sample_error: OnSampleError,
}

impl ShardedDatasetBuilder {
    fn new(source: Source) -> Self {
        ShardedDatasetBuilder {
            source,
            store: None,
            config: OrderConfig::default(),
            rank: None,
            world_size: None,
            cache_dir: None,
            cache_budget: None,
            cache_config: None,
            job: None,
            prefetch_shards: 2,
            range_reads: true,
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

    /// Shards each worker prefetches ahead of those it reads (default 2; 0 turns prefetch
    /// off). Counted past every shard the worker is reading: under a shuffle block, the
    /// block's shards being read and the next block's first two fetched.
    #[must_use]
    pub fn prefetch_shards(mut self, shards: usize) -> Self {
        self.prefetch_shards = shards;
        self
    }

    /// Whether reads below the cache's working set may be range reads of single samples
    /// (default `true`; see [Range reads](self#range-reads)). With `false` every read of a shard
    /// not on disk downloads it (where a `GET` costs more than the bytes it saves).
    #[must_use]
    pub fn range_reads(mut self, on: bool) -> Self {
        self.range_reads = on;
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
            (Some(r), Some(w)) => (Layout::new(w, 1, 1)?, r),
            _ => Layout::from_env(1, 1)?,
        };
        let world_size = self.world_size.unwrap_or(env.world_size());
        let rank = self.rank.unwrap_or(env_rank);
        let layout = Layout::new(world_size, 1, 1)?;
        if rank >= layout.world_size() {
            return Err(ShardError::Order {
                option: "rank",
                reason: format!("rank {rank} must be less than world_size {world_size}"),
            });
        }
        let store = self.store.unwrap_or_else(ShardStore::from_env);
        let spec = spec::resolve(&store, &self.source)?;
        let len = spec.epoch_len()?;
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
            cache = %cache.dir.display(),
            budget = cache.budget_bytes,
            "sharded dataset"
        );
        let cache = ShardCache::open(cache, store.clone(), &spec.shards)?;
        Ok(ShardedDataset {
            inner: Arc::new(Inner {
                spec,
                len,
                columns,
                store,
                leases: leases::LeaseBoard::new(cache.clone()),
                layouts: layout::SharedLayouts::default(),
                cache,
                config: self.config,
                rank,
                world_size,
                prefetch_shards: self.prefetch_shards,
                range_reads: self.range_reads,
                required: self.required,
                on_sample_error: self.on_sample_error,
                stats,
                epochs: Mutex::default(),
                prefetch: Mutex::default(),
            }),
        })
    }
}

#[derive(Debug)]
struct Inner {
    spec: DatasetSpec,
    /// Positions per epoch (a mixture's by its stop rule).
    len: u64,
    columns: Vec<Arc<Columns>>,
    store: ShardStore,
    cache: ShardCache,
    /// The leases of this process's readers, and their keeper.
    leases: Arc<leases::LeaseBoard>,
    /// The cached shards' sample layouts, shared by the readers.
    layouts: layout::SharedLayouts,
    config: OrderConfig,
    rank: usize,
    world_size: usize,
    prefetch_shards: usize,
    range_reads: bool,
    required: Vec<String>,
    on_sample_error: OnSampleError,
    /// Failed reads, padding made up for them, damaged shards.
    stats: stats::Counters,
    /// The plans of the epochs the loader began, by epoch.
    epochs: Mutex<epochs::Begun>,
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
}

/// WebDataset, MDS or Parquet shards as an [`IterableDataset`](longshore_data::IterableDataset) of [`ShardSample`]s; see the
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

    /// A mixture of sharded datasets of one format: `members` drawn in proportion to
    /// `weights` until `stop`, as longshore-data's map-style `Mixture` draws (Hugging Face's
    /// `interleave_datasets` stopping strategies; see
    /// [`EpochOrder::mixed`](crate::order::EpochOrder::mixed)). The members' resolved shards
    /// are used as they are (no listing); the mixture is one dataset for the loader: its
    /// epoch's positions are split over ranks and workers, padded, checkpointed and resumed
    /// on another layout as a single dataset's are, each member read in its own order (a seed
    /// of its own, the builder's `shuffle` options). Set the builder's options (seed,
    /// shuffle, cache, `on_sample_error`, rank) on the mixture: the members' are not used,
    /// except their store, which the mixture reads through (member 0's).
    ///
    /// ```
    /// use longshore_data::dataset::mixture::Stop;
    /// use longshore_shards::dataset::ShardedDataset;
    /// use longshore_shards::webdataset::ShardWriter;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let mut members = Vec::new();
    /// for (name, n) in [("web", 60), ("books", 20)] {
    ///     let mut w = ShardWriter::new(dir.path().join(name), 2048)?;
    ///     for i in 0..n {
    ///         w.write(&format!("{name}{i:03}"), &[("txt", name.as_bytes())])?;
    ///     }
    ///     let shards = w.finish()?.shardlist.len();
    ///     let pattern = format!("{}/{name}/shard-{{000000..{:06}}}.tar", dir.path().display(), shards - 1);
    ///     members.push(ShardedDataset::webdataset([pattern]).rank(0).world_size(1).build()?);
    /// }
    /// // 3 web samples for 1 book, until the books run out.
    /// let mix = ShardedDataset::mixture(&[&members[0], &members[1]], &[3.0, 1.0], Stop::FirstExhausted)?
    ///     .rank(0)
    ///     .world_size(1)
    ///     .cache_dir(dir.path().join("cache"))
    ///     .build()?;
    /// assert_eq!(mix.len(), 80); // 60 web, 20 books: the 21st book would come next
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`DatasetSpec::mixture`].
    pub fn mixture(
        members: &[&ShardedDataset],
        weights: &[f64],
        stop: longshore_data::dataset::mixture::Stop,
    ) -> Result<ShardedDatasetBuilder, ShardError> {
        let specs: Vec<&DatasetSpec> = members.iter().map(|m| m.spec()).collect();
        let spec = DatasetSpec::mixture(&specs, weights, stop)?;
        let mut builder = ShardedDataset::from_spec(spec);
        if let Some(m) = members.first() {
            builder = builder.store(m.store().clone());
        }
        Ok(builder)
    }

    /// Each member's draws in an epoch of a mixture ([`ShardedDataset::mixture`]); `None` for
    /// one dataset.
    pub fn member_draws(&self) -> Option<Vec<u64>> {
        let m = self.inner.spec.mixture.as_ref()?;
        crate::order::EpochOrder::mixed(&self.inner.spec.counts, m, self.inner.config, 0)
            .ok()?
            .member_draws()
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

    /// Samples per epoch in the dataset (all ranks together, before padding or dropping): a
    /// mixture's positions by its stop rule.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the dataset holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What became of the samples that could not be read, since the dataset was built: the
    /// failed reads by reason, the padding repeats that made up for them, damaged shards.
    pub fn stats(&self) -> ShardStats {
        let mut s = self.inner.stats.snapshot();
        s.cache = self.inner.cache.epoch_stats();
        if let Some(m) = &self.inner.spec.mixture {
            s.members.resize(m.shards.len(), 0);
        }
        s
    }

    /// The policy for samples that cannot be read.
    pub fn on_sample_error(&self) -> OnSampleError {
        self.inner.on_sample_error
    }

    /// The order's options (their `drop_last` is each epoch's loader's, see
    /// [`plan`](Self::plan)).
    pub fn order_config(&self) -> OrderConfig {
        self.inner.config
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// The plan the loader's epoch `epoch` reads (after a resume: what is left of it), as the
    /// loader last began it
    /// ([`begin_epoch`](longshore_data::IterableDataset::begin_epoch)); `None` when no loader
    /// began that epoch.
    pub fn plan(&self, epoch: u64) -> Option<Arc<EpochPlan>> {
        self.inner.begun(epoch, None).map(|b| b.plan)
    }
}
