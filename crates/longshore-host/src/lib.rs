//! Host memory for longshore: buffers that know whether they are pageable or page-locked, and a
//! caching pool of page-locked blocks with event-deferred reuse and a memory budget.
//!
//! ```
//! use longshore_host::{BudgetPolicy, MemoryKind, PinnedPool, PoolConfig};
//!
//! // Page-locked when a CUDA driver is present, pageable otherwise.
//! let kind = if longshore_host::driver_available() { MemoryKind::PageLocked } else { MemoryKind::Pageable };
//! let pool = PinnedPool::new(
//!     PoolConfig::for_kind(kind).budget(256 << 20).policy(BudgetPolicy::FallbackPageable),
//! )?;
//! let mut batch = pool.alloc(3 * 224 * 224 * 4)?;
//! batch.as_mut_slice::<f32>()?.fill(0.5);
//! drop(batch); // back to the pool's free list
//! let again = pool.alloc(3 * 224 * 224 * 4)?; // a cache hit: no driver call
//! assert_eq!(pool.stats().hits, 1);
//! # drop(again);
//! # Ok::<(), longshore_host::HostError>(())
//! ```
//!
//! # Map
//!
//! * [`HostBuffer`]: owned, page-aligned, zeroed memory with a [`MemoryKind`] and typed views.
//! * [`SharedAllocator`]: memory files another process maps (worker processes of Python
//!   datasets), pinned or not.
//! * [`RawAllocator`] and one allocator per kind: [`PageableAllocator`],
//!   [`PageLockedAllocator`] (`cuMemHostAlloc`), [`RegisteredAllocator`] (`cuMemHostRegister`),
//!   [`LockedAllocator`] (`mlock`).
//! * [`PinnedPool`], [`PoolConfig`], [`BudgetPolicy`], [`PoolStats`], [`PoolBuffer`] (a lease).
//! * [`Fence`]: what the pool waits on before reusing a block; [`CpuFence`] is signalled by host code.
//! * [`HostMemory`]: what the transfer layer needs of any of these buffers.
//! * Placement: [`CpuSet`] (the kernel's `0-7,16-23` lists), [`thread`] (a thread's CPU
//!   affinity, scheduling policy and nice value), [`numa`] (memory nodes; a pool's blocks on
//!   the node of its GPU, [`PinnedPool::set_numa_node`]).
//!
//! The CUDA driver is loaded at run time (feature `cuda`, on by default): on a host without
//! one, page-locked allocations return [`HostError::CudaUnavailable`] and everything else works.

mod alloc;
mod buffer;
mod cpuset;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod fence;
mod kind;
mod memory;
pub mod numa;
mod pool;
pub mod sys;
pub mod thread;

pub use alloc::{
    LockedAllocator, PageLockedAllocator, PageableAllocator, RawAllocator, RegisteredAllocator,
    SharedAllocator,
};
pub use buffer::HostBuffer;
pub use cpuset::{CpuListError, CpuSet};
#[cfg(feature = "cuda")]
pub use cuda::{driver_status, is_driver_host_memory};
pub use error::{HostError, Result};
pub use fence::{CpuFence, Fence, SharedFence};
pub use kind::{MemoryKind, PageLockedFlags};
pub use memory::HostMemory;
pub use pool::{
    BudgetPolicy, GrantRecord, PinnedPool, PoolBuffer, PoolConfig, PoolStats, UNRANKED, size_class,
};

/// Whether a CUDA driver can be loaded and initialised here (always `false` without the
/// `cuda` feature). Never panics.
pub fn driver_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        cuda::driver_available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Why no CUDA driver can be used, or `None` if one can.
pub fn driver_unavailable_reason() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        cuda::driver_status().err().map(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some("built without the `cuda` feature".to_owned())
    }
}
