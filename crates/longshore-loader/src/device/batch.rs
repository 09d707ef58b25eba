//! [`DeviceBatch`]: what every device stage yields, the loader's one batch type on a device.

use std::any::Any;
use std::fmt;

use longshore_data::{Batch, BatchLayout, DType, DataError, TensorSpec};
use longshore_host::HostBuffer;
use longshore_transfer::{DeviceBuffer, Event, Stream};

use crate::error::LoaderError;

/// One device buffer of a [`DeviceBatch`] and the tensors it holds (offsets in its bytes).
#[derive(Debug)]
pub struct DevicePart {
    /// The tensors in this buffer.
    pub layout: BatchLayout,
    /// The device memory.
    pub storage: DeviceBuffer,
}

/// A batch on a device, whatever stage produced it (an upload, nvJPEG decoding, your own
/// kernel): named tensors with their shapes and dtypes, in one or more device buffers, and the
/// [`Event`] that ends the work producing them.
///
/// Use it after its work: [`wait_on`](DeviceBatch::wait_on) orders your compute stream after
/// it (the host does not block), [`wait`](DeviceBatch::wait) blocks the host. Copies made
/// through longshore-transfer order themselves after it on their own.
///
/// Tensors are numbered across the buffers in order: an upload gives one buffer holding every
/// tensor of the host batch at its [`BatchLayout`] offsets (the whole batch crossed the link
/// in one copy); nvJPEG gives the images in one buffer and the labels in another.
///
/// ```
/// use longshore_data::{BatchLayout, DType};
/// use longshore_loader::DeviceBatch;
/// use longshore_transfer::Device;
///
/// let stream = Device::cpu().new_stream()?;
/// let mut layout = BatchLayout::new(4);
/// layout.push(Some("x".into()), DType::F32, vec![4, 2])?;
/// let storage = stream.alloc(layout.total_bytes())?;
/// let batch = DeviceBatch::new(layout, storage, stream.record()?).wait()?;
/// assert_eq!((batch.batch_size(), batch.shape(0)?, batch.position("x")), (4, &[4, 2][..], Some(0)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DeviceBatch {
    parts: Vec<DevicePart>,
    /// `(part, index in the part)` of each tensor, in batch order.
    index: Vec<(usize, usize)>,
    batch_size: usize,
    ready: Event,
    extension: Option<Box<dyn Any + Send + Sync>>,
}

impl fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("batch_size", &self.batch_size)
            .field("parts", &self.parts)
            .field("extension", &self.extension.is_some())
            .finish_non_exhaustive()
    }
}

impl DeviceBatch {
    /// A batch in one device buffer, ready at `ready`.
    pub fn new(layout: BatchLayout, storage: DeviceBuffer, ready: Event) -> DeviceBatch {
        let batch_size = layout.batch_size();
        let index = (0..layout.tensors().len()).map(|i| (0, i)).collect();
        DeviceBatch {
            parts: vec![DevicePart { layout, storage }],
            index,
            batch_size,
            ready,
            extension: None,
        }
    }

