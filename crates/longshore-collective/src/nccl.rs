//! The CUDA backend of the collectives: NCCL through a small function table of our own, loaded
//! at run time.
//!
//! cudarc's NCCL loader only tries bare names (`libnccl.so`, not NCCL's soname `libnccl.so.2`)
//! on the system search path and panics when none loads. We find the library with
//! longshore-transfer's [`cuda_libs`](longshore_transfer::cuda_libs) (versioned sonames, the
//! CUDA toolkit, the `nvidia-nccl` pip package and `torch/lib` of the active Python) and take
//! the seven functions we call from it, so a missing library is a
//! [`TransferError::LibraryUnavailable`] naming every place searched.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaContext;
use longshore_transfer::cuda_libs::{self, NCCL};
use longshore_transfer::{DeviceId, Result, Stream, TransferError};

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawUniqueId {
    internal: [c_char; UniqueId::LEN],
}

/// `ncclComm_t`.
type RawCommPtr = *mut c_void;
/// `ncclResult_t` (`ncclSuccess` is 0).
type NcclResult = c_int;
/// `ncclFloat32` of `ncclDataType_t`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum` of `ncclRedOp_t`.
const NCCL_SUM: c_int = 0;

/// The NCCL functions we call, with the signatures of `nccl.h`.
struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawCommPtr, c_int, RawUniqueId, c_int) -> NcclResult,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawCommPtr,
        *mut c_void,
    ) -> NcclResult,
    comm_get_async_error: unsafe extern "C" fn(RawCommPtr, *mut NcclResult) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(RawCommPtr) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// The loaded library's functions, or why it could not be loaded (with every place searched).
fn api() -> std::result::Result<&'static Api, String> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = cuda_libs::load(&NCCL).map_err(|e| e.to_string())?;
        // SAFETY: each type below is the `extern "C"` signature of that function in nccl.h
        // (NCCL 2.x), whose ABI is stable across 2.x releases.
        unsafe {
            Ok(Api {
                get_version: lib.get("ncclGetVersion")?,
                get_unique_id: lib.get("ncclGetUniqueId")?,
                comm_init_rank: lib.get("ncclCommInitRank")?,
                all_reduce: lib.get("ncclAllReduce")?,
                comm_get_async_error: lib.get("ncclCommGetAsyncError")?,
                comm_destroy: lib.get("ncclCommDestroy")?,
                get_error_string: lib.get("ncclGetErrorString")?,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether libnccl can be loaded: its version (e.g. `22703` for 2.27.3), or why not.
///
/// The library is looked for where a PyTorch user has it, with no symlink or
/// `LD_LIBRARY_PATH` needed: `libnccl.so.2` on the system search path, in the CUDA toolkit
/// (`CUDA_HOME`, `/usr/local/cuda*`), and in `nvidia/nccl/lib` and `torch/lib` of the active
/// Python's site-packages (see [`cuda_libs`](longshore_transfer::cuda_libs)). The error names
/// every place searched.
pub fn nccl_available() -> std::result::Result<i32, String> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; the function is from the loaded library.
    check(unsafe { (api.get_version)(&mut v) })
        .map(|()| v)
        .map_err(|e| format!("ncclGetVersion failed: {e}"))
}

/// Fails with an error naming NCCL when it cannot be loaded.
pub(crate) fn require(ordinal: usize) -> Result<i32> {
    nccl_available().map_err(|reason| TransferError::LibraryUnavailable {
        op: "nccl init",
        library: "NCCL (libnccl.so.2)",
        device: DeviceId::Cuda(ordinal),
        reason,
    })
}

/// `Ok` for `ncclSuccess`, otherwise the code with NCCL's text for it.
fn check(code: NcclResult) -> std::result::Result<(), String> {
    if code == 0 {
        return Ok(());
    }
    let text = api()
        .ok()
        // SAFETY: ncclGetErrorString takes any result code and returns a static
        // NUL-terminated string (or null).
        .map(|api| unsafe { (api.get_error_string)(code) })
        .filter(|p| !p.is_null())
        // SAFETY: non-null, NUL-terminated and static (see above).
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err(format!("ncclResult {code} ({text})"))
}

/// NCCL's `ncclUniqueId`: 128 opaque bytes made by rank 0 ([`UniqueId::new`]) and handed to
/// every rank before [`Communicator::nccl`](super::Communicator::nccl).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UniqueId::LEN]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: String = self.0[..8].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "UniqueId({head}..)")
    }
}

impl UniqueId {
    /// Bytes in a unique id.
    pub const LEN: usize = 128;

    /// A fresh id (`ncclGetUniqueId`), made by rank 0. Needs libnccl, not a GPU.
    pub fn new() -> Result<Self> {
        require(0)?;
        let api = api().map_err(|reason| TransferError::LibraryUnavailable {
            op: "ncclGetUniqueId",
            library: "NCCL (libnccl.so.2)",
            device: DeviceId::Cuda(0),
            reason,
        })?;
        let mut raw = RawUniqueId {
            internal: [0; Self::LEN],
        };
        // SAFETY: `raw` is a valid out-pointer to an ncclUniqueId.
        check(unsafe { (api.get_unique_id)(&mut raw) }).map_err(|reason| {
            TransferError::Collective {
                op: "ncclGetUniqueId",
                rank: 0,
                world_size: 0,
                reason,
            }
        })?;
        let mut b = [0u8; Self::LEN];
        for (d, s) in b.iter_mut().zip(raw.internal.iter()) {
            *d = *s as u8;
        }
        Ok(Self(b))
    }

