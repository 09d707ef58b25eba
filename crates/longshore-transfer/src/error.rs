//! Errors of the transfer layer.

use longshore_host::HostError;

use crate::id::DeviceId;

/// Everything that can go wrong when opening devices, enqueuing work or copying memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// Host memory could not be allocated, pooled or viewed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// No CUDA driver could be loaded, or the crate was built without the `cuda` feature.
    #[error("cannot open cuda:{ordinal}: CUDA is not available: {reason}")]
    CudaUnavailable {
        /// The device that was asked for.
        ordinal: usize,
        /// Why the driver could not be used.
        reason: String,
    },
    /// The driver works but has no GPU with this ordinal.
    #[error("cannot open cuda:{ordinal}: the CUDA driver reports {count} device(s)")]
    NoSuchDevice {
        /// The device that was asked for.
        ordinal: usize,
        /// How many devices the driver sees.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed with {code} on {device} while {what}")]
    Cuda {
        /// The driver function, e.g. `cuMemcpyHtoDAsync`.
        call: &'static str,
        /// The driver's error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        code: String,
        /// The device the call was made for.
        device: DeviceId,
        /// What was being done: bytes, stream, offsets.
        what: String,
    },
    /// An operation mixed objects of two devices (a buffer of one device, a stream of another).
    #[error("{op}: {what} lives on {found} but the stream runs on {expected}")]
    DeviceMismatch {
        /// The operation, e.g. `upload`.
        op: &'static str,
        /// Which argument was on the wrong device.
        what: &'static str,
        /// The stream's device.
        expected: DeviceId,
        /// The argument's device.
        found: DeviceId,
    },
    /// A copy does not fit the buffer it reads from or writes into.
    #[error("{op}: {bytes} bytes at offset {offset} do not fit a {capacity}-byte device buffer")]
    OutOfBounds {
        /// The operation.
        op: &'static str,
        /// Bytes to copy.
        bytes: usize,
        /// Offset into the device buffer.
        offset: usize,
        /// Length of the device buffer.
        capacity: usize,
    },
    /// A zero-byte device buffer was requested.
    #[error("cannot allocate a zero-byte buffer on {device}")]
    ZeroSize {
        /// The device.
        device: DeviceId,
    },
    /// An argument is invalid (a zero depth, a zero chunk size, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A CUDA library an operation needs (NVRTC, or one a crate above loads with
    /// [`cuda_libs`](crate::cuda_libs)) could not be loaded or initialised.
    #[error("{op} on {device}: {library} is not available: {reason}")]
    LibraryUnavailable {
        /// The operation, e.g. `gemm`.
        op: &'static str,
        /// The library, e.g. `NVRTC`.
        library: &'static str,
        /// The device the operation was for.
        device: DeviceId,
        /// Why it could not be used.
        reason: String,
    },
    /// The operation has no meaning on this device (e.g. the native handle of a `Cpu` stream).
    #[error("{op} is not supported on {device}: {reason}")]
    Unsupported {
        /// The operation, e.g. `Stream::as_raw`.
        op: &'static str,
        /// The device it was asked of.
        device: DeviceId,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// A `Cpu` stream's worker thread is gone (it could not be spawned, or it panicked).
    #[error("stream {stream} on {device} is closed: {reason}")]
    StreamClosed {
        /// The stream's id.
        stream: u64,
        /// The stream's device.
        device: DeviceId,
        /// Why.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;
