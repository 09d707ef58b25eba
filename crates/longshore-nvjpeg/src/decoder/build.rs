//! Making a decoder: its nvJPEG handles, compiled kernel, stream and decoding states, for an
//! image folder or any source of encoded images; and a lane sharing them.

use std::sync::Arc;
use std::time::Instant;

use longshore_loader::SampleErrorPolicy;
use longshore_transfer::{Device, StreamPriority, TransferError};
use longshore_vision::compose::Compose;
use longshore_vision::decode::DecodeOptions;

use super::super::batch::{Backend, NvjpegStats};
use super::super::encoded::EncodedImages;
use super::super::ffi::{self, NvHandle};
use super::super::kernel::{Kernel, context};
use super::{Handles, NvjpegDecoder, SampleNames, nv_err};

impl NvjpegDecoder {
    /// A decoder for the batches of `images` on `device` (a CUDA device), on a new stream,
    /// with [`Backend::Auto`], keeping 2 batches in flight.
    ///
    /// # Errors
    /// [`TransferError::LibraryUnavailable`] when libnvjpeg or NVRTC cannot be loaded (naming
    /// every place searched), [`TransferError::Invalid`] for the `Cpu` device, driver errors.
    pub fn new(device: &Device, images: &EncodedImages) -> Result<NvjpegDecoder, TransferError> {
        NvjpegDecoder::with_backend(device, images, Backend::Auto)
    }

    /// A decoder for batches of any source of encoded images with `transform` (an iterable
    /// source of [`PlannedSample`](crate::PlannedSample)s: image shards), decoding on the CPU
    /// with `options` where the device cannot; `names` gives a sample's name for errors from
    /// its index. [`Backend::Auto`].
    ///
    /// # Errors
    /// As [`NvjpegDecoder::new`].
    pub fn for_pipeline(
        device: &Device,
        transform: &Compose,
        options: DecodeOptions,
        names: SampleNames,
    ) -> Result<NvjpegDecoder, TransferError> {
        NvjpegDecoder::build(device, transform, options, names, Backend::Auto)
    }

    /// [`NvjpegDecoder::new`] with a chosen backend.
    ///
    /// # Errors
    /// As [`NvjpegDecoder::new`]; [`Backend::Hardware`] where the GPU has no JPEG engines is
    /// [`TransferError::Cuda`] with nvJPEG's status.
    pub fn with_backend(
        device: &Device,
        images: &EncodedImages,
        backend: Backend,
    ) -> Result<NvjpegDecoder, TransferError> {
        let folder = images.images().folder().clone();
        let names: SampleNames = Arc::new(move |index| {
            folder
                .samples()
                .get(index)
                .map(|(p, _)| p.clone())
                .unwrap_or_default()
        });
        NvjpegDecoder::build(
            device,
            images.transform(),
            *images.images().folder().decode(),
            names,
            backend,
        )
    }

