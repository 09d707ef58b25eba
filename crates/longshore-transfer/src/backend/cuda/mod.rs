//! The CUDA backend: cudarc streams and events, stream-ordered device memory, raw
//! `cuMemcpy*Async` copies and host functions ([`CuStream`]), events and the watcher that
//! drives futures ([`event`]), and the staging lanes ([`staging`]).
//!
//! Everything here is reached only after `longshore_host::driver_status()` succeeded, so
//! cudarc's dynamic loader never panics on a host without a driver. This module and its
//! children are the only place of the crate that names a cudarc type.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::{HostPtr, HostPtrMut};
use crate::error::{Result, TransferError};
use crate::id::DeviceId;

mod event;
pub(crate) mod libs;
pub(crate) mod nvrtc;
pub(crate) mod staging;

pub(crate) use event::{CuEvent, on_complete};

pub(crate) fn err(
    call: &'static str,
    e: DriverError,
    ordinal: usize,
    what: impl Into<String>,
) -> TransferError {
    TransferError::Cuda {
        call,
        code: format!("{:?}", e.0),
        device: DeviceId::Cuda(ordinal),
        what: what.into(),
    }
}

/// One opened GPU: its primary context and whether it has stream-ordered allocation.
#[derive(Debug)]
pub(crate) struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) ordinal: usize,
    pub(crate) async_alloc: bool,
    /// Events no longer referenced, kept for the next record (see [`event::EventCache`]).
    pub(crate) events: Arc<event::EventCache>,
}

/// Opens (once per process) the primary context of GPU `ordinal`.
pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
    if let Err(e) = longshore_host::driver_status() {
        let reason = match e {
            longshore_host::HostError::CudaUnavailable { reason } => reason,
            other => other.to_string(),
        };
        return Err(TransferError::CudaUnavailable { ordinal, reason });
    }
    static DEVICES: OnceLock<Mutex<Vec<Arc<CudaDevice>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    let mut guard = devices.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = guard.iter().find(|d| d.ordinal == ordinal) {
        return Ok(d.clone());
    }
    let count = result::device::get_count()
        .map_err(|e| err("cuDeviceGetCount", e, ordinal, "counting devices"))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(TransferError::NoSuchDevice { ordinal, count });
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| {
        err(
            "cuDevicePrimaryCtxRetain",
            e,
            ordinal,
            format!("opening device {ordinal}"),
        )
    })?;
    // We order all work with our own events; cudarc's per-slice event tracking is not used.
    // SAFETY: this crate never uses cudarc's CudaSlice, the only user of event tracking.
    unsafe { ctx.disable_event_tracking() };
    let async_alloc = ctx.has_async_alloc();
    if async_alloc {
        keep_pool_memory(&ctx, ordinal);
    }
    let dev = Arc::new(CudaDevice {
        ctx,
        ordinal,
        async_alloc,
        events: Arc::default(),
    });
    guard.push(dev.clone());
    Ok(dev)
}

/// Makes the device's default memory pool keep freed memory cached instead of returning it to
/// the OS at every synchronisation (release threshold 0, the default), so that one device batch
/// per step costs no `cuMemAllocAsync` round trip to the OS: the device-side twin of the pinned
/// pool. Failure only costs speed, so it is logged.
fn keep_pool_memory(ctx: &CudaContext, ordinal: usize) {
    // SAFETY: `cu_device` is a device returned by the driver for this context.
    let pool = match unsafe { result::device::get_default_mem_pool(ctx.cu_device()) } {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(target: "longshore::transfer", device = ordinal, error = ?e.0, "cannot get the default memory pool");
            return;
        }
    };
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the pool is valid and this attribute takes a pointer to a cuuint64_t.
    let rc = unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    if let Err(e) = rc {
        tracing::warn!(target: "longshore::transfer", device = ordinal, error = ?e.0, "cannot set the memory pool release threshold");
    }
}

/// GPUs the driver reports (0 without a driver).
pub(crate) fn count() -> usize {
    if longshore_host::driver_status().is_err() {
        return 0;
    }
    result::device::get_count()
        .ok()
        .and_then(|c| usize::try_from(c).ok())
        .unwrap_or(0)
}

