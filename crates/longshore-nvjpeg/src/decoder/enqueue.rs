//! The work of one batch on the decoder's stream: uploads of CPU-decoded pixels, the hardware
//! batched decode (with its fallback), the default backend per image, the kernel's parameters
//! and the kernel. Each phase is one lap of the decoder's clock.

use std::ops::Range;

use longshore_loader::LoaderError;
use longshore_transfer::TransferError;

use super::super::encoded::EncodedEntry;
use super::super::ffi::Image;
use super::super::kernel::PARAMS;
use super::{Item, NvjpegDecoder, Route};
use longshore_vision::compose::Output;

impl NvjpegDecoder {
    /// The work of one batch on the stream (inside `enqueue_work`): uploads, decodes, params,
    /// labels, kernel. A sample error is left in `late`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue(
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
        let copy = |dst: u64, src: &[u8]| htod(cu, id, dst, src);
        let range = |e: &EncodedEntry| -> Range<usize> { e.offset..e.offset + e.len };
        // 1. Pixels decoded on the CPU.
        for it in items.iter() {
            match it.route {
                Route::HostRgb => copy(dec + it.at as u64, &bytes[range(&it.entry)])?,
                Route::Kept(k) => copy(dec + it.at as u64, &self.slots[slot_i].keep[k])?,
                _ => {}
            }
        }
        let lap = self.lap();
        self.stats.upload_time += lap;
        // 2. The hardware batch. If it fails as a whole (the workers' walk let through an
        //    image the engines refuse), its images are routed again one by one with nvJPEG's
        //    checks, and those the engines take are decoded in a second batch.
        let mut hw: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].route == Route::Hardware)
            .collect();
        let mut attempt = 0;
        while !hw.is_empty() {
            let data: Vec<&[u8]> = hw.iter().map(|&i| &bytes[range(&items[i].entry)]).collect();
            let mut images: Vec<Image> = hw
                .iter()
                .map(|&i| {
                    let e = &items[i].entry;
                    Image::planar(dec + items[i].at as u64, e.width * e.height, e.width)
                })
                .collect();
            let Some(state) = self.slots[slot_i].hardware.as_mut() else {
                break;
            };
            // SAFETY: each image's three planes lie in the decode buffer at its offset (sized
            // 3 * width * height from the header's dimensions, which the worker's walk checked
            // against the header decoder's, or nvjpegGetImageInfo's on the checked path); the
            // bitstreams are in the host batch, alive until the batch's event; `raw` is this
            // stream, its context bound by enqueue_work.
            let r = unsafe { state.decode_batched(&data, &mut images, raw) };
            let lap = self.lap();
            self.stats.decode_call_time += lap;
            let Err(e) = r else { break };
            self.stats.hardware_batch_failures += 1;
            attempt += 1;
            tracing::debug!(target: "longshore::vision", error = %e, images = hw.len(), attempt, "hardware batch failed; routing its images one by one");
            if attempt > 1 {
                // The images nvJPEG itself said the engines take failed again: per image.
                for &i in &hw {
                    items[i].route = Route::Default;
                }
                break;
            }
            let mut again = Vec::with_capacity(hw.len());
            for &i in &hw {
                let entry = items[i].entry;
                let data = &bytes[range(&entry)];
                self.stats.checked += 1;
                match self.route_jpeg(slot_i, data, &entry) {
                    Some(Route::Hardware) => again.push(i),
                    Some(r) => items[i].route = r,
                    None => match self.cpu_decode(slot_i, data, &entry) {
                        Ok(k) => {
                            items[i].route = Route::Kept(k);
                            copy(dec + items[i].at as u64, &self.slots[slot_i].keep[k])?;
                        }
                        Err(source) => match self.sample_error(seq, entry.index, source) {
                            Ok(()) => items[i].dropped = true,
                            Err(x) => {
                                *late = Some(x);
                                return Ok(());
                            }
                        },
                    },
                }
            }
            let lap = self.lap();
            self.stats.route_time += lap;
            if again.len() == hw.len() {
                // nvJPEG takes each image alone but not the batch: per image.
                for &i in &again {
                    items[i].route = Route::Default;
                }
                break;
            }
            hw = again;
        }
        // 3. The default backend, per image; a refusal goes to the CPU decoder.
        for item in items.iter_mut() {
            if item.route != Route::Default || item.dropped {
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
        let lap = self.lap();
        self.stats.decode_call_time += lap;
        // 4. Params and labels of the samples kept, through the slot's page-locked staging,
        //    then the kernel.
        let kept = items.iter().filter(|i| !i.dropped).count();
        if kept == 0 {
            return Ok(());
        }
        let staging = self.slots[slot_i]
            .staging
            .as_mut()
            .expect("the caller sized the staging buffer");
        let words: &mut [i64] = staging.as_mut_slice()?;
        let (params, rest) = words.split_at_mut(kept * PARAMS);
        let labels = &mut rest[..kept];
        for (k, it) in items.iter().filter(|i| !i.dropped).enumerate() {
            let e = &it.entry;
            let (cs, rs, ps) = match it.route {
                Route::Hardware | Route::Default => {
                    ((e.width * e.height) as i64, e.width as i64, 1)
                }
                _ => (1, (e.width * 3) as i64, 3),
            };
            let p = e.plan;
            check_plan(&p, e)?;
            params[k * PARAMS..(k + 1) * PARAMS].copy_from_slice(&[
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
            ]);
            labels[k] = e.label;
        }
        let bytes_of = staging.as_bytes();
        copy(par, &bytes_of[..kept * PARAMS * 8])?;
        copy(lab, &bytes_of[kept * PARAMS * 8..kept * (PARAMS + 1) * 8])?;
        let lap = self.lap();
        self.stats.upload_time += lap;
        let (kind, affine) = match self.transform.output() {
            Output::Normalized(n) => (0, n.affine()),
            Output::U8Chw => (1, [(1.0, 0.0); 3]),
            Output::U8Hwc => (2, [(1.0, 0.0); 3]),
            other => {
                return Err(TransferError::Invalid(format!(
                    "the nvjpeg kernel does not write the output {other:?}"
                )));
            }
        };
        let (oh, ow) = self.transform.output_size();
        // SAFETY: `out` holds items.len() >= kept images of the output kind; `par` holds
        // kept * PARAMS i64 copied just before on this stream; every box lies inside its image
        // (check_plan) and each image's pixels lie in `dec` at its offset with the strides
        // given; all are allocations of this context, alive until the batch's event; the
        // context is current (enqueue_work).
        let r = unsafe {
            self.kernel
                .launch(&self.stream, out, dec, par, kept, (ow, oh), kind, affine)
        };
        let lap = self.lap();
        self.stats.kernel_time += lap;
        r
    }
}

/// The kernel reads `box` of a `width x height` image: refuse a plan that would read outside.
fn check_plan(p: &crate::SamplePlan, e: &EncodedEntry) -> Result<(), TransferError> {
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

/// Enqueues the copy of `src` to device address `dst` on stream `cu` (of device `id`).
pub(super) fn htod(
    cu: cudarc::driver::sys::CUstream,
    id: longshore_transfer::DeviceId,
    dst: u64,
    src: &[u8],
) -> Result<(), TransferError> {
    // SAFETY: the callers lay out `dst` inside an allocation of this context sized for `src`;
    // `src` is the host batch, a buffer in `slot.keep` or the slot's page-locked staging, all
    // kept alive and unchanged until the batch's event (the lease's fence, the slot's reuse
    // wait).
    unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, cu) }.map_err(|e| {
        TransferError::Cuda {
            call: "cuMemcpyHtoDAsync",
            code: format!("{:?}", e.0),
            device: id,
            what: "uploading to the nvjpeg stage".into(),
        }
    })
}
