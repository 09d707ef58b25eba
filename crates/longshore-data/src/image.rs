//! The image transforms of the `.npy` image datasets and of longshore-vision's pipelines,
//! defined once: [`Normalize`] (`ToTensor()` + `Normalize(mean, std)`, through the vectorised
//! [`NormalizeKernel`]), [`RandomHorizontalFlip`] and [`RandomCrop`], on images in an
//! [`ImageLayout`].
//!
//! longshore-vision's `Compose` runs the same `Normalize` and `RandomHorizontalFlip` on
//! decoded images, and the device kernels take their constants from
//! [`Normalize::affine`], so the CPU, the `.npy` path and the GPU share one definition.

use crate::DataError;
use crate::dtype::DType;
use crate::field::{DirectPlan, FieldSpec, FieldTransform};
use crate::normalize::NormalizeKernel;
use crate::rng::{Rng, below, unit_f32};
use crate::shape::Shape;
use crate::tensor::{ImageLayout, Tensor};
use crate::transform::Transform;

/// Per-channel normalisation of `u8` images to `f32` in CHW order:
/// `out = (x / 255 - mean[c]) / std[c]`, like `ToTensor()` + `Normalize(mean, std)`.
///
/// Computed as `x * scale[c] + bias[c]` (`scale = 1 / (255 std)`, `bias = -mean / std`) by
/// the vectorised [`NormalizeKernel`], on the widest path the running CPU has (AVX-512, AVX2 +
/// FMA, or a portable loop the compiler vectorises), chosen at run time: no `target-cpu`
/// flag is needed.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    mean: Vec<f32>,
    std: Vec<f32>,
    kernel: NormalizeKernel,
}

impl Normalize {
    /// ImageNet's per-channel mean (on the `[0, 1]` scale), as in PyTorch's ImageNet example.
    pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    /// ImageNet's per-channel standard deviation (on the `[0, 1]` scale).
    pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

    /// Normalisation with per-channel `mean` and `std` (on the `[0, 1]` scale) for
    /// images in `layout`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `mean` and `std` differ in length, are
    /// empty, or a `std` is zero, negative or not finite.
    pub fn new(mean: &[f32], std: &[f32], layout: ImageLayout) -> Result<Normalize, DataError> {
        Ok(Normalize {
            kernel: NormalizeKernel::new(mean, std, layout)?,
            mean: mean.to_vec(),
            std: std.to_vec(),
        })
    }

    /// ImageNet's mean and std ([`Normalize::IMAGENET_MEAN`], [`Normalize::IMAGENET_STD`]).
    pub fn imagenet(layout: ImageLayout) -> Normalize {
        Normalize::new(&Self::IMAGENET_MEAN, &Self::IMAGENET_STD, layout)
            .expect("ImageNet's constants are valid")
    }

    /// `ToTensor()` alone for `channels` channels: `x / 255` (mean 0, std 1).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `channels` is 0.
    pub fn to_tensor(channels: usize, layout: ImageLayout) -> Result<Normalize, DataError> {
        Normalize::new(&vec![0.0; channels], &vec![1.0; channels], layout)
    }

    /// The same normalisation of images in `layout` (a pipeline that always reads decoded
    /// HWC pixels sets it so).
    pub fn with_layout(mut self, layout: ImageLayout) -> Normalize {
        self.kernel = self.kernel.with_layout(layout);
        self
    }

    /// The per-channel mean, on the `[0, 1]` scale.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// The per-channel standard deviation, on the `[0, 1]` scale.
    pub fn std(&self) -> &[f32] {
        &self.std
    }

    /// The layout of the `u8` images this transform reads.
    pub fn layout(&self) -> ImageLayout {
        self.kernel.layout()
    }

    /// Channels per pixel.
    pub fn channels(&self) -> usize {
        self.kernel.channels()
    }

    /// Per-channel `(scale, bias)` such that `out = x * scale + bias` (`scale = 1 / (255
    /// std)`, `bias = -mean / std`): the constants the CPU kernel uses, for a device kernel
    /// with `C` channels (the nvJPEG and `normalize_u8` kernels take them from here).
    ///
    /// # Panics
    /// When this normalisation does not have exactly `C` channels; check
    /// [`Normalize::channels`] first where that is not known (longshore-vision's `Compose`
    /// only accepts 3).
    pub fn affine<const C: usize>(&self) -> [(f32, f32); C] {
        assert_eq!(
            self.channels(),
            C,
            "Normalize::affine::<{C}> of a {}-channel normalisation",
            self.channels()
        );
        std::array::from_fn(|c| (self.kernel.scale()[c], self.kernel.bias()[c]))
    }

    /// The kernel doing the work (its path, layout and channels).
    pub fn kernel(&self) -> &NormalizeKernel {
        &self.kernel
    }

