//! Token files for language models as fixed-length training sequences: `_TokenSequences`, the
//! native side of `longshore.datasets.TokenDataset`, over the data crate's [`TokenSequences`].
//! Its batches reach Python as dicts keyed by the field names ([`BatchForm::Named`]), what
//! torch's `default_collate` makes of a dataset returning `{"input_ids": ..., "targets": ...}`.

use std::path::PathBuf;
use std::sync::Arc;

use longshore::data::formats::tokens::TokenSequences;
use longshore::data::{DType, DataError, Dataset, DirectCollate};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::dataset::PyNative;
use crate::errors::data_err;
use crate::source::{BatchForm, Fields, Native, Source};

/// Token files (one stream, in the order given) cut into sequences of `seq_len` tokens:
/// `input_ids`, `targets` (shifted by one; `targets=False` leaves them out) and, with a
/// document `separator`, `position_ids` and `document_ids`. `dtype`: how the files store a
/// token (`"uint16"`, nanoGPT's, or `"uint32"`, little-endian); `output_dtype`: `"int64"` or
/// `"int32"`.
#[pyclass(name = "_TokenSequences", module = "longshore", frozen)]
pub(crate) struct PyTokenSequences {
    seqs: TokenSequences,
    source: Source,
}

impl PyTokenSequences {
    /// What the loader reads: the sequences, batched as a dict by field name.
    pub(crate) fn native(&self) -> Native {
        Native {
            source: self.source.clone(),
            form: BatchForm::named(self.seqs.field_names()),
            transformed: false,
        }
    }
}

/// The dtype named `name` for the argument `arg` (NumPy's names), among `allowed`.
fn dtype_arg(
    arg: &'static str,
    name: &str,
    allowed: [(&str, DType); 2],
) -> Result<DType, DataError> {
    allowed
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, d)| d)
        .ok_or_else(|| DataError::InvalidArgument {
            name: arg,
            reason: format!("{name:?}: must be {:?} or {:?}", allowed[0].0, allowed[1].0),
        })
}

#[pymethods]
impl PyTokenSequences {
    /// What the loader reads, as a `_Native`.
    #[getter]
    fn _native(&self) -> PyNative {
        PyNative::wrap(self.native(), "TokenDataset")
    }

    #[new]
    #[pyo3(signature = (paths, seq_len = 1024, *, dtype = "uint16", output_dtype = "int64",
        targets = true, separator = None))]
    fn new(
        py: Python<'_>,
        paths: Vec<PathBuf>,
        seq_len: usize,
        dtype: &str,
        output_dtype: &str,
        targets: bool,
        separator: Option<u32>,
    ) -> PyResult<Self> {
        let token = dtype_arg(
            "dtype",
            dtype,
            [("uint16", DType::U16), ("uint32", DType::U32)],
        )
        .map_err(data_err)?;
        let output = dtype_arg(
            "output_dtype",
            output_dtype,
            [("int64", DType::I64), ("int32", DType::I32)],
        )
        .map_err(data_err)?;
        let seqs = py
            .detach(|| {
                let mut b = TokenSequences::builder(&paths)
                    .seq_len(seq_len)
                    .token_dtype(token)
                    .output_dtype(output)
                    .targets(targets);
                if let Some(sep) = separator {
                    b = b.documents(sep);
                }
                b.build()
            })
            .map_err(data_err)?;
        let collate = DirectCollate::new().with_names(seqs.field_names().iter().copied());
        let source = Source {
            dataset: Arc::new(Fields(seqs.clone())),
            collate,
        };
        Ok(Self { seqs, source })
    }

    fn __len__(&self) -> usize {
        self.seqs.len()
    }

    /// The fields of a sequence, in order: `input_ids`, `targets`, `position_ids`,
    /// `document_ids` (those that are on).
    #[getter]
    fn field_names(&self) -> Vec<&'static str> {
        self.seqs.field_names().to_vec()
    }

    /// Tokens per sequence.
    #[getter]
    fn seq_len(&self) -> usize {
        self.seqs.seq_len()
    }

    /// Tokens in all files.
    #[getter]
    fn total_tokens(&self) -> u64 {
        self.seqs.total_tokens()
    }

    /// Tokens after the last whole sequence, never read.
    #[getter]
    fn dropped_tokens(&self) -> u64 {
        self.seqs.dropped_tokens()
    }

    /// Documents in the stream (with a separator), else `None`.
    #[getter]
    fn documents(&self) -> Option<usize> {
        self.seqs.documents()
    }

    /// Sequence `index`'s fields, each the bytes of `seq_len` values of the output dtype
    /// (native byte order), in [`field_names`](Self::field_names) order.
    fn get<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let fields = py.detach(|| self.seqs.get(index)).map_err(data_err)?;
        Ok(fields.iter().map(|t| PyBytes::new(py, t.bytes())).collect())
    }

    fn __repr__(&self) -> String {
        format!(
            "_TokenSequences(len={}, seq_len={}, fields={:?})",
            self.seqs.len(),
            self.seqs.seq_len(),
            self.seqs.field_names()
        )
    }
}
