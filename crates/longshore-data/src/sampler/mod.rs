//! Samplers with PyTorch's semantics, seeded and reproducible, with resumable state.
//!
//! A [`Sampler`] yields the dataset indices of one epoch; a [`BatchSampling`]
//! implementation, such as the struct [`BatchSampler`] (PyTorch's `BatchSampler`),
//! yields them grouped into batches. Both are object safe (`Box<dyn Sampler>`). Random
//! samplers draw from [`crate::rng::epoch_rng`]`(seed, epoch)`: the same seed and
//! epoch give the same order on any machine.
//!
//! Resuming mid-epoch: [`Sampler::state`] records the epoch and how many indices (or
//! batches) were consumed; after [`Sampler::restore`], [`Sampler::iter_from`] yields
//! exactly the indices that had not been consumed yet.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::rng::{below, epoch_rng, permutation, unit_f64};

mod batch;
mod distributed;

pub use batch::{BatchSampler, BatchSampling};
pub use distributed::{DistributedSampler, DistributedSamplerBuilder};

/// Iterator over one epoch's indices.
pub type IndexIter<'a> = Box<dyn Iterator<Item = usize> + Send + 'a>;

/// Iterator over one epoch's batches of indices.
pub type BatchIter<'a> = Box<dyn Iterator<Item = Vec<usize>> + Send + 'a>;

/// Where a sampler stood: serialise it in a checkpoint to resume mid-epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SamplerState {
    /// The epoch being iterated.
    pub epoch: u64,
    /// How many items of that epoch (indices for a [`Sampler`], batches for a
    /// [`BatchSampling`]) were already consumed.
    pub position: usize,
    /// Items per epoch when the state was taken, checked on restore.
    pub len: usize,
}

/// Yields the dataset indices of an epoch, like PyTorch's `Sampler`.
pub trait Sampler: Send + Sync + fmt::Debug {
    /// Number of indices per epoch.
    fn len(&self) -> usize;

    /// Whether an epoch yields no index.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current epoch.
    fn epoch(&self) -> u64;

    /// Selects the epoch whose order [`Sampler::iter`] yields (random samplers reshuffle).
    fn set_epoch(&mut self, epoch: u64);

    /// The indices of the current epoch.
    fn iter(&self) -> IndexIter<'_>;

    /// The indices of the current epoch after the first `position`.
    fn iter_from(&self, position: usize) -> IndexIter<'_> {
        Box::new(self.iter().skip(position))
    }

    /// What [`Sampler::iter_from`] yields, as an iterator that does not borrow the sampler
    /// (it keeps the epoch current when it was made): a loader pulls from it while the
    /// sampler may be set to another epoch. The default collects `iter_from(position)`; the
    /// built-in samplers override it to produce indices as they are consumed.
    fn iter_owned_from(&self, position: usize) -> IndexIter<'static> {
        Box::new(self.iter_from(position).collect::<Vec<_>>().into_iter())
    }

    /// The state after `position` indices of the current epoch were consumed.
    fn state(&self, position: usize) -> SamplerState {
        SamplerState {
            epoch: self.epoch(),
            position,
            len: self.len(),
        }
    }

    /// The number of ranks the dataset is split over when this sampler takes one rank's share
    /// ([`DistributedSampler`]: `num_replicas`), `None` otherwise. A loader records it in its
    /// checkpoints and refuses to resume one on another number of ranks, whose shares are
    /// other index lists.
    fn num_replicas(&self) -> Option<usize> {
        None
    }

    /// The epoch resumed from another number of ranks ([`resume_share`](Sampler::resume_share))
    /// and the entries of its global order consumed before its shares were split; `None`
    /// when no epoch was.
    fn resumed_share(&self) -> Option<(u64, usize)> {
        None
    }

    /// Sets the epoch to `epoch` with its first `consumed` entries of the global order (every
    /// rank's share together, as a [`DistributedSampler`] lays them out) taken out, and what is
    /// left split over this sampler's ranks by the same rule: how a checkpoint taken on
    /// another number of ranks resumes. Only samplers of one rank's share can.
    ///
    /// # Errors
    /// [`DataError::StateMismatch`] for a sampler that is not one rank's share, or `consumed`
    /// past the epoch.
    fn resume_share(&mut self, epoch: u64, consumed: usize) -> Result<(), DataError> {
        let _ = (epoch, consumed);
        Err(not_a_share())
    }

    /// Sets the epoch from `state` and returns the position to pass to
    /// [`Sampler::iter_from`].
    ///
    /// # Errors
    /// [`DataError::StateMismatch`] when the state's length differs from this
    /// sampler's or its position is past the end of the epoch.
    fn restore(&mut self, state: &SamplerState) -> Result<usize, DataError> {
        check_state(state, self.len(), "indices")?;
        self.set_epoch(state.epoch);
        Ok(state.position)
    }
}

