//! [`DlpackTensor`]: one exported tensor, owning a share of its batch's memory.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use longshore_data::{DType, TensorSpec};
use longshore_transfer::{Device, Event, Stream};

use crate::error::DlpackError;
use crate::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion,
    DLTensor,
};

/// What keeps a batch's memory alive: the pool lease, host buffer or device buffer, shared by
/// every tensor exported from the batch and dropped when the last deleter has run (and every
/// consumer stream has passed the point where its tensor was released, see
/// [`DlpackTensor::hand_to`]).
pub(crate) type Owner = Arc<Shared>;

/// The memory of one export and the consumer streams its released tensors were used on.
///
/// A tensor released before the others only notes its consumer stream here; the last one
/// records one event on each distinct stream noted (usually one: a batch's tensors go to the
/// same framework stream), and the memory is dropped once they all complete. Work a consumer
/// enqueued on a stream before releasing a tensor precedes an event recorded on that stream
/// later, so one event per stream and batch covers every tensor, where one per tensor cost
/// a driver call and an event-watcher registration each.
pub(crate) struct Shared {
    memory: Box<dyn Send + Sync>,
    streams: std::sync::Mutex<Vec<Stream>>,
}

impl Shared {
    /// An owner of `memory`.
    pub(crate) fn owner(memory: impl Send + Sync + 'static) -> Owner {
        Arc::new(Shared {
            memory: Box::new(memory),
            streams: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Frees the memory once every noted stream has passed the event recorded on it now.
    fn release_after_streams(self) {
        let streams = self.streams.into_inner().unwrap_or_else(|p| p.into_inner());
        let memory = Arc::new(self.memory);
        for stream in streams {
            let memory = memory.clone();
            match stream.record() {
                Ok(done) => done.on_complete(move || drop(memory)),
                Err(e) => {
                    // The consumer's stream is broken: wait for it as well as we can.
                    tracing::error!(target: "longshore::dlpack", error = %e, "cannot record the release of an exported tensor on the consumer's stream; synchronising it");
                    if let Err(e) = stream.synchronize() {
                        tracing::error!(target: "longshore::dlpack", error = %e, "synchronising the consumer's stream failed");
                    }
                    drop(memory);
                }
            }
        }
    }
}

/// The allocation behind one exported tensor: both DLPack headers (versioned and legacy; the
/// consumer receives one), the shape and strides they point to, and the share of the owner.
/// It never moves once boxed: the headers point into it.
struct Holder {
    versioned: DLManagedTensorVersioned,
    legacy: DLManagedTensor,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    owner: Option<Owner>,
    name: Option<Arc<str>>,
    bytes: usize,
    /// The device a device tensor lives on (`None` for host memory).
    device: Option<Device>,
    /// Completes when the data is written (device batches: their copy). Shared by the tensors
    /// of one export, so that [`hand_all_to`] can make a consumer wait for it once.
    ready: Option<Arc<Event>>,
    /// The stream the consumer uses the tensor on: the memory is released only once the work
    /// enqueued there before the deleter ran has completed.
    consumer: Option<Stream>,
}

impl Holder {
    /// Gives back this tensor's share of the owner: the memory is dropped when the last share
    /// is, once each consumer stream noted by the tensors has run what was enqueued on it
    /// before their release ([`Shared`]).
    fn release(mut self: Box<Self>) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        if let Some(stream) = self.consumer.take() {
            let mut streams = owner.streams.lock().unwrap_or_else(|p| p.into_inner());
            if !streams.iter().any(|s| s.id() == stream.id()) {
                streams.push(stream);
            }
        }
        // Exactly one share gets the owner back; the notes of the others happened before.
        if let Some(shared) = Arc::into_inner(owner) {
            shared.release_after_streams();
        }
    }
}

/// Reclaims and releases the holder behind `ctx`; never unwinds.
///
/// # Safety
/// `ctx` is the `manager_ctx` of a tensor made by [`DlpackTensor::new`], not yet released.
unsafe fn release_ctx(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: `ctx` is the leaked `Box<Holder>` of one export (guaranteed by the caller), and
    // DLPack's contract is that the deleter runs exactly once, so the box is reclaimed once.
    let holder = unsafe { Box::from_raw(ctx.cast::<Holder>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| holder.release())).is_err() {
        tracing::error!(target: "longshore::dlpack", "releasing an exported tensor panicked");
    }
}

/// The deleter of a versioned export.
unsafe extern "C" fn delete_versioned(tensor: *mut DLManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: the consumer passes back the header we handed out, which is alive until here.
    let ctx = unsafe { (*tensor).manager_ctx };
    // SAFETY: `ctx` is that header's holder, released once (the deleter's contract).
    unsafe { release_ctx(ctx) }
}

/// The deleter of a legacy export.
unsafe extern "C" fn delete_legacy(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`.
    let ctx = unsafe { (*tensor).manager_ctx };
    // SAFETY: as in `delete_versioned`.
    unsafe { release_ctx(ctx) }
}

/// DLPack's type code and width for a dtype.
pub(crate) fn dl_dtype(dtype: DType) -> Option<DLDataType> {
    let (code, bits) = match dtype {
        DType::Bool => (DLDataTypeCode::BOOL, 8),
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::U16 => (DLDataTypeCode::UINT, 16),
        DType::I16 => (DLDataTypeCode::INT, 16),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::U64 => (DLDataTypeCode::UINT, 64),
        DType::I64 => (DLDataTypeCode::INT, 64),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F64 => (DLDataTypeCode::FLOAT, 64),
        _ => return None,
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// Where the exported tensors of one batch live and what they share.
pub(crate) struct Source<'a> {
    pub(crate) base: *mut u8,
    pub(crate) len: usize,
    pub(crate) dl_device: DLDevice,
    pub(crate) device: Option<&'a Device>,
    pub(crate) owner: &'a Owner,
    pub(crate) ready: Option<&'a Event>,
    pub(crate) read_only: bool,
}

/// One tensor of a batch as a DLPack managed tensor, zero-copy: its data is the batch's own
/// memory (a pinned pool lease, a host buffer or a device buffer), kept alive by a share that
/// the tensor's deleter gives back.
///
/// Hand it to a consumer with [`into_raw`](DlpackTensor::into_raw) (DLPack 1.x) or
/// [`into_raw_legacy`](DlpackTensor::into_raw_legacy); the consumer then calls the deleter
/// once, from any thread. Dropping a `DlpackTensor` that was not handed over runs the deleter.
/// The batch's memory goes back (a lease to its pool, which still defers reuse until the
/// lease's copy fences complete) when the last tensor of the batch has been released.
pub struct DlpackTensor {
    holder: NonNull<Holder>,
}

// SAFETY: the holder is owned by this value alone (until `into_raw`); everything it holds is
// Send + Sync (the owner is `Arc<dyn Send + Sync>`, events and streams are Send + Sync) and its
// raw pointers point into its own boxes or into the owner's memory, which moves with it.
unsafe impl Send for DlpackTensor {}
// SAFETY: `&DlpackTensor` only reads the holder's immutable fields.
unsafe impl Sync for DlpackTensor {}

impl DlpackTensor {
    /// Exports tensor `index` (`spec`) of a batch whose storage is described by `src`.
    ///
    /// `ready` is the export's event when its work was not complete yet (shared by the
    /// batch's tensors).
    pub(crate) fn new(
        index: usize,
        spec: &TensorSpec,
        src: &Source<'_>,
        ready: Option<Arc<Event>>,
    ) -> Result<DlpackTensor, DlpackError> {
        let dtype = dl_dtype(spec.dtype).ok_or(DlpackError::UnsupportedDType {
            tensor: index,
            dtype: spec.dtype,
        })?;
        let shape_err = || DlpackError::Shape {
            tensor: index,
            shape: spec.shape.clone(),
        };
        let ndim = i32::try_from(spec.shape.len()).map_err(|_| shape_err())?;
        let shape: Box<[i64]> = spec
            .shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| shape_err()))
            .collect::<Result<_, _>>()?;
        // C-contiguous strides, in elements.
        let mut strides = vec![1i64; shape.len()].into_boxed_slice();
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1]
                .checked_mul(shape[i + 1].max(1))
                .ok_or_else(shape_err)?;
        }
        let end = spec.offset.checked_add(spec.len);
        if end.is_none_or(|end| end > src.len) {
            return Err(DlpackError::OutOfBounds {
                tensor: index,
                start: spec.offset,
                end: end.unwrap_or(usize::MAX),
                len: src.len,
            });
        }
        // DLPack: a tensor of zero bytes has a null data pointer.
        let data = if spec.len == 0 {
            std::ptr::null_mut()
        } else {
            src.base.wrapping_add(spec.offset).cast::<c_void>()
        };
        let flags = if src.read_only {
            DLPACK_FLAG_BITMASK_READ_ONLY
        } else {
            0
        };
        let dl_tensor = DLTensor {
            data,
            device: src.dl_device,
            ndim,
            dtype,
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let holder = Box::new(Holder {
            versioned: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: DLPACK_MAJOR_VERSION,
                    minor: DLPACK_MINOR_VERSION,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor,
            },
            legacy: DLManagedTensor {
                dl_tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape,
            strides,
            owner: Some(src.owner.clone()),
            name: spec.name.clone(),
            bytes: spec.len,
            device: src.device.cloned(),
            ready,
            consumer: None,
        });
        let raw = Box::into_raw(holder);
        // SAFETY: `raw` is a fresh, valid box; the pointers written into it point into its own
        // heap slices (which never move) and at itself (it is never moved out of the box).
        unsafe {
            let h = &mut *raw;
            let (shape_ptr, strides_ptr) = if h.shape.is_empty() {
                (std::ptr::null_mut(), std::ptr::null_mut())
            } else {
                (h.shape.as_mut_ptr(), h.strides.as_mut_ptr())
            };
            for t in [&mut h.versioned.dl_tensor, &mut h.legacy.dl_tensor] {
                t.shape = shape_ptr;
                t.strides = strides_ptr;
            }
            h.versioned.manager_ctx = raw.cast();
            h.legacy.manager_ctx = raw.cast();
        }
        Ok(DlpackTensor {
            // SAFETY: Box::into_raw never returns null.
            holder: unsafe { NonNull::new_unchecked(raw) },
        })
    }

    fn h(&self) -> &Holder {
        // SAFETY: the holder is alive and owned by `self` until `into_raw`/drop.
        unsafe { self.holder.as_ref() }
    }

    fn h_mut(&mut self) -> &mut Holder {
        // SAFETY: as in `h`, and `&mut self` makes the access exclusive.
        unsafe { self.holder.as_mut() }
    }

    /// The tensor's name in its batch (`"image"`, `"label"`), if it has one.
    pub fn name(&self) -> Option<&str> {
        self.h().name.as_deref()
    }

    /// Where the data lives: `kDLCUDA` with the GPU ordinal, `kDLCUDAHost` for page-locked
    /// host memory, `kDLCPU` for pageable memory (and for the Cpu backend's device memory).
    pub fn device(&self) -> DLDevice {
        self.h().versioned.dl_tensor.device
    }

    /// The element type.
    pub fn dtype(&self) -> DLDataType {
        self.h().versioned.dl_tensor.dtype
    }

    /// The shape (batch dimension first).
    pub fn shape(&self) -> &[i64] {
        &self.h().shape
    }

    /// The strides, in elements (C-contiguous).
    pub fn strides(&self) -> &[i64] {
        &self.h().strides
    }

    /// The address of the first element (a device address for `kDLCUDA`; null when empty).
    pub fn data_ptr(&self) -> *mut c_void {
        self.h().versioned.dl_tensor.data
    }

    /// Bytes of data.
    pub fn byte_len(&self) -> usize {
        self.h().bytes
    }

    /// Whether the consumer is told not to write the data (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    pub fn is_read_only(&self) -> bool {
        self.h().versioned.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0
    }

    /// The event the data is ready at, if it is not yet (device batches).
    pub fn ready_event(&self) -> Option<&Event> {
        self.h().ready.as_deref()
    }

    /// Blocks the host until the data is ready (a no-op for host batches).
    pub fn synchronize(&self) -> Result<(), DlpackError> {
        if let Some(e) = &self.h().ready {
            e.synchronize()?;
        }
        Ok(())
    }

    /// The bytes, for memory the CPU can read (`kDLCPU`, `kDLCUDAHost`); waits for the data to
    /// be ready first. `None` for CUDA device memory.
    pub fn host_bytes(&self) -> Result<Option<&[u8]>, DlpackError> {
        let dev = self.device().device_type;
        if dev != DLDeviceType::CPU && dev != DLDeviceType::CUDA_HOST {
            return Ok(None);
        }
        self.synchronize()?;
        let (ptr, len) = (self.data_ptr(), self.byte_len());
        if len == 0 {
            return Ok(Some(&[]));
        }
        // SAFETY: `ptr..ptr+len` lies inside the owner's memory (checked at export), which
        // lives as long as `self`; the data is ready (synchronised above) and nothing writes it
        // while `&self` is borrowed (the tensor was not handed to a consumer).
        Ok(Some(unsafe {
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        }))
    }

    /// Orders `consumer` after the data (device-side: `consumer` waits for the batch's copy,
    /// the host does not block) and makes the release of the memory wait for the work the
    /// consumer enqueues on `consumer` before it calls the deleter.
    ///
    /// This is what the DLPack `__dlpack__(stream=...)` protocol asks of a producer; call it
    /// also for page-locked host tensors that the consumer copies to a GPU asynchronously on
    /// `consumer`, so that their block does not go back to the pool while the copy reads it.
    pub fn hand_to(&mut self, consumer: &Stream) -> Result<(), DlpackError> {
        if let Some(ready) = self.h().ready.clone()
            && !ready.is_complete()
        {
            consumer.wait_event(&ready)?;
        }
        self.h_mut().consumer = Some(consumer.clone());
        Ok(())
    }

    /// The shared ready event, for [`hand_all_to`].
    fn shared_ready(&self) -> Option<&Arc<Event>> {
        self.h().ready.as_ref()
    }

    /// Applies the `stream` argument of the Python `__dlpack__` protocol: `None` means the
    /// legacy default stream on CUDA, `-1` no synchronisation, `1` / `2` the legacy / per-thread
    /// default streams, anything else a `cudaStream_t`. For host memory the host waits for the
    /// data instead (no stream is passed for it).
    pub fn prepare_for_stream(&mut self, stream: Option<i64>) -> Result<(), DlpackError> {
        if self.device().device_type != DLDeviceType::CUDA {
            return self.synchronize();
        }
        let device = self.h().device.clone().ok_or(DlpackError::Unsupported {
            what: "a CUDA tensor",
            reason: "it has no device handle".into(),
        })?;
        self.hand_to_protocol_stream(&device, stream.unwrap_or(1))
    }

    /// [`hand_to`](DlpackTensor::hand_to) a CUDA stream of `device` given as the `__dlpack__`
    /// protocol encodes it (`-1`: nothing to do, `1` / `2`: the legacy / per-thread default
    /// stream, else a `cudaStream_t`), for example torch's current stream before an
    /// asynchronous copy of a page-locked tensor.
    pub fn hand_to_protocol_stream(
        &mut self,
        device: &Device,
        stream: i64,
    ) -> Result<(), DlpackError> {
        if stream == -1 {
            return Ok(());
        }
        if stream <= 0 {
            return Err(DlpackError::Unsupported {
                what: "a CUDA stream",
                reason: format!("stream {stream} is not a valid CUDA stream for __dlpack__"),
            });
        }
        let consumer = wrap_raw_stream(device, stream as usize)?;
        self.hand_to(&consumer)
    }

    /// Applies the `dl_device` and `copy` arguments of `__dlpack__`: a page-locked tensor may
    /// be relabelled `kDLCPU` (the CPU reads it in place); any other device change, or
    /// `copy=True`, is refused (this producer never copies).
    pub fn request(
        &mut self,
        dl_device: Option<DLDevice>,
        copy: Option<bool>,
    ) -> Result<(), DlpackError> {
        if copy == Some(true) {
            return Err(DlpackError::Unsupported {
                what: "a copy",
                reason: "longshore exports batches without copying (copy=True)".into(),
            });
        }
        let Some(want) = dl_device else {
            return Ok(());
        };
        let have = self.device();
        if want == have {
            return Ok(());
        }
        if have.device_type == DLDeviceType::CUDA_HOST && want.device_type == DLDeviceType::CPU {
            let h = self.h_mut();
            h.versioned.dl_tensor.device = want;
            h.legacy.dl_tensor.device = want;
            return Ok(());
        }
        Err(DlpackError::Unsupported {
            what: "to another device",
            reason: format!(
                "the tensor lives on device ({}, {}), ({}, {}) was asked and copy is not allowed",
                have.device_type.0, have.device_id, want.device_type.0, want.device_id
            ),
        })
    }

    /// Hands the tensor over as a DLPack 1.x `DLManagedTensorVersioned`. The receiver must call
    /// its `deleter` exactly once (from any thread) when done.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let raw = self.holder.as_ptr();
        std::mem::forget(self);
        // SAFETY: the holder stays alive until its deleter runs; the header is a field of it.
        unsafe { &raw mut (*raw).versioned }
    }

    /// Hands the tensor over as a legacy `DLManagedTensor`, for consumers that do not know
    /// DLPack 1.x; refused for read-only tensors (the legacy struct cannot say so).
    pub fn into_raw_legacy(self) -> Result<*mut DLManagedTensor, (DlpackError, DlpackTensor)> {
        if self.is_read_only() {
            return Err((
                DlpackError::Unsupported {
                    what: "a read-only tensor",
                    reason: "the legacy DLPack struct cannot carry the read-only flag".into(),
                },
                self,
            ));
        }
        let raw = self.holder.as_ptr();
        std::mem::forget(self);
        // SAFETY: as in `into_raw`.
        Ok(unsafe { &raw mut (*raw).legacy })
    }

    /// Takes back a tensor handed over with [`into_raw`](DlpackTensor::into_raw) (dropping the
    /// result runs the deleter).
    ///
    /// # Safety
    /// `raw` came from `into_raw` and its deleter has not run.
    pub unsafe fn from_raw(raw: *mut DLManagedTensorVersioned) -> DlpackTensor {
        // SAFETY: guaranteed by the caller: `manager_ctx` is the holder, alive.
        let ctx = unsafe { (*raw).manager_ctx };
        DlpackTensor {
            // SAFETY: a live holder is never null.
            holder: unsafe { NonNull::new_unchecked(ctx.cast::<Holder>()) },
        }
    }
}

impl Drop for DlpackTensor {
    fn drop(&mut self) {
        // SAFETY: the holder was not handed over (or was taken back): release it once here.
        unsafe { release_ctx(self.holder.as_ptr().cast()) }
    }
}

impl fmt::Debug for DlpackTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.device();
        f.debug_struct("DlpackTensor")
            .field("name", &self.name())
            .field("device", &(d.device_type.0, d.device_id))
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

/// [`DlpackTensor::hand_to`] for every tensor of `tensors` (a batch, usually), with one wait
/// per distinct ready event instead of one per tensor: the tensors of one export share their
/// batch's event, so a batch costs its consumer a single `cuStreamWaitEvent`. The host does not
/// block; the release of each tensor is ordered after the work enqueued on `consumer` before its
/// deleter runs, exactly as with `hand_to`.
///
/// On an error the tensors before the failing wait have been handed to `consumer` (their
/// release waits for it), the others are unchanged.
pub fn hand_all_to(tensors: &mut [DlpackTensor], consumer: &Stream) -> Result<(), DlpackError> {
    // Distinct events of a batch: one or two (nvJPEG batches export images and labels apart).
    let mut waited: Vec<Arc<Event>> = Vec::new();
    for t in tensors.iter_mut() {
        if let Some(ready) = t.shared_ready()
            && !waited.iter().any(|w| Arc::ptr_eq(w, ready))
        {
            let ready = ready.clone();
            // No `is_complete` query first: waiting on a completed event is one driver call,
            // the same as the query it would replace.
            consumer.wait_event(&ready)?;
            waited.push(ready);
        }
        t.h_mut().consumer = Some(consumer.clone());
    }
    Ok(())
}

/// A protocol stream handle of `device` as a [`Stream`].
#[cfg(feature = "cuda")]
fn wrap_raw_stream(device: &Device, raw: usize) -> Result<Stream, DlpackError> {
    // SAFETY: the DLPack protocol's contract: the consumer passes a live stream of the tensor's
    // device (or a special handle) that it keeps alive while it uses the tensor, which covers
    // the release recorded on it by the deleter.
    Ok(unsafe { Stream::from_raw(device, raw as _) }?)
}

#[cfg(not(feature = "cuda"))]
fn wrap_raw_stream(_device: &Device, _raw: usize) -> Result<Stream, DlpackError> {
    Err(DlpackError::Unsupported {
        what: "a CUDA stream",
        reason: "longshore-dlpack was built without the `cuda` feature".into(),
    })
}
