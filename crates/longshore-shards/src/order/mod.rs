//! The global sample order of a sharded dataset: a pure function of (seed, epoch, the shard
//! list with its per-shard sample counts, the shuffle options), split equally over ranks and
//! then over each rank's loader workers, and exactly resumable — also on a different number of
//! ranks or workers.
//!
//! # The epoch order
//!
//! [`EpochOrder`] lays out every sample of an epoch once, as MosaicML Streaming's `py1b` and
//! LitData do:
//!
//! 1. The shards are permuted with [`epoch_rng`]`(seed, epoch)` (Fisher-Yates).
//! 2. Consecutive shards of that order are grouped into *shuffle blocks*: a block closes at the
//!    first shard boundary where it holds at least [`OrderConfig::shuffle_block`] samples.
//!    Blocks are made of whole shards, so a shard's samples mix only with those of the other
//!    shards of its block. This division is the *canonical partition*: it depends on nothing
//!    but the seed, the epoch, the shard counts and `shuffle_block` — never on the number of
//!    ranks or workers, which is what makes elastic resume possible.
//! 3. The samples of each block are permuted with their own generator
//!    ([`epoch_rng`]`(`[`block_seed`]`(seed, block), epoch)`).
//!
//! `shuffle_block = 0` keeps each shard's samples in file order (shard shuffle only, like
//! WebDataset without a sample buffer); `shuffle_block = u64::MAX` makes one block, a full
//! permutation; `shuffle = false` keeps the canonical order (shard by shard, file order).
//!
//! A sample is addressed by a [`SampleId`]: its shard (index in the shard list as given), its
//! index within that shard, and its *global id* (its index in the concatenation of all shards
//! in list order). Its place in the epoch is its *position* (`0..len`) in [`EpochOrder`].
//! Random augmentation should draw from [`sample_seed`]`(seed, epoch, global)`, which does not
//! depend on which rank or worker reads the sample, so a resumed or re-split run augments
//! every sample exactly as an uninterrupted one.
//!
//! # Shuffle quality
//!
//! [`ShuffleQuality::measure`] counts the distinct shards in each batch of `batch_size`
//! consecutive positions, the statistic that matters for within-batch correlation;
//! [`expected_distinct_shards`] gives its exact mean for a full permutation. For 1,000 shards of
//! 1,000 samples (10⁶ samples) and batches of 256 (the test `shuffle_quality_numbers` in this
//! module measures them):
//!
//! | scheme | mean distinct shards per batch | of a full permutation | mean displacement / N |
//! | --- | --- | --- | --- |
//! | full permutation (`shuffle_block = u64::MAX`) | 226.1 (exact mean 226.0) | 100 % | 0.334 |
//! | default blocks (`shuffle_block = 2^18`: 263 shards a block, the last 211) | 160.7 | 71 % | 0.336 |
//! | blocks of 2^16 samples (66 shards) | 64.3 | 28 % | 0.338 |
//! | shard shuffle only (`shuffle_block = 0`) | 1.25 | 0.6 % | 0.338 |
//!
//! The mean displacement (`|position - global id|`) is about 1/3 of the epoch in every scheme:
//! the shard shuffle alone already moves samples across the whole epoch, so it says nothing
//! about how well a batch mixes; the distinct shards per batch do.
//!
//! A block of `b` shards gives about `b (1 - e^(-batch/b))` distinct shards per batch: a
//! block of several times the batch size in shards comes close to a full permutation, while
//! each worker still reads only the shards of the blocks its span covers.
//!
//! # Ranks, workers and resume
//!
//! [`EpochPlan`] splits the epoch over a [`Layout`] (world size, workers per rank, batch size):
//! contiguous equal spans per rank, then contiguous runs of whole batches per worker; see
//! [`EpochPlan`] for the exact padding and dropping rule, the worker mapping, and
//! [`ResumeState`] for resuming.
//!
//! ```
//! use std::sync::Arc;
//! use longshore_shards::order::{EpochOrder, EpochPlan, Layout, OrderConfig};
//!
//! # fn main() -> Result<(), longshore_shards::ShardError> {
//! let counts = [5, 3, 4, 6]; // samples per shard
//! let config = OrderConfig { seed: 7, shuffle_block: 8, ..OrderConfig::default() };
//! let order = Arc::new(EpochOrder::new(&counts, config, 0)?);
//! let plan = EpochPlan::new(order.clone(), Layout::new(2, 2, 3)?);
//! assert_eq!(plan.samples_per_rank(), 9); // 18 samples over 2 ranks
//!
//! // Rank 1 takes 2 batches, as every rank does; then the job restarts on 3 ranks.
//! let taken: Vec<_> = plan.rank(1)?.batches().take(2).collect();
//! assert_eq!(taken.len(), 2);
//! let state = plan.state_after(2)?;
//! let json = serde_json::to_string(&state).unwrap();
//! let state: longshore_shards::order::ResumeState = serde_json::from_str(&json).unwrap();
//! let resumed = EpochPlan::resume(order, &state, Layout::new(3, 1, 3)?)?;
//! assert_eq!(resumed.samples_per_rank(), 2); // 18 - 2 ranks x 6 taken = 6 left, 2 per rank
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use longshore_data::rng::{epoch_rng, permutation, shuffle};
use longshore_data::seed::block_seed;
pub use longshore_data::seed::sample_seed;
use serde::{Deserialize, Serialize};

