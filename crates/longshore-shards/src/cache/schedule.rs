//! The readers' schedule, which the cache evicts and prefetches by: each reader registers the
//! shards it will read, in order, with the tick of each read ([`ShardCache::schedule_reader`]);
//! the node's view of them ([`View`]) gives each shard's next use, the shards live at once (the
//! working set) and the room the schedule leaves free. Other processes sharing the directory
//! publish theirs in `plans/` ([`Schedules::publish`]). Also the offline computations over a
//! reference string: [`belady_downloads`] and [`working_set_bytes`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::bounds::peak;
use super::index::{key_for, writer_gone};
use super::{Inner, ShardCache, TARGET, TEMP_COUNTER};
use crate::store::ShardList;

/// How often a process rewrites its published next uses while its readers move on.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// A stretch of one reader's reads of one shard: ticks `start..=end`.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u64,
    end: u64,
    shard: u32,
}

/// One reader's schedule: its reads in order, and how far it has read.
#[derive(Debug)]
pub(super) struct ReaderPlan {
    epoch: u64,
    runs: Vec<Run>,
    /// Shard -> its runs (indices into `runs`, in order).
    by_shard: HashMap<u32, Vec<u32>>,
    /// The tick of the reader's next read.
    progress: AtomicU64,
}

impl ReaderPlan {
    fn new(epoch: u64, uses: impl IntoIterator<Item = (u64, usize)>) -> ReaderPlan {
        let mut runs: Vec<Run> = Vec::new();
        for (tick, shard) in uses {
            let shard = u32::try_from(shard).unwrap_or(u32::MAX);
            match runs.last_mut() {
                Some(r) if r.shard == shard && tick >= r.end => r.end = tick,
                _ => runs.push(Run {
                    start: tick,
                    end: tick,
                    shard,
                }),
            }
        }
        let mut by_shard: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, r) in runs.iter().enumerate() {
            by_shard.entry(r.shard).or_default().push(i as u32);
        }
        let progress = AtomicU64::new(runs.first().map_or(0, |r| r.start));
        ReaderPlan {
            epoch,
            runs,
            by_shard,
            progress,
        }
    }

    fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    fn done(&self) -> bool {
        self.runs.last().is_none_or(|r| self.progress() > r.end)
    }

    /// The tick of this reader's next read of `shard` (its progress if it reads it now).
    fn next_use(&self, shard: usize) -> Option<u64> {
        let p = self.progress();
        let runs = self.by_shard.get(&u32::try_from(shard).ok()?)?;
        let k = runs.partition_point(|&r| self.runs[r as usize].end < p);
        runs.get(k).map(|&r| self.runs[r as usize].start.max(p))
    }

    /// How many ticks ahead of its progress this reader reads `shard` next.
    fn ahead(&self, shard: usize) -> Option<u64> {
        let p = self.progress();
        let runs = self.by_shard.get(&u32::try_from(shard).ok()?)?;
        let k = runs.partition_point(|&r| self.runs[r as usize].end < p);
        runs.get(k)
            .map(|&r| self.runs[r as usize].start.saturating_sub(p))
    }

    /// How many ticks ahead of its progress this reader reads `shard` for the last time.
    fn last_ahead(&self, shard: usize) -> Option<u64> {
        let p = self.progress();
        let runs = self.by_shard.get(&u32::try_from(shard).ok()?)?;
        let end = self.runs[*runs.last()? as usize].end;
        (end >= p).then(|| end - p)
    }

    /// Whether this reader has read `shard` this epoch (its first read is behind it).
    fn started(&self, shard: usize) -> bool {
        let Some(runs) = u32::try_from(shard)
            .ok()
            .and_then(|s| self.by_shard.get(&s))
        else {
            return false;
        };
        self.runs[runs[0] as usize].start < self.progress()
    }

    /// Each shard's first and last tick in the whole schedule.
    fn spans(&self) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        self.by_shard.iter().map(|(&s, runs)| {
            let first = self.runs[runs[0] as usize].start;
            let last = self.runs[runs[runs.len() - 1] as usize].end;
            (s as usize, first, last)
        })
    }
}