    /// The id as bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        self.0
    }

    /// The id from [`to_bytes`](UniqueId::to_bytes)'s output; an error unless there are exactly
    /// [`LEN`](UniqueId::LEN) bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let b: [u8; Self::LEN] = bytes.try_into().map_err(|_| {
            TransferError::Invalid(format!(
                "an NCCL unique id has {} bytes, got {}",
                Self::LEN,
                bytes.len()
            ))
        })?;
        Ok(Self(b))
    }

    fn raw(&self) -> RawUniqueId {
        let mut internal = [0 as c_char; Self::LEN];
        for (d, s) in internal.iter_mut().zip(self.0.iter()) {
            *d = *s as c_char;
        }
        RawUniqueId { internal }
    }
}

/// An `ncclComm_t`, used by one thread at a time (behind the communicator's mutex).
struct RawComm(RawCommPtr);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; `NcclComm` only reaches it through a `Mutex`.
unsafe impl Send for RawComm {}

/// One rank's NCCL communicator on one GPU.
pub(crate) struct NcclComm {
    comm: Mutex<RawComm>,
    api: &'static Api,
    /// The device's primary context (the one longshore-transfer's streams use), made current
    /// before each NCCL call.
    ctx: Arc<CudaContext>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("device", &self.ctx.ordinal())
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl NcclComm {
    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn bind(&self) -> Result<()> {
        bind(&self.ctx)
    }

    fn err(&self, op: &'static str, reason: String) -> TransferError {
        TransferError::Collective {
            op,
            rank: self.rank,
            world_size: self.world,
            reason,
        }
    }

    /// `ncclCommInitRank` on `dev`: blocks until every rank has called it.
    pub(crate) fn init(ordinal: usize, rank: usize, world: usize, id: &UniqueId) -> Result<Self> {
        require(ordinal)?;
        let (nranks, r) = match (c_int::try_from(world), c_int::try_from(rank)) {
            (Ok(n), Ok(r)) => (n, r),
            _ => {
                return Err(TransferError::Invalid(format!(
                    "world size {world} too large"
                )));
            }
        };
        // NCCL uses the calling thread's current device: this GPU's primary context. (Reached
        // only with a CUDA stream in hand, so the driver has loaded.)
        let ctx = CudaContext::new(ordinal).map_err(|e| TransferError::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            code: format!("{:?}", e.0),
            device: DeviceId::Cuda(ordinal),
            what: "opening the context for nccl".to_owned(),
        })?;
        bind(&ctx)?;
        let fail = |reason: String| TransferError::Collective {
            op: "ncclCommInitRank",
            rank,
            world_size: world,
            reason,
        };
        let api = api().map_err(fail)?;
        let mut comm: RawCommPtr = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is passed by value; 0 <= r < nranks
        // (checked by the caller); this device's context is current on this thread.
        check(unsafe { (api.comm_init_rank)(&mut comm, nranks, id.raw(), r) }).map_err(fail)?;
        if comm.is_null() {
            return Err(fail("no communicator returned".into()));
        }
        tracing::info!(target: "longshore::collective", rank, world, device = ordinal, "nccl communicator ready");
        Ok(Self {
            comm: Mutex::new(RawComm(comm)),
            api,
            ctx,
            rank,
            world,
        })
    }

    /// Enqueues `ncclAllReduce(sum, f32)` in place on `ptr`, `len` values, on `stream`.
    pub(crate) fn all_reduce(&self, stream: &Stream, ptr: u64, len: usize) -> Result<()> {
        let cs = stream.as_raw()?;
        let stream_id = stream.id();
        self.bind()?;
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `ptr` points at `len` f32 inside a live allocation of this communicator's
        // device (the region was checked on the host against the buffer, whose device matches);
        // in-place operation (send == receive buffer) is allowed by NCCL; `cs` is the CUstream
        // of a transfer stream of this device's primary context, current on this
        // thread; the communicator is valid until drop and used by one thread at a time.
        check(unsafe {
            (self.api.all_reduce)(
                ptr as *const c_void,
                ptr as *mut c_void,
                len,
                NCCL_FLOAT32,
                NCCL_SUM,
                comm.0,
                cs,
            )
        })
        .map_err(|e| {
            self.err(
                "ncclAllReduce",
                format!(
                    "{e} ({len} f32 on stream {stream_id}, cuda:{})",
                    self.ordinal()
                ),
            )
        })
    }

    /// NCCL's asynchronous error of the communicator.
    pub(crate) fn check(&self) -> Result<()> {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let mut state: NcclResult = 0;
        // SAFETY: the communicator is valid (until drop); `state` is a valid out-pointer.
        check(unsafe { (self.api.comm_get_async_error)(comm.0, &mut state) })
            .map_err(|e| self.err("ncclCommGetAsyncError", e))?;
        check(state).map_err(|e| self.err("all_reduce_sum", e))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(|p| p.into_inner());
        if comm.0.is_null() {
            return;
        }
        if let Err(e) = bind(&self.ctx) {
            tracing::error!(target: "longshore::collective", error = %e, "binding the context to destroy an nccl communicator");
        }
        // SAFETY: the communicator is valid and is never used again (we own it and are
        // dropping it). Buffers of enqueued all-reduces are kept alive by their events.
        if let Err(e) = check(unsafe { (self.api.comm_destroy)(comm.0) }) {
            tracing::error!(target: "longshore::collective", rank = self.rank, error = %e, "ncclCommDestroy failed");
        }
        comm.0 = std::ptr::null_mut();
    }
}

fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| TransferError::Cuda {
        call: "cuCtxSetCurrent",
        code: format!("{:?}", e.0),
        device: DeviceId::Cuda(ctx.ordinal()),
        what: "binding the context for nccl".to_owned(),
    })
}
