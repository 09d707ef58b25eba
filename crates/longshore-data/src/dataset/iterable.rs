//! Iterable (stream) datasets, the epoch and position seam the loader drives them through
//! ([`EpochLayout`], [`StreamPosition`]), and their combinators.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::dataset::Dataset;
use crate::worker::WorkerInfo;

/// How a loader reads one epoch of an [`IterableDataset`]: what the dataset needs to lay out
/// its workers' streams (given to [`IterableDataset::begin_epoch`] and
/// [`IterableDataset::position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EpochLayout {
    /// The loader's epoch (what `set_epoch` set; each iteration runs the next one).
    pub epoch: u64,
    /// The loader's base seed.
    pub seed: u64,
    /// Items per batch the loader collates from each worker's stream.
    pub batch_size: usize,
    /// Whether the loader drops each worker's last, incomplete batch.
    pub drop_last: bool,
    /// The number of streams (worker threads) the loader reads, at least 1.
    pub num_workers: usize,
}

impl EpochLayout {
    /// The layout of epoch `epoch` for a loader with base seed `seed`, `num_workers` streams
    /// (0, "load without workers", is one stream) batched by `batch_size`.
    pub fn new(
        epoch: u64,
        seed: u64,
        batch_size: usize,
        drop_last: bool,
        num_workers: usize,
    ) -> EpochLayout {
        EpochLayout {
            epoch,
            seed,
            batch_size,
            drop_last,
            num_workers: num_workers.max(1),
        }
    }
}

/// Where an [`IterableDataset`]'s epoch stands after some delivered batches, in the dataset's
/// own terms (a sharded dataset: the samples not yet delivered), kept as JSON so that it rides
/// in the loader's checkpoint whatever the dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamPosition(serde_json::Value);

impl StreamPosition {
    /// The position `value` (any serialisable state).
    ///
    /// # Errors
    /// [`DataError::StreamPosition`] when `value` does not serialise.
    pub fn new<T: Serialize>(value: &T) -> Result<StreamPosition, DataError> {
        serde_json::to_value(value)
            .map(StreamPosition)
            .map_err(|e| DataError::StreamPosition(format!("cannot serialise the position: {e}")))
    }

