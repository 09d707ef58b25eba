//! The CUDA backend: cudarc streams and events, stream-ordered device memory, raw
//! `cuMemcpy*Async` copies, host functions, and the event watcher that drives futures.
//!
//! Everything here is reached only after `longshore_host::driver_status()` succeeded, so
//! cudarc's dynamic loader never panics on a host without a driver.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};

use crate::device::DeviceId;
use crate::error::{Result, TransferError};

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

impl CudaDevice {
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| err("cuCtxSetCurrent", e, self.ordinal, "binding the context"))
    }

    pub(crate) fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| err("cuStreamCreate", e, self.ordinal, "creating a stream"))
    }

    /// Wraps a native stream of this device without owning it.
    ///
    /// # Safety
    /// `raw` is a live `CUstream` of this device's primary context (or null, the legacy
    /// default stream), kept alive by its owner while the wrapper is in use.
    pub(crate) unsafe fn wrap_stream(&self, raw: *mut c_void) -> Arc<CudaStream> {
        // SAFETY: forwarded from the caller.
        unsafe { self.ctx.wrap_borrowed_stream(raw.cast()) }
    }

    pub(crate) fn name(&self) -> Option<String> {
        self.ctx.name().ok()
    }
}

/// A recorded CUDA event.
#[derive(Debug)]
pub(crate) struct CuEvent {
    ev: CudaEvent,
    ordinal: usize,
}

impl CuEvent {
    pub(crate) fn record(dev: &CudaDevice, stream: &CudaStream, stream_id: u64) -> Result<Self> {
        let ev = stream.record_event(None).map_err(|e| {
            err(
                "cuEventRecord",
                e,
                dev.ordinal,
                format!("recording an event on stream {stream_id}"),
            )
        })?;
        Ok(Self {
            ev,
            ordinal: dev.ordinal,
        })
    }

    /// A new event, not yet recorded (complete until it is).
    pub(crate) fn create(dev: &CudaDevice) -> Result<Self> {
        let ev = dev
            .ctx
            .new_event(None)
            .map_err(|e| err("cuEventCreate", e, dev.ordinal, "creating an event"))?;
        Ok(Self {
            ev,
            ordinal: dev.ordinal,
        })
    }

    /// Records the event again, at the current end of `stream`: from now on it completes with
    /// that work. Whoever holds it as a fence must not need its earlier position any more.
    pub(crate) fn rerecord(&self, stream: &CudaStream, stream_id: u64) -> Result<()> {
        self.ev.record(stream).map_err(|e| {
            err(
                "cuEventRecord",
                e,
                self.ordinal,
                format!("recording an event on stream {stream_id}"),
            )
        })
    }

    pub(crate) fn raw(&self) -> &CudaEvent {
        &self.ev
    }

    /// Non-blocking query. A failed query (a broken context) counts as complete: no device
    /// access can happen any more, and reporting incomplete forever would hang every waiter.
    pub(crate) fn is_complete(&self) -> bool {
        match self.ev.try_is_complete() {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(target: "longshore::transfer", device = self.ordinal, error = ?e.0, "cuEventQuery failed; treating the event as complete");
                true
            }
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ev.synchronize().map_err(|e| {
            err(
                "cuEventSynchronize",
                e,
                self.ordinal,
                "waiting for an event",
            )
        })
    }
}

/// Device memory from `cuMemAllocAsync` (or `cuMemAlloc` where memory pools are missing).
#[derive(Debug)]
pub(crate) struct CuMem {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: usize,
    pub(crate) dev: Arc<CudaDevice>,
    /// The stream the memory was allocated on and is freed on.
    pub(crate) stream: Arc<CudaStream>,
    freed: bool,
}

impl CuMem {
    pub(crate) fn alloc(
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
    pub(crate) fn free_after(&mut self, last_uses: &[&CuEvent]) {
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
pub(crate) unsafe fn htod(
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
pub(crate) unsafe fn dtoh(
    stream: &CudaStream,
    dst: *mut u8,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.cu_stream()) }.result()
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst..dst+len` is device memory of the stream's context.
pub(crate) unsafe fn memset(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    byte: u8,
    len: usize,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { result::memset_d8_async(dst, byte, len, stream.cu_stream()) }
}

/// `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Both ranges are device memory of the stream's context.
pub(crate) unsafe fn dtod(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { result::memcpy_dtod_async(dst, src, len, stream.cu_stream()) }
}

type HostFn = Box<dyn FnOnce() + Send + 'static>;

unsafe extern "C" fn host_fn_trampoline(arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<HostFn>` leaked by `launch_host_fn`, reclaimed exactly once here.
    let f: Box<HostFn> = unsafe { Box::from_raw(arg.cast::<HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(target: "longshore::transfer", "a host function on a CUDA stream panicked");
    }
}

/// `cuLaunchHostFunc`: runs `f` on a driver thread once the work before it has run.
pub(crate) fn launch_host_fn(dev: &CudaDevice, stream: &CudaStream, f: HostFn) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// The event watcher.

struct Watch {
    event: Arc<CuEvent>,
    callback: HostFn,
}

fn watcher() -> Option<&'static Sender<Watch>> {
    static TX: OnceLock<Option<Sender<Watch>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = unbounded::<Watch>();
        match std::thread::Builder::new().name("longshore-cuda-events".into()).spawn(move || watch_loop(rx)) {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(target: "longshore::transfer", error = %e, "cannot spawn the CUDA event watcher");
                None
            }
        }
    })
    .as_ref()
}

fn watch_loop(rx: Receiver<Watch>) {
    let mut list: Vec<Watch> = Vec::new();
    let mut idle_rounds = 0u32;
    loop {
        if list.is_empty() {
            // Nothing awaited: block, costing nothing.
            match rx.recv() {
                Ok(w) => list.push(w),
                Err(_) => return,
            }
        }
        list.extend(rx.try_iter());
        let mut i = 0;
        let mut fired = false;
        while i < list.len() {
            if list[i].event.is_complete() {
                let w = list.swap_remove(i);
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(w.callback)).is_err() {
                    tracing::error!(target: "longshore::transfer", "an event completion callback panicked");
                }
                fired = true;
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            continue;
        }
        idle_rounds = if fired {
            0
        } else {
            idle_rounds.saturating_add(1)
        };
        // Back off from 5 us to 100 us between queries while nothing completes; a new
        // registration wakes the loop at once.
        let nap = Duration::from_micros((5u64 << idle_rounds.min(5)).min(100));
        match rx.recv_timeout(nap) {
            Ok(w) => list.push(w),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs `callback` on the watcher thread once `event` completes.
pub(crate) fn on_complete(event: &Arc<CuEvent>, callback: HostFn) {
    if event.is_complete() {
        callback();
        return;
    }
    match watcher() {
        Some(tx) => {
            if let Err(e) = tx.send(Watch {
                event: event.clone(),
                callback,
            }) {
                // The watcher is gone: fall back to waiting here.
                let w = e.into_inner();
                let _ = w.event.synchronize();
                (w.callback)();
            }
        }
        None => {
            let _ = event.synchronize();
            callback();
        }
    }
}
