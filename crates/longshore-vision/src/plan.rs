//! [`Geometry`]: one image's path through a [`Compose`](crate::Compose) with every random
//! parameter drawn: the boxes, sizes and flips, and nothing of the pixels.
//!
//! A pipeline is run in two halves. [`Geometry::draw`] replays the steps on the image's
//! dimensions, drawing from the generator exactly as torchvision's transforms draw
//! (`RandomResizedCrop.get_params`, then the flip's coin, ...), and resolves what depends on
//! the image's size (a `Resize`'s output, a `CenterCrop`'s box). Then a renderer executes the
//! plan on pixels: the CPU pipeline ([`Compose::decode_into`](crate::Compose::decode_into))
//! and the nvJPEG device stage (longshore-nvjpeg reduces a plan to one resampling per output
//! pixel) both execute the same [`Geometry`], so one seed gives the same boxes and flips on
//! both paths and a draw is written once.
//!
//! ```
//! use longshore_vision::Compose;
//! use longshore_vision::plan::{Geometry, PlannedStep};
//!
//! let val = Compose::imagenet_val();
//! let mut rng = longshore_data::rng::epoch_rng(0, 0);
//! let g = Geometry::draw(val.steps(), 500, 375, &mut rng)?;
//! // Resize(256) of a 500x375 image is 341x256, then the centre 224x224 of it.
//! assert_eq!(g.steps()[0], PlannedStep::Resize { width: 341, height: 256, interpolation: Default::default() });
//! assert!(matches!(g.steps()[1], PlannedStep::Crop(b) if (b.left, b.top) == (58, 16)));
//! assert_eq!(g.output_size(), (224, 224));
//! # Ok::<(), longshore_data::DataError>(())
//! ```

use longshore_data::DataError;
use longshore_data::rng::Rng;

use crate::resize::SubBox;
use crate::transforms::{CropBox, Interpolation, Step};

/// One step of a [`Geometry`], resolved for its image: boxes are relative to the image as
/// the previous steps left it (mirrored, if a flip came before), in torchvision's
/// coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PlannedStep {
    /// The box `crop` (clamped to the image) resampled to `width x height`: a
    /// `RandomResizedCrop`'s drawn box or a fixed `ResizedCrop`.
    ResizedCrop {
        /// The box.
        crop: CropBox,
        /// Output width.
        width: usize,
        /// Output height.
        height: usize,
        /// The filter.
        interpolation: Interpolation,
    },
    /// The whole image resampled to `width x height` (a `Resize` that changes the size).
    Resize {
        /// Output width.
        width: usize,
        /// Output height.
        height: usize,
        /// The filter.
        interpolation: Interpolation,
    },
    /// The box `crop` of the image; where it extends past the image, zeros (a `CenterCrop`
    /// larger than its input pads).
    Crop(CropBox),
    /// The image mirrored left to right (a `RandomHorizontalFlip` whose coin came up).
    Flip,
}

/// One image's geometry through a pipeline; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Geometry {
    input: (usize, usize),
    steps: Vec<PlannedStep>,
    output: (usize, usize),
}

