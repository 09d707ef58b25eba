//! The node's reference string of a dataset's epoch and its offline bounds, for the cache
//! schedule tests (included with `#[path = "support/schedule.rs"] mod schedule;` beside
//! `mod support;`).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;

use longshore_shards::cache::{belady_downloads, working_set_bytes};
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::order::{EpochOrder, EpochPlan, Layout};

/// The batch size the schedule tests' loaders read with.
pub const BATCH: usize = 8;

/// The shards the node reads in epoch `epoch`, in delivery order: each of `ranks` ranks'
/// batches as its loader delivers them (round-robin over `workers` workers, batches of
/// [`BATCH`]), the ranks in step (batch `k` of rank 0, of rank 1, ..., then batch `k + 1`).
pub fn node_refs(ds: &ShardedDataset, epoch: u64, ranks: &[usize], workers: usize) -> Vec<usize> {
    let order = Arc::new(EpochOrder::new(&ds.spec().counts, ds.order_config(), epoch).unwrap());
    let layout = Layout::new(ds.world_size(), workers, BATCH).unwrap();
    let plan = EpochPlan::new(order, layout);
    let mut per_rank: Vec<Vec<Vec<usize>>> = ranks
        .iter()
        .map(|&r| {
            plan.rank(r)
                .unwrap()
                .batches()
                .map(|b| b.iter().map(|s| s.sample.shard).collect())
                .collect()
        })
        .collect();
    let most = per_rank.iter().map(Vec::len).max().unwrap_or(0);
    let mut refs = Vec::new();
    for k in 0..most {
        for batches in &mut per_rank {
            if let Some(b) = batches.get_mut(k) {
                refs.append(b);
            }
        }
    }
    refs
}

/// The shards' sizes, by index.
pub fn sizes(ds: &ShardedDataset) -> Vec<u64> {
    ds.spec().shards.shards.iter().map(|s| s.size).collect()
}

/// Belady's downloads and the working set (bytes) of `refs` under `budget`.
pub fn bounds(ds: &ShardedDataset, refs: &[usize], budget: u64) -> (u64, u64) {
    let sizes = sizes(ds);
    (
        belady_downloads(refs.iter().copied(), &sizes, budget),
        working_set_bytes(refs.iter().copied(), &sizes),
    )
}

/// The shards rank `rank`'s workers read in epoch `epoch` if they take turns sample by sample
/// (worker 0's next, worker 1's next, ...): the order concurrent workers read in when each
/// read takes as long as another's.
pub fn interleaved_refs(
    ds: &ShardedDataset,
    epoch: u64,
    rank: usize,
    workers: usize,
) -> Vec<usize> {
    let order = Arc::new(EpochOrder::new(&ds.spec().counts, ds.order_config(), epoch).unwrap());
    let layout = Layout::new(ds.world_size(), workers, BATCH).unwrap();
    let plan = EpochPlan::new(order, layout);
    let streams: Vec<Vec<usize>> = (0..workers)
        .map(|w| {
            plan.rank(rank)
                .unwrap()
                .worker(w)
                .unwrap()
                .map(|s| s.sample.shard)
                .collect()
        })
        .collect();
    let most = streams.iter().map(Vec::len).max().unwrap_or(0);
    (0..most)
        .flat_map(|i| streams.iter().filter_map(move |s| s.get(i).copied()))
        .collect()
}
