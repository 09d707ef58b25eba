//! Image shards (feature `shards`): WebDataset or MDS shards in object storage, read by
//! longshore-shards' [`ShardedDataset`], decoded and transformed into the `(image, label)`
//! samples of an [`ImageFolder`](crate::ImageFolder) with a transform pipeline, so one training
//! pipeline runs over a folder or over shards.
//!
//! [`ImageShards`] wraps a [`ShardedDataset`] of samples with an image field (`jpg`, `jpeg`,
//! `png` or `webp`: what [`pack_image_folder`](longshore_shards::webdataset::pack_image_folder)
//! writes;
//! or the one named with [`image_field`](ImageShards::image_field)) and a label field (`cls`
//! by default: decimal text in a WebDataset, an integer column of an MDS dataset). Each image is decoded and transformed by a
//! [`Compose`] pipeline (torchvision's `RandomResizedCrop`, flips, `Normalize`, ...) drawing
//! from a generator seeded with the sample's seed ([`ShardSample::seed`]): the same crops on
//! every rank, worker count and resume.
//!
//! For a loader, [`ImageShards::deferred`] is the fast form: the workers read each image and
//! check its header, and its collation ([`DecodeCollate`]) decodes each image straight into
//! its slot of the page-locked batch, as the folder path does, with the same batches as
//! [`ImageShards`] stacked by a `StackCollate`. On a GPU, longshore-nvjpeg's `EncodedShards`
//! (its feature `shards`) decodes them with nvJPEG instead, attached to the loader as its
//! image folders are.
//!
//! Samples with more than an image and a label (captions, JSON metadata, raw bytes) are read
//! field by field by [`FieldRecords`] and batched by its [`RecordCollate`]: see [`fields`].
//!
//! ```
//! use longshore_data::{IterableDataset, WorkerInfo};
//! use longshore_shards::dataset::ShardedDataset;
//! use longshore_vision::shards::ImageShards;
//! use longshore_vision::{Compose, Output};
//!
//! # #[cfg(feature = "synth")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let folder = dir.path().join("folder");
//! # longshore_vision::synth::write_folder(&folder, &longshore_vision::synth::FolderSpec::tiny())?;
//! let index = longshore_shards::webdataset::pack_image_folder(&folder, dir.path(), 1 << 20, Some(0))?;
//! assert_eq!(index.shardlist.len(), 1);
//! let shards = ShardedDataset::webdataset([format!("{}/shard-000000.tar", dir.path().display())])
//!     .rank(0)
//!     .world_size(1)
//!     .cache_dir(dir.path().join("cache"))
//!     .build()?;
//! let train = ImageShards::new(shards, Compose::train(32, Output::imagenet()));
//! let (image, label) = train.iter(WorkerInfo::single(0)).next().unwrap()?;
//! assert_eq!(image.shape(), &[3, 32, 32]);
//! assert!((0..4).contains(&label));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "synth"))]
//! # fn main() {}
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{DataError, ItemIter, IterableDataset, Tensor, WorkerInfo};
use longshore_shards::ShardError;
use longshore_shards::dataset::{ShardSample, ShardedDataset};

use crate::{Compose, DecodeOptions};

mod deferred;
pub mod fields;

pub use deferred::{DecodeCollate, DeferredImage, DeferredShards};
pub use fields::{FieldKind, FieldRecord, FieldRecords, RecordCollate, ShardField};

/// Image shards with a transform pipeline: an [`IterableDataset`] of `(image, label)`, as
/// [`ImageDataset`](crate::ImageDataset) yields them; see the
/// [module docs](self).
///
/// Padding repeats (see [`ShardSample::pad`]) are yielded like other samples; to leave them
/// out of metrics, map the [`ShardedDataset`] yourself with [`ImageShards::decode`].
#[derive(Debug, Clone)]
pub struct ImageShards {
    dataset: ShardedDataset,
    transform: Arc<Compose>,
    decode: DecodeOptions,
    image: Option<String>,
    label: String,
}

