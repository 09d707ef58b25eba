//! libjpeg-turbo's JPEG decoder behind a safe API: a whole image, or only a region of it, to
//! 8-bit RGB, with the decoder's errors returned as values.
//!
//! This is the decoder PIL (and so torchvision's `ImageFolder`) uses, built from source and
//! linked statically through `mozjpeg-sys` (MozJPEG 4 is libjpeg-turbo with another encoder;
//! the decoder is libjpeg-turbo's, SIMD included when `nasm` is on the build machine). It
//! decodes with libjpeg's defaults, as PIL does: the accurate integer IDCT and "fancy"
//! (triangular) chroma upsampling.
//!
//! A region is decoded by libjpeg-turbo's `jpeg_skip_scanlines` (rows above it: entropy
//! decoding only, no IDCT or colour conversion), `jpeg_crop_scanline` (columns outside it:
//! the same) and stopping after its last row (or the image's last, when the data do not end
//! with an end-of-image marker: a file cut short is an error whichever region is asked, as it
//! is for a whole decode). The region's pixels are those of a whole
//! decode, bit for bit: the crop is widened by one column on each side before libjpeg-turbo
//! aligns it to its blocks, so the upsampling at the region's edges sees the same neighbours
//! (property-tested against whole decodes over subsamplings, progressive files and restart
//! intervals). A `RandomResizedCrop` of ImageNet-sized photos reads about half of each image
//! this way.
//!
//! ```
//! use longshore_jpeg::{JpegError, Region, decode_rgb, read_header};
//!
//! # let pixels: Vec<u8> = (0..64 * 48 * 3).map(|i| (i % 251) as u8).collect();
//! # let mut jpeg = Vec::new();
//! # jpeg_encoder::Encoder::new(&mut jpeg, 90)
//! #     .encode(&pixels, 64, 48, jpeg_encoder::ColorType::Rgb)
//! #     .unwrap();
//! let header = read_header(&jpeg)?;
//! assert_eq!((header.width, header.height), (64, 48));
//! let mut pixels = Vec::new();
//! // The header comes first, so a caller can refuse an image or choose the region from its size.
//! let region = |h: &longshore_jpeg::Header| Ok::<_, JpegError>(Some(Region::new(8, 4, h.width / 2, 10)));
//! let decoded = decode_rgb(&jpeg, region, &mut pixels)?;
//! assert_eq!((decoded.region.width, decoded.region.height), (32, 10));
//! assert_eq!(pixels.len(), 32 * 10 * 3);
//! # Ok::<(), JpegError>(())
//! ```
//!
//! Errors: libjpeg's fatal errors (`error_exit`) and the warnings that mean pixels are missing
//! (the file ends early, a corrupt entropy-coded segment) are a [`JpegError`]; the warnings PIL
//! also ignores (extraneous bytes before a marker, data after the image) are logged at
//! `tracing`'s debug level. Nothing is printed.

use std::ffi::{CStr, c_int, c_ulong};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg_sys as sys;

/// What a JPEG's header says, read before any pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Colour components in the file (1 grey, 3 YCbCr or RGB, 4 CMYK or YCCK).
    pub components: usize,
    /// The file's colour model.
    pub color: ColorModel,
}

impl Header {
    /// `width * height`.
    pub fn pixels(&self) -> u64 {
        self.width as u64 * self.height as u64
    }

    /// The whole image as a [`Region`].
    pub fn whole(&self) -> Region {
        Region::new(0, 0, self.width, self.height)
    }
}

/// A JPEG's colour model, as libjpeg reads it from the markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ColorModel {
    /// One grey component.
    Grayscale,
    /// Luma and chroma (JFIF's usual model).
    YCbCr,
    /// Red, green, blue.
    Rgb,
    /// Cyan, magenta, yellow, black (Adobe).
    Cmyk,
    /// YCbCr plus black (Adobe).
    Ycck,
    /// Anything else libjpeg reports.
    Other,
}

impl ColorModel {
    /// Whether [`decode_rgb`] converts this model to RGB (CMYK and YCCK are not converted by
    /// libjpeg; [`JpegError::UnsupportedColor`] names them so a caller can use another decoder).
    pub fn to_rgb_supported(self) -> bool {
        matches!(self, Self::Grayscale | Self::YCbCr | Self::Rgb)
    }
}

