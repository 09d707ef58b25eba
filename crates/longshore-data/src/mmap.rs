//! Memory-mapped datasets: `.npy` arrays, shards of them, and fixed-size record files.
//!
//! Files are mapped read-only with `memmap2`. Lengths are checked against the header
//! or record layout when a file is opened, so every later read is in bounds.
//!
//! **Files must not be modified or truncated while mapped.** Another process
//! shrinking a mapped file makes reads of the lost pages fault (`SIGBUS`); this is
//! the caveat every memory map carries and cannot be checked for.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::DataError;
use crate::dataset::{Dataset, DirectDataset, FieldSpec};
use crate::dtype::{ByteOrder, DType, Element, Shape, nbytes, swap_bytes_in_place};
use crate::npy::{NpyHeader, parse_header};
use crate::tensor::Tensor;

/// Maps `file` (opened read-only from `path`) into memory.
fn map_file(file: &File, path: &Path) -> Result<Mmap, DataError> {
    longshore_host::file::map_readonly(file).map_err(|source| DataError::Io {
        path: path.to_owned(),
        source,
    })
}

fn open_map(path: &Path) -> Result<Mmap, DataError> {
    let io = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    map_file(&file, path)
}

/// How a mapped file will be read: passed to the kernel as an `madvise` hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AccessPattern {
    /// No particular pattern.
    Normal,
    /// Front to back (sequential sampler): aggressive read-ahead.
    Sequential,
    /// Random order (shuffled sampler): no read-ahead.
    Random,
    /// Will be needed soon: start reading it in now.
    WillNeed,
}

fn advise(mmap: &Mmap, pattern: AccessPattern, path: &Path) -> Result<(), DataError> {
    #[cfg(unix)]
    {
        use memmap2::Advice;
        let advice = match pattern {
            AccessPattern::Normal => Advice::Normal,
            AccessPattern::Sequential => Advice::Sequential,
            AccessPattern::Random => Advice::Random,
            AccessPattern::WillNeed => Advice::WillNeed,
        };
        if mmap.is_empty() {
            return Ok(());
        }
        mmap.advise(advice).map_err(|source| DataError::Io {
            path: path.to_owned(),
            source,
        })?;
        tracing::debug!(target: "longshore::data", path = %path.display(), ?pattern, "madvise");
    }
    #[cfg(not(unix))]
    {
        let _ = (mmap, pattern, path);
    }
    Ok(())
}

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
    /// When the shape has more than [`crate::dtype::MAX_DIMS`] dimensions.
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
}

impl DirectDataset for NpyShards {
    fn fields(&self) -> &[FieldSpec] {
        &self.shards[0].fields
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let (s, i) = self.locate(index)?;
        s.get_field_into(i, field, out)
    }
}

/// One field of a fixed-size record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordField {
    /// Field name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape of the field in one record.
    pub shape: Vec<usize>,
    /// Byte offset of the field within the record.
    pub offset: usize,
}

/// The layout of a fixed-size record file: an optional header to skip, then
/// records of `record_size` bytes, each holding the given fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLayout {
    record_size: usize,
    header_bytes: usize,
    byte_order: ByteOrder,
    fields: Vec<RecordField>,
    specs: Vec<FieldSpec>,
}

impl RecordLayout {
    /// Records of `record_size` bytes, little endian, no file header.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `record_size == 0`.
    pub fn new(record_size: usize) -> Result<RecordLayout, DataError> {
        if record_size == 0 {
            return Err(DataError::arg("record_size", "must be positive"));
        }
        Ok(RecordLayout {
            record_size,
            header_bytes: 0,
            byte_order: ByteOrder::Little,
            fields: Vec::new(),
            specs: Vec::new(),
        })
    }

    /// Records packed back to back, each holding `fields` in order (no padding).
    ///
    /// # Errors
    /// As [`RecordLayout::field`]; [`DataError::InvalidArgument`] for no fields.
    pub fn packed(fields: &[(&str, DType, &[usize])]) -> Result<RecordLayout, DataError> {
        let mut size = 0usize;
        let mut offsets = Vec::with_capacity(fields.len());
        for (_, dtype, shape) in fields {
            offsets.push(size);
            size = size
                .checked_add(nbytes(shape, dtype.size(), "record size")?)
                .ok_or(DataError::Overflow("record size"))?;
        }
        let mut layout = RecordLayout::new(size)?;
        for ((name, dtype, shape), offset) in fields.iter().zip(offsets) {
            layout = layout.field(name, *dtype, shape, offset)?;
        }
        Ok(layout)
    }

    /// Skips `bytes` at the start of the file.
    pub fn header_bytes(mut self, bytes: usize) -> RecordLayout {
        self.header_bytes = bytes;
        self
    }

    /// Sets the byte order of the stored values (converted on read).
    pub fn byte_order(mut self, order: ByteOrder) -> RecordLayout {
        self.byte_order = order;
        self
    }

