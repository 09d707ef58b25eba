//! The backend layer: one interface, four concepts (device, stream, event, memory), and one
//! implementation of it per device kind, dispatched here in one line per arm (the shape of
//! crossbeam-channel's flavors).
//!
//! * [`cpu`]: always compiled. Streams are worker threads fed by channels, events are
//!   condition variables, device memory is host memory owned by the backend.
//! * `cuda` (feature `cuda`): cudarc streams and events, stream-ordered device allocations,
//!   raw `cuMemcpy*Async` copies, host functions, staging lanes and an event watcher thread.
//!
//! Everything above this module (`stream.rs`, `event.rs`, `device.rs`, `buffer.rs`,
//! `staging.rs`) works on [`DeviceImpl`], [`StreamImpl`], [`EventImpl`] and [`MemImpl`] and
//! names no cudarc type. All unsafe code of the crate lives in this module's children, except
//! the two `unsafe` copy entry points here, which forward their callers' guarantees. A stream
//! and memory of two different backends never meet here: the public types compare device ids
//! first, and the arms that would mix them return [`mixed`].

// Without the `cuda` feature some arguments and plan fields only the CUDA arms use go unread.
#![cfg_attr(not(feature = "cuda"), allow(unused_variables, dead_code))]

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use longshore_host::{Fence, MemoryKind};

use crate::error::{Result, TransferError};
use crate::id::DeviceId;

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod reaper;
pub(crate) mod stage;

pub(crate) use cpu::{HostPtr, HostPtrMut, Job};

/// A stream and a buffer (or an event) of two backends met: ruled out by the device checks of
/// the public types, so reaching this is a bug of this crate, reported rather than panicking.
fn mixed(op: &'static str) -> TransferError {
    TransferError::Invalid(format!("{op}: a stream and a buffer of two backends met"))
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(ordinal: usize) -> TransferError {
    TransferError::CudaUnavailable {
        ordinal,
        reason: "longshore-transfer was built without the `cuda` feature".to_owned(),
    }
}

/// The backend of a device.
#[derive(Debug)]
pub(crate) enum DeviceImpl {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Arc<cuda::CudaDevice>),
}

impl DeviceImpl {
    /// Opens GPU `ordinal` (its primary context, once per process).
    pub(crate) fn open_cuda(ordinal: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        return cuda::open(ordinal).map(Self::Cuda);
        #[cfg(not(feature = "cuda"))]
        Err(no_cuda(ordinal))
    }

    /// GPUs the driver reports (0 without a driver or the `cuda` feature).
    pub(crate) fn cuda_count() -> usize {
        #[cfg(feature = "cuda")]
        return cuda::count();
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// The device's own name (e.g. `NVIDIA H200`), if it has one.
    pub(crate) fn name(&self) -> Option<String> {
        match self {
            Self::Cpu => None,
            #[cfg(feature = "cuda")]
            Self::Cuda(d) => d.name(),
        }
    }

    /// A new stream; `id` is its process-unique id.
    pub(crate) fn new_stream(
        &self,
        id: u64,
        priority: crate::StreamPriority,
    ) -> Result<StreamImpl> {
        match self {
            // One host thread runs a Cpu stream's work: there is nothing to prioritise.
            Self::Cpu => cpu::CpuStream::new(id).map(StreamImpl::Cpu),
            #[cfg(feature = "cuda")]
            Self::Cuda(d) => cuda::CuStream::new(d, id, priority).map(StreamImpl::Cuda),
        }
    }

    /// A stream over a native stream someone else owns.
    ///
    /// # Safety
    /// See [`Stream::from_raw`](crate::Stream::from_raw).
    pub(crate) unsafe fn wrap_stream(&self, raw: *mut c_void, id: u64) -> Result<StreamImpl> {
        match self {
            Self::Cpu => Err(TransferError::Unsupported {
                op: "Stream::from_raw",
                device: DeviceId::Cpu,
                reason: "the cpu device has no native streams; use Device::new_stream",
            }),
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded from the caller.
            Self::Cuda(d) => Ok(StreamImpl::Cuda(unsafe {
                cuda::CuStream::wrap(d, raw, id)
            })),
        }
    }

    /// `n` streams for a stager's copying threads, or none where pieces go on the caller's
    /// stream (`Cpu`).
    pub(crate) fn new_lanes(&self, n: usize) -> Result<Lanes> {
        match self {
            Self::Cpu => Ok(Lanes::None),
            #[cfg(feature = "cuda")]
            Self::Cuda(d) => cuda::staging::new_lanes(d, n).map(Lanes::Cuda),
        }
    }
}

/// The backend of a stream.
#[derive(Debug)]
pub(crate) enum StreamImpl {
    Cpu(cpu::CpuStream),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuStream),
}