    fn build(
        device: &Device,
        transform: &Compose,
        options: DecodeOptions,
        names: SampleNames,
        backend: Backend,
    ) -> Result<NvjpegDecoder, TransferError> {
        let id = device.id();
        if device.is_cpu() {
            return Err(TransferError::Invalid(
                "nvjpeg decoding needs a cuda device; use the cpu pipeline (ImageDataset) on the cpu"
                    .into(),
            ));
        }
        ffi::available().map_err(|reason| TransferError::LibraryUnavailable {
            op: "nvjpeg decode",
            library: "nvJPEG",
            device: id,
            reason,
        })?;
        let kernel = Kernel::get(device)?;
        let ctx = context(device)?;
        let bind = |ctx: &cudarc::driver::CudaContext| {
            ctx.bind_to_thread().map_err(|e| TransferError::Cuda {
                call: "cuCtxSetCurrent",
                code: format!("{:?}", e.0),
                device: id,
                what: "making the context current for nvjpeg".into(),
            })
        };
        bind(&ctx)?;
        let handles = device.local(|| {
            let default = NvHandle::new(ffi::BACKEND_DEFAULT)
                .map_err(|e| nv_err(e, id, "creating an nvjpeg handle (default backend)"))?;
            let hardware = NvHandle::new(ffi::BACKEND_HARDWARE)
                .map(Arc::new)
                .map_err(|e| e.to_string());
            if let Err(e) = &hardware {
                tracing::debug!(target: "longshore::vision", device = %id, error = %e, "no nvjpeg hardware backend");
            }
            Ok(Handles {
                default: Arc::new(default),
                hardware,
                gpu: std::sync::OnceLock::new(),
            })
        })?;
        if backend == Backend::Hardware
            && let Err(e) = &handles.hardware
        {
            return Err(TransferError::Cuda {
                call: "nvjpegCreateEx",
                code: e.clone(),
                device: id,
                what: "creating an nvjpeg handle with NVJPEG_BACKEND_HARDWARE (does this GPU have JPEG engines?)".into(),
            });
        }
        let stream = device.new_stream_with_priority(StreamPriority::High)?;
        let mut decoder = NvjpegDecoder {
            device: device.clone(),
            stream,
            priority: StreamPriority::High,
            names,
            transform: Arc::new(transform.clone()),
            options,
            backend,
            on_error: SampleErrorPolicy::FailBatch,
            own_policy: false,
            kernel,
            handles,
            slots: Vec::new(),
            next: 0,
            verify: false,
            fields: None,
            current: 0,
            stats: NvjpegStats::default(),
            clock: Instant::now(),
        };
        decoder.set_depth(2)?;
        if let Ok(v) = ffi::version() {
            tracing::debug!(target: "longshore::vision", device = %id, nvjpeg.version = ?v, hardware = decoder.uses_hardware(), "nvjpeg decoder ready");
        }
        Ok(decoder)
    }

    /// The priority of the decoder's stream, [`StreamPriority::High`] by default: the
    /// crop/resize/normalise kernel (and whatever nvJPEG enqueues on the stream) starts ahead
    /// of a training step's waiting blocks as SMs free up. Measured beside an eager and a
    /// captured ResNet-18 step on an H200, it made no difference either way: the time there
    /// goes to nvJPEG's own per-image synchronisation (`docs/benchmarks.md`, ResNet section).
    /// The decoder's work in flight completes first; lanes made after this take it too.
    ///
    /// # Errors
    /// Driver errors waiting for the stream or creating the new one.
    pub fn stream_priority(
        mut self,
        priority: StreamPriority,
    ) -> Result<NvjpegDecoder, TransferError> {
        if priority != self.priority {
            self.stream.synchronize()?;
            self.sync_slots();
            self.stream = self.device.new_stream_with_priority(priority)?;
            self.priority = priority;
        }
        Ok(self)
    }

    /// Another decoder sharing this one's nvJPEG handles and compiled kernel, with its own
    /// stream, decoding states (as many as this one's) and counts: a lane of a parallel device
    /// stage ([`DeviceLoader::lanes`](longshore_loader::DeviceLoader::lanes)). nvJPEG's handles are
    /// thread-safe and its states are not, so each lane has its own states and may run on
    /// its own thread.
    ///
    /// # Errors
    /// Driver or nvJPEG errors creating the stream or the states.
    pub fn lane(&self) -> Result<NvjpegDecoder, TransferError> {
        let mut lane = NvjpegDecoder {
            device: self.device.clone(),
            stream: self.device.new_stream_with_priority(self.priority)?,
            priority: self.priority,
            names: self.names.clone(),
            transform: self.transform.clone(),
            options: self.options,
            backend: self.backend,
            on_error: self.on_error,
            own_policy: self.own_policy,
            kernel: self.kernel.clone(),
            handles: self.handles.clone(),
            slots: Vec::new(),
            next: 0,
            verify: self.verify,
            fields: self.fields.clone(),
            current: 0,
            stats: NvjpegStats::default(),
            clock: Instant::now(),
        };
        lane.set_depth(self.slots.len().saturating_sub(1))?;
        Ok(lane)
    }
}
