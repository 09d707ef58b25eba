//! Shards read field by field, beyond an image and a label: [`FieldRecords`], whose workers
//! read each sample's named fields ([`ShardField`]: a name and a [`FieldKind`]), and
//! [`RecordCollate`], which writes them into the (page-locked) batch.
//!
//! # The batch layout
//!
//! Each field gives, in the order the fields are named, one tensor or two:
//!
//! * an image ([`FieldKind::Image`], at most one): `[B, ...]` of the pipeline's dtype and
//!   shape, decoded and transformed straight into its slot by the [`Compose`] pipeline, from
//!   a generator seeded with the sample's seed ([`ShardSample::seed`]);
//! * an integer ([`FieldKind::Int`]): `[B]`, `i64`;
//! * a float ([`FieldKind::Float`]): `[B]`, `f64`;
//! * an array ([`FieldKind::Array`]: a WebDataset `.npy`, an MDS `ndarray` column, a Parquet
//!   list of numbers): `[B, ...]` of its own dtype, the samples' arrays stacked as torch's
//!   `default_collate` stacks tensors, so every array of a batch has one dtype and shape
//!   (fixed-length token sequences, embeddings, masks); a batch that mixes shapes is an error
//!   naming its samples (read ragged arrays as `bytes` and decode them yourself);
//! * a variable-length field (text, JSON, bytes: [`FieldKind::is_variable`]): two tensors,
//!   `<name>` holding its samples' bytes concatenated (`u8`, `[total bytes]`) and
//!   `<name>.offsets` holding where each sample's bytes start and end (`i64`, `[B + 1]`:
//!   sample `k` is `bytes[offsets[k]..offsets[k + 1]]`).
//!
//! A missing field, text that is not UTF-8, JSON that does not parse or a number that does
//! not read is an item error naming the shard, the key and the field.
//!
//! ```
//! use longshore_data::Batch;
//! use longshore_loader::DataLoader;
//! use longshore_shards::dataset::ShardedDataset;
//! use longshore_shards::webdataset::ShardWriter;
//! use longshore_vision::shards::fields::{FieldKind, FieldRecords, ShardField};
//! use longshore_vision::{Compose, DecodeOptions, Output};
//!
//! # #[cfg(feature = "synth")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use longshore_vision::synth::{FolderSpec, image_jpeg};
//! # let dir = tempfile::tempdir()?;
//! let mut writer = ShardWriter::new(dir.path(), 1 << 20)?;
//! for i in 0..4 {
//!     let jpg = image_jpeg(&FolderSpec::tiny(), i, 0);
//!     let txt = format!("caption {i}");
//!     writer.write(&format!("s{i}"), &[("jpg", &jpg), ("txt", txt.as_bytes())])?;
//! }
//! writer.finish()?;
//! let shards = ShardedDataset::webdataset([format!("{}/shard-000000.tar", dir.path().display())])
//!     .rank(0)
//!     .world_size(1)
//!     .cache_dir(dir.path().join("cache"))
//!     .build()?;
//! let fields = [
//!     ShardField::new("jpg", FieldKind::Image),
//!     ShardField::new("txt", FieldKind::Text),
//! ];
//! let records = FieldRecords::new(
//!     shards,
//!     fields,
//!     Some(Compose::val(36, 32, Output::U8Chw)),
//!     DecodeOptions::default(),
//! );
//! let collate = records.collate();
//! let loader = DataLoader::iterable(records).collate(collate).batch_size(4).build()?;
//! let batch = loader.iter().next().unwrap()?;
//! assert_eq!(batch.shape(0)?, &[4, 3, 32, 32]);
//! let (bytes, offsets) = (batch.tensor_bytes(1)?, batch.tensor::<i64>(2)?);
//! assert_eq!(offsets.len(), 5);
//! let first = &bytes[offsets[0] as usize..offsets[1] as usize];
//! assert!(std::str::from_utf8(first)?.starts_with("caption "));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "synth"))]
//! # fn main() {}
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longshore_data::dtype::swap_bytes_in_place;
use longshore_data::formats::npy::parse_header;
use longshore_data::{DType, DataError, ItemIter, IterableDataset, WorkerInfo};
use longshore_shards::ShardError;
use longshore_shards::dataset::{ShardFormat, ShardSample, ShardedDataset};

use crate::{Compose, DecodeOptions};

mod collate;

pub use collate::RecordCollate;

