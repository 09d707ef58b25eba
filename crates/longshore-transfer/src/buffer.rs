//! [`DeviceBuffer`]: memory on a device, reached only through stream-ordered work.
//!
//! The buffer keeps the events of its last write and the reads since; it says which of them a
//! new use on a stream must wait for ([`DeviceBuffer::write_deps`], [`DeviceBuffer::read_deps`])
//! and the stream does the waiting, so this module does not know streams.

use std::fmt;
use std::sync::Mutex;

use crate::backend::cpu::CpuMemory;
use crate::backend::{EventImpl, MemImpl};
use crate::device::Device;
use crate::error::{Result, TransferError};
use crate::event::Event;

/// Which work a buffer may still be part of: what new work on another stream must wait for.
#[derive(Default)]
struct Track {
    /// The last write (copy into, fill, allocation, work that writes it).
    write: Option<Event>,
    /// Reads since that write.
    reads: Vec<Event>,
}

/// A byte buffer in a device's memory (on `Cpu`, host memory owned by the backend).
///
/// There is no direct access to the bytes, on any backend: data goes in and out through
/// [`Stream`](crate::Stream) copies, typed through `bytemuck`
/// ([`Stream::to_device`](crate::Stream::to_device),
/// [`Stream::read_to_vec`](crate::Stream::read_to_vec), [`len_of`](DeviceBuffer::len_of)).
///
/// A buffer remembers its last write and the reads since, and a copy enqueued on a stream other
/// than theirs first makes that stream wait for them (device-side, the host does not block), so
/// copies through this crate are ordered across streams. Work of your own takes part through
/// [`Stream::enqueue_work`](crate::Stream::enqueue_work); kernels you launch some other way
/// must wait for [`ready_event`](DeviceBuffer::ready_event). The memory is freed only after
/// every recorded use: stream-ordered (`cuMemFreeAsync`) on CUDA.
pub struct DeviceBuffer {
    pub(crate) mem: MemImpl,
    len: usize,
    device: Device,
    track: Mutex<Track>,
}

impl DeviceBuffer {
    pub(crate) fn new(mem: MemImpl, len: usize, device: Device) -> Self {
        Self {
            mem,
            len,
            device,
            track: Mutex::new(Track::default()),
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
        if size == 0 || !self.len.is_multiple_of(size) {
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

    /// The address of the buffer's first byte in its device's address space: the
    /// `CUdeviceptr` on CUDA, a host address on `Cpu`. With [`len`](DeviceBuffer::len) and
    /// [`device`](DeviceBuffer::device), what a kernel launch or a DLPack capsule needs.
    ///
    /// The address is stable for the buffer's lifetime. Reaching the memory through it is
    /// up to you: only from work ordered after [`ready_event`](DeviceBuffer::ready_event) and
    /// before the buffer's next use by this crate, which
    /// [`Stream::enqueue_work`](crate::Stream::enqueue_work) arranges. On `Cpu`, work of your
    /// own should use [`cpu_memory`](DeviceBuffer::cpu_memory) instead, which locks the bytes
    /// the way this crate's jobs do.
    pub fn device_ptr(&self) -> u64 {
        self.mem.addr()
    }

    /// The CUDA device pointer (`CUdeviceptr`), for launching your own kernels; `None` on `Cpu`.
    /// Same as [`device_ptr`](DeviceBuffer::device_ptr) on a CUDA buffer.
    pub fn cuda_device_ptr(&self) -> Option<u64> {
        self.mem.cuda_ptr()
    }

    /// The bytes of a buffer on the `Cpu` device, for work of your own on a `Cpu` stream's
    /// executor thread ([`Stream::enqueue_work`](crate::Stream::enqueue_work) with
    /// [`Stream::launch_host_fn`](crate::Stream::launch_host_fn)); `None` on other devices.
    /// The handle keeps the bytes alive as long as it lives.
    pub fn cpu_memory(&self) -> Option<CpuMemory> {
        self.mem.cpu().map(|m| CpuMemory(m.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Track> {
        self.track.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The uses a write on stream `stream_id` must wait for: the last write and the reads
    /// since, where they are on other streams and not complete.
    pub(crate) fn write_deps(&self, stream_id: u64) -> Vec<Event> {
        let t = self.lock();
        foreign(t.write.iter().chain(t.reads.iter()), stream_id)
    }

    /// The uses a read on stream `stream_id` must wait for: the last write, if on another
    /// stream and not complete.
    pub(crate) fn read_deps(&self, stream_id: u64) -> Vec<Event> {
        foreign(self.lock().write.iter(), stream_id)
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

fn foreign<'a>(events: impl Iterator<Item = &'a Event>, stream_id: u64) -> Vec<Event> {
    events
        .filter(|e| e.stream_id() != stream_id && !e.is_complete())
        .cloned()
        .collect()
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
        let t = std::mem::take(self.track.get_mut().unwrap_or_else(|p| p.into_inner()));
        let uses: Vec<EventImpl> = t
            .write
            .iter()
            .chain(t.reads.iter())
            .map(|e| e.inner.clone())
            .collect();
        self.mem.release(&uses);
    }
}
