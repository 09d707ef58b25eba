//! `longshore-data` is longshore's data layer: datasets, samplers with PyTorch's
//! semantics, collation straight into caller-provided (page-locked) buffers,
//! memory-mapped `.npy` and record datasets, and image transforms. It knows nothing
//! of CUDA.
//!
//! ```
//! use longshore_data::{
//!     BatchSampler, BatchSampling, Collate, DataError, Dataset, DatasetExt, RandomSampler,
//!     StackCollate, VecDataset,
//! };
//!
//! # fn main() -> Result<(), DataError> {
//! // A map-style dataset of (features, label) samples.
//! let dataset = VecDataset::new((0..10).map(|i| i as f32).collect())
//!     .map(|x: f32| ([x, x * 2.0, x * 3.0], x as i64));
//!
//! // Shuffled, reproducible batches of 4 (PyTorch's RandomSampler + BatchSampler).
//! let mut batches = BatchSampler::new(RandomSampler::new(dataset.len(), 42)?, 4, false)?;
//! batches.set_epoch(1);
//!
//! let collate = StackCollate::new().with_names(["features", "label"]);
//! for indices in batches.iter() {
//!     let samples = indices.iter().map(|&i| dataset.get(i)).collect::<Result<Vec<_>, _>>()?;
//!     // Ask for the size, provide any byte buffer (the loader passes pinned memory),
//!     // and get a typed batch back that owns the buffer.
//!     let layout = collate.layout(&samples)?;
//!     let buffer = longshore_data::AlignedBuf::zeroed(layout.total_bytes());
//!     let batch = collate.collate_into(&samples, layout, buffer)?;
//!     let features: &[f32] = batch.tensor(0)?;
//!     let labels: &[i64] = batch.tensor_by_name("label")?;
//!     assert_eq!(batch.shape(0)?, &[indices.len(), 3]);
//!     assert_eq!(features.len(), 3 * labels.len());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Map of the crate
//!
//! - Datasets ([`dataset`]): [`Dataset`] (map-style), [`IterableDataset`] (streams,
//!   sharded by [`WorkerInfo`], driven by the loader through [`EpochLayout`] and resumed from
//!   a [`StreamPosition`]), [`DirectDataset`] (writes samples straight into a
//!   batch); combinators [`DatasetExt::map`], [`DatasetExt::transform`], [`Subset`],
//!   [`ConcatDataset`], [`Zip`], [`random_split`], [`IterableExt::chain`].
//! - Samplers ([`sampler`]): the [`Sampler`] and [`BatchSampling`] traits with resumable
//!   [`SamplerState`]; [`SequentialSampler`], [`RandomSampler`], [`SubsetRandomSampler`],
//!   [`WeightedRandomSampler`], [`DistributedSampler`], and [`BatchSampler`], the struct
//!   that groups a sampler's indices into batches (PyTorch's `BatchSampler`).
//! - Collation ([`collate`]): [`Collate`] (items to [`Batch`]), [`DatasetCollate`]
//!   (indices to [`Batch`], used by the loader), [`StackCollate`], [`PadCollate`],
//!   [`DirectCollate`], and [`FetchCollate`], the loader's default, which writes straight
//!   from a dataset's [`DirectPlan`] when it has one (so `NpyDataset::open(..)?
//!   .transform(Normalize::imagenet(..))` is as fast as a fused `DirectCollate`); a
//!   [`Batch`] ([`batch`]) is typed tensors in one storage at [`TENSOR_ALIGN`]-aligned
//!   offsets.
//! - Fields ([`field`]): [`FieldSpec`], [`FieldTransform`] (a per-field hook such as a fused
//!   [`Normalize`]), [`DirectSource`] and [`DirectPlan`].
//! - Samples ([`tensor`], [`dtype`], [`shape`]): [`Tensor`], [`TensorRef`], the [`Field`]
//!   and [`Sample`] traits, `#[derive(Sample)]` for a struct of fields, [`DType`],
//!   [`Shape`], [`ImageLayout`].
//! - Files ([`formats`], [`formats::npy`], [`formats::records`]): [`NpyArray`], [`NpyDataset`], [`NpyShards`],
//!   [`RecordDataset`], [`write_npy`].
//! - Transforms ([`transform`]): the [`Transform`] trait and its combinators; the image
//!   transforms ([`image`]) [`Normalize`], [`RandomCrop`], [`RandomHorizontalFlip`], defined
//!   once for the `.npy` image datasets and longshore-vision, with the vectorised kernel in
//!   [`normalize`]; per-worker seeded randomness in [`worker`] and [`rng`]; SplitMix64 and
//!   every seed scheme (worker, per-sample and block seeds) in [`seed`].
//!
//! ## Layers
//!
//! Modules import only modules of lower layers (checked with `grep 'crate::' src`, comments
//! aside; a module's own submodules count as the module):
//!
//! 1. [`dtype`], [`rng`], then [`seed`] (over [`rng`])
//! 2. `error` ([`DataError`]: names dtypes)
//! 3. [`shape`], [`worker`]
//! 4. [`tensor`] (with [`ImageLayout`]), [`batch`], [`field`]
//! 5. [`normalize`] (the kernel), [`transform`] (the trait)
//! 6. [`image`] (the image transforms)
//! 7. [`dataset`]
//! 8. [`collate`], [`formats`], [`sampler`], then [`dist`]
//!
//! Unsafe code is denied in this crate except in one small private module of
//! [`formats`], which holds the one `memmap2` call a memory-mapped dataset needs.
//! Mapped files must not be modified or truncated while mapped (see [`formats`]).
#![deny(unsafe_code)]

