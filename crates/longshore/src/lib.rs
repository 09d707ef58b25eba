//! longshore: a data loader that keeps GPUs fed — PyTorch's `DataLoader(pin_memory=True)` and
//! `.to(device, non_blocking=True)` rebuilt in Rust, with the sharp edges removed by types.
//!
//! A training loop, on the GPU when one is present and on the CPU otherwise:
//!
//! ```
//! use longshore::prelude::*;
//!
//! let samples: Vec<([f32; 8], i64)> = (0..256).map(|i| ([i as f32; 8], i % 4)).collect();
//! let loader = DataLoader::builder(VecDataset::new(samples))
//!     .batch_size(32).shuffle(true).num_workers(2).pin_memory(true).seed(0).build()?;
//! let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
//! let compute = device.new_stream()?;
//! for epoch in 0..2 {
//!     for batch in loader.to_device(&device, 2)? {
//!         let batch = batch?.wait_on(&compute)?; // the compute stream waits, the host does not
//!         assert_eq!(batch.shape(0)?, &[32, 8]); // features: [batch, 8] f32, on `device`
//!     }
//!     println!("epoch {epoch}: waited {:.1}% for data", 100.0 * loader.stats().wait_fraction());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The user guide, the architecture notes and the README are in the repository's `docs/`
//! folder; their examples are compiled and run as doctests by the (unpublished)
//! `longshore-examples` crate.
//!
//! # Layers
//!
//! * [`host`]: host memory — [`HostBuffer`](host::HostBuffer) knows whether it is pageable
//!   or page-locked; [`PinnedPool`](host::PinnedPool) caches page-locked blocks under a budget.
//! * [`transfer`]: devices, streams, events, asynchronous copies, the prefetcher.
//! * [`data`]: datasets, samplers with PyTorch's semantics, collation, memory-mapped files.
//! * [`loader`]: the multi-worker [`DataLoader`](loader::DataLoader).
//! * [`dlpack`]: batches handed to other frameworks (PyTorch, NumPy, JAX, CuPy, candle) as
//!   DLPack 1.x tensors, zero-copy, with their streams ordered after the copies.
//! * `vision` (feature `vision`, default): torchvision for longshore — `ImageFolder`, JPEG and
//!   PNG decoding, `RandomResizedCrop` / `Resize` / `CenterCrop` with torchvision's semantics,
//!   written straight into the batch buffer.
//! * `shards` (feature `shards`): WebDataset, MDS and Parquet shards in object storage as an
//!   iterable dataset — URL patterns resolved once per job, a node-wide shard cache, a global
//!   order split equally over ranks and workers, elastic resume.
//!
//! # Features
//!
//! * `cuda` (default): the CUDA backend in every layer. The driver is loaded at run time, so
//!   this builds and runs on machines without CUDA; `Device::cuda` then returns an error.
//! * `stream` (default): `DataLoader::stream`, an epoch as an async `futures_core::Stream`
//!   for any executor.
//! * `vision` (default): `longshore::vision`, the image pipeline (JPEGs by libjpeg-turbo,
//!   built from source and linked statically by longshore-jpeg, only the crop's region when a
//!   pipeline starts with one; PNGs by zune-png; resizing by fast_image_resize).
//! * `shards`: `longshore::shards`, datasets in object storage (S3 and S3-compatible stores,
//!   GCS, Azure, HTTP, local files, through `object_store`); with `vision`,
//!   `vision::shards::ImageShards` decodes image shards with the vision pipelines, and with
//!   `nvjpeg`, `nvjpeg::EncodedShards` decodes them on the GPU.
#![forbid(unsafe_code)]

#[doc(inline)]
pub use longshore_data as data;
#[doc(inline)]
pub use longshore_dlpack as dlpack;
#[doc(inline)]
pub use longshore_host as host;
#[doc(inline)]
pub use longshore_loader as loader;
#[cfg(feature = "nvjpeg")]
#[doc(inline)]
pub use longshore_nvjpeg as nvjpeg;
#[cfg(feature = "shards")]
#[doc(inline)]
pub use longshore_shards as shards;
#[cfg(feature = "vision")]
#[doc(inline)]
pub use longshore_vision as vision;

#[doc(inline)]
pub use longshore_transfer as transfer;

/// What a training loop needs, in one import.
pub mod prelude {
    pub use longshore_data::{
        Batch, BatchSampler, BatchSampling, Collate, DataError, Dataset, DatasetCollate,
        DatasetExt, DirectCollate, DistributedSampler, IterableDataset, PadCollate, RandomSampler,
        Sample, Sampler, SequentialSampler, StackCollate, VecDataset, WorkerInfo,
    };
    pub use longshore_host::{BudgetPolicy, HostBuffer, MemoryKind, PinnedPool, PoolConfig};
    pub use longshore_loader::{
        DataLoader, DeviceBatch, DeviceLoader, DeviceStage, DirectLoader, IterableLoader,
        LoaderConfig, LoaderError, LoaderState, LoaderStats, LoaderWarning, MapLoader, StackLoader,
        UnbatchedLoader, Upload,
    };
    pub use longshore_transfer::{Device, DeviceBuffer, Event, Pending, Stream};
}
