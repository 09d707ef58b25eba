//! Image shards decoded straight into the batch: the workers read each sample's encoded image
//! and check its header ([`DeferredShards`]), and the collation decodes and transforms each
//! image into its slot of the (page-locked) batch buffer ([`DecodeCollate`]), as the folder's
//! [`ImageDataset`](crate::ImageDataset) does through its direct plan: no tensor
//! per image (allocated, zeroed, then copied into the batch).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{
    Batch, BatchLayout, Collate, DType, DataError, ItemIter, IterableDataset, Storage, WorkerInfo,
};
use longshore_shards::dataset::{ShardSample, ShardedDataset};

use super::ImageShards;
use crate::decode::probe;
use crate::folder::invalid;
use crate::{Compose, DecodeOptions};

/// One image sample as a worker reads it from its shard, not yet decoded: its encoded bytes
/// (header checked), its label and the seed its random transforms draw from. The items of
/// [`DeferredShards`]; [`DecodeCollate`] decodes them into the batch.
#[derive(Debug, Clone)]
pub struct DeferredImage {
    path: PathBuf,
    bytes: Vec<u8>,
    label: i64,
    seed: u64,
    pad: bool,
}

impl DeferredImage {
    /// The image's name in errors: `shard-url#key.ext`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The encoded image (JPEG or PNG).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The label.
    pub fn label(&self) -> i64 {
        self.label
    }

    /// The seed the sample's random transforms draw from ([`ShardSample::seed`]).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether the sample is a padding repeat ([`ShardSample::pad`]).
    pub fn pad(&self) -> bool {
        self.pad
    }
}

/// Image shards whose images are decoded by the collation, into the batch: the fast CPU
/// path for a loader. Made by [`ImageShards::deferred`]; batch its items with
/// [`DeferredShards::collate`].
///
/// Each batch holds the same tensors, with the same pixels, as [`ImageShards`]' items stacked
/// by a [`StackCollate`](longshore_data::StackCollate): images `[B, ...]` of the pipeline's
/// dtype and labels `[B]` (`i64`). A file whose header does not parse is an item error in the
/// worker; one that fails while decoding into the batch is found by
/// [`Collate::check_item`], so the loader's `on_sample_error` names or skips that sample
/// alone either way.
///
/// ```
/// use longshore_loader::DataLoader;
/// use longshore_shards::dataset::ShardedDataset;
/// use longshore_vision::shards::ImageShards;
/// use longshore_vision::{Compose, Output};
///
/// # #[cfg(feature = "synth")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let folder = dir.path().join("folder");
/// # longshore_vision::synth::write_folder(&folder, &longshore_vision::synth::FolderSpec::tiny())?;
/// # longshore_shards::webdataset::pack_image_folder(&folder, dir.path(), 1 << 20, Some(0))?;
/// let shards = ShardedDataset::webdataset([format!("{}/shard-000000.tar", dir.path().display())])
///     .rank(0)
///     .world_size(1)
///     .cache_dir(dir.path().join("cache"))
///     .build()?;
/// let train = ImageShards::new(shards.clone(), Compose::train(32, Output::imagenet())).deferred();
/// let loader = DataLoader::iterable(train.clone())
///     .collate(train.collate().with_names("image", "label"))
///     .batch_size(4)
///     .num_workers(2)
///     .build()?;
/// for batch in loader.iter() {
///     let batch = batch?;
///     let image = batch.layout().position("image").unwrap();
///     assert_eq!(batch.shape(image)?[1..], [3, 32, 32]);
/// }
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "synth"))]
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct DeferredShards {
    images: ImageShards,
}

impl ImageShards {
    /// These shards with their images decoded by the collation, into the batch: see
    /// [`DeferredShards`].
    pub fn deferred(self) -> DeferredShards {
        DeferredShards { images: self }
    }
}

impl DeferredShards {
    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        &self.images.dataset
    }

    /// The form whose items are decoded tensors.
    pub fn images(&self) -> &ImageShards {
        &self.images
    }

    /// The collation that decodes this dataset's items into their batch (unnamed tensors;
    /// see [`DecodeCollate::with_names`]).
    pub fn collate(&self) -> DecodeCollate {
        DecodeCollate {
            transform: self.images.transform.clone(),
            decode: self.images.decode,
            names: None,
        }
    }

    /// Reads one sample's image and label and checks the image's header: what each item of
    /// this dataset is.
    ///
    /// # Errors
    /// As [`ImageShards::decode`]: a missing field, or a header that does not parse or is
    /// over the pixel limit, naming `shard-url#key.ext`.
    pub fn read(&self, sample: ShardSample) -> Result<DeferredImage, DataError> {
        let images = &self.images;
        let (ext, _) = images.image_of(&sample)?;
        let ext = ext.to_owned();
        let label = images.label_of(&sample)?;
        let ShardSample {
            sample: mut s,
            seed,
            pad,
            ..
        } = sample;
        let path = PathBuf::from(format!("{}#{}.{ext}", s.url, s.key));
        let bytes = s.fields.remove(&ext).unwrap_or_default();
        let header = probe(&bytes).map_err(|e| invalid(&path, e))?;
        images
            .decode
            .check_header(&header)
            .map_err(|e| invalid(&path, e))?;
        Ok(DeferredImage {
            path,
            bytes,
            label,
            seed,
            pad,
        })
    }
}

