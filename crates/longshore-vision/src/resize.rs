//! Resizing a box of an RGB image with [`fast_image_resize`]: SIMD convolution (SSE4.1,
//! AVX2, NEON, chosen at run time) with PIL's separable filters and support, so a box
//! resized here matches PIL's `img.crop(box).resize(size, BILINEAR)` to within rounding.

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use longshore_data::DataError;

use crate::transforms::Interpolation;

/// A box of an image with non-negative coordinates inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) w: usize,
    pub(crate) h: usize,
}

fn fir_err(what: &str, e: impl std::fmt::Display) -> DataError {
    DataError::Other(format!("resize failed ({what}): {e}"))
}

fn u32_of(v: usize, what: &'static str) -> Result<u32, DataError> {
    u32::try_from(v).map_err(|_| DataError::Overflow(what))
}

/// A box of a [`Rect`] in fractional pixels, relative to the rect's corner: the part of the
/// rect's resize that is kept ([`resize_box`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SubBox {
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) width: f64,
    pub(crate) height: f64,
}

impl SubBox {
    /// The whole of `rect`.
    pub(crate) fn whole(rect: Rect) -> SubBox {
        SubBox {
            left: 0.0,
            top: 0.0,
            width: rect.w as f64,
            height: rect.h as f64,
        }
    }
}

/// Resizes the box `rect` of `src` (`src_w` pixels wide, RGB) to `dst_w x dst_h`, into
/// `dst` (resized to fit). Pixels outside the box are not read, as when PIL crops first.
///
/// `sub` narrows what is computed without changing the result's pixels: the output is the
/// part of `rect` resized at the scale `sub` sets (`sub.width / dst_w`) whose source is
/// `sub`, with the filter still reading the neighbours of `sub` inside `rect`. So resizing
/// `rect` to `W x H` and cropping the box `(x, y, w, h)` of the result equals resizing with
/// `sub = (x * rect.w / W, y * rect.h / H, w * rect.w / W, h * rect.h / H)` to `w x h`
/// (PIL's `resize(size, box=...)` has the same meaning).
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_box(
    resizer: &mut Resizer,
    src: &[u8],
    src_w: usize,
    src_h: usize,
    rect: Rect,
    sub: SubBox,
    dst: &mut Vec<u8>,
    dst_w: usize,
    dst_h: usize,
    interpolation: Interpolation,
) -> Result<(), DataError> {
    let image = ImageRef::new(
        u32_of(src_w, "image width")?,
        u32_of(src_h, "image height")?,
        src,
        PixelType::U8x3,
    )
    .map_err(|e| fir_err("source", e))?;
    let cropped = CroppedImage::new(
        &image,
        u32_of(rect.x, "crop")?,
        u32_of(rect.y, "crop")?,
        u32_of(rect.w, "crop")?,
        u32_of(rect.h, "crop")?,
    )
    .map_err(|e| fir_err("crop box", e))?;
    dst.clear();
    dst.resize(dst_w * dst_h * 3, 0);
    let mut out = Image::from_slice_u8(
        u32_of(dst_w, "output width")?,
        u32_of(dst_h, "output height")?,
        dst,
        PixelType::U8x3,
    )
    .map_err(|e| fir_err("destination", e))?;
    let alg = match interpolation {
        Interpolation::Nearest => ResizeAlg::Nearest,
        Interpolation::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
        Interpolation::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
    };
    let options = ResizeOptions::new().resize_alg(alg);
    let options = if sub == SubBox::whole(rect) {
        options
    } else {
        options.crop(sub.left, sub.top, sub.width, sub.height)
    };
    resizer
        .resize(&cropped, &mut out, &options)
        .map_err(|e| fir_err("convolution", e))
}
