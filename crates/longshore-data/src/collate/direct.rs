//! [`DirectCollate`]: a [`DirectDataset`] writes each sample straight into its slot of
//! the batch, optionally through a per-field [`FieldTransform`]; the same writer serves a
//! dataset's [`DirectPlan`] (see [`super::FetchCollate`]).

use std::sync::Arc;

use super::{DatasetCollate, TensorNames};
use crate::DataError;
use crate::batch::{Batch, BatchLayout, Storage, zero_gaps};
use crate::dataset::DirectDataset;
use crate::field::{DirectPlan, DirectSource, FieldSpec, FieldTransform};

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
///
/// A field may go through a [`FieldTransform`] on its way
/// ([`DirectCollate::with_transform`]); the transform reads the dataset's own bytes
/// when the dataset can lend them ([`DirectDataset::field_bytes`], a native-order
/// memory-mapped file) and a per-batch copy otherwise.
///
/// ```
/// use longshore_data::{
///     AlignedBuf, DatasetCollate, DirectCollate, ImageLayout, Normalize, VecDataset, Zip,
/// };
/// # use longshore_data::{DataError, DirectDataset, FieldSpec};
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("images.npy");
/// // Four 3x2x2 u8 images in CHW order, memory-mapped.
/// let pixels: Vec<u8> = (0..48).map(|i| i as u8).collect();
/// longshore_data::write_npy(&path, &[4, 3, 2, 2], &pixels)?;
/// let images = longshore_data::NpyDataset::open(&path)?;
///
/// // u8 rows become normalised f32 CHW straight in the batch buffer.
/// let collate = DirectCollate::new()
///     .with_names(["image"])
///     .with_transform(0, Normalize::imagenet(ImageLayout::Chw));
/// let staged = collate.stage(&images, &[2, 0])?;
/// let buf = AlignedBuf::zeroed(staged.layout().total_bytes());
/// let batch = collate.write(&images, staged, buf)?;
/// assert_eq!(batch.shape(0)?, &[2, 3, 2, 2]);
/// let x: &[f32] = batch.tensor_by_name("image")?;
/// assert!((x[0] - (24.0 / 255.0 - 0.485) / 0.229).abs() < 1e-6); // image 2, pixel 0
/// # Ok::<(), DataError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct DirectCollate {
    names: TensorNames,
    transforms: Vec<(usize, Arc<dyn FieldTransform>)>,
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

    /// Named as a [`super::StackCollate`] names its tensors.
    pub(crate) fn with_tensor_names(mut self, names: TensorNames) -> DirectCollate {
        self.names = names;
        self
    }

    /// Writes field `field` through `transform` (replacing any transform set for it
    /// before): its tensor gets the transform's output dtype and shape.
    pub fn with_transform(
        mut self,
        field: usize,
        transform: impl FieldTransform + 'static,
    ) -> DirectCollate {
        self.transforms.retain(|(f, _)| *f != field);
        self.transforms.push((field, Arc::new(transform)));
        self
    }

    fn transform(&self, field: usize) -> Option<&dyn FieldTransform> {
        self.transforms
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, t)| &**t)
    }

    /// The layout of a batch of `batch_size` samples with these fields (after any
    /// field transforms).
    ///
    /// # Errors
    /// [`DataError::Empty`] for a zero batch size, [`DataError::Overflow`],
    /// [`DataError::InvalidArgument`] for a transform of a field the dataset lacks,
    /// and the errors of [`FieldTransform::output`].
    pub(crate) fn layout_for(
        &self,
        fields: &[FieldSpec],
        batch_size: usize,
    ) -> Result<BatchLayout, DataError> {
        if batch_size == 0 {
            return Err(DataError::Empty { what: "batch" });
        }
        if let Some((bad, _)) = self.transforms.iter().find(|(f, _)| *f >= fields.len()) {
            return Err(DataError::arg(
                "field",
                format!(
                    "a transform is set for field {bad}, but the dataset has {} fields",
                    fields.len()
                ),
            ));
        }
        layout_of(&self.names, fields, |f| self.transform(f), batch_size)
    }

    /// Whether this collation can write a batch of `plan`: no field is transformed both by
    /// this collation and by the plan, and every transformed field exists.
    pub(crate) fn accepts(&self, plan: &DirectPlan<'_>) -> bool {
        self.transforms
            .iter()
            .all(|(f, _)| *f < plan.fields().len() && plan.transform(*f).is_none())
    }

    /// The layout of a batch of `batch_size` samples of `plan` (see [`Self::accepts`]).
    pub(crate) fn plan_layout(
        &self,
        plan: &DirectPlan<'_>,
        batch_size: usize,
    ) -> Result<BatchLayout, DataError> {
        layout_of(
            &self.names,
            plan.fields(),
            |f| self.transform(f).or_else(|| plan.transform(f)),
            batch_size,
        )
    }

    /// Writes the samples `indices` of `plan` at `layout` (from [`Self::plan_layout`]).
    pub(crate) fn write_plan<S: Storage>(
        &self,
        plan: &DirectPlan<'_>,
        indices: &[usize],
        layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        let sources = indices
            .iter()
            .map(|&i| plan.index(i))
            .collect::<Result<Vec<_>, _>>()?;
        write_fields(
            plan.source(),
            |f| self.transform(f).or_else(|| plan.transform(f)),
            &sources,
            layout,
            storage,
        )
    }
}

