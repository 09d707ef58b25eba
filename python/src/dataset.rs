//! The built-in datasets, as Python classes: `.npy` files (one, or several zipped into
//! fields, optionally normalised), fixed-size record files, and `longshore.data`'s native
//! datasets ([`PyNative`]): in-memory arrays (`ArrayDataset`, `TensorDataset`) and `Subset` /
//! `ConcatDataset` over any built-in dataset, read by the loader's worker threads like the
//! files are.

use std::path::PathBuf;
use std::sync::Arc;

use longshore::data::{
    AlignedBuf, ConcatDataset, DType, DataError, Dataset, DirectCollate, DirectDataset, FieldSpec,
    ImageLayout, Normalize, NpyDataset, RecordDataset, RecordLayout, Shape, Subset, Tensor, Zip,
};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::data_err;
use crate::source::{AnyDataset, BatchForm, Fields, Native, Source};
use crate::vision::PyImageFolder;

fn paths_of(paths: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if let Ok(p) = paths.extract::<PathBuf>() {
        return Ok(vec![p]);
    }
    let mut out = Vec::new();
    for item in paths.try_iter()? {
        out.push(item?.extract::<PathBuf>()?);
    }
    if out.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "NpyDataset needs at least one .npy file",
        ));
    }
    Ok(out)
}

/// A dataset over memory-mapped `.npy` files: sample `i` is row `i` of each file (one file:
/// one tensor per sample; several: one field per file, like zipping them). With
/// `normalize=(mean, std)`, a single `u8 [N, C, H, W]` file is normalised to `f32`
/// (`(x / 255 - mean[c]) / std[c]`) while collating.
#[pyclass(name = "NpyDataset", module = "longshore", frozen)]
pub(crate) struct PyNpyDataset {
    pub(crate) source: Source,
    files: Vec<PathBuf>,
    /// Whether the collate normalises (`normalize=`): such a dataset's fields are not what
    /// its batches hold, so it is not concatenated with others.
    normalized: bool,
}

impl PyNpyDataset {
    /// Whether a sample is one tensor (one file) rather than several fields.
    pub(crate) fn is_single(&self) -> bool {
        self.files.len() == 1
    }
}

#[pymethods]
impl PyNpyDataset {
    #[new]
    #[pyo3(signature = (paths, *, normalize = None))]
    fn new(paths: &Bound<'_, PyAny>, normalize: Option<(Vec<f32>, Vec<f32>)>) -> PyResult<Self> {
        let files = paths_of(paths)?;
        let normalized = normalize.is_some();
        let py = paths.py();
        let source = py
            .detach(|| -> Result<Source, DataError> {
                if let Some((mean, std)) = normalize {
                    if files.len() != 1 {
                        return Err(DataError::InvalidArgument {
                            name: "normalize",
                            reason: format!(
                                "normalize applies to one image file, {} were given",
                                files.len()
                            ),
                        });
                    }
                    let ds = NpyDataset::open(&files[0])?;
                    let normalize = Normalize::new(&mean, &std, ImageLayout::Chw)?;
                    check_images(&ds, mean.len())?;
                    return Ok(Source {
                        dataset: Arc::new(Fields(ds)),
                        collate: DirectCollate::new().with_transform(0, normalize),
                    });
                }
                let mut it = files.iter();
                let first = NpyDataset::open(it.next().expect("at least one file"))?;
                let mut acc: AnyDataset = Arc::new(Fields(first));
                for p in it {
                    let next: AnyDataset = Arc::new(Fields(NpyDataset::open(p)?));
                    acc = Arc::new(Fields(Zip::direct(acc, next)?));
                }
                Ok(Source::direct(acc))
            })
            .map_err(data_err)?;
        Ok(Self {
            source,
            files,
            normalized,
        })
    }

    fn __len__(&self) -> usize {
        self.source.len()
    }

    fn __repr__(&self) -> String {
        format!("NpyDataset({:?}, len={})", self.files, self.source.len())
    }
}

/// A dataset over a file of fixed-size records, each holding the same fields:
/// `RecordDataset(path, [("image", "u8", (3, 32, 32)), ("label", "i64", ())])`, packed in
/// that order after `header_bytes` bytes of header. Dtypes use NumPy's names or codes.
#[pyclass(name = "RecordDataset", module = "longshore", frozen)]
pub(crate) struct PyRecordDataset {
    pub(crate) source: Source,
    path: PathBuf,
}

