//! [`ImageDataset`]: an [`ImageFolder`] with a [`Compose`] pipeline, writing each image
//! straight into its slot of the (page-locked) batch buffer through
//! [`longshore_data::DirectCollate`].

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use longshore_data::rng::Rng;
pub use longshore_data::seed::sample_rng;
use longshore_data::{
    DType, DataError, Dataset, DirectDataset, DirectPlan, FieldSpec, Shape, Tensor,
};

use crate::compose::{Compose, with_scratch};
use crate::folder::ImageFolder;

/// Where the random transforms of a sample draw from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RandomSource {
    /// A generator per sample, a pure function of `(loader seed, epoch, index)` (the default):
    /// the seed is the loader's ([`longshore_data::worker::loader_seed`]; 0 outside a loader),
    /// so a sample draws the same crops whichever worker loads it and however many workers
    /// run, and a resumed epoch yields the batches of the uninterrupted one, pixels included.
    /// The epoch is as for [`PerSample`](RandomSource::PerSample).
    #[default]
    Sample,
    /// The loader worker's seeded generator ([`longshore_data::worker::with_rng`]), as
    /// PyTorch's transforms draw from the worker's torch generator: reproducible for a given
    /// seed and number of workers when an epoch is run from its start, but not across a
    /// resume (a resumed worker starts its stream over) or another number of workers.
    Worker,
    /// A generator per sample, a pure function of `(seed, epoch, index)`: the same crops
    /// whatever the number of workers, and a resumed epoch draws the crops the interrupted
    /// one would have. Inside a loader the epoch is the loader's (the one its sampler
    /// shuffles with: [`longshore_data::worker::epoch`]), so batches of the next epoch that
    /// the loader starts early draw that epoch's crops; outside a loader it is the one set
    /// with [`ImageDataset::set_epoch`].
    PerSample {
        /// The base seed.
        seed: u64,
    },
}

impl RandomSource {
    /// Runs `f` with the generator sample `index` draws from in `epoch`: the worker's, or the
    /// sample's own ([`sample_rng`]). The CPU pipeline and the nvJPEG planner both draw
    /// through here, so one seed gives the same boxes on both paths.
    /// `epoch` is the dataset's own, used only outside a loader (see
    /// [`RandomSource::PerSample`]).
    pub fn draw<R>(self, epoch: u64, index: usize, f: impl FnOnce(&mut Rng) -> R) -> R {
        match self {
            RandomSource::Worker => longshore_data::worker::with_rng(f),
            RandomSource::Sample => {
                let seed = longshore_data::worker::loader_seed().unwrap_or(0);
                let epoch = longshore_data::worker::epoch().unwrap_or(epoch);
                f(&mut sample_rng(seed, epoch, index))
            }
            RandomSource::PerSample { seed } => {
                let epoch = longshore_data::worker::epoch().unwrap_or(epoch);
                f(&mut sample_rng(seed, epoch, index))
            }
        }
    }
}

/// An image folder with a transform pipeline: torchvision's
/// `ImageFolder(root, transform=Compose([...]))`.
///
/// Samples are `(image, label)`: the image as the pipeline's output (f32 `[3, H, W]`
/// normalised, or u8) and the label as `i64`. As a [`DirectDataset`] it decodes and
/// transforms each image straight into its batch slot (the loader's default collation does
/// so through its [`DirectPlan`], as [`longshore_data::DirectCollate`] does); as a
/// [`Dataset`] it returns owned tensors.
#[derive(Debug, Clone)]
pub struct ImageDataset {
    folder: ImageFolder,
    transform: Arc<Compose>,
    random: RandomSource,
    epoch: Arc<AtomicU64>,
    fields: [FieldSpec; 2],
}

impl ImageFolder {
    /// Attaches a transform pipeline (torchvision's `transform=`).
    pub fn with_transform(self, transform: Compose) -> ImageDataset {
        ImageDataset::new(self, transform)
    }
}

