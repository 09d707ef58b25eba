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
//! * `ops` (feature `ops`): f32 operations on device buffers; `collective` (feature `nccl`):
//!   an all-reduce across ranks. Both build on transfer's public seams.
//! * [`data`]: datasets, samplers with PyTorch's semantics, collation, memory-mapped files.
//! * [`loader`]: the multi-worker [`DataLoader`](loader::DataLoader).
//! * [`dlpack`]: batches handed to other frameworks (PyTorch, NumPy, JAX, CuPy, candle) as
//!   DLPack 1.x tensors, zero-copy, with their streams ordered after the copies.
//! * `vision` (feature `vision`, default): torchvision for longshore — `ImageFolder`, JPEG and
//!   PNG decoding, `RandomResizedCrop` / `Resize` / `CenterCrop` with torchvision's semantics,
//!   written straight into the batch buffer.
//!
//! # Features
//!
//! * `cuda` (default): the CUDA backend in every layer. The driver is loaded at run time, so
//!   this builds and runs on machines without CUDA; `Device::cuda` then returns an error.
//! * `stream` (default): `DataLoader::stream`, an epoch as an async `futures_core::Stream`
//!   for any executor. `tokio` is its old name, kept as an alias feature for one release.
//! * `ops`: `longshore::ops`, safe f32 operations on device buffers (cuBLAS and
//!   NVRTC on CUDA, loaded at run time), enough to train a small model.
//! * `nccl` (implies `ops`): `longshore::collective`, a `Communicator` whose
//!   `all_reduce_sum` adds a buffer across ranks in place: NCCL on CUDA (libnccl loaded at run
//!   time; a missing library is an error naming it), or ranks as threads on the Cpu device
//!   (`CpuGroup`) so data-parallel training is testable without GPUs. Pair it with
//!   `DistributedSampler::from_env` and `longshore::loader::dist::local_device` under torchrun.
//! * `vision` (default): `longshore::vision`, the image pipeline (pure Rust: zune-jpeg,
//!   zune-png, fast_image_resize).
#![forbid(unsafe_code)]

#[cfg(feature = "nccl")]
#[doc(inline)]
pub use longshore_collective as collective;
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
#[cfg(feature = "ops")]
#[doc(inline)]
pub use longshore_ops as ops;
#[cfg(feature = "vision")]
#[doc(inline)]
pub use longshore_vision as vision;

/// Devices, streams, events, device buffers and asynchronous copies: the crate
/// `longshore-transfer`, re-exported whole.
///
/// In 0.1 the device operations and the collectives lived here, as `transfer::ops` and
/// `transfer::collective`; they are now the crates `longshore-ops` and
/// `longshore-collective`, at [`longshore::ops`](crate::ops) and
/// [`longshore::collective`](crate::collective) (features `ops` and `nccl`). The old paths
/// still resolve, deprecated, for one release.
pub mod transfer {
    #[doc(inline)]
    pub use longshore_transfer::*;

    /// Moved: use [`longshore::ops`](crate::ops) (the crate `longshore-ops`).
    #[cfg(feature = "ops")]
    #[deprecated(
        since = "0.2.0",
        note = "moved to `longshore::ops` (the crate longshore-ops)"
    )]
    pub mod ops {
        #[doc(no_inline)]
        pub use longshore_ops::*;
    }

    /// Moved: use [`longshore::collective`](crate::collective) (the crate
    /// `longshore-collective`).
    #[cfg(feature = "nccl")]
    #[deprecated(
        since = "0.2.0",
        note = "moved to `longshore::collective` (the crate longshore-collective)"
    )]
    pub mod collective {
        #[doc(no_inline)]
        pub use longshore_collective::*;
    }
}

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
    pub use longshore_transfer::{Device, DeviceBuffer, Event, Pending, Prefetcher, Stream};
}
