//! Collation: turning samples into one [`Batch`] written straight into a caller's
//! buffer (in the loader, a page-locked pool buffer), with no second copy.
//!
//! A batch ([`Batch`], in [`crate::batch`]) is a list of typed tensors living in one
//! contiguous storage, each at an offset aligned to [`TENSOR_ALIGN`](crate::TENSOR_ALIGN) bytes, so the
//! transfer layer can move the whole batch with one copy and hand out typed device
//! views at the same offsets.
//!
//! The loader's calls, for items it has already fetched:
//!
//! ```text
//! let layout = collate.layout(&samples)?;           // how many bytes?
//! let buf = pool.lease(layout.total_bytes())?;      // S: DerefMut<Target = [u8]>
//! let batch: Batch<S> = collate.collate_into(&samples, layout, buf)?;
//! ```
//!
//! and for a map-style dataset, through [`DatasetCollate`], which may skip the
//! intermediate items altogether ([`DirectCollate`]):
//!
//! ```text
//! let staged = collate.stage(&dataset, &indices)?;
//! let buf = pool.lease(staged.layout().total_bytes())?;
//! let batch = collate.write(&dataset, staged, buf)?;
//! ```
//!
//! The collations, one per file: [`StackCollate`] (`stack`), [`PadCollate`] (`pad`) and
//! [`DirectCollate`] with its per-field [`FieldTransform`](crate::FieldTransform) hook
//! (`direct`).
//!
//! The default collation of the loader, [`FetchCollate`] of a [`StackCollate`], writes a
//! batch the direct way whenever the dataset has a [`DirectPlan`]
//! ([`Dataset::direct_plan`]): `NpyDataset::open(..)?.transform(Normalize::imagenet(..))`
//! then collates exactly as `DirectCollate::new().with_transform(0, Normalize::imagenet(..))`
//! does, with the same bytes and without a tensor per sample.

use std::sync::Arc;

use crate::DataError;
use crate::batch::{AlignedBuf, Batch, BatchLayout, Storage};
use crate::dataset::Dataset;
use crate::field::DirectPlan;
use crate::tensor::{Sample, TensorRef};

mod direct;
mod pad;
mod stack;

pub use direct::{DirectCollate, StagedIndices};
pub use pad::PadCollate;
pub use stack::StackCollate;

/// Turns a list of samples into a [`Batch`] written into caller-provided storage.
pub trait Collate<T>: Send + Sync {
    /// The layout of the batch of `samples`: tensors, offsets and total bytes.
    ///
    /// # Errors
    /// When the samples cannot be collated together (empty list, shape or dtype
    /// mismatch), naming the sample and field.
    fn layout(&self, samples: &[T]) -> Result<BatchLayout, DataError>;

    /// Writes `samples` into `storage` at `layout` (from [`Collate::layout`] on the
    /// same samples) and returns the batch, which owns `storage`.
    ///
    /// # Errors
    /// [`DataError::BufferTooSmall`] when `storage` is shorter than the layout, or
    /// the samples do not match the layout.
    fn collate_into<S: Storage>(
        &self,
        samples: &[T],
        layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError>;

    /// [`Collate::layout`] then [`Collate::collate_into`] a fresh [`AlignedBuf`].
    ///
    /// # Errors
    /// As the two steps.
    fn collate(&self, samples: &[T]) -> Result<Batch<AlignedBuf>, DataError> {
        let layout = self.layout(samples)?;
        let buf = AlignedBuf::zeroed(layout.total_bytes());
        self.collate_into(samples, layout, buf)
    }

    /// Checks one item on its own, for a collation that defers per-item work to
    /// [`Collate::collate_into`] (decoding an image into its slot of the batch): the error
    /// that item alone gives, if any. When `collate_into` fails, the loader calls this on each
    /// item of the batch to name the sample at fault, or to skip it under `on_sample_error`
    /// and collate the rest; `Ok` (the default, for collations whose items are complete)
    /// leaves the failure to the batch.
    ///
    /// # Errors
    /// What collating `item` fails with.
    fn check_item(&self, item: &T) -> Result<(), DataError> {
        let _ = item;
        Ok(())
    }

    /// The [`DirectCollate`] that writes, from a dataset's [`DirectPlan`], the batch this
    /// collation makes of that dataset's items, when there is one: [`StackCollate`]'s is a
    /// `DirectCollate` with its names. [`FetchCollate`] then skips the items. `None` (the
    /// default) keeps the items.
    fn as_direct(&self) -> Option<DirectCollate> {
        None
    }
}

/// Optional tensor names in field order: what every collation's `with_names` sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TensorNames(Vec<Arc<str>>);

impl TensorNames {
    /// Names from any list of strings (`["image", "label"]`).
    pub(crate) fn new<I: IntoIterator<Item = N>, N: AsRef<str>>(names: I) -> TensorNames {
        TensorNames(names.into_iter().map(|n| Arc::from(n.as_ref())).collect())
    }

