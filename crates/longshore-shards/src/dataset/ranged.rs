//! Range reads: below the cache's working set, a sample whose shard is not on disk (nor
//! about to be) is read by one range `GET` of its bytes, issued ahead of the reader, instead
//! of downloading its whole shard for it.
//!
//! A budget below the working set of the shuffle window cannot keep every shard from its
//! first read to its last, so some reads find their shard evicted. Downloading the shard again
//! for each of them costs a whole shard per sample (a wide shuffle over a small cache reads
//! at a few percent of the unbounded rate); a range read costs the sample's bytes. What it
//! needs is where the sample lies: a tar's layout from an earlier scan of the shard (kept by
//! [`SharedLayouts`](super::layout::SharedLayouts) while the object's size is unchanged), an
//! MDS shard's header (one range read of its first bytes). A tar never scanned in this
//! process is downloaded whole once.
//!
//! Which shards: a shard is *sparse* for a reader when caching it could not pay: with `d` its
//! density in the reader's stream (its reads over the span from its first to its last), the
//! reader would read `1 / d` shards like it at once, and they do not fit its share of the
//! budget (`B / R` shards: `B` the budget in shards, `R` the readers on the node): `d B / R <
//! 1`, or when it reads fewer than one in [`DENSE_AHEAD`] of the shard's samples (the end of a
//! block another worker reads). Under a wide shuffle every shard is sparse (each is read thinly over the whole epoch:
//! whatever the cache holds serves its share of reads, and a download would only displace
//! another), and each of its reads not on disk is a range read. Under shuffle blocks whose
//! shards fit the readers' shares the block's shards are dense: the prefetch downloads them
//! (in Belady's order), up to one in [`DENSE_AHEAD`] of their reads are range reads issued while
//! they are not on disk yet, and a read that finds no room for one is a range read rather
//! than a wait. When those range reads are spent and the shard is still not on disk (below
//! the working set the prefetch finds room for a block's shards only as the node's reads of
//! the block before end), the reader starts its download then, as its own read would, so that
//! it runs while the range reads issued ahead are read rather than when the reader waits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::layout::{Layout, Version};
use super::{Inner, ShardFormat};
use crate::ShardError;
use crate::mds::{Columns, header_len, sample_count};
use crate::order::{EpochPlan, Slot};
use crate::store::{block_on, runtime};
use crate::webdataset::Sample;

/// The most range reads a reader keeps in flight: at 20-50 ms a `GET`, enough for a few
/// thousand samples a second per worker.
const MAX_RANGES: usize = 256;

/// The most bytes of range reads a reader keeps in flight or fetched and not yet read.
const MAX_RANGE_BYTES: u64 = 64 << 20;

/// A range read issued for one slot of the reader's window.
pub(super) struct Pending {
    layout: Arc<Layout>,
    start: u64,
    bytes: u64,
    handle: JoinHandle<Result<Bytes, ShardError>>,
}

/// What a reader knows of a shard's layout for range reads.
enum Known {
    Layout(Arc<Layout>),
    /// Its MDS header is being fetched.
    Waiting,
    /// No range reads of it (a tar not scanned in this process, a header that failed).
    No,
}

/// One reader's range reads: the slots of its window decided (by their sequence number in
/// the reader's stream), the reads in flight, the MDS headers being fetched.
#[derive(Default)]
pub(super) struct Ranges {
    pending: HashMap<u64, Pending>,
    bytes: u64,
    /// The sequence number of the first slot not decided yet.
    decided: u64,
    heads: HashMap<usize, JoinHandle<Result<Bytes, ShardError>>>,
    no_head: HashSet<usize>,
    /// The reader's sparse shards, and the range reads left to each dense one (computed at
    /// the first need, below the working set).
    shape: Option<Shape>,
    /// Dense shards whose download the reader started ahead (see [`Ranges::read_ahead`]).
    fetched: HashSet<usize>,
}

/// Which of a reader's shards are sparse, and how many reads of each dense one may still be
/// range reads (one in [`DENSE_AHEAD`] of its reads).
#[derive(Default)]
struct Shape {
    sparse: HashSet<usize>,
    dense_left: HashMap<usize, u64>,
    /// How close (in slots) a dense shard's read must be for the reader to start its
    /// download (see [`Ranges::read_ahead`]).
    fetch_within: HashMap<usize, usize>,
}

