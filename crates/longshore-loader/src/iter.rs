//! [`LoaderIter`]: one epoch of a loader, on the consumer's thread. It deals tasks to the
//! workers, keeps the reorder buffer, enforces the timeout, detects dead workers and relieves
//! a starved pool; with `num_workers == 0` it loads each batch when asked for (a map-style
//! dataset on the calling thread, an iterable one's stream on a thread of its own, one batch
//! in flight).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::RecvTimeoutError;
use longshore_data::WorkerInfo;

use crate::config::LoaderConfig;
use crate::engine::{Engine, Outcome, Reply, Task, guarded, rank};
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::next_epoch::{Ahead, AheadKey, Batches, ReplyCounts, Slot, SlotState, settle};
use crate::options::WorkerPanicPolicy;
use crate::prepare::Prepared;
use crate::shared::{Inner, Parked};
use crate::state::Progress;
use crate::stats::LoaderStats;
use crate::sync::lock;
use crate::worker::worker_body;
use longshore_data::seed::worker_seed;

mod ahead;
mod budget;
mod marks;
mod stall;
mod stream;

pub(crate) use marks::Marker;

pub(crate) use budget::UNKNOWN_BLOCK;
use stall::STALL_REPORT;

/// Counters gathered between two deliveries, added to the loader's stats under one lock.
#[derive(Debug, Default)]
struct Pending {
    replies: ReplyCounts,
    reloaded: u64,
    peak_in_flight: usize,
    peak_reorder: usize,
    /// Batches of this epoch started before its iterator existed.
    adopted: u64,
    /// Batches started ahead for the next epoch and discarded.
    discarded: u64,
    /// Batches of a resumed epoch replayed and discarded.
    replayed: u64,
    /// The part of the consumer's wait spent on pinned memory.
    consumer_pinned: Duration,
    /// The in-flight bound in force (0: not set yet).
    in_flight_limit: usize,
}

impl Pending {
    fn flush(&mut self, s: &mut LoaderStats) {
        let p = std::mem::take(self);
        s.worker_busy += p.replies.worker_busy;
        s.pinned_wait += p.replies.pinned_wait;
        s.consumer_pinned_wait += p.consumer_pinned;
        if p.in_flight_limit > 0 {
            s.in_flight_limit = p.in_flight_limit;
        }
        s.skipped_samples += p.replies.skipped;
        s.worker_restarts += p.replies.restarts;
        s.reloaded += p.reloaded;
        s.peak_in_flight = s.peak_in_flight.max(p.peak_in_flight);
        s.peak_reorder = s.peak_reorder.max(p.peak_reorder);
        s.speculative_batches += p.adopted;
        s.speculative_discarded += p.discarded;
        s.replayed_batches += p.replayed;
    }
}