    /// Normalises raw image bytes `src` of `channels x height x width` in this
    /// transform's layout into `out` (CHW, `channels * height * width` floats).
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the lengths or channel count disagree.
    pub fn apply_into(
        &self,
        src: &[u8],
        channels: usize,
        out: &mut [f32],
    ) -> Result<(), DataError> {
        if channels != self.kernel.channels() || channels == 0 {
            return Err(DataError::ShapeMismatch(format!(
                "normalise {} bytes with {channels} channels into {} floats; transform has {} channels",
                src.len(),
                out.len(),
                self.kernel.channels()
            )));
        }
        self.kernel.apply(src, out)
    }

    /// Normalises into a batch slot of bytes: straight into it when it is aligned for `f32`,
    /// else through one temporary copy.
    ///
    /// # Errors
    /// As [`Normalize::apply_into`]; [`DataError::BufferTooSmall`] for a slot of the wrong
    /// length.
    pub fn apply_into_bytes(
        &self,
        src: &[u8],
        channels: usize,
        dst: &mut [u8],
    ) -> Result<(), DataError> {
        if dst.len() != src.len() * 4 {
            return Err(DataError::BufferTooSmall {
                what: "normalised image slot",
                needed: src.len() * 4,
                got: dst.len(),
            });
        }
        match bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
            Ok(out) => self.apply_into(src, channels, out),
            Err(_) => {
                // Storage not aligned for f32 (a plain Vec<u8>): correct, with one copy.
                let mut out = vec![0f32; src.len()];
                self.apply_into(src, channels, &mut out)?;
                dst.copy_from_slice(bytemuck::cast_slice(&out));
                Ok(())
            }
        }
    }
}

impl Transform<Tensor> for Normalize {
    type Output = Tensor;
    fn apply(&self, input: Tensor, _: &mut Rng) -> Result<Tensor, DataError> {
        if input.dtype() != DType::U8 {
            return Err(DataError::DTypeMismatch {
                what: "image given to Normalize".into(),
                actual: input.dtype(),
                requested: DType::U8,
            });
        }
        let (c, h, w) = self.kernel.layout().dims(&input)?;
        let mut out = Tensor::zeros(DType::F32, &[c, h, w])?;
        self.apply_into(input.bytes(), c, out.as_slice_mut::<f32>()?)?;
        Ok(out)
    }

    /// A one-field image dataset (a `.npy` of `u8` images) normalised on its way into the
    /// batch: the same kernel writes the same floats into the slot that `apply` writes
    /// into a tensor.
    fn fuse<'a>(&'a self, plan: DirectPlan<'a>) -> Option<DirectPlan<'a>> {
        if plan.fields().len() != 1 {
            return None;
        }
        plan.with_transform(0, self)
    }
}

/// The fused image path of [`crate::DirectCollate`]: a `u8` image field in this
/// transform's layout (`[C, H, W]` or `[H, W, C]`) becomes normalised `f32`
/// `[C, H, W]`, written straight into the batch slot.
impl FieldTransform for Normalize {
    fn output(&self, input: &FieldSpec) -> Result<FieldSpec, DataError> {
        if input.dtype != DType::U8 {
            return Err(DataError::DTypeMismatch {
                what: "image field given to Normalize".into(),
                actual: input.dtype,
                requested: DType::U8,
            });
        }
        let (c, h, w) = self.kernel.layout().dims_of(input.shape.dims())?;
        if c != self.channels() {
            return Err(DataError::ShapeMismatch(format!(
                "image field of shape {:?} has {c} channels, Normalize has {}",
                input.shape.dims(),
                self.channels()
            )));
        }
        Ok(FieldSpec {
            dtype: DType::F32,
            shape: Shape::new(&[c, h, w])?,
        })
    }

    fn apply(&self, input: &FieldSpec, src: &[u8], dst: &mut [u8]) -> Result<(), DataError> {
        let (c, _, _) = self.kernel.layout().dims_of(input.shape.dims())?;
        self.apply_into_bytes(src, c, dst)
    }
}

/// Crops a random `height x width` window, like torchvision's `RandomCrop`
/// (without padding). Works on any dtype; the layout is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomCrop {
    height: usize,
    width: usize,
    layout: ImageLayout,
}

impl RandomCrop {
    /// Crops windows of `height x width` from images in `layout`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a zero size.
    pub fn new(height: usize, width: usize, layout: ImageLayout) -> Result<RandomCrop, DataError> {
        if height == 0 || width == 0 {
            return Err(DataError::arg(
                "size",
                format!("crop size {height}x{width} must be positive"),
            ));
        }
        Ok(RandomCrop {
            height,
            width,
            layout,
        })
    }

