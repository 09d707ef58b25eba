//! [`HostMemory`]: what the transfer layer needs from any host buffer.

use crate::fence::SharedFence;
use crate::kind::MemoryKind;
use crate::{HostBuffer, PoolBuffer};

/// Host memory that a device copy can read from or write into.
///
/// Implemented by [`HostBuffer`] and by pool leases ([`PoolBuffer`]). The transfer layer
/// records the fence of every copy it enqueues on the memory, and the memory then refuses to
/// be freed or reused until that fence completes: a `HostBuffer` waits in `drop`, a pool
/// lease goes back to the pool's pending list and is reused only once its fences complete.
pub trait HostMemory: Send + 'static {
    /// What kind of memory this is (decides the copy path).
    fn kind(&self) -> MemoryKind;
    /// The bytes.
    fn as_bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn as_bytes_mut(&mut self) -> &mut [u8];
    /// Keeps the memory from being freed or reused until `fence` completes.
    fn record_fence(&mut self, fence: SharedFence);
}

impl HostMemory for HostBuffer {
    fn kind(&self) -> MemoryKind {
        HostBuffer::kind(self)
    }
    fn as_bytes(&self) -> &[u8] {
        HostBuffer::as_bytes(self)
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        HostBuffer::as_bytes_mut(self)
    }
    fn record_fence(&mut self, fence: SharedFence) {
        HostBuffer::record_fence(self, fence)
    }
}

impl HostMemory for PoolBuffer {
    fn kind(&self) -> MemoryKind {
        PoolBuffer::kind(self)
    }
    fn as_bytes(&self) -> &[u8] {
        PoolBuffer::as_bytes(self)
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        PoolBuffer::as_bytes_mut(self)
    }
    fn record_fence(&mut self, fence: SharedFence) {
        PoolBuffer::record_fence(self, fence)
    }
}
