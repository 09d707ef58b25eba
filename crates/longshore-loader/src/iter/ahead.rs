//! The next epoch's first batches, started while an epoch drains: the iterator's side of
//! `next_epoch.rs` (starting them, adopting them as the next epoch's own, discarding them).

use super::*;
use crate::shared::stream_layout;

impl<F: Fetch> LoaderIter<F> {
    /// Takes the next epoch's first batches started ahead (`next_epoch.rs`) as this epoch's
    /// own: they were dealt as this epoch deals its first batches (position `k` to worker
    /// `k % num_workers`), so dealing goes on from there.
    pub(super) fn adopt(&mut self, a: Ahead<F::Output>) {
        let n = self.outstanding.len();
        self.generation = a.generation;
        self.lineage = a.lineage;
        self.outstanding = a.outstanding;
        self.in_flight = a.slots.len();
        self.ready = a.ready;
        self.rr = a.slots.len() % n;
        // Streams: dealing goes on after the positions sent ahead, to the workers whose next
        // epoch's stream has not already ended.
        self.next_seq = a.slots.len() as u64;
        for slot in &a.slots {
            if matches!(slot.state, SlotState::Done(Outcome::Exhausted)) {
                self.active[slot.worker] = false;
            }
        }
        self.pending.adopted += a.slots.len() as u64;
        let counts = a.counts;
        self.pending.replies.worker_busy += counts.worker_busy;
        self.pending.replies.pinned_wait += counts.pinned_wait;
        self.pending.replies.skipped += counts.skipped;
        self.pending.replies.restarts += counts.restarts;
        self.pending.peak_reorder = self.pending.peak_reorder.max(self.ready);
        self.slots = a.slots;
        tracing::debug!(target: "longshore::loader", epoch = self.epoch, adopted = self.in_flight, ready = self.ready, "epoch starts with batches started ahead");
    }

    /// Starts the next epoch's first batches on the workers, up to `capacity` batches in
    /// flight with this epoch's (see `next_epoch.rs`). The first call opens the start: the
    /// epoch the loader runs next, with its order drawn from the sampler now.
    pub(super) fn start_ahead(&mut self, capacity: usize) -> Result<(), LoaderError> {
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        if self.ahead.is_none() {
            let n = self.outstanding.len();
            let mut guard = lock(&self.inner.plan);
            let plan = &mut *guard;
            let key = AheadKey {
                epoch: plan.next_epoch,
                seed: plan.config.seed,
                revision: plan.revision,
            };
            // A restored position runs next: not a whole epoch from its start.
            if plan.restored.is_some() {
                self.may_start_ahead = false;
                return Ok(());
            }
            // The next epoch's order is still being drawn in the background: start its
            // batches at a later fill rather than wait for it here, on the consumer's thread
            // in the middle of this epoch's tail (a 2 M-row permutation takes 10-50 ms).
            if plan.prepared.as_ref().is_some_and(|p| !p.is_ready()) {
                return Ok(());
            }
            let batches = if self.inner.fetch.indexed() {
                let prepared = plan.prepared.take();
                let Some(s) = plan.sampler.get() else {
                    self.may_start_ahead = false;
                    return Ok(());
                };
                let iter = prepared
                    .and_then(|p| p.take(key.epoch, key.seed))
                    .unwrap_or_else(|| {
                        let current = s.epoch();
                        s.set_epoch(key.epoch);
                        let iter = s.iter_owned_from(0);
                        s.set_epoch(current);
                        iter
                    });
                drop(guard);
                Some(Batches::new(iter, 0, None))
            } else {
                // The dataset lays out the next epoch before its streams open (a refusal is
                // the next epoch's own first item, not this one's).
                let layout = stream_layout(&*self.inner.fetch, &plan.config, key.epoch);
                drop(guard);
                if let Some(layout) = layout
                    && let Err(e) = self.inner.fetch.begin_epoch(&layout, None)
                {
                    tracing::debug!(target: "longshore::loader", error = %crate::error::chain(&e), next_epoch = key.epoch, "the next epoch cannot be laid out: not started ahead");
                    self.may_start_ahead = false;
                    return Ok(());
                }
                None
            };
            let generation = engine.open_ahead();
            let lineage = NEXT_RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(target: "longshore::loader", epoch = self.epoch, next_epoch = key.epoch, "starting the next epoch's first batches");
            self.ahead = Some(Ahead::new(key, generation, lineage, batches, n));
        }
        let Some(a) = self.ahead.as_mut() else {
            return Ok(());
        };
        while self.in_flight + a.len() < capacity {
            let Some((seq, w, indices)) = a.next_task() else {
                break;
            };
            engine.send(
                w,
                Task {
                    generation: a.generation,
                    epoch: a.key.epoch,
                    lineage: a.lineage,
                    seq,
                    indices,
                    rank: crate::engine::rank(a.key.epoch, seq),
                },
            )?;
            a.sent(seq, w);
        }
        Ok(())
    }

    /// Discards the next epoch's batches started ahead: their leases go back to the pool,
    /// their queued tasks are skipped, and this epoch starts no other.
    pub(super) fn discard_ahead(&mut self) {
        self.may_start_ahead = false;
        let Some(a) = self.ahead.take() else {
            return;
        };
        if let Some(e) = &self.engine {
            e.close_ahead();
        }
        self.pending.discarded += a.len() as u64;
        tracing::debug!(target: "longshore::loader", epoch = self.epoch, discarded = a.len(), "discarding the next epoch's batches started ahead");
        drop(a);
    }
}
