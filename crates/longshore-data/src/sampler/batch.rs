//! [`BatchSampler`] (the struct, PyTorch's `BatchSampler`) and the [`BatchSampling`]
//! trait the loader consumes.

use std::fmt;

use super::{BatchIter, IndexIter, Sampler, SamplerState, check_state};
use crate::DataError;

/// Yields an epoch's indices grouped into batches: what the loader consumes (its
/// `batch_sampler` option takes any implementation).
///
/// This is the trait; the struct that wraps a [`Sampler`] into batches, PyTorch's
/// `BatchSampler(sampler, batch_size, drop_last)`, is [`BatchSampler`].
pub trait BatchSampling: Send + Sync + fmt::Debug {
    /// Batches per epoch.
    fn len(&self) -> usize;

    /// Whether an epoch yields no batch.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The (largest) batch size.
    fn batch_size(&self) -> usize;

    /// Whether a final partial batch is dropped.
    fn drop_last(&self) -> bool;

    /// The current epoch.
    fn epoch(&self) -> u64;

    /// Selects the epoch.
    fn set_epoch(&mut self, epoch: u64);

    /// The batches of the current epoch.
    fn iter(&self) -> BatchIter<'_>;

    /// The batches of the current epoch after the first `batches_done`: exactly `iter()`
    /// without its first `batches_done` batches. A loader resuming from a checkpoint starts
    /// here (it does not skip batches itself), so an implementation that ignores
    /// `batches_done` delivers those batches twice.
    fn iter_from(&self, batches_done: usize) -> BatchIter<'_>;

    /// What [`BatchSampling::iter_from`] yields, as an iterator that does not borrow the
    /// sampler (it keeps the epoch current when it was made): the loader pulls batches from
    /// it as it deals them to workers instead of materialising the epoch first. The default
    /// collects `iter_from(batches_done)`; [`BatchSampler`] overrides it to group its
    /// sampler's indices as they are consumed.
    fn iter_owned_from(&self, batches_done: usize) -> BatchIter<'static> {
        Box::new(self.iter_from(batches_done).collect::<Vec<_>>().into_iter())
    }

    /// The state after `batches_done` batches of the current epoch were consumed.
    fn state(&self, batches_done: usize) -> SamplerState {
        SamplerState {
            epoch: self.epoch(),
            position: batches_done,
            len: self.len(),
        }
    }

    /// The number of ranks the indices are one share of (see [`Sampler::num_replicas`]).
    fn num_replicas(&self) -> Option<usize> {
        None
    }

    /// See [`Sampler::resumed_share`].
    fn resumed_share(&self) -> Option<(u64, usize)> {
        None
    }

    /// See [`Sampler::resume_share`]; the batches are then those of what is left.
    ///
    /// # Errors
    /// As [`Sampler::resume_share`].
    fn resume_share(&mut self, epoch: u64, consumed: usize) -> Result<(), DataError> {
        let _ = (epoch, consumed);
        Err(super::not_a_share())
    }

    /// Sets the epoch from `state`; returns the batch position for [`BatchSampling::iter_from`].
    ///
    /// # Errors
    /// [`DataError::StateMismatch`] when the state does not fit this sampler.
    fn restore(&mut self, state: &SamplerState) -> Result<usize, DataError> {
        check_state(state, self.len(), "batches")?;
        self.set_epoch(state.epoch);
        Ok(state.position)
    }
}

/// Groups a [`Sampler`]'s indices into batches of `batch_size`, like PyTorch's
/// `BatchSampler(sampler, batch_size, drop_last)`; the last batch is smaller, or
/// dropped with `drop_last`. It implements the [`BatchSampling`] trait.
///
/// ```
/// use longshore_data::{BatchSampler, BatchSampling, SequentialSampler};
///
/// let batches = BatchSampler::new(SequentialSampler::new(5), 2, false)?;
/// let all: Vec<Vec<usize>> = batches.iter().collect();
/// assert_eq!(all, [vec![0, 1], vec![2, 3], vec![4]]);
/// # Ok::<(), longshore_data::DataError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BatchSampler<S> {
    sampler: S,
    batch_size: usize,
    drop_last: bool,
}

