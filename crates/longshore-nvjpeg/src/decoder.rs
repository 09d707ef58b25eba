//! [`NvjpegDecoder`]: the device stage. Per host batch of [`EncodedCollate`](super::EncodedCollate):
//! route each sample (hardware batched decode, the default backend per image, or the CPU
//! decoder), decode into one device buffer, then one kernel crops, resizes and normalises
//! into a `[B, 3, H, W]` batch. The host batch (a pinned lease) is released to its pool only
//! after the event that ends the batch's work, since nvJPEG reads the bitstreams from it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use longshore_data::{Batch, BatchLayout, DType, DataError, Storage};
use longshore_host::{HostBuffer, HostMemory};
use longshore_loader::{DeviceBatch, DevicePart, LoaderError, SampleErrorPolicy};
use longshore_transfer::{
    Device, DeviceBuffer, DeviceId, Event, Stream, StreamPriority, TransferError,
};

use super::batch::{Backend, DecodedBy, NvjpegInfo, NvjpegStats};
use super::encoded::{EncodedEntry, Payload, check_limit, entries};
#[cfg(feature = "ceiling")]
use super::ffi::Image;
use super::ffi::{self, NvHandle, NvState};
use super::header::has_eoi;
use super::kernel::{Kernel, PARAMS, context};
use crate::{IMAGE, LABEL_NAME};
use longshore_vision::compose::{Compose, Output};
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::folder::invalid;

mod build;
#[cfg(feature = "ceiling")]
mod ceiling;
mod enqueue;
mod fields;

pub(crate) use fields::FieldOut;

#[cfg(feature = "ceiling")]
pub use ceiling::{CeilingRun, CeilingStage};

/// The nvJPEG handles of a device, made once ([`Device::local`]).
struct Handles {
    default: Arc<NvHandle>,
    hardware: Result<Arc<NvHandle>, String>,
    /// `NVJPEG_BACKEND_GPU_HYBRID`, made on first use (the ceiling's
    /// [`DecodeCuda`](super::CeilingStage::DecodeCuda) stage).
    #[cfg_attr(not(feature = "ceiling"), allow(dead_code))]
    gpu: std::sync::OnceLock<Result<Arc<NvHandle>, String>>,
}

/// The per-batch state a decoder cycles through: one is reused only after the event of the
/// batch that last used it.
struct Slot {
    default: NvState,
    hardware: Option<NvState>,
    /// A `GPU_HYBRID` state, made by the ceiling's `DecodeCuda` stage.
    #[cfg_attr(not(feature = "ceiling"), allow(dead_code))]
    gpu: Option<NvState>,
    last: Option<Event>,
    /// Pixels the device stage decoded on the CPU (rare: JPEGs nvJPEG refuses), uploaded
    /// from here.
    keep: Vec<Vec<u8>>,
    /// The decoded pixels of the slot's batch, reused batch after batch (grown when a batch
    /// needs more): no allocation per batch.
    decoded: Option<DeviceBuffer>,
    /// The kernel's parameters on the device, reused likewise.
    params: Option<DeviceBuffer>,
    /// Page-locked staging of the parameters and labels (a copy from pageable memory may
    /// wait for the stream's earlier work), reused likewise.
    staging: Option<HostBuffer>,
}

/// Where a sample's pixels come from in the device stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Hardware,
    Default,
    /// RGB HWC bytes in the host batch.
    HostRgb,
    /// RGB HWC bytes in `slot.keep[k]`.
    Kept(usize),
}

struct Item {
    entry: EncodedEntry,
    /// The sample's row in the host batch.
    row: usize,
    route: Route,
    /// Offset of the decoded pixels in the decode buffer.
    at: usize,
    dropped: bool,
}

/// How a decoder names a sample in errors, from its dataset index: its file, or for a shard
/// sample the shard and the sample's place in it.
pub type SampleNames = Arc<dyn Fn(usize) -> std::path::PathBuf + Send + Sync>;

