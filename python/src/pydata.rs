//! Python datasets (any object with `__getitem__` and `__len__`): their code runs in worker
//! processes (`longshore/_workers.py`), one per loader worker thread, and each batch is
//! collated by its process straight into the loader's shared, page-locked block.
//!
//! Per batch, the loader's worker thread `i` and process `i` exchange two messages on a pipe
//! (multiprocessing's `Connection` framing: a big-endian `i32` length, then the payload):
//!
//! 1. `S` (stage): the batch's position, epoch and indices. The process fetches the samples
//!    (`__getitems__` or `__getitem__`), works out torch's `default_collate` structure (or runs
//!    the user's `collate_fn`) and answers `K` with each output tensor's dtype and shape and
//!    the size of the batch's *meta* (its nesting and non-tensor values, pickled), or `E` with
//!    the failing sample's index and the worker's traceback.
//! 2. The loader leases a block for that layout (ranked by the batch's place in the order,
//!    under the pool's budget), then `W` (write): the block's memory file, its id and each
//!    tensor's offset. The process maps the file (once per block) and copies each sample's
//!    array into its slot: one copy from the user's array. Where the block is not shared
//!    memory (a pool of the user's, a budget fallback), it answers `B` with the bytes instead.
//!
//! The loader keeps what it does for every dataset: the order, prefetch, the budget, timeouts,
//! `state_dict`, stats. A process that dies ends its batch with an error naming the worker,
//! its pid, how it ended and the samples it held. With `num_workers=0` the same Python code
//! runs in this process, under the GIL, on the loader's thread.

use std::any::Any;
use std::cell::RefCell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use longshore::data::{
    Batch, BatchLayout, Collate, DType, DataError, Dataset, DatasetCollate, ItemIter,
    IterableDataset, Storage, WorkerInfo,
};
use longshore::host::PoolBuffer;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Whether the interpreter is shutting down (set by `_at_exit`, which `longshore/__init__.py`
/// registers with `atexit`). A loader thread holds the read side while it runs Python, so
/// the interpreter never starts finalizing under it, and takes no new turn afterwards: a
/// thread that attaches to a finalizing interpreter is ended by it mid-call (CPython aborts
/// with `PyGILState_Release: thread state must be current`), which happened when the worker
/// processes were ended at exit and their pipes closed under a live loader.
static FINALIZING: RwLock<bool> = RwLock::new(false);

/// Runs `f` with the GIL from a loader thread, unless the interpreter is shutting down.
fn with_python<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    let gate = FINALIZING.read().unwrap_or_else(|p| p.into_inner());
    if *gate {
        return None;
    }
    let r = Python::attach(f);
    drop(gate);
    Some(r)
}

/// `longshore._longshore._at_exit()`: called once by `atexit` before the interpreter
/// finalizes: waits for the loader threads running Python to finish their call, and lets
/// none start another (their batches then fail with "the interpreter is shutting down").
#[pyfunction]
pub(crate) fn _at_exit(py: Python<'_>) {
    // Without the GIL: a loader thread holding the read side may be waiting for it.
    py.detach(|| *FINALIZING.write().unwrap_or_else(|p| p.into_inner()) = true);
}

