//! A record batch's other fields beside its decoded images (`EncodedFields`): the host batch's
//! tensors after the encoded images' three (`bytes`, `meta`, `label`), uploaded on the
//! decoder's stream into the device batch in field order, with the image where its field is.
//! The samples the stage dropped (under `SampleErrorPolicy::Skip`) are dropped from every
//! field too.

use std::sync::Arc;

use longshore_data::{Batch, BatchLayout, DataError, Storage};
use longshore_loader::{DeviceBatch, DevicePart, LoaderError};
use longshore_transfer::{DeviceBuffer, Event, TransferError};

use super::NvjpegDecoder;
use super::enqueue::htod;
use crate::batch::NvjpegInfo;

/// How the device stage carries one field of a record batch (made by `EncodedFields`, feature
/// `shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "shards"), allow(dead_code))]
pub(crate) enum FieldOut {
    /// The decoded images (the stage's own output), named after their field.
    Image(Arc<str>),
    /// One host tensor `[B, ...]`, one row per sample.
    Rows,
    /// Two host tensors: the samples' bytes back to back (`u8`) and their offsets (`i64`,
    /// `[B + 1]`); also kept on the host ([`NvjpegInfo::variable_fields`]).
    Variable,
}

/// Where one upload's bytes come from: the host batch, or a compacted copy in the slot.
enum Source {
    Host(std::ops::Range<usize>),
    Kept(usize),
}

/// The encoded images' tensors at the front of a record batch.
const ENCODED_TENSORS: usize = 3;

fn shape_err(what: String) -> LoaderError {
    LoaderError::Data(DataError::ShapeMismatch(format!("record batch: {what}")))
}

impl NvjpegDecoder {
    /// Makes this decoder carry a record batch's fields (`fields`, in order, one of them
    /// [`FieldOut::Image`]) beside the images it decodes.
    #[cfg_attr(not(feature = "shards"), allow(dead_code))]
    pub(crate) fn carry(mut self, fields: Arc<[FieldOut]>) -> NvjpegDecoder {
        self.fields = Some(fields);
        self
    }

