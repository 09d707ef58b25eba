//! The worker engine: threads that take tasks from their own queue and reply on a shared
//! channel, with epoch generations (so a cancelled epoch's queued tasks are skipped), panic
//! containment, and a shutdown bounded in time.
//!
//! # Generations
//!
//! Every task carries the generation of the epoch it belongs to. At most two generations are
//! live at once: the current one, and the one opened *ahead* of it for the next epoch's
//! first batches (`next_epoch.rs`), which the workers take once their current tasks are
//! done. A task or reply of any other generation is dead: skipped, cancelled between samples,
//! dropped instead of sent. Generation numbers are issued from one counter, so a number is
//! never live twice.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use crossbeam::utils::CachePadded;

use crate::error::LoaderError;

/// One unit of work: a batch of indices (empty for iterable datasets) of one epoch generation.
#[derive(Debug)]
pub(crate) struct Task {
    /// Epoch generation; tasks of a dead generation are skipped.
    pub(crate) generation: u64,
    /// The epoch number (seeds derive from it).
    pub(crate) epoch: u64,
    /// The run of the epoch this task belongs to (an epoch iterator, or the speculative start
    /// an iterator adopts): a worker starts a fresh state (generator seeded from
    /// `(seed, epoch, id)`, iterable stream) when it meets a task of another epoch or run.
    pub(crate) lineage: u64,
    /// Position of the batch in the epoch.
    pub(crate) seq: u64,
    /// Dataset indices of the batch.
    pub(crate) indices: Vec<usize>,
    /// The batch's place in the delivery order ([`rank`]): its pool request is served before
    /// those of batches delivered after it.
    pub(crate) rank: u64,
}

/// The pool rank of batch `seq` of epoch `epoch` ([`PinnedPool::alloc_ranked`]): delivery
/// order across epochs, so the next epoch's batches started ahead rank after every batch of
/// the current one.
///
/// [`PinnedPool::alloc_ranked`]: longshore_host::PinnedPool::alloc_ranked
pub(crate) fn rank(epoch: u64, seq: u64) -> u64 {
    const SEQ_BITS: u32 = 40;
    (epoch.min((1 << (63 - SEQ_BITS)) - 1) << SEQ_BITS) | seq.min((1 << SEQ_BITS) - 1)
}

/// What a worker made of a task.
#[derive(Debug)]
pub(crate) enum Outcome<O> {
    /// A batch.
    Batch(O),
    /// Nothing to deliver (every sample skipped).
    Empty,
    /// An iterable dataset's stream ended for this worker.
    Exhausted,
    /// The task failed.
    Failed(LoaderError),
}

/// A worker's reply.
#[derive(Debug)]
pub(crate) struct Reply<O> {
    pub(crate) generation: u64,
    pub(crate) seq: u64,
    pub(crate) worker: usize,
    pub(crate) outcome: Outcome<O>,
    /// The task's indices, moved back (the consumer keeps them to reload a held-back batch,
    /// without a copy per batch).
    pub(crate) indices: Vec<usize>,
    /// Time the worker spent on the task.
    pub(crate) busy: Duration,
    /// Of which waiting for pinned memory (the pool's budget).
    pub(crate) pinned_wait: Duration,
    /// Samples skipped because they failed to load.
    pub(crate) skipped: u64,
    /// The worker panicked in this task and restarts (counted when the reply is taken in by
    /// its epoch, so a discarded speculative batch does not count).
    pub(crate) restarted: bool,
}

/// The live generations and shutdown flag: read by every worker for every task (and by
/// cancellation checks), written only when an epoch starts or ends.
#[derive(Debug, Default)]
pub(crate) struct Flags {
    pub(crate) generation: AtomicU64,
    /// The generation opened ahead for the next epoch's first batches (0: none).
    pub(crate) ahead: AtomicU64,
    pub(crate) shutdown: AtomicBool,
}

/// State shared by the engine and its workers. The read-mostly flags and the reply gate (whose
/// lock word every reply writes) sit on cache lines of their own, so a reply does not
/// invalidate the line every worker reads its generation from.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) flags: CachePadded<Flags>,
    /// The last generation number issued (written by the consumer only).
    issued: AtomicU64,
    /// Read-held by a worker while it checks its reply's generation and sends it, and
    /// write-held by the consumer while it starts a new generation and drains the replies of
    /// the old one: a reply of a cancelled epoch is then either drained or never sent, and
    /// cannot sit in the channel holding a pooled lease (persistent workers park the channel
    /// between epochs). Workers share the read side, so their replies do not serialize.
    reply_gate: CachePadded<RwLock<()>>,
}

impl Shared {
    /// The workers' side of the reply gate.
    fn sending(&self) -> RwLockReadGuard<'_, ()> {
        self.reply_gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The consumer's side: no reply is being sent while it is held.
    fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.reply_gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The current generation.
    pub(crate) fn generation(&self) -> u64 {
        self.flags.generation.load(Ordering::Acquire)
    }

