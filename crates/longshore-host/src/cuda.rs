//! The CUDA driver, loaded at run time: availability checks and the driver calls this crate
//! needs that cudarc's safe layer lacks (host allocation flags, host registration).

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, DriverError, sys};

use crate::error::HostError;

/// Whether a CUDA driver can be loaded and initialised on this host, and why not.
///
/// Never panics: cudarc's dynamic loader panics when the library is missing, so this checks
/// for the library first and contains any panic from symbol loading.
pub fn driver_status() -> Result<(), HostError> {
    static STATUS: OnceLock<Result<(), String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to dlopen the driver library by name.
            if !unsafe { sys::is_culib_present() } {
                return Err("no CUDA driver library (libcuda.so) could be loaded".to_owned());
            }
            match std::panic::catch_unwind(cudarc::driver::result::init) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("cuInit failed with {}", error_name(&e))),
                Err(_) => Err(
                    "the CUDA driver library lacks a required symbol (driver too old?)".to_owned(),
                ),
            }
        })
        .clone()
        .map_err(|reason| HostError::CudaUnavailable { reason })
}

/// Whether the CUDA driver is usable (see [`driver_status`]).
pub(crate) fn driver_available() -> bool {
    driver_status().is_ok()
}

/// The primary context of device `ordinal`, retained once per process and bound to this thread.
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>, HostError> {
    driver_status()?;
    type Contexts = std::sync::Mutex<Vec<(usize, Arc<CudaContext>)>>;
    static CTXS: OnceLock<Contexts> = OnceLock::new();
    let ctxs = CTXS.get_or_init(Default::default);
    let existing = {
        let guard = ctxs.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, c)| c.clone())
    };
    let ctx = match existing {
        Some(c) => c,
        None => {
            let c = CudaContext::new(ordinal).map_err(|e| {
                driver_err(
                    "cuDevicePrimaryCtxRetain",
                    e,
                    format!("opening device {ordinal}"),
                )
            })?;
            ctxs.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((ordinal, c.clone()));
            c
        }
    };
    ctx.bind_to_thread()
        .map_err(|e| driver_err("cuCtxSetCurrent", e, format!("binding device {ordinal}")))?;
    Ok(ctx)
}

/// The driver's name for an error, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn error_name(e: &DriverError) -> String {
    format!("{:?}", e.0)
}

pub(crate) fn driver_err(call: &'static str, e: DriverError, what: String) -> HostError {
    HostError::Cuda {
        call,
        code: error_name(&e),
        what,
    }
}

/// `cuMemHostAlloc`: `len` bytes of page-locked memory.
///
/// # Safety
/// A context must be current on the calling thread. The returned memory is uninitialised.
pub(crate) unsafe fn mem_host_alloc(len: usize, flags: u32) -> Result<*mut u8, DriverError> {
    // SAFETY: the caller guarantees a current context; `malloc_host` writes the pointer.
    unsafe { cudarc::driver::result::malloc_host(len, flags) }.map(|p| p.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`] and is not used afterwards.
pub(crate) unsafe fn mem_free_host(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { cudarc::driver::result::free_host(ptr.cast()) }
}

/// `cuMemHostRegister`: page-locks and registers `len` bytes at `ptr` with the driver.
///
/// # Safety
/// `ptr..ptr+len` is memory owned by the caller that stays allocated until
/// [`mem_host_unregister`] is called on it; a context is current on this thread.
pub(crate) unsafe fn mem_host_register(
    ptr: *mut u8,
    len: usize,
    flags: u32,
) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) }.result()
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `ptr` was registered by [`mem_host_register`] and no copy from it is in flight.
pub(crate) unsafe fn mem_host_unregister(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::cuMemHostUnregister(ptr.cast()) }.result()
}

/// Whether the driver knows `ptr` as page-locked host memory (from `cuMemHostAlloc` or
/// `cuMemHostRegister`).
///
/// Uses `cuPointerGetAttributes` with `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`, which reports host
/// memory for both allocation paths (`cuMemHostGetFlags` only covers `cuMemHostAlloc`). Unlike
/// `cuPointerGetAttribute`, it answers a pointer the driver does not know (ordinary pageable
/// memory) with success and a zero memory type rather than `CUDA_ERROR_INVALID_VALUE`, so asking
/// about pageable memory is not an API error (compute-sanitizer reports those).
pub fn is_driver_host_memory(ptr: *const u8) -> Result<bool, HostError> {
    driver_status()?;
    let _ctx = context(0)?;
    let mut mem_type: u32 = 0;
    let mut attrs = [sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE];
    let mut data = [(&mut mem_type as *mut u32).cast::<std::ffi::c_void>()];
    // SAFETY: one attribute and one out-pointer, both arrays of length 1 that outlive the
    // call; `data[0]` points at a valid u32, the size the driver writes for the memory type;
    // the driver only reads `ptr` as an address, never dereferences it for us.
    let rc = unsafe {
        sys::cuPointerGetAttributes(
            1,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr as sys::CUdeviceptr,
        )
    };
    match rc {
        sys::CUresult::CUDA_SUCCESS => Ok(mem_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32),
        other => Err(HostError::Cuda {
            call: "cuPointerGetAttributes",
            code: format!("{other:?}"),
            what: format!("querying memory type of {ptr:p}"),
        }),
    }
}
