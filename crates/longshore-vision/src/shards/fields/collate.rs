//! [`RecordCollate`]: a batch of [`FieldRecord`]s written into its (page-locked) buffer, field
//! by field, as the [module docs](super) lay out.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use longshore_data::rng::epoch_rng;
use longshore_data::{Batch, BatchLayout, Collate, DType, DataError, Storage};

use super::{FieldKind, FieldRecord, ShardField, Value};
use crate::{Compose, DecodeOptions};

/// Writes [`FieldRecord`]s into their batch: per field, in order, one tensor (image, int,
/// float) or two (`<name>`: bytes, `u8`; `<name>.offsets`: `i64 [B + 1]`), as the
/// [module docs](super) lay out. Made by [`FieldRecords::collate`](super::FieldRecords::collate).
///
/// An image that fails while decoding into the batch is found by [`Collate::check_item`], so
/// the loader's `on_sample_error` names or skips that sample alone.
#[derive(Debug, Clone)]
pub struct RecordCollate {
    fields: Arc<[ShardField]>,
    transform: Option<Arc<Compose>>,
    decode: DecodeOptions,
}

thread_local! {
    /// An image slot for [`RecordCollate::check_item`] (only on a failed batch).
    static SLOT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl RecordCollate {
    /// The collation of `fields` (in this order), the image field decoded by `transform`.
    pub(super) fn new(
        fields: Arc<[ShardField]>,
        transform: Option<Arc<Compose>>,
        decode: DecodeOptions,
    ) -> RecordCollate {
        RecordCollate {
            fields,
            transform,
            decode,
        }
    }

    /// The fields, in the order of the batch's tensors.
    pub fn fields(&self) -> &Arc<[ShardField]> {
        &self.fields
    }

    /// Field `index` of `record`, an image, decoded and transformed by the pipeline as its
    /// batch slot would be (the same generator of the record's seed): the pipeline's output
    /// bytes, `None` when the field is no image.
    ///
    /// # Errors
    /// A decode error naming the shard, the key and the field; a missing pipeline.
    pub fn decode_image(
        &self,
        record: &FieldRecord,
        index: usize,
    ) -> Result<Option<Vec<u8>>, DataError> {
        let Some((path, bytes)) = record.image(index) else {
            return Ok(None);
        };
        let mut out = vec![0u8; self.pipeline()?.output_bytes()];
        self.decode_into(path, bytes, record.seed, &mut out)?;
        Ok(Some(out))
    }

    /// The collation of the fields other than the image, in order: for records whose image
    /// was [taken out](FieldRecord::take_image) to be decoded elsewhere (nvJPEG).
    pub fn without_image(&self) -> RecordCollate {
        RecordCollate {
            fields: self
                .fields
                .iter()
                .filter(|f| f.kind != FieldKind::Image)
                .cloned()
                .collect(),
            transform: None,
            decode: self.decode,
        }
    }

    fn pipeline(&self) -> Result<&Compose, DataError> {
        self.transform
            .as_deref()
            .ok_or_else(|| DataError::Other("an image field without a pipeline".into()))
    }

    fn decode_into(
        &self,
        path: &Path,
        bytes: &[u8],
        seed: u64,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let mut rng = epoch_rng(seed, 0);
        self.pipeline()?
            .decode_into(path, bytes, &self.decode, &mut rng, out)
    }
}

impl Collate<FieldRecord> for RecordCollate {
    fn layout(&self, samples: &[FieldRecord]) -> Result<BatchLayout, DataError> {
        self.layout_of(samples)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[FieldRecord],
        layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        self.collate_records(samples, layout, storage)
    }

    fn check_item(&self, item: &FieldRecord) -> Result<(), DataError> {
        for v in &item.values {
            if let Value::Image(path, bytes) = v {
                let per = self.pipeline()?.output_bytes();
                SLOT.with_borrow_mut(|slot| {
                    slot.resize(per, 0);
                    self.decode_into(path, bytes, item.seed, slot)
                })?;
            }
        }
        Ok(())
    }
}

impl RecordCollate {
    /// The layout of a batch of `samples` ([`Collate::layout`], for records held elsewhere:
    /// `&[&FieldRecord]` as well as `&[FieldRecord]`).
    ///
    /// # Errors
    /// As [`Collate::layout`]: an empty batch, arrays that do not stack, a missing pipeline.
    pub fn layout_of<R: Borrow<FieldRecord>>(
        &self,
        samples: &[R],
    ) -> Result<BatchLayout, DataError> {
        if samples.is_empty() {
            return Err(DataError::Empty { what: "batch" });
        }
        let n = samples.len();
        let mut layout = BatchLayout::new(n);
        for (i, f) in self.fields.iter().enumerate() {
            let name = Some(Arc::<str>::from(f.name.as_str()));
            match f.kind {
                FieldKind::Image => {
                    let field = self.pipeline()?.field();
                    let mut shape = vec![n];
                    shape.extend_from_slice(field.shape.dims());
                    layout.push(name, field.dtype, shape)?;
                }
                FieldKind::Int => {
                    layout.push(name, DType::I64, vec![n])?;
                }
                FieldKind::Float => {
                    layout.push(name, DType::F64, vec![n])?;
                }
                FieldKind::Array => {
                    let (dtype, dims) = stacked(samples, i, &f.name)?;
                    let mut shape = vec![n];
                    shape.extend(dims);
                    layout.push(name, dtype, shape)?;
                }
                FieldKind::Text | FieldKind::Json | FieldKind::Bytes => {
                    let total = samples.iter().map(|s| s.borrow().var(i).len()).sum();
                    layout.push(name, DType::U8, vec![total])?;
                    let offsets = Some(Arc::<str>::from(format!("{}.offsets", f.name)));
                    layout.push(offsets, DType::I64, vec![n + 1])?;
                }
            }
        }
        Ok(layout)
    }

    /// Writes `samples` into `storage` for `layout` ([`Collate::collate_into`], for records
    /// held elsewhere, as [`layout_of`](RecordCollate::layout_of)).
    ///
    /// # Errors
    /// As [`Collate::collate_into`]: a buffer too small, an image that does not decode.
    pub fn collate_records<R: Borrow<FieldRecord>, S: Storage>(
        &self,
        samples: &[R],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        if layout.batch_size() != samples.len() || storage.len() < layout.total_bytes() {
            return Err(DataError::BufferTooSmall {
                what: "batch of sample fields",
                needed: layout.total_bytes(),
                got: storage.len(),
            });
        }
        let out = &mut storage[..layout.total_bytes()];
        // The alignment gaps: never stale bytes.
        let mut end = 0;
        for t in layout.tensors() {
            out[end..t.offset].fill(0);
            end = t.offset + t.len;
        }
        let mut tensors = layout.tensors().iter();
        let mut next = || {
            tensors
                .next()
                .map(|t| t.range())
                .ok_or_else(|| DataError::ShapeMismatch("a layout with too few tensors".into()))
        };
        for (i, f) in self.fields.iter().enumerate() {
            match f.kind {
                FieldKind::Image => {
                    let range = next()?;
                    let per = self.pipeline()?.output_bytes();
                    if range.len() != per * samples.len() {
                        return Err(DataError::ShapeMismatch(format!(
                            "image field {:?}: {} bytes for {} images of {per}",
                            f.name,
                            range.len(),
                            samples.len()
                        )));
                    }
                    for (s, slot) in samples
                        .iter()
                        .map(Borrow::borrow)
                        .zip(out[range].chunks_exact_mut(per.max(1)))
                    {
                        if let Value::Image(path, bytes) = &s.values[i] {
                            self.decode_into(path, bytes, s.seed, slot)?;
                        }
                    }
                }
                FieldKind::Int | FieldKind::Float => {
                    let range = next()?;
                    for (s, slot) in samples
                        .iter()
                        .map(Borrow::borrow)
                        .zip(out[range].chunks_exact_mut(8))
                    {
                        let bytes = match s.values[i] {
                            Value::Int(v) => v.to_ne_bytes(),
                            Value::Float(v) => v.to_ne_bytes(),
                            _ => [0; 8],
                        };
                        slot.copy_from_slice(&bytes);
                    }
                }
                FieldKind::Array => {
                    let range = next()?;
                    let per = range.len() / samples.len().max(1);
                    for (s, slot) in samples
                        .iter()
                        .map(Borrow::borrow)
                        .zip(out[range].chunks_exact_mut(per.max(1)))
                    {
                        match &s.values[i] {
                            Value::Array(_, _, data) if data.len() == slot.len() => {
                                slot.copy_from_slice(data);
                            }
                            _ => {
                                return Err(DataError::ShapeMismatch(format!(
                                    "field {:?}: sample {} does not fit its {per}-byte slot",
                                    f.name, s.origin
                                )));
                            }
                        }
                    }
                }
                FieldKind::Text | FieldKind::Json | FieldKind::Bytes => {
                    let (data, offsets) = (next()?, next()?);
                    let mut at = data.start;
                    let mut off = 0i64;
                    let start = offsets.start;
                    out[start..start + 8].copy_from_slice(&off.to_ne_bytes());
                    for (k, s) in samples.iter().map(Borrow::borrow).enumerate() {
                        let b = s.var(i);
                        out[at..at + b.len()].copy_from_slice(b);
                        at += b.len();
                        off += i64::try_from(b.len())
                            .map_err(|_| DataError::Overflow("field bytes"))?;
                        let o = start + 8 * (k + 1);
                        out[o..o + 8].copy_from_slice(&off.to_ne_bytes());
                    }
                }
            }
        }
        Batch::from_parts(layout, storage)
    }
}

/// The dtype and shape of field `f`'s arrays in `samples`, all equal (they are stacked).
fn stacked<R: Borrow<FieldRecord>>(
    samples: &[R],
    f: usize,
    name: &str,
) -> Result<(DType, Vec<usize>), DataError> {
    let first = samples[0]
        .borrow()
        .array(f)
        .ok_or_else(|| DataError::ShapeMismatch(format!("field {name:?} holds no array")))?;
    for (k, s) in samples.iter().map(Borrow::borrow).enumerate().skip(1) {
        let (dtype, shape, _) = s
            .array(f)
            .ok_or_else(|| DataError::ShapeMismatch(format!("field {name:?} holds no array")))?;
        if dtype != first.0 || shape != first.1 {
            return Err(DataError::ShapeMismatch(format!(
                "field {name:?}: the arrays of a batch are stacked into one tensor (as torch's \
                 default_collate stacks them), but sample {k} of the batch ({}) is {dtype} \
                 {shape:?} where sample 0 ({}) is {} {:?}; give every sample's array one dtype \
                 and shape, or read the field as bytes and decode it yourself",
                s.origin,
                samples[0].borrow().origin,
                first.0,
                first.1
            )));
        }
    }
    Ok((first.0, first.1.to_vec()))
}
