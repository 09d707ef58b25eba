//! Collation: turning samples into one [`Batch`] written straight into a caller's
//! buffer (in the loader, a page-locked pool buffer), with no second copy.
//!
//! A batch is a list of typed tensors living in one contiguous storage, each at an
//! offset aligned to [`TENSOR_ALIGN`] bytes, so the transfer layer can move the whole
//! batch with one copy and hand out typed device views at the same offsets.
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

use std::fmt;
use std::ops::DerefMut;
use std::sync::Arc;

use crate::DataError;
use crate::dataset::{Dataset, DirectDataset};
use crate::dtype::{DType, Element};
use crate::tensor::{Sample, TensorRef};

/// Alignment of every tensor's offset inside a batch, in bytes.
pub const TENSOR_ALIGN: usize = 256;

/// What a batch can be written into: any owned byte buffer that can cross threads,
/// such as a `Vec<u8>`, an [`AlignedBuf`] or a page-locked pool lease.
pub trait Storage: DerefMut<Target = [u8]> + Send + 'static {}

impl<S: DerefMut<Target = [u8]> + Send + 'static> Storage for S {}

/// Where one tensor of a batch lives and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// Optional name (`"image"`, `"label"`, `"tokens.mask"`).
    pub name: Option<Arc<str>>,
    /// Element type.
    pub dtype: DType,
    /// Shape, batch dimension first.
    pub shape: Vec<usize>,
    /// Byte offset in the batch storage; a multiple of [`TENSOR_ALIGN`].
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl TensorSpec {
    /// The byte range of this tensor in the storage.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }

    fn label(&self, index: usize) -> String {
        match &self.name {
            Some(n) => format!("tensor '{n}'"),
            None => format!("tensor {index}"),
        }
    }
}

/// The tensors of a batch and the bytes they need: what the loader leases a buffer for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BatchLayout {
    tensors: Vec<TensorSpec>,
    total_bytes: usize,
    batch_size: usize,
}

impl BatchLayout {
    /// An empty layout for `batch_size` samples; add tensors with [`BatchLayout::push`].
    pub fn new(batch_size: usize) -> BatchLayout {
        BatchLayout {
            tensors: Vec::new(),
            total_bytes: 0,
            batch_size,
        }
    }

    /// Appends a tensor at the next [`TENSOR_ALIGN`]-aligned offset; returns its index.
    ///
    /// # Errors
    /// [`DataError::Overflow`] when the size overflows.
    pub fn push(
        &mut self,
        name: Option<Arc<str>>,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Result<usize, DataError> {
        let len = crate::dtype::nbytes(&shape, dtype.size(), "batch tensor size")?;
        let offset = self
            .total_bytes
            .checked_next_multiple_of(TENSOR_ALIGN)
            .ok_or(DataError::Overflow("batch layout"))?;
        self.total_bytes = offset
            .checked_add(len)
            .ok_or(DataError::Overflow("batch layout"))?;
        self.tensors.push(TensorSpec {
            name,
            dtype,
            shape,
            offset,
            len,
        });
        Ok(self.tensors.len() - 1)
    }

    /// The tensors.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Bytes the batch needs: the end of the last tensor.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Index of the tensor called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.tensors
            .iter()
            .position(|t| t.name.as_deref() == Some(name))
    }

    fn check_storage(&self, got: usize) -> Result<(), DataError> {
        if got < self.total_bytes {
            return Err(DataError::BufferTooSmall {
                what: "batch",
                needed: self.total_bytes,
                got,
            });
        }
        Ok(())
    }
}

/// A collated batch: typed tensors in one contiguous storage `S`, which it owns.
///
/// The storage may be larger than [`BatchLayout::total_bytes`]; [`Batch::bytes`] is
/// the prefix that holds the batch (what a transfer copies).
pub struct Batch<S> {
    layout: BatchLayout,
    storage: S,
}