impl CudaDevice {
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| err("cuCtxSetCurrent", e, self.ordinal, "binding the context"))
    }

    fn new_stream(&self, priority: crate::StreamPriority) -> Result<Arc<CudaStream>> {
        match priority {
            crate::StreamPriority::High => {
                self.bind()?;
                // (least, greatest); numerically smaller is higher, (0, 0) without priorities.
                let (_, greatest) = result::stream::get_priority_range().map_err(|e| {
                    err(
                        "cuCtxGetStreamPriorityRange",
                        e,
                        self.ordinal,
                        "reading the stream priorities",
                    )
                })?;
                self.ctx.new_stream_with_priority(greatest).map_err(|e| {
                    err(
                        "cuStreamCreateWithPriority",
                        e,
                        self.ordinal,
                        format!("creating a stream of priority {greatest}"),
                    )
                })
            }
            _ => self
                .ctx
                .new_stream()
                .map_err(|e| err("cuStreamCreate", e, self.ordinal, "creating a stream")),
        }
    }

    pub(crate) fn name(&self) -> Option<String> {
        self.ctx.name().ok()
    }
}

/// A stream of this crate on a GPU: a cudarc stream (owned, or borrowed from another library
/// by [`CuStream::wrap`]) with its device and id, for error messages.
#[derive(Debug)]
pub(crate) struct CuStream {
    dev: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    id: u64,
}

impl CuStream {
    pub(crate) fn new(
        dev: &Arc<CudaDevice>,
        id: u64,
        priority: crate::StreamPriority,
    ) -> Result<Self> {
        Ok(Self {
            dev: dev.clone(),
            stream: dev.new_stream(priority)?,
            id,
        })
    }

    /// Wraps a native stream without owning it.
    ///
    /// # Safety
    /// `raw` is a live `CUstream` of this device's primary context (or null, the legacy
    /// default stream), kept alive by its owner while the wrapper, and memory allocated on it,
    /// is in use.
    pub(crate) unsafe fn wrap(dev: &Arc<CudaDevice>, raw: *mut c_void, id: u64) -> Self {
        // SAFETY: forwarded from the caller.
        let stream = unsafe { dev.ctx.wrap_borrowed_stream(raw.cast()) };
        Self {
            dev: dev.clone(),
            stream,
            id,
        }
    }

    pub(crate) fn device_id(&self) -> DeviceId {
        DeviceId::Cuda(self.dev.ordinal)
    }

    pub(crate) fn raw(&self) -> *mut c_void {
        self.stream.cu_stream().cast()
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.dev.bind()
    }

    fn err(&self, call: &'static str, e: DriverError, what: String) -> TransferError {
        err(call, e, self.dev.ordinal, what)
    }

    pub(crate) fn record(&self) -> Result<CuEvent> {
        CuEvent::record(&self.dev, &self.stream, self.id)
    }

    pub(crate) fn wait(&self, event: &CuEvent) -> Result<()> {
        self.stream.wait(event.raw()).map_err(|e| {
            self.err(
                "cuStreamWaitEvent",
                e,
                format!("making stream {} wait on an event", self.id),
            )
        })
    }

    pub(crate) fn host_fn(&self, f: HostFn) -> Result<()> {
        launch_host_fn(&self.dev, &self.stream, f)
    }

    pub(crate) fn alloc(&self, len: usize) -> Result<CuMem> {
        CuMem::alloc(&self.dev, &self.stream, len, self.id)
    }

    pub(crate) fn memset(&self, m: &CuMem, byte: u8, len: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: `m` is a live allocation of at least `len` bytes in this stream's context
        // (the public types check devices and lengths).
        unsafe { result::memset_d8_async(m.ptr, byte, len, self.stream.cu_stream()) }.map_err(|e| {
            self.err(
                "cuMemsetD8Async",
                e,
                format!("filling {len} bytes on stream {}", self.id),
            )
        })
    }

    /// # Safety
    /// `src` stays valid and unwritten until the copy completes; the range fits `m`.
    pub(crate) unsafe fn htod(&self, m: &CuMem, offset: usize, src: HostPtr) -> Result<()> {
        self.bind()?;
        // SAFETY: the destination range is inside `m` in this stream's context, and the source
        // stays valid until the copy completes (both from the caller).
        unsafe { htod(&self.stream, m.ptr + offset as u64, src.ptr, src.len) }.map_err(|e| {
            self.err(
                "cuMemcpyHtoDAsync",
                e,
                format!(
                    "copying {} bytes to offset {offset} on stream {}",
                    src.len, self.id
                ),
            )
        })
    }