fn dtype_of(name: &str) -> Result<DType, DataError> {
    let code = match name {
        "bool" => "b1",
        "uint8" => "u1",
        "int8" => "i1",
        "uint16" => "u2",
        "int16" => "i2",
        "uint32" => "u4",
        "int32" => "i4",
        "uint64" => "u8",
        "int64" => "i8",
        "float16" => "f2",
        "float32" => "f4",
        "float64" => "f8",
        "u8" => "u1",
        "i8" => "i1",
        "u16" => "u2",
        "i16" => "i2",
        "u32" => "u4",
        "i32" => "i4",
        "u64" => "u8",
        "i64" => "i8",
        "f16" => "f2",
        "f32" => "f4",
        "f64" => "f8",
        other => other,
    };
    DType::from_npy_code(code.trim_start_matches(['<', '|', '='])).ok_or_else(|| {
        DataError::InvalidArgument {
            name: "fields",
            reason: format!("unknown dtype {name:?}"),
        }
    })
}

#[pymethods]
impl PyRecordDataset {
    #[new]
    #[pyo3(signature = (path, fields, *, header_bytes = 0))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        fields: Vec<(String, String, Vec<usize>)>,
        header_bytes: usize,
    ) -> PyResult<Self> {
        let source = py
            .detach(|| -> Result<Source, DataError> {
                let specs = fields
                    .iter()
                    .map(|(n, d, s)| Ok((n.as_str(), dtype_of(d)?, s.as_slice())))
                    .collect::<Result<Vec<_>, DataError>>()?;
                let layout = RecordLayout::packed(&specs)?.header_bytes(header_bytes);
                let ds = RecordDataset::open(&path, layout)?;
                Ok(Source::direct(Arc::new(Fields(ds))))
            })
            .map_err(data_err)?;
        Ok(Self { source, path })
    }

    fn __len__(&self) -> usize {
        self.source.len()
    }

    fn __repr__(&self) -> String {
        format!("RecordDataset({:?}, len={})", self.path, self.source.len())
    }
}

/// Checks that `dataset` holds `u8 [N, channels, H, W]` images, naming the file otherwise.
fn check_images(dataset: &NpyDataset, channels: usize) -> Result<(), DataError> {
    if dataset.array().dtype() != DType::U8
        || dataset.row_shape().len() != 3
        || dataset.row_shape()[0] != channels
    {
        return Err(DataError::ShapeMismatch(format!(
            "normalize needs u8 rows of shape [{channels}, H, W] in {}, got {} rows of shape {:?}",
            dataset.array().path().display(),
            dataset.array().dtype(),
            dataset.row_shape()
        )));
    }
    Ok(())
}

/// The native form of `dataset`: a built-in dataset, a [`PyNative`], or a Python object whose
/// `_native` attribute is one (`datasets.ImageFolder`, `datasets.TokenDataset`,
/// `longshore.data`'s classes, and `_TokenSequences` and `_Mixture` themselves, whose
/// `_native` is a [`PyNative`]: this module knows no class above it); `None` for anything else
/// (a Python dataset, which longshore's Rust workers cannot read).
pub(crate) fn native_of(dataset: &Bound<'_, PyAny>) -> PyResult<Option<Native>> {
    if let Ok(d) = dataset.cast::<PyNpyDataset>() {
        let d = d.get();
        return Ok(Some(Native {
            source: d.source.clone(),
            form: if d.is_single() {
                BatchForm::Single
            } else {
                BatchForm::List
            },
            transformed: d.normalized,
        }));
    }
    if let Ok(d) = dataset.cast::<PyRecordDataset>() {
        return Ok(Some(Native {
            source: d.get().source.clone(),
            form: BatchForm::List,
            transformed: false,
        }));
    }
    if let Ok(d) = dataset.cast::<PyImageFolder>() {
        let source = d.get().source.clone().ok_or_else(|| {
            PyValueError::new_err(
                "an ImageFolder without a transform yields PIL images in torchvision, which \
                 cannot be batched: give it transform=Compose([..., ToTensor()])",
            )
        })?;
        return Ok(Some(Native {
            source,
            form: BatchForm::List,
            transformed: false,
        }));
    }
    if let Ok(d) = dataset.cast::<PyNative>() {
        return Ok(Some(d.get().native.clone()));
    }
    // A Python wrapper (not a string, whose attributes are no dataset).
    if !dataset.is_instance_of::<pyo3::types::PyString>()
        && let Ok(inner) = dataset.getattr("_native")
        && !inner.is(dataset)
        && !inner.is_none()
    {
        return native_of(&inner);
    }
    Ok(None)
}

