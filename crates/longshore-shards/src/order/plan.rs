//! The split of an [`EpochOrder`] over ranks and workers, and resuming it.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use longshore_data::{DistEnv, WorkerInfo};
use serde::{Deserialize, Serialize};

use super::{EpochOrder, OrderConfig, Slot, SlotIter};
use crate::ShardError;

/// How a job reads an epoch: ranks, loader workers per rank, and the batch size each worker
/// batches its stream with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    world_size: usize,
    num_workers: usize,
    batch_size: usize,
}

impl Layout {
    /// `world_size` ranks, `num_workers` workers per rank (`0`, PyTorch's "load in the main
    /// process", is one stream, the same as `1`), batches of `batch_size` samples.
    ///
    /// # Errors
    /// [`ShardError::Order`] when `world_size` or `batch_size` is 0.
    pub fn new(
        world_size: usize,
        num_workers: usize,
        batch_size: usize,
    ) -> Result<Layout, ShardError> {
        if world_size == 0 {
            return Err(order_err("world_size", "must be at least 1"));
        }
        if batch_size == 0 {
            return Err(order_err("batch_size", "must be at least 1"));
        }
        Ok(Layout {
            world_size,
            num_workers: num_workers.max(1),
            batch_size,
        })
    }

    /// The layout of the job `env` describes (torchrun, `srun`, `mpirun`; see
    /// [`DistEnv`]); this process's rank is `env.rank`.
    ///
    /// # Errors
    /// As [`Layout::new`].
    pub fn from_dist(
        env: &DistEnv,
        num_workers: usize,
        batch_size: usize,
    ) -> Result<Layout, ShardError> {
        Layout::new(env.world_size, num_workers, batch_size)
    }

    /// This process's layout and rank, read from the launcher's environment
    /// ([`DistEnv::from_env`]); a process started without a launcher is rank 0 of 1.
    ///
    /// # Errors
    /// [`ShardError::Order`] naming an invalid launcher variable, or as [`Layout::new`].
    pub fn from_env(num_workers: usize, batch_size: usize) -> Result<(Layout, usize), ShardError> {
        match DistEnv::from_env().map_err(|e| order_err("environment", e.to_string()))? {
            Some(env) => Ok((Layout::from_dist(&env, num_workers, batch_size)?, env.rank)),
            None => Ok((Layout::new(1, num_workers, batch_size)?, 0)),
        }
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Workers per rank (at least 1).
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// Samples per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
}

fn order_err(option: &'static str, reason: impl Into<String>) -> ShardError {
    ShardError::Order {
        option,
        reason: reason.into(),
    }
}

/// The sizes of a segment: `m` samples split over a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    m: u64,
    per_rank: u64,
    batches: u64,
    world: u64,
    workers: u64,
    batch: u64,
}

impl Split {
    fn new(m: u64, layout: Layout, drop_last: bool) -> Split {
        let (world, batch) = (layout.world_size as u64, layout.batch_size as u64);
        let per_rank = if drop_last {
            m / world.saturating_mul(batch) * batch
        } else {
            m.div_ceil(world)
        };
        Split {
            m,
            per_rank,
            batches: per_rank.div_ceil(batch),
            world,
            workers: layout.num_workers as u64,
            batch,
        }
    }

    /// Batch indices (within a rank's span) of worker `i` in a fresh segment.
    fn worker_batches(&self, i: u64) -> Range<u64> {
        let (q, r) = (self.batches / self.workers, self.batches % self.workers);
        let start = i * q + i.min(r);
        start..start + q + u64::from(i < r)
    }

    /// After `k` batches delivered round-robin: full rounds done and the next worker.
    fn round(&self, k: u64) -> (u64, u64) {
        let q = self.batches / self.workers;
        if k <= q * self.workers {
            (k / self.workers, k % self.workers)
        } else {
            (q, k - q * self.workers)
        }
    }

    /// Batches of worker `i` among the first `k` delivered.
    fn consumed(&self, k: u64, i: u64) -> u64 {
        let (f, e) = self.round(k);
        f + u64::from(i < e)
    }
}