impl ImageShards {
    /// `dataset`'s images through `transform`, labels from field `cls`.
    pub fn new(dataset: ShardedDataset, transform: Compose) -> ImageShards {
        ImageShards {
            dataset,
            transform: Arc::new(transform),
            decode: DecodeOptions::default(),
            image: None,
            label: "cls".into(),
        }
    }

    /// The decoder's options (its pixel limit).
    #[must_use]
    pub fn decode_options(mut self, options: DecodeOptions) -> ImageShards {
        self.decode = options;
        self
    }

    /// The field holding the encoded image (an MDS `jpeg`/`png` column, a WebDataset
    /// extension); default: the first of `jpg`, `jpeg`, `png`, `webp` present.
    #[must_use]
    pub fn image_field(mut self, name: impl Into<String>) -> ImageShards {
        self.image = Some(name.into());
        self
    }

    /// The field holding the label (default `cls`); see [`ShardSample::int`].
    #[must_use]
    pub fn label_field(mut self, ext: impl Into<String>) -> ImageShards {
        self.label = ext.into();
        self
    }

    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        &self.dataset
    }

    /// The pipeline.
    pub fn transform(&self) -> &Compose {
        &self.transform
    }

    /// The decoder's options (set with [`decode_options`](ImageShards::decode_options)).
    pub fn options(&self) -> &DecodeOptions {
        &self.decode
    }

    /// One sample's encoded image and label, not decoded: the image's name in errors
    /// (`shard-url#key.ext`), its bytes, and the label. What another decoder (longshore-nvjpeg's
    /// `EncodedShards`) starts from.
    ///
    /// # Errors
    /// As [`ImageShards::decode`]: the [`ShardError`] of a missing image or label field.
    pub fn read<'a>(
        &'a self,
        sample: &'a ShardSample,
    ) -> Result<(PathBuf, &'a [u8], i64), DataError> {
        let (ext, bytes) = self.image_of(sample)?;
        let label = self.label_of(sample)?;
        let s = &sample.sample;
        Ok((
            PathBuf::from(format!("{}#{}.{ext}", s.url, s.key)),
            bytes,
            label,
        ))
    }

    /// The sample's image field: its name and encoded bytes.
    fn image_of<'a>(&'a self, sample: &'a ShardSample) -> Result<(&'a str, &'a [u8]), DataError> {
        let s = &sample.sample;
        sample.image(self.image.as_deref()).ok_or_else(|| {
            let have: Vec<&str> = s.fields.keys().map(String::as_str).collect();
            DataError::custom(
                "decoding an image sample",
                ShardError::Sample {
                    shard: s.url.clone(),
                    key: s.key.clone(),
                    offset: s.offset,
                    reason: match &self.image {
                        Some(n) => format!("no image field {n:?} (fields: {})", have.join(", ")),
                        None => format!("no image field (fields: {})", have.join(", ")),
                    },
                },
            )
        })
    }

    /// The sample's label.
    fn label_of(&self, sample: &ShardSample) -> Result<i64, DataError> {
        sample
            .int(&self.label)
            .map_err(|e| DataError::custom("reading an image sample's label", e))
    }

    /// Decodes and transforms one sample's image and reads its label: what each item of this
    /// dataset is.
    ///
    /// # Errors
    /// The [`ShardError`] of a missing image or label field (naming the shard, key and
    /// offset), or [`DataError::InvalidFile`] naming `shard-url#key.ext` for an image that
    /// does not decode.
    pub fn decode(&self, sample: &ShardSample) -> Result<(Tensor, i64), DataError> {
        let (path, bytes, label) = self.read(sample)?;
        let field = self.transform.field();
        let mut image = Tensor::zeros(field.dtype, field.shape.dims())?;
        let mut rng = epoch_rng(sample.seed, 0);
        self.transform
            .decode_into(&path, bytes, &self.decode, &mut rng, image.bytes_mut())?;
        Ok((image, label))
    }
}

impl IterableDataset for ImageShards {
    type Item = (Tensor, i64);

    longshore_data::forward_epoch_seam!(dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, (Tensor, i64)> {
        Box::new(
            self.dataset
                .iter(worker)
                .map(move |item| item.and_then(|s| self.decode(&s))),
        )
    }
}
