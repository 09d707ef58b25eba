//! Decoding JPEG and PNG files to 8-bit RGB, as PIL's `Image.open(f).convert("RGB")` does.
//!
//! The format is recognised from the file's first bytes, not its extension (like PIL), and
//! the image's dimensions are read from its header before any pixel is decoded, so an image
//! over the pixel limit ([`DecodeOptions::max_pixels`], PIL's decompression-bomb check) is
//! refused without allocating it.
//!
//! * JPEG: libjpeg-turbo, PIL's own decoder, through [`longshore_jpeg`] (feature `libjpeg`, on
//!   by default): baseline, progressive and arithmetic-coded; grey, YCbCr and RGB, with
//!   libjpeg's defaults as PIL uses them (accurate integer IDCT, fancy upsampling). CMYK and
//!   YCCK files, and every JPEG without the feature, go to [`zune_jpeg`]. Truncated or corrupt
//!   data is an error, as in PIL without `LOAD_TRUNCATED_IMAGES`. A pipeline that starts with a
//!   crop decodes only the crop's rows and columns
//!   ([`Compose::decode_into`](crate::Compose::decode_into)), with the pixels of a whole decode.
//! * PNG: [`zune_png`] (every colour type and bit depth, interlaced, palette with or without
//!   transparency). Conversion to RGB follows PIL's `convert("RGB")`: alpha is dropped,
//!   1/2/4-bit grey is scaled to 0..255, 16-bit colour keeps the high byte, and 16-bit grey
//!   (PIL's mode `I;16`) is *clipped* to 255, as PIL does.
//!
//! Reduced-scale decoding (PIL's `draft`, libjpeg's DCT scaling) is not used: torchvision's
//! ImageFolder does not use draft mode, so decoding at full size is what keeps the pixels equal
//! to torchvision's. Nor would it pay on ImageNet-sized images: a scaled IDCT needs the output
//! to be at most half the source on both sides, and `RandomResizedCrop(224)` would need a crop
//! of at least 448x448 (larger than a whole 500x375 ImageNet photo), `Resize(256)` a short side
//! of at least 512. Decoding only the crop's region saves more there, without changing a pixel.

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_core::result::DecodingResult;
use zune_jpeg::JpegDecoder;
use zune_png::PngDecoder;

use longshore_data::DataError;

use crate::image::RgbImage;
use crate::plan::Geometry;

/// PIL's `Image.MAX_IMAGE_PIXELS`: `1024 * 1024 * 1024 // 4 // 3` pixels.
///
/// PIL warns above it and raises `DecompressionBombError` above twice it; longshore refuses
/// images above [`DecodeOptions::max_pixels`], which defaults to this value, because a
/// warning raised in a loader worker is seen by no one.
pub const PIL_MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// The largest side zune's decoders are allowed to read (JPEG's own limit is 65,535).
const MAX_SIDE: usize = 1 << 24;

/// Image file formats this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ImageFormat {
    /// JPEG (JFIF / EXIF), baseline or progressive.
    Jpeg,
    /// PNG, every colour type and bit depth.
    Png,
}

/// What a file's header says, read without decoding pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageHeader {
    /// The format, from the file's magic bytes.
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
}

impl ImageHeader {
    /// `width * height`.
    pub fn pixels(&self) -> u64 {
        self.width as u64 * self.height as u64
    }
}

/// Why bytes could not be decoded to an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The file has no bytes at all.
    #[error("empty file (0 bytes)")]
    Empty,
    /// The first bytes are not those of a supported format.
    #[error("not a JPEG or PNG file (starts with {magic})")]
    UnknownFormat {
        /// The first bytes, in hex.
        magic: String,
    },
    /// A format that PIL reads but this crate does not (BMP, GIF, TIFF, WebP, PPM).
    #[error("unsupported image format {0} (longshore-vision decodes JPEG and PNG)")]
    Unsupported(&'static str),
    /// The image has more pixels than the limit allows.
    #[error(
        "image of {width}x{height} = {pixels} pixels exceeds the limit of {limit} pixels \
         (a decompression bomb? raise DecodeOptions::max_pixels to allow it)"
    )]
    TooManyPixels {
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// `width * height`.
        pixels: u64,
        /// The configured limit.
        limit: u64,
    },
    /// A header declares a zero width or height.
    #[error("image header declares a zero-sized image ({width}x{height})")]
    ZeroSize {
        /// Declared width.
        width: usize,
        /// Declared height.
        height: usize,
    },
    /// The JPEG decoder refused the data (truncated, corrupt, unsupported).
    #[error("invalid jpeg: {0}")]
    Jpeg(String),
    /// The PNG decoder refused the data (truncated, corrupt, unsupported).
    #[error("invalid png: {0}")]
    Png(String),
}

