//! `longshore._Epoch`: one epoch of a loader as a Python iterator that waits without the GIL,
//! answers Ctrl-C, and runs a bounded number of batches ahead of Python.
//!
//! The epoch's Rust iterator runs on its own thread (the *pump*), which takes each batch from
//! the loader and queues it, up to [`AHEAD`] batches ahead of Python ([`AHEAD_SMALL`] for
//! small batches). `__next__` takes a queued batch at once, holding the GIL, exports it for
//! DLPack and converts it; only when none is ready does it wait, in short slices with the GIL
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
//! Guarantees:
//! - A `KeyboardInterrupt` while waiting takes nothing from the queue: the next `__next__`
//!   yields the batch that would have come, so no batch is lost or loaded twice.
//! - `close()` (or dropping the epoch) returns every queued batch's memory at once, and the
//!   pump stops at its next hand-over (a batch it is collating then is returned as soon as it
//!   is ready).
//! - The loader's resumable position counts only the batches Python has received: the pump
//!   records the position after each batch it takes, and the batch carries it through the
//!   queue to [`Position`], which `state_dict()` reads while an epoch is under way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, bounded};
use longshore::dlpack::{DlpackError, DlpackTensor, ExportOptions, export_batch, export_host};
use longshore::loader::{LoaderError, LoaderState};
use longshore::nvjpeg::NvjpegInfo;
use longshore::transfer::{Device, Stream};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::boxed::{Epoch, Handoff, Loader};
use crate::errors::{LoaderFailure, dlpack_err, loader_err};
use crate::fields::{Field, VarPart, fixed_tensors, host_parts, shape_batch};
use crate::source::BatchForm;
use crate::tensor::PyTensor;
use crate::torch::PyTorchConverter;
use crate::upload::Uploader;

/// Batches the pump may hold ready for Python, queued or being queued, when a batch is larger
/// than [`SMALL_BATCH`] bytes.
///
/// One ready batch is what overlaps the loader's per-batch work with Python's; a second
/// absorbs the jitter of a single slow hand-over. Large batches take long enough to make that
/// the hand-over's cost is negligible, and every ready batch holds a block of the pool beyond
/// the loader's own prefetch (`num_workers * prefetch_factor` batches being collated), so under
/// a tight pool budget a deeper queue of them would only take blocks from the workers.
pub(crate) const AHEAD: usize = 2;

/// Batches the pump may hold ready for Python when a batch has at most [`SMALL_BATCH`] bytes.
///
/// Small batches come every few tens of microseconds, as often as a thread's wake-up: with two
/// ready batches, the pump and Python each sleep and wake the other about once a batch
/// (the pump on a full queue, Python on an empty one), and the futex calls and reschedules are
/// most of both threads' per-batch CPU time. A deeper queue lets each side run through several
/// batches between sleeps (on two shared cores, tabular batches of 256 KiB with 4 workers:
/// 13 us less CPU per batch and 15% less wall time than with [`AHEAD`]). It holds at most
/// `(AHEAD_SMALL - AHEAD) * SMALL_BATCH` bytes more than [`AHEAD`] would (24 MiB); under a
/// pool budget of only a few batches, that many ready batches leave the workers fewer blocks
/// to collate into (never a deadlock: each batch Python takes frees a slot).
pub(crate) const AHEAD_SMALL: usize = 8;

/// The size up to which a batch counts as small for [`AHEAD_SMALL`], in bytes.
pub(crate) const SMALL_BATCH: usize = 4 << 20;

/// How long one wait lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(50);

/// How long `__next__` polls the queue (GIL released) before it sleeps, when the host has a
/// core to spare for it ([`poll_for`]). When Python consumes faster than the loader produces,
/// the next batch is usually due within a few microseconds; catching it while polling spares
/// the pump a wake-up call on its critical path (a sleeping receiver costs the sender a futex
/// syscall and the receiver a reschedule, several microseconds per batch at tens of thousands
/// of batches per second).
const POLL: Duration = Duration::from_micros(50);

/// How long `__next__` polls before it sleeps, for a loader with `num_workers` workers:
/// [`POLL`] when the workers, the epoch thread and Python's thread fit the cores this process
/// may use, else none: with every core busy, a polling thread takes a core from the workers or
/// from the epoch thread it waits for. `LONGSHORE_EPOCH_POLL_US` (a benchmark switch, read
/// when an epoch starts) sets it.
pub(crate) fn poll_for(num_workers: usize) -> Duration {
    if let Some(us) = std::env::var("LONGSHORE_EPOCH_POLL_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Duration::from_micros(us);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if num_workers + 2 <= cores {
        POLL
    } else {
        Duration::ZERO
    }
}

