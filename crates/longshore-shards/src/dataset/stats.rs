//! What became of the samples a dataset could not read: [`ShardStats`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::ShardError;

/// What became of the samples a [`ShardedDataset`](super::ShardedDataset) could not read,
/// since it was built (every worker of this process; each process counts its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStats {
    /// Samples whose read failed, by reason (`"damaged shard"`, `"bad sample"`, `"missing
    /// field"`, `"unreachable shard"`).
    pub failed_by_reason: BTreeMap<String, u64>,
    /// Padding repeats read to make up for failed samples
    /// ([`OnSampleError::Skip`](super::OnSampleError::Skip)).
    pub padded: u64,
    /// Failed samples that could not be made up for (no sample of the epoch's order could be
    /// read to repeat): the worker yields an unskippable error in their place (a rank short
    /// of its planned batches would hang a distributed job), logged as an error.
    pub unpadded: u64,
    /// Shards found damaged (in the spec, or while reading).
    pub damaged_shards: u64,
    /// Their indices in the spec's shard list, ascending (what tells two processes' damaged
    /// shards apart when their counts are added).
    pub damaged: Vec<usize>,
    /// The shard cache's downloads, re-downloads and evictions per epoch, as this process's
    /// handle counted them ([`ShardCache::epoch_stats`](crate::cache::ShardCache::epoch_stats)):
    /// re-downloads are what a budget below the shuffle window's working set costs.
    pub cache: Vec<crate::cache::EpochCacheStats>,
    /// A mixture's samples read, by member ([`ShardedDataset::mixture`](super::ShardedDataset::mixture);
    /// empty for one dataset): what its workers yielded, a few batches ahead of the loader's
    /// delivery within an epoch, padding repeats included.
    pub members: Vec<u64>,
}

impl ShardStats {
    /// Samples whose read failed, all reasons together.
    pub fn failed(&self) -> u64 {
        self.failed_by_reason.values().sum()
    }
}

/// The live counters behind [`ShardStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    inner: Mutex<(ShardStats, BTreeSet<usize>)>,
}

impl Counters {
    fn lock(&self) -> std::sync::MutexGuard<'_, (ShardStats, BTreeSet<usize>)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `shard` is damaged; returns whether it was news (to log it once).
    pub(super) fn damaged(&self, shard: usize) -> bool {
        let mut g = self.lock();
        let (stats, shards) = &mut *g;
        let new = shards.insert(shard);
        stats.damaged_shards = shards.len() as u64;
        if new {
            stats.damaged = shards.iter().copied().collect();
        }
        new
    }

    /// A read of shard `shard` failed with `e`; returns whether the shard is newly known to
    /// be damaged.
    pub(super) fn failed(&self, shard: usize, e: &ShardError) -> bool {
        let reason = reason(e);
        *self
            .lock()
            .0
            .failed_by_reason
            .entry(reason.to_owned())
            .or_default() += 1;
        reason == DAMAGED && self.damaged(shard)
    }

    /// A sample of mixture member `member` (of `members`) was read.
    pub(super) fn member_read(&self, member: usize, members: usize) {
        let mut g = self.lock();
        let m = &mut g.0.members;
        if m.len() < members {
            m.resize(members, 0);
        }
        if let Some(c) = m.get_mut(member) {
            *c += 1;
        }
    }

    pub(super) fn padded(&self) {
        self.lock().0.padded += 1;
    }

    pub(super) fn unpadded(&self) {
        self.lock().0.unpadded += 1;
    }

    pub(super) fn snapshot(&self) -> ShardStats {
        self.lock().0.clone()
    }
}

const DAMAGED: &str = "damaged shard";

/// The reason a read failed, as [`ShardStats::failed_by_reason`] counts it.
fn reason(e: &ShardError) -> &'static str {
    match e {
        ShardError::Mds { reason, .. } | ShardError::Parquet { reason, .. }
            if reason.starts_with("missing required field") =>
        {
            "missing field"
        }
        ShardError::Tar { .. }
        | ShardError::Mds { .. }
        | ShardError::Parquet { .. }
        | ShardError::Damaged { .. } => DAMAGED,
        ShardError::Sample { reason, .. } if reason.starts_with("missing required field") => {
            "missing field"
        }
        ShardError::Sample { .. } => "bad sample",
        _ => "unreachable shard",
    }
}
