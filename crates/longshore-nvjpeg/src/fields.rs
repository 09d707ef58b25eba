//! Shards of any fields with their image decoded on the GPU (feature `shards`):
//! [`EncodedFields`], longshore-vision's [`FieldRecords`] (CLIP-style `.jpg` + `.txt`, an
//! image with labels, arrays, JSON) whose workers read and plan the image as
//! [`EncodedShards`](crate::EncodedShards)' do and leave it encoded for nvJPEG, and
//! [`FieldsCollate`], which writes the encoded images and the other fields into one
//! page-locked batch.
//!
//! The device batch holds the fields in their order, as the CPU path's batch does
//! ([`RecordCollate`]'s layout, the [module docs of the fields](longshore_vision::shards::fields)):
//! the image field is the decoded `[B, 3, H, W]` tensor (named after its field), an int, float
//! or array field its `[B, ...]` tensor, a variable-length field (text, JSON, bytes) its
//! `<name>` bytes and `<name>.offsets` tensors, uploaded on the decoder's stream. The
//! variable-length fields also stay on the host, in
//! [`NvjpegInfo::variable_fields`](crate::NvjpegInfo::variable_fields), for whoever turns them
//! into strings. A sample the stage drops (under `SampleErrorPolicy::Skip`) is dropped from
//! every field.

use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{
    AlignedBuf, Batch, BatchLayout, Collate, DataError, ItemIter, IterableDataset, Storage,
    WorkerInfo,
};
use longshore_shards::dataset::{ShardSample, ShardedDataset};
use longshore_transfer::{Device, TransferError};
use longshore_vision::shards::fields::{
    FieldKind, FieldRecord, FieldRecords, RecordCollate, ShardField,
};

use super::decoder::{FieldOut, NvjpegDecoder};
use super::encoded::{EncodedSample, PlannedSample, planned_layout, write_planned};
use super::plan::check_steps;
use super::shards::sample_names;

/// Shards read field by field with their image decoded on the GPU: vision's
/// [`FieldRecords`] whose workers read each sample's fields and its JPEG's header and draw its
/// crop from the sample's seed (the boxes the CPU path draws), leaving the JPEG for nvJPEG.
///
/// The device batch holds the fields in their order, as the CPU path's batch does
/// ([`RecordCollate`]'s layout): the image field the decoded `[B, 3, H, W]` tensor (named after
/// its field), an int, float or array field its `[B, ...]` tensor, a text, JSON or bytes field
/// its `<name>` bytes and `<name>.offsets` tensors. Those variable-length fields also stay on
/// the host, in [`NvjpegInfo::variable_fields`](crate::NvjpegInfo::variable_fields). A sample
/// the device stage drops (under `SampleErrorPolicy::Skip`) is dropped from every field.
///
/// ```no_run
/// # use longshore_shards::dataset::ShardedDataset;
/// # fn f(shards: ShardedDataset, device: &longshore_transfer::Device) -> Result<(), Box<dyn std::error::Error>> {
/// use longshore_loader::DataLoader;
/// use longshore_nvjpeg::EncodedFields;
/// use longshore_vision::shards::fields::{FieldKind, FieldRecords, ShardField};
/// use longshore_vision::{Compose, DecodeOptions};
///
/// let fields = [ShardField::new("jpg", FieldKind::Image), ShardField::new("txt", FieldKind::Text)];
/// let records = FieldRecords::new(shards, fields, Some(Compose::imagenet_train()), DecodeOptions::default());
/// let encoded = EncodedFields::new(records)?;
/// let decoder = encoded.decoder(device)?;
/// let collate = encoded.collate();
/// let loader = DataLoader::iterable(encoded)
///     .collate(collate)
///     .batch_size(256)
///     .num_workers(8)
///     .build()?
///     .with_stage(decoder);
/// for batch in loader.iter()? {
///     let batch = batch?; // "jpg" [256, 3, 224, 224] f32, "txt" and "txt.offsets" on the GPU
///     let info: &longshore_nvjpeg::NvjpegInfo = batch.extension().unwrap();
///     let (captions, offsets) = &info.variable_fields()[0]; // the captions, on the host
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct EncodedFields {
    records: FieldRecords,
    rest: RecordCollate,
}

