//! Ranked waiting under [`BudgetPolicy::Wait`](super::BudgetPolicy::Wait): requests that find
//! the budget full queue up in rank order, and whatever comes back (a block released, a
//! pending block's fences completed, budget room freed by a trim) is handed directly to the
//! best-ranked waiter that can use it, which alone is woken. A reaper thread waits on the
//! fences of pending blocks while requests wait, so their completion, not a polling interval,
//! wakes the waiter.
//!
//! Why ranks: a data loader leases one block per batch, and the batch the consumer needs next
//! must not wait while batches later in the order take the blocks coming back (head-of-line
//! blocking). The loader ranks each request by the batch's place in the delivery order; plain
//! [`alloc`](super::PinnedPool::alloc) requests rank last, in arrival order.

use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::{Block, Inner, PinnedPool, PoolBuffer, State, free_blocks};
use crate::error::{HostError, Result};

/// The rank of a plain [`alloc`](super::PinnedPool::alloc): served after every ranked request.
pub const UNRANKED: u64 = u64::MAX;

/// How long the reaper waits on the oldest pending block before it queries all of them again
/// (fences on different streams may complete out of order), at first and at most: the slice
/// doubles while queries find nothing completed and starts again small when one does. The
/// oldest block's completion wakes the reaper at once (copies on one stream complete in
/// order); the slice only bounds the delay of a block that completes before it.
const REAP_SLICE_MIN: Duration = Duration::from_micros(100);
const REAP_SLICE_MAX: Duration = Duration::from_millis(5);

/// What a waiter is handed.
pub(super) enum Grant {
    /// A cached block of its class (counted in `State::reserved` until leased).
    Block(Block),
    /// Budget room for one block of its class, already counted in `State::reserved`: the
    /// waiter allocates it outside the lock.
    Room,
}

/// A request queued on the budget.
pub(super) struct Waiter {
    /// (rank, arrival ticket): served in this order.
    pub(super) key: (u64, u64),
    pub(super) class: usize,
    pub(super) cv: Arc<Condvar>,
    pub(super) grant: Option<Grant>,
}

/// One grant, as recorded by [`PinnedPool::record_grants`](super::PinnedPool::record_grants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRecord {
    /// The rank of the request served.
    pub rank: u64,
    /// Whether the request was served through the queue (no cached block was free for it on
    /// arrival, or better-ranked requests waited), rather than straight from the cache.
    pub queued: bool,
    /// The best rank among the requests still waiting when it was served (`None`: none).
    pub best_waiting: Option<u64>,
}

impl State {
    /// The queue position of the waiter with arrival ticket `ticket`.
    pub(super) fn waiter_index(&self, key: (u64, u64)) -> Option<usize> {
        self.waiters.binary_search_by_key(&key, |w| w.key).ok()
    }

    /// Queues a request; returns its key.
    pub(super) fn enqueue(&mut self, rank: u64, class: usize) -> (u64, u64) {
        self.next_ticket += 1;
        let key = (rank, self.next_ticket);
        let at = self.waiters.partition_point(|w| w.key < key);
        self.waiters.insert(
            at,
            Waiter {
                key,
                class,
                cv: Arc::new(Condvar::new()),
                grant: None,
            },
        );
        key
    }