/// [`Sampler::resume_share`]'s refusal by a sampler that is not one rank's share.
pub(crate) fn not_a_share() -> DataError {
    DataError::StateMismatch(
        "only a sampler of one rank's share (DistributedSampler) resumes a checkpoint of \
         another number of ranks"
            .into(),
    )
}

pub(crate) fn check_state(state: &SamplerState, len: usize, what: &str) -> Result<(), DataError> {
    if state.len != len {
        return Err(DataError::StateMismatch(format!(
            "state was taken with {} {what} per epoch, this sampler has {len}",
            state.len
        )));
    }
    if state.position > len {
        return Err(DataError::StateMismatch(format!(
            "position {} is past the end of an epoch of {len} {what}",
            state.position
        )));
    }
    Ok(())
}

impl<S: Sampler + ?Sized> Sampler for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn epoch(&self) -> u64 {
        (**self).epoch()
    }
    fn set_epoch(&mut self, epoch: u64) {
        (**self).set_epoch(epoch);
    }
    fn iter(&self) -> IndexIter<'_> {
        (**self).iter()
    }
    fn iter_from(&self, position: usize) -> IndexIter<'_> {
        (**self).iter_from(position)
    }
    fn iter_owned_from(&self, position: usize) -> IndexIter<'static> {
        (**self).iter_owned_from(position)
    }
    fn state(&self, position: usize) -> SamplerState {
        (**self).state(position)
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

/// `0, 1, ..., len - 1`, like PyTorch's `SequentialSampler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequentialSampler {
    len: usize,
    epoch: u64,
}

impl SequentialSampler {
    /// Indices of a dataset of `len` items, in order.
    pub fn new(len: usize) -> SequentialSampler {
        SequentialSampler { len, epoch: 0 }
    }
}

impl Sampler for SequentialSampler {
    fn len(&self) -> usize {
        self.len
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn iter(&self) -> IndexIter<'_> {
        Box::new(0..self.len)
    }
    fn iter_from(&self, position: usize) -> IndexIter<'_> {
        Box::new(position.min(self.len)..self.len)
    }
    fn iter_owned_from(&self, position: usize) -> IndexIter<'static> {
        Box::new(position.min(self.len)..self.len)
    }
}

/// Random indices, like PyTorch's `RandomSampler`: a permutation (repeated whole
/// and then truncated when `num_samples > len`) without replacement, or
/// `num_samples` independent uniform draws with replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomSampler {
    dataset_len: usize,
    replacement: bool,
    num_samples: usize,
    seed: u64,
    epoch: u64,
}

impl RandomSampler {
    /// A shuffled permutation of `0..len` each epoch.
    ///
    /// # Errors
    /// [`DataError::Empty`] when `len == 0` (PyTorch refuses it too).
    pub fn new(len: usize, seed: u64) -> Result<RandomSampler, DataError> {
        RandomSampler::with_options(len, false, None, seed)
    }

    /// The general form: `replacement`, and `num_samples` (default `len`).
    ///
    /// # Errors
    /// [`DataError::Empty`] when `len == 0`; [`DataError::InvalidArgument`] when
    /// `num_samples == Some(0)`.
    pub fn with_options(
        len: usize,
        replacement: bool,
        num_samples: Option<usize>,
        seed: u64,
    ) -> Result<RandomSampler, DataError> {
        if len == 0 {
            return Err(DataError::Empty {
                what: "dataset given to RandomSampler",
            });
        }
        let num_samples = num_samples.unwrap_or(len);
        if num_samples == 0 {
            return Err(DataError::arg(
                "num_samples",
                "must be a positive integer, got 0",
            ));
        }
        Ok(RandomSampler {
            dataset_len: len,
            replacement,
            num_samples,
            seed,
            epoch: 0,
        })
    }
}

impl Sampler for RandomSampler {
    fn len(&self) -> usize {
        self.num_samples
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn iter(&self) -> IndexIter<'_> {
        self.iter_owned_from(0)
    }
    fn iter_owned_from(&self, position: usize) -> IndexIter<'static> {
        let it = self.indices();
        if position == 0 {
            it
        } else {
            Box::new(it.skip(position))
        }
    }
}

