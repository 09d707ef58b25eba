//! The worker side of device decoding: [`EncodedImages`] (an image folder whose samples are
//! file bytes with their crop plans, [`PlannedSample`]s, as image shards' are) and
//! [`EncodedCollate`], which writes a batch of them into one (page-locked) buffer: the files'
//! bytes, one metadata row per sample, and the labels.
//!
//! Workers only read files, parse headers and draw the crop boxes; JPEGs are decoded on the
//! device. Files that are not JPEG (PNG) are decoded by the worker on the CPU and travel as RGB
//! pixels, so the device stage only uploads them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use longshore_data::seed::mix;
use longshore_data::{Batch, BatchLayout, Collate, DType, DataError, Dataset, Storage};

use super::header::{JpegHeader, JpegRoute};
use super::plan::{PLAN_FIELDS, SamplePlan, check_steps, plan};
use longshore_vision::compose::Compose;
use longshore_vision::dataset::ImageDataset;
use longshore_vision::decode::{DecodeError, DecodeOptions, ImageFormat, decode_rgb, probe};
use longshore_vision::folder::invalid;

/// How a sample's bytes are stored in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Payload {
    /// The JPEG file as it is, to decode on the device.
    Jpeg,
    /// RGB pixels (HWC), decoded by the worker (a PNG, or a JPEG the hardware engines do not
    /// take).
    Rgb,
}

/// Fields of a metadata row before the plan: index, label, payload, offset, length, width,
/// height, hardware.
const HEAD: usize = 8;
/// `i64`s per sample in a batch's `meta` tensor.
pub const META_FIELDS: usize = HEAD + PLAN_FIELDS;

/// Name of the batch tensor holding the files' bytes (u8, one dimension).
pub const BYTES: &str = "bytes";
/// Name of the metadata tensor (i64 `[B, META_FIELDS]`).
pub const META: &str = "meta";
/// Name of the label tensor (i64 `[B]`).
pub const LABEL: &str = "label";

/// One sample of an encoded batch, read back from its metadata row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedEntry {
    /// The dataset index.
    pub index: usize,
    /// The class.
    pub label: i64,
    /// What the bytes are.
    pub payload: Payload,
    /// Offset of the bytes in the `bytes` tensor.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// The worker's marker walk found a JPEG nvJPEG's hardware engines take
    /// ([`JpegRoute::Hardware`]): the device stage decodes it in the batched hardware call
    /// without checking it with nvJPEG first.
    pub hardware: bool,
    /// Where the output pixels come from.
    pub plan: SamplePlan,
}

impl EncodedEntry {
    fn to_row(self) -> [i64; META_FIELDS] {
        let mut row = [0i64; META_FIELDS];
        row[0] = self.index as i64;
        row[1] = self.label;
        row[2] = match self.payload {
            Payload::Jpeg => 0,
            Payload::Rgb => 1,
        };
        row[3] = self.offset as i64;
        row[4] = self.len as i64;
        row[5] = self.width as i64;
        row[6] = self.height as i64;
        row[7] = i64::from(self.hardware);
        row[HEAD..].copy_from_slice(&self.plan.to_fields());
        row
    }

    fn from_row(row: &[i64]) -> Result<EncodedEntry, DataError> {
        let bad = |what: &str| DataError::ShapeMismatch(format!("encoded batch: {what}"));
        if row.len() != META_FIELDS {
            return Err(bad("metadata row of the wrong length"));
        }
        let u = |v: i64| usize::try_from(v).map_err(|_| bad("negative size or offset"));
        let payload = match row[2] {
            0 => Payload::Jpeg,
            1 => Payload::Rgb,
            _ => return Err(bad("unknown payload kind")),
        };
        let plan: &[i64; PLAN_FIELDS] = row[HEAD..].try_into().map_err(|_| bad("plan"))?;
        Ok(EncodedEntry {
            index: u(row[0])?,
            label: row[1],
            payload,
            offset: u(row[3])?,
            len: u(row[4])?,
            width: u(row[5])?,
            height: u(row[6])?,
            hardware: match row[7] {
                0 => false,
                1 => true,
                _ => return Err(bad("unknown hardware flag")),
            },
            plan: SamplePlan::from_fields(plan),
        })
    }
}