    /// Whether tasks and replies of generation `g` are wanted: the current generation or the
    /// one opened ahead of it.
    pub(crate) fn live(&self, g: u64) -> bool {
        g == self.generation() || g == self.flags.ahead.load(Ordering::Acquire)
    }

    /// A generation number never used before (never 0, which means "none" for `ahead`).
    fn issue(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn shut_down(&self) -> bool {
        self.flags.shutdown.load(Ordering::Acquire)
    }
}

/// What a worker thread sees: its id, its task queue, the reply channel.
pub(crate) struct WorkerCtx<O> {
    pub(crate) id: usize,
    tasks: Receiver<Task>,
    replies: Sender<Reply<O>>,
    shared: Arc<Shared>,
}

impl<O> WorkerCtx<O> {
    /// The next live task; `None` when the engine shuts down.
    pub(crate) fn next_task(&self) -> Option<Task> {
        loop {
            let task = self.tasks.recv().ok()?;
            if self.shared.shut_down() {
                return None;
            }
            if self.shared.live(task.generation) {
                return Some(task);
            }
            tracing::trace!(target: "longshore::loader", task_generation = task.generation, worker.id = self.id, batch.seq = task.seq, "skipping a task of a cancelled epoch");
        }
    }

    /// Whether the task's epoch has been cancelled (checked between samples).
    pub(crate) fn cancelled(&self, task: &Task) -> bool {
        self.shared.shut_down() || !self.shared.live(task.generation)
    }

    /// Sends a reply; false if the consumer is gone. The reply of a cancelled epoch is
    /// dropped here (its batch's lease goes back to the pool) instead of being sent.
    pub(crate) fn reply(&self, reply: Reply<O>) -> bool {
        let gate = self.shared.sending();
        if !self.shared.live(reply.generation) {
            drop(gate);
            drop(reply);
            return true;
        }
        let sent = self.replies.send(reply).is_ok();
        drop(gate);
        sent
    }
}

/// Runs `f`, turning a panic into its message.
pub(crate) fn guarded<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(panic_message)
}

pub(crate) use longshore_data::worker::panic_message;

/// The body each worker thread runs until [`WorkerCtx::next_task`] returns `None`.
pub(crate) type WorkerBody<O> = Arc<dyn Fn(WorkerCtx<O>) + Send + Sync>;

/// A set of worker threads.
pub(crate) struct Engine<O> {
    senders: Vec<Sender<Task>>,
    handles: Vec<Option<JoinHandle<()>>>,
    replies: Receiver<Reply<O>>,
    pub(crate) shared: Arc<Shared>,
    shutdown_timeout: Duration,
}

impl<O> std::fmt::Debug for Engine<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.senders.len())
            .field("shared", &self.shared)
            .finish()
    }
}

impl<O: Send + 'static> Engine<O> {
    /// Starts `n` workers running `body`.
    pub(crate) fn start(
        n: usize,
        body: WorkerBody<O>,
        shutdown_timeout: Duration,
    ) -> Result<Self, LoaderError> {
        let (reply_tx, replies) = unbounded();
        let shared = Arc::new(Shared::default());
        let mut senders = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        for id in 0..n {
            let (tx, rx) = unbounded();
            let ctx = WorkerCtx {
                id,
                tasks: rx,
                replies: reply_tx.clone(),
                shared: shared.clone(),
            };
            let body = body.clone();
            let handle = std::thread::Builder::new()
                .name(format!("longshore-worker-{id}"))
                .spawn(move || {
                    let span =
                        tracing::debug_span!(target: "longshore::loader", "worker", worker.id = id);
                    let _e = span.enter();
                    body(ctx)
                })
                .map_err(|e| LoaderError::Spawn {
                    worker: id,
                    source: e,
                })?;
            senders.push(tx);
            handles.push(Some(handle));
        }
        Ok(Self {
            senders,
            handles,
            replies,
            shared,
            shutdown_timeout,
        })
    }
}

impl<O> Engine<O> {
    /// Starts a new generation: tasks of older ones (the one opened ahead included) are
    /// skipped, their replies ignored.
    pub(crate) fn new_generation(&self) -> u64 {
        let g = self.shared.issue();
        let gate = self.shared.exclusive();
        self.shared.flags.generation.store(g, Ordering::Release);
        self.shared.flags.ahead.store(0, Ordering::Release);
        // Drop replies of the old generations now: their batches (and pinned leases) go back.
        let stale: Vec<_> = self.replies.try_iter().collect();
        drop(gate);
        drop(stale);
        g
    }

    /// Opens a generation ahead of the current one, for the next epoch's first batches: its
    /// tasks are run and its replies sent while the current generation lives on. Replaces a
    /// generation opened ahead before (whose tasks die).
    pub(crate) fn open_ahead(&self) -> u64 {
        let g = self.shared.issue();
        let _gate = self.shared.exclusive();
        self.shared.flags.ahead.store(g, Ordering::Release);
        g
    }