thread_local! {
    /// A `BaseException` that is not an `Exception` (`KeyboardInterrupt`, `SystemExit`) that a
    /// Python dataset run on this thread raised, for `__next__` to raise as itself
    /// ([`take_interrupt`]).
    static INTERRUPT: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The interrupt a Python dataset run on this thread raised since the last call, if any.
pub(crate) fn take_interrupt() -> Option<PyErr> {
    INTERRUPT.with(|i| i.borrow_mut().take())
}

/// The error of an in-process handler's call that raised `e`: an interrupt is kept for
/// [`take_interrupt`] and fails its batch under every sample-error policy (no skip runs the
/// dataset on after a Ctrl-C).
fn handler_failed(py: Python<'_>, e: PyErr) -> DataError {
    if e.is_instance_of::<pyo3::exceptions::PyException>(py) {
        return DataError::Other(format!("the dataset's handler failed: {e}"));
    }
    let message = e.to_string();
    INTERRUPT.with(|i| *i.borrow_mut() = Some(e));
    DataError::unskippable("the dataset's code was interrupted", message)
}

fn shutting_down() -> DataError {
    DataError::Other("the Python interpreter is shutting down".into())
}

/// The torch/NumPy dtype codes of the protocol (`_workers.py` `_CODES`).
fn dtype_of(code: u8) -> Option<DType> {
    Some(match code {
        0 => DType::Bool,
        1 => DType::U8,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        9 => DType::U16,
        10 => DType::U32,
        11 => DType::U64,
        _ => return None,
    })
}

/// One worker process's end of its pipe, and the process itself: its pid and, where the kernel
/// has them (Linux 5.3+), a pidfd, readable once the process has ended.
///
/// Every read first waits for the pipe *or* the pidfd: a worker's death is seen at once from
/// the process, not from the pipe's end of file, which never comes while another process
/// holds a copy of the worker's end (a sibling forked after it, a subprocess of the dataset).
/// Without a pidfd the wait wakes every [`LIVENESS_POLL`] to look at the process in `/proc`.
struct Channel {
    pipe: File,
    pid: i32,
    pidfd: Option<OwnedFd>,
}

/// How often a read without a pidfd looks whether its worker process still runs.
const LIVENESS_POLL: i32 = 100;

/// The worker process ended (seen from the process, not from the pipe).
fn process_ended() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the worker process ended")
}

