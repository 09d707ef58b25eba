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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Duration;

use super::TARGET;
use crate::cache::{CachedShard, ShardCache};

/// How often the keeper looks for waiters.
const POLL: Duration = Duration::from_millis(20);

/// One reader's leases, by shard index; locked while the reader reads.
pub(super) type Held = Arc<Mutex<HashMap<usize, CachedShard>>>;

/// The dataset's readers in this process and their keeper.
#[derive(Debug)]
pub(super) struct LeaseBoard {
    cache: ShardCache,
    state: Mutex<BoardState>,
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
        })
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