    /// The device batch of record batch `batch`: `images` (what `run` made of its encoded
    /// images: the image and label tensors, [`NvjpegInfo`] attached) with the other fields
    /// uploaded in field order; `fence` becomes the event after the uploads.
    pub(super) fn carry_fields<S: Storage>(
        &mut self,
        fields: &[FieldOut],
        batch: &Batch<S>,
        images: DeviceBatch,
        fence: &mut Option<Event>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        let mut info: NvjpegInfo = images
            .extension::<NvjpegInfo>()
            .cloned()
            .ok_or_else(|| LoaderError::State("a decoded batch without its NvjpegInfo".into()))?;
        let (parts, _) = images.into_parts();
        let mut image = parts.into_iter().next();
        let n = batch.batch_size();
        let rows = std::mem::take(&mut info.rows);
        let b = rows.len();
        let all = b == n && rows.iter().enumerate().all(|(k, &r)| k == r);
        let slot_i = self.current;
        let host = batch.bytes();
        let mut out = Vec::with_capacity(fields.len());
        let mut uploads: Vec<(usize, usize, Source)> = Vec::new();
        let mut t = ENCODED_TENSORS;
        let spec = |i: usize| {
            batch
                .spec(i)
                .cloned()
                .map_err(|_| shape_err(format!("no tensor {i} for its fields")))
        };
        for f in fields {
            match f {
                FieldOut::Image(name) => {
                    let mut part = image
                        .take()
                        .ok_or_else(|| shape_err("two image fields".into()))?;
                    // The stage's "image" tensor, under its field's name.
                    let decoded = part
                        .layout
                        .tensors()
                        .first()
                        .cloned()
                        .ok_or_else(|| shape_err("no decoded images".into()))?;
                    let mut layout = BatchLayout::new(b);
                    layout.push(Some(name.clone()), decoded.dtype, decoded.shape)?;
                    part.layout = layout;
                    out.push(part);
                }
                FieldOut::Rows => {
                    let s = spec(t)?;
                    t += 1;
                    if s.shape.first() != Some(&n) {
                        return Err(shape_err(format!(
                            "tensor {:?} of shape {:?} is not one row per sample of {n}",
                            s.name, s.shape
                        )));
                    }
                    let per = s.len / n.max(1);
                    let mut layout = BatchLayout::new(b);
                    let mut shape = s.shape.clone();
                    shape[0] = b;
                    layout.push(s.name.clone(), s.dtype, shape)?;
                    let source = if all {
                        Source::Host(s.range())
                    } else {
                        let v = gather_rows(&host[s.range()], per, &rows);
                        self.slots[slot_i].keep.push(v);
                        Source::Kept(self.slots[slot_i].keep.len() - 1)
                    };
                    uploads.push((out.len(), 0, source));
                    out.push(self.part(layout)?);
                }
                FieldOut::Variable => {
                    let (data, offs) = (spec(t)?, spec(t + 1)?);
                    t += 2;
                    let offsets: &[i64] = batch.tensor(t - 1)?;
                    let bytes = batch.tensor_bytes(t - 2)?;
                    if offsets.len() != n + 1 {
                        return Err(shape_err(format!(
                            "{:?} holds {} offsets for {n} samples",
                            offs.name,
                            offsets.len()
                        )));
                    }
                    let (kept, kept_offsets) = if all {
                        (bytes.to_vec(), offsets.to_vec())
                    } else {
                        gather_items(bytes, offsets, &rows)
                            .map_err(|why| shape_err(format!("{:?}: {why}", offs.name)))?
                    };
                    let mut layout = BatchLayout::new(b);
                    layout.push(data.name.clone(), data.dtype, vec![kept.len()])?;
                    layout.push(offs.name.clone(), offs.dtype, vec![b + 1])?;
                    let (d_at, o_at) = (layout.tensors()[0].offset, layout.tensors()[1].offset);
                    let (d_src, o_src) = if all {
                        (Source::Host(data.range()), Source::Host(offs.range()))
                    } else {
                        let keep = &mut self.slots[slot_i].keep;
                        keep.push(kept.clone());
                        keep.push(bytemuck::cast_slice(&kept_offsets).to_vec());
                        (Source::Kept(keep.len() - 2), Source::Kept(keep.len() - 1))
                    };
                    uploads.push((out.len(), d_at, d_src));
                    uploads.push((out.len(), o_at, o_src));
                    out.push(self.part(layout)?);
                    info.variable.push((kept, kept_offsets));
                }
            }
        }
        if t != batch.len() {
            return Err(shape_err(format!(
                "{} tensors where its fields take {t}",
                batch.len()
            )));
        }
        let (id, stream) = (self.device.id(), self.stream.clone());
        let keep = &self.slots[slot_i].keep;
        let writes: Vec<&DeviceBuffer> = uploads.iter().map(|&(p, _, _)| &out[p].storage).collect();
        let ev = stream.enqueue_work(&[], &writes, || {
            let cu: cudarc::driver::sys::CUstream = stream.as_raw()?.cast();
            for (p, at, source) in &uploads {
                let src = match source {
                    Source::Host(r) => &host[r.clone()],
                    Source::Kept(k) => keep[*k].as_slice(),
                };
                if !src.is_empty() {
                    htod(cu, id, out[*p].storage.device_ptr() + *at as u64, src)?;
                }
            }
            Ok(())
        });
        let ev = self.settle(slot_i, ev, fence)?;
        info.rows = rows;
        Ok(Some(DeviceBatch::from_parts(out, ev)?.with_extension(info)))
    }

    /// A device part for `layout` (at least one byte: a field may be empty).
    fn part(&self, layout: BatchLayout) -> Result<DevicePart, TransferError> {
        let storage = self.stream.alloc(layout.total_bytes().max(1))?;
        Ok(DevicePart { layout, storage })
    }
}

