//! One loader worker's stream: the slots of its [`WorkerStream`], read through the node's
//! shard cache, with the shards it will read next prefetched.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use longshore_data::DataError;

use super::layout::{Layout, file_id, scan};
use super::leases::{Held, lock};
use super::ranged::{Pending, Ranges};
use super::{Inner, OnSampleError, ShardFormat, ShardSample, TARGET};
use crate::ShardError;
use crate::cache::CachedShard;
use crate::order::{EpochOrder, EpochPlan, Slot, WorkerStream};
use crate::webdataset::Sample;

/// The most slots a worker looks ahead (to find the next shards to prefetch): 64 Ki slots,
/// 2.5 MiB.
const MAX_WINDOW: usize = 1 << 16;

/// The most slots a worker looks ahead for shards past those it reads (see `refill`): at a
/// few thousand samples a second, a second or more before their first read.
const AHEAD_WINDOW: usize = 1 << 12;

/// The fewest slots a worker looks ahead (and the batch size, if larger): a shard whose
/// samples come back within this many stays leased instead of being released and leased
/// again (a lease costs a few system calls; a process's first of a shard, a write of the
/// cache's index).
const MIN_WINDOW: usize = 256;

/// The most slots of samples that read a worker keeps, to repeat in place of samples that
/// failed ([`OnSampleError::Skip`]).
const MAX_GOOD: usize = 4096;

/// The most failed repeats a worker tries (other samples in turn) before it gives up making
/// up for its failed samples.
const MAX_PROBES: u64 = 64;

/// Below the working set, how often (in samples) a reader asks for its next shards again
/// when no lease of a new shard did.
const PREFETCH_EVERY: u64 = 32;

/// Below the working set, a reader keeps its leases of the shards it reads within this many
/// of its next slots when it opens another, and lets the others go (see `open`).
const KEEP_SOON: usize = 64;

/// A worker's iterator over its samples.
pub(super) struct WorkerReader {
    ds: Arc<Inner>,
    worker: usize,
    epoch: u64,
    stream: WorkerStream,
    stream_done: bool,
    /// The next slots, read ahead of the stream.
    window: VecDeque<Slot>,
    /// Shard -> its slots in `window`.
    pending: HashMap<usize, usize>,
    /// The shards of `pending` this reader has read from: the others are the ones ahead, to
    /// prefetch.
    begun: HashSet<usize>,
    /// Leased shards (released when the window no longer holds them, or by the lease keeper
    /// while this reader is idle and another waits for room); locked while reading.
    leases: Held,
    /// Sample layouts of the shards in the window.
    layouts: HashMap<usize, Arc<Layout>>,
    /// What this worker last asked to prefetch.
    prefetching: Vec<usize>,
    /// Slots of samples that read (the first [`MAX_GOOD`]), repeated in place of failed ones.
    good: Vec<Slot>,
    /// Failed samples not yet made up for ([`OnSampleError::Skip`]).
    owed: u64,
    /// The repeats made so far (which of `good`, or which position of the epoch's order,
    /// comes next).
    repeats: u64,
    /// Repeats that failed too (at most [`MAX_PROBES`] are tried again).
    probes: u64,
    /// The stream ended and the window holds a repeat.
    making_up: bool,
    /// No sample could be read to make up for a failed one: the error to yield (once).
    gave_up: Option<String>,
    /// The epoch's order: where repeats come from when no sample of this worker read.
    order: Arc<EpochOrder>,
    /// The epoch's plan (the cache's schedule follows this worker's stream of it).
    plan: Arc<EpochPlan>,
    /// The loader's batch size: the window reads at least a batch ahead.
    batch_size: usize,
    /// Slots taken from the window so far: the sequence number of its first.
    popped: u64,
    /// Range reads issued for the window's slots (below the working set).
    ranges: Ranges,
}

