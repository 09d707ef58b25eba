//! Map-style and iterable datasets, and the combinators that build new datasets
//! from old ones.

use std::fmt;
use std::sync::Arc;

use crate::DataError;
use crate::field::{DirectPlan, DirectSource, FieldSpec};
use crate::rng::{epoch_rng, permutation};
use crate::transform::Transform;
use crate::worker;

mod iterable;
pub mod mixture;

pub use iterable::{
    Chain, EpochLayout, FromFn, ItemIter, IterMap, IterableDataset, IterableExt, Sharded,
    StreamPosition,
};
pub use mixture::{Mixture, Stop};

/// A map-style dataset: `len` items addressed by index, like PyTorch's `Dataset`.
///
/// The loader shares one dataset between worker threads through an `Arc`, hence
/// `Send + Sync`. The trait is object safe: `Box<dyn Dataset<Item = T>>` works.
pub trait Dataset: Send + Sync {
    /// What one index yields.
    type Item: Send;

    /// Number of items.
    fn len(&self) -> usize;

    /// Whether the dataset holds no items.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The item at `index`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when `index >= len()`, or any error reading it.
    fn get(&self, index: usize) -> Result<Self::Item, DataError>;

    /// How this dataset's items can be written straight into a batch, field by field, when
    /// they can: a [`DirectPlan`] whose fields stack to exactly the items of
    /// [`get`](Dataset::get). The loader's default collation then skips the items (no
    /// per-sample tensor, no second copy) and gives the same bytes. `None` (the default)
    /// when the items must be built: the loader then fetches and stacks them.
    ///
    /// Implemented by the memory-mapped datasets, forwarded by [`Subset`] and the pointer
    /// types, and kept by [`Transformed`] when its transform fuses ([`Transform::fuse`]).
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        None
    }
}

/// A dataset of fixed-shape samples that can write a sample's fields straight into
/// a caller's buffer, skipping the intermediate item: a memory-mapped row goes into
/// a (page-locked) batch buffer with one copy. Used by [`crate::DirectCollate`].
pub trait DirectDataset: Dataset {
    /// The fields every sample has, in order.
    fn fields(&self) -> &[FieldSpec];

    /// Writes field `field` of sample `index` into `out`, in native byte order.
    /// `out.len()` is exactly `fields()[field].nbytes()`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] for a bad `index` or `field`,
    /// [`DataError::BufferTooSmall`] when `out` has the wrong length.
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError>;

    /// Field `field` of sample `index` borrowed as stored, when the dataset holds it
    /// in native byte order and can lend it (a row of a memory-mapped `.npy` file), or
    /// `None` when it can only write it out with [`DirectDataset::get_field_into`] (the
    /// default). A [`crate::FieldTransform`] reads a borrowed field in place instead of
    /// from a copy.
    ///
    /// # Errors
    /// As [`DirectDataset::get_field_into`].
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let _ = (index, field);
        Ok(None)
    }
}

macro_rules! forward_dataset {
    ($($ptr:ty),*) => {$(
        impl<D: Dataset + ?Sized> Dataset for $ptr {
            type Item = D::Item;
            fn len(&self) -> usize {
                (**self).len()
            }
            fn get(&self, index: usize) -> Result<D::Item, DataError> {
                (**self).get(index)
            }
            fn direct_plan(&self) -> Option<DirectPlan<'_>> {
                (**self).direct_plan()
            }
        }
        impl<D: DirectDataset + ?Sized> DirectDataset for $ptr {
            fn fields(&self) -> &[FieldSpec] {
                (**self).fields()
            }
            fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
                (**self).get_field_into(index, field, out)
            }
            fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
                (**self).field_bytes(index, field)
            }
        }
    )*};
}

forward_dataset!(Arc<D>, Box<D>, &D);

/// Every direct dataset is a [`DirectSource`] (what a [`DirectPlan`] holds).
impl<D: DirectDataset + ?Sized> DirectSource for D {
    fn source_fields(&self) -> &[FieldSpec] {
        self.fields()
    }
    fn write_field(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        self.get_field_into(index, field, out)
    }
    fn lend_field(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        self.field_bytes(index, field)
    }
}

/// Combinators for every [`Dataset`].
pub trait DatasetExt: Dataset + Sized {
    /// Applies `f` to every item.
    fn map<U, F>(self, f: F) -> Map<Self, F>
    where
        F: Fn(Self::Item) -> U + Send + Sync,
        U: Send,
    {
        Map { dataset: self, f }
    }

