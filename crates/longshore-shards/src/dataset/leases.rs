//! The leases each worker's reader holds on shards it will read again soon, and the keeper
//! thread that lets an idle reader's leases go while a reader anywhere on the node waits for
//! room in the cache.
//!
//! A loader gives a worker no task while it waits to deliver another worker's batch in
//! order, so a reader can sit idle, holding leases, for as long as another reader waits for
//! room: with a small budget, every reader of a node could wait on the others that way. A
//! reader locks its leases while it reads; the keeper, when [`ShardCache::has_waiters`] says
//! a reader waits, takes the leases of every reader that is not reading
//! ([`CachedShard::release_unread`]): the reader leases the shard again when it reads it
//! next.
//!
//! The board also keeps each reader's schedule ([`LeaseBoard::follow`]): the reads left in its
//! stream, registered with the cache ([`ShardCache::schedule_reader`]) so that it evicts by
//! Belady's rule and prefetches in need order. Sample `i` of worker `w`'s stream (of `W`
//! workers) is read at tick `i W + w`: the workers read at once, at one pace, as the loader
//! keeps them (each is at most `prefetch_factor` batches ahead of the batch delivered), and
//! the ranks of a job walk their equal streams in step, so it is also the time axis the
//! node's processes share. (Ticks of the loader's exact delivery order, `((i / B) W + w) B +
//! i mod B` for batches of `B`, made 1-4% more downloads under small budgets: the workers do
//! not take turns, they read concurrently.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Duration;

use super::{Inner, TARGET};
use crate::cache::{CachedShard, ReaderSchedule, ShardCache};
use crate::order::EpochPlan;

/// How often the keeper looks for waiters.
const POLL: Duration = Duration::from_millis(20);

/// One reader's leases, by shard index; locked while the reader reads.
pub(super) type Held = Arc<Mutex<HashMap<usize, CachedShard>>>;

/// The dataset's readers in this process and their keeper.
#[derive(Debug)]
pub(super) struct LeaseBoard {
    cache: ShardCache,
    state: Mutex<BoardState>,
    /// Each reader's schedule, by the address of its leases (`None`: its stream is not the
    /// plan's, so it has none).
    schedules: Mutex<HashMap<usize, Followed>>,
}

/// A reader's registered schedule.
#[derive(Debug)]
struct Followed {
    reader: Weak<Mutex<HashMap<usize, CachedShard>>>,
    schedule: Option<ReaderSchedule>,
    /// Slots in the reader's stream; the worker and workers per rank of its ticks.
    total: u64,
    worker: u64,
    workers: u64,
}

impl Followed {
    fn tick(&self, i: u64) -> u64 {
        i * self.workers + self.worker
    }
}

#[derive(Debug, Default)]
struct BoardState {
    readers: Vec<Weak<Mutex<HashMap<usize, CachedShard>>>>,
    /// The process whose keeper runs (a forked child starts its own).
    keeper_pid: Option<u32>,
}

/// Locks a reader's leases (a reader that panicked left them whole).
pub(super) fn lock(held: &Held) -> MutexGuard<'_, HashMap<usize, CachedShard>> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

impl LeaseBoard {
    pub(super) fn new(cache: ShardCache) -> Arc<Self> {
        Arc::new(Self {
            cache,
            state: Mutex::default(),
            schedules: Mutex::default(),
        })
    }