/// An epoch (or what is left of it) split over a [`Layout`].
///
/// # The split
///
/// Let `M` be the samples to split (the whole epoch, or what a [`ResumeState`] left), in
/// position order, `W` the world size, `B` the batch size:
///
/// - **`drop_last = false`**: every rank gets `L = ceil(M / W)` samples. The sequence is padded
///   to `W * L` by repeating it from its start: padding slot `j` (`0..W*L-M`) repeats the
///   `(j mod M)`-th sample. Padding is fewer than `W` slots, all on the last ranks, marked
///   [`Slot::pad`]. A rank's last batch holds `L mod B` samples when that is not 0.
/// - **`drop_last = true`**: every rank gets `L = floor(M / (W * B)) * B` samples, whole
///   batches only; the last `M - W * L` samples of the sequence (fewer than `W * B`) are not
///   read in this epoch (PyTorch: `DistributedSampler(drop_last=True)` with
///   `DataLoader(drop_last=True)`).
///
/// Rank `r` reads the contiguous span `r*L .. (r+1)*L` of the (padded) sequence, so ranks read
/// disjoint shards except where a shard or shuffle block straddles a span boundary.
///
/// # Workers
///
/// A rank's span is cut into `ceil(L / B)` batches of `B` consecutive samples (the last may be
/// short). With `w` workers, worker `i` gets a contiguous run of them: `q + 1` batches for the
/// first `nb mod w` workers and `q = nb / w` for the rest (`nb` the rank's batch count). Each
/// worker reads its run in order and batches it by `B`, which reproduces those batches exactly
/// (the short batch ends the run that holds it). The loader takes batches from its workers
/// round-robin, worker 0's first, worker 1's first, ..., skipping a worker once it is
/// exhausted (PyTorch's iterable-dataset behaviour); [`RankPlan::batches`] yields that
/// sequence.
///
/// # Resume
///
/// [`EpochPlan::state_after`]`(k)` is the state after every rank took `k` batches.
/// [`EpochPlan::resume`] with the same layout continues exactly where the run stopped: the
/// workers are renumbered so the loader's round-robin, which restarts at worker 0, delivers the
/// batches the uninterrupted run would have. With another layout, the samples not yet
/// delivered — everything but the taken batches, without padding, with the samples
/// `drop_last` would have dropped — become the sequence `M` that is split anew, by the
/// same rules. Either way the new plan's states compose.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    order: Arc<EpochOrder>,
    /// The segment's samples: sorted, disjoint, non-empty position ranges.
    base: Vec<Range<u64>>,
    /// Index in the segment's sequence of each base range's start, plus `M`.
    base_starts: Vec<u64>,
    layout: Layout,
    split: Split,
    /// Batches per rank delivered in this segment before this plan starts.
    skip: u64,
}

impl EpochPlan {
    /// The whole epoch of `order` split over `layout`.
    pub fn new(order: Arc<EpochOrder>, layout: Layout) -> EpochPlan {
        let all = if order.is_empty() {
            Vec::new()
        } else {
            std::iter::once(0..order.len()).collect()
        };
        EpochPlan::segment(order, all, layout, 0)
    }

    fn segment(
        order: Arc<EpochOrder>,
        base: Vec<Range<u64>>,
        layout: Layout,
        skip: u64,
    ) -> EpochPlan {
        let mut base_starts = Vec::with_capacity(base.len() + 1);
        let mut m = 0;
        for r in &base {
            base_starts.push(m);
            m += r.end - r.start;
        }
        base_starts.push(m);
        let split = Split::new(m, layout, order.config().drop_last);
        tracing::debug!(
            target: "longshore::shards",
            epoch = order.epoch(),
            samples = m,
            ranges = base.len(),
            world_size = layout.world_size,
            num_workers = layout.num_workers,
            batch_size = layout.batch_size,
            samples_per_rank = split.per_rank,
            skip,
            "epoch plan"
        );
        EpochPlan {
            order,
            base,
            base_starts,
            layout,
            split,
            skip,
        }
    }

