//! [`Prefetcher`]: keeps N host batches in flight to a device on a copy stream.

use std::collections::VecDeque;
use std::fmt;
use std::iter::Fuse;

use longshore_host::{HostBuffer, HostMemory, PoolBuffer};

use crate::buffer::DeviceBuffer;
use crate::error::{Result, TransferError};
use crate::event::Event;
use crate::stream::Stream;

/// A host-side value that can be copied to a device: what a [`Prefetcher`] moves.
///
/// `to_device` enqueues the copies on `stream` and returns the device-side value *without*
/// waiting for them; the [`Prefetcher`] records the event that covers them. The host memory
/// must stay untouched until the copies complete: move it into the copy ([`Stream::upload`]
/// takes it by value) and drop the returned [`Pending`](crate::Pending), which releases it (to
/// its pool, for a lease) only after the copy.
///
/// The loader implements it for its batch type; a batch that owns one contiguous host storage
/// plus typed metadata can also use [`HostStorage`] as is:
///
/// ```
/// use longshore_host::{HostBuffer, MemoryKind};
/// use longshore_transfer::{Device, DeviceBuffer, Result, Stream, ToDevice, upload_new};
///
/// /// Images and labels collated into one buffer: images first, then labels.
/// struct Batch { storage: HostBuffer, images: usize }
/// struct GpuBatch { storage: DeviceBuffer, images: usize }
///
/// impl ToDevice for Batch {
///     type Output = GpuBatch;
///     fn to_device(self, stream: &Stream) -> Result<GpuBatch> {
///         Ok(GpuBatch { storage: upload_new(stream, self.storage)?, images: self.images })
///     }
/// }
///
/// let stream = Device::cpu().new_stream()?;
/// let batch = Batch { storage: HostBuffer::from_slice(MemoryKind::Pageable, &[1u8; 80])?, images: 64 };
/// let gpu = batch.to_device(&stream)?;
/// assert_eq!((gpu.storage.len(), gpu.images), (80, 64));
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
pub trait ToDevice: Send + 'static {
    /// The device-side value.
    type Output: Send + 'static;

    /// Enqueues the copies of `self` on `stream` and returns the device-side value.
    fn to_device(self, stream: &Stream) -> Result<Self::Output>;
}

/// Allocates a device buffer of `src`'s length on `stream` and uploads `src` into it; `src` is
/// released (back to its pool, for a lease) once the copy has completed.
pub fn upload_new<S: HostMemory>(stream: &Stream, src: S) -> Result<DeviceBuffer> {
    let mut dst = stream.alloc(src.as_bytes().len())?;
    stream.upload(src, &mut dst)?.release();
    Ok(dst)
}

impl ToDevice for HostBuffer {
    type Output = DeviceBuffer;
    fn to_device(self, stream: &Stream) -> Result<DeviceBuffer> {
        upload_new(stream, self)
    }
}

impl ToDevice for PoolBuffer {
    type Output = DeviceBuffer;
    fn to_device(self, stream: &Stream) -> Result<DeviceBuffer> {
        upload_new(stream, self)
    }
}

/// Items of a fallible source (`Result<T, E>`) pass their errors through, in order.
impl<T: ToDevice, E: Send + 'static> ToDevice for std::result::Result<T, E> {
    type Output = std::result::Result<T::Output, E>;
    fn to_device(self, stream: &Stream) -> Result<Self::Output> {
        match self {
            Ok(t) => t.to_device(stream).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }
}

/// A batch that owns one contiguous host storage plus typed metadata (shapes, labels, indices).
///
/// Named `HostBatch` until 0.1; renamed so it does not clash with the loader's batch types in
/// the facade (`longshore::loader::DeviceBatch`).
#[derive(Debug)]
pub struct HostStorage<S, M> {
    /// The bytes to copy.
    pub storage: S,
    /// Metadata that stays on the host and travels with the batch.
    pub meta: M,
}