/// Decodes host batches of [`EncodedCollate`](super::EncodedCollate) on a CUDA device; see the
/// [module docs](super).
pub struct NvjpegDecoder {
    device: Device,
    stream: Stream,
    /// The scheduling priority of `stream` (and of lanes' streams).
    priority: StreamPriority,
    /// Names a sample (by dataset index) in errors.
    names: SampleNames,
    transform: Arc<Compose>,
    options: DecodeOptions,
    backend: Backend,
    on_error: SampleErrorPolicy,
    /// `on_error` was chosen with [`on_sample_error`](NvjpegDecoder::on_sample_error): the
    /// loader's policy does not replace it.
    own_policy: bool,
    kernel: Arc<Kernel>,
    handles: Arc<Handles>,
    slots: Vec<Slot>,
    next: usize,
    /// Check every JPEG with nvJPEG, ignoring the workers' routes.
    verify: bool,
    /// The fields of a record batch beside its images (`EncodedFields`), in field order:
    /// the host batch's tensors after the encoded images' three.
    fields: Option<Arc<[FieldOut]>>,
    /// The slot of the batch under way.
    current: usize,
    stats: NvjpegStats,
    /// The end of the last timed phase: consecutive laps partition the stage's time.
    clock: Instant,
}

impl std::fmt::Debug for NvjpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvjpegDecoder")
            .field("device", &self.device.id())
            .field("backend", &self.backend)
            .field("hardware", &self.handles.hardware.is_ok())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn nv_err(e: ffi::CallError, device: DeviceId, what: &str) -> TransferError {
    TransferError::Cuda {
        call: e.call,
        code: ffi::status_name(e.status).to_owned(),
        device,
        what: what.to_owned(),
    }
}

const ALIGN: usize = 256;

/// A slot buffer of at least `len` bytes: the one there, or a new one with some headroom
/// (the old one is freed in stream order after its last use).
fn ensure_device(
    stream: &Stream,
    buf: &mut Option<DeviceBuffer>,
    len: usize,
) -> Result<DeviceBuffer, TransferError> {
    match buf.take() {
        Some(b) if b.len() >= len => Ok(b),
        _ => stream.alloc(len.max(1) + len / 8),
    }
}

impl NvjpegDecoder {
    /// Makes the device's context current on the calling thread (nvJPEG's calls use the
    /// thread's current context; a lane thread starts with none).
    pub(crate) fn enter(&self) -> Result<(), TransferError> {
        let ctx = context(&self.device)?;
        ctx.bind_to_thread().map_err(|e| TransferError::Cuda {
            call: "cuCtxSetCurrent",
            code: format!("{:?}", e.0),
            device: self.device.id(),
            what: "making the context current for an nvjpeg lane".into(),
        })
    }

    /// Takes the loader's policy for samples that fail in the device stage (at each epoch),
    /// unless one was chosen with [`on_sample_error`](NvjpegDecoder::on_sample_error).
    pub(crate) fn set_policy(&mut self, policy: SampleErrorPolicy) {
        if !self.own_policy {
            self.on_error = policy;
        }
    }

    /// What a sample that fails to decode in the device stage does: fail the batch or drop
    /// the sample. By default the decoder follows the loader's `on_sample_error`; this sets
    /// its own (the workers keep the loader's).
    pub fn on_sample_error(mut self, policy: SampleErrorPolicy) -> NvjpegDecoder {
        self.on_error = policy;
        self.own_policy = true;
        self
    }

    /// Whether the device stage checks every JPEG with nvJPEG (`nvjpegGetImageInfo`,
    /// `nvjpegJpegStreamParse`, `nvjpegDecodeBatchedSupported`, about 36 us an image on an
    /// H200 host) instead of trusting the workers' marker walk
    /// ([`JpegRoute`](super::JpegRoute)). Off by default: a hardware batch that fails is
    /// routed again image by image with these checks anyway.
    pub fn verify_routes(mut self, verify: bool) -> NvjpegDecoder {
        self.verify = verify;
        self
    }

    /// The `GPU_HYBRID` handle, made on first use.
    #[cfg(feature = "ceiling")]
    fn gpu_handle(&self) -> Result<Arc<NvHandle>, TransferError> {
        self.handles
            .gpu
            .get_or_init(|| {
                NvHandle::new(ffi::BACKEND_GPU_HYBRID)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|code| TransferError::Cuda {
                call: "nvjpegCreateEx",
                code,
                device: self.device.id(),
                what: "creating an nvjpeg handle with NVJPEG_BACKEND_GPU_HYBRID".into(),
            })
    }

    /// The time since the last lap, and a new lap starts.
    pub(crate) fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let d = now - self.clock;
        self.clock = now;
        d
    }

