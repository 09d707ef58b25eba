//! libnvjpeg and NVRTC through small function tables of our own, loaded at run time with
//! longshore-transfer's [`cuda_libs`] (versioned sonames, the CUDA toolkit, the `nvidia-*` pip
//! packages of the active Python), as longshore-ops loads cuBLAS and NVRTC.
//!
//! The signatures are those of `nvjpeg.h` (CUDA 11-13) and `nvrtc.h`; enums are C `int`s.
//! Every call's status is checked; the RAII types destroy what they create.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use longshore_transfer::cuda_libs::{self, LibrarySpec};

/// libnvjpeg, as the CUDA toolkit (`lib64`) and the `nvidia-nvjpeg-cu12`/`-cu13` pip packages
/// (`nvidia/nvjpeg/lib`, or `nvidia/cu13/lib`) ship it.
pub const NVJPEG: LibrarySpec = LibrarySpec {
    name: "nvJPEG",
    sonames: &[
        "libnvjpeg.so.13",
        "libnvjpeg.so.12",
        "libnvjpeg.so.11",
        "libnvjpeg.so",
    ],
    pip_dirs: &["nvidia/nvjpeg/lib", "nvidia/cu13/lib", "torch/lib"],
    companions: &[],
};

/// `NVJPEG_MAX_COMPONENT`.
pub(crate) const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`: per-channel device pointers and pitches.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Image {
    pub(crate) channel: [*mut u8; MAX_COMPONENT],
    pub(crate) pitch: [usize; MAX_COMPONENT],
}

// nvjpeg.h: `unsigned char *channel[4]; size_t pitch[4];` on LP64: 64 bytes, 8-aligned.
const _: () = assert!(std::mem::size_of::<Image>() == 64);
const _: () = assert!(std::mem::align_of::<Image>() == 8);
const _: () = assert!(std::mem::offset_of!(Image, pitch) == 32);

impl Image {
    /// Planar RGB at `base` (three planes of `width * height` bytes, `plane` bytes apart).
    pub(crate) fn planar(base: u64, plane: usize, width: usize) -> Image {
        let at = |c: usize| (base + (c * plane) as u64) as *mut u8;
        Image {
            channel: [at(0), at(1), at(2), std::ptr::null_mut()],
            pitch: [width, width, width, 0],
        }
    }
}

type Handle = *mut c_void;
type State = *mut c_void;
type JStream = *mut c_void;
type Status = c_int;

/// `nvjpegBackend_t` values.
pub(crate) const BACKEND_DEFAULT: c_int = 0;
/// `NVJPEG_BACKEND_GPU_HYBRID`: Huffman decoding on the GPU too (batched decode of baseline
/// JPEGs, in batches of more than about 50 images).
#[cfg(feature = "ceiling")]
pub(crate) const BACKEND_GPU_HYBRID: c_int = 2;
pub(crate) const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_OUTPUT_RGB`: planar RGB.
pub(crate) const OUTPUT_RGB: c_int = 3;
/// `NVJPEG_CSS_UNKNOWN`.
pub(crate) const CSS_UNKNOWN: c_int = -1;
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` (CUDA 12.x): chroma upsampled by
/// interpolation, like libjpeg's "fancy" upsampling that PIL uses. Older releases refuse the
/// flag; then the handle is made without it.
pub(crate) const FLAG_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;

#[allow(clippy::type_complexity)]
struct Api {
    create_ex: unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    state_create: unsafe extern "C" fn(Handle, *mut State) -> Status,
    state_destroy: unsafe extern "C" fn(State) -> Status,
    image_info: unsafe extern "C" fn(
        Handle,
        *const u8,
        usize,
        *mut c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> Status,
    decode: unsafe extern "C" fn(
        Handle,
        State,
        *const u8,
        usize,
        c_int,
        *mut Image,
        *mut c_void,
    ) -> Status,
    batched_init: unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status,
    batched: unsafe extern "C" fn(
        Handle,
        State,
        *const *const u8,
        *const usize,
        *mut Image,
        *mut c_void,
    ) -> Status,
    stream_create: unsafe extern "C" fn(Handle, *mut JStream) -> Status,
    stream_destroy: unsafe extern "C" fn(JStream) -> Status,
    stream_parse: unsafe extern "C" fn(Handle, *const u8, usize, c_int, c_int, JStream) -> Status,
    batched_supported: unsafe extern "C" fn(Handle, JStream, *mut c_int) -> Status,
    property: unsafe extern "C" fn(c_int, *mut c_int) -> Status,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = cuda_libs::load(&NVJPEG).map_err(|e| e.to_string())?;
        // SAFETY: each type is the `extern "C"` signature of that function in nvjpeg.h (enums
        // are `int`, handles are pointers to opaque structs).
        unsafe {
            Ok(Api {
                create_ex: lib.get("nvjpegCreateEx")?,
                destroy: lib.get("nvjpegDestroy")?,
                state_create: lib.get("nvjpegJpegStateCreate")?,
                state_destroy: lib.get("nvjpegJpegStateDestroy")?,
                image_info: lib.get("nvjpegGetImageInfo")?,
                decode: lib.get("nvjpegDecode")?,
                batched_init: lib.get("nvjpegDecodeBatchedInitialize")?,
                batched: lib.get("nvjpegDecodeBatched")?,
                stream_create: lib.get("nvjpegJpegStreamCreate")?,
                stream_destroy: lib.get("nvjpegJpegStreamDestroy")?,
                stream_parse: lib.get("nvjpegJpegStreamParse")?,
                batched_supported: lib.get("nvjpegDecodeBatchedSupported")?,
                property: lib.get("nvjpegGetProperty")?,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether libnvjpeg loads (why not: every place searched).
pub(crate) fn available() -> Result<(), String> {
    api().map(drop)
}

/// libnvjpeg's `(major, minor, patch)`.
pub(crate) fn version() -> Result<(i32, i32, i32), String> {
    let api = api()?;
    let get = |what: c_int| {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; 0..=2 are MAJOR/MINOR/PATCH_LEVEL.
        check("nvjpegGetProperty", unsafe { (api.property)(what, &mut v) }).map(|()| v)
    };
    Ok((get(0)?, get(1)?, get(2)?))
}

/// The name of an `nvjpegStatus_t`.
pub(crate) fn status_name(s: Status) -> &'static str {
    match s {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "NVJPEG_STATUS_UNKNOWN",
    }
}

/// A failed nvJPEG call: the function and the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallError {
    pub(crate) call: &'static str,
    pub(crate) status: Status,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            status_name(self.status),
            self.status
        )
    }
}

fn check(call: &'static str, status: Status) -> Result<(), String> {
    call_check(call, status).map_err(|e| e.to_string())
}

fn call_check(call: &'static str, status: Status) -> Result<(), CallError> {
    if status == 0 {
        Ok(())
    } else {
        Err(CallError { call, status })
    }
}

/// An nvJPEG library handle of one backend (thread-safe, per nvjpeg.h); destroyed on drop.
#[derive(Debug)]
pub(crate) struct NvHandle {
    raw: Handle,
}

// SAFETY: nvjpegHandle_t may be used from several threads at once (only states may not).
unsafe impl Send for NvHandle {}
// SAFETY: as above.
unsafe impl Sync for NvHandle {}

impl NvHandle {
    /// `nvjpegCreateEx(backend, default allocators, flags)`, with the device's primary context
    /// current on this thread. Tries with chroma interpolation first.
    pub(crate) fn new(backend: c_int) -> Result<NvHandle, CallError> {
        let api = api().map_err(|_| CallError {
            call: "nvjpegCreateEx",
            status: 1,
        })?;
        let mut last = CallError {
            call: "nvjpegCreateEx",
            status: 2,
        };
        for flags in [FLAG_UPSAMPLING_WITH_INTERPOLATION, 0] {
            let mut raw: Handle = std::ptr::null_mut();
            // SAFETY: null allocators select nvJPEG's defaults; `raw` is a valid out-pointer.
            let s = unsafe {
                (api.create_ex)(
                    backend,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    flags,
                    &mut raw,
                )
            };
            match call_check("nvjpegCreateEx", s) {
                Ok(()) => return Ok(NvHandle { raw }),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `nvjpegGetImageInfo`: `(components, subsampling, width, height)` of the first component.
    pub(crate) fn image_info(&self, data: &[u8]) -> Result<(i32, i32, usize, usize), CallError> {
        let api = api().expect("the handle exists, so the library loaded");
        let (mut n, mut css) = (0 as c_int, 0 as c_int);
        let (mut w, mut h) = ([0 as c_int; MAX_COMPONENT], [0 as c_int; MAX_COMPONENT]);
        // SAFETY: `data` is a live byte slice of `data.len()` bytes, read during the call;
        // the out-arrays hold NVJPEG_MAX_COMPONENT ints as the header requires.
        call_check("nvjpegGetImageInfo", unsafe {
            (api.image_info)(
                self.raw,
                data.as_ptr(),
                data.len(),
                &mut n,
                &mut css,
                w.as_mut_ptr(),
                h.as_mut_ptr(),
            )
        })?;
        Ok((n, css, w[0].max(0) as usize, h[0].max(0) as usize))
    }
}

impl Drop for NvHandle {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: the handle is valid, its states were dropped first (they hold an Arc of
            // it), and it is never used again.
            if let Err(e) = check("nvjpegDestroy", unsafe { (api.destroy)(self.raw) }) {
                tracing::error!(target: "longshore::vision", error = %e, "destroying an nvJPEG handle");
            }
        }
    }
}

/// A decoding state of a handle (used by one thread at a time) with a parsed-stream object for
/// `nvjpegDecodeBatchedSupported`; destroyed on drop.
#[derive(Debug)]
pub(crate) struct NvState {
    handle: std::sync::Arc<NvHandle>,
    raw: State,
    jstream: JStream,
    /// The batch size `nvjpegDecodeBatchedInitialize` was last called with.
    batched: Option<usize>,
}

// SAFETY: a state is used by one thread at a time (the decoder holds it by `&mut`).
unsafe impl Send for NvState {}

impl NvState {
    pub(crate) fn new(handle: std::sync::Arc<NvHandle>) -> Result<NvState, CallError> {
        let api = api().expect("the handle exists, so the library loaded");
        let mut raw: State = std::ptr::null_mut();
        // SAFETY: a live handle and a valid out-pointer.
        call_check("nvjpegJpegStateCreate", unsafe {
            (api.state_create)(handle.raw, &mut raw)
        })?;
        let mut jstream: JStream = std::ptr::null_mut();
        // SAFETY: as above.
        let made = call_check("nvjpegJpegStreamCreate", unsafe {
            (api.stream_create)(handle.raw, &mut jstream)
        });
        let state = NvState {
            handle,
            raw,
            jstream,
            batched: None,
        };
        made.map(|()| state)
    }

    /// Whether the hardware batched decoder takes `data` (`nvjpegJpegStreamParse`, then
    /// `nvjpegDecodeBatchedSupported`, whose 0 means "supported").
    pub(crate) fn batched_supported(&mut self, data: &[u8]) -> Result<bool, CallError> {
        let api = api().expect("the state exists, so the library loaded");
        // SAFETY: live handle and stream object; `data` is read during the call only
        // (save_stream = 0: no copy of it is kept).
        call_check("nvjpegJpegStreamParse", unsafe {
            (api.stream_parse)(
                self.handle.raw,
                data.as_ptr(),
                data.len(),
                0,
                0,
                self.jstream,
            )
        })?;
        let mut unsupported: c_int = -1;
        // SAFETY: the stream object was just parsed; valid out-pointer.
        call_check("nvjpegDecodeBatchedSupported", unsafe {
            (api.batched_supported)(self.handle.raw, self.jstream, &mut unsupported)
        })?;
        Ok(unsupported == 0)
    }

    /// `nvjpegDecode` of one image to planar RGB at `out`, on `stream`.
    ///
    /// # Safety
    /// `out`'s channels point at device memory of the current context holding `pitch * height`
    /// bytes each for this image's height; `stream` is a live `CUstream` of that context; the
    /// bytes of `data` stay alive and unchanged until the work enqueued on `stream` completes.
    pub(crate) unsafe fn decode(
        &mut self,
        data: &[u8],
        out: &mut Image,
        stream: *mut c_void,
    ) -> Result<(), CallError> {
        let api = api().expect("the state exists, so the library loaded");
        // SAFETY: forwarded from the caller; handle and state are live.
        call_check("nvjpegDecode", unsafe {
            (api.decode)(
                self.handle.raw,
                self.raw,
                data.as_ptr(),
                data.len(),
                OUTPUT_RGB,
                out,
                stream,
            )
        })
    }

    /// `nvjpegDecodeBatchedInitialize` (when the batch size changed) then `nvjpegDecodeBatched`.
    ///
    /// # Safety
    /// As [`NvState::decode`], for every image: `data[i]` decodes into `out[i]`.
    pub(crate) unsafe fn decode_batched(
        &mut self,
        data: &[&[u8]],
        out: &mut [Image],
        stream: *mut c_void,
    ) -> Result<(), CallError> {
        let api = api().expect("the state exists, so the library loaded");
        assert_eq!(data.len(), out.len(), "one output per image");
        let n = data.len();
        if self.batched != Some(n) {
            self.batched = None;
            let count = c_int::try_from(n).map_err(|_| CallError {
                call: "nvjpegDecodeBatchedInitialize",
                status: 2,
            })?;
            // SAFETY: live handle and state; one CPU thread (ignored by the hardware backend).
            call_check("nvjpegDecodeBatchedInitialize", unsafe {
                (api.batched_init)(self.handle.raw, self.raw, count, 1, OUTPUT_RGB)
            })?;
            self.batched = Some(n);
        }
        let ptrs: Vec<*const u8> = data.iter().map(|d| d.as_ptr()).collect();
        let lens: Vec<usize> = data.iter().map(|d| d.len()).collect();
        // SAFETY: `ptrs`/`lens` describe `n` live byte slices, `out` holds `n` images (the
        // caller's guarantees cover the memory they point at); the arrays outlive the call.
        let r = call_check("nvjpegDecodeBatched", unsafe {
            (api.batched)(
                self.handle.raw,
                self.raw,
                ptrs.as_ptr(),
                lens.as_ptr(),
                out.as_mut_ptr(),
                stream,
            )
        });
        if r.is_err() {
            // Re-initialise next time: a failed call may leave the state half set up.
            self.batched = None;
        }
        r
    }
}

impl Drop for NvState {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: both objects are live and never used again; the decoder synchronised
            // its stream before dropping its states, so no work uses them.
            let a = check("nvjpegJpegStreamDestroy", unsafe {
                (api.stream_destroy)(self.jstream)
            });
            // SAFETY: as above.
            let b = check("nvjpegJpegStateDestroy", unsafe {
                (api.state_destroy)(self.raw)
            });
            for e in [a, b].into_iter().filter_map(Result::err) {
                tracing::error!(target: "longshore::vision", error = %e, "destroying an nvJPEG state");
            }
        }
    }
}

/// Compiles CUDA C++ `src` to PTX with NVRTC (loaded by transfer's `cuda_libs`); the error
/// carries the compiler's log.
pub(crate) fn compile_ptx(src: &str) -> Result<String, String> {
    cuda_libs::compile_ptx(src, c"longshore_nvjpeg.cu")
}