// `#[derive(Sample)]` names this crate `::longshore_data`, also inside it.
extern crate self as longshore_data;

pub mod batch;
pub mod collate;
pub mod dataset;
pub mod dist;
pub mod dtype;
mod error;
pub mod field;
pub mod formats;
pub mod image;
pub mod normalize;
pub mod rng;
pub mod sampler;
pub mod seed;
pub mod shape;
pub mod tensor;
pub mod transform;
pub mod worker;

pub use batch::{AlignedBuf, Batch, BatchLayout, Storage, TENSOR_ALIGN, TensorSpec};
pub use collate::{
    Collate, DatasetCollate, DirectCollate, FetchCollate, PadCollate, StackCollate, StagedIndices,
    StagedItems,
};
pub use dataset::{
    Chain, ConcatDataset, Dataset, DatasetExt, DirectDataset, EpochLayout, FromFn, ItemIter,
    IterMap, IterableDataset, IterableExt, Map, Mixture, Sharded, StreamPosition, Subset,
    Transformed, TryMap, VecDataset, Zip, random_split, random_split_fractions, split_lengths,
};
pub use dist::{DistEnv, Launcher};
pub use dtype::{ByteOrder, DType, Element};
pub use error::{DataError, NpyError};
pub use field::{DirectPlan, DirectSource, FieldSpec, FieldTransform};
pub use formats::{
    AccessPattern, NpyArray, NpyDataset, NpyHeader, NpyShards, RecordDataset, RecordField,
    RecordLayout, TokenSequences, write_npy,
};
pub use image::{Normalize, RandomCrop, RandomHorizontalFlip};
/// `#[derive(Sample)]`: a struct of tensor fields as a dataset item (see [`Sample`]).
pub use longshore_derive::Sample;
pub use sampler::{
    BatchIter, BatchSampler, BatchSampling, DistributedSampler, DistributedSamplerBuilder,
    IndexIter, RandomSampler, Sampler, SamplerState, SequentialSampler, SubsetRandomSampler,
    WeightedRandomSampler,
};
pub use shape::Shape;
pub use tensor::{Field, ImageLayout, Sample, Tensor, TensorRef};
pub use transform::{First, FnTransform, Then, Transform, TransformExt};
pub use worker::WorkerInfo;
