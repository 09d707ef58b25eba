//! [`DirectCollate`]: a [`DirectDataset`] writes each sample straight into its slot of
//! the batch, optionally through a per-field [`FieldTransform`].

use super::{DatasetCollate, TensorNames};
use crate::DataError;
use crate::batch::{Batch, BatchLayout, Storage, zero_gaps};
use crate::dataset::DirectDataset;

/// Indices of a batch and its layout; see [`DirectCollate`].
#[derive(Debug, Clone)]
pub struct StagedIndices {
    indices: Vec<usize>,
    layout: BatchLayout,
}

impl StagedIndices {
    /// The batch's layout.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }
}

/// Stacks the fields of a [`DirectDataset`] by having the dataset write each sample
/// straight into its slot of the batch: a memory-mapped row reaches the (pinned)
/// batch buffer with one copy and no intermediate allocation.
#[derive(Debug, Clone, Default)]
pub struct DirectCollate {
    names: TensorNames,
}

impl DirectCollate {
    /// Unnamed tensors.
    pub fn new() -> DirectCollate {
        DirectCollate::default()
    }

    /// Names the tensors in field order.
    pub fn with_names<I: IntoIterator<Item = N>, N: AsRef<str>>(
        mut self,
        names: I,
    ) -> DirectCollate {
        self.names = TensorNames::new(names);
        self
    }

    /// The layout of a batch of `batch_size` samples with these fields.
    ///
    /// # Errors
    /// [`DataError::Empty`] for a zero batch size, [`DataError::Overflow`].
    pub fn layout_for(
        &self,
        fields: &[crate::dataset::FieldSpec],
        batch_size: usize,
    ) -> Result<BatchLayout, DataError> {
        if batch_size == 0 {
            return Err(DataError::Empty { what: "batch" });
        }
        let mut layout = BatchLayout::new(batch_size);
        for (f, spec) in fields.iter().enumerate() {
            let mut shape = vec![batch_size];
            shape.extend_from_slice(spec.shape.dims());
            layout.push(self.names.get(f), spec.dtype, shape)?;
        }
        Ok(layout)
    }
}

impl<D: DirectDataset + ?Sized> DatasetCollate<D> for DirectCollate {
    type Staged = StagedIndices;

    fn stage(&self, dataset: &D, indices: &[usize]) -> Result<StagedIndices, DataError> {
        let len = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::oob(bad, len, "dataset"));
        }
        Ok(StagedIndices {
            indices: indices.to_vec(),
            layout: self.layout_for(dataset.fields(), indices.len())?,
        })
    }

    fn staged_layout<'a>(&self, staged: &'a StagedIndices) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        dataset: &D,
        staged: StagedIndices,
        mut storage: S,
    ) -> Result<Batch<S>, DataError> {
        let StagedIndices { indices, layout } = staged;
        layout.check_storage(storage.len())?;
        let out = &mut storage[..layout.total_bytes];
        zero_gaps(&layout, out);
        for (f, spec) in layout.tensors.iter().enumerate() {
            let per = spec.len / indices.len().max(1);
            if per == 0 {
                continue;
            }
            for (&i, slot) in indices.iter().zip(out[spec.range()].chunks_exact_mut(per)) {
                dataset.get_field_into(i, f, slot)?;
            }
        }
        Ok(Batch { layout, storage })
    }
}
