//! [`Stream`]: an ordered queue of work on a device, and the copies enqueued on it.
//!
//! Every operation checks its arguments (devices, bounds), orders itself after the buffers'
//! earlier uses on other streams, dispatches to the backend in one call, and records its event
//! as the buffers' latest use.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use longshore_host::{HostBuffer, HostMemory, MemoryKind};

use crate::backend::{HostPtr, HostPtrMut, StreamImpl};
use crate::buffer::DeviceBuffer;
use crate::device::{Device, local_in};
use crate::error::{Result, TransferError};
use crate::event::Event;
use crate::id::DeviceId;
use crate::pending::Pending;
use crate::staging::{Stager, UploadMode};

struct StreamShared {
    /// State that crates above keep per stream ([`Stream::local`]). Declared first so it is
    /// dropped before the backend's stream (a library handle bound to a stream goes first).
    locals: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
    device: Device,
    id: u64,
    backend: StreamImpl,
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

/// How the GPU schedules a stream's kernels against other streams' of the same context
/// ([`Device::new_stream_with_priority`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamPriority {
    /// The context's default priority (what `cuStreamCreate` gives).
    #[default]
    Normal,
    /// The greatest priority the context allows (`cuCtxGetStreamPriorityRange`): when both
    /// have blocks waiting, the GPU starts this stream's before normal streams' as SMs free
    /// up, so a short kernel (a decode stage's) is not queued behind a long run of another
    /// stream's (a training step's); running blocks are not preempted. Equal to `Normal` where
    /// the device has no priorities and on the `Cpu` device.
    High,
}

impl Device {
    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        self.new_stream_with_priority(StreamPriority::Normal)
    }

    /// A new stream on this device with a scheduling priority.
    pub fn new_stream_with_priority(&self, priority: StreamPriority) -> Result<Stream> {
        let id = next_stream_id();
        let backend = self.shared.backend.new_stream(id, priority)?;
        tracing::debug!(target: "longshore::transfer", stream_id = id, device = %self.id(), ?priority, "stream created");
        Ok(Stream::with_backend(self, id, backend))
    }
}

impl Stream {
    fn with_backend(device: &Device, id: u64, backend: StreamImpl) -> Stream {
        Stream {
            shared: Arc::new(StreamShared {
                locals: Mutex::new(Vec::new()),
                device: device.clone(),
                id,
                backend,
            }),
        }
    }

    /// The backend's native stream handle: the `CUstream` (`cudaStream_t`) on CUDA, to order
    /// work of another library (a kernel, a cuBLAS call, torch's stream through an event)
    /// with this stream's. The handle stays valid while this stream (any clone) lives.
    ///
    /// A `Cpu` stream is a thread of this crate with no native handle: that is a
    /// [`TransferError::Unsupported`]. Order work with a `Cpu` stream through events
    /// ([`record`](Stream::record), [`wait_event`](Stream::wait_event)) and host functions
    /// ([`launch_host_fn`](Stream::launch_host_fn)) instead.
    ///
    /// ```
    /// # use longshore_transfer::{Device, TransferError};
    /// let stream = Device::cpu().new_stream()?;
    /// assert!(matches!(stream.as_raw(), Err(TransferError::Unsupported { .. })));
    /// # Ok::<(), TransferError>(())
    /// ```
    pub fn as_raw(&self) -> Result<*mut c_void> {
        self.backend().as_raw()
    }

    /// A stream of this crate over a native stream that someone else owns, such as
    /// `torch.cuda.current_stream().cuda_stream` or a cudarc stream: copies enqueued on it are
    /// ordered with that owner's work. Dropping the returned stream (every clone) does not
    /// destroy the native stream.
    ///
    /// On the `Cpu` device there is no native stream to adopt: that is a
    /// [`TransferError::Unsupported`] (whatever `raw` is).
    ///
    /// # Safety
    ///
    /// On CUDA, `raw` is a valid `CUstream` of `device`'s primary context (the one the CUDA
    /// runtime and PyTorch use), or null for its legacy default stream, and its owner keeps it
    /// alive while the returned stream, any clone of it, or anything made on it is in use:
    /// [`DeviceBuffer`]s allocated on it are freed on it when dropped.
    pub unsafe fn from_raw(device: &Device, raw: *mut c_void) -> Result<Stream> {
        let id = next_stream_id();
        // SAFETY: forwarded from the caller.
        let backend = unsafe { device.shared.backend.wrap_stream(raw, id) }?;
        tracing::debug!(target: "longshore::transfer", stream_id = id, device = %device.id(), "stream adopted from a native handle");
        Ok(Stream::with_backend(device, id, backend))
    }

