//! `longshore._TorchConverter`: hands a whole batch to PyTorch in one Rust call, from the
//! epoch's `__next__`, instead of one `torch.utils.dlpack.from_dlpack` per tensor.
//!
//! Per batch, with the GIL held throughout (nothing here blocks):
//! 1. CUDA batches: torch's current stream of the batch's GPU is read once, with torch's C-level
//!    `torch._C._cuda_getCurrentRawStream(index)`, and made to wait for the batch's copy once
//!    ([`hand_all_to`]: one `cuStreamWaitEvent` for the tensors that share the batch's event).
//!    Page-locked CPU batches with CUDA available: the same, on the current stream of torch's
//!    current device (`torch._C._cuda_getDevice()`), with nothing to wait for: only the release
//!    of each tensor is ordered after that stream, for the `.to("cuda", non_blocking=True)`
//!    copies users make from them.
//! 2. Each tensor goes to `torch._C._from_dlpack` as a capsule.
//!
//! The stream semantics are those of `torch.utils.dlpack.from_dlpack(t)`, which calls
//! `t.__dlpack__(stream=torch.cuda.current_stream(t's device).cuda_stream)` (0 sent as 1, the
//! legacy default stream): torch's current stream waits for the copy, and each tensor's memory
//! is released only once that stream has passed the point where torch freed the tensor.

use std::ffi::c_void;
use std::sync::Mutex;

use longshore::dlpack::ffi::DLDeviceType;
use longshore::dlpack::{DlpackTensor, hand_all_to};
use longshore::transfer::{Device, Stream};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{LoaderFailure, dlpack_err, transfer_err};
use crate::tensor::{PyTensor, capsule_of};

/// The torch stream adopted last (a [`Stream`] over torch's handle), reused while torch's
/// current stream stays the same: adopting one allocates, reading the handle does not.
struct Adopted {
    ordinal: usize,
    raw: usize,
    stream: Stream,
}

/// Converts the batches of an epoch into `torch.Tensor`s, a batch per Rust call.
///
/// Made by `longshore.DataLoader` from torch's internals (`from_dlpack` is
/// `torch._C._from_dlpack`, `raw_stream` `torch._C._cuda_getCurrentRawStream`,
/// `current_device` `torch._C._cuda_getDevice`); `pinned` orders the release of host batches
/// after torch's current stream.
#[pyclass(name = "_TorchConverter", module = "longshore", frozen)]
pub(crate) struct PyTorchConverter {
    from_dlpack: Py<PyAny>,
    raw_stream: Option<Py<PyAny>>,
    current_device: Option<Py<PyAny>>,
    pinned: bool,
    adopted: Mutex<Option<Adopted>>,
}

#[pymethods]
impl PyTorchConverter {
    /// `from_dlpack(capsule)` imports one legacy DLPack capsule; `raw_stream(index)` returns the
    /// `cudaStream_t` of the current stream of GPU `index` (0: the legacy default stream), and
    /// is needed for CUDA batches; `current_device()` returns the current GPU's index, needed
    /// with `pinned`.
    #[new]
    #[pyo3(signature = (from_dlpack, *, raw_stream = None, current_device = None, pinned = false))]
    fn new(
        from_dlpack: Py<PyAny>,
        raw_stream: Option<Py<PyAny>>,
        current_device: Option<Py<PyAny>>,
        pinned: bool,
    ) -> PyResult<Self> {
        if pinned && (raw_stream.is_none() || current_device.is_none()) {
            return Err(PyValueError::new_err(
                "pinned=True orders releases after torch's current stream: it needs raw_stream \
                 and current_device",
            ));
        }
        Ok(Self {
            from_dlpack,
            raw_stream,
            current_device,
            pinned,
            adopted: Mutex::new(None),
        })
    }

    /// Whether the release of host batches is ordered after torch's current stream.
    #[getter]
    fn pinned(&self) -> bool {
        self.pinned
    }

    /// Converts `tensors` (`longshore.Tensor`s not yet exported, one batch: CUDA ones share a
    /// GPU) as an epoch does, on torch's current stream; `device` is the GPU ordinal of CUDA
    /// tensors. Each `longshore.Tensor` is consumed.
    #[pyo3(signature = (tensors, device = None))]
    fn convert<'py>(
        &self,
        py: Python<'py>,
        tensors: Vec<PyRef<'py, PyTensor>>,
        device: Option<usize>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let tensors = tensors
            .iter()
            .map(|t| t.take())
            .collect::<PyResult<Vec<_>>>()?;
        let device = device
            .map(|d| py.detach(|| Device::cuda(d)).map_err(transfer_err))
            .transpose()?;
        self.batch(py, tensors, device.as_ref())
    }
}

