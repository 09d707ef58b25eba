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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::alloc::{RawAllocator, RegisteredAllocator, allocator_for};
use crate::error::{HostError, Result};
use crate::fence::SharedFence;
use crate::kind::MemoryKind;
use crate::numa::{self, MemPolicyOps, SystemMemPolicy};
use crate::{HostBuffer, sys};

mod config;
mod lease;
mod wait;

pub use config::{BudgetPolicy, PoolConfig, PoolStats, size_class};
pub use lease::PoolBuffer;
use lease::Slot;
pub use wait::{GrantRecord, UNRANKED};
use wait::{Reaper, Waiter, wake};

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
    /// Requests queued on the budget, in (rank, arrival) order.
    waiters: Vec<Waiter>,
    next_ticket: u64,
    /// Grants recorded since [`PinnedPool::record_grants`] turned it on.
    grant_log: Option<Vec<GrantRecord>>,
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
    /// Watches pending blocks' fences while requests wait (`wait.rs`).
    reaper: Arc<Reaper>,
    /// Where new blocks are placed (see `numa.rs`).
    placement: Placement,
}

/// The NUMA node new blocks should land on, and how the memory policy is set for them.
struct Placement {
    /// The node, or `NO_NODE`.
    node: AtomicUsize,
    /// Memory nodes of the host (placement is skipped with one).
    host_nodes: usize,
    ops: Arc<dyn MemPolicyOps>,
}

const NO_NODE: usize = usize::MAX;

impl Placement {
    fn node(&self) -> Option<usize> {
        match self.node.load(Ordering::Relaxed) {
            NO_NODE => None,
            n => Some(n),
        }
    }

    /// Runs the allocation `f` on the preferred node, if one is set.
    fn allocate<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.node() {
            Some(node) => numa::with_preferred_node_using(&*self.ops, self.host_nodes, node, f),
            None => f(),
        }
    }
}

impl Drop for Inner {
    /// The last handle and lease are gone, but a copy from a released block may still be in
    /// flight: a pending block is freed only once its fences have completed (the same rule as
    /// [`HostBuffer`]'s drop), never under a DMA or a `Cpu` stream still reading it.
    fn drop(&mut self) {
        self.reaper.stop();
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
        let mut evicted = Vec::new();
        let woken = if n > 0 {
            st.dispatch(self.config.budget, &mut evicted)
        } else {
            Vec::new()
        };
        drop(st);
        wake(woken);
        free_blocks(evicted);
        n
    }

    fn allocator_for(&self, class: usize) -> &Arc<dyn RawAllocator> {
        match (&self.large, self.config.register_above) {
            (Some(large), Some(t)) if class >= t => large,
            _ => &self.allocator,
        }
    }

    fn release(self: &Arc<Self>, block: Block, mut fences: Vec<SharedFence>) {
        fences.retain(|f| !f.is_complete());
        let mut evicted = Vec::new();
        let mut watch = false;
        let woken = {
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
                watch = !st.waiters.is_empty();
            }
            // Waiters first: a block coming back goes to the best-ranked one.
            let woken = st.dispatch(self.config.budget, &mut evicted);
            let cap = self.config.max_cached_bytes;
            if st.stats.bytes_cached > cap {
                let over = st.stats.bytes_cached - cap;
                st.evict_lru(over, &mut evicted);
            }
            woken
        };
        wake(woken);
        if watch {
            self.reaper.want(self);
        }
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
    pub fn with_allocator(allocator: Arc<dyn RawAllocator>, config: PoolConfig) -> Result<Self> {
        Self::with_placement(
            allocator,
            config,
            Arc::new(SystemMemPolicy),
            numa::node_count().unwrap_or(1),
        )
    }