/// Options of [`decode_rgb`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Images with more pixels than this are refused before decoding; `None` disables the
    /// check. Default: [`PIL_MAX_IMAGE_PIXELS`].
    pub max_pixels: Option<u64>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_pixels: Some(PIL_MAX_IMAGE_PIXELS),
        }
    }
}

impl DecodeOptions {
    /// Sets the pixel limit (`None`: no limit).
    pub fn max_pixels(mut self, limit: Option<u64>) -> Self {
        self.max_pixels = limit;
        self
    }

    /// Checks a header against these options before decoding (what the decoder does first):
    /// a zero size, or more pixels than [`max_pixels`](Self::max_pixels).
    ///
    /// # Errors
    /// [`DecodeError::ZeroSize`] or [`DecodeError::TooManyPixels`].
    pub fn check_header(&self, header: &ImageHeader) -> Result<(), DecodeError> {
        if header.width == 0 || header.height == 0 {
            return Err(DecodeError::ZeroSize {
                width: header.width,
                height: header.height,
            });
        }
        match self.max_pixels {
            Some(limit) if header.pixels() > limit => Err(DecodeError::TooManyPixels {
                width: header.width,
                height: header.height,
                pixels: header.pixels(),
                limit,
            }),
            _ => Ok(()),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let shown: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    if shown.is_empty() {
        "nothing".to_owned()
    } else {
        shown.join(" ")
    }
}

/// The format of `bytes`, from their magic number.
///
/// # Errors
/// [`DecodeError::Empty`], [`DecodeError::Unsupported`] for formats PIL reads that this
/// crate does not, [`DecodeError::UnknownFormat`] otherwise.
pub fn sniff(bytes: &[u8]) -> Result<ImageFormat, DecodeError> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    match bytes {
        [] => Err(DecodeError::Empty),
        [0xFF, 0xD8, 0xFF, ..] => Ok(ImageFormat::Jpeg),
        b if b.starts_with(PNG) => Ok(ImageFormat::Png),
        b if b.starts_with(b"BM") => Err(DecodeError::Unsupported("bmp")),
        b if b.starts_with(b"GIF8") => Err(DecodeError::Unsupported("gif")),
        b if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") => {
            Err(DecodeError::Unsupported("tiff"))
        }
        b if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" => {
            Err(DecodeError::Unsupported("webp"))
        }
        [b'P', b'1'..=b'6', ..] => Err(DecodeError::Unsupported("ppm/pgm")),
        b => Err(DecodeError::UnknownFormat { magic: hex(b) }),
    }
}

fn jpeg_options() -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(MAX_SIDE)
        .set_max_height(MAX_SIDE)
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_strict_mode(true)
}

fn png_options() -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(MAX_SIDE)
        .set_max_height(MAX_SIDE)
        .png_set_strip_to_8bit(false)
        .png_set_add_alpha_channel(false)
}

/// The PNG colour type and bit depth from the IHDR chunk (zune-png keeps them private).
fn png_ihdr(bytes: &[u8]) -> Result<(usize, usize, u8, u8), DecodeError> {
    let ihdr = bytes
        .get(8..29)
        .filter(|h| &h[4..8] == b"IHDR")
        .ok_or_else(|| DecodeError::Png("missing or truncated IHDR chunk".into()))?;
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    Ok((be(&ihdr[8..12]), be(&ihdr[12..16]), ihdr[16], ihdr[17]))
}

