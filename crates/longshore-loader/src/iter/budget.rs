//! Dealing to the pool's budget: the iterator keeps no more batches in flight than the pool
//! can back with blocks, so that a batch never waits for memory held by batches delivered
//! after it (they could not be delivered before it: in order, a deadlock broken only by
//! giving them back and loading them again).
//!
//! The bound is `num_workers * prefetch_factor`, or, once the first batch tells the size of a
//! batch's block, `budget / block - 1` if that is smaller (at least 1): one block is left for
//! the batch the consumer holds while it asks for the next one. Until the first batch comes
//! back the size is unknown, and the bound is `num_workers` (one task per worker): no worker
//! then queues a batch behind another, so a batch given back to a starved pool and sent again
//! always finds a worker with nothing queued that is delivered after it (the bound below the
//! worker count keeps that true later: fewer batches are waiting than there are workers). Blocks then go to batches in
//! delivery order: each pool request is ranked by its batch's position
//! ([`rank`](crate::engine::rank)), and the pool hands a returning block to the best-ranked
//! waiter ([`PinnedPool::alloc_ranked`](longshore_host::PinnedPool::alloc_ranked)).

use std::sync::atomic::Ordering;

use super::*;
use crate::config::LoaderWarning;

/// `Inner::block_bytes` before the first batch came back.
pub(crate) const UNKNOWN_BLOCK: usize = usize::MAX;

/// The in-flight bound for batches of `block` bytes under `budget`, from `wanted`
/// (`num_workers * prefetch_factor`) and the worker count.
pub(crate) fn budget_limit(workers: usize, wanted: usize, block: usize, budget: usize) -> usize {
    if block == 0 {
        return wanted;
    }
    if block == UNKNOWN_BLOCK {
        return wanted.min(workers.max(1));
    }
    let blocks = budget / block;
    wanted.min(blocks.saturating_sub(1).max(1))
}

impl<F: Fetch> LoaderIter<F> {
    /// Most batches in flight (this epoch's and the next one's started ahead). With
    /// `num_workers == 0` (an iterable dataset, whose stream one thread runs): one, sent when
    /// the consumer asks for it, so nothing is loaded ahead, as PyTorch's loader loads in the
    /// calling process only when asked.
    pub(super) fn in_flight_limit(&mut self) -> usize {
        if self.config.options.num_workers == 0 {
            self.pending.in_flight_limit = 1;
            return 1;
        }
        let wanted = self.outstanding.len().max(1) * self.config.prefetch_factor.max(1);
        let block = self.inner.block_bytes.load(Ordering::Relaxed);
        let workers = self.outstanding.len();
        let limit = budget_limit(workers, wanted, block, self.inner.pool.config().budget);
        self.pending.in_flight_limit = limit;
        limit
    }

    /// A batch came back holding a pool block of `bytes`: the first one (or one of another
    /// size) sets the block size the bound is computed from, and warns once when the budget
    /// cannot back `num_workers * prefetch_factor` batches.
    pub(super) fn learn_block(&mut self, bytes: usize) {
        let known = self.inner.block_bytes.load(Ordering::Relaxed);
        if known != UNKNOWN_BLOCK && known >= bytes {
            return;
        }
        // 0: this batch holds no pool memory (a fallback, or a loader whose batches never
        // do); a later batch in a pool block still sets the size.
        self.inner.block_bytes.store(bytes, Ordering::Relaxed);
        if bytes == 0 {
            return;
        }
        let workers = self.outstanding.len();
        let wanted = workers.max(1) * self.config.prefetch_factor.max(1);
        let budget = self.inner.pool.config().budget;
        let in_flight = budget_limit(workers, wanted, bytes, budget);
        if wanted.saturating_mul(bytes) <= budget {
            return;
        }
        let warning = LoaderWarning::PrefetchExceedsBudget {
            num_workers: self.config.options.num_workers,
            prefetch_factor: self.config.prefetch_factor,
            batch_bytes: bytes,
            budget,
            in_flight,
        };
        let mut plan = lock(&self.inner.plan);
        let warnings = &mut plan.config.warnings;
        if warnings
            .iter()
            .any(|w| matches!(w, LoaderWarning::PrefetchExceedsBudget { .. }))
        {
            return;
        }
        tracing::warn!(target: "longshore::loader", warning = %warning, "loader option");
        warnings.push(warning);
    }