    /// Applies a fallible `f` to every item; its error is returned by `get`.
    fn try_map<U, F>(self, f: F) -> TryMap<Self, F>
    where
        F: Fn(Self::Item) -> Result<U, DataError> + Send + Sync,
        U: Send,
    {
        TryMap { dataset: self, f }
    }

    /// Applies a (possibly random) [`Transform`], drawing from the current worker's
    /// generator ([`worker::with_rng`]).
    fn transform<T: Transform<Self::Item>>(self, transform: T) -> Transformed<Self, T> {
        Transformed {
            dataset: self,
            transform,
        }
    }

    /// Pairs this dataset with another of the same length: item `i` is `(a[i], b[i])`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the lengths differ.
    fn zip<B: Dataset>(self, other: B) -> Result<Zip<Self, B>, DataError> {
        Zip::new(self, other)
    }
}

impl<D: Dataset> DatasetExt for D {}

/// A dataset whose items are `f(item)`; see [`DatasetExt::map`].
#[derive(Clone)]
pub struct Map<D, F> {
    dataset: D,
    f: F,
}

impl<D: fmt::Debug, F> fmt::Debug for Map<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

impl<D, F, U> Dataset for Map<D, F>
where
    D: Dataset,
    F: Fn(D::Item) -> U + Send + Sync,
    U: Send,
{
    type Item = U;
    fn len(&self) -> usize {
        self.dataset.len()
    }
    fn get(&self, index: usize) -> Result<U, DataError> {
        self.dataset.get(index).map(&self.f)
    }
}

/// A dataset whose items are `f(item)?`; see [`DatasetExt::try_map`].
#[derive(Clone)]
pub struct TryMap<D, F> {
    dataset: D,
    f: F,
}

impl<D: fmt::Debug, F> fmt::Debug for TryMap<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TryMap")
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

impl<D, F, U> Dataset for TryMap<D, F>
where
    D: Dataset,
    F: Fn(D::Item) -> Result<U, DataError> + Send + Sync,
    U: Send,
{
    type Item = U;
    fn len(&self) -> usize {
        self.dataset.len()
    }
    fn get(&self, index: usize) -> Result<U, DataError> {
        self.dataset.get(index).and_then(&self.f)
    }
}

/// A dataset with a [`Transform`] applied; see [`DatasetExt::transform`].
#[derive(Debug, Clone)]
pub struct Transformed<D, T> {
    dataset: D,
    transform: T,
}

impl<D, T> Dataset for Transformed<D, T>
where
    D: Dataset,
    T: Transform<D::Item>,
{
    type Item = T::Output;
    fn len(&self) -> usize {
        self.dataset.len()
    }
    fn get(&self, index: usize) -> Result<T::Output, DataError> {
        let item = self.dataset.get(index)?;
        worker::with_rng(|rng| self.transform.apply(item, rng))
    }
    /// The dataset's plan with the transform fused into it, when it fuses
    /// ([`Transform::fuse`]: `Normalize` of a `.npy` image dataset).
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        self.transform.fuse(self.dataset.direct_plan()?)
    }
}

/// Two datasets of equal length side by side; see [`DatasetExt::zip`].
#[derive(Debug, Clone)]
pub struct Zip<A, B> {
    a: A,
    b: B,
    fields: Vec<FieldSpec>,
    a_fields: usize,
}

impl<A: Dataset, B: Dataset> Zip<A, B> {
    /// Pairs `a` and `b`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the lengths differ.
    pub fn new(a: A, b: B) -> Result<Zip<A, B>, DataError> {
        if a.len() != b.len() {
            return Err(DataError::ShapeMismatch(format!(
                "zip of datasets of different lengths {} and {}",
                a.len(),
                b.len()
            )));
        }
        Ok(Zip {
            a,
            b,
            fields: Vec::new(),
            a_fields: 0,
        })
    }
}

impl<A: DirectDataset, B: DirectDataset> Zip<A, B> {
    /// Pairs two direct datasets, keeping the fast path: the fields are those of `a`
    /// followed by those of `b`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the lengths differ.
    pub fn direct(a: A, b: B) -> Result<Zip<A, B>, DataError> {
        let mut z = Zip::new(a, b)?;
        z.fields = z.a.fields().iter().chain(z.b.fields()).copied().collect();
        z.a_fields = z.a.fields().len();
        Ok(z)
    }
}

impl<A: Dataset, B: Dataset> Dataset for Zip<A, B> {
    type Item = (A::Item, B::Item);
    fn len(&self) -> usize {
        self.a.len()
    }
    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        Ok((self.a.get(index)?, self.b.get(index)?))
    }
}