    /// Adds a field at `offset` within the record.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when the field does not fit in the record.
    pub fn field(
        mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        offset: usize,
    ) -> Result<RecordLayout, DataError> {
        let len = nbytes(shape, dtype.size(), "record field size")?;
        let end = offset
            .checked_add(len)
            .ok_or(DataError::Overflow("record field end"))?;
        if end > self.record_size {
            return Err(DataError::arg(
                "offset",
                format!(
                    "field '{name}' spans bytes {offset}..{end}, past the record size {}",
                    self.record_size
                ),
            ));
        }
        self.specs.push(FieldSpec {
            dtype,
            shape: Shape::new(shape)?,
        });
        self.fields.push(RecordField {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            offset,
        });
        Ok(self)
    }

    /// Bytes per record.
    pub fn record_size(&self) -> usize {
        self.record_size
    }

    /// The fields.
    pub fn fields(&self) -> &[RecordField] {
        &self.fields
    }
}

/// A memory-mapped file of fixed-size records; item `i` is a `Vec<Tensor>`, one per field.
#[derive(Debug)]
pub struct RecordDataset {
    path: PathBuf,
    mmap: Option<Mmap>,
    layout: RecordLayout,
    len: usize,
}

impl RecordDataset {
    /// Maps `path` with `layout`.
    ///
    /// # Errors
    /// [`DataError::Io`]; [`DataError::InvalidArgument`] for a layout without fields;
    /// [`DataError::Truncated`] when the file is shorter than its header;
    /// [`DataError::InvalidFile`] when the data is not a whole number of records.
    pub fn open(path: impl AsRef<Path>, layout: RecordLayout) -> Result<RecordDataset, DataError> {
        let path = path.as_ref();
        if layout.fields.is_empty() {
            return Err(DataError::arg(
                "layout",
                "a record layout needs at least one field",
            ));
        }
        let size = std::fs::metadata(path)
            .map_err(|source| DataError::Io {
                path: path.to_owned(),
                source,
            })?
            .len();
        let mmap = if size == 0 {
            None
        } else {
            Some(open_map(path)?)
        };
        let actual = mmap.as_ref().map_or(0, |m| m.len());
        if actual < layout.header_bytes {
            return Err(DataError::Truncated {
                path: path.to_owned(),
                expected: layout.header_bytes as u64,
                actual: actual as u64,
            });
        }
        let body = actual - layout.header_bytes;
        if body % layout.record_size != 0 {
            return Err(DataError::InvalidFile {
                path: path.to_owned(),
                reason: format!(
                    "{body} bytes of records after a {}-byte header is not a multiple of the record size {} \
                     ({} trailing bytes at offset {})",
                    layout.header_bytes,
                    layout.record_size,
                    body % layout.record_size,
                    actual - body % layout.record_size
                ),
            });
        }
        let len = body / layout.record_size;
        tracing::debug!(target: "longshore::data", path = %path.display(), records = len, "opened record file");
        Ok(RecordDataset {
            path: path.to_owned(),
            mmap,
            layout,
            len,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &RecordLayout {
        &self.layout
    }

    /// The stored bytes of record `index`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`].
    pub fn record_raw(&self, index: usize) -> Result<&[u8], DataError> {
        match &self.mmap {
            Some(m) if index < self.len => {
                let start = self.layout.header_bytes + index * self.layout.record_size;
                Ok(&m[start..start + self.layout.record_size])
            }
            _ => Err(DataError::oob(index, self.len, "record file")),
        }
    }

    /// Tells the kernel how the records will be read.
    ///
    /// # Errors
    /// [`DataError::Io`] when `madvise` fails.
    pub fn advise(&self, pattern: AccessPattern) -> Result<(), DataError> {
        match &self.mmap {
            Some(m) => advise(m, pattern, &self.path),
            None => Ok(()),
        }
    }
}

impl Dataset for RecordDataset {
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let rec = self.record_raw(index)?;
        self.layout
            .fields
            .iter()
            .map(|f| {
                let len = nbytes(&f.shape, f.dtype.size(), "record field size")?;
                let mut t = Tensor::from_bytes(f.dtype, &f.shape, &rec[f.offset..f.offset + len])?;
                if !self.layout.byte_order.is_native() {
                    swap_bytes_in_place(t.bytes_mut(), f.dtype.size());
                }
                Ok(t)
            })
            .collect()
    }
}

impl DirectDataset for RecordDataset {
    fn fields(&self) -> &[FieldSpec] {
        &self.layout.specs
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let rec = self.record_raw(index)?;
        let f = self.layout.fields.get(field).ok_or(DataError::oob(
            field,
            self.layout.fields.len(),
            "record fields",
        ))?;
        let len = nbytes(&f.shape, f.dtype.size(), "record field size")?;
        if out.len() != len {
            return Err(DataError::BufferTooSmall {
                what: "record field",
                needed: len,
                got: out.len(),
            });
        }
        out.copy_from_slice(&rec[f.offset..f.offset + len]);
        if !self.layout.byte_order.is_native() {
            swap_bytes_in_place(out, f.dtype.size());
        }
        Ok(())
    }
}