    /// Makes `depth + 1` decoding states, so `depth` batches can be in flight.
    pub(crate) fn set_depth(&mut self, depth: usize) -> Result<(), TransferError> {
        // Every slot's work is done after this: the slots kept (their nvJPEG states, decode
        // and parameter buffers, staging) are reused as they are. Making a hardware state costs
        // hundreds of milliseconds (measured on an H200: 1.2 s for three slots, at every epoch
        // start before slots were kept), so an epoch with the same depth makes none.
        self.sync_slots();
        let want = depth.max(1) + 1;
        let use_hw = self.uses_hardware();
        // A slot made for the other backend (the backend was chosen after the decoder was
        // made) is made again.
        self.slots.retain(|s| s.hardware.is_some() == use_hw);
        self.slots.truncate(want);
        for s in &mut self.slots {
            s.keep.clear();
        }
        let id = self.device.id();
        for _ in self.slots.len()..want {
            let default = NvState::new(self.handles.default.clone())
                .map_err(|e| nv_err(e, id, "creating an nvjpeg state"))?;
            let hardware = match (&self.handles.hardware, use_hw) {
                (Ok(h), true) => Some(
                    NvState::new(h.clone())
                        .map_err(|e| nv_err(e, id, "creating an nvjpeg hardware state"))?,
                ),
                _ => None,
            };
            self.slots.push(Slot {
                default,
                hardware,
                gpu: None,
                last: None,
                keep: Vec::new(),
                decoded: None,
                params: None,
                staging: None,
            });
        }
        self.next = 0;
        Ok(())
    }

    /// Whether JPEGs go to the hardware engines.
    pub fn uses_hardware(&self) -> bool {
        self.backend != Backend::Default && self.handles.hardware.is_ok()
    }

    /// The stream the decoding and the kernel run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The GPU the decoder decodes on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The counts so far.
    pub fn stats(&self) -> NvjpegStats {
        self.stats
    }

    fn path(&self, index: usize) -> std::path::PathBuf {
        (self.names)(index)
    }

    fn sync_slots(&mut self) {
        for s in &mut self.slots {
            if let Some(ev) = s.last.take()
                && let Err(e) = ev.synchronize()
            {
                tracing::error!(target: "longshore::vision", error = %e, "waiting for an nvjpeg batch");
            }
        }
    }

    /// Decodes host batch `seq` (written by [`EncodedCollate`](super::EncodedCollate)): returns
    /// the device batch and the event it is ready at, or `None` when every sample was skipped.
    /// The host batch's storage goes back to its pool once the batch's work has completed.
    ///
    /// # Errors
    /// [`LoaderError::Sample`] naming the file for a sample that does not decode (unless
    /// skipped), [`LoaderError::Data`] for a batch not written by `EncodedCollate`,
    /// [`LoaderError::Transfer`] for device errors.
    pub fn decode<S: Storage + HostMemory>(
        &mut self,
        seq: u64,
        batch: Batch<S>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        // The time since the last batch is not the decoder's.
        self.lap();
        let mut fence = None;
        let out = match (self.run(seq, &batch, &mut fence), self.fields.clone()) {
            (Ok(Some(images)), Some(fields)) => {
                self.carry_fields(&fields, &batch, images, &mut fence)
            }
            (out, _) => out,
        };
        let (_, mut storage) = batch.into_parts();
        // Whatever was enqueued reads the host batch: it goes back to its pool after that.
        if let Some(ev) = fence {
            storage.record_fence(ev.to_fence());
        }
        drop(storage);
        let lap = self.lap();
        self.stats.finish_time += lap;
        out
    }

