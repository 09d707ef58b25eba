//! [`LoaderState`]: where an epoch stood, to resume a job mid-epoch.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A serialisable checkpoint of a loader's position (torchdata's `StatefulDataLoader`).
///
/// Taken with [`DataLoader::state_dict`](crate::DataLoader::state_dict) at any point, restored
/// with [`DataLoader::load_state_dict`](crate::DataLoader::load_state_dict) on a loader built
/// with the same dataset and options: the next epoch it runs yields exactly the batches the
/// checkpointed run had not yet delivered, in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Format version.
    pub version: u32,
    /// The epoch in progress (or the next one, if none is).
    pub epoch: u64,
    /// The base seed (shuffling and worker generators).
    pub seed: u64,
    /// Samples in the dataset, checked on restore.
    pub dataset_len: usize,
    /// Batches per epoch, checked on restore.
    pub num_batches: u64,
    /// Every batch position below this was delivered.
    pub done_prefix: u64,
    /// Positions at or above `done_prefix` also delivered (out-of-order delivery).
    pub done_extra: Vec<u64>,
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
}

impl Progress {
    pub(crate) fn new(epoch: u64, num_batches: u64) -> Self {
        Self {
            owner: 0,
            epoch,
            num_batches,
            prefix: 0,
            extra: BTreeSet::new(),
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
        self.prefix >= self.num_batches
    }
}