impl<A: DirectDataset, B: DirectDataset> DirectDataset for Zip<A, B> {
    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        if self.fields.is_empty() {
            return Err(DataError::arg(
                "field",
                "zip built with Zip::new has no direct fields; build it with Zip::direct",
            ));
        }
        if field < self.a_fields {
            self.a.get_field_into(index, field, out)
        } else {
            self.b.get_field_into(index, field - self.a_fields, out)
        }
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        if self.fields.is_empty() {
            return Ok(None);
        }
        if field < self.a_fields {
            self.a.field_bytes(index, field)
        } else {
            self.b.field_bytes(index, field - self.a_fields)
        }
    }
}

/// The items of a dataset at chosen indices, like PyTorch's `Subset`.
#[derive(Debug, Clone)]
pub struct Subset<D> {
    dataset: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// The items of `dataset` at `indices`, in that order.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] naming the first index that is not in `dataset`.
    pub fn new(dataset: D, indices: Vec<usize>) -> Result<Subset<D>, DataError> {
        let len = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::oob(bad, len, "subset's dataset"));
        }
        Ok(Subset { dataset, indices })
    }

    /// The indices into the underlying dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item, DataError> {
        let &i =
            self.indices
                .get(index)
                .ok_or(DataError::oob(index, self.indices.len(), "subset"))?;
        self.dataset.get(i)
    }
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(self.dataset.direct_plan()?.remapped(&self.indices))
    }
}

impl<D: DirectDataset> DirectDataset for Subset<D> {
    fn fields(&self) -> &[FieldSpec] {
        self.dataset.fields()
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let &i =
            self.indices
                .get(index)
                .ok_or(DataError::oob(index, self.indices.len(), "subset"))?;
        self.dataset.get_field_into(i, field, out)
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let &i =
            self.indices
                .get(index)
                .ok_or(DataError::oob(index, self.indices.len(), "subset"))?;
        self.dataset.field_bytes(i, field)
    }
}

/// Several datasets one after another, like PyTorch's `ConcatDataset`.
///
/// For datasets of different types use `ConcatDataset<Box<dyn Dataset<Item = T>>>`.
#[derive(Debug, Clone)]
pub struct ConcatDataset<D> {
    datasets: Vec<D>,
    /// `ends[i]` is the total length of datasets `0..=i`.
    ends: Vec<usize>,
}

impl<D: Dataset> ConcatDataset<D> {
    /// Concatenates `datasets`.
    ///
    /// # Errors
    /// [`DataError::Empty`] when `datasets` is empty (as PyTorch refuses it),
    /// [`DataError::Overflow`] when the total length overflows.
    pub fn new(datasets: Vec<D>) -> Result<ConcatDataset<D>, DataError> {
        if datasets.is_empty() {
            return Err(DataError::Empty {
                what: "list of datasets to concatenate",
            });
        }
        let mut ends = Vec::with_capacity(datasets.len());
        let mut total = 0usize;
        for d in &datasets {
            total = total
                .checked_add(d.len())
                .ok_or(DataError::Overflow("concatenated length"))?;
            ends.push(total);
        }
        Ok(ConcatDataset { datasets, ends })
    }

    /// Which dataset holds `index`, and the index within it.
    fn locate(&self, index: usize) -> Result<(usize, usize), DataError> {
        let len = self.ends.last().copied().unwrap_or(0);
        if index >= len {
            return Err(DataError::oob(index, len, "concatenated dataset"));
        }
        let d = self.ends.partition_point(|&end| end <= index);
        let start = if d == 0 { 0 } else { self.ends[d - 1] };
        Ok((d, index - start))
    }

    /// The concatenated datasets.
    pub fn datasets(&self) -> &[D] {
        &self.datasets
    }
}

impl<D: Dataset> Dataset for ConcatDataset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }
    fn get(&self, index: usize) -> Result<D::Item, DataError> {
        let (d, i) = self.locate(index)?;
        self.datasets[d].get(i)
    }
}

