//! How a worker turns a task into a batch: [`Fetch`] and its implementations for map-style
//! datasets (collated into pooled, optionally page-locked memory), unbatched map-style
//! datasets, and iterable datasets.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use longshore_data::{
    Batch, BatchLayout, DataError, Dataset, DatasetCollate, EpochLayout, ItemIter, IterableDataset,
    StreamPosition, WorkerInfo,
};
use longshore_host::{PinnedPool, PoolBuffer};

use crate::engine::{Outcome, Task};
use crate::error::LoaderError;
use crate::options::SampleErrorPolicy;

pub(crate) mod sealed {
    use super::*;

    /// An iterable dataset's epoch seam with its item type erased (what the loader keeps
    /// of the dataset to begin its epochs and take its positions).
    pub trait EpochSeam: Send + Sync {
        /// `IterableDataset::begin_epoch`.
        fn begin(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
        ) -> Result<Option<u64>, DataError>;
        /// `IterableDataset::position`.
        fn position_after(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
            batches: u64,
        ) -> Result<Option<StreamPosition>, DataError>;
    }

    impl<D: IterableDataset> EpochSeam for D {
        fn begin(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
        ) -> Result<Option<u64>, DataError> {
            IterableDataset::begin_epoch(self, layout, resume)
        }
        fn position_after(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
            batches: u64,
        ) -> Result<Option<StreamPosition>, DataError> {
            IterableDataset::position(self, layout, resume, batches)
        }
    }

    /// The worker-side interface of [`Fetch`](super::Fetch), private to this crate.
    pub trait Sealed: Send + Sync + 'static {
        /// What the loader yields.
        type Out: Send + 'static;
        /// Per-worker state for one epoch (the stream of an iterable dataset).
        type Worker<'a>
        where
            Self: 'a;
        /// Whether work is dealt as index batches (`true`) or pulled from per-worker streams.
        fn indexed(&self) -> bool;
        /// Number of samples in the dataset (0 for iterable datasets).
        fn dataset_len(&self) -> usize;
        /// Samples in one output, for statistics.
        fn output_samples(&self, out: &Self::Out) -> usize;
        /// Pool bytes one output holds (0 when it holds none).
        fn output_bytes(&self, out: &Self::Out) -> usize;
        /// How long the request for the output's pool memory waited for the budget.
        fn output_pinned_wait(&self, _out: &Self::Out) -> Duration {
            Duration::ZERO
        }
        /// Iterable datasets: the batch size and `drop_last` each worker batches its stream
        /// with (`None` for indexed datasets).
        fn stream_batching(&self) -> Option<(usize, bool)> {
            None
        }
        /// Iterable datasets: the dataset's epoch seam (`None` for indexed datasets).
        fn seam(&self) -> Option<&dyn EpochSeam> {
            None
        }
        /// Iterable datasets: prepares an epoch (see `IterableDataset::begin_epoch`).
        fn begin_epoch(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
        ) -> Result<Option<u64>, DataError> {
            self.seam().map_or(Ok(None), |s| s.begin(layout, resume))
        }
        /// Iterable datasets: the dataset's position (see `IterableDataset::position`).
        fn position(
            &self,
            layout: &EpochLayout,
            resume: Option<&StreamPosition>,
            batches: u64,
        ) -> Result<Option<StreamPosition>, DataError> {
            self.seam()
                .map_or(Ok(None), |s| s.position_after(layout, resume, batches))
        }
        /// The state of worker `info` for a new epoch.
        fn worker<'a>(&'a self, info: WorkerInfo) -> Self::Worker<'a>;
        /// Loads one task; returns the outcome and how many samples were skipped.
        fn fetch(
            &self,
            worker: &mut Self::Worker<'_>,
            task: &Task,
            cancelled: &dyn Fn() -> bool,
        ) -> (Outcome<Self::Out>, u64);
    }
}

/// What a loader's workers do with a task. Implemented by this crate for each dataset
/// kind ([`MapFetch`], [`ItemFetch`], [`IterableFetch`]); it appears in
/// [`DataLoader`](crate::DataLoader)'s type and cannot be implemented outside this crate.
pub trait Fetch: sealed::Sealed<Out = Self::Output> {
    /// What the loader yields.
    type Output: Send + 'static;
}

