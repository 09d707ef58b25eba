//! Sampling for `longshore.DataLoader` and `longshore.data`:
//!
//! - [`PyEpochOrder`] (`longshore._EpochOrder`): the order of each epoch, handed over by Python
//!   before the epoch starts, as the loader's batch sampler ([`EpochOrder`], a
//!   [`BatchSampling`]). PyTorch's samplers draw from a `torch.Generator` whose state only
//!   Python holds, and a user's sampler is any Python iterable, so the order of an epoch is
//!   known only when Python starts it: as a whole epoch of indices (longshore's samplers,
//!   drawn by Python in one call), or as a Python iterator that the loader pulls from while it
//!   deals batches, as PyTorch iterates its sampler in the main process.
//! - the samplers of `longshore-data` (`RandomSampler`, `SubsetRandomSampler`,
//!   `WeightedRandomSampler`, `DistributedSampler`) as functions returning one epoch's indices,
//!   which `longshore.data` uses when PyTorch is not installed, and the launcher's environment
//!   ([`DistEnv`]) for `DistributedSampler`'s defaults.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use longshore::data::{
    BatchIter, BatchSampling, DataError, DistEnv, DistributedSampler, RandomSampler, Sampler,
    SubsetRandomSampler, WeightedRandomSampler,
};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PyList};

use crate::errors::data_err;

/// Batches a lazy order takes from its Python iterator per visit to Python: fewer visits (each
/// waits for the GIL) at the cost of drawing a few batches earlier than PyTorch would.
const PULL: usize = 4;

/// One epoch's order, as Python handed it over.
enum Order {
    /// The whole epoch's indices, grouped here into batches of `batch_size`.
    Indices {
        indices: Arc<Vec<usize>>,
        batch_size: usize,
        drop_last: bool,
    },
    /// A Python iterator pulled while the loader deals batches: of batches (`batch_size` is
    /// `None`) or of indices, grouped here.
    Lazy {
        iter: Py<PyIterator>,
        batch_size: Option<usize>,
        drop_last: bool,
    },
}

/// What Python and the loader share.
struct Slot {
    /// The order the next epoch runs. Whole-epoch indices stay until replaced (an epoch run
    /// without Python, `_drain_in_rust`, repeats them); an iterator serves one epoch.
    order: Option<Order>,
    /// Batches per epoch, as Python counts them (`len(batch_sampler)`; 0 when unknown): what
    /// the loader's resumable position records.
    len: usize,
    epoch: u64,
    /// The samples of the dataset (negative indices count from its end, as in Python).
    dataset_len: usize,
    /// What went wrong pulling a Python iterator, raised by Python when the epoch ends.
    error: Option<PyErr>,
    /// Bumped by every order handed over: an abandoned epoch's iterator that fails later does
    /// not report into the next epoch.
    generation: u64,
}

/// The loader's batch sampler over the orders Python hands over ([`PyEpochOrder`]).
#[derive(Clone)]
pub(crate) struct EpochOrder(Arc<Mutex<Slot>>);

impl fmt::Debug for EpochOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("EpochOrder")
            .field("len", &s.len)
            .field("epoch", &s.epoch)
            .field("handed", &s.order.is_some())
            .finish()
    }
}

