//! Sharded datasets read field by field (`fields=` of `WebDataset`, `StreamingDataset` and
//! `ParquetDataset`): the vision crate's [`FieldShards`] (`FieldRecords`), whose workers read
//! each sample's named fields, and its collation (`RecordCollate`), which writes them into the
//! (pinned) batch; here, the fields parsed from Python and the batches shaped for it.
//!
//! Fixed-size fields are one tensor each: an image `[B, ...]` decoded and transformed straight
//! into its slot (the dataset's pipeline), an int `[B]` (`i64`), a float `[B]` (`f64`), an
//! array `[B, ...]` of its own dtype (the samples' arrays stacked). A
//! variable-length field (text, JSON, bytes) is two tensors: its samples' bytes concatenated
//! (`u8`) and their offsets (`i64`, `[B + 1]`). The epoch's delivery reads those two from host
//! memory ([`host_parts`]) before any copy to the device and turns them into Python lists
//! ([`shape_batch`]): `list[str]`, `list[bytes]`, or `json.loads` of each item.

use std::sync::Arc;

use longshore::data::{Batch, DataError, Storage};
pub(crate) use longshore::vision::shards::fields::{
    FieldKind as Kind, FieldRecords as FieldShards, ShardField as Field,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

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
        let Some(kind) = Kind::from_name(&decoder) else {
            return Err(PyValueError::new_err(format!(
                "fields: field {name:?} has an unknown decoder {decoder:?} (one of 'image', \
                 'int', 'float', 'text', 'json', 'bytes', 'array')"
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
        out.push(Field::new(name, kind));
    }
    Ok(out.into())
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
        if !f.kind.is_variable() {
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
            if f.kind.is_variable() {
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
        if !f.kind.is_variable() {
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

/// NumPy's `dtype.str` of `dtype` in native byte order (`"<f4"`, `"|u1"`).
fn npy_str(dtype: longshore::data::DType) -> String {
    let order = if dtype.size() == 1 {
        '|'
    } else if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    format!("{order}{}", dtype.npy_code())
}

/// One field of a record as the Python worker gets it (see [`PyRecordIter`]).
enum Out {
    /// The pipeline's output bytes (its dtype and shape are the dataset's).
    Image(Vec<u8>),
    Int(i64),
    Float(f64),
    Text(String),
    Json(String),
    Bytes(Vec<u8>),
    Array(longshore::data::DType, Vec<usize>, Vec<u8>),
}

/// A record's fields in field order, and its shard and key.
type Rendered = (Vec<Out>, String);

/// One worker's records rendered for Python (images decoded by the pipeline), read by a Rust
/// thread a few records ahead.
fn render(
    collate: &longshore::vision::shards::fields::RecordCollate,
    fields: &[Field],
    record: &longshore::vision::shards::fields::FieldRecord,
) -> Result<Rendered, DataError> {
    let mut out = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        let text = |i| String::from_utf8_lossy(record.bytes(i).unwrap_or_default()).into_owned();
        out.push(match f.kind {
            Kind::Image => Out::Image(collate.decode_image(record, i)?.unwrap_or_default()),
            Kind::Int => Out::Int(record.int(i).unwrap_or_default()),
            Kind::Float => Out::Float(record.float(i).unwrap_or_default()),
            Kind::Text => Out::Text(text(i)),
            Kind::Json => Out::Json(text(i)),
            Kind::Bytes => Out::Bytes(record.bytes(i).unwrap_or_default().to_vec()),
            Kind::Array => match record.array(i) {
                Some((dtype, shape, data)) => Out::Array(dtype, shape.to_vec(), data.to_vec()),
                None => Out::Bytes(Vec::new()),
            },
            _ => Out::Bytes(record.bytes(i).unwrap_or_default().to_vec()),
        });
    }
    Ok((out, record.origin().to_owned()))
}

/// The records of one worker's stream of an epoch (`_Shards.records`): an iterator of dicts
/// `{field: value}` plus `"__key__"` (`shard#key`): an image as `(bytes, dtype, shape)` of the
/// pipeline's output, an array as `(bytes, dtype, shape)` (NumPy's `dtype.str`, native byte
/// order), text and JSON as `str` (`longshore.datasets` turns arrays into NumPy arrays and
/// JSON into objects), ints, floats and bytes as they are.
#[pyclass(name = "_RecordIter", module = "longshore")]
pub(crate) struct PyRecordIter {
    rx: crossbeam_channel::Receiver<Result<Rendered, DataError>>,
    fields: Arc<[Field]>,
    image: (String, Vec<usize>),
}

impl PyRecordIter {
    /// Worker `worker` of `num_workers`'s stream of `records`' epoch `epoch`, laid out in
    /// batches of `batch_size` (`drop_last`), read by a thread of its own.
    pub(crate) fn start(
        records: FieldShards,
        epoch: u64,
        worker: usize,
        num_workers: usize,
        batch_size: usize,
        drop_last: bool,
    ) -> PyResult<PyRecordIter> {
        use longshore::data::{EpochLayout, IterableDataset, WorkerInfo};
        let layout = EpochLayout::new(epoch, 0, batch_size.max(1), drop_last, num_workers);
        records
            .begin_epoch(&layout, None)
            .map_err(crate::errors::data_err)?;
        let info = WorkerInfo::new(worker, num_workers.max(1), 0)
            .map_err(crate::errors::data_err)?
            .with_epoch(epoch);
        let fields = records.fields().clone();
        let image = records
            .transform()
            .map_or((String::new(), Vec::new()), |c| {
                let f = c.field();
                (npy_str(f.dtype), f.shape.dims().to_vec())
            });
        let (tx, rx) = crossbeam_channel::bounded(8);
        let names = fields.clone();
        std::thread::Builder::new()
            .name("longshore-records".into())
            .spawn(move || {
                let collate = records.collate();
                for item in records.iter(info) {
                    let out = item.and_then(|r| render(&collate, &names, &r));
                    if tx.send(out).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| PyValueError::new_err(format!("cannot start a reader thread: {e}")))?;
        Ok(PyRecordIter { rx, fields, image })
    }
}

#[pymethods]
impl PyRecordIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rx = self.rx.clone();
        let (values, key) = match py.detach(move || rx.recv()) {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(crate::errors::data_err(e)),
            Err(_) => return Err(pyo3::exceptions::PyStopIteration::new_err(())),
        };
        let dict = PyDict::new(py);
        dict.set_item("__key__", key)?;
        for (f, v) in self.fields.iter().zip(values) {
            let value: Bound<'_, PyAny> = match v {
                Out::Image(b) => (PyBytes::new(py, &b), &self.image.0, self.image.1.clone())
                    .into_pyobject(py)?
                    .into_any(),
                Out::Array(dtype, shape, b) => (PyBytes::new(py, &b), npy_str(dtype), shape)
                    .into_pyobject(py)?
                    .into_any(),
                Out::Int(x) => x.into_pyobject(py)?.into_any(),
                Out::Float(x) => x.into_pyobject(py)?.into_any(),
                Out::Text(t) | Out::Json(t) => PyString::new(py, &t).into_any(),
                Out::Bytes(b) => PyBytes::new(py, &b).into_any(),
            };
            dict.set_item(&f.name, value)?;
        }
        Ok(dict.into_any().unbind())
    }
}