    /// The end of a batch's enqueued work (`ev`), kept as the host batch's fence and the
    /// slot's last use. When enqueueing failed, whatever was enqueued may still read the host
    /// batch and the slot: an event recorded now is kept in their place, and the error returned.
    pub(super) fn settle(
        &mut self,
        slot_i: usize,
        ev: Result<Event, TransferError>,
        fence: &mut Option<Event>,
    ) -> Result<Event, LoaderError> {
        let (kept, out) = match ev {
            Ok(ev) => (Some(ev.clone()), Ok(ev)),
            Err(e) => (self.stream.record().ok(), Err(e.into())),
        };
        if let Some(ev) = kept {
            *fence = Some(ev.clone());
            self.slots[slot_i].last = Some(ev);
        }
        out
    }

    /// The slot the next batch uses, once its previous batch's work has completed.
    pub(super) fn next_slot(&mut self) -> Result<usize, TransferError> {
        let slot_i = self.next;
        self.current = slot_i;
        self.next = (self.next + 1) % self.slots.len();
        if let Some(ev) = self.slots[slot_i].last.take() {
            ev.synchronize()?;
        }
        let lap = self.lap();
        self.stats.slot_wait_time += lap;
        Ok(slot_i)
    }

    /// The device stage on a borrowed host batch; `fence` receives the event after which the
    /// host batch is no longer read (the caller keeps it alive until then).
    pub(super) fn run<S: Storage>(
        &mut self,
        seq: u64,
        batch: &Batch<S>,
        fence: &mut Option<Event>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        let slot_i = self.next_slot()?;
        self.slots[slot_i].keep.clear();
        let (rows, bytes) = entries(batch)?;
        let lap = self.lap();
        self.stats.setup_time += lap;
        let trust = !self.verify && self.slots[slot_i].hardware.is_some();
        let mut items = Vec::with_capacity(rows.len());
        for (row, e) in rows.into_iter().enumerate() {
            let data = &bytes[e.offset..e.offset + e.len];
            let route = match e.payload {
                Payload::Rgb => Some(Route::HostRgb),
                Payload::Jpeg if trust && e.hardware => Some(Route::Hardware),
                Payload::Jpeg => {
                    self.stats.checked += 1;
                    self.route_jpeg(slot_i, data, &e)
                }
            };
            let route = match route {
                Some(r) => r,
                None => match self.cpu_decode(slot_i, data, &e) {
                    Ok(k) => Route::Kept(k),
                    Err(source) => {
                        self.sample_error(seq, e.index, source)?;
                        continue;
                    }
                },
            };
            items.push(Item {
                entry: e,
                row,
                route,
                at: 0,
                dropped: false,
            });
        }
        let lap = self.lap();
        self.stats.route_time += lap;
        if items.is_empty() {
            return Ok(None);
        }
        let mut total = 0usize;
        for it in &mut items {
            it.at = total;
            let n = it.entry.width * it.entry.height * 3;
            total = (total + n).next_multiple_of(ALIGN);
        }
        let (out_h, out_w) = self.transform.output_size();
        let out_bytes = self.transform.output_bytes();
        let n = items.len();
        let stream = self.stream.clone();
        let staging_len = n * (PARAMS + 1) * 8;
        let slot = &mut self.slots[slot_i];
        if slot.staging.as_ref().is_none_or(|s| s.len() < staging_len) {
            slot.staging = None;
            // Headroom against regrowing for every slightly larger batch, kept a whole number
            // of i64 words (the staging is written as `[i64]`).
            slot.staging = Some(HostBuffer::page_locked(
                (staging_len + staging_len / 8).next_multiple_of(8),
            )?);
        }
        let mut decoded = ensure_device(&stream, &mut slot.decoded, total)?;
        let mut params_buf = ensure_device(&stream, &mut slot.params, n * PARAMS * 8)?;
        let mut out = stream.alloc(n * out_bytes)?;
        let mut labels_buf = stream.alloc(n * 8)?;
        let lap = self.lap();
        self.stats.setup_time += lap;
        let mut late: Option<LoaderError> = None;
        let ev = {
            let (dec, outp, par, lab) = (&mut decoded, &mut out, &mut params_buf, &mut labels_buf);
            stream.enqueue_work(&[], &[dec, outp, par, lab], || {
                self.enqueue(
                    slot_i,
                    seq,
                    &mut items,
                    bytes,
                    [
                        dec.device_ptr(),
                        outp.device_ptr(),
                        par.device_ptr(),
                        lab.device_ptr(),
                    ],
                    &mut late,
                )
            })
        };
        self.slots[slot_i].decoded = Some(decoded);
        self.slots[slot_i].params = Some(params_buf);
        let ev = self.settle(slot_i, ev, fence)?;
        self.stats.batches += 1;
        if let Some(e) = late {
            return Err(e);
        }
        let kept: Vec<&Item> = items.iter().filter(|i| !i.dropped).collect();
        if kept.is_empty() {
            return Ok(None);
        }
        for it in &kept {
            match it.route {
                Route::Hardware => self.stats.hardware += 1,
                Route::Default => self.stats.default_backend += 1,
                Route::HostRgb => self.stats.worker += 1,
                Route::Kept(_) => self.stats.cpu_fallback += 1,
            }
        }
        let b = kept.len();
        let (shape, dtype) = match self.transform.output() {
            Output::Normalized(_) => ([b, 3, out_h, out_w], DType::F32),
            Output::U8Chw => ([b, 3, out_h, out_w], DType::U8),
            Output::U8Hwc => ([b, out_h, out_w, 3], DType::U8),
            other => {
                return Err(LoaderError::Data(DataError::InvalidArgument {
                    name: "transform",
                    reason: format!("the nvjpeg stage does not write the output {other:?}"),
                }));
            }
        };
        let info = NvjpegInfo {
            indices: kept.iter().map(|i| i.entry.index).collect(),
            labels: kept.iter().map(|i| i.entry.label).collect(),
            rows: kept.iter().map(|i| i.row).collect(),
            variable: Vec::new(),
            decoded_by: kept
                .iter()
                .map(|i| match i.route {
                    Route::Hardware => DecodedBy::Hardware,
                    Route::Default => DecodedBy::Default,
                    Route::HostRgb => DecodedBy::Worker,
                    Route::Kept(_) => DecodedBy::CpuFallback,
                })
                .collect(),
        };
        let mut image = BatchLayout::new(b);
        image.push(Some(IMAGE.into()), dtype, shape.to_vec())?;
        let mut label = BatchLayout::new(b);
        label.push(Some(LABEL_NAME.into()), DType::I64, vec![b])?;
        let parts = vec![
            DevicePart {
                layout: image,
                storage: out,
            },
            DevicePart {
                layout: label,
                storage: labels_buf,
            },
        ];
        Ok(Some(
            DeviceBatch::from_parts(parts, ev)?.with_extension(info),
        ))
    }

