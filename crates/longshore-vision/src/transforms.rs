//! torchvision's transforms, with its parameters, defaults and rounding
//! (`torchvision/transforms/transforms.py` and `functional.py`).
//!
//! Each transform here computes *geometry* (which box of the image, what output size);
//! [`crate::Compose`] runs them on pixels, cropping before resizing so no full-size copy
//! is ever made, and writes the result straight into a batch slot.
//!
//! [`Normalize`] and [`RandomHorizontalFlip`] are longshore-data's (re-exported here): the
//! `.npy` image datasets, these pipelines and the device kernels share one definition.

use longshore_data::DataError;
use longshore_data::rng::{Rng, below, unit_f32};
pub use longshore_data::{Normalize, RandomHorizontalFlip};

/// A box of an image: `top`, `left` (may be negative when a crop pads), `height`, `width`,
/// in torchvision's `(i, j, h, w)` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CropBox {
    /// First row (`i`).
    pub top: i64,
    /// First column (`j`).
    pub left: i64,
    /// Rows (`h`).
    pub height: usize,
    /// Columns (`w`).
    pub width: usize,
}

/// Python's `round()` on floats: halves to even.
pub fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// `torch.empty(1).uniform_(a, b)` on a float32 tensor.
fn uniform_f32(rng: &mut Rng, a: f32, b: f32) -> f32 {
    a + (b - a) * unit_f32(rng)
}

/// Interpolation of a resize (torchvision's `InterpolationMode`), as PIL computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Interpolation {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear with antialiasing when downscaling (PIL's BILINEAR; torchvision's default).
    #[default]
    Bilinear,
    /// Bicubic with antialiasing (PIL's BICUBIC).
    Bicubic,
}

fn check_size(name: &'static str, h: usize, w: usize) -> Result<(), DataError> {
    if h == 0 || w == 0 {
        return Err(DataError::InvalidArgument {
            name,
            reason: format!("size ({h}, {w}) must be positive"),
        });
    }
    Ok(())
}

/// `RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3/4, 4/3))`: a random box of random
/// area and aspect ratio, resized to `size`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    size: (usize, usize),
    scale: (f64, f64),
    ratio: (f64, f64),
    interpolation: Interpolation,
}

impl RandomResizedCrop {
    /// A square output of `size x size` with torchvision's defaults.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `size` is 0.
    pub fn new(size: usize) -> Result<RandomResizedCrop, DataError> {
        RandomResizedCrop::with_size(size, size)
    }

    /// An output of `height x width` with torchvision's defaults.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when a side is 0.
    pub fn with_size(height: usize, width: usize) -> Result<RandomResizedCrop, DataError> {
        check_size("size", height, width)?;
        Ok(RandomResizedCrop {
            size: (height, width),
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            interpolation: Interpolation::Bilinear,
        })
    }

    /// The range of the box's area as a fraction of the image's (default `(0.08, 1.0)`).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] unless `0 < min <= max` and both are finite.
    pub fn scale(mut self, min: f64, max: f64) -> Result<RandomResizedCrop, DataError> {
        if !(min.is_finite() && max.is_finite() && min > 0.0 && min <= max) {
            return Err(DataError::InvalidArgument {
                name: "scale",
                reason: format!("({min}, {max}) must satisfy 0 < min <= max"),
            });
        }
        self.scale = (min, max);
        Ok(self)
    }

    /// The range of the box's aspect ratio, width / height (default `(3/4, 4/3)`).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] unless `0 < min <= max` and both are finite.
    pub fn ratio(mut self, min: f64, max: f64) -> Result<RandomResizedCrop, DataError> {
        if !(min.is_finite() && max.is_finite() && min > 0.0 && min <= max) {
            return Err(DataError::InvalidArgument {
                name: "ratio",
                reason: format!("({min}, {max}) must satisfy 0 < min <= max"),
            });
        }
        self.ratio = (min, max);
        Ok(self)
    }

    /// The interpolation (default bilinear, antialiased).
    pub fn interpolation(mut self, interpolation: Interpolation) -> RandomResizedCrop {
        self.interpolation = interpolation;
        self
    }

    /// Output `(height, width)`.
    pub fn size(&self) -> (usize, usize) {
        self.size
    }

    /// The configured interpolation.
    pub fn get_interpolation(&self) -> Interpolation {
        self.interpolation
    }

    /// torchvision's `RandomResizedCrop.get_params`: up to 10 draws of an area fraction
    /// (uniform in `scale`) and an aspect ratio (log-uniform in `ratio`) whose rounded box
    /// fits the image, placed uniformly; otherwise the central crop clamped to `ratio`.
    pub fn get_params(&self, width: usize, height: usize, rng: &mut Rng) -> CropBox {
        let area = (height * width) as f64;
        // torch.log(torch.tensor(ratio)) is float32, and so are its uniform draws.
        let log_ratio = ((self.ratio.0 as f32).ln(), (self.ratio.1 as f32).ln());
        for _ in 0..10 {
            let frac = uniform_f32(rng, self.scale.0 as f32, self.scale.1 as f32);
            let target_area = area * f64::from(frac);
            let aspect = f64::from(uniform_f32(rng, log_ratio.0, log_ratio.1).exp());
            let w = round_half_even((target_area * aspect).sqrt());
            let h = round_half_even((target_area / aspect).sqrt());
            if w > 0.0 && w <= width as f64 && h > 0.0 && h <= height as f64 {
                let (w, h) = (w as usize, h as usize);
                let i = below(rng, (height - h + 1) as u64) as i64;
                let j = below(rng, (width - w + 1) as u64) as i64;
                return CropBox {
                    top: i,
                    left: j,
                    height: h,
                    width: w,
                };
            }
        }
        // Fallback to the central crop.
        let in_ratio = width as f64 / height as f64;
        let (min_r, max_r) = (
            self.ratio.0.min(self.ratio.1),
            self.ratio.0.max(self.ratio.1),
        );
        let (w, h) = if in_ratio < min_r {
            (width, round_half_even(width as f64 / min_r) as usize)
        } else if in_ratio > max_r {
            (round_half_even(height as f64 * max_r) as usize, height)
        } else {
            (width, height)
        };
        CropBox {
            top: ((height - h.min(height)) / 2) as i64,
            left: ((width - w.min(width)) / 2) as i64,
            height: h,
            width: w,
        }
    }
}

