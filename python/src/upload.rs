//! The device copies of an epoch's batches: who enqueues them ([`Copies`]) and how
//! ([`Uploader`]).
//!
//! By default ([`Copies::Thread`]) a thread of the epoch's own (the *copy thread*) enqueues
//! every batch's copy, between the epoch thread that takes host batches from the loader and
//! the thread that calls `__next__`: each of the three then does a third of the per-batch work
//! (the loader's consumer side; the copy's driver calls; the export and the conversion), and
//! the slowest of them, not their sum, sets the rate. On an H100 host the split below
//! ([`Copies::Next`]) left Python's thread the bound at about 26 us per tabular batch, 10 us of
//! it the copy's driver calls.
//!
//! Before the copy thread:
//! With a device, the epoch thread (the *pump*) used to run the loader's whole device
//! iterator: the loader's consumer side and then, per batch, the copy's driver calls (a
//! stream-ordered allocation, the copy, an event). The pump is the pipeline's serial stage,
//! while the thread calling `__next__` waited for it most of the time (on an H200, 91% of
//! tabular batches found nothing ready), so the copy of a small batch is now enqueued by
//! `__next__`, before its export, and the pump only takes host batches from the loader. A
//! large batch (over [`SMALL_BATCH`](crate::epoch::SMALL_BATCH)) is still copied by the
//! pump as soon as it is collated: its copy takes long enough that enqueuing it early, ahead
//! of Python's request, is what overlaps it with the training step.
//!
//! Both sides enqueue on one copy stream and bound the copies in flight as
//! longshore-transfer's `Prefetcher` does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use longshore_loader::LoaderError;

use crate::epoch::{Ready, Reply, Room, SMALL_BATCH, Timings, batch_bytes, lap};
use crate::loader::Handoff;

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_loader::{DeviceBatch, HostBatch};
use longshore_transfer::{Event, Prefetched, Stream, ToDevice, TransferError};

/// Copies one side may have enqueued and not seen complete before it waits for the oldest
/// (the `Prefetcher`'s bound for a depth of 2).
pub(crate) const MAX_COPIES: usize = 8;

/// Enqueues host batches' copies on a copy stream, at most [`MAX_COPIES`] in flight.
pub(crate) struct Uploader {
    stream: Stream,
    /// Completion events of this side's copies that may still run, oldest first.
    copies: VecDeque<Event>,
}

impl Uploader {
    pub(crate) fn new(stream: Stream) -> Self {
        Self {
            stream,
            copies: VecDeque::with_capacity(MAX_COPIES),
        }
    }

    /// Enqueues `batch`'s copy; its page-locked lease returns to the pool once the copy has
    /// completed. At the bound, the oldest copy is queried (copies complete in stream order)
    /// and, if it still runs, `wait` is called with it first.
    pub(crate) fn upload(
        &mut self,
        batch: Batch<PoolBuffer>,
        wait: impl FnOnce(Event) -> Result<(), TransferError>,
    ) -> Result<Prefetched<DeviceBatch>, TransferError> {
        while self.copies.len() >= MAX_COPIES {
            let Some(oldest) = self.copies.pop_front() else {
                break;
            };
            if !oldest.is_complete() {
                wait(oldest)?;
                break;
            }
        }
        let batch = HostBatch(batch).to_device(&self.stream)?;
        let ready = self.stream.record()?;
        self.copies.push_back(ready.clone());
        Ok(Prefetched { batch, ready })
    }
}

/// Who enqueues the device copies of a device epoch's batches: `LONGSHORE_UPLOAD` (a benchmark
/// switch, read when an epoch starts): `thread` (the default), `next` or `pump`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Copies {
    /// The loader's own device iterator on the epoch thread: every copy there.
    Pump,
    /// `__next__` enqueues the copies of small batches, the epoch thread those of large ones.
    Next,
    /// The copy thread enqueues every copy.
    Thread,
}

impl Copies {
    /// The mode `LONGSHORE_UPLOAD` asks for (unset or empty: [`Copies::Thread`]).
    pub(crate) fn from_env() -> Result<Self, LoaderError> {
        match std::env::var("LONGSHORE_UPLOAD").as_deref().map(str::trim) {
            Err(_) | Ok("" | "thread") => Ok(Self::Thread),
            Ok("next") => Ok(Self::Next),
            Ok("pump") => Ok(Self::Pump),
            Ok(other) => Err(LoaderError::State(format!(
                "LONGSHORE_UPLOAD={other:?}: expected thread, next or pump"
            ))),
        }
    }
}

/// The copy thread ([`Copies::Thread`]): takes the epoch thread's replies from `from`,
/// enqueues each host batch's copy, and hands the replies on to Python's queue `out`, in
/// order, with their positions. A batch larger than [`SMALL_BATCH`] waits for `room` in `out`
/// (as the epoch thread's do without this thread). `upstream` is the epoch thread's room in
/// `from`: taken after every reply, closed when this thread ends, so that the epoch thread
/// never waits for a thread that is gone. Ends after the epoch's end or failure, when Python
/// closes the epoch or drops its queue, or when the epoch thread ends.
pub(crate) fn copy_thread(
    from: Receiver<Ready>,
    out: Sender<Ready>,
    room: Arc<Room>,
    upstream: Arc<Room>,
    mut uploader: Uploader,
    timings: Option<Arc<Timings>>,
) {
    let t = timings.as_deref();
    while let Ok(Ready { reply, state }) = from.recv() {
        upstream.taken();
        if room.is_closed() {
            break;
        }
        let reply = match reply {
            Reply::Batch(h) => match *h {
                Handoff::Staged(b) => {
                    let start = t.map(|_| Instant::now());
                    // A panic here (a driver binding) reaches Python as the batch's error.
                    let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        uploader.upload(b, |e| e.synchronize())
                    }));
                    lap(t, |t| &t.upload, start);
                    match copied {
                        Ok(Ok(p)) => {
                            if let Some(t) = t {
                                t.uploads_thread.fetch_add(1, Ordering::Relaxed);
                            }
                            Reply::Batch(Box::new(Handoff::Device(p)))
                        }
                        Ok(Err(e)) => Reply::Failed(e.into()),
                        Err(p) => Reply::Failed(LoaderError::WorkerPanicked {
                            worker: 0,
                            batch: 0,
                            message: format!(
                                "the copy thread panicked: {}",
                                longshore_data::worker::panic_message(p)
                            ),
                        }),
                    }
                }
                other => Reply::Batch(Box::new(other)),
            },
            other => other,
        };
        // A failed batch may be followed by more (the loader's error policy decides).
        let last = matches!(reply, Reply::End);
        if let Reply::Batch(b) = &reply
            && batch_bytes(b) > SMALL_BATCH
        {
            room.wait_for_room(&out);
        }
        // A closed queue hands the reply back; dropping it returns its memory.
        if out.send(Ready { reply, state }).is_err() || last {
            break;
        }
    }
    // The epoch thread's next hand-over fails (`from` is dropped) and it stops waiting for
    // room.
    drop(from);
    upstream.close();
}
