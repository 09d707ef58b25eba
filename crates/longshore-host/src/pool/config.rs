//! The pool's configuration, its budget policy, its statistics and its size classes.

use std::time::Duration;

use crate::kind::MemoryKind;
use crate::sys;
#[cfg(doc)]
use crate::{HostError, PinnedPool};

/// What the pool does when a request would take it past its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetPolicy {
    /// Block until enough bytes come back (leases dropped, fences completed), up to `timeout`.
    Wait {
        /// How long one request may wait before it fails with [`HostError::WaitTimedOut`].
        timeout: Duration,
    },
    /// Hand out an ordinary pageable buffer instead, and count it in
    /// [`PoolStats::fallbacks`]. Copies from it are slower, but nothing blocks or fails.
    FallbackPageable,
    /// Fail with [`HostError::BudgetExceeded`], naming requested, in-use, cached and budget bytes.
    Error,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        BudgetPolicy::Wait {
            timeout: Duration::from_secs(60),
        }
    }
}

/// Configuration of a [`PinnedPool`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The memory the pool allocates. Defaults to [`MemoryKind::PageLocked`] when a CUDA driver
    /// is available and [`MemoryKind::Pageable`] otherwise.
    pub kind: MemoryKind,
    /// Most bytes the pool may hold from its allocator (in use + cached + awaiting fences).
    /// Defaults to a quarter of physical RAM, and never more than `RLIMIT_MEMLOCK` for
    /// [`MemoryKind::Locked`].
    pub budget: usize,
    /// What to do when the budget is reached.
    pub policy: BudgetPolicy,
    /// Most bytes kept in the free lists; past it, least recently used blocks are freed.
    /// Defaults to the budget.
    pub max_cached_bytes: usize,
    /// With [`MemoryKind::PageLocked`], blocks of at least this size are allocated pageable,
    /// pre-faulted by several threads and registered (`cuMemHostRegister`) instead, which is
    /// several times faster for large blocks. `None` disables it.
    pub register_above: Option<usize>,
    /// The NUMA node blocks are allocated on (`MPOL_PREFERRED` around each allocation), or
    /// `None` (the default) for wherever the kernel puts them. Ignored on hosts with one node.
    pub numa_node: Option<usize>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        let kind = if crate::driver_available() {
            MemoryKind::PageLocked
        } else {
            MemoryKind::Pageable
        };
        Self::for_kind(kind)
    }
}

impl PoolConfig {
    /// The default configuration for a pool of `kind`.
    pub fn for_kind(kind: MemoryKind) -> Self {
        let ram = sys::physical_memory().unwrap_or(8 << 30);
        let mut budget = ram / 4;
        if kind == MemoryKind::Locked
            && let Some(limit) = sys::memlock_limit()
        {
            budget = budget.min(limit);
        }
        Self {
            kind,
            budget,
            policy: BudgetPolicy::default(),
            max_cached_bytes: budget,
            register_above: Some(32 << 20),
            numa_node: None,
        }
    }

    /// Sets the budget (and caps the cache at it).
    pub fn budget(mut self, bytes: usize) -> Self {
        self.budget = bytes;
        self.max_cached_bytes = self.max_cached_bytes.min(bytes);
        self
    }

    /// Sets the policy.
    pub fn policy(mut self, policy: BudgetPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the cache cap.
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// Sets the NUMA node blocks are allocated on (see [`PoolConfig::numa_node`]).
    pub fn numa_node(mut self, node: Option<usize>) -> Self {
        self.numa_node = node;
        self
    }

    /// Sets or disables the registration fast path.
    pub fn register_above(mut self, bytes: Option<usize>) -> Self {
        self.register_above = bytes;
        self
    }
}

/// Counters of a [`PinnedPool`], like PyTorch's `host_memory_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes of blocks leased out now.
    pub bytes_in_use: usize,
    /// Bytes of blocks in the free lists, ready for reuse.
    pub bytes_cached: usize,
    /// Bytes of freed blocks whose fences have not all completed.
    pub bytes_pending: usize,
    /// Bytes held from the allocator: in use + cached + pending (+ allocations in progress).
    pub bytes_held: usize,
    /// Highest `bytes_held` seen.
    pub peak_bytes_held: usize,
    /// Highest `bytes_in_use` seen.
    pub peak_bytes_in_use: usize,
    /// The budget.
    pub budget: usize,
    /// Leases served from the cache.
    pub hits: u64,
    /// Leases that needed a new allocation.
    pub misses: u64,
    /// Allocations made through the allocator (driver calls).
    pub allocations: u64,
    /// Total time spent in the allocator.
    pub allocation_time: Duration,
    /// Longest single allocation.
    pub allocation_time_max: Duration,
    /// Blocks given back to the allocator (evictions, trims, `empty_cache`).
    pub frees: u64,
    /// Pageable buffers handed out under [`BudgetPolicy::FallbackPageable`].
    pub fallbacks: u64,
    /// Bytes of those pageable buffers.
    pub fallback_bytes: u64,
    /// Requests that had to wait under [`BudgetPolicy::Wait`].
    pub waits: u64,
    /// Total time requests spent waiting.
    pub wait_time: Duration,
    /// Blocks leased out now.
    pub blocks_in_use: usize,
    /// Blocks cached now.
    pub blocks_cached: usize,
    /// Blocks awaiting fences now.
    pub blocks_pending: usize,
    /// Requests blocked under [`BudgetPolicy::Wait`] right now (a gauge): a consumer holding
    /// leases can tell that someone is starved of budget.
    pub waiting: usize,
}

/// The size class a request of `len` bytes rounds up to.
///
/// Four classes per power of two (at most 25% waste) with a granularity of at least one page.
/// `None` for zero or absurd sizes.
pub fn size_class(len: usize) -> Option<usize> {
    if len == 0 || len > isize::MAX as usize / 4 {
        return None;
    }
    let page = sys::page_size();
    let len = len.max(page);
    let pow = 1usize << (usize::BITS - 1 - len.leading_zeros());
    let step = (pow / 4).max(page);
    sys::round_up(len, step)
}