    /// Registers the schedule of the reader holding `held` at its first call (worker `worker`'s
    /// stream of `epoch`, from the dataset's plan), and tells it how far the reader got:
    /// `left` slots of its stream are still to read (0 once it only makes up for failed reads).
    pub(super) fn follow(
        &self,
        ds: &Inner,
        held: &Held,
        plan: &EpochPlan,
        worker: usize,
        left: u64,
    ) {
        let addr = Arc::as_ptr(held) as usize;
        {
            let map = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(f) = map.get(&addr)
                && f.reader.strong_count() > 0
            {
                if let Some(s) = &f.schedule {
                    s.advance(f.tick(f.total.saturating_sub(left)));
                }
                return;
            }
        }
        let followed = self.schedule_of(ds, held, plan, worker, left);
        let mut map = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, f| f.reader.strong_count() > 0);
        map.insert(addr, followed);
    }

    /// Worker `worker`'s stream of the dataset's plan, as a schedule: if it is the reader's
    /// (same epoch, at least `left` slots), its reads from the first on.
    fn schedule_of(
        &self,
        ds: &Inner,
        held: &Held,
        plan: &EpochPlan,
        worker: usize,
        left: u64,
    ) -> Followed {
        let workers = plan.layout().num_workers();
        let epoch = plan.order().epoch();
        let mut followed = Followed {
            reader: Arc::downgrade(held),
            schedule: None,
            total: 0,
            worker: worker as u64,
            workers: workers as u64,
        };
        let stream = plan.rank(ds.rank).ok().and_then(|r| r.worker(worker).ok());
        let Some(stream) = stream.filter(|s| s.remaining() >= left) else {
            tracing::debug!(target: TARGET, worker, epoch, "no schedule for this reader: the cache evicts without it");
            return followed;
        };
        followed.total = stream.remaining();
        let uses: Vec<(u64, usize)> = stream
            .enumerate()
            .map(|(i, slot)| (followed.tick(i as u64), slot.sample.shard))
            .collect();
        let schedule = self.cache.schedule_reader(epoch, uses);
        schedule.advance(followed.tick(followed.total - left));
        followed.schedule = Some(schedule);
        followed
    }

    /// Drops the schedules of readers that are gone.
    fn forget_gone(&self) {
        let mut map = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, f| f.reader.strong_count() > 0);
    }

    /// A new reader's (empty) leases, watched by this process's keeper (started if needed).
    pub(super) fn register(self: &Arc<Self>) -> Held {
        let held = Held::default();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.readers.retain(|r| r.strong_count() > 0);
        st.readers.push(Arc::downgrade(&held));
        let pid = std::process::id();
        if st.keeper_pid != Some(pid) {
            let board = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("longshore-lease-keeper".into())
                .spawn(move || keeper(&board));
            match spawned {
                Ok(_) => st.keeper_pid = Some(pid),
                Err(e) => {
                    tracing::warn!(target: TARGET, error = %e, "cannot start the lease keeper");
                }
            }
        }
        held
    }

    /// The live readers, or `None` (and the keeper marked stopped) when there are none.
    fn readers(&self) -> Option<Vec<Held>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let live: Vec<Held> = st.readers.iter().filter_map(Weak::upgrade).collect();
        st.readers.retain(|r| r.strong_count() > 0);
        if live.is_empty() {
            st.keeper_pid = None;
            return None;
        }
        Some(live)
    }
}

/// The leases of a reader that is not reading now, or `None`.
fn idle(held: &Held) -> Option<MutexGuard<'_, HashMap<usize, CachedShard>>> {
    match held.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The keeper: while the dataset has readers in this process, releases idle readers' leases
/// whenever a reader on the node waits for room.
fn keeper(board: &Weak<LeaseBoard>) {
    loop {
        std::thread::sleep(POLL);
        let Some(board) = board.upgrade() else { return };
        board.forget_gone();
        let Some(readers) = board.readers() else {
            return;
        };
        let holding = readers
            .iter()
            .any(|r| idle(r).is_some_and(|g| !g.is_empty()));
        if !holding || !board.cache.has_waiters() {
            continue;
        }
        let mut released = 0;
        for r in &readers {
            if let Some(mut g) = idle(r) {
                released += g.len();
                for (_, lease) in g.drain() {
                    lease.release_unread();
                }
            }
        }
        if released > 0 {
            tracing::debug!(target: TARGET, released, "idle readers' leases released for a waiting reader");
        }
    }
}