use crate::ShardError;

mod mixed;
mod plan;

pub use mixed::MixtureConfig;
pub use plan::{EpochPlan, Layout, RankBatches, RankPlan, ResumeState, WorkerStream};

/// [`OrderConfig::shuffle_block`]'s default: 2^18 samples, MosaicML Streaming's minimum
/// `shuffle_block_size`.
pub const DEFAULT_SHUFFLE_BLOCK: u64 = 1 << 18;

/// How an epoch's samples are ordered and how uneven ends are evened out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderConfig {
    /// The seed of every shuffle (shards, blocks) and of [`sample_seed`].
    pub seed: u64,
    /// Whether to shuffle at all; `false` gives the shards in list order, each in file order.
    pub shuffle: bool,
    /// Samples per shuffle block (blocks close at the next shard boundary): `0` shuffles only
    /// the shard order, `u64::MAX` permutes the whole epoch.
    pub shuffle_block: u64,
    /// `false`: pad the ranks' equal shares by repeating samples; `true`: drop the samples
    /// that do not fill every rank's last batch (see [`EpochPlan`]).
    pub drop_last: bool,
}

impl Default for OrderConfig {
    /// `seed 0`, `shuffle true`, [`DEFAULT_SHUFFLE_BLOCK`], `drop_last false` (PyTorch's
    /// `DistributedSampler` defaults).
    fn default() -> OrderConfig {
        OrderConfig {
            seed: 0,
            shuffle: true,
            shuffle_block: DEFAULT_SHUFFLE_BLOCK,
            drop_last: false,
        }
    }
}

/// Where a sample lives: its shard, its index in the shard, and its global id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleId {
    /// The shard's index in the shard list as given to [`EpochOrder::new`].
    pub shard: usize,
    /// The sample's index within its shard (`0..count`).
    pub index: u64,
    /// The sample's index in the concatenation of all shards in list order.
    pub global: u64,
}

/// One place in a rank's or worker's stream: the sample, its position in the epoch order, and
/// whether it is a padding repeat (see [`EpochPlan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    /// The sample to read.
    pub sample: SampleId,
    /// Its position in the [`EpochOrder`].
    pub position: u64,
    /// `true` when this slot repeats a sample to even out the ranks' shares.
    pub pad: bool,
}

