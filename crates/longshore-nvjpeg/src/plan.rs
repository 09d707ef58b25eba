//! [`SamplePlan`]: a [`Compose`](longshore_vision::Compose)'s [`Geometry`] for one image
//! reduced to one resampling, and [`render_reference`], the device kernel's arithmetic on the
//! CPU.
//!
//! The CPU pipeline renders a plan step by step on pixels; the device runs one kernel per
//! output pixel. Both execute the one [`Geometry`] that longshore-vision draws for the image
//! (the boxes, sizes and flips, drawn once, in vision, from the sample's generator), so the
//! same seed gives the same boxes on both paths. Here the plan's steps are composed on the
//! image's *dimensions*, and what they do to the pixels is summed up as:
//!
//! 1. a box of the decoded image (`box_*`) resampled to `resized_w x resized_h` with PIL's
//!    antialiased bilinear filter (an identity resampling when no step resizes);
//! 2. a window of the resized image (`view_*`, of the output's size) whose pixels outside
//!    `valid_*` are zero (a `CenterCrop` larger than its input pads with zeros);
//! 3. mirrored when `flip` is set.
//!
//! A flip before the resize is carried through it: PIL's filter is symmetric, so resizing a
//! mirrored box equals mirroring the resized one. Supported pipelines: any number of crops and
//! flips around at most one resampling step (`Resize`, `RandomResizedCrop` or a fixed
//! `ResizedCrop`), bilinear (torchvision's default); padding before the resampling step is not.

use longshore_data::DataError;
use longshore_data::rng::Rng;

use longshore_vision::compose::Step;
use longshore_vision::plan::{Geometry, PlannedStep};
use longshore_vision::transforms::{CropBox, Interpolation};

/// Where each pixel of one output image comes from; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SamplePlan {
    /// Left edge of the resampled box, in the decoded image.
    pub box_x: i64,
    /// Top edge of the resampled box.
    pub box_y: i64,
    /// Width of the resampled box.
    pub box_w: i64,
    /// Height of the resampled box.
    pub box_h: i64,
    /// Width the box is resampled to.
    pub resized_w: i64,
    /// Height the box is resampled to.
    pub resized_h: i64,
    /// Left edge of the output window in the resized image (negative where it pads).
    pub view_x: i64,
    /// Top edge of the output window.
    pub view_y: i64,
    /// First column of the resized image that has pixels (zero outside).
    pub valid_x0: i64,
    /// First row that has pixels.
    pub valid_y0: i64,
    /// One past the last column that has pixels.
    pub valid_x1: i64,
    /// One past the last row that has pixels.
    pub valid_y1: i64,
    /// Whether the output is mirrored left to right.
    pub flip: bool,
}

/// Number of `i64` a [`SamplePlan`] takes in a batch's metadata.
pub(crate) const PLAN_FIELDS: usize = 13;

impl SamplePlan {
    /// The plan as `i64`s (for a batch's metadata tensor).
    pub(crate) fn to_fields(self) -> [i64; PLAN_FIELDS] {
        [
            self.box_x,
            self.box_y,
            self.box_w,
            self.box_h,
            self.resized_w,
            self.resized_h,
            self.view_x,
            self.view_y,
            self.valid_x0,
            self.valid_y0,
            self.valid_x1,
            self.valid_y1,
            i64::from(self.flip),
        ]
    }

    /// The inverse of [`SamplePlan::to_fields`].
    pub(crate) fn from_fields(f: &[i64; PLAN_FIELDS]) -> SamplePlan {
        SamplePlan {
            box_x: f[0],
            box_y: f[1],
            box_w: f[2],
            box_h: f[3],
            resized_w: f[4],
            resized_h: f[5],
            view_x: f[6],
            view_y: f[7],
            valid_x0: f[8],
            valid_y0: f[9],
            valid_x1: f[10],
            valid_y1: f[11],
            flip: f[12] != 0,
        }
    }
}

fn unsupported(reason: impl Into<String>) -> DataError {
    DataError::InvalidArgument {
        name: "transform",
        reason: format!(
            "{} (device decoding supports crops and flips around at most one bilinear resize)",
            reason.into()
        ),
    }
}

