//! The built-in datasets, as Python classes: `.npy` files (one, or several zipped into
//! fields, optionally normalised) and fixed-size record files.

use std::path::PathBuf;
use std::sync::Arc;

use longshore::data::{
    DType, DataError, Dataset, DirectCollate, DirectDataset, FieldSpec, ImageLayout, Normalize,
    NpyDataset, RecordDataset, RecordLayout, Tensor, Zip,
};
use pyo3::prelude::*;

use crate::errors::data_err;

/// What one sample of any built-in dataset turns into when read by index: its fields.
pub(crate) trait IntoFields {
    fn into_fields(self, out: &mut Vec<Tensor>);
}

impl IntoFields for Tensor {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        out.push(self)
    }
}

impl IntoFields for Vec<Tensor> {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        out.extend(self)
    }
}

impl<A: IntoFields, B: IntoFields> IntoFields for (A, B) {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        self.0.into_fields(out);
        self.1.into_fields(out);
    }
}

/// A direct dataset whose items are read as a list of fields, so that datasets of any shape
/// (one file, several zipped, records) share one type behind the loader.
#[derive(Debug)]
pub(crate) struct Fields<D>(pub(crate) D);

impl<D: DirectDataset> Dataset for Fields<D>
where
    D::Item: IntoFields,
{
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let mut out = Vec::new();
        self.0.get(index)?.into_fields(&mut out);
        Ok(out)
    }
}

impl<D: DirectDataset> DirectDataset for Fields<D>
where
    D::Item: IntoFields,
{
    fn fields(&self) -> &[FieldSpec] {
        self.0.fields()
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        self.0.get_field_into(index, field, out)
    }
}

/// Any built-in dataset, read field by field straight into a batch.
pub(crate) type AnyDataset = Arc<dyn DirectDataset<Item = Vec<Tensor>>>;

/// What a Python dataset object stands for: a dataset whose fields are written straight into
/// the batch by a [`DirectCollate`], with a fused [`Normalize`] on the image field when asked.
#[derive(Clone)]
pub(crate) struct Source {
    pub(crate) dataset: AnyDataset,
    pub(crate) collate: DirectCollate,
}

impl Source {
    fn direct(dataset: AnyDataset) -> Source {
        Source {
            dataset,
            collate: DirectCollate::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.dataset.len()
    }
}

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
        Ok(Self { source, files })
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