impl<S: Storage> Batch<S> {
    /// Reassembles a batch from a layout and storage holding its bytes (for example
    /// after a copy); the inverse of [`Batch::into_parts`].
    ///
    /// # Errors
    /// [`DataError::BufferTooSmall`] when `storage` is shorter than the layout.
    pub fn from_parts(layout: BatchLayout, storage: S) -> Result<Batch<S>, DataError> {
        layout.check_storage(storage.len())?;
        Ok(Batch { layout, storage })
    }

    /// Splits the batch into its layout and storage.
    pub fn into_parts(self) -> (BatchLayout, S) {
        (self.layout, self.storage)
    }

    /// The layout.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.layout.batch_size
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.layout.tensors.len()
    }

    /// Whether the batch holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.layout.tensors.is_empty()
    }

    /// Specification of tensor `i`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when there is no tensor `i`.
    pub fn spec(&self, i: usize) -> Result<&TensorSpec, DataError> {
        self.layout.tensors.get(i).ok_or(DataError::oob(
            i,
            self.layout.tensors.len(),
            "batch tensors",
        ))
    }

    /// Shape of tensor `i`, batch dimension first.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when there is no tensor `i`.
    pub fn shape(&self, i: usize) -> Result<&[usize], DataError> {
        Ok(&self.spec(i)?.shape)
    }

    /// The bytes holding the batch (`total_bytes` long): what a transfer copies.
    pub fn bytes(&self) -> &[u8] {
        &self.storage[..self.layout.total_bytes]
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The raw bytes of tensor `i`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when there is no tensor `i`.
    pub fn tensor_bytes(&self, i: usize) -> Result<&[u8], DataError> {
        let range = self.spec(i)?.range();
        Ok(&self.storage[range])
    }

    /// Tensor `i` as a typed slice, checked against its dtype.
    ///
    /// # Errors
    /// [`DataError::DTypeMismatch`] when `T` is not the tensor's dtype,
    /// [`DataError::Misaligned`] when the storage's base address is not aligned for
    /// `T` (use an [`AlignedBuf`] or page-aligned storage).
    pub fn tensor<T: Element>(&self, i: usize) -> Result<&[T], DataError> {
        let spec = self.spec(i)?;
        check_dtype::<T>(spec, i)?;
        bytemuck::try_cast_slice(&self.storage[spec.range()]).map_err(|_| DataError::Misaligned {
            what: spec.label(i),
            align: std::mem::align_of::<T>(),
        })
    }

    /// Tensor `i` as a mutable typed slice (for in-place transforms).
    ///
    /// # Errors
    /// As [`Batch::tensor`].
    pub fn tensor_mut<T: Element>(&mut self, i: usize) -> Result<&mut [T], DataError> {
        let spec = self.spec(i)?.clone();
        check_dtype::<T>(&spec, i)?;
        bytemuck::try_cast_slice_mut(&mut self.storage[spec.range()]).map_err(|_| {
            DataError::Misaligned {
                what: spec.label(i),
                align: std::mem::align_of::<T>(),
            }
        })
    }

    /// The tensor called `name` as a typed slice.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when no tensor has that name, else as [`Batch::tensor`].
    pub fn tensor_by_name<T: Element>(&self, name: &str) -> Result<&[T], DataError> {
        let i = self.layout.position(name).ok_or_else(|| {
            DataError::arg("name", format!("no tensor named '{name}' in the batch"))
        })?;
        self.tensor(i)
    }
}

fn check_dtype<T: Element>(spec: &TensorSpec, i: usize) -> Result<(), DataError> {
    if spec.dtype != T::DTYPE {
        return Err(DataError::DTypeMismatch {
            what: spec.label(i),
            actual: spec.dtype,
            requested: T::DTYPE,
        });
    }
    Ok(())
}

impl<S> fmt::Debug for Batch<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

/// A heap byte buffer whose base address is 8-byte aligned, so every tensor of a
/// batch written into it can be read as a typed slice. Page-locked pool buffers are
/// page aligned and need no such wrapper.
#[derive(Clone, PartialEq, Eq)]
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

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