    /// Crops the window whose top-left corner is `(top, left)`.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when the window does not fit in the image.
    pub fn crop_at(&self, input: &Tensor, top: usize, left: usize) -> Result<Tensor, DataError> {
        let (c, h, w) = self.layout.dims(input)?;
        if top + self.height > h || left + self.width > w {
            return Err(DataError::ShapeMismatch(format!(
                "crop of {}x{} at ({top}, {left}) does not fit an image of {h}x{w}",
                self.height, self.width
            )));
        }
        let e = input.dtype().size();
        let (ch, cw) = (self.height, self.width);
        let mut out = Tensor::zeros(input.dtype(), &self.layout.shape(c, ch, cw))?;
        let src = input.bytes();
        let dst = out.bytes_mut();
        match self.layout {
            ImageLayout::Chw => {
                for ci in 0..c {
                    for y in 0..ch {
                        let s = ((ci * h + top + y) * w + left) * e;
                        let d = (ci * ch + y) * cw * e;
                        dst[d..d + cw * e].copy_from_slice(&src[s..s + cw * e]);
                    }
                }
            }
            ImageLayout::Hwc => {
                let row = cw * c * e;
                for y in 0..ch {
                    let s = ((top + y) * w + left) * c * e;
                    dst[y * row..(y + 1) * row].copy_from_slice(&src[s..s + row]);
                }
            }
        }
        Ok(out)
    }
}

impl Transform<Tensor> for RandomCrop {
    type Output = Tensor;
    fn apply(&self, input: Tensor, rng: &mut Rng) -> Result<Tensor, DataError> {
        let (_, h, w) = self.layout.dims(&input)?;
        if h < self.height || w < self.width {
            return Err(DataError::ShapeMismatch(format!(
                "crop of {}x{} is larger than the image of {h}x{w}",
                self.height, self.width
            )));
        }
        let top = below(rng, (h - self.height + 1) as u64) as usize;
        let left = below(rng, (w - self.width + 1) as u64) as usize;
        self.crop_at(&input, top, left)
    }
}

/// Mirrors the image left to right with probability `p`, like torchvision's
/// `RandomHorizontalFlip` (which draws `torch.rand(1) < p`, a float32: see
/// [`RandomHorizontalFlip::draw`]).
///
/// As a [`Transform`] of a [`Tensor`] it flips in place in its layout; longshore-vision's
/// `Compose` runs it as a step on the decoded image (whatever the layout given here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomHorizontalFlip {
    p: f64,
    layout: ImageLayout,
}

/// torchvision's default: `p = 0.5`, CHW tensors.
impl Default for RandomHorizontalFlip {
    fn default() -> Self {
        RandomHorizontalFlip {
            p: 0.5,
            layout: ImageLayout::Chw,
        }
    }
}

impl RandomHorizontalFlip {
    /// Flips images in `layout` with probability `p`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `p` is not within `[0, 1]`.
    pub fn new(p: f64, layout: ImageLayout) -> Result<RandomHorizontalFlip, DataError> {
        if !(0.0..=1.0).contains(&p) {
            return Err(DataError::arg(
                "p",
                format!("probability {p} is not within [0, 1]"),
            ));
        }
        Ok(RandomHorizontalFlip { p, layout })
    }

    /// The probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// The layout of the tensors it flips.
    pub fn layout(&self) -> ImageLayout {
        self.layout
    }

    /// Draws whether to flip: `torch.rand(1) < p`, one float32 of 24 random bits.
    pub fn draw(&self, rng: &mut Rng) -> bool {
        f64::from(unit_f32(rng)) < self.p
    }

    /// Mirrors `input` left to right in place.
    ///
    /// # Errors
    /// [`DataError::ShapeMismatch`] when `input` is not a 3-dimensional image.
    pub fn flip(&self, input: &mut Tensor) -> Result<(), DataError> {
        let (c, h, w) = self.layout.dims(input)?;
        let e = input.dtype().size();
        let bytes = input.bytes_mut();
        match self.layout {
            ImageLayout::Chw => {
                for row in bytes.chunks_exact_mut(w * e).take(c * h) {
                    reverse_elems(row, e);
                }
            }
            ImageLayout::Hwc => {
                for row in bytes.chunks_exact_mut(w * c * e).take(h) {
                    reverse_elems(row, c * e);
                }
            }
        }
        Ok(())
    }
}

/// Reverses the order of `elem`-byte elements of `row`.
fn reverse_elems(row: &mut [u8], elem: usize) {
    let n = row.len() / elem;
    for i in 0..n / 2 {
        let j = n - 1 - i;
        let (a, b) = row.split_at_mut(j * elem);
        a[i * elem..(i + 1) * elem].swap_with_slice(&mut b[..elem]);
    }
}

impl Transform<Tensor> for RandomHorizontalFlip {
    type Output = Tensor;
    fn apply(&self, mut input: Tensor, rng: &mut Rng) -> Result<Tensor, DataError> {
        if self.draw(rng) {
            self.flip(&mut input)?;
        }
        Ok(input)
    }
}
