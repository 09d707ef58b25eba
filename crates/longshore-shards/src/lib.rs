//! Sharded datasets streamed from object storage: WebDataset, MDS and Parquet shards read from S3
//! (and S3-compatible stores), GCS, Azure, HTTP or local files, in a global sample order that
//! is a pure function of (seed, epoch, shard list), equal per rank and exactly resumable.
//!
//! ```
//! use longshore_data::{IterableDataset, WorkerInfo};
//! use longshore_shards::dataset::ShardedDataset;
//! use longshore_shards::webdataset::ShardWriter;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let mut writer = ShardWriter::new(dir.path(), 1 << 20)?;
//! for i in 0..10 {
//!     writer.write(&format!("{i:03}"), &[("txt", format!("sample {i}").as_bytes())])?;
//! }
//! writer.finish()?;
//! // Or "s3://bucket/train/shard-{000000..000099}.tar", "gs://...", "https://...".
//! let url = format!("{}/shard-000000.tar", dir.path().display());
//! let dataset = ShardedDataset::webdataset([url])
//!     .rank(1)
//!     .world_size(2)
//!     .cache_dir(dir.path().join("cache"))
//!     .build()?;
//! let mine: Vec<String> = dataset
//!     .iter(WorkerInfo::single(0)) // as a loader worker calls it
//!     .map(|s| Ok(s?.sample.text("txt")?.to_owned()))
//!     .collect::<Result<_, Box<dyn std::error::Error>>>()?;
//! assert_eq!(mine.len(), 5); // half of the epoch, in the shuffled global order
//! # Ok(())
//! # }
//! ```
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
//! - [`parquet`]: Parquet files as shards, a row per sample (Hugging Face datasets' format).
//! - [`dataset`]: [`ShardedDataset`](dataset::ShardedDataset), the loader's iterable dataset
//!   over shards in object storage: resolved once per job, read through the cache, exactly
//!   resumable.
//! - [`ShardError`]: the crate's errors.
#![forbid(unsafe_code)]

pub mod cache;
pub mod dataset;
mod error;
pub mod mds;
pub mod order;
pub mod parquet;
pub mod store;
pub mod url;
pub mod webdataset;

pub use error::ShardError;