fn names(names: &[Arc<str>], i: usize) -> Option<Arc<str>> {
    names.get(i).cloned()
}

fn field_of<'a, T: Sample>(sample: &'a T, b: usize, f: usize) -> Result<TensorRef<'a>, DataError> {
    sample.field(f).ok_or_else(|| {
        DataError::ShapeMismatch(format!(
            "sample {b} of the batch has {} fields, expected at least {}",
            sample.num_fields(),
            f + 1
        ))
    })
}

/// Zeroes the bytes between tensors (alignment gaps) so no stale data is shipped.
fn zero_gaps(layout: &BatchLayout, out: &mut [u8]) {
    let mut end = 0;
    for t in &layout.tensors {
        out[end..t.offset].fill(0);
        end = t.offset + t.len;
    }
}

/// Stacks fixed-shape samples field by field, like PyTorch's `default_collate`:
/// field `f` of every sample becomes tensor `f` of shape `[batch, ...field_shape]`.
#[derive(Debug, Clone, Default)]
pub struct StackCollate {
    names: Vec<Arc<str>>,
}

impl StackCollate {
    /// Unnamed tensors, addressed by position.
    pub fn new() -> StackCollate {
        StackCollate::default()
    }

    /// Names the tensors in field order (`["image", "label"]`).
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(
        mut self,
        names: I,
    ) -> StackCollate {
        self.names = names.into_iter().map(|n| Arc::from(n.as_ref())).collect();
        self
    }
}

impl<T: Sample> Collate<T> for StackCollate {
    fn layout(&self, samples: &[T]) -> Result<BatchLayout, DataError> {
        let first = samples.first().ok_or(DataError::Empty { what: "batch" })?;
        let n = first.num_fields();
        let mut layout = BatchLayout::new(samples.len());
        for f in 0..n {
            let r = field_of(first, 0, f)?;
            for (b, s) in samples.iter().enumerate().skip(1) {
                if s.num_fields() != n {
                    return Err(DataError::ShapeMismatch(format!(
                        "sample {b} of the batch has {} fields, sample 0 has {n}",
                        s.num_fields()
                    )));
                }
                let o = field_of(s, b, f)?;
                if o.dtype() != r.dtype() || o.shape() != r.shape() {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} is {} {:?}, sample 0 has {} {:?}; \
                         use PadCollate for variable-length fields",
                        o.dtype(),
                        o.shape(),
                        r.dtype(),
                        r.shape()
                    )));
                }
            }
            let mut shape = Vec::with_capacity(r.shape().ndim() + 1);
            shape.push(samples.len());
            shape.extend_from_slice(r.shape().dims());
            layout.push(names(&self.names, f), r.dtype(), shape)?;
        }
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[T],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        layout.check_storage(storage.len())?;
        if layout.batch_size != samples.len() {
            return Err(DataError::ShapeMismatch(format!(
                "layout is for {} samples, {} given",
                layout.batch_size,
                samples.len()
            )));
        }
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        for (f, spec) in layout.tensors.iter().enumerate() {
            let per = spec.len / samples.len().max(1);
            let dst = &mut out[spec.range()];
            for (b, (s, slot)) in samples
                .iter()
                .zip(dst.chunks_exact_mut(per.max(1)))
                .enumerate()
            {
                let r = field_of(s, b, f)?;
                if r.bytes().len() != per || r.dtype() != spec.dtype {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} does not match the layout ({} bytes, expected {per})",
                        r.bytes().len()
                    )));
                }
                slot.copy_from_slice(r.bytes());
            }
        }
        Ok(Batch { layout, storage })
    }
}

/// Pads variable-length fields, like a `pad_sequence` collate: each field with at
/// least one dimension is padded along its first dimension to the longest in the
/// batch (`[batch, max_len, ...rest]`, filled with `pad_value`); scalar fields are
/// stacked. After the fields, for each padded field in order, come its `lengths`
/// (`i64 [batch]`) and its `mask` (`bool [batch, max_len]`, 1 where data is real).
#[derive(Debug, Clone)]
pub struct PadCollate {
    pad_value: f64,
    names: Vec<Arc<str>>,
}

