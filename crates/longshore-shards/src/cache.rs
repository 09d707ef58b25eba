//! The node's shard cache: a directory of downloaded shards shared by every rank and worker
//! process on the node, within a byte budget.
//!
//! - **Budget.** The bytes of complete shards plus the reservations of downloads in progress
//!   never exceed the budget. A budget smaller than the largest shard is refused by
//!   [`ShardCache::open`] ([`ShardError::BudgetTooSmall`]), so a request can always be met once
//!   readers release their shards; a request that finds the cache full of shards in use waits
//!   up to [`CacheConfig::wait_timeout`] and then fails with [`ShardError::CacheFull`] (it does
//!   not hang). While it waits, it is announced node-wide ([`ShardCache::has_waiters`]), so
//!   that holders of leases they are not using now can let them go
//!   ([`CachedShard::release_unread`]).
//! - **Leases.** [`ShardCache::get`] returns a [`CachedShard`], a lease: the shard stays on
//!   disk until it is dropped (or [`released`](CachedShard::release)), which marks the shard
//!   consumed. Only shards no reader leases are ever evicted.
//! - **Eviction by the schedule.** A dataset's sample order is a pure function of (seed, epoch,
//!   shards, ranks, workers), so each reader knows what it will read and when: readers register
//!   it ([`ShardCache::schedule_reader`]), and the cache evicts by Belady's rule, the shard whose
//!   next read on the node is furthest ahead first (one never read again this epoch before any).
//!   See [Eviction by the schedule](#eviction-by-the-schedule). Without a registered schedule it
//!   evicts the least recently used unleased shard, consumed ones first.
//! - **Prefetch.** [`ShardCache::prefetch`] takes the shards the caller will read next and
//!   downloads ahead on background threads, in need order (the shard read soonest first) and
//!   within the budget. A shard that does not fit waits, first in the queue, until room
//!   changes (a lease let go, checked again within 50 ms for other processes), so the next
//!   shards are downloaded as soon as the current ones are read for the last time, together,
//!   rather than missed one by one. With a schedule a prefetch takes only room the schedule
//!   leaves free until the shard's first read, or that of shards no reader needs before the
//!   prefetched shard's last read (Belady's rule: what it evicts is needed later than
//!   everything it brings): below the working set any such shard (the shard two workers' runs
//!   share, read by one at the start and by the other at the end, is the usual one); when the
//!   budget holds the working set only shards the epoch has not read yet (the last epoch's,
//!   kept), so that no shard is downloaded twice in an epoch, and the next shards are on disk
//!   before they are read even when the last epoch's fill the cache ([`EpochCacheStats::misses`]
//!   counts the reads that still waited). Without a schedule it evicts only consumed shards.
//! - **Stats.** [`ShardCache::stats`] counts hits, downloads, re-downloads, evictions, waits and
//!   bytes; [`ShardCache::epoch_stats`] the downloads, re-downloads, evictions (and those of a
//!   shard still needed) and bytes of each epoch.
//! - **Concurrency.** At most [`CacheConfig::max_concurrent_downloads`] downloads run at once
//!   on the node (slot lock files). A shard is downloaded once: a process that wants a shard
//!   another is downloading waits for it.
//! - **Crash safety.** A download goes to `tmp/` under a temporary name, is size-checked and
//!   synced, and only then renamed into `data/`; a reader only ever opens `data/`. Opening the
//!   cache reuses complete shards and deletes temporary files whose writer is gone.
//!
//! Cross-process coordination is by files only (no shared-memory names): `index.json`, guarded
//! by an exclusive lock on `index.lock` for short critical sections; a shared lock on a data
//! file per lease (an evictor's exclusive `try_lock` fails while any lease is held, and the OS
//! drops the locks of a process that dies); an exclusive lock on a temporary file while its
//! download runs (a waiter blocks on a shared lock of it; a successful `try_lock_shared` means
//! its writer died). The locks are `std::fs::File::lock` (`flock` on Unix), so the directory
//! should be on a local file system.
//!
//! # Eviction by the schedule
//!
//! Each reader registers its reads as `(tick, shard)` pairs; a `ShardedDataset` reader does it
//! at its first read (sample `i` of worker `w` of `W` is read at tick `i W + w`) and reports
//! its progress at each read. The node's next read of a shard is the earliest among this
//! process's readers (counted from each reader's own progress) and the tables other processes
//! publish: each process sharing the directory writes `plans/<pid>.<n>.json` (each shard's next
//! tick and its first and last tick of the epoch) when a reader registers or goes and at most
//! every 100 ms while its readers read, beside a lock file it holds while it lives (a table
//! whose writer died is deleted). Another process's ticks are compared with this process's
//! progress: the ranks of a job walk their equal streams in step, so one rank's tick is
//! another's. That is the approximation across processes: a table up to 100 ms old shows a
//! shard as needed sooner than it is (kept, never evicted early), and a process of another
//! epoch is not seen (at an epoch's turn the last tables of the old one are ignored).
//!
//! The *working set* is the most bytes of shards live at once on the node, a shard being live
//! from its first read in the epoch to its last ([`ShardCache::working_set`]; offline,
//! [`working_set_bytes`]). A budget that holds it downloads each shard once per epoch (fewer
//! when shards stay from the last epoch). A smaller budget downloads some shards again: the
//! first eviction of a shard still needed warns once (`longshore::shards`, naming the working
//! set as the budget that would suffice), and Belady's rule keeps the re-downloads near the
//! fewest possible, which [`belady_downloads`] computes offline from the same order. Under
//! such a budget ([`ShardCache::below_working_set`]) a reader keeps a lease only on the shard
//! it reads, so that no idle lease keeps Belady's choice from being evicted.
//!
//! A [`ShardedDataset`](crate::dataset::ShardedDataset) below the working set reads the
//! samples of shards it reads thinly (a wide shuffle's) by range instead of downloading their
//! shards again ([`crate::dataset`], "Range reads"), counted in
//! [`EpochCacheStats::range_reads`]. Downloads and range reads per epoch as a function of the
//! budget and the shuffle block: 20 shards of 100 samples read by 2 workers (batches of 8), the
//! second epoch (`cache-bench`; docs/benchmarks.md has every row), against Belady's bound for
//! whole-shard downloads over the loader's delivery order:
//!
//! | shuffle block | working set | budget 3 shards | 4 | 8 | 12 | 20 |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | 0 (shard order) | 2 shards | 20 | 20 | 17 | 12 | 0 |
//! | 250 samples (2.5 shards) | 9 shards | 0 + 1,700 ranged (Belady 528) | 2 + 1,424 (311) | 18 + 190 (21) | 12 | 0 |
//! | 1,000 samples (10 shards) | 20 shards | 0 + 1,700 (1,293) | 0 + 1,600 (1,134) | 0 + 1,200 (675) | 0 + 800 (371) | 0 |
//! | the whole epoch (the default 2^18) | 20 shards | 0 + 1,700 (1,303) | 0 + 1,600 (1,135) | 0 + 1,200 (676) | 0 + 800 (379) | 0 |
//!
//! A budget that holds the working set downloads each shard at most once (fewer than 20 where
//! shards stay from the last epoch: those the prefetch did not displace to fetch the next
//! shards before they are read). Below it, each read whose shard is not on disk is one
//! range `GET` of a sample (about 2 KiB here) where whole-shard caching made Belady's count of
//! downloads of a shard (205 KiB) each; the shards on disk serve their share of the reads.
//! Eviction itself is Belady's rule over the readers' schedules: with every read a download
//! (as through [`ShardCache::get`] alone), one worker per process makes Belady's count exactly
//! (`tests/cache_schedule.rs`).
//!
//! Readers get a path and an open [`File`]; this crate has no `unsafe`, so it hands out no
//! memory map (map the file yourself if you want one).
//!
//! ```
//! use longshore_shards::cache::{CacheConfig, ShardCache};
//! use longshore_shards::store::ShardStore;
//! # let src = tempfile::tempdir().unwrap();
//! # for i in 0..4 { std::fs::write(src.path().join(format!("s-{i}.tar")), vec![i as u8; 100]).unwrap(); }
//! # let root = src.path().display();
//! # let node_dir = tempfile::tempdir().unwrap();
//! let store = ShardStore::from_env();
//! let shards = store.resolve(&[format!("{root}/s-{{0..3}}.tar")])?;
//! let cache = ShardCache::open(CacheConfig::new(node_dir.path(), 250), store, &shards)?;
//! for (i, shard) in shards.shards.iter().enumerate() {
//!     let local = cache.get(shard)?; // leased until dropped
//!     cache.prefetch(&shards.shards[i + 1..]);
//!     assert_eq!(local.read_all()?, vec![i as u8; 100]);
//! } // each lease ends here: the shard may be evicted for the next ones
//! assert!(cache.usage()?.complete_bytes <= 250);
//! # Ok::<(), longshore_shards::ShardError>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::ShardError;
use crate::store::{ShardInfo, ShardList, ShardStore};

