//! [`Device`]: the host (`Cpu`) or one GPU (`Cuda(ordinal)`), with a backend per kind.

use std::fmt;
#[cfg(feature = "cuda")]
use std::sync::Weak;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Result, TransferError};
use crate::staging::{Stager, StagingConfig};
use crate::stream::Stream;

/// Which device something lives on: cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceId {
    /// The host, through the `Cpu` backend.
    Cpu,
    /// A CUDA GPU, by ordinal.
    Cuda(usize),
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Cpu => f.write_str("cpu"),
            DeviceId::Cuda(o) => write!(f, "cuda:{o}"),
        }
    }
}

pub(crate) struct DeviceShared {
    pub(crate) id: DeviceId,
    #[cfg(feature = "cuda")]
    pub(crate) cuda: Option<Arc<crate::backend::cuda::CudaDevice>>,
    stager: Mutex<Option<Arc<Stager>>>,
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
    /// The host device (`Cpu` backend): streams are worker threads, memory is host memory.
    pub fn cpu() -> Device {
        static CPU: OnceLock<Device> = OnceLock::new();
        CPU.get_or_init(|| Device {
            shared: Arc::new(DeviceShared {
                id: DeviceId::Cpu,
                #[cfg(feature = "cuda")]
                cuda: None,
                stager: Mutex::new(None),
            }),
        })
        .clone()
    }

    /// GPU `ordinal`, through the CUDA driver.
    ///
    /// Fails with [`TransferError::CudaUnavailable`] (naming the cause) when no driver can be
    /// loaded or the crate was built without the `cuda` feature, and with
    /// [`TransferError::NoSuchDevice`] when the driver has no such GPU. Never panics.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        #[cfg(feature = "cuda")]
        {
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
            let dev = crate::backend::cuda::open(ordinal)?;
            let shared = Arc::new(DeviceShared {
                id: DeviceId::Cuda(ordinal),
                cuda: Some(dev),
                stager: Mutex::new(None),
            });
            guard.push((ordinal, Arc::downgrade(&shared)));
            Ok(Device { shared })
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(TransferError::CudaUnavailable {
                ordinal,
                reason: "longshore-transfer was built without the `cuda` feature".to_owned(),
            })
        }
    }

    /// Number of CUDA GPUs the driver reports (0 without a driver or the `cuda` feature).
    pub fn cuda_count() -> usize {
        #[cfg(feature = "cuda")]
        {
            if longshore_host::driver_status().is_err() {
                return 0;
            }
            cudarc::driver::result::device::get_count()
                .ok()
                .and_then(|c| usize::try_from(c).ok())
                .unwrap_or(0)
        }
        #[cfg(not(feature = "cuda"))]
        {
            0
        }
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
        #[cfg(feature = "cuda")]
        if let Some(dev) = &self.shared.cuda {
            return match dev.name() {
                Some(n) => format!("{} ({n})", self.id()),
                None => self.id().to_string(),
            };
        }
        self.id().to_string()
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// The device's default [`Stager`] for pageable uploads (created on first use with
    /// [`StagingConfig::default`]).
    pub fn stager(&self) -> Result<Arc<Stager>> {
        let mut guard = self.shared.stager.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &*guard {
            return Ok(s.clone());
        }
        let s = Arc::new(Stager::new(self, StagingConfig::default())?);
        *guard = Some(s.clone());
        Ok(s)
    }

    /// The size from which [`UploadMode::Auto`](crate::UploadMode::Auto) stages an upload:
    /// the default stager's `auto_min_bytes`, without making the stager (and reserving its
    /// page-locked chunks) for an upload that will not use it.
    pub(crate) fn auto_stage_min_bytes(&self) -> usize {
        self.shared
            .stager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(StagingConfig::DEFAULT_AUTO_MIN_BYTES, |s| {
                s.config().auto_min_bytes
            })
    }

    /// Replaces the device's default [`Stager`] (e.g. with other chunk sizes or thread counts).
    pub fn set_stager(&self, stager: Arc<Stager>) -> Result<()> {
        if stager.device_id() != self.id() {
            return Err(TransferError::DeviceMismatch {
                op: "set_stager",
                what: "the stager",
                expected: self.id(),
                found: stager.device_id(),
            });
        }
        *self.shared.stager.lock().unwrap_or_else(|p| p.into_inner()) = Some(stager);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_device(&self) -> Option<&Arc<crate::backend::cuda::CudaDevice>> {
        self.shared.cuda.as_ref()
    }
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
