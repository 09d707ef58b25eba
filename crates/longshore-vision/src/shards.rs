//! WebDataset image shards decoded with longshore-vision (feature `vision`): the
//! `(image, label)` samples of an [`ImageFolder`](longshore_vision::ImageFolder) with a
//! transform pipeline, read from shards, so one training pipeline runs over a folder or over
//! shards.
//!
//! [`ImageShards`] wraps a [`ShardedDataset`] of samples with an image field (`jpg`, `jpeg`,
//! `png` or `webp`: what [`pack_image_folder`](crate::webdataset::pack_image_folder) writes;
//! or the one named with [`image_field`](ImageShards::image_field)) and a label field (`cls`
//! by default: decimal text in a WebDataset, an integer column of an MDS dataset). Each image is decoded and transformed by a
//! [`Compose`] pipeline (torchvision's `RandomResizedCrop`, flips, `Normalize`, ...) drawing
//! from a generator seeded with the sample's seed ([`ShardSample::seed`]): the same crops on
//! every rank, worker count and resume.
//!
//! For a loader, [`ImageShards::deferred`] is the fast form: the workers read each image and
//! check its header, and its collation ([`DecodeCollate`]) decodes each image straight into
//! its slot of the page-locked batch, as the folder path does, with the same batches as
//! [`ImageShards`] stacked by a `StackCollate`. On a GPU, [`ImageShards::encoded`] decodes with
//! nvJPEG instead (feature `nvjpeg`).
//!
//! ```
//! use longshore_data::{IterableDataset, WorkerInfo};
//! use longshore_shards::dataset::ShardedDataset;
//! use longshore_shards::vision::ImageShards;
//! use longshore_vision::{Compose, Output};
//!
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
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{DataError, ItemIter, IterableDataset, Tensor, WorkerInfo};
use longshore_vision::{Compose, DecodeOptions};

use crate::ShardError;
use crate::dataset::{ShardSample, ShardedDataset};

mod deferred;

pub use deferred::{DecodeCollate, DeferredImage, DeferredShards};

/// Image shards with a transform pipeline: an [`IterableDataset`] of `(image, label)`, as
/// [`ImageDataset`](longshore_vision::ImageDataset) yields them; see the
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

    /// Decodes and transforms one sample's image and reads its label: what each item of this
    /// dataset is.
    ///
    /// # Errors
    /// The [`ShardError`] of a missing image or label field (naming the shard, key and
    /// offset), or [`DataError::InvalidFile`] naming `shard-url#key.ext` for an image that
    /// does not decode.
    pub fn decode(&self, sample: &ShardSample) -> Result<(Tensor, i64), DataError> {
        let s = &sample.sample;
        let (ext, bytes) = self.image_of(sample)?;
        let label = sample
            .int(&self.label)
            .map_err(|e| DataError::custom("reading an image sample's label", e))?;
        let field = self.transform.field();
        let mut image = Tensor::zeros(field.dtype, field.shape.dims())?;
        let path = PathBuf::from(format!("{}#{}.{ext}", s.url, s.key));
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

/// Image shards decoded on the GPU (feature `nvjpeg`): the workers read each sample's encoded
/// image from its shard, check its header and draw its crop from the sample's seed (the same
/// boxes [`ImageShards`] draws on the CPU); nvJPEG decodes the batch on the device and one
/// kernel crops, resizes and normalises it ([`NvjpegDecoder`](longshore_nvjpeg::NvjpegDecoder),
/// the loader's device stage). Made by [`ImageShards::encoded`].
///
/// ```no_run
/// # use longshore_shards::vision::ImageShards;
/// # fn f(train: ImageShards, device: &longshore_transfer::Device) -> Result<(), Box<dyn std::error::Error>> {
/// use longshore_loader::DataLoader;
/// use longshore_nvjpeg::EncodedCollate;
///
/// let encoded = train.encoded()?;
/// let decoder = encoded.decoder(device)?;
/// let loader = DataLoader::iterable(encoded)
///     .collate(EncodedCollate)
///     .batch_size(256)
///     .num_workers(4)
///     .build()?
///     .with_stage(decoder);
/// for batch in loader.iter()? {
///     let batch = batch?; // images [B, 3, H, W] and labels [B] on the GPU
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "nvjpeg")]
#[derive(Debug, Clone)]
pub struct EncodedShards {
    images: ImageShards,
}