impl Geometry {
    /// Replays `steps` on a `width x height` image, drawing from `rng` as the transforms do
    /// (the only place a pipeline draws), and resolves each step for the image's size.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for an image with a zero side.
    pub fn draw(
        steps: &[Step],
        width: usize,
        height: usize,
        rng: &mut Rng,
    ) -> Result<Geometry, DataError> {
        if width == 0 || height == 0 {
            return Err(DataError::InvalidArgument {
                name: "image",
                reason: format!("a {width}x{height} image has no pixels"),
            });
        }
        let (mut w, mut h) = (width, height);
        let mut planned = Vec::with_capacity(steps.len());
        for step in steps {
            match step {
                Step::RandomResizedCrop(t) => {
                    let crop = t.get_params(w, h, rng);
                    let (oh, ow) = t.size();
                    planned.push(PlannedStep::ResizedCrop {
                        crop,
                        width: ow,
                        height: oh,
                        interpolation: t.get_interpolation(),
                    });
                    (w, h) = (ow, oh);
                }
                Step::ResizedCrop {
                    crop,
                    height: oh,
                    width: ow,
                    interpolation,
                } => {
                    planned.push(PlannedStep::ResizedCrop {
                        crop: *crop,
                        width: *ow,
                        height: *oh,
                        interpolation: *interpolation,
                    });
                    (w, h) = (*ow, *oh);
                }
                Step::Resize(t) => {
                    let (rw, rh) = t.output_size(w, h);
                    if (rw, rh) != (w, h) {
                        planned.push(PlannedStep::Resize {
                            width: rw,
                            height: rh,
                            interpolation: t.get_interpolation(),
                        });
                        (w, h) = (rw, rh);
                    }
                }
                Step::CenterCrop(t) => {
                    let b = t.get_params(w, h);
                    planned.push(PlannedStep::Crop(b));
                    (w, h) = (b.width, b.height);
                }
                Step::RandomHorizontalFlip(t) => {
                    if t.draw(rng) {
                        planned.push(PlannedStep::Flip);
                    }
                }
            }
        }
        Ok(Geometry {
            input: (width, height),
            steps: planned,
            output: (h, w),
        })
    }

    /// The resolved steps, in order.
    pub fn steps(&self) -> &[PlannedStep] {
        &self.steps
    }

    /// The image it was drawn for: `(width, height)`.
    pub fn input_size(&self) -> (usize, usize) {
        self.input
    }

    /// The size the steps produce: `(height, width)`, as [`Compose::output_size`](crate::Compose::output_size).
    pub fn output_size(&self) -> (usize, usize) {
        self.output
    }

    /// When the plan reads only part of its input, that part in the input's coordinates and
    /// how to render the plan on those pixels alone, writing what it writes on the whole image:
    /// a first step (after any flips) that is a resized crop or a crop inside the image reads
    /// its box, and the plan is re-based onto it; a first `Resize` whose result is cropped
    /// inside (the val pipeline, computed as one resize of the crop's source box) reads that
    /// box and its filter's reach, and the plan is rendered with the region's corner as its
    /// source's origin. `None` when the plan reads every pixel.
    #[cfg(feature = "libjpeg")]
    pub(crate) fn source_region(&self) -> Option<(SourceRegion, RegionPlan)> {
        let (width, height) = self.input;
        let first = self.steps.iter().position(|s| *s != PlannedStep::Flip)?;
        if let (
            0,
            PlannedStep::Resize {
                width: w,
                height: h,
                interpolation,
            },
            Some(PlannedStep::Crop(b)),
        ) = (first, self.steps[0], self.steps.get(1))
        {
            let sub = fused_sub_box(width, height, w, h, interpolation, *b)?;
            // fast_image_resize reads, for each output pixel, the source pixels within the
            // filter's support times the scale of its centre (a centre lies inside the box);
            // two more pixels on each side absorb the floating-point rounding of the bounds.
            let support = match interpolation {
                Interpolation::Bilinear => 1.0,
                Interpolation::Bicubic => 2.0,
                Interpolation::Nearest => return None,
            };
            let (rx, ry) = (
                support * (sub.width / b.width as f64).max(1.0),
                support * (sub.height / b.height as f64).max(1.0),
            );
            let span = |lo: f64, len: f64, reach: f64, all: usize| {
                let start = (lo - reach).floor() - 2.0;
                let end = (lo + len + reach).ceil() + 2.0;
                let start = start.max(0.0) as usize;
                let end = (end.max(0.0) as usize).min(all);
                (start.min(end), end)
            };
            let (x0, x1) = span(sub.left, sub.width, rx, width);
            let (y0, y1) = span(sub.top, sub.height, ry, height);
            if x1 <= x0 || y1 <= y0 || (x1 - x0, y1 - y0) == (width, height) {
                return None;
            }
            let region = SourceRegion {
                x: x0,
                y: y0,
                w: x1 - x0,
                h: y1 - y0,
            };
            return Some((region, RegionPlan::Offset));
        }
        let mirrored = first % 2 == 1;
        let (crop, clamp) = match self.steps[first] {
            PlannedStep::ResizedCrop { crop, .. } => (crop, true),
            PlannedStep::Crop(crop) => (crop, false),
            _ => return None,
        };
        let (left, top) = (crop.left.max(0) as usize, crop.top.max(0) as usize);
        if !clamp
            && (crop.left < 0
                || crop.top < 0
                || left + crop.width > width
                || top + crop.height > height)
        {
            // A crop that pads: the renderer's zeros are outside any region.
            return None;
        }
        // As the renderer clamps a resized crop's box to the image.
        let (left, top) = (left.min(width), top.min(height));
        let (w, h) = (crop.width.min(width - left), crop.height.min(height - top));
        if w == 0 || h == 0 || (w, h) == (width, height) {
            return None;
        }
        // The box is in the mirrored image's coordinates when an odd number of flips came first.
        let x = if mirrored { width - left - w } else { left };
        let mut steps = self.steps.clone();
        let whole = CropBox {
            top: 0,
            left: 0,
            height: h,
            width: w,
        };
        match &mut steps[first] {
            PlannedStep::ResizedCrop { crop, .. } | PlannedStep::Crop(crop) => *crop = whole,
            _ => unreachable!("matched above"),
        }
        let region = SourceRegion { x, y: top, w, h };
        Some((
            region,
            RegionPlan::Rebased(Geometry {
                input: (w, h),
                steps,
                output: self.output,
            }),
        ))
    }
}

