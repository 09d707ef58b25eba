//! The Cpu backend of the collectives: ranks are threads of one process, each with its own
//! Cpu-device stream; an all-reduce is a job on each rank's stream thread that meets the other
//! ranks' jobs at a barrier with a timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use longshore_transfer::{CpuMemory, Stream, TransferError};

use super::{CollectiveError, Communicator, Inner, Region, Result};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An in-process group of `world_size` ranks on the Cpu device: one [`Communicator`] per
/// rank, each used by its own thread with its own stream.
///
/// A rank blocked in an all-reduce waits at most the group's timeout (default 120 s) for the
/// others; a rank that drops its communicator makes the others' pending and later all-reduces
/// fail with an error naming it. Cheap to clone (clones are the same group).
#[derive(Debug, Clone)]
pub struct CpuGroup {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug)]
struct State {
    /// All-reduces completed by the whole group.
    completed: u64,
    /// Deposits of the all-reduce in progress, by rank.
    slots: Vec<Option<Vec<f32>>>,
    arrived: usize,
    /// The sum of the last completed all-reduce.
    result: Arc<Vec<f32>>,
    /// Why the group can no longer complete an all-reduce.
    poison: Option<String>,
    joined: Vec<bool>,
}

impl CpuGroup {
    /// A group of `world_size` ranks (at least 1) with the default timeout of 120 s.
    pub fn new(world_size: usize) -> Result<Self> {
        Self::with_timeout(world_size, Duration::from_secs(120))
    }

    /// A group of `world_size` ranks whose all-reduces fail when a rank waits longer than
    /// `timeout` for the others.
    pub fn with_timeout(world_size: usize, timeout: Duration) -> Result<Self> {
        if world_size == 0 {
            return Err(
                TransferError::Invalid("a cpu group needs at least one rank".to_owned()).into(),
            );
        }
        Ok(Self {
            shared: Arc::new(Shared {
                world: world_size,
                timeout,
                state: Mutex::new(State {
                    completed: 0,
                    slots: vec![None; world_size],
                    arrived: 0,
                    result: Arc::new(Vec::new()),
                    poison: None,
                    joined: vec![false; world_size],
                }),
                cv: Condvar::new(),
            }),
        })
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world
    }

    /// The communicator of `rank`; each rank joins once.
    pub fn join(&self, rank: usize) -> Result<Communicator> {
        let world = self.shared.world;
        {
            let mut st = lock(&self.shared.state);
            match st.joined.get_mut(rank) {
                None => {
                    return Err(CollectiveError::Rank {
                        op: "join",
                        rank,
                        world_size: world,
                        reason: format!("rank {rank} is not in 0..{world}"),
                    });
                }
                Some(true) => {
                    return Err(CollectiveError::Rank {
                        op: "join",
                        rank,
                        world_size: world,
                        reason: "this rank has already joined the group".to_owned(),
                    });
                }
                Some(j) => *j = true,
            }
        }
        Ok(Communicator {
            inner: Inner::Cpu(CpuRank {
                member: Arc::new(Member {
                    group: self.shared.clone(),
                    rank,
                    rounds: AtomicU64::new(0),
                    error: Mutex::new(None),
                }),
            }),
        })
    }

    /// Every rank's communicator, in rank order (all ranks must not have joined yet).
    pub fn communicators(&self) -> Result<Vec<Communicator>> {
        (0..self.shared.world).map(|r| self.join(r)).collect()
    }
}

/// A rank's side of a [`CpuGroup`].
#[derive(Debug)]
pub(crate) struct CpuRank {
    member: Arc<Member>,
}

/// Held by the communicator and by each of its enqueued jobs: the rank leaves the group when
/// the last of them is gone, i.e. once its communicator is dropped and its jobs have run.
#[derive(Debug)]
struct Member {
    group: Arc<Shared>,
    rank: usize,
    /// All-reduces enqueued by this rank.
    rounds: AtomicU64,
    /// The first failure of one of its all-reduces.
    error: Mutex<Option<String>>,
}

impl CpuRank {
    pub(crate) fn rank(&self) -> usize {
        self.member.rank
    }

    pub(crate) fn world_size(&self) -> usize {
        self.member.group.world
    }

    pub(crate) fn check(&self) -> Result<()> {
        match &*lock(&self.member.error) {
            Some(reason) => Err(self.member.err(reason.clone())),
            None => Ok(()),
        }
    }

