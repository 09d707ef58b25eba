//! Weighted mixtures of map-style datasets, the native side of `longshore.data.Mixture`, over
//! the data crate's [`Mixture`]: `_Mixture` when every member is a built-in dataset (the
//! loader's Rust workers read it like any other, writing its batches straight into pinned
//! memory), and `_MixtureSchedule`, the same schedule over members' lengths alone, which the
//! Python class asks which member and index a position reads when a member is a Python
//! dataset.

use std::sync::Arc;

use longshore::data::dataset::mixture::{MemberOf, Mixture, Stop};
use longshore::data::{DataError, Dataset, DirectDataset};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};

use crate::dataset::{PyNative, native_part};
use crate::errors::data_err;
use crate::source::{AnyDataset, Native, Source};

/// `stop=`: `"first_exhausted"`, `"all_exhausted"` (Hugging Face's `interleave_datasets`
/// stopping strategies) or a positive number of positions per epoch.
pub(crate) fn stop_of(stop: &Bound<'_, PyAny>) -> PyResult<Stop> {
    let unknown = |what: String| {
        PyValueError::new_err(format!(
            "stop={what}: must be \"first_exhausted\", \"all_exhausted\" or a number of \
             positions per epoch"
        ))
    };
    if let Ok(s) = stop.cast::<PyString>() {
        return match s.to_str()? {
            "first_exhausted" => Ok(Stop::FirstExhausted),
            "all_exhausted" => Ok(Stop::AllExhausted),
            other => Err(unknown(format!("{other:?}"))),
        };
    }
    if !stop.is_instance_of::<PyBool>()
        && let Ok(n) = stop.extract::<i128>()
    {
        return match u64::try_from(n) {
            Ok(n) if n > 0 => Ok(Stop::Samples(n)),
            _ => Err(PyValueError::new_err(format!(
                "stop={n}: a number of positions per epoch is positive"
            ))),
        };
    }
    Err(unknown(stop.repr()?.to_string()))
}

/// A mixture of `members` drawn in proportion to `weights` until `stop`.
fn mixture_of<D: Dataset>(
    members: Vec<D>,
    weights: &[f64],
    stop: Stop,
    seed: u64,
    shuffle: bool,
) -> PyResult<Mixture<D>> {
    let mixture = Mixture::new(members, weights, stop).map_err(data_err)?;
    Ok(mixture.seed(seed).shuffle_members(shuffle))
}

/// `mixture`'s member and index for `position` in `epoch`, an `IndexError` past its end.
fn source_of<D: Dataset>(
    mixture: &Mixture<D>,
    position: i64,
    epoch: u64,
) -> PyResult<(usize, usize)> {
    let len = mixture.len();
    let p = if position < 0 {
        position + len as i64
    } else {
        position
    };
    match usize::try_from(p) {
        Ok(p) if p < len => mixture.source(p, epoch).map_err(data_err),
        _ => Err(PyIndexError::new_err(format!(
            "position {position} is out of range for a mixture of {len} positions"
        ))),
    }
}

/// Which member each position of a mixture reads (`_Mixture` or `_MixtureSchedule`): the
/// loader counts its delivered samples by member (`_Loader(sources=...)`).
pub(crate) fn member_of(schedule: &Bound<'_, PyAny>) -> PyResult<MemberOf> {
    if let Ok(m) = schedule.cast::<PyMixture>() {
        return Ok(m.get().mixture.member_of());
    }
    if let Ok(s) = schedule.cast::<PySchedule>() {
        return Ok(s.get().mixture.member_of());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "sources= takes a mixture's schedule (_Mixture or _MixtureSchedule), not {}",
        schedule.get_type().name()?
    )))
}

/// A member of the schedule: its length alone (what [`Mixture`] needs to plan an epoch).
struct Length(usize);

impl Dataset for Length {
    type Item = ();
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, index: usize) -> Result<(), DataError> {
        if index < self.0 {
            Ok(())
        } else {
            Err(DataError::IndexOutOfRange {
                index,
                len: self.0,
                what: "mixture member",
            })
        }
    }
}