    /// The name of field `i`, if one was given.
    pub(crate) fn get(&self, i: usize) -> Option<Arc<str>> {
        self.0.get(i).cloned()
    }
}

/// Field `f` of sample `b`, or an error naming both when the sample has too few fields.
pub(crate) fn field_of<T: Sample>(
    sample: &T,
    b: usize,
    f: usize,
) -> Result<TensorRef<'_>, DataError> {
    sample.field(f).ok_or_else(|| {
        DataError::ShapeMismatch(format!(
            "sample {b} of the batch has {} fields, expected at least {}",
            sample.num_fields(),
            f + 1
        ))
    })
}

/// Collation driven by a map-style dataset and a list of indices: the form the
/// loader uses for map-style datasets. Two phases, so the loader can lease a buffer
/// of the right size in between.
pub trait DatasetCollate<D: Dataset + ?Sized>: Send + Sync {
    /// What [`DatasetCollate::stage`] gathers (fetched items, or only indices).
    type Staged: Send;

    /// Gathers what the batch of `indices` needs and computes its layout.
    ///
    /// # Errors
    /// Errors from the dataset (naming the index) or from the layout.
    fn stage(&self, dataset: &D, indices: &[usize]) -> Result<Self::Staged, DataError>;

    /// The layout of a staged batch: lease [`BatchLayout::total_bytes`] bytes.
    fn staged_layout<'a>(&self, staged: &'a Self::Staged) -> &'a BatchLayout;

    /// Writes the staged batch into `storage`.
    ///
    /// # Errors
    /// [`DataError::BufferTooSmall`], or errors reading the dataset.
    fn write<S: Storage>(
        &self,
        dataset: &D,
        staged: Self::Staged,
        storage: S,
    ) -> Result<Batch<S>, DataError>;
}

/// What [`FetchCollate`] gathered for a batch, with its layout: the fetched items, or only
/// the indices when the dataset's [`DirectPlan`] writes the batch.
#[derive(Debug)]
pub struct StagedItems<T> {
    items: Staged<T>,
    layout: BatchLayout,
}

#[derive(Debug)]
enum Staged<T> {
    Items(Vec<T>),
    Direct(DirectCollate, Vec<usize>),
}

impl<T> StagedItems<T> {
    /// The batch's layout.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Whether the batch is written from the dataset's [`DirectPlan`] (no items fetched).
    pub fn is_direct(&self) -> bool {
        matches!(self.items, Staged::Direct(..))
    }
}

/// Fetches each index with [`Dataset::get`], then collates the items with `C`; or, when
/// the dataset has a [`DirectPlan`] and `C` has a direct form ([`Collate::as_direct`]:
/// [`StackCollate`]), writes the same batch straight from the dataset's fields.
#[derive(Debug, Clone, Default)]
pub struct FetchCollate<C>(pub C);

impl<C> FetchCollate<C> {
    /// The direct route for `dataset`, when it has one.
    fn direct<'d, D: Dataset + ?Sized, T>(
        &self,
        dataset: &'d D,
    ) -> Option<(DirectCollate, DirectPlan<'d>)>
    where
        C: Collate<T>,
    {
        let plan = dataset.direct_plan()?;
        let direct = self.0.as_direct()?;
        direct.accepts(&plan).then_some((direct, plan))
    }
}

impl<D, C> DatasetCollate<D> for FetchCollate<C>
where
    D: Dataset + ?Sized,
    C: Collate<D::Item>,
{
    type Staged = StagedItems<D::Item>;

    fn stage(&self, dataset: &D, indices: &[usize]) -> Result<Self::Staged, DataError> {
        if let Some((direct, plan)) = self.direct(dataset) {
            let len = dataset.len();
            if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
                return Err(DataError::oob(bad, len, "dataset"));
            }
            let layout = direct.plan_layout(&plan, indices.len())?;
            return Ok(StagedItems {
                items: Staged::Direct(direct, indices.to_vec()),
                layout,
            });
        }
        let items = indices
            .iter()
            .map(|&i| dataset.get(i))
            .collect::<Result<Vec<_>, _>>()?;
        let layout = self.0.layout(&items)?;
        Ok(StagedItems {
            items: Staged::Items(items),
            layout,
        })
    }

    fn staged_layout<'a>(&self, staged: &'a Self::Staged) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        dataset: &D,
        staged: Self::Staged,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        match staged.items {
            Staged::Items(items) => self.0.collate_into(&items, staged.layout, storage),
            Staged::Direct(direct, indices) => {
                let plan = dataset.direct_plan().ok_or_else(|| {
                    DataError::arg(
                        "dataset",
                        "the dataset had a direct plan when the batch was staged, none now",
                    )
                })?;
                direct.write_plan(&plan, &indices, staged.layout, storage)
            }
        }
    }
}