/// The entries of an encoded batch and the bytes of the `bytes` tensor.
///
/// # Errors
/// [`DataError::ShapeMismatch`] when the batch was not written by [`EncodedCollate`].
pub fn entries<S: Storage>(batch: &Batch<S>) -> Result<(Vec<EncodedEntry>, &[u8]), DataError> {
    let pos = |name: &str| {
        batch.layout().position(name).ok_or_else(|| {
            DataError::ShapeMismatch(format!("encoded batch has no '{name}' tensor"))
        })
    };
    let meta: &[i64] = batch.tensor(pos(META)?)?;
    let bytes = batch.tensor_bytes(pos(BYTES)?)?;
    let rows: Vec<EncodedEntry> = meta
        .chunks_exact(META_FIELDS)
        .map(EncodedEntry::from_row)
        .collect::<Result<_, _>>()?;
    if let Some(e) = rows.iter().find(|e| e.offset + e.len > bytes.len()) {
        return Err(DataError::ShapeMismatch(format!(
            "encoded batch: sample {} reaches past the bytes tensor",
            e.index
        )));
    }
    Ok((rows, bytes))
}

/// An [`ImageDataset`] (a folder with its pipeline) decoded on the device: its samples are
/// the files' bytes with the geometry the workers draw ([`EncodedCollate`] writes its
/// batches), as [`EncodedShards`](crate::EncodedShards) is image shards decoded on the device.
///
/// Its items are [`PlannedSample`]s: `get` reads the file, checks its header and draws its
/// crop from the dataset's [`RandomSource`](longshore_vision::RandomSource) (the boxes the CPU
/// path draws for the same index), in the worker.
///
/// ```
/// use longshore_data::{AlignedBuf, Collate, Dataset};
/// use longshore_nvjpeg::{EncodedCollate, EncodedImages, entries};
/// use longshore_vision::{Compose, ImageFolder};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # longshore_vision::synth::write_folder(dir.path(), &longshore_vision::synth::FolderSpec::tiny())?;
/// let files = EncodedImages::new(ImageFolder::new(dir.path())?.with_transform(Compose::imagenet_train()))?;
/// let samples = [files.get(0)?, files.get(1)?]; // what a loader worker does
/// let layout = EncodedCollate.layout(&samples)?;
/// let buffer = AlignedBuf::zeroed(layout.total_bytes());
/// let batch = EncodedCollate.collate_into(&samples, layout, buffer)?;
/// let (rows, bytes) = entries(&batch)?;
/// assert_eq!(rows.len(), 2);
/// assert_eq!(&bytes[rows[0].offset..rows[0].offset + 2], &[0xFF, 0xD8]); // a JPEG's SOI
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct EncodedImages {
    images: ImageDataset,
    /// The share of hardware-routed JPEGs the workers decode on the CPU, in units of 2^-32
    /// (shared by clones: workers see a change at their next sample).
    cpu_share: Arc<AtomicU32>,
}

/// A sample of [`EncodedImages`]: the file's bytes and what its header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSample {
    /// The file.
    pub path: PathBuf,
    /// The class.
    pub label: i64,
    /// The file's format.
    pub format: ImageFormat,
    /// What `bytes` hold: the JPEG file for the device to decode, or RGB pixels decoded by the
    /// worker (a PNG, or a JPEG the hardware engines do not take, such as a progressive one).
    pub payload: Payload,
    /// Width from the header.
    pub width: usize,
    /// Height from the header.
    pub height: usize,
    /// Whether the worker's marker walk routes this JPEG to nvJPEG's hardware engines with no
    /// further check ([`JpegRoute::Hardware`]; false for pixels and for JPEGs the device stage
    /// checks with nvJPEG per image).
    pub hardware: bool,
    /// The file's bytes ([`Payload::Jpeg`]) or the decoded RGB pixels ([`Payload::Rgb`]).
    pub bytes: Vec<u8>,
}

