//! Mixtures of sharded datasets: an [`EpochOrder`] over several members' shards (one shard
//! list, member after member) whose positions draw from the members in chosen proportions, by
//! the schedule of longshore-data's map-style `Mixture`
//! ([`Schedule`](longshore_data::dataset::mixture::Schedule)).
//!
//! Position `p` of the mixture's epoch is member `s`'s draw `k` (`schedule.at(p)`). Each
//! member keeps its own order, an [`EpochOrder`] of its shards with the mixture's options and
//! a seed of its own: draw `k` is position `k mod n` (`n` the member's samples) of its order
//! for pass `k / n` (pass 0 the epoch's order; a later pass, drawn when the stop rule takes a
//! member past its end, another order). So a worker's run of mixture positions reads a
//! contiguous run of each member's order: the shard locality of the members' shuffle blocks is
//! kept, and the plan (ranks, workers, padding, resume on other layouts) is the one of a
//! single dataset, over the mixture's positions.

use std::ops::Range;
use std::sync::Arc;

use longshore_data::dataset::mixture::{Schedule, Stop};
use longshore_data::seed::mix;
use serde::{Deserialize, Serialize};

use super::{EpochOrder, OrderConfig, SampleId};
use crate::ShardError;

/// How a mixture's shard list is made of its members and how they are drawn: member `s` is
/// the next `shards[s]` shards of the list (member 0 the first ones), drawn in proportion to
/// `weights` until `stop` (Hugging Face's `interleave_datasets` stopping strategies, see
/// [`Stop`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MixtureConfig {
    /// Shards of each member, in list order.
    pub shards: Vec<usize>,
    /// Each member's weight (not negative; normalised).
    pub weights: Vec<f64>,
    /// How an epoch ends.
    pub stop: Stop,
}

