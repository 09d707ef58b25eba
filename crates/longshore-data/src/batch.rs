//! The batch type: typed tensors in one contiguous storage at [`TENSOR_ALIGN`]-aligned
//! offsets, and the layout the loader leases a buffer for.
//!
//! A batch is a list of typed tensors living in one contiguous storage, each at an
//! offset aligned to [`TENSOR_ALIGN`] bytes, so the transfer layer can move the whole
//! batch with one copy and hand out typed device views at the same offsets.

use std::fmt;
use std::ops::DerefMut;
use std::sync::Arc;

use crate::DataError;
use crate::dtype::{DType, Element};

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

    pub(crate) fn label(&self, index: usize) -> String {
        match &self.name {
            Some(n) => format!("tensor '{n}'"),
            None => format!("tensor {index}"),
        }
    }
}

/// The tensors of a batch and the bytes they need: what the loader leases a buffer for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BatchLayout {
    pub(crate) tensors: Vec<TensorSpec>,
    pub(crate) total_bytes: usize,
    pub(crate) batch_size: usize,
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
        let len = crate::shape::nbytes(&shape, dtype.size(), "batch tensor size")?;
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

    pub(crate) fn check_storage(&self, got: usize) -> Result<(), DataError> {
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
    pub(crate) layout: BatchLayout,
    pub(crate) storage: S,
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

/// Zeroes the bytes between tensors (alignment gaps) so no stale data is shipped.
pub(crate) fn zero_gaps(layout: &BatchLayout, out: &mut [u8]) {
    let mut end = 0;
    for t in &layout.tensors {
        out[end..t.offset].fill(0);
        end = t.offset + t.len;
    }
}
