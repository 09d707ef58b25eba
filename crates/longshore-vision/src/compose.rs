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

use std::borrow::Cow;
use std::cell::RefCell;
use std::path::Path;

use fast_image_resize::Resizer;
use longshore_data::rng::Rng;
use longshore_data::{DType, DataError, FieldSpec, ImageLayout, Shape, Tensor};

#[cfg(feature = "libjpeg")]
use crate::decode::DecodeError;
use crate::decode::{DecodeOptions, PlanFailed, decode_planned};
use crate::image::RgbImage;
use crate::plan::{Geometry, PlannedStep};
use crate::resize::{Rect, SubBox, resize_box};
use crate::transforms::{
    CenterCrop, CropBox, Interpolation, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize,
};

/// One step of a [`Compose`]. A [`RandomHorizontalFlip`] step mirrors the decoded image,
/// whatever the layout it was built with.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Step {
    /// [`RandomResizedCrop`].
    RandomResizedCrop(RandomResizedCrop),
    /// [`Resize`].
    Resize(Resize),
    /// [`CenterCrop`].
    CenterCrop(CenterCrop),
    /// [`RandomHorizontalFlip`].
    RandomHorizontalFlip(RandomHorizontalFlip),
    /// A fixed box resized to `height x width` (torchvision's `F.resized_crop`); the box
    /// must lie inside the image (it is clamped to it).
    ResizedCrop {
        /// The box, in the image's coordinates.
        crop: CropBox,
        /// Output height.
        height: usize,
        /// Output width.
        width: usize,
        /// The interpolation.
        interpolation: crate::transforms::Interpolation,
    },
}

impl From<RandomResizedCrop> for Step {
    fn from(t: RandomResizedCrop) -> Step {
        Step::RandomResizedCrop(t)
    }
}
impl From<Resize> for Step {
    fn from(t: Resize) -> Step {
        Step::Resize(t)
    }
}
impl From<CenterCrop> for Step {
    fn from(t: CenterCrop) -> Step {
        Step::CenterCrop(t)
    }
}
impl From<RandomHorizontalFlip> for Step {
    fn from(t: RandomHorizontalFlip) -> Step {
        Step::RandomHorizontalFlip(t)
    }
}

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
                Ok(p) => self.write(&p.geometry, &decoded, p.width, p.height, s, out),
                Err(PlanFailed::Decode(e)) => Err(crate::folder::invalid(path, e)),
                Err(PlanFailed::Plan(e)) => Err(e),
                #[cfg(feature = "libjpeg")]
                Err(PlanFailed::Jpeg(e)) => Err(crate::folder::invalid(
                    path,
                    DecodeError::Jpeg(e.to_string()),
                )),
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
            self.write(
                geometry,
                image.as_bytes(),
                image.width(),
                image.height(),
                s,
                out,
            )
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
        self.write(&geometry, src, width, height, s, out)
    }

    /// Renders `geometry` on `src` and writes the output.
    fn write(
        &self,
        geometry: &Geometry,
        src: &[u8],
        width: usize,
        height: usize,
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
        let cur = render(geometry, src, width, height, s)?;
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
    render(&geometry, src, width, height, s)
}