/// A rectangle of an image, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// First column.
    pub left: usize,
    /// First row.
    pub top: usize,
    /// Columns.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

impl Region {
    /// The region of `width x height` pixels whose top-left pixel is `(left, top)`.
    pub const fn new(left: usize, top: usize, width: usize, height: usize) -> Region {
        Region {
            left,
            top,
            width,
            height,
        }
    }

    fn inside(&self, width: usize, height: usize) -> bool {
        self.width > 0
            && self.height > 0
            && self
                .left
                .checked_add(self.width)
                .is_some_and(|r| r <= width)
            && self
                .top
                .checked_add(self.height)
                .is_some_and(|b| b <= height)
    }
}

/// What [`decode_rgb`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decoded {
    /// The file's header.
    pub header: Header,
    /// The region whose pixels are in the output (the whole image when none was asked for).
    pub region: Region,
}

/// Why a JPEG could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JpegError {
    /// libjpeg refused the data: truncated, corrupt or a feature it does not read. The message
    /// is libjpeg's own.
    #[error("{message}")]
    Corrupt {
        /// libjpeg's message.
        message: String,
        /// libjpeg's message code (`J_MESSAGE_CODE`).
        code: i32,
    },
    /// The colour model has no conversion to RGB in libjpeg (CMYK, YCCK).
    #[error("JPEG colour model {0:?} is not converted to RGB by libjpeg")]
    UnsupportedColor(ColorModel),
    /// The asked region is empty or not inside the image.
    #[error("the region {region:?} is empty or outside the {width}x{height} image")]
    Region {
        /// The region asked for.
        region: Region,
        /// The image's width.
        width: usize,
        /// The image's height.
        height: usize,
    },
}

/// Reads a JPEG's header (markers up to the first scan) without decoding pixels.
///
/// # Errors
/// [`JpegError::Corrupt`] for data libjpeg cannot read a header from.
pub fn read_header(bytes: &[u8]) -> Result<Header, JpegError> {
    let mut d = Decompressor::new(bytes)?;
    d.header()
}

/// Decodes the JPEG `bytes` to RGB into `out` (resized to the region's `width * height * 3`
/// bytes, rows top to bottom, pixels `R, G, B`).
///
/// `admit` sees the header before any pixel buffer is sized or any pixel decoded, and returns
/// the region to decode (`None`: the whole image) or its own error, which is returned as is:
/// a caller refuses an image over a pixel limit, or draws a crop from the image's size,
/// without parsing the header twice.
///
/// # Errors
/// `admit`'s error; [`JpegError::Corrupt`] for data libjpeg refuses or that ends early;
/// [`JpegError::UnsupportedColor`] for CMYK and YCCK files; [`JpegError::Region`] for a
/// region outside the image.
pub fn decode_rgb<E: From<JpegError>>(
    bytes: &[u8],
    admit: impl FnOnce(&Header) -> Result<Option<Region>, E>,
    out: &mut Vec<u8>,
) -> Result<Decoded, E> {
    let mut d = Decompressor::new(bytes)?;
    let header = d.header()?;
    if !header.color.to_rgb_supported() {
        return Err(JpegError::UnsupportedColor(header.color).into());
    }
    let region = admit(&header)?.unwrap_or(header.whole());
    if !region.inside(header.width, header.height) {
        return Err(JpegError::Region {
            region,
            width: header.width,
            height: header.height,
        }
        .into());
    }
    d.decode(&header, region, out)?;
    Ok(Decoded { header, region })
}

/// What `error_exit` unwinds with: libjpeg's message and code.
struct Fatal {
    message: String,
    code: c_int,
}

/// The warnings that mean pixels were not decoded from the file (libjpeg fills them in with
/// grey and goes on): errors here, as PIL's "image file is truncated" and as zune-jpeg's
/// strict mode. Other warnings (extraneous bytes, data after the image, a bogus ICC profile)
/// are logged and the image is kept, as PIL keeps it.
const FATAL_WARNINGS: [c_int; 5] = [
    sys::JWRN_JPEG_EOF,
    sys::JWRN_HIT_MARKER,
    sys::JWRN_HUFF_BAD_CODE,
    sys::JWRN_MUST_RESYNC,
    JWRN_ARITH_BAD_CODE,
];