    /// Resumes the run `state` was taken from, on `layout` (the same or another).
    ///
    /// # Errors
    /// [`ShardError::Resume`] when the state is of another epoch, seed, option or shard list,
    /// or is malformed.
    pub fn resume(
        order: Arc<EpochOrder>,
        state: &ResumeState,
        layout: Layout,
    ) -> Result<EpochPlan, ShardError> {
        let bad = |reason: String| ShardError::Resume {
            epoch: state.epoch,
            reason,
        };
        if state.epoch != order.epoch() {
            return Err(bad(format!("the order is of epoch {}", order.epoch())));
        }
        if state.config != *order.config() {
            return Err(bad(format!(
                "the state's options {:?} differ from the order's {:?}",
                state.config,
                order.config()
            )));
        }
        if state.shards != order.counts().len()
            || state.samples != order.len()
            || state.counts_hash != order.counts_hash
        {
            return Err(bad(format!(
                "the state is of {} shards holding {} samples, the order of {} shards holding {} \
                 (or their counts differ)",
                state.shards,
                state.samples,
                order.counts().len(),
                order.len()
            )));
        }
        let mut base = Vec::with_capacity(state.remaining.len());
        let mut end = 0;
        for &[a, b] in &state.remaining {
            if a < end || a >= b || b > order.len() {
                return Err(bad(format!(
                    "remaining range {a}..{b} is empty, unsorted or past the epoch's {} samples",
                    order.len()
                )));
            }
            base.push(a..b);
            end = b;
        }
        let segment = EpochPlan::segment(order, base, state.layout, 0);
        if state.batches > segment.split.batches {
            return Err(bad(format!(
                "{} batches taken of a segment of {} batches per rank",
                state.batches, segment.split.batches
            )));
        }
        if layout == state.layout {
            return Ok(EpochPlan {
                skip: state.batches,
                ..segment
            });
        }
        let remaining = segment.remaining_after(state.batches);
        Ok(EpochPlan::segment(segment.order, remaining, layout, 0))
    }

    /// The order this plan splits.
    pub fn order(&self) -> &Arc<EpochOrder> {
        &self.order
    }

    /// The layout it splits over.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Samples each rank reads in this segment (`L`), padding included.
    pub fn samples_per_rank(&self) -> u64 {
        self.split.per_rank
    }

    /// Batches each rank reads in this segment, those taken before a resume included.
    pub fn batches_per_rank(&self) -> u64 {
        self.split.batches
    }

    /// Batches each rank has left to read in this plan.
    pub fn remaining_batches(&self) -> u64 {
        self.split.batches - self.skip
    }

    /// Padding slots in this segment (`W * L - M`; 0 with `drop_last`).
    pub fn padding(&self) -> u64 {
        (self.split.world * self.split.per_rank).saturating_sub(self.split.m)
    }

    /// Samples of this segment that no rank reads (`M - W * L`; 0 without `drop_last`).
    pub fn dropped(&self) -> u64 {
        self.split
            .m
            .saturating_sub(self.split.world * self.split.per_rank)
    }

