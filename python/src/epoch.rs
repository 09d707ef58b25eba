//! `longshore._Epoch`: one epoch of a loader as a Python iterator that waits without the GIL,
//! answers Ctrl-C, and runs a bounded number of batches ahead of Python.
//!
//! The epoch's Rust iterator runs on its own thread (the *pump*, [`crate::pump`]), which takes
//! each batch from the loader and queues it, up to [`AHEAD`](crate::pump::AHEAD) batches ahead
//! of Python. `__next__` takes a queued batch at once, holding the GIL, exports it for DLPack
//! and converts it; only when none is ready does it wait, in short slices with the GIL
//! released, checking for signals between slices. So the loader's per-batch work (its
//! consumer side, the device copy) overlaps Python's per-batch work (the export, the
//! conversion), and a steady stream of batches costs Python no thread wake-up.
//!
//! The export runs on Python's side, not the pump's: the pump is the pipeline's serial stage
//! (one thread for every batch of every worker), and on an H200 host a CUDA batch's export
//! (an event query, the capsules' allocations, the host lease's hand-back) cost 5.6-6.9 us of
//! the pump's 33 us per tabular batch, while Python waited for the pump on almost every call.
//! For the same reason a small batch's device copy is enqueued by `__next__` too
//! ([`crate::upload`]); a large one's by the pump, ahead of Python.
//!
//! A Python dataset loaded in this process (`num_workers=0`) is loaded only when asked for, as
//! PyTorch loads it ([`Feeding`]): a map-style one by `__next__` itself, on the calling thread
//! (no pump; the dataset sees that thread's grad mode, autocast and thread-locals), an
//! iterable one by the pump, one batch per `__next__`, while `__next__` waits. Either way the
//! dataset's code draws from the global random generators (torch's, NumPy's, Python's)
//! exactly where PyTorch's loader would, between the training loop's own draws.
//!
//! Guarantees:
//! - A `KeyboardInterrupt` while waiting takes nothing from the queue: the next `__next__`
//!   yields the batch that would have come, so no batch is lost or loaded twice. Without a
//!   pump, one raised in the dataset's code reaches Python as itself, as with PyTorch.
//! - `close()` (or dropping the epoch) returns every queued batch's memory at once, and the
//!   pump stops at its next hand-over (a batch it is collating then is returned as soon as it
//!   is ready).
//! - The loader's resumable position counts only the batches Python has received: the pump
//!   records the position after each batch it takes, and the batch carries it through the
//!   queue to [`Position`], which `state_dict()` reads while an epoch is under way.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use longshore::dlpack::{DlpackError, DlpackTensor, ExportOptions, export_batch, export_host};
use longshore::loader::{LoaderError, LoaderState};
use longshore::transfer::{Device, Stream};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::boxed::{Epoch, Handoff, Loader};
use crate::errors::{LoaderFailure, dlpack_err, loader_err};
use crate::fields::{VarPart, fixed_tensors, shape_batch};
use crate::pump::{HostReads, Producer, Ready, Reply, Room, Timings, lap, wait};
use crate::source::BatchForm;
use crate::tensor::PyTensor;
use crate::torch::PyTorchConverter;
use crate::upload::Uploader;

/// How an epoch's batches are made for Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feeding {
    /// By the pump, ahead of Python.
    Ahead,
    /// By the pump, one when `__next__` asks for it: a Python iterable dataset loaded in this
    /// process (`num_workers=0`), whose iterator runs on a loader thread while `__next__`
    /// waits (answering Ctrl-C).
    WhenAsked,
    /// By `__next__` itself, on the calling thread: a Python map-style dataset loaded in this
    /// process (`num_workers=0`).
    OnCallingThread,
}

/// Where `__next__` takes its batches from.
enum Feed {
    /// The pump's queue; with [`Feeding::WhenAsked`], where `__next__` asks for each batch and
    /// whether it has asked for one not yet taken (an interrupted wait leaves it asked).
    Pump(
        Receiver<Ready>,
        Option<(crossbeam_channel::Sender<()>, bool)>,
    ),
    /// The epoch itself, run by `__next__` on the calling thread.
    Direct(Box<Producer>),
}

fn export(h: Handoff, opts: &ExportOptions) -> Result<Vec<DlpackTensor>, DlpackError> {
    match h {
        Handoff::Host(b) => export_host(b, opts),
        Handoff::Device(b) => export_batch(b, opts),
        Handoff::Staged(_) => Err(DlpackError::Unsupported {
            what: "a batch for the device",
            reason: "its copy to the device was not enqueued".into(),
        }),
    }
}

