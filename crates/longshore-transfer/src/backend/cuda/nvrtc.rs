//! NVRTC through a small function table of our own, loaded at run time by
//! [`cuda_libs`](crate::cuda_libs) (cudarc's own loader only tries bare library names): CUDA
//! C++ compiled to PTX for the crates above transfer that launch kernels of their own
//! (longshore-ops, longshore-vision's nvJPEG stage). The signatures are those of `nvrtc.h`,
//! stable across CUDA 11-13.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use super::libs;
use crate::lib_search::NVRTC;

/// `nvrtcProgram`.
type Program = *mut c_void;
/// `nvrtcResult` (`NVRTC_SUCCESS` is 0).
type NvrtcResult = c_int;

struct NvrtcApi {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
}

fn nvrtc_api() -> Result<&'static NvrtcApi, String> {
    static API: OnceLock<Result<NvrtcApi, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = libs::load(&NVRTC).map_err(|e| e.to_string())?;
        // SAFETY: each type is the `extern "C"` signature of that function in nvrtc.h.
        unsafe {
            Ok(NvrtcApi {
                create: lib.get("nvrtcCreateProgram")?,
                compile: lib.get("nvrtcCompileProgram")?,
                ptx_size: lib.get("nvrtcGetPTXSize")?,
                ptx: lib.get("nvrtcGetPTX")?,
                log_size: lib.get("nvrtcGetProgramLogSize")?,
                log: lib.get("nvrtcGetProgramLog")?,
                destroy: lib.get("nvrtcDestroyProgram")?,
                error_string: lib.get("nvrtcGetErrorString")?,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether NVRTC loads; the error names every place searched.
pub fn nvrtc_available() -> Result<(), String> {
    nvrtc_api().map(drop)
}

fn nvrtc_err(api: &NvrtcApi, call: &str, r: NvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString takes any result and returns a static string (or null).
    let p = unsafe { (api.error_string)(r) };
    let text = if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    format!("{call} returned {r} ({text})")
}

/// Compiles CUDA C++ `src` (its program named `name` in NVRTC's messages) to PTX; the error
/// carries NVRTC's status text and the compiler's log.
pub fn compile_ptx(src: &str, name: &CStr) -> Result<String, String> {
    let api = nvrtc_api()?;
    let src = CString::new(src).map_err(|e| e.to_string())?;
    let mut prog: Program = std::ptr::null_mut();
    let ok = |call, r| {
        if r == 0 {
            Ok(())
        } else {
            Err(nvrtc_err(api, call, r))
        }
    };
    // SAFETY: valid out-pointer and NUL-terminated strings; no headers.
    ok("nvrtcCreateProgram", unsafe {
        (api.create)(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let result = (|| {
        // SAFETY: `prog` is a live program; no options.
        let compiled = unsafe { (api.compile)(prog, 0, std::ptr::null()) };
        if compiled != 0 {
            let mut n = 0usize;
            let mut log = Vec::new();
            // SAFETY: live program, valid out-pointer; the buffer has the size NVRTC reported.
            if unsafe { (api.log_size)(prog, &mut n) } == 0 && n > 0 {
                log = vec![0u8; n];
                // SAFETY: `log` holds `n` bytes as NVRTC asked.
                unsafe { (api.log)(prog, log.as_mut_ptr().cast()) };
            }
            let log = String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .to_owned();
            return Err(format!(
                "{}: {log}",
                nvrtc_err(api, "nvrtcCompileProgram", compiled)
            ));
        }
        let mut n = 0usize;
        // SAFETY: live, compiled program; valid out-pointer.
        ok("nvrtcGetPTXSize", unsafe { (api.ptx_size)(prog, &mut n) })?;
        let mut ptx = vec![0u8; n];
        // SAFETY: `ptx` holds the `n` bytes NVRTC reported.
        ok("nvrtcGetPTX", unsafe {
            (api.ptx)(prog, ptx.as_mut_ptr().cast())
        })?;
        Ok(String::from_utf8_lossy(&ptx)
            .trim_end_matches('\0')
            .to_owned())
    })();
    // SAFETY: `prog` is live and destroyed once.
    unsafe { (api.destroy)(&mut prog) };
    result
}
