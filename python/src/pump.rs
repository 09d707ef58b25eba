//! The epoch's *pump*: the thread that runs an epoch's Rust iterator ahead of Python and queues
//! each batch, up to [`AHEAD`] batches ahead ([`AHEAD_SMALL`] for small batches), with the
//! loader's position after it; and the [`Producer`] that turns the iterator's batches into
//! those replies, run by the pump or, where a Python dataset runs in this process
//! (`num_workers=0`), by `__next__` itself on the calling thread, as PyTorch loads it there.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, bounded};
use longshore::loader::{LoaderError, LoaderState};
use longshore::nvjpeg::NvjpegInfo;

use crate::boxed::{Epoch, Handoff, Loader};
use crate::fields::{Field, VarPart, host_parts};
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
pub(crate) const SLICE: Duration = Duration::from_millis(50);

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
    pub(crate) next: AtomicU64,
    /// `__next__`: exporting a batch for DLPack.
    pub(crate) export: AtomicU64,
    /// `__next__`: enqueuing a small batch's device copy (see [`crate::upload`]).
    pub(crate) upload: AtomicU64,
    /// The pump: taking the loader's position after a batch.
    pub(crate) state: AtomicU64,
    /// The pump: handing a batch to the queue, waiting for room included.
    pub(crate) send: AtomicU64,
    /// Batches the pump handed over.
    pub(crate) pumped: AtomicU64,
    /// The pump thread's CPU time, in nanoseconds, when it ended.
    pub(crate) pump_cpu: AtomicU64,
    /// The pump thread's CPU time in the loader's `next()`.
    pub(crate) next_cpu: AtomicU64,
    /// The pump thread's CPU time handing batches to the queue.
    pub(crate) send_cpu: AtomicU64,
    /// `__next__`: waiting for a batch (the GIL released), when none was ready.
    pub(crate) wait: AtomicU64,
    /// `__next__` calls that found no batch ready and waited.
    pub(crate) waits: AtomicU64,
    /// `__next__`: recording the position, enqueuing a small batch's copy, exporting the batch
    /// and turning it into Python values (the copy and the export included).
    pub(crate) deliver: AtomicU64,
    /// Batches `__next__` delivered.
    pub(crate) delivered: AtomicU64,
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
pub(crate) fn lap(
    t: Option<&Timings>,
    counter: impl Fn(&Timings) -> &AtomicU64,
    start: Option<Instant>,
) {
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
pub(crate) struct Room {
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
    pub(crate) fn taken(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) {
            // Under the lock: the pump is then either before its check or inside its wait.
            let _g = self.guard();
            self.cv.notify_one();
        }
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.taken();
    }

    /// Whether `close()` was called (or the epoch dropped).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
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
pub(crate) enum Reply {
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
pub(crate) struct Ready {
    pub(crate) reply: Reply,
    pub(crate) state: Option<LoaderState>,
}

/// Waits up to [`SLICE`] for the next reply: polls for `poll` first, then sleeps.
pub(crate) fn wait(rx: &Receiver<Ready>, poll: Duration) -> Result<Ready, RecvTimeoutError> {
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

/// What is read from each host batch before any copy to the device: a Python dataset's meta
/// (its last tensor), a fields batch's variable-length fields.
pub(crate) struct HostReads {
    pub(crate) meta: bool,
    pub(crate) fields: Option<Arc<[Field]>>,
}

/// An epoch's iterator and what turns its batches into [`Ready`] replies: run by the pump
/// thread, or by `__next__` itself ([`Feed::Direct`]).
pub(crate) struct Producer {
    epoch: Epoch,
    loader: Arc<Loader>,
    reads: HostReads,
    /// Starts a large batch's copy as soon as it is made (the pump; `None` leaves every copy
    /// to `__next__`).
    uploader: Option<Uploader>,
    timings: Option<Arc<Timings>>,
    /// Batches produced so far.
    n: u64,
}

impl Producer {
    pub(crate) fn new(
        epoch: Epoch,
        loader: Arc<Loader>,
        reads: HostReads,
        timings: Option<Arc<Timings>>,
    ) -> Self {
        Self {
            epoch,
            loader,
            reads,
            uploader: None,
            timings,
            n: 0,
        }
    }

    /// The next reply with the loader's position right after it, and whether the epoch is
    /// over (its end, or a panic, which reaches Python with its message and ends the epoch).
    pub(crate) fn next(&mut self) -> (Ready, bool) {
        let t = self.timings.clone();
        let t = t.as_deref();
        let reply = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.reply(t))) {
            Ok(r) => r,
            Err(p) => {
                let message = longshore::data::worker::panic_message(p);
                let reply = Reply::Failed(LoaderError::WorkerPanicked {
                    worker: 0,
                    batch: self.n,
                    message: format!("the epoch thread panicked: {message}"),
                });
                return (Ready { reply, state: None }, true);
            }
        };
        self.n += 1;
        // Only this producer advances the epoch, so the position read now is the one right
        // after this reply.
        let start = t.map(|_| Instant::now());
        let state = self.loader.loader().state_dict().ok();
        lap(t, |t| &t.state, start);
        let end = matches!(reply, Reply::End);
        (Ready { reply, state }, end)
    }

    /// The next batch with what is read from it on the host, or why there is none.
    fn reply(&mut self, t: Option<&Timings>) -> Reply {
        let HostReads { meta, fields } = &self.reads;
        let (start, cpu) = (t.map(|_| Instant::now()), t.map(|_| thread_cpu_ns()));
        let next = self.epoch.next();
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
                    "a Python dataset's batch reached the device before its meta was read".into(),
                ));
            }
            _ => None,
        };
        let parts = match (&next, fields) {
            (Some(Ok(Handoff::Host(b) | Handoff::Staged(b))), Some(f)) => match host_parts(f, b) {
                Ok(p) => Some(p),
                Err(e) => return Reply::Failed(LoaderError::Data(e)),
            },
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
        match (next, self.uploader.as_mut()) {
            (None, _) => Reply::End,
            (Some(Err(e)), _) => Reply::Failed(e),
            // A large batch's copy starts now, ahead of Python (see `crate::upload`).
            (Some(Ok(Handoff::Staged(b))), Some(up)) if b.layout().total_bytes() > SMALL_BATCH => {
                match up.upload(b, |e| e.synchronize()) {
                    Ok(p) => Reply::Batch(Box::new(Handoff::Device(p)), meta, parts),
                    Err(e) => Reply::Failed(e),
                }
            }
            (Some(Ok(h)), _) => Reply::Batch(Box::new(h), meta, parts),
        }
    }
}