/// Reads the format and dimensions of `bytes` without decoding pixels.
///
/// # Errors
/// As [`sniff`], or the decoder's error for a corrupt header.
pub fn probe(bytes: &[u8]) -> Result<ImageHeader, DecodeError> {
    match sniff(bytes)? {
        ImageFormat::Jpeg => {
            let mut d = JpegDecoder::new_with_options(ZCursor::new(bytes), jpeg_options());
            d.decode_headers()
                .map_err(|e| DecodeError::Jpeg(e.to_string()))?;
            let (width, height) = d
                .dimensions()
                .ok_or_else(|| DecodeError::Jpeg("no frame header".into()))?;
            Ok(ImageHeader {
                format: ImageFormat::Jpeg,
                width,
                height,
            })
        }
        ImageFormat::Png => {
            let (width, height, _, _) = png_ihdr(bytes)?;
            Ok(ImageHeader {
                format: ImageFormat::Png,
                width,
                height,
            })
        }
    }
}

/// Decodes `bytes` (JPEG or PNG) to RGB, like PIL's `Image.open(f).convert("RGB")`.
///
/// ```
/// use longshore_vision::decode::{DecodeError, DecodeOptions, decode_rgb};
///
/// assert_eq!(decode_rgb(b"", &DecodeOptions::default()), Err(DecodeError::Empty));
/// assert!(matches!(
///     decode_rgb(b"hello, I am text", &DecodeOptions::default()),
///     Err(DecodeError::UnknownFormat { .. })
/// ));
/// ```
///
/// # Errors
/// [`DecodeError`]: unknown format, over the pixel limit, truncated or corrupt data.
pub fn decode_rgb(bytes: &[u8], options: &DecodeOptions) -> Result<RgbImage, DecodeError> {
    let mut out = Vec::new();
    let (width, height) = decode_rgb_into(bytes, options, &mut out)?;
    Ok(RgbImage::from_vec(width, height, out).expect("decoder returned a consistent buffer"))
}

/// [`decode_rgb`] into a caller's buffer (resized to `width * height * 3`), so a worker can
/// reuse one allocation for every image. Returns `(width, height)`.
///
/// # Errors
/// As [`decode_rgb`].
pub fn decode_rgb_into(
    bytes: &[u8],
    options: &DecodeOptions,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), DecodeError> {
    let format = sniff(bytes)?;
    // A decoder bug must not take a loader worker down: a panic is this file's error.
    catch_decoder_panic(format, || match format {
        ImageFormat::Jpeg => decode_jpeg(bytes, options, out),
        ImageFormat::Png => {
            let header = probe(bytes)?;
            options.check_header(&header)?;
            decode_png(bytes, out)
        }
    })
}

/// Decodes a JPEG with one header parse: the headers are read, the size is checked against
/// `options` (before any pixel buffer is sized), then the same decoder decodes into `out`:
/// libjpeg-turbo, or zune-jpeg for what libjpeg does not convert to RGB (and without the
/// `libjpeg` feature).
fn decode_jpeg(
    bytes: &[u8],
    options: &DecodeOptions,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), DecodeError> {
    #[cfg(feature = "libjpeg")]
    {
        let admit = |h: &longshore_jpeg::Header| {
            options.check_header(&jpeg_header(h))?;
            Ok(None)
        };
        match libjpeg_rgb(bytes, admit, out) {
            Ok(Some(d)) => return Ok((d.region.width, d.region.height)),
            Ok(None) => {}
            Err(PlanFailed::Decode(e)) => return Err(e),
            // `admit` draws no plan: no such error comes back.
            Err(PlanFailed::Plan(e)) => return Err(DecodeError::Jpeg(e.to_string())),
        }
    }
    decode_jpeg_zune(bytes, options, out)
}

/// Why an `admit` hook of [`libjpeg_rgb`] or libjpeg-turbo itself stopped a decode.
#[cfg(feature = "libjpeg")]
enum Admit {
    Failed(PlanFailed),
    Jpeg(longshore_jpeg::JpegError),
}

#[cfg(feature = "libjpeg")]
impl From<longshore_jpeg::JpegError> for Admit {
    fn from(e: longshore_jpeg::JpegError) -> Self {
        Admit::Jpeg(e)
    }
}

#[cfg(feature = "libjpeg")]
impl From<DecodeError> for Admit {
    fn from(e: DecodeError) -> Self {
        Admit::Failed(PlanFailed::Decode(e))
    }
}

