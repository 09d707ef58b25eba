//! Memory-mapped `.npy` files: [`NpyArray`] (one array), [`NpyDataset`] (its rows as
//! samples), [`NpyShards`] (several files as one dataset), and the format itself:
//! header parsing and writing ([`parse_header`], [`encode_header`], [`write_npy`]).

use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{AccessPattern, advise, open_map};
use crate::DataError;
use crate::dataset::{Dataset, DirectDataset};
use crate::dtype::{DType, Element, swap_bytes_in_place};
use crate::field::{DirectPlan, FieldSpec};
use crate::shape::{Shape, nbytes};
use crate::tensor::Tensor;

mod header;

pub use header::{NpyHeader, encode_header, encode_npy, parse_header, write_npy, write_npy_bytes};

/// A memory-mapped `.npy` array.
#[derive(Debug)]
pub struct NpyArray {
    path: PathBuf,
    mmap: Mmap,
    header: NpyHeader,
    data_len: usize,
}

impl NpyArray {
    /// Maps `path` and checks its header against its length.
    ///
    /// # Errors
    /// [`DataError::Io`] when the file cannot be opened or mapped, [`DataError::Npy`]
    /// for a bad header, [`DataError::Truncated`] when the file is shorter than the
    /// header says.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyArray, DataError> {
        let path = path.as_ref();
        let mmap = open_map(path)?;
        let header = parse_header(&mmap).map_err(|source| DataError::Npy {
            path: path.to_owned(),
            source,
        })?;
        let data_len = header.data_len().map_err(|source| DataError::Npy {
            path: path.to_owned(),
            source,
        })?;
        let needed = header.data_offset as u64 + data_len as u64;
        let actual = mmap.len() as u64;
        if actual < needed {
            return Err(DataError::Truncated {
                path: path.to_owned(),
                expected: needed,
                actual,
            });
        }
        if actual > needed {
            tracing::warn!(target: "longshore::data", path = %path.display(), extra = actual - needed,
                "npy file has trailing bytes after its data; ignoring them");
        }
        tracing::debug!(target: "longshore::data", path = %path.display(), dtype = %header.dtype,
            shape = ?header.shape, "opened npy");
        Ok(NpyArray {
            path: path.to_owned(),
            mmap,
            header,
            data_len,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &NpyHeader {
        &self.header
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.header.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.header.shape
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The data bytes as stored (possibly big endian; see [`NpyHeader::byte_order`]).
    pub fn raw_bytes(&self) -> &[u8] {
        &self.mmap[self.header.data_offset..self.header.data_offset + self.data_len]
    }

    /// The data as a typed slice, without copying.
    ///
    /// # Errors
    /// [`DataError::DTypeMismatch`] when `T` is not the file's dtype,
    /// [`DataError::InvalidFile`] when the data is not in native byte order (use
    /// [`NpyArray::to_tensor`]), [`DataError::Misaligned`] when the data offset is
    /// not aligned for `T` (hand-written files; NumPy aligns it to 16 or 64 bytes).
    pub fn as_slice<T: Element>(&self) -> Result<&[T], DataError> {
        if T::DTYPE != self.dtype() {
            return Err(DataError::DTypeMismatch {
                what: self.path.display().to_string(),
                actual: self.dtype(),
                requested: T::DTYPE,
            });
        }
        if !self.header.byte_order.is_native() {
            return Err(DataError::InvalidFile {
                path: self.path.clone(),
                reason: "data is not in native byte order; read it with to_tensor or a dataset"
                    .into(),
            });
        }
        bytemuck::try_cast_slice(self.raw_bytes()).map_err(|_| DataError::Misaligned {
            what: format!(
                "{} (data at offset {})",
                self.path.display(),
                self.header.data_offset
            ),
            align: std::mem::align_of::<T>(),
        })
    }

    /// Copies the whole array into a [`Tensor`] in native byte order.
    ///
    /// # Errors
    /// When the shape has more than [`crate::shape::MAX_DIMS`] dimensions.
    pub fn to_tensor(&self) -> Result<Tensor, DataError> {
        let mut t = Tensor::from_bytes(self.dtype(), self.shape(), self.raw_bytes())?;
        if !self.header.byte_order.is_native() {
            swap_bytes_in_place(t.bytes_mut(), self.dtype().size());
        }
        Ok(t)
    }

    /// Tells the kernel how the file will be read.
    ///
    /// # Errors
    /// [`DataError::Io`] when `madvise` fails.
    pub fn advise(&self, pattern: AccessPattern) -> Result<(), DataError> {
        advise(&self.mmap, pattern, &self.path)
    }
}

/// The rows (first axis) of a memory-mapped `.npy` array as a dataset: item `i` is
/// `array[i]` as a [`Tensor`] of the remaining shape.
#[derive(Debug)]
pub struct NpyDataset {
    array: NpyArray,
    fields: [FieldSpec; 1],
    row_bytes: usize,
}

impl NpyDataset {
    /// Opens `path` as a dataset of its rows.
    ///
    /// # Errors
    /// As [`NpyArray::open`], and [`DataError::InvalidFile`] for a zero-dimensional array.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyDataset, DataError> {
        NpyDataset::from_array(NpyArray::open(path)?)
    }

    /// Wraps an opened array.
    ///
    /// # Errors
    /// [`DataError::InvalidFile`] for a zero-dimensional array.
    pub fn from_array(array: NpyArray) -> Result<NpyDataset, DataError> {
        let Some((_, row_shape)) = array.shape().split_first() else {
            return Err(DataError::InvalidFile {
                path: array.path.clone(),
                reason: "a 0-dimensional array has no rows to index".into(),
            });
        };
        let shape = Shape::new(row_shape)?;
        let row_bytes = nbytes(row_shape, array.dtype().size(), "npy row size")?;
        Ok(NpyDataset {
            fields: [FieldSpec {
                dtype: array.dtype(),
                shape,
            }],
            row_bytes,
            array,
        })
    }

    /// The mapped array.
    pub fn array(&self) -> &NpyArray {
        &self.array
    }

    /// Shape of one row.
    pub fn row_shape(&self) -> &[usize] {
        &self.array.shape()[1..]
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The stored bytes of row `index` (file byte order).
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`].
    pub fn row_raw(&self, index: usize) -> Result<&[u8], DataError> {
        let len = self.len();
        if index >= len {
            return Err(DataError::oob(index, len, "npy dataset"));
        }
        let start = index * self.row_bytes;
        Ok(&self.array.raw_bytes()[start..start + self.row_bytes])
    }

    /// Tells the kernel how the rows will be read.
    ///
    /// # Errors
    /// [`DataError::Io`] when `madvise` fails.
    pub fn advise(&self, pattern: AccessPattern) -> Result<(), DataError> {
        self.array.advise(pattern)
    }
}

impl Dataset for NpyDataset {
    type Item = Tensor;
    fn len(&self) -> usize {
        self.array.shape()[0]
    }
    fn get(&self, index: usize) -> Result<Tensor, DataError> {
        let raw = self.row_raw(index)?;
        let mut t = Tensor::from_bytes(self.array.dtype(), self.row_shape(), raw)?;
        if !self.array.header.byte_order.is_native() {
            swap_bytes_in_place(t.bytes_mut(), self.array.dtype().size());
        }
        Ok(t)
    }
    /// A row is the one field: batches are written straight from the mapped file.
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(DirectPlan::new(self))
    }
}

impl DirectDataset for NpyDataset {
    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        if field != 0 {
            return Err(DataError::oob(field, 1, "npy dataset fields"));
        }
        let raw = self.row_raw(index)?;
        if out.len() != raw.len() {
            return Err(DataError::BufferTooSmall {
                what: "npy row",
                needed: raw.len(),
                got: out.len(),
            });
        }
        out.copy_from_slice(raw);
        if !self.array.header.byte_order.is_native() {
            swap_bytes_in_place(out, self.array.dtype().size());
        }
        Ok(())
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        if field != 0 {
            return Err(DataError::oob(field, 1, "npy dataset fields"));
        }
        let raw = self.row_raw(index)?;
        Ok(self.array.header.byte_order.is_native().then_some(raw))
    }
}

/// Several `.npy` files with the same dtype and row shape, concatenated along the
/// first axis (a dataset sharded over files).
#[derive(Debug)]
pub struct NpyShards {
    shards: Vec<NpyDataset>,
    ends: Vec<usize>,
}

impl NpyShards {
    /// Opens every path, in order.
    ///
    /// # Errors
    /// [`DataError::Empty`] for no paths; any error opening a shard; and
    /// [`DataError::ShapeMismatch`] naming the first shard whose dtype or row shape
    /// differs from the first's.
    pub fn open<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<NpyShards, DataError> {
        let shards = paths
            .into_iter()
            .map(NpyDataset::open)
            .collect::<Result<Vec<_>, _>>()?;
        let first = shards.first().ok_or(DataError::Empty {
            what: "list of npy shards",
        })?;
        let spec = first.fields[0];
        let mut ends = Vec::with_capacity(shards.len());
        let mut total = 0usize;
        for s in &shards {
            if s.fields[0] != spec {
                return Err(DataError::ShapeMismatch(format!(
                    "shard {} has rows of {} {:?}, shard {} has {} {:?}",
                    s.array.path.display(),
                    s.fields[0].dtype,
                    s.fields[0].shape,
                    first.array.path.display(),
                    spec.dtype,
                    spec.shape
                )));
            }
            total = total
                .checked_add(s.len())
                .ok_or(DataError::Overflow("sharded dataset length"))?;
            ends.push(total);
        }
        Ok(NpyShards { shards, ends })
    }

    fn locate(&self, index: usize) -> Result<(&NpyDataset, usize), DataError> {
        let len = self.len();
        if index >= len {
            return Err(DataError::oob(index, len, "npy shards"));
        }
        let s = self.ends.partition_point(|&e| e <= index);
        let start = if s == 0 { 0 } else { self.ends[s - 1] };
        Ok((&self.shards[s], index - start))
    }

    /// The shards.
    pub fn shards(&self) -> &[NpyDataset] {
        &self.shards
    }

    /// Tells the kernel how every shard will be read.
    ///
    /// # Errors
    /// [`DataError::Io`] when `madvise` fails.
    pub fn advise(&self, pattern: AccessPattern) -> Result<(), DataError> {
        self.shards.iter().try_for_each(|s| s.advise(pattern))
    }
}

impl Dataset for NpyShards {
    type Item = Tensor;
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }
    fn get(&self, index: usize) -> Result<Tensor, DataError> {
        let (s, i) = self.locate(index)?;
        s.get(i)
    }
    /// A row is the one field: batches are written straight from the mapped files.
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(DirectPlan::new(self))
    }
}

impl DirectDataset for NpyShards {
    fn fields(&self) -> &[FieldSpec] {
        &self.shards[0].fields
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let (s, i) = self.locate(index)?;
        s.get_field_into(i, field, out)
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let (s, i) = self.locate(index)?;
        s.field_bytes(i, field)
    }
}
