//! What the binding's datasets stand for behind the loader: [`Source`], a dataset whose fields
//! are written straight into the batch, [`Fields`], the adapter that gives every built-in
//! dataset (files, records, image folders, token files) the same item type, [`BatchForm`],
//! how its batches reach Python, and [`Native`], the two with how the collate treats them.
//! Below the dataset modules (`dataset`, `vision`, `tokens`, `mixture`), which build sources.

use std::sync::Arc;

use crate::fields::Field;
use longshore::data::{DataError, Dataset, DirectCollate, DirectDataset, FieldSpec, Tensor};

/// What the loader reads for a Python dataset object: its [`Source`], and how its batches look.
#[derive(Clone)]
pub(crate) struct Native {
    pub(crate) source: Source,
    /// How a batch reaches Python: a list of fields, one tensor (a one-file `NpyDataset`), or
    /// a dict by field name (token sequences).
    pub(crate) form: BatchForm,
    /// The collate transforms a field (`NpyDataset(normalize=)`): see `PyNpyDataset`.
    pub(crate) transformed: bool,
}

/// What one sample of any built-in dataset turns into when read by index: its fields.
pub(crate) trait IntoFields {
    fn into_fields(self, out: &mut Vec<Tensor>);
}

impl IntoFields for Tensor {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        out.push(self)
    }
}

impl IntoFields for Vec<Tensor> {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        out.extend(self)
    }
}

impl<A: IntoFields, B: IntoFields> IntoFields for (A, B) {
    fn into_fields(self, out: &mut Vec<Tensor>) {
        self.0.into_fields(out);
        self.1.into_fields(out);
    }
}

/// A direct dataset whose items are read as a list of fields, so that datasets of any shape
/// (one file, several zipped, records) share one type behind the loader.
#[derive(Debug)]
pub(crate) struct Fields<D>(pub(crate) D);

impl<D: DirectDataset> Dataset for Fields<D>
where
    D::Item: IntoFields,
{
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let mut out = Vec::new();
        self.0.get(index)?.into_fields(&mut out);
        Ok(out)
    }
}

impl<D: DirectDataset> DirectDataset for Fields<D>
where
    D::Item: IntoFields,
{
    fn fields(&self) -> &[FieldSpec] {
        self.0.fields()
    }
    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        self.0.get_field_into(index, field, out)
    }
}

/// Any built-in dataset, read field by field straight into a batch.
pub(crate) type AnyDataset = Arc<dyn DirectDataset<Item = Vec<Tensor>>>;

/// What a Python dataset object stands for: a dataset whose fields are written straight into
/// the batch by a [`DirectCollate`], with a fused [`Normalize`](longshore::data::Normalize) on the image field when asked.
#[derive(Clone)]
pub(crate) struct Source {
    pub(crate) dataset: AnyDataset,
    pub(crate) collate: DirectCollate,
}

impl Source {
    /// `dataset` collated by a plain [`DirectCollate`].
    pub(crate) fn direct(dataset: AnyDataset) -> Source {
        Source {
            dataset,
            collate: DirectCollate::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.dataset.len()
    }
}

/// How a batch of a built-in dataset reaches Python: the shape torch's `default_collate` gives
/// the batches of the torch dataset it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BatchForm {
    /// A list of its fields' tensors (samples are tuples: `[images, labels]`).
    List,
    /// Its one tensor (a one-file `NpyDataset`: samples are one array).
    Single,
    /// A dict of its fields' tensors keyed by these names, in field order (samples are dicts:
    /// token sequences' `{"input_ids": ..., "targets": ...}`).
    Named(Arc<[String]>),
    /// A dict keyed by these fields' names, in order, of a sharded dataset read with
    /// `fields=` ([`crate::fields`]): each fixed-size field one tensor, each variable-length
    /// field two (bytes and offsets) that the delivery turns into a Python list.
    Fields(Arc<[Field]>),
}

impl BatchForm {
    /// A dict keyed by `names`.
    pub(crate) fn named<S: AsRef<str>>(names: &[S]) -> BatchForm {
        BatchForm::Named(names.iter().map(|n| n.as_ref().to_owned()).collect())
    }

    /// What a batch is, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            BatchForm::List => "batches are lists".into(),
            BatchForm::Single => "batches are one tensor".into(),
            BatchForm::Named(names) => format!("batches are dicts of {names:?}"),
            BatchForm::Fields(fields) => {
                let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
                format!("batches are dicts of {names:?}")
            }
        }
    }
}