/// libjpeg-turbo's decode of `bytes` (a decoder panic is this file's error): `None` for a
/// colour model it does not convert to RGB, which zune-jpeg decodes instead.
#[cfg(feature = "libjpeg")]
fn libjpeg_rgb(
    bytes: &[u8],
    admit: impl FnOnce(&longshore_jpeg::Header) -> Result<Option<longshore_jpeg::Region>, Admit>,
    out: &mut Vec<u8>,
) -> Result<Option<longshore_jpeg::Decoded>, PlanFailed> {
    let r = catch_decoder_panic(ImageFormat::Jpeg, || {
        longshore_jpeg::decode_rgb(bytes, admit, out)
    });
    match r {
        Ok(d) => Ok(Some(d)),
        Err(Admit::Jpeg(longshore_jpeg::JpegError::UnsupportedColor(_))) => Ok(None),
        Err(Admit::Jpeg(e)) => Err(PlanFailed::Decode(DecodeError::Jpeg(e.to_string()))),
        Err(Admit::Failed(e)) => Err(e),
    }
}

#[cfg(feature = "libjpeg")]
fn jpeg_header(h: &longshore_jpeg::Header) -> ImageHeader {
    ImageHeader {
        format: ImageFormat::Jpeg,
        width: h.width,
        height: h.height,
    }
}

/// What [`decode_planned`] returns: the decoded pixels' size and the plan to render on them.
#[derive(Debug)]
pub(crate) struct Planned {
    /// The decoded pixels' width.
    pub(crate) width: usize,
    /// The decoded pixels' height.
    pub(crate) height: usize,
    /// The plan, drawn for the whole image (and re-based onto the decoded region, or
    /// rendered with `origin`).
    pub(crate) geometry: Geometry,
    /// Where the decoded pixels lie in the image the plan was drawn for, when the plan is
    /// rendered on a region of it as drawn (`RegionPlan::Offset`).
    pub(crate) origin: Option<crate::plan::SourceRegion>,
}

/// Why [`decode_planned`] failed: the file, or the plan.
#[derive(Debug)]
pub(crate) enum PlanFailed {
    /// The bytes do not decode.
    Decode(DecodeError),
    /// The plan could not be drawn.
    Plan(DataError),
}

impl From<DecodeError> for PlanFailed {
    fn from(e: DecodeError) -> Self {
        PlanFailed::Decode(e)
    }
}

/// Decodes `bytes` for a pipeline: reads the header, draws the plan with `draw` from the
/// image's size, and decodes only the region the plan reads when it starts with a crop (a
/// JPEG through libjpeg-turbo), else the whole image. The plan returned is re-based onto the
/// pixels decoded, which equal the whole decode's there, so it renders what the whole plan
/// renders on the whole image.
pub(crate) fn decode_planned(
    bytes: &[u8],
    options: &DecodeOptions,
    draw: impl FnOnce(usize, usize) -> Result<Geometry, DataError>,
    out: &mut Vec<u8>,
) -> Result<Planned, PlanFailed> {
    #[cfg(feature = "libjpeg")]
    if sniff(bytes)? == ImageFormat::Jpeg {
        let mut draw = Some(draw);
        let mut planned = None;
        let admit = |h: &longshore_jpeg::Header| {
            options.check_header(&jpeg_header(h))?;
            let draw = draw.take().expect("admit is called once");
            let geometry =
                draw(h.width, h.height).map_err(|e| Admit::Failed(PlanFailed::Plan(e)))?;
            let (region, geometry, origin) = match geometry.source_region() {
                Some((r, plan)) => {
                    let region = Some(longshore_jpeg::Region::new(r.x, r.y, r.w, r.h));
                    match plan {
                        crate::plan::RegionPlan::Rebased(rebased) => (region, rebased, None),
                        crate::plan::RegionPlan::Offset => (region, geometry, Some(r)),
                    }
                }
                None => (None, geometry, None),
            };
            planned = Some((geometry, origin));
            Ok(region)
        };
        if let Some(d) = libjpeg_rgb(bytes, admit, out)? {
            let (geometry, origin) = planned.expect("admitted");
            return Ok(Planned {
                width: d.region.width,
                height: d.region.height,
                geometry,
                origin,
            });
        }
        let (width, height) = decode_rgb_into(bytes, options, out)?;
        let geometry = draw.take().expect("not drawn")(width, height).map_err(PlanFailed::Plan)?;
        return Ok(Planned {
            width,
            height,
            geometry,
            origin: None,
        });
    }
    let (width, height) = decode_rgb_into(bytes, options, out)?;
    let geometry = draw(width, height).map_err(PlanFailed::Plan)?;
    Ok(Planned {
        width,
        height,
        geometry,
        origin: None,
    })
}

