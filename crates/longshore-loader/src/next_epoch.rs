//! Cross-epoch prefetch: the next epoch's first batches, started on the idle workers while
//! the current epoch drains its last ones (`DataLoaderBuilder::prefetch_next_epoch`).
//!
//! With persistent workers the next epoch's order is known before the user asks for it (it is
//! a function of the sampler, the epoch number and the seed). Once an epoch iterator has
//! dealt its last batch, [`LoaderIter`](crate::LoaderIter) opens an [`Ahead`]: it pulls the
//! next epoch's batches from the sampler and sends them to the workers under a generation of
//! their own (the engine's *ahead* generation), as many as the in-flight limit
//! (`num_workers * prefetch_factor`, counting the current epoch's undelivered batches)
//! allows. Their replies are kept in the `Ahead`, never yielded by the current epoch.
//!
//! When the epoch ends, the `Ahead` is parked with the workers. The next `iter()` adopts it
//! if it is what that epoch would have run: the same epoch number, seed and plan revision (no
//! `load_state_dict`), nothing restored. The new iterator then makes the ahead generation
//! current, takes its slots as its own first batches and deals the rest of the epoch from
//! where the `Ahead` stopped. Otherwise the `Ahead` is discarded (its batches' leases go back
//! to the pool, its queued tasks are skipped) and the epoch starts as without it.
//!
//! Identical results: a speculative batch is computed by the worker the epoch would have
//! dealt it to (position `k` to worker `k % num_workers`, which is how an epoch's first
//! `num_workers * prefetch_factor` batches are dealt in either order mode), as the first tasks
//! of that worker's run of the epoch (`Task::lineage`), so it draws from the generator seeded
//! from `(seed, epoch, id)` exactly as without speculation. A discarded start leaves nothing
//! behind: the next run has another lineage, so every worker starts it from a fresh state.

use std::collections::VecDeque;
use std::time::Duration;

use longshore_data::BatchIter;

use crate::engine::{Outcome, Reply};
use crate::state::Progress;

/// An indexed epoch's batches, pulled from the sampler as they are dealt (the epoch is never
/// materialised up front), with the positions a restore marked done skipped.
pub(crate) struct Batches {
    pub(crate) iter: BatchIter<'static>,
    /// Position of the batch `iter` yields next.
    pub(crate) next: u64,
    /// What a restore marked done.
    pub(crate) done: Option<Progress>,
    /// The sampler's iterator has ended (it is not asked again).
    pub(crate) ended: bool,
}

impl Batches {
    pub(crate) fn new(iter: BatchIter<'static>, next: u64, done: Option<Progress>) -> Self {
        Self {
            iter,
            next,
            done,
            ended: false,
        }
    }

    /// The next batch not yet delivered: (position, indices).
    pub(crate) fn pull(&mut self) -> Option<(u64, Vec<usize>)> {
        while !self.ended {
            let Some(indices) = self.iter.next() else {
                self.ended = true;
                return None;
            };
            let seq = self.next;
            self.next += 1;
            if self.done.as_ref().is_none_or(|d| !d.is_done(seq)) {
                return Some((seq, indices));
            }
        }
        None
    }
}

/// Where a batch sent to a worker stands.
pub(crate) enum SlotState<O> {
    /// With its worker.
    Sent,
    /// Finished, held until it is delivered.
    Done(Outcome<O>),
    /// Delivered (out-of-order mode; removed once it reaches the front).
    Taken,
}

/// A batch sent and not yet delivered. Slots are kept in sending order, which is position
/// order, so a reply finds its slot by binary search.
pub(crate) struct Slot<O> {
    pub(crate) seq: u64,
    pub(crate) worker: usize,
    pub(crate) state: SlotState<O>,
    /// The batch's indices once its worker gave them back (to load it again if it must be
    /// given back to a starved pool).
    pub(crate) indices: Vec<usize>,
}

/// Counters of the replies taken in, added to the loader's stats when they count.
#[derive(Debug, Default)]
pub(crate) struct ReplyCounts {
    pub(crate) worker_busy: Duration,
    pub(crate) pinned_wait: Duration,
    pub(crate) skipped: u64,
    pub(crate) restarts: u64,
}

