//! cuBLAS and NVRTC through small function tables of our own, loaded at run time.
//!
//! cudarc's loaders for these libraries only try bare names on the system search path (and
//! CUDA 12 names at most), and panic when none loads. We find them with longshore-transfer's
//! [`cuda_libs`](longshore_transfer::cuda_libs) (versioned sonames such as `libcublas.so.13`,
//! the CUDA toolkit, the `nvidia-*` pip packages and `torch/lib` of the active Python) and take
//! the few functions we call from them, so a missing library is an error naming every place
//! searched. Where to look for cuBLAS is this module's [`CUBLAS`] spec (NVRTC's is
//! transfer's). The signatures are those of `cublas_api.h` and `nvrtc.h`, stable across CUDA
//! 11-13.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use longshore_transfer::cuda_libs::{self, LibrarySpec};

/// cuBLAS (`libcublas.so.13`, `.12`, `.11`), as the CUDA toolkits, the `nvidia-cublas-cu12`
/// and `nvidia-cu13` pip packages and `torch/lib` ship it, with `libcublasLt` loaded first from
/// the same folder.
pub const CUBLAS: LibrarySpec = LibrarySpec {
    name: "cuBLAS",
    sonames: &[
        "libcublas.so.13",
        "libcublas.so.12",
        "libcublas.so.11",
        "libcublas.so",
    ],
    pip_dirs: &["nvidia/cublas/lib", "nvidia/cu13/lib", "torch/lib"],
    companions: &["libcublasLt.so"],
};

/// `cublasHandle_t`.
type BlasHandle = *mut c_void;
/// `cublasStatus_t` (`CUBLAS_STATUS_SUCCESS` is 0).
type BlasStatus = c_int;

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

/// Whether cuBLAS loads (why not, naming every place searched).
pub(crate) fn blas_available() -> Result<(), String> {
    blas_api().map(drop)
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
                tracing::error!(target: "longshore_ops", error = %e, "destroying a cuBLAS handle");
            }
        }
    }
}

/// Whether NVRTC loads (why not, naming every place searched).
pub(crate) fn nvrtc_available() -> Result<(), String> {
    cuda_libs::nvrtc_available()
}

/// Compiles CUDA C++ `src` to PTX with NVRTC; the error carries the compiler's log.
pub(crate) fn compile_ptx(src: &str) -> Result<String, String> {
    cuda_libs::compile_ptx(src, c"longshore_ops.cu")
}
