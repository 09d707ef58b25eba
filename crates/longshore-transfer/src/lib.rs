//! longshore-transfer is the transfer engine of longshore: devices, streams, events, device
//! buffers and asynchronous host<->device copies whose ordering and lifetime rules are checked
//! by types.
//!
//! ```
//! use longshore_host::{HostBuffer, MemoryKind};
//! use longshore_transfer::Device;
//!
//! // The Cpu device is a real asynchronous backend; `Device::cuda(0)?` works the same way.
//! let device = Device::cpu();
//! let copy = device.new_stream()?;
//!
//! // Host -> device: the source is moved into the copy, which returns at once.
//! let src = HostBuffer::from_slice(MemoryKind::Pageable, &[1.0f32, 2.0, 3.0, 4.0])?;
//! let mut on_device = copy.alloc(src.len())?;
//! let upload = copy.upload(src, &mut on_device)?;
//!
//! // Device -> host: the result is reachable only through `wait()` or `.await`.
//! let pending = copy.download(&on_device, HostBuffer::pageable(16)?)?;
//! let back = pending.wait()?;
//! assert_eq!(back.as_slice::<f32>()?, &[1.0, 2.0, 3.0, 4.0]);
//! let _src_again = upload.wait()?; // the source, free to refill
//! # Ok::<(), longshore_transfer::TransferError>(())
//! ```
//!
//! # Map
//!
//! * [`Device`] (`Cpu` or `Cuda(ordinal)`, see [`DeviceId`]): opens backends, makes streams.
//! * [`Stream`]: an ordered queue of copies, fills, host functions, records and waits.
//! * [`Event`]: a point in a stream; query, wait, `.await` ([`EventFuture`]), make another
//!   stream wait on it. Implements [`longshore_host::Fence`].
//! * [`DeviceBuffer`]: device memory, reached only through copies; orders copies across streams.
//! * [`Pending`]: a value (a copy's source or destination) reachable once the copy completes.
//! * [`UploadMode`], [`Stager`], [`StagingConfig`]: pageable uploads, direct or staged through
//!   pooled page-locked chunks by several threads.
//! * [`upload_new`]: a host value into a new device buffer (what the loader's upload stage
//!   does with each batch; the loader's `DeviceStage` is the one host->device pipeline).
//! * [`GpuTopology`] ([`Device::topology`]): a GPU's PCI address, NUMA node and nearest CPUs.
//! * [`TransferError`]: what can fail, with the CUDA error name and what was being done.
//! * Seams for crates above (decoders, DLPack, the examples' device operations and
//!   all-reduce):
//!   [`Stream::enqueue_work`] (your own kernels or `Cpu` closures, ordered and tracked like
//!   copies), [`Stream::as_raw`] / [`Stream::from_raw`] (the native `CUstream`),
//!   [`Stream::local`] (per-stream state), [`DeviceBuffer::device_ptr`] and
//!   [`DeviceBuffer::cpu_memory`] ([`CpuMemory`]).
//!
//! # Backends
//!
//! The public types sit on one backend interface (`backend/`: device, stream, event and
//! memory, each an enum over the backends whose methods dispatch in one line). All of the
//! crate's cudarc types and CUDA calls live in its `cuda` module; the public types check
//! devices and bounds, order work across streams and track buffers, the backends enqueue.
//! The `Cpu` backend is always compiled: each stream runs its work in order on its own worker
//! thread, events complete when the work before them has run, and a cross-stream wait blocks
//! the waiting stream's thread, not the host, so ordering bugs show up without a GPU. The
//! CUDA backend (feature `cuda`, on by default) loads the driver at run time through cudarc;
//! [`Device::cuda`] returns an error naming the cause when there is no driver or no such GPU.
//! How CUDA futures are woken, and what it costs, is described in the [`event`] module.

mod backend;
mod buffer;
pub mod cuda_libs;
mod device;
mod error;
pub mod event;
mod id;
mod lib_search;
mod pending;
mod staging;
mod stream;
pub mod topology;
mod upload;

pub use backend::cpu::{CpuMemory, CpuMemoryGuard};
pub use buffer::DeviceBuffer;
pub use device::Device;
pub use error::{Result, TransferError};
pub use event::{Event, EventFuture};
pub use id::DeviceId;
pub use pending::Pending;
pub use staging::{Stager, StagingConfig, UploadMode};
pub use stream::{Stream, StreamPriority};
pub use topology::GpuTopology;
pub use upload::upload_new;