impl IterableDataset for DeferredShards {
    type Item = DeferredImage;

    longshore_data::forward_epoch_seam!(images.dataset);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, DeferredImage> {
        Box::new(
            self.images
                .dataset
                .iter(worker)
                .map(move |item| item.and_then(|s| self.read(s))),
        )
    }
}

/// Decodes [`DeferredImage`]s straight into their batch: images `[B, ...]` (the pipeline's
/// [`field`](Compose::field)) then labels `[B]` (`i64`), each image run through the pipeline
/// with a generator seeded by its sample's seed (the pixels [`ImageShards`] gives). Made by
/// [`DeferredShards::collate`].
#[derive(Debug, Clone)]
pub struct DecodeCollate {
    transform: Arc<Compose>,
    decode: DecodeOptions,
    names: Option<(Arc<str>, Arc<str>)>,
}

impl DecodeCollate {
    /// Names the two tensors (`"image"`, `"label"`).
    #[must_use]
    pub fn with_names(mut self, image: &str, label: &str) -> DecodeCollate {
        self.names = Some((Arc::from(image), Arc::from(label)));
        self
    }

    /// Decodes and transforms `item` into `out` (one image slot).
    fn decode_into(&self, item: &DeferredImage, out: &mut [u8]) -> Result<(), DataError> {
        let mut rng = epoch_rng(item.seed, 0);
        self.transform
            .decode_into(&item.path, &item.bytes, &self.decode, &mut rng, out)
    }
}

thread_local! {
    /// An image slot for [`DecodeCollate::check_item`] (only on a failed batch).
    static SLOT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Collate<DeferredImage> for DecodeCollate {
    fn layout(&self, samples: &[DeferredImage]) -> Result<BatchLayout, DataError> {
        if samples.is_empty() {
            return Err(DataError::Empty { what: "batch" });
        }
        let n = samples.len();
        let field = self.transform.field();
        let mut shape = Vec::with_capacity(field.shape.ndim() + 1);
        shape.push(n);
        shape.extend_from_slice(field.shape.dims());
        let (image, label) = match &self.names {
            Some((i, l)) => (Some(i.clone()), Some(l.clone())),
            None => (None, None),
        };
        let mut layout = BatchLayout::new(n);
        layout.push(image, field.dtype, shape)?;
        layout.push(label, DType::I64, vec![n])?;
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[DeferredImage],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        let [image, label] = layout.tensors() else {
            return Err(DataError::ShapeMismatch(format!(
                "a layout of {} tensors for images and labels",
                layout.tensors().len()
            )));
        };
        if layout.batch_size() != samples.len() || storage.len() < layout.total_bytes() {
            return Err(DataError::BufferTooSmall {
                what: "batch of decoded images",
                needed: layout.total_bytes(),
                got: storage.len(),
            });
        }
        let per = self.transform.output_bytes();
        if image.len != per * samples.len() || label.len != 8 * samples.len() {
            return Err(DataError::ShapeMismatch(format!(
                "the layout's images are {} bytes and labels {} bytes, {} samples need {} and {}",
                image.len,
                label.len,
                samples.len(),
                per * samples.len(),
                8 * samples.len()
            )));
        }
        let (images, labels) = (image.range(), label.range());
        let out = &mut storage[..layout.total_bytes()];
        // The alignment gaps: never stale bytes.
        out[..images.start].fill(0);
        out[images.end..labels.start].fill(0);
        for (item, slot) in samples.iter().zip(out[images].chunks_exact_mut(per.max(1))) {
            self.decode_into(item, slot)?;
        }
        for (item, slot) in samples.iter().zip(out[labels].chunks_exact_mut(8)) {
            slot.copy_from_slice(&item.label.to_ne_bytes());
        }
        Batch::from_parts(layout, storage)
    }

    fn check_item(&self, item: &DeferredImage) -> Result<(), DataError> {
        SLOT.with_borrow_mut(|slot| {
            slot.resize(self.transform.output_bytes(), 0);
            self.decode_into(item, slot)
        })
    }
}