impl EpochOrder {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BatchSampling for EpochOrder {
    fn len(&self) -> usize {
        self.lock().len
    }
    fn batch_size(&self) -> usize {
        match &self.lock().order {
            Some(Order::Indices { batch_size, .. })
            | Some(Order::Lazy {
                batch_size: Some(batch_size),
                ..
            }) => *batch_size,
            _ => 1,
        }
    }
    fn drop_last(&self) -> bool {
        match &self.lock().order {
            Some(Order::Indices { drop_last, .. }) | Some(Order::Lazy { drop_last, .. }) => {
                *drop_last
            }
            None => false,
        }
    }
    fn epoch(&self) -> u64 {
        self.lock().epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.lock().epoch = epoch;
    }
    fn iter(&self) -> BatchIter<'_> {
        self.iter_owned_from(0)
    }
    fn iter_from(&self, batches_done: usize) -> BatchIter<'_> {
        self.iter_owned_from(batches_done)
    }
    /// The handed-over order, without its first `batches_done` batches. Called by the loader
    /// under its own lock: nothing here waits for Python (an iterator is first pulled by the
    /// loader's `next`).
    fn iter_owned_from(&self, batches_done: usize) -> BatchIter<'static> {
        let mut slot = self.lock();
        let (dataset_len, generation) = (slot.dataset_len, slot.generation);
        let batches: BatchIter<'static> = match slot.order.take() {
            None => Box::new(std::iter::empty()),
            Some(Order::Indices {
                indices,
                batch_size,
                drop_last,
            }) => {
                slot.order = Some(Order::Indices {
                    indices: indices.clone(),
                    batch_size,
                    drop_last,
                });
                Box::new(Chunked {
                    indices,
                    at: 0,
                    batch_size,
                    drop_last,
                })
            }
            Some(Order::Lazy {
                iter,
                batch_size,
                drop_last,
            }) => Box::new(Pull {
                iter: Some(iter),
                batch_size,
                drop_last,
                dataset_len,
                ready: VecDeque::new(),
                partial: Vec::new(),
                slot: self.0.clone(),
                generation,
            }),
        };
        if batches_done == 0 {
            batches
        } else {
            Box::new(batches.skip(batches_done))
        }
    }
}

/// Whole-epoch indices in batches.
struct Chunked {
    indices: Arc<Vec<usize>>,
    at: usize,
    batch_size: usize,
    drop_last: bool,
}

impl Iterator for Chunked {
    type Item = Vec<usize>;
    fn next(&mut self) -> Option<Vec<usize>> {
        let rest = self.indices.get(self.at..).unwrap_or(&[]);
        let take = rest.len().min(self.batch_size);
        if take == 0 || (self.drop_last && take < self.batch_size) {
            return None;
        }
        self.at += take;
        Some(rest[..take].to_vec())
    }
}

/// A Python iterator's batches, taken [`PULL`] at a time with the GIL held.
struct Pull {
    /// `None` once it has ended (or failed, or Python is shutting down).
    iter: Option<Py<PyIterator>>,
    batch_size: Option<usize>,
    drop_last: bool,
    dataset_len: usize,
    ready: VecDeque<Vec<usize>>,
    /// Indices of the batch being grouped (an iterator of indices).
    partial: Vec<usize>,
    slot: Arc<Mutex<Slot>>,
    /// The order's [`Slot::generation`].
    generation: u64,
}

impl Iterator for Pull {
    type Item = Vec<usize>;
    fn next(&mut self) -> Option<Vec<usize>> {
        if self.ready.is_empty() {
            self.fill();
        }
        self.ready.pop_front()
    }
}

impl Pull {
    /// Takes up to [`PULL`] batches from the iterator; at its end, the last partial batch
    /// (unless `drop_last`); on a Python exception, records it for Python and ends.
    fn fill(&mut self) {
        let Some(iter) = self.iter.take() else {
            return;
        };
        let Self {
            batch_size,
            drop_last,
            dataset_len,
            ready,
            partial,
            ..
        } = self;
        let pulled = Python::try_attach(|py| -> PyResult<bool> {
            let mut it = iter.bind(py).clone();
            while ready.len() < PULL {
                let Some(item) = it.next() else {
                    // The end: the last partial batch of grouped indices.
                    if !partial.is_empty() && !*drop_last {
                        ready.push_back(std::mem::take(partial));
                    }
                    return Ok(false);
                };
                let item = item?;
                match batch_size {
                    None => ready.push_back(batch_of(&item, *dataset_len)?),
                    Some(bs) => {
                        partial.push(index_of(&item, *dataset_len)?);
                        if partial.len() == *bs {
                            ready.push_back(std::mem::replace(partial, Vec::with_capacity(*bs)));
                        }
                    }
                }
            }
            Ok(true)
        });
        match pulled {
            Some(Ok(true)) => self.iter = Some(iter),
            Some(Ok(false)) | None => {}
            Some(Err(e)) => {
                let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
                if slot.generation == self.generation {
                    slot.error.get_or_insert(e);
                }
            }
        }
    }
}