impl WorkerReader {
    pub(super) fn new(
        ds: Arc<Inner>,
        worker: usize,
        stream: WorkerStream,
        plan: Arc<EpochPlan>,
    ) -> Self {
        let order = Arc::clone(plan.order());
        let epoch = order.epoch();
        let batch_size = plan.layout().batch_size();
        tracing::debug!(target: TARGET, worker, epoch, slots = stream.remaining(), "worker stream");
        let leases = ds.leases.register();
        WorkerReader {
            ds,
            worker,
            epoch,
            stream,
            stream_done: false,
            window: VecDeque::new(),
            pending: HashMap::new(),
            begun: HashSet::new(),
            leases,
            layouts: HashMap::new(),
            prefetching: Vec::new(),
            good: Vec::new(),
            owed: 0,
            repeats: 0,
            probes: 0,
            making_up: false,
            gave_up: None,
            order,
            plan,
            batch_size,
            popped: 0,
            ranges: Ranges::default(),
        }
    }

    /// At the end of the stream, the next padding repeat for a failed sample: a sample of this
    /// worker that read (in turn), else one of the epoch's order (from its start), marked
    /// `pad`, so that this worker yields its planned number of samples.
    fn make_up(&mut self) {
        self.making_up = true;
        self.owed -= 1;
        let k = self.repeats;
        self.repeats += 1;
        let mut slot = if self.good.is_empty() {
            let len = self.order.len().max(1);
            let position = k % len;
            match self.order.at(position) {
                Some(sample) => Slot {
                    sample,
                    position,
                    pad: true,
                },
                None => {
                    self.short(None);
                    return;
                }
            }
        } else {
            self.good[(k % self.good.len() as u64) as usize]
        };
        slot.pad = true;
        *self.pending.entry(slot.sample.shard).or_default() += 1;
        self.window.push_back(slot);
    }

    /// Failed samples this worker cannot make up for: counted, and an unskippable error is
    /// yielded in their place (a rank short of its planned batches would hang a distributed
    /// job at its next collective; an error ends it with the reason).
    fn short(&mut self, e: Option<&ShardError>) {
        let owed = self.owed + 1;
        for _ in 0..owed {
            self.ds.stats.unpadded();
        }
        self.owed = 0;
        self.window.clear();
        self.pending.clear();
        self.begun.clear();
        let last = e.map_or_else(
            || "the epoch's order is empty".to_string(),
            ToString::to_string,
        );
        let msg = format!(
            "worker {} of rank {} (epoch {}): {owed} failed sample(s) cannot be made up for, \
             as no sample of the epoch's order could be read in their place ({} tried; last: \
             {last}); the rank cannot yield its planned batches",
            self.worker, self.ds.rank, self.epoch, self.probes
        );
        tracing::error!(target: TARGET, worker = self.worker, epoch = self.epoch, "{msg}");
        self.gave_up = Some(msg);
    }

    /// Counts (and logs) the failed read of `slot`, and owes a repeat for it under
    /// [`OnSampleError::Skip`].
    fn failed(&mut self, slot: &Slot, e: &ShardError) {
        let shard = slot.sample.shard;
        if self.making_up {
            // A repeat that fails is not a sample of the epoch lost: another is tried.
            tracing::debug!(target: TARGET, worker = self.worker, error = %e, "a padding repeat failed; trying another sample");
        } else if self.ds.stats.failed(shard, e) {
            let url = &self.ds.spec.shards.shards[shard].url;
            tracing::warn!(target: TARGET, shard = %url, error = %e, "damaged shard: its samples that cannot be read are skipped and counted");
        }
        if self.ds.on_sample_error != OnSampleError::Skip {
            return;
        }
        if self.making_up && self.probes >= MAX_PROBES {
            self.short(Some(e));
            return;
        }
        if self.making_up {
            self.probes += 1;
        }
        self.owed += 1;
    }