    /// Pageable `src`, consumed when this returns. The range fits `m`.
    pub(crate) fn htod_pageable(&self, m: &CuMem, offset: usize, src: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: the range fits `m` (checked by the callers); `src` is borrowed for the whole
        // call, and the driver consumes pageable memory before returning. If the slice is
        // page-locked, we wait below until the copy is done.
        unsafe { htod(&self.stream, m.ptr + offset as u64, src.as_ptr(), src.len()) }.map_err(
            |e| {
                self.err(
                    "cuMemcpyHtoDAsync",
                    e,
                    format!(
                        "copying {} pageable bytes to offset {offset} on stream {}",
                        src.len(),
                        self.id
                    ),
                )
            },
        )?;
        if !matches!(
            longshore_host::is_driver_host_memory(src.as_ptr()),
            Ok(false)
        ) {
            self.record()?.synchronize()?;
        }
        Ok(())
    }

    /// # Safety
    /// `dst` stays valid and untouched by anyone else until the copy completes; the range
    /// fits `m`.
    pub(crate) unsafe fn dtoh(&self, m: &CuMem, offset: usize, dst: HostPtrMut) -> Result<()> {
        self.bind()?;
        // SAFETY: the source range fits `m` in this stream's context; `dst` is kept for the
        // copy (both from the caller).
        unsafe { dtoh(&self.stream, dst.ptr, m.ptr + offset as u64, dst.len) }.map_err(|e| {
            self.err(
                "cuMemcpyDtoHAsync",
                e,
                format!(
                    "copying {} bytes from offset {offset} on stream {}",
                    dst.len, self.id
                ),
            )
        })
    }

    pub(crate) fn dtod(
        &self,
        src: (&CuMem, usize),
        dst: (&CuMem, usize),
        len: usize,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges were checked against their allocations, in this context.
        unsafe {
            result::memcpy_dtod_async(
                dst.0.ptr + dst.1 as u64,
                src.0.ptr + src.1 as u64,
                len,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| self.err("cuMemcpyDtoDAsync", e, format!("copying {len} bytes")))
    }
}

/// Device memory from `cuMemAllocAsync` (or `cuMemAlloc` where memory pools are missing).
#[derive(Debug)]
pub(crate) struct CuMem {
    ptr: sys::CUdeviceptr,
    len: usize,
    dev: Arc<CudaDevice>,
    /// The stream the memory was allocated on and is freed on.
    stream: Arc<CudaStream>,
    freed: bool,
}

impl CuMem {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    fn alloc(
        dev: &Arc<CudaDevice>,
        stream: &Arc<CudaStream>,
        len: usize,
        stream_id: u64,
    ) -> Result<Self> {
        dev.bind()?;
        let ptr = if dev.async_alloc {
            // SAFETY: the context is bound and `stream` is a live stream of it; the memory is
            // uninitialised bytes, which is fine for a byte buffer only reached through copies.
            unsafe { result::malloc_async(stream.cu_stream(), len) }.map_err(|e| {
                err(
                    "cuMemAllocAsync",
                    e,
                    dev.ordinal,
                    format!("allocating {len} bytes on stream {stream_id}"),
                )
            })?
        } else {
            // SAFETY: the context is bound; the memory is only reached through copies.
            unsafe { result::malloc_sync(len) }.map_err(|e| {
                err(
                    "cuMemAlloc",
                    e,
                    dev.ordinal,
                    format!("allocating {len} bytes"),
                )
            })?
        };
        Ok(Self {
            ptr,
            len,
            dev: dev.clone(),
            stream: stream.clone(),
            freed: false,
        })
    }