impl EncodedSample {
    /// An encoded image read from anywhere (a file, a shard): `bytes` checked as the CPU path
    /// checks them (format, pixel limit, a readable header) and routed. A JPEG nvJPEG's
    /// hardware engines take stays encoded for the device unless `on_cpu` (a CPU share, see
    /// [`EncodedImages::cpu_share`]); other JPEGs (progressive, ...) and other formats (PNG)
    /// are decoded here to RGB. `path` names the image in errors.
    ///
    /// # Errors
    /// [`DataError::InvalidFile`] naming `path`.
    pub fn from_bytes(
        path: PathBuf,
        label: i64,
        bytes: Vec<u8>,
        options: &DecodeOptions,
        on_cpu: bool,
    ) -> Result<EncodedSample, DataError> {
        let header = probe(&bytes).map_err(|e| invalid(&path, e))?;
        check_limit(options, header.width, header.height).map_err(|e| invalid(&path, e))?;
        // The marker walk decides who decodes a JPEG, here in the workers, so that the device
        // stage's one thread only calls nvJPEG; its dimensions must agree with the header
        // decoder's, or the device stage checks the file itself.
        let route = match header.format {
            ImageFormat::Jpeg => match JpegHeader::walk(&bytes) {
                Ok(h) if (h.width, h.height) == (header.width, header.height) => h.route(),
                _ => JpegRoute::Check,
            },
            // PNG, and any format the CPU decoder learns later: decoded by the workers.
            _ => JpegRoute::CpuHuffman,
        };
        let on_cpu = route == JpegRoute::Hardware && on_cpu;
        let (bytes, payload) = match route {
            JpegRoute::Hardware | JpegRoute::Check if !on_cpu => (bytes, Payload::Jpeg),
            // A PNG, or a JPEG that nvJPEG's hardware engines do not take (progressive,
            // arithmetic, lossless: about 5% of ImageNet). nvJPEG's default backend would run
            // its Huffman pass on the CPU, one image at a time on the device stage's single
            // thread; decoding it here, in parallel workers, keeps that thread free. Or a JPEG of
            // the CPU share, which the workers decode beside the engines.
            _ => {
                let image = decode_rgb(&bytes, options).map_err(|e| invalid(&path, e))?;
                (image.into_vec(), Payload::Rgb)
            }
        };
        Ok(EncodedSample {
            path,
            label,
            format: header.format,
            payload,
            width: header.width,
            height: header.height,
            hardware: route == JpegRoute::Hardware && !on_cpu,
            bytes,
        })
    }
}

/// A sample of a source of encoded images (an [`EncodedImages`] folder, image shards): the
/// image, its dataset index (what errors and [`NvjpegInfo::indices`](crate::NvjpegInfo::indices)
/// report) and its crop plan, drawn by the worker. [`EncodedCollate`] batches these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSample {
    /// The sample's index in its dataset.
    pub index: usize,
    /// The image.
    pub sample: EncodedSample,
    /// Where its output pixels come from.
    pub plan: SamplePlan,
}

impl PlannedSample {
    /// `sample` with its plan through `transform`, drawn from `rng` as the CPU pipeline
    /// ([`Compose::decode_into`](longshore_vision::Compose::decode_into)) draws its boxes from the
    /// same generator.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a pipeline the device cannot run.
    pub fn new(
        index: usize,
        sample: EncodedSample,
        transform: &Compose,
        rng: &mut longshore_data::rng::Rng,
    ) -> Result<PlannedSample, DataError> {
        let plan = plan(
            transform.steps(),
            sample.width,
            sample.height,
            transform.output_size(),
            rng,
        )?;
        Ok(PlannedSample {
            index,
            sample,
            plan,
        })
    }
}

impl EncodedImages {
    /// `images` (a folder with its pipeline, drawing from its
    /// [`RandomSource`](longshore_vision::RandomSource)) for decoding on the device.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a pipeline the device cannot run
    /// ([`check_steps`](super::plan::check_steps)).
    pub fn new(images: ImageDataset) -> Result<EncodedImages, DataError> {
        check_steps(images.transform().steps())?;
        Ok(EncodedImages {
            images,
            cpu_share: Arc::new(AtomicU32::new(0)),
        })
    }

    /// Has the workers decode `share` (0 to 1) of the JPEGs the hardware engines would take on
    /// the CPU, as a PNG is, so the device stage only crops, resizes and normalises their
    /// pixels: the GPU's JPEG engines and the host's idle cores decode side by side. Default
    /// 0: every such JPEG goes to the engines.
    ///
    /// nvJPEG's hardware decoder has a fixed rate per GPU (about 20,000 ImageNet-sized images/s
    /// on an H100 or H200, batches of 256); with fast training steps it is the bound of the
    /// device path while the workers, which only read files, leave most cores idle. Moving a
    /// share of the decoding to them raises the pipeline's rate up to what both decode
    /// together (DALI's `hw_decoder_load` splits the same work between the engines and CUDA
    /// decoding). A share too large makes the workers the bound instead: measure it
    /// (`jpeg-bench --cpu-share 0,0.1,0.2,0.3`) on the training host.
    ///
    /// Which JPEGs go to the CPU is a fixed function of the dataset index (a hash compared
    /// with the share), so a run decodes the same files the same way each time; the pixels of
    /// a CPU-decoded file are libjpeg-turbo's (PIL's) instead of nvJPEG's (within a few
    /// levels, see the [module docs](super)). Values outside 0..=1 are clamped; NaN counts as 0.
    pub fn cpu_share(self, share: f64) -> EncodedImages {
        self.set_cpu_share(share);
        self
    }

