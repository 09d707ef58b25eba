//! The device copies of an epoch's batches, split between the epoch thread and Python.
//!
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

use longshore::data::Batch;
use longshore::host::PoolBuffer;
use longshore::loader::DeviceBatch;
use longshore::transfer::{Event, Stream, TransferError, upload_new};

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
    ) -> Result<DeviceBatch, TransferError> {
        while self.copies.len() >= MAX_COPIES {
            let Some(oldest) = self.copies.pop_front() else {
                break;
            };
            if !oldest.is_complete() {
                wait(oldest)?;
                break;
            }
        }
        let (layout, host) = batch.into_parts();
        // The lease returns to its pool once the copy has completed.
        let storage = upload_new(&self.stream, host)?;
        let ready = self.stream.record()?;
        self.copies.push_back(ready.clone());
        Ok(DeviceBatch::new(layout, storage, ready))
    }
}
