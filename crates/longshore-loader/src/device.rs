//! Device delivery: [`DataLoader::to_device`] feeds the loader's batches through
//! longshore-transfer's [`Prefetcher`], so the copy of batch `i + 1` overlaps the compute on
//! batch `i`, and the page-locked lease of each batch goes back to the pool only once its copy
//! has completed.

use longshore_data::{Batch, BatchLayout, DType, DataError, TensorSpec};
use longshore_host::{HostBuffer, PoolBuffer};
use longshore_transfer::{
    Device, DeviceBuffer, Prefetched, Prefetcher, Stream, ToDevice, upload_new,
};

use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::iter::{LoaderIter, Marker};
use crate::loader::DataLoader;

/// A batch on a device: one [`DeviceBuffer`] holding every tensor at the offsets of its
/// [`BatchLayout`], so the whole batch crossed PCIe in one copy.
#[derive(Debug)]
pub struct DeviceBatch {
    storage: DeviceBuffer,
    layout: BatchLayout,
}

impl DeviceBatch {
    /// The device memory of the whole batch.
    pub fn storage(&self) -> &DeviceBuffer {
        &self.storage
    }

    /// The device memory, writable (for in-place transforms on the device).
    pub fn storage_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.storage
    }

    /// Where each tensor lives in [`storage`](DeviceBatch::storage).
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.layout.batch_size()
    }

    /// The spec (dtype, shape, offset) of tensor `i`.
    pub fn spec(&self, i: usize) -> Result<&TensorSpec, DataError> {
        self.layout
            .tensors()
            .get(i)
            .ok_or(DataError::IndexOutOfRange {
                index: i,
                len: self.layout.tensors().len(),
                what: "batch tensors",
            })
    }

    /// The shape of tensor `i`, batch dimension first.
    pub fn shape(&self, i: usize) -> Result<&[usize], DataError> {
        self.spec(i).map(|s| &s.shape[..])
    }

    /// The dtype of tensor `i`.
    pub fn dtype(&self, i: usize) -> Result<DType, DataError> {
        self.spec(i).map(|s| s.dtype)
    }

    /// The CUDA device address of tensor `i` (`None` on the Cpu device), for kernels and BLAS.
    pub fn cuda_ptr(&self, i: usize) -> Option<u64> {
        let off = self.spec(i).ok()?.offset as u64;
        self.storage.cuda_device_ptr().map(|p| p + off)
    }

    /// Copies the batch back to host memory on `stream` and waits for it (for checks and
    /// debugging; a training loop never needs this).
    pub fn to_host(&self, stream: &Stream) -> Result<Batch<HostBuffer>, LoaderError> {
        let host = HostBuffer::pageable(self.storage.len().max(1))?;
        let host = stream.download(&self.storage, host)?.wait()?;
        Ok(Batch::from_parts(self.layout.clone(), host)?)
    }

    /// The device memory and the layout.
    pub fn into_parts(self) -> (BatchLayout, DeviceBuffer) {
        (self.layout, self.storage)
    }
}

/// A host batch on its way to a device.
#[derive(Debug)]
pub struct HostBatch(pub Batch<PoolBuffer>);

impl ToDevice for HostBatch {
    type Output = DeviceBatch;
    fn to_device(self, stream: &Stream) -> longshore_transfer::Result<DeviceBatch> {
        let (layout, storage) = self.0.into_parts();
        // The lease is moved into the copy and returns to its pool once the copy completes.
        Ok(DeviceBatch {
            storage: upload_new(stream, storage)?,
            layout,
        })
    }
}

/// A host batch with its position in the epoch, so the device stage can mark it delivered
/// when it hands it out.
struct Tagged {
    batch: HostBatch,
    seq: u64,
}

impl ToDevice for Tagged {
    type Output = (DeviceBatch, u64);
    fn to_device(self, stream: &Stream) -> longshore_transfer::Result<(DeviceBatch, u64)> {
        Ok((self.batch.to_device(stream)?, self.seq))
    }
}

/// An error of the loader with the position it came at (and whether it counts as delivered).
type TaggedError = (LoaderError, Option<(u64, bool)>);