mod bounds;
mod evict;
mod index;
mod lease;
mod schedule;

pub use bounds::{belady_downloads, working_set_bytes};
pub use lease::CachedShard;
use lease::{Known, Waiter};
pub use schedule::{EpochCacheStats, ReaderSchedule};
use schedule::{Schedules, View};

use evict::{Need, Reserved};
use index::{Entry, Index, Locked, key_for, writer_gone};

const TARGET: &str = "longshore::shards";

/// How a [`ShardCache`] is set up. Every process sharing a directory should use the same
/// budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The cache directory (created if missing). One per node, on a local file system.
    pub dir: PathBuf,
    /// The most bytes the cache holds, counting downloads in progress.
    pub budget_bytes: u64,
    /// The most downloads running at once on the node (at least 1).
    pub max_concurrent_downloads: usize,
    /// How long [`ShardCache::get`] waits for room before [`ShardError::CacheFull`].
    pub wait_timeout: Duration,
}

impl CacheConfig {
    /// A configuration with 4 concurrent downloads and a 10-minute wait limit.
    pub fn new(dir: impl Into<PathBuf>, budget_bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            budget_bytes,
            max_concurrent_downloads: 4,
            wait_timeout: Duration::from_secs(600),
        }
    }
}

/// What one [`ShardCache`] handle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// `get`s served by a shard already on disk.
    pub hits: u64,
    /// Shards this handle downloaded (demand and prefetch).
    pub downloads: u64,
    /// Their bytes.
    pub downloaded_bytes: u64,
    /// Shards this handle evicted.
    pub evictions: u64,
    /// Times a `get` waited (for room, or for another's download of the same shard).
    pub waits: u64,
    /// Downloads of a shard this handle had on disk earlier in the same epoch (see
    /// [`ShardCache::epoch_stats`] for the counts of each epoch).
    pub redownloads: u64,
}

