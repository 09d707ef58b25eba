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
//! copies in flight with the loader's own [`DeviceWindow`], as its device pipeline does.

use longshore::data::Batch;
use longshore::host::PoolBuffer;
use longshore::loader::{DeviceBatch, DeviceStage, DeviceWindow, LoaderError, Upload};
use longshore::transfer::{Event, Stream, TransferError};

/// Batches in flight to the device per side: the window of the loader's device pipeline at
/// the binding's depth.
const DEPTH: usize = 2;

/// Enqueues host batches' copies through the loader's [`Upload`] stage on a shared copy
/// stream, at most the window of a device pipeline of depth [`DEPTH`] in flight.
pub(crate) struct Uploader {
    upload: Upload,
    /// This side's copies that may still run.
    window: DeviceWindow,
}

impl Uploader {
    pub(crate) fn new(stream: Stream) -> Self {
        Self {
            upload: Upload::on_stream(stream),
            window: DeviceWindow::for_depth(DEPTH, 1),
        }
    }

    /// Enqueues `batch`'s copy; its page-locked lease returns to the pool once the copy has
    /// completed. With the window full, `wait` is called first with the oldest copy still
    /// running (copies complete in stream order).
    pub(crate) fn upload(
        &mut self,
        batch: Batch<PoolBuffer>,
        mut wait: impl FnMut(Event) -> Result<(), TransferError>,
    ) -> Result<DeviceBatch, LoaderError> {
        self.window.make_room(0, |e| wait(e.clone()))?;
        let batch = self
            .upload
            .run(0, batch)?
            .ok_or_else(|| LoaderError::State("the upload stage dropped a batch".into()))?;
        self.window.record(batch.ready().clone());
        Ok(batch)
    }
}