/// The loader's position as Python has received it, while an epoch is under way.
///
/// Each epoch has an id; only the newest epoch's batches move the position, and an epoch's
/// end (or `set_epoch` / `load_state_dict`) leaves the loader's own position in charge.
#[derive(Debug, Default)]
pub(crate) struct Position {
    inner: Mutex<(u64, Option<LoaderState>)>,
}

impl Position {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<LoaderState>)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new epoch starts at `state` (the loader's position before its first batch); returns
    /// its id.
    pub(crate) fn begin(&self, state: Option<LoaderState>) -> u64 {
        let mut g = self.lock();
        g.0 += 1;
        g.1 = state;
        g.0
    }

    fn received(&self, id: u64, state: Option<LoaderState>) {
        let mut g = self.lock();
        if g.0 == id {
            g.1 = state;
        }
    }

    /// The loader's own position applies again (for example after `set_epoch`).
    pub(crate) fn clear(&self) {
        let mut g = self.lock();
        g.0 += 1;
        g.1 = None;
    }

    /// The position as Python received it, if an epoch is under way.
    pub(crate) fn get(&self) -> Option<LoaderState> {
        self.lock().1.clone()
    }
}

/// How an epoch turns a batch's tensors into Python values.
pub(crate) enum Convert {
    /// `longshore.Tensor` objects, as exported.
    Raw,
    /// A Python callable per tensor (`np.from_dlpack`, or torch's `from_dlpack` where the
    /// torch internals [`PyTorchConverter`] needs are missing).
    Each(Py<PyAny>),
    /// torch tensors, a whole batch per Rust call; with the loader's device (that of CUDA
    /// batches).
    Torch(Py<PyTorchConverter>, Option<Device>),
}

/// One epoch of a `_Loader`. `__next__` returns the converted tensor (one-tensor batches), a
/// dict of converted tensors by field name (named fields: token sequences) or a list of them,
/// or a list of `longshore.Tensor` without conversion.
#[pyclass(name = "_Epoch", module = "longshore", frozen)]
pub(crate) struct PyEpoch {
    /// The pump's queue or the epoch itself; `None` once the epoch ended or was closed.
    feed: Mutex<Option<Feed>>,
    /// `closed`: set by `close()`, for a `__next__` waiting on another thread (and for the
    /// pump, waiting for room).
    room: Arc<Room>,
    position: Arc<Position>,
    id: u64,
    convert: Convert,
    form: BatchForm,
    opts: ExportOptions,
    timings: Option<Arc<Timings>>,
    /// Enqueues the copies of the small batches the pump leaves to `__next__` (device epochs).
    uploader: Mutex<Option<Uploader>>,
    /// How long `__next__` polls for a batch before it sleeps ([`crate::pump::poll_for`]).
    poll: Duration,
}

impl Drop for PyEpoch {
    fn drop(&mut self) {
        // A pump waiting for room stops waiting; its hand-over then fails (the queue is
        // dropped with this epoch), which ends it.
        self.room.close();
    }
}