/// Executes `geometry` on the pixels `src` (`width x height`, RGB HWC): the CPU renderer of
/// a plan. A crop only narrows a view of the current pixels, a resize reads only its box, a
/// flip waits for the next geometric step or the output writer.
fn render<'a>(
    geometry: &Geometry,
    src: &'a [u8],
    width: usize,
    height: usize,
    s: &mut Scratch,
) -> Result<Current<'a>, DataError> {
    if geometry.input_size() != (width, height) {
        return Err(DataError::ShapeMismatch(format!(
            "a plan drawn for a {}x{} image, rendered on a {width}x{height} one",
            geometry.input_size().0,
            geometry.input_size().1
        )));
    }
    let mut cur = Current {
        pixels: Cow::Borrowed(src),
        width,
        height,
        view: Rect {
            x: 0,
            y: 0,
            w: width,
            h: height,
        },
        flip: false,
    };
    let mut steps = geometry.steps().iter().peekable();
    while let Some(step) = steps.next() {
        match *step {
            PlannedStep::ResizedCrop {
                crop,
                width,
                height,
                interpolation,
            } => {
                cur.apply_flip();
                let rect = cur.sub_rect(crop);
                if rect.w == 0 || rect.h == 0 {
                    return Err(DataError::InvalidArgument {
                        name: "crop",
                        reason: format!(
                            "the box {crop:?} of a resized crop has no pixels inside the \
                             {}x{} image",
                            cur.view.w, cur.view.h
                        ),
                    });
                }
                cur.resize(s, rect, SubBox::whole(rect), width, height, interpolation)?;
            }
            PlannedStep::Resize {
                width: w,
                height: h,
                interpolation,
            } => {
                cur.apply_flip();
                // Resize then a crop inside the result (the val pipeline): only the cropped
                // part is computed, from the source box that maps onto it. Only when
                // shrinking (the ImageNet case), and not for nearest neighbour: upscaling a
                // fractional box and nearest neighbour's pick of a source pixel are not
                // shift-invariant in fast_image_resize (a proptest found 2 levels off when
                // upscaling 50x75 to 60x90).
                let fusable =
                    interpolation != Interpolation::Nearest && w <= cur.view.w && h <= cur.view.h;
                if let (true, Some(PlannedStep::Crop(b))) = (fusable, steps.peek()) {
                    let b = *b;
                    if b.top >= 0
                        && b.left >= 0
                        && b.top as usize + b.height <= h
                        && b.left as usize + b.width <= w
                    {
                        steps.next();
                        let (sx, sy) = (cur.view.w as f64 / w as f64, cur.view.h as f64 / h as f64);
                        let (left, top) = (b.left as f64 * sx, b.top as f64 * sy);
                        // Clamped to the view: `b.width * sx` can exceed it by a rounding
                        // error when the crop reaches the edge (55x54 -> 21x21, crop 21).
                        let sub = SubBox {
                            left,
                            top,
                            width: (b.width as f64 * sx).min(cur.view.w as f64 - left),
                            height: (b.height as f64 * sy).min(cur.view.h as f64 - top),
                        };
                        let rect = cur.view;
                        cur.resize(s, rect, sub, b.width, b.height, interpolation)?;
                        continue;
                    }
                }
                let rect = cur.view;
                cur.resize(s, rect, SubBox::whole(rect), w, h, interpolation)?;
            }
            PlannedStep::Crop(b) => {
                cur.apply_flip();
                cur.crop(s, b);
            }
            PlannedStep::Flip => cur.flip = !cur.flip,
        }
    }
    Ok(cur)
}

/// Buffers a worker thread reuses for every image.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The output view's pixels, gathered when they are not one whole buffer to normalise.
    view: Vec<u8>,
    decoded: Vec<u8>,
    spare: Vec<u8>,
    pub(crate) file: Vec<u8>,
    resizer: Resizer,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's buffers (fresh ones if they are already in use).
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// The image between steps: pixels (borrowed until a step writes new ones), a view of them,
/// and a pending horizontal flip of the view.
struct Current<'a> {
    pixels: Cow<'a, [u8]>,
    width: usize,
    height: usize,
    view: Rect,
    flip: bool,
}