/// `Resize(size)`: the shorter side to `size` keeping the aspect ratio (torchvision truncates
/// the longer side: `int(size * long / short)`), or exactly `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resize {
    size: ResizeTo,
    max_size: Option<usize>,
    interpolation: Interpolation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResizeTo {
    Shorter(usize),
    Exact(usize, usize),
}

impl Resize {
    /// The shorter side to `size` (torchvision's `Resize(int)`).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `size` is 0.
    pub fn new(size: usize) -> Result<Resize, DataError> {
        check_size("size", size, size)?;
        Ok(Resize {
            size: ResizeTo::Shorter(size),
            max_size: None,
            interpolation: Interpolation::Bilinear,
        })
    }

    /// Exactly `height x width` (torchvision's `Resize((h, w))`).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when a side is 0.
    pub fn exact(height: usize, width: usize) -> Result<Resize, DataError> {
        check_size("size", height, width)?;
        Ok(Resize {
            size: ResizeTo::Exact(height, width),
            max_size: None,
            interpolation: Interpolation::Bilinear,
        })
    }

    /// torchvision's `max_size`: the longer side is capped, shrinking the shorter one.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for an exact size or a `max_size` not larger than `size`.
    pub fn max_size(mut self, max_size: usize) -> Result<Resize, DataError> {
        match self.size {
            ResizeTo::Shorter(s) if max_size > s => {
                self.max_size = Some(max_size);
                Ok(self)
            }
            _ => Err(DataError::InvalidArgument {
                name: "max_size",
                reason: format!(
                    "max_size {max_size} needs a single size smaller than it, got {:?}",
                    self.size
                ),
            }),
        }
    }

    /// The interpolation (default bilinear, antialiased).
    pub fn interpolation(mut self, interpolation: Interpolation) -> Resize {
        self.interpolation = interpolation;
        self
    }

    /// The configured interpolation.
    pub fn get_interpolation(&self) -> Interpolation {
        self.interpolation
    }

    /// The fixed output `(height, width)`, when it does not depend on the image.
    pub fn fixed_size(&self) -> Option<(usize, usize)> {
        match self.size {
            ResizeTo::Exact(h, w) => Some((h, w)),
            ResizeTo::Shorter(_) => None,
        }
    }

    /// torchvision's `_compute_resized_output_size`: the output `(width, height)` for an
    /// input of `width x height`.
    pub fn output_size(&self, width: usize, height: usize) -> (usize, usize) {
        match self.size {
            ResizeTo::Exact(h, w) => (w, h),
            ResizeTo::Shorter(size) => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                let (mut new_short, mut new_long) =
                    (size, (size as f64 * long as f64 / short as f64) as usize);
                if let Some(max) = self.max_size
                    && new_long > max
                {
                    new_short = (max as f64 * new_short as f64 / new_long as f64) as usize;
                    new_long = max;
                }
                let (new_short, new_long) = (new_short.max(1), new_long.max(1));
                if width <= height {
                    (new_short, new_long)
                } else {
                    (new_long, new_short)
                }
            }
        }
    }
}

/// `CenterCrop(size)`: the central box, with torchvision's rounding
/// (`int(round((H - h) / 2))`, halves to even) and zero padding when the crop is larger
/// than the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CenterCrop {
    size: (usize, usize),
}

impl CenterCrop {
    /// A square crop.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `size` is 0.
    pub fn new(size: usize) -> Result<CenterCrop, DataError> {
        CenterCrop::with_size(size, size)
    }

    /// A `height x width` crop.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when a side is 0.
    pub fn with_size(height: usize, width: usize) -> Result<CenterCrop, DataError> {
        check_size("size", height, width)?;
        Ok(CenterCrop {
            size: (height, width),
        })
    }

    /// Output `(height, width)`.
    pub fn size(&self) -> (usize, usize) {
        self.size
    }

    /// The box in the image's coordinates; `top`/`left` are negative where the crop extends
    /// past the image (those pixels are zero), placed as torchvision pads: the image is first
    /// padded by `(crop - size) // 2` before and `(crop - size + 1) // 2` after.
    pub fn get_params(&self, width: usize, height: usize) -> CropBox {
        let (ch, cw) = self.size;
        let axis = |size: usize, crop: usize| -> i64 {
            if crop > size {
                // Padded to `crop` exactly, then cropped at 0.
                -(((crop - size) / 2) as i64)
            } else {
                round_half_even((size - crop) as f64 / 2.0) as i64
            }
        };
        CropBox {
            top: axis(height, ch),
            left: axis(width, cw),
            height: ch,
            width: cw,
        }
    }
}

/// One step of a [`Compose`](crate::Compose). A [`RandomHorizontalFlip`] step mirrors the
/// decoded image, whatever the layout it was built with.
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
        interpolation: Interpolation,
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