/// Rows `rows` of a `[n, ...]` tensor's bytes `data` (`per` bytes a row), back to back: a
/// fixed-size field without the samples the stage dropped.
fn gather_rows(data: &[u8], per: usize, rows: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * per);
    for &r in rows {
        out.extend_from_slice(&data[r * per..(r + 1) * per]);
    }
    out
}

/// Items `rows` of a variable-length field (its items' `bytes` back to back, `offsets` of
/// `n + 1`), back to back, and their offsets: the field without the samples the stage dropped.
fn gather_items(
    bytes: &[u8],
    offsets: &[i64],
    rows: &[usize],
) -> Result<(Vec<u8>, Vec<i64>), String> {
    let at = |k: usize| {
        offsets
            .get(k)
            .and_then(|&o| usize::try_from(o).ok())
            .filter(|&o| o <= bytes.len())
            .ok_or_else(|| format!("offset {k} missing or past the {} bytes", bytes.len()))
    };
    let (mut out, mut ends) = (Vec::new(), vec![0i64]);
    for &r in rows {
        let (start, end) = (at(r)?, at(r + 1)?);
        let item = bytes
            .get(start..end)
            .ok_or_else(|| format!("offsets {r} and {} decrease", r + 1))?;
        out.extend_from_slice(item);
        ends.push(i64::try_from(out.len()).map_err(|_| "too many bytes".to_owned())?);
    }
    Ok((out, ends))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{gather_items, gather_rows};

    /// Items of a few bytes each (some empty), and which of them the stage keeps.
    fn items_and_kept() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<bool>)> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 1..12).prop_flat_map(
            |items| {
                let n = items.len();
                (Just(items), prop::collection::vec(any::<bool>(), n))
            },
        )
    }

    proptest! {
        /// The kept rows, in order, whatever the row size and the rows dropped.
        #[test]
        fn gathered_rows_are_the_kept_ones_in_order(
            (items, keep) in items_and_kept(), per in 1usize..9
        ) {
            let rows: Vec<usize> = (0..items.len()).filter(|&k| keep[k]).collect();
            let data: Vec<u8> = (0..items.len() * per).map(|i| (i * 7) as u8).collect();
            let got = gather_rows(&data, per, &rows);
            let want: Vec<u8> =
                rows.iter().flat_map(|&r| data[r * per..(r + 1) * per].to_vec()).collect();
            prop_assert_eq!(got, want);
        }

        /// The kept items, each whole and in order, with offsets that start at 0 and end at
        /// their total; keeping every row gives the field back as it was.
        #[test]
        fn gathered_items_are_the_kept_ones_with_their_offsets((items, keep) in items_and_kept()) {
            let bytes: Vec<u8> = items.concat();
            let mut offsets = vec![0i64];
            for it in &items {
                offsets.push(offsets.last().unwrap() + it.len() as i64);
            }
            let rows: Vec<usize> = (0..items.len()).filter(|&k| keep[k]).collect();
            let (got, ends) = gather_items(&bytes, &offsets, &rows).unwrap();
            prop_assert_eq!(ends.len(), rows.len() + 1);
            for (k, &r) in rows.iter().enumerate() {
                prop_assert_eq!(&got[ends[k] as usize..ends[k + 1] as usize], &items[r][..]);
            }
            prop_assert_eq!(*ends.last().unwrap() as usize, got.len());
            let every: Vec<usize> = (0..items.len()).collect();
            prop_assert_eq!(gather_items(&bytes, &offsets, &every).unwrap(), (bytes, offsets));
        }
    }

    #[test]
    fn offsets_that_decrease_or_run_past_the_bytes_are_refused() {
        let bytes = b"abcdef";
        assert!(
            gather_items(bytes, &[0, 4, 2, 6], &[1])
                .unwrap_err()
                .contains("decrease")
        );
        assert!(
            gather_items(bytes, &[0, 9], &[0])
                .unwrap_err()
                .contains("past the 6 bytes")
        );
        assert!(
            gather_items(bytes, &[0, 3], &[1])
                .unwrap_err()
                .contains("missing")
        );
    }
}
