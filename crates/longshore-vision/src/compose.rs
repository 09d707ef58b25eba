//! [`Compose`]: torchvision's `transforms.Compose` for the image path, run on 8-bit pixels
//! and written straight into a batch slot.
//!
//! Steps run in order on the decoded image, as torchvision runs them on a PIL image, with
//! three economies that do not change the pixels: a crop only narrows a view of the current
//! image (no copy), a resize reads just that view (crop before resize), and a flip is applied
//! while writing the output (or to the view, if a geometric step follows it). The output is
//! `ToTensor()` + `Normalize(mean, std)` fused, as f32 CHW, or the raw u8 pixels (CHW or HWC)
//! for normalising on the device. Normalising is longshore-data's [`Normalize`], whose one
//! vectorised kernel ([`longshore_data::normalize::NormalizeKernel`]) writes every float.

use std::path::Path;

use longshore_data::rng::Rng;
use longshore_data::{DType, DataError, FieldSpec, ImageLayout, Shape, Tensor};

use crate::decode::{DecodeOptions, PlanFailed, decode_planned};
use crate::image::RgbImage;
use crate::plan::Geometry;
pub(crate) use crate::render::with_scratch;
use crate::render::{Current, Scratch, Source, render};
use crate::transforms::{CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize};

pub use crate::transforms::Step;

/// What a [`Compose`] writes for each image.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// `ToTensor()` then `Normalize(mean, std)`: f32 `[3, H, W]`. `ToTensor()` alone is
    /// `Normalize` with mean 0 and std 1 ([`Output::to_tensor`]). The normalisation must have 3
    /// channels; a [`Compose`] reads it as HWC (the decoded pixels), whatever its layout.
    Normalized(Normalize),
    /// The pixels as u8 `[3, H, W]`, to normalise on the device.
    U8Chw,
    /// The pixels as u8 `[H, W, 3]`.
    U8Hwc,
}

impl Output {
    /// `ToTensor()` alone: f32 in `[0, 1]`.
    pub fn to_tensor() -> Output {
        Output::Normalized(
            Normalize::to_tensor(3, ImageLayout::Hwc).expect("3 channels are a valid count"),
        )
    }

    /// `ToTensor()` + `Normalize` with ImageNet's statistics (PyTorch's ImageNet example).
    pub fn imagenet() -> Output {
        Output::Normalized(Normalize::imagenet(ImageLayout::Hwc))
    }

    /// The output as a pipeline writes it: a normalisation reads HWC pixels.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a normalisation of other than 3 channels.
    fn for_pipeline(self) -> Result<Output, DataError> {
        match self {
            Output::Normalized(n) if n.channels() != 3 => Err(DataError::InvalidArgument {
                name: "output",
                reason: format!(
                    "images are RGB: Normalize needs 3 channels, has {}",
                    n.channels()
                ),
            }),
            Output::Normalized(n) => Ok(Output::Normalized(n.with_layout(ImageLayout::Hwc))),
            other => Ok(other),
        }
    }
}

/// A pipeline of transforms with a fixed output size, like torchvision's
/// `transforms.Compose([...])` for a classification model.
///
/// ```
/// use longshore_data::ImageLayout;
/// use longshore_vision::{Compose, Output, RgbImage};
/// use longshore_vision::transforms::{CenterCrop, Normalize, Resize};
///
/// let val = Compose::new(
///     [Resize::new(8)?.into(), CenterCrop::new(6)?.into()],
///     Output::Normalized(Normalize::imagenet(ImageLayout::Hwc)),
/// )?;
/// assert_eq!(val.output_size(), (6, 6));
/// let image = RgbImage::from_vec(16, 12, vec![128; 16 * 12 * 3])?;
/// let mut rng = longshore_data::rng::epoch_rng(0, 0);
/// let tensor = val.apply(&image, &mut rng)?;
/// assert_eq!(tensor.shape(), &[3, 6, 6]);
/// # Ok::<(), longshore_data::DataError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Compose {
    steps: Vec<Step>,
    output: Output,
    size: (usize, usize),
}

impl Compose {
    /// A pipeline of `steps` writing `output`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when the output size depends on the image (the
    /// pipeline must end its geometry with a crop or a fixed-size resize), or a normalised
    /// output has other than 3 channels.
    pub fn new(
        steps: impl IntoIterator<Item = Step>,
        output: Output,
    ) -> Result<Compose, DataError> {
        let steps: Vec<Step> = steps.into_iter().collect();
        let mut size = None;
        for s in &steps {
            match s {
                Step::RandomResizedCrop(t) => size = Some(t.size()),
                Step::Resize(t) => size = t.fixed_size(),
                Step::CenterCrop(t) => size = Some(t.size()),
                Step::ResizedCrop { height, width, .. } => size = Some((*height, *width)),
                Step::RandomHorizontalFlip(_) => {}
            }
        }
        let size = size.ok_or_else(|| DataError::InvalidArgument {
            name: "steps",
            reason: "the output size depends on the image: end with a crop or a resize to \
                     (height, width) so images can be batched"
                .into(),
        })?;
        Ok(Compose {
            steps,
            output: output.for_pipeline()?,
            size,
        })
    }