/// FNV-1a over the counts' little-endian bytes: identifies a shard list in a [`ResumeState`].
fn counts_hash(counts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for c in counts {
        for b in c.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    h
}

/// The order of every sample of one epoch (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct EpochOrder {
    config: OrderConfig,
    epoch: u64,
    counts: Vec<u64>,
    /// Global id of each shard's first sample (list order), plus the total.
    starts: Vec<u64>,
    /// Slot (place in the shuffled shard order) -> shard.
    shard_order: Vec<usize>,
    /// Position of each slot's first sample, plus the total.
    slot_starts: Vec<u64>,
    /// First slot of each block, plus the number of slots.
    block_slots: Vec<usize>,
    counts_hash: u64,
    /// A mixture's members and schedule ([`EpochOrder::mixed`]); the positions are then the
    /// mixture's.
    mix: Option<Arc<mixed::Mixed>>,
}

impl EpochOrder {
    /// The order of epoch `epoch` over shards holding `counts[i]` samples each.
    ///
    /// # Errors
    /// [`ShardError::Order`] when the total number of samples overflows `u64`.
    pub fn new(counts: &[u64], config: OrderConfig, epoch: u64) -> Result<EpochOrder, ShardError> {
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut total: u64 = 0;
        for &c in counts {
            starts.push(total);
            total = total.checked_add(c).ok_or_else(|| ShardError::Order {
                option: "counts",
                reason: "the total number of samples overflows u64".into(),
            })?;
        }
        starts.push(total);
        let mut shard_order: Vec<usize> = (0..counts.len()).collect();
        if config.shuffle {
            shuffle(&mut shard_order, &mut epoch_rng(config.seed, epoch));
        }
        let mut slot_starts = Vec::with_capacity(counts.len() + 1);
        let mut block_slots = vec![0];
        let (mut pos, mut in_block) = (0u64, 0u64);
        for (slot, &shard) in shard_order.iter().enumerate() {
            slot_starts.push(pos);
            pos += counts[shard];
            in_block += counts[shard];
            if in_block > 0 && in_block >= config.shuffle_block.max(1) {
                block_slots.push(slot + 1);
                in_block = 0;
            }
        }
        slot_starts.push(pos);
        if *block_slots.last().unwrap_or(&0) != shard_order.len() {
            block_slots.push(shard_order.len());
        }
        tracing::debug!(
            target: "longshore::shards",
            epoch,
            shards = counts.len(),
            samples = total,
            blocks = block_slots.len() - 1,
            "epoch order"
        );
        Ok(EpochOrder {
            config,
            epoch,
            counts_hash: counts_hash(counts),
            counts: counts.to_vec(),
            starts,
            shard_order,
            slot_starts,
            block_slots,
            mix: None,
        })
    }

    /// The order of epoch `epoch` of a mixture of sharded datasets (see [`MixtureConfig`]):
    /// the shards holding `counts[i]` samples are the members' shards, member after member;
    /// position `p` draws from the member the mixture's schedule names, in that member's own
    /// order (the options of `config`, a seed of the member's own). [`len`](Self::len) is the
    /// mixture's epoch (by its stop rule), which the plans split over ranks and workers as
    /// they split a single dataset's.
    ///
    /// # Errors
    /// [`ShardError::Order`] (option `mixture`) for members that do not add up to the
    /// shards, weights that are not one per member or cannot be scheduled, or an empty
    /// member with weight; as [`EpochOrder::new`].
    pub fn mixed(
        counts: &[u64],
        mixture: &MixtureConfig,
        config: OrderConfig,
        epoch: u64,
    ) -> Result<EpochOrder, ShardError> {
        let mut order = EpochOrder::new(counts, config, epoch)?;
        let m = mixed::Mixed::new(counts, mixture, config, epoch)?;
        tracing::debug!(target: "longshore::shards", epoch, positions = m.len,
            draws = ?m.draws(), members = ?m.lens(), "mixture order");
        order.mix = Some(Arc::new(m));
        Ok(order)
    }