    /// Changes the CPU share of a dataset already in a loader (its clones in the workers share
    /// it; each worker reads it per sample). See [`cpu_share`](EncodedImages::cpu_share).
    pub fn set_cpu_share(&self, share: f64) {
        let share = if share.is_nan() {
            0.0
        } else {
            share.clamp(0.0, 1.0)
        };
        // 1.0 maps to u32::MAX + 1, saturated to u32::MAX: `decode_on_cpu` treats that as all.
        let units = (share * 4_294_967_296.0).min(u32::MAX as f64) as u32;
        self.cpu_share.store(units, Ordering::Relaxed);
    }

    /// The CPU share (0 to 1, as stored: a multiple of 2^-32).
    pub fn current_cpu_share(&self) -> f64 {
        let units = self.cpu_share.load(Ordering::Relaxed);
        if units == u32::MAX {
            1.0
        } else {
            f64::from(units) / 4_294_967_296.0
        }
    }

    /// Whether sample `index`, a JPEG the engines take, is decoded by the worker instead
    /// ([`cpu_share`](EncodedImages::cpu_share)).
    fn decode_on_cpu(&self, index: usize) -> bool {
        match self.cpu_share.load(Ordering::Relaxed) {
            0 => false,
            u32::MAX => true,
            units => (mix(index as u64 ^ 0x6A09_E667_F3BC_C909) >> 32) < u64::from(units),
        }
    }

    /// The folder and pipeline (its random source and epoch are this dataset's).
    pub fn images(&self) -> &ImageDataset {
        &self.images
    }

    /// The folder.
    pub fn folder(&self) -> &longshore_vision::ImageFolder {
        self.images.folder()
    }

    /// The pipeline.
    pub fn transform(&self) -> &Compose {
        self.images.transform()
    }

    fn path(&self, index: usize) -> Result<(&Path, i64), DataError> {
        let folder = self.images.folder();
        folder
            .samples()
            .get(index)
            .map(|(p, l)| (p.as_path(), *l as i64))
            .ok_or(DataError::IndexOutOfRange {
                index,
                len: folder.len(),
                what: "image folder",
            })
    }

    /// Reads sample `index`: a JPEG's bytes with its dimensions, or another format decoded to
    /// RGB. The same checks as the CPU path: format, pixel limit, a readable header.
    ///
    /// # Errors
    /// [`DataError::Io`] or [`DataError::InvalidFile`] naming the file.
    pub fn read(&self, index: usize) -> Result<EncodedSample, DataError> {
        let (path, label) = self.path(index)?;
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        EncodedSample::from_bytes(
            path.to_path_buf(),
            label,
            bytes,
            self.images.folder().decode(),
            self.decode_on_cpu(index),
        )
    }

    /// Reads sample `index` ([`read`](EncodedImages::read)) and draws its crop from the
    /// images' [`RandomSource`](longshore_vision::RandomSource), as the CPU pipeline draws its boxes for the same index:
    /// what each item of this dataset is.
    ///
    /// # Errors
    /// As [`read`](EncodedImages::read).
    pub fn planned(&self, index: usize) -> Result<PlannedSample, DataError> {
        let sample = self.read(index)?;
        let transform = self.images.transform();
        let (size, steps) = (transform.output_size(), transform.steps());
        let plan = self.images.draw(index, |rng| {
            plan(steps, sample.width, sample.height, size, rng)
        })?;
        Ok(PlannedSample {
            index,
            sample,
            plan,
        })
    }
}

/// The pixel limit of `options` (and zero sizes), as the CPU decoder checks them.
pub(crate) fn check_limit(
    options: &DecodeOptions,
    width: usize,
    height: usize,
) -> Result<(), DecodeError> {
    let pixels = width as u64 * height as u64;
    if width == 0 || height == 0 {
        return Err(DecodeError::ZeroSize { width, height });
    }
    match options.max_pixels {
        Some(limit) if pixels > limit => Err(DecodeError::TooManyPixels {
            width,
            height,
            pixels,
            limit,
        }),
        _ => Ok(()),
    }
}

impl Dataset for EncodedImages {
    type Item = PlannedSample;

