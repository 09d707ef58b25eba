//! Errors of the host-memory layer.

use crate::MemoryKind;

/// Everything that can go wrong when allocating, viewing or pooling host memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A buffer of zero bytes was requested.
    #[error("cannot allocate a zero-byte {kind} buffer")]
    ZeroSize {
        /// The kind of memory that was requested.
        kind: MemoryKind,
    },
    /// The requested size and alignment do not form a valid allocation.
    #[error("invalid allocation request: {bytes} bytes aligned to {align} ({reason})")]
    InvalidLayout {
        /// Bytes requested.
        bytes: usize,
        /// Alignment requested.
        align: usize,
        /// Why the request is invalid.
        reason: &'static str,
    },
    /// The operating system or the driver could not provide the memory.
    #[error("out of memory: could not allocate {bytes} bytes of {kind} memory")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
        /// The kind of memory that was requested.
        kind: MemoryKind,
    },
    /// `mlock` refused to lock the pages (usually `RLIMIT_MEMLOCK`).
    #[error(
        "mlock refused to lock {bytes} bytes ({errno}); RLIMIT_MEMLOCK is {limit} \
         (raise it with `ulimit -l` or use page-locked memory from the CUDA driver)"
    )]
    MlockRefused {
        /// Bytes that were to be locked.
        bytes: usize,
        /// The OS error.
        errno: std::io::Error,
        /// The soft `RLIMIT_MEMLOCK`, as text (`unlimited` or a byte count).
        limit: String,
    },
    /// A system call making shared memory (a memory file) failed.
    #[error("{call} failed making shared memory: {source}")]
    SharedMemory {
        /// The call, e.g. `memfd_create`.
        call: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The CUDA driver could not be loaded, or the crate was built without CUDA.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// Why the driver could not be used.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed with {code} while {what}")]
    Cuda {
        /// The driver function, e.g. `cuMemHostAlloc`.
        call: &'static str,
        /// The driver's error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        code: String,
        /// What was being done, with sizes.
        what: String,
    },
    /// A typed view did not fit the buffer.
    #[error("cannot view {len} bytes at address {addr:#x} as [{ty}]: {reason}")]
    View {
        /// The element type.
        ty: &'static str,
        /// Buffer length in bytes.
        len: usize,
        /// Buffer address.
        addr: usize,
        /// Size or alignment mismatch.
        reason: &'static str,
    },
    /// A pool request could not be served within the pinned-memory budget.
    #[error(
        "pinned-memory budget exceeded: requested {requested} bytes (block {block} bytes) with \
         {in_use} in use, {cached} cached and {pending} awaiting fences, budget {budget}"
    )]
    BudgetExceeded {
        /// Bytes requested by the caller.
        requested: usize,
        /// Size of the block the request rounds up to.
        block: usize,
        /// Bytes leased out.
        in_use: usize,
        /// Bytes cached in free lists.
        cached: usize,
        /// Bytes freed but waiting on fences.
        pending: usize,
        /// The budget.
        budget: usize,
    },
    /// A request under the `Wait` policy timed out.
    #[error(
        "timed out after {waited:?} waiting for {block} bytes of pinned memory \
         ({in_use} in use, budget {budget})"
    )]
    WaitTimedOut {
        /// How long the request waited.
        waited: std::time::Duration,
        /// Size of the block requested.
        block: usize,
        /// Bytes leased out when the wait ended.
        in_use: usize,
        /// The budget.
        budget: usize,
    },
    /// A request can never fit the budget, whatever is freed.
    #[error(
        "request of {requested} bytes (block {block} bytes) is larger than the whole pinned budget of {budget} bytes"
    )]
    LargerThanBudget {
        /// Bytes requested.
        requested: usize,
        /// Block size the request rounds up to.
        block: usize,
        /// The budget.
        budget: usize,
    },
    /// A pool configuration value is invalid.
    #[error("invalid pool configuration: {0}")]
    Config(String),
}

/// Result alias of this crate.
pub type Result<T, E = HostError> = std::result::Result<T, E>;
