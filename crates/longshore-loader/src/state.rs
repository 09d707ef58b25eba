//! [`LoaderState`]: where an epoch stood, to resume a job mid-epoch.

use std::collections::BTreeSet;

use longshore_data::{EpochLayout, StreamPosition};
use serde::{Deserialize, Serialize};

/// The version [`DataLoader::state_dict`](crate::DataLoader::state_dict) writes. Version 1
/// (map-style datasets only, no [`LoaderState::stream`]) is still read.
pub(crate) const STATE_VERSION: u32 = 2;

/// A serialisable checkpoint of a loader's position (torchdata's `StatefulDataLoader`).
///
/// Taken with [`DataLoader::state_dict`](crate::DataLoader::state_dict) at any point, restored
/// with [`DataLoader::load_state_dict`](crate::DataLoader::load_state_dict) on a loader built
/// with the same dataset and options: the next epoch it runs yields exactly the batches the
/// checkpointed run had not yet delivered, in the same order.
///
/// For an iterable dataset it also holds [`stream`](LoaderState::stream): the epoch's layout
/// and the dataset's own position after the delivered batches
/// ([`IterableDataset::position`](longshore_data::IterableDataset::position)), from which the
/// dataset resumes (on another worker count too, when the dataset supports it); a dataset
/// without a position is resumed by replaying the epoch and discarding the `done_prefix`
/// batches delivered before ([`LoaderStats::replayed_batches`](crate::LoaderStats::replayed_batches)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Format version.
    pub version: u32,
    /// The epoch in progress (or the next one, if none is).
    pub epoch: u64,
    /// The base seed (shuffling and worker generators).
    pub seed: u64,
    /// Samples in the dataset, checked on restore (0 for iterable datasets).
    pub dataset_len: usize,
    /// Batches per epoch, checked on restore of a map-style dataset (iterable datasets: the
    /// batches of an epoch under way or restored when the dataset knows them, else `u64::MAX`).
    pub num_batches: u64,
    /// Every batch position below this was delivered.
    pub done_prefix: u64,
    /// Positions at or above `done_prefix` also delivered (out-of-order delivery).
    pub done_extra: Vec<u64>,
    /// Iterable datasets: how the epoch's streams are laid out and where the dataset stands
    /// (`None` for map-style datasets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamState>,
    /// Map-style datasets under a sampler of one rank's share (a
    /// [`DistributedSampler`](longshore_data::DistributedSampler)): the number of ranks. A
    /// loader whose sampler splits the dataset over another number refuses the state: each
    /// rank's positions would name other samples (sharded datasets resume on any number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_replicas: Option<usize>,
    /// With [`num_replicas`](LoaderState::num_replicas): the batch size, so that a loader of
    /// another number of ranks or batch size knows how much of the epoch was consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    /// With [`num_replicas`](LoaderState::num_replicas): the entries of the epoch's global
    /// order consumed before this epoch's shares were split (non-zero in an epoch resumed
    /// from another number of ranks).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub share_offset: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The part of a [`LoaderState`] that an iterable dataset's epoch adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamState {
    /// The layout the epoch was read with (batch size, `drop_last`, workers).
    pub layout: EpochLayout,
    /// The dataset's position after the `done_prefix` delivered batches; `None` when the
    /// dataset has none (the loader then replays the epoch, which needs the same layout).
    pub position: Option<StreamPosition>,
}

/// An iterable dataset's epoch as the loader reads it.
#[derive(Debug, Clone)]
pub(crate) struct StreamProgress {
    pub(crate) layout: EpochLayout,
    /// Batches of the epoch delivered before these streams began (a resume from a position).
    pub(crate) base: u64,
    /// The position the streams began from.
    pub(crate) resume: Option<StreamPosition>,
    /// The epoch's iterator reached its end.
    pub(crate) ended: bool,
}

/// Delivered positions of the current epoch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// The epoch iterator that marks this progress (0: none, e.g. a restored state not yet
    /// iterated). An older iterator still alive (abandoned, or drained by another thread)
    /// must not mark the newer epoch's positions.
    pub(crate) owner: u64,
    pub(crate) epoch: u64,
    pub(crate) num_batches: u64,
    pub(crate) prefix: u64,
    pub(crate) extra: BTreeSet<u64>,
    /// Iterable datasets: the layout and where the streams began.
    pub(crate) stream: Option<StreamProgress>,
}

impl Progress {
    pub(crate) fn new(epoch: u64, num_batches: u64) -> Self {
        Self {
            owner: 0,
            epoch,
            num_batches,
            prefix: 0,
            extra: BTreeSet::new(),
            stream: None,
        }
    }

    /// Marks `seq` delivered by the iterator `owner`; ignored from any other iterator.
    pub(crate) fn mark(&mut self, owner: u64, seq: u64) {
        if owner != self.owner || seq < self.prefix {
            return;
        }
        self.extra.insert(seq);
        while self.extra.remove(&self.prefix) {
            self.prefix += 1;
        }
    }

    pub(crate) fn is_done(&self, seq: u64) -> bool {
        seq < self.prefix || self.extra.contains(&seq)
    }

    pub(crate) fn complete(&self) -> bool {
        self.prefix >= self.num_batches || self.stream.as_ref().is_some_and(|s| s.ended)
    }
}