    /// Reads ahead until the window holds a batch and the shards to prefetch (or the end);
    /// `true` if a shard the window did not hold, not on disk and not read by range, entered
    /// it.
    fn refill(&mut self) -> bool {
        // The reads left in the stream, for the cache's schedule (a repeat that makes up for a
        // failed read is none of them).
        let left = if self.making_up {
            0
        } else {
            self.stream.remaining() + self.window.len() as u64
        };
        self.ds
            .leases
            .follow(&self.ds, &self.leases, &self.plan, self.worker, left);
        // The window holds `prefetch_shards` shards more than it reads now (however long
        // their shards), and, within `AHEAD_WINDOW`, as many beyond those being read: a
        // shuffle block alternates between several shards, and the next block's shards should
        // all be fetched ahead, not only the first one (the others would be missed as they
        // are first read, once the block before is done). A wide shuffle reads every shard
        // at once: no shard is ahead, and the window stops at the bound.
        let want_ahead = self.ds.prefetch_shards;
        let mut grew = false;
        while !self.stream_done
            && (self.window.len() < self.batch_size.max(MIN_WINDOW)
                || (self.pending.len() < want_ahead + 1 && self.window.len() < MAX_WINDOW)
                || (self.pending.len().saturating_sub(self.begun.len()) < want_ahead
                    && self.window.len() < AHEAD_WINDOW))
        {
            match self.stream.next() {
                Some(slot) => {
                    let s = slot.sample.shard;
                    let n = self.pending.entry(s).or_default();
                    if *n == 0 && !grew && !self.ranges.is_sparse(s) {
                        grew = !self.ds.cache.is_complete(&self.ds.spec.shards.shards[s]);
                    }
                    *n += 1;
                    self.window.push_back(slot);
                }
                None => self.stream_done = true,
            }
        }
        grew
    }

    /// Asks the cache to prefetch the next shards of the window that are neither leased nor
    /// on disk: under a shuffle the window's first shards are mostly the current block's,
    /// already cached, and the next block's would otherwise be asked for only as they are read.
    fn update_prefetch(&mut self, leases: &HashMap<usize, CachedShard>) {
        let mut next = Vec::with_capacity(self.ds.prefetch_shards);
        let mut seen = HashSet::new();
        // Below the working set, a reader whose shards are all read by range has none to bring.
        let none = self.ranges.all_sparse();
        for slot in self.window.iter().take_while(|_| !none) {
            if next.len() >= self.ds.prefetch_shards {
                break;
            }
            let s = slot.sample.shard;
            // A sparse shard is read by range below the working set: not one to bring whole.
            if leases.contains_key(&s) || self.ranges.is_sparse(s) || !seen.insert(s) {
                continue;
            }
            if !self.ds.cache.is_complete(&self.ds.spec.shards.shards[s]) {
                next.push(s);
            }
        }
        if next != self.prefetching {
            self.prefetching.clone_from(&next);
            self.ds.publish_prefetch(self.worker, next);
        }
    }