impl<D: DirectDataset> DirectDataset for ConcatDataset<D> {
    /// The fields of the first dataset; writing a sample of a dataset whose fields
    /// differ is refused.
    fn fields(&self) -> &[FieldSpec] {
        self.datasets[0].fields()
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let (d, i) = self.locate(index)?;
        if self.datasets[d].fields() != self.fields() {
            return Err(DataError::ShapeMismatch(format!(
                "dataset {d} of the concatenation has fields {:?}, dataset 0 has {:?}",
                self.datasets[d].fields(),
                self.fields()
            )));
        }
        self.datasets[d].get_field_into(i, field, out)
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let (d, i) = self.locate(index)?;
        if self.datasets[d].fields() != self.fields() {
            // get_field_into reports the mismatch.
            return Ok(None);
        }
        self.datasets[d].field_bytes(i, field)
    }
}

/// Splits `dataset` at random into non-overlapping subsets of the given lengths,
/// like `torch.utils.data.random_split`, reproducibly for a given `seed`.
///
/// # Errors
/// [`DataError::InvalidArgument`] when the lengths do not sum to the dataset's length.
pub fn random_split<D: Dataset + ?Sized>(
    dataset: Arc<D>,
    lengths: &[usize],
    seed: u64,
) -> Result<Vec<Subset<Arc<D>>>, DataError> {
    let n = dataset.len();
    let total = lengths
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .ok_or(DataError::Overflow("sum of split lengths"))?;
    if total != n {
        return Err(DataError::arg(
            "lengths",
            format!("sum of lengths {total} does not equal the dataset length {n}"),
        ));
    }
    let perm = permutation(n, &mut epoch_rng(seed, 0));
    let mut out = Vec::with_capacity(lengths.len());
    let mut start = 0;
    for &l in lengths {
        out.push(Subset {
            dataset: Arc::clone(&dataset),
            indices: perm[start..start + l].to_vec(),
        });
        start += l;
    }
    Ok(out)
}

/// Turns fractions of a dataset of `n` items into lengths as PyTorch does: each
/// `floor(n * fraction)`, then the remainder handed out one by one, round-robin from
/// the first split.
///
/// # Errors
/// [`DataError::InvalidArgument`] when a fraction is outside `[0, 1]` or NaN, or the
/// fractions do not sum to 1.
pub fn split_lengths(n: usize, fractions: &[f64]) -> Result<Vec<usize>, DataError> {
    if fractions.is_empty() {
        return Err(DataError::arg("fractions", "no fractions given"));
    }
    if let Some((i, f)) = fractions
        .iter()
        .enumerate()
        .find(|(_, f)| !(0.0..=1.0).contains(*f))
    {
        return Err(DataError::arg(
            "fractions",
            format!("fraction at index {i} is {f}, not within [0, 1]"),
        ));
    }
    let sum: f64 = fractions.iter().sum();
    // math.isclose(sum, 1) with its default rel_tol of 1e-9, and sum <= 1.
    if (sum - 1.0).abs() > 1e-9 || sum > 1.0 + 1e-9 {
        return Err(DataError::arg(
            "fractions",
            format!("fractions sum to {sum}, not 1"),
        ));
    }
    let mut lengths: Vec<usize> = fractions
        .iter()
        .map(|f| (n as f64 * f).floor() as usize)
        .collect();
    let assigned: usize = lengths.iter().sum();
    let remainder = n.saturating_sub(assigned);
    let k = lengths.len();
    for i in 0..remainder {
        lengths[i % k] += 1;
    }
    if remainder > 0 {
        tracing::debug!(target: "longshore::data", remainder, "random_split: distributed remainder round-robin");
    }
    Ok(lengths)
}

/// [`random_split`] by fractions (see [`split_lengths`] for the rounding).
///
/// # Errors
/// As [`split_lengths`].
pub fn random_split_fractions<D: Dataset + ?Sized>(
    dataset: Arc<D>,
    fractions: &[f64],
    seed: u64,
) -> Result<Vec<Subset<Arc<D>>>, DataError> {
    let lengths = split_lengths(dataset.len(), fractions)?;
    random_split(dataset, &lengths, seed)
}

/// A map-style dataset over an in-memory `Vec` (handy for tests and small data).
#[derive(Debug, Clone, PartialEq)]
pub struct VecDataset<T> {
    items: Vec<T>,
}

impl<T: Clone + Send + Sync> VecDataset<T> {
    /// Wraps `items`.
    pub fn new(items: Vec<T>) -> VecDataset<T> {
        VecDataset { items }
    }
}

impl<T: Clone + Send + Sync> Dataset for VecDataset<T> {
    type Item = T;
    fn len(&self) -> usize {
        self.items.len()
    }
    fn get(&self, index: usize) -> Result<T, DataError> {
        self.items
            .get(index)
            .cloned()
            .ok_or(DataError::oob(index, self.items.len(), "dataset"))
    }
}
