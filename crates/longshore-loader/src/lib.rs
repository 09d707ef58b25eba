//! The multi-worker DataLoader of longshore: PyTorch's `DataLoader` options and semantics,
//! with worker threads that collate batches straight into pooled page-locked memory.
//!
//! ```
//! use longshore_data::VecDataset;
//! use longshore_loader::DataLoader;
//!
//! let samples: Vec<([f32; 3], i64)> = (0..100).map(|i| ([i as f32; 3], i % 10)).collect();
//! let loader = DataLoader::builder(VecDataset::new(samples))
//!     .batch_size(16)
//!     .shuffle(true)
//!     .num_workers(2)
//!     .pin_memory(true) // page-locked when a CUDA driver is present
//!     .seed(42)
//!     .build()?;
//! for epoch in 0..2 {
//!     for batch in &loader {
//!         let batch = batch?;
//!         let x = batch.tensor::<f32>(0)?; // [batch, 3], in one pooled buffer
//!         let y = batch.tensor::<i64>(1)?;
//!         assert_eq!(x.len(), 3 * y.len());
//!     }
//!     let _ = epoch;
//! }
//! assert!(loader.stats().wait_fraction() <= 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Map
//!
//! * [`DataLoader`], built by [`DataLoaderBuilder`] (PyTorch's option names), iterated by
//!   [`LoaderIter`]; [`LoaderConfig`] holds the options and what they became on this machine
//!   ([`LoaderWarning`]s included).
//! * [`StackLoader`], [`MapLoader`], [`DirectLoader`], [`IterableLoader`],
//!   [`UnbatchedLoader`]: a loader's type in one name, to return it from a function;
//!   [`BoxedLoader`] (`build_boxed`): one type for loaders of any dataset.
//! * [`IntoCollate`]: what `.collate(..)` accepts (a `Collate` of the items, or a
//!   `DatasetCollate` of the dataset).
//! * [`SampleErrorPolicy`], [`WorkerPanicPolicy`]: what faults do.
//! * [`LoaderState`]: `state_dict()` / `load_state_dict()` for mid-epoch resume, iterable
//!   datasets included: the loader lays out their epochs with its batch size, `drop_last` and
//!   workers ([`IterableDataset::begin_epoch`](longshore_data::IterableDataset::begin_epoch))
//!   and keeps their position in [`StreamState`] (or resumes by replay when they have none).
//! * [`Placement`], [`WorkerPriority`], [`WorkerPlacement`]: workers on the CPUs nearest
//!   the GPU (on by default where the host has several NUMA nodes) and their scheduling class.
//! * [`LoaderStats`]: who is the bottleneck (`wait_fraction`); [`Tuner`] picks `num_workers`
//!   and `pin_memory` by measuring.
//! * [`DataLoaderBuilder::prefetch_next_epoch`]: with persistent workers, the next epoch's
//!   first batches load while the current epoch drains (same batches, discarded if the next
//!   epoch is not the one predicted).
//! * [`DataLoader::to_device`]: batches on a device, copied while the model computes
//!   ([`DeviceBatch`]); [`DataLoader::with_stage`] with any [`DeviceStage`] (nvJPEG decoding,
//!   your own kernel) gives a [`DeviceLoader`]: one delivery pipeline (depth, lanes, order,
//!   resume marks, [`DeviceStats`]) whatever turns host batches into device batches;
//!   `DataLoader::stream`: an epoch as an executor-agnostic `futures_core::Stream`
//!   ([`LoaderStream`], feature `stream`, on by default).
//! * [`LoaderError`]: every error names its worker, batch or sample; its `Display` says what
//!   failed and `source()` gives the cause, so an error chain prints each cause once.
//!
//! # Features
//!
//! * `cuda` (default): the CUDA backend of the layers below (loaded at run time).
//! * `stream` (default): `DataLoader::stream` and [`LoaderStream`]. It works with any
//!   executor (tokio's `sync` channel is used without its runtime).
//!
//! # Logging
//!
//! Events use the target `"longshore::loader"`. At `warn`: each [`LoaderWarning`] once when
//! a loader is built, skipped samples, workers detached at shutdown. At `error`: worker
//! panics and the error that ended an epoch.
#![forbid(unsafe_code)]

// Module layers: imports point down this list, never up (no cycles).
//   error, sync, state, prepare
//   engine, placement
//   options (LoaderOptions and the policies: plain values)
//   config, stats, next_epoch
//   fetch, boxed, worker
//   shared (what a loader's clones and iterators share)
//   iter (an epoch), collate
//   loader (DataLoader), builder
//   device (DeviceStage, DeviceLoader), stream, tuner, dist

#[allow(private_interfaces)]
mod boxed;
mod builder;
mod collate;
mod config;
mod device;
pub mod dist;
mod engine;
mod error;
// The sealed worker-side trait names crate-private task types on purpose: it cannot be
// implemented or called outside this crate.
#[allow(private_interfaces)]
mod fetch;
mod iter;
mod loader;
mod next_epoch;
mod options;
mod placement;
mod prepare;
mod shared;
mod state;
mod stats;
#[cfg(feature = "stream")]
mod stream;
mod sync;
mod tuner;
mod worker;

pub use boxed::BoxedFetch;
pub use builder::DataLoaderBuilder;
pub use collate::{ByDataset, ByItems, ByStream, IntoCollate, IterableSource};
pub use config::{LoaderConfig, LoaderWarning};
pub use device::{
    DeviceBatch, DeviceIter, DeviceLoader, DevicePart, DeviceStage, DeviceStats, DeviceWindow,
    StageContext, Upload,
};
pub use error::LoaderError;
pub use fetch::{Fetch, ItemFetch, IterableFetch, MapFetch};
pub use iter::LoaderIter;
pub use loader::{
    BoxedLoader, DataLoader, DirectLoader, IterableLoader, MapLoader, StackLoader, UnbatchedLoader,
};
pub use longshore_data::seed::worker_seed;
pub use options::{LoaderOptions, SampleErrorPolicy, WorkerPanicPolicy};
pub use placement::{BACKGROUND_NICE, Placement, WorkerPlacement, WorkerPriority};
pub use state::{LoaderState, StreamState};
pub use stats::LoaderStats;
#[cfg(feature = "stream")]
pub use stream::LoaderStream;
pub use tuner::{Trial, TuneReport, Tuner};
