//! The CUDA backend of the collectives: NCCL through cudarc's `result`/`sys` layers, loaded at
//! run time.
//!
//! cudarc's loader panics when libnccl cannot be opened, so its presence is checked first, with
//! any panic contained, and every entry point here fails with
//! [`TransferError::LibraryUnavailable`] instead.

use std::ffi::{CStr, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaContext;
use cudarc::nccl::{result as nr, sys as ns};
use longshore_transfer::{DeviceId, Result, Stream, TransferError};

/// Whether libnccl can be loaded: its version (e.g. `22703` for 2.27.3), or why not.
///
/// cudarc looks for `libnccl.so` (and a few versioned names, but not NCCL's own soname
/// `libnccl.so.2`), on the usual search path (`LD_LIBRARY_PATH`, ...). The NCCL of a PyTorch
/// pip install is `site-packages/nvidia/nccl/lib/libnccl.so.2`: make a `libnccl.so` symlink
/// to it in a folder on `LD_LIBRARY_PATH`.
pub fn nccl_available() -> std::result::Result<i32, String> {
    static STATUS: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open the library by its candidate names.
            let present = catch_unwind(|| unsafe { ns::is_culib_present() }).unwrap_or(false);
            if !present {
                return Err(
                    "libnccl could not be loaded: cudarc looks for libnccl.so (not \
                            NCCL's soname libnccl.so.2); put a libnccl.so symlink to \
                            libnccl.so.2 in a folder on LD_LIBRARY_PATH"
                        .to_owned(),
                );
            }
            catch_unwind(nr::get_nccl_version)
                .map_err(|_| "libnccl loaded but ncclGetVersion is missing".to_owned())?
                .map_err(|e| format!("ncclGetVersion failed: {}", describe(&e)))
        })
        .clone()
}

/// Fails with an error naming NCCL when it cannot be loaded.
pub(crate) fn require(ordinal: usize) -> Result<i32> {
    nccl_available().map_err(|reason| TransferError::LibraryUnavailable {
        op: "nccl init",
        library: "NCCL (libnccl.so)",
        device: DeviceId::Cuda(ordinal),
        reason,
    })
}

fn describe(e: &nr::NcclError) -> String {
    // SAFETY: ncclGetErrorString takes any result code and returns a static NUL-terminated
    // string (or null); the library is loaded (only called after a call into it failed).
    let text = catch_unwind(|| unsafe { ns::ncclGetErrorString(e.0) })
        .ok()
        .filter(|p| !p.is_null())
        // SAFETY: non-null, NUL-terminated and static (see above).
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{:?} ({text})", e.0)
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
        let raw = nr::get_uniqueid().map_err(|e| TransferError::Collective {
            op: "ncclGetUniqueId",
            rank: 0,
            world_size: 0,
            reason: describe(&e),
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

    fn raw(&self) -> ns::ncclUniqueId {
        let mut internal = [0 as std::ffi::c_char; Self::LEN];
        for (d, s) in internal.iter_mut().zip(self.0.iter()) {
            *d = *s as std::ffi::c_char;
        }
        ns::ncclUniqueId { internal }
    }
}

/// An `ncclComm_t`, used by one thread at a time (behind the communicator's mutex).
struct RawComm(ns::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; `NcclComm` only reaches it through a `Mutex`.
unsafe impl Send for RawComm {}

/// One rank's NCCL communicator on one GPU.
pub(crate) struct NcclComm {
    comm: Mutex<RawComm>,
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
        let mut comm: ns::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is passed by value; 0 <= r < nranks
        // (checked by the caller); the library is loaded (`require` above) and this device's
        // context is current on this thread.
        let res = catch_unwind(AssertUnwindSafe(|| unsafe {
            nr::comm_init_rank(&mut comm, nranks, id.raw(), r)
        }));
        let fail = |reason: String| TransferError::Collective {
            op: "ncclCommInitRank",
            rank,
            world_size: world,
            reason,
        };
        match res {
            Err(_) => return Err(fail("libnccl lacks ncclCommInitRank".to_owned())),
            Ok(Err(e)) => return Err(fail(describe(&e))),
            Ok(Ok(_)) if comm.is_null() => return Err(fail("no communicator returned".into())),
            Ok(Ok(_)) => {}
        }
        tracing::info!(target: "longshore::collective", rank, world, device = ordinal, "nccl communicator ready");
        Ok(Self {
            comm: Mutex::new(RawComm(comm)),
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
        // of a transfer stream of this device's primary context, current on this thread; the communicator is valid until drop
        // and used by one thread at a time (the mutex).
        unsafe {
            nr::all_reduce(
                ptr as *const c_void,
                ptr as *mut c_void,
                len,
                ns::ncclDataType_t::ncclFloat32,
                ns::ncclRedOp_t::ncclSum,
                comm.0,
                cs as ns::cudaStream_t,
            )
        }
        .map(drop)
        .map_err(|e| {
            self.err(
                "ncclAllReduce",
                format!(
                    "{} ({len} f32 on stream {stream_id}, cuda:{})",
                    describe(&e),
                    self.ordinal()
                ),
            )
        })
    }

    /// NCCL's asynchronous error of the communicator.
    pub(crate) fn check(&self) -> Result<()> {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let mut state = ns::ncclResult_t::ncclSuccess;
        // SAFETY: the communicator is valid (until drop); `state` is a valid out-pointer.
        unsafe { ns::ncclCommGetAsyncError(comm.0, &mut state) }
            .result()
            .map_err(|e| self.err("ncclCommGetAsyncError", describe(&e)))?;
        match state.result() {
            Ok(_) => Ok(()),
            Err(e) => Err(self.err("all_reduce_sum", describe(&e))),
        }
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
        match unsafe { nr::comm_destroy(comm.0) } {
            Ok(_) => {}
            Err(e) => {
                tracing::error!(target: "longshore::collective", rank = self.rank, error = %describe(&e), "ncclCommDestroy failed")
            }
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
