//! Collation: turning samples into one [`Batch`] written straight into a caller's
//! buffer (in the loader, a page-locked pool buffer), with no second copy.
//!
//! A batch ([`Batch`], in [`crate::batch`]) is a list of typed tensors living in one
//! contiguous storage, each at an offset aligned to [`TENSOR_ALIGN`] bytes, so the
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
//! [`DirectCollate`] with its per-field [`FieldTransform`] hook (`direct`).

use std::sync::Arc;

use crate::DataError;
use crate::dataset::Dataset;
use crate::tensor::{Sample, TensorRef};

mod direct;
mod pad;
mod stack;

// The batch type lived here before it got its own module; these paths keep working.
pub use crate::batch::{AlignedBuf, Batch, BatchLayout, Storage, TENSOR_ALIGN, TensorSpec};
pub use direct::{DirectCollate, FieldTransform, StagedIndices};
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

/// Items fetched for a batch, with their layout; see [`FetchCollate`].
#[derive(Debug)]
pub struct StagedItems<T> {
    items: Vec<T>,
    layout: BatchLayout,
}

impl<T> StagedItems<T> {
    /// The batch's layout.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }
}

/// Fetches each index with [`Dataset::get`], then collates the items with `C`.
#[derive(Debug, Clone, Default)]
pub struct FetchCollate<C>(pub C);

impl<D, C> DatasetCollate<D> for FetchCollate<C>
where
    D: Dataset + ?Sized,
    C: Collate<D::Item>,
{
    type Staged = StagedItems<D::Item>;

    fn stage(&self, dataset: &D, indices: &[usize]) -> Result<Self::Staged, DataError> {
        let items = indices
            .iter()
            .map(|&i| dataset.get(i))
            .collect::<Result<Vec<_>, _>>()?;
        let layout = self.0.layout(&items)?;
        Ok(StagedItems { items, layout })
    }

    fn staged_layout<'a>(&self, staged: &'a Self::Staged) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        _: &D,
        staged: Self::Staged,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        self.0.collate_into(&staged.items, staged.layout, storage)
    }
}
