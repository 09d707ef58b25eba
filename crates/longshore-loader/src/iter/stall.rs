//! What a long wait for a batch is waiting for, logged while it waits (a hang, or a dataset
//! that slow, is then diagnosed from the log).

use std::time::Duration;

use super::*;

/// How often a wait for a batch logs what it waits for (debug level).
pub(super) const STALL_REPORT: Duration = Duration::from_secs(5);
/// The wait after which that report is a warning (once per wait).
const STALL_WARNING: Duration = Duration::from_secs(60);

impl<F: Fetch> LoaderIter<F> {
    /// Logs what a wait of `waited` for a batch (`awaited`, or any) is waiting for: the
    /// batches sent and their state, each worker's queue, the next epoch's batches started
    /// ahead and the pool's budget. A warning at the first report past `STALL_WARNING`.
    pub(super) fn report_stall(&self, awaited: Option<u64>, waited: Duration) {
        let slots: Vec<String> = self
            .slots
            .iter()
            .map(|s| {
                let state = match &s.state {
                    SlotState::Sent => "sent",
                    SlotState::Done(_) => "done",
                    SlotState::Taken => "taken",
                };
                format!("{}@{}:{state}", s.seq, s.worker)
            })
            .collect();
        let ahead = self.ahead.as_ref().map(|a| {
            format!(
                "{} sent ({} done, queued per worker {:?})",
                a.len(),
                a.ready,
                a.outstanding
            )
        });
        let pool = self.inner.pool.stats();
        let state = format!(
            "batches in flight {} (limit {}), ready {}, slots [{}], queued per worker {:?}, \
             next epoch's batches: {}, pool: {} of {} bytes held ({} blocks in use, {} pending \
             their fences, {} requests waiting, best rank {:?})",
            self.in_flight,
            self.pending.in_flight_limit,
            self.ready,
            slots.join(" "),
            self.outstanding,
            ahead.as_deref().unwrap_or("none"),
            pool.bytes_held,
            self.inner.pool.config().budget,
            pool.blocks_in_use,
            pool.blocks_pending,
            pool.waiting,
            self.inner.pool.best_waiting(),
        );
        let awaited = awaited.map_or_else(|| "any batch".to_owned(), |s| format!("batch {s}"));
        if waited >= STALL_WARNING && waited < STALL_WARNING + STALL_REPORT {
            tracing::warn!(target: "longshore::loader", epoch = self.epoch, waited_s = waited.as_secs(), %state, "the loader has waited {}s for {awaited} of epoch {}", waited.as_secs(), self.epoch);
        } else {
            tracing::debug!(target: "longshore::loader", epoch = self.epoch, waited_s = waited.as_secs(), %state, "still waiting for {awaited}");
        }
    }
}