    /// State of type `T` kept with this stream for crates above this one (a library handle
    /// bound to the stream, a cache): made by `init` on first use, shared by every clone of
    /// the stream, dropped with the stream (before its native stream is destroyed).
    ///
    /// `init` runs without a lock held; if two threads race, one value wins and both get it.
    ///
    /// ```
    /// # use longshore_transfer::Device;
    /// struct Calls(std::sync::atomic::AtomicU32);
    /// let stream = Device::cpu().new_stream()?;
    /// let a = stream.local(|| Ok(Calls(0.into())))?;
    /// let b = stream.clone().local(|| Ok(Calls(7.into())))?; // the same value: init not run
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// # Ok::<(), longshore_transfer::TransferError>(())
    /// ```
    pub fn local<T: Send + Sync + 'static>(
        &self,
        init: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        local_in(&self.shared.locals, init)
    }

    /// Enqueues work of your own on this stream, ordered and tracked like this crate's copies:
    /// the seam through which crates above (device ops, collectives, decoders) run kernels on
    /// [`DeviceBuffer`]s.
    ///
    /// 1. The stream is made to wait (device-side) for the earlier uses of the buffers on other
    ///    streams: the last write of each buffer in `reads`, and the last write and the reads
    ///    since of each buffer in `writes`.
    /// 2. `enqueue` runs on this thread, with the device's context current (CUDA). It enqueues
    ///    the work on this stream: on CUDA, kernels or library calls on
    ///    [`as_raw`](Stream::as_raw); on `Cpu`, closures through
    ///    [`launch_host_fn`](Stream::launch_host_fn) that run on the stream's executor thread
    ///    and reach the bytes through [`DeviceBuffer::cpu_memory`].
    /// 3. An event is recorded behind the work and becomes the buffers' latest use: later copies
    ///    and work on other streams wait for it, and a buffer dropped meanwhile is freed only
    ///    after it has completed (on `Cpu`, the [`CpuMemory`](crate::CpuMemory) handles a job
    ///    holds keep the bytes alive).
    ///
    /// Returns that event. If `enqueue` fails, its error is returned after the event is still
    /// recorded and tracked (it may have enqueued part of the work).
    ///
    /// ```
    /// # use longshore_transfer::Device;
    /// let stream = Device::cpu().new_stream()?;
    /// let mut buf = stream.to_device(&[1u8, 2, 3, 4])?;
    /// let mem = buf.cpu_memory().expect("a cpu buffer");
    /// stream.enqueue_work(&[], &[&buf], || {
    ///     stream.launch_host_fn(move || mem.lock().iter_mut().for_each(|b| *b *= 10))
    /// })?;
    /// assert_eq!(stream.read_to_vec::<u8>(&buf)?, vec![10, 20, 30, 40]);
    /// # Ok::<(), longshore_transfer::TransferError>(())
    /// ```
    pub fn enqueue_work(
        &self,
        reads: &[&DeviceBuffer],
        writes: &[&DeviceBuffer],
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<Event> {
        for b in reads.iter().chain(writes) {
            self.check_device("enqueue_work", "a buffer", b.device().id())?;
        }
        for b in reads {
            self.before_read(b)?;
        }
        for b in writes {
            self.before_write(b)?;
        }
        self.backend().bind()?;
        let outcome = enqueue();
        let ev = self.record()?;
        for b in reads {
            b.after_read(&ev);
        }
        for b in writes {
            b.after_write(&ev);
        }
        outcome.map(|()| ev)
    }

    /// The device the stream runs on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// A process-unique id of the stream.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    pub(crate) fn backend(&self) -> &StreamImpl {
        &self.shared.backend
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

    /// Makes this stream wait for the uses of `buf` on other streams that a write must follow.
    fn before_write(&self, buf: &DeviceBuffer) -> Result<()> {
        buf.write_deps(self.id())
            .iter()
            .try_for_each(|e| self.wait_event(e))
    }

    /// Makes this stream wait for the last write of `buf` if it happened on another stream.
    fn before_read(&self, buf: &DeviceBuffer) -> Result<()> {
        buf.read_deps(self.id())
            .iter()
            .try_for_each(|e| self.wait_event(e))
    }

    /// Records an event behind all the work enqueued so far.
    pub fn record(&self) -> Result<Event> {
        Ok(Event::new(
            self.backend().record()?,
            self.device().id(),
            self.id(),
        ))
    }

    /// Makes the work enqueued on this stream from now on wait until `event` completes,
    /// without blocking the host (on `Cpu`, the stream's worker thread waits).
    ///
    /// A `Cpu` stream can wait for an event of any device. A CUDA stream can wait for events
    /// of any CUDA device, but not for `Cpu` events: that is a [`TransferError::DeviceMismatch`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.backend().wait(&event.inner)
    }

    /// Blocks the host until all the work enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        self.record()?.synchronize()
    }

    /// Enqueues a host function that runs once the work before it has run; later work waits
    /// for it to return. On CUDA this is `cuLaunchHostFunc`: `f` runs on a driver thread and
    /// must not call the CUDA API (which includes dropping a `DeviceBuffer`).
    pub fn launch_host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.backend().host_fn(Box::new(f))
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
        let (mem, stream_ordered) = self.backend().alloc(len)?;
        let buf = DeviceBuffer::new(mem, len, self.device().clone());
        if stream_ordered {
            buf.after_write(&self.record()?);
        }
        Ok(buf)
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
        self.before_write(buf)?;
        self.backend().memset(&buf.mem, byte, buf.len())?;
        buf.after_write(&self.record()?);
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
        self.before_write(dst)?;
        let mut src = Box::new(src);
        if self.backend().reads_host_later(src.kind()) {
            let ptr = HostPtr {
                ptr: src.as_bytes().as_ptr(),
                len,
            };
            // SAFETY: `src` is boxed (its bytes do not move) and owned by the returned Pending,
            // which gives no access to it until an event recorded after this copy completes and
            // defers its drop until then; `HostMemory` memory stays valid while it is alive.
            unsafe { self.backend().htod(&dst.mem, offset, ptr) }?;
        } else {
            self.upload_pageable_raw(src.as_bytes(), dst, offset, UploadMode::Auto)?;
        }
        let ev = self.record()?;
        dst.after_write(&ev);
        src.record_fence(ev.to_fence());
        tracing::trace!(target: "longshore::transfer", stream_id = self.id(), bytes = len, kind = %src.kind(), "upload enqueued");
        Ok(Pending::new(src, ev))
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
        self.before_write(dst)?;
        self.upload_pageable_raw(src, dst, offset, mode)?;
        let ev = self.record()?;
        dst.after_write(&ev);
        Ok(ev)
    }

    /// The pageable path, without checks or tracking; `src` is consumed when this returns.
    fn upload_pageable_raw(
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
            let stager = self.device().stager()?;
            return stager.upload_raw(self.backend(), self.id(), src, (&dst.mem, offset));
        }
        self.backend().htod_pageable(&dst.mem, offset, src)
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
        self.before_read(src)?;
        let out = HostPtrMut {
            ptr: dst.as_bytes_mut().as_mut_ptr(),
            len,
        };
        // SAFETY: `dst` is boxed and owned by the returned Pending, which gives no access to it
        // before an event recorded after this copy completes and defers its drop until then.
        unsafe { self.backend().dtoh(&src.mem, offset, out) }?;
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
        self.before_read(src)?;
        self.before_write(dst)?;
        self.backend()
            .dtod((&src.mem, src_offset), (&dst.mem, dst_offset), len)?;
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

impl Stager {
    /// Stages `src` into `dst` at `offset` on `stream`; returns the event of the last chunk.
    /// When this returns, `src` has been consumed.
    pub fn upload(
        &self,
        stream: &Stream,
        src: &[u8],
        dst: &mut DeviceBuffer,
        offset: usize,
    ) -> Result<Event> {
        for (what, id) in [
            ("the stream", stream.device().id()),
            ("the destination buffer", dst.device().id()),
        ] {
            if id != self.device_id() {
                return Err(TransferError::DeviceMismatch {
                    op: "staged upload",
                    what,
                    expected: self.device_id(),
                    found: id,
                });
            }
        }
        bounds("staged upload", src.len(), offset, dst.len())?;
        stream.before_write(dst)?;
        self.upload_raw(stream.backend(), stream.id(), src, (&dst.mem, offset))?;
        let ev = stream.record()?;
        dst.after_write(&ev);
        Ok(ev)
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