impl<T: sealed::Sealed> Fetch for T {
    type Output = T::Out;
}

/// Map-style dataset with automatic batching: the indices of each batch collated by a
/// [`DatasetCollate`] into a [`Batch`] whose storage is leased from a [`PinnedPool`]
/// (page-locked with `pin_memory`). Named through the aliases
/// [`MapLoader`](crate::MapLoader), [`StackLoader`](crate::StackLoader) and
/// [`DirectLoader`](crate::DirectLoader).
#[derive(Debug)]
pub struct MapFetch<D, C> {
    pub(crate) dataset: Arc<D>,
    pub(crate) collate: C,
    pub(crate) pool: PinnedPool,
    pub(crate) on_error: SampleErrorPolicy,
}

/// What `policy` makes of sample `index`'s failure in batch `seq`: the batch's error
/// (`FailBatch`, or any policy for an [unskippable](longshore_data::DataError::is_unskippable)
/// failure), or `None` once it is logged as skipped (`Skip`; `stage` says where it failed:
/// "load" or "collate").
fn sample_failed(
    policy: SampleErrorPolicy,
    index: usize,
    seq: u64,
    source: longshore_data::DataError,
    stage: &str,
) -> Option<LoaderError> {
    if matches!(policy, SampleErrorPolicy::Skip) && !source.is_unskippable() {
        tracing::warn!(target: "longshore::loader", error = %crate::error::chain(&source), sample.index = index, batch.seq = seq, "skipping a sample that failed to {stage}");
        return None;
    }
    Some(LoaderError::Sample {
        index,
        batch: seq,
        source,
    })
}

/// Finds which of `indices` fails to load (the dataset's own error), for error messages and
/// for skipping; `None` if every sample loads on its own.
fn find_failing<D: Dataset + ?Sized>(
    dataset: &D,
    indices: &[usize],
) -> Option<(usize, longshore_data::DataError)> {
    indices
        .iter()
        .find_map(|&i| dataset.get(i).err().map(|e| (i, e)))
}

/// A batch collated into pool memory: what [`MapFetch`] and [`IterableFetch`] yield.
type PooledBatch = Batch<PoolBuffer>;

/// Pool bytes a pooled batch holds: 0 for a batch in fallback (non-pool) memory.
fn pooled_bytes(out: &PooledBatch) -> usize {
    if out.storage().is_fallback() {
        0
    } else {
        out.storage().capacity()
    }
}

/// Leases `bytes` (at least 1) of `pool` for `task`'s batch, ranked by its delivery order.
fn lease(pool: &PinnedPool, bytes: usize, task: &Task) -> Result<PoolBuffer, LoadErr> {
    pool.alloc_ranked(bytes.max(1), task.rank)
        .map_err(|source| {
            LoadErr::Memory(LoaderError::Memory {
                batch: task.seq,
                source,
            })
        })
}

/// Why a pooled batch could not be made: its data (a sample's or the collation's, which the
/// caller looks into) or its memory (which fails the batch).
enum LoadErr {
    Data(longshore_data::DataError),
    Memory(LoaderError),
}

impl LoadErr {
    /// An attempt's outcome: `Ok` with the outcome to return (the batch, or the failure of
    /// its memory), or `Err` with a data error for the caller to look into.
    fn settle(attempt: Result<PooledBatch, LoadErr>) -> Result<Outcome<PooledBatch>, DataError> {
        match attempt {
            Ok(batch) => Ok(Outcome::Batch(batch)),
            Err(LoadErr::Memory(e)) => Ok(Outcome::Failed(e)),
            Err(LoadErr::Data(e)) => Err(e),
        }
    }
}

/// The failure of batch `task` whose collation failed with no sample at fault.
fn collate_failed(task: &Task, source: DataError) -> Outcome<PooledBatch> {
    Outcome::Failed(LoaderError::Collate {
        batch: task.seq,
        source,
    })
}