    fn len(&self) -> usize {
        self.images.folder().len()
    }

    fn get(&self, index: usize) -> Result<PlannedSample, DataError> {
        self.planned(index)
    }
}

/// Writes batches of [`PlannedSample`]s (the items of [`EncodedImages`] and of image shards):
/// tensors `bytes` (u8, the files back to back, each at a multiple of 16), `meta` (i64
/// `[B, META_FIELDS]`: index, label, payload, offset, length, width, height, hardware, then the
/// [`SamplePlan`]) and `label` (i64 `[B]`), in one buffer. The crop boxes were drawn by the
/// workers with each sample, as the CPU pipeline draws them.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodedCollate;

const SLOT_ALIGN: usize = 16;

/// The entry of each sample (its place in the batch's bytes, each at a multiple of
/// [`SLOT_ALIGN`]) and the bytes tensor's length.
fn place<'a>(
    samples: impl Iterator<Item = (usize, &'a EncodedSample, SamplePlan)>,
) -> Result<(Vec<EncodedEntry>, usize), DataError> {
    let mut entries = Vec::new();
    let mut total = 0usize;
    for (index, s, plan) in samples {
        entries.push(EncodedEntry {
            index,
            label: s.label,
            payload: s.payload,
            offset: total,
            len: s.bytes.len(),
            width: s.width,
            height: s.height,
            hardware: s.hardware,
            plan,
        });
        total = (total + s.bytes.len())
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or(DataError::Overflow("encoded batch"))?;
    }
    Ok((entries, total))
}

/// The layout of a batch of `b` samples whose bytes take `total` bytes.
fn batch_layout(b: usize, total: usize) -> Result<BatchLayout, DataError> {
    if b == 0 {
        return Err(DataError::Empty { what: "batch" });
    }
    let mut layout = BatchLayout::new(b);
    layout.push(Some(BYTES.into()), DType::U8, vec![total.max(1)])?;
    layout.push(Some(META.into()), DType::I64, vec![b, META_FIELDS])?;
    layout.push(Some(LABEL.into()), DType::I64, vec![b])?;
    Ok(layout)
}

/// Writes placed samples into `storage`.
fn write_placed<'a, S: Storage>(
    layout: BatchLayout,
    samples: impl Iterator<Item = (&'a EncodedEntry, &'a [u8])> + Clone,
    storage: S,
) -> Result<Batch<S>, DataError> {
    let mut batch = Batch::from_parts(layout, storage)?;
    {
        let bytes: &mut [u8] = batch.tensor_mut(0)?;
        for (e, data) in samples.clone() {
            bytes[e.offset..e.offset + e.len].copy_from_slice(data);
        }
    }
    {
        let meta: &mut [i64] = batch.tensor_mut(1)?;
        for ((e, _), row) in samples.clone().zip(meta.chunks_exact_mut(META_FIELDS)) {
            row.copy_from_slice(&e.to_row());
        }
    }
    let labels: &mut [i64] = batch.tensor_mut(2)?;
    for ((e, _), l) in samples.zip(labels.iter_mut()) {
        *l = e.label;
    }
    Ok(batch)
}

/// The layout [`EncodedCollate`] gives `samples` (also the front of a record batch's).
pub(crate) fn planned_layout<'a>(
    samples: impl Iterator<Item = &'a PlannedSample>,
) -> Result<BatchLayout, DataError> {
    let (entries, total) = place(samples.map(|p| (p.index, &p.sample, p.plan)))?;
    batch_layout(entries.len(), total)
}

/// Writes `samples` into `storage` as [`EncodedCollate`] does, for `layout` (the three
/// tensors first; a record batch's others follow).
pub(crate) fn write_planned<'a, S: Storage>(
    samples: impl Iterator<Item = &'a PlannedSample> + Clone,
    layout: BatchLayout,
    storage: S,
) -> Result<Batch<S>, DataError> {
    let (entries, _) = place(samples.clone().map(|p| (p.index, &p.sample, p.plan)))?;
    write_placed(
        layout,
        entries
            .iter()
            .zip(samples)
            .map(|(e, p)| (e, p.sample.bytes.as_slice())),
        storage,
    )
}

impl Collate<PlannedSample> for EncodedCollate {
    fn layout(&self, samples: &[PlannedSample]) -> Result<BatchLayout, DataError> {
        planned_layout(samples.iter())
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[PlannedSample],
        layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        write_planned(samples.iter(), layout, storage)
    }
}