/// For tests of stream ordering: a one-dimensional u8 CUDA tensor on GPU `device` holding
/// `data`, whose copy is enqueued on the foreign stream `stream` (a `cudaStream_t` the caller
/// keeps alive, such as a `torch.cuda.Stream`'s `cuda_stream`), so it completes only when that
/// stream gets there. Before the copy the memory holds zeros (filled and synchronised first):
/// a consumer that is not ordered after the copy reads zeros.
#[pyfunction]
pub(crate) fn _cuda_bytes_copied_on(
    py: Python<'_>,
    device: usize,
    stream: usize,
    data: Vec<u8>,
) -> PyResult<PyTensor> {
    use longshore::data::{BatchLayout, DType};
    use longshore::host::HostBuffer;
    let n = data.len();
    let tensor = py
        .detach(|| -> Result<DlpackTensor, longshore::dlpack::DlpackError> {
            let dev = Device::cuda(device)?;
            let own = dev.new_stream()?;
            let mut buf = own.alloc_zeroed(n.max(1))?;
            own.synchronize()?;
            // SAFETY: the caller passes a live stream of the device's primary context and keeps
            // it alive while the tensor is in use (the Python test holds the torch stream); the
            // buffer was allocated on this crate's own stream, so nothing is freed on `raw`.
            let foreign = unsafe { Stream::from_raw(&dev, stream as *mut c_void) }?;
            let mut host = HostBuffer::page_locked(n.max(1))
                .map_err(longshore::transfer::TransferError::from)?;
            host[..n].copy_from_slice(&data);
            let pending = foreign.upload(host, &mut buf)?;
            let ready = pending.event().clone();
            drop(pending);
            let mut layout = BatchLayout::new(1);
            layout
                .push(Some("bytes".into()), DType::U8, vec![n])
                .map_err(|e| longshore::dlpack::DlpackError::Unsupported {
                    what: "a test tensor",
                    reason: e.to_string(),
                })?;
            let mut out = longshore::dlpack::export_device(
                &layout,
                buf,
                Some(ready),
                &longshore::dlpack::ExportOptions::default(),
            )?;
            Ok(out.remove(0))
        })
        .map_err(dlpack_err)?;
    Ok(PyTensor::new(tensor))
}

impl PyTorchConverter {
    /// The tensors of one batch as torch tensors, in batch order. `device` is the loader's
    /// device (that of CUDA batches).
    pub(crate) fn batch<'py>(
        &self,
        py: Python<'py>,
        mut tensors: Vec<DlpackTensor>,
        device: Option<&Device>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.order(py, &mut tensors, device)?;
        let from_dlpack = self.from_dlpack.bind(py);
        tensors
            .into_iter()
            .map(|t| {
                // Legacy capsules: every torch's `_from_dlpack` takes them, DLPack 1.x ones only
                // recent versions. They cannot carry the read-only flag, which the Python
                // package never sets; a read-only export goes versioned.
                let versioned = t.is_read_only();
                from_dlpack.call1((capsule_of(py, t, versioned)?,))
            })
            .collect()
    }

    /// Orders torch's current stream after the batch and the tensors' release after it.
    fn order(
        &self,
        py: Python<'_>,
        tensors: &mut [DlpackTensor],
        device: Option<&Device>,
    ) -> PyResult<()> {
        let cuda = tensors
            .iter()
            .map(DlpackTensor::device)
            .find(|d| d.device_type == DLDeviceType::CUDA);
        if let Some(d) = cuda {
            let ordinal = usize::try_from(d.device_id).map_err(|_| {
                LoaderFailure::new_err(format!("a CUDA batch on device {}", d.device_id))
            })?;
            let device = device.ok_or_else(|| {
                LoaderFailure::new_err("a CUDA batch from a loader without a device")
            })?;
            let stream = self.current_stream(py, ordinal, || Ok(device.clone()))?;
            return hand_all_to(tensors, &stream).map_err(dlpack_err);
        }
        // Host memory: ready once its event (if any: host batches have none) completes, as
        // `__dlpack__` waits for it without a stream.
        for t in tensors.iter() {
            if t.ready_event().is_some() {
                py.detach(|| t.synchronize()).map_err(dlpack_err)?;
            }
        }
        if self.pinned {
            let current = self
                .current_device
                .as_ref()
                .expect("checked at construction")
                .bind(py)
                .call0()?
                .extract::<usize>()?;
            let stream = self.current_stream(py, current, || {
                py.detach(|| Device::cuda(current)).map_err(transfer_err)
            })?;
            hand_all_to(tensors, &stream).map_err(dlpack_err)?;
        }
        Ok(())
    }

    /// torch's current stream of GPU `ordinal`, as a [`Stream`] (adopted once per handle);
    /// `device` makes the device when a new handle is adopted.
    fn current_stream(
        &self,
        py: Python<'_>,
        ordinal: usize,
        device: impl FnOnce() -> PyResult<Device>,
    ) -> PyResult<Stream> {
        let raw_stream = self.raw_stream.as_ref().ok_or_else(|| {
            LoaderFailure::new_err("this converter was made without torch's raw_stream")
        })?;
        let raw = raw_stream.bind(py).call1((ordinal,))?.extract::<usize>()?;
        // torch reports the legacy default stream as 0; DLPack's protocol and the driver name
        // it 1 (`CU_STREAM_LEGACY`), as torch.utils.dlpack.from_dlpack sends it.
        let raw = if raw == 0 { 1 } else { raw };
        let lock = || self.adopted.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = lock().as_ref()
            && a.ordinal == ordinal
            && a.raw == raw
        {
            return Ok(a.stream.clone());
        }
        // Not under the lock: `device` may release the GIL.
        let device = device()?;
        // SAFETY: `raw` is torch's current stream of GPU `ordinal`, which torch created in the
        // device's primary context (the one longshore's `Device` uses) and keeps alive while it
        // uses the tensors ordered on it, as the `__dlpack__(stream=...)` protocol asks of a
        // consumer; the release recorded on it by a tensor's deleter happens while torch frees
        // that tensor. The adopted wrapper is reused only when torch reports the same handle as
        // current again, so it is live whenever it is used.
        let stream =
            unsafe { Stream::from_raw(&device, raw as *mut c_void) }.map_err(transfer_err)?;
        *lock() = Some(Adopted {
            ordinal,
            raw,
            stream: stream.clone(),
        });
        Ok(stream)
    }
}
