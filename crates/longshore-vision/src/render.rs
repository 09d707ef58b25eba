//! The CPU renderer of a [`Geometry`]: the pixels between steps (a view of them, a pending
//! flip), the thread's scratch buffers, and the output writers ([`Compose`](crate::Compose)'s
//! `ToTensor` + `Normalize`, or raw u8 CHW/HWC).

use std::borrow::Cow;
use std::cell::RefCell;

use fast_image_resize::Resizer;
use longshore_data::{DataError, ImageLayout};

use crate::plan::{Geometry, PlannedStep, SourceRegion, fused_sub_box};
use crate::resize::{Rect, SubBox, resize_box};
use crate::transforms::{CropBox, Interpolation, Normalize};

/// Executes `geometry` on the pixels `src` (`width x height`, RGB HWC): the CPU renderer of
/// a plan. A crop only narrows a view of the current pixels, a resize reads only its box, a
/// flip waits for the next geometric step or the output writer.
///
/// A source with an `origin` holds only that region of the image the plan was drawn for (a
/// JPEG decoded there alone): the plan must start with a `Resize` and a crop inside its result
/// ([`Geometry::source_region`]'s offset case), whose source box is read from the region.
pub(crate) fn render<'a>(
    geometry: &Geometry,
    src: Source<'a>,
    s: &mut Scratch,
) -> Result<Current<'a>, DataError> {
    let (width, height) = (src.width, src.height);
    let drawn_for = match src.origin {
        Some(r) if r.x + r.w <= geometry.input_size().0 && r.y + r.h <= geometry.input_size().1 => {
            (r.w, r.h)
        }
        Some(_) => (0, 0),
        None => geometry.input_size(),
    };
    if drawn_for != (width, height) {
        return Err(DataError::ShapeMismatch(format!(
            "a plan drawn for a {}x{} image, rendered on a {width}x{height} one{}",
            geometry.input_size().0,
            geometry.input_size().1,
            src.origin
                .map(|r| format!(" at {:?}", r))
                .unwrap_or_default()
        )));
    }
    let mut cur = Current {
        pixels: Cow::Borrowed(src.pixels),
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
    if let Some(r) = src.origin {
        // The region's fused resize + crop: the source box as the whole image's, moved by the
        // region's corner (integers: the move is exact), read from the region's pixels.
        let (w_all, h_all) = geometry.input_size();
        let fused = match (steps.next(), steps.next()) {
            (
                Some(&PlannedStep::Resize {
                    width: w,
                    height: h,
                    interpolation,
                }),
                Some(&PlannedStep::Crop(b)),
            ) => fused_sub_box(w_all, h_all, w, h, interpolation, b)
                .map(|sub| (sub, b, interpolation)),
            _ => None,
        };
        let Some((sub, b, interpolation)) = fused else {
            return Err(DataError::ShapeMismatch(
                "a plan rendered on a region must start with a resize and a crop inside it".into(),
            ));
        };
        let sub = SubBox {
            left: sub.left - r.x as f64,
            top: sub.top - r.y as f64,
            ..sub
        };
        let rect = cur.view;
        cur.resize(s, rect, sub, b.width, b.height, interpolation)?;
    }
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
                // part is computed, from the source box that maps onto it.
                if let Some(&&PlannedStep::Crop(b)) = steps.peek() {
                    let (vw, vh) = (cur.view.w, cur.view.h);
                    if let Some(sub) = fused_sub_box(vw, vh, w, h, interpolation, b) {
                        steps.next();
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

/// The pixels a plan is rendered on: a whole image, or (with `origin`) the region of it a
/// JPEG was decoded in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub(crate) pixels: &'a [u8],
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) origin: Option<SourceRegion>,
}

impl<'a> Source<'a> {
    /// A whole `width x height` image.
    pub(crate) fn whole(pixels: &'a [u8], width: usize, height: usize) -> Source<'a> {
        Source {
            pixels,
            width,
            height,
            origin: None,
        }
    }
}

/// Buffers a worker thread reuses for every image.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The output view's pixels, gathered when they are not one whole buffer to normalise.
    view: Vec<u8>,
    pub(crate) decoded: Vec<u8>,
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
pub(crate) struct Current<'a> {
    pixels: Cow<'a, [u8]>,
    width: usize,
    height: usize,
    pub(crate) view: Rect,
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

    pub(crate) fn recycle(self, s: &mut Scratch) {
        if let Cow::Owned(v) = self.pixels {
            s.spare = v;
        }
    }

    /// Writes the view as normalised f32 CHW into `out` with `n`'s vectorised kernel (one
    /// fused multiply-add per value, non-temporal stores for a batch slot). The kernel reads
    /// the pixels in place when the view is the whole image (a pending flip applied to pixels
    /// this pipeline owns); otherwise the view is gathered (and mirrored) into a reused buffer
    /// first.
    pub(crate) fn write_normalized(
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
    pub(crate) fn write_u8(&self, layout: ImageLayout, out: &mut [u8]) {
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
