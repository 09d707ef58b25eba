//! [`Stream`]: an ordered queue of work on a device, and the copies enqueued on it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use longshore_host::{HostBuffer, HostMemory, MemoryKind};

use crate::backend::cpu::{self, CpuMem, CpuStream, HostPtr, HostPtrMut};
use crate::buffer::{DeviceBuffer, DeviceMem};
use crate::device::{Device, DeviceId};
use crate::error::{Result, TransferError};
use crate::event::{Event, EventInner};
use crate::pending::Pending;
use crate::staging::UploadMode;

pub(crate) enum StreamBackend {
    Cpu(CpuStream),
    #[cfg(feature = "cuda")]
    Cuda {
        dev: Arc<crate::backend::cuda::CudaDevice>,
        stream: Arc<cudarc::driver::CudaStream>,
    },
}

struct StreamShared {
    device: Device,
    id: u64,
    backend: StreamBackend,
    /// Per-stream state of the `ops` module (a cuBLAS handle bound to this stream).
    #[cfg(feature = "ops")]
    ops: crate::ops::StreamOps,
}

/// An ordered queue of work on a device: copies, fills, host functions, event records and
/// waits run in the order they were enqueued, asynchronously to the host.
///
/// On CUDA a stream is a non-blocking `CUstream`; on `Cpu` it is a worker thread. Cheap to
/// clone (clones are the same stream). Work enqueued before the last handle is dropped still
/// runs.
///
/// ```
/// use longshore_host::HostBuffer;
/// use longshore_transfer::Device;
///
/// let dev = Device::cpu();
/// let (copy, compute) = (dev.new_stream()?, dev.new_stream()?);
/// let mut on_device = copy.alloc(4096)?;
/// let src = HostBuffer::from_slice(longshore_host::MemoryKind::Pageable, &[7u8; 4096])?;
/// let upload = copy.upload(src, &mut on_device)?; // returns at once
/// compute.wait_event(upload.event())?; // compute waits device-side, the host does not block
/// let back = compute.download(&on_device, HostBuffer::pageable(4096)?)?.wait()?;
/// assert!(back.iter().all(|&b| b == 7));
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
#[derive(Clone)]
pub struct Stream {
    shared: Arc<StreamShared>,
}

fn next_stream_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn bounds(op: &'static str, bytes: usize, offset: usize, capacity: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(TransferError::OutOfBounds {
            op,
            bytes,
            offset,
            capacity,
        }),
    }
}

impl Stream {
    pub(crate) fn new(device: &Device) -> Result<Stream> {
        let id = next_stream_id();
        let backend = match device.id() {
            DeviceId::Cpu => StreamBackend::Cpu(CpuStream::new(id)?),
            DeviceId::Cuda(_ordinal) => {
                #[cfg(feature = "cuda")]
                {
                    let dev = device.cuda_device().cloned().ok_or_else(|| {
                        TransferError::Invalid(format!("{} has no CUDA backend", device.id()))
                    })?;
                    let stream = dev.new_stream()?;
                    StreamBackend::Cuda { dev, stream }
                }
                #[cfg(not(feature = "cuda"))]
                {
                    return Err(TransferError::CudaUnavailable {
                        ordinal: _ordinal,
                        reason: "longshore-transfer was built without the `cuda` feature"
                            .to_owned(),
                    });
                }
            }
        };
        tracing::debug!(target: "longshore::transfer", stream_id = id, device = %device.id(), "stream created");
        Ok(Stream {
            shared: Arc::new(StreamShared {
                device: device.clone(),
                id,
                backend,
                #[cfg(feature = "ops")]
                ops: Default::default(),
            }),
        })
    }

