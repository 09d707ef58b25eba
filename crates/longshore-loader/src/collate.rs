//! [`IntoCollate`]: what [`DataLoaderBuilder::collate`](crate::DataLoaderBuilder::collate)
//! accepts, so `.collate(PadCollate::new(0.0))` works on a map-style dataset as it does in
//! PyTorch's `collate_fn`.

use longshore_data::{Collate, Dataset, DatasetCollate, FetchCollate, IterableDataset};

/// Marks a builder's dataset as iterable (what `DataLoader::iterable` gives the builder).
#[derive(Debug)]
pub struct IterableSource<D>(pub(crate) D);

/// A collate function for the dataset of a builder, `S` (the dataset for a map-style
/// builder, [`IterableSource`] for an iterable one).
///
/// Implemented for:
/// * any [`Collate`] of a map-style dataset's items ([`StackCollate`], [`PadCollate`], your
///   own): the loader fetches the items and collates them (it wraps the collate in
///   [`FetchCollate`]);
/// * any [`DatasetCollate`] of a map-style dataset ([`DirectCollate`], [`FetchCollate`]):
///   used as is;
/// * any [`Collate`] of an iterable dataset's items.
///
/// `M` is one of the marker types [`ByItems`], [`ByDataset`], [`ByStream`]: the compiler
/// infers it, so a call site never names it. A type that is both a `Collate` of the items and
/// a `DatasetCollate` of the dataset is ambiguous here: pass it to
/// [`dataset_collate`](crate::DataLoaderBuilder::dataset_collate) or wrap it in
/// [`FetchCollate`].
///
/// [`StackCollate`]: longshore_data::StackCollate
/// [`PadCollate`]: longshore_data::PadCollate
/// [`DirectCollate`]: longshore_data::DirectCollate
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot collate batches of `{S}`",
    label = "not a collate function for this dataset",
    note = "a map-style dataset takes a `Collate<Item>` (StackCollate, PadCollate, ...) or a `DatasetCollate<Dataset>` (DirectCollate, FetchCollate); an iterable dataset takes a `Collate<Item>`"
)]
pub trait IntoCollate<S, M> {
    /// The collate function the builder stores.
    type Collate;
    /// Converts.
    fn into_collate(self) -> Self::Collate;
}

/// Marks [`IntoCollate`] for a [`Collate`] of a map-style dataset's items.
#[derive(Debug)]
pub enum ByItems {}

/// Marks [`IntoCollate`] for a [`DatasetCollate`] of a map-style dataset.
#[derive(Debug)]
pub enum ByDataset {}

/// Marks [`IntoCollate`] for a [`Collate`] of an iterable dataset's items.
#[derive(Debug)]
pub enum ByStream {}

impl<D, C> IntoCollate<D, ByItems> for C
where
    D: Dataset,
    C: Collate<D::Item>,
{
    type Collate = FetchCollate<C>;
    fn into_collate(self) -> FetchCollate<C> {
        FetchCollate(self)
    }
}

impl<D, C> IntoCollate<D, ByDataset> for C
where
    D: Dataset,
    C: DatasetCollate<D>,
{
    type Collate = C;
    fn into_collate(self) -> C {
        self
    }
}

impl<D, C> IntoCollate<IterableSource<D>, ByStream> for C
where
    D: IterableDataset,
    C: Collate<D::Item>,
{
    type Collate = C;
    fn into_collate(self) -> C {
        self
    }
}