/// The device side of a [`HostStorage`]. Named `DeviceBatch` until 0.1.
#[derive(Debug)]
pub struct DeviceStorage<M> {
    /// The bytes, on the device.
    pub storage: DeviceBuffer,
    /// The batch's metadata.
    pub meta: M,
}

impl<S: HostMemory, M: Send + 'static> ToDevice for HostStorage<S, M> {
    type Output = DeviceStorage<M>;
    fn to_device(self, stream: &Stream) -> Result<DeviceStorage<M>> {
        Ok(DeviceStorage {
            storage: upload_new(stream, self.storage)?,
            meta: self.meta,
        })
    }
}

/// A batch handed out by a [`Prefetcher`], with the event its copies complete at.
#[derive(Debug)]
#[must_use = "the batch's copies may still be in flight: wait for `ready` before using it"]
pub struct Prefetched<D> {
    /// The device-side batch. Copies through this crate order themselves after `ready`; your
    /// own kernels must not touch it before `ready` (use [`wait_on`](Prefetched::wait_on)).
    pub batch: D,
    /// Completes when the batch's copies have.
    pub ready: Event,
}

impl<D> Prefetched<D> {
    /// Makes `compute` wait for the batch's copies (device-side: the host does not block) and
    /// hands the batch over. This is the stream-to-stream handoff of NVIDIA's data_prefetcher.
    pub fn wait_on(self, compute: &Stream) -> Result<D> {
        compute.wait_event(&self.ready)?;
        Ok(self.batch)
    }

    /// Blocks the host until the batch's copies are done and hands the batch over.
    pub fn wait(self) -> Result<D> {
        self.ready.synchronize()?;
        Ok(self.batch)
    }
}

/// Wraps an iterator of host batches and keeps `depth` of them in flight on a copy stream.
///
/// Each [`next`](Iterator::next) hands back the oldest batch with the [`Event`] its copies
/// complete at, then enqueues the copies of the next batch, so while the consumer computes on
/// one batch, the next `depth` are being copied. A page-locked source (a pool lease) goes back
/// to its pool only after its copy has completed.
///
/// **Back-pressure from the link.** Handing a batch out does not wait for its copy (the
/// consumer orders its own stream after it with [`Prefetched::wait_on`]), so a consumer that
/// enqueues work faster than the link drains it would otherwise pull batch after batch from
/// the source while their copies queue up on the stream: the source's producers (the loader's
/// workers) would run unthrottled, and every queued batch would hold its page-locked block.
/// The prefetcher therefore keeps at most [`max_copies`](Self::max_copies) copies enqueued and
/// not yet complete, handed out or not (default `4 * depth`, at least `depth + 1`): before
/// pulling another batch past that bound it blocks the host on the oldest copy. A consumer
/// slower than the link never waits there (its copies are done by then).
///
/// ```
/// use longshore_host::{HostBuffer, MemoryKind};
/// use longshore_transfer::{Device, Prefetcher};
///
/// let dev = Device::cpu();
/// let (copy, compute) = (dev.new_stream()?, dev.new_stream()?);
/// let batches = (0..5u8).map(|i| HostBuffer::from_slice(MemoryKind::Pageable, &[i; 1024]).unwrap());
/// for (i, item) in Prefetcher::new(batches, copy, 2)?.enumerate() {
///     let batch = item?.wait_on(&compute)?; // compute waits for the copy, the host does not
///     assert_eq!(compute.read_to_vec::<u8>(&batch)?, vec![i as u8; 1024]);
/// }
/// # Ok::<(), longshore_transfer::TransferError>(())
/// ```
pub struct Prefetcher<I>
where
    I: Iterator,
    I::Item: ToDevice,
{
    source: Fuse<I>,
    stream: Stream,
    depth: usize,
    queue: VecDeque<Result<Prefetched<<I::Item as ToDevice>::Output>>>,
    /// Completion events of batches handed out whose copies may still run, oldest first.
    handed: VecDeque<Event>,
    max_copies: usize,
    /// Times the host waited for a handed-out batch's copy before pulling the next batch.
    throttled: u64,
    pulled: u64,
}