/// `native_of`, or a `TypeError` naming what `what` (a class of `longshore.data`) takes.
pub(crate) fn native_part(dataset: &Bound<'_, PyAny>, what: &str) -> PyResult<Native> {
    native_of(dataset)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what} over a {} runs in Python, not in longshore's Rust workers",
            dataset
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// In-memory arrays, one field per array: sample `i` is row `i` of each (the first dimension
/// counts the samples), as `torch.utils.data.TensorDataset` indexes its tensors. The rows are
/// copied once, into memory the workers read without Python.
#[derive(Debug)]
pub(crate) struct Arrays {
    fields: Vec<FieldSpec>,
    /// Bytes of one row of each field.
    row_bytes: Vec<usize>,
    data: Vec<AlignedBuf>,
    len: usize,
}

impl Arrays {
    fn row(&self, index: usize, field: usize) -> Result<&[u8], DataError> {
        if index >= self.len {
            return Err(DataError::IndexOutOfRange {
                index,
                len: self.len,
                what: "array dataset",
            });
        }
        let rb = *self
            .row_bytes
            .get(field)
            .ok_or(DataError::IndexOutOfRange {
                index: field,
                len: self.fields.len(),
                what: "fields of the array dataset",
            })?;
        Ok(&self.data[field][index * rb..(index + 1) * rb])
    }
}

impl Dataset for Arrays {
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        (0..self.fields.len())
            .map(|f| {
                let spec = &self.fields[f];
                Tensor::from_bytes(spec.dtype, spec.shape.dims(), self.row(index, f)?)
            })
            .collect()
    }
}

impl DirectDataset for Arrays {
    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let row = self.row(index, field)?;
        if out.len() != row.len() {
            return Err(DataError::BufferTooSmall {
                what: "a field of the array dataset",
                needed: row.len(),
                got: out.len(),
            });
        }
        out.copy_from_slice(row);
        Ok(())
    }
    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        self.row(index, field).map(Some)
    }
}

/// A native dataset of `longshore.data`: in-memory arrays, or a subset or concatenation of
/// native datasets. The Python classes (`ArrayDataset`, `Subset`, ...) hold one as `_native`.
#[pyclass(name = "_Native", module = "longshore", frozen)]
pub(crate) struct PyNative {
    native: Native,
    what: &'static str,
}

impl PyNative {
    /// `native` as a `_Native` (what another native class's `_native` attribute returns,
    /// so that [`native_of`] reads it without knowing that class).
    pub(crate) fn wrap(native: Native, what: &'static str) -> PyNative {
        PyNative { native, what }
    }
}

