//! `longshore-nvjpeg` decodes JPEG folders on the GPU with nvJPEG, as a device stage of the
//! loader: the workers only read files into page-locked memory, and the stage decodes, crops,
//! resizes and normalises on the device.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use longshore_loader::DataLoader;
//! use longshore_transfer::Device;
//! use longshore_nvjpeg::{EncodedCollate, EncodedImages, NvjpegDecoder};
//! use longshore_vision::{Compose, ImageFolder};
//!
//! let device = Device::cuda(0)?;
//! let files = EncodedImages::new(ImageFolder::new("/data/imagenet/train")?.with_transform(Compose::imagenet_train()))?;
//! let decoder = NvjpegDecoder::new(&device, &files)?; // loads libnvjpeg and NVRTC
//! let loader = DataLoader::builder(files)
//!     .batch_size(256)
//!     .num_workers(8)
//!     .pin_memory(true)
//!     .shuffle(true)
//!     .collate(EncodedCollate)
//!     .build()?;
//! let compute = device.new_stream()?;
//! let on_gpu = loader.with_stage(decoder).depth(2); // the decoder is kept across epochs
//! for batch in on_gpu.iter()? {
//!     let batch = batch?.wait_on(&compute)?; // [256, 3, 224, 224] f32 on the GPU
//!     assert_eq!(batch.shape(0)?, [256, 3, 224, 224]);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Image shards in object storage (feature `shards`) attach the same way:
//! `EncodedShards::new(image_shards)?`, its `decoder(&device)`, then
//! `DataLoader::iterable(encoded).collate(EncodedCollate)` and `.with_stage(decoder)`. Both
//! datasets' items are [`PlannedSample`]s (an image read, its header checked and its crop
//! drawn by the worker), which [`EncodedCollate`] batches.
//!
//! # The stages
//!
//! 1. **Workers** ([`EncodedImages`] + [`EncodedCollate`]): read each file, parse its header
//!    (format, dimensions, the pixel limit), draw its crop box and flip with the same
//!    generator and the same calls as the CPU [`Compose`](longshore_vision::Compose) ([`plan`]), and
//!    write the bytes, one metadata row and the label into the batch's page-locked buffer.
//!    A file that is not a JPEG (PNG), or a JPEG the hardware engines do not take
//!    (progressive, arithmetic, lossless: about 5% of ImageNet, which nvJPEG's default
//!    backend would decode with a CPU Huffman pass on the device stage's one thread), is
//!    decoded there, on the CPU, in parallel workers, and travels as pixels; so does a chosen
//!    share of the JPEGs the engines would take ([`EncodedImages::cpu_share`]), when the
//!    engines are the bound and the host has idle cores. A
//!    file whose header does not parse is a `DataError` naming it, and the loader's
//!    `on_sample_error` applies as on the CPU path.
//! 2. **Device stage** ([`NvjpegDecoder`], on its own stream; a [`DeviceStage`](longshore_loader::DeviceStage):
//!    `loader.with_stage(decoder)` drives it like `to_device`): JPEGs the hardware engines support
//!    (`nvjpegDecodeBatchedSupported`) are decoded in one `nvjpegDecodeBatched` call with
//!    `NVJPEG_BACKEND_HARDWARE` (A100, H100, H200); the rest by the default backend, one
//!    `nvjpegDecode` per image; planar RGB into one device buffer. A JPEG nvJPEG refuses,
//!    or one without its end-of-image marker (truncated), is decoded by the CPU decoder
//!    instead, and if that fails too it is a `LoaderError::Sample` naming the file, or
//!    dropped under `SampleErrorPolicy::Skip`.
//! 3. **One kernel** ([NVRTC](https://docs.nvidia.com/cuda/nvrtc/), compiled once per process)
//!    writes the `[B, 3, H, W]` f32 batch (or u8 CHW / HWC, as the pipeline's
//!    [`Output`](longshore_vision::Output)): per output pixel, PIL's antialiased bilinear filter over the
//!    crop box (torchvision's default `Resize`/`RandomResizedCrop` interpolation; plain
//!    bilinear when upscaling, as PIL), vertical pass then horizontal, each rounded to 8 bits
//!    as the CPU path's fast_image_resize does, then `Normalize`. [`render_reference`] is the same arithmetic on the CPU.
//!
//! The host batch (a pool lease) is handed back to its pool only after the event that ends
//! the batch's work on the stream, since nvJPEG reads the bitstreams from it; each device
//! batch ([`DeviceBatch`](longshore_loader::DeviceBatch): `"image"` and `"label"` tensors, with
//! [`NvjpegInfo`] attached) comes with that event.
//!
//! # How close to the CPU path
//!
//! The geometry is exact: same boxes, same flips, same output sizes, for a given seed and
//! [`RandomSource`](longshore_vision::RandomSource). The resampling is the CPU path's filter in `f32`
//! instead of 16-bit fixed point: on the same decoded pixels the outputs differ by at most 1
//! level, on about 1 value in 150, and by 2 at most (rarely) where the CPU path fuses Resize +
//! CenterCrop into one resize of the crop's source box (`tests/nvjpeg_plan.rs` checks this on
//! the CPU with [`render_reference`]). The decoded pixels are nvJPEG's, not libjpeg-turbo's
//! (the CPU path's, PIL's): IDCT and chroma upsampling differ slightly (chroma interpolation
//! is requested with `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` where the library knows it),
//! so expect mean absolute differences around 1 on 0..255 and maxima of a few levels at sharp
//! colour edges; `tests/nvjpeg_decode.rs` measures both on the GPU.
//!
//! # Libraries
//!
//! libnvjpeg ([`NVJPEG`]: `libnvjpeg.so.13`, `.12`, `.11`; the CUDA toolkit's `lib64`, the
//! `nvidia/nvjpeg/lib` folder of the `nvidia-nvjpeg-cu12` pip package) and NVRTC are loaded
//! at run time by [`longshore_transfer::cuda_libs`]; when one is missing the decoder's
//! constructor fails with `TransferError::LibraryUnavailable` naming every place searched, and
//! the CPU pipeline ([`ImageDataset`](longshore_vision::ImageDataset)) still works.

