//! [`LoaderStats`]: who is the bottleneck, the loader or the model?

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use longshore_host::PoolStats;

use crate::placement::WorkerPlacement;

/// Counters of a loader since it was built (or since [`DataLoader::reset_stats`](crate::DataLoader::reset_stats)).
///
/// The key figure is [`wait_fraction`](LoaderStats::wait_fraction): the share of the
/// consumer's time spent blocked waiting for a batch. Near zero, the model is the bottleneck;
/// near one, the input pipeline is.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LoaderStats {
    /// Batches delivered (including errors).
    pub batches: u64,
    /// Samples in delivered batches.
    pub samples: u64,
    /// Samples skipped under [`SampleErrorPolicy::Skip`](crate::SampleErrorPolicy::Skip).
    pub skipped_samples: u64,
    /// Errors delivered.
    pub errors: u64,
    /// Worker restarts after panics.
    pub worker_restarts: u64,
    /// Time the consumer spent blocked in `next()` waiting for data.
    pub consumer_wait: Duration,
    /// Time from the first `next()` of each epoch to its last, summed.
    pub consumer_time: Duration,
    /// Time workers spent loading and collating, summed over workers.
    pub worker_busy: Duration,
    /// Most batches in flight at once (sent to workers, not yet delivered).
    pub peak_in_flight: usize,
    /// Most finished batches held back by the reorder buffer at once.
    pub peak_reorder: usize,
    /// Epochs started.
    pub epochs: u64,
    /// Finished batches given back to a starved pool by the reorder buffer and loaded again
    /// (in-order mode under [`BudgetPolicy::Wait`](longshore_host::BudgetPolicy::Wait)).
    pub reloaded: u64,
    /// Batches of an epoch started before its iterator was created, while the previous epoch
    /// drained ([`prefetch_next_epoch`](crate::DataLoaderBuilder::prefetch_next_epoch)), and
    /// taken over by it.
    pub speculative_batches: u64,
    /// Batches started ahead for a next epoch that did not come as predicted (`set_epoch` to
    /// another epoch, `load_state_dict`, an epoch dropped or ended by an error, a starved
    /// pool): discarded, never delivered.
    pub speculative_discarded: u64,
    /// Batches of a resumed epoch loaded again and discarded: an iterable dataset without a
    /// stream position is resumed by replaying its epoch up to the checkpoint (see
    /// [`LoaderState`](crate::LoaderState)).
    pub replayed_batches: u64,
    /// Time workers waited for pinned memory (the pool's budget), summed over workers.
    pub pinned_wait: Duration,
    /// The part of [`consumer_wait`](LoaderStats::consumer_wait) spent on pinned memory: for
    /// each delivered batch, the shorter of the consumer's wait for it and its worker's wait
    /// for a block. See [`pinned_wait_fraction`](LoaderStats::pinned_wait_fraction).
    pub consumer_pinned_wait: Duration,
    /// Most batches the loader keeps in flight: `num_workers * prefetch_factor`, or fewer
    /// where the pool's budget cannot back that many blocks (see
    /// [`LoaderWarning::PrefetchExceedsBudget`](crate::LoaderWarning::PrefetchExceedsBudget));
    /// until the first batch tells the size of a batch's block, `num_workers`. 0 before the
    /// first batch is dealt, and without workers.
    pub in_flight_limit: usize,
    /// The host-memory pool's counters.
    pub pool: PoolStats,
    /// Where the workers run now (the CPUs they are pinned to, and why); see
    /// [`Placement`](crate::Placement).
    pub placement: WorkerPlacement,
    /// The samples of the delivered batches, by source (a mixture's member), when the loader
    /// counts them ([`count_sources`](crate::DataLoaderBuilder::count_sources)); empty
    /// otherwise. A sample skipped under
    /// [`SampleErrorPolicy::Skip`](crate::SampleErrorPolicy::Skip) is counted in its source
    /// (its position was delivered) and in [`skipped_samples`](LoaderStats::skipped_samples).
    pub sources: Vec<u64>,
}

/// Which source each sample of a map-style dataset comes from, counted in
/// [`LoaderStats::sources`]: see [`count_sources`](crate::DataLoaderBuilder::count_sources).
#[derive(Clone)]
pub(crate) struct SourceCounter {
    pub(crate) count: usize,
    pub(crate) of: Arc<dyn Fn(usize) -> Option<usize> + Send + Sync>,
}

impl SourceCounter {
    /// Adds the sources of `indices` (a delivered batch's samples) to `counts`.
    pub(crate) fn add(&self, counts: &mut Vec<u64>, indices: &[usize]) {
        if counts.len() != self.count {
            counts.resize(self.count, 0);
        }
        for &i in indices {
            if let Some(c) = (self.of)(i).and_then(|s| counts.get_mut(s)) {
                *c += 1;
            }
        }
    }
}

impl fmt::Debug for SourceCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceCounter")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl LoaderStats {
    /// Share of the consumer's time spent waiting for data, in `0.0..=1.0`.
    pub fn wait_fraction(&self) -> f64 {
        let t = self.consumer_time.as_secs_f64();
        if t <= 0.0 {
            0.0
        } else {
            (self.consumer_wait.as_secs_f64() / t).clamp(0.0, 1.0)
        }
    }

    /// Share of the consumer's wait spent waiting for pinned memory, in `0.0..=1.0`: near
    /// one, the pool's budget is what the consumer waits for (raise it, or lower
    /// `prefetch_factor`); near zero, the budget costs nothing.
    pub fn pinned_wait_fraction(&self) -> f64 {
        let w = self.consumer_wait.as_secs_f64();
        if w <= 0.0 {
            0.0
        } else {
            (self.consumer_pinned_wait.as_secs_f64() / w).clamp(0.0, 1.0)
        }
    }

    /// Delivered samples per second of consumer time.
    pub fn samples_per_second(&self) -> f64 {
        let t = self.consumer_time.as_secs_f64();
        if t <= 0.0 {
            0.0
        } else {
            self.samples as f64 / t
        }
    }
}
