//! Sharded datasets streamed from object storage: WebDataset and MDS shards read from S3
//! (and S3-compatible stores), GCS, Azure, HTTP or local files, in a global sample order that
//! is a pure function of (seed, epoch, shard list), equal per rank and exactly resumable.
//!
//! Map of the crate:
//!
//! - [`url`]: shard URLs as users write them (`s3://bucket/train-{000000..000999}.tar`).
//! - [`store`]: the object stores behind those URLs (`object_store`), and a fault-injecting
//!   wrapper for tests.
//! - [`cache`]: the node's shard cache (byte budget, eviction, crash-safe downloads).
//! - [`order`]: the global sample order, its partition over ranks and workers, and resume.
//! - [`webdataset`]: WebDataset tar shards (reader and writer).
//! - [`mds`]: MosaicML MDS shards (reader, and a writer byte-identical to Streaming's).
//! - [`dataset`]: [`ShardedDataset`](dataset::ShardedDataset), the loader's iterable dataset
//!   over shards in object storage: resolved once per job, read through the cache, exactly
//!   resumable.
//! - [`vision`] (feature `vision`): WebDataset image shards decoded and transformed by
//!   longshore-vision into the `(image, label)` samples of its `ImageFolder`.
//! - [`error`]: the crate's errors.
#![forbid(unsafe_code)]

pub mod cache;
pub mod dataset;
pub mod error;
pub mod mds;
pub mod order;
pub mod store;
pub mod url;
#[cfg(feature = "vision")]
pub mod vision;
pub mod webdataset;

pub use error::ShardError;