/// A reader's schedule registered with the cache ([`ShardCache::schedule_reader`]): while it
/// lives, the cache evicts and prefetches by it. Tell it how far the reader got with
/// [`advance`](Self::advance); dropping it withdraws the schedule.
#[derive(Debug)]
pub struct ReaderSchedule {
    cache: Weak<Inner>,
    id: u64,
    plan: Arc<ReaderPlan>,
}

impl ReaderSchedule {
    /// The reader's next read is at `tick` (reads before it are done). Cheap: an atomic store,
    /// and at most every 100 ms a rewrite of this process's published next uses.
    pub fn advance(&self, tick: u64) {
        self.plan.progress.store(tick, Ordering::Relaxed);
        if let Some(inner) = self.cache.upgrade() {
            inner.schedule.publish_if_due(&inner.config.dir);
        }
    }

    /// The epoch it was registered for.
    pub fn epoch(&self) -> u64 {
        self.plan.epoch
    }
}

impl Drop for ReaderSchedule {
    fn drop(&mut self) {
        if let Some(inner) = self.cache.upgrade() {
            let s = &inner.schedule;
            s.state().readers.remove(&self.id);
            s.publish(&inner.config.dir);
        }
    }
}

/// What one [`ShardCache`] handle did in one epoch (the epoch of the schedules its readers
/// registered; see [`ShardCache::epoch_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpochCacheStats {
    /// The epoch.
    pub epoch: u64,
    /// Shards downloaded (demand and prefetch).
    pub downloads: u64,
    /// Of those, shards this handle had on disk earlier in the epoch (downloaded or leased),
    /// evicted since: the downloads a larger budget would have saved.
    pub redownloads: u64,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
    /// Shards evicted.
    pub evictions: u64,
    /// Evictions of a shard still needed in the epoch (by any reader on the node).
    pub forced_evictions: u64,
    /// Samples read by a range `GET` instead of from a cached shard: below the working set, a
    /// read whose shard is not on disk (see [`crate::dataset`], "Range reads").
    pub range_reads: u64,
    /// The bytes of those range reads.
    pub range_bytes: u64,
    /// Reads that found their shard not on disk and waited for it: for its download (the
    /// reader's own, or a prefetch's still running) or for room. A prefetch that keeps ahead
    /// of the readers leaves only each worker's first shards of the epoch here.
    pub misses: u64,
    /// How long readers waited on those misses, in all.
    pub miss_wait: std::time::Duration,
}

/// A process's published schedule (`plans/<pid>.json`, its liveness `plans/<pid>.lock`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Table {
    /// The fingerprint of the shard list the indices refer to.
    list: u64,
    epoch: u64,
    /// The earliest next read of the process's readers.
    now: u64,
    /// (shard, tick of its next read).
    next: Vec<(u32, u64)>,
    /// (shard, first tick, last tick) over the whole epoch.
    spans: Vec<(u32, u64, u64)>,
    /// The process's readers of the epoch (0 in a table written before it was counted: one).
    #[serde(default)]
    readers: usize,
}

/// Another process's table, as read.
#[derive(Debug)]
struct Other {
    modified: SystemTime,
    len: u64,
    table: Table,
    next: HashMap<u32, u64>,
}

#[derive(Debug, Default)]
struct State {
    epoch: Option<u64>,
    readers: HashMap<u64, Arc<ReaderPlan>>,
    next_id: u64,
    /// This process's published files and the lock that marks them live (per pid: a forked
    /// child publishes its own).
    published: Option<(u32, PathBuf, File)>,
    others: HashMap<PathBuf, Arc<Other>>,
    warned: bool,
    /// Keys this handle had on disk in the current epoch.
    seen: HashSet<String>,
    epochs: BTreeMap<u64, EpochCacheStats>,
}

/// The schedules the cache knows: this process's readers', and the other processes' tables.
#[derive(Debug)]
pub(super) struct Schedules {
    /// Cache key -> index in the shard list the cache was opened with.
    index: HashMap<String, usize>,
    sizes: Vec<u64>,
    list: u64,
    state: Mutex<State>,
    start: Instant,
    /// Milliseconds after `start` of the last publication.
    published_ms: AtomicU64,
    /// Whether the budget is smaller than the node's working set, as of the last registration.
    tight: AtomicBool,
}

