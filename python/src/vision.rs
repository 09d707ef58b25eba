//! `longshore._ImageFolder`: torchvision's `ImageFolder` over `longshore-vision`, with a
//! transform pipeline given as plain step descriptions (the Python `longshore.transforms`
//! classes check torchvision's rules and produce them), decoded and transformed by the
//! loader's workers straight into the batch.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use longshore::data::{DType, DataError, Dataset, DirectCollate, ImageLayout, Tensor};
use longshore::nvjpeg::EncodedImages;
use longshore::vision::transforms::{
    CenterCrop, Interpolation, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize,
};
use longshore::vision::{
    Compose, DecodeOptions, ImageDataset, ImageFolder, ImageFolderOptions, Output, RandomSource,
    Step,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::data_err;
use crate::source::{Fields, IntoFields, Source};

impl IntoFields for i64 {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        out.push(Tensor::scalar(self))
    }
}

fn interpolation(name: &str) -> PyResult<Interpolation> {
    match name {
        "bilinear" => Ok(Interpolation::Bilinear),
        "bicubic" => Ok(Interpolation::Bicubic),
        "nearest" => Ok(Interpolation::Nearest),
        other => Err(PyValueError::new_err(format!(
            "interpolation {other:?} is not supported: use bilinear, bicubic or nearest"
        ))),
    }
}

/// `("random_resized_crop", (h, w), (smin, smax), (rmin, rmax), interpolation)`.
type RrcDesc = (String, (usize, usize), (f64, f64), (f64, f64), String);

/// One step from its description: `("random_resized_crop", (h, w), (smin, smax), (rmin,
/// rmax), interp)`, `("resize", size, max_size, interp)` with `size` an int (shorter side) or
/// `(h, w)`, `("center_crop", (h, w))`, `("hflip", p)`.
fn step(desc: &Bound<'_, PyTuple>) -> PyResult<Step> {
    let kind: String = desc.get_item(0)?.extract()?;
    let s: Result<Step, DataError> = match kind.as_str() {
        "random_resized_crop" => {
            let (_, (h, w), (smin, smax), (rmin, rmax), interp): RrcDesc = desc.extract()?;
            let interp = interpolation(&interp)?;
            RandomResizedCrop::with_size(h, w)
                .and_then(|t| t.scale(smin, smax))
                .and_then(|t| t.ratio(rmin, rmax))
                .map(|t| t.interpolation(interp).into())
        }
        "resize" => {
            let (_, size, max_size, interp): (String, Bound<'_, PyAny>, Option<usize>, String) =
                desc.extract()?;
            let interp = interpolation(&interp)?;
            let r = if let Ok(s) = size.extract::<usize>() {
                Resize::new(s)
            } else {
                let (h, w): (usize, usize) = size.extract()?;
                Resize::exact(h, w)
            };
            r.and_then(|r| match max_size {
                Some(m) => r.max_size(m),
                None => Ok(r),
            })
            .map(|r| r.interpolation(interp).into())
        }
        "center_crop" => {
            let (_, (h, w)): (String, (usize, usize)) = desc.extract()?;
            CenterCrop::with_size(h, w).map(Into::into)
        }
        "hflip" => {
            let (_, p): (String, f64) = desc.extract()?;
            RandomHorizontalFlip::new(p, ImageLayout::Hwc).map(Into::into)
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown transform step {other:?}"
            )));
        }
    };
    s.map_err(data_err)
}

/// The output from its description: `("normalize", mean[3], std[3])`, `("to_tensor",)` or
/// `("u8_chw",)`.
fn output(desc: &Bound<'_, PyTuple>) -> PyResult<Output> {
    let kind: String = desc.get_item(0)?.extract()?;
    match kind.as_str() {
        "normalize" => {
            let (_, mean, std): (String, [f32; 3], [f32; 3]) = desc.extract()?;
            Normalize::new(&mean, &std, ImageLayout::Hwc)
                .map(Output::Normalized)
                .map_err(data_err)
        }
        "to_tensor" => Ok(Output::to_tensor()),
        "u8_chw" => Ok(Output::U8Chw),
        other => Err(PyValueError::new_err(format!("unknown output {other:?}"))),
    }
}

/// The pipeline of `steps` and `output` (as `longshore.transforms.Compose._plan()` describes
/// it), `None` for neither; a `ValueError` when the Rust pipeline cannot express it.
pub(crate) fn compose_of(
    steps: Option<Vec<Bound<'_, PyTuple>>>,
    output: Option<Bound<'_, PyTuple>>,
) -> PyResult<Option<Compose>> {
    match (steps, output) {
        (Some(steps), Some(out)) => {
            let steps = steps.iter().map(step).collect::<PyResult<Vec<_>>>()?;
            let out = crate::vision::output(&out)?;
            Ok(Some(Compose::new(steps, out).map_err(data_err)?))
        }
        (None, None) => Ok(None),
        _ => Err(PyValueError::new_err(
            "steps and output go together (a pipeline needs both)",
        )),
    }
}

/// The decoder's pixel limit: PIL's default, `max_pixels`, or none.
pub(crate) fn decode_options(max_pixels: Option<u64>, no_pixel_limit: bool) -> DecodeOptions {
    let decode = DecodeOptions::default();
    if no_pixel_limit {
        decode.max_pixels(None)
    } else if let Some(m) = max_pixels {
        decode.max_pixels(Some(m))
    } else {
        decode
    }
}

/// An image folder (torchvision's `ImageFolder` semantics) and, when it has a transform, the
/// dataset the loader reads: `(image, label)` with the image written by the pipeline.
#[pyclass(name = "_ImageFolder", module = "longshore", frozen)]
pub(crate) struct PyImageFolder {
    folder: ImageFolder,
    compose: Option<Compose>,
    /// Where random steps draw from (`random=`).
    random: RandomSource,
    pub(crate) source: Option<Source>,
    output_shape: Option<Vec<usize>>,
}

