//! [`DeviceStage`]: the seam between the loader's host batches and the device, and
//! [`Upload`], the stage behind [`DataLoader::to_device`](crate::DataLoader::to_device).

use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_transfer::{Device, Stream, upload_new};

use crate::device::DeviceBatch;
use crate::error::LoaderError;
use crate::options::SampleErrorPolicy;

/// What a stage is told when an epoch starts on one of its lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StageContext {
    /// Batches this lane keeps in flight: a stage with per-batch resources (decoding states,
    /// staging buffers) keeps `depth + 1` sets so that it never waits for a batch it has just
    /// handed out.
    pub depth: usize,
    /// The loader's `on_sample_error`: what a sample that fails in the stage does.
    pub on_sample_error: SampleErrorPolicy,
    /// The loader's epoch.
    pub epoch: u64,
}

/// Turns a host batch (the workers' output, in pooled page-locked memory) into a
/// [`DeviceBatch`] on a stream: the one seam through which every batch reaches a device.
///
/// [`Upload`] (one DMA copy of the whole batch) is what
/// [`DataLoader::to_device`](crate::DataLoader::to_device) uses; nvJPEG decoding
/// (`longshore-nvjpeg`) is another; a custom kernel or a GPU augmentation is yours. The loader
/// owns everything around it ([`DeviceLoader`](crate::DeviceLoader)): the depth of the queue,
/// the lanes (threads) a stage may run on, the order batches come out in, what
/// `state_dict` counts, worker placement and stats. A stage keeps its state (streams,
/// library handles, compiled kernels) for as long as the [`DeviceLoader`](crate::DeviceLoader)
/// holds it, across epochs.
///
/// `run` must not block on the device: it enqueues the batch's work on its own stream and
/// returns the batch with the [`Event`](longshore_transfer::Event) that work ends at. The host
/// batch's lease must stay alive until that work has read it: move it into the copy
/// ([`Stream::upload`] does) or record the event as a fence on it
/// ([`PoolBuffer::record_fence`]), so it returns to the pool only after.
///
/// ```
/// use longshore_data::{Batch, VecDataset};
/// use longshore_host::PoolBuffer;
/// use longshore_loader::{DataLoader, DeviceBatch, DeviceStage, LoaderError, StageContext};
/// use longshore_transfer::{Device, Stream, upload_new};
///
/// /// Uploads each batch and counts the samples it saw (a stand-in for a GPU augmentation).
/// struct Counting { device: Device, stream: Stream, samples: usize }
///
/// impl DeviceStage for Counting {
///     fn device(&self) -> &Device { &self.device }
///     fn run(&mut self, _seq: u64, batch: Batch<PoolBuffer>) -> Result<Option<DeviceBatch>, LoaderError> {
///         self.samples += batch.batch_size();
///         let (layout, host) = batch.into_parts();
///         let storage = upload_new(&self.stream, host)?; // the lease returns after the copy
///         Ok(Some(DeviceBatch::new(layout, storage, self.stream.record()?)))
///     }
/// }
///
/// let rows: Vec<([f32; 2], i64)> = (0..10).map(|i| ([i as f32; 2], i)).collect();
/// let loader = DataLoader::builder(VecDataset::new(rows)).batch_size(4).build()?;
/// let device = Device::cpu();
/// let stage = Counting { stream: device.new_stream()?, device, samples: 0 };
/// let on_device = loader.with_stage(stage);
/// for _epoch in 0..2 {
///     for batch in on_device.iter()? {
///         let batch = batch?.wait()?;
///         assert_eq!(batch.shape(0)?[1], 2);
///     }
/// }
/// assert_eq!(on_device.stage(|s| s.samples), Some(20)); // kept across epochs
/// # Ok::<(), LoaderError>(())
/// ```
pub trait DeviceStage: Send + 'static {
    /// The device the stage delivers to (the loader places its workers near it).
    fn device(&self) -> &Device;

    /// Makes the stage ready for an epoch on this lane: called on the lane's thread before its
    /// first batch of every epoch (the default does nothing). Keep what is costly to make
    /// (states, buffers) across calls.
    ///
    /// # Errors
    /// Whatever makes the stage unable to run; the epoch yields it and ends.
    fn prepare(&mut self, context: &StageContext) -> Result<(), LoaderError> {
        let _ = context;
        Ok(())
    }

    /// Enqueues the work turning host batch `seq` (its position in the epoch) into a device
    /// batch and returns it with the event that work ends at, or `None` when the stage
    /// dropped every sample (under [`SampleErrorPolicy::Skip`]).
    ///
    /// # Errors
    /// A failed sample as [`LoaderError::Sample`] (the batch counts as delivered, as on the
    /// CPU path), a device failure as [`LoaderError::Transfer`] (the batch does not count:
    /// a resume loads it again).
    fn run(
        &mut self,
        seq: u64,
        batch: Batch<PoolBuffer>,
    ) -> Result<Option<DeviceBatch>, LoaderError>;

    /// Another lane of this stage, with its own stream and per-batch state, to run on its own
    /// thread ([`DeviceLoader::lanes`](crate::DeviceLoader::lanes)): for stages whose host
    /// work per batch (parsing, submitting) would otherwise bound the pipeline. `None` (the
    /// default): the stage runs on one lane, on the thread iterating the epoch.
    fn lane(&self) -> Option<Result<Self, LoaderError>>
    where
        Self: Sized,
    {
        None
    }
}

/// The default device stage: the whole host batch in one copy to a new device buffer on its
/// own copy stream (direct DMA from a page-locked lease, which returns to the pool once the
/// copy completes). PyTorch's `pin_memory=True` + `.to(device, non_blocking=True)`.
#[derive(Debug)]
pub struct Upload {
    device: Device,
    stream: Stream,
}

impl Upload {
    /// An upload stage to `device` on a new copy stream.
    ///
    /// # Errors
    /// [`LoaderError::Transfer`] when the stream cannot be made.
    pub fn new(device: &Device) -> Result<Upload, LoaderError> {
        Ok(Upload {
            device: device.clone(),
            stream: device.new_stream()?,
        })
    }

    /// An upload stage on an existing copy stream (its device's), for several callers that
    /// enqueue their copies on one stream in order.
    pub fn on_stream(stream: Stream) -> Upload {
        Upload {
            device: stream.device().clone(),
            stream,
        }
    }

    /// The copy stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

impl DeviceStage for Upload {
    fn device(&self) -> &Device {
        &self.device
    }

    fn run(
        &mut self,
        _seq: u64,
        batch: Batch<PoolBuffer>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        let (layout, host) = batch.into_parts();
        // The lease is moved into the copy and returns to its pool once the copy completes.
        let storage = upload_new(&self.stream, host)?;
        Ok(Some(DeviceBatch::new(
            layout,
            storage,
            self.stream.record()?,
        )))
    }

    fn lane(&self) -> Option<Result<Self, LoaderError>> {
        Some(Upload::new(&self.device))
    }
}