impl Schedules {
    pub(super) fn new(shards: &ShardList) -> Schedules {
        let mut list: u64 = 0xcbf2_9ce4_8422_2325;
        for s in &shards.shards {
            for b in s.url.bytes().chain(s.size.to_le_bytes()) {
                list = (list ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Schedules {
            index: shards
                .shards
                .iter()
                .enumerate()
                .map(|(i, s)| (key_for(&s.url), i))
                .collect(),
            sizes: shards.shards.iter().map(|s| s.size).collect(),
            list,
            state: Mutex::default(),
            start: Instant::now(),
            published_ms: AtomicU64::new(0),
            tight: AtomicBool::new(false),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn shard_of(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// Records that `key` is on disk for this handle now (a lease or a download); `true` if
    /// it was already earlier in the epoch.
    pub(super) fn saw(&self, key: &str) -> bool {
        let mut st = self.state();
        if st.seen.contains(key) {
            return true;
        }
        st.seen.insert(key.to_owned());
        false
    }

    /// Whether `key` was on disk for this handle earlier in the epoch (a lease or a download).
    pub(super) fn had(&self, key: &str) -> bool {
        self.state().seen.contains(key)
    }

    /// Counts into the current epoch's stats, if there is one.
    pub(super) fn count(&self, f: impl FnOnce(&mut EpochCacheStats)) {
        let mut st = self.state();
        if let Some(epoch) = st.epoch {
            let e = st.epochs.entry(epoch).or_insert(EpochCacheStats {
                epoch,
                ..EpochCacheStats::default()
            });
            f(e);
        }
    }

    pub(super) fn epoch_stats(&self) -> Vec<EpochCacheStats> {
        self.state().epochs.values().copied().collect()
    }

    fn register(&self, plan: &Arc<ReaderPlan>) -> u64 {
        let mut st = self.state();
        if st.epoch != Some(plan.epoch) {
            st.epoch = Some(plan.epoch);
            st.seen.clear();
            let epoch = plan.epoch;
            st.epochs.entry(epoch).or_insert(EpochCacheStats {
                epoch,
                ..EpochCacheStats::default()
            });
        }
        st.next_id += 1;
        let id = st.next_id;
        st.readers.insert(id, Arc::clone(plan));
        id
    }

    /// Whether the warning was not given yet (and is now marked given).
    pub(super) fn first_warning(&self) -> bool {
        !std::mem::replace(&mut self.state().warned, true)
    }

    /// This process's readers' next read of each shard (by key; `None`: none of them reads it
    /// again), or `None` when the process has no readers.
    pub(super) fn own_next_uses(&self, keys: &[String]) -> Option<Vec<Option<u64>>> {
        let st = self.state();
        let epoch = st.epoch;
        let readers: Vec<&Arc<ReaderPlan>> = st
            .readers
            .values()
            .filter(|r| Some(r.epoch) == epoch)
            .collect();
        if readers.is_empty() {
            return None;
        }
        Some(
            keys.iter()
                .map(|k| {
                    let s = self.shard_of(k)?;
                    readers.iter().filter_map(|r| r.next_use(s)).min()
                })
                .collect(),
        )
    }

    /// This process's table: every shard its readers will still read, with its next tick.
    fn table(&self, st: &State) -> Option<Table> {
        let epoch = st.epoch?;
        let readers: Vec<&Arc<ReaderPlan>> =
            st.readers.values().filter(|r| r.epoch == epoch).collect();
        let mut next: HashMap<u32, u64> = HashMap::new();
        let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut now = u64::MAX;
        for r in &readers {
            if !r.done() {
                now = now.min(r.progress());
            }
            for (s, first, last) in r.spans() {
                let s = s as u32;
                let e = spans.entry(s).or_insert((first, last));
                e.0 = e.0.min(first);
                e.1 = e.1.max(last);
                if let Some(t) = r.next_use(s as usize) {
                    let n = next.entry(s).or_insert(t);
                    *n = (*n).min(t);
                }
            }
        }
        Some(Table {
            list: self.list,
            epoch,
            now: if now == u64::MAX { 0 } else { now },
            next: next.into_iter().collect(),
            spans: spans.into_iter().map(|(s, (a, b))| (s, a, b)).collect(),
            readers: readers.len(),
        })
    }

    fn publish_if_due(&self, dir: &Path) {
        let ms = self.start.elapsed().as_millis() as u64;
        let last = self.published_ms.load(Ordering::Relaxed);
        if ms < last + PUBLISH_EVERY.as_millis() as u64
            || self
                .published_ms
                .compare_exchange(last, ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.publish(dir);
    }

    /// Writes this process's table to `plans/<pid>.json` (atomically: a temporary file renamed),
    /// next to `plans/<pid>.lock`, which the process holds locked while it lives. Errors are
    /// logged: another process then only sees less of the schedule.
    pub(super) fn publish(&self, dir: &Path) {
        let mut st = self.state();
        let pid = std::process::id();
        if st.published.as_ref().is_none_or(|(p, _, _)| *p != pid) {
            // One name per handle (handles of one process publish apart), held locked while
            // the handle lives.
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{pid}.{n}");
            let plans = dir.join("plans");
            let lock = plans.join(format!("{name}.lock"));
            let file = File::create_new(&lock)
                .and_then(|f| f.try_lock().map(|()| f).map_err(std::io::Error::from));
            match file {
                Ok(f) => st.published = Some((pid, plans.join(format!("{name}.json")), f)),
                Err(e) => {
                    tracing::debug!(target: TARGET, error = %e, "cannot publish the schedule");
                    return;
                }
            }
        }
        let table = self.table(&st).unwrap_or_default();
        let Some((_, path, _)) = &st.published else {
            return;
        };
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec(&table).expect("a table always serialises");
        if let Err(e) = fs::write(&tmp, json).and_then(|()| fs::rename(&tmp, path)) {
            tracing::debug!(target: TARGET, error = %e, "cannot publish the schedule");
        }
    }

    /// Withdraws this process's table (when the cache handle goes).
    pub(super) fn withdraw(&self) {
        let st = self.state();
        if let Some((pid, path, _)) = &st.published
            && *pid == std::process::id()
        {
            let _ = fs::remove_file(path);
            let _ = fs::remove_file(path.with_extension("lock"));
        }
    }

    /// The node's schedule as this process sees it now: its own readers' (exact) and the tables
    /// other live processes published for the same shard list and epoch.
    pub(super) fn view(&self, dir: &Path) -> View {
        let mut st = self.state();
        let epoch = st.epoch;
        let own: Vec<Arc<ReaderPlan>> = st
            .readers
            .values()
            .filter(|r| Some(r.epoch) == epoch)
            .cloned()
            .collect();
        let plans = dir.join("plans");
        let me = st.published.as_ref().map(|(_, p, _)| p.clone());
        let mut live = HashSet::new();
        if let Ok(entries) = fs::read_dir(&plans) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let path = e.path();
                if !name.ends_with(".json") || me.as_ref() == Some(&path) {
                    continue;
                }
                if writer_gone(&path.with_extension("lock")) {
                    let _ = fs::remove_file(&path);
                    let _ = fs::remove_file(path.with_extension("lock"));
                    continue;
                }
                let Ok(meta) = e.metadata() else { continue };
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                live.insert(path.clone());
                let fresh = st
                    .others
                    .get(&path)
                    .is_some_and(|o| o.modified == modified && o.len == meta.len());
                if fresh {
                    continue;
                }
                let parsed = fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Table>(&b).ok());
                if let Some(table) = parsed {
                    let next = table.next.iter().copied().collect();
                    st.others.insert(
                        path,
                        Arc::new(Other {
                            modified,
                            len: meta.len(),
                            table,
                            next,
                        }),
                    );
                }
            }
        }
        st.others.retain(|p, _| live.contains(p));
        // Tables of this process's epoch; a process without readers follows the latest.
        let epoch = epoch.or_else(|| {
            st.others
                .values()
                .filter(|o| o.table.list == self.list)
                .map(|o| o.table.epoch)
                .max()
        });
        let others: Vec<Arc<Other>> = st
            .others
            .values()
            .filter(|o| o.table.list == self.list && Some(o.table.epoch) == epoch)
            .cloned()
            .collect();
        drop(st);
        let now = own
            .iter()
            .filter(|r| !r.done())
            .map(|r| r.progress())
            .min()
            .or_else(|| others.iter().map(|o| o.table.now).min())
            .unwrap_or(0);
        View {
            own,
            others,
            now,
            sizes: self.sizes.clone(),
        }
    }
}

/// The node's schedule at one moment (see [`Schedules::view`]).
#[derive(Debug)]
pub(super) struct View {
    own: Vec<Arc<ReaderPlan>>,
    others: Vec<Arc<Other>>,
    /// The earliest next read of this process's readers (else of the others').
    pub(super) now: u64,
    sizes: Vec<u64>,
}

impl View {
    /// Whether any schedule is known: else the cache evicts by its rule without one.
    pub(super) fn active(&self) -> bool {
        !self.own.is_empty() || !self.others.is_empty()
    }

    /// How far ahead the node reads `shard` next, in ticks, `None` if no reader reads it again
    /// this epoch: for this process's readers, from each reader's own progress (readers that
    /// run ahead of the loader's turn are not penalised for it); for other processes, from
    /// this process's progress (the ranks walk the delivery order in step).
    pub(super) fn next_use(&self, shard: usize) -> Option<u64> {
        let own = self.own.iter().filter_map(|r| r.ahead(shard));
        let s = u32::try_from(shard).ok();
        let others = self
            .others
            .iter()
            .filter_map(|o| s.and_then(|s| o.next.get(&s).copied()))
            .map(|t| t.saturating_sub(self.now));
        own.chain(others).min()
    }

    /// How far ahead the node reads `shard` for the last time this epoch, in the ticks of
    /// [`next_use`](Self::next_use); `None` if no reader reads it again.
    pub(super) fn last_use(&self, shard: usize) -> Option<u64> {
        let own = self.own.iter().filter_map(|r| r.last_ahead(shard));
        let s = u32::try_from(shard).ok();
        let others = self.others.iter().filter_map(|o| {
            let &(_, _, last) = o.table.spans.iter().find(|&&(x, _, _)| Some(x) == s)?;
            (last >= self.now).then(|| last - self.now)
        });
        own.chain(others).max()
    }

    /// Whether a reader on the node has read `shard` this epoch already (for another
    /// process, as of its table).
    pub(super) fn started(&self, shard: usize) -> bool {
        let s = u32::try_from(shard).ok();
        self.own.iter().any(|r| r.started(shard))
            || self.others.iter().any(|o| {
                o.table
                    .spans
                    .iter()
                    .any(|&(x, first, _)| Some(x) == s && first < o.table.now)
            })
    }

    /// Each shard's first and last tick on the node this epoch, with its bytes.
    fn intervals(&self) -> HashMap<usize, (u64, u64, u64)> {
        let mut out: HashMap<usize, (u64, u64, u64)> = HashMap::new();
        let own = self.own.iter().flat_map(|r| r.spans());
        let others = self
            .others
            .iter()
            .flat_map(|o| o.table.spans.iter().map(|&(s, a, b)| (s as usize, a, b)));
        for (s, a, b) in own.chain(others) {
            let bytes = self.sizes.get(s).copied().unwrap_or(0);
            let e = out.entry(s).or_insert((a, b, bytes));
            e.0 = e.0.min(a);
            e.1 = e.1.max(b);
        }
        out
    }

    /// The working set: the most bytes of shards live at once on the node this epoch.
    /// The readers on the node: this process's and those of the other processes' tables.
    pub(super) fn readers(&self) -> usize {
        self.own.len()
            + self
                .others
                .iter()
                .map(|o| o.table.readers.max(1))
                .sum::<usize>()
    }

    pub(super) fn working_set(&self) -> (u64, usize) {
        let iv = self.intervals();
        let bytes = peak(iv.values().copied(), 0, u64::MAX);
        let shards = peak(iv.values().map(|&(a, b, _)| (a, b, 1)), 0, u64::MAX) as usize;
        (bytes, shards)
    }

    /// The most bytes the schedule keeps live at once from now until `ahead` ticks from now
    /// (exclusive), and the bytes of `cached` shards (by index) first read after that: shards
    /// fetched ahead of the window (those first read inside it are in its peak already).
    pub(super) fn needed_until(&self, ahead: u64, cached: impl Iterator<Item = usize>) -> u64 {
        let iv = self.intervals();
        let until = self.now.saturating_add(ahead);
        let live = peak(iv.values().copied(), self.now, until);
        let early: u64 = cached
            .filter_map(|s| iv.get(&s))
            .filter(|&&(a, _, _)| a >= until)
            .map(|&(_, _, bytes)| bytes)
            .sum();
        live + early
    }
}

impl ShardCache {
    /// Registers a reader's schedule: `uses` are its reads in order, each the tick it happens
    /// at and the index of its shard in the list the cache was opened with. The cache evicts
    /// by Belady's rule over every registered schedule on the node (the shard read furthest
    /// ahead goes first) and prefetches in need order; see [`crate::cache`]. Ticks of
    /// all readers of the node must share one time axis (a `ShardedDataset` uses each rank's
    /// delivery order, which ranks walk in step). Registering a schedule of another epoch
    /// starts that epoch's [`epoch_stats`](Self::epoch_stats).
    pub fn schedule_reader(
        &self,
        epoch: u64,
        uses: impl IntoIterator<Item = (u64, usize)>,
    ) -> ReaderSchedule {
        let plan = Arc::new(ReaderPlan::new(epoch, uses));
        let schedule = &self.inner.schedule;
        let id = schedule.register(&plan);
        schedule.publish(&self.inner.config.dir);
        let (ws, _) = schedule.view(&self.inner.config.dir).working_set();
        schedule
            .tight
            .store(ws > self.inner.config.budget_bytes, Ordering::Relaxed);
        ReaderSchedule {
            cache: Arc::downgrade(&self.inner),
            id,
            plan,
        }
    }

    /// This handle's counts per epoch (the epochs of the schedules its readers registered).
    pub fn epoch_stats(&self) -> Vec<EpochCacheStats> {
        self.inner.schedule.epoch_stats()
    }

    /// Whether the budget is smaller than the working set of the node's schedule (as of the
    /// last reader registered): then every shard that stays leased keeps Belady's rule from
    /// evicting it, so readers should hold leases only on the shard they read.
    pub fn below_working_set(&self) -> bool {
        self.inner.schedule.tight.load(Ordering::Relaxed)
    }

    /// The working set of the node's schedule as this process sees it now: the most bytes (and
    /// shards) live at once, a shard being live from its first read in the epoch to its last.
    /// A budget of at least these bytes downloads each shard once per epoch. `None` without a
    /// registered schedule.
    pub fn working_set(&self) -> Option<(u64, usize)> {
        let view = self.inner.schedule.view(&self.inner.config.dir);
        view.active().then(|| view.working_set())
    }

    /// The readers whose schedules the node's cache knows now (this process's registered
    /// readers of the epoch and the other processes' published ones).
    pub(crate) fn readers(&self) -> usize {
        self.inner.schedule.view(&self.inner.config.dir).readers()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_plan_finds_next_uses_and_spans() {
        let plan = ReaderPlan::new(3, [(0, 5), (1, 5), (2, 7), (5, 5), (6, 7)]);
        assert_eq!(plan.next_use(5), Some(0));
        plan.progress.store(2, Ordering::Relaxed);
        assert_eq!(plan.next_use(5), Some(5));
        assert_eq!(plan.next_use(7), Some(2));
        assert_eq!(plan.next_use(9), None);
        plan.progress.store(7, Ordering::Relaxed);
        assert!(plan.done());
        let mut spans: Vec<_> = plan.spans().collect();
        spans.sort_unstable();
        assert_eq!(spans, [(5, 0, 5), (7, 2, 6)]);
    }
}
