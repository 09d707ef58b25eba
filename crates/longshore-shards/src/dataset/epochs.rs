//! The epochs a loader begins on a [`ShardedDataset`]: each epoch's plan, split by the
//! loader's layout (batch size, `drop_last`, workers) from the epoch's start or from a resume
//! position, and kept by epoch, so that a next epoch begun ahead leaves the streams of the
//! epoch being read as they are.

use std::collections::VecDeque;
use std::sync::Arc;

use longshore_data::{
    DataError, EpochLayout, ItemIter, IterableDataset, StreamPosition, WorkerInfo,
};

use super::reader::WorkerReader;
use super::{Inner, ShardSample, ShardedDataset, TARGET};
use crate::ShardError;
use crate::order::{EpochOrder, EpochPlan, Layout, OrderConfig, ResumeState};

/// Epochs kept: the one being read, one begun ahead, and room for a loader's `len()` and a
/// restore.
const KEPT: usize = 8;

/// One epoch as a loader began it.
#[derive(Debug, Clone)]
pub(super) struct Epoch {
    pub(super) layout: EpochLayout,
    pub(super) resume: Option<ResumeState>,
    pub(super) plan: Arc<EpochPlan>,
}

/// The epochs begun, the last begun last.
#[derive(Debug, Default)]
pub(super) struct Begun(VecDeque<Epoch>);

impl Inner {
    /// Epoch `layout.epoch` split by `layout`, from its start or from `resume`: the plan begun
    /// so before, or a new one; it becomes the epoch's last begun.
    fn begin(
        &self,
        layout: &EpochLayout,
        resume: Option<ResumeState>,
    ) -> Result<Epoch, ShardError> {
        let same = |e: &Epoch| e.layout == *layout && e.resume == resume;
        let known = {
            let mut begun = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
            let at = begun.0.iter().rposition(same);
            at.and_then(|i| begun.0.remove(i))
        };
        let epoch = match known {
            Some(e) => e,
            None => self.make(layout, resume)?,
        };
        let mut begun = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        begun.0.push_back(epoch.clone());
        while begun.0.len() > KEPT {
            begun.0.pop_front();
        }
        Ok(epoch)
    }

    /// Epoch `layout.epoch` split by `layout`, from its start or from `resume`.
    fn make(&self, layout: &EpochLayout, resume: Option<ResumeState>) -> Result<Epoch, ShardError> {
        // The loader's drop_last decides what becomes of the ranks' uneven ends.
        let config = OrderConfig {
            drop_last: layout.drop_last,
            ..self.config
        };
        let order = Arc::new(match &self.spec.mixture {
            Some(m) => EpochOrder::mixed(&self.spec.counts, m, config, layout.epoch)?,
            None => EpochOrder::new(&self.spec.counts, config, layout.epoch)?,
        });
        let split = Layout::new(self.world_size, layout.num_workers, layout.batch_size)?;
        let plan = match &resume {
            Some(state) => EpochPlan::resume(order, state, split)?,
            None => EpochPlan::new(order, split),
        };
        tracing::debug!(target: TARGET, epoch = layout.epoch, workers = layout.num_workers, batch_size = layout.batch_size, resumed = resume.is_some(), batches = plan.remaining_batches(), "epoch planned");
        Ok(Epoch {
            layout: *layout,
            resume,
            plan: Arc::new(plan),
        })
    }

    /// The plan of epoch `layout.epoch` begun from `resume`: the one kept, or made again (not
    /// kept: it is not what a worker reads).
    fn plan_of(
        &self,
        layout: &EpochLayout,
        resume: Option<ResumeState>,
    ) -> Result<Epoch, ShardError> {
        let kept = {
            let begun = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
            begun
                .0
                .iter()
                .rev()
                .find(|e| e.layout == *layout && e.resume == resume)
                .cloned()
        };
        match kept {
            Some(e) => Ok(e),
            None => self.make(layout, resume),
        }
    }

    /// Epoch `epoch` as last begun (for `workers` workers, when given).
    pub(super) fn begun(&self, epoch: u64, workers: Option<usize>) -> Option<Epoch> {
        let begun = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        begun
            .0
            .iter()
            .rev()
            .find(|e| e.layout.epoch == epoch && workers.is_none_or(|w| w == e.layout.num_workers))
            .cloned()
    }
}

/// A shard error as the loader's: a resume state that does not fit names what differs.
fn data_err(e: ShardError, doing: String) -> DataError {
    match e {
        ShardError::Resume { .. } => DataError::StreamPosition(e.to_string()),
        e => DataError::custom(doing, e),
    }
}

impl IterableDataset for ShardedDataset {
    type Item = ShardSample;

    /// Worker `worker.id`'s stream of this rank's part of epoch `worker.epoch`, in order, as
    /// the loader last began the epoch for `worker.num_workers` workers (an error item if the
    /// plan cannot be made). Outside a loader, an epoch not begun for that many workers is
    /// read whole, in batches of 1, without `drop_last`.
    fn iter(&self, worker: WorkerInfo) -> ItemIter<'_, ShardSample> {
        let inner = &self.inner;
        let workers = worker.num_workers.max(1);
        let stream = (|| -> Result<_, ShardError> {
            let epoch = match inner.begun(worker.epoch, Some(workers)) {
                Some(e) => e,
                None => {
                    tracing::debug!(target: TARGET, epoch = worker.epoch, workers, "epoch not begun by a loader for this many workers: read in batches of 1");
                    inner.begin(&EpochLayout::new(worker.epoch, 0, 1, false, workers), None)?
                }
            };
            let stream = epoch.plan.rank(inner.rank)?.worker(worker.id)?;
            Ok((stream, epoch.plan))
        })();
        match stream {
            Ok((stream, plan)) => Box::new(WorkerReader::new(
                Arc::clone(inner),
                worker.id,
                stream,
                plan,
            )),
            Err(e) => Box::new(std::iter::once(Err(DataError::custom(
                format!("starting worker {} of a sharded dataset", worker.id),
                e,
            )))),
        }
    }

    /// Splits the epoch over the world size and the loader's workers in batches of the
    /// loader's batch size (see [`EpochPlan`]); from `resume`, a position of this dataset on
    /// any layout (another worker count or batch size re-splits what is left). Returns the
    /// batches each rank's loader yields (what is left after a resume).
    fn begin_epoch(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
    ) -> Result<Option<u64>, DataError> {
        let resume = resume
            .map(StreamPosition::decode::<ResumeState>)
            .transpose()?;
        let epoch = self
            .inner
            .begin(layout, resume)
            .map_err(|e| data_err(e, format!("beginning epoch {}", layout.epoch)))?;
        Ok(Some(epoch.plan.remaining_batches()))
    }

    /// The [`ResumeState`] after every rank took `batches` batches of the epoch begun with
    /// `layout` from `resume` (every rank computes the same).
    fn position(
        &self,
        layout: &EpochLayout,
        resume: Option<&StreamPosition>,
        batches: u64,
    ) -> Result<Option<StreamPosition>, DataError> {
        let resume = resume
            .map(StreamPosition::decode::<ResumeState>)
            .transpose()?;
        let epoch = self
            .inner
            .plan_of(layout, resume)
            .map_err(|e| data_err(e, format!("the position in epoch {}", layout.epoch)))?;
        let state = epoch
            .plan
            .state_after(batches)
            .map_err(|e| data_err(e, format!("the position in epoch {}", layout.epoch)))?;
        Ok(Some(StreamPosition::new(&state)?))
    }
}