    /// Leases the shard of `slot` (asking the cache without waiting first, and letting every
    /// lease go before a download or a wait, so that no reader waits for room while holding
    /// some) and finds its samples' layout. Below the working set, a sparse shard not on
    /// disk, or a dense one the cache has no room for now, is not leased where its layout is
    /// known: the sample is read by range, and the read returned (see `ranged`).
    fn open(
        &mut self,
        slot: &Slot,
        leases: &mut HashMap<usize, CachedShard>,
    ) -> Result<Option<Pending>, ShardError> {
        let shard = slot.sample.shard;
        if !leases.contains_key(&shard) {
            let info = &self.ds.spec.shards.shards[shard];
            let below = self.ds.cache.below_working_set();
            if below {
                // A budget below the working set: a shard this reader holds but does not read
                // soon is one Belady's rule could not evict for another reader's. One it
                // reads within its next `KEEP_SOON` slots is what the rule keeps anyway (a
                // shuffle block's shards alternate sample by sample: letting them go at each
                // change of shard reopens one file per sample).
                let soon: HashSet<usize> = self
                    .window
                    .iter()
                    .take(KEEP_SOON)
                    .map(|s| s.sample.shard)
                    .collect();
                let far: Vec<usize> = leases
                    .keys()
                    .copied()
                    .filter(|s| !soon.contains(s))
                    .collect();
                for s in far {
                    if let Some(held) = leases.remove(&s) {
                        held.release_unread();
                    }
                }
            }
            let lease = match self.ds.cache.get_cached(info)? {
                Some(lease) => lease,
                None => {
                    let missed = Instant::now();
                    // Every leased shard still has slots in the window: not consumed.
                    for (_, held) in leases.drain() {
                        held.release_unread();
                    }
                    // Below the working set a sparse shard not on disk is read by range
                    // where its layout is known (a download would only displace another),
                    // and a dense one is when the cache has no room for it now.
                    let room = if below && !self.ranges.is_sparse(shard) {
                        self.ds.cache.get_if_room(info)?
                    } else {
                        None
                    };
                    let lease = match room {
                        Some(lease) => lease,
                        None => {
                            if below {
                                // No room for it now: so for its next reads too.
                                self.ranges.demote(shard);
                            }
                            if below
                                && let Some(p) =
                                    self.ranges.start_now(&self.ds, shard, slot.sample.index)?
                            {
                                return Ok(Some(p));
                            }
                            self.ds.cache.get(info)?
                        }
                    };
                    self.ds.cache.count_miss(missed.elapsed());
                    lease
                }
            };
            leases.insert(shard, lease);
            self.update_prefetch(leases);
        }
        if !self.layouts.contains_key(&shard) {
            let lease = &leases[&shard];
            let id = file_id(lease, &self.ds.spec.shards.shards[shard]);
            let shared = id.as_ref().and_then(|id| self.ds.layouts.get(shard, id));
            let layout = match shared {
                Some(layout) => layout,
                None => {
                    let layout = Arc::new(scan(&self.ds, shard, lease)?);
                    if let Some(id) = id {
                        self.ds.layouts.insert(shard, id, &layout);
                    }
                    layout
                }
            };
            self.layouts.insert(shard, layout);
        }
        Ok(None)
    }

    /// Reads the sample of `slot` (number `seq` of the reader's stream).
    fn read(
        &mut self,
        seq: u64,
        slot: &Slot,
        leases: &mut HashMap<usize, CachedShard>,
    ) -> Result<ShardSample, ShardError> {
        let shard = slot.sample.shard;
        let index = slot.sample.index;
        let ds = Arc::clone(&self.ds);
        let url = &ds.spec.shards.shards[shard].url;
        let columns =
            (self.ds.spec.format == ShardFormat::Mds).then(|| Arc::clone(&self.ds.columns[shard]));
        let ranged = match self.ranges.take(seq) {
            Some(p) => Some(p),
            None => self.open(slot, leases)?,
        };
        let sample = match ranged {
            Some(p) => p.finish(&self.ds, url, columns.as_deref(), index)?,
            None => {
                let lease = &leases[&shard];
                match &*self.layouts[&shard] {
                    Layout::Parquet { rows } => {
                        let fields = usize::try_from(index)
                            .ok()
                            .and_then(|i| rows.get(i))
                            .ok_or_else(|| ShardError::Parquet {
                                shard: url.clone(),
                                row: Some(index),
                                reason: format!("the file holds {} rows", rows.len()),
                            })?;
                        Sample {
                            key: index.to_string(),
                            url: url.clone(),
                            offset: index,
                            fields: fields.clone(),
                        }
                    }
                    layout => layout.read_leased(
                        lease,
                        columns.as_deref(),
                        index,
                        self.ds.spec.counts[shard],
                    )?,
                }
            }
        };
        for name in &self.ds.required {
            if sample.get(name).is_none() {
                let have: Vec<&str> = sample.fields.keys().map(String::as_str).collect();
                let reason = format!(
                    "missing required field {name:?} (fields: {})",
                    have.join(", ")
                );
                return Err(match self.ds.spec.format {
                    ShardFormat::WebDataset => ShardError::Sample {
                        shard: url.clone(),
                        key: sample.key.clone(),
                        offset: sample.offset,
                        reason,
                    },
                    ShardFormat::Mds => ShardError::Mds {
                        shard: url.clone(),
                        sample: Some(index),
                        offset: sample.offset,
                        reason,
                    },
                    ShardFormat::Parquet => ShardError::Parquet {
                        shard: url.clone(),
                        row: Some(index),
                        reason,
                    },
                });
            }
        }
        Ok(ShardSample {
            sample,
            id: slot.sample,
            position: slot.position,
            epoch: self.epoch,
            seed: self.order.slot_seed(slot),
            pad: slot.pad,
            columns,
        })
    }
}