/// Weights compare by their bits: equal configs draw the same schedule (and a spec holding
/// one stays `Eq`).
impl PartialEq for MixtureConfig {
    fn eq(&self, other: &MixtureConfig) -> bool {
        self.shards == other.shards
            && self.stop == other.stop
            && self.weights.len() == other.weights.len()
            && self
                .weights
                .iter()
                .zip(&other.weights)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for MixtureConfig {}

/// A mixture's members and schedule, built for one epoch.
#[derive(Debug)]
pub(super) struct Mixed {
    pub(super) config: MixtureConfig,
    schedule: Schedule,
    /// Each member's first shard in the list.
    first: Vec<usize>,
    /// Each member's samples.
    lens: Vec<u64>,
    /// Each member's shard counts.
    counts: Vec<Vec<u64>>,
    /// Each member's order options (its own seed).
    configs: Vec<OrderConfig>,
    /// Each member's order in pass 0.
    pass0: Vec<Arc<EpochOrder>>,
    /// Positions in the epoch.
    pub(super) len: u64,
    epoch: u64,
}

fn mix_err(reason: String) -> ShardError {
    ShardError::Order {
        option: "mixture",
        reason,
    }
}

/// The epoch of member orders, and of the augmentation seeds, in pass `pass` (0: the epoch
/// itself).
pub(super) fn pass_seed_epoch(epoch: u64, pass: u64) -> u64 {
    if pass == 0 {
        epoch
    } else {
        mix(epoch ^ mix(pass ^ 0x7061_7373))
    }
}

impl Mixed {
    /// The mixture `config` over shards holding `counts`, for `epoch` ordered by `order`.
    pub(super) fn new(
        counts: &[u64],
        config: &MixtureConfig,
        order: OrderConfig,
        epoch: u64,
    ) -> Result<Mixed, ShardError> {
        let m = config.shards.len();
        if m == 0 {
            return Err(mix_err("a mixture needs a member".into()));
        }
        if config.weights.len() != m {
            return Err(mix_err(format!(
                "{} weights for {m} members",
                config.weights.len()
            )));
        }
        let total: usize = config.shards.iter().sum();
        if total != counts.len() {
            return Err(mix_err(format!(
                "the members hold {total} shards, the list {}",
                counts.len()
            )));
        }
        let schedule = Schedule::new(&config.weights).map_err(|e| mix_err(e.to_string()))?;
        let (mut first, mut member_counts, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0;
        for &n in &config.shards {
            first.push(at);
            let c = counts[at..at + n].to_vec();
            lens.push(c.iter().sum::<u64>());
            member_counts.push(c);
            at += n;
        }
        let len = schedule
            .epoch_len(&lens, config.stop)
            .map_err(|e| mix_err(e.to_string()))?;
        let configs: Vec<OrderConfig> = (0..m)
            .map(|s| OrderConfig {
                seed: mix(order.seed ^ mix(s as u64 ^ 0x0000_6D65_6D62_6572)),
                ..order
            })
            .collect();
        let pass0 = (0..m)
            .map(|s| EpochOrder::new(&member_counts[s], configs[s], epoch).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Mixed {
            config: config.clone(),
            schedule,
            first,
            lens,
            counts: member_counts,
            configs,
            pass0,
            len,
            epoch,
        })
    }

    /// The member, its pass and its position in that pass's order, of mixture position `p`.
    fn locate(&self, p: u64) -> (usize, u64, u64) {
        let (s, k) = self.schedule.at(p);
        let n = self.lens[s].max(1);
        (s, k / n, k % n)
    }

    /// Member `s`'s order in pass `pass`.
    fn order(&self, s: usize, pass: u64) -> Arc<EpochOrder> {
        if pass == 0 {
            return Arc::clone(&self.pass0[s]);
        }
        // The counts were summed when pass 0 was made: another order of them cannot fail.
        EpochOrder::new(
            &self.counts[s],
            self.configs[s],
            pass_seed_epoch(self.epoch, pass),
        )
        .map_or_else(|_| Arc::clone(&self.pass0[s]), Arc::new)
    }

    /// The pass in which mixture position `p` draws its sample (0 for its member's first).
    pub(super) fn pass_of(&self, p: u64) -> u64 {
        self.locate(p).1
    }

    /// The epoch's draws of each member.
    pub(super) fn draws(&self) -> Vec<u64> {
        (0..self.lens.len())
            .map(|s| self.schedule.draws(s, self.len))
            .collect()
    }

    /// Each member's samples.
    pub(super) fn lens(&self) -> &[u64] {
        &self.lens
    }

    /// The member whose shards hold list shard `shard`.
    pub(super) fn member_of_shard(&self, shard: usize) -> usize {
        self.first
            .partition_point(|&f| f <= shard)
            .saturating_sub(1)
    }
}

/// A block of an [`EpochOrder`] and its permutation, kept while positions stay in it.
pub(super) type BlockCache = Option<(usize, Range<u64>, Option<Vec<usize>>)>;

/// Where a [`SlotIter`](super::SlotIter) stands in each member of a mixture: the pass it reads
/// and that order's block.
#[derive(Debug, Default)]
pub(super) struct Cursors(Vec<Option<(u64, Arc<EpochOrder>, BlockCache)>>);

impl Cursors {
    /// The sample at mixture position `p` of `order` (whose [`Mixed`] is `mixed`).
    pub(super) fn sample(&mut self, order: &EpochOrder, mixed: &Mixed, p: u64) -> SampleId {
        let (s, pass, j) = mixed.locate(p);
        if self.0.len() < mixed.lens.len() {
            self.0.resize_with(mixed.lens.len(), || None);
        }
        let cursor = &mut self.0[s];
        if cursor.as_ref().is_some_and(|(at, _, _)| *at != pass) {
            *cursor = None;
        }
        let (_, member, block) = cursor.get_or_insert_with(|| (pass, mixed.order(s, pass), None));
        let local = super::lookup(member, block, j);
        let shard = mixed.first[s] + local.shard;
        SampleId {
            shard,
            index: local.index,
            global: order.starts[shard] + local.index,
        }
    }
}
