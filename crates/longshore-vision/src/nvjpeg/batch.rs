//! What the device stage yields and counts: [`NvjpegBatch`] (a decoded batch in device memory),
//! [`NvjpegStats`] (what a decoder did and where its thread's time went), [`DecodedBy`] and the
//! [`Backend`] choice.

use std::time::Duration;

use longshore_data::DType;
use longshore_transfer::{DeviceBuffer, Stream, TransferError};

/// Which nvJPEG backend decodes JPEGs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Backend {
    /// The hardware JPEG engines (A100, H100, H200) for the images they support, the default
    /// backend for the rest; the default backend alone where there are no engines.
    #[default]
    Auto,
    /// The hardware engines (an error at construction where there are none); images they do
    /// not support go to the default backend.
    Hardware,
    /// nvJPEG's default backend (hybrid CPU/GPU or GPU_HYBRID, chosen by nvJPEG), per image.
    Default,
}

/// How one sample of a batch was decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodedBy {
    /// nvJPEG's hardware backend, batched.
    Hardware,
    /// nvJPEG's default backend, per image.
    Default,
    /// The CPU decoder in the device stage: a JPEG nvJPEG refused or that looked truncated.
    CpuFallback,
    /// The CPU decoder in the worker: not a JPEG (PNG), a JPEG the engines do not take, or one
    /// of the [CPU share](super::EncodedImages::cpu_share).
    Worker,
}

/// What a decoder has done so far, and where the device stage's time went.
///
/// The times partition the stage's wall time ([`wall_time`](NvjpegStats::wall_time), from the
/// first call of the iterator's `next` to its last return): every phase of the loop is timed
/// by consecutive laps of one clock, so [`unaccounted`](NvjpegStats::unaccounted) is only the
/// clock's own cost. With lanes ([`NvjpegIter::with_lanes`](super::NvjpegIter::with_lanes))
/// the decode phases are summed over the lane threads and the wall time is the iterating
/// thread's, so they may add up to more than it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NvjpegStats {
    /// Images decoded by the hardware backend.
    pub hardware: u64,
    /// Images decoded by the default backend.
    pub default_backend: u64,
    /// JPEGs decoded on the CPU by the device stage.
    pub cpu_fallback: u64,
    /// Images decoded by the workers (not JPEG, a JPEG the engines do not take, or the
    /// [CPU share](super::EncodedImages::cpu_share)).
    pub worker: u64,
    /// Samples dropped under [`SampleErrorPolicy::Skip`](longshore_loader::SampleErrorPolicy::Skip).
    pub skipped: u64,
    /// Times a hardware batch failed as a whole and its images were routed again one by one.
    pub hardware_batch_failures: u64,
    /// JPEGs the workers' marker walk could not route, checked with nvJPEG per image by the
    /// device stage (`nvjpegGetImageInfo`, `nvjpegJpegStreamParse`,
    /// `nvjpegDecodeBatchedSupported`).
    pub checked: u64,
    /// Batches decoded.
    pub batches: u64,
    /// Waiting for the next host batch from the loader (`next()` on the source).
    pub source_wait_time: Duration,
    /// Blocked until a batch slot's previous work completed (the device side, engines and
    /// kernels, being the slower stage).
    pub slot_wait_time: Duration,
    /// Reading the batch's metadata rows, laying out and allocating the device buffers.
    pub setup_time: Duration,
    /// Routing the images the workers could not route (nvJPEG's per-image checks) and CPU
    /// decoding of the JPEGs nvJPEG refuses.
    pub route_time: Duration,
    /// The nvJPEG decode calls: `nvjpegDecodeBatched` (hardware) and `nvjpegDecode` (default
    /// backend), whose host-side parsing and submission run on this thread.
    pub decode_call_time: Duration,
    /// Uploads: pixels decoded on the CPU, the kernel's parameters and the labels.
    pub upload_time: Duration,
    /// Launching the crop/resize/normalise kernel.
    pub kernel_time: Duration,
    /// Ending the batch: recording its event, fencing the host batch, building the device
    /// batch.
    pub finish_time: Duration,
    /// The iterator's own work handing batches out (its queue; with lanes, also waiting for
    /// the lanes' answers).
    pub hand_out_time: Duration,
    /// Outside the iterator: the caller's time between receiving a batch and asking for the
    /// next one (its `wait_on`, its step, dropping the batch).
    pub consumer_time: Duration,
    /// From the first call of `next` to its last return.
    pub wall_time: Duration,
}

impl NvjpegStats {
    /// Every image the decoder delivered (all routes).
    pub fn images(&self) -> u64 {
        self.hardware + self.default_backend + self.cpu_fallback + self.worker
    }