impl PyEpoch {
    /// Starts epoch `id` of a loader with `num_workers` workers; `position` has already begun
    /// it. `copies`: the copy stream of an epoch that yields [`Handoff::Staged`] batches.
    /// `meta`: batches of a Python dataset, which `__next__` returns as `(tensors, meta)`.
    /// `poll`: how long `__next__` polls the pump's queue before it sleeps
    /// ([`crate::pump::poll_for`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        epoch: Epoch,
        loader: Arc<Loader>,
        opts: ExportOptions,
        position: Arc<Position>,
        id: u64,
        convert: Convert,
        form: BatchForm,
        meta: bool,
        copies: Option<Stream>,
        feeding: Feeding,
        poll: Duration,
    ) -> PyResult<Self> {
        let room = Arc::new(Room::default());
        let timings = Timings::from_env();
        let fields = match &form {
            BatchForm::Fields(f) => Some(f.clone()),
            _ => None,
        };
        let producer = Producer::new(epoch, loader, HostReads { meta, fields }, timings.clone());
        let feed = if feeding == Feeding::OnCallingThread {
            Feed::Direct(Box::new(producer))
        } else {
            let uploader = copies.clone().map(Uploader::new);
            let (asks, asked) = match feeding {
                Feeding::WhenAsked => {
                    let (tx, rx) = crossbeam_channel::unbounded();
                    (Some(rx), Some((tx, false)))
                }
                _ => (None, None),
            };
            let rx = crate::pump::start(producer, uploader, room.clone(), asks).map_err(|e| {
                LoaderFailure::new_err(format!("cannot start the epoch thread: {e}"))
            })?;
            Feed::Pump(rx, asked)
        };
        Ok(Self {
            feed: Mutex::new(Some(feed)),
            room,
            position,
            id,
            convert,
            form,
            opts,
            timings,
            uploader: Mutex::new(copies.map(Uploader::new)),
            poll,
        })
    }

    /// Enqueues the copy of a batch the pump left to `__next__`, waiting (the GIL released)
    /// if the copies in flight are at their bound; other batches pass as they are.
    fn stage(&self, py: Python<'_>, h: Handoff) -> Result<Handoff, LoaderError> {
        let Handoff::Staged(b) = h else {
            return Ok(h);
        };
        let start = self.timings.as_ref().map(|_| Instant::now());
        let mut up = self.uploader.lock().unwrap_or_else(|p| p.into_inner());
        let Some(up) = up.as_mut() else {
            return Err(LoaderError::State(
                "a batch for the device came from an epoch without a copy stream".into(),
            ));
        };
        let p = up.upload(b, |e| py.detach(move || e.synchronize()))?;
        lap(self.timings.as_deref(), |t| &t.upload, start);
        Ok(Handoff::Device(p))
    }

    /// The Python value of one batch; `parts`: a fields batch's variable-length fields.
    fn deliver(
        &self,
        py: Python<'_>,
        tensors: Vec<DlpackTensor>,
        parts: Option<Vec<VarPart>>,
    ) -> PyResult<Py<PyAny>> {
        let (tensors, fields) = match (&self.form, parts) {
            (BatchForm::Fields(fields), Some(parts)) => {
                // The variable-length fields' tensors are not handed out: their lists are.
                let keep = fixed_tensors(fields);
                let fixed = tensors
                    .into_iter()
                    .zip(keep)
                    .filter_map(|(t, k)| k.then_some(t))
                    .collect();
                (fixed, Some((fields, parts)))
            }
            _ => (tensors, None),
        };
        let values = match &self.convert {
            Convert::Raw => {
                let raw: Vec<PyTensor> = tensors.into_iter().map(PyTensor::new).collect();
                if fields.is_none() {
                    return Ok(PyList::new(py, raw)?.into_any().unbind());
                }
                raw.into_iter()
                    .map(|t| Ok(Bound::new(py, t)?.into_any()))
                    .collect::<PyResult<Vec<_>>>()?
            }
            Convert::Torch(c, device) => c.get().batch(py, tensors, device.as_ref())?,
            Convert::Each(f) => {
                let f = f.bind(py);
                tensors
                    .into_iter()
                    .map(|t| f.call1((PyTensor::new(t),)))
                    .collect::<PyResult<Vec<_>>>()?
            }
        };
        match fields {
            Some((fields, parts)) => shape_batch(py, fields, values, parts),
            None => self.shape(py, values),
        }
    }

    /// A batch's converted tensors in the dataset's [`BatchForm`].
    fn shape(&self, py: Python<'_>, mut values: Vec<Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        match &self.form {
            BatchForm::Single if values.len() == 1 => {
                Ok(values.pop().expect("one tensor").unbind())
            }
            BatchForm::Named(names) if names.len() == values.len() => {
                let dict = PyDict::new(py);
                for (name, value) in names.iter().zip(values) {
                    dict.set_item(name, value)?;
                }
                Ok(dict.into_any().unbind())
            }
            _ => Ok(PyList::new(py, values)?.into_any().unbind()),
        }
    }
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let mut guard = self
            .feed
            .try_lock()
            .map_err(|_| PyRuntimeError::new_err("this epoch is already being iterated"))?;
        if self.room.is_closed() {
            *guard = None;
        }
        let ready = match guard.as_mut() {
            None => return Ok(None),
            Some(Feed::Direct(producer)) => {
                // The dataset's code runs on this thread now, with the GIL (the loader
                // releases it around its own work).
                crate::pydata::take_interrupt();
                let (ready, end) = py.detach(|| producer.next());
                if end {
                    *guard = None;
                }
                // A KeyboardInterrupt (or SystemExit) raised in the dataset's code: the batch
                // it interrupted is lost, as with PyTorch's loader.
                if let Some(e) = crate::pydata::take_interrupt() {
                    self.position.received(self.id, ready.state);
                    return Err(e);
                }
                ready
            }
            Some(Feed::Pump(rx, asks)) => {
                if let Some((tx, asked)) = asks.as_mut()
                    && !*asked
                {
                    // One ask per batch: a wait interrupted by Ctrl-C leaves it asked, and the
                    // next call takes that batch.
                    if tx.send(()).is_err() {
                        *guard = None;
                        return Err(LoaderFailure::new_err(
                            "the epoch thread ended unexpectedly",
                        ));
                    }
                    *asked = true;
                }
                let ready = match rx.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Disconnected) => {
                        *guard = None;
                        return Err(LoaderFailure::new_err(
                            "the epoch thread ended unexpectedly",
                        ));
                    }
                    Err(TryRecvError::Empty) => loop {
                        let start = self.timings.as_ref().map(|_| Instant::now());
                        let got = py.detach(|| wait(rx, self.poll));
                        if let Some(t) = self.timings.as_deref() {
                            lap(Some(t), |t| &t.wait, start);
                            t.waits.fetch_add(1, Ordering::Relaxed);
                        }
                        // An interrupt returns here with the queue untouched: the batch is
                        // taken by the next call.
                        match got {
                            Ok(r) => break r,
                            Err(RecvTimeoutError::Timeout) => {
                                if self.room.is_closed() {
                                    *guard = None;
                                    return Ok(None);
                                }
                                py.check_signals()?
                            }
                            Err(RecvTimeoutError::Disconnected) => {
                                *guard = None;
                                return Err(LoaderFailure::new_err(
                                    "the epoch thread ended unexpectedly",
                                ));
                            }
                        }
                    },
                };
                if let Some((_, asked)) = asks.as_mut() {
                    *asked = false;
                }
                ready
            }
        };
        self.room.taken();
        let Ready { reply, state } = ready;
        match reply {
            Reply::Batch(handoff, meta, parts) => {
                let start = self.timings.as_ref().map(|_| Instant::now());
                self.position.received(self.id, state);
                let handoff = match self.stage(py, *handoff) {
                    Ok(h) => h,
                    Err(e) => return Err(loader_err(e)),
                };
                let exported = self.timings.as_ref().map(|_| Instant::now());
                let tensors = export(handoff, &self.opts);
                lap(self.timings.as_deref(), |t| &t.export, exported);
                let out = tensors
                    .map_err(dlpack_err)
                    .and_then(|mut t| match &meta {
                        // The meta's tensor is not handed out: its bytes are.
                        Some(m) => {
                            t.pop();
                            let list = self.deliver(py, t, None)?;
                            let tuple = (list, pyo3::types::PyBytes::new(py, m));
                            Ok(tuple.into_pyobject(py)?.into_any().unbind())
                        }
                        None => self.deliver(py, t, parts),
                    })
                    .map(Some);
                if let Some(t) = self.timings.as_deref() {
                    lap(Some(t), |t| &t.deliver, start);
                    t.delivered.fetch_add(1, Ordering::Relaxed);
                }
                out
            }
            Reply::End => {
                *guard = None;
                // The loader's own position is right again: the pump holds nothing.
                self.position.received(self.id, None);
                Ok(None)
            }
            Reply::Failed(e) => {
                self.position.received(self.id, state);
                Err(loader_err(e))
            }
        }
    }

    /// The per-stage time counters (nanoseconds summed over the epoch, and batch counts), or
    /// `None` unless `LONGSHORE_EPOCH_TIMINGS` was set when the epoch started.
    fn _debug_timings<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(t) = self.timings.as_deref() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (k, v) in [
            ("pump_next_ns", &t.next),
            ("export_ns", &t.export),
            ("upload_ns", &t.upload),
            ("pump_state_ns", &t.state),
            ("pump_send_ns", &t.send),
            ("pumped", &t.pumped),
            ("pump_cpu_ns", &t.pump_cpu),
            ("pump_next_cpu_ns", &t.next_cpu),
            ("pump_send_cpu_ns", &t.send_cpu),
            ("next_wait_ns", &t.wait),
            ("next_waits", &t.waits),
            ("next_deliver_ns", &t.deliver),
            ("delivered", &t.delivered),
        ] {
            d.set_item(k, v.load(Ordering::Relaxed))?;
        }
        Ok(Some(d))
    }

    /// Ends the epoch now: returns the memory of the batches queued for Python and stops the
    /// workers (also done when the epoch is garbage-collected). The loader's position stays
    /// at the last batch Python received.
    fn close(&self, py: Python<'_>) {
        self.room.close();
        // When another thread is waiting in `__next__`, it drops the queue at its next slice
        // (blocking here, with the GIL held, could deadlock with it).
        if let Ok(mut guard) = self.feed.try_lock() {
            match guard.take() {
                // Queued batches go back to the pool now; dropping the receiver makes the
                // pump's next hand-over fail, which ends it.
                Some(Feed::Pump(rx, _)) => while rx.try_recv().is_ok() {},
                // The epoch ends here (its iterator is dropped, the GIL released: it may
                // wait for the loader's threads).
                Some(Feed::Direct(producer)) => py.detach(move || drop(producer)),
                None => {}
            }
        }
    }
}
