//! Memory-mapped files of fixed-size records: [`RecordLayout`] says where each field
//! sits in a record, [`RecordDataset`] reads them.

use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{AccessPattern, advise, open_map};
use crate::DataError;
use crate::dataset::{Dataset, DirectDataset};
use crate::dtype::{ByteOrder, DType, swap_bytes_in_place};
use crate::field::{DirectPlan, FieldSpec};
use crate::shape::{Shape, nbytes};
use crate::tensor::Tensor;

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
        if !body.is_multiple_of(layout.record_size) {
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
    pub(crate) fn record_raw(&self, index: usize) -> Result<&[u8], DataError> {
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
    /// A record's fields are the fields: batches are written straight from the mapped file.
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(DirectPlan::new(self))
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
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let rec = self.record_raw(index)?;
        let f = self.layout.fields.get(field).ok_or(DataError::oob(
            field,
            self.layout.fields.len(),
            "record fields",
        ))?;
        if !self.layout.byte_order.is_native() {
            return Ok(None);
        }
        let len = nbytes(&f.shape, f.dtype.size(), "record field size")?;
        Ok(Some(&rec[f.offset..f.offset + len]))
    }
}
