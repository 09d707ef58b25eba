//! [`LoaderIter`]: one epoch of a loader, on the consumer's thread. It deals tasks to the
//! workers, keeps the reorder buffer, enforces the timeout, detects dead workers and relieves
//! a starved pool; with `num_workers == 0` it loads on the calling thread.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::RecvTimeoutError;
use longshore_data::WorkerInfo;

use crate::config::{LoaderConfig, WorkerPanicPolicy};
use crate::engine::{Engine, Outcome, Reply, Task, guarded};
use crate::error::LoaderError;
use crate::fetch::Fetch;
use crate::loader::{Inner, lock};
use crate::state::Progress;
use crate::worker::{worker_body, worker_seed};

/// One epoch of a [`DataLoader`](crate::DataLoader): yields `Result<batch, LoaderError>`.
///
/// Dropping it mid-epoch stops the workers (bounded by the loader's `shutdown_timeout`) and
/// returns every leased buffer to the pool; with `persistent_workers` the workers are kept
/// for the next epoch and only the outstanding work is cancelled.
pub struct LoaderIter<F: Fetch> {
    inner: Arc<Inner<F>>,
    engine: Option<Engine<F::Output>>,
    config: LoaderConfig,
    epoch: u64,
    generation: u64,
    /// Batches not yet sent: (position, indices). Empty indices for iterable datasets.
    to_send: VecDeque<(u64, Vec<usize>)>,
    /// Positions sent, in delivery order (in-order mode).
    order: VecDeque<u64>,
    sent_to: HashMap<u64, usize>,
    /// In-order mode: the indices of batches sent and not yet delivered, so a finished batch
    /// held in the reorder buffer can be given back to a starved pool and loaded again.
    indices_of: HashMap<u64, Vec<usize>>,
    outstanding: Vec<usize>,
    in_flight: usize,
    reorder: BTreeMap<u64, Outcome<F::Output>>,
    rr: usize,
    /// Iterable mode: workers whose stream has not ended, and the next position to assign.
    active: Vec<bool>,
    next_seq: u64,
    finished: bool,
    broken: bool,
    /// The epoch ended because a worker did not answer (timeout, dead worker): it may be
    /// stuck in dataset code, so the workers are stopped in the background.
    unresponsive: bool,
    started: Option<Instant>,
    last_yield: Instant,
}

impl<F: Fetch> fmt::Debug for LoaderIter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderIter")
            .field("epoch", &self.epoch)
            .field("to_send", &self.to_send.len())
            .field("in_flight", &self.in_flight)
            .field("reorder", &self.reorder.len())
            .field("finished", &self.finished)
            .finish()
    }
}