    /// Rank `rank`'s part.
    ///
    /// # Errors
    /// [`ShardError::Order`] when `rank >= world_size`.
    pub fn rank(&self, rank: usize) -> Result<RankPlan<'_>, ShardError> {
        if rank >= self.layout.world_size {
            return Err(order_err(
                "rank",
                format!(
                    "rank {rank} must be less than world_size {}",
                    self.layout.world_size
                ),
            ));
        }
        Ok(RankPlan { plan: self, rank })
    }

    /// The state after every rank took `batches` more batches from this plan (the loader's
    /// batches: count what the training loop received, not what workers prefetched).
    ///
    /// # Errors
    /// [`ShardError::Resume`] when that is more batches than the plan has left.
    pub fn state_after(&self, batches: u64) -> Result<ResumeState, ShardError> {
        let total = self.skip.saturating_add(batches);
        if total > self.split.batches {
            return Err(ShardError::Resume {
                epoch: self.order.epoch(),
                reason: format!(
                    "{batches} batches taken of {} left per rank",
                    self.remaining_batches()
                ),
            });
        }
        let order = &self.order;
        Ok(ResumeState {
            epoch: order.epoch(),
            config: *order.config(),
            shards: order.counts().len(),
            samples: order.len(),
            counts_hash: order.counts_hash,
            remaining: self.base.iter().map(|r| [r.start, r.end]).collect(),
            layout: self.layout,
            batches: total,
        })
    }

    /// Position ranges of the segment's samples not delivered after `k` batches per rank
    /// (padding left out, samples `drop_last` would drop kept), sorted and merged.
    fn remaining_after(&self, k: u64) -> Vec<Range<u64>> {
        let s = &self.split;
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut push = |r: Range<u64>| {
            for g in self.to_positions(r) {
                match out.last_mut() {
                    Some(last) if last.end == g.start => last.end = g.end,
                    _ => out.push(g),
                }
            }
        };
        for rank in 0..s.world {
            for i in 0..s.workers {
                let run = s.worker_batches(i);
                let first = run.start + s.consumed(k, i);
                let a = rank * s.per_rank + (first * s.batch).min(s.per_rank);
                let b = rank * s.per_rank + (run.end * s.batch).min(s.per_rank);
                push(a.min(s.m)..b.min(s.m));
            }
        }
        push((s.world * s.per_rank).min(s.m)..s.m);
        out
    }

    /// The position ranges of indices `r` of the segment's sequence (`r` within `0..M`).
    fn to_positions(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        if r.start >= r.end {
            return out;
        }
        let mut i = self.base_starts.partition_point(|&s| s <= r.start) - 1;
        let mut at = r.start;
        while at < r.end && i < self.base.len() {
            let offset = at - self.base_starts[i];
            let take = (self.base_starts[i + 1] - at).min(r.end - at);
            let start = self.base[i].start + offset;
            out.push(start..start + take);
            at += take;
            i += 1;
        }
        out
    }

    /// Position ranges (with padding marks) of the padded sequence's indices `r`.
    fn padded_positions(&self, r: Range<u64>) -> VecDeque<(Range<u64>, bool)> {
        let m = self.split.m;
        let mut out: VecDeque<(Range<u64>, bool)> = self
            .to_positions(r.start.min(m)..r.end.min(m))
            .into_iter()
            .map(|g| (g, false))
            .collect();
        let mut j = r.start.max(m);
        while j < r.end && m > 0 {
            let s = (j - m) % m;
            let run = (r.end - j).min(m - s);
            out.extend(self.to_positions(s..s + run).into_iter().map(|g| (g, true)));
            j += run;
        }
        out
    }
}

/// One rank's part of an [`EpochPlan`].
#[derive(Debug, Clone, Copy)]
pub struct RankPlan<'a> {
    plan: &'a EpochPlan,
    rank: usize,
}