/// "Corrupt JPEG data: bad arithmetic code". The binding's table has no arithmetic-coding
/// messages; with `arith_dec` on and the jpeg62 ABI, jerror.h numbers it after
/// `JERR_BAD_CROP_SPEC` (124) and `JERR_NO_ARITH_TABLE` (125).
const JWRN_ARITH_BAD_CODE: c_int = 126;

/// libjpeg's current message as text.
fn message(cinfo: &mut sys::jpeg_common_struct) -> String {
    // libjpeg writes up to JMSG_LENGTH_MAX (200) bytes; the binding's type says 80.
    let buffer = [0u8; 256];
    // SAFETY: `cinfo.err` points to the error manager `Decompressor::new` installed (it lives
    // as long as `cinfo`); its `format_message` is libjpeg's, which writes a NUL-terminated
    // string of at most JMSG_LENGTH_MAX = 200 bytes through the pointer, and `buffer` has 256.
    unsafe {
        if let Some(format) = (*cinfo.err).format_message {
            format(cinfo, &*buffer.as_ptr().cast::<[u8; 80]>());
        }
    }
    CStr::from_bytes_until_nul(&buffer)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown libjpeg error".to_owned())
}

/// libjpeg's fatal-error hook: unwinds to [`Decompressor::guard`] (without the panic hook, so
/// nothing is printed), where it becomes a [`JpegError::Corrupt`].
unsafe extern "C-unwind" fn error_exit(cinfo: &mut sys::jpeg_common_struct) {
    let message = message(cinfo);
    // SAFETY: `cinfo.err` is the installed error manager (see `message`).
    let code = unsafe { (*cinfo.err).msg_code };
    resume_unwind(Box::new(Fatal { message, code }));
}

/// libjpeg's message hook: the warnings in [`FATAL_WARNINGS`] are fatal, the others logged;
/// trace messages (levels >= 1) are dropped. Nothing is printed.
unsafe extern "C-unwind" fn emit_message(cinfo: &mut sys::jpeg_common_struct, level: c_int) {
    if level >= 0 {
        return;
    }
    // SAFETY: `cinfo.err` is the installed error manager (see `message`).
    let code = unsafe { (*cinfo.err).msg_code };
    if FATAL_WARNINGS.contains(&code) {
        // SAFETY: as libjpeg's own `emit_message` would call `error_exit`.
        unsafe { error_exit(cinfo) };
        return;
    }
    // SAFETY: as above.
    unsafe { (*cinfo.err).num_warnings += 1 };
    tracing::debug!(code, message = %message(cinfo), "libjpeg warning (image kept)");
}

/// libjpeg's output hook, which would print to stderr: replaced by nothing.
unsafe extern "C-unwind" fn output_message(_cinfo: &mut sys::jpeg_common_struct) {}

/// One `jpeg_decompress_struct` reading `bytes`, destroyed on drop (also after an error).
struct Decompressor<'a> {
    cinfo: Box<sys::jpeg_decompress_struct>,
    // Boxed: `cinfo.common.err` points to it.
    _err: Box<sys::jpeg_error_mgr>,
    /// The data libjpeg reads (it keeps a pointer to them).
    bytes: &'a [u8],
}