    /// In-order mode, while the awaited batch does not come: if a batch to be delivered
    /// before the latest finished one held in the reorder buffer waits for a pool block (its
    /// request is the best-ranked waiting), the finished batches may be what starves it, and
    /// through it the awaited one (a deadlock until the pool's wait timeout: the consumer holds
    /// more blocks than the in-flight bound leaves it, or a worker must load an earlier batch
    /// first). Gives that latest batch back to the pool, where the earlier request is served
    /// first, and loads it again later.
    pub(super) fn relieve_budget(&mut self) -> Result<(), LoaderError> {
        if !self.config.options.in_order {
            return Ok(());
        }
        let Some(best) = self.inner.pool.best_waiting() else {
            return Ok(());
        };
        let fetch = &self.inner.fetch;
        let Some(i) = self.slots.iter().rposition(|s| match &s.state {
            SlotState::Done(Outcome::Batch(b)) => {
                fetch.output_bytes(b) > 0 && !s.indices.is_empty()
            }
            _ => false,
        }) else {
            return Ok(());
        };
        let victim = self.slots[i].seq;
        if best >= rank(self.epoch, victim) {
            return Ok(());
        }
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        // Preferably a worker with nothing queued that is delivered after the batch (it then
        // waits behind nothing later), the least loaded among them. While the in-flight bound
        // is below the worker count (`iter/budget.rs`), one always has no task at all.
        let n = self.outstanding.len();
        let behind_later = |w: usize| {
            self.slots
                .iter()
                .any(|s| s.worker == w && s.seq > victim && matches!(s.state, SlotState::Sent))
        };
        let w = (0..n)
            .min_by_key(|&w| (behind_later(w), self.outstanding[w]))
            .unwrap_or(0);
        let slot = &mut self.slots[i];
        // The batch's lease goes back to the pool here.
        drop(std::mem::replace(&mut slot.state, SlotState::Sent));
        let seq = slot.seq;
        tracing::debug!(target: "longshore::loader", reloaded = true, batch.seq = seq, worker.id = w, "pool budget starved: reloading a held-back batch later");
        let indices = std::mem::take(&mut slot.indices);
        slot.worker = w;
        self.ready -= 1;
        let task = self.task(seq, indices);
        engine.send(w, task)?;
        // The batch was already counted in `in_flight` (it is sent and not yielded).
        self.outstanding[w] += 1;
        self.pending.reloaded += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{UNKNOWN_BLOCK, budget_limit};

    #[test]
    fn the_bound_leaves_one_block_for_the_consumer() {
        let mib = 1 << 20;
        // 16 workers x 2, 40 MiB batches.
        assert_eq!(budget_limit(16, 32, 40 * mib, 6 * 40 * mib), 5);
        assert_eq!(budget_limit(16, 32, 40 * mib, 12 * 40 * mib), 11);
        assert_eq!(budget_limit(16, 32, 40 * mib, 2 * 40 * mib), 1);
        assert_eq!(budget_limit(16, 32, 40 * mib, 40 * mib), 1);
        assert_eq!(budget_limit(16, 32, 40 * mib, 2048 * mib), 32);
        assert_eq!(
            budget_limit(16, 32, 0, 40 * mib),
            32,
            "batches hold no pool block"
        );
        assert_eq!(
            budget_limit(16, 32, UNKNOWN_BLOCK, 40 * mib),
            16,
            "one task per worker until the first batch"
        );
    }
}