    /// The position as the state it was made from.
    ///
    /// # Errors
    /// [`DataError::StreamPosition`] when it is not a `T` (a position of another kind of
    /// dataset).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DataError> {
        T::deserialize(&self.0).map_err(|e| {
            DataError::StreamPosition(format!(
                "the position is not a {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The position as JSON.
    pub fn as_json(&self) -> &serde_json::Value {
        &self.0
    }
}

/// An iterable (stream) dataset, like PyTorch's `IterableDataset`.
///
/// Each worker calls [`IterableDataset::iter`] with its [`WorkerInfo`] and must yield
/// only its own share (see [`WorkerInfo::shard`]); otherwise every worker yields
/// every item, as in PyTorch.
///
/// # Epochs and resume
///
/// The loader owns epochs, batch size and checkpoints. Before it opens the workers' streams of
/// an epoch (also an epoch started ahead, while the previous one drains) it calls
/// [`begin_epoch`](IterableDataset::begin_epoch) with the epoch's [`EpochLayout`]; each
/// worker's [`WorkerInfo::epoch`] then names the epoch its stream is for, so a dataset keys
/// what it prepared by epoch instead of keeping a "current epoch". For a checkpoint the loader
/// asks [`position`](IterableDataset::position) where the epoch stands after the batches it
/// delivered, and resumes with `begin_epoch(layout, Some(position))`. A dataset without a
/// position (the default) is resumed by replaying the epoch and discarding the batches
/// delivered before, which is exact when the streams are a function of the layout (seed,
/// epoch, workers) alone.
pub trait IterableDataset: Send + Sync {
    /// What the stream yields.
    type Item: Send;

    /// This worker's stream of items (for the epoch `worker.epoch`).
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, Self::Item>;

    /// Prepares epoch `layout.epoch` read as `layout` says, from its start or, with `resume`,
    /// from a position this dataset returned from [`position`](IterableDataset::position);
    /// returns the number of batches the loader's epoch yields (what is left of it after a
    /// resume), when the dataset knows it. Called by the loader before it opens the epoch's
    /// streams, and possibly again for the same epoch (`len()`, a restore): it must be
    /// idempotent. The default knows nothing and refuses a position.
    ///
    /// # Errors
    /// [`DataError::StreamPosition`] for a position of another dataset, epoch, seed or
    /// option; any error preparing the epoch.
    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        let _ = layout;
        no_position(resume, std::any::type_name::<Self>())?;
        Ok(None)
    }

    /// Where epoch `layout.epoch`, begun with `begin_epoch(layout, resume)`, stands once the
    /// loader delivered `batches` batches of its streams (a pure function of its arguments:
    /// the loader may ask after other epochs were begun); `None` (the default) when the
    /// dataset has no position, and the loader resumes it by replay.
    ///
    /// # Errors
    /// When `batches` is more than the epoch holds, or `resume` does not fit.
    fn position(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
        batches: u64,
    ) -> Result<Option<StreamPosition>, DataError> {
        let _ = (layout, resume, batches);
        Ok(None)
    }
}

/// Refuses a position given to `what`, a dataset that keeps none (the loader resumes it by
/// replay, and gives it none).
fn no_position(resume: Option<&StreamPosition>, what: &str) -> Result<(), DataError> {
    match resume {
        Some(_) => Err(DataError::StreamPosition(format!(
            "{what} has no stream position"
        ))),
        None => Ok(()),
    }
}

/// The iterator an [`IterableDataset`] returns.
pub type ItemIter<'a, T> = Box<dyn Iterator<Item = Result<T, DataError>> + Send + 'a>;

/// Inside an `impl IterableDataset for Wrapper`, forwards
/// [`begin_epoch`](IterableDataset::begin_epoch) and [`position`](IterableDataset::position)
/// to the wrapped dataset: `forward_epoch_seam!(field)` (or `field.inner` for a nested one) for
/// `self.field`, `forward_epoch_seam!(*)` for `**self` (smart pointers). A wrapper that does not
/// change which items make a batch keeps its dataset's epochs and positions this way.
///
/// ```
/// use longshore_data::{ItemIter, IterableDataset, WorkerInfo, forward_epoch_seam};
///
/// struct Logged<D>(D);
/// impl<D: IterableDataset> IterableDataset for Logged<D> {
///     type Item = D::Item;
///     fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, D::Item> {
///         self.0.iter(worker)
///     }
///     forward_epoch_seam!(0);
/// }
/// ```
#[macro_export]
macro_rules! forward_epoch_seam {
    ($($how:tt)+) => {
        fn begin_epoch(
            &self,
            layout: &$crate::EpochLayout,
            resume: ::core::option::Option<&$crate::StreamPosition>,
        ) -> ::core::result::Result<::core::option::Option<u64>, $crate::DataError> {
            $crate::IterableDataset::begin_epoch(
                $crate::__epoch_seam_target!(self, $($how)+),
                layout,
                resume,
            )
        }
        fn position(
            &self,
            layout: &$crate::EpochLayout,
            resume: ::core::option::Option<&$crate::StreamPosition>,
            batches: u64,
        ) -> ::core::result::Result<::core::option::Option<$crate::StreamPosition>, $crate::DataError>
        {
            $crate::IterableDataset::position(
                $crate::__epoch_seam_target!(self, $($how)+),
                layout,
                resume,
                batches,
            )
        }
    };
}

/// The dataset [`forward_epoch_seam!`] forwards to (`self` is given by the caller's method).
#[doc(hidden)]
#[macro_export]
macro_rules! __epoch_seam_target {
    ($s:tt, *) => {
        &**$s
    };
    ($s:tt, $($field:tt).+) => {
        &$s.$($field).+
    };
}

macro_rules! forward_iterable {
    ($($ptr:ty),*) => {$(
        impl<D: IterableDataset + ?Sized> IterableDataset for $ptr {
            type Item = D::Item;
            fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, D::Item> {
                (**self).iter(worker)
            }
            forward_epoch_seam!(*);
        }
    )*};
}

forward_iterable!(Arc<D>, Box<D>, &D);

/// Combinators for every [`IterableDataset`].
pub trait IterableExt: IterableDataset + Sized {
    /// This stream followed by `other`, like PyTorch's `ChainDataset`.
    fn chain<B: IterableDataset<Item = Self::Item>>(self, other: B) -> Chain<Self, B> {
        Chain { a: self, b: other }
    }

    /// Applies `f` to every item.
    fn map<U, F>(self, f: F) -> IterMap<Self, F>
    where
        F: Fn(Self::Item) -> U + Send + Sync,
        U: Send,
    {
        IterMap { dataset: self, f }
    }
}

impl<D: IterableDataset> IterableExt for D {}

/// Two iterable datasets one after the other; see [`IterableExt::chain`].
#[derive(Debug, Clone)]
pub struct Chain<A, B> {
    a: A,
    b: B,
}

impl<A, B> IterableDataset for Chain<A, B>
where
    A: IterableDataset,
    B: IterableDataset<Item = A::Item>,
{
    type Item = A::Item;
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, A::Item> {
        Box::new(self.a.iter(worker).chain(self.b.iter(worker)))
    }
    /// Begins the epoch of both streams. A chain has no position of its own (its batches
    /// straddle the two streams): the loader resumes it by replay.
    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        no_position(resume, "a chain of iterable datasets")?;
        self.a.begin_epoch(layout, None)?;
        self.b.begin_epoch(layout, None)?;
        Ok(None)
    }
}

/// An iterable dataset with `f` applied to each item; see [`IterableExt::map`].
#[derive(Clone)]
pub struct IterMap<D, F> {
    dataset: D,
    f: F,
}

impl<D: fmt::Debug, F> fmt::Debug for IterMap<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IterMap")
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

impl<D, F, U> IterableDataset for IterMap<D, F>
where
    D: IterableDataset,
    F: Fn(D::Item) -> U + Send + Sync,
    U: Send,
{
    type Item = U;
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, U> {
        Box::new(self.dataset.iter(worker).map(move |r| r.map(&self.f)))
    }
    forward_epoch_seam!(dataset);
}

/// A map-style dataset read as a stream, dealt round-robin over workers
/// ([`WorkerInfo::shard`]): each item is yielded by exactly one worker.
#[derive(Debug, Clone)]
pub struct Sharded<D> {
    dataset: D,
}

impl<D: Dataset> Sharded<D> {
    /// Streams `dataset` in index order, split between workers.
    pub fn new(dataset: D) -> Sharded<D> {
        Sharded { dataset }
    }
}

impl<D: Dataset> IterableDataset for Sharded<D> {
    type Item = D::Item;
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, D::Item> {
        Box::new(
            worker
                .shard(self.dataset.len())
                .map(move |i| self.dataset.get(i)),
        )
    }
    /// The batches of the round-robin split: each worker's share batched on its own. No
    /// position: the streams depend on the layout alone, so the loader's replay is exact.
    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        no_position(resume, "a sharded map-style dataset")?;
        let (len, n) = (self.dataset.len(), layout.num_workers.max(1));
        let batch = layout.batch_size.max(1);
        let batches = (0..n.min(len))
            .map(|w| {
                let items = (len - w).div_ceil(n);
                if layout.drop_last {
                    items / batch
                } else {
                    items.div_ceil(batch)
                }
            })
            .sum::<usize>();
        Ok(Some(batches as u64))
    }
}

/// An iterable dataset from a function that builds each worker's iterator.
pub struct FromFn<F> {
    f: F,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

impl<F> FromFn<F> {
    /// Wraps `f`, called once per worker with its [`WorkerInfo`].
    pub fn new<I, T>(f: F) -> FromFn<F>
    where
        F: Fn(WorkerInfo) -> I + Send + Sync,
        I: Iterator<Item = Result<T, DataError>> + Send,
        T: Send,
    {
        FromFn { f }
    }
}

impl<F, I, T> IterableDataset for FromFn<F>
where
    F: Fn(WorkerInfo) -> I + Send + Sync,
    I: Iterator<Item = Result<T, DataError>> + Send + 'static,
    T: Send,
{
    type Item = T;
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, T> {
        Box::new((self.f)(worker))
    }
}