impl PyImageFolder {
    /// The folder and pipeline for device decoding (workers read the files, nvJPEG decodes):
    /// a `ValueError` when the pipeline has no device form.
    pub(crate) fn encoded(&self) -> PyResult<EncodedImages> {
        let compose = self.compose.clone().ok_or_else(|| {
            PyValueError::new_err(
                "decode=\"nvjpeg\" needs an ImageFolder with a transform ending in ToTensor()",
            )
        })?;
        let images = self
            .folder
            .clone()
            .with_transform(compose)
            .random_source(self.random);
        EncodedImages::new(images).map_err(data_err)
    }
}

#[pymethods]
impl PyImageFolder {
    /// Scans `root`; with `steps` and `output`, builds the pipeline (a `ValueError` when
    /// the Rust pipeline cannot express it, for example an output size that depends on the
    /// image).
    #[new]
    /// `random`: `"sample"` (each sample's own generator, keyed by the loader's seed: exact
    /// resume, any number of workers) or `"worker"` (each worker's generator, as torch's
    /// transforms draw).
    #[pyo3(signature = (root, steps = None, output = None, *, allow_empty = false, max_pixels = None, no_pixel_limit = false, random = "sample"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        steps: Option<Vec<Bound<'_, PyTuple>>>,
        output: Option<Bound<'_, PyTuple>>,
        allow_empty: bool,
        max_pixels: Option<u64>,
        no_pixel_limit: bool,
        random: &str,
    ) -> PyResult<Self> {
        let random = match random {
            "sample" => RandomSource::Sample,
            "worker" => RandomSource::Worker,
            other => {
                return Err(PyValueError::new_err(format!(
                    "random must be 'sample' or 'worker', not {other:?}"
                )));
            }
        };
        let compose = compose_of(steps, output)?;
        let decode = decode_options(max_pixels, no_pixel_limit);
        let options = ImageFolderOptions::default()
            .allow_empty(allow_empty)
            .decode(decode);
        let folder = py
            .detach(|| ImageFolder::with_options(&root, options))
            .map_err(data_err)?;
        let output_shape = compose.as_ref().map(|c| c.field().shape.dims().to_vec());
        let source = compose.clone().map(|c| Source {
            dataset: Arc::new(Fields(
                ImageDataset::new(folder.clone(), c).random_source(random),
            )),
            collate: DirectCollate::new().with_names(["image", "label"]),
        });
        Ok(Self {
            folder,
            compose,
            random,
            source,
            output_shape,
        })
    }

    /// The class names, sorted.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.folder.classes().to_vec()
    }

    /// Class name to index.
    #[getter]
    fn class_to_idx(&self) -> BTreeMap<String, usize> {
        self.folder.class_to_idx().clone()
    }

    /// `(path, class index)` in sample order.
    #[getter]
    fn samples(&self) -> Vec<(String, usize)> {
        self.folder
            .samples()
            .iter()
            .map(|(p, l)| (p.to_string_lossy().into_owned(), *l))
            .collect()
    }

    /// The class index of every sample.
    #[getter]
    fn targets(&self) -> Vec<usize> {
        self.folder.targets()
    }

    /// The per-image output shape of the pipeline (`None` without a transform).
    #[getter]
    fn output_shape(&self) -> Option<Vec<usize>> {
        self.output_shape.clone()
    }

    /// Sample `index` through the pipeline, outside the loader: `(bytes, dtype, label)` of the
    /// image (native byte order), for `__getitem__`. Random steps draw from this thread's
    /// fallback generator.
    fn get(&self, py: Python<'_>, index: usize) -> PyResult<(Vec<u8>, String, i64)> {
        let Some(source) = &self.source else {
            return Err(PyValueError::new_err(
                "this ImageFolder has no transform: give it one ending in ToTensor()",
            ));
        };
        let fields = py.detach(|| source.dataset.get(index)).map_err(data_err)?;
        let [image, label]: [Tensor; 2] = fields
            .try_into()
            .map_err(|_| PyValueError::new_err("an image sample has two fields"))?;
        let label = i64::from_ne_bytes(
            label
                .bytes()
                .try_into()
                .map_err(|_| PyValueError::new_err("a label is one i64"))?,
        );
        let dtype = match image.dtype() {
            DType::U8 => "uint8",
            _ => "float32",
        };
        Ok((image.bytes().to_vec(), dtype.to_owned(), label))
    }

    fn __len__(&self) -> usize {
        self.folder.len()
    }
}

/// Writes `classes x per_class` synthetic ImageNet-like JPEGs under `root` (longshore-vision's
/// generator; reused when the same spec is already there): `(images, bytes, reused)`.
#[pyfunction]
#[pyo3(signature = (root, classes = 4, per_class = 3, mean_area = 7680.0, quality = 90, seed = 7))]
pub(crate) fn write_synthetic_folder(
    py: Python<'_>,
    root: PathBuf,
    classes: usize,
    per_class: usize,
    mean_area: f64,
    quality: u8,
    seed: u64,
) -> PyResult<(usize, u64, bool)> {
    let spec = longshore::vision::synth::FolderSpec {
        classes,
        per_class,
        mean_area,
        quality,
        seed,
    };
    let r = py
        .detach(|| longshore::vision::synth::write_folder(&root, &spec))
        .map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!(
                "cannot write the synthetic folder {}: {e}",
                root.display()
            ))
        })?;
    Ok((r.images, r.bytes, r.reused))
}
