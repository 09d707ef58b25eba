//! The CUDA backend of the collectives: NCCL through a small function table of our own, loaded
//! at run time.
//!
//! cudarc's NCCL loader only tries bare names (`libnccl.so`, not NCCL's soname `libnccl.so.2`)
//! on the system search path and panics when none loads. We find the library with
//! longshore-transfer's [`cuda_libs`](longshore_transfer::cuda_libs) (versioned sonames, the
//! CUDA toolkit, the `nvidia-nccl` pip package and `torch/lib` of the active Python) and take
//! the seven functions we call from it, so a missing library is a
//! [`TransferError::LibraryUnavailable`] naming every place searched. Where to look is this
//! module's [`NCCL`] spec.

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use longshore_transfer::cuda_libs::{self, LibrarySpec};
use longshore_transfer::{DeviceId, Event, Stream, TransferError};

use crate::liveness::{Liveness, Lost};
use crate::{CollectiveError, Result};

/// NCCL (`libnccl.so.2`), as the `nvidia-nccl-cu12`/`-cu13` pip packages, `torch/lib` and the
/// CUDA toolkits ship it: where [`nccl_available`] and the communicators look for it.
pub const NCCL: LibrarySpec = LibrarySpec {
    name: "NCCL",
    sonames: &["libnccl.so.2", "libnccl.so"],
    pip_dirs: &["nvidia/nccl/lib", "torch/lib"],
    companions: &[],
};

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
    comm_abort: unsafe extern "C" fn(RawCommPtr) -> NcclResult,
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
                comm_abort: lib.get("ncclCommAbort")?,
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
    nccl_available().map_err(|reason| {
        TransferError::LibraryUnavailable {
            op: "nccl init",
            library: "NCCL (libnccl.so.2)",
            device: DeviceId::Cuda(ordinal),
            reason,
        }
        .into()
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
            CollectiveError::Rank {
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
            CollectiveError::from(TransferError::Invalid(format!(
                "an NCCL unique id has {} bytes, got {}",
                Self::LEN,
                bytes.len()
            )))
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

/// How often the watchdog looks at the job.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// `ncclInProgress`: an operation of a non-blocking communicator still running (not an error).
const NCCL_IN_PROGRESS: NcclResult = 7;
/// The default bound on one all-reduce (see [`NcclComm::set_timeout`]).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What the watchdog and the communicator's callers share.
struct Watch {
    /// The `ncclComm_t`; null once aborted or destroyed, so nothing uses it afterwards.
    comm: AtomicPtr<c_void>,
    /// Serialises the callers' NCCL calls on the communicator (an NCCL communicator must not be
    /// used by two threads at once). The watchdog's abort does not wait on it for long: see
    /// [`Watch::fail`].
    calls: Mutex<()>,
    api: &'static Api,
    /// The device's primary context (the one longshore-transfer's streams use), made current
    /// before each NCCL call.
    ctx: Arc<CudaContext>,
    rank: usize,
    world: usize,
    /// Why the communicator failed; every later call returns it.
    error: Mutex<Option<String>>,
    /// A rank that said goodbye while no all-reduce was outstanding: the next all-reduce fails
    /// (it could never complete), while `check` of work already done stays `Ok`.
    departed: Mutex<Option<Lost>>,
    /// The completion event of every enqueued all-reduce not yet seen complete, with its time.
    pending: Mutex<VecDeque<(Instant, Event)>>,
    timeout: Mutex<Duration>,
    stop: AtomicBool,
    liveness: Option<Liveness>,
}

impl Watch {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn error(&self) -> Option<String> {
        Self::lock(&self.error).clone()
    }

    /// Records `why` (the first failure wins) and aborts the communicator: `ncclCommAbort`
    /// makes NCCL's kernels of this communicator return, so a stream (and a host thread
    /// synchronising it) blocked behind an all-reduce that can never complete is released.
    fn fail(&self, why: String) {
        {
            let mut e = Self::lock(&self.error);
            if e.is_some() {
                return;
            }
            tracing::error!(target: "longshore_collective", rank = self.rank, world = self.world, reason = %why, "aborting the nccl communicator");
            *e = Some(why);
        }
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return;
        }
        if let Err(e) = bind(&self.ctx) {
            tracing::error!(target: "longshore_collective", error = %e, "binding the context to abort an nccl communicator");
        }
        // Take the call lock when it comes within a second, so the abort normally runs while
        // no other NCCL call is in progress on this communicator. A caller can hold it for
        // longer only when stuck inside an NCCL call on a dead job (a blocking communicator's
        // first collective connects to its peers); the abort then runs beside that call, as
        // PyTorch's watchdog does, which is what ncclCommAbort exists for.
        let deadline = Instant::now() + Duration::from_secs(1);
        let guard = loop {
            match self.calls.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        // SAFETY: `comm` was a valid communicator, swapped out of `self.comm` above, so no
        // caller can start a new call with it and it is neither aborted nor destroyed twice;
        // see above for a call that may still be running in it.
        if let Err(e) = check(unsafe { (self.api.comm_abort)(comm) }) {
            tracing::error!(target: "longshore_collective", rank = self.rank, error = %e, "ncclCommAbort failed");
        }
        drop(guard);
    }

    /// One look: a rank gone, NCCL's asynchronous error, an all-reduce past the timeout.
    fn look(&self) {
        if self.error().is_some() {
            return;
        }
        let outstanding = {
            let mut p = Self::lock(&self.pending);
            while p.front().is_some_and(|(_, ev)| ev.is_complete()) {
                p.pop_front();
            }
            p.front().map(|(t, _)| t.elapsed())
        };
        if let Some(lost) = self.liveness.as_ref().and_then(Liveness::lost) {
            if !lost.left || outstanding.is_some() {
                self.fail(lost.describe(self.rank, self.world));
                return;
            }
            Self::lock(&self.departed).get_or_insert(lost);
        }
        if let Ok(_g) = self.calls.try_lock() {
            let comm = self.comm.load(Ordering::Acquire);
            if !comm.is_null() {
                let mut state: NcclResult = 0;
                // SAFETY: the communicator is valid (not null: neither aborted nor destroyed,
                // and both happen only with this call lock held or after this thread stopped);
                // `state` is a valid out-pointer.
                let r = check(unsafe { (self.api.comm_get_async_error)(comm, &mut state) });
                let bad = match r {
                    Err(e) => Some(e),
                    Ok(()) if state != 0 && state != NCCL_IN_PROGRESS => check(state).err(),
                    Ok(()) => None,
                };
                if let Some(e) = bad {
                    drop(_g);
                    self.fail(format!("nccl reported an asynchronous error: {e}"));
                    return;
                }
            }
        }
        let timeout = *Self::lock(&self.timeout);
        if let Some(age) = outstanding.filter(|a| *a > timeout) {
            self.fail(format!(
                "an all-reduce has not completed {:.1} s after it was enqueued (collective \
                 timeout {timeout:?}): a rank stopped issuing collectives, or issued different ones",
                age.as_secs_f64()
            ));
        }
    }
}

/// One rank's NCCL communicator on one GPU, with its watchdog thread.
pub(crate) struct NcclComm {
    watch: Arc<Watch>,
    watchdog: Option<std::thread::JoinHandle<()>>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("device", &self.watch.ctx.ordinal())
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("error", &self.watch.error())
            .finish()
    }
}

impl NcclComm {
    pub(crate) fn ordinal(&self) -> usize {
        self.watch.ctx.ordinal()
    }

    fn err(&self, op: &'static str, reason: String) -> CollectiveError {
        CollectiveError::Rank {
            op,
            rank: self.rank,
            world_size: self.world,
            reason,
        }
    }

    /// `ncclCommInitRank` on `dev`: blocks until every rank has called it. `liveness` watches
    /// the other ranks (from the TCP rendezvous); without it only the timeout and NCCL's own
    /// errors end a stuck all-reduce.
    pub(crate) fn init(
        ordinal: usize,
        rank: usize,
        world: usize,
        id: &UniqueId,
        liveness: Option<Liveness>,
    ) -> Result<Self> {
        require(ordinal)?;
        let (nranks, r) = match (c_int::try_from(world), c_int::try_from(rank)) {
            (Ok(n), Ok(r)) => (n, r),
            _ => {
                return Err(TransferError::Invalid(format!("world size {world} too large")).into());
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
        let fail = |reason: String| CollectiveError::Rank {
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
        tracing::info!(target: "longshore_collective", rank, world, device = ordinal, "nccl communicator ready");
        let watch = Arc::new(Watch {
            comm: AtomicPtr::new(comm),
            calls: Mutex::new(()),
            api,
            ctx,
            rank,
            world,
            error: Mutex::new(None),
            departed: Mutex::new(None),
            pending: Mutex::new(VecDeque::new()),
            timeout: Mutex::new(DEFAULT_TIMEOUT),
            stop: AtomicBool::new(false),
            liveness,
        });
        let w = watch.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("longshore-nccl-watchdog-{rank}"))
            .spawn(move || {
                while !w.stop.load(Ordering::Acquire) {
                    w.look();
                    std::thread::sleep(WATCH_EVERY);
                }
            })
            .map_err(|e| fail(format!("starting the watchdog thread: {e}")))?;
        Ok(Self {
            watch,
            watchdog: Some(watchdog),
            rank,
            world,
        })
    }

    /// How long an enqueued all-reduce may stay incomplete before the communicator is aborted.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        *Watch::lock(&self.watch.timeout) = timeout;
    }

    /// Enqueues `ncclAllReduce(sum, f32)` in place on `ptr`, `len` values, on `stream`.
    pub(crate) fn all_reduce(&self, stream: &Stream, ptr: u64, len: usize) -> Result<()> {
        if let Some(lost) = *Watch::lock(&self.watch.departed) {
            return Err(self.err("ncclAllReduce", lost.describe(self.rank, self.world)));
        }
        let cs = stream.as_raw()?;
        let stream_id = stream.id();
        bind(&self.watch.ctx)?;
        let _calls = Watch::lock(&self.watch.calls);
        let comm = self.live("ncclAllReduce")?;
        // SAFETY: `ptr` points at `len` f32 inside a live allocation of this communicator's
        // device (the region was checked on the host against the buffer, whose device matches);
        // in-place operation (send == receive buffer) is allowed by NCCL; `cs` is the CUstream
        // of a transfer stream of this device's primary context, current on this thread; the
        // communicator is valid (not null, and only aborted or destroyed after being swapped
        // out, see `Watch::fail`) and used by one caller at a time (the call lock).
        check(unsafe {
            (self.watch.api.all_reduce)(
                ptr as *const c_void,
                ptr as *mut c_void,
                len,
                NCCL_FLOAT32,
                NCCL_SUM,
                comm,
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

    /// The communicator, or the error that closed it (call with the call lock held).
    fn live(&self, op: &'static str) -> Result<RawCommPtr> {
        let comm = self.watch.comm.load(Ordering::Acquire);
        if comm.is_null() {
            let why = self
                .watch
                .error()
                .unwrap_or_else(|| "the communicator is closed".into());
            return Err(self.err(op, why));
        }
        Ok(comm)
    }

    /// Hands the watchdog the completion event of the all-reduce just enqueued.
    pub(crate) fn track(&self, done: Event) {
        Watch::lock(&self.watch.pending).push_back((Instant::now(), done));
    }

    /// The communicator's failure (a rank gone, the timeout, an abort), or NCCL's asynchronous
    /// error.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(why) = self.watch.error() {
            return Err(self.err("all_reduce_sum", why));
        }
        let _calls = Watch::lock(&self.watch.calls);
        let comm = self.live("all_reduce_sum")?;
        let mut state: NcclResult = 0;
        // SAFETY: the communicator is valid (not null, see `all_reduce`); `state` is a valid
        // out-pointer.
        check(unsafe { (self.watch.api.comm_get_async_error)(comm, &mut state) })
            .map_err(|e| self.err("ncclCommGetAsyncError", e))?;
        if state == NCCL_IN_PROGRESS {
            return Ok(());
        }
        check(state).map_err(|e| self.err("all_reduce_sum", e))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Release);
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
        let comm = self.watch.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return; // aborted after a failure: nothing left to destroy
        }
        if let Err(e) = bind(&self.watch.ctx) {
            tracing::error!(target: "longshore_collective", error = %e, "binding the context to destroy an nccl communicator");
        }
        let _calls = Watch::lock(&self.watch.calls);
        // SAFETY: the communicator is valid, swapped out above so it is never used again, and
        // the watchdog has stopped. Buffers of enqueued all-reduces are kept alive by their
        // events.
        if let Err(e) = check(unsafe { (self.watch.api.comm_destroy)(comm) }) {
            tracing::error!(target: "longshore_collective", rank = self.rank, error = %e, "ncclCommDestroy failed");
        }
    }
}

fn bind(ctx: &CudaContext) -> longshore_transfer::Result<()> {
    ctx.bind_to_thread().map_err(|e| TransferError::Cuda {
        call: "cuCtxSetCurrent",
        code: format!("{:?}", e.0),
        device: DeviceId::Cuda(ctx.ordinal()),
        what: "binding the context for nccl".to_owned(),
    })
}