impl<D, C> MapFetch<D, C>
where
    D: Dataset + 'static,
    C: DatasetCollate<D> + 'static,
{
    fn load(&self, task: &Task, cancelled: &dyn Fn() -> bool) -> (Outcome<PooledBatch>, u64) {
        // Copied only when a sample is skipped.
        let mut indices = Cow::Borrowed(task.indices.as_slice());
        let mut skipped = 0u64;
        loop {
            if cancelled() || indices.is_empty() {
                return (Outcome::Empty, skipped);
            }
            let err = match LoadErr::settle(self.try_load(task, &indices)) {
                Ok(outcome) => return (outcome, skipped),
                Err(e) => e,
            };
            // Find the sample at fault: name it, or skip it and try again.
            match find_failing(&*self.dataset, &indices) {
                Some((index, source)) => {
                    if let Some(e) = sample_failed(self.on_error, index, task.seq, source, "load") {
                        return (Outcome::Failed(e), skipped);
                    }
                    indices.to_mut().retain(|&i| i != index);
                    skipped += 1;
                }
                None => return (collate_failed(task, err), skipped),
            }
        }
    }

    fn try_load(&self, task: &Task, indices: &[usize]) -> Result<PooledBatch, LoadErr> {
        let staged = self
            .collate
            .stage(&*self.dataset, indices)
            .map_err(LoadErr::Data)?;
        let layout: &BatchLayout = self.collate.staged_layout(&staged);
        // One lease per batch, taken once the samples are staged: a worker never holds a
        // block while it waits for another, and its request ranks by delivery order.
        let mut lease = lease(&self.pool, layout.total_bytes(), task)?;
        let _ = lease.set_len(layout.total_bytes().max(1));
        self.collate
            .write(&*self.dataset, staged, lease)
            .map_err(LoadErr::Data)
    }
}

impl<D, C> sealed::Sealed for MapFetch<D, C>
where
    D: Dataset + 'static,
    C: DatasetCollate<D> + 'static,
{
    type Out = PooledBatch;
    type Worker<'a> = ();

    fn indexed(&self) -> bool {
        true
    }
    fn dataset_len(&self) -> usize {
        self.dataset.len()
    }
    fn output_samples(&self, out: &Self::Out) -> usize {
        out.batch_size()
    }
    fn output_bytes(&self, out: &Self::Out) -> usize {
        pooled_bytes(out)
    }
    fn output_pinned_wait(&self, out: &Self::Out) -> Duration {
        out.storage().waited()
    }
    fn worker(&self, _: WorkerInfo) {}
    fn fetch(
        &self,
        _: &mut (),
        task: &Task,
        cancelled: &dyn Fn() -> bool,
    ) -> (Outcome<Self::Out>, u64) {
        self.load(task, cancelled)
    }
}

/// Map-style dataset without automatic batching (PyTorch's `batch_size=None`): each task is
/// one index and the loader yields the dataset's items as they are.
#[derive(Debug)]
pub struct ItemFetch<D> {
    pub(crate) dataset: Arc<D>,
}

impl<D> sealed::Sealed for ItemFetch<D>
where
    D: Dataset + 'static,
    D::Item: 'static,
{
    type Out = D::Item;
    type Worker<'a> = ();

    fn indexed(&self) -> bool {
        true
    }
    fn dataset_len(&self) -> usize {
        self.dataset.len()
    }
    fn output_samples(&self, _: &D::Item) -> usize {
        1
    }
    fn output_bytes(&self, _: &D::Item) -> usize {
        0
    }
    fn worker(&self, _: WorkerInfo) {}
    fn fetch(&self, _: &mut (), task: &Task, _: &dyn Fn() -> bool) -> (Outcome<D::Item>, u64) {
        let index = task.indices[0];
        match self.dataset.get(index) {
            Ok(item) => (Outcome::Batch(item), 0),
            Err(source) => (
                Outcome::Failed(LoaderError::Sample {
                    index,
                    batch: task.seq,
                    source,
                }),
                0,
            ),
        }
    }
}

/// Iterable dataset: each worker pulls `batch_size` items from its own stream and collates
/// them; the loader takes batches from the workers in turn, like PyTorch.
#[derive(Debug)]
pub struct IterableFetch<D, C> {
    pub(crate) dataset: Arc<D>,
    pub(crate) collate: C,
    pub(crate) pool: PinnedPool,
    pub(crate) batch_size: usize,
    pub(crate) drop_last: bool,
    pub(crate) on_error: SampleErrorPolicy,
}