    /// The hardware batched decode alone (for [`ceiling`](NvjpegDecoder::ceiling)): `data[i]`
    /// (`dims[i]` = width x height) into the next slot's decode buffer, with nvJPEG's
    /// per-image checks first when `checked`, or with the `GPU_HYBRID` backend instead when
    /// `cuda`; returns the images decoded. The caller keeps `data` alive and unchanged until
    /// the stream has synchronised.
    #[cfg(feature = "ceiling")]
    pub(super) fn decode_only(
        &mut self,
        data: &[&[u8]],
        dims: &[(usize, usize)],
        checked: bool,
        cuda: bool,
    ) -> Result<usize, TransferError> {
        let slot_i = self.next_slot()?;
        if cuda && self.slots[slot_i].gpu.is_none() {
            let state = NvState::new(self.gpu_handle()?)
                .map_err(|e| nv_err(e, self.device.id(), "creating an nvjpeg GPU_HYBRID state"))?;
            self.slots[slot_i].gpu = Some(state);
        }
        let mut n_ok = data.len();
        if checked {
            let e0 = EncodedEntry {
                index: 0,
                label: 0,
                payload: Payload::Jpeg,
                offset: 0,
                len: 0,
                width: 0,
                height: 0,
                hardware: false,
                plan: super::SamplePlan::default(),
            };
            for (d, &(width, height)) in data.iter().zip(dims) {
                let e = EncodedEntry {
                    width,
                    height,
                    ..e0
                };
                if self.route_jpeg(slot_i, d, &e) != Some(Route::Hardware) {
                    n_ok -= 1;
                }
            }
            let lap = self.lap();
            self.stats.route_time += lap;
        }
        let mut at = Vec::with_capacity(data.len());
        let mut total = 0usize;
        for &(w, h) in dims {
            at.push(total);
            total = (total + w * h * 3).next_multiple_of(ALIGN);
        }
        let stream = self.stream.clone();
        let mut dec = ensure_device(&stream, &mut self.slots[slot_i].decoded, total)?;
        let id = self.device.id();
        let ev = {
            let d = &mut dec;
            stream.enqueue_work(&[], &[d], || {
                let base = d.device_ptr();
                let mut images: Vec<Image> = dims
                    .iter()
                    .zip(&at)
                    .map(|(&(w, h), &a)| Image::planar(base + a as u64, w * h, w))
                    .collect();
                let raw = self.stream.as_raw()?;
                let slot = &mut self.slots[slot_i];
                let state = if cuda {
                    slot.gpu.as_mut()
                } else {
                    slot.hardware.as_mut()
                };
                let state = state.ok_or_else(|| {
                    TransferError::Invalid("nvjpeg ceiling: no hardware backend here".into())
                })?;
                // SAFETY: each image's planes lie in the slot's decode buffer, sized above for
                // `dims`, which the caller took from the files' headers; the bitstreams stay
                // alive until the stream synchronises (the caller's promise).
                unsafe { state.decode_batched(data, &mut images, raw) }
                    .map_err(|e| nv_err(e, id, "nvjpeg ceiling: batched decode"))
            })
        };
        self.slots[slot_i].decoded = Some(dec);
        let ev = ev?;
        self.slots[slot_i].last = Some(ev);
        let lap = self.lap();
        self.stats.decode_call_time += lap;
        Ok(n_ok)
    }