/// A dataset index from Python (an `int`, a NumPy integer, a 0-d integer tensor: anything with
/// `__index__`); negative indices count from the end, as Python's indexing does.
fn index_of(item: &Bound<'_, PyAny>, len: usize) -> PyResult<usize> {
    let i: i64 = item.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "a sampler must yield integer indices, got {}",
            type_name(item)
        ))
    })?;
    wrap(i, len)
}

fn type_name(item: &Bound<'_, PyAny>) -> String {
    let name = item.get_type().name();
    name.map_or_else(|_| "?".into(), |n| n.to_string())
}

fn wrap(i: i64, len: usize) -> PyResult<usize> {
    if i >= 0 {
        return usize::try_from(i)
            .map_err(|_| PyIndexError::new_err(format!("index {i} is out of range")));
    }
    let back = usize::try_from(i.unsigned_abs()).unwrap_or(usize::MAX);
    len.checked_sub(back).ok_or_else(|| {
        PyIndexError::new_err(format!(
            "index {i} is out of range for a dataset of {len} samples"
        ))
    })
}

/// A batch of indices from Python: a list (the usual), or any iterable of indices.
fn batch_of(item: &Bound<'_, PyAny>, len: usize) -> PyResult<Vec<usize>> {
    if let Ok(list) = item.cast::<PyList>() {
        return list.iter().map(|i| index_of(&i, len)).collect();
    }
    let mut out = Vec::new();
    for i in item.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "a batch_sampler must yield lists of indices, got {}",
            type_name(item)
        ))
    })? {
        out.push(index_of(&i?, len)?);
    }
    Ok(out)
}

/// Indices packed as native-endian `int64` (NumPy's `int64` array `tobytes()`) into a dataset
/// of `len` samples, negative ones counting from its end.
pub(crate) fn unpack(data: &[u8], len: usize) -> PyResult<Vec<usize>> {
    if !data.len().is_multiple_of(8) {
        return Err(PyTypeError::new_err(
            "indices must be packed int64 values (a multiple of 8 bytes)",
        ));
    }
    data.chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            wrap(i64::from_ne_bytes(b), len)
        })
        .collect()
}

/// Indices as packed native-endian `int64`, for `numpy.frombuffer(..., numpy.int64)`.
fn pack<'py>(py: Python<'py>, indices: impl Iterator<Item = usize>) -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(indices.size_hint().0 * 8);
    for i in indices {
        // Indices of an in-memory dataset fit in i64.
        out.extend_from_slice(&(i as i64).to_ne_bytes());
    }
    PyBytes::new(py, &out)
}

/// A `ValueError` for a batch size of 0.
fn no_zero_batch(batch_size: usize) -> PyResult<()> {
    if batch_size == 0 {
        return Err(data_err(DataError::InvalidArgument {
            name: "batch_size",
            reason: "must be a positive integer, got 0".into(),
        }));
    }
    Ok(())
}

/// The order of each epoch of a `longshore.DataLoader` whose sampler is a Python object (one
/// of `longshore.data`'s, PyTorch's, a user's), handed over by Python before the epoch starts.
#[pyclass(name = "_EpochOrder", module = "longshore", frozen)]
pub(crate) struct PyEpochOrder {
    order: EpochOrder,
}

impl PyEpochOrder {
    /// The batch sampler the loader runs.
    pub(crate) fn sampler(&self) -> EpochOrder {
        self.order.clone()
    }

    fn set(&self, order: Order, len: usize) {
        let mut slot = self.order.lock();
        slot.order = Some(order);
        slot.len = len;
        slot.error = None;
        slot.generation += 1;
    }
}

#[pymethods]
impl PyEpochOrder {
    /// An order for a dataset of `dataset_len` samples, `len` batches per epoch.
    #[new]
    #[pyo3(signature = (dataset_len, len = 0))]
    fn new(dataset_len: usize, len: usize) -> Self {
        Self {
            order: EpochOrder(Arc::new(Mutex::new(Slot {
                order: None,
                len,
                epoch: 0,
                dataset_len,
                error: None,
                generation: 0,
            }))),
        }
    }