/// How one field of a sample is decoded, and so how it is batched (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FieldKind {
    /// An encoded image, decoded and transformed by the pipeline into a `[B, ...]` tensor.
    Image,
    /// An integer ([`ShardSample::int`]): an `i64` `[B]` tensor.
    Int,
    /// A float (decimal text, or an MDS numeric column): an `f64` `[B]` tensor.
    Float,
    /// UTF-8 text (checked): bytes and offsets.
    Text,
    /// JSON text (checked to parse): bytes and offsets.
    Json,
    /// Raw bytes: bytes and offsets.
    Bytes,
    /// A numeric array (a `.npy`, an MDS `ndarray` column, a Parquet list of numbers):
    /// `[B, ...]` of its dtype, stacked (every array of a batch of one dtype and shape).
    Array,
}

impl FieldKind {
    /// Every kind, in the order of their [names](FieldKind::name).
    pub const ALL: [FieldKind; 7] = [
        FieldKind::Image,
        FieldKind::Int,
        FieldKind::Float,
        FieldKind::Text,
        FieldKind::Json,
        FieldKind::Bytes,
        FieldKind::Array,
    ];

    /// The kind's name: `image`, `int`, `float`, `text`, `json`, `bytes` or `array`.
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Image => "image",
            FieldKind::Int => "int",
            FieldKind::Float => "float",
            FieldKind::Text => "text",
            FieldKind::Json => "json",
            FieldKind::Bytes => "bytes",
            FieldKind::Array => "array",
        }
    }

    /// The kind named `name` (see [`FieldKind::name`]), if any.
    pub fn from_name(name: &str) -> Option<FieldKind> {
        FieldKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the field travels as two tensors, bytes and offsets (text, JSON, bytes).
    pub fn is_variable(self) -> bool {
        matches!(self, FieldKind::Text | FieldKind::Json | FieldKind::Bytes)
    }
}

impl fmt::Display for FieldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One requested field: its name (a WebDataset extension, an MDS or Parquet column) and how
/// it is decoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardField {
    /// The field's name in the shards, and its tensor's name in the batch.
    pub name: String,
    /// How it is decoded and batched.
    pub kind: FieldKind,
}

impl ShardField {
    /// Field `name`, decoded as `kind`.
    pub fn new(name: impl Into<String>, kind: FieldKind) -> ShardField {
        ShardField {
            name: name.into(),
            kind,
        }
    }
}

/// One field's value as a worker reads it.
#[derive(Debug, Clone)]
enum Value {
    /// The encoded image, and its name in errors (`shard-url#key.ext`).
    Image(PathBuf, Vec<u8>),
    Int(i64),
    Float(f64),
    /// Text, JSON or bytes (text and JSON checked).
    Var(Vec<u8>),
    /// An array's dtype, shape and elements (native byte order, C order).
    Array(DType, Vec<usize>, Vec<u8>),
}

/// One sample's fields, read and checked but not decoded (an image stays encoded until
/// [`RecordCollate`] decodes it into its batch slot): the items of [`FieldRecords`], in the
/// order of its fields.
#[derive(Debug, Clone)]
pub struct FieldRecord {
    values: Vec<Value>,
    seed: u64,
    /// `shard-url#key`, naming the sample in collation errors.
    origin: String,
}