impl StreamImpl {
    /// Records an event behind the work enqueued so far.
    pub(crate) fn record(&self) -> Result<EventImpl> {
        match self {
            Self::Cpu(s) => s.record().map(EventImpl::Cpu),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => s.record().map(|e| EventImpl::Cuda(Arc::new(e))),
        }
    }

    /// Makes later work wait for `event` without blocking the host. A `Cpu` stream waits for
    /// events of any device on its thread; a CUDA stream cannot wait for a `Cpu` event.
    pub(crate) fn wait(&self, event: &EventImpl) -> Result<()> {
        match (self, event) {
            (Self::Cpu(s), _) => s.wait(event.clone()),
            #[cfg(feature = "cuda")]
            (Self::Cuda(s), EventImpl::Cuda(e)) => s.wait(e),
            #[cfg(feature = "cuda")]
            (Self::Cuda(s), EventImpl::Cpu(_)) => Err(TransferError::DeviceMismatch {
                op: "wait_event",
                what: "the event",
                expected: s.device_id(),
                found: DeviceId::Cpu,
            }),
        }
    }

    /// Runs `f` in stream order: on the worker thread (`Cpu`), through `cuLaunchHostFunc`
    /// on a driver thread (CUDA).
    pub(crate) fn host_fn(&self, f: Job) -> Result<()> {
        match self {
            Self::Cpu(s) => s.enqueue(f),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => s.host_fn(f),
        }
    }

    /// Allocates `len` bytes; `true` with it when the allocation is stream-ordered (usable by
    /// other streams only after an event recorded now).
    pub(crate) fn alloc(&self, len: usize) -> Result<(MemImpl, bool)> {
        match self {
            Self::Cpu(_) => Ok((MemImpl::Cpu(cpu::CpuMem::new(len)), false)),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => Ok((MemImpl::Cuda(s.alloc(len)?), true)),
        }
    }

    /// Enqueues a fill of `mem[..len]` with `byte`.
    pub(crate) fn memset(&self, mem: &MemImpl, byte: u8, len: usize) -> Result<()> {
        match (self, mem) {
            (Self::Cpu(s), MemImpl::Cpu(m)) => cpu::enqueue_memset(s, m, 0, len, byte),
            #[cfg(feature = "cuda")]
            (Self::Cuda(s), MemImpl::Cuda(m)) => s.memset(m, byte, len),
            #[cfg(feature = "cuda")]
            _ => Err(mixed("memset")),
        }
    }

    /// Whether a copy from memory of `kind` reads it after the call returns (so the memory
    /// must be kept, untouched, until the copy's event): always on `Cpu`, whose jobs run
    /// later; on CUDA only for memory the driver can DMA from (pageable memory is consumed by
    /// the call).
    pub(crate) fn reads_host_later(&self, kind: MemoryKind) -> bool {
        match self {
            Self::Cpu(_) => true,
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => kind.is_dma_capable(),
        }
    }

    /// Enqueues a host -> device copy of `src` into `mem[offset..]`, reading `src` later.
    ///
    /// # Safety
    /// `src` stays valid and unwritten until an event recorded on this stream after this call
    /// completes; `mem` is on this stream's device and the range fits.
    pub(crate) unsafe fn htod(&self, mem: &MemImpl, offset: usize, src: HostPtr) -> Result<()> {
        match (self, mem) {
            // SAFETY: forwarded from the caller.
            (Self::Cpu(s), MemImpl::Cpu(m)) => unsafe { cpu::enqueue_htod(s, m, offset, src) },
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded from the caller.
            (Self::Cuda(s), MemImpl::Cuda(m)) => unsafe { s.htod(m, offset, src) },
            #[cfg(feature = "cuda")]
            _ => Err(mixed("upload")),
        }
    }