/// One in this many of a dense shard's reads in a stream may be range reads issued ahead while
/// the shard is not on disk: the first reads of a shuffle block's shards, read before their
/// downloads are done (a block's samples are mixed, so its first slots touch every shard),
/// without ranging the reads a whole download serves.
const DENSE_AHEAD: u64 = 8;

/// A dense shard's download is started by its reader when the reader reads it within this
/// many slots (or as many as its range reads ahead, if fewer) and it is still not on disk
/// (see [`Ranges::read_ahead`]), looked for every [`FETCH_EVERY`] slots.
const FETCH_SOON: usize = 64;
const FETCH_EVERY: u64 = 8;

impl Ranges {
    /// Issues range reads for the window's slots (`window[0]` has sequence number `first`)
    /// whose shards are sparse for the reader (worker `reader.1` of plan `reader.0`), not on
    /// disk and not `skipped` (leased by the reader),
    /// within [`MAX_RANGES`] and [`MAX_RANGE_BYTES`]; only below the working set. Each slot
    /// is decided once.
    pub(super) fn read_ahead(
        &mut self,
        ds: &Inner,
        reader: (&EpochPlan, usize),
        window: &VecDeque<Slot>,
        first: u64,
        skipped: impl Fn(usize) -> bool,
    ) {
        if !ds.range_reads || !ds.cache.below_working_set() {
            return;
        }
        if self.shape.is_none() {
            self.shape = Some(shape(ds, reader.0, reader.1));
        }
        let end = first + window.len() as u64;
        let mut i = self.decided.max(first);
        let mut on_disk: HashMap<usize, bool> = HashMap::new();
        while i < end && self.pending.len() < MAX_RANGES && self.bytes < MAX_RANGE_BYTES {
            let slot = &window[(i - first) as usize];
            let s = slot.sample.shard;
            let cached = || ds.cache.is_complete(&ds.spec.shards.shards[s]);
            if self.pending.contains_key(&i) {
                i += 1;
                continue;
            }
            let allowed = self.shape.as_ref().is_some_and(|sh| {
                sh.sparse.contains(&s) || sh.dense_left.get(&s).is_some_and(|&left| left > 0)
            });
            if allowed && !skipped(s) && !*on_disk.entry(s).or_insert_with(cached) {
                match self.known(ds, s) {
                    Known::Layout(layout) => {
                        // A sample the layout has no bytes for (a damaged tar) is read by the
                        // lease path, which names the damage.
                        if let Ok(Some(p)) = start(ds, s, layout, slot.sample.index) {
                            self.bytes += p.bytes;
                            self.pending.insert(i, p);
                            if let Some(left) =
                                self.shape.as_mut().and_then(|sh| sh.dense_left.get_mut(&s))
                            {
                                *left = left.saturating_sub(1);
                            }
                        }
                    }
                    Known::Waiting => break,
                    Known::No => {}
                }
            }
            i += 1;
        }
        self.decided = i;
        // A dense shard read soon (within as many slots as it has range reads ahead, at most
        // `FETCH_SOON`), not by a range read issued ahead (those are spent), and still not on
        // disk: the reader would download it when it gets there and wait for the download
        // (below the working set the prefetch finds no room for a block's shards until the
        // node's last reads of the block before). Started now, as the reader's read would
        // start it (evicting by the schedule), it runs while the reader reads up to it; not
        // earlier, where it could evict a shard another reader still reads before this one
        // needs its own.
        if first.is_multiple_of(FETCH_EVERY) {
            for (k, slot) in window.iter().take(FETCH_SOON).enumerate() {
                let s = slot.sample.shard;
                let dense_spent = self.shape.as_ref().is_some_and(|sh| {
                    sh.dense_left.get(&s).is_some_and(|&left| left == 0)
                        && sh.fetch_within.get(&s).is_some_and(|&w| k < w)
                });
                if dense_spent
                    && !self.pending.contains_key(&(first + k as u64))
                    && !skipped(s)
                    && !self.fetched.contains(&s)
                    && !ds.cache.is_complete(&ds.spec.shards.shards[s])
                {
                    self.fetch(ds, s);
                }
            }
        }
    }