impl<S: Sampler> BatchSampler<S> {
    /// Batches of `batch_size` indices of `sampler`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `batch_size == 0`.
    pub fn new(
        sampler: S,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<BatchSampler<S>, DataError> {
        if batch_size == 0 {
            return Err(DataError::arg(
                "batch_size",
                "must be a positive integer, got 0",
            ));
        }
        Ok(BatchSampler {
            sampler,
            batch_size,
            drop_last,
        })
    }

    /// The inner sampler.
    pub fn sampler(&self) -> &S {
        &self.sampler
    }

    /// The inner sampler, mutable.
    pub fn sampler_mut(&mut self) -> &mut S {
        &mut self.sampler
    }
}

struct Chunks<'a> {
    inner: IndexIter<'a>,
    batch_size: usize,
    drop_last: bool,
    remaining: usize,
    /// Indices the inner sampler has left (bounds each batch's allocation).
    items_left: usize,
}

impl Iterator for Chunks<'_> {
    type Item = Vec<usize>;
    fn next(&mut self) -> Option<Vec<usize>> {
        if self.remaining == 0 {
            return None;
        }
        let mut batch = Vec::with_capacity(self.batch_size.min(self.items_left));
        batch.extend(self.inner.by_ref().take(self.batch_size));
        self.items_left = self.items_left.saturating_sub(batch.len());
        if batch.is_empty() || (self.drop_last && batch.len() < self.batch_size) {
            self.remaining = 0;
            return None;
        }
        self.remaining -= 1;
        Some(batch)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining))
    }
}

impl<S: Sampler> BatchSampling for BatchSampler<S> {
    fn len(&self) -> usize {
        let n = self.sampler.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }
    fn batch_size(&self) -> usize {
        self.batch_size
    }
    fn drop_last(&self) -> bool {
        self.drop_last
    }
    fn epoch(&self) -> u64 {
        self.sampler.epoch()
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.sampler.set_epoch(epoch);
    }
    fn num_replicas(&self) -> Option<usize> {
        self.sampler.num_replicas()
    }
    fn resumed_share(&self) -> Option<(u64, usize)> {
        self.sampler.resumed_share()
    }
    fn resume_share(&mut self, epoch: u64, consumed: usize) -> Result<(), DataError> {
        self.sampler.resume_share(epoch, consumed)
    }
    fn iter(&self) -> BatchIter<'_> {
        self.iter_from(0)
    }
    fn iter_from(&self, batches_done: usize) -> BatchIter<'_> {
        let (skip, chunks) = self.chunks(batches_done);
        Box::new(chunks(self.sampler.iter_from(skip)))
    }
    fn iter_owned_from(&self, batches_done: usize) -> BatchIter<'static> {
        let (skip, chunks) = self.chunks(batches_done);
        Box::new(chunks(self.sampler.iter_owned_from(skip)))
    }
}

impl<S: Sampler> BatchSampler<S> {
    /// The indices to skip for `batches_done`, and how to group the rest into batches.
    fn chunks<'a>(&self, batches_done: usize) -> (usize, impl FnOnce(IndexIter<'a>) -> Chunks<'a>) {
        let done = batches_done.min(self.len());
        let skip = done.saturating_mul(self.batch_size);
        let (batch_size, drop_last, remaining) =
            (self.batch_size, self.drop_last, self.len() - done);
        let items_left = self.sampler.len().saturating_sub(skip);
        (skip, move |inner| Chunks {
            inner,
            batch_size,
            drop_last,
            remaining,
            items_left,
        })
    }
}

impl<S: BatchSampling + ?Sized> BatchSampling for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn batch_size(&self) -> usize {
        (**self).batch_size()
    }
    fn drop_last(&self) -> bool {
        (**self).drop_last()
    }
    fn epoch(&self) -> u64 {
        (**self).epoch()
    }
    fn set_epoch(&mut self, epoch: u64) {
        (**self).set_epoch(epoch);
    }
    fn iter(&self) -> BatchIter<'_> {
        (**self).iter()
    }
    fn iter_from(&self, batches_done: usize) -> BatchIter<'_> {
        (**self).iter_from(batches_done)
    }
    fn iter_owned_from(&self, batches_done: usize) -> BatchIter<'static> {
        (**self).iter_owned_from(batches_done)
    }
    fn state(&self, batches_done: usize) -> SamplerState {
        (**self).state(batches_done)
    }
    fn num_replicas(&self) -> Option<usize> {
        (**self).num_replicas()
    }
    fn resumed_share(&self) -> Option<(u64, usize)> {
        (**self).resumed_share()
    }
    fn resume_share(&mut self, epoch: u64, consumed: usize) -> Result<(), DataError> {
        (**self).resume_share(epoch, consumed)
    }
    fn restore(&mut self, state: &SamplerState) -> Result<usize, DataError> {
        (**self).restore(state)
    }
}