impl Iterator for WorkerReader {
    type Item = Result<ShardSample, DataError>;

    fn next(&mut self) -> Option<Result<ShardSample, DataError>> {
        let grew = self.refill();
        while self.window.is_empty() && self.stream_done && self.owed > 0 {
            self.make_up();
        }
        if let Some(msg) = self.gave_up.take() {
            return Some(Err(DataError::unskippable(
                msg,
                "on_sample_error=skip pads a rank with samples that read; none did",
            )));
        }
        // Locked while reading: the lease keeper takes only an idle reader's leases.
        let held = Arc::clone(&self.leases);
        let mut leases = lock(&held);
        self.ranges.read_ahead(
            &self.ds,
            (&self.plan, self.worker),
            &self.window,
            self.popped,
            |s| leases.contains_key(&s),
        );
        if grew || (self.popped.is_multiple_of(PREFETCH_EVERY) && self.ds.cache.below_working_set())
        {
            // The next shards to fetch are asked for as they enter the window, and as shards
            // are leased (`open`); below the working set also every few samples: reads by
            // range lease no shard.
            self.update_prefetch(&leases);
        }
        let slot = self.window.pop_front()?;
        let seq = self.popped;
        self.popped += 1;
        let shard = slot.sample.shard;
        self.begun.insert(shard);
        let left = self.pending.get_mut(&shard).map_or(0, |n| {
            *n -= 1;
            *n
        });
        let result = self.read(seq, &slot, &mut leases);
        if result.is_ok()
            && let Some(m) = self.order.mixture()
        {
            let members = m.shards.len();
            self.ds
                .stats
                .member_read(self.order.member_of_shard(shard), members);
        }
        match &result {
            Ok(_) if self.making_up => self.ds.stats.padded(),
            Ok(_) => {
                if self.good.len() < MAX_GOOD {
                    self.good.push(slot);
                }
            }
            Err(e) => self.failed(&slot, e),
        }
        if left == 0 {
            // The window holds no more of this shard: release it (it may be evicted now).
            self.pending.remove(&shard);
            self.begun.remove(&shard);
            leases.remove(&shard);
            self.layouts.remove(&shard);
        }
        if self.window.is_empty() && self.stream_done && self.owed == 0 {
            leases.clear();
            self.ds.publish_prefetch(self.worker, Vec::new());
        }
        drop(leases);
        Some(result.map_err(|e| {
            let url = &self.ds.spec.shards.shards[shard].url;
            let pad = if slot.pad { ", a padding repeat" } else { "" };
            DataError::custom(
                format!(
                    "reading sample {} (index {} of shard {url}) at position {} of epoch {}{pad}",
                    slot.sample.global, slot.sample.index, slot.position, self.epoch
                ),
                e,
            )
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let owed = usize::try_from(self.owed).unwrap_or(usize::MAX);
        let n = self.window.len() + self.stream.size_hint().0 + owed;
        (n, None)
    }
}

impl Drop for WorkerReader {
    fn drop(&mut self) {
        self.ranges.abort();
        if !self.prefetching.is_empty() {
            self.ds.publish_prefetch(self.worker, Vec::new());
        }
    }
}