/// Runs a decoder, turning a panic (a decoder bug) into this file's error: it must not take a
/// loader worker down.
fn catch_decoder_panic<T, E: From<DecodeError>>(
    format: ImageFormat,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = longshore_data::worker::panic_message(panic);
        let e = format!("the decoder panicked: {message}");
        Err(match format {
            ImageFormat::Jpeg => DecodeError::Jpeg(e),
            ImageFormat::Png => DecodeError::Png(e),
        }
        .into())
    })
}

/// [`decode_jpeg`] by zune-jpeg.
fn decode_jpeg_zune(
    bytes: &[u8],
    options: &DecodeOptions,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), DecodeError> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(bytes), jpeg_options());
    let err = |e: zune_jpeg::errors::DecodeErrors| DecodeError::Jpeg(e.to_string());
    d.decode_headers().map_err(err)?;
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| DecodeError::Jpeg("no frame header".into()))?;
    options.check_header(&ImageHeader {
        format: ImageFormat::Jpeg,
        width,
        height,
    })?;
    let len = d
        .output_buffer_size()
        .ok_or_else(|| DecodeError::Jpeg("image size overflows".into()))?;
    if len != width * height * 3 {
        return Err(DecodeError::Jpeg(format!(
            "decoder would produce {len} bytes for a {width}x{height} RGB image"
        )));
    }
    // Zeroed, not just sized: a malformed file the decoder accepts may leave rows unwritten,
    // and those must not show the previous image's pixels (outputs stay deterministic).
    out.clear();
    out.resize(len, 0);
    d.decode_into(out).map_err(err)?;
    Ok((width, height))
}

fn decode_png(bytes: &[u8], out: &mut Vec<u8>) -> Result<(usize, usize), DecodeError> {
    let (_, _, depth, color) = png_ihdr(bytes)?;
    let mut d = PngDecoder::new_with_options(ZCursor::new(bytes), png_options());
    let err = |e: zune_png::error::PngDecodeErrors| DecodeError::Png(e.to_string());
    d.decode_headers().map_err(err)?;
    let (w, h) = d
        .dimensions()
        .ok_or_else(|| DecodeError::Png("no IHDR chunk".into()))?;
    let space = d
        .colorspace()
        .ok_or_else(|| DecodeError::Png("no colour type".into()))?;
    let result = d.decode().map_err(err)?;
    let n = space.num_components();
    let pixels = w * h;
    out.clear();
    out.reserve(pixels * 3);
    // Grey (colour type 0) at 16 bits is PIL's mode I;16, whose conversion to RGB clips.
    let grey16_clips = color == 0 && depth == 16;
    match result {
        DecodingResult::U8(v) => push_rgb(out, &v, n, pixels, |x| x)?,
        DecodingResult::U16(v) if grey16_clips => {
            push_rgb(out, &v, n, pixels, |x| x.min(255) as u8)?
        }
        DecodingResult::U16(v) => push_rgb(out, &v, n, pixels, |x| (x >> 8) as u8)?,
        _ => return Err(DecodeError::Png("unexpected sample type".into())),
    }
    Ok((w, h))
}

/// Appends `pixels` pixels of `n` channels (grey, grey+alpha, RGB, RGBA) as RGB.
fn push_rgb<T: Copy>(
    out: &mut Vec<u8>,
    src: &[T],
    n: usize,
    pixels: usize,
    to_u8: impl Fn(T) -> u8,
) -> Result<(), DecodeError> {
    if n == 0 || src.len() < pixels * n {
        return Err(DecodeError::Png(format!(
            "decoder produced {} samples for {pixels} pixels of {n} channels",
            src.len()
        )));
    }
    for px in src.chunks_exact(n).take(pixels) {
        match n {
            1 | 2 => {
                let g = to_u8(px[0]);
                out.extend_from_slice(&[g, g, g]);
            }
            _ => out.extend_from_slice(&[to_u8(px[0]), to_u8(px[1]), to_u8(px[2])]),
        }
    }
    Ok(())
}