impl RandomSampler {
    /// The current epoch's indices; the permutation is drawn on the first `next`, not here.
    fn indices(&self) -> IndexIter<'static> {
        let mut rng = epoch_rng(self.seed, self.epoch);
        let (n, total) = (self.dataset_len, self.num_samples);
        if self.replacement {
            Box::new((0..total).map(move |_| below(&mut rng, n as u64) as usize))
        } else {
            // Whole permutations, then the head of one more, as PyTorch does.
            let mut remaining = total;
            Box::new(
                std::iter::from_fn(move || {
                    if remaining == 0 {
                        return None;
                    }
                    let take = remaining.min(n);
                    remaining -= take;
                    let mut p = permutation(n, &mut rng);
                    p.truncate(take);
                    Some(p)
                })
                .flatten(),
            )
        }
    }
}

/// A random permutation of given indices each epoch, like PyTorch's `SubsetRandomSampler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsetRandomSampler {
    indices: Vec<usize>,
    seed: u64,
    epoch: u64,
}

impl SubsetRandomSampler {
    /// Samples `indices` in random order.
    pub fn new(indices: Vec<usize>, seed: u64) -> SubsetRandomSampler {
        SubsetRandomSampler {
            indices,
            seed,
            epoch: 0,
        }
    }
}

impl Sampler for SubsetRandomSampler {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn iter(&self) -> IndexIter<'_> {
        let mut rng = epoch_rng(self.seed, self.epoch);
        let perm = permutation(self.indices.len(), &mut rng);
        Box::new(perm.into_iter().map(move |i| self.indices[i]))
    }
}

/// Indices drawn with probability proportional to their weight, like PyTorch's
/// `WeightedRandomSampler` (`torch.multinomial`).
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedRandomSampler {
    /// Cumulative weights, for draws with replacement.
    cumulative: Vec<f64>,
    weights: Vec<f64>,
    num_samples: usize,
    replacement: bool,
    seed: u64,
    epoch: u64,
}

impl WeightedRandomSampler {
    /// Draws `num_samples` indices of `0..weights.len()`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when a weight is negative, NaN or infinite,
    /// all weights are zero, `num_samples == 0`, or (without replacement)
    /// `num_samples` exceeds the number of non-zero weights.
    pub fn new(
        weights: Vec<f64>,
        num_samples: usize,
        replacement: bool,
        seed: u64,
    ) -> Result<WeightedRandomSampler, DataError> {
        if weights.is_empty() {
            return Err(DataError::Empty {
                what: "weights given to WeightedRandomSampler",
            });
        }
        if let Some((i, w)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !w.is_finite() || **w < 0.0)
        {
            return Err(DataError::arg(
                "weights",
                format!("weight at index {i} is {w}; weights must be finite and non-negative"),
            ));
        }
        let nonzero = weights.iter().filter(|&&w| w > 0.0).count();
        if nonzero == 0 {
            return Err(DataError::arg("weights", "all weights are zero"));
        }
        if num_samples == 0 {
            return Err(DataError::arg(
                "num_samples",
                "must be a positive integer, got 0",
            ));
        }
        if !replacement && num_samples > nonzero {
            return Err(DataError::arg(
                "num_samples",
                format!(
                    "{num_samples} samples without replacement, but only {nonzero} weights are non-zero"
                ),
            ));
        }
        let mut acc = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        if !acc.is_finite() {
            return Err(DataError::arg("weights", "sum of weights overflows"));
        }
        Ok(WeightedRandomSampler {
            cumulative,
            weights,
            num_samples,
            replacement,
            seed,
            epoch: 0,
        })
    }
}

impl Sampler for WeightedRandomSampler {
    fn len(&self) -> usize {
        self.num_samples
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn iter(&self) -> IndexIter<'_> {
        let mut rng = epoch_rng(self.seed, self.epoch);
        if self.replacement {
            let total = self.cumulative.last().copied().unwrap_or(0.0);
            let last = self.cumulative.len() - 1;
            Box::new((0..self.num_samples).map(move |_| {
                let u = unit_f64(&mut rng) * total;
                // First index whose cumulative weight exceeds u: zero weights are never hit.
                self.cumulative.partition_point(|&c| c <= u).min(last)
            }))
        } else {
            // Efraimidis-Spirakis: key = ln(u) / w, take the largest keys. The order of
            // decreasing keys is distributed like successive draws without replacement.
            let mut keyed: Vec<(f64, usize)> = self
                .weights
                .iter()
                .enumerate()
                .filter(|(_, w)| **w > 0.0)
                .map(|(i, &w)| {
                    // 1 - u is in (0, 1], so ln is finite or zero.
                    let u = 1.0 - unit_f64(&mut rng);
                    (u.ln() / w, i)
                })
                .collect();
            keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            keyed.truncate(self.num_samples);
            Box::new(keyed.into_iter().map(|(_, i)| i))
        }
    }
}