    /// Positions in the epoch: the sum of the counts, or a mixture's positions.
    pub fn len(&self) -> u64 {
        match &self.mix {
            Some(m) => m.len,
            None => *self.starts.last().unwrap_or(&0),
        }
    }

    /// The mixture this order draws (see [`EpochOrder::mixed`]), if any.
    pub fn mixture(&self) -> Option<&MixtureConfig> {
        self.mix.as_ref().map(|m| &m.config)
    }

    /// A mixture's draws of each member in the epoch (the epoch's positions by member).
    pub fn member_draws(&self) -> Option<Vec<u64>> {
        self.mix.as_ref().map(|m| m.draws())
    }

    /// The mixture member whose shards hold shard `shard` (0 for a single dataset).
    pub fn member_of_shard(&self, shard: usize) -> usize {
        self.mix.as_ref().map_or(0, |m| m.member_of_shard(shard))
    }

    /// Whether the epoch has no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The epoch this order is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The options it was built with.
    pub fn config(&self) -> &OrderConfig {
        &self.config
    }

    /// Samples per shard, in list order.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// The shards in this epoch's order.
    pub fn shard_order(&self) -> &[usize] {
        &self.shard_order
    }

    /// The shuffle blocks, as ranges of positions (a mixture's epoch is one range: its
    /// members' blocks are their own).
    pub fn blocks(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        let mixed = self.mix.as_ref().map(|m| 0..m.len);
        let plain = self.mix.is_none().then(|| {
            self.block_slots
                .windows(2)
                .map(|w| self.slot_starts[w[0]]..self.slot_starts[w[1]])
        });
        mixed.into_iter().chain(plain.into_iter().flatten())
    }

    /// The [`SampleId`] of global id `global`, or `None` past the end.
    pub fn sample(&self, global: u64) -> Option<SampleId> {
        if global >= self.len() {
            return None;
        }
        let shard = self.starts.partition_point(|&s| s <= global) - 1;
        Some(SampleId {
            shard,
            index: global - self.starts[shard],
            global,
        })
    }

    /// The augmentation seed of `sample` in this epoch ([`sample_seed`]).
    pub fn sample_seed(&self, sample: &SampleId) -> u64 {
        sample_seed(self.config.seed, self.epoch, sample.global)
    }

    /// The augmentation seed of the sample at `slot`: [`sample_seed`](Self::sample_seed),
    /// except for a mixture's draw in a later pass over its member (a sample drawn again in
    /// the epoch), whose seed is of that pass, so that the repeat is augmented anew.
    pub fn slot_seed(&self, slot: &Slot) -> u64 {
        match &self.mix {
            Some(m) if slot.position < m.len => {
                let pass = m.pass_of(slot.position);
                sample_seed(
                    self.config.seed,
                    mixed::pass_seed_epoch(self.epoch, pass),
                    slot.sample.global,
                )
            }
            _ => self.sample_seed(&slot.sample),
        }
    }

    /// The sample at `position`, or `None` past the end. This permutes the position's whole
    /// block: to read many positions, iterate with [`EpochOrder::iter_range`].
    pub fn at(&self, position: u64) -> Option<SampleId> {
        self.iter_range(position..position.saturating_add(1))
            .next()
            .map(|s| s.sample)
    }

    /// The samples at positions `range`, in order.
    pub fn iter_range(&self, range: Range<u64>) -> SlotIter<&EpochOrder> {
        SlotIter::new(self, [(range, false)].into())
    }

    fn block_of(&self, position: u64) -> usize {
        let slot = self.slot_starts.partition_point(|&s| s <= position) - 1;
        self.block_slots.partition_point(|&b| b <= slot) - 1
    }