/// The layout of a batch of `batch_size` samples of `fields`, each through
/// `transform(field)` when it has one.
fn layout_of<'t>(
    names: &TensorNames,
    fields: &[FieldSpec],
    transform: impl Fn(usize) -> Option<&'t dyn FieldTransform>,
    batch_size: usize,
) -> Result<BatchLayout, DataError> {
    if batch_size == 0 {
        return Err(DataError::Empty { what: "batch" });
    }
    let mut layout = BatchLayout::new(batch_size);
    for (f, spec) in fields.iter().enumerate() {
        let spec = match transform(f) {
            Some(t) => t.output(spec)?,
            None => *spec,
        };
        let mut shape = vec![batch_size];
        shape.extend_from_slice(spec.shape.dims());
        layout.push(names.get(f), spec.dtype, shape)?;
    }
    Ok(layout)
}

/// Writes the fields of samples `indices` of `source` into `storage` at `layout`, each field
/// through `transform(field)` when it has one: the one writer of [`DirectCollate`] and of a
/// dataset's [`DirectPlan`].
fn write_fields<'t, D: DirectSource + ?Sized, S: Storage>(
    source: &D,
    transform: impl Fn(usize) -> Option<&'t dyn FieldTransform>,
    indices: &[usize],
    layout: BatchLayout,
    mut storage: S,
) -> Result<Batch<S>, DataError> {
    layout.check_storage(storage.len())?;
    let out = &mut storage[..layout.total_bytes];
    zero_gaps(&layout, out);
    // Filled only for a transformed field the dataset cannot lend, reused across samples.
    let mut scratch = Vec::new();
    for (f, spec) in layout.tensors.iter().enumerate() {
        let per = spec.len / indices.len().max(1);
        if per == 0 {
            continue;
        }
        let slots = indices.iter().zip(out[spec.range()].chunks_exact_mut(per));
        let Some(transform) = transform(f) else {
            for (&i, slot) in slots {
                source.write_field(i, f, slot)?;
            }
            continue;
        };
        let input = source.source_fields().get(f).ok_or(DataError::oob(
            f,
            source.source_fields().len(),
            "dataset fields",
        ))?;
        for (&i, slot) in slots {
            match source.lend_field(i, f)? {
                Some(src) => transform.apply(input, src, slot)?,
                None => {
                    scratch.resize(input.nbytes()?, 0);
                    source.write_field(i, f, &mut scratch)?;
                    transform.apply(input, &scratch, slot)?;
                }
            }
        }
    }
    Ok(Batch { layout, storage })
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
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        let StagedIndices { indices, layout } = staged;
        write_fields(dataset, |f| self.transform(f), &indices, layout, storage)
    }
}
