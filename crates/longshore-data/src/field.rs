//! Fixed-shape fields written straight into a batch: what a field is ([`FieldSpec`]), how
//! a dataset writes one ([`DirectSource`]), how one is transformed on its way into its slot
//! ([`FieldTransform`]), and how a dataset says that its items are such fields
//! ([`DirectPlan`], from [`crate::Dataset::direct_plan`]).
//!
//! This module sits below [`crate::transform`], [`crate::dataset`] and [`crate::collate`]:
//! all three speak of fields, none of them is needed to say what a field is.

use std::fmt;

use crate::DataError;
use crate::dtype::DType;
use crate::shape::Shape;

/// The dtype and per-sample shape of one field of a [`crate::DirectDataset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldSpec {
    /// Element type.
    pub dtype: DType,
    /// Shape of this field in one sample (without the batch dimension).
    pub shape: Shape,
}

impl FieldSpec {
    /// Bytes of this field in one sample.
    ///
    /// # Errors
    /// [`DataError::Overflow`] when the size overflows.
    pub fn nbytes(&self) -> Result<usize, DataError> {
        crate::shape::nbytes(self.shape.dims(), self.dtype.size(), "field size")
    }
}

/// A per-field hook of [`crate::DirectCollate`] (and of a dataset's [`DirectPlan`]): turns
/// one sample's field, as the dataset stores it, into that sample's slot of the batch
/// tensor, in one pass and with no intermediate tensor. Fused `u8` image -> normalised `f32`
/// is [`Normalize`](crate::Normalize)'s implementation.
///
/// ```
/// use longshore_data::{DType, DataError, FieldSpec, FieldTransform, Shape};
///
/// /// Widens `u8` fields to `f32` (0..=255), any shape.
/// #[derive(Debug)]
/// struct ToF32;
///
/// impl FieldTransform for ToF32 {
///     fn output(&self, input: &FieldSpec) -> Result<FieldSpec, DataError> {
///         Ok(FieldSpec { dtype: DType::F32, shape: input.shape })
///     }
///     fn apply(&self, _: &FieldSpec, src: &[u8], dst: &mut [u8]) -> Result<(), DataError> {
///         for (x, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
///             out.copy_from_slice(&f32::from(*x).to_ne_bytes());
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait FieldTransform: Send + Sync + fmt::Debug {
    /// The dtype and per-sample shape this transform writes for a field of `input`.
    ///
    /// # Errors
    /// When this transform does not accept such a field (wrong dtype or shape), with
    /// a message saying what it expected.
    fn output(&self, input: &FieldSpec) -> Result<FieldSpec, DataError>;

    /// Writes the transformed field: `src` holds one sample's field as described by
    /// `input` (native byte order, `input.nbytes()` long); `dst` is its slot in the
    /// batch, exactly `self.output(input)?.nbytes()` long. The slot's alignment is
    /// that of the batch storage plus a multiple of the slot size: for storage
    /// aligned to 8 bytes or more (page-locked buffers, [`crate::AlignedBuf`]) an
    /// `f32` slot can be cast with `bytemuck`; stay correct when it cannot.
    ///
    /// # Errors
    /// When `src` or `dst` has an unexpected length.
    fn apply(&self, input: &FieldSpec, src: &[u8], dst: &mut [u8]) -> Result<(), DataError>;
}

/// The fields of a dataset that writes samples straight into a batch, without naming its
/// item type: the object-safe half of [`crate::DirectDataset`], which every direct dataset
/// is (a blanket implementation), so that a [`DirectPlan`] can hold any of them. Its methods
/// are named apart from `DirectDataset`'s so that both traits can be in scope.
pub trait DirectSource: Send + Sync {
    /// [`DirectDataset::fields`](crate::DirectDataset::fields).
    fn source_fields(&self) -> &[FieldSpec];