impl RankPlan<'_> {
    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Batches this rank has left to deliver (the same on every rank).
    pub fn num_batches(&self) -> u64 {
        self.plan.remaining_batches()
    }

    /// The batch ranges (within the rank's span) each worker reads, in worker order: a fresh
    /// split, or after a same-layout resume the unread rest of each run, rotated so that
    /// worker 0 holds the batch the loader would have delivered next.
    fn worker_runs(&self) -> Vec<Range<u64>> {
        let s = &self.plan.split;
        let skip = self.plan.skip;
        let (_, e) = s.round(skip);
        (0..s.workers)
            .map(|j| {
                let old = (e + j) % s.workers;
                let run = s.worker_batches(old);
                (run.start + s.consumed(skip, old)).min(run.end)..run.end
            })
            .collect()
    }

    /// Worker `worker`'s stream.
    ///
    /// # Errors
    /// [`ShardError::Order`] when `worker >= num_workers`.
    pub fn worker(&self, worker: usize) -> Result<WorkerStream, ShardError> {
        let runs = self.worker_runs();
        let run = runs.get(worker).ok_or_else(|| {
            order_err(
                "worker",
                format!(
                    "worker {worker} must be less than num_workers {}",
                    runs.len()
                ),
            )
        })?;
        let s = &self.plan.split;
        let base = self.rank as u64 * s.per_rank;
        let a = base + (run.start * s.batch).min(s.per_rank);
        let b = base + (run.end * s.batch).min(s.per_rank);
        Ok(WorkerStream {
            slots: SlotIter::new(self.plan.order.clone(), self.plan.padded_positions(a..b)),
            batch_size: self.plan.layout.batch_size,
            batches: run.end - run.start,
        })
    }

    /// The stream of the loader worker `info` describes (as handed to an
    /// [`IterableDataset`](longshore_data::IterableDataset)).
    ///
    /// # Errors
    /// [`ShardError::Order`] when `info.num_workers` is not the layout's.
    pub fn worker_for(&self, info: &WorkerInfo) -> Result<WorkerStream, ShardError> {
        if info.num_workers.max(1) != self.plan.layout.num_workers {
            return Err(order_err(
                "num_workers",
                format!(
                    "the loader runs {} workers, the plan was made for {}",
                    info.num_workers, self.plan.layout.num_workers
                ),
            ));
        }
        self.worker(info.id)
    }

    /// The rank's batches in the order the loader delivers them (round-robin over the
    /// workers, skipping exhausted ones).
    pub fn batches(&self) -> RankBatches {
        let workers = (0..self.plan.layout.num_workers)
            .filter_map(|j| self.worker(j).ok())
            .collect::<Vec<_>>();
        RankBatches {
            active: vec![true; workers.len()],
            workers,
            next: 0,
        }
    }
}

/// A rank's batches in delivery order, from [`RankPlan::batches`].
#[derive(Debug)]
pub struct RankBatches {
    workers: Vec<WorkerStream>,
    active: Vec<bool>,
    next: usize,
}

impl Iterator for RankBatches {
    type Item = Vec<Slot>;

    fn next(&mut self) -> Option<Vec<Slot>> {
        for _ in 0..self.workers.len() {
            let j = self.next;
            self.next = (self.next + 1) % self.workers.len();
            if self.active[j] {
                match self.workers[j].next_batch() {
                    Some(batch) => return Some(batch),
                    None => self.active[j] = false,
                }
            }
        }
        None
    }
}

/// One worker's samples, in the order it reads them.
#[derive(Debug)]
pub struct WorkerStream {
    slots: SlotIter<Arc<EpochOrder>>,
    batch_size: usize,
    batches: u64,
}

impl WorkerStream {
    /// Batches this stream holds (the last may be short when `drop_last` is off).
    pub fn num_batches(&self) -> u64 {
        self.batches
    }

    /// Slots left to read.
    pub fn remaining(&self) -> u64 {
        self.slots.remaining()
    }

    /// The next `batch_size` slots (fewer at the end), or `None` when the stream is done.
    pub fn next_batch(&mut self) -> Option<Vec<Slot>> {
        let batch: Vec<Slot> = self.slots.by_ref().take(self.batch_size).collect();
        (!batch.is_empty()).then_some(batch)
    }
}

impl Iterator for WorkerStream {
    type Item = Slot;

    fn next(&mut self) -> Option<Slot> {
        self.slots.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.slots.size_hint()
    }
}

/// Where an epoch stood after every rank took the same number of batches: serialise it (serde)
/// in a checkpoint and pass it to [`EpochPlan::resume`], on the same or another [`Layout`].
///
/// It names the epoch, the options and the shard list (checked on resume), the samples of
/// the current segment (position ranges), the segment's layout and the batches taken from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeState {
    epoch: u64,
    config: OrderConfig,
    shards: usize,
    samples: u64,
    counts_hash: u64,
    remaining: Vec<[u64; 2]>,
    layout: Layout,
    batches: u64,
}

impl ResumeState {
    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The layout the batches were taken on.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Batches per rank taken from the current segment.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Whether the epoch is done: every rank took every batch of the segment (go on with the
    /// next epoch rather than resuming this one).
    pub fn is_finished(&self) -> bool {
        let m = self.remaining.iter().map(|[a, b]| b - a).sum();
        self.batches >= Split::new(m, self.layout, self.config.drop_last).batches
    }
}