    /// Kills the generation opened ahead (its tasks are skipped or cancelled, its replies
    /// dropped, here or by [`Engine::recv`]); the current one goes on.
    pub(crate) fn close_ahead(&self) {
        let _gate = self.shared.exclusive();
        self.shared.flags.ahead.store(0, Ordering::Release);
    }

    /// Makes `g` (the generation opened ahead) the current one: tasks of the old current
    /// generation die. Returns the replies of `g` already in the channel (the others are
    /// dropped), which the caller must take in: they are not received again.
    pub(crate) fn promote(&self, g: u64) -> Vec<Reply<O>> {
        let gate = self.shared.exclusive();
        self.shared.flags.generation.store(g, Ordering::Release);
        self.shared.flags.ahead.store(0, Ordering::Release);
        let (early, stale): (Vec<_>, Vec<_>) =
            self.replies.try_iter().partition(|r| r.generation == g);
        drop(gate);
        drop(stale);
        early
    }

    /// Queues a task on worker `w`.
    pub(crate) fn send(&self, w: usize, task: Task) -> Result<(), LoaderError> {
        let seq = task.seq;
        self.senders[w]
            .send(task)
            .map_err(|_| LoaderError::WorkerGone {
                worker: w,
                batch: seq,
            })
    }

    /// Waits for the next reply of a live generation (the current one, or the one opened
    /// ahead); replies of dead generations are dropped.
    pub(crate) fn recv(&self, timeout: Option<Duration>) -> Result<Reply<O>, RecvTimeoutError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let r = match deadline {
                Some(d) => self.replies.recv_deadline(d)?,
                None => self
                    .replies
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected)?,
            };
            if self.shared.live(r.generation) {
                return Ok(r);
            }
        }
    }

    /// Number of workers whose thread has ended (they only end on shutdown or a fatal error).
    pub(crate) fn dead_workers(&self) -> Vec<usize> {
        self.handles
            .iter()
            .enumerate()
            .filter(|(_, h)| h.as_ref().is_none_or(|h| h.is_finished()))
            .map(|(i, _)| i)
            .collect()
    }

    /// Tells every worker to stop: queued tasks are dropped, running ones stop at the next
    /// sample boundary, idle ones wake up (their task channel is closed). Returns at once.
    fn signal_stop(&mut self) {
        self.shared.flags.shutdown.store(true, Ordering::Release);
        {
            let g = self.shared.issue();
            let _gate = self.shared.exclusive();
            self.shared.flags.generation.store(g, Ordering::Release);
            self.shared.flags.ahead.store(0, Ordering::Release);
        }
        self.senders.clear();
    }

    /// Stops every worker (see `signal_stop`) and waits up to the shutdown timeout for them,
    /// then detaches threads still stuck in user code (they exit when that code returns) and
    /// logs a warning.
    pub(crate) fn shutdown(&mut self) {
        self.signal_stop();
        let deadline = Instant::now() + self.shutdown_timeout;
        for (id, h) in self.handles.iter_mut().enumerate() {
            let Some(handle) = h.take() else { continue };
            while !handle.is_finished() && Instant::now() < deadline {
                // Drain replies so no batch is kept alive by the channel while we wait.
                while let Ok(r) = self.replies.try_recv() {
                    drop(r);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if handle.is_finished() {
                if let Err(p) = handle.join() {
                    tracing::error!(target: "longshore::loader", panic = %panic_message(p), worker.id = id, "worker thread panicked outside a task");
                }
            } else {
                tracing::warn!(target: "longshore::loader", timeout_ms = self.shutdown_timeout.as_millis() as u64, worker.id = id, "worker still busy in dataset code at shutdown; detaching it");
            }
        }
        while let Ok(r) = self.replies.try_recv() {
            drop(r);
        }
    }
}

impl<O: Send + 'static> Engine<O> {
    /// Signals the workers to stop now and runs the bounded join of [`Engine::shutdown`] on a
    /// short-lived thread (`longshore-reaper`), so the caller does not wait for a worker stuck
    /// in dataset code. Falls back to a synchronous shutdown if that thread cannot start.
    pub(crate) fn shutdown_in_background(mut self) {
        self.signal_stop();
        let spawned = std::thread::Builder::new()
            .name("longshore-reaper".into())
            .spawn(move || self.shutdown());
        if let Err(e) = spawned {
            // The closure, and the engine in it, was dropped: `Drop` shut it down here.
            tracing::warn!(target: "longshore::loader", error = %e, "could not start a thread to stop the workers; stopped them on this thread");
        }
    }
}

impl<O> Drop for Engine<O> {
    fn drop(&mut self) {
        if !self.handles.iter().all(Option::is_none) {
            self.shutdown();
        }
    }
}