/// An item of [`EncodedFields`]: the sample's image, read and planned, and its other fields.
#[derive(Debug, Clone)]
pub struct EncodedRecord {
    /// The image (its index is the sample's global id; its label is 0).
    pub image: PlannedSample,
    /// The other fields, in order (the image taken out).
    pub fields: FieldRecord,
}

impl EncodedFields {
    /// `records`, whose one [`Image`](FieldKind::Image) field is decoded on the device by its
    /// pipeline.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when no field or more than one is an image, without a
    /// pipeline, or for a pipeline the device cannot run ([`check_steps`]).
    pub fn new(records: FieldRecords) -> Result<EncodedFields, DataError> {
        let images = records
            .fields()
            .iter()
            .filter(|f| f.kind == FieldKind::Image)
            .count();
        if images != 1 {
            return Err(DataError::InvalidArgument {
                name: "fields",
                reason: format!(
                    "nvJPEG decodes one image field; these fields have {images} ({})",
                    names(records.fields())
                ),
            });
        }
        let Some(transform) = records.transform() else {
            return Err(DataError::InvalidArgument {
                name: "transform",
                reason: "an image field decoded on the device needs a pipeline".into(),
            });
        };
        check_steps(transform.steps())?;
        let rest = records.collate().without_image();
        Ok(EncodedFields { records, rest })
    }

    /// The records (the same shards, fields and pipeline; their CPU form).
    pub fn records(&self) -> &FieldRecords {
        &self.records
    }

    /// The shards.
    pub fn dataset(&self) -> &ShardedDataset {
        self.records.dataset()
    }

    /// The collation of this dataset's items.
    pub fn collate(&self) -> FieldsCollate {
        FieldsCollate {
            rest: self.rest.clone(),
        }
    }

    /// Reads one sample's fields, and its image's header, and draws its crop from the
    /// sample's seed (the boxes the CPU path draws): what each item of this dataset is.
    ///
    /// # Errors
    /// As [`FieldRecords::read`]; an image whose header does not parse, naming
    /// `shard-url#key.ext`.
    pub fn encode(&self, sample: ShardSample) -> Result<EncodedRecord, DataError> {
        let index =
            usize::try_from(sample.id.global).map_err(|_| DataError::Overflow("sample id"))?;
        let mut fields = self.records.read(sample)?;
        let (path, bytes) = fields
            .take_image()
            .ok_or_else(|| DataError::Other("a record without its image".into()))?;
        let transform = self
            .records
            .transform()
            .ok_or_else(|| DataError::InvalidArgument {
                name: "transform",
                reason: "an image field decoded on the device needs a pipeline".into(),
            })?;
        let encoded = EncodedSample::from_bytes(path, 0, bytes, self.records.options(), false)?;
        let mut rng = epoch_rng(fields.seed(), 0);
        let image = PlannedSample::new(index, encoded, transform, &mut rng)?;
        Ok(EncodedRecord { image, fields })
    }

    /// The device stage for these records on `device` (a CUDA device): an nvJPEG decoder
    /// with the image field's pipeline that carries the other fields into the device batch.
    ///
    /// # Errors
    /// As [`NvjpegDecoder::new`]: libnvjpeg or NVRTC missing, the `Cpu` device, driver errors.
    pub fn decoder(&self, device: &Device) -> Result<NvjpegDecoder, TransferError> {
        let transform = self
            .records
            .transform()
            .ok_or_else(|| TransferError::Invalid("an image field needs a pipeline".into()))?;
        let out: Arc<[FieldOut]> = self
            .records
            .fields()
            .iter()
            .map(|f| match f.kind {
                FieldKind::Image => FieldOut::Image(f.name.as_str().into()),
                k if k.is_variable() => FieldOut::Variable,
                _ => FieldOut::Rows,
            })
            .collect();
        let decoder = NvjpegDecoder::for_pipeline(
            device,
            transform,
            *self.records.options(),
            sample_names(self.dataset()),
        )?;
        Ok(decoder.carry(out))
    }
}

