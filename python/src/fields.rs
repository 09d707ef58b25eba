//! Sharded datasets read field by field (`fields=` of `WebDataset`, `StreamingDataset` and
//! `ParquetDataset`): [`FieldShards`], whose workers read each sample's named fields, and
//! [`FieldsCollate`], which writes them into the (pinned) batch.
//!
//! Fixed-size fields are one tensor each: an image `[B, ...]` decoded and transformed straight
//! into its slot (the dataset's pipeline), an int `[B]` (`i64`), a float `[B]` (`f64`). A
//! variable-length field (text, JSON, bytes) is two tensors: its samples' bytes concatenated
//! (`u8`) and their offsets (`i64`, `[B + 1]`). The epoch's delivery reads those two from host
//! memory ([`host_parts`]) before any copy to the device and turns them into Python lists
//! ([`shape_batch`]): `list[str]`, `list[bytes]`, or `json.loads` of each item.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longshore::data::rng::epoch_rng;
use longshore::data::{
    Batch, BatchLayout, Collate, DType, DataError, ItemIter, IterableDataset, Storage, WorkerInfo,
};
use longshore::shards::ShardError;
use longshore::shards::dataset::{ShardFormat, ShardSample, ShardedDataset};
use longshore::vision::{Compose, DecodeOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

/// How one field is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Decoded and transformed by the dataset's pipeline.
    Image,
    /// An integer ([`ShardSample::int`]).
    Int,
    /// A float (decimal text, or an MDS numeric column).
    Float,
    /// UTF-8 text, delivered as `str`.
    Text,
    /// JSON text, delivered as `json.loads` of it.
    Json,
    /// Raw bytes.
    Bytes,
}

impl Kind {
    const NAMES: [(&'static str, Kind); 6] = [
        ("image", Kind::Image),
        ("int", Kind::Int),
        ("float", Kind::Float),
        ("text", Kind::Text),
        ("json", Kind::Json),
        ("bytes", Kind::Bytes),
    ];

    /// Whether the field travels as bytes and offsets.
    pub(crate) fn variable(self) -> bool {
        matches!(self, Kind::Text | Kind::Json | Kind::Bytes)
    }
}

/// One requested field: its name (a WebDataset extension, an MDS or Parquet column) and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) name: String,
    pub(crate) kind: Kind,
}

/// The fields as Python gives them (`[(name, decoder)]`, in the dict's order), checked: known
/// decoders, at most one image, an image only with a pipeline.
pub(crate) fn parse_fields(
    fields: Vec<(String, String)>,
    has_transform: bool,
) -> PyResult<Arc<[Field]>> {
    if fields.is_empty() {
        return Err(PyValueError::new_err(
            "fields must name at least one field ({name: decoder})",
        ));
    }
    let mut out: Vec<Field> = Vec::with_capacity(fields.len());
    for (name, decoder) in fields {
        let Some(kind) = Kind::NAMES
            .iter()
            .find_map(|(n, k)| (*n == decoder).then_some(*k))
        else {
            return Err(PyValueError::new_err(format!(
                "fields: field {name:?} has an unknown decoder {decoder:?} (one of 'image', \
                 'int', 'float', 'text', 'json', 'bytes')"
            )));
        };
        if kind == Kind::Image {
            if let Some(other) = out.iter().find(|f| f.kind == Kind::Image) {
                return Err(PyValueError::new_err(format!(
                    "fields: two image fields, {:?} and {name:?}: at most one field is decoded \
                     as an image",
                    other.name
                )));
            }
            if !has_transform {
                return Err(PyValueError::new_err(format!(
                    "fields: image field {name:?} needs transform=Compose([..., ToTensor()]): \
                     images are decoded and batched in Rust, at a fixed output size"
                )));
            }
        }
        out.push(Field { name, kind });
    }
    Ok(out.into())
}

/// One field's value as a worker reads it.
#[derive(Debug)]
enum Value {
    /// The encoded image, and its name in errors (`shard-url#key.ext`).
    Image(PathBuf, Vec<u8>),
    Int(i64),
    Float(f64),
    /// Text, JSON or bytes (text and JSON checked).
    Var(Vec<u8>),
}