/// A pidfd of process `pid`, or `None` where the kernel has none (before Linux 5.3) or the
/// process is already gone (then the pipe tells).
fn pidfd_of(pid: i32) -> Option<OwnedFd> {
    if pid <= 0 {
        return None;
    }
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1; no
    // memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether process `pid` has ended (a zombie, or gone), from `/proc` (no pidfd).
fn ended_by_proc(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

impl Channel {
    fn send(&mut self, msg: &[u8]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(msg.len() + 12);
        match i32::try_from(msg.len()) {
            Ok(n) => out.extend_from_slice(&n.to_be_bytes()),
            Err(_) => {
                out.extend_from_slice(&(-1i32).to_be_bytes());
                out.extend_from_slice(&(msg.len() as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(msg);
        self.pipe.write_all(&out)
    }

    /// Waits until the pipe has something to read (or its end), or the process has ended
    /// with nothing left in the pipe.
    fn wait_readable(&self) -> std::io::Result<()> {
        let pipe = self.pipe.as_raw_fd();
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: pipe,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let timeout = if self.pidfd.is_some() || self.pid <= 0 {
                -1
            } else {
                LIVENESS_POLL
            };
            // SAFETY: `fds` is an array of two initialised pollfd that outlives the call; a
            // negative fd is ignored by poll(2).
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // What the worker wrote before it ended is read first.
            if fds[0].revents != 0 {
                return Ok(());
            }
            if fds[1].revents != 0 || (n == 0 && self.pid > 0 && ended_by_proc(self.pid)) {
                return Err(process_ended());
            }
        }
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> std::io::Result<()> {
        while !buf.is_empty() {
            self.wait_readable()?;
            match self.pipe.read(buf) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        let mut head = [0u8; 4];
        self.read_exact(&mut head)?;
        let n = match i32::from_be_bytes(head) {
            -1 => {
                let mut long = [0u8; 8];
                self.read_exact(&mut long)?;
                usize::try_from(u64::from_be_bytes(long)).map_err(std::io::Error::other)?
            }
            n => usize::try_from(n).map_err(std::io::Error::other)?,
        };
        let mut buf = vec![0u8; n];
        self.read_exact(&mut buf)?;
        Ok(buf)
    }
}

/// Where a worker's batches are made.
enum Endpoint {
    /// A worker process, by its pipe (the raw descriptor beside the lock, to shut the socket
    /// down while a read holds the lock).
    Process(Mutex<Channel>, i32),
    /// This process: `handle(request: bytes) -> bytes` of `_workers.Handler`, under the GIL.
    InProcess(Py<PyAny>),
}

/// The worker processes (or the in-process handler) of a Python dataset, shared by the
/// loader's worker threads: thread `i` talks to endpoint `i`.
pub(crate) struct Workers {
    endpoints: Mutex<Vec<Option<Arc<Endpoint>>>>,
    /// The first worker process found dead since the endpoints were set: its error message
    /// (Python ends the epoch with it, as a `LoaderError`, and starts new workers next epoch).
    dead: Mutex<Option<String>>,
    /// `describe(worker_id) -> str`: how worker `id`'s process ended (pid, exit code or
    /// signal), for the error when its pipe closes.
    describe: Py<PyAny>,
}

thread_local! {
    /// The sample at fault in this thread's last failed batch and its error: the loader asks
    /// the dataset for each sample of a failed batch (`Dataset::get`) to name it.
    static FAILED: RefCell<Option<(usize, String)>> = const { RefCell::new(None) };
}

/// Process-wide handle of a Python dataset for the loader: its length; samples are loaded by
/// [`ProcessCollate`].
pub(crate) struct ProcessDataset {
    /// `len(dataset)`, read again by Python at each epoch (a dataset may grow).
    len: Arc<AtomicUsize>,
}

impl Dataset for ProcessDataset {
    type Item = ();
    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
    /// The sample's error if it is the one this thread's last batch failed on.
    fn get(&self, index: usize) -> Result<(), DataError> {
        FAILED.with(|f| match &*f.borrow() {
            Some((i, msg)) if *i == index => Err(DataError::Other(msg.clone())),
            _ => Ok(()),
        })
    }
}

/// A staged batch: its layout, and the endpoint holding its samples.
pub(crate) struct Staged {
    layout: BatchLayout,
    endpoint: Arc<Endpoint>,
    worker: usize,
    indices: Vec<usize>,
}

/// Collates a batch in a worker process (see the module's documentation).
pub(crate) struct ProcessCollate {
    workers: Arc<Workers>,
}

impl Workers {
    fn endpoint(&self, id: usize) -> Result<Arc<Endpoint>, DataError> {
        let e = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        e.get(id).cloned().flatten().ok_or_else(|| {
            DataError::Other(format!(
                "DataLoader worker {id} has no process (the epoch started without workers)"
            ))
        })
    }

    /// The error for worker `id`'s pipe failing (`err`) while it held `indices`.
    fn died(&self, id: usize, indices: &[usize], err: &std::io::Error) -> DataError {
        let Some(how) = with_python(|py| {
            self.describe
                .call1(py, (id,))
                .and_then(|r| r.extract::<String>(py))
                .unwrap_or_else(|e| format!("its pipe failed ({err}); describing it failed: {e}"))
        }) else {
            return shutting_down();
        };
        let held = if indices.is_empty() {
            "its next batch of the stream".to_string()
        } else {
            format!("samples {indices:?}")
        };
        let msg =
            format!("DataLoader worker {id} ({how}) exited unexpectedly while loading {held}");
        self.dead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| msg.clone());
        DataError::Other(msg)
    }

    fn exchange(
        &self,
        endpoint: &Endpoint,
        id: usize,
        indices: &[usize],
        request: &[u8],
    ) -> Result<Vec<u8>, DataError> {
        match endpoint {
            Endpoint::Process(ch, _) => {
                if let Some(dead) = self.dead.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    // One death ends the epoch: the other workers' batches fail with it
                    // rather than run on.
                    return Err(DataError::Other(dead));
                }
                let mut ch = ch.lock().unwrap_or_else(|p| p.into_inner());
                ch.send(request)
                    .and_then(|()| ch.recv())
                    .map_err(|e| self.died(id, indices, &e))
            }
            Endpoint::InProcess(handler) => with_python(|py| {
                let reply = handler
                    .call_method1(py, "handle", (PyBytes::new(py, request),))
                    .map_err(|e| handler_failed(py, e))?;
                reply
                    .extract::<Vec<u8>>(py)
                    .map_err(|e| DataError::Other(format!("the dataset's handler answered: {e}")))
            })
            .unwrap_or_else(|| Err(shutting_down())),
        }
    }
}

/// Reads little-endian integers from a reply.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DataError> {
        if self.0.len() < n {
            return Err(DataError::Other(
                "a truncated reply from a DataLoader worker".into(),
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DataError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DataError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DataError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

fn usize_of(v: u64) -> Result<usize, DataError> {
    usize::try_from(v).map_err(|_| DataError::Overflow("a worker's reply"))
}

/// A failure reply (`E`): records the sample at fault for [`ProcessDataset::get`].
fn failure(body: &[u8]) -> DataError {
    let mut r = Reader(body);
    let index = r.u64().unwrap_or(u64::MAX);
    let message = String::from_utf8_lossy(r.0).into_owned();
    FAILED.with(|f| {
        *f.borrow_mut() = usize::try_from(index)
            .ok()
            .filter(|_| index != u64::MAX)
            .map(|i| (i, message.clone()))
    });
    DataError::Other(message)
}

/// The layout of a staged batch from a `K` reply's body.
fn staged_layout(worker: usize, body: &[u8]) -> Result<BatchLayout, DataError> {
    let mut r = Reader(body);
    let batch = usize_of(r.u64()?)?;
    let n = r.u32()? as usize;
    let mut layout = BatchLayout::new(batch);
    for _ in 0..n {
        let code = r.u8()?;
        let dtype = dtype_of(code).ok_or_else(|| {
            DataError::Other(format!(
                "DataLoader worker {worker}: unknown dtype code {code}"
            ))
        })?;
        let ndim = r.u8()? as usize;
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            shape.push(usize_of(r.u64()?)?);
        }
        layout.push(None, dtype, shape)?;
    }
    let meta = usize_of(r.u64()?)?;
    layout.push(None, DType::U8, vec![meta])?;
    Ok(layout)
}

/// Asks worker `worker` to write its staged batch into `storage` (see the module's
/// documentation).
fn write_staged<S: Storage>(
    workers: &Workers,
    staged: Staged,
    mut storage: S,
) -> Result<Batch<S>, DataError> {
    let Staged {
        layout,
        endpoint,
        worker,
        indices,
    } = staged;
    let total = layout.total_bytes();
    if storage.len() < total {
        return Err(DataError::BufferTooSmall {
            what: "a Python dataset's batch",
            needed: total,
            got: storage.len(),
        });
    }
    let shared = (&storage as &dyn Any)
        .downcast_ref::<PoolBuffer>()
        .and_then(PoolBuffer::shared_fd)
        .map(|(fd, id)| (fd.as_raw_fd(), id));
    let mut req = Vec::with_capacity(32 + 8 * layout.tensors().len());
    req.push(b'W');
    let (fd, id) = shared.unwrap_or((-1, 0));
    req.extend_from_slice(&id.to_le_bytes());
    req.extend_from_slice(&fd.to_le_bytes());
    req.extend_from_slice(&(storage.len() as u64).to_le_bytes());
    req.extend_from_slice(&(layout.tensors().len() as u32).to_le_bytes());
    for t in layout.tensors() {
        req.extend_from_slice(&(t.offset as u64).to_le_bytes());
    }
    let reply = workers.exchange(&endpoint, worker, &indices, &req)?;
    match reply.split_first() {
        Some((b'w', _)) if shared.is_some() => {}
        Some((b'B', bytes)) if bytes.len() == total => storage[..total].copy_from_slice(bytes),
        Some((b'E', body)) => return Err(failure(body)),
        _ => {
            return Err(DataError::Other(format!(
                "DataLoader worker {worker} answered a write request with {} bytes",
                reply.len()
            )));
        }
    }
    Batch::from_parts(layout, storage)
}

impl DatasetCollate<ProcessDataset> for ProcessCollate {
    type Staged = Staged;

    fn stage(&self, _dataset: &ProcessDataset, indices: &[usize]) -> Result<Staged, DataError> {
        FAILED.with(|f| f.borrow_mut().take());
        let info = longshore::data::worker::current();
        let worker = info.map_or(0, |i| i.id);
        let epoch = longshore::data::worker::epoch().unwrap_or(0);
        let endpoint = self.workers.endpoint(worker)?;
        let mut req = Vec::with_capacity(21 + 8 * indices.len());
        req.push(b'S');
        req.extend_from_slice(&epoch.to_le_bytes());
        req.extend_from_slice(&(indices.len() as u32).to_le_bytes());
        for &i in indices {
            req.extend_from_slice(&(i as u64).to_le_bytes());
        }
        let reply = self.workers.exchange(&endpoint, worker, indices, &req)?;
        let (kind, body) = reply
            .split_first()
            .ok_or_else(|| DataError::Other("an empty reply from a DataLoader worker".into()))?;
        match kind {
            b'K' => Ok(Staged {
                layout: staged_layout(worker, body)?,
                endpoint,
                worker,
                indices: indices.to_vec(),
            }),
            b'E' => Err(failure(body)),
            other => Err(DataError::Other(format!(
                "DataLoader worker {worker} answered {other:#x} to a stage request"
            ))),
        }
    }

    fn staged_layout<'a>(&self, staged: &'a Staged) -> &'a BatchLayout {
        &staged.layout
    }

    fn write<S: Storage>(
        &self,
        _dataset: &ProcessDataset,
        staged: Staged,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        write_staged(&self.workers, staged, storage)
    }
}

/// An iterable Python dataset (`__iter__`, PyTorch's `IterableDataset`): each worker
/// process iterates its own copy (sharding by `get_worker_info()`, as in PyTorch) and stages
/// whole batches of `batch_size` items; the loader takes them from the workers in turn.
pub(crate) struct ProcessStream {
    workers: Arc<Workers>,
    batch_size: usize,
    drop_last: bool,
}

impl IterableDataset for ProcessStream {
    /// One staged batch (the loader's own batch size is 1 for this dataset).
    type Item = Staged;

    fn iter(&self, info: WorkerInfo) -> ItemIter<'_, Staged> {
        let worker = info.id;
        let mut done = false;
        Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            // Read per batch: the loader enters the epoch around each fetch, after it made
            // the stream.
            let epoch = longshore::data::worker::epoch().unwrap_or(0);
            let endpoint = match self.workers.endpoint(worker) {
                Ok(e) => e,
                Err(e) => {
                    done = true;
                    return Some(Err(e));
                }
            };
            let mut req = Vec::with_capacity(14);
            req.push(b'N');
            req.extend_from_slice(&epoch.to_le_bytes());
            req.extend_from_slice(&(self.batch_size as u32).to_le_bytes());
            req.push(u8::from(self.drop_last));
            let reply = match self.workers.exchange(&endpoint, worker, &[], &req) {
                Ok(r) => r,
                Err(e) => {
                    done = true;
                    return Some(Err(e));
                }
            };
            match reply.split_first() {
                Some((b'K', body)) => Some(staged_layout(worker, body).map(|layout| Staged {
                    layout,
                    endpoint,
                    worker,
                    indices: Vec::new(),
                })),
                Some((b'X', _)) => {
                    done = true;
                    None
                }
                Some((b'E', body)) => Some(Err(failure(body))),
                _ => {
                    done = true;
                    Some(Err(DataError::Other(format!(
                        "DataLoader worker {worker} answered a next-batch request with {} bytes",
                        reply.len()
                    ))))
                }
            }
        }))
    }
}

/// Writes a staged batch of an iterable Python dataset (one item per loader batch).
pub(crate) struct ProcessStreamCollate {
    workers: Arc<Workers>,
}

impl Collate<Staged> for ProcessStreamCollate {
    fn layout(&self, samples: &[Staged]) -> Result<BatchLayout, DataError> {
        match samples {
            [one] => Ok(one.layout.clone()),
            _ => Err(DataError::Other(format!(
                "an iterable Python dataset's batches come one per loader batch, not {}",
                samples.len()
            ))),
        }
    }

    fn collate_into<S: Storage>(
        &self,
        samples: &[Staged],
        _layout: BatchLayout,
        storage: S,
    ) -> Result<Batch<S>, DataError> {
        let [one] = samples else {
            return Err(DataError::Other("one staged batch expected".into()));
        };
        let staged = Staged {
            layout: one.layout.clone(),
            endpoint: one.endpoint.clone(),
            worker: one.worker,
            indices: Vec::new(),
        };
        write_staged(&self.workers, staged, storage)
    }
}

/// `longshore._ProcessSource`: a Python dataset as the loader sees it: its length, the worker
/// endpoints (set by the Python side before each epoch), and how to describe a dead worker.
#[pyclass(name = "_ProcessSource", module = "longshore", frozen)]
pub(crate) struct PyProcessSource {
    pub(crate) len: Arc<AtomicUsize>,
    pub(crate) workers: Arc<Workers>,
    /// An iterable dataset: its `(batch_size, drop_last)`, applied by the workers.
    pub(crate) iterable: Option<(usize, bool)>,
}

#[pymethods]
impl PyProcessSource {
    /// `describe(worker_id) -> str` says how a worker's process ended; `iterable`: the
    /// `(batch_size, drop_last)` of an iterable dataset (`len` is then unused).
    #[new]
    #[pyo3(signature = (len, describe, iterable = None))]
    fn new(len: usize, describe: Py<PyAny>, iterable: Option<(usize, bool)>) -> Self {
        Self {
            len: Arc::new(AtomicUsize::new(len)),
            workers: Arc::new(Workers {
                endpoints: Mutex::new(Vec::new()),
                dead: Mutex::new(None),
                describe,
            }),
            iterable,
        }
    }

    /// Sets the endpoints: for each loader worker, `(fd, pid)` of its process (the file
    /// descriptor of its end of the pipe, duplicated here so the caller may close its own,
    /// and the process's pid, watched through a pidfd), or a handler object
    /// (`handle(bytes) -> bytes`) run in this process. The sockets of the endpoints replaced
    /// are shut down: their workers see the end of the conversation at once.
    fn set_workers(&self, endpoints: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let mut out = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            if let Ok((fd, pid)) = e.extract::<(i32, i32)>() {
                // SAFETY: `dup` of a descriptor the caller owns; the copy is ours alone.
                let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    let err = std::io::Error::last_os_error();
                    return Err(PyOSError::new_err(format!(
                        "cannot duplicate DataLoader worker pipe {fd}: {err}{}",
                        crate::errors::fd_advice(&err)
                    )));
                }
                // SAFETY: `dup` is a new descriptor owned by nothing else.
                let pipe = File::from(unsafe { OwnedFd::from_raw_fd(dup) });
                out.push(Some(Arc::new(Endpoint::Process(
                    Mutex::new(Channel {
                        pipe,
                        pid,
                        pidfd: pidfd_of(pid),
                    }),
                    dup,
                ))));
            } else {
                out.push(Some(Arc::new(Endpoint::InProcess(e.unbind()))));
            }
        }
        let old = std::mem::replace(
            &mut *self
                .workers
                .endpoints
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            out,
        );
        for e in old.into_iter().flatten() {
            if let Endpoint::Process(_, fd) = &*e {
                // SAFETY: shutdown(2) of the socket `e` owns (alive while `e` is): its holders
                // (the worker, a loader thread reading it) see the end now.
                unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
            }
        }
        *self.workers.dead.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// The error of the first worker process found dead since the workers were set, if any.
    fn dead_worker(&self) -> Option<String> {
        self.workers
            .dead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `len(dataset)` again (at each epoch: a dataset may grow between epochs, as PyTorch's
    /// loader follows it).
    fn set_len(&self, len: usize) {
        self.len.store(len, Ordering::Relaxed);
    }

    fn __len__(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

/// What the loader is built from for a Python dataset.
pub(crate) enum Parts {
    Map(ProcessDataset, ProcessCollate),
    Iterable(ProcessStream, ProcessStreamCollate),
}

impl PyProcessSource {
    /// The loader's dataset and collate for this source.
    pub(crate) fn parts(&self) -> Parts {
        let workers = self.workers.clone();
        match self.iterable {
            None => Parts::Map(
                ProcessDataset {
                    len: self.len.clone(),
                },
                ProcessCollate { workers },
            ),
            Some((batch_size, drop_last)) => Parts::Iterable(
                ProcessStream {
                    workers: workers.clone(),
                    batch_size,
                    drop_last,
                },
                ProcessStreamCollate { workers },
            ),
        }
    }
}