    /// The next epoch has `len` batches: set before a checkpoint of an epoch whose length
    /// differs from the sampler's usual one (resumed from another number of ranks) loads.
    fn set_len(&self, len: usize) {
        self.order.lock().len = len;
    }

    /// The dataset has `dataset_len` samples now (read at each epoch: a dataset may grow).
    fn set_dataset_len(&self, dataset_len: usize) {
        self.order.lock().dataset_len = dataset_len;
    }

    /// The next epoch runs `indices` (packed native-endian int64) in batches of `batch_size`;
    /// `len` batches.
    fn indices(
        &self,
        indices: &Bound<'_, PyBytes>,
        batch_size: usize,
        drop_last: bool,
        len: usize,
    ) -> PyResult<()> {
        no_zero_batch(batch_size)?;
        let dataset_len = self.order.lock().dataset_len;
        let indices = unpack(indices.as_bytes(), dataset_len)?;
        self.set(
            Order::Indices {
                indices: Arc::new(indices),
                batch_size,
                drop_last,
            },
            len,
        );
        Ok(())
    }

    /// The next epoch runs the batches of the Python iterator `iter`, pulled as the loader
    /// deals them: each item a batch (`batch_size=None`), or an index grouped into batches of
    /// `batch_size`. `len`: batches per epoch (0 when unknown).
    #[pyo3(signature = (iter, batch_size, drop_last, len))]
    fn lazy(
        &self,
        iter: &Bound<'_, PyAny>,
        batch_size: Option<usize>,
        drop_last: bool,
        len: usize,
    ) -> PyResult<()> {
        no_zero_batch(batch_size.unwrap_or(1))?;
        let iter = iter.try_iter()?.unbind();
        self.set(
            Order::Lazy {
                iter,
                batch_size,
                drop_last,
            },
            len,
        );
        Ok(())
    }

    /// Raises what went wrong pulling the last iterator (once), if anything did.
    fn raise_error(&self) -> PyResult<()> {
        match self.order.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `RandomSampler`'s indices of one epoch (longshore-data's generator seeded with `seed`).
#[pyfunction]
pub(crate) fn _random_indices<'py>(
    py: Python<'py>,
    len: usize,
    replacement: bool,
    num_samples: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let s =
        RandomSampler::with_options(len, replacement, Some(num_samples), seed).map_err(data_err)?;
    Ok(pack(py, s.iter()))
}

/// A random permutation of `0..len` (`SubsetRandomSampler`'s and `random_split`'s).
#[pyfunction]
pub(crate) fn _permutation(py: Python<'_>, len: usize, seed: u64) -> Bound<'_, PyBytes> {
    let s = SubsetRandomSampler::new((0..len).collect(), seed);
    pack(py, s.iter())
}

/// `WeightedRandomSampler`'s indices of one epoch.
#[pyfunction]
pub(crate) fn _weighted_indices(
    py: Python<'_>,
    weights: Vec<f64>,
    num_samples: usize,
    replacement: bool,
    seed: u64,
) -> PyResult<Bound<'_, PyBytes>> {
    let s =
        WeightedRandomSampler::new(weights, num_samples, replacement, seed).map_err(data_err)?;
    Ok(pack(py, s.iter()))
}

/// `DistributedSampler`'s indices for `rank` at `epoch`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _distributed_indices(
    py: Python<'_>,
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
) -> PyResult<Bound<'_, PyBytes>> {
    let mut s = DistributedSampler::builder(len, num_replicas, rank)
        .shuffle(shuffle)
        .seed(seed)
        .drop_last(drop_last)
        .build()
        .map_err(data_err)?;
    s.set_epoch(epoch);
    Ok(pack(py, s.iter()))
}

/// `(rank, world_size)` from the launcher's environment (torchrun's `RANK`/`WORLD_SIZE`,
/// SLURM's, Open MPI's), or `None` outside a launcher.
#[pyfunction]
pub(crate) fn _dist_env() -> PyResult<Option<(usize, usize)>> {
    Ok(DistEnv::from_env()
        .map_err(data_err)?
        .map(|e| (e.rank, e.world_size)))
}
