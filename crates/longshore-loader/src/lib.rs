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
//!   [`LoaderIter`]; [`LoaderConfig`] holds the options.
//! * [`SampleErrorPolicy`], [`WorkerPanicPolicy`]: what faults do.
//! * [`LoaderState`]: `state_dict()` / `load_state_dict()` for mid-epoch resume.
//! * [`LoaderStats`]: who is the bottleneck (`wait_fraction`); [`Tuner`] picks `num_workers`
//!   and `pin_memory` by measuring.
//! * [`DataLoader::to_device`]: batches on a device through the prefetcher ([`DeviceBatch`]);
//!   [`DataLoader::stream`]: an async stream (feature `tokio`, on by default).
//! * [`LoaderError`]: every error names its worker, batch or sample.
#![forbid(unsafe_code)]

mod config;
mod device;
pub mod dist;
mod engine;
mod error;
// The sealed worker-side trait names crate-private task types on purpose: it cannot be
// implemented or called outside this crate.
#[allow(private_interfaces)]
mod fetch;
mod loader;
mod state;
mod stats;
#[cfg(feature = "tokio")]
mod stream;
mod tuner;

pub use config::{LoaderConfig, SampleErrorPolicy, WorkerPanicPolicy};
pub use device::{DeviceBatch, DeviceIter, HostBatch};
pub use error::LoaderError;
pub use fetch::{CollateFetch, Fetch, ItemFetch, IterableFetch};
pub use loader::{
    DataLoader, DataLoaderBuilder, IterableSource, LoaderIter, WorkerInit, worker_seed,
};
pub use state::LoaderState;
pub use stats::LoaderStats;
#[cfg(feature = "tokio")]
pub use stream::LoaderStream;
pub use tuner::{Trial, TuneReport, Tuner};