/// Checks, before any image is seen, that `steps` reduce to one plan: at most one step that
/// always resamples or may (`Resize`, `RandomResizedCrop`, `ResizedCrop`), all bilinear.
///
/// # Errors
/// [`DataError::InvalidArgument`] naming what is not supported.
pub fn check_steps(steps: &[Step]) -> Result<(), DataError> {
    let mut resampling = 0;
    for s in steps {
        let interpolation = match s {
            Step::RandomResizedCrop(t) => Some(t.get_interpolation()),
            Step::Resize(t) => Some(t.get_interpolation()),
            Step::ResizedCrop { interpolation, .. } => Some(*interpolation),
            Step::CenterCrop(_) | Step::RandomHorizontalFlip(_) => None,
            other => return Err(unsupported(format!("the step {other:?}"))),
        };
        if let Some(i) = interpolation {
            resampling += 1;
            if i != Interpolation::Bilinear {
                return Err(unsupported(format!("{i:?} interpolation")));
            }
        }
    }
    if resampling > 1 {
        return Err(unsupported(format!("{resampling} resizing steps")));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct Rect {
    x: i64,
    y: i64,
    w: i64,
    h: i64,
}

struct State {
    /// The view, in the current space (the decoded image, or the resized one).
    view: Rect,
    /// Where the current space has pixels: `(x0, y0, x1, y1)`.
    valid: (i64, i64, i64, i64),
    flip: bool,
    resample: Option<(Rect, i64, i64)>,
}

impl State {
    /// `b` (relative to the logical image, that is the view mirrored if `flip`) in the current
    /// space, clamped to the view as the CPU pipeline's `sub_rect` does.
    fn sub_rect(&self, b: CropBox) -> Rect {
        let v = self.view;
        let lx = b.left.clamp(0, v.w);
        let ly = b.top.clamp(0, v.h);
        let w = (b.width as i64).min(v.w - lx);
        let h = (b.height as i64).min(v.h - ly);
        let x = if self.flip {
            v.x + v.w - lx - w
        } else {
            v.x + lx
        };
        Rect {
            x,
            y: v.y + ly,
            w,
            h,
        }
    }

    /// `b` unclamped (it may extend past the view: the CPU pipeline pads with zeros).
    fn padded_rect(&self, b: CropBox) -> Rect {
        let v = self.view;
        let w = b.width as i64;
        let x = if self.flip {
            v.x + v.w - b.left - w
        } else {
            v.x + b.left
        };
        Rect {
            x,
            y: v.y + b.top,
            w,
            h: b.height as i64,
        }
    }

    fn view_has_pixels(&self) -> bool {
        let (v, (x0, y0, x1, y1)) = (self.view, self.valid);
        v.x >= x0 && v.y >= y0 && v.x + v.w <= x1 && v.y + v.h <= y1
    }

    fn resample(&mut self, what: &str, rect: Rect, w: i64, h: i64) -> Result<(), DataError> {
        if self.resample.is_some() {
            return Err(unsupported(format!("a second resize ({what})")));
        }
        if !self.view_has_pixels() {
            return Err(unsupported(format!("padding before {what}")));
        }
        if rect.w <= 0 || rect.h <= 0 {
            return Err(DataError::InvalidArgument {
                name: "crop",
                reason: format!("the box of {what} has no pixels inside the image"),
            });
        }
        self.resample = Some((rect, w, h));
        self.view = Rect { x: 0, y: 0, w, h };
        self.valid = (0, 0, w, h);
        Ok(())
    }
}

/// Draws `steps`' geometry for a `width x height` image ([`Geometry::draw`], the draws of the
/// CPU pipeline) and reduces it to one resampling per output pixel
/// ([`SamplePlan::from_geometry`]).
///
/// # Errors
/// As [`SamplePlan::from_geometry`]; [`DataError::ShapeMismatch`] when the result is not
/// `out_h x out_w`.
pub fn plan(
    steps: &[Step],
    width: usize,
    height: usize,
    (out_h, out_w): (usize, usize),
    rng: &mut Rng,
) -> Result<SamplePlan, DataError> {
    let geometry = Geometry::draw(steps, width, height, rng)?;
    if geometry.output_size() != (out_h, out_w) {
        let (h, w) = geometry.output_size();
        return Err(DataError::ShapeMismatch(format!(
            "pipeline produced a {w}x{h} image, its output is {out_w}x{out_h}"
        )));
    }
    SamplePlan::from_geometry(&geometry)
}

impl SamplePlan {
    /// Where each output pixel of `geometry` comes from: its crops and flips composed around
    /// its one resampling (the device kernel's input); see the [module docs](self).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a second resampling, one that is not bilinear, or
    /// padding before the resampling.
    pub fn from_geometry(geometry: &Geometry) -> Result<SamplePlan, DataError> {
        let (width, height) = geometry.input_size();
        let (w, h) = (width as i64, height as i64);
        let mut s = State {
            view: Rect { x: 0, y: 0, w, h },
            valid: (0, 0, w, h),
            flip: false,
            resample: None,
        };
        for step in geometry.steps() {
            match *step {
                PlannedStep::ResizedCrop {
                    crop,
                    width,
                    height,
                    interpolation,
                } => {
                    check_bilinear(interpolation)?;
                    let rect = s.sub_rect(crop);
                    s.resample("a resized crop", rect, width as i64, height as i64)?;
                }
                PlannedStep::Resize {
                    width,
                    height,
                    interpolation,
                } => {
                    check_bilinear(interpolation)?;
                    let view = s.view;
                    s.resample("Resize", view, width as i64, height as i64)?;
                }
                PlannedStep::Crop(b) => {
                    let inside = b.top >= 0
                        && b.left >= 0
                        && b.top + b.height as i64 <= s.view.h
                        && b.left + b.width as i64 <= s.view.w;
                    if inside {
                        s.view = s.sub_rect(b);
                    } else {
                        let v = s.view;
                        let (x0, y0, x1, y1) = s.valid;
                        s.valid = (
                            x0.max(v.x),
                            y0.max(v.y),
                            x1.min(v.x + v.w),
                            y1.min(v.y + v.h),
                        );
                        s.view = s.padded_rect(b);
                    }
                }
                PlannedStep::Flip => s.flip = !s.flip,
                other => return Err(unsupported(format!("the step {other:?}"))),
            }
        }
        let (b, rw, rh) = s.resample.unwrap_or((Rect { x: 0, y: 0, w, h }, w, h));
        Ok(SamplePlan {
            box_x: b.x,
            box_y: b.y,
            box_w: b.w,
            box_h: b.h,
            resized_w: rw,
            resized_h: rh,
            view_x: s.view.x,
            view_y: s.view.y,
            valid_x0: s.valid.0,
            valid_y0: s.valid.1,
            valid_x1: s.valid.2,
            valid_y1: s.valid.3,
            flip: s.flip,
        })
    }
}

fn check_bilinear(i: Interpolation) -> Result<(), DataError> {
    if i == Interpolation::Bilinear {
        Ok(())
    } else {
        Err(unsupported(format!("{i:?} interpolation")))
    }
}

/// The taps of PIL's antialiased bilinear filter for output coordinate `o` of a box of `size`
/// input pixels resampled to `out` (box-relative: reads stay inside the box, as when PIL
/// crops first): the first input index and the normalised weights. The kernel computes
/// exactly this, in `f32`.
pub(crate) fn taps(o: i64, size: i64, out: i64) -> (i64, Vec<f32>) {
    let scale = size as f32 / out as f32;
    let fscale = scale.max(1.0);
    let support = fscale;
    let center = (o as f32 + 0.5) * scale;
    let lo = ((center - support + 0.5) as i64).max(0);
    let hi = ((center + support + 0.5) as i64).min(size);
    let mut w: Vec<f32> = (lo..hi)
        .map(|i| {
            let x = ((i as f32 - center + 0.5) / fscale).abs();
            if x < 1.0 { 1.0 - x } else { 0.0 }
        })
        .collect();
    let sum: f32 = w.iter().sum();
    if sum > 0.0 {
        w.iter_mut().for_each(|v| *v /= sum);
    }
    (lo, w)
}

/// PIL's rounding of a filtered value to 8 bits: half up, clipped.
pub(crate) fn clip8(v: f32) -> u8 {
    (v + 0.5).floor().clamp(0.0, 255.0) as u8
}

/// What the device kernel writes for one image, computed on the CPU: the RGB pixels (HWC) of
/// the `out_w x out_h` output of `plan` on `src` (`width x height`, RGB HWC). Vertical pass
/// then horizontal, each rounded to 8 bits, in the order fast_image_resize (the CPU path) uses
/// for 8-bit images; PIL runs the horizontal pass first, which changes some values by 1.
///
/// # Panics
/// When `src` is shorter than `width * height * 3` or the plan's box lies outside it.
pub fn render_reference(
    plan: &SamplePlan,
    src: &[u8],
    width: usize,
    out_w: usize,
    out_h: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; out_w * out_h * 3];
    for oy in 0..out_h as i64 {
        for ox in 0..out_w as i64 {
            let lx = if plan.flip { out_w as i64 - 1 - ox } else { ox };
            let (rx, ry) = (plan.view_x + lx, plan.view_y + oy);
            if rx < plan.valid_x0
                || rx >= plan.valid_x1
                || ry < plan.valid_y0
                || ry >= plan.valid_y1
            {
                continue;
            }
            let (x0, wx) = taps(rx, plan.box_w, plan.resized_w);
            let (y0, wy) = taps(ry, plan.box_h, plan.resized_h);
            for c in 0..3 {
                let mut acc = 0f32;
                for (i, wxi) in wx.iter().enumerate() {
                    let col = (plan.box_x + x0 + i as i64) as usize;
                    let mut v = 0f32;
                    for (j, wyj) in wy.iter().enumerate() {
                        let row = (plan.box_y + y0 + j as i64) as usize;
                        v += wyj * f32::from(src[(row * width + col) * 3 + c]);
                    }
                    acc += wxi * f32::from(clip8(v));
                }
                out[((oy as usize) * out_w + ox as usize) * 3 + c] = clip8(acc);
            }
        }
    }
    out
}