/// One sample's fields, in the requested order; what [`FieldShards`] yields.
#[derive(Debug)]
pub(crate) struct FieldSample {
    values: Vec<Value>,
    seed: u64,
}

/// A sharded dataset read field by field; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct FieldShards {
    dataset: ShardedDataset,
    fields: Arc<[Field]>,
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

impl FieldShards {
    pub(crate) fn new(
        dataset: ShardedDataset,
        fields: Arc<[Field]>,
        transform: Option<Compose>,
        decode: DecodeOptions,
    ) -> FieldShards {
        FieldShards {
            dataset,
            fields,
            transform: transform.map(Arc::new),
            decode,
        }
    }

    /// The collation of this dataset's items.
    pub(crate) fn collate(&self) -> FieldsCollate {
        FieldsCollate {
            fields: self.fields.clone(),
            transform: self.transform.clone(),
            decode: self.decode,
        }
    }

    fn float(&self, sample: &ShardSample, name: &str) -> Result<f64, DataError> {
        let bytes = sample.field(name).map_err(DataError::from)?;
        if self.dataset.spec().format == ShardFormat::Mds {
            use longshore::shards::mds::Value as V;
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

    /// Reads and checks one sample's fields: what each item of this dataset is.
    fn read(&self, mut sample: ShardSample) -> Result<FieldSample, DataError> {
        let mut values = Vec::with_capacity(self.fields.len());
        let mut image = None;
        for (i, f) in self.fields.iter().enumerate() {
            let name = f.name.as_str();
            // The shard's error names the shard, the key and the missing field.
            let missing = |e: ShardError| DataError::custom("reading a sample's fields", e);
            values.push(match f.kind {
                Kind::Image => {
                    sample.field(name).map_err(missing)?;
                    image = Some(i);
                    Value::Var(Vec::new())
                }
                Kind::Int => {
                    sample.field(name).map_err(missing)?;
                    Value::Int(sample.int(name).map_err(DataError::from)?)
                }
                Kind::Float => Value::Float(self.float(&sample, name)?),
                Kind::Text => {
                    let bytes = sample.field(name).map_err(missing)?;
                    if let Err(e) = std::str::from_utf8(bytes) {
                        return Err(fail(&sample, name, format!("is not UTF-8 text: {e}")));
                    }
                    Value::Var(bytes.to_vec())
                }
                Kind::Json => {
                    let bytes = sample.field(name).map_err(missing)?;
                    if let Err(e) = serde_json::from_slice::<serde_json::Value>(bytes) {
                        return Err(fail(&sample, name, format!("is not JSON: {e}")));
                    }
                    Value::Var(bytes.to_vec())
                }
                Kind::Bytes => Value::Var(sample.field(name).map_err(missing)?.to_vec()),
            });
        }
        if let Some(i) = image {
            let name = &self.fields[i].name;
            let s = &mut sample.sample;
            let path = PathBuf::from(format!("{}#{}.{name}", s.url, s.key));
            values[i] = Value::Image(path, s.fields.remove(name).unwrap_or_default());
        }
        Ok(FieldSample {
            values,
            seed: sample.seed,
        })
    }
}

impl IterableDataset for FieldShards {
    type Item = FieldSample;

    longshore::data::forward_epoch_seam!(dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, FieldSample> {
        Box::new(
            self.dataset
                .iter(worker)
                .map(move |item| item.and_then(|s| self.read(s))),
        )
    }
}

/// Writes [`FieldSample`]s into their batch: per field, in order, one tensor (image, int,
/// float) or two (bytes `u8`, offsets `i64 [B + 1]`).
#[derive(Debug, Clone)]
pub(crate) struct FieldsCollate {
    fields: Arc<[Field]>,
    transform: Option<Arc<Compose>>,
    decode: DecodeOptions,
}

thread_local! {
    /// An image slot for [`FieldsCollate::check_item`] (only on a failed batch).
    static SLOT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl FieldsCollate {
    fn pipeline(&self) -> Result<&Compose, DataError> {
        self.transform
            .as_deref()
            .ok_or_else(|| DataError::Other("an image field without a pipeline".into()))
    }

    fn decode_into(
        &self,
        path: &Path,
        bytes: &[u8],
        seed: u64,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let mut rng = epoch_rng(seed, 0);
        self.pipeline()?
            .decode_into(path, bytes, &self.decode, &mut rng, out)
    }
}

fn var(sample: &FieldSample, f: usize) -> &[u8] {
    match &sample.values[f] {
        Value::Var(b) => b,
        _ => &[],
    }
}

impl Collate<FieldSample> for FieldsCollate {
    fn layout(&self, samples: &[FieldSample]) -> Result<BatchLayout, DataError> {
        if samples.is_empty() {
            return Err(DataError::Empty { what: "batch" });
        }
        let n = samples.len();
        let mut layout = BatchLayout::new(n);
        for (i, f) in self.fields.iter().enumerate() {
            let name = Some(Arc::<str>::from(f.name.as_str()));
            match f.kind {
                Kind::Image => {
                    let field = self.pipeline()?.field();
                    let mut shape = vec![n];
                    shape.extend_from_slice(field.shape.dims());
                    layout.push(name, field.dtype, shape)?;
                }
                Kind::Int => {
                    layout.push(name, DType::I64, vec![n])?;
                }
                Kind::Float => {
                    layout.push(name, DType::F64, vec![n])?;
                }
                Kind::Text | Kind::Json | Kind::Bytes => {
                    let total = samples.iter().map(|s| var(s, i).len()).sum();
                    layout.push(name, DType::U8, vec![total])?;
                    let offsets = Some(Arc::<str>::from(format!("{}.offsets", f.name)));
                    layout.push(offsets, DType::I64, vec![n + 1])?;
                }
            }
        }
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[FieldSample],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        if layout.batch_size() != samples.len() || storage.len() < layout.total_bytes() {
            return Err(DataError::BufferTooSmall {
                what: "batch of sample fields",
                needed: layout.total_bytes(),
                got: storage.len(),
            });
        }
        let out = &mut storage[..layout.total_bytes()];
        // The alignment gaps: never stale bytes.
        let mut end = 0;
        for t in layout.tensors() {
            out[end..t.offset].fill(0);
            end = t.offset + t.len;
        }
        let mut tensors = layout.tensors().iter();
        let mut next = || {
            tensors
                .next()
                .map(|t| t.range())
                .ok_or_else(|| DataError::ShapeMismatch("a layout with too few tensors".into()))
        };
        for (i, f) in self.fields.iter().enumerate() {
            match f.kind {
                Kind::Image => {
                    let range = next()?;
                    let per = self.pipeline()?.output_bytes();
                    if range.len() != per * samples.len() {
                        return Err(DataError::ShapeMismatch(format!(
                            "image field {:?}: {} bytes for {} images of {per}",
                            f.name,
                            range.len(),
                            samples.len()
                        )));
                    }
                    for (s, slot) in samples.iter().zip(out[range].chunks_exact_mut(per.max(1))) {
                        if let Value::Image(path, bytes) = &s.values[i] {
                            self.decode_into(path, bytes, s.seed, slot)?;
                        }
                    }
                }
                Kind::Int | Kind::Float => {
                    let range = next()?;
                    for (s, slot) in samples.iter().zip(out[range].chunks_exact_mut(8)) {
                        let bytes = match s.values[i] {
                            Value::Int(v) => v.to_ne_bytes(),
                            Value::Float(v) => v.to_ne_bytes(),
                            _ => [0; 8],
                        };
                        slot.copy_from_slice(&bytes);
                    }
                }
                Kind::Text | Kind::Json | Kind::Bytes => {
                    let (data, offsets) = (next()?, next()?);
                    let mut at = data.start;
                    let mut off = 0i64;
                    let start = offsets.start;
                    out[start..start + 8].copy_from_slice(&off.to_ne_bytes());
                    for (k, s) in samples.iter().enumerate() {
                        let b = var(s, i);
                        out[at..at + b.len()].copy_from_slice(b);
                        at += b.len();
                        off += i64::try_from(b.len())
                            .map_err(|_| DataError::Overflow("field bytes"))?;
                        let o = start + 8 * (k + 1);
                        out[o..o + 8].copy_from_slice(&off.to_ne_bytes());
                    }
                }
            }
        }
        Batch::from_parts(layout, storage)
    }

    fn check_item(&self, item: &FieldSample) -> Result<(), DataError> {
        for v in &item.values {
            if let Value::Image(path, bytes) = v {
                let per = self.pipeline()?.output_bytes();
                SLOT.with_borrow_mut(|slot| {
                    slot.resize(per, 0);
                    self.decode_into(path, bytes, item.seed, slot)
                })?;
            }
        }
        Ok(())
    }
}

/// One variable-length field of a host batch: its bytes and offsets.
pub(crate) type VarPart = (Vec<u8>, Vec<i64>);

/// The variable-length fields' bytes and offsets of a host batch whose tensors are `fields`'
/// (read before any copy to the device).
pub(crate) fn host_parts(
    fields: &[Field],
    batch: &Batch<impl Storage>,
) -> Result<Vec<VarPart>, DataError> {
    let mut parts = Vec::new();
    let mut t = 0;
    for f in fields {
        if !f.kind.variable() {
            t += 1;
            continue;
        }
        let data = batch.tensor_bytes(t)?.to_vec();
        let offsets = batch.tensor::<i64>(t + 1)?.to_vec();
        parts.push((data, offsets));
        t += 2;
    }
    Ok(parts)
}

/// Which of a fields batch's tensors are fixed-size fields (converted to tensors for Python).
pub(crate) fn fixed_tensors(fields: &[Field]) -> Vec<bool> {
    fields
        .iter()
        .flat_map(|f| {
            if f.kind.variable() {
                vec![false, false]
            } else {
                vec![true]
            }
        })
        .collect()
}

/// A batch as Python receives it: a dict by field name, in field order, of the converted
/// fixed-size tensors (`fixed`, in order) and the lists made of the variable-length parts.
pub(crate) fn shape_batch(
    py: Python<'_>,
    fields: &[Field],
    fixed: Vec<Bound<'_, PyAny>>,
    parts: Vec<VarPart>,
) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    let mut fixed = fixed.into_iter();
    let mut parts = parts.into_iter();
    let mut loads = None;
    for f in fields {
        if !f.kind.variable() {
            let value = fixed
                .next()
                .ok_or_else(|| PyValueError::new_err("a fields batch with too few tensors"))?;
            dict.set_item(&f.name, value)?;
            continue;
        }
        let (data, offsets) = parts
            .next()
            .ok_or_else(|| PyValueError::new_err("a fields batch without its bytes"))?;
        let list = PyList::empty(py);
        for w in offsets.windows(2) {
            let (a, b) = (usize::try_from(w[0]), usize::try_from(w[1]));
            let item = match (a, b) {
                (Ok(a), Ok(b)) if a <= b && b <= data.len() => &data[a..b],
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "field {:?}: offsets out of range",
                        f.name
                    )));
                }
            };
            match f.kind {
                Kind::Bytes => list.append(PyBytes::new(py, item))?,
                Kind::Text | Kind::Json => {
                    let text = std::str::from_utf8(item).map_err(|e| {
                        PyValueError::new_err(format!("field {:?}: not UTF-8: {e}", f.name))
                    })?;
                    let s = PyString::new(py, text);
                    if f.kind == Kind::Json {
                        let loads = match &loads {
                            Some(l) => l,
                            None => loads.insert(py.import("json")?.getattr("loads")?),
                        };
                        list.append(loads.call1((s,))?)?;
                    } else {
                        list.append(s)?;
                    }
                }
                _ => {}
            }
        }
        dict.set_item(&f.name, list)?;
    }
    Ok(dict.into_any().unbind())
}