/// The node-wide state of a cache directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheUsage {
    /// The budget of the handle that asked.
    pub budget_bytes: u64,
    /// Bytes of complete shards.
    pub complete_bytes: u64,
    /// Bytes reserved by downloads in progress.
    pub reserved_bytes: u64,
    /// Bytes of complete shards leased by readers.
    pub leased_bytes: u64,
    /// Complete shards.
    pub shards: usize,
}

#[derive(Debug, Default)]
struct Prefetch {
    queue: VecDeque<ShardInfo>,
    shutdown: bool,
    threads_pid: Option<u32>,
    /// When the queue's first shard found no room, and when to try it again: once room
    /// changes (a lease let go, a prefetch done: [`Inner::room_changed`]), else after
    /// [`PREFETCH_RETRY`]`.1` (other processes' releases are not announced here).
    blocked: Option<(Instant, Instant)>,
}

/// The shortest interval between two tries of a prefetch that found no room (what a stream of
/// releases costs the index) and the longest a refused prefetch waits without being woken.
const PREFETCH_RETRY: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(50));

#[derive(Debug)]
struct Inner {
    config: CacheConfig,
    store: ShardStore,
    prefetch: Arc<(Mutex<Prefetch>, Condvar)>,
    /// Whether a prefetch waits for room ([`Prefetch::blocked`]): what a lease's drop looks at
    /// before it takes the queue's lock (which a prefetch thread holds while it reserves).
    prefetch_blocked: AtomicBool,
    hits: AtomicU64,
    downloads: AtomicU64,
    downloaded_bytes: AtomicU64,
    evictions: AtomicU64,
    waits: AtomicU64,
    redownloads: AtomicU64,
    /// The readers' schedules, which eviction and prefetch follow.
    schedule: Schedules,
    /// The shards this process leased through the index, by key: which file it was, and
    /// whether this process marked it consumed. A later lease of the same file skips the
    /// index (see [`Inner::lease_known`]).
    known: Mutex<HashMap<String, Known>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let (state, cond) = &*self.prefetch;
        state.lock().unwrap_or_else(|p| p.into_inner()).shutdown = true;
        cond.notify_all();
        self.schedule.withdraw();
    }
}

