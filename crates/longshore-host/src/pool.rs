//! [`PinnedPool`]: a caching allocator of page-locked blocks with event-deferred reuse and a
//! memory budget.
//!
//! Compared with PyTorch's `CachingHostAllocator`:
//!
//! * **size classes** are four per power of two (at most 25% rounding waste from four pages
//!   up; below that the granularity is one page), not power-of-two buckets that waste up
//!   to half of every block;
//! * **reuse is deferred per block**: a freed block whose fences are pending waits in a
//!   pending list and each block is checked on its own, so one slow copy never holds back the
//!   reuse of others (PyTorch processes its event queue in order);
//! * **a budget** bounds the page-locked bytes the pool holds (in use + cached + pending), with
//!   a [`BudgetPolicy`] when it is reached, and the cache is trimmed least-recently-used first,
//!   so pinned memory never grows without bound (pytorch#97432, #150517);
//! * the hit path is a mutex, a map lookup and a `Vec::pop`; driver calls (allocation, freeing,
//!   fence queries) are never made while the lock is held.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::alloc::{RawAllocator, RegisteredAllocator, allocator_for};
use crate::buffer::view_error;
use crate::error::{HostError, Result};
use crate::fence::SharedFence;
use crate::kind::MemoryKind;
use crate::{HostBuffer, sys};

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
        if kind == MemoryKind::Locked {
            if let Some(limit) = sys::memlock_limit() {
                budget = budget.min(limit);
            }
        }
        Self {
            kind,
            budget,
            policy: BudgetPolicy::default(),
            max_cached_bytes: budget,
            register_above: Some(32 << 20),
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

struct Block {
    buf: HostBuffer,
    class: usize,
    /// Tick of the last release, for least-recently-used eviction.
    tick: u64,
}

struct Pending {
    /// Identifies the entry across a reclaim that queries fences without the lock.
    id: u64,
    block: Block,
    fences: Vec<SharedFence>,
}

#[derive(Default)]
struct State {
    free: BTreeMap<usize, Vec<Block>>,
    pending: Vec<Pending>,
    reserved: usize,
    tick: u64,
    next_pending: u64,
    stats: PoolStats,
}

impl State {
    fn held(&self) -> usize {
        self.stats.bytes_in_use + self.stats.bytes_cached + self.stats.bytes_pending + self.reserved
    }

    fn note_peaks(&mut self) {
        let held = self.held();
        let s = &mut self.stats;
        s.peak_bytes_held = s.peak_bytes_held.max(held);
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
    }

    fn take_free(&mut self, class: usize) -> Option<Block> {
        let list = self.free.get_mut(&class)?;
        let block = list.pop()?;
        self.stats.bytes_cached -= class;
        self.stats.blocks_cached -= 1;
        Some(block)
    }

    fn put_free(&mut self, mut block: Block) {
        self.tick += 1;
        block.tick = self.tick;
        self.stats.bytes_cached += block.class;
        self.stats.blocks_cached += 1;
        self.free.entry(block.class).or_default().push(block);
    }

    /// Removes least-recently-used cached blocks until `bytes` have been taken (or none is
    /// left); the caller frees them after unlocking.
    fn evict_lru(&mut self, bytes: usize, out: &mut Vec<Block>) {
        let mut taken = 0;
        while taken < bytes {
            // The oldest block of each class is at the bottom of its LIFO list.
            let Some((&class, _)) = self
                .free
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .min_by_key(|(_, v)| v[0].tick)
            else {
                break;
            };
            let list = self.free.get_mut(&class).expect("class present");
            let block = list.remove(0);
            if list.is_empty() {
                self.free.remove(&class);
            }
            self.stats.bytes_cached -= class;
            self.stats.blocks_cached -= 1;
            self.stats.frees += 1;
            taken += class;
            out.push(block);
        }
    }
}

struct Inner {
    config: PoolConfig,
    allocator: Arc<dyn RawAllocator>,
    large: Option<Arc<dyn RawAllocator>>,
    state: Mutex<State>,
    returned: Condvar,
}

impl Drop for Inner {
    /// The last handle and lease are gone, but a copy from a released block may still be in
    /// flight: a pending block is freed only once its fences have completed (the same rule as
    /// [`HostBuffer`]'s drop), never under a DMA or a `Cpu` stream still reading it.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in st.pending.drain(..) {
            for f in &p.fences {
                f.wait();
            }
            drop(p.block);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves pending blocks whose fences have all completed to the free lists.
    ///
    /// Fences are queried without the lock held (a `cuEventQuery` each), but the pending
    /// blocks stay in the list meanwhile: a thread that finds the list empty while another is
    /// querying would otherwise see the budget full of blocks it cannot reach, and fall back or
    /// fail for nothing. Whoever relocks first moves a completed block; by the time any call
    /// returns, every block whose fences it saw complete is in the free lists (or leased).
    fn reclaim(&self) -> usize {
        let checks: Vec<(u64, Vec<SharedFence>)> = {
            let st = self.lock();
            if st.pending.is_empty() {
                return 0;
            }
            st.pending
                .iter()
                .map(|p| (p.id, p.fences.clone()))
                .collect()
        };
        let mut done: Vec<u64> = checks
            .into_iter()
            .filter(|(_, fences)| fences.iter().all(|f| f.is_complete()))
            .map(|(id, _)| id)
            .collect();
        if done.is_empty() {
            return 0;
        }
        done.sort_unstable();
        let mut n = 0;
        let mut st = self.lock();
        let mut i = 0;
        while i < st.pending.len() {
            if done.binary_search(&st.pending[i].id).is_ok() {
                let p = st.pending.swap_remove(i);
                st.stats.bytes_pending -= p.block.class;
                st.stats.blocks_pending -= 1;
                st.put_free(p.block);
                n += 1;
            } else {
                i += 1;
            }
        }
        drop(st);
        if n > 0 {
            self.returned.notify_all();
        }
        n
    }

    fn allocator_for(&self, class: usize) -> &Arc<dyn RawAllocator> {
        match (&self.large, self.config.register_above) {
            (Some(large), Some(t)) if class >= t => large,
            _ => &self.allocator,
        }
    }

    fn release(&self, block: Block, mut fences: Vec<SharedFence>) {
        fences.retain(|f| !f.is_complete());
        let mut evicted = Vec::new();
        {
            let mut st = self.lock();
            st.stats.bytes_in_use -= block.class;
            st.stats.blocks_in_use -= 1;
            if fences.is_empty() {
                st.put_free(block);
            } else {
                st.stats.bytes_pending += block.class;
                st.stats.blocks_pending += 1;
                st.next_pending += 1;
                let id = st.next_pending;
                st.pending.push(Pending { id, block, fences });
            }
            let cap = self.config.max_cached_bytes;
            if st.stats.bytes_cached > cap {
                let over = st.stats.bytes_cached - cap;
                st.evict_lru(over, &mut evicted);
            }
        }
        self.returned.notify_all();
        free_blocks(evicted);
    }
}

fn free_blocks(blocks: Vec<Block>) {
    if !blocks.is_empty() {
        let bytes: usize = blocks.iter().map(|b| b.class).sum();
        tracing::debug!(target: "longshore::host", blocks = blocks.len(), bytes, "pool freed cached blocks");
    }
    drop(blocks);
}

/// A caching pool of page-locked host blocks, shared by cloning (an `Arc` inside).
///
/// ```
/// use longshore_host::{CpuFence, MemoryKind, PinnedPool, PoolConfig};
///
/// // A pageable pool runs everywhere; with a CUDA driver the default is page-locked.
/// let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(64 << 20))?;
/// let mut batch = pool.alloc(1 << 20)?;
/// batch.as_bytes_mut().fill(7);
///
/// // A copy from the lease is in flight until this fence completes...
/// let copy_done = CpuFence::new();
/// batch.record_fence(copy_done.clone());
/// drop(batch); // ...so the block waits in the pending list, not the free list.
/// assert_eq!(pool.stats().bytes_pending, 1 << 20);
///
/// copy_done.signal();
/// let again = pool.alloc(1 << 20)?; // now it is reused
/// assert_eq!(pool.stats().hits, 1);
/// # drop(again);
/// # Ok::<(), longshore_host::HostError>(())
/// ```
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<Inner>,
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl PinnedPool {
    /// A pool allocating `config.kind` with that kind's default allocator.
    pub fn new(config: PoolConfig) -> Result<Self> {
        let allocator: Arc<dyn RawAllocator> = Arc::from(allocator_for(config.kind));
        Self::with_allocator(allocator, config)
    }

    /// A pool drawing from a given allocator (whose kind overrides `config.kind`).
    pub fn with_allocator(
        allocator: Arc<dyn RawAllocator>,
        mut config: PoolConfig,
    ) -> Result<Self> {
        if config.budget == 0 {
            return Err(HostError::Config("budget must be greater than zero".into()));
        }
        config.kind = allocator.kind();
        let large: Option<Arc<dyn RawAllocator>> = match (config.kind, config.register_above) {
            (MemoryKind::PageLocked, Some(_)) => Some(Arc::new(RegisteredAllocator::default())),
            _ => None,
        };
        let state = State {
            stats: PoolStats {
                budget: config.budget,
                ..PoolStats::default()
            },
            ..State::default()
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                allocator,
                large,
                state: Mutex::new(state),
                returned: Condvar::new(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// The memory kind of the pool's blocks.
    pub fn kind(&self) -> MemoryKind {
        self.inner.config.kind
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.inner.lock();
        let mut s = st.stats.clone();
        s.bytes_held = st.held();
        s
    }

    /// Leases a buffer of at least `len` bytes (exactly `len` visible).
    ///
    /// Served from the cache when a block of the size class is free (the hot path: no driver
    /// call); otherwise allocated, within the budget, following the pool's [`BudgetPolicy`].
    pub fn alloc(&self, len: usize) -> Result<PoolBuffer> {
        let inner = &self.inner;
        let class = self.class_of(len)?;
        let budget = inner.config.budget;
        if class > budget {
            if inner.config.policy == BudgetPolicy::FallbackPageable {
                return self.fallback(len);
            }
            return Err(HostError::LargerThanBudget {
                requested: len,
                block: class,
                budget,
            });
        }
        let start = Instant::now();
        let mut waited = false;
        loop {
            // Hot path: a cached block of this class.
            let mut st = inner.lock();
            if let Some(block) = st.take_free(class) {
                return Ok(self.lease(st, block, len, true, waited.then(|| start.elapsed())));
            }
            // Counts blocks put in the free lists; tells below whether any came back meanwhile.
            let returned_before = st.tick;
            if !st.pending.is_empty() {
                drop(st);
                inner.reclaim();
                st = inner.lock();
                if let Some(block) = st.take_free(class) {
                    return Ok(self.lease(st, block, len, true, waited.then(|| start.elapsed())));
                }
            }
            // Room in the budget: allocate outside the lock.
            if st.held() + class <= budget {
                st.reserved += class;
                st.note_peaks();
                drop(st);
                let alloc = inner.allocator_for(class);
                let t0 = Instant::now();
                let result = alloc.allocate(class);
                let took = t0.elapsed();
                let mut st = inner.lock();
                st.reserved -= class;
                return match result {
                    Ok(mut buf) => {
                        // The visible length of a block is its class; leases narrow it.
                        let _ = buf.set_len(class);
                        st.stats.allocations += 1;
                        st.stats.allocation_time += took;
                        st.stats.allocation_time_max = st.stats.allocation_time_max.max(took);
                        tracing::debug!(target: "longshore::host", bytes = class, kind = %alloc.kind(), took_us = took.as_micros() as u64, "pool allocated a block");
                        let block = Block {
                            buf,
                            class,
                            tick: 0,
                        };
                        Ok(self.lease(st, block, len, false, waited.then(|| start.elapsed())))
                    }
                    Err(e) => {
                        drop(st);
                        inner.returned.notify_all();
                        Err(e)
                    }
                };
            }
            // Over budget: free cached blocks of other classes if that makes room.
            let need = st.held() + class - budget;
            if st.stats.bytes_cached >= need {
                let mut evicted = Vec::new();
                st.evict_lru(need, &mut evicted);
                drop(st);
                free_blocks(evicted);
                continue;
            }
            // Blocks came back during this attempt but other threads leased them first: look
            // again rather than fail or fall back while the pool is still turning over.
            if st.tick != returned_before {
                continue;
            }
            match inner.config.policy {
                BudgetPolicy::Error => {
                    return Err(HostError::BudgetExceeded {
                        requested: len,
                        block: class,
                        in_use: st.stats.bytes_in_use,
                        cached: st.stats.bytes_cached,
                        pending: st.stats.bytes_pending,
                        budget,
                    });
                }
                BudgetPolicy::FallbackPageable => {
                    drop(st);
                    return self.fallback(len);
                }
                BudgetPolicy::Wait { timeout } => {
                    let elapsed = start.elapsed();
                    if elapsed >= timeout {
                        return Err(HostError::WaitTimedOut {
                            waited: elapsed,
                            block: class,
                            in_use: st.stats.bytes_in_use,
                            budget,
                        });
                    }
                    if !waited {
                        waited = true;
                        st.stats.waits += 1;
                    }
                    // Device fences do not notify us: poll them often while some are pending.
                    let slice = if st.pending.is_empty() {
                        timeout - elapsed
                    } else {
                        Duration::from_micros(500)
                    };
                    st.stats.waiting += 1;
                    let (mut st, _) = inner
                        .returned
                        .wait_timeout(st, slice.min(timeout - elapsed))
                        .unwrap_or_else(|p| p.into_inner());
                    st.stats.waiting -= 1;
                    drop(st);
                }
            }
        }
    }

    /// The size class serving `len` bytes, or the error naming why there is none.
    fn class_of(&self, len: usize) -> Result<usize> {
        size_class(len).ok_or(if len == 0 {
            HostError::ZeroSize {
                kind: self.inner.config.kind,
            }
        } else {
            HostError::InvalidLayout {
                bytes: len,
                align: sys::page_size(),
                reason: "larger than the address space allows",
            }
        })
    }

    /// Allocates ahead of need so that at least `count` blocks of `len`'s size class are
    /// cached: the first `count` leases of that size then make no driver call (a
    /// `cuMemHostAlloc` of a few MiB costs milliseconds).
    ///
    /// Stays within the budget and [`max_cached_bytes`](PoolConfig::max_cached_bytes), and
    /// never waits, evicts or falls back to pageable memory: it returns how many blocks of the
    /// class are cached afterwards, fewer than `count` where a limit stopped it.
    ///
    /// ```
    /// # use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
    /// let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(8 << 20))?;
    /// assert_eq!(pool.reserve(1 << 20, 4)?, 4);
    /// let lease = pool.alloc(1 << 20)?; // served from the cache
    /// assert_eq!(pool.stats().hits, 1);
    /// # drop(lease);
    /// # Ok::<(), longshore_host::HostError>(())
    /// ```
    pub fn reserve(&self, len: usize, count: usize) -> Result<usize> {
        let inner = &self.inner;
        let class = self.class_of(len)?;
        loop {
            let mut st = inner.lock();
            let cached = st.free.get(&class).map_or(0, Vec::len);
            if cached >= count
                || st.held() + class > inner.config.budget
                || st.stats.bytes_cached + class > inner.config.max_cached_bytes
            {
                return Ok(cached);
            }
            st.reserved += class;
            st.note_peaks();
            drop(st);
            let alloc = inner.allocator_for(class);
            let t0 = Instant::now();
            let result = alloc.allocate(class);
            let took = t0.elapsed();
            let mut st = inner.lock();
            st.reserved -= class;
            let mut buf = match result {
                Ok(buf) => buf,
                Err(e) => {
                    drop(st);
                    inner.returned.notify_all();
                    return Err(e);
                }
            };
            let _ = buf.set_len(class);
            st.stats.allocations += 1;
            st.stats.allocation_time += took;
            st.stats.allocation_time_max = st.stats.allocation_time_max.max(took);
            tracing::debug!(target: "longshore::host", bytes = class, kind = %alloc.kind(), took_us = took.as_micros() as u64, "pool reserved a block");
            st.put_free(Block {
                buf,
                class,
                tick: 0,
            });
            drop(st);
            inner.returned.notify_all();
        }
    }

    fn lease(
        &self,
        mut st: MutexGuard<'_, State>,
        block: Block,
        len: usize,
        hit: bool,
        waited: Option<Duration>,
    ) -> PoolBuffer {
        st.stats.bytes_in_use += block.class;
        st.stats.blocks_in_use += 1;
        if hit {
            st.stats.hits += 1;
        } else {
            st.stats.misses += 1;
        }
        if let Some(w) = waited {
            st.stats.wait_time += w;
        }
        st.note_peaks();
        drop(st);
        PoolBuffer {
            slot: Slot::Block(block),
            len,
            fences: Vec::new(),
            pool: Some(self.inner.clone()),
        }
    }

    fn fallback(&self, len: usize) -> Result<PoolBuffer> {
        let buf = HostBuffer::pageable(len)?;
        {
            let mut st = self.inner.lock();
            st.stats.fallbacks += 1;
            st.stats.fallback_bytes += len as u64;
        }
        tracing::warn!(target: "longshore::host", bytes = len, "pinned budget reached: handing out pageable memory");
        Ok(PoolBuffer {
            slot: Slot::Fallback(buf),
            len,
            fences: Vec::new(),
            pool: None,
        })
    }

    /// Moves freed blocks whose fences have completed back to the free lists; returns how many.
    pub fn collect(&self) -> usize {
        self.inner.reclaim()
    }

    /// Frees every cached block (after collecting completed pending ones). Leased and pending
    /// blocks are untouched.
    pub fn empty_cache(&self) {
        self.trim_to(0)
    }

    /// Frees least-recently-used cached blocks until at most `bytes` are cached.
    pub fn trim_to(&self, bytes: usize) {
        self.inner.reclaim();
        let mut evicted = Vec::new();
        {
            let mut st = self.inner.lock();
            if st.stats.bytes_cached > bytes {
                let over = st.stats.bytes_cached - bytes;
                st.evict_lru(over, &mut evicted);
            }
        }
        self.inner.returned.notify_all();
        free_blocks(evicted);
    }
}

enum Slot {
    Block(Block),
    Fallback(HostBuffer),
    Gone,
}

/// A buffer leased from a [`PinnedPool`]; goes back to the pool when dropped.
///
/// If fences were recorded on it (copies in flight), the block waits in the pool's pending
/// list and is handed out again only once every one of them has completed.
pub struct PoolBuffer {
    slot: Slot,
    len: usize,
    fences: Vec<SharedFence>,
    pool: Option<Arc<Inner>>,
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

    /// The kind of memory: the pool's, or [`MemoryKind::Pageable`] for a budget fallback.
    pub fn kind(&self) -> MemoryKind {
        self.buf().kind()
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