// Unsafe code only in the FFI modules (libnvjpeg, NVRTC, kernel launches), each block with
// its SAFETY comment.
#![deny(unsafe_code)]

mod encoded;
pub mod header;
pub mod plan;

mod batch;
#[allow(unsafe_code)]
mod decoder;
#[allow(unsafe_code)]
mod ffi;
#[cfg(feature = "shards")]
mod fields;
#[allow(unsafe_code)]
mod kernel;
#[cfg(feature = "shards")]
mod shards;
mod stage;

pub use batch::{Backend, DecodedBy, NvjpegInfo, NvjpegStats};
#[cfg(feature = "ceiling")]
pub use decoder::{CeilingRun, CeilingStage};
pub use decoder::{NvjpegDecoder, SampleNames};
pub use encoded::{
    BYTES, EncodedCollate, EncodedEntry, EncodedImages, EncodedSample, LABEL, META, META_FIELDS,
    Payload, PlannedSample, entries,
};
pub use ffi::NVJPEG;
#[cfg(feature = "shards")]
pub use fields::{EncodedFields, EncodedRecord, FieldsCollate};
pub use header::{JpegHeader, JpegRoute};
pub use plan::{SamplePlan, check_steps, render_reference};
#[cfg(feature = "shards")]
pub use shards::EncodedShards;

/// The name of the images tensor of the device batches (`[B, 3, H, W]` or `[B, H, W, 3]`).
pub const IMAGE: &str = "image";
/// The name of the labels tensor of the device batches (i64 `[B]`).
pub const LABEL_NAME: &str = "label";

/// Whether libnvjpeg can be loaded (the error names every place searched).
pub fn available() -> Result<(), String> {
    ffi::available()
}