/// A class's `#[pymethods]`: its own `$own` items and the schedule's methods, which both
/// classes share (one `#[pymethods]` block per class).
macro_rules! schedule_methods {
    ($ty:ty, $name:literal, { $($own:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($own)*

            fn __repr__(&self) -> String {
                format!(
                    "{}(members={}, len={})",
                    $name,
                    self.mixture.members().len(),
                    self.mixture.len()
                )
            }

            /// `(member, index)` that `position` (negative: from the end) reads in `epoch`.
            fn source(&self, position: i64, epoch: u64) -> PyResult<(usize, usize)> {
                source_of(&self.mixture, position, epoch)
            }

            /// `source` of each of `positions`, as two lists (members, indices).
            fn sources(
                &self,
                positions: Vec<i64>,
                epoch: u64,
            ) -> PyResult<(Vec<usize>, Vec<usize>)> {
                positions
                    .into_iter()
                    .map(|p| source_of(&self.mixture, p, epoch))
                    .collect::<PyResult<Vec<_>>>()
                    .map(|v| v.into_iter().unzip())
            }

            /// Sets the epoch the members' orders are of outside a loader (inside one, the
            /// loader's epoch applies).
            fn set_epoch(&self, epoch: u64) {
                self.mixture.set_epoch(epoch)
            }

            /// Each member's draws in an epoch.
            #[getter]
            fn draws(&self) -> Vec<u64> {
                self.mixture.draws()
            }

            /// Each member's samples not drawn in an epoch.
            #[getter]
            fn unused(&self) -> Vec<u64> {
                self.mixture.unused()
            }

            /// Each member's draws past its size in an epoch.
            #[getter]
            fn repeated(&self) -> Vec<u64> {
                self.mixture.repeated()
            }

            /// Positions per block of the schedule (each block holds every member's share).
            #[getter]
            fn block(&self) -> u64 {
                self.mixture.block()
            }

            fn __len__(&self) -> usize {
                self.mixture.len()
            }
        }
    };
}

/// Built-in datasets (the same fields and batch form) drawn in proportion to `weights` until
/// `stop`; the loader reads it in its Rust workers.
#[pyclass(name = "_Mixture", module = "longshore", frozen)]
pub(crate) struct PyMixture {
    mixture: Mixture<AnyDataset>,
    native: Native,
}

schedule_methods!(PyMixture, "_Mixture", {
    /// What the loader reads, as a `_Native`.
    #[getter]
    fn _native(&self) -> PyNative {
        PyNative::wrap(self.native.clone(), "Mixture")
    }

    #[new]
    #[pyo3(signature = (datasets, weights, stop, *, seed = 0, shuffle = true))]
    fn new(
        datasets: Vec<Bound<'_, PyAny>>,
        weights: Vec<f64>,
        stop: &Bound<'_, PyAny>,
        seed: u64,
        shuffle: bool,
    ) -> PyResult<Self> {
        let stop = stop_of(stop)?;
        let parts = datasets
            .iter()
            .map(|d| native_part(d, "Mixture"))
            .collect::<PyResult<Vec<_>>>()?;
        let Some(first) = parts.first() else {
            return Err(PyValueError::new_err("Mixture needs at least one dataset"));
        };
        for (i, p) in parts.iter().enumerate() {
            if p.transformed {
                return Err(PyValueError::new_err(format!(
                    "Mixture: member {i} is an NpyDataset(normalize=...), which a mixture \
                     cannot normalise: mix the raw datasets and normalise the batches"
                )));
            }
            let (a, b) = (p.source.dataset.fields(), first.source.dataset.fields());
            if a != b || p.form != first.form {
                return Err(PyValueError::new_err(format!(
                    "Mixture: member {i} has fields {a:?} ({}), member 0 has {b:?} ({}); a \
                     mixture's batches need the same fields in every member",
                    p.form.describe(),
                    first.form.describe()
                )));
            }
        }
        let collate = first.source.collate.clone();
        let form = first.form.clone();
        let members: Vec<AnyDataset> = parts.into_iter().map(|p| p.source.dataset).collect();
        let mixture = mixture_of(members, &weights, stop, seed, shuffle)?;
        // Clones share the epoch: `set_epoch` here reaches the loader's copy.
        let dataset: AnyDataset = Arc::new(mixture.clone());
        Ok(Self {
            mixture,
            native: Native {
                source: Source { dataset, collate },
                form,
                transformed: false,
            },
        })
    }
});

/// The schedule of a mixture over members of these lengths: which member and index each
/// position reads, for a mixture whose members are read in Python.
#[pyclass(name = "_MixtureSchedule", module = "longshore", frozen)]
pub(crate) struct PySchedule {
    mixture: Mixture<Length>,
}

schedule_methods!(PySchedule, "_MixtureSchedule", {
    #[new]
    #[pyo3(signature = (lengths, weights, stop, *, seed = 0, shuffle = true))]
    fn new(
        lengths: Vec<usize>,
        weights: Vec<f64>,
        stop: &Bound<'_, PyAny>,
        seed: u64,
        shuffle: bool,
    ) -> PyResult<Self> {
        let members = lengths.into_iter().map(Length).collect();
        Ok(Self {
            mixture: mixture_of(members, &weights, stop_of(stop)?, seed, shuffle)?,
        })
    }
});

/// The schedule by the weights alone (no lengths): the member each position draws from, for a
/// mixture of Python iterable datasets, whose lengths are not known.
#[pyclass(name = "_Weights", module = "longshore", frozen)]
pub(crate) struct PyWeights {
    schedule: longshore::data::dataset::mixture::Schedule,
}

#[pymethods]
impl PyWeights {
    #[new]
    fn new(weights: Vec<f64>) -> PyResult<Self> {
        longshore::data::dataset::mixture::Schedule::new(&weights)
            .map(|schedule| Self { schedule })
            .map_err(data_err)
    }

    /// The members positions `start..start + n` draw from.
    fn members(&self, start: u64, n: u64) -> Vec<usize> {
        (start..start.saturating_add(n))
            .map(|p| self.schedule.at(p).0)
            .collect()
    }
}