    /// Enqueues this rank's part of the next all-reduce on its stream.
    pub(crate) fn enqueue(&self, s: &Stream, mem: CpuMemory, r: Region) -> Result<()> {
        if let Some(p) = &lock(&self.member.group.state).poison {
            return Err(self.member.err(p.clone()));
        }
        let round = self.member.rounds.fetch_add(1, Ordering::Relaxed);
        let member = self.member.clone();
        Ok(s.launch_host_fn(move || member.run(round, &mem, r))?)
    }
}

impl Member {
    fn err(&self, reason: String) -> CollectiveError {
        CollectiveError::Rank {
            op: "all_reduce_sum",
            rank: self.rank,
            world_size: self.group.world,
            reason,
        }
    }

    /// The job: deposit this rank's values, meet the others, write the sum back.
    fn run(&self, round: u64, mem: &CpuMemory, r: Region) {
        let mine: Vec<f32> = {
            let bytes = mem.lock();
            bytemuck::pod_collect_to_vec(&bytes[r.offset..r.offset + r.bytes])
        };
        match self.exchange(round, mine) {
            Ok(sum) => {
                let mut bytes = mem.lock();
                bytes[r.offset..r.offset + r.bytes].copy_from_slice(bytemuck::cast_slice(&sum));
            }
            Err(reason) => {
                tracing::error!(target: "longshore_collective", rank = self.rank, round, %reason, "cpu all-reduce failed");
                lock(&self.error).get_or_insert(reason);
            }
        }
    }

    fn poison(&self, st: &mut State, reason: String) -> String {
        st.poison.get_or_insert(reason.clone());
        self.group.cv.notify_all();
        reason
    }

    fn exchange(&self, round: u64, mine: Vec<f32>) -> std::result::Result<Arc<Vec<f32>>, String> {
        let g = &*self.group;
        let me = self.rank;
        let deadline = Instant::now() + g.timeout;
        let mut st = lock(&g.state);
        let timed_out = |st: &State| {
            let missing: Vec<usize> = (0..g.world).filter(|&i| st.slots[i].is_none()).collect();
            format!(
                "rank {me} waited {:?} in all-reduce #{round} for rank(s) {missing:?}",
                g.timeout
            )
        };
        // Earlier all-reduces of the group first (only when one rank uses several streams).
        while st.completed < round {
            if let Some(p) = &st.poison {
                return Err(p.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                let reason = timed_out(&st);
                return Err(self.poison(&mut st, reason));
            }
            st =
                g.cv.wait_timeout(st, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
        if let Some(p) = &st.poison {
            return Err(p.clone());
        }
        if let Some((other, n)) = st
            .slots
            .iter()
            .enumerate()
            .find_map(|(i, s)| s.as_ref().map(|v| (i, v.len())))
            && n != mine.len()
        {
            let reason = format!(
                "all-reduce #{round}: rank {me} has {} values but rank {other} has {n}",
                mine.len()
            );
            return Err(self.poison(&mut st, reason));
        }
        st.slots[me] = Some(mine);
        st.arrived += 1;
        if st.arrived == g.world {
            // Sum in rank order: every rank gets the same bits whoever arrived last.
            let mut slots = st.slots.iter_mut().map(|s| s.take().unwrap_or_default());
            let mut sum = slots.next().unwrap_or_default();
            for v in slots {
                sum.iter_mut().zip(&v).for_each(|(a, b)| *a += *b);
            }
            let sum = Arc::new(sum);
            st.result = sum.clone();
            st.arrived = 0;
            st.completed += 1;
            g.cv.notify_all();
            return Ok(sum);
        }
        loop {
            if st.completed > round {
                return Ok(st.result.clone());
            }
            if let Some(p) = &st.poison {
                return Err(p.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                let reason = timed_out(&st);
                return Err(self.poison(&mut st, reason));
            }
            st =
                g.cv.wait_timeout(st, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut st = lock(&self.group.state);
        let reason = format!(
            "rank {} left the group (its communicator was dropped or its thread ended) after {} all-reduce(s)",
            self.rank,
            self.rounds.load(Ordering::Relaxed)
        );
        st.poison.get_or_insert(reason);
        self.group.cv.notify_all();
    }
}