/// Per-stage time counters of one epoch, kept only when the environment variable
/// `LONGSHORE_EPOCH_TIMINGS` is set to a non-empty value other than `0` when the epoch starts
/// (read by `_Epoch._debug_timings()`, for benchmarks): nanoseconds summed over the epoch.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    /// The pump: the loader's `next()` (waiting for workers, the device prefetcher).
    next: AtomicU64,
    /// `__next__`: exporting a batch for DLPack.
    export: AtomicU64,
    /// `__next__`: enqueuing a small batch's device copy (see [`crate::upload`]).
    upload: AtomicU64,
    /// The pump: taking the loader's position after a batch.
    state: AtomicU64,
    /// The pump: handing a batch to the queue, waiting for room included.
    send: AtomicU64,
    /// Batches the pump handed over.
    pumped: AtomicU64,
    /// The pump thread's CPU time, in nanoseconds, when it ended.
    pump_cpu: AtomicU64,
    /// The pump thread's CPU time in the loader's `next()`.
    next_cpu: AtomicU64,
    /// The pump thread's CPU time handing batches to the queue.
    send_cpu: AtomicU64,
    /// `__next__`: waiting for a batch (the GIL released), when none was ready.
    wait: AtomicU64,
    /// `__next__` calls that found no batch ready and waited.
    waits: AtomicU64,
    /// `__next__`: recording the position, enqueuing a small batch's copy, exporting the batch
    /// and turning it into Python values (the copy and the export included).
    deliver: AtomicU64,
    /// Batches `__next__` delivered.
    delivered: AtomicU64,
}

impl Timings {
    /// Counters for a new epoch, if the environment asks for them.
    pub(crate) fn from_env() -> Option<Arc<Self>> {
        match std::env::var_os("LONGSHORE_EPOCH_TIMINGS") {
            Some(v) if !v.is_empty() && v != "0" => Some(Arc::default()),
            _ => None,
        }
    }
}

