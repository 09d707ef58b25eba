//! Transforms for the common image path: crop, flip, and `u8` to normalised `f32`.
//!
//! Random transforms draw from the generator they are given; applied through
//! [`crate::DatasetExt::transform`] that is the current worker's generator, seeded
//! per worker ([`crate::worker`]), so a run is reproducible for a given seed and
//! number of workers.

use std::fmt;

use crate::DataError;
use crate::collate::FieldTransform;
use crate::dataset::FieldSpec;
use crate::dtype::{DType, Shape};
use crate::normalize::NormalizeKernel;
use crate::rng::{Rng, below, unit_f64};
use crate::tensor::Tensor;

/// A (possibly random) function applied to each item of a dataset.
pub trait Transform<T>: Send + Sync {
    /// The transformed item.
    type Output: Send;

    /// Transforms `input`, drawing any randomness from `rng`.
    ///
    /// # Errors
    /// When `input` is not something this transform accepts (wrong dtype, too small).
    fn apply(&self, input: T, rng: &mut Rng) -> Result<Self::Output, DataError>;
}

/// Composition of transforms.
pub trait TransformExt<T>: Transform<T> + Sized {
    /// Applies `self`, then `next`.
    fn then<N: Transform<Self::Output>>(self, next: N) -> Then<Self, N> {
        Then(self, next)
    }
}

impl<T, X: Transform<T>> TransformExt<T> for X {}

/// `A` then `B`; see [`TransformExt::then`].
#[derive(Debug, Clone)]
pub struct Then<A, B>(A, B);

impl<T, A: Transform<T>, B: Transform<A::Output>> Transform<T> for Then<A, B> {
    type Output = B::Output;
    fn apply(&self, input: T, rng: &mut Rng) -> Result<B::Output, DataError> {
        let mid = self.0.apply(input, rng)?;
        self.1.apply(mid, rng)
    }
}

/// Applies a transform to the first element of a pair, leaving the second (a label) as is.
#[derive(Debug, Clone)]
pub struct First<X>(pub X);

impl<A, B: Send, X: Transform<A>> Transform<(A, B)> for First<X> {
    type Output = (X::Output, B);
    fn apply(&self, (a, b): (A, B), rng: &mut Rng) -> Result<Self::Output, DataError> {
        Ok((self.0.apply(a, rng)?, b))
    }
}

/// A deterministic transform from a closure.
#[derive(Clone)]
pub struct FnTransform<F>(pub F);

impl<F> fmt::Debug for FnTransform<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTransform").finish_non_exhaustive()
    }
}

impl<T, U: Send, F: Fn(T) -> Result<U, DataError> + Send + Sync> Transform<T> for FnTransform<F> {
    type Output = U;
    fn apply(&self, input: T, _: &mut Rng) -> Result<U, DataError> {
        (self.0)(input)
    }
}

/// Where the channel axis of an image tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageLayout {
    /// `[channels, height, width]` (PyTorch).
    Chw,
    /// `[height, width, channels]` (decoded images, NumPy).
    Hwc,
}

impl ImageLayout {
    /// `(channels, height, width)` of a tensor in this layout.
    fn dims(self, t: &Tensor) -> Result<(usize, usize, usize), DataError> {
        self.dims_of(t.shape())
    }

    /// `(channels, height, width)` of a shape in this layout.
    fn dims_of(self, shape: &[usize]) -> Result<(usize, usize, usize), DataError> {
        match (self, shape) {
            (ImageLayout::Chw, &[c, h, w]) => Ok((c, h, w)),
            (ImageLayout::Hwc, &[h, w, c]) => Ok((c, h, w)),
            (_, s) => Err(DataError::ShapeMismatch(format!(
                "expected a 3-dimensional {self:?} image, got shape {s:?}"
            ))),
        }
    }

    fn shape(self, c: usize, h: usize, w: usize) -> [usize; 3] {
        match self {
            ImageLayout::Chw => [c, h, w],
            ImageLayout::Hwc => [h, w, c],
        }
    }
}

/// Per-channel normalisation of `u8` images to `f32` in CHW order:
/// `out = (x / 255 - mean[c]) / std[c]`, like `ToTensor()` + `Normalize(mean, std)`.
///
/// Computed as `x * scale[c] + bias[c]` (`scale = 1 / (255 std)`, `bias = -mean / std`) by
/// the vectorised [`NormalizeKernel`], on the widest path the running CPU has (AVX-512, AVX2 +
/// FMA, or a portable loop the compiler vectorises), chosen at run time: no `target-cpu`
/// flag is needed.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    kernel: NormalizeKernel,
}

impl Normalize {
    /// Normalisation with per-channel `mean` and `std` (on the `[0, 1]` scale) for
    /// images in `layout`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `mean` and `std` differ in length, are
    /// empty, or a `std` is zero, negative or not finite.
    pub fn new(mean: &[f32], std: &[f32], layout: ImageLayout) -> Result<Normalize, DataError> {
        Ok(Normalize {
            kernel: NormalizeKernel::new(mean, std, layout)?,
        })
    }

    /// ImageNet's mean and std.
    pub fn imagenet(layout: ImageLayout) -> Normalize {
        Normalize {
            kernel: NormalizeKernel::imagenet(layout),
        }
    }

    /// The kernel doing the work (its path, layout and channels).
    pub fn kernel(&self) -> &NormalizeKernel {
        &self.kernel
    }

    /// The same normalisation with a kernel configured otherwise (a forced path, streaming
    /// stores on or off).
    pub fn with_kernel(kernel: NormalizeKernel) -> Normalize {
        Normalize { kernel }
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

    fn channels(&self) -> usize {
        self.kernel.channels()
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
        match bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
            Ok(out) => self.apply_into(src, c, out),
            Err(_) => {
                // Storage not aligned for f32 (a plain Vec<u8>): correct, with one copy.
                let mut out = vec![0f32; src.len()];
                self.apply_into(src, c, &mut out)?;
                if dst.len() != out.len() * 4 {
                    return Err(DataError::BufferTooSmall {
                        what: "normalised image slot",
                        needed: out.len() * 4,
                        got: dst.len(),
                    });
                }
                dst.copy_from_slice(bytemuck::cast_slice(&out));
                Ok(())
            }
        }
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
/// `RandomHorizontalFlip`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomHorizontalFlip {
    p: f64,
    layout: ImageLayout,
}

impl RandomHorizontalFlip {
    /// Flips with probability `p`.
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
        if unit_f64(rng) < self.p {
            self.flip(&mut input)?;
        }
        Ok(input)
    }
}
