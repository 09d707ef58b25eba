//! [`PoolBuffer`]: a lease of one pool block (or a pageable fallback), returned on drop.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::PinnedPool;
use super::{Block, Inner};
use crate::HostBuffer;
use crate::buffer::view_error;
use crate::error::{HostError, Result};
use crate::fence::SharedFence;
use crate::kind::MemoryKind;

pub(super) enum Slot {
    Block(Block),
    Fallback(HostBuffer),
    Gone,
}

/// A buffer leased from a [`PinnedPool`]; goes back to the pool when dropped.
///
/// If fences were recorded on it (copies in flight), the block waits in the pool's pending
/// list and is handed out again only once every one of them has completed.
pub struct PoolBuffer {
    pub(super) slot: Slot,
    pub(super) len: usize,
    pub(super) fences: Vec<SharedFence>,
    pub(super) pool: Option<Arc<Inner>>,
    /// How long the request waited for the budget.
    pub(super) waited: Duration,
}

impl PoolBuffer {
    fn buf(&self) -> &HostBuffer {
        match &self.slot {
            Slot::Block(b) => &b.buf,
            Slot::Fallback(b) => b,
            Slot::Gone => unreachable!("slot is only emptied in drop"),
        }
    }

    fn buf_mut(&mut self) -> &mut HostBuffer {
        match &mut self.slot {
            Slot::Block(b) => &mut b.buf,
            Slot::Fallback(b) => b,
            Slot::Gone => unreachable!("slot is only emptied in drop"),
        }
    }

    /// The memory file of the block and its id, when the pool allocates shared memory
    /// ([`SharedAllocator`](crate::SharedAllocator)); `None` for other pools and for a budget
    /// fallback. See [`HostBuffer::shared_fd`].
    pub fn shared_fd(&self) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        self.buf().shared_fd()
    }

    /// The kind of memory: the pool's, or [`MemoryKind::Pageable`] for a budget fallback.
    pub fn kind(&self) -> MemoryKind {
        self.buf().kind()
    }

    /// How long the request for this lease waited for the budget under
    /// [`BudgetPolicy::Wait`](super::BudgetPolicy::Wait) (zero when it was served at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether this lease is a pageable fallback handed out because the budget was reached.
    pub fn is_fallback(&self) -> bool {
        matches!(self.slot, Slot::Fallback(_))
    }

    /// Visible length in bytes (what was requested).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the visible length is zero (never, for a lease).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the underlying block (the size class).
    pub fn capacity(&self) -> usize {
        match &self.slot {
            Slot::Block(b) => b.class,
            _ => self.buf().capacity(),
        }
    }

    /// Changes the visible length, up to [`capacity`](PoolBuffer::capacity).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(HostError::InvalidLayout {
                bytes: len,
                align: 1,
                reason: "length exceeds the lease's capacity",
            });
        }
        self.len = len;
        Ok(())
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.buf().as_ptr()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf().as_bytes()[..self.len]
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf_mut().as_bytes_mut()[..len]
    }

    /// A typed view, checked for size and alignment.
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        let b = self.as_bytes();
        bytemuck::try_cast_slice(b).map_err(|e| view_error::<T>(b.as_ptr() as usize, b.len(), e))
    }

    /// A typed, writable view, checked for size and alignment.
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
        let b = self.as_bytes_mut();
        let (addr, len) = (b.as_ptr() as usize, b.len());
        bytemuck::try_cast_slice_mut(b).map_err(|e| view_error::<T>(addr, len, e))
    }

    /// Records that a device operation may use this memory until `fence` completes; the block
    /// is not reused (or a fallback buffer freed) before then.
    pub fn record_fence(&mut self, fence: SharedFence) {
        self.fences.retain(|f| !f.is_complete());
        self.fences.push(fence);
    }

    /// Whether every recorded fence has completed.
    pub fn is_idle(&self) -> bool {
        self.fences.iter().all(|f| f.is_complete())
    }
}

impl std::ops::Deref for PoolBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::ops::DerefMut for PoolBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

impl AsRef<[u8]> for PoolBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsMut<[u8]> for PoolBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

impl fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("kind", &self.kind())
            .field("fallback", &self.is_fallback())
            .field(
                "pending_fences",
                &self.fences.iter().filter(|f| !f.is_complete()).count(),
            )
            .finish()
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        let fences = std::mem::take(&mut self.fences);
        match std::mem::replace(&mut self.slot, Slot::Gone) {
            Slot::Block(block) => {
                if let Some(pool) = self.pool.take() {
                    pool.release(block, fences);
                }
            }
            Slot::Fallback(mut buf) => {
                // The pageable buffer is freed by HostBuffer's drop, which waits for fences.
                for f in fences {
                    buf.record_fence(f);
                }
            }
            Slot::Gone => {}
        }
    }
}