    /// A pool whose NUMA placement goes through `ops` on a host of `host_nodes` nodes.
    pub(crate) fn with_placement(
        allocator: Arc<dyn RawAllocator>,
        mut config: PoolConfig,
        ops: Arc<dyn MemPolicyOps>,
        host_nodes: usize,
    ) -> Result<Self> {
        if config.budget == 0 {
            return Err(HostError::Config("budget must be greater than zero".into()));
        }
        config.kind = allocator.kind();
        let large: Option<Arc<dyn RawAllocator>> = match (config.kind, config.register_above) {
            (MemoryKind::PageLocked, Some(_)) => Some(Arc::new(RegisteredAllocator::default())),
            _ => None,
        };
        let node = config.numa_node.unwrap_or(NO_NODE);
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
                reaper: Arc::default(),
                placement: Placement {
                    node: AtomicUsize::new(node),
                    host_nodes,
                    ops,
                },
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// The NUMA node new blocks are placed on, if any (see [`set_numa_node`](PinnedPool::set_numa_node)).
    pub fn numa_node(&self) -> Option<usize> {
        self.inner.placement.node()
    }

    /// Places the blocks allocated from now on on NUMA node `node` (`None`: where the kernel
    /// chooses, usually the allocating thread's node), by setting the allocating thread's
    /// memory policy to `MPOL_PREFERRED` around each allocation (see [`numa`](crate::numa)).
    /// Cached blocks stay where they are. Nothing is called on a host with one node.
    ///
    /// A loader delivering to a GPU sets this to the GPU's node on the pool it made itself.
    pub fn set_numa_node(&self, node: Option<usize>) {
        self.inner
            .placement
            .node
            .store(node.unwrap_or(NO_NODE), Ordering::Relaxed);
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
    /// Under [`BudgetPolicy::Wait`] it queues behind every ranked request
    /// ([`alloc_ranked`](PinnedPool::alloc_ranked)).
    pub fn alloc(&self, len: usize) -> Result<PoolBuffer> {
        self.alloc_ranked(len, UNRANKED)
    }

    /// Leases a buffer like [`alloc`](PinnedPool::alloc), ranked `rank` among requests that
    /// wait for the budget under [`BudgetPolicy::Wait`]: a block coming back (a lease dropped,
    /// a pending block's fences completed) goes to the waiting request of the lowest rank
    /// (equal ranks in arrival order), and only that request is woken; a request never takes a
    /// block while a better-ranked one waits. A data loader ranks each batch by its place in
    /// the delivery order, so the batch needed next is never starved by later ones.
    ///
    /// ```
    /// # use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
    /// let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable).budget(1 << 20))?;
    /// let first = pool.alloc_ranked(1 << 20, 0)?; // the whole budget
    /// # drop(first);
    /// # Ok::<(), longshore_host::HostError>(())
    /// ```
    pub fn alloc_ranked(&self, len: usize, rank: u64) -> Result<PoolBuffer> {
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
        if let BudgetPolicy::Wait { timeout } = inner.config.policy {
            return self.alloc_waiting(len, class, rank, timeout);
        }
        loop {
            // Hot path: a cached block of this class.
            let mut st = inner.lock();
            if let Some(block) = st.take_free(class) {
                return Ok(self.lease(st, block, len, true, None));
            }
            // Counts blocks put in the free lists; tells below whether any came back meanwhile.
            let returned_before = st.tick;
            if !st.pending.is_empty() {
                drop(st);
                inner.reclaim();
                st = inner.lock();
                if let Some(block) = st.take_free(class) {
                    return Ok(self.lease(st, block, len, true, None));
                }
            }
            // Room in the budget: allocate outside the lock.
            if st.held() + class <= budget {
                let (st, block) = self.allocate_block(st, class, "pool allocated a block")?;
                return Ok(self.lease(st, block, len, false, None));
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
            if inner.config.policy == BudgetPolicy::FallbackPageable {
                drop(st);
                return self.fallback(len);
            }
            return Err(HostError::BudgetExceeded {
                requested: len,
                block: class,
                in_use: st.stats.bytes_in_use,
                cached: st.stats.bytes_cached,
                pending: st.stats.bytes_pending,
                budget,
            });
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
            let st = inner.lock();
            let cached = st.free.get(&class).map_or(0, Vec::len);
            if cached >= count
                || st.held() + class > inner.config.budget
                || st.stats.bytes_cached + class > inner.config.max_cached_bytes
            {
                return Ok(cached);
            }
            let (mut st, block) = self.allocate_block(st, class, "pool reserved a block")?;
            st.put_free(block);
            drop(st);
        }
    }

    /// Allocates one block of `class` bytes outside the lock: counts it as reserved against
    /// the budget while the driver call runs, then re-takes the lock and records the
    /// allocation, handing the guard back with the block. On failure the lock is released and
    /// waiters are woken (the reserved bytes are free again).
    fn allocate_block<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        class: usize,
        what: &'static str,
    ) -> Result<(MutexGuard<'a, State>, Block)> {
        st.reserved += class;
        st.note_peaks();
        drop(st);
        self.allocate_reserved(class, what)
    }

    /// Allocates one block of `class` bytes already counted in `State::reserved`, without the
    /// lock; re-takes it and records the allocation. On failure the reserved bytes are free
    /// again: waiters are served and woken.
    fn allocate_reserved(
        &self,
        class: usize,
        what: &'static str,
    ) -> Result<(MutexGuard<'_, State>, Block)> {
        let inner = &self.inner;
        let alloc = inner.allocator_for(class);
        let t0 = Instant::now();
        let result = inner.placement.allocate(|| alloc.allocate(class));
        let took = t0.elapsed();
        let mut st = inner.lock();
        st.reserved -= class;
        match result {
            Ok(mut buf) => {
                // The visible length of a block is its class; leases narrow it.
                let _ = buf.set_len(class);
                st.stats.allocations += 1;
                st.stats.allocation_time += took;
                st.stats.allocation_time_max = st.stats.allocation_time_max.max(took);
                tracing::debug!(target: "longshore::host", bytes = class, kind = %alloc.kind(), took_us = took.as_micros() as u64, "{what}");
                let block = Block {
                    buf,
                    class,
                    tick: 0,
                };
                Ok((st, block))
            }
            Err(e) => {
                let mut evicted = Vec::new();
                let woken = st.dispatch(inner.config.budget, &mut evicted);
                drop(st);
                wake(woken);
                free_blocks(evicted);
                Err(e)
            }
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
            waited: waited.unwrap_or_default(),
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
            waited: Duration::ZERO,
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
        let woken = {
            let mut st = self.inner.lock();
            if st.stats.bytes_cached > bytes {
                let over = st.stats.bytes_cached - bytes;
                st.evict_lru(over, &mut evicted);
            }
            st.dispatch(self.inner.config.budget, &mut evicted)
        };
        wake(woken);
        free_blocks(evicted);
    }

    /// The best rank among the requests waiting for the budget now (granted ones excluded),
    /// if any: a loader tells from it whether the batch it needs next is the one starved.
    pub fn best_waiting(&self) -> Option<u64> {
        self.inner
            .lock()
            .waiters
            .iter()
            .find(|w| w.grant.is_none())
            .map(|w| w.key.0)
    }

    /// Starts (or, with `false`, stops) recording every grant made to a request under
    /// [`BudgetPolicy::Wait`], in grant order: which rank got a block and the best rank still
    /// waiting then. A diagnostic for the ordering promise of
    /// [`alloc_ranked`](PinnedPool::alloc_ranked); [`grants`](PinnedPool::grants) reads it.
    pub fn record_grants(&self, on: bool) {
        self.inner.lock().grant_log = on.then(Vec::new);
    }

    /// The grants recorded since [`record_grants`](PinnedPool::record_grants), taken (the
    /// record starts again empty).
    pub fn grants(&self) -> Vec<GrantRecord> {
        self.inner
            .lock()
            .grant_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