    /// Hardware, default backend, or `None` for the CPU decoder: nvJPEG's own checks.
    fn route_jpeg(&mut self, slot_i: usize, data: &[u8], e: &EncodedEntry) -> Option<Route> {
        if !has_eoi(data) {
            return None;
        }
        let (n, css, w, h) = self.handles.default.image_info(data).ok()?;
        if (w, h) != (e.width, e.height) || css == ffi::CSS_UNKNOWN || !(n == 1 || n == 3) {
            return None;
        }
        let hw = self.slots[slot_i]
            .hardware
            .as_mut()
            .is_some_and(|hw| matches!(hw.batched_supported(data), Ok(true)));
        Some(if hw { Route::Hardware } else { Route::Default })
    }

    /// Decodes on the CPU into `slot.keep`; returns the index there.
    fn cpu_decode(
        &mut self,
        slot_i: usize,
        data: &[u8],
        e: &EncodedEntry,
    ) -> Result<usize, DataError> {
        let path = self.path(e.index);
        check_limit(&self.options, e.width, e.height).map_err(|x| invalid(&path, x))?;
        let image = decode_rgb(data, &self.options).map_err(|x| invalid(&path, x))?;
        if (image.width(), image.height()) != (e.width, e.height) {
            return Err(DataError::InvalidFile {
                path,
                reason: format!(
                    "decoded to {}x{}, its header says {}x{}",
                    image.width(),
                    image.height(),
                    e.width,
                    e.height
                ),
            });
        }
        let keep = &mut self.slots[slot_i].keep;
        keep.push(image.into_vec());
        Ok(keep.len() - 1)
    }

    /// Applies the sample-error policy: `Err` to fail the batch, `Ok` when the sample is
    /// dropped.
    fn sample_error(
        &mut self,
        seq: u64,
        index: usize,
        source: DataError,
    ) -> Result<(), LoaderError> {
        match self.on_error {
            SampleErrorPolicy::Skip => {
                tracing::warn!(target: "longshore::vision", error = %source, sample.index = index, batch.seq = seq, "skipping a sample that failed to decode");
                self.stats.skipped += 1;
                Ok(())
            }
            _ => Err(LoaderError::Sample {
                index,
                batch: seq,
                source,
            }),
        }
    }
}

impl Drop for NvjpegDecoder {
    fn drop(&mut self) {
        // The states and the kept host bytes may still be used by work in flight.
        if let Err(e) = self.stream.synchronize() {
            tracing::error!(target: "longshore::vision", error = %e, "synchronising the nvjpeg stream");
        }
        self.sync_slots();
    }
}