/// Starts the pump thread: `producer` runs ahead of Python, each reply queued with the loader's
/// position after it; the queue's bound makes the pump wait for Python. `uploader` starts the
/// copies of large staged batches on the pump. With `asks`, the pump makes a batch only when
/// one comes (`__next__` asks for each), and ends when their sender is dropped.
pub(crate) fn start(
    mut producer: Producer,
    uploader: Option<Uploader>,
    room: Arc<Room>,
    asks: Option<Receiver<()>>,
) -> std::io::Result<Receiver<Ready>> {
    // The pump holds one batch while it waits for room: the queue holds the rest; large
    // batches wait for the queue to hold fewer than `AHEAD - 1`.
    let (tx, rx) = bounded::<Ready>(AHEAD_SMALL - 1);
    producer.uploader = uploader;
    std::thread::Builder::new()
        .name("longshore-epoch".into())
        .spawn(move || pump(producer, tx, room, asks))?;
    Ok(rx)
}

fn pump(mut producer: Producer, out: Sender<Ready>, room: Arc<Room>, asks: Option<Receiver<()>>) {
    let timings = producer.timings.clone();
    let t = timings.as_deref();
    loop {
        // No wait without bound: the epoch's end (or close) drops the sender.
        if let Some(a) = &asks
            && a.recv().is_err()
        {
            break;
        }
        let (ready, end) = producer.next();
        let (start, cpu) = (t.map(|_| Instant::now()), t.map(|_| thread_cpu_ns()));
        if let Reply::Batch(b, _, _) = &ready.reply
            && batch_bytes(b) > SMALL_BATCH
        {
            room.wait_for_room(&out);
        }
        // A closed queue hands the reply back; dropping it returns its memory.
        let sent = out.send(ready);
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
    // Dropping the producer here stops the workers and returns the leases.
}
