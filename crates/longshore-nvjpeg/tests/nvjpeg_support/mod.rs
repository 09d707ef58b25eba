//! Shared by the nvjpeg test files: GPU 0 or a printed skip (a failure with
//! LONGSHORE_REQUIRE_CUDA=1), a small PNG writer, a folder mixing JPEGs, a PNG and
//! broken JPEGs, and a page-locked host batch of chosen samples as a loader worker writes it.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;

use longshore_data::{Batch, Collate, Dataset};
use longshore_host::{HostBuffer, MemoryKind};
use longshore_nvjpeg::{EncodedCollate, EncodedImages};
use longshore_transfer::Device;
use longshore_vision::synth::{FolderSpec, image_jpeg};

#[path = "../../../longshore-vision/tests/png_support/mod.rs"]
mod png_support;
pub use png_support::png_rgb;

/// `cuda:0`, or `None` (printing why) when no driver or GPU can be used.
pub fn gpu() -> Option<Device> {
    longshore_testing::cuda_or_skip("CUDA test", Device::cuda(0))
}

/// The host batch of `indices` in a page-locked buffer: each sample read and planned (`get`,
/// as a loader worker does), then written by [`EncodedCollate`].
pub fn host_batch(data: &EncodedImages, indices: &[usize]) -> Batch<HostBuffer> {
    let samples: Vec<_> = indices.iter().map(|&i| data.get(i).unwrap()).collect();
    let layout = EncodedCollate.layout(&samples).unwrap();
    let host = HostBuffer::alloc(MemoryKind::PageLocked, layout.total_bytes()).unwrap();
    EncodedCollate.collate_into(&samples, layout, host).unwrap()
}

/// The JPEGs of a small photo-like folder spec (2 classes).
pub fn spec() -> FolderSpec {
    FolderSpec {
        classes: 2,
        per_class: 6,
        mean_area: 60_000.0,
        quality: 90,
        seed: 11,
    }
}

/// Writes class `a` (6 JPEGs) and class `b` (6 JPEGs, then `x_image.png`, and, when `broken`,
/// `w_badheader.jpg`, `y_truncated.jpg` and `z_garbled.jpg`): in `b`, the sorted order is
/// img0..img5, w_badheader, x_image, y_truncated, z_garbled.
pub fn write_mixed(root: &Path, broken: bool) {
    let s = spec();
    for (c, name) in ["a", "b"].iter().enumerate() {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..s.per_class {
            std::fs::write(dir.join(format!("img{i}.jpg")), image_jpeg(&s, c, i)).unwrap();
        }
    }
    let (w, h) = (45, 37);
    let px: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7) % 251) as u8).collect();
    std::fs::write(root.join("b/x_image.png"), png_rgb(w, h, &px)).unwrap();
    if broken {
        let jpeg = image_jpeg(&s, 1, 0);
        std::fs::write(root.join("b/y_truncated.jpg"), &jpeg[..jpeg.len() / 2]).unwrap();
        // The header survives, the entropy-coded data is garbage: only decoding finds out.
        let mut garbled = jpeg.clone();
        let sos = garbled.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        for (k, b) in garbled[sos + 20..].iter_mut().enumerate() {
            *b = if k % 3 == 0 { 0xFF } else { (k % 200) as u8 };
        }
        garbled.extend_from_slice(&[0xFF, 0xD9]);
        std::fs::write(root.join("b/z_garbled.jpg"), garbled).unwrap();
        // A JPEG whose header does not parse: the worker's probe refuses it.
        std::fs::write(
            root.join("b/w_badheader.jpg"),
            b"\xFF\xD8\xFF\xE0 not a jpeg at all",
        )
        .unwrap();
    }
}

/// What the tests read of an nvJPEG device batch: its [`NvjpegInfo`] and its images.
pub trait Decoded {
    fn info(&self) -> &longshore_nvjpeg::NvjpegInfo;
    fn indices(&self) -> &[usize] {
        self.info().indices()
    }
    fn decoded_by(&self) -> &[longshore_nvjpeg::DecodedBy] {
        self.info().decoded_by()
    }
    fn host_labels(&self) -> &[i64] {
        self.info().labels()
    }
    /// The images tensor, copied back to the host.
    fn read_images<T: longshore_data::Element>(
        &self,
        stream: &longshore_transfer::Stream,
    ) -> Result<Vec<T>, longshore_loader::LoaderError>;
}

impl Decoded for longshore_loader::DeviceBatch {
    fn info(&self) -> &longshore_nvjpeg::NvjpegInfo {
        self.extension()
            .expect("an nvjpeg batch carries its NvjpegInfo")
    }
    fn read_images<T: longshore_data::Element>(
        &self,
        stream: &longshore_transfer::Stream,
    ) -> Result<Vec<T>, longshore_loader::LoaderError> {
        let host = self.to_host(stream)?;
        Ok(host.tensor::<T>(0)?.to_vec())
    }
}
