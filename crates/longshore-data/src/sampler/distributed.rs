//! [`DistributedSampler`]: this replica's share of a dataset, like PyTorch's.

use super::{IndexIter, Sampler};
use crate::DataError;
use crate::rng::{epoch_rng, shuffle};

/// Restricts loading to this replica's share of the dataset, like PyTorch's
/// `DistributedSampler`.
///
/// Each epoch the indices `0..len` (shuffled by [`epoch_rng`]`(seed, epoch)` when
/// `shuffle`, identically on every replica given the same seed; PyTorch seeds
/// `seed + epoch`, so orders differ from PyTorch's but obey the same rules) are
/// padded by wrapping around to a multiple of `num_replicas` (or truncated to one,
/// with `drop_last`), and replica `rank` takes every `num_replicas`-th index from
/// position `rank`. Every replica yields the same number of indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    dataset_len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
    num_samples: usize,
    /// An epoch resumed from another number of ranks ([`Sampler::resume_share`]): that epoch
    /// and how many entries of its order were consumed before.
    resumed: Option<(u64, usize)>,
}

impl DistributedSampler {
    /// A builder for the share of replica `rank` of `num_replicas` of a dataset of
    /// `len` items, with PyTorch's defaults: `shuffle = true`, `seed = 0`,
    /// `drop_last = false`.
    ///
    /// ```
    /// use longshore_data::{DistributedSampler, Sampler};
    ///
    /// // PyTorch: DistributedSampler(ds, num_replicas=4, rank=1, shuffle=False, drop_last=True)
    /// let s = DistributedSampler::builder(10, 4, 1).shuffle(false).drop_last(true).build()?;
    /// assert_eq!(s.iter().collect::<Vec<_>>(), [1, 5]);
    /// # Ok::<(), longshore_data::DataError>(())
    /// ```
    pub fn builder(len: usize, num_replicas: usize, rank: usize) -> DistributedSamplerBuilder {
        DistributedSamplerBuilder {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
        }
    }

    /// Indices over all replicas (`num_samples * num_replicas`; in an epoch resumed from
    /// another number of ranks, what is left of it, split the same way).
    pub fn total_size(&self) -> usize {
        self.share_len() * self.num_replicas
    }

    /// The entries of the current epoch's order consumed before its shares were split
    /// (non-zero only in an epoch resumed from another number of ranks).
    fn offset(&self) -> usize {
        match self.resumed {
            Some((epoch, offset)) if epoch == self.epoch => offset.min(self.dataset_len),
            _ => 0,
        }
    }

    /// This replica's indices in the current epoch: PyTorch's rule over what is left.
    fn share_len(&self) -> usize {
        let left = self.dataset_len - self.offset();
        if self.offset() == 0 {
            self.num_samples
        } else if self.drop_last {
            left / self.num_replicas
        } else {
            left.div_ceil(self.num_replicas)
        }
    }

    /// The full padded (or truncated) index list of this epoch, before it is split
    /// between replicas (in a resumed epoch, the entries left after those consumed before).
    pub fn global_indices(&self) -> Vec<usize> {
        let mut indices: Vec<usize> = (0..self.dataset_len).collect();
        if self.shuffle {
            shuffle(&mut indices, &mut epoch_rng(self.seed, self.epoch));
        }
        indices.drain(..self.offset());
        let total = self.total_size();
        if indices.len() >= total {
            indices.truncate(total);
        } else if !indices.is_empty() {
            let mut k = 0;
            while indices.len() < total {
                indices.push(indices[k]);
                k += 1;
            }
        }
        indices
    }
}

impl Sampler for DistributedSampler {
    fn len(&self) -> usize {
        self.share_len()
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn num_replicas(&self) -> Option<usize> {
        Some(self.num_replicas)
    }
    fn resumed_share(&self) -> Option<(u64, usize)> {
        self.resumed
    }
    fn resume_share(&mut self, epoch: u64, consumed: usize) -> Result<(), DataError> {
        if consumed > self.dataset_len {
            return Err(DataError::StateMismatch(format!(
                "{consumed} entries of epoch {epoch}'s order consumed, of a dataset of {}",
                self.dataset_len
            )));
        }
        self.resumed = (consumed > 0).then_some((epoch, consumed));
        self.epoch = epoch;
        Ok(())
    }
    fn iter(&self) -> IndexIter<'_> {
        self.iter_owned_from(0)
    }
    fn iter_owned_from(&self, position: usize) -> IndexIter<'static> {
        let indices = self.global_indices();
        Box::new(
            indices
                .into_iter()
                .skip(self.rank)
                .step_by(self.num_replicas)
                .take(self.share_len())
                .skip(position),
        )
    }
}

/// Options of a [`DistributedSampler`], from [`DistributedSampler::builder`]; the
/// defaults are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct DistributedSamplerBuilder {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSamplerBuilder {
    /// Whether each epoch's order is shuffled (by `seed` and the epoch); default `true`.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed of the shuffle, the same on every replica; default `0`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether the tail that does not divide evenly between replicas is dropped
    /// (instead of padding by wrapping around); default `false`.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The sampler.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `num_replicas == 0` or `rank >= num_replicas`.
    pub fn build(self) -> Result<DistributedSampler, DataError> {
        let DistributedSamplerBuilder {
            len,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
        } = self;
        if num_replicas == 0 {
            return Err(DataError::arg("num_replicas", "must be at least 1"));
        }
        if rank >= num_replicas {
            return Err(DataError::arg(
                "rank",
                format!(
                    "invalid rank {rank}, rank should be in the interval [0, {}]",
                    num_replicas - 1
                ),
            ));
        }
        let num_samples = if drop_last && len % num_replicas != 0 {
            // ceil((len - num_replicas) / num_replicas) == floor(len / num_replicas)
            len / num_replicas
        } else {
            len.div_ceil(num_replicas)
        };
        Ok(DistributedSampler {
            dataset_len: len,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            epoch: 0,
            num_samples,
            resumed: None,
        })
    }
}