impl<F: Fetch> LoaderIter<F> {
    pub(crate) fn new(inner: Arc<Inner<F>>) -> Self {
        let indexed = inner.fetch.indexed();
        let mut to_send = VecDeque::new();
        let mut num_batches = 0u64;
        let (config, epoch, restored) = {
            let mut plan = lock(&inner.plan);
            let epoch = plan.next_epoch;
            plan.next_epoch = epoch + 1;
            let restored = plan.restored.take();
            if indexed && let Some(s) = plan.sampler.get() {
                s.set_epoch(epoch);
                for (i, b) in s.iter().enumerate() {
                    let seq = i as u64;
                    if restored.as_ref().is_none_or(|r| !r.is_done(seq)) {
                        to_send.push_back((seq, b));
                    }
                }
                num_batches = s.len() as u64;
            }
            (plan.config.clone(), epoch, restored)
        };
        *lock(&inner.progress) = restored.unwrap_or_else(|| Progress::new(epoch, num_batches));
        lock(&inner.stats).epochs += 1;
        let span = tracing::debug_span!(target: "longshore::loader", "epoch", epoch, batches = num_batches);
        let _e = span.enter();
        // Workers: the persistent set, or a new one; none for map-style with num_workers 0.
        let n = config.num_workers;
        let threads = if n == 0 && indexed { 0 } else { n.max(1) };
        let mut it = Self {
            inner: inner.clone(),
            engine: None,
            config,
            epoch,
            generation: 0,
            to_send,
            order: VecDeque::new(),
            sent_to: HashMap::new(),
            indices_of: HashMap::new(),
            outstanding: vec![0; threads],
            in_flight: 0,
            reorder: BTreeMap::new(),
            rr: 0,
            active: vec![true; threads],
            next_seq: 0,
            finished: false,
            broken: false,
            unresponsive: false,
            started: None,
            last_yield: Instant::now(),
        };
        if threads > 0 {
            let existing = if it.config.persistent_workers {
                lock(&inner.persistent).take()
            } else {
                None
            };
            let engine = match existing {
                Some(e) => Ok(e),
                None => Engine::start(
                    threads,
                    worker_body(
                        inner.fetch.clone(),
                        inner.worker_init.clone(),
                        threads,
                        it.config.seed,
                    ),
                    it.config.shutdown_timeout,
                ),
            };
            match engine {
                Ok(e) => {
                    it.generation = e.new_generation();
                    it.engine = Some(e);
                }
                Err(e) => {
                    it.finished = true;
                    it.reorder.insert(0, Outcome::Failed(e));
                    it.order.push_back(0);
                }
            }
        }
        it
    }

    fn capacity(&self) -> usize {
        self.outstanding.len() * self.config.prefetch_factor
    }

