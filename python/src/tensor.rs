//! `longshore.Tensor`: one exported batch tensor with the Python DLPack protocol
//! (`__dlpack__`, `__dlpack_device__`), consumed by `torch.from_dlpack` / `np.from_dlpack`.

use std::ffi::CStr;
use std::sync::Mutex;

use longshore::dlpack::ffi::{DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use longshore::dlpack::{DlpackTensor, wants_versioned};
use longshore::transfer::Device;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{dlpack_err, transfer_err};

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";

/// The capsule destructor of a versioned export: runs the deleter unless a consumer took the
/// tensor (and renamed the capsule `used_dltensor_versioned`).
unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; `PyCapsule_IsValid` sets no exception, and a
    // valid capsule of this name holds the pointer `capsule_of` stored, whose deleter has not
    // run (the consumer renames the capsule when it takes ownership).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
                d(p);
            }
        }
    }
}

/// The capsule destructor of a legacy export; see [`destroy_versioned`].
unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_versioned`, for the legacy struct and name.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
                d(p);
            }
        }
    }
}

/// Wraps an export in a DLPack capsule, versioned or legacy.
pub(crate) fn capsule_of<'py>(
    py: Python<'py>,
    tensor: DlpackTensor,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if versioned {
        let raw = tensor.into_raw();
        // SAFETY: `raw` is a live export; the capsule owns it until a consumer renames it, and
        // the destructor runs its deleter otherwise.
        let cap =
            unsafe { ffi::PyCapsule_New(raw.cast(), VERSIONED.as_ptr(), Some(destroy_versioned)) };
        if cap.is_null() {
            // SAFETY: the capsule was not created, so `raw` is still ours: take it back (drop
            // runs the deleter).
            drop(unsafe { DlpackTensor::from_raw(raw) });
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `cap` is a new reference.
        Ok(unsafe { Bound::from_owned_ptr(py, cap) })
    } else {
        let raw = tensor.into_raw_legacy().map_err(|(e, _)| dlpack_err(e))?;
        // SAFETY: as above, for the legacy struct.
        let cap = unsafe { ffi::PyCapsule_New(raw.cast(), LEGACY.as_ptr(), Some(destroy_legacy)) };
        if cap.is_null() {
            // SAFETY: not handed over: run its deleter once here.
            unsafe {
                if let Some(d) = (*raw).deleter {
                    d(raw);
                }
            }
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `cap` is a new reference.
        Ok(unsafe { Bound::from_owned_ptr(py, cap) })
    }
}

/// One tensor of a batch, zero-copy, until a framework takes it with `torch.from_dlpack`,
/// `np.from_dlpack` (or any DLPack consumer); it can be taken once.
#[pyclass(name = "Tensor", module = "longshore", frozen)]
pub(crate) struct PyTensor {
    inner: Mutex<Option<DlpackTensor>>,
    device: DLDevice,
    /// Whether the tensor came with an event to wait for (a device copy in flight).
    pending: bool,
    shape: Box<[i64]>,
    dtype: (u8, u8),
    name: Option<String>,
}

impl PyTensor {
    pub(crate) fn new(t: DlpackTensor) -> Self {
        let d = t.dtype();
        Self {
            device: t.device(),
            pending: t.ready_event().is_some(),
            shape: t.shape().into(),
            dtype: (d.code, d.bits),
            name: t.name().map(str::to_owned),
            inner: Mutex::new(Some(t)),
        }
    }

    pub(crate) fn take(&self) -> PyResult<DlpackTensor> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| PyBufferError::new_err("this longshore.Tensor was already exported"))
    }

    fn put_back(&self, t: DlpackTensor) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    }
}

#[pymethods]
impl PyTensor {
    /// The DLPack protocol: a capsule holding the tensor, with the consumer's `stream` ordered
    /// after the batch's copy (CUDA), `dl_device` honoured where no copy is needed.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut t = self.take()?;
        let want = dl_device.map(|(ty, id)| DLDevice {
            device_type: DLDeviceType(ty),
            device_id: id,
        });
        let prepare =
            move || -> Result<DlpackTensor, (longshore::dlpack::DlpackError, DlpackTensor)> {
                if let Err(e) = t.request(want, copy) {
                    return Err((e, t));
                }
                match t.prepare_for_stream(stream) {
                    Ok(()) => Ok(t),
                    Err(e) => Err((e, t)),
                }
            };
        // Host memory with no copy in flight is ready now: nothing to wait for, so the GIL is
        // kept (releasing and taking it back costs more than the checks).
        let prepared = if self.device.device_type != DLDeviceType::CUDA && !self.pending {
            prepare()
        } else {
            py.detach(prepare)
        };
        match prepared {
            Ok(t) => capsule_of(py, t, wants_versioned(max_version)),
            Err((e, t)) => {
                self.put_back(t);
                Err(dlpack_err(e))
            }
        }
    }

    /// The DLPack protocol: `(device_type, device_id)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type.0, self.device.device_id)
    }

    /// Makes the release of this tensor's memory wait for the work enqueued on CUDA stream
    /// `stream` (of GPU `device`) before it is freed: call it before copying a page-locked
    /// tensor to the GPU asynchronously on that stream. `stream` uses the protocol's encoding
    /// (`1`: legacy default stream, `2`: per-thread default stream, else a `cudaStream_t`).
    fn release_after_stream(&self, py: Python<'_>, device: usize, stream: i64) -> PyResult<()> {
        let mut t = self.take()?;
        let r = py.detach(|| {
            let dev = Device::cuda(device).map_err(transfer_err)?;
            t.hand_to_protocol_stream(&dev, stream).map_err(dlpack_err)
        });
        self.put_back(t);
        r
    }

    /// The shape, batch dimension first.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.to_vec()
    }

    /// The NumPy name of the element type (`"float32"`, `"int64"`, ...).
    #[getter]
    fn dtype(&self) -> String {
        let kind = match self.dtype.0 {
            0 => "int",
            1 => "uint",
            2 => "float",
            6 => "bool",
            _ => "unknown",
        };
        if kind == "bool" {
            kind.to_owned()
        } else {
            format!("{kind}{}", self.dtype.1)
        }
    }

    /// The tensor's name in its batch, if it has one.
    #[getter]
    fn name(&self) -> Option<String> {
        self.name.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "longshore.Tensor(shape={:?}, dtype={}, device=({}, {}))",
            self.shape,
            self.dtype(),
            self.device.device_type.0,
            self.device.device_id
        )
    }
}