    /// Starts downloading dense shard `shard` (its caller checked) for the reader, on a
    /// thread of its own (a `get` that does not wait for room, as the reader's own read would
    /// make). The lease goes back as soon as the shard is on disk, unread: the reader leases
    /// it when it reaches it (a lease handed to the reader could be room it waits for).
    fn fetch(&mut self, ds: &Inner, shard: usize) {
        let cache = ds.cache.clone();
        let info = ds.spec.shards.shards[shard].clone();
        let spawned = std::thread::Builder::new()
            .name("longshore-shard-ahead".into())
            .spawn(move || match cache.get_if_room(&info) {
                Ok(Some(lease)) => lease.release_unread(),
                Ok(None) => {}
                // The reader's own read of the shard reports it.
                Err(e) => tracing::debug!(
                    target: super::TARGET, url = %info.url, error = %e,
                    "a download started ahead of the reader failed"
                ),
            });
        if spawned.is_ok() {
            self.fetched.insert(shard);
        }
    }

    /// Shard `shard` found no room in the cache: its reads not on disk are range reads from
    /// now on, the window's included (decided again).
    pub(super) fn demote(&mut self, shard: usize) {
        if let Some(shape) = &mut self.shape
            && shape.sparse.insert(shard)
        {
            shape.dense_left.remove(&shard);
            self.decided = 0;
        }
    }

    /// Whether shard `shard` is sparse for the reader (see the [module docs](self)); `false`
    /// before [`read_ahead`](Self::read_ahead) found the node below its working set.
    /// Whether the reader reads every shard of its stream by range (a wide shuffle's, below
    /// the working set).
    pub(super) fn all_sparse(&self) -> bool {
        self.shape
            .as_ref()
            .is_some_and(|sh| sh.dense_left.is_empty() && !sh.sparse.is_empty())
    }

    pub(super) fn is_sparse(&self, shard: usize) -> bool {
        self.shape
            .as_ref()
            .is_some_and(|sh| sh.sparse.contains(&shard))
    }

    /// The range read issued for the slot numbered `seq`, if any.
    pub(super) fn take(&mut self, seq: u64) -> Option<Pending> {
        let p = self.pending.remove(&seq)?;
        self.bytes -= p.bytes;
        Some(p)
    }

    /// A range read of sample `index` of shard `shard` issued now, for a reader that found no
    /// room for the shard: `None` if its layout is not known.
    ///
    /// # Errors
    ///
    /// The layout's, for a sample it has no bytes for.
    pub(super) fn start_now(
        &mut self,
        ds: &Inner,
        shard: usize,
        index: u64,
    ) -> Result<Option<Pending>, ShardError> {
        if !ds.range_reads {
            return Ok(None);
        }
        match self.known(ds, shard) {
            Known::Layout(layout) => start(ds, shard, layout, index),
            Known::Waiting | Known::No => Ok(None),
        }
    }

    /// Stops the reads in flight (the reader is gone).
    pub(super) fn abort(&mut self) {
        for (_, p) in self.pending.drain() {
            p.handle.abort();
        }
        for (_, h) in self.heads.drain() {
            h.abort();
        }
        self.bytes = 0;
    }

    fn known(&mut self, ds: &Inner, shard: usize) -> Known {
        let info = &ds.spec.shards.shards[shard];
        if let Some(layout) = ds.layouts.for_object(shard, info.size) {
            return Known::Layout(layout);
        }
        if ds.spec.format != ShardFormat::Mds || self.no_head.contains(&shard) {
            return Known::No;
        }
        let Some(handle) = self.heads.get(&shard) else {
            let mds = &ds.spec.mds[shard];
            let len = header_len(mds.samples);
            // A file whose size disagrees with its index is read (and named) by the lease path.
            if mds.raw_data.bytes != info.size || len > info.size {
                self.no_head.insert(shard);
                return Known::No;
            }
            match spawn(ds, &info.url, 0..len) {
                Ok(h) => {
                    self.heads.insert(shard, h);
                    return Known::Waiting;
                }
                Err(_) => {
                    self.no_head.insert(shard);
                    return Known::No;
                }
            }
        };
        if !handle.is_finished() {
            return Known::Waiting;
        }
        let handle = self.heads.remove(&shard).expect("looked up above");
        let head = wait(handle).and_then(|head| {
            let samples = sample_count(&info.url, &head[..4.min(head.len())])?;
            if samples == ds.spec.mds[shard].samples {
                Ok(head)
            } else {
                Err(ShardError::Mds {
                    shard: info.url.clone(),
                    sample: None,
                    offset: 0,
                    reason: format!(
                        "the file holds {samples} samples, the index says {}",
                        ds.spec.mds[shard].samples
                    ),
                })
            }
        });
        match head {
            Ok(head) => {
                let layout = Arc::new(Layout::Mds {
                    head: head.to_vec(),
                });
                ds.layouts
                    .insert(shard, (info.size, Version::listed(info)), &layout);
                Known::Layout(layout)
            }
            Err(e) => {
                tracing::debug!(
                    target: super::TARGET, url = %info.url, error = %e,
                    "no range reads of this shard: its header did not read"
                );
                self.no_head.insert(shard);
                Known::No
            }
        }
    }
}

