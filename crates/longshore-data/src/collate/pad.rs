//! [`PadCollate`]: variable-length fields padded to the longest in the batch, with
//! lengths and masks, like a `pad_sequence` collate.

use std::sync::Arc;

use super::{Collate, TensorNames, field_of};
use crate::DataError;
use crate::batch::{Batch, BatchLayout, Storage, zero_gaps};
use crate::dtype::DType;
use crate::tensor::Sample;

/// Pads variable-length fields, like a `pad_sequence` collate: each field with at
/// least one dimension is padded along its first dimension to the longest in the
/// batch (`[batch, max_len, ...rest]`, filled with `pad_value`); scalar fields are
/// stacked. After the fields, for each padded field in order, come its `lengths`
/// (`i64 [batch]`) and its `mask` (`bool [batch, max_len]`, 1 where data is real).
#[derive(Debug, Clone)]
pub struct PadCollate {
    pad_value: f64,
    names: TensorNames,
}

impl Default for PadCollate {
    fn default() -> Self {
        PadCollate::new(0.0)
    }
}

impl PadCollate {
    /// Pads with `pad_value` (converted to each field's dtype).
    pub fn new(pad_value: f64) -> PadCollate {
        PadCollate {
            pad_value,
            names: TensorNames::default(),
        }
    }

    /// Names the fields; lengths and masks are then named `"{name}.lengths"` and
    /// `"{name}.mask"`.
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(mut self, names: I) -> PadCollate {
        self.names = TensorNames::new(names);
        self
    }
}

impl<T: Sample> Collate<T> for PadCollate {
    fn layout(&self, samples: &[T]) -> Result<BatchLayout, DataError> {
        let first = samples.first().ok_or(DataError::Empty { what: "batch" })?;
        let n = first.num_fields();
        let bs = samples.len();
        let mut layout = BatchLayout::new(bs);
        let mut padded = Vec::new();
        for f in 0..n {
            let r = field_of(first, 0, f)?;
            let rest = r.shape().dims().get(1..).unwrap_or(&[]).to_vec();
            let mut max_len = r.shape().dims().first().copied().unwrap_or(0);
            for (b, s) in samples.iter().enumerate().skip(1) {
                let o = field_of(s, b, f)?;
                let same_rest = o.shape().dims().get(1..).unwrap_or(&[]) == rest.as_slice();
                if o.dtype() != r.dtype() || o.shape().ndim() != r.shape().ndim() || !same_rest {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} is {} {:?}, sample 0 has {} {:?}; only the first dimension may vary",
                        o.dtype(),
                        o.shape(),
                        r.dtype(),
                        r.shape()
                    )));
                }
                max_len = max_len.max(o.shape().dims().first().copied().unwrap_or(0));
            }
            let mut shape = vec![bs];
            if r.shape().ndim() > 0 {
                shape.push(max_len);
                shape.extend_from_slice(&rest);
                padded.push((f, max_len));
            }
            layout.push(self.names.get(f), r.dtype(), shape)?;
        }
        for (f, max_len) in padded {
            let name = self.names.get(f);
            let suffixed = |s: &str| name.as_ref().map(|n| Arc::from(format!("{n}.{s}")));
            layout.push(suffixed("lengths"), DType::I64, vec![bs])?;
            layout.push(suffixed("mask"), DType::Bool, vec![bs, max_len])?;
        }
        Ok(layout)
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[T],
        layout: BatchLayout,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        layout.check_storage(storage.len())?;
        let bs = samples.len();
        if layout.batch_size != bs || bs == 0 {
            return Err(DataError::ShapeMismatch(format!(
                "layout is for {} samples, {bs} given",
                layout.batch_size
            )));
        }
        let n_fields = samples[0].num_fields();
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        let mut extra = n_fields;
        for f in 0..n_fields {
            let spec = layout
                .tensors
                .get(f)
                .ok_or(DataError::oob(f, layout.tensors.len(), "layout tensors"))?
                .clone();
            let per = spec.len / bs;
            let elem = spec.dtype.size();
            let mut pad = vec![0u8; elem];
            spec.dtype.encode_f64(self.pad_value, &mut pad);
            let dst = &mut out[spec.range()];
            let mut lengths = Vec::with_capacity(bs);
            for (b, (s, slot)) in samples
                .iter()
                .zip(dst.chunks_exact_mut(per.max(1)))
                .enumerate()
            {
                let r = field_of(s, b, f)?;
                if r.bytes().len() > per || r.dtype() != spec.dtype {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} does not match the layout"
                    )));
                }
                slot[..r.bytes().len()].copy_from_slice(r.bytes());
                for p in slot[r.bytes().len()..].chunks_exact_mut(elem) {
                    p.copy_from_slice(&pad);
                }
                lengths.push(r.shape().dims().first().copied().unwrap_or(0));
            }
            if spec.shape.len() >= 2 {
                let max_len = spec.shape[1];
                let (lspec, mspec) =
                    match (layout.tensors.get(extra), layout.tensors.get(extra + 1)) {
                        (Some(l), Some(m)) => (l.clone(), m.clone()),
                        _ => {
                            return Err(DataError::ShapeMismatch(
                                "layout lacks lengths/mask tensors".into(),
                            ));
                        }
                    };
                extra += 2;
                for (slot, &l) in out[lspec.range()].chunks_exact_mut(8).zip(&lengths) {
                    slot.copy_from_slice(&(l as i64).to_ne_bytes());
                }
                if let Some((b, &l)) = lengths.iter().enumerate().find(|(_, l)| **l > max_len) {
                    return Err(DataError::ShapeMismatch(format!(
                        "sample {b} has length {l}, longer than the layout's {max_len}"
                    )));
                }
                for (row, &l) in out[mspec.range()]
                    .chunks_exact_mut(max_len.max(1))
                    .zip(&lengths)
                {
                    row[..l].fill(1);
                    row[l..].fill(0);
                }
            }
        }
        Ok(Batch { layout, storage })
    }
}