fn names(fields: &[ShardField]) -> String {
    fields
        .iter()
        .map(|f| format!("{}: {}", f.name, f.kind))
        .collect::<Vec<_>>()
        .join(", ")
}

impl IterableDataset for EncodedFields {
    type Item = EncodedRecord;

    // To the shards, through the records' own forwarding.
    longshore_data::forward_epoch_seam!(records);

    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, EncodedRecord> {
        Box::new(
            self.records
                .dataset()
                .iter(worker)
                .map(move |item| item.and_then(|s| self.encode(s))),
        )
    }
}

/// Writes batches of [`EncodedRecord`]s: the encoded images' three tensors first, as
/// [`EncodedCollate`](crate::EncodedCollate) writes them (`bytes`, `meta`, `label`), then the
/// other fields' tensors in field order, as [`RecordCollate`] writes them. Made by
/// [`EncodedFields::collate`].
#[derive(Debug, Clone)]
pub struct FieldsCollate {
    rest: RecordCollate,
}

impl FieldsCollate {
    /// The records' other fields, borrowed.
    fn fields(samples: &[EncodedRecord]) -> Vec<&FieldRecord> {
        samples.iter().map(|s| &s.fields).collect()
    }

    /// The layout of the other fields alone (a batch of `rest`'s own).
    fn rest_layout(&self, fields: &[&FieldRecord]) -> Result<Option<BatchLayout>, DataError> {
        if self.rest.fields().is_empty() {
            return Ok(None);
        }
        self.rest.layout_of(fields).map(Some)
    }
}

impl Collate<EncodedRecord> for FieldsCollate {
    fn layout(&self, samples: &[EncodedRecord]) -> Result<BatchLayout, DataError> {
        let mut layout = planned_layout(samples.iter().map(|s| &s.image))?;
        if let Some(rest) = self.rest_layout(&FieldsCollate::fields(samples))? {
            for t in rest.tensors() {
                layout.push(t.name.clone(), t.dtype, t.shape.clone())?;
            }
        }
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[EncodedRecord],
        layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        let fields = FieldsCollate::fields(samples);
        let rest = self.rest_layout(&fields)?;
        let extra = rest.as_ref().map_or(0, |r| r.tensors().len());
        if layout.tensors().len() != 3 + extra {
            return Err(DataError::ShapeMismatch(format!(
                "a record batch's layout of {} tensors for 3 + {extra}",
                layout.tensors().len()
            )));
        }
        // The images' tensors first, as EncodedCollate writes them.
        let batch = write_planned(samples.iter().map(|s| &s.image), layout, storage)?;
        let (layout, mut storage) = batch.into_parts();
        if let Some(rest) = rest {
            // The other fields into a buffer of their own layout, then each tensor to its
            // place after the images'.
            let scratch = AlignedBuf::zeroed(rest.total_bytes().max(1));
            let written = self.rest.collate_records(&fields, rest, scratch)?;
            for (k, t) in written.layout().tensors().iter().enumerate() {
                let to = &layout.tensors()[3 + k];
                if to.len != t.len {
                    return Err(DataError::ShapeMismatch(format!(
                        "record batch: tensor {:?} of {} bytes for {}",
                        t.name, t.len, to.len
                    )));
                }
                storage[to.range()].copy_from_slice(written.tensor_bytes(k)?);
            }
        }
        Batch::from_parts(layout, storage)
    }

    fn check_item(&self, item: &EncodedRecord) -> Result<(), DataError> {
        self.rest.check_item(&item.fields)
    }
}