    /// Wraps a CUDA stream owned by another library (a framework's current stream, as the
    /// DLPack protocol passes it: `0x1` is the legacy default stream, `0x2` the per-thread
    /// default stream), so that it can [`wait_event`](Stream::wait_event) on this crate's
    /// events and [`record`](Stream::record) its own. Dropping the wrapper leaves the stream
    /// alive; the copies of this crate are never enqueued on it unless you ask.
    ///
    /// # Safety
    /// `raw` is a stream of `device`'s primary context (or one of the two special handles),
    /// and it outlives the returned `Stream` and every clone of it.
    #[cfg(feature = "cuda")]
    pub unsafe fn from_raw(device: &Device, raw: cudarc::driver::sys::CUstream) -> Result<Stream> {
        let dev = device.cuda_device().cloned().ok_or_else(|| {
            TransferError::Invalid(format!(
                "cannot wrap a CUDA stream on {}: not a CUDA device",
                device.id()
            ))
        })?;
        // SAFETY: the caller guarantees that `raw` belongs to this context and outlives the
        // wrapper; cudarc does not destroy a borrowed stream on drop.
        let stream = unsafe { dev.ctx.wrap_borrowed_stream(raw) };
        let id = next_stream_id();
        tracing::debug!(target: "longshore::transfer", stream_id = id, device = %device.id(), "external stream wrapped");
        Ok(Stream {
            shared: Arc::new(StreamShared {
                device: device.clone(),
                id,
                backend: StreamBackend::Cuda { dev, stream },
                #[cfg(feature = "ops")]
                ops: Default::default(),
            }),
        })
    }