    /// A batch whose tensors live in several device buffers, ready at `ready`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when there is no part, the parts disagree on the batch size,
    /// or a part's buffer is shorter than its layout.
    pub fn from_parts(parts: Vec<DevicePart>, ready: Event) -> Result<DeviceBatch, DataError> {
        let Some(first) = parts.first() else {
            return Err(DataError::InvalidArgument {
                name: "parts",
                reason: "a device batch needs at least one part".into(),
            });
        };
        let batch_size = first.layout.batch_size();
        let mut index = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            if part.layout.batch_size() != batch_size {
                return Err(DataError::InvalidArgument {
                    name: "parts",
                    reason: format!(
                        "device batch part {p} holds {} samples where part 0 holds {batch_size}",
                        part.layout.batch_size()
                    ),
                });
            }
            if part.storage.len() < part.layout.total_bytes() {
                return Err(DataError::BufferTooSmall {
                    what: "device batch part",
                    needed: part.layout.total_bytes(),
                    got: part.storage.len(),
                });
            }
            index.extend((0..part.layout.tensors().len()).map(|i| (p, i)));
        }
        Ok(DeviceBatch {
            parts,
            index,
            batch_size,
            ready,
            extension: None,
        })
    }

    /// Attaches what the stage knows of the batch beyond its tensors (nvJPEG: how each
    /// sample was decoded), for [`extension`](DeviceBatch::extension).
    pub fn with_extension<T: Any + Send + Sync>(mut self, value: T) -> DeviceBatch {
        self.extension = Some(Box::new(value));
        self
    }

    /// The stage's extra information, if it attached a `T`.
    pub fn extension<T: Any>(&self) -> Option<&T> {
        self.extension.as_deref()?.downcast_ref()
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the batch has no tensor.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The event that ends the work producing the batch.
    pub fn ready(&self) -> &Event {
        &self.ready
    }

    /// Makes `compute` wait for the batch's work (device-side: the host does not block) and
    /// hands the batch over: NVIDIA's data_prefetcher handoff.
    pub fn wait_on(self, compute: &Stream) -> Result<DeviceBatch, LoaderError> {
        compute.wait_event(&self.ready)?;
        Ok(self)
    }

    /// Blocks the host until the batch's work is done.
    pub fn wait(self) -> Result<DeviceBatch, LoaderError> {
        self.ready.synchronize()?;
        Ok(self)
    }

    /// The buffers and the tensors each holds.
    pub fn parts(&self) -> &[DevicePart] {
        &self.parts
    }

    fn locate(&self, i: usize) -> Result<(usize, usize), DataError> {
        self.index
            .get(i)
            .copied()
            .ok_or(DataError::IndexOutOfRange {
                index: i,
                len: self.index.len(),
                what: "batch tensors",
            })
    }

    /// The spec (dtype, shape, offset in [`buffer`](DeviceBatch::buffer)) of tensor `i`.
    pub fn spec(&self, i: usize) -> Result<&TensorSpec, DataError> {
        let (p, t) = self.locate(i)?;
        Ok(&self.parts[p].layout.tensors()[t])
    }

    /// The device buffer holding tensor `i` (at [`spec(i).offset`](TensorSpec::offset)).
    pub fn buffer(&self, i: usize) -> Result<&DeviceBuffer, DataError> {
        let (p, _) = self.locate(i)?;
        Ok(&self.parts[p].storage)
    }

    /// The device buffer holding tensor `i`, writable (in-place transforms on the device).
    pub fn buffer_mut(&mut self, i: usize) -> Result<&mut DeviceBuffer, DataError> {
        let (p, _) = self.locate(i)?;
        Ok(&mut self.parts[p].storage)
    }

    /// The shape of tensor `i`, batch dimension first.
    pub fn shape(&self, i: usize) -> Result<&[usize], DataError> {
        self.spec(i).map(|s| &s.shape[..])
    }

    /// The dtype of tensor `i`.
    pub fn dtype(&self, i: usize) -> Result<DType, DataError> {
        self.spec(i).map(|s| s.dtype)
    }

    /// The name of tensor `i`, if it has one.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.spec(i).ok()?.name.as_deref()
    }

    /// Index of the tensor called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        (0..self.len()).find(|&i| self.name(i) == Some(name))
    }

    /// The CUDA device address of tensor `i` (`None` on the Cpu device), for kernels and BLAS.
    pub fn cuda_ptr(&self, i: usize) -> Option<u64> {
        let off = self.spec(i).ok()?.offset as u64;
        self.buffer(i).ok()?.cuda_device_ptr().map(|p| p + off)
    }

    /// Copies the batch back to host memory on `stream` (after its work) and waits for it,
    /// every tensor laid out as in a host batch (for checks and debugging; a training loop
    /// never needs this).
    pub fn to_host(&self, stream: &Stream) -> Result<Batch<HostBuffer>, LoaderError> {
        stream.wait_event(&self.ready)?;
        let mut layout = BatchLayout::new(self.batch_size);
        for i in 0..self.len() {
            let s = self.spec(i)?;
            layout.push(s.name.clone(), s.dtype, s.shape.clone())?;
        }
        let mut parts = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let bytes = HostBuffer::pageable(part.storage.len().max(1))?;
            parts.push(if part.storage.is_empty() {
                bytes
            } else {
                stream.download(&part.storage, bytes)?.wait()?
            });
        }
        let mut host = HostBuffer::pageable(layout.total_bytes().max(1))?;
        for (dst, &(p, t)) in layout.tensors().iter().zip(&self.index) {
            let src = &self.parts[p].layout.tensors()[t];
            host[dst.range()].copy_from_slice(&parts[p][src.range()]);
        }
        Ok(Batch::from_parts(layout, host)?)
    }

    /// The buffers with their layouts, and the event their work ends at.
    pub fn into_parts(self) -> (Vec<DevicePart>, Event) {
        (self.parts, self.ready)
    }
}