    /// [`DirectDataset::get_field_into`](crate::DirectDataset::get_field_into).
    ///
    /// # Errors
    /// As `get_field_into`.
    fn write_field(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError>;

    /// [`DirectDataset::field_bytes`](crate::DirectDataset::field_bytes).
    ///
    /// # Errors
    /// As `field_bytes`.
    fn lend_field(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError>;
}

/// How a dataset's items can be written straight into a batch: a [`DirectSource`] whose
/// fields, each through an optional [`FieldTransform`], are exactly what stacking the
/// dataset's items (its [`crate::Dataset::get`]) would give, byte for byte. Sample `i` of the
/// dataset is sample `index(i)` of the source (a [`crate::Subset`] remaps indices).
///
/// The loader's default collation ([`crate::FetchCollate`] of a [`crate::StackCollate`])
/// takes this route whenever the dataset has a plan, so
/// `NpyDataset::open(..)?.transform(Normalize::imagenet(..))` collates as fast as a
/// [`crate::DirectCollate`] with a fused `Normalize`.
///
/// ```
/// use longshore_data::{DatasetExt, ImageLayout, Normalize, NpyDataset, Dataset};
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("images.npy");
/// longshore_data::write_npy(&path, &[4, 3, 2, 2], &[7u8; 48])?;
/// let images = NpyDataset::open(&path)?.transform(Normalize::imagenet(ImageLayout::Chw));
/// let plan = images.direct_plan().expect("a normalised .npy image dataset is direct");
/// assert!(plan.transform(0).is_some());
/// # Ok::<(), longshore_data::DataError>(())
/// ```
#[derive(Clone)]
pub struct DirectPlan<'a> {
    source: &'a dyn DirectSource,
    transforms: Vec<(usize, &'a dyn FieldTransform)>,
    /// Index maps in the order they were added (the innermost dataset's first);
    /// [`DirectPlan::index`] applies them outermost first.
    remaps: Vec<&'a [usize]>,
}

impl fmt::Debug for DirectPlan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectPlan")
            .field("fields", &self.source.source_fields())
            .field("transforms", &self.transforms)
            .field("remaps", &self.remaps.len())
            .finish()
    }
}

impl<'a> DirectPlan<'a> {
    /// The plan of a dataset whose items are exactly `source`'s fields.
    pub fn new(source: &'a dyn DirectSource) -> DirectPlan<'a> {
        DirectPlan {
            source,
            transforms: Vec::new(),
            remaps: Vec::new(),
        }
    }

    /// The source's fields, before any transform.
    pub fn fields(&self) -> &'a [FieldSpec] {
        self.source.source_fields()
    }

    /// The transform of field `field`, if it has one.
    pub fn transform(&self, field: usize) -> Option<&'a dyn FieldTransform> {
        self.transforms
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, t)| *t)
    }

    /// The same plan with field `field` written through `transform`, or `None` when the field
    /// does not exist, already has a transform (transforms do not compose here), or
    /// `transform` does not accept it ([`FieldTransform::output`] fails: the items' own path
    /// then reports the error).
    pub fn with_transform(
        mut self,
        field: usize,
        transform: &'a dyn FieldTransform,
    ) -> Option<DirectPlan<'a>> {
        let spec = self.fields().get(field)?;
        if self.transform(field).is_some() || transform.output(spec).is_err() {
            return None;
        }
        self.transforms.push((field, transform));
        Some(self)
    }

    /// The plan of a dataset whose sample `i` is sample `indices[i]` of this one.
    pub fn remapped(mut self, indices: &'a [usize]) -> DirectPlan<'a> {
        self.remaps.push(indices);
        self
    }

    /// The source's sample that is sample `index` of the planned dataset.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when an index map does not hold `index`.
    pub fn index(&self, index: usize) -> Result<usize, DataError> {
        self.remaps.iter().rev().try_fold(index, |i, map| {
            map.get(i)
                .copied()
                .ok_or(DataError::oob(i, map.len(), "planned subset"))
        })
    }

    /// The source the fields are read from.
    pub fn source(&self) -> &'a dyn DirectSource {
        self.source
    }
}