/// A handle on the node's shard cache directory. Cheap to open; open one per process (its
/// prefetch threads are started lazily, in the process that prefetches). Clones share the
/// handle.
#[derive(Debug, Clone)]
pub struct ShardCache {
    inner: Arc<Inner>,
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> ShardError {
    ShardError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ShardCache {
    /// Opens (creating) the cache directory for a job's shards: checks the budget holds the
    /// largest shard, reuses the complete shards already there and deletes temporary files
    /// left by processes that died.
    ///
    /// # Errors
    ///
    /// [`ShardError::BudgetTooSmall`] naming the budget and the largest shard's URL and size;
    /// [`ShardError::Io`] for the directory.
    pub fn open(
        config: CacheConfig,
        store: ShardStore,
        shards: &ShardList,
    ) -> Result<Self, ShardError> {
        if let Some(largest) = shards.largest()
            && largest.size > config.budget_bytes
        {
            return Err(ShardError::BudgetTooSmall {
                budget: config.budget_bytes,
                url: largest.url.clone(),
                shard_size: largest.size,
            });
        }
        for sub in ["data", "tmp", "slots", "waiters", "plans"] {
            let d = config.dir.join(sub);
            fs::create_dir_all(&d).map_err(|e| io("create", &d, e))?;
        }
        let cache = Self {
            inner: Arc::new(Inner {
                config: CacheConfig {
                    max_concurrent_downloads: config.max_concurrent_downloads.max(1),
                    ..config
                },
                store,
                prefetch: Arc::default(),
                prefetch_blocked: AtomicBool::new(false),
                hits: AtomicU64::new(0),
                downloads: AtomicU64::new(0),
                downloaded_bytes: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                redownloads: AtomicU64::new(0),
                schedule: Schedules::new(shards),
                known: Mutex::default(),
            }),
        };
        cache.inner.reconcile()?;
        Ok(cache)
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// This handle's counters.
    pub fn stats(&self) -> CacheStats {
        let i = &self.inner;
        CacheStats {
            hits: i.hits.load(Ordering::Relaxed),
            downloads: i.downloads.load(Ordering::Relaxed),
            downloaded_bytes: i.downloaded_bytes.load(Ordering::Relaxed),
            evictions: i.evictions.load(Ordering::Relaxed),
            waits: i.waits.load(Ordering::Relaxed),
            redownloads: i.redownloads.load(Ordering::Relaxed),
        }
    }

    /// The directory's state, node-wide.
    ///
    /// # Errors
    ///
    /// [`ShardError::Io`] for the index.
    pub fn usage(&self) -> Result<CacheUsage, ShardError> {
        let l = self.inner.lock_index()?;
        Ok(self.inner.usage(&l.index))
    }

    /// The shard on local disk, leased: from the cache, after another process's download of
    /// it, or downloaded now (evicting unleased shards, least recently used and consumed
    /// first, to make room). Blocks until then.
    ///
    /// # Errors
    ///
    /// [`ShardError::BudgetTooSmall`] for a shard larger than the budget;
    /// [`ShardError::CacheFull`] when no room came within the wait limit; the download's
    /// errors ([`ShardError::Fetch`], …); [`ShardError::Io`].
    pub fn get(&self, shard: &ShardInfo) -> Result<CachedShard, ShardError> {
        self.get_or_room(shard, true)
            .map(|lease| lease.expect("get waits for room"))
    }

    /// As [`get`](Self::get), but `None` where `get` would wait for room (it still waits for
    /// another process's download of the shard): a reader below the working set then reads
    /// its sample by a range `GET`.
    pub(crate) fn get_if_room(&self, shard: &ShardInfo) -> Result<Option<CachedShard>, ShardError> {
        self.get_or_room(shard, false)
    }

    fn get_or_room(
        &self,
        shard: &ShardInfo,
        wait_for_room: bool,
    ) -> Result<Option<CachedShard>, ShardError> {
        let inner = &self.inner;
        if shard.size > inner.config.budget_bytes {
            return Err(ShardError::BudgetTooSmall {
                budget: inner.config.budget_bytes,
                url: shard.url.clone(),
                shard_size: shard.size,
            });
        }
        let key = key_for(&shard.url);
        if let Some(lease) = inner.lease_known(&key, shard) {
            return Ok(Some(lease));
        }
        let start = Instant::now();
        let mut nap = Duration::from_millis(2);
        let mut waiting: Option<Waiter> = None;
        loop {
            let mut l = inner.lock_index()?;
            match l.index.entries.get(&key).cloned() {
                Some(e) if e.downloading.is_none() => {
                    let same = e.size == shard.size
                        && (e.url.is_empty() || e.url == shard.url)
                        && !matches!((&e.etag, &shard.etag), (Some(a), Some(b)) if a != b);
                    if same {
                        if let Some(lease) = inner.lease(&mut l, &key, shard)? {
                            inner.hits.fetch_add(1, Ordering::Relaxed);
                            return Ok(Some(lease));
                        }
                        continue; // the file was gone; the entry is dropped
                    }
                    // Another version of the object: replace it once no reader holds it.
                    if !inner.try_evict(&mut l, &key)? {
                        drop(l);
                        if !wait_for_room {
                            return Ok(None);
                        }
                        inner.announce(&mut waiting)?;
                        inner.wait_or_fail(shard, start, &mut nap)?;
                    }
                }
                Some(e) => {
                    // Another download of it is running: wait for it, then look again.
                    drop(l);
                    inner.waits.fetch_add(1, Ordering::Relaxed);
                    let temp = inner
                        .config
                        .dir
                        .join("tmp")
                        .join(e.downloading.unwrap_or_default());
                    if let Ok(f) = File::open(&temp) {
                        if f.try_lock_shared().is_ok() {
                            inner.reclaim_if_stale(&key)?;
                        } else {
                            let _ = f.lock_shared();
                        }
                    }
                }
                None => {
                    if let Some(reserved) = inner.reserve(&mut l, &key, shard, Need::Now)? {
                        drop(l);
                        return inner.download(reserved, shard, true);
                    }
                    drop(l);
                    if !wait_for_room {
                        return Ok(None);
                    }
                    inner.announce(&mut waiting)?;
                    inner.wait_or_fail(shard, start, &mut nap)?;
                }
            }
        }
    }

    /// Counts a sample read by a range `GET` (`bytes` long) into the epoch's stats; the
    /// first warns that the budget is below the working set, if no eviction did.
    pub(crate) fn count_range_read(&self, bytes: u64) {
        let schedule = &self.inner.schedule;
        schedule.count(|e| {
            e.range_reads += 1;
            e.range_bytes += bytes;
        });
        if schedule.first_warning() {
            let (ws, shards) = schedule.view(&self.inner.config.dir).working_set();
            evict::warn_below_working_set(self.inner.config.budget_bytes, ws, shards);
        }
    }

    /// Counts a reader's wait for a shard not on disk (see [`EpochCacheStats::misses`]).
    pub(crate) fn count_miss(&self, waited: Duration) {
        self.inner.schedule.count(|e| {
            e.misses += 1;
            e.miss_wait += waited;
        });
    }

    /// The shard leased if it is complete on disk now, else `None`: never downloads and never
    /// waits (for room or for another's download). A reader holding leases asks this first
    /// and releases them before a blocking [`get`](Self::get), so that readers never wait
    /// for room while holding it.
    ///
    /// # Errors
    ///
    /// [`ShardError::Io`] for the index or the file.
    pub fn get_cached(&self, shard: &ShardInfo) -> Result<Option<CachedShard>, ShardError> {
        let inner = &self.inner;
        let key = key_for(&shard.url);
        if let Some(lease) = inner.lease_known(&key, shard) {
            return Ok(Some(lease));
        }
        let mut l = inner.lock_index()?;
        let Some(e) = l.index.entries.get(&key) else {
            return Ok(None);
        };
        let same = e.downloading.is_none()
            && e.size == shard.size
            && (e.url.is_empty() || e.url == shard.url)
            && !matches!((&e.etag, &shard.etag), (Some(a), Some(b)) if a != b);
        if !same {
            return Ok(None);
        }
        let lease = inner.lease(&mut l, &key, shard)?;
        if lease.is_some() {
            inner.hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(lease)
    }

    /// Whether the shard is complete on disk now (a file test: no index, no lease).
    pub(crate) fn is_complete(&self, shard: &ShardInfo) -> bool {
        self.inner.data_path(&key_for(&shard.url)).exists()
    }

    /// Downloads, in the background, the shards the caller will read next, in need order,
    /// as they fit without evicting shards still needed first (see the [module docs](self)):
    /// one that does not fit yet waits for room. Replaces the previous prefetch order; call
    /// it again as reading moves on. Errors are logged (a later `get` of the shard reports
    /// them).
    pub fn prefetch(&self, upcoming: &[ShardInfo]) {
        let mut queue: Vec<ShardInfo> = upcoming.to_vec();
        let keys: Vec<String> = queue.iter().map(|s| key_for(&s.url)).collect();
        if let Some(next) = self.inner.schedule.own_next_uses(&keys) {
            // Need order: the shard read soonest first (a stable sort keeps the caller's
            // order among equals), those no reader of this process reads again last.
            let mut keyed: Vec<(u64, ShardInfo)> = next
                .into_iter()
                .map(|t| t.unwrap_or(u64::MAX))
                .zip(queue)
                .collect();
            keyed.sort_by_key(|(t, _)| *t);
            queue = keyed.into_iter().map(|(_, s)| s).collect();
        }
        let (state, cond) = &*self.inner.prefetch;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.queue = queue.into();
        s.blocked = None;
        self.inner.prefetch_blocked.store(false, Ordering::Relaxed);
        let pid = std::process::id();
        if s.threads_pid != Some(pid) {
            s.threads_pid = Some(pid);
            let n = self.inner.config.max_concurrent_downloads.min(4);
            for i in 0..n {
                let weak = Arc::downgrade(&self.inner);
                let shared = Arc::clone(&self.inner.prefetch);
                let spawned = std::thread::Builder::new()
                    .name(format!("longshore-prefetch-{i}"))
                    .spawn(move || prefetch_thread(&weak, &shared));
                if let Err(e) = spawned {
                    tracing::warn!(target: TARGET, error = %e, "cannot start a prefetch thread");
                }
            }
        }
        cond.notify_all();
    }
}

/// A prefetch thread: takes the next shard and reserves its room while holding the queue,
/// so that the threads reserve in the caller's order, then downloads it. A shard that finds no
/// room stays first in the queue until room changes (see [`Prefetch::blocked`]): the room an
/// epoch's next shards need is often freed only as the current ones are read for the last
/// time, and they should be downloaded together then, not one by one as the reader misses.
fn prefetch_thread(cache: &Weak<Inner>, shared: &(Mutex<Prefetch>, Condvar)) {
    let (state, cond) = shared;
    loop {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        let next = loop {
            if s.shutdown {
                return;
            }
            if let Some((_, retry)) = s.blocked {
                let now = Instant::now();
                if now < retry {
                    s = cond
                        .wait_timeout(s, retry - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
            }
            if let Some(n) = s.queue.pop_front() {
                break n;
            }
            s = cond.wait(s).unwrap_or_else(|p| p.into_inner());
        };
        let Some(inner) = cache.upgrade() else { return };
        let reserved = inner.prefetch_reserve(&next);
        let blocked = matches!(reserved, Ok(None));
        inner.prefetch_blocked.store(blocked, Ordering::Relaxed);
        let reserved = match reserved {
            Ok(Some(Some(r))) => {
                s.blocked = None;
                r
            }
            Ok(Some(None)) => {
                s.blocked = None;
                continue; // present, or being downloaded
            }
            Ok(None) => {
                tracing::trace!(target: TARGET, url = %next.url, "prefetch waits for room");
                s.queue.push_front(next);
                let now = Instant::now();
                s.blocked = Some((now, now + PREFETCH_RETRY.1));
                continue;
            }
            Err(e) => {
                s.blocked = None;
                tracing::warn!(target: TARGET, url = %next.url, error = %e, "prefetch failed");
                continue;
            }
        };
        drop(s);
        if let Err(e) = inner.download(reserved, &next, false) {
            tracing::warn!(target: TARGET, url = %next.url, error = %e, "prefetch failed");
        }
        inner.room_changed();
    }
}

impl Inner {
    fn data_path(&self, key: &str) -> PathBuf {
        self.config.dir.join("data").join(key)
    }

    /// Room in the cache may have changed (a lease let go, a prefetch done): a prefetch that
    /// found none tries again, no sooner than [`PREFETCH_RETRY`]`.0` after its last try.
    pub(super) fn room_changed(&self) {
        // Cheap when no prefetch waits (every lease's drop calls this); a wake-up missed in the
        // race with a refusal being recorded comes with the 50 ms retry.
        if !self.prefetch_blocked.load(Ordering::Relaxed) {
            return;
        }
        let (state, cond) = &*self.prefetch;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tried, retry)) = s.blocked {
            s.blocked = Some((tried, retry.min(tried + PREFETCH_RETRY.0)));
            drop(s);
            cond.notify_one();
        }
    }

    fn usage(&self, index: &Index) -> CacheUsage {
        let mut u = CacheUsage {
            budget_bytes: self.config.budget_bytes,
            ..CacheUsage::default()
        };
        for (key, e) in &index.entries {
            if e.downloading.is_some() {
                u.reserved_bytes += e.size;
                continue;
            }
            u.complete_bytes += e.size;
            u.shards += 1;
            let leased = File::open(self.data_path(key))
                .is_ok_and(|f| matches!(f.try_lock(), Err(TryLockError::WouldBlock)));
            if leased {
                u.leased_bytes += e.size;
            }
        }
        u
    }

    /// Runs a reserved download (within a download slot) and publishes the shard; with
    /// `lease`, returns it leased.
    fn download(
        self: &Arc<Self>,
        r: Reserved,
        shard: &ShardInfo,
        lease: bool,
    ) -> Result<Option<CachedShard>, ShardError> {
        let result = {
            let _slot = self.download_slot()?;
            tracing::debug!(target: TARGET, url = %shard.url, bytes = shard.size, "downloading");
            self.store.download(shard, &r.temp)
        };
        let mut l = self.lock_index()?;
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                l.index.entries.remove(&r.key);
                let _ = fs::remove_file(&r.temp);
                self.save(&l)?;
                return Err(e);
            }
        };
        let data = self.data_path(&r.key);
        fs::rename(&r.temp, &data).map_err(|e| io("rename", &data, e))?;
        if let Some(e) = l.index.entries.get_mut(&r.key) {
            e.downloading = None;
            e.etag = report.etag.or_else(|| shard.etag.clone());
        }
        self.save(&l)?;
        drop(r.file); // waiters wake, and find the shard complete once the index is unlocked
        self.downloads.fetch_add(1, Ordering::Relaxed);
        self.downloaded_bytes
            .fetch_add(report.bytes, Ordering::Relaxed);
        let again = self.schedule.saw(&r.key);
        if again {
            self.redownloads.fetch_add(1, Ordering::Relaxed);
        }
        self.schedule.count(|e| {
            e.downloads += 1;
            e.redownloads += u64::from(again);
            e.downloaded_bytes += report.bytes;
        });
        if lease {
            return self.lease(&mut l, &r.key, shard);
        }
        Ok(None)
    }

    /// Reserves room for a shard to prefetch, evicting only consumed shards: `None` if it
    /// does not fit, `Some(None)` if it is present or being downloaded.
    fn prefetch_reserve(&self, shard: &ShardInfo) -> Result<Option<Option<Reserved>>, ShardError> {
        if shard.size > self.config.budget_bytes {
            return Ok(None);
        }
        let key = key_for(&shard.url);
        if self.data_path(&key).exists() {
            // Complete on disk (only complete files are in `data/`): no need for the index.
            return Ok(Some(None));
        }
        let mut l = self.lock_index()?;
        if l.index.entries.contains_key(&key) {
            return Ok(Some(None));
        }
        let r = self.reserve(&mut l, &key, shard, Need::Ahead)?;
        Ok(r.map(Some))
    }

    /// Deletes a download's reservation whose writer died.
    fn reclaim_if_stale(&self, key: &str) -> Result<(), ShardError> {
        let mut l = self.lock_index()?;
        let Some(temp) = l.index.entries.get(key).and_then(|e| e.downloading.clone()) else {
            return Ok(());
        };
        let path = self.config.dir.join("tmp").join(&temp);
        if writer_gone(&path) {
            tracing::info!(target: TARGET, temp = %temp, "reclaiming a dead download");
            let _ = fs::remove_file(&path);
            l.index.entries.remove(key);
            self.save(&l)?;
        }
        Ok(())
    }

    /// Sleeps before the next look for room, or fails after the wait limit.
    fn wait_or_fail(
        &self,
        shard: &ShardInfo,
        start: Instant,
        nap: &mut Duration,
    ) -> Result<(), ShardError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        if start.elapsed() >= self.config.wait_timeout {
            let l = self.lock_index()?;
            let u = self.usage(&l.index);
            return Err(ShardError::CacheFull {
                url: shard.url.clone(),
                needed: shard.size,
                budget: self.config.budget_bytes,
                leased: u.leased_bytes,
                reserved: u.reserved_bytes,
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(*nap);
        *nap = (*nap * 2).min(Duration::from_millis(200));
        Ok(())
    }

    /// Takes one of the node's download slots (a lock file), waiting for one if all are
    /// taken. The slot is held until the returned file is dropped.
    fn download_slot(&self) -> Result<File, ShardError> {
        let n = self.config.max_concurrent_downloads;
        let first = (TEMP_COUNTER.fetch_add(1, Ordering::Relaxed) as usize) % n;
        let open = |i: usize| {
            let p = self.config.dir.join("slots").join(format!("{i}.lock"));
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .map_err(|e| io("open", &p, e))
                .map(|f| (f, p))
        };
        for i in (0..n).map(|k| (first + k) % n) {
            let (f, p) = open(i)?;
            match f.try_lock() {
                Ok(()) => return Ok(f),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(io("lock", &p, e)),
            }
        }
        let (f, p) = open(first)?;
        f.lock().map_err(|e| io("lock", &p, e))?;
        Ok(f)
    }
}