    /// The permutation of block `block`'s samples, or `None` when samples keep file order.
    fn block_permutation(&self, block: usize) -> Option<Vec<usize>> {
        if !self.config.shuffle || self.config.shuffle_block == 0 {
            return None;
        }
        let (a, b) = (self.block_slots[block], self.block_slots[block + 1]);
        let len = self.slot_starts[b] - self.slot_starts[a];
        let mut rng = epoch_rng(block_seed(self.config.seed, block as u64), self.epoch);
        Some(permutation(len as usize, &mut rng))
    }

    /// The sample whose place in `block`'s file order is `offset`.
    fn sample_in_block(&self, block: usize, offset: u64) -> SampleId {
        let (a, b) = (self.block_slots[block], self.block_slots[block + 1]);
        let position = self.slot_starts[a] + offset;
        let slot = a + self.slot_starts[a..=b].partition_point(|&s| s <= position) - 1;
        let shard = self.shard_order[slot];
        let index = position - self.slot_starts[slot];
        SampleId {
            shard,
            index,
            global: self.starts[shard] + index,
        }
    }
}

/// Samples of an [`EpochOrder`] over a list of position ranges, each marked as padding or not
/// (from [`EpochOrder::iter_range`] or a [`WorkerStream`]). It keeps the permutation of the
/// block it is in, so consecutive positions cost a lookup each.
#[derive(Debug)]
pub struct SlotIter<O> {
    order: O,
    ranges: VecDeque<(Range<u64>, bool)>,
    block: mixed::BlockCache,
    /// A mixture's place in each member.
    cursors: mixed::Cursors,
}

/// The sample at `position` of `order` (a single dataset's), keeping the permutation of its
/// block in `cache`.
fn lookup(order: &EpochOrder, cache: &mut mixed::BlockCache, position: u64) -> SampleId {
    let cached = matches!(cache, Some((_, r, _)) if r.contains(&position));
    if !cached {
        let block = order.block_of(position);
        let span = order.slot_starts[order.block_slots[block]]
            ..order.slot_starts[order.block_slots[block + 1]];
        *cache = Some((block, span, order.block_permutation(block)));
    }
    let (block, span, perm) = cache.get_or_insert_with(|| (0, 0..0, None));
    let offset = position - span.start;
    let offset = perm.as_ref().map_or(offset, |p| p[offset as usize] as u64);
    order.sample_in_block(*block, offset)
}

impl<O: std::ops::Deref<Target = EpochOrder>> SlotIter<O> {
    fn new(order: O, ranges: VecDeque<(Range<u64>, bool)>) -> SlotIter<O> {
        SlotIter {
            order,
            ranges,
            block: None,
            cursors: mixed::Cursors::default(),
        }
    }

    /// Slots left in this iterator.
    pub fn remaining(&self) -> u64 {
        self.ranges.iter().map(|(r, _)| r.end - r.start).sum()
    }
}

impl<O: std::ops::Deref<Target = EpochOrder>> Iterator for SlotIter<O> {
    type Item = Slot;

