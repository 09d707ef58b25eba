//! The `Cpu` backend: a real asynchronous backend whose "device" is the host.
//!
//! Each stream owns a worker thread that runs the stream's work in order; an event is a
//! condition variable signalled by a job enqueued behind the work it covers; a cross-stream
//! wait is a job that blocks the *waiting stream's* thread until the event completes, never
//! the host thread that enqueued it. Device memory is a byte vector behind a mutex, which
//! every copy job locks while it touches it: two streams racing on one buffer give an
//! unspecified order of copies (as on a GPU), never undefined behaviour.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Sender, unbounded};

use crate::device::DeviceId;
use crate::error::{Result, TransferError};

/// A unit of work on a `Cpu` stream.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// A callback run when an event completes.
pub(crate) type Callback = Box<dyn FnOnce() + Send + 'static>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An ordered queue of jobs executed by one worker thread.
#[derive(Debug)]
pub(crate) struct CpuStream {
    tx: Sender<Job>,
    id: u64,
}

impl CpuStream {
    pub(crate) fn new(id: u64) -> Result<Self> {
        let (tx, rx) = unbounded::<Job>();
        std::thread::Builder::new()
            .name(format!("longshore-cpu-stream-{id}"))
            .spawn(move || {
                // The worker ends when every sender (the stream and its clones) is gone and
                // the queue is drained, so work enqueued before a stream is dropped still runs.
                for job in rx {
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        tracing::error!(target: "longshore::transfer", stream_id = id, "a job on a cpu stream panicked");
                    }
                }
            })
            .map_err(|e| TransferError::StreamClosed {
                stream: id,
                device: DeviceId::Cpu,
                reason: format!("cannot spawn its worker thread: {e}"),
            })?;
        Ok(Self { tx, id })
    }

    /// Appends `job` to the stream.
    pub(crate) fn enqueue(&self, job: Job) -> Result<()> {
        self.tx.send(job).map_err(|_| TransferError::StreamClosed {
            stream: self.id,
            device: DeviceId::Cpu,
            reason: "its worker thread has exited".to_owned(),
        })
    }

    /// Records a new event behind the work enqueued so far.
    pub(crate) fn record(&self) -> Result<Arc<CpuEvent>> {
        let ev = Arc::new(CpuEvent::default());
        let signal = ev.clone();
        self.enqueue(Box::new(move || signal.signal()))?;
        Ok(ev)
    }

    /// Makes the stream's later work wait until `wait` returns (on the worker thread).
    pub(crate) fn wait_with(&self, wait: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.enqueue(wait)
    }
}

#[derive(Default)]
struct EventState {
    done: bool,
    callbacks: Vec<Callback>,
}

/// A point in a `Cpu` stream: complete once the jobs before it have run.
#[derive(Default)]
pub(crate) struct CpuEvent {
    state: Mutex<EventState>,
    cv: Condvar,
}

