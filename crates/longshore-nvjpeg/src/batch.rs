//! What the device stage attaches and counts: [`NvjpegInfo`] (each batch's indices, labels
//! and decoders), [`NvjpegStats`] (what a decoder did and where its time went), [`DecodedBy`]
//! and the [`Backend`] choice.

use std::time::Duration;

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
/// The times are the decoder's phases for each batch, timed by consecutive laps of one
/// clock from the start of each batch's `run`; the delivery around it (waiting for the loader,
/// handing batches out, the consumer) is in the
/// [`DeviceLoader`](longshore_loader::DeviceLoader)'s
/// [`DeviceStats`](longshore_loader::DeviceStats). Lanes count apart: add them up with `+=`.
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
}

impl NvjpegStats {
    /// Every image the decoder delivered (all routes).
    pub fn images(&self) -> u64 {
        self.hardware + self.default_backend + self.cpu_fallback + self.worker
    }

    /// The timed phases, by name, in the order they run.
    pub fn phases(&self) -> [(&'static str, Duration); 7] {
        [
            ("slot_wait", self.slot_wait_time),
            ("setup", self.setup_time),
            ("route", self.route_time),
            ("decode_call", self.decode_call_time),
            ("upload", self.upload_time),
            ("kernel", self.kernel_time),
            ("finish", self.finish_time),
        ]
    }

    /// Every phase added up: the decoder's busy time.
    pub fn busy_time(&self) -> Duration {
        self.phases().iter().map(|(_, d)| *d).sum()
    }

    /// Host time enqueueing a batch's work (decode calls, uploads, kernel launch), the one
    /// figure the earlier stats gave.
    pub fn enqueue_time(&self) -> Duration {
        self.decode_call_time + self.upload_time + self.kernel_time
    }
}

/// The lanes of a device stage, added up: `on_gpu.lanes_kept(|l| l.iter().map(|d| d.stats()).sum())`.
impl std::iter::Sum for NvjpegStats {
    fn sum<I: Iterator<Item = NvjpegStats>>(iter: I) -> NvjpegStats {
        iter.fold(NvjpegStats::default(), |mut total, s| {
            total += &s;
            total
        })
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
        self.slot_wait_time += other.slot_wait_time;
        self.setup_time += other.setup_time;
        self.route_time += other.route_time;
        self.decode_call_time += other.decode_call_time;
        self.upload_time += other.upload_time;
        self.kernel_time += other.kernel_time;
        self.finish_time += other.finish_time;
    }
}

/// What the nvJPEG stage knows of each batch beyond its tensors, attached to every
/// [`DeviceBatch`](longshore_loader::DeviceBatch) it yields:
/// `batch.extension::<NvjpegInfo>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvjpegInfo {
    pub(crate) indices: Vec<usize>,
    pub(crate) labels: Vec<i64>,
    /// Each sample's row in the host batch.
    pub(crate) rows: Vec<usize>,
    /// A record batch's variable-length fields, on the host.
    pub(crate) variable: Vec<(Vec<u8>, Vec<i64>)>,
    pub(crate) decoded_by: Vec<DecodedBy>,
}

impl NvjpegInfo {
    /// The dataset index of each sample.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The variable-length fields (text, JSON, bytes) of a batch of
    /// [`EncodedFields`](crate::EncodedFields) records, on the host, in field order: each the
    /// samples' bytes back to back and their offsets (`[B + 1]`: sample `k` is
    /// `bytes[offsets[k]..offsets[k + 1]]`), as the batch's own `<name>` and `<name>.offsets`
    /// tensors hold them on the device. Empty for image batches.
    pub fn variable_fields(&self) -> &[(Vec<u8>, Vec<i64>)] {
        &self.variable
    }

    /// The labels, on the host (the batch's `"label"` tensor holds them on the device; zeros
    /// for a batch of [`EncodedFields`](crate::EncodedFields) records, whose label, if any, is
    /// one of its fields).
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// How each sample was decoded.
    pub fn decoded_by(&self) -> &[DecodedBy] {
        &self.decoded_by
    }
}