/// The loader's epoch as the prefetcher's source: items tagged with their position.
struct Source<F: Fetch> {
    it: LoaderIter<F>,
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> Iterator for Source<F> {
    type Item = Result<Tagged, TaggedError>;
    fn next(&mut self) -> Option<Self::Item> {
        let item = self.it.next()?;
        let tag = self.it.last_yielded();
        Some(match (item, tag) {
            (Ok(b), Some((seq, _))) => Ok(Tagged {
                batch: HostBatch(b),
                seq,
            }),
            (Ok(_), None) => Err((
                LoaderError::State("a batch came without its position".into()),
                None,
            )),
            (Err(e), tag) => Err((e, tag)),
        })
    }
}

/// One epoch of a [`DataLoader`] delivered to a device; see [`DataLoader::to_device`].
///
/// A batch counts as delivered for [`DataLoader::state_dict`] when this iterator hands it out,
/// not when the prefetcher takes it from the loader.
pub struct DeviceIter<F: Fetch<Output = Batch<PoolBuffer>>> {
    inner: Prefetcher<Source<F>>,
    marker: Marker<F>,
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> std::fmt::Debug for DeviceIter<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceIter")
            .field("prefetcher", &self.inner)
            .finish()
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> DeviceIter<F> {
    /// Bounds the copies enqueued and not yet complete, including those of batches already
    /// handed out (default `4 * depth`): a consumer that enqueues its work faster than the link
    /// copies is held there, so the workers are throttled by the loader's in-flight limit
    /// instead of filling page-locked memory with batches queued behind the link. See
    /// [`Prefetcher::max_copies`]; `usize::MAX` turns the bound off.
    pub fn max_copies(mut self, n: usize) -> Self {
        self.inner = self.inner.max_copies(n);
        self
    }

    /// How many times the iterator waited for the link before taking the next batch from the
    /// loader (see [`Prefetcher::throttled`]).
    pub fn throttled(&self) -> u64 {
        self.inner.throttled()
    }

    /// The copy stream.
    pub fn copy_stream(&self) -> &Stream {
        self.inner.stream()
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> Iterator for DeviceIter<F> {
    type Item = Result<Prefetched<DeviceBatch>, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(match self.inner.next()? {
            // The copy could not be enqueued: the batch never reaches the user, so it is not
            // marked and a resume loads it again.
            Err(e) => Err(LoaderError::from(e)),
            Ok(Prefetched {
                batch: Err((e, tag)),
                ..
            }) => {
                if let Some((seq, true)) = tag {
                    self.marker.mark(seq);
                }
                Err(e)
            }
            Ok(Prefetched {
                batch: Ok((batch, seq)),
                ready,
            }) => {
                self.marker.mark(seq);
                Ok(Prefetched { batch, ready })
            }
        })
    }
}

impl<F: Fetch<Output = Batch<PoolBuffer>>> DataLoader<F> {
    /// Iterates one epoch with every batch copied to `device` on a dedicated copy stream,
    /// keeping `depth` batches in flight (PyTorch: `pin_memory=True` plus
    /// `.to(device, non_blocking=True)`, done right).
    ///
    /// Each item is a [`Prefetched`] batch with the event its copy completes at: call
    /// [`wait_on`](Prefetched::wait_on) with your compute stream (the GPU waits, the host does
    /// not) or [`wait`](Prefetched::wait). With `pin_memory` the copies are direct DMA from
    /// the batch's page-locked lease, which returns to the pool only after its copy.
    ///
    /// Under [`Placement::GpuLocal`](crate::Placement::GpuLocal) (the default) the workers run
    /// on the CPUs nearest `device` and the loader's own pool allocates on its NUMA node,
    /// where the host has several nodes (see [`DataLoader::placement`]).
    pub fn to_device(&self, device: &Device, depth: usize) -> Result<DeviceIter<F>, LoaderError> {
        let stream = device.new_stream()?;
        // Workers (persistent ones too) move to the device's CPUs before their next batch.
        self.place(device.topology(), false);
        let mut it = self.iter();
        let marker = it.defer_marks();
        Ok(DeviceIter {
            inner: Prefetcher::new(Source { it }, stream, depth.max(1))?,
            marker,
        })
    }
}