impl Default for PadCollate {
    fn default() -> Self {
        PadCollate::new(0.0)
    }
}

impl PadCollate {
    /// Pads with `pad_value` (converted to each field's dtype).
    pub fn new(pad_value: f64) -> PadCollate {
        PadCollate {
            pad_value,
            names: Vec::new(),
        }
    }

    /// Names the fields; lengths and masks are then named `"{name}.lengths"` and
    /// `"{name}.mask"`.
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(mut self, names: I) -> PadCollate {
        self.names = names.into_iter().map(|n| Arc::from(n.as_ref())).collect();
        self
    }
}

impl<T: Sample> Collate<T> for PadCollate {
    fn layout(&self, samples: &[T]) -> Result<BatchLayout, DataError> {
        let first = samples.first().ok_or(DataError::Empty { what: "batch" })?;
        let n = first.num_fields();
        let bs = samples.len();
        let mut layout = BatchLayout::new(bs);
        let mut padded = Vec::new();
        for f in 0..n {
            let r = field_of(first, 0, f)?;
            let rest = r.shape().dims().get(1..).unwrap_or(&[]).to_vec();
            let mut max_len = r.shape().dims().first().copied().unwrap_or(0);
            for (b, s) in samples.iter().enumerate().skip(1) {
                let o = field_of(s, b, f)?;
                let same_rest = o.shape().dims().get(1..).unwrap_or(&[]) == rest.as_slice();
                if o.dtype() != r.dtype() || o.shape().ndim() != r.shape().ndim() || !same_rest {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} is {} {:?}, sample 0 has {} {:?}; only the first dimension may vary",
                        o.dtype(),
                        o.shape(),
                        r.dtype(),
                        r.shape()
                    )));
                }
                max_len = max_len.max(o.shape().dims().first().copied().unwrap_or(0));
            }
            let mut shape = vec![bs];
            if r.shape().ndim() > 0 {
                shape.push(max_len);
                shape.extend_from_slice(&rest);
                padded.push((f, max_len));
            }
            layout.push(names(&self.names, f), r.dtype(), shape)?;
        }
        for (f, max_len) in padded {
            let name = names(&self.names, f);
            let suffixed = |s: &str| name.as_ref().map(|n| Arc::from(format!("{n}.{s}")));
            layout.push(suffixed("lengths"), DType::I64, vec![bs])?;
            layout.push(suffixed("mask"), DType::Bool, vec![bs, max_len])?;
        }
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[T],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        layout.check_storage(storage.len())?;
        let bs = samples.len();
        if layout.batch_size != bs || bs == 0 {
            return Err(DataError::ShapeMismatch(format!(
                "layout is for {} samples, {bs} given",
                layout.batch_size
            )));
        }
        let n_fields = samples[0].num_fields();
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        let mut extra = n_fields;
        for f in 0..n_fields {
            let spec = layout
                .tensors
                .get(f)
                .ok_or(DataError::oob(f, layout.tensors.len(), "layout tensors"))?
                .clone();
            let per = spec.len / bs;
            let elem = spec.dtype.size();
            let mut pad = vec![0u8; elem];
            spec.dtype.encode_f64(self.pad_value, &mut pad);
            let dst = &mut out[spec.range()];
            let mut lengths = Vec::with_capacity(bs);
            for (b, (s, slot)) in samples
                .iter()
                .zip(dst.chunks_exact_mut(per.max(1)))
                .enumerate()
            {
                let r = field_of(s, b, f)?;
                if r.bytes().len() > per || r.dtype() != spec.dtype {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} does not match the layout"
                    )));
                }
                slot[..r.bytes().len()].copy_from_slice(r.bytes());
                for p in slot[r.bytes().len()..].chunks_exact_mut(elem) {
                    p.copy_from_slice(&pad);
                }
                lengths.push(r.shape().dims().first().copied().unwrap_or(0));
            }
            if spec.shape.len() >= 2 {
                let max_len = spec.shape[1];
                let (lspec, mspec) =
                    match (layout.tensors.get(extra), layout.tensors.get(extra + 1)) {
                        (Some(l), Some(m)) => (l.clone(), m.clone()),
                        _ => {
                            return Err(DataError::ShapeMismatch(
                                "layout lacks lengths/mask tensors".into(),
                            ));
                        }
                    };
                extra += 2;
                for (slot, &l) in out[lspec.range()].chunks_exact_mut(8).zip(&lengths) {
                    slot.copy_from_slice(&(l as i64).to_ne_bytes());
                }
                if let Some((b, &l)) = lengths.iter().enumerate().find(|(_, l)| **l > max_len) {
                    return Err(DataError::ShapeMismatch(format!(
                        "sample {b} has length {l}, longer than the layout's {max_len}"
                    )));
                }
                for (row, &l) in out[mspec.range()]
                    .chunks_exact_mut(max_len.max(1))
                    .zip(&lengths)
                {
                    row[..l].fill(1);
                    row[l..].fill(0);
                }
            }
        }
        Ok(Batch { layout, storage })
    }
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