/// How a [`Geometry`] is rendered on the region of its input it reads
/// ([`Geometry::source_region`]).
#[cfg(feature = "libjpeg")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RegionPlan {
    /// This plan, drawn for the region's pixels alone.
    Rebased(Geometry),
    /// The plan as drawn, its source's origin at the region's corner.
    Offset,
}

/// The part of an image a [`Geometry`] reads: `w x h` pixels from column `x`, row `y`.
#[cfg_attr(not(feature = "libjpeg"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SourceRegion {
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) w: usize,
    pub(crate) h: usize,
}

/// The source box of a `Resize` to `w x h` of a `view_w x view_h` view followed by the crop `b`
/// of its result, in the view's coordinates, when the two are computed as one resize of that
/// box: `b` inside the resize, shrinking (the ImageNet case), not nearest neighbour (upscaling a
/// fractional box and nearest neighbour's pick of a source pixel are not shift-invariant in
/// fast_image_resize: a proptest found 2 levels off when upscaling 50x75 to 60x90).
pub(crate) fn fused_sub_box(
    view_w: usize,
    view_h: usize,
    w: usize,
    h: usize,
    interpolation: Interpolation,
    b: CropBox,
) -> Option<SubBox> {
    let fusable = interpolation != Interpolation::Nearest && w <= view_w && h <= view_h;
    let inside = b.top >= 0
        && b.left >= 0
        && b.top as usize + b.height <= h
        && b.left as usize + b.width <= w;
    if !(fusable && inside) {
        return None;
    }
    let (sx, sy) = (view_w as f64 / w as f64, view_h as f64 / h as f64);
    let (left, top) = (b.left as f64 * sx, b.top as f64 * sy);
    // Clamped to the view: `b.width * sx` can exceed it by a rounding error when the crop
    // reaches the edge (55x54 -> 21x21, crop 21).
    Some(SubBox {
        left,
        top,
        width: (b.width as f64 * sx).min(view_w as f64 - left),
        height: (b.height as f64 * sy).min(view_h as f64 - top),
    })
}
