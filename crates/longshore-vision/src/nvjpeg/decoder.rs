//! [`NvjpegDecoder`]: the device stage. Per host batch of [`EncodedCollate`](super::EncodedCollate):
//! route each sample (hardware batched decode, the default backend per image, or the CPU
//! decoder), decode into one device buffer, then one kernel crops, resizes and normalises
//! into a `[B, 3, H, W]` batch. The host batch (a pinned lease) is released to its pool only
//! after the event that ends the batch's work, since nvJPEG reads the bitstreams from it.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use longshore_data::{Batch, DType, DataError, Storage};
use longshore_host::HostMemory;
use longshore_loader::{LoaderError, SampleErrorPolicy};
use longshore_transfer::{Device, DeviceId, Event, Prefetched, Stream, TransferError};

use super::batch::{Backend, DecodedBy, NvjpegBatch, NvjpegStats};
use super::encoded::{EncodedEntry, EncodedImages, Payload, check_limit, entries};
use super::ffi::{self, Image, NvHandle, NvState};
use super::kernel::{Kernel, PARAMS, context};
use crate::compose::{Compose, Output};
use crate::decode::{DecodeOptions, decode_rgb};
use crate::folder::{ImageFolder, invalid};

/// The nvJPEG handles of a device, made once ([`Device::local`]).
struct Handles {
    default: Arc<NvHandle>,
    hardware: Result<Arc<NvHandle>, String>,
}

/// The per-batch state a decoder cycles through: one is reused only after the event of the
/// batch that last used it.
struct Slot {
    default: NvState,
    hardware: Option<NvState>,
    last: Option<Event>,
    /// Host bytes the batch's copies read (CPU-decoded pixels, params, labels).
    keep: Vec<Vec<u8>>,
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
    route: Route,
    /// Offset of the decoded pixels in the decode buffer.
    at: usize,
    dropped: bool,
}

/// Decodes host batches of [`EncodedCollate`](super::EncodedCollate) on a CUDA device; see the
/// [module docs](super).
pub struct NvjpegDecoder {
    device: Device,
    stream: Stream,
    folder: ImageFolder,
    transform: Arc<Compose>,
    options: DecodeOptions,
    backend: Backend,
    on_error: SampleErrorPolicy,
    kernel: Arc<Kernel>,
    handles: Arc<Handles>,
    slots: Vec<Slot>,
    next: usize,
    stats: NvjpegStats,
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

/// Whether a JPEG's end-of-image marker is within its last KiB (a truncated file is decoded on
/// the CPU, which reports it as PIL does, instead of by an engine that may not notice).
fn has_eoi(data: &[u8]) -> bool {
    let tail = &data[data.len().saturating_sub(1024)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

const ALIGN: usize = 256;

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
        let stream = device.new_stream()?;
        let mut decoder = NvjpegDecoder {
            device: device.clone(),
            stream,
            folder: images.folder().clone(),
            transform: Arc::new(images.transform().clone()),
            options: *images.folder().decode(),
            backend,
            on_error: SampleErrorPolicy::FailBatch,
            kernel,
            handles,
            slots: Vec::new(),
            next: 0,
            stats: NvjpegStats::default(),
        };
        decoder.set_depth(2)?;
        if let Ok(v) = ffi::version() {
            tracing::debug!(target: "longshore::vision", device = %id, nvjpeg.version = ?v, hardware = decoder.uses_hardware(), "nvjpeg decoder ready");
        }
        Ok(decoder)
    }

    /// Another decoder sharing this one's nvJPEG handles and compiled kernel, with its own
    /// stream, decoding states (as many as this one's) and counts: a lane of a parallel device
    /// stage ([`NvjpegIter::with_lanes`](super::NvjpegIter::with_lanes)). nvJPEG's handles are
    /// thread-safe and its states are not, so each lane has its own states and may run on
    /// its own thread.
    ///
    /// # Errors
    /// Driver or nvJPEG errors creating the stream or the states.
    pub fn lane(&self) -> Result<NvjpegDecoder, TransferError> {
        let mut lane = NvjpegDecoder {
            device: self.device.clone(),
            stream: self.device.new_stream()?,
            folder: self.folder.clone(),
            transform: self.transform.clone(),
            options: self.options,
            backend: self.backend,
            on_error: self.on_error,
            kernel: self.kernel.clone(),
            handles: self.handles.clone(),
            slots: Vec::new(),
            next: 0,
            stats: NvjpegStats::default(),
        };
        lane.set_depth(self.slots.len().saturating_sub(1))?;
        Ok(lane)
    }

    /// Makes the device's context current on the calling thread (nvJPEG's calls use the
    /// thread's current context; a lane thread starts with none).
    pub(crate) fn bind(&self) -> Result<(), TransferError> {
        let ctx = context(&self.device)?;
        ctx.bind_to_thread().map_err(|e| TransferError::Cuda {
            call: "cuCtxSetCurrent",
            code: format!("{:?}", e.0),
            device: self.device.id(),
            what: "making the context current for an nvjpeg lane".into(),
        })
    }

    /// Adds `other`'s counts and times to this decoder's (a lane's, at the end of an epoch).
    pub(crate) fn absorb_stats(&mut self, other: &NvjpegStats) {
        self.stats += other;
    }

    /// What a sample that fails to decode in the device stage does (as the loader's
    /// `on_sample_error`): fail the batch (default) or drop the sample.
    pub fn on_sample_error(mut self, policy: SampleErrorPolicy) -> NvjpegDecoder {
        self.on_error = policy;
        self
    }

    /// Makes `depth + 1` decoding states, so `depth` batches can be in flight.
    pub(crate) fn set_depth(&mut self, depth: usize) -> Result<(), TransferError> {
        self.sync_slots();
        self.slots.clear();
        let id = self.device.id();
        let use_hw = self.uses_hardware();
        for _ in 0..depth.max(1) + 1 {
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
                last: None,
                keep: Vec::new(),
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

    /// The counts so far.
    pub fn stats(&self) -> NvjpegStats {
        self.stats
    }

    fn path(&self, index: usize) -> std::path::PathBuf {
        self.folder
            .samples()
            .get(index)
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
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
    ) -> Result<Option<Prefetched<NvjpegBatch>>, LoaderError> {
        let slot_i = self.next;
        self.next = (self.next + 1) % self.slots.len();
        if let Some(ev) = self.slots[slot_i].last.take() {
            let t = Instant::now();
            ev.synchronize()?;
            self.stats.slot_wait_time += t.elapsed();
        }
        self.slots[slot_i].keep.clear();
        let (rows, bytes) = entries(&batch)?;
        let t_route = Instant::now();
        let mut items = Vec::with_capacity(rows.len());
        for e in rows {
            let data = &bytes[e.offset..e.offset + e.len];
            let route = match e.payload {
                Payload::Rgb => Some(Route::HostRgb),
                Payload::Jpeg => self.route_jpeg(slot_i, data, &e),
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
                route,
                at: 0,
                dropped: false,
            });
        }
        self.stats.route_time += t_route.elapsed();
        if items.is_empty() {
            return Ok(None);
        }
        let t_enqueue = Instant::now();
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
        let mut decoded = stream.alloc(total.max(1))?;
        let mut out = stream.alloc(n * out_bytes)?;
        let mut params_buf = stream.alloc(n * PARAMS * 8)?;
        let mut labels_buf = stream.alloc(n * 8)?;
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
        let (_, mut storage) = batch.into_parts();
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                // Whatever was enqueued may still read the host batch: keep it until then.
                if let Ok(ev) = stream.record() {
                    storage.record_fence(ev.to_fence());
                    self.slots[slot_i].last = Some(ev);
                }
                return Err(e.into());
            }
        };
        storage.record_fence(ev.to_fence());
        drop(storage);
        self.stats.enqueue_time += t_enqueue.elapsed();
        self.slots[slot_i].last = Some(ev.clone());
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
        };
        let batch = NvjpegBatch {
            images: out,
            labels: labels_buf,
            shape,
            dtype,
            indices: kept.iter().map(|i| i.entry.index).collect(),
            host_labels: kept.iter().map(|i| i.entry.label).collect(),
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
        Ok(Some(Prefetched { batch, ready: ev }))
    }