    /// The timed phases, by name, in loop order (they sum to the wall time, less
    /// [`unaccounted`](NvjpegStats::unaccounted)).
    pub fn phases(&self) -> [(&'static str, Duration); 11] {
        [
            ("source_wait", self.source_wait_time),
            ("slot_wait", self.slot_wait_time),
            ("setup", self.setup_time),
            ("route", self.route_time),
            ("decode_call", self.decode_call_time),
            ("upload", self.upload_time),
            ("kernel", self.kernel_time),
            ("finish", self.finish_time),
            ("hand_out", self.hand_out_time),
            ("consumer", self.consumer_time),
            ("unaccounted", self.unaccounted()),
        ]
    }

    /// The wall time no phase accounts for (0 when the phases cover it, as with one lane).
    pub fn unaccounted(&self) -> Duration {
        let timed = self.source_wait_time
            + self.slot_wait_time
            + self.setup_time
            + self.route_time
            + self.decode_call_time
            + self.upload_time
            + self.kernel_time
            + self.finish_time
            + self.hand_out_time
            + self.consumer_time;
        self.wall_time.saturating_sub(timed)
    }

    /// Host time enqueueing a batch's work (decode calls, uploads, kernel launch), the one
    /// figure the earlier stats gave.
    pub fn enqueue_time(&self) -> Duration {
        self.decode_call_time + self.upload_time + self.kernel_time
    }
}

/// Counts and times add up (the lanes of a parallel device stage, several epochs).
impl std::ops::AddAssign<&NvjpegStats> for NvjpegStats {
    fn add_assign(&mut self, other: &NvjpegStats) {
        self.hardware += other.hardware;
        self.default_backend += other.default_backend;
        self.cpu_fallback += other.cpu_fallback;
        self.worker += other.worker;
        self.skipped += other.skipped;
        self.hardware_batch_failures += other.hardware_batch_failures;
        self.checked += other.checked;
        self.batches += other.batches;
        self.source_wait_time += other.source_wait_time;
        self.slot_wait_time += other.slot_wait_time;
        self.setup_time += other.setup_time;
        self.route_time += other.route_time;
        self.decode_call_time += other.decode_call_time;
        self.upload_time += other.upload_time;
        self.kernel_time += other.kernel_time;
        self.finish_time += other.finish_time;
        self.hand_out_time += other.hand_out_time;
        self.consumer_time += other.consumer_time;
        self.wall_time += other.wall_time;
    }
}

/// A batch decoded, cropped, resized and normalised on the device.
#[derive(Debug)]
pub struct NvjpegBatch {
    pub(super) images: DeviceBuffer,
    pub(super) labels: DeviceBuffer,
    pub(super) shape: [usize; 4],
    pub(super) dtype: DType,
    pub(super) indices: Vec<usize>,
    pub(super) host_labels: Vec<i64>,
    pub(super) decoded_by: Vec<DecodedBy>,
}

impl NvjpegBatch {
    /// The images: `shape()` elements of `dtype()` at the start of the buffer (the buffer may
    /// be longer when samples were skipped in the device stage).
    pub fn images(&self) -> &DeviceBuffer {
        &self.images
    }

    /// The labels, i64 `[B]`.
    pub fn labels(&self) -> &DeviceBuffer {
        &self.labels
    }

    /// `[B, 3, H, W]` (f32 or u8 CHW), or `[B, H, W, 3]` (u8 HWC).
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The images' element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.shape[0]
    }

    /// Bytes of the images (the used prefix of [`images`](NvjpegBatch::images)).
    pub fn images_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// The dataset index of each sample.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The labels, on the host.
    pub fn host_labels(&self) -> &[i64] {
        &self.host_labels
    }

    /// How each sample was decoded.
    pub fn decoded_by(&self) -> &[DecodedBy] {
        &self.decoded_by
    }

    /// The device buffers `(images, labels)`, to hand the batch on (a DLPack export, for
    /// example): the images are the first [`images_bytes`](NvjpegBatch::images_bytes) bytes
    /// of the first, the labels `batch_size()` i64 at the start of the second.
    pub fn into_buffers(self) -> (DeviceBuffer, DeviceBuffer) {
        (self.images, self.labels)
    }

    /// Copies the images back to the host (for checks; blocks until done).
    ///
    /// # Errors
    /// [`TransferError`] from the copy, or a `T` that does not match the dtype's size.
    pub fn read_images<T: bytemuck::Pod>(&self, stream: &Stream) -> Result<Vec<T>, TransferError> {
        let n = self.images_bytes();
        if std::mem::size_of::<T>() != self.dtype.size() {
            return Err(TransferError::Invalid(format!(
                "reading {:?} images as {}",
                self.dtype,
                std::any::type_name::<T>()
            )));
        }
        let host = longshore_host::HostBuffer::pageable(n.max(1))?;
        let host = stream.download_at(&self.images, 0, host)?.wait()?;
        Ok(bytemuck::pod_collect_to_vec(&host.as_bytes()[..n]))
    }
}
