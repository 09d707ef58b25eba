//! [`StackCollate`]: fixed-shape samples stacked field by field, like PyTorch's
//! `default_collate`.

use super::{Collate, DirectCollate, TensorNames, field_of};
use crate::DataError;
use crate::batch::{Batch, BatchLayout, Storage, zero_gaps};
use crate::tensor::Sample;

/// Stacks fixed-shape samples field by field, like PyTorch's `default_collate`:
/// field `f` of every sample becomes tensor `f` of shape `[batch, ...field_shape]`.
#[derive(Debug, Clone, Default)]
pub struct StackCollate {
    names: TensorNames,
}

impl StackCollate {
    /// Unnamed tensors, addressed by position.
    pub fn new() -> StackCollate {
        StackCollate::default()
    }

    /// Names the tensors in field order (`["image", "label"]`).
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(
        mut self,
        names: I,
    ) -> StackCollate {
        self.names = TensorNames::new(names);
        self
    }
}

impl<T: Sample> Collate<T> for StackCollate {
    fn layout(&self, samples: &[T]) -> Result<BatchLayout, DataError> {
        let first = samples.first().ok_or(DataError::Empty { what: "batch" })?;
        let n = first.num_fields();
        let mut layout = BatchLayout::new(samples.len());
        for f in 0..n {
            let r = field_of(first, 0, f)?;
            for (b, s) in samples.iter().enumerate().skip(1) {
                if s.num_fields() != n {
                    return Err(DataError::ShapeMismatch(format!(
                        "sample {b} of the batch has {} fields, sample 0 has {n}",
                        s.num_fields()
                    )));
                }
                let o = field_of(s, b, f)?;
                if o.dtype() != r.dtype() || o.shape() != r.shape() {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} is {} {:?}, sample 0 has {} {:?}; \
                         use PadCollate for variable-length fields",
                        o.dtype(),
                        o.shape(),
                        r.dtype(),
                        r.shape()
                    )));
                }
            }
            let mut shape = Vec::with_capacity(r.shape().ndim() + 1);
            shape.push(samples.len());
            shape.extend_from_slice(r.shape().dims());
            layout.push(self.names.get(f), r.dtype(), shape)?;
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
        if layout.batch_size != samples.len() {
            return Err(DataError::ShapeMismatch(format!(
                "layout is for {} samples, {} given",
                layout.batch_size,
                samples.len()
            )));
        }
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        for (f, spec) in layout.tensors.iter().enumerate() {
            let per = spec.len / samples.len().max(1);
            let dst = &mut out[spec.range()];
            for (b, (s, slot)) in samples
                .iter()
                .zip(dst.chunks_exact_mut(per.max(1)))
                .enumerate()
            {
                let r = field_of(s, b, f)?;
                if r.bytes().len() != per || r.dtype() != spec.dtype {
                    return Err(DataError::ShapeMismatch(format!(
                        "field {f} of sample {b} does not match the layout ({} bytes, expected {per})",
                        r.bytes().len()
                    )));
                }
                slot.copy_from_slice(r.bytes());
            }
        }
        Ok(Batch { layout, storage })
    }

    /// Stacking fixed-shape fields is what [`DirectCollate`] writes: with the same names.
    fn as_direct(&self) -> Option<DirectCollate> {
        Some(DirectCollate::new().with_tensor_names(self.names.clone()))
    }
}