    /// Sends tasks until the in-flight bound is reached.
    fn fill(&mut self) -> Result<(), LoaderError> {
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        let indexed = self.inner.fetch.indexed();
        let n = self.outstanding.len();
        // `in_flight` counts every batch sent and not yet yielded, including those held back in
        // the reorder buffer (as PyTorch's outstanding tasks do): otherwise sent-but-undelivered
        // batches, and their pool memory, could reach twice `num_workers * prefetch_factor`.
        while self.in_flight < self.capacity() {
            let (seq, indices) = if indexed {
                match self.to_send.pop_front() {
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
            let w = if self.config.in_order || !indexed {
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
            if self.config.in_order && indexed {
                self.indices_of.insert(seq, indices.clone());
            }
            engine.send(
                w,
                Task {
                    generation: self.generation,
                    epoch: self.epoch,
                    seq,
                    indices,
                },
            )?;
            self.outstanding[w] += 1;
            self.in_flight += 1;
            self.sent_to.insert(seq, w);
            self.order.push_back(seq);
        }
        let mut stats = lock(&self.inner.stats);
        stats.peak_in_flight = stats.peak_in_flight.max(self.in_flight);
        Ok(())
    }

    fn absorb(&mut self, r: Reply<F::Output>) {
        // The worker is free for more; the batch still counts as in flight (it holds a lease)
        // until it is yielded, as PyTorch counts outstanding tasks.
        if let Some(w) = self.sent_to.remove(&r.seq) {
            self.outstanding[w] -= 1;
        }
        if matches!(r.outcome, Outcome::Exhausted) {
            self.active[r.worker] = false;
        }
        {
            let mut s = lock(&self.inner.stats);
            s.worker_busy += r.busy;
            s.skipped_samples += r.skipped;
        }
        self.reorder.insert(r.seq, r.outcome);
        let mut s = lock(&self.inner.stats);
        s.peak_reorder = s.peak_reorder.max(self.reorder.len());
    }

    /// Waits for a reply, bounded by the timeout; detects dead workers instead of hanging.
    fn wait_reply(&mut self, awaited: Option<u64>) -> Result<(), LoaderError> {
        if self.engine.is_none() {
            return Ok(());
        }
        let t0 = Instant::now();
        loop {
            // With finished batches held back, check often whether they starve the pool.
            let slice = if self.reorder.is_empty() {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(20)
            };
            let wait = match self.config.timeout {
                Some(t) => (t.saturating_sub(t0.elapsed())).min(slice),
                None => slice,
            };
            let Some(engine) = &self.engine else {
                return Ok(());
            };
            match engine.recv(Some(wait)) {
                Ok(r) => {
                    self.absorb(r);
                    return Ok(());
                }
                Err(RecvTimeoutError::Timeout) => {
                    let seq = awaited.or_else(|| self.order.front().copied()).unwrap_or(0);
                    let worker = self.sent_to.get(&seq).copied().unwrap_or(0);
                    if let Some(t) = self.config.timeout
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
                            .sent_to
                            .iter()
                            .find(|(_, ww)| **ww == w)
                            .map_or(seq, |(s, _)| *s);
                        return Err(LoaderError::WorkerGone { worker: w, batch });
                    }
                    self.relieve_budget()?;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let seq = awaited.unwrap_or(0);
                    return Err(LoaderError::WorkerGone {
                        worker: self.sent_to.get(&seq).copied().unwrap_or(0),
                        batch: seq,
                    });
                }
            }
        }
    }

    /// In-order mode, while the awaited batch does not come: if the pool has requests blocked
    /// on its budget and the reorder buffer holds later batches in pool memory, those batches
    /// may be what starves the awaited one (its worker waits for budget they hold: a deadlock
    /// until the pool's wait timeout). Gives the latest such batch back to the pool and loads
    /// it again later.
    fn relieve_budget(&mut self) -> Result<(), LoaderError> {
        if !self.config.in_order || self.inner.pool.stats().waiting == 0 {
            return Ok(());
        }
        let fetch = &self.inner.fetch;
        let Some(seq) = self.reorder.iter().rev().find_map(|(&s, o)| match o {
            Outcome::Batch(b) if fetch.output_bytes(b) > 0 && self.indices_of.contains_key(&s) => {
                Some(s)
            }
            _ => None,
        }) else {
            return Ok(());
        };
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        drop(self.reorder.remove(&seq));
        let indices = self.indices_of.get(&seq).cloned().unwrap_or_default();
        let n = self.outstanding.len();
        let w = (0..n).min_by_key(|&w| self.outstanding[w]).unwrap_or(0);
        tracing::debug!(target: "longshore::loader", reloaded = true, batch.seq = seq, worker.id = w, "pool budget starved: reloading a held-back batch later");
        engine.send(
            w,
            Task {
                generation: self.generation,
                epoch: self.epoch,
                seq,
                indices,
            },
        )?;
        // The batch was already counted in `in_flight` (it is sent and not yielded).
        self.outstanding[w] += 1;
        self.sent_to.insert(seq, w);
        lock(&self.inner.stats).reloaded += 1;
        Ok(())
    }

    /// Loads the next batch on the calling thread (`num_workers == 0`).
    fn next_sync(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        let (seq, indices) = self.to_send.pop_front()?;
        let info = WorkerInfo {
            id: 0,
            num_workers: 1,
            seed: worker_seed(self.config.seed, self.epoch, 0),
        };
        let _guard = longshore_data::worker::enter(info);
        let task = Task {
            generation: 0,
            epoch: self.epoch,
            seq,
            indices,
        };
        let fetch = &*self.inner.fetch;
        let t0 = Instant::now();
        let outcome = match guarded(|| {
            let mut w = fetch.worker(info);
            fetch.fetch(&mut w, &task, &|| false)
        }) {
            Ok((o, skipped)) => {
                lock(&self.inner.stats).skipped_samples += skipped;
                o
            }
            Err(message) => Outcome::Failed(LoaderError::WorkerPanicked {
                worker: 0,
                batch: seq,
                message,
            }),
        };
        lock(&self.inner.stats).worker_busy += t0.elapsed();
        Some((seq, outcome))
    }

    /// The next delivered outcome of this epoch, or `None` at its end.
    fn next_outcome(&mut self) -> Option<(u64, Outcome<F::Output>)> {
        if self.engine.is_none() {
            if self.finished {
                let seq = self.order.pop_front()?;
                return self.reorder.remove(&seq).map(|o| (seq, o));
            }
            return self.next_sync();
        }
        if let Err(e) = self.fill() {
            return Some((0, Outcome::Failed(e)));
        }
        loop {
            if self.config.in_order || !self.inner.fetch.indexed() {
                let &seq = self.order.front()?;
                if let Some(o) = self.reorder.remove(&seq) {
                    self.order.pop_front();
                    self.in_flight -= 1;
                    self.indices_of.remove(&seq);
                    return Some((seq, o));
                }
                if let Err(e) = self.wait_reply(Some(seq)) {
                    return Some((seq, Outcome::Failed(e)));
                }
            } else {
                if let Some((&seq, _)) = self.reorder.iter().next() {
                    let o = self.reorder.remove(&seq).expect("present");
                    self.order.retain(|s| *s != seq);
                    self.in_flight -= 1;
                    return Some((seq, o));
                }
                if self.in_flight == 0 {
                    return None;
                }
                if let Err(e) = self.wait_reply(None) {
                    let seq = self.order.front().copied().unwrap_or(0);
                    return Some((seq, Outcome::Failed(e)));
                }
            }
        }
    }

    fn end_epoch(&mut self, broken: bool) {
        self.finished = true;
        self.broken |= broken;
        self.to_send.clear();
        self.order.clear();
        self.indices_of.clear();
        self.release_engine();
    }
}

impl<F: Fetch> LoaderIter<F> {
    /// Gives the workers back: to the loader (persistent workers, epoch not broken) or to a
    /// shutdown, synchronous unless a worker did not answer.
    fn release_engine(&mut self) {
        let Some(mut engine) = self.engine.take() else {
            return;
        };
        // Leases held in the reorder buffer go back to the pool now.
        self.reorder.clear();
        let restarts = engine
            .shared
            .restarts
            .swap(0, std::sync::atomic::Ordering::Relaxed);
        lock(&self.inner.stats).worker_restarts += restarts;
        if self.config.persistent_workers && !self.broken {
            engine.new_generation();
            *lock(&self.inner.persistent) = Some(engine);
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
            if self.finished && self.engine.is_none() && self.order.is_empty() {
                return None;
            }
            let next = self.next_outcome();
            let Some((seq, outcome)) = next else {
                self.end_epoch(false);
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
            let item = match outcome {
                Outcome::Batch(b) => Some(Ok(b)),
                Outcome::Empty | Outcome::Exhausted => None,
                Outcome::Failed(e) => Some(Err(e)),
            };
            if delivered && self.inner.fetch.indexed() {
                lock(&self.inner.progress).mark(seq);
            }
            let Some(item) = item else { continue };
            {
                let mut s = lock(&self.inner.stats);
                s.batches += 1;
                match &item {
                    Ok(b) => s.samples += self.inner.fetch.output_samples(b) as u64,
                    Err(_) => s.errors += 1,
                }
                s.consumer_wait += end - now;
                s.consumer_time += since_last + (end - now);
            }
            self.last_yield = end;
            if let Err(e) = &item {
                let fatal = match e {
                    LoaderError::WorkerPanicked { .. } => {
                        self.config.on_worker_panic == WorkerPanicPolicy::Fail
                    }
                    LoaderError::Timeout { .. }
                    | LoaderError::WorkerGone { .. }
                    | LoaderError::Spawn { .. } => true,
                    _ => false,
                };
                if fatal {
                    self.unresponsive = matches!(
                        e,
                        LoaderError::Timeout { .. } | LoaderError::WorkerGone { .. }
                    );
                    tracing::error!(target: "longshore::loader", error = %crate::error::chain(e), epoch = self.epoch, "ending the epoch");
                    self.end_epoch(true);
                }
            }
            return Some(item);
        }
    }
}

impl<F: Fetch> Drop for LoaderIter<F> {
    fn drop(&mut self) {
        self.release_engine();
    }
}