#[cfg(feature = "nvjpeg")]
impl ImageShards {
    /// These shards for decoding on the GPU: see [`EncodedShards`].
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a pipeline the device cannot run
    /// ([`check_steps`](longshore_nvjpeg::check_steps)).
    pub fn encoded(self) -> Result<EncodedShards, DataError> {
        longshore_nvjpeg::check_steps(self.transform.steps())?;
        Ok(EncodedShards { images: self })
    }
}

#[cfg(feature = "nvjpeg")]
impl EncodedShards {
    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        &self.images.dataset
    }

    /// The CPU form (the same pipeline, decoded by the workers).
    pub fn images(&self) -> &ImageShards {
        &self.images
    }

    /// Reads one sample's image and label and draws its crop: what each item of this dataset
    /// is (its index is the sample's global id).
    ///
    /// # Errors
    /// As [`ImageShards::decode`]: a missing field, or a header that does not parse, naming
    /// `shard-url#key.ext`.
    pub fn encode(
        &self,
        sample: &ShardSample,
    ) -> Result<longshore_nvjpeg::PlannedSample, DataError> {
        let images = &self.images;
        let s = &sample.sample;
        let (ext, bytes) = images.image_of(sample)?;
        let label = sample
            .int(&images.label)
            .map_err(|e| DataError::custom("reading an image sample's label", e))?;
        let path = PathBuf::from(format!("{}#{}.{ext}", s.url, s.key));
        let encoded = longshore_nvjpeg::EncodedSample::from_bytes(
            path,
            label,
            bytes.to_vec(),
            &images.decode,
            false,
        )?;
        let mut rng = epoch_rng(sample.seed, 0);
        let index =
            usize::try_from(sample.id.global).map_err(|_| DataError::Overflow("sample id"))?;
        longshore_nvjpeg::PlannedSample::new(index, encoded, &images.transform, &mut rng)
    }

    /// The device stage for these shards on `device` (a CUDA device): an nvJPEG decoder with
    /// this pipeline, naming a failed sample by its shard URL and place in the shard.
    ///
    /// # Errors
    /// As [`NvjpegDecoder::new`](longshore_nvjpeg::NvjpegDecoder::new): libnvjpeg or NVRTC
    /// missing, the `Cpu` device, driver errors.
    pub fn decoder(
        &self,
        device: &longshore_transfer::Device,
    ) -> Result<longshore_nvjpeg::NvjpegDecoder, longshore_transfer::TransferError> {
        let spec = self.images.dataset.spec();
        let urls: Vec<String> = spec.shards.shards.iter().map(|s| s.url.clone()).collect();
        let starts: Vec<u64> = spec
            .counts
            .iter()
            .scan(0u64, |acc, &c| {
                let start = *acc;
                *acc += c;
                Some(start)
            })
            .collect();
        let names: longshore_nvjpeg::SampleNames = Arc::new(move |global| {
            let global = global as u64;
            let shard = starts.partition_point(|&s| s <= global).saturating_sub(1);
            match urls.get(shard) {
                Some(url) => PathBuf::from(format!("{url}#sample {}", global - starts[shard])),
                None => PathBuf::from(format!("sample {global}")),
            }
        });
        longshore_nvjpeg::NvjpegDecoder::for_pipeline(
            device,
            &self.images.transform,
            self.images.decode,
            names,
        )
    }
}

#[cfg(feature = "nvjpeg")]
impl IterableDataset for EncodedShards {
    type Item = longshore_nvjpeg::PlannedSample;

    longshore_data::forward_epoch_seam!(images.dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, longshore_nvjpeg::PlannedSample> {
        Box::new(
            self.images
                .dataset
                .iter(worker)
                .map(move |item| item.and_then(|s| self.encode(&s))),
        )
    }
}
