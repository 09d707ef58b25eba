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
//! Both sides enqueue through the loader's `Upload` stage on one copy stream, and bound the
//! copies in flight as the loader's device pipeline does.

use std::collections::VecDeque;

use longshore::data::Batch;
use longshore::host::PoolBuffer;
use longshore::loader::{DeviceBatch, DeviceStage, LoaderError, Upload};
use longshore::transfer::{Event, Stream, TransferError};

/// Copies one side may have enqueued and not seen complete before it waits for the oldest
/// (the device pipeline's bound for a depth of 2).
pub(crate) const MAX_COPIES: usize = 8;

/// Enqueues host batches' copies through the loader's [`Upload`] stage on a shared copy
/// stream, at most [`MAX_COPIES`] in flight.
pub(crate) struct Uploader {
    upload: Upload,
    /// Completion events of this side's copies that may still run, oldest first.
    copies: VecDeque<Event>,
}

impl Uploader {
    pub(crate) fn new(stream: Stream) -> Self {
        Self {
            upload: Upload::on_stream(stream),
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
    ) -> Result<DeviceBatch, LoaderError> {
        while self.copies.len() >= MAX_COPIES {
            let Some(oldest) = self.copies.pop_front() else {
                break;
            };
            if !oldest.is_complete() {
                wait(oldest)?;
                break;
            }
        }
        let batch = self
            .upload
            .run(0, batch)?
            .ok_or_else(|| LoaderError::State("the upload stage dropped a batch".into()))?;
        self.copies.push_back(batch.ready().clone());
        Ok(batch)
    }
}
