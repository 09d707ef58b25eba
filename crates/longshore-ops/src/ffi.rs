//! cuBLAS and NVRTC through small function tables of our own, loaded at run time.
//!
//! cudarc's loaders for these libraries only try bare names on the system search path (and
//! CUDA 12 names at most), and panic when none loads. We find them with longshore-transfer's
//! [`cuda_libs`](longshore_transfer::cuda_libs) (versioned sonames such as `libcublas.so.13`,
//! the CUDA toolkit, the `nvidia-*` pip packages and `torch/lib` of the active Python) and take
//! the few functions we call from them, so a missing library is an error naming every place
//! searched. The signatures are those of `cublas_api.h` and `nvrtc.h`, stable across CUDA
//! 11-13.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use longshore_transfer::cuda_libs::{self, CUBLAS, NVRTC};

/// `cublasHandle_t`.
type BlasHandle = *mut c_void;
/// `cublasStatus_t` (`CUBLAS_STATUS_SUCCESS` is 0).
type BlasStatus = c_int;
/// `nvrtcProgram`.
type Program = *mut c_void;
/// `nvrtcResult` (`NVRTC_SUCCESS` is 0).
type NvrtcResult = c_int;

/// `CUBLAS_OP_N` and `CUBLAS_OP_T` of `cublasOperation_t`.
pub(crate) const OP_N: c_int = 0;
pub(crate) const OP_T: c_int = 1;

struct BlasApi {
    create: unsafe extern "C" fn(*mut BlasHandle) -> BlasStatus,
    destroy: unsafe extern "C" fn(BlasHandle) -> BlasStatus,
    set_stream: unsafe extern "C" fn(BlasHandle, *mut c_void) -> BlasStatus,
    #[allow(clippy::type_complexity)]
    sgemm: unsafe extern "C" fn(
        BlasHandle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const f32,
        *const f32,
        c_int,
        *const f32,
        c_int,
        *const f32,
        *mut f32,
        c_int,
    ) -> BlasStatus,
}

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

fn blas_api() -> Result<&'static BlasApi, String> {
    static API: OnceLock<Result<BlasApi, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = cuda_libs::load(&CUBLAS).map_err(|e| e.to_string())?;
        // SAFETY: each type is the `extern "C"` signature of that function in cublas_api.h.
        unsafe {
            Ok(BlasApi {
                create: lib.get("cublasCreate_v2")?,
                destroy: lib.get("cublasDestroy_v2")?,
                set_stream: lib.get("cublasSetStream_v2")?,
                sgemm: lib.get("cublasSgemm_v2")?,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn nvrtc_api() -> Result<&'static NvrtcApi, String> {
    static API: OnceLock<Result<NvrtcApi, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = cuda_libs::load(&NVRTC).map_err(|e| e.to_string())?;
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

/// Whether cuBLAS loads (why not, naming every place searched).
pub(crate) fn blas_available() -> Result<(), String> {
    blas_api().map(drop)
}

/// Whether NVRTC loads (why not, naming every place searched).
pub(crate) fn nvrtc_available() -> Result<(), String> {
    nvrtc_api().map(drop)
}

fn blas_check(call: &str, status: BlasStatus) -> Result<(), String> {
    match status {
        0 => Ok(()),
        s => Err(format!("{call} returned cublasStatus {s}")),
    }
}

/// A cuBLAS handle bound to one stream; destroyed on drop.
#[derive(Debug)]
pub(crate) struct Blas {
    handle: BlasHandle,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on it are not
// concurrent; ops keeps each `Blas` behind a mutex.
unsafe impl Send for Blas {}

impl Blas {
    /// `cublasCreate` + `cublasSetStream`, with the stream's context current on this thread.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of the current context that outlives the handle.
    pub(crate) unsafe fn new(stream: *mut c_void) -> Result<Self, String> {
        let api = blas_api()?;
        let mut handle: BlasHandle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        blas_check("cublasCreate_v2", unsafe { (api.create)(&mut handle) })?;
        let blas = Self { handle };
        // SAFETY: the handle was just created; the stream is live (caller).
        blas_check("cublasSetStream_v2", unsafe {
            (api.set_stream)(handle, stream)
        })?;
        Ok(blas)
    }

    /// Column-major `C = alpha * op(A) * op(B) + beta * C` (`cublasSgemm`).
    ///
    /// # Safety
    /// `a`, `b`, `c` point at device memory of the handle's context holding the elements the
    /// sizes and leading dimensions address; `c` overlaps neither; the context is current.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn sgemm(
        &self,
        (op_a, op_b): (c_int, c_int),
        (m, n, k): (c_int, c_int, c_int),
        alpha: f32,
        (a, lda): (*const f32, c_int),
        (b, ldb): (*const f32, c_int),
        beta: f32,
        (c, ldc): (*mut f32, c_int),
    ) -> Result<(), String> {
        let api = blas_api()?;
        // SAFETY: forwarded from the caller; alpha and beta are host values read before the
        // call returns (the default host pointer mode).
        blas_check("cublasSgemm_v2", unsafe {
            (api.sgemm)(
                self.handle,
                op_a,
                op_b,
                m,
                n,
                k,
                &alpha,
                a,
                lda,
                b,
                ldb,
                &beta,
                c,
                ldc,
            )
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Ok(api) = blas_api() {
            // SAFETY: the handle is valid and never used again.
            if let Err(e) = blas_check("cublasDestroy_v2", unsafe { (api.destroy)(self.handle) }) {
                tracing::error!(target: "longshore::ops", error = %e, "destroying a cuBLAS handle");
            }
        }
    }
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

/// Compiles CUDA C++ `src` to PTX with NVRTC; the error carries the compiler's log.
pub(crate) fn compile_ptx(src: &str) -> Result<String, String> {
    let api = nvrtc_api()?;
    let src = CString::new(src).map_err(|e| e.to_string())?;
    let name = c"longshore_ops.cu";
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