/// The CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs no set-up.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Adds the time since `start` to `counter`, when timings are kept.
fn lap(t: Option<&Timings>, counter: impl Fn(&Timings) -> &AtomicU64, start: Option<Instant>) {
    if let (Some(t), Some(s)) = (t, start) {
        let ns = u64::try_from(s.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter(t).fetch_add(ns, Ordering::Relaxed);
    }
}

/// Adds the calling thread's CPU time since `start` to `counter`, when timings are kept.
fn cpu_lap(t: Option<&Timings>, counter: impl Fn(&Timings) -> &AtomicU64, start: Option<u64>) {
    if let (Some(t), Some(s)) = (t, start) {
        counter(t).fetch_add(thread_cpu_ns().saturating_sub(s), Ordering::Relaxed);
    }
}

/// Where the pump waits for room in the queue before it hands over a batch larger than
/// [`SMALL_BATCH`] (the queue holds up to [`AHEAD_SMALL`] small ones).
#[derive(Debug, Default)]
struct Room {
    /// Set while the pump waits (or is about to check) for room: the receiver then wakes it
    /// after taking a batch.
    waiting: AtomicBool,
    /// Set by `close()` and when the epoch is dropped.
    closed: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Room {
    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `out` holds fewer than `AHEAD - 1` batches (the pump holds the other), or
    /// the epoch is closed.
    fn wait_for_room(&self, out: &Sender<Ready>) {
        if out.len() < AHEAD - 1 {
            return;
        }
        let mut g = self.guard();
        loop {
            // Announced before the check, so that a batch taken after the check wakes it.
            self.waiting.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if out.len() < AHEAD - 1 || self.closed.load(Ordering::SeqCst) {
                break;
            }
            // The timeout only bounds a missed wake-up; none is expected.
            g = self
                .cv
                .wait_timeout(g, SLICE)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        self.waiting.store(false, Ordering::SeqCst);
    }

    /// Called after the receiver took a batch or closed the epoch: wakes the pump if it waits
    /// for room (costs a fence and a load when it does not).
    fn taken(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) {
            // Under the lock: the pump is then either before its check or inside its wait.
            let _g = self.guard();
            self.cv.notify_one();
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.taken();
    }
}

/// The bytes of a batch's tensors.
fn batch_bytes(h: &Handoff) -> usize {
    match h {
        Handoff::Host(b) | Handoff::Staged(b) => b.layout().total_bytes(),
        Handoff::Device(b) => b.parts().iter().map(|p| p.layout.total_bytes()).sum(),
    }
}

/// A batch for Python (exported by `__next__`), or why there is none.
enum Reply {
    /// Boxed: a handoff is several hundred bytes, moved through the queue. With a Python
    /// dataset, the batch's meta (its last tensor: nesting and non-tensor values, pickled),
    /// read from host memory before any copy to the device.
    /// With a `fields=` dataset, its variable-length fields' bytes and offsets, read from host
    /// memory before any copy to the device.
    Batch(Box<Handoff>, Option<Vec<u8>>, Option<Vec<VarPart>>),
    Failed(LoaderError),
    End,
}

/// A reply with the loader's position once it was taken (`None` when the loader has no
/// resumable position).
struct Ready {
    reply: Reply,
    state: Option<LoaderState>,
}

/// Waits up to [`SLICE`] for the next reply: polls for `poll` first, then sleeps.
fn wait(rx: &Receiver<Ready>, poll: Duration) -> Result<Ready, RecvTimeoutError> {
    if poll.is_zero() {
        return rx.recv_timeout(SLICE);
    }
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        match rx.try_recv() {
            Ok(r) => return Ok(r),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        spins += 1;
        if spins.is_multiple_of(64) {
            if start.elapsed() >= poll {
                return rx.recv_timeout(SLICE);
            }
            // Lets the pump run where it shares a core with this thread.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
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

/// What the pump reads from each host batch before any copy to the device: a Python
/// dataset's meta (its last tensor), a fields batch's variable-length fields.
struct HostReads {
    meta: bool,
    fields: Option<Arc<[Field]>>,
}

/// Runs an epoch's iterator ahead of Python: each batch is queued with the loader's position
/// after it; the queue's bound makes the pump wait for Python.
fn pump(
    mut epoch: Epoch,
    loader: Arc<Loader>,
    out: Sender<Ready>,
    room: Arc<Room>,
    timings: Option<Arc<Timings>>,
    mut uploader: Option<Uploader>,
    reads: HostReads,
) {
    let HostReads { meta, fields } = reads;
    let t = timings.as_deref();
    let now = || t.map(|_| Instant::now());
    let mut n = 0u64;
    loop {
        // A panic here (the device stage) reaches Python with its message, and ends the epoch.
        let reply = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (start, cpu) = (now(), t.map(|_| thread_cpu_ns()));
            let next = epoch.next();
            lap(t, |t| &t.next, start);
            cpu_lap(t, |t| &t.next_cpu, cpu);
            let meta = match (&next, meta) {
                (Some(Ok(Handoff::Host(b) | Handoff::Staged(b))), true) => {
                    match b.layout().tensors().last() {
                        Some(m) => Some(b.bytes()[m.range()].to_vec()),
                        None => {
                            return Reply::Failed(LoaderError::State(
                                "a Python dataset's batch without its meta".into(),
                            ));
                        }
                    }
                }
                (Some(Ok(Handoff::Device(_))), true) => {
                    return Reply::Failed(LoaderError::State(
                        "a Python dataset's batch reached the device before its meta was read"
                            .into(),
                    ));
                }
                _ => None,
            };
            let parts = match (&next, &fields) {
                (Some(Ok(Handoff::Host(b) | Handoff::Staged(b))), Some(f)) => {
                    match host_parts(f, b) {
                        Ok(p) => Some(p),
                        Err(e) => return Reply::Failed(LoaderError::Data(e)),
                    }
                }
                // nvJPEG's device stage keeps them on the host for us.
                (Some(Ok(Handoff::Device(d))), Some(_)) => match d.extension::<NvjpegInfo>() {
                    Some(info) => Some(info.variable_fields().to_vec()),
                    None => {
                        return Reply::Failed(LoaderError::State(
                            "a fields batch reached the device before its text was read".into(),
                        ));
                    }
                },
                _ => None,
            };
            match (next, uploader.as_mut()) {
                (None, _) => Reply::End,
                (Some(Err(e)), _) => Reply::Failed(e),
                // A large batch's copy starts now, ahead of Python (see `crate::upload`).
                (Some(Ok(Handoff::Staged(b))), Some(up))
                    if b.layout().total_bytes() > SMALL_BATCH =>
                {
                    match up.upload(b, |e| e.synchronize()) {
                        Ok(p) => Reply::Batch(Box::new(Handoff::Device(p)), meta, parts),
                        Err(e) => Reply::Failed(e),
                    }
                }
                (Some(Ok(h)), _) => Reply::Batch(Box::new(h), meta, parts),
            }
        })) {
            Ok(r) => r,
            Err(p) => {
                let message = longshore::data::worker::panic_message(p);
                let _ = out.send(Ready {
                    reply: Reply::Failed(LoaderError::WorkerPanicked {
                        worker: 0,
                        batch: n,
                        message: format!("the epoch thread panicked: {message}"),
                    }),
                    state: None,
                });
                break;
            }
        };
        n += 1;
        // Only this thread advances the epoch, so the position read now is the one right
        // after this reply.
        let start = now();
        let state = loader.loader().state_dict().ok();
        lap(t, |t| &t.state, start);
        let end = matches!(reply, Reply::End);
        let (start, cpu) = (now(), t.map(|_| thread_cpu_ns()));
        if let Reply::Batch(b, _, _) = &reply
            && batch_bytes(b) > SMALL_BATCH
        {
            room.wait_for_room(&out);
        }
        // A closed queue hands the reply back; dropping it returns its memory.
        let sent = out.send(Ready { reply, state });
        lap(t, |t| &t.send, start);
        cpu_lap(t, |t| &t.send_cpu, cpu);
        if let Some(t) = t {
            t.pumped.fetch_add(1, Ordering::Relaxed);
        }
        if sent.is_err() || end {
            break;
        }
    }
    if let Some(t) = t {
        t.pump_cpu.store(thread_cpu_ns(), Ordering::Relaxed);
    }
    // Dropping the iterator here stops the workers and returns the leases.
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
    /// The queue from the pump; `None` once the epoch ended or was closed.
    ready: Mutex<Option<Receiver<Ready>>>,
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
    /// How long `__next__` polls for a batch before it sleeps ([`poll_for`]).
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
    /// Starts the pump of `epoch`; `position` has already begun epoch `id`. `copies`: the
    /// copy stream of an epoch that yields [`Handoff::Staged`] batches. `meta`: batches of a
    /// Python dataset, which `__next__` returns as `(tensors, meta)`.
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
        poll: Duration,
    ) -> PyResult<Self> {
        // The pump holds one batch while it waits for room: the queue holds the rest; large
        // batches wait for the queue to hold fewer than `AHEAD - 1`.
        let (tx, rx) = bounded::<Ready>(AHEAD_SMALL - 1);
        let room = Arc::new(Room::default());
        let pump_room = room.clone();
        let timings = Timings::from_env();
        let pump_timings = timings.clone();
        std::thread::Builder::new()
            .name("longshore-epoch".into())
            .spawn({
                let uploader = copies.clone().map(Uploader::new);
                let fields = match &form {
                    BatchForm::Fields(f) => Some(f.clone()),
                    _ => None,
                };
                let reads = HostReads { meta, fields };
                move || pump(epoch, loader, tx, pump_room, pump_timings, uploader, reads)
            })
            .map_err(|e| LoaderFailure::new_err(format!("cannot start the epoch thread: {e}")))?;
        Ok(Self {
            ready: Mutex::new(Some(rx)),
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
            .ready
            .try_lock()
            .map_err(|_| PyRuntimeError::new_err("this epoch is already being iterated"))?;
        if self.room.closed.load(Ordering::SeqCst) {
            *guard = None;
        }
        let Some(rx) = guard.as_ref() else {
            return Ok(None);
        };
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
                // An interrupt returns here with the queue untouched: the batch is taken by
                // the next call.
                match got {
                    Ok(r) => break r,
                    Err(RecvTimeoutError::Timeout) => {
                        if self.room.closed.load(Ordering::SeqCst) {
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
    fn close(&self) {
        self.room.close();
        // When another thread is waiting in `__next__`, it drops the queue at its next slice
        // (blocking here, with the GIL held, could deadlock with it).
        if let Ok(mut guard) = self.ready.try_lock()
            && let Some(rx) = guard.take()
        {
            // Queued batches go back to the pool now; dropping the receiver makes the pump's
            // next hand-over fail, which ends it.
            while rx.try_recv().is_ok() {}
        }
    }
}
