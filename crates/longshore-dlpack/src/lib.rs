//! longshore-dlpack hands longshore batches to other frameworks without copying: every
//! tensor of a host or device batch becomes a DLPack 1.x managed tensor
//! (`DLManagedTensorVersioned`) whose deleter keeps the batch's memory alive.
//!
//! ```
//! use longshore_data::{Collate, StackCollate};
//! use longshore_dlpack::{ExportOptions, export_host, ffi::DLDeviceType};
//! use longshore_host::HostBuffer;
//!
//! // A batch of 4 samples of ([f32; 3] features, i64 label), in pageable memory.
//! let samples: Vec<([f32; 3], i64)> = (0..4).map(|i| ([i as f32; 3], i)).collect();
//! let collate = StackCollate::new();
//! let layout = collate.layout(&samples)?;
//! let storage = HostBuffer::pageable(layout.total_bytes())?;
//! let batch = collate.collate_into(&samples, layout, storage)?;
//!
//! let tensors = export_host(batch, &ExportOptions::default())?;
//! assert_eq!(tensors[0].shape(), &[4, 3]);
//! assert_eq!(tensors[0].device().device_type, DLDeviceType::CPU);
//! assert_eq!(tensors[1].host_bytes()?.unwrap(), bytemuck_i64(&[0, 1, 2, 3]));
//!
//! // A consumer takes a tensor and calls its deleter when done; the batch's memory goes back
//! // once every tensor of the batch has been released.
//! let raw = tensors.into_iter().next().unwrap().into_raw();
//! unsafe { ((*raw).deleter.unwrap())(raw) };
//! # fn bytemuck_i64(v: &[i64]) -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Map
//!
//! * [`export_host`]: a host [`Batch`](longshore_data::Batch) (a pinned pool lease as
//!   `kDLCUDAHost`, pageable memory as `kDLCPU`) to one [`DlpackTensor`] per tensor.
//! * [`export_device`]: a device batch (`DeviceBuffer` + layout) as `kDLCUDA` tensors, with the
//!   event their copy completes at.
//! * [`DlpackTensor`]: one exported tensor: shape, dtype, device; [`hand_to`] orders a
//!   consumer's stream after the data and the release after the consumer's work;
//!   [`prepare_for_stream`] and [`request`] implement the arguments of Python's `__dlpack__`;
//!   [`hand_all_to`] hands a whole batch to a stream with one wait for its copy;
//!   [`into_raw`] / [`into_raw_legacy`] hand it over.
//! * [`ffi`]: the DLPack ABI structs, written against `dlpack.h`.
//!
//! # Ownership, streams and the pool
//!
//! All tensors of a batch share its storage. The storage is dropped when the last tensor is
//! released; a pool lease then goes back to its pool, which still waits for the lease's copy
//! fences before reusing the block (the pool's budget counts it until then). When a tensor was
//! handed to a stream ([`hand_to`], or `__dlpack__(stream=...)`), its release is also ordered
//! after the work the consumer had enqueued on that stream when it called the deleter: the
//! memory cannot be reused under a kernel or copy still reading it.
//!
//! [`hand_to`]: DlpackTensor::hand_to
//! [`prepare_for_stream`]: DlpackTensor::prepare_for_stream
//! [`request`]: DlpackTensor::request
//! [`into_raw`]: DlpackTensor::into_raw
//! [`into_raw_legacy`]: DlpackTensor::into_raw_legacy

mod error;
mod export;
pub mod ffi;
mod tensor;

pub use error::DlpackError;
pub use export::{ExportOptions, PinnedLabel, export_batch, export_device, export_host};
pub use tensor::{DlpackTensor, hand_all_to};

/// Whether a consumer that passed `max_version` to `__dlpack__` takes the versioned
/// (DLPack 1.x) struct; without it, the legacy struct is expected.
pub fn wants_versioned(max_version: Option<(u32, u32)>) -> bool {
    max_version.is_some_and(|(major, _)| major >= ffi::DLPACK_MAJOR_VERSION)
}