    /// PyTorch's ImageNet training transform: `RandomResizedCrop(224)`,
    /// `RandomHorizontalFlip()`, `ToTensor()`, `Normalize(IMAGENET)`.
    pub fn imagenet_train() -> Compose {
        Compose::train(224, Output::imagenet())
    }

    /// PyTorch's ImageNet validation transform: `Resize(256)`, `CenterCrop(224)`,
    /// `ToTensor()`, `Normalize(IMAGENET)`.
    pub fn imagenet_val() -> Compose {
        Compose::val(256, 224, Output::imagenet())
    }

    /// `RandomResizedCrop(size)`, `RandomHorizontalFlip()`, then `output`.
    ///
    /// # Panics
    /// When `size` is 0 or a normalised output has other than 3 channels.
    pub fn train(size: usize, output: Output) -> Compose {
        let rrc = RandomResizedCrop::new(size).expect("a positive crop size");
        Compose::new([rrc.into(), RandomHorizontalFlip::default().into()], output)
            .expect("a crop fixes the size, and the output has 3 channels")
    }

    /// `Resize(resize)`, `CenterCrop(crop)`, then `output`.
    ///
    /// # Panics
    /// When a size is 0 or a normalised output has other than 3 channels.
    pub fn val(resize: usize, crop: usize, output: Output) -> Compose {
        let r = Resize::new(resize).expect("a positive resize");
        let c = CenterCrop::new(crop).expect("a positive crop size");
        Compose::new([r.into(), c.into()], output)
            .expect("a crop fixes the size, and the output has 3 channels")
    }

