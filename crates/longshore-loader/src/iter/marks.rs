//! Who marks a batch delivered (for `state_dict`): the iterator, or the stage after it that
//! hands batches to the user ([`Marker`]); and what that stage asks of the iterator.

use std::sync::Arc;

use super::LoaderIter;
use crate::engine::{Task, rank};
use crate::fetch::Fetch;
use crate::shared::Inner;
use crate::sync::lock;

impl<F: Fetch> LoaderIter<F> {
    /// From now on, batches are marked delivered (for [`state_dict`]) only through the
    /// returned [`Marker`], by the stage that hands them to the user: a prefetching stage
    /// (`to_device`) takes batches before the training loop sees them, and a checkpoint must
    /// not count those.
    ///
    /// [`state_dict`]: crate::DataLoader::state_dict
    pub(crate) fn defer_marks(&mut self) -> Marker<F> {
        self.defer_marks = true;
        Marker {
            inner: self.inner.clone(),
            run: self.run,
        }
    }

    /// The epoch this iterator runs.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The task that loads batch `seq` (its sample `indices`) in this epoch's generation,
    /// ranked by its place in the delivery order.
    pub(crate) fn task(&self, seq: u64, indices: Vec<usize>) -> Task {
        Task {
            generation: self.generation,
            epoch: self.epoch,
            lineage: self.lineage,
            seq,
            indices,
            rank: rank(self.epoch, seq),
        }
    }

    /// The position of the item `next` yielded last, and whether it counts as delivered.
    pub(crate) fn last_yielded(&self) -> Option<(u64, bool)> {
        self.last
    }
}

/// Marks batches of one epoch iterator delivered when a later stage hands them out (see
/// [`LoaderIter::defer_marks`]).
pub(crate) struct Marker<F: Fetch> {
    inner: Arc<Inner<F>>,
    run: u64,
}

impl<F: Fetch> Marker<F> {
    /// Batch `seq` reached the user.
    pub(crate) fn mark(&self, seq: u64) {
        lock(&self.inner.progress).mark(self.run, seq);
    }
}