    /// The device the stream runs on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// A process-unique id of the stream.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    pub(crate) fn backend(&self) -> &StreamBackend {
        &self.shared.backend
    }

    #[cfg(feature = "ops")]
    pub(crate) fn ops_state(&self) -> &crate::ops::StreamOps {
        &self.shared.ops
    }

    fn check_device(&self, op: &'static str, what: &'static str, found: DeviceId) -> Result<()> {
        let expected = self.device().id();
        if expected != found {
            return Err(TransferError::DeviceMismatch {
                op,
                what,
                expected,
                found,
            });
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn mismatch(&self, op: &'static str, what: &'static str, found: DeviceId) -> TransferError {
        TransferError::DeviceMismatch {
            op,
            what,
            expected: self.device().id(),
            found,
        }
    }

    /// Records an event behind all the work enqueued so far.
    pub fn record(&self) -> Result<Event> {
        let dev = self.device().id();
        match self.backend() {
            StreamBackend::Cpu(s) => Ok(Event::new(EventInner::Cpu(s.record()?), dev, self.id())),
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda { dev: cu, stream } => {
                let ev = crate::backend::cuda::CuEvent::record(cu, stream, self.id())?;
                Ok(Event::new(EventInner::Cuda(Arc::new(ev)), dev, self.id()))
            }
        }
    }

    /// Makes the work enqueued on this stream from now on wait until `event` completes,
    /// without blocking the host (on `Cpu`, the stream's worker thread waits).
    ///
    /// A `Cpu` stream can wait for an event of any device. A CUDA stream can wait for events
    /// of any CUDA device, but not for `Cpu` events: that is a [`TransferError::DeviceMismatch`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (self.backend(), &event.inner) {
            (StreamBackend::Cpu(s), _) => {
                let ev = event.clone();
                s.wait_with(Box::new(move || {
                    if let Err(e) = ev.synchronize() {
                        tracing::error!(target: "longshore::transfer", error = %e, "a cpu stream waited on a failed event");
                    }
                }))
            }
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, EventInner::Cuda(e)) => {
                stream.wait(e.raw()).map_err(|err| {
                    crate::backend::cuda::err(
                        "cuStreamWaitEvent",
                        err,
                        dev.ordinal,
                        format!(
                            "making stream {} wait on an event of stream {}",
                            self.id(),
                            event.stream_id()
                        ),
                    )
                })
            }
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { .. }, EventInner::Cpu(_)) => {
                Err(self.mismatch("wait_event", "the event", event.device()))
            }
        }
    }

    /// Blocks the host until all the work enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        self.record()?.synchronize()
    }

    /// Enqueues a host function that runs once the work before it has run; later work waits
    /// for it to return. On CUDA this is `cuLaunchHostFunc`: `f` runs on a driver thread and
    /// must not call the CUDA API (which includes dropping a `DeviceBuffer`).
    pub fn launch_host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        match self.backend() {
            StreamBackend::Cpu(s) => s.enqueue(Box::new(f)),
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda { dev, stream } => {
                crate::backend::cuda::launch_host_fn(dev, stream, Box::new(f))
            }
        }
    }

    /// Allocates `len` bytes of device memory, in stream order where the device supports it
    /// (`cuMemAllocAsync`): the buffer is usable by work enqueued on this stream at once, and by
    /// other streams' copies after the allocation (they wait for it automatically).
    /// The contents are unspecified (zero on `Cpu`); see [`alloc_zeroed`](Stream::alloc_zeroed).
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(TransferError::ZeroSize {
                device: self.device().id(),
            });
        }
        match self.backend() {
            StreamBackend::Cpu(_) => Ok(DeviceBuffer::new(
                DeviceMem::Cpu(CpuMem::new(len)),
                len,
                self.device().clone(),
                None,
            )),
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda { dev, stream } => {
                let mem = crate::backend::cuda::CuMem::alloc(dev, stream, len, self.id())?;
                let buf = DeviceBuffer::new(DeviceMem::Cuda(mem), len, self.device().clone(), None);
                let ev = self.record()?;
                buf.after_write(&ev);
                Ok(buf)
            }
        }
    }

    /// [`alloc`](Stream::alloc), then a fill with zeros on this stream.
    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer> {
        let mut buf = self.alloc(len)?;
        self.memset(&mut buf, 0)?;
        Ok(buf)
    }

    /// Enqueues a fill of the whole buffer with `byte`.
    pub fn memset(&self, buf: &mut DeviceBuffer, byte: u8) -> Result<()> {
        self.check_device("memset", "the buffer", buf.device().id())?;
        buf.before_write(self)?;
        let len = buf.len();
        match (self.backend(), &buf.mem) {
            (StreamBackend::Cpu(s), DeviceMem::Cpu(m)) => cpu::enqueue_memset(s, m, 0, len, byte)?,
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, DeviceMem::Cuda(m)) => {
                dev.bind()?;
                // SAFETY: `m` is a live allocation of `len` bytes in this stream's context
                // (checked by device id above).
                unsafe { crate::backend::cuda::memset(stream, m.ptr, byte, len) }.map_err(|e| {
                    crate::backend::cuda::err(
                        "cuMemsetD8Async",
                        e,
                        dev.ordinal,
                        format!("filling {len} bytes on stream {}", self.id()),
                    )
                })?;
            }
            #[cfg(feature = "cuda")]
            _ => return Err(self.mismatch("memset", "the buffer", buf.device().id())),
        }
        let ev = self.record()?;
        buf.after_write(&ev);
        Ok(())
    }

    /// Copies `src` to the start of `dst`; see [`upload_at`](Stream::upload_at).
    pub fn upload<S: HostMemory>(&self, src: S, dst: &mut DeviceBuffer) -> Result<Pending<S>> {
        self.upload_at(src, dst, 0)
    }

    /// Copies the bytes of `src` into `dst` at `offset`, and hands `src` back through a
    /// [`Pending`] once the copy no longer reads it.
    ///
    /// * From memory the driver can DMA (`src.kind().is_dma_capable()`: page-locked or
    ///   registered), the copy is enqueued and the call returns at once. `src` is moved into the
    ///   returned `Pending`, so nothing can write it while the copy reads it, and the copy's event
    ///   is recorded on it ([`HostMemory::record_fence`]): dropping the `Pending` (or the buffer
    ///   got back from it) never frees or reuses the memory under the copy.
    /// * From pageable memory on CUDA, the bytes are copied like
    ///   [`upload_slice`](Stream::upload_slice) with [`UploadMode::Auto`]; the call returns once
    ///   the source has been consumed, so the `Pending` is ready (or nearly) at once.
    /// * On `Cpu` every copy is asynchronous: the worker thread reads `src` when it gets there.
    pub fn upload_at<S: HostMemory>(
        &self,
        src: S,
        dst: &mut DeviceBuffer,
        offset: usize,
    ) -> Result<Pending<S>> {
        self.check_device("upload", "the destination buffer", dst.device().id())?;
        let len = src.as_bytes().len();
        bounds("upload", len, offset, dst.len())?;
        dst.before_write(self)?;
        let mut src = Box::new(src);
        let pageable_cuda = !src.kind().is_dma_capable() && !self.device().is_cpu();
        if pageable_cuda {
            self.upload_pageable_raw(src.as_bytes(), dst, offset, UploadMode::Auto)?;
        } else {
            let ptr = HostPtr {
                ptr: src.as_bytes().as_ptr(),
                len,
            };
            // SAFETY: `src` is boxed (its bytes do not move) and owned by the returned Pending,
            // which gives no access to it until an event recorded after this copy completes and
            // defers its drop until then; `HostMemory` memory stays valid while it is alive.
            unsafe { self.enqueue_htod_raw(ptr, dst, offset) }?;
        }
        let ev = self.record()?;
        dst.after_write(&ev);
        src.record_fence(ev.to_fence());
        tracing::trace!(target: "longshore::transfer", stream_id = self.id(), bytes = len, kind = %src.kind(), "upload enqueued");
        Ok(Pending::new(src, ev))
    }

    /// Enqueues an asynchronous copy of `src` into `dst` at `offset`, with no dependency tracking.
    ///
    /// # Safety
    /// The memory behind `src` stays valid and unwritten until an event recorded on this stream
    /// after this call completes. `dst` is on this stream's device and the range fits.
    pub(crate) unsafe fn enqueue_htod_raw(
        &self,
        src: HostPtr,
        dst: &DeviceBuffer,
        offset: usize,
    ) -> Result<()> {
        match (self.backend(), &dst.mem) {
            // SAFETY: forwarded from the caller.
            (StreamBackend::Cpu(s), DeviceMem::Cpu(m)) => unsafe {
                cpu::enqueue_htod(s, m, offset, src)
            },
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, DeviceMem::Cuda(m)) => {
                dev.bind()?;
                // SAFETY: the destination range is inside `m` (checked by the caller) in this
                // stream's context; the source stays valid until the copy completes (caller).
                unsafe {
                    crate::backend::cuda::htod(stream, m.ptr + offset as u64, src.ptr, src.len)
                }
                .map_err(|e| {
                    crate::backend::cuda::err(
                        "cuMemcpyHtoDAsync",
                        e,
                        dev.ordinal,
                        format!(
                            "copying {} bytes to offset {offset} on stream {}",
                            src.len,
                            self.id()
                        ),
                    )
                })
            }
            #[cfg(feature = "cuda")]
            _ => Err(self.mismatch("upload", "the destination buffer", dst.device().id())),
        }
    }

    /// Copies `src` (any host memory, treated as pageable) into `dst` at `offset` and returns
    /// the copy's event. When this returns, `src` has been consumed and may be reused.
    ///
    /// `mode` picks the path for pageable memory (see [`UploadMode`]):
    /// * [`UploadMode::Direct`] hands the pointer to the driver (`cuMemcpyHtoDAsync`). From
    ///   pageable memory the driver copies through its own small page-locked bounce buffer and
    ///   returns only once it has consumed the source: the call is synchronous in all but the
    ///   last chunk, and slow (two copies, one thread). If the slice turns out to be
    ///   page-locked, the call waits for the copy, since the driver would read it later.
    /// * [`UploadMode::Staged`] copies through chunks leased from the device's [`Stager`]
    ///   pool with several threads while earlier chunks are in flight.
    /// * [`UploadMode::Auto`] stages from the stager's `auto_min_bytes` up.
    ///
    /// [`Stager`]: crate::Stager
    pub fn upload_slice(
        &self,
        src: &[u8],
        dst: &mut DeviceBuffer,
        offset: usize,
        mode: UploadMode,
    ) -> Result<Event> {
        self.check_device("upload_slice", "the destination buffer", dst.device().id())?;
        bounds("upload_slice", src.len(), offset, dst.len())?;
        dst.before_write(self)?;
        self.upload_pageable_raw(src, dst, offset, mode)?;
        let ev = self.record()?;
        dst.after_write(&ev);
        Ok(ev)
    }

    /// The pageable path, without tracking; `src` is consumed when this returns.
    pub(crate) fn upload_pageable_raw(
        &self,
        src: &[u8],
        dst: &DeviceBuffer,
        offset: usize,
        mode: UploadMode,
    ) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let staged = match mode {
            UploadMode::Direct => false,
            UploadMode::Staged => true,
            UploadMode::Auto => src.len() >= self.device().auto_stage_min_bytes(),
        };
        if staged {
            return self.device().stager()?.upload_raw(self, src, dst, offset);
        }
        match (self.backend(), &dst.mem) {
            (StreamBackend::Cpu(s), DeviceMem::Cpu(m)) => {
                // The job owns a copy of the bytes, so `src` is free when this returns.
                let owned = src.to_vec();
                let m = m.clone();
                s.enqueue(Box::new(move || {
                    m.lock()[offset..offset + owned.len()].copy_from_slice(&owned)
                }))
            }
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, DeviceMem::Cuda(m)) => {
                dev.bind()?;
                // SAFETY: the range fits `m` (checked by the callers); `src` is borrowed for
                // the whole call, and the driver consumes pageable memory before returning. If
                // the slice is page-locked, we wait below until the copy is done.
                unsafe {
                    crate::backend::cuda::htod(
                        stream,
                        m.ptr + offset as u64,
                        src.as_ptr(),
                        src.len(),
                    )
                }
                .map_err(|e| {
                    crate::backend::cuda::err(
                        "cuMemcpyHtoDAsync",
                        e,
                        dev.ordinal,
                        format!(
                            "copying {} pageable bytes to offset {offset} on stream {}",
                            src.len(),
                            self.id()
                        ),
                    )
                })?;
                if !matches!(
                    longshore_host::is_driver_host_memory(src.as_ptr()),
                    Ok(false)
                ) {
                    self.synchronize()?;
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            _ => Err(self.mismatch("upload_slice", "the destination buffer", dst.device().id())),
        }
    }

    /// Copies the start of `src` into `dst` (`dst.len()` bytes); see [`download_at`](Stream::download_at).
    pub fn download<D: HostMemory>(&self, src: &DeviceBuffer, dst: D) -> Result<Pending<D>> {
        self.download_at(src, 0, dst)
    }

    /// Copies `dst.len()` bytes of `src` from `offset` into `dst`, which is moved into the
    /// returned [`Pending`] and reachable only once the copy has completed.
    ///
    /// Into page-locked or registered memory the copy is asynchronous and the call returns at
    /// once. Into pageable memory on CUDA the driver copies through a bounce buffer and
    /// `cuMemcpyDtoHAsync` returns only when the copy is done (it blocks the calling thread
    /// until the stream's earlier work and the copy have run); prefer page-locked destinations.
    pub fn download_at<D: HostMemory>(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: D,
    ) -> Result<Pending<D>> {
        self.check_device("download", "the source buffer", src.device().id())?;
        let mut dst = Box::new(dst);
        let len = dst.as_bytes().len();
        bounds("download", len, offset, src.len())?;
        src.before_read(self)?;
        let out = HostPtrMut {
            ptr: dst.as_bytes_mut().as_mut_ptr(),
            len,
        };
        match (self.backend(), &src.mem) {
            (StreamBackend::Cpu(s), DeviceMem::Cpu(m)) => {
                // SAFETY: `dst` is boxed and owned by the returned Pending, which gives no
                // access to it before an event recorded after this copy completes and defers
                // its drop until then.
                unsafe { cpu::enqueue_dtoh(s, m, offset, out) }?
            }
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, DeviceMem::Cuda(m)) => {
                dev.bind()?;
                // SAFETY: the source range fits `m` in this stream's context; `dst` is boxed
                // and owned by the returned Pending until the copy's event completes.
                unsafe { crate::backend::cuda::dtoh(stream, out.ptr, m.ptr + offset as u64, len) }.map_err(|e| {
                    crate::backend::cuda::err(
                        "cuMemcpyDtoHAsync",
                        e,
                        dev.ordinal,
                        format!(
                            "copying {len} bytes from offset {offset} into {} memory on stream {}",
                            dst.kind(),
                            self.id()
                        ),
                    )
                })?;
            }
            #[cfg(feature = "cuda")]
            _ => return Err(self.mismatch("download", "the source buffer", src.device().id())),
        }
        let ev = self.record()?;
        src.after_read(&ev);
        dst.record_fence(ev.to_fence());
        Ok(Pending::new(dst, ev))
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`, on the device.
    pub fn copy(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_device("copy", "the source buffer", src.device().id())?;
        self.check_device("copy", "the destination buffer", dst.device().id())?;
        bounds("copy (source)", len, src_offset, src.len())?;
        bounds("copy (destination)", len, dst_offset, dst.len())?;
        src.before_read(self)?;
        dst.before_write(self)?;
        match (self.backend(), &src.mem, &dst.mem) {
            (StreamBackend::Cpu(s), DeviceMem::Cpu(a), DeviceMem::Cpu(b)) => {
                cpu::enqueue_dtod(s, a, src_offset, b, dst_offset, len)?
            }
            #[cfg(feature = "cuda")]
            (StreamBackend::Cuda { dev, stream }, DeviceMem::Cuda(a), DeviceMem::Cuda(b)) => {
                dev.bind()?;
                // SAFETY: both ranges were checked against their allocations in this context.
                unsafe {
                    crate::backend::cuda::dtod(
                        stream,
                        b.ptr + dst_offset as u64,
                        a.ptr + src_offset as u64,
                        len,
                    )
                }
                .map_err(|e| {
                    crate::backend::cuda::err(
                        "cuMemcpyDtoDAsync",
                        e,
                        dev.ordinal,
                        format!("copying {len} bytes"),
                    )
                })?;
            }
            #[cfg(feature = "cuda")]
            _ => return Err(self.mismatch("copy", "a buffer", dst.device().id())),
        }
        let ev = self.record()?;
        src.after_read(&ev);
        dst.after_write(&ev);
        Ok(())
    }

    /// Allocates a device buffer holding a copy of `data` (typed through `bytemuck`); `data` is
    /// consumed when this returns.
    pub fn to_device<T: bytemuck::NoUninit>(&self, data: &[T]) -> Result<DeviceBuffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut buf = self.alloc(bytes.len())?;
        self.upload_slice(bytes, &mut buf, 0, UploadMode::Auto)?;
        Ok(buf)
    }

    /// Copies the whole buffer back as a `Vec<T>`, blocking until the copy is done.
    pub fn read_to_vec<T: bytemuck::Pod>(&self, src: &DeviceBuffer) -> Result<Vec<T>> {
        let n = src.len_of::<T>()?;
        let kind = if self.device().is_cpu() {
            MemoryKind::Pageable
        } else {
            pinned_or_pageable()
        };
        let host = HostBuffer::alloc(kind, src.len())?;
        let host = self.download(src, host)?.wait()?;
        let mut out = vec![T::zeroed(); n];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(host.as_bytes());
        Ok(out)
    }
}

fn pinned_or_pageable() -> MemoryKind {
    if longshore_host::driver_available() {
        MemoryKind::PageLocked
    } else {
        MemoryKind::Pageable
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device().id())
            .field("id", &self.id())
            .finish()
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Stream {}