/// Ids of epoch iterators (0 is none).
static NEXT_RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One epoch of a [`DataLoader`](crate::DataLoader): yields `Result<batch, LoaderError>`.
///
/// Dropping it mid-epoch stops the workers (bounded by the loader's `shutdown_timeout`) and
/// returns every leased buffer to the pool; with `persistent_workers` the workers are kept
/// for the next epoch and only the outstanding work is cancelled.
pub struct LoaderIter<F: Fetch> {
    inner: Arc<Inner<F>>,
    engine: Option<Engine<F::Output>>,
    config: LoaderConfig,
    /// This iterator's id: only it marks the progress it started ([`Progress::owner`]).
    run: u64,
    /// The lineage its tasks carry (`Task::lineage`): its own id, or that of the start it
    /// adopted.
    lineage: u64,
    /// The next epoch's first batches, started once this epoch has dealt its last one.
    ahead: Option<Ahead<F::Output>>,
    /// Whether this epoch may start the next one's first batches (`prefetch_next_epoch`,
    /// persistent workers, an indexed dataset; cleared when a start had to be discarded).
    may_start_ahead: bool,
    /// Batches are marked delivered by whoever hands them to the user ([`Marker`]), not when
    /// this iterator yields them (a prefetching stage between them holds some back).
    defer_marks: bool,
    /// The position of the item yielded last, and whether it counts as delivered.
    last: Option<(u64, bool)>,
    epoch: u64,
    generation: u64,
    /// Indexed datasets: the batches not yet sent.
    batches: Option<Batches>,
    /// Batches sent and not yet delivered, in sending (= position) order.
    slots: VecDeque<Slot<F::Output>>,
    /// Slots in state `Done`.
    ready: usize,
    outstanding: Vec<usize>,
    in_flight: usize,
    rr: usize,
    /// Iterable mode: workers whose stream has not ended, and the next position to assign.
    active: Vec<bool>,
    next_seq: u64,
    /// Iterable mode: the epoch's position of the next batch delivered, and the batches below
    /// which are replayed and discarded (a resume without a stream position).
    stream_pos: u64,
    replay_until: u64,
    finished: bool,
    broken: bool,
    /// The epoch ended because a worker did not answer (timeout, dead worker): it may be
    /// stuck in dataset code, so the workers are stopped in the background.
    unresponsive: bool,
    started: Option<Instant>,
    last_yield: Instant,
    /// The indices of the batch being delivered, when the loader counts sources.
    taken: Vec<usize>,
    pending: Pending,
}

impl<F: Fetch> fmt::Debug for LoaderIter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderIter")
            .field("epoch", &self.epoch)
            .field("in_flight", &self.in_flight)
            .field("ready", &self.ready)
            .field("finished", &self.finished)
            .finish()
    }
}