    /// The same steps with another output.
    ///
    /// # Panics
    /// When a normalised output has other than 3 channels.
    pub fn with_output(mut self, output: Output) -> Compose {
        self.output = output
            .for_pipeline()
            .expect("a normalised output has 3 channels");
        self
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The output kind (a normalisation as the pipeline runs it: HWC input).
    pub fn output(&self) -> &Output {
        &self.output
    }

    /// Output `(height, width)`.
    pub fn output_size(&self) -> (usize, usize) {
        self.size
    }

    /// The dtype and per-image shape written.
    pub fn field(&self) -> FieldSpec {
        let (h, w) = self.size;
        match self.output {
            Output::Normalized(_) => FieldSpec {
                dtype: DType::F32,
                shape: Shape::new(&[3, h, w]).expect("3 dimensions"),
            },
            Output::U8Chw => FieldSpec {
                dtype: DType::U8,
                shape: Shape::new(&[3, h, w]).expect("3 dimensions"),
            },
            Output::U8Hwc => FieldSpec {
                dtype: DType::U8,
                shape: Shape::new(&[h, w, 3]).expect("3 dimensions"),
            },
        }
    }

    /// Bytes written per image.
    pub fn output_bytes(&self) -> usize {
        let (h, w) = self.size;
        let n = 3 * h * w;
        match self.output {
            Output::Normalized(_) => n * 4,
            Output::U8Chw | Output::U8Hwc => n,
        }
    }

    /// Runs the pipeline on a decoded image and returns the tensor.
    ///
    /// # Errors
    /// As [`Compose::apply_into`].
    pub fn apply(&self, image: &RgbImage, rng: &mut Rng) -> Result<Tensor, DataError> {
        let f = self.field();
        let mut t = Tensor::zeros(f.dtype, f.shape.dims())?;
        self.apply_into(image, rng, t.bytes_mut())?;
        Ok(t)
    }

    /// Runs the pipeline on a decoded image, writing [`Compose::output_bytes`] bytes (native
    /// byte order) into `out`.
    ///
    /// # Errors
    /// [`DataError::BufferTooSmall`] when `out` has the wrong length.
    pub fn apply_into(
        &self,
        image: &RgbImage,
        rng: &mut Rng,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        with_scratch(|s| self.run(image.as_bytes(), image.width(), image.height(), rng, s, out))
    }

    /// Decodes `bytes` (the file at `path`, named in errors) and runs the pipeline into `out`:
    /// what a dataset does per sample, reusing this thread's buffers.
    ///
    /// # Errors
    /// [`DataError::InvalidFile`] naming `path` when the bytes do not decode (or the image is
    /// over the pixel limit), [`DataError::BufferTooSmall`] for a wrong `out`.
    pub fn decode_into(
        &self,
        path: &Path,
        bytes: &[u8],
        decode: &DecodeOptions,
        rng: &mut Rng,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        with_scratch(|s| {
            let mut decoded = std::mem::take(&mut s.decoded);
            // The plan is drawn from the header's size; a JPEG whose plan starts with a crop is
            // decoded only there (the same pixels), and the plan re-based onto the crop.
            let draw = |w, h| self.geometry(w, h, rng);
            let r = match decode_planned(bytes, decode, draw, &mut decoded) {
                Ok(p) => {
                    let src = Source {
                        pixels: &decoded,
                        width: p.width,
                        height: p.height,
                        origin: p.origin,
                    };
                    self.write(&p.geometry, src, s, out)
                }
                Err(PlanFailed::Decode(e)) => Err(crate::folder::invalid(path, e)),
                Err(PlanFailed::Plan(e)) => Err(e),
            };
            s.decoded = decoded;
            r
        })
    }

    /// Draws this pipeline's [`Geometry`] for a `width x height` image: every random
    /// parameter, from `rng`, as [`Compose::apply_into`] draws them (it renders this plan).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for an image with a zero side.
    pub fn geometry(
        &self,
        width: usize,
        height: usize,
        rng: &mut Rng,
    ) -> Result<Geometry, DataError> {
        Geometry::draw(&self.steps, width, height, rng)
    }

    /// Renders `geometry` (drawn with [`Compose::geometry`] for `image`'s size) on `image`,
    /// writing [`Compose::output_bytes`] bytes into `out`: [`Compose::apply_into`] without the
    /// draws.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] for a plan of another image size,
    /// [`DataError::BufferTooSmall`] when `out` has the wrong length.
    pub fn render_into(
        &self,
        geometry: &Geometry,
        image: &RgbImage,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        with_scratch(|s| {
            let src = Source::whole(image.as_bytes(), image.width(), image.height());
            self.write(geometry, src, s, out)
        })
    }

    fn run(
        &self,
        src: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        s: &mut Scratch,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let geometry = self.geometry(width, height, rng)?;
        self.write(&geometry, Source::whole(src, width, height), s, out)
    }

    /// Renders `geometry` on `src` and writes the output.
    fn write(
        &self,
        geometry: &Geometry,
        src: Source<'_>,
        s: &mut Scratch,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        if out.len() != self.output_bytes() {
            return Err(DataError::BufferTooSmall {
                what: "image slot",
                needed: self.output_bytes(),
                got: out.len(),
            });
        }
        let cur = render(geometry, src, s)?;
        let (h, w) = self.size;
        if (cur.view.h, cur.view.w) != (h, w) {
            return Err(DataError::ShapeMismatch(format!(
                "pipeline produced a {}x{} image, its output is {w}x{h}",
                cur.view.w, cur.view.h
            )));
        }
        let mut cur = cur;
        let r = match &self.output {
            Output::Normalized(n) => cur.write_normalized(s, n, out),
            Output::U8Chw => {
                cur.write_u8(ImageLayout::Chw, out);
                Ok(())
            }
            Output::U8Hwc => {
                cur.write_u8(ImageLayout::Hwc, out);
                Ok(())
            }
        };
        cur.recycle(s);
        r
    }
}

/// Runs `steps` on `image` and returns the transformed image, whatever its size: the
/// functional form (torchvision's `Compose` on a PIL image, without `ToTensor`).
///
/// # Errors
/// [`DataError::Other`] when the resizer fails (it does not for valid sizes).
pub fn apply_steps(steps: &[Step], image: &RgbImage, rng: &mut Rng) -> Result<RgbImage, DataError> {
    with_scratch(|s| {
        let cur = run_steps(
            steps,
            image.as_bytes(),
            image.width(),
            image.height(),
            rng,
            s,
        )?;
        let (w, h) = (cur.view.w, cur.view.h);
        let mut out = vec![0u8; w * h * 3];
        cur.write_u8(ImageLayout::Hwc, &mut out);
        cur.recycle(s);
        RgbImage::from_vec(w, h, out)
    })
}

/// Draws `steps`' [`Geometry`] for a `width x height` image and renders it on `src`.
fn run_steps<'a>(
    steps: &[Step],
    src: &'a [u8],
    width: usize,
    height: usize,
    rng: &mut Rng,
    s: &mut Scratch,
) -> Result<Current<'a>, DataError> {
    let geometry = Geometry::draw(steps, width, height, rng)?;
    render(&geometry, Source::whole(src, width, height), s)
}