    /// Serves waiters in rank order while what is free (or the budget's room, after evicting
    /// cached blocks of other classes) can serve the best one not yet served; stops at the
    /// first that cannot be served, so no later request overtakes it. Returns the condition
    /// variables to notify (one per waiter served); evicted blocks go to `evicted`, to be freed
    /// after unlocking.
    pub(super) fn dispatch(
        &mut self,
        budget: usize,
        evicted: &mut Vec<Block>,
    ) -> Vec<Arc<Condvar>> {
        let mut wake = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].grant.is_some() {
                i += 1;
                continue;
            }
            let class = self.waiters[i].class;
            let grant = if let Some(block) = self.take_free(class) {
                // Counted as reserved until the waiter leases it, so it stays in the budget.
                self.reserved += class;
                Grant::Block(block)
            } else if self.held() + class <= budget {
                self.reserved += class;
                self.note_peaks();
                Grant::Room
            } else {
                let need = self.held() + class - budget;
                if self.stats.bytes_cached < need {
                    break;
                }
                self.evict_lru(need, evicted);
                self.reserved += class;
                self.note_peaks();
                Grant::Room
            };
            let key = self.waiters[i].key;
            self.log_grant(key.0, true, i + 1);
            self.waiters[i].grant = Some(grant);
            wake.push(self.waiters[i].cv.clone());
            i += 1;
        }
        wake
    }

    /// Records a grant to rank `rank`, the waiters from `from` on being still queued.
    pub(super) fn log_grant(&mut self, rank: u64, queued: bool, from: usize) {
        let Some(log) = self.grant_log.as_mut() else {
            return;
        };
        let best_waiting = self.waiters[from.min(self.waiters.len())..]
            .iter()
            .filter(|w| w.grant.is_none())
            .map(|w| w.key.0)
            .min();
        log.push(GrantRecord {
            rank,
            queued,
            best_waiting,
        });
    }

    /// Whether a request of `rank` arriving now may be served without queueing: no request
    /// ranked before it is waiting (granted ones are served already).
    pub(super) fn first_in_line(&self, rank: u64) -> bool {
        self.waiters
            .iter()
            .take_while(|w| w.key.0 <= rank)
            .all(|w| w.grant.is_some())
    }
}

