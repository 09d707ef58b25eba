//! [`Device`]: the host (`Cpu`) or one GPU (`Cuda(ordinal)`), over its backend.
//!
//! This module knows neither streams nor stagers: `Device::new_stream` is defined with
//! [`Stream`](crate::Stream) (in `stream.rs`) and `Device::stager` with the
//! [`Stager`](crate::Stager) (in `staging.rs`), which keeps the device's default stager in the
//! device's [`local`](Device::local) state.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::backend::DeviceImpl;
use crate::error::Result;
use crate::id::DeviceId;

pub(crate) struct DeviceShared {
    /// State that this crate's higher layers and crates above keep per device
    /// ([`Device::local`]). Declared first so it is dropped before the backend.
    locals: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
    id: DeviceId,
    pub(crate) backend: DeviceImpl,
}

/// A device that streams run on and buffers live on: the host's `Cpu` backend or a CUDA GPU.
///
/// Cheap to clone (an `Arc`). Two handles to the same device compare equal.
///
/// ```
/// use longshore_transfer::{Device, DeviceId};
///
/// let cpu = Device::cpu();
/// assert_eq!(cpu.id(), DeviceId::Cpu);
/// match Device::cuda(0) {
///     Ok(gpu) => assert_eq!(gpu.id(), DeviceId::Cuda(0)),
///     Err(e) => println!("no GPU here: {e}"), // e.g. "cannot open cuda:0: CUDA is not available: ..."
/// }
/// ```
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
}

impl Device {
    fn with_backend(id: DeviceId, backend: DeviceImpl) -> Arc<DeviceShared> {
        Arc::new(DeviceShared {
            locals: Mutex::new(Vec::new()),
            id,
            backend,
        })
    }

    /// The host device (`Cpu` backend): streams are worker threads, memory is host memory.
    pub fn cpu() -> Device {
        static CPU: OnceLock<Device> = OnceLock::new();
        CPU.get_or_init(|| Device {
            shared: Device::with_backend(DeviceId::Cpu, DeviceImpl::Cpu),
        })
        .clone()
    }

    /// GPU `ordinal`, through the CUDA driver.
    ///
    /// Fails with [`TransferError::CudaUnavailable`](crate::TransferError::CudaUnavailable)
    /// (naming the cause) when no driver can be loaded or the crate was built without the
    /// `cuda` feature, and with [`TransferError::NoSuchDevice`](crate::TransferError::NoSuchDevice)
    /// when the driver has no such GPU. Never panics.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        // Weak: while any handle lives, every caller gets the same device (and its default
        // stager); once the last handle is dropped, the stager's page-locked chunks and
        // threads are released. The CUDA context itself stays open for the process.
        type Open = Mutex<Vec<(usize, Weak<DeviceShared>)>>;
        static OPEN: OnceLock<Open> = OnceLock::new();
        let open = OPEN.get_or_init(Default::default);
        let mut guard = open.lock().unwrap_or_else(|p| p.into_inner());
        guard.retain(|(_, w)| w.strong_count() > 0);
        if let Some(shared) = guard
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(Device { shared });
        }
        let shared = Device::with_backend(DeviceId::Cuda(ordinal), DeviceImpl::open_cuda(ordinal)?);
        guard.push((ordinal, Arc::downgrade(&shared)));
        Ok(Device { shared })
    }

    /// Number of CUDA GPUs the driver reports (0 without a driver or the `cuda` feature).
    pub fn cuda_count() -> usize {
        DeviceImpl::cuda_count()
    }

    /// Which device this is.
    pub fn id(&self) -> DeviceId {
        self.shared.id
    }

    /// Whether this is the host (`Cpu`) device.
    pub fn is_cpu(&self) -> bool {
        self.id() == DeviceId::Cpu
    }

    /// A human-readable name (`cpu`, or `cuda:0 (NVIDIA H200)`).
    pub fn name(&self) -> String {
        match self.shared.backend.name() {
            Some(n) => format!("{} ({n})", self.id()),
            None => self.id().to_string(),
        }
    }

    /// State of type `T` kept with this device for higher layers and crates above (a library
    /// handle per device such as a decoder's, a cache, the default [`Stager`](crate::Stager)):
    /// made by `init` on first use, shared by every handle of the device, dropped with the
    /// device (a GPU's device is dropped with its last handle; the `Cpu` device lives for the
    /// process).
    ///
    /// `init` runs without a lock held; if two threads race, one value wins and both get it.
    ///
    /// ```
    /// # use longshore_transfer::Device;
    /// struct Counter(std::sync::atomic::AtomicU32);
    /// let a = Device::cpu().local(|| Ok(Counter(0.into())))?;
    /// let b = Device::cpu().local(|| Ok(Counter(5.into())))?;
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// # Ok::<(), longshore_transfer::TransferError>(())
    /// ```
    pub fn local<T: Send + Sync + 'static>(
        &self,
        init: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        local_in(&self.shared.locals, init)
    }

    /// The device's `T` state if it has been made, without making it.
    pub(crate) fn local_if_made<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        find::<T>(&lock(&self.shared.locals))
    }
}

type Locals = Mutex<Vec<Arc<dyn Any + Send + Sync>>>;

fn lock(locals: &Locals) -> std::sync::MutexGuard<'_, Vec<Arc<dyn Any + Send + Sync>>> {
    locals.lock().unwrap_or_else(|p| p.into_inner())
}

fn find<T: Send + Sync + 'static>(v: &[Arc<dyn Any + Send + Sync>]) -> Option<Arc<T>> {
    v.iter().find_map(|a| a.clone().downcast::<T>().ok())
}

/// The `T` slot of a type map (of a device or a stream), made by `init` outside the lock.
pub(crate) fn local_in<T: Send + Sync + 'static>(
    locals: &Locals,
    init: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    if let Some(t) = find::<T>(&lock(locals)) {
        return Ok(t);
    }
    let made = Arc::new(init()?);
    let mut guard = lock(locals);
    if let Some(t) = find::<T>(&guard) {
        return Ok(t);
    }
    guard.push(made.clone());
    Ok(made)
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Device").field(&self.id()).finish()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.id(), f)
    }
}