    /// Hardware, default backend, or `None` for the CPU decoder.
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

    /// The work of one batch on the stream (inside `enqueue_work`): uploads, decodes, params,
    /// labels, kernel. A sample error is left in `late`.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        slot_i: usize,
        seq: u64,
        items: &mut [Item],
        bytes: &[u8],
        [dec, out, par, lab]: [u64; 4],
        late: &mut Option<LoaderError>,
    ) -> Result<(), TransferError> {
        let id = self.device.id();
        let raw = self.stream.as_raw()?;
        let cu: cudarc::driver::sys::CUstream = raw.cast();
        let copy = |dst: u64, src: &[u8]| -> Result<(), TransferError> {
            // SAFETY: `dst` is inside an allocation of this context sized for `src` (laid out
            // above); `src` is the host batch or a buffer in `slot.keep`, both kept alive until
            // the batch's event (the lease's fence, the slot's reuse wait).
            unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, cu) }.map_err(|e| {
                TransferError::Cuda {
                    call: "cuMemcpyHtoDAsync",
                    code: format!("{:?}", e.0),
                    device: id,
                    what: "uploading decoded pixels for nvjpeg".into(),
                }
            })
        };
        let range = |e: &EncodedEntry| -> Range<usize> { e.offset..e.offset + e.len };
        // 1. Pixels decoded on the CPU.
        for it in items.iter() {
            match it.route {
                Route::HostRgb => copy(dec + it.at as u64, &bytes[range(&it.entry)])?,
                Route::Kept(k) => copy(dec + it.at as u64, &self.slots[slot_i].keep[k])?,
                _ => {}
            }
        }
        // 2. The hardware batch; if it fails as a whole, its images go per image.
        let hw: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].route == Route::Hardware)
            .collect();
        if !hw.is_empty() {
            let data: Vec<&[u8]> = hw.iter().map(|&i| &bytes[range(&items[i].entry)]).collect();
            let mut images: Vec<Image> = hw
                .iter()
                .map(|&i| {
                    let e = &items[i].entry;
                    Image::planar(dec + items[i].at as u64, e.width * e.height, e.width)
                })
                .collect();
            let state = self.slots[slot_i]
                .hardware
                .as_mut()
                .expect("hardware route needs a hardware state");
            // SAFETY: each image's three planes lie in the decode buffer at its offset (sized
            // 3 * width * height from nvjpegGetImageInfo's dimensions, checked equal to the
            // header's); the bitstreams are in the host batch, alive until the batch's event;
            // `cu` is this stream, current context bound by enqueue_work.
            if let Err(e) = unsafe { state.decode_batched(&data, &mut images, raw) } {
                tracing::debug!(target: "longshore::vision", error = %e, images = hw.len(), "hardware batch failed; decoding per image");
                self.stats.hardware_batch_failures += 1;
                for &i in &hw {
                    items[i].route = Route::Default;
                }
            }
        }
        // 3. The default backend, per image; a refusal goes to the CPU decoder.
        for item in items.iter_mut() {
            if item.route != Route::Default {
                continue;
            }
            let e = item.entry;
            let data = &bytes[range(&e)];
            let mut image = Image::planar(dec + item.at as u64, e.width * e.height, e.width);
            let state = &mut self.slots[slot_i].default;
            // SAFETY: as for the hardware batch, for this one image.
            let r = unsafe { state.decode(data, &mut image, raw) };
            if let Err(err) = r {
                tracing::debug!(target: "longshore::vision", error = %err, sample.index = e.index, "nvjpeg refused an image; decoding it on the cpu");
                match self.cpu_decode(slot_i, data, &e) {
                    Ok(k) => {
                        item.route = Route::Kept(k);
                        copy(dec + item.at as u64, &self.slots[slot_i].keep[k])?;
                    }
                    Err(source) => match self.sample_error(seq, e.index, source) {
                        Ok(()) => item.dropped = true,
                        Err(x) => {
                            *late = Some(x);
                            return Ok(());
                        }
                    },
                }
            }
        }
        // 4. Params and labels of the samples kept, then the kernel.
        let mut params: Vec<i64> = Vec::new();
        let mut labels: Vec<i64> = Vec::new();
        for it in items.iter().filter(|i| !i.dropped) {
            let e = &it.entry;
            let (cs, rs, ps) = match it.route {
                Route::Hardware | Route::Default => {
                    ((e.width * e.height) as i64, e.width as i64, 1)
                }
                _ => (1, (e.width * 3) as i64, 3),
            };
            let p = e.plan;
            let row: [i64; PARAMS] = [
                it.at as i64,
                cs,
                rs,
                ps,
                p.box_x,
                p.box_y,
                p.box_w,
                p.box_h,
                p.resized_w,
                p.resized_h,
                p.view_x,
                p.view_y,
                p.valid_x0,
                p.valid_y0,
                p.valid_x1,
                p.valid_y1,
                i64::from(p.flip),
                0,
                0,
                0,
            ];
            check_plan(&p, e)?;
            params.extend_from_slice(&row);
            labels.push(e.label);
        }
        if labels.is_empty() {
            return Ok(());
        }
        let keep = &mut self.slots[slot_i].keep;
        keep.push(bytemuck::cast_slice(&params).to_vec());
        keep.push(bytemuck::cast_slice(&labels).to_vec());
        let (pk, lk) = (keep.len() - 2, keep.len() - 1);
        copy(par, &self.slots[slot_i].keep[pk])?;
        copy(lab, &self.slots[slot_i].keep[lk])?;
        let (kind, affine) = match self.transform.output() {
            Output::Normalized(n) => (0, n.affine()),
            Output::U8Chw => (1, [(1.0, 0.0); 3]),
            Output::U8Hwc => (2, [(1.0, 0.0); 3]),
        };
        let (oh, ow) = self.transform.output_size();
        // SAFETY: `out` holds items.len() >= labels.len() images of the output kind; `par`
        // holds labels.len() * PARAMS i64 copied just before on this stream; every box lies
        // inside its image (check_plan) and each image's pixels lie in `dec` at its offset
        // with the strides given; all are allocations of this context, alive until the
        // batch's event; the context is current (enqueue_work).
        unsafe {
            self.kernel.launch(
                &self.stream,
                out,
                dec,
                par,
                labels.len(),
                (ow, oh),
                kind,
                affine,
            )
        }
    }
}

/// The kernel reads `box` of a `width x height` image: refuse a plan that would read outside.
fn check_plan(p: &super::SamplePlan, e: &EncodedEntry) -> Result<(), TransferError> {
    let (w, h) = (e.width as i64, e.height as i64);
    let ok = p.box_x >= 0
        && p.box_y >= 0
        && p.box_w > 0
        && p.box_h > 0
        && p.box_x + p.box_w <= w
        && p.box_y + p.box_h <= h
        && p.resized_w > 0
        && p.resized_h > 0;
    if ok {
        Ok(())
    } else {
        Err(TransferError::Invalid(format!(
            "nvjpeg: sample {} has a crop box {:?} outside its {w}x{h} image",
            e.index, p
        )))
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