    /// Frees the memory once every event in `last_uses` has completed: stream-ordered (no host
    /// blocking) with memory pools, after waiting on the host otherwise. Never panics.
    pub(crate) fn free_after<'a>(&mut self, last_uses: impl Iterator<Item = &'a CuEvent>) {
        let last_uses: Vec<&CuEvent> = last_uses.collect();
        if std::mem::replace(&mut self.freed, true) {
            return;
        }
        if let Err(e) = self.dev.ctx.bind_to_thread() {
            tracing::error!(target: "longshore::transfer", device = self.dev.ordinal, error = ?e.0, bytes = self.len, "cannot bind the context to free device memory; leaking it");
            return;
        }
        if self.dev.async_alloc {
            for ev in last_uses {
                if let Err(e) = self.stream.wait(ev.raw()) {
                    tracing::error!(target: "longshore::transfer", device = self.dev.ordinal, error = ?e.0, "cuStreamWaitEvent failed before a free; waiting on the host");
                    let _ = ev.raw().synchronize();
                }
            }
            // SAFETY: allocated by cuMemAllocAsync, freed once; the free is ordered after every
            // recorded use by the waits above.
            if let Err(e) = unsafe { result::free_async(self.ptr, self.stream.cu_stream()) } {
                tracing::error!(target: "longshore::transfer", device = self.dev.ordinal, error = ?e.0, bytes = self.len, "cuMemFreeAsync failed");
            }
        } else {
            for ev in last_uses {
                let _ = ev.raw().synchronize();
            }
            // SAFETY: allocated by cuMemAlloc, freed once, every use has completed.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::error!(target: "longshore::transfer", device = self.dev.ordinal, error = ?e.0, bytes = self.len, "cuMemFree failed");
            }
        }
    }
}

/// `cuMemcpyHtoDAsync` of `len` bytes from `src` to `dst`.
///
/// # Safety
/// `dst..dst+len` is device memory of the stream's context; `src..src+len` stays valid and
/// unwritten until the copy completes (for page-locked memory) or until this returns (for
/// pageable memory, which the driver consumes before returning).
unsafe fn htod(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: *const u8,
    len: usize,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.cu_stream()) }.result()
}

/// `cuMemcpyDtoHAsync` of `len` bytes from `src` to `dst`.
///
/// # Safety
/// `src..src+len` is device memory of the stream's context; `dst..dst+len` stays valid and is
/// not accessed by anyone else until the copy completes.
unsafe fn dtoh(
    stream: &CudaStream,
    dst: *mut u8,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.cu_stream()) }.result()
}

type HostFn = super::Job;

unsafe extern "C" fn host_fn_trampoline(arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<HostFn>` leaked by `launch_host_fn`, reclaimed exactly once here.
    let f: Box<HostFn> = unsafe { Box::from_raw(arg.cast::<HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(target: "longshore::transfer", "a host function on a CUDA stream panicked");
    }
}

/// `cuLaunchHostFunc`: runs `f` on a driver thread once the work before it has run.
fn launch_host_fn(dev: &CudaDevice, stream: &CudaStream, f: HostFn) -> Result<()> {
    dev.bind()?;
    let arg = Box::into_raw(Box::new(f));
    // SAFETY: the trampoline matches the driver's callback signature and reclaims `arg` once;
    // `f` is 'static + Send, so running it later on a driver thread is sound.
    let rc = unsafe {
        result::stream::launch_host_function(stream.cu_stream(), host_fn_trampoline, arg.cast())
    };
    if let Err(e) = rc {
        // SAFETY: the launch failed, so the driver never saw `arg`: reclaim it here.
        drop(unsafe { Box::from_raw(arg) });
        return Err(err(
            "cuLaunchHostFunc",
            e,
            dev.ordinal,
            "launching a host function",
        ));
    }
    Ok(())
}

/// The PCI address of the device (`cuDeviceGetPCIBusId`), as the driver writes it
/// (`0000:3B:00.0`).
pub(crate) fn pci_bus_id(dev: &CudaDevice) -> Result<String> {
    // The driver writes at most 13 characters and a NUL; room to spare.
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: `buf` is writable for its length, which is passed; the device handle came from
    // the driver for this context; the driver writes a NUL-terminated string within `len`.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev.ctx.cu_device()) }
        .result()
        .map_err(|e| {
            err(
                "cuDeviceGetPCIBusId",
                e,
                dev.ordinal,
                "reading the PCI bus id",
            )
        })?;
    // SAFETY: the call succeeded, so `buf` holds a NUL-terminated string (and the last byte
    // is still 0, which bounds the read either way).
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}