impl<F: Fetch> LoaderIter<F> {
    pub(crate) fn new(inner: Arc<Inner<F>>) -> Self {
        let indexed = inner.fetch.indexed();
        let mut batches = None;
        let mut num_batches = 0u64;
        let mut adopted: Option<Ahead<F::Output>> = None;
        let mut discarded: Option<Ahead<F::Output>> = None;
        let (config, epoch, restored, parked) = {
            let mut guard = lock(&inner.plan);
            let plan = &mut *guard;
            let epoch = plan.next_epoch;
            plan.next_epoch = epoch + 1;
            let restored = plan.restored.take();
            let seed = plan.config.seed;
            let prepares = plan.sampler.prepares();
            let prepared = plan.prepared.take();
            // Lock order: plan (held) -> persistent.
            let mut parked = if plan.config.options.persistent_workers {
                lock(&inner.persistent).take()
            } else {
                None
            };
            if let Some(a) = parked.as_mut().and_then(|p| p.ahead.take()) {
                let key = AheadKey {
                    epoch,
                    seed,
                    revision: plan.revision,
                };
                if a.key == key && restored.is_none() {
                    adopted = Some(a);
                } else {
                    discarded = Some(a);
                }
            }
            if indexed && let Some(s) = plan.sampler.get() {
                s.set_epoch(epoch);
                num_batches = s.len() as u64;
                if let Some(a) = adopted.as_mut() {
                    // The rest of the epoch, from where the start ahead stopped.
                    batches = a.batches.take();
                } else {
                    // Batches below the restored prefix were delivered: the sampler skips them.
                    let from = restored.as_ref().map_or(0, |r| r.prefix.min(num_batches));
                    let iter = match prepared {
                        Some(p) if from == 0 => p.take(epoch, seed),
                        _ => None,
                    }
                    .unwrap_or_else(|| s.iter_owned_from(from as usize));
                    batches = Some(Batches::new(iter, from, restored.clone()));
                }
                if prepares {
                    plan.prepared = Prepared::spawn(&mut **s, epoch + 1, seed);
                }
            } else if indexed && let Some(a) = adopted.take() {
                discarded = Some(a);
            }
            (plan.config.clone(), epoch, restored, parked)
        };
        // An iterable dataset lays out its epoch (or resumes it) before its streams open.
        let mut stream_failed = None;
        let stream = if indexed {
            None
        } else {
            let (begun, error) = stream::begin(&*inner.fetch, &config, epoch, restored.as_ref());
            stream_failed = error;
            num_batches = begun.num_batches;
            Some(begun)
        };
        let run = NEXT_RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut p = restored.unwrap_or_else(|| Progress::new(epoch, num_batches));
            p.owner = run;
            if let Some(b) = &stream {
                p.num_batches = num_batches;
                p.stream = Some(b.progress.clone());
            }
            *lock(&inner.progress) = p;
        }
        let discarded_batches = discarded.as_ref().map_or(0, |a| a.len() as u64);
        {
            let mut s = lock(&inner.stats);
            s.epochs += 1;
            s.speculative_discarded += discarded_batches;
        }
        let span = tracing::debug_span!(target: "longshore::loader", "epoch", epoch, batches = num_batches);
        let _e = span.enter();
        if discarded_batches > 0 {
            tracing::debug!(target: "longshore::loader", discarded = discarded_batches, "the next epoch's batches started ahead are not this epoch's: discarded");
        }
        // Its leases go back to the pool here, under no loader lock (its queued tasks die with
        // the new generation below).
        drop(discarded);
        // Workers: the persistent set, or a new one; none for map-style with num_workers 0.
        let n = config.options.num_workers;
        let threads = if n == 0 && indexed { 0 } else { n.max(1) };
        let may_start_ahead =
            config.options.prefetch_next_epoch && config.options.persistent_workers && threads > 0;
        let mut it = Self {
            inner: inner.clone(),
            engine: None,
            config,
            run,
            lineage: run,
            ahead: None,
            may_start_ahead,
            defer_marks: false,
            last: None,
            epoch,
            generation: 0,
            batches,
            slots: VecDeque::new(),
            ready: 0,
            outstanding: vec![0; threads],
            in_flight: 0,
            rr: 0,
            active: vec![true; threads],
            next_seq: 0,
            stream_pos: stream.as_ref().map_or(0, |b| b.progress.base),
            replay_until: stream.as_ref().map_or(0, |b| b.replay_until),
            finished: false,
            broken: false,
            unresponsive: false,
            started: None,
            last_yield: Instant::now(),
            taken: Vec::new(),
            pending: Pending::default(),
        };
        if let Some(e) = stream_failed {
            it.fail_at_start(e);
        } else if threads > 0 {
            let engine = match parked {
                Some(p) => Ok(p.engine),
                None => Engine::start(
                    threads,
                    worker_body(
                        inner.fetch.clone(),
                        inner.worker_init.clone(),
                        inner.threads.clone(),
                        threads,
                        it.config.seed,
                    ),
                    it.config.options.shutdown_timeout,
                ),
            };
            match engine {
                Ok(e) => {
                    match adopted {
                        Some(a) => {
                            let early = e.promote(a.generation);
                            it.adopt(a);
                            for r in early {
                                it.absorb(r);
                            }
                        }
                        None => it.generation = e.new_generation(),
                    }
                    it.engine = Some(e);
                }
                Err(e) => it.fail_at_start(e),
            }
        }
        it
    }

    /// Ends the epoch before it starts: its only item is `e`.
    fn fail_at_start(&mut self, e: LoaderError) {
        self.finished = true;
        self.batches = None;
        self.slots.push_back(Slot {
            seq: 0,
            worker: 0,
            state: SlotState::Done(Outcome::Failed(e)),
            indices: Vec::new(),
        });
        self.ready = 1;
        self.in_flight = 1;
    }

    /// The slot of the batch at position `seq`, if it is sent and not delivered.
    fn slot_index(&self, seq: u64) -> Option<usize> {
        self.slots.binary_search_by_key(&seq, |s| s.seq).ok()
    }

    /// Sends tasks until the in-flight bound is reached, pulling batches from the sampler;
    /// once this epoch has dealt its last batch, starts the next epoch's first ones.
    fn fill(&mut self) -> Result<(), LoaderError> {
        if self.engine.is_none() {
            return Ok(());
        }
        let capacity = self.in_flight_limit();
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        let indexed = self.inner.fetch.indexed();
        let n = self.outstanding.len();
        // `in_flight` counts every batch sent and not yet yielded, including those held back in
        // the reorder buffer (as PyTorch's outstanding tasks do): otherwise sent-but-undelivered
        // batches, and their pool memory, could reach twice `num_workers * prefetch_factor`.
        // Batches started ahead for the next epoch count against the same bound.
        let ahead = self.ahead.as_ref().map_or(0, Ahead::len);
        while self.in_flight + ahead < capacity {
            let (seq, indices) = if indexed {
                match self.batches.as_mut().and_then(Batches::pull) {
                    Some(t) => t,
                    None => break,
                }
            } else {
                if !self.active.iter().any(|a| *a) {
                    break;
                }
                let s = self.next_seq;
                self.next_seq += 1;
                (s, Vec::new())
            };
            // In order: round-robin (PyTorch). Out of order: the least loaded worker.
            let w = if self.config.options.in_order || !indexed {
                let mut w = self.rr % n;
                while !self.active[w] {
                    w = (w + 1) % n;
                }
                self.rr = w + 1;
                w
            } else {
                (0..n)
                    .min_by_key(|&w| (self.outstanding[w], (w + n - self.rr % n) % n))
                    .unwrap_or(0)
            };
            engine.send(w, self.task(seq, indices))?;
            self.outstanding[w] += 1;
            self.in_flight += 1;
            self.slots.push_back(Slot {
                seq,
                worker: w,
                state: SlotState::Sent,
                indices: Vec::new(),
            });
        }
        // Dealt to the end: the sampler's last batch, or every stream exhausted.
        let dealt = if indexed {
            self.batches.as_ref().is_some_and(|b| b.ended)
        } else {
            !self.active.iter().any(|a| *a)
        };
        if self.may_start_ahead && self.in_flight + ahead < capacity && dealt {
            self.start_ahead(capacity)?;
        }
        let total = self.in_flight + self.ahead.as_ref().map_or(0, Ahead::len);
        self.pending.peak_in_flight = self.pending.peak_in_flight.max(total);
        Ok(())
    }

    /// Takes in a reply: of this epoch, or of the next epoch's batches started ahead.
    fn absorb(&mut self, r: Reply<F::Output>) {
        let keep = self.config.options.in_order || self.inner.sources.is_some();
        if r.generation != self.generation {
            if let Some(a) = self.ahead.as_mut().filter(|a| a.generation == r.generation) {
                a.absorb(r, keep);
            }
            return;
        }
        if matches!(r.outcome, Outcome::Exhausted) {
            self.active[r.worker] = false;
        }
        if let Outcome::Batch(b) = &r.outcome {
            self.learn_block(self.inner.fetch.output_bytes(b));
        }
        self.pending.replies.add(&r);
        if settle(&mut self.slots, &mut self.outstanding, r, keep) {
            self.ready += 1;
            self.pending.peak_reorder = self.pending.peak_reorder.max(self.ready);
        }
    }

    /// The worker a batch was sent to (0 if it is not in flight).
    fn worker_of(&self, seq: u64) -> usize {
        self.slot_index(seq).map_or(0, |i| self.slots[i].worker)
    }

    /// Waits for a reply, bounded by the timeout; detects dead workers instead of hanging.
    fn wait_reply(&mut self, awaited: Option<u64>) -> Result<(), LoaderError> {
        if self.engine.is_none() {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut reported = Duration::ZERO;
        loop {
            // A long wait says what it waits for (a hang, or a dataset that slow, is then
            // diagnosed from the log): every `STALL_REPORT` at debug level, once as a warning.
            let waited = t0.elapsed();
            if waited >= reported + STALL_REPORT {
                reported = waited;
                self.report_stall(awaited, waited);
            }
            // With finished batches held back, check often whether they starve the pool.
            let slice = if self.ready == 0 {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(20)
            };
            let wait = match self.config.options.timeout {
                Some(t) => (t.saturating_sub(t0.elapsed())).min(slice),
                None => slice,
            };
            let Some(engine) = &self.engine else {
                return Ok(());
            };
            match engine.recv(Some(wait)) {
                Ok(r) => {
                    let ours = r.generation == self.generation;
                    self.absorb(r);
                    // A batch of the next epoch does not end this wait (nor restart its timeout).
                    if ours {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let seq = awaited
                        .or_else(|| self.slots.front().map(|s| s.seq))
                        .unwrap_or(0);
                    let worker = self.worker_of(seq);
                    if let Some(t) = self.config.options.timeout
                        && t0.elapsed() >= t
                    {
                        return Err(LoaderError::Timeout {
                            worker,
                            batch: seq,
                            waited: t0.elapsed(),
                        });
                    }
                    let dead = engine.dead_workers();
                    if let Some(&w) = dead.iter().find(|&&w| self.outstanding[w] > 0) {
                        let batch = self
                            .slots
                            .iter()
                            .find(|s| s.worker == w && matches!(s.state, SlotState::Sent))
                            .map_or(seq, |s| s.seq);
                        return Err(LoaderError::WorkerGone { worker: w, batch });
                    }
                    // Batches of the next epoch hold pool memory this epoch's awaited batch may
                    // be waiting for (they cannot be delivered before this epoch ends): they go
                    // first.
                    if self.ahead.is_some()
                        && self
                            .inner
                            .pool
                            .best_waiting()
                            .is_some_and(|r| r < rank(self.epoch.saturating_add(1), 0))
                    {
                        self.discard_ahead();
                        continue;
                    }
                    self.relieve_budget()?;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let seq = awaited.unwrap_or(0);
                    return Err(LoaderError::WorkerGone {
                        worker: self.worker_of(seq),
                        batch: seq,
                    });
                }
            }
        }
    }

    /// Loads the next batch on the calling thread (`num_workers == 0`).
    fn next_sync(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        let (seq, indices) = self.batches.as_mut()?.pull()?;
        let info =
            WorkerInfo::single(worker_seed(self.config.seed, self.epoch, 0)).with_epoch(self.epoch);
        let _guard = longshore_data::worker::enter(info);
        let _epoch = longshore_data::worker::enter_epoch(self.epoch);
        let _seed = longshore_data::worker::enter_seed(self.config.seed);
        let task = Task {
            generation: 0,
            epoch: self.epoch,
            lineage: self.lineage,
            seq,
            indices,
            rank: rank(self.epoch, seq),
        };
        let fetch = &*self.inner.fetch;
        let t0 = Instant::now();
        let outcome = match guarded(|| {
            let mut w = fetch.worker(info);
            fetch.fetch(&mut w, &task, &|| false)
        }) {
            Ok((o, skipped)) => {
                self.pending.replies.skipped += skipped;
                o
            }
            Err(message) => Outcome::Failed(LoaderError::WorkerPanicked {
                worker: 0,
                batch: seq,
                message,
            }),
        };
        self.pending.replies.worker_busy += t0.elapsed();
        if self.inner.sources.is_some() {
            self.taken = task.indices;
        }
        Some((seq, outcome))
    }

    /// Takes the outcome of the slot at `i` (in state `Done`) for delivery.
    fn take(&mut self, i: usize) -> (u64, Outcome<F::Output>) {
        let slot = &mut self.slots[i];
        let SlotState::Done(o) = std::mem::replace(&mut slot.state, SlotState::Taken) else {
            unreachable!("only finished slots are taken");
        };
        let seq = slot.seq;
        if self.inner.sources.is_some() {
            self.taken = std::mem::take(&mut slot.indices);
        }
        self.ready -= 1;
        self.in_flight -= 1;
        while self
            .slots
            .front()
            .is_some_and(|s| matches!(s.state, SlotState::Taken))
        {
            self.slots.pop_front();
        }
        (seq, o)
    }

    /// The next delivered outcome of this epoch, or `None` at its end.
    fn next_outcome(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        if self.engine.is_none() {
            if self.finished {
                return self
                    .slots
                    .front()
                    .is_some_and(|s| matches!(s.state, SlotState::Done(_)))
                    .then(|| self.take(0));
            }
            return self.next_sync();
        }
        if let Err(e) = self.fill() {
            return Some((0, Outcome::Failed(e)));
        }
        loop {
            if self.config.options.in_order || !self.inner.fetch.indexed() {
                let front = self.slots.front()?;
                if matches!(front.state, SlotState::Done(_)) {
                    return Some(self.take(0));
                }
                let seq = front.seq;
                if let Err(e) = self.wait_reply(Some(seq)) {
                    return Some((seq, Outcome::Failed(e)));
                }
            } else {
                if self.ready > 0
                    && let Some(i) = self
                        .slots
                        .iter()
                        .position(|s| matches!(s.state, SlotState::Done(_)))
                {
                    return Some(self.take(i));
                }
                if self.in_flight == 0 {
                    return None;
                }
                if let Err(e) = self.wait_reply(None) {
                    let seq = self.slots.front().map_or(0, |s| s.seq);
                    return Some((seq, Outcome::Failed(e)));
                }
            }
        }
    }

    fn end_epoch(&mut self, broken: bool) {
        self.finished = true;
        self.broken |= broken;
        self.batches = None;
        self.release_engine();
    }
}

impl<F: Fetch> LoaderIter<F> {
    /// Gives the workers back: to the loader (persistent workers, epoch not broken) or to a
    /// shutdown, synchronous unless a worker did not answer.
    fn release_engine(&mut self) {
        let Some(mut engine) = self.engine.take() else {
            self.pending.flush(&mut lock(&self.inner.stats));
            return;
        };
        // Leases held in the reorder buffer go back to the pool now.
        self.slots.clear();
        self.ready = 0;
        // The next epoch's batches started ahead are kept only when this epoch ran to its end
        // and the workers are kept: otherwise their leases go back now.
        let keep = self.config.options.persistent_workers && self.finished && !self.broken;
        let ahead = if keep {
            self.ahead.take()
        } else {
            if let Some(a) = self.ahead.take() {
                self.pending.discarded += a.len() as u64;
            }
            None
        };
        self.pending.flush(&mut lock(&self.inner.stats));
        if self.config.options.persistent_workers && !self.broken {
            if ahead.is_none() {
                engine.new_generation();
            }
            // A set parked meanwhile (by another iterator of a clone) is stopped here, its
            // leases returned, under no loader lock.
            let replaced = lock(&self.inner.persistent).replace(Parked { ahead, engine });
            drop(replaced);
        } else if self.unresponsive {
            // A timeout or a dead worker is being yielded: a worker may be stuck in dataset
            // code, so the bounded join (up to `shutdown_timeout`) runs in the background and
            // the error reaches the user at the timeout. Other fatal errors (a panic) leave
            // responsive workers: they are joined here, so every lease is back when the error
            // is yielded.
            engine.shutdown_in_background();
        } else {
            engine.shutdown();
        }
    }
}

impl<F: Fetch> Iterator for LoaderIter<F> {
    type Item = Result<F::Output, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        let now = Instant::now();
        let since_last = if self.started.is_some() {
            now - self.last_yield
        } else {
            Duration::ZERO
        };
        self.started.get_or_insert(now);
        loop {
            if self.finished && self.engine.is_none() && self.slots.is_empty() {
                // An epoch that could not start has ended too (a broken one has not: it
                // resumes where it broke).
                if !self.broken && !self.inner.fetch.indexed() {
                    stream::ended(&self.inner.progress, self.run);
                }
                return None;
            }
            let next = self.next_outcome();
            let Some((seq, outcome)) = next else {
                self.end_epoch(false);
                if !self.inner.fetch.indexed() {
                    stream::ended(&self.inner.progress, self.run);
                }
                return None;
            };
            let end = Instant::now();
            // A batch counts as delivered (for resume) unless it never came back at all.
            let delivered = !matches!(
                outcome,
                Outcome::Failed(
                    LoaderError::Timeout { .. }
                        | LoaderError::WorkerGone { .. }
                        | LoaderError::Spawn { .. }
                )
            );
            if let Outcome::Batch(b) = &outcome {
                let pinned = self.inner.fetch.output_pinned_wait(b);
                self.pending.consumer_pinned += pinned.min(end - now);
            }
            let item = match outcome {
                Outcome::Batch(b) => Some(Ok(b)),
                Outcome::Empty | Outcome::Exhausted => None,
                Outcome::Failed(e) => Some(Err(e)),
            };
            // A batch's position in the epoch: its index batch's, or for streams the count of
            // batches delivered before it (a stream's end holds no position).
            let seq = if self.inner.fetch.indexed() {
                seq
            } else if item.is_some() {
                self.stream_pos += 1;
                self.stream_pos - 1
            } else {
                continue;
            };
            // A replayed batch was delivered before the checkpoint: discarded (a fatal error
            // still ends the epoch).
            if seq < self.replay_until && item.as_ref().is_some_and(|i| !is_fatal(i, &self.config))
            {
                self.pending.replayed += 1;
                continue;
            }
            // Nothing to hand over (every sample skipped) counts at once, deferred or not.
            if delivered && (!self.defer_marks || item.is_none()) {
                lock(&self.inner.progress).mark(self.run, seq);
            }
            let Some(item) = item else { continue };
            self.last = Some((seq, delivered));
            {
                let mut s = lock(&self.inner.stats);
                s.batches += 1;
                match &item {
                    Ok(b) => {
                        s.samples += self.inner.fetch.output_samples(b) as u64;
                        if let Some(c) = &self.inner.sources {
                            c.add(&mut s.sources, &self.taken);
                        }
                    }
                    Err(_) => s.errors += 1,
                }
                s.consumer_wait += end - now;
                s.consumer_time += since_last + (end - now);
                self.pending.flush(&mut s);
            }
            self.last_yield = end;
            if let Err(e) = &item
                && is_fatal(&item, &self.config)
            {
                self.unresponsive = matches!(
                    e,
                    LoaderError::Timeout { .. } | LoaderError::WorkerGone { .. }
                );
                tracing::error!(target: "longshore::loader", error = %crate::error::chain(e), epoch = self.epoch, "ending the epoch");
                self.end_epoch(true);
            }
            return Some(item);
        }
    }
}

/// Whether `item` ends its epoch: a panic under [`WorkerPanicPolicy::Fail`], a timeout, a
/// worker gone or not started.
fn is_fatal<T>(item: &Result<T, LoaderError>, config: &LoaderConfig) -> bool {
    match item {
        Err(LoaderError::WorkerPanicked { .. }) => {
            config.options.on_worker_panic == WorkerPanicPolicy::Fail
        }
        Err(
            LoaderError::Timeout { .. }
            | LoaderError::WorkerGone { .. }
            | LoaderError::Spawn { .. },
        ) => true,
        _ => false,
    }
}

impl<F: Fetch> Drop for LoaderIter<F> {
    fn drop(&mut self) {
        self.release_engine();
    }
}