impl std::fmt::Debug for CpuEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuEvent")
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl CpuEvent {
    pub(crate) fn signal(&self) {
        let callbacks = {
            let mut st = lock(&self.state);
            st.done = true;
            std::mem::take(&mut st.callbacks)
        };
        self.cv.notify_all();
        for cb in callbacks {
            if catch_unwind(AssertUnwindSafe(cb)).is_err() {
                tracing::error!(target: "longshore::transfer", "an event completion callback panicked");
            }
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        lock(&self.state).done
    }

    pub(crate) fn wait(&self) {
        let mut st = lock(&self.state);
        while !st.done {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        let st = lock(&self.state);
        let (st, _) = self
            .cv
            .wait_timeout_while(st, timeout, |s| !s.done)
            .unwrap_or_else(|p| p.into_inner());
        st.done
    }

    /// Runs `cb` once the event completes (now, on this thread, if it already has).
    pub(crate) fn on_complete(&self, cb: Callback) {
        {
            let mut st = lock(&self.state);
            if !st.done {
                st.callbacks.push(cb);
                return;
            }
        }
        cb();
    }
}

/// "Device" memory of the `Cpu` backend.
#[derive(Debug)]
pub(crate) struct CpuMem {
    bytes: Mutex<Vec<u8>>,
}

impl CpuMem {
    pub(crate) fn new(len: usize) -> Arc<Self> {
        Arc::new(Self {
            bytes: Mutex::new(vec![0u8; len]),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        lock(&self.bytes)
    }

    /// Start of the bytes (the vector is never resized, so the address is fixed).
    pub(crate) fn address(&self) -> *mut u8 {
        self.lock().as_mut_ptr()
    }
}

/// A raw pointer to host bytes that a job may read; see the `SAFETY` notes where it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostPtr {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
}
// SAFETY: a HostPtr is only built over memory that is kept alive and unaliased by writers
// until the job reading it has run (the memory is owned by a `Pending` or has been copied
// into the job); sending the address to the worker thread is then sound.
unsafe impl Send for HostPtr {}

/// A raw pointer to host bytes that a job may write; see the `SAFETY` notes where it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostPtrMut {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}
// SAFETY: as for HostPtr: the memory is owned by a `Pending` that gives no access to it
// until the event behind the job has completed.
unsafe impl Send for HostPtrMut {}

/// Enqueues a host -> device copy of `src` into `mem[offset..]`.
///
/// # Safety
/// `src.ptr..src.ptr+src.len` stays valid and is not written by anyone until the job has run
/// (until an event recorded after this call completes).
pub(crate) unsafe fn enqueue_htod(
    stream: &CpuStream,
    mem: &Arc<CpuMem>,
    offset: usize,
    src: HostPtr,
) -> Result<()> {
    let mem = mem.clone();
    stream.enqueue(Box::new(move || {
        let src = src;
        // SAFETY: guaranteed by the caller of `enqueue_htod` until this job has run.
        let bytes = unsafe { std::slice::from_raw_parts(src.ptr, src.len) };
        mem.lock()[offset..offset + src.len].copy_from_slice(bytes);
    }))
}

/// Enqueues a device -> host copy of `mem[offset..offset+dst.len]` into `dst`.
///
/// # Safety
/// `dst.ptr..dst.ptr+dst.len` stays valid and is neither read nor written by anyone else until
/// the job has run (until an event recorded after this call completes).
pub(crate) unsafe fn enqueue_dtoh(
    stream: &CpuStream,
    mem: &Arc<CpuMem>,
    offset: usize,
    dst: HostPtrMut,
) -> Result<()> {
    let mem = mem.clone();
    stream.enqueue(Box::new(move || {
        let dst = dst;
        // SAFETY: guaranteed by the caller of `enqueue_dtoh` until this job has run.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.ptr, dst.len) };
        out.copy_from_slice(&mem.lock()[offset..offset + dst.len]);
    }))
}

/// Enqueues a fill of `mem[offset..offset+len]` with `byte`.
pub(crate) fn enqueue_memset(
    stream: &CpuStream,
    mem: &Arc<CpuMem>,
    offset: usize,
    len: usize,
    byte: u8,
) -> Result<()> {
    let mem = mem.clone();
    stream.enqueue(Box::new(move || {
        mem.lock()[offset..offset + len].fill(byte)
    }))
}

/// Enqueues a device -> device copy.
pub(crate) fn enqueue_dtod(
    stream: &CpuStream,
    src: &Arc<CpuMem>,
    src_offset: usize,
    dst: &Arc<CpuMem>,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    let (src, dst) = (src.clone(), dst.clone());
    stream.enqueue(Box::new(move || {
        if Arc::ptr_eq(&src, &dst) {
            dst.lock()
                .copy_within(src_offset..src_offset + len, dst_offset);
        } else {
            let tmp = src.lock()[src_offset..src_offset + len].to_vec();
            dst.lock()[dst_offset..dst_offset + len].copy_from_slice(&tmp);
        }
    }))
}
