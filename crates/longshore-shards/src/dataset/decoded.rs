//! [`Decoded`]: a [`ShardedDataset`] whose samples a function turns into the loader's items.

use longshore_data::{DataError, ItemIter, IterableDataset, WorkerInfo};

use super::{ShardSample, ShardedDataset};

/// A [`ShardedDataset`] with each sample decoded by a function, from
/// [`ShardedDataset::decode_with`]: its items are the function's results, and its errors
/// (a [`ShardError`](crate::ShardError) converts with `?`) are items' errors naming the
/// sample, for the loader's `on_sample_error` policy.
#[derive(Clone)]
pub struct Decoded<F> {
    dataset: ShardedDataset,
    decode: F,
}

impl<F> std::fmt::Debug for Decoded<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

impl<F> Decoded<F> {
    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        &self.dataset
    }
}

impl ShardedDataset {
    /// This dataset with each sample turned into an item by `decode` (parse fields, decode
    /// images, build tensors): an [`IterableDataset`] of its results. An error it returns
    /// becomes the item's error, naming the sample (its global id, shard and key).
    ///
    /// ```
    /// # use longshore_shards::dataset::ShardedDataset;
    /// # fn f(ds: ShardedDataset) {
    /// let labels = ds.decode_with(|s| Ok((s.sample.int("cls")?, u8::from(s.pad))));
    /// # }
    /// ```
    pub fn decode_with<T, F>(self, decode: F) -> Decoded<F>
    where
        F: Fn(&ShardSample) -> Result<T, DataError> + Send + Sync,
        T: Send,
    {
        Decoded {
            dataset: self,
            decode,
        }
    }
}

impl<T, F> IterableDataset for Decoded<F>
where
    F: Fn(&ShardSample) -> Result<T, DataError> + Send + Sync,
    T: Send,
{
    type Item = T;

    longshore_data::forward_epoch_seam!(dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, T> {
        Box::new(self.dataset.iter(worker).map(move |item| {
            let s = item?;
            (self.decode)(&s).map_err(|e| {
                DataError::custom(
                    format!(
                        "decoding sample {} ({:?} at byte {} of shard {})",
                        s.id.global, s.sample.key, s.sample.offset, s.sample.url
                    ),
                    e,
                )
            })
        }))
    }
}