impl Current<'_> {
    /// The box `b` (relative to the view, inside it) in the pixels' coordinates.
    fn sub_rect(&self, b: CropBox) -> Rect {
        let x = self.view.x + (b.left.max(0) as usize).min(self.view.w);
        let y = self.view.y + (b.top.max(0) as usize).min(self.view.h);
        Rect {
            x,
            y,
            w: b.width.min(self.view.x + self.view.w - x),
            h: b.height.min(self.view.y + self.view.h - y),
        }
    }

    fn replace(&mut self, s: &mut Scratch, pixels: Vec<u8>, width: usize, height: usize) {
        if let Cow::Owned(old) = std::mem::replace(&mut self.pixels, Cow::Owned(pixels)) {
            s.spare = old;
        }
        self.width = width;
        self.height = height;
        self.view = Rect {
            x: 0,
            y: 0,
            w: width,
            h: height,
        };
    }

    fn resize(
        &mut self,
        s: &mut Scratch,
        rect: Rect,
        sub: SubBox,
        w: usize,
        h: usize,
        interpolation: Interpolation,
    ) -> Result<(), DataError> {
        let mut dst = std::mem::take(&mut s.spare);
        resize_box(
            &mut s.resizer,
            &self.pixels,
            self.width,
            self.height,
            rect,
            sub,
            &mut dst,
            w,
            h,
            interpolation,
        )?;
        self.replace(s, dst, w, h);
        Ok(())
    }

    /// Crops the view to `b`, padding with zeros where `b` extends past it.
    fn crop(&mut self, s: &mut Scratch, b: CropBox) {
        let inside = b.top >= 0
            && b.left >= 0
            && b.top as usize + b.height <= self.view.h
            && b.left as usize + b.width <= self.view.w;
        if inside {
            self.view = self.sub_rect(b);
            return;
        }
        let mut dst = std::mem::take(&mut s.spare);
        dst.clear();
        dst.resize(b.width * b.height * 3, 0);
        for y in 0..b.height {
            let sy = y as i64 + b.top;
            if sy < 0 || sy as usize >= self.view.h {
                continue;
            }
            let row = (self.view.y + sy as usize) * self.width;
            for x in 0..b.width {
                let sx = x as i64 + b.left;
                if sx < 0 || sx as usize >= self.view.w {
                    continue;
                }
                let si = (row + self.view.x + sx as usize) * 3;
                let di = (y * b.width + x) * 3;
                dst[di..di + 3].copy_from_slice(&self.pixels[si..si + 3]);
            }
        }
        self.replace(s, dst, b.width, b.height);
    }

    /// Mirrors the view's pixels now (a geometric step follows a flip).
    fn apply_flip(&mut self) {
        if !self.flip {
            return;
        }
        self.flip = false;
        let (v, width) = (self.view, self.width);
        let pixels = self.pixels.to_mut();
        for y in v.y..v.y + v.h {
            let row = &mut pixels[(y * width + v.x) * 3..(y * width + v.x + v.w) * 3];
            let n = v.w;
            for x in 0..n / 2 {
                for c in 0..3 {
                    row.swap(x * 3 + c, (n - 1 - x) * 3 + c);
                }
            }
        }
    }

    fn recycle(self, s: &mut Scratch) {
        if let Cow::Owned(v) = self.pixels {
            s.spare = v;
        }
    }

    /// Writes the view as normalised f32 CHW into `out` with `n`'s vectorised kernel (one
    /// fused multiply-add per value, non-temporal stores for a batch slot). The kernel reads
    /// the pixels in place when the view is the whole image (a pending flip applied to pixels
    /// this pipeline owns); otherwise the view is gathered (and mirrored) into a reused buffer
    /// first.
    fn write_normalized(
        &mut self,
        s: &mut Scratch,
        n: &Normalize,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let whole = self.view.x == 0
            && self.view.y == 0
            && (self.view.w, self.view.h) == (self.width, self.height);
        if whole && (!self.flip || matches!(self.pixels, Cow::Owned(_))) {
            if self.flip {
                for row in self.pixels.to_mut().chunks_exact_mut(self.width * 3) {
                    bytemuck::cast_slice_mut::<u8, [u8; 3]>(row).reverse();
                }
                self.flip = false;
            }
            return n.apply_into_bytes(&self.pixels, 3, out);
        }
        let mut view = std::mem::take(&mut s.view);
        view.clear();
        view.resize(self.view.w * self.view.h * 3, 0);
        self.write_u8(ImageLayout::Hwc, &mut view);
        let r = n.apply_into_bytes(&view, 3, out);
        s.view = view;
        r
    }

    /// Writes the view (mirrored if a flip is pending) as u8 pixels in `layout` into `out`.
    fn write_u8(&self, layout: ImageLayout, out: &mut [u8]) {
        let v = self.view;
        let px = |y: usize| {
            let start = ((v.y + y) * self.width + v.x) * 3;
            &self.pixels[start..start + v.w * 3]
        };
        let col = |x: usize| if self.flip { v.w - 1 - x } else { x };
        match layout {
            ImageLayout::Chw => {
                let plane = v.w * v.h;
                for y in 0..v.h {
                    let row = px(y);
                    for c in 0..3 {
                        let dst = &mut out[c * plane + y * v.w..c * plane + (y + 1) * v.w];
                        for (x, d) in dst.iter_mut().enumerate() {
                            *d = row[col(x) * 3 + c];
                        }
                    }
                }
            }
            ImageLayout::Hwc => {
                for y in 0..v.h {
                    let row = px(y);
                    let dst = &mut out[y * v.w * 3..(y + 1) * v.w * 3];
                    if self.flip {
                        for (x, d) in dst.chunks_exact_mut(3).enumerate() {
                            let si = col(x) * 3;
                            d.copy_from_slice(&row[si..si + 3]);
                        }
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
            }
        }
    }
}