/// The shape of worker `worker`'s stream of `plan` (see the [module docs](self)).
fn shape(ds: &Inner, plan: &EpochPlan, worker: usize) -> Shape {
    let largest = ds.spec.shards.largest().map_or(1, |s| s.size.max(1));
    let budget = ds.cache.config().budget_bytes as f64 / largest as f64;
    // This rank's workers at least: the others may not have registered yet.
    let readers = ds.cache.readers().max(plan.layout().num_workers()).max(1);
    let share = budget / readers as f64;
    let Some(stream) = plan.rank(ds.rank).ok().and_then(|r| r.worker(worker).ok()) else {
        return Shape::default();
    };
    // Per shard: reads, first and last position in the stream.
    let mut seen: HashMap<usize, (u64, u64, u64)> = HashMap::new();
    for (i, slot) in stream.enumerate() {
        let e = seen
            .entry(slot.sample.shard)
            .or_insert((0, i as u64, i as u64));
        e.0 += 1;
        e.2 = i as u64;
    }
    let mut shape = Shape::default();
    for (shard, (reads, first, last)) in seen {
        let density = reads as f64 / (last - first + 1) as f64;
        // A shard this reader reads only a few samples of (the end of a block another worker
        // reads) is not worth a download, however close together the reads.
        let few = reads * DENSE_AHEAD < ds.spec.counts[shard];
        if few || density * share < 1.0 {
            shape.sparse.insert(shard);
        } else {
            shape.dense_left.insert(shard, reads / DENSE_AHEAD);
            let within = usize::try_from(reads / DENSE_AHEAD).unwrap_or(usize::MAX);
            shape.fetch_within.insert(shard, within.min(FETCH_SOON));
        }
    }
    tracing::debug!(
        target: super::TARGET, worker, share, sparse = shape.sparse.len(),
        dense = shape.dense_left.len(),
        "below the working set: reads of sparse shards not on disk are range reads"
    );
    shape
}

/// Issues the range read of sample `index` of shard `shard` (`None` for a Parquet layout).
fn start(
    ds: &Inner,
    shard: usize,
    layout: Arc<Layout>,
    index: u64,
) -> Result<Option<Pending>, ShardError> {
    let info = &ds.spec.shards.shards[shard];
    let count = ds.spec.counts[shard];
    let Some(range) = layout.range(&info.url, info.size, index, count)? else {
        return Ok(None);
    };
    let handle = spawn(ds, &info.url, range.clone())?;
    Ok(Some(Pending {
        layout,
        start: range.start,
        bytes: range.end - range.start,
        handle,
    }))
}

/// Spawns a range `GET` on the store's runtime.
fn spawn(
    ds: &Inner,
    url: &str,
    range: std::ops::Range<u64>,
) -> Result<JoinHandle<Result<Bytes, ShardError>>, ShardError> {
    let store = ds.store.clone();
    let url = url.to_owned();
    Ok(runtime()?.spawn(async move { store.get_range_async(&url, range).await }))
}

/// The result of a spawned read (within the store's timeouts and retries).
fn wait(handle: JoinHandle<Result<Bytes, ShardError>>) -> Result<Bytes, ShardError> {
    match block_on(handle)? {
        Ok(result) => result,
        Err(e) => Err(ShardError::Runtime {
            reason: format!("a range read's task failed: {e}"),
        }),
    }
}

impl Pending {
    /// Waits for the read and parses sample `index` from its bytes (an MDS shard's
    /// `columns`), counting it into the cache's epoch stats.
    pub(super) fn finish(
        self,
        ds: &Inner,
        url: &str,
        columns: Option<&Columns>,
        index: u64,
    ) -> Result<Sample, ShardError> {
        let bytes = wait(self.handle)?;
        ds.cache.count_range_read(bytes.len() as u64);
        self.layout.parse(url, columns, index, self.start, &bytes)
    }
}