impl<I> Prefetcher<I>
where
    I: Iterator,
    I::Item: ToDevice,
{
    /// Prefetches `source` on `stream`, keeping `depth` (at least 1) batches in flight.
    /// Nothing is pulled from `source` before the first `next`.
    pub fn new(
        source: impl IntoIterator<IntoIter = I>,
        stream: Stream,
        depth: usize,
    ) -> Result<Self> {
        if depth == 0 {
            return Err(TransferError::Invalid(
                "a prefetcher needs a depth of at least 1".to_owned(),
            ));
        }
        Ok(Self {
            source: source.into_iter().fuse(),
            stream,
            depth,
            queue: VecDeque::with_capacity(depth + 1),
            handed: VecDeque::with_capacity(depth + 1),
            max_copies: 4 * depth,
            throttled: 0,
            pulled: 0,
        })
    }

    /// Bounds the copies enqueued on the stream and not yet complete, counting those of batches
    /// already handed out (see the type's docs); raised to `depth + 1` if lower. `usize::MAX`
    /// turns the bound off (copies then queue up without limit while the source has batches).
    pub fn max_copies(mut self, n: usize) -> Self {
        self.max_copies = n.max(self.depth + 1);
        self
    }

    /// The bound on copies in flight (see [`max_copies`](Self::max_copies)).
    pub fn copy_limit(&self) -> usize {
        self.max_copies
    }

    /// How many times the host waited for a copy before pulling the next batch: how often the
    /// link, not the consumer, set the pace.
    pub fn throttled(&self) -> u64 {
        self.throttled
    }

    /// The copy stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The number of batches kept in flight.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Batches enqueued and not yet handed out.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Batches pulled from the source so far.
    pub fn pulled(&self) -> u64 {
        self.pulled
    }

    /// Waits for handed-out copies until one more may be enqueued within the bound.
    fn make_room(&mut self) {
        // Only at the bound is anything asked of the device: the oldest copy (copies complete
        // in stream order) is dropped if done, else waited for.
        while self.queue.len() + self.handed.len() >= self.max_copies {
            let Some(oldest) = self.handed.pop_front() else {
                break;
            };
            if oldest.is_complete() {
                continue;
            }
            self.throttled += 1;
            if let Err(e) = oldest.synchronize() {
                // The device is broken: the next enqueue fails and reports it.
                tracing::error!(target: "longshore::transfer", error = %e, "waiting for a prefetched copy failed");
            }
        }
    }

    fn fill(&mut self) {
        while self.queue.len() < self.depth {
            self.make_room();
            let Some(item) = self.source.next() else {
                break;
            };
            self.pulled += 1;
            let staged = item.to_device(&self.stream).and_then(|batch| {
                Ok(Prefetched {
                    batch,
                    ready: self.stream.record()?,
                })
            });
            self.queue.push_back(staged);
        }
    }
}

impl<I> Iterator for Prefetcher<I>
where
    I: Iterator,
    I::Item: ToDevice,
{
    type Item = Result<Prefetched<<I::Item as ToDevice>::Output>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.fill();
        let out = self.queue.pop_front();
        if let Some(Ok(p)) = &out
            && self.max_copies != usize::MAX
        {
            self.handed.push_back(p.ready.clone());
        }
        self.fill();
        out
    }
}

impl<I> fmt::Debug for Prefetcher<I>
where
    I: Iterator,
    I::Item: ToDevice,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prefetcher")
            .field("stream", &self.stream)
            .field("depth", &self.depth)
            .field("in_flight", &self.queue.len())
            .field("max_copies", &self.max_copies)
            .field("throttled", &self.throttled)
            .field("pulled", &self.pulled)
            .finish()
    }
}