impl ImageDataset {
    /// `folder` with `transform`, each sample drawing its randomness from its own generator
    /// ([`RandomSource::Sample`]).
    pub fn new(folder: ImageFolder, transform: Compose) -> ImageDataset {
        let fields = [
            transform.field(),
            FieldSpec {
                dtype: DType::I64,
                shape: Shape::new(&[]).expect("a scalar shape"),
            },
        ];
        ImageDataset {
            folder,
            transform: Arc::new(transform),
            random: RandomSource::default(),
            epoch: Arc::new(AtomicU64::new(0)),
            fields,
        }
    }

    /// Chooses where random transforms draw from.
    pub fn random_source(mut self, random: RandomSource) -> ImageDataset {
        self.random = random;
        self
    }

    /// Sets the epoch of [`RandomSource::PerSample`] streams for samples read outside a
    /// loader (shared by clones). Inside a `DataLoader` the
    /// loader's epoch applies instead (`DataLoader::set_epoch`, or its own count), so the
    /// crops follow the shuffling even for batches a loader starts before its epoch's
    /// iterator exists.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The folder.
    pub fn folder(&self) -> &ImageFolder {
        &self.folder
    }

    /// The pipeline.
    pub fn transform(&self) -> &Compose {
        &self.transform
    }

    /// Runs `f` with the generator sample `index` draws from (this dataset's
    /// [`RandomSource`], at its epoch outside a loader): what the CPU pipeline draws its boxes
    /// from, and a device decoder draws the same boxes from.
    pub fn draw<R>(&self, index: usize, f: impl FnOnce(&mut Rng) -> R) -> R {
        self.random
            .draw(self.epoch.load(Ordering::Relaxed), index, f)
    }

    /// Decodes and transforms sample `index` into `out` (the pipeline's output bytes).
    ///
    /// # Errors
    /// [`DataError::Io`] or [`DataError::InvalidFile`] naming the file.
    pub(crate) fn image_into(&self, index: usize, out: &mut [u8]) -> Result<(), DataError> {
        let (path, _) = self
            .folder
            .samples()
            .get(index)
            .ok_or(DataError::IndexOutOfRange {
                index,
                len: self.folder.len(),
                what: "image folder",
            })?;
        let bytes = with_scratch(|s| {
            let mut file = std::mem::take(&mut s.file);
            file.clear();
            let r = std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut file))
                .map_err(|source| DataError::Io {
                    path: path.clone(),
                    source,
                });
            r.map(|_| file)
        })?;
        let decode = self.folder.decode();
        let result = self.draw(index, |rng| {
            self.transform.decode_into(path, &bytes, decode, rng, out)
        });
        with_scratch(|s| s.file = bytes);
        result
    }

    fn label(&self, index: usize) -> Result<i64, DataError> {
        self.folder
            .samples()
            .get(index)
            .map(|(_, l)| *l as i64)
            .ok_or(DataError::IndexOutOfRange {
                index,
                len: self.folder.len(),
                what: "image folder",
            })
    }
}

impl Dataset for ImageDataset {
    type Item = (Tensor, i64);

    fn len(&self) -> usize {
        self.folder.len()
    }

    fn get(&self, index: usize) -> Result<(Tensor, i64), DataError> {
        let f = self.transform.field();
        let mut t = Tensor::zeros(f.dtype, f.shape.dims())?;
        self.image_into(index, t.bytes_mut())?;
        Ok((t, self.label(index)?))
    }

    /// The image and label fields: the loader's default collation decodes and transforms
    /// each image straight into its batch slot, as [`longshore_data::DirectCollate`] does
    /// (the same pixels, the same draws: labels draw nothing).
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(DirectPlan::new(self))
    }
}

impl DirectDataset for ImageDataset {
    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        match field {
            0 => self.image_into(index, out),
            1 => {
                let label = self.label(index)?;
                if out.len() != 8 {
                    return Err(DataError::BufferTooSmall {
                        what: "label slot",
                        needed: 8,
                        got: out.len(),
                    });
                }
                out.copy_from_slice(&label.to_ne_bytes());
                Ok(())
            }
            f => Err(DataError::IndexOutOfRange {
                index: f,
                len: 2,
                what: "fields",
            }),
        }
    }
}
