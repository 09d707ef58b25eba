//! `longshore-vision` is longshore's torchvision: [`ImageFolder`] datasets, JPEG and PNG
//! decoding, and torchvision's transforms with its semantics, written straight into the
//! slots of (page-locked) batch buffers.
//!
//! ```
//! use longshore_data::{Dataset, DirectCollate, DatasetCollate, AlignedBuf};
//! use longshore_vision::{Compose, ImageFolder};
//!
//! # #[cfg(feature = "synth")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # longshore_vision::synth::write_folder(dir.path(), &longshore_vision::synth::FolderSpec::tiny())?;
//! // torchvision: ImageFolder(root, transform=Compose([RandomResizedCrop(224),
//! //     RandomHorizontalFlip(), ToTensor(), Normalize(mean, std)]))
//! let train = ImageFolder::new(dir.path())?.with_transform(Compose::imagenet_train());
//! assert_eq!(train.folder().classes().len(), 4);
//!
//! // What the loader does for each batch: decode + transform straight into the buffer.
//! let collate = DirectCollate::new().with_names(["image", "label"]);
//! let staged = collate.stage(&train, &[0, 1, 2])?;
//! let buffer = AlignedBuf::zeroed(staged.layout().total_bytes());
//! let batch = collate.write(&train, staged, buffer)?;
//! assert_eq!(batch.shape(0)?, &[3, 3, 224, 224]);
//! assert_eq!(batch.tensor_by_name::<i64>("label")?.len(), 3);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "synth"))]
//! # fn main() {}
//! ```
//!
//! With the loader: `DataLoader::builder(train)`, then `num_workers`, `pin_memory` and the
//! rest as usual (the default collation writes through the dataset's direct plan, as
//! `.collate(DirectCollate::new())` does); a file that fails to decode is a
//! `DataError` naming it, handled by the loader's `on_sample_error` policy.
//!
//! # Map of the crate
//!
//! - [`folder`]: [`ImageFolder`] (torchvision's semantics: sorted classes, `class_to_idx`,
//!   sample order, [`IMG_EXTENSIONS`], `allow_empty`) and
//!   [`ImageFolder::from_samples`].
//! - [`decode`]: [`decode_rgb`](decode::decode_rgb) (JPEG with libjpeg-turbo, PNG with zune-png,
//!   converted to RGB as PIL's `convert("RGB")`), the pixel limit of
//!   [`DecodeOptions`].
//! - [`transforms`]: `RandomResizedCrop`, `Resize`, `CenterCrop`, with torchvision's
//!   parameters and rounding, and longshore-data's `RandomHorizontalFlip` and `Normalize`
//!   (one definition for the `.npy` image path, these pipelines and the device kernels,
//!   which read [`Normalize::affine`](longshore_data::Normalize::affine)).
//! - [`Compose`]: a pipeline with a fixed output size, presets
//!   [`Compose::imagenet_train`] and [`Compose::imagenet_val`] (PyTorch's ImageNet example).
//! - [`plan`]: [`Geometry`], a pipeline's boxes, sizes and flips drawn for one image (the
//!   only place a pipeline draws); the CPU renderer and the nvJPEG device stage both execute it.
//! - [`ImageDataset`]: folder + pipeline, a [`longshore_data::DirectDataset`];
//!   [`RandomSource`] picks the worker's generator or per-sample streams.
//! - `shards` (feature `shards`): image shards in object storage (longshore-shards'
//!   WebDataset and MDS datasets) through these pipelines: `ImageShards` (decoded tensors),
//!   `DeferredShards` with `DecodeCollate` (decoded straight into the batch).
//! - GPU decoding with nvJPEG is the `longshore-nvjpeg` crate, a device stage of the loader.
//! - `synth` (feature `synth`): an ImageNet-like synthetic folder generator (for benchmarks,
//!   examples and tests).
#![forbid(unsafe_code)]

pub mod compose;
pub mod dataset;
pub mod decode;
pub mod folder;
pub mod image;
pub mod plan;
mod render;
mod resize;
#[cfg(feature = "shards")]
pub mod shards;
#[cfg(feature = "synth")]
pub mod synth;
pub mod transforms;

pub use compose::{Compose, Output, Step, apply_steps};
pub use dataset::{ImageDataset, RandomSource, sample_rng};
pub use decode::{DecodeError, DecodeOptions, ImageFormat, PIL_MAX_IMAGE_PIXELS};
pub use folder::{IMG_EXTENSIONS, ImageFolder, ImageFolderOptions};
pub use image::RgbImage;
pub use plan::{Geometry, PlannedStep};