/// One worker's stream for an epoch.
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub struct StreamState<'a, T> {
    iter: ItemIter<'a, T>,
    done: bool,
    position: usize,
}

impl<D, C> sealed::Sealed for IterableFetch<D, C>
where
    D: IterableDataset + 'static,
    D::Item: 'static,
    C: longshore_data::Collate<D::Item> + 'static,
{
    type Out = PooledBatch;
    type Worker<'a> = StreamState<'a, D::Item>;

    fn indexed(&self) -> bool {
        false
    }
    fn dataset_len(&self) -> usize {
        0
    }
    fn output_samples(&self, out: &Self::Out) -> usize {
        out.batch_size()
    }
    fn output_bytes(&self, out: &Self::Out) -> usize {
        pooled_bytes(out)
    }
    fn output_pinned_wait(&self, out: &Self::Out) -> Duration {
        out.storage().waited()
    }
    fn stream_batching(&self) -> Option<(usize, bool)> {
        Some((self.batch_size, self.drop_last))
    }
    fn seam(&self) -> Option<&dyn sealed::EpochSeam> {
        Some(&self.dataset)
    }
    fn worker<'a>(&'a self, info: WorkerInfo) -> StreamState<'a, D::Item> {
        StreamState {
            iter: self.dataset.iter(info),
            done: false,
            position: 0,
        }
    }
    fn fetch(
        &self,
        w: &mut StreamState<'_, D::Item>,
        task: &Task,
        cancelled: &dyn Fn() -> bool,
    ) -> (Outcome<Self::Out>, u64) {
        let mut items = Vec::with_capacity(self.batch_size);
        // Each item's place in this worker's stream, to name it in errors.
        let mut positions = Vec::with_capacity(self.batch_size);
        let mut skipped = 0;
        loop {
            while items.len() < self.batch_size && !w.done {
                if cancelled() {
                    return (Outcome::Empty, skipped);
                }
                let index = w.position;
                match w.iter.next() {
                    None => {
                        w.done = true;
                        break;
                    }
                    Some(Ok(item)) => {
                        items.push(item);
                        positions.push(index);
                    }
                    Some(Err(source)) => {
                        if let Some(e) =
                            sample_failed(self.on_error, index, task.seq, source, "load")
                        {
                            w.position += 1;
                            return (Outcome::Failed(e), skipped);
                        }
                        skipped += 1;
                    }
                }
                w.position += 1;
            }
            if items.is_empty() || (self.drop_last && items.len() < self.batch_size) {
                return (
                    if w.done {
                        Outcome::Exhausted
                    } else {
                        Outcome::Empty
                    },
                    skipped,
                );
            }
            let err = match LoadErr::settle(self.collate_batch(&items, task)) {
                Ok(outcome) => return (outcome, skipped),
                Err(e) => e,
            };
            // A collation that does per-item work while it writes the batch (decoding into
            // it) fails for the whole batch: find the item at fault, then name it, or skip it
            // and fill its place from the stream.
            let failing = items
                .iter()
                .enumerate()
                .find_map(|(i, item)| self.collate.check_item(item).err().map(|e| (i, e)));
            let Some((i, source)) = failing else {
                return (collate_failed(task, err), skipped);
            };
            if let Some(e) = sample_failed(self.on_error, positions[i], task.seq, source, "collate")
            {
                return (Outcome::Failed(e), skipped);
            }
            items.remove(i);
            positions.remove(i);
            skipped += 1;
        }
    }
}

impl<D, C> IterableFetch<D, C>
where
    D: IterableDataset + 'static,
    D::Item: 'static,
    C: longshore_data::Collate<D::Item> + 'static,
{
    /// Lays out, leases and writes one batch of `items`.
    fn collate_batch(&self, items: &[D::Item], task: &Task) -> Result<PooledBatch, LoadErr> {
        let layout = self.collate.layout(items).map_err(LoadErr::Data)?;
        let lease = lease(&self.pool, layout.total_bytes(), task)?;
        self.collate
            .collate_into(items, layout, lease)
            .map_err(LoadErr::Data)
    }
}