impl ReplyCounts {
    pub(crate) fn add<O>(&mut self, r: &Reply<O>) {
        self.worker_busy += r.busy;
        self.pinned_wait += r.pinned_wait;
        self.skipped += r.skipped;
        self.restarts += u64::from(r.restarted);
    }
}

/// What an `Ahead` was started for: it is adopted only by an epoch with the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AheadKey {
    pub(crate) epoch: u64,
    pub(crate) seed: u64,
    /// `Plan::revision` (bumped by `load_state_dict`).
    pub(crate) revision: u64,
}

/// The next epoch's first batches, started before its iterator exists.
pub(crate) struct Ahead<O> {
    pub(crate) key: AheadKey,
    /// The engine generation its tasks carry.
    pub(crate) generation: u64,
    /// The lineage its tasks carry; the adopting iterator's tasks carry it too.
    pub(crate) lineage: u64,
    /// The rest of the epoch, from the first batch not sent (`None` for streams: positions
    /// are dealt round-robin, as many as the in-flight bound allows).
    pub(crate) batches: Option<Batches>,
    /// Batches sent, in position order.
    pub(crate) slots: VecDeque<Slot<O>>,
    /// Tasks of this start queued or running on each worker.
    pub(crate) outstanding: Vec<usize>,
    /// Slots in state `Done`.
    pub(crate) ready: usize,
    /// Counters of the replies taken in (they count once the epoch adopts them).
    pub(crate) counts: ReplyCounts,
}

impl<O> Ahead<O> {
    pub(crate) fn new(
        key: AheadKey,
        generation: u64,
        lineage: u64,
        batches: Option<Batches>,
        workers: usize,
    ) -> Self {
        Self {
            key,
            generation,
            lineage,
            batches,
            slots: VecDeque::new(),
            outstanding: vec![0; workers],
            ready: 0,
            counts: ReplyCounts::default(),
        }
    }

    /// Batches sent (finished or not).
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The next batch to start, and the worker the epoch would deal it to; `None` when the
    /// epoch has no more.
    pub(crate) fn next_task(&mut self) -> Option<(u64, usize, Vec<usize>)> {
        let n = self.outstanding.len();
        let (seq, indices) = match &mut self.batches {
            Some(b) => b.pull()?,
            // A stream's next position: every worker's stream is open at the epoch's start.
            None => (self.slots.len() as u64, Vec::new()),
        };
        Some((seq, (seq % n as u64) as usize, indices))
    }

    /// Records that batch `seq` was sent to worker `w`.
    pub(crate) fn sent(&mut self, seq: u64, w: usize) {
        self.outstanding[w] += 1;
        self.slots.push_back(Slot {
            seq,
            worker: w,
            state: SlotState::Sent,
            indices: Vec::new(),
        });
    }

    /// Takes in a reply of this start's generation.
    pub(crate) fn absorb(&mut self, r: Reply<O>, keep_indices: bool) {
        self.counts.add(&r);
        if settle(&mut self.slots, &mut self.outstanding, r, keep_indices) {
            self.ready += 1;
        }
    }
}

/// Puts reply `r` in the slot of its position if that slot waits for it: its worker has one
/// task fewer outstanding (it is free for more; the batch still counts as in flight, holding
/// its lease, until it is yielded, as PyTorch counts outstanding tasks), the outcome is
/// stored, and the indices kept if asked. Whether the reply was taken (a batch became ready).
pub(crate) fn settle<O>(
    slots: &mut std::collections::VecDeque<Slot<O>>,
    outstanding: &mut [usize],
    r: Reply<O>,
    keep_indices: bool,
) -> bool {
    let Ok(i) = slots.binary_search_by_key(&r.seq, |s| s.seq) else {
        return false;
    };
    let slot = &mut slots[i];
    if !matches!(slot.state, SlotState::Sent) {
        return false;
    }
    outstanding[slot.worker] -= 1;
    slot.state = SlotState::Done(r.outcome);
    if keep_indices {
        slot.indices = r.indices;
    }
    true
}

impl<O> std::fmt::Debug for Ahead<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("key", &self.key)
            .field("generation", &self.generation)
            .field("sent", &self.slots.len())
            .field("ready", &self.ready)
            .finish()
    }
}
