//! Image shards decoded on the GPU (feature `shards`): [`EncodedShards`], longshore-vision's
//! [`ImageShards`] with the workers reading and planning each image and nvJPEG decoding it.

use std::path::PathBuf;
use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{DataError, ItemIter, IterableDataset, WorkerInfo};
use longshore_shards::dataset::{ShardSample, ShardedDataset};
use longshore_transfer::{Device, TransferError};
use longshore_vision::shards::ImageShards;

use super::decoder::{NvjpegDecoder, SampleNames};
use super::encoded::{EncodedSample, PlannedSample};
use super::plan::check_steps;

/// Image shards decoded on the GPU: the workers read each sample's encoded image from its
/// shard, check its header and draw its crop from the sample's seed (the same boxes
/// [`ImageShards`] draws on the CPU); nvJPEG decodes the batch on the device and one kernel
/// crops, resizes and normalises it ([`NvjpegDecoder`], the loader's device stage).
///
/// Its items are [`PlannedSample`]s, as an [`EncodedImages`](crate::EncodedImages)' are, so
/// both attach to the loader the same way: `.collate(EncodedCollate)` and
/// `.with_stage(decoder)`.
///
/// ```no_run
/// # use longshore_vision::shards::ImageShards;
/// # fn f(train: ImageShards, device: &longshore_transfer::Device) -> Result<(), Box<dyn std::error::Error>> {
/// use longshore_loader::DataLoader;
/// use longshore_nvjpeg::{EncodedCollate, EncodedShards};
///
/// let encoded = EncodedShards::new(train)?;
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
#[derive(Debug, Clone)]
pub struct EncodedShards {
    images: ImageShards,
}

impl EncodedShards {
    /// `images` for decoding on the GPU: the same shards and pipeline.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a pipeline the device cannot run ([`check_steps`]).
    pub fn new(images: ImageShards) -> Result<EncodedShards, DataError> {
        check_steps(images.transform().steps())?;
        Ok(EncodedShards { images })
    }

    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        self.images.dataset()
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
    pub fn encode(&self, sample: &ShardSample) -> Result<PlannedSample, DataError> {
        let images = &self.images;
        let (path, bytes, label) = images.read(sample)?;
        let encoded =
            EncodedSample::from_bytes(path, label, bytes.to_vec(), images.options(), false)?;
        let mut rng = epoch_rng(sample.seed, 0);
        let index =
            usize::try_from(sample.id.global).map_err(|_| DataError::Overflow("sample id"))?;
        PlannedSample::new(index, encoded, images.transform(), &mut rng)
    }

    /// The device stage for these shards on `device` (a CUDA device): an nvJPEG decoder with
    /// this pipeline, naming a failed sample by its shard URL and place in the shard.
    ///
    /// # Errors
    /// As [`NvjpegDecoder::new`]: libnvjpeg or NVRTC missing, the `Cpu` device, driver errors.
    pub fn decoder(&self, device: &Device) -> Result<NvjpegDecoder, TransferError> {
        NvjpegDecoder::for_pipeline(
            device,
            self.images.transform(),
            *self.images.options(),
            sample_names(self.images.dataset()),
        )
    }
}

/// Names a sample of `dataset` by its global id: `shard-url#sample k`.
pub(crate) fn sample_names(dataset: &ShardedDataset) -> SampleNames {
    let spec = dataset.spec();
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
    Arc::new(move |global| {
        let global = global as u64;
        let shard = starts.partition_point(|&s| s <= global).saturating_sub(1);
        match urls.get(shard) {
            Some(url) => PathBuf::from(format!("{url}#sample {}", global - starts[shard])),
            None => PathBuf::from(format!("sample {global}")),
        }
    })
}

impl IterableDataset for EncodedShards {
    type Item = PlannedSample;

    // To the shards, through `ImageShards`' own forwarding.
    longshore_data::forward_epoch_seam!(images);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, PlannedSample> {
        Box::new(
            self.images
                .dataset()
                .iter(worker)
                .map(move |item| item.and_then(|s| self.encode(&s))),
        )
    }
}