    /// Copies pageable `src` into `mem[offset..]`; `src` is consumed when this returns (the
    /// `Cpu` job copies it first; the CUDA driver stages it, and page-locked memory passed as
    /// pageable is waited for). The range fits (checked by the caller).
    pub(crate) fn htod_pageable(&self, mem: &MemImpl, offset: usize, src: &[u8]) -> Result<()> {
        match (self, mem) {
            (Self::Cpu(s), MemImpl::Cpu(m)) => cpu::enqueue_htod_owned(s, m, offset, src),
            #[cfg(feature = "cuda")]
            (Self::Cuda(s), MemImpl::Cuda(m)) => s.htod_pageable(m, offset, src),
            #[cfg(feature = "cuda")]
            _ => Err(mixed("upload_slice")),
        }
    }

    /// Enqueues a device -> host copy of `mem[offset..offset + dst.len]` into `dst`.
    ///
    /// # Safety
    /// `dst` stays valid and is accessed by no one else until an event recorded on this
    /// stream after this call completes; the range fits `mem`, on this stream's device.
    pub(crate) unsafe fn dtoh(&self, mem: &MemImpl, offset: usize, dst: HostPtrMut) -> Result<()> {
        match (self, mem) {
            // SAFETY: forwarded from the caller.
            (Self::Cpu(s), MemImpl::Cpu(m)) => unsafe { cpu::enqueue_dtoh(s, m, offset, dst) },
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded from the caller.
            (Self::Cuda(s), MemImpl::Cuda(m)) => unsafe { s.dtoh(m, offset, dst) },
            #[cfg(feature = "cuda")]
            _ => Err(mixed("download")),
        }
    }

    /// Enqueues a device -> device copy of `len` bytes; both ranges fit (checked by the caller).
    pub(crate) fn dtod(
        &self,
        src: (&MemImpl, usize),
        dst: (&MemImpl, usize),
        len: usize,
    ) -> Result<()> {
        match (self, src.0, dst.0) {
            (Self::Cpu(s), MemImpl::Cpu(a), MemImpl::Cpu(b)) => {
                cpu::enqueue_dtod(s, a, src.1, b, dst.1, len)
            }
            #[cfg(feature = "cuda")]
            (Self::Cuda(s), MemImpl::Cuda(a), MemImpl::Cuda(b)) => {
                s.dtod((a, src.1), (b, dst.1), len)
            }
            #[cfg(feature = "cuda")]
            _ => Err(mixed("copy")),
        }
    }

    /// The native handle (`CUstream`); `Unsupported` on `Cpu`.
    pub(crate) fn as_raw(&self) -> Result<*mut c_void> {
        match self {
            Self::Cpu(_) => Err(TransferError::Unsupported {
                op: "Stream::as_raw",
                device: DeviceId::Cpu,
                reason: "a cpu stream is a thread with no native handle; order work with \
                         events and launch_host_fn",
            }),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => Ok(s.raw()),
        }
    }

    /// Makes the device's context current on this thread (nothing to do on `Cpu`).
    pub(crate) fn bind(&self) -> Result<()> {
        match self {
            Self::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => s.bind(),
        }
    }
}

/// The backend of an event. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) enum EventImpl {
    Cpu(Arc<cpu::CpuEvent>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<cuda::CuEvent>),
}

impl EventImpl {
    /// A `Cpu` event that is already complete.
    pub(crate) fn completed() -> Self {
        let ev = Arc::new(cpu::CpuEvent::default());
        ev.signal();
        Self::Cpu(ev)
    }

    /// Non-blocking query.
    pub(crate) fn is_complete(&self) -> bool {
        match self {
            Self::Cpu(e) => e.is_complete(),
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => e.is_complete(),
        }
    }