#[pymethods]
impl PyNative {
    /// In-memory arrays of `len` rows: `fields` lists each array's NumPy dtype (native byte
    /// order), row shape, and its C-ordered bytes as an iterable of `bytes` chunks (so that a
    /// large array is never copied whole into one Python object).
    #[staticmethod]
    fn arrays(len: usize, fields: Vec<(String, Vec<usize>, Bound<'_, PyAny>)>) -> PyResult<Self> {
        let mut specs = Vec::with_capacity(fields.len());
        let mut row_bytes = Vec::with_capacity(fields.len());
        let mut data = Vec::with_capacity(fields.len());
        for (i, (dtype, shape, chunks)) in fields.iter().enumerate() {
            let spec = FieldSpec {
                dtype: dtype_of(dtype).map_err(data_err)?,
                shape: Shape::new(shape).map_err(data_err)?,
            };
            let rb = spec.nbytes().map_err(data_err)?;
            let total = rb.checked_mul(len).ok_or_else(|| {
                PyValueError::new_err(format!("array {i} is too large ({len} rows of {rb} bytes)"))
            })?;
            let mut buf = AlignedBuf::zeroed(total);
            let mut at = 0;
            for chunk in chunks.try_iter()? {
                let chunk = chunk?;
                let bytes = chunk.cast::<PyBytes>()?.as_bytes();
                let end = at + bytes.len();
                if end > total {
                    return Err(PyValueError::new_err(format!(
                        "array {i} has more than the {total} bytes its dtype and shape imply"
                    )));
                }
                buf[at..end].copy_from_slice(bytes);
                at = end;
            }
            if at != total {
                return Err(PyValueError::new_err(format!(
                    "array {i} has {at} bytes, its dtype and shape imply {total}"
                )));
            }
            specs.push(spec);
            row_bytes.push(rb);
            data.push(buf);
        }
        let arrays = Arrays {
            fields: specs,
            row_bytes,
            data,
            len,
        };
        Ok(Self {
            native: Native {
                source: Source::direct(Arc::new(arrays)),
                form: BatchForm::List,
                transformed: false,
            },
            what: "ArrayDataset",
        })
    }

    /// The samples of `dataset` (a native dataset) at `indices` (packed native-endian int64,
    /// negative ones counting from the end).
    #[staticmethod]
    fn subset(dataset: &Bound<'_, PyAny>, indices: &Bound<'_, PyBytes>) -> PyResult<Self> {
        let inner = native_part(dataset, "Subset")?;
        let len = inner.source.len();
        let idx = crate::sampler::unpack(indices.as_bytes(), len)?;
        if let Some(&bad) = idx.iter().find(|&&i| i >= len) {
            return Err(PyIndexError::new_err(format!(
                "Subset index {bad} is out of range for a dataset of {len} samples"
            )));
        }
        let Source { dataset, collate } = inner.source;
        let subset = Subset::new(dataset, idx).map_err(data_err)?;
        Ok(Self {
            native: Native {
                source: Source {
                    dataset: Arc::new(subset),
                    collate,
                },
                form: inner.form,
                transformed: inner.transformed,
            },
            what: "Subset",
        })
    }

    /// `datasets` (native datasets whose samples have the same fields) one after another.
    #[staticmethod]
    fn concat(datasets: Vec<Bound<'_, PyAny>>) -> PyResult<Self> {
        let parts = datasets
            .iter()
            .map(|d| native_part(d, "ConcatDataset"))
            .collect::<PyResult<Vec<_>>>()?;
        let Some(first) = parts.first() else {
            return Err(PyValueError::new_err(
                "datasets should not be an empty iterable",
            ));
        };
        for (i, p) in parts.iter().enumerate() {
            if p.transformed {
                return Err(PyValueError::new_err(
                    "ConcatDataset over NpyDataset(normalize=...) is not supported: \
                     concatenate the raw datasets",
                ));
            }
            let (a, b) = (p.source.dataset.fields(), first.source.dataset.fields());
            if a != b || p.form != first.form {
                return Err(PyValueError::new_err(format!(
                    "ConcatDataset: dataset {i} has fields {a:?} ({}), dataset 0 has {b:?} \
                     ({}); longshore batches need the same fields in every sample",
                    p.form.describe(),
                    first.form.describe()
                )));
            }
        }
        let collate = first.source.collate.clone();
        let form = first.form.clone();
        let concat = ConcatDataset::new(parts.into_iter().map(|p| p.source.dataset).collect())
            .map_err(data_err)?;
        Ok(Self {
            native: Native {
                source: Source {
                    dataset: Arc::new(concat),
                    collate,
                },
                form,
                transformed: false,
            },
            what: "ConcatDataset",
        })
    }

    /// The dtype (NumPy's code) and per-sample shape of each field.
    fn fields(&self) -> Vec<(String, Vec<usize>)> {
        self.native
            .source
            .dataset
            .fields()
            .iter()
            .map(|f| (f.dtype.npy_code().to_owned(), f.shape.dims().to_vec()))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.native.source.len()
    }

    fn __repr__(&self) -> String {
        format!("_Native({}, len={})", self.what, self.native.source.len())
    }
}