impl FieldRecord {
    /// The number of fields.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the record has no fields.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The seed the sample's random transforms draw from ([`ShardSample::seed`]).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Field `index`'s integer, if it is an [`Int`](FieldKind::Int) field.
    pub fn int(&self, index: usize) -> Option<i64> {
        match self.values.get(index)? {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// Field `index`'s number, if it is a [`Float`](FieldKind::Float) field.
    pub fn float(&self, index: usize) -> Option<f64> {
        match self.values.get(index)? {
            Value::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// Field `index`'s bytes, if it is a variable-length field ([`FieldKind::is_variable`]).
    pub fn bytes(&self, index: usize) -> Option<&[u8]> {
        match self.values.get(index)? {
            Value::Var(b) => Some(b),
            _ => None,
        }
    }

    /// Field `index`'s array (dtype, shape, elements in native byte order and C order), if it
    /// is an [`Array`](FieldKind::Array) field.
    pub fn array(&self, index: usize) -> Option<(DType, &[usize], &[u8])> {
        match self.values.get(index)? {
            Value::Array(dtype, shape, data) => Some((*dtype, shape, data)),
            _ => None,
        }
    }

    /// The sample's shard and key (`shard-url#key`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Field `index`'s encoded image and its name in errors (`shard-url#key.ext`), if it is
    /// the [`Image`](FieldKind::Image) field.
    pub fn image(&self, index: usize) -> Option<(&Path, &[u8])> {
        match self.values.get(index)? {
            Value::Image(path, bytes) => Some((path, bytes)),
            _ => None,
        }
    }

    /// Takes the encoded image out of the record (for a decoder elsewhere: nvJPEG's
    /// `EncodedFields`): its name in errors (`shard-url#key.ext`) and bytes. The record then
    /// holds the other fields, in order, as [`RecordCollate::without_image`] collates them.
    pub fn take_image(&mut self) -> Option<(PathBuf, Vec<u8>)> {
        let at = self
            .values
            .iter()
            .position(|v| matches!(v, Value::Image(..)))?;
        match self.values.remove(at) {
            Value::Image(path, bytes) => Some((path, bytes)),
            _ => None,
        }
    }

    /// Field `f`'s bytes when variable-length, else none.
    fn var(&self, f: usize) -> &[u8] {
        match &self.values[f] {
            Value::Var(b) => b,
            _ => &[],
        }
    }
}

/// A sharded dataset read field by field: an [`IterableDataset`] of [`FieldRecord`]s, driven
/// through the loader's epoch seam as its [`ShardedDataset`] is; batch its items with
/// [`FieldRecords::collate`]. See the [module docs](self).
///
/// The fields are not checked here: name at most one [`Image`](FieldKind::Image) field, and
/// give a pipeline when you do (without one, collating a batch fails).
#[derive(Debug, Clone)]
pub struct FieldRecords {
    dataset: ShardedDataset,
    fields: Arc<[ShardField]>,
    transform: Option<Arc<Compose>>,
    decode: DecodeOptions,
}

/// A sample error naming the shard, the key and the field.
fn fail(sample: &ShardSample, name: &str, reason: String) -> DataError {
    let s = &sample.sample;
    DataError::custom(
        "reading a sample's fields",
        ShardError::Sample {
            shard: s.url.clone(),
            key: s.key.clone(),
            offset: s.offset,
            reason: format!("field {name:?}: {reason}"),
        },
    )
}

impl FieldRecords {
    /// `dataset`'s samples read as `fields`, in that order; the image field (if any) decoded
    /// by `transform` with `decode`'s options.
    pub fn new(
        dataset: ShardedDataset,
        fields: impl Into<Arc<[ShardField]>>,
        transform: Option<Compose>,
        decode: DecodeOptions,
    ) -> FieldRecords {
        FieldRecords {
            dataset,
            fields: fields.into(),
            transform: transform.map(Arc::new),
            decode,
        }
    }

    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        &self.dataset
    }

    /// The fields, in the order of each record's values and of the batch's tensors.
    pub fn fields(&self) -> &Arc<[ShardField]> {
        &self.fields
    }

    /// The pipeline of the image field, if any.
    pub fn transform(&self) -> Option<&Compose> {
        self.transform.as_deref()
    }

    /// The image field's decoding options (the pixel limit).
    pub fn options(&self) -> &DecodeOptions {
        &self.decode
    }

    /// The collation of this dataset's items.
    pub fn collate(&self) -> RecordCollate {
        RecordCollate::new(self.fields.clone(), self.transform.clone(), self.decode)
    }

    fn float(&self, sample: &ShardSample, name: &str) -> Result<f64, DataError> {
        let bytes = sample.field(name).map_err(DataError::from)?;
        if self.dataset.spec().format == ShardFormat::Mds {
            use longshore_shards::mds::Value as V;
            return match sample.value(name).map_err(DataError::from)? {
                V::Float(f) => Ok(f),
                V::Int(i) => Ok(i as f64),
                V::UInt(u) => Ok(u as f64),
                V::Str(t) => t
                    .trim()
                    .parse()
                    .map_err(|_| fail(sample, name, format!("{t:?} is not a number"))),
                other => Err(fail(
                    sample,
                    name,
                    format!("{} is not a number", other.kind()),
                )),
            };
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| fail(sample, name, "is not UTF-8 text".into()))?;
        text.trim()
            .parse()
            .map_err(|_| fail(sample, name, format!("{text:?} is not a number")))
    }

    /// Field `name` as an array: an MDS `ndarray` column decoded by its encoding, any other
    /// field's bytes read as a `.npy` (what the Parquet reader makes of a list of numbers).
    fn array(&self, sample: &ShardSample, name: &str) -> Result<Value, DataError> {
        let bytes = sample.field(name).map_err(DataError::from)?;
        if self.dataset.spec().format == ShardFormat::Mds {
            use longshore_shards::mds::Value as V;
            return match sample.value(name).map_err(DataError::from)? {
                V::Array(t) => Ok(Value::Array(
                    t.dtype(),
                    t.shape().to_vec(),
                    t.bytes().to_vec(),
                )),
                other => Err(fail(
                    sample,
                    name,
                    format!("{} is not an array (an MDS ndarray column)", other.kind()),
                )),
            };
        }
        let (dtype, shape, data) = read_npy(bytes).map_err(|reason| fail(sample, name, reason))?;
        Ok(Value::Array(dtype, shape, data))
    }

    /// Checks that field `name` (present) parses as JSON, through the shard's own parser.
    fn check_json(sample: &ShardSample, name: &str) -> Result<(), DataError> {
        match sample.sample.json(name) {
            Ok(_) => Ok(()),
            Err(e) => {
                // The parser's message, without the shard's own prefix (this error names the
                // field as the others do).
                let reason = match &e {
                    ShardError::Sample { reason, .. } => reason
                        .strip_prefix(&format!("field .{name} is not JSON: "))
                        .unwrap_or(reason)
                        .to_owned(),
                    other => other.to_string(),
                };
                Err(fail(sample, name, format!("is not JSON: {reason}")))
            }
        }
    }

    /// Reads and checks one sample's fields: what each item of this dataset is.
    ///
    /// # Errors
    /// The [`ShardError`] of a missing field (naming the shard, the key and the field), or a
    /// [`ShardError::Sample`] naming the field whose value does not read as its kind.
    pub fn read(&self, mut sample: ShardSample) -> Result<FieldRecord, DataError> {
        let mut values = Vec::with_capacity(self.fields.len());
        let mut image = None;
        for (i, f) in self.fields.iter().enumerate() {
            let name = f.name.as_str();
            // The shard's error names the shard, the key and the missing field.
            let missing = |e: ShardError| DataError::custom("reading a sample's fields", e);
            values.push(match f.kind {
                FieldKind::Image => {
                    sample.field(name).map_err(missing)?;
                    image = Some(i);
                    Value::Var(Vec::new())
                }
                FieldKind::Int => {
                    sample.field(name).map_err(missing)?;
                    Value::Int(sample.int(name).map_err(DataError::from)?)
                }
                FieldKind::Float => Value::Float(self.float(&sample, name)?),
                FieldKind::Text => {
                    let bytes = sample.field(name).map_err(missing)?;
                    if let Err(e) = std::str::from_utf8(bytes) {
                        return Err(fail(&sample, name, format!("is not UTF-8 text: {e}")));
                    }
                    Value::Var(bytes.to_vec())
                }
                FieldKind::Json => {
                    let bytes = sample.field(name).map_err(missing)?.to_vec();
                    FieldRecords::check_json(&sample, name)?;
                    Value::Var(bytes)
                }
                FieldKind::Bytes => Value::Var(sample.field(name).map_err(missing)?.to_vec()),
                FieldKind::Array => {
                    sample.field(name).map_err(missing)?;
                    self.array(&sample, name)?
                }
            });
        }
        if let Some(i) = image {
            let name = &self.fields[i].name;
            let s = &mut sample.sample;
            let path = PathBuf::from(format!("{}#{}.{name}", s.url, s.key));
            values[i] = Value::Image(path, s.fields.remove(name).unwrap_or_default());
        }
        let origin = format!("{}#{}", sample.sample.url, sample.sample.key);
        Ok(FieldRecord {
            values,
            seed: sample.seed,
            origin,
        })
    }
}

/// A `.npy` file's dtype, shape and elements (in native byte order), or why it does not read.
fn read_npy(bytes: &[u8]) -> Result<(DType, Vec<usize>, Vec<u8>), String> {
    let header = parse_header(bytes).map_err(|e| format!("is not a .npy array: {e}"))?;
    let len = header
        .data_len()
        .map_err(|e| format!("is not a .npy array: {e}"))?;
    let data = bytes
        .get(header.data_offset..)
        .and_then(|d| d.get(..len))
        .ok_or_else(|| {
            format!(
                "is a truncated .npy array: {} bytes of data where its header ({} {:?}) needs {len}",
                bytes.len().saturating_sub(header.data_offset),
                header.dtype,
                header.shape
            )
        })?;
    let mut data = data.to_vec();
    if !header.byte_order.is_native() {
        swap_bytes_in_place(&mut data, header.dtype.size());
    }
    Ok((header.dtype, header.shape, data))
}

impl IterableDataset for FieldRecords {
    type Item = FieldRecord;

    longshore_data::forward_epoch_seam!(dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, FieldRecord> {
        Box::new(
            self.dataset
                .iter(worker)
                .map(move |item| item.and_then(|s| self.read(s))),
        )
    }
}