/// Indices of a batch and its layout; see [`DirectCollate`].
#[derive(Debug, Clone)]
pub struct StagedIndices {
    indices: Vec<usize>,
    layout: BatchLayout,
}

impl StagedIndices {
    /// The batch's layout.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }
}

/// Stacks the fields of a [`DirectDataset`] by having the dataset write each sample
/// straight into its slot of the batch: a memory-mapped row reaches the (pinned)
/// batch buffer with one copy and no intermediate allocation.
#[derive(Debug, Clone, Default)]
pub struct DirectCollate {
    names: Vec<Arc<str>>,
}

impl DirectCollate {
    /// Unnamed tensors.
    pub fn new() -> DirectCollate {
        DirectCollate::default()
    }

    /// Names the tensors in field order.
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(
        mut self,
        names: I,
    ) -> DirectCollate {
        self.names = names.into_iter().map(|n| Arc::from(n.as_ref())).collect();
        self
    }

    /// The layout of a batch of `batch_size` samples with these fields.
    ///
    /// # Errors
    /// [`DataError::Empty`] for a zero batch size, [`DataError::Overflow`].
    pub fn layout_for(
        &self,
        fields: &[crate::dataset::FieldSpec],
        batch_size: usize,
    ) -> Result<BatchLayout, DataError> {
        if batch_size == 0 {
            return Err(DataError::Empty { what: "batch" });
        }
        let mut layout = BatchLayout::new(batch_size);
        for (f, spec) in fields.iter().enumerate() {
            let mut shape = vec![batch_size];
            shape.extend_from_slice(spec.shape.dims());
            layout.push(names(&self.names, f), spec.dtype, shape)?;
        }
        Ok(layout)
    }
}

impl<D: DirectDataset + ?Sized> DatasetCollate<D> for DirectCollate {
    type Staged = StagedIndices;

    fn stage(&self, dataset: &D, indices: &[usize]) -> Result<StagedIndices, DataError> {
        let len = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::oob(bad, len, "dataset"));
        }
        Ok(StagedIndices {
            indices: indices.to_vec(),
            layout: self.layout_for(dataset.fields(), indices.len())?,
        })
    }

    fn staged_layout<'a>(&self, staged: &'a StagedIndices) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        dataset: &D,
        staged: StagedIndices,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        let StagedIndices { indices, layout } = staged;
        layout.check_storage(storage.len())?;
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        for (f, spec) in layout.tensors.iter().enumerate() {
            let per = spec.len / indices.len().max(1);
            if per == 0 {
                continue;
            }
            for (&i, slot) in indices.iter().zip(out[spec.range()].chunks_exact_mut(per)) {
                dataset.get_field_into(i, f, slot)?;
            }
        }
        Ok(Batch { layout, storage })
    }
}