impl PinnedPool {
    /// [`alloc_ranked`](PinnedPool::alloc_ranked) under [`BudgetPolicy::Wait`]: served at
    /// once when no better-ranked request waits and a block or room is there; otherwise
    /// queued (`wait.rs`) until a grant hands it a block or room, or the timeout passes.
    pub(super) fn alloc_waiting(
        &self,
        len: usize,
        class: usize,
        rank: u64,
        timeout: Duration,
    ) -> Result<PoolBuffer> {
        let inner = &self.inner;
        let budget = inner.config.budget;
        let start = Instant::now();
        let mut st = inner.lock();
        // Pending blocks whose fences completed are reused before anything is allocated.
        let mut reclaimed = false;
        if st.first_in_line(rank)
            && st.free.get(&class).is_none_or(Vec::is_empty)
            && !st.pending.is_empty()
        {
            drop(st);
            inner.reclaim();
            reclaimed = true;
            st = inner.lock();
        }
        // Uncontended hot path: nobody ranked before us waits and a block of the class is free.
        if st.first_in_line(rank)
            && let Some(block) = st.take_free(class)
        {
            st.log_grant(rank, false, 0);
            return Ok(self.lease(st, block, len, true, None));
        }
        let key = st.enqueue(rank, class);
        let mut counted = false;
        loop {
            let mut evicted = Vec::new();
            let woken = st.dispatch(budget, &mut evicted);
            let i = st
                .waiter_index(key)
                .expect("a waiter leaves the queue only here");
            if st.waiters[i].grant.is_some() {
                let w = st.waiters.remove(i);
                if counted {
                    st.stats.waiting -= 1;
                }
                let waited = counted.then(|| start.elapsed());
                drop(st);
                wake(woken);
                free_blocks(evicted);
                return match w.grant.expect("checked above") {
                    Grant::Block(block) => {
                        let mut st = inner.lock();
                        st.reserved -= class;
                        Ok(self.lease(st, block, len, true, waited))
                    }
                    Grant::Room => {
                        let (st, block) =
                            self.allocate_reserved(class, "pool allocated a block")?;
                        Ok(self.lease(st, block, len, false, waited))
                    }
                };
            }
            let cv = st.waiters[i].cv.clone();
            let pending = !st.pending.is_empty();
            drop(st);
            wake(woken);
            free_blocks(evicted);
            // Blocks whose fences completed since they were released: query them once before
            // sleeping (the reaper watches them from then on).
            if pending && !reclaimed {
                reclaimed = true;
                if inner.reclaim() > 0 {
                    st = inner.lock();
                    continue;
                }
            }
            if pending {
                inner.reaper.want(inner);
            }
            st = inner.lock();
            let i = st
                .waiter_index(key)
                .expect("a waiter leaves the queue only here");
            if st.waiters[i].grant.is_some() {
                continue;
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                st.waiters.remove(i);
                if counted {
                    st.stats.waiting -= 1;
                }
                // Requests behind this one may be served now.
                let mut evicted = Vec::new();
                let woken = st.dispatch(budget, &mut evicted);
                let err = HostError::WaitTimedOut {
                    waited: elapsed,
                    block: class,
                    in_use: st.stats.bytes_in_use,
                    budget,
                };
                drop(st);
                wake(woken);
                free_blocks(evicted);
                return Err(err);
            }
            if !counted {
                counted = true;
                st.stats.waits += 1;
                st.stats.waiting += 1;
            }
            // Woken by a grant (or the reaper's reclaim). Without a reaper thread, pending
            // blocks are queried again at short intervals instead.
            let slice = if pending && !inner.reaper.running() {
                reclaimed = false;
                Duration::from_millis(1)
            } else {
                timeout - elapsed
            };
            st = cv
                .wait_timeout(st, slice.min(timeout - elapsed))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Notifies the waiters `dispatch` served.
pub(super) fn wake(cvs: Vec<Arc<Condvar>>) {
    for cv in cvs {
        cv.notify_one();
    }
}

/// The reaper's signal: set when requests wait while blocks are pending.
#[derive(Default)]
pub(super) struct Reaper {
    flags: Mutex<ReapFlags>,
    cv: Condvar,
    started: OnceLock<()>,
}

#[derive(Default)]
struct ReapFlags {
    wanted: bool,
    stop: bool,
}

impl Reaper {
    /// Asks the reaper to watch the pending blocks (starting its thread the first time).
    pub(super) fn want(self: &Arc<Self>, inner: &Arc<Inner>) {
        self.started.get_or_init(|| {
            let weak = Arc::downgrade(inner);
            let sig = self.clone();
            let spawned = std::thread::Builder::new()
                .name("longshore-pool-reaper".into())
                .spawn(move || reap(&sig, weak));
            if let Err(e) = spawned {
                tracing::error!(target: "longshore::host", error = %e, "cannot spawn the pool's reaper: waiters query pending blocks themselves");
                self.flags.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
            }
        });
        let mut f = self.flags.lock().unwrap_or_else(|p| p.into_inner());
        f.wanted = true;
        self.cv.notify_one();
    }

    /// Whether the reaper thread runs (else waiters query pending blocks themselves).
    pub(super) fn running(&self) -> bool {
        self.started.get().is_some() && !self.flags.lock().unwrap_or_else(|p| p.into_inner()).stop
    }

    /// Ends the reaper thread (the pool is dropped).
    pub(super) fn stop(&self) {
        let mut f = self.flags.lock().unwrap_or_else(|p| p.into_inner());
        f.stop = true;
        self.cv.notify_one();
    }
}

/// The reaper thread: while requests wait and blocks are pending, waits on the fences of the
/// oldest pending block, then moves every completed one to the waiters. Holds the pool only
/// while it watches, so dropping the pool ends it.
fn reap(sig: &Reaper, weak: Weak<Inner>) {
    loop {
        {
            let mut f = sig.flags.lock().unwrap_or_else(|p| p.into_inner());
            while !f.wanted && !f.stop {
                f = sig.cv.wait(f).unwrap_or_else(|p| p.into_inner());
            }
            if f.stop {
                return;
            }
            f.wanted = false;
        }
        let mut slice = REAP_SLICE_MIN;
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let fences = {
                let st = inner.lock();
                if st.waiters.iter().all(|w| w.grant.is_some()) {
                    None
                } else {
                    st.pending
                        .iter()
                        .min_by_key(|p| p.id)
                        .map(|p| p.fences.clone())
                }
            };
            let Some(fences) = fences else { break };
            for f in &fences {
                if !f.wait_timeout(slice) {
                    break;
                }
            }
            slice = if inner.reclaim() > 0 {
                REAP_SLICE_MIN
            } else {
                (slice * 2).min(REAP_SLICE_MAX)
            };
        }
    }
}
