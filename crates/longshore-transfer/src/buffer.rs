//! [`DeviceBuffer`]: memory on a device, reached only through stream-ordered copies.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::backend::cpu::CpuMem;
use crate::device::Device;
use crate::error::{Result, TransferError};
use crate::event::Event;
#[cfg(feature = "cuda")]
use crate::event::EventInner;
use crate::stream::Stream;

pub(crate) enum DeviceMem {
    Cpu(Arc<CpuMem>),
    #[cfg(feature = "cuda")]
    Cuda(crate::backend::cuda::CuMem),
}

/// Which copies a buffer may still be part of: what a new copy on another stream must wait for.
#[derive(Default)]
struct Track {
    /// The last write (copy into, fill, allocation).
    write: Option<Event>,
    /// Reads since that write.
    reads: Vec<Event>,
}

/// A byte buffer in a device's memory (on `Cpu`, host memory owned by the backend).
///
/// There is no direct access to the bytes, on any backend: data goes in and out through
/// [`Stream`] copies, typed through `bytemuck` ([`Stream::to_device`], [`Stream::read_to_vec`],
/// [`len_of`](DeviceBuffer::len_of)).
///
/// A buffer remembers its last write and the reads since, and a copy enqueued on a stream other
/// than theirs first makes that stream wait for them (device-side, the host does not block), so
/// copies through this crate are ordered across streams. Kernels you launch yourself on the
/// buffer must wait for [`ready_event`](DeviceBuffer::ready_event). The memory is freed only
/// after every recorded use: stream-ordered (`cuMemFreeAsync`) on CUDA.
pub struct DeviceBuffer {
    pub(crate) mem: DeviceMem,
    len: usize,
    device: Device,
    track: Mutex<Track>,
}

impl DeviceBuffer {
    pub(crate) fn new(
        mem: DeviceMem,
        len: usize,
        device: Device,
        allocated: Option<Event>,
    ) -> Self {
        Self {
            mem,
            len,
            device,
            track: Mutex::new(Track {
                write: allocated,
                reads: Vec::new(),
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (never, for an allocated buffer).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Number of `T` elements the buffer holds; fails if the length is not a multiple of
    /// `size_of::<T>()`.
    pub fn len_of<T: bytemuck::Pod>(&self) -> Result<usize> {
        let size = std::mem::size_of::<T>();
        if size == 0 || self.len % size != 0 {
            return Err(TransferError::Invalid(format!(
                "a {}-byte device buffer is not a whole number of {} ({size} bytes each)",
                self.len,
                std::any::type_name::<T>()
            )));
        }
        Ok(self.len / size)
    }

    /// The event after which the buffer's last write is visible, if it had one.
    pub fn ready_event(&self) -> Option<Event> {
        self.lock().write.clone()
    }

    /// The CUDA device pointer (`CUdeviceptr`), for launching your own kernels; `None` on `Cpu`.
    pub fn cuda_device_ptr(&self) -> Option<u64> {
        match &self.mem {
            DeviceMem::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            DeviceMem::Cuda(m) => Some(m.ptr),
        }
    }

    /// The address of the memory, to hand it to another library (DLPack): the CUDA device
    /// pointer, or on `Cpu` the host address of the backend's memory. Reading or writing
    /// through it is only sound once [`ready_event`](DeviceBuffer::ready_event) has completed,
    /// with no copy of this crate enqueued on the buffer meanwhile.
    pub fn raw_address(&self) -> u64 {
        match &self.mem {
            DeviceMem::Cpu(m) => m.address() as u64,
            #[cfg(feature = "cuda")]
            DeviceMem::Cuda(m) => m.ptr,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Track> {
        self.track.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `stream` wait for the uses of this buffer on other streams that a write must follow.
    pub(crate) fn before_write(&self, stream: &Stream) -> Result<()> {
        let deps: Vec<Event> = {
            let t = self.lock();
            t.write.iter().chain(t.reads.iter()).cloned().collect()
        };
        wait_foreign(stream, &deps)
    }

    /// Makes `stream` wait for the last write of this buffer if it happened on another stream.
    pub(crate) fn before_read(&self, stream: &Stream) -> Result<()> {
        let deps: Vec<Event> = self.lock().write.iter().cloned().collect();
        wait_foreign(stream, &deps)
    }

    pub(crate) fn after_write(&self, ev: &Event) {
        let mut t = self.lock();
        t.write = Some(ev.clone());
        t.reads.clear();
    }

    pub(crate) fn after_read(&self, ev: &Event) {
        let mut t = self.lock();
        t.reads
            .retain(|e| !e.is_complete() && e.stream_id() != ev.stream_id());
        t.reads.push(ev.clone());
    }
}

fn wait_foreign(stream: &Stream, deps: &[Event]) -> Result<()> {
    for e in deps {
        if e.stream_id() != stream.id() && !e.is_complete() {
            stream.wait_event(e)?;
        }
    }
    Ok(())
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.id())
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _t = std::mem::take(self.track.get_mut().unwrap_or_else(|p| p.into_inner()));
        match &mut self.mem {
            // Cpu jobs hold their own `Arc` of the memory: it outlives every queued copy.
            DeviceMem::Cpu(_) => {}
            #[cfg(feature = "cuda")]
            DeviceMem::Cuda(m) => {
                let uses: Vec<&crate::backend::cuda::CuEvent> = _t
                    .write
                    .iter()
                    .chain(_t.reads.iter())
                    .filter_map(|e| match &e.inner {
                        EventInner::Cuda(c) => Some(&**c),
                        EventInner::Cpu(_) => None,
                    })
                    .collect();
                m.free_after(&uses);
            }
        }
    }
}
