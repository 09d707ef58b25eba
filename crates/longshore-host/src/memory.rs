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
///
/// # Safety
///
/// The transfer layer hands the address of these bytes to a device copy that runs after the
/// call returns, while the value may be moved. Implementors guarantee:
///
/// * while the transfer layer holds the value, [`as_bytes`](HostMemory::as_bytes) and
///   [`as_bytes_mut`](HostMemory::as_bytes_mut) return
///   the same address and length on every call, and that address does not change when the
///   value is moved (the bytes live on the heap or elsewhere, never inline in the value);
/// * after [`record_fence`](HostMemory::record_fence), the memory is neither freed nor handed
///   to anyone else (reused) until the fence has completed, even if the value is dropped.
pub unsafe trait HostMemory: Send + 'static {
    /// What kind of memory this is (decides the copy path).
    fn kind(&self) -> MemoryKind;
    /// The bytes.
    fn as_bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn as_bytes_mut(&mut self) -> &mut [u8];
    /// Keeps the memory from being freed or reused until `fence` completes.
    fn record_fence(&mut self, fence: SharedFence);

    /// Whether dropping this value while a recorded fence is still pending is free: the drop
    /// neither blocks nor frees memory the device may still use, because the memory itself
    /// waits for its fences (a pool block waits in its pool's pending list). A copy can then
    /// release its source at once instead of keeping it until the copy completes. The default
    /// is `false` (a [`HostBuffer`]'s drop blocks on its fences).
    fn drop_defers_reuse(&self) -> bool {
        false
    }
}

// SAFETY: a HostBuffer owns a heap allocation whose address and length never change, and
// its `Drop` waits for every recorded fence before freeing it.
unsafe impl HostMemory for HostBuffer {
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

// SAFETY: a lease's block is a HostBuffer (stable heap memory) owned by the lease; on drop it
// goes to the pool's pending list and is not handed out again until its fences complete (a
// pageable fallback buffer is freed by HostBuffer's drop, which waits for the fences).
unsafe impl HostMemory for PoolBuffer {
    fn drop_defers_reuse(&self) -> bool {
        !self.is_fallback()
    }
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