impl<'a> Decompressor<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, JpegError> {
        if bytes.is_empty() {
            return Err(JpegError::Corrupt {
                message: "empty JPEG data (0 bytes)".to_owned(),
                code: sys::JERR_INPUT_EMPTY,
            });
        }
        // SAFETY: both structs are plain C data for which all-zero bytes is the state libjpeg
        // expects before `jpeg_std_error` / `jpeg_CreateDecompress` (its own examples memset
        // nothing, but zeroed fields are what `jpeg_CreateDecompress` itself writes).
        let mut err: Box<sys::jpeg_error_mgr> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: as above.
        let mut cinfo: Box<sys::jpeg_decompress_struct> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `jpeg_std_error` fills in the manager and returns it; nothing can fail.
        unsafe { sys::jpeg_std_error(&mut err) };
        err.error_exit = Some(error_exit);
        err.emit_message = Some(emit_message);
        err.output_message = Some(output_message);
        cinfo.common.err = &mut *err;
        let mut d = Decompressor {
            cinfo,
            _err: err,
            bytes,
        };
        let len = c_ulong::try_from(bytes.len()).map_err(|_| JpegError::Corrupt {
            message: format!(
                "{} bytes of JPEG data are more than libjpeg reads",
                bytes.len()
            ),
            code: 0,
        })?;
        d.guard(|cinfo| {
            // SAFETY: `cinfo` is zeroed with our error manager installed, as
            // `jpeg_create_decompress` expects; the version and size are this binding's.
            unsafe {
                sys::jpeg_CreateDecompress(
                    cinfo,
                    sys::JPEG_LIB_VERSION,
                    std::mem::size_of::<sys::jpeg_decompress_struct>(),
                );
            }
        })?;
        d.guard(|cinfo| {
            // SAFETY: a created decompressor; libjpeg keeps the pointer to `bytes`, which
            // outlive `d` (its field `bytes: &'a [u8]`).
            unsafe { sys::jpeg_mem_src(cinfo, bytes.as_ptr(), len) }
        })?;
        Ok(d)
    }

    /// Runs `f` on the struct; libjpeg's `error_exit` (an unwind) becomes an error. Any other
    /// panic (a bug) goes on unwinding, once the struct is destroyed.
    fn guard<R>(
        &mut self,
        f: impl FnOnce(&mut sys::jpeg_decompress_struct) -> R,
    ) -> Result<R, JpegError> {
        let cinfo = &mut *self.cinfo;
        catch_unwind(AssertUnwindSafe(|| f(cinfo))).map_err(|panic| {
            match panic.downcast::<Fatal>() {
                Ok(fatal) => JpegError::Corrupt {
                    message: fatal.message,
                    code: fatal.code,
                },
                Err(other) => resume_unwind(other),
            }
        })
    }

    fn header(&mut self) -> Result<Header, JpegError> {
        self.guard(|cinfo| {
            // SAFETY: a created decompressor with a memory source.
            unsafe { sys::jpeg_read_header(cinfo, 1) };
            // Read as an integer: a value outside the Rust enum must not be read as it.
            // SAFETY: `J_COLOR_SPACE` is a `#[repr(C)]` enum, an `int` in C.
            let space = unsafe {
                std::ptr::addr_of!(cinfo.jpeg_color_space)
                    .cast::<c_int>()
                    .read()
            };
            let color = match space {
                s if s == sys::JCS_GRAYSCALE as c_int => ColorModel::Grayscale,
                s if s == sys::JCS_YCbCr as c_int => ColorModel::YCbCr,
                s if s == sys::JCS_RGB as c_int => ColorModel::Rgb,
                s if s == sys::JCS_CMYK as c_int => ColorModel::Cmyk,
                s if s == sys::JCS_YCCK as c_int => ColorModel::Ycck,
                _ => ColorModel::Other,
            };
            Header {
                width: cinfo.image_width as usize,
                height: cinfo.image_height as usize,
                components: cinfo.num_components.max(0) as usize,
                color,
            }
        })
    }

    /// Decodes `region` (inside the image) into `out`.
    fn decode(
        &mut self,
        header: &Header,
        region: Region,
        out: &mut Vec<u8>,
    ) -> Result<(), JpegError> {
        let whole_rows = region.left == 0 && region.width == header.width;
        let complete = ends_with_eoi(self.bytes);
        // Zeroed, not only sized: nothing of a previous image may show if a row is not written.
        out.clear();
        out.resize(region.width * region.height * 3, 0);
        self.guard(|cinfo| {
            cinfo.out_color_space = sys::JCS_RGB;
            // SAFETY: a decompressor whose header was read.
            unsafe { sys::jpeg_start_decompress(cinfo) };
            // Columns: one more on each side, so the chroma upsampling at the region's edges
            // has the neighbours it has in a whole decode, and at least `MIN_CROP_COLUMNS`
            // (libjpeg-turbo upsamples chroma fewer than 3 samples wide without interpolation,
            // unlike a whole decode); libjpeg-turbo widens the crop further, to its block
            // columns, and says where it starts.
            let mut x0 = 0;
            if !whole_rows {
                let mut left = region.left.saturating_sub(1);
                let mut right = (region.left + region.width + 1).min(header.width);
                let short = MIN_CROP_COLUMNS.saturating_sub(right - left);
                right = (right + short).min(header.width);
                left = left.saturating_sub(MIN_CROP_COLUMNS.saturating_sub(right - left));
                x0 = left as u32;
                let mut cw = (right - left) as u32;
                // SAFETY: called after `jpeg_start_decompress`, before any scanline is read,
                // with a range inside the image.
                unsafe { sys::jpeg_crop_scanline(cinfo, &mut x0, &mut cw) };
            }
            if region.top > 0 {
                // SAFETY: before any scanline is read, fewer rows than the image has.
                let skipped = unsafe { sys::jpeg_skip_scanlines(cinfo, region.top as u32) };
                if skipped as usize != region.top {
                    return Err(format!("libjpeg skipped {skipped} of {} rows", region.top));
                }
            }
            let row_bytes = cinfo.output_width as usize * 3;
            let skip = (region.left - x0 as usize) * 3;
            let take = region.width * 3;
            // Rows are read through the region's last, or through the image's last when the
            // data may be cut short (see `complete`), so that a truncated file is an error
            // whichever region is asked; rows past the region are read and dropped.
            let through = if complete {
                region.height
            } else {
                header.height - region.top
            };
            // Whole rows of the region are decoded straight into `out`; others into scratch rows.
            let mut scratch = if whole_rows && through == region.height {
                Vec::new()
            } else {
                vec![0u8; row_bytes * ROWS]
            };
            let mut done = 0;
            while done < through {
                let n = (through - done).min(ROWS);
                let direct = whole_rows && done + n <= region.height;
                let mut rows = [std::ptr::null_mut::<u8>(); ROWS];
                for (i, row) in rows.iter_mut().take(n).enumerate() {
                    *row = if direct {
                        out[(done + i) * take..].as_mut_ptr()
                    } else {
                        scratch[i * row_bytes..].as_mut_ptr()
                    };
                }
                // SAFETY: `n` row pointers, each to at least `output_width * 3` writable bytes
                // (a row of `out` when whole rows of the region are read, where
                // `take == row_bytes`; else a scratch row of `row_bytes`).
                let got = unsafe { sys::jpeg_read_scanlines(cinfo, rows.as_mut_ptr(), n as u32) }
                    as usize;
                if got == 0 {
                    return Err(format!(
                        "libjpeg returned no scanline at row {}",
                        region.top + done
                    ));
                }
                if !direct {
                    for i in (0..got).filter(|i| done + i < region.height) {
                        let src = &scratch[i * row_bytes + skip..][..take];
                        out[(done + i) * take..][..take].copy_from_slice(src);
                    }
                }
                done += got;
            }
            // SAFETY: a started decompressor; the rest of the file is not needed.
            unsafe { sys::jpeg_abort_decompress(cinfo) };
            Ok(())
        })?
        .map_err(|message| JpegError::Corrupt { message, code: 0 })
    }
}