    /// Blocks until the event completes; on CUDA, reports errors of the work before it.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            Self::Cpu(e) => {
                e.wait();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => e.synchronize(),
        }
    }

    /// Blocks until the event completes or `timeout` passes; whether it completed.
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        match self {
            Self::Cpu(e) => e.wait_timeout(timeout),
            // Woken by the event watcher (which queries every 5-100 us while events are
            // awaited) instead of polling here: a waiter on a CUDA fence (the pool's reaper)
            // learns of the completion as soon as the watcher does.
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => {
                if e.is_complete() {
                    return true;
                }
                let signal = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
                let theirs = signal.clone();
                cuda::on_complete(
                    e,
                    Box::new(move || {
                        let (done, cv) = &*theirs;
                        *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
                        cv.notify_all();
                    }),
                );
                let (done, cv) = &*signal;
                let guard = done.lock().unwrap_or_else(|p| p.into_inner());
                let (guard, _) = cv
                    .wait_timeout_while(guard, timeout, |done| !*done)
                    .unwrap_or_else(|p| p.into_inner());
                *guard
            }
        }
    }

    /// Runs `f` once the event completes (at once, here, if it has).
    pub(crate) fn on_complete(&self, f: Job) {
        match self {
            Self::Cpu(e) => e.on_complete(f),
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => cuda::on_complete(e, f),
        }
    }
}

impl Fence for EventImpl {
    fn is_complete(&self) -> bool {
        EventImpl::is_complete(self)
    }

    fn wait(&self) {
        if let Err(e) = self.synchronize() {
            tracing::error!(target: "longshore::transfer", error = %e, "waiting on an event failed; the device is broken");
        }
    }
}

/// The backend of a device buffer's memory.
#[derive(Debug)]
pub(crate) enum MemImpl {
    Cpu(Arc<cpu::CpuMem>),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuMem),
}

impl MemImpl {
    /// The address of the first byte in the device's address space.
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Self::Cpu(m) => m.addr() as u64,
            #[cfg(feature = "cuda")]
            Self::Cuda(m) => m.ptr(),
        }
    }

    /// The `CUdeviceptr`, on CUDA.
    pub(crate) fn cuda_ptr(&self) -> Option<u64> {
        match self {
            Self::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            Self::Cuda(m) => Some(m.ptr()),
        }
    }

    /// The bytes, on `Cpu`.
    pub(crate) fn cpu(&self) -> Option<&Arc<cpu::CpuMem>> {
        match self {
            Self::Cpu(m) => Some(m),
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => None,
        }
    }

    /// Frees the memory once every event of `last_uses` has completed. Never blocks on `Cpu`
    /// (jobs hold their own `Arc` of the bytes) and never panics.
    pub(crate) fn release(&mut self, last_uses: &[EventImpl]) {
        match self {
            Self::Cpu(_) => {}
            #[cfg(feature = "cuda")]
            Self::Cuda(m) => m.free_after(last_uses.iter().filter_map(|e| match e {
                EventImpl::Cuda(c) => Some(&**c),
                EventImpl::Cpu(_) => None,
            })),
        }
        let _ = last_uses;
    }
}

/// A stager's per-thread streams ("lanes").
#[derive(Debug)]
pub(crate) enum Lanes {
    /// Pieces go on the caller's stream (`Cpu`).
    None,
    #[cfg(feature = "cuda")]
    Cuda(Vec<cuda::CuStream>),
}

impl Lanes {
    /// Stages `src` into `dst[offset..]` on the lanes, ordered on `stream` as if enqueued
    /// there; `None` when there are no lanes for this stream (the caller stages on `stream`).
    pub(crate) fn upload(
        &self,
        plan: &stage::Plan<'_>,
        stream: &StreamImpl,
        src: &[u8],
        dst: (&MemImpl, usize),
    ) -> Option<Result<()>> {
        match (self, stream, dst.0) {
            #[cfg(feature = "cuda")]
            (Self::Cuda(lanes), StreamImpl::Cuda(s), MemImpl::Cuda(m))
                if lanes.len() >= plan.threads_max =>
            {
                Some(cuda::staging::upload(
                    lanes,
                    plan,
                    s,
                    src,
                    m.ptr() + dst.1 as u64,
                ))
            }
            _ => {
                let _ = (plan, stream, src, dst);
                None
            }
        }
    }
}
