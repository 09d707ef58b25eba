//! The next epoch's batch order, drawn on a short-lived thread while the current epoch runs.
//!
//! A shuffled epoch starts with a permutation of the whole dataset (Fisher-Yates over 2M
//! indices costs 15-40 ms, mostly cache misses): the first batch cannot be dealt before it
//! exists. For the built-in shuffled sampler the loader draws the next epoch's permutation in
//! the background when an epoch starts, so the next epoch's start only picks it up. The order
//! is the sampler's own (its owned iterator, made for that epoch and seed), so results are
//! identical to drawing it at the epoch's start.

use std::thread::JoinHandle;

use longshore_data::{BatchIter, BatchSampling};

/// Datasets smaller than this draw their order at the epoch's start (it costs under 1 ms).
pub(crate) const MIN_LEN: usize = 1 << 16;

/// The batches of one (epoch, seed), being drawn on their own thread.
pub(crate) struct Prepared {
    epoch: u64,
    seed: u64,
    handle: JoinHandle<(Option<Vec<usize>>, BatchIter<'static>)>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("epoch", &self.epoch)
            .field("seed", &self.seed)
            .finish()
    }
}

impl Prepared {
    /// Starts drawing `sampler`'s batches of `epoch` (the sampler is set to it for the call and
    /// back to its current epoch after); `None` if the thread cannot start.
    pub(crate) fn spawn(sampler: &mut dyn BatchSampling, epoch: u64, seed: u64) -> Option<Self> {
        let current = sampler.epoch();
        sampler.set_epoch(epoch);
        let mut iter = sampler.iter_owned_from(0);
        sampler.set_epoch(current);
        let handle = std::thread::Builder::new()
            .name("longshore-sampler".into())
            .spawn(move || {
                // The first batch draws the permutation.
                let first = iter.next();
                (first, iter)
            });
        match handle {
            Ok(handle) => Some(Prepared {
                epoch,
                seed,
                handle,
            }),
            Err(e) => {
                tracing::debug!(target: "longshore::loader", error = %e, "could not start a thread to draw the next epoch's order; it is drawn when the epoch starts");
                None
            }
        }
    }

    /// Whether the order is drawn: [`take`](Prepared::take) would not wait.
    pub(crate) fn is_ready(&self) -> bool {
        self.handle.is_finished()
    }

    /// The batches, if they are those of `epoch` and `seed` (waiting for the thread if it
    /// has not finished); `None` otherwise, or if drawing them panicked.
    pub(crate) fn take(self, epoch: u64, seed: u64) -> Option<BatchIter<'static>> {
        if self.epoch != epoch || self.seed != seed {
            return None;
        }
        let (first, rest) = self.handle.join().ok()?;
        Some(Box::new(first.into_iter().chain(rest)))
    }
}