/// Whether `bytes` end with the end-of-image marker (`FF D9`, allowing a few bytes of padding
/// after it). Entropy-coded data never contains `FF D9`, so a file cut anywhere in its scans
/// fails this check; a complete file may fail it too (data appended after the image, a missing
/// marker), and is then only read to its last row, as a whole decode reads it.
fn ends_with_eoi(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(EOI_SLACK)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

/// Bytes after the end-of-image marker that [`ends_with_eoi`] allows.
const EOI_SLACK: usize = 32;

/// The fewest columns asked of `jpeg_crop_scanline`: libjpeg-turbo interpolates chroma only
/// when it is more than 2 samples wide after the crop, which 4:1:1 files (4 pixels a sample)
/// reach from 9 columns; a whole image that narrow is decoded the same way, so the pixels
/// agree either way.
const MIN_CROP_COLUMNS: usize = 32;

/// Rows asked of libjpeg per `jpeg_read_scanlines` call.
const ROWS: usize = 16;

impl Drop for Decompressor<'_> {
    fn drop(&mut self) {
        // A decompressor that `jpeg_CreateDecompress` failed on is all zero but its error
        // manager; `jpeg_destroy_decompress` does nothing without a memory manager.
        if self.cinfo.common.mem.is_null() {
            return;
        }
        // SAFETY: a created decompressor, in any state (libjpeg's documented cleanup after an
        // error); nothing uses it afterwards.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::jpeg_destroy_decompress(&mut self.cinfo)
        }));
    }
}