    fn next(&mut self) -> Option<Slot> {
        loop {
            let (range, pad) = self.ranges.front_mut()?;
            let pad = *pad;
            if range.start >= range.end || range.start >= self.order.len() {
                self.ranges.pop_front();
                continue;
            }
            let position = range.start;
            range.start += 1;
            let order = &*self.order;
            let sample = match &order.mix {
                Some(m) => self.cursors.sample(order, m, position),
                None => lookup(order, &mut self.block, position),
            };
            return Some(Slot {
                sample,
                position,
                pad,
            });
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining()).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

/// The exact mean number of distinct shards among `batch_size` samples drawn without
/// replacement from the whole dataset: the value a full permutation gives.
pub fn expected_distinct_shards(counts: &[u64], batch_size: usize) -> f64 {
    let total: u64 = counts.iter().sum();
    let b = (batch_size as u64).min(total);
    counts
        .iter()
        .map(|&n| {
            // P(no sample of this shard) = prod_{i<b} (total - n - i) / (total - i).
            let mut absent = 1.0f64;
            for i in 0..b {
                if total - i == 0 || n + i >= total {
                    absent = 0.0;
                    break;
                }
                absent *= (total - n - i) as f64 / (total - i) as f64;
                if absent < 1e-300 {
                    absent = 0.0;
                    break;
                }
            }
            1.0 - absent
        })
        .sum()
}

/// How well an order mixes shards within batches (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShuffleQuality {
    /// Mean over whole batches of the number of distinct shards in the batch.
    pub mean_distinct_shards: f64,
    /// The same mean for a full permutation ([`expected_distinct_shards`]).
    pub full_permutation: f64,
    /// Mean over samples of `|position - global id|` divided by the number of samples (a full
    /// permutation gives about 1/3).
    pub mean_displacement: f64,
}

impl ShuffleQuality {
    /// Measures `order` in batches of `batch_size` consecutive positions (the last, partial
    /// batch is left out).
    pub fn measure(order: &EpochOrder, batch_size: usize) -> ShuffleQuality {
        let batch_size = batch_size.max(1);
        let (mut distinct, mut batches, mut displacement) = (0u64, 0u64, 0f64);
        let mut batch: Vec<usize> = Vec::with_capacity(batch_size);
        for slot in order.iter_range(0..order.len()) {
            displacement += slot.position.abs_diff(slot.sample.global) as f64;
            batch.push(slot.sample.shard);
            if batch.len() == batch_size {
                batch.sort_unstable();
                batch.dedup();
                distinct += batch.len() as u64;
                batches += 1;
                batch.clear();
            }
        }
        let n = order.len().max(1) as f64;
        ShuffleQuality {
            mean_distinct_shards: distinct as f64 / batches.max(1) as f64,
            full_permutation: expected_distinct_shards(order.counts(), batch_size),
            mean_displacement: displacement / n / n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_quality_numbers() {
        let counts = vec![1000u64; 1000];
        let measure = |shuffle_block| {
            let config = OrderConfig {
                seed: 1,
                shuffle_block,
                ..OrderConfig::default()
            };
            ShuffleQuality::measure(&EpochOrder::new(&counts, config, 0).unwrap(), 256)
        };
        let full = measure(u64::MAX);
        let default = measure(DEFAULT_SHUFFLE_BLOCK);
        let small = measure(1 << 16);
        let shard_only = measure(0);
        assert!((full.mean_distinct_shards - full.full_permutation).abs() < 1.0);
        assert!((full.full_permutation - 226.0).abs() < 0.1);
        assert!((default.mean_distinct_shards - 160.7).abs() < 0.5);
        assert!((small.mean_distinct_shards - 64.3).abs() < 0.5);
        assert!((shard_only.mean_distinct_shards - 1.25).abs() < 0.01);
    }

    #[test]
    fn blocks_are_whole_shards_and_cover_the_epoch() {
        let counts = [3, 0, 5, 2, 7, 1];
        let config = OrderConfig {
            shuffle_block: 6,
            ..OrderConfig::default()
        };
        let order = EpochOrder::new(&counts, config, 3).unwrap();
        let blocks: Vec<_> = order.blocks().collect();
        assert_eq!(blocks.first().map(|b| b.start), Some(0));
        assert_eq!(blocks.last().map(|b| b.end), Some(18));
        let mut seen: Vec<u64> = order.iter_range(0..18).map(|s| s.sample.global).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..18).collect::<Vec<_>>());
        for p in 0..18 {
            let s = order.at(p).unwrap();
            assert_eq!(order.sample(s.global), Some(s));
        }
    }

    #[test]
    fn no_shuffle_is_the_canonical_order() {
        let config = OrderConfig {
            shuffle: false,
            ..OrderConfig::default()
        };
        let order = EpochOrder::new(&[2, 3], config, 9).unwrap();
        let ids: Vec<_> = order
            .iter_range(0..5)
            .map(|s| (s.sample.shard, s.sample.index))
            .collect();
        assert_eq!(ids, [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]);
    }
}
