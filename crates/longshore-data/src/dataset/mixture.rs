//! [`Mixture`]: map-style datasets drawn in chosen proportions, by a fixed schedule.
//!
//! Position `p` of a mixture's epoch comes from member `s(p)`, and the members' positions are
//! interleaved as evenly as their weights allow: every block of [`Mixture::block`] positions
//! (at least 1,024, and enough for the smallest share to get 16) holds each member's share of
//! it rounded by largest remainders, spread through the block by stride scheduling. So the
//! realised proportions are the weights to within one position per block (1/1,024 or finer),
//! over an epoch and over every whole block of it.
//! The schedule depends on the weights alone; the loader's sampler shuffles the positions,
//! and each member's samples are taken in a random order of `(seed, epoch, member, pass)`
//! ([`Mixture::shuffle_members`]), so an epoch's mixture is a pure function of its position
//! and epoch: samplers, ranks, workers and exact resume work on it as on any map-style
//! dataset.
//!
//! How an epoch ends ([`Stop`], Hugging Face's `interleave_datasets` stopping strategies):
//!
//! - [`Stop::FirstExhausted`] (undersampling): the epoch ends where the schedule would draw
//!   from a member that has no sample left; every sample is drawn at most once per epoch, and
//!   the other members' unused samples are counted ([`Mixture::unused`]).
//! - [`Stop::AllExhausted`] (oversampling): the epoch ends once every member has given every
//!   sample; members that run out earlier start another pass (another order) and are counted
//!   as repeats ([`Mixture::repeated`]).
//! - [`Stop::Samples(n)`](Stop::Samples): `n` positions, members passing as often as needed:
//!   an epoch of a chosen size over an endless mixture.
//!
//! Opening logs the epoch's length and each member's draws, unused and repeated samples
//! (target `longshore::data`).
//!
//! Changing the weights changes the schedule. Between epochs, build a new `Mixture`. A
//! checkpoint taken with other weights: with [`Stop::Samples`] (a fixed epoch length) it loads,
//! and the positions the epoch has left read the new schedule (the remaining stream follows the
//! new weights from that point); with the other stop rules the epoch's length changes with the
//! weights, and the loader refuses the checkpoint, naming the length it was taken with.
//!
//! ```
//! use longshore_data::dataset::mixture::{Mixture, Stop};
//! use longshore_data::{Dataset, VecDataset};
//!
//! # fn main() -> Result<(), longshore_data::DataError> {
//! let a = VecDataset::new((0..100u32).collect());
//! let b = VecDataset::new((1000..1010u32).collect());
//! // 3 parts of `a` for 1 of `b`, until `b` would give an 11th sample: 42 positions.
//! let mix = Mixture::new(vec![a, b], &[3.0, 1.0], Stop::FirstExhausted)?;
//! assert_eq!(mix.len(), 42);
//! assert_eq!(mix.draws(), [32, 10]);
//! assert_eq!(mix.unused(), [68, 0]);
//! let from_b = (0..mix.len()).filter(|&p| mix.get(p).unwrap() >= 1000).count();
//! assert_eq!(from_b, 10);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::DataError;
use crate::dataset::{Dataset, DirectDataset};
use crate::field::FieldSpec;
use crate::seed::mix;
use crate::worker;

/// How a [`Mixture`]'s epoch ends; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Stop {
    /// When the schedule would draw from a member with no sample left (undersampling).
    FirstExhausted,
    /// When every member has given every sample (oversampling the others).
    AllExhausted,
    /// After this many positions.
    Samples(u64),
}

/// The fixed schedule of a mixture's positions (see the [module docs](self)): which member each
/// position draws from and which of that member's draws it is, a function of the weights
/// alone. [`Mixture`] draws map-style members by it; sharded datasets (longshore-shards) mix
/// their members' orders by it.
///
/// ```
/// use longshore_data::dataset::mixture::{Schedule, Stop};
///
/// # fn main() -> Result<(), longshore_data::DataError> {
/// let s = Schedule::new(&[3.0, 1.0])?;
/// assert_eq!(s.epoch_len(&[100, 10], Stop::FirstExhausted)?, 42);
/// // Position 42 would be b's 11th draw (b has 10 samples): the epoch ends before it.
/// assert_eq!(s.at(42), (1, 10));
/// assert_eq!(s.position(1, 10), 42);
/// assert_eq!((s.draws(0, 42), s.draws(1, 42)), (32, 10));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Schedule {
    // For each offset of a block, its member and the number of that member's positions
    // before it in the block; for each member, its offsets.
    block: u64,
    counts: Vec<u64>,
    at: Vec<(u32, u32)>,
    offsets: Vec<Vec<u32>>,
}

impl Schedule {
    /// The schedule of members drawn in proportion to `weights`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a negative, infinite or all-zero weight, or a share
    /// too small to schedule (below 2^-18).
    pub fn new(weights: &[f64]) -> Result<Schedule, DataError> {
        let invalid = |reason: String| DataError::InvalidArgument {
            name: "weights",
            reason,
        };
        if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err(invalid(format!(
                "{weights:?}: weights are finite and not negative"
            )));
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Err(invalid(format!("{weights:?}: no member has weight")));
        }
        let shares: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let smallest = shares
            .iter()
            .copied()
            .filter(|&s| s > 0.0)
            .fold(1.0, f64::min);
        // A block in which the smallest share gets at least 16 positions (at least 1,024).
        let block = ((16.0 / smallest).ceil() as u64)
            .max(1024)
            .next_power_of_two();
        if block > 1 << 22 {
            return Err(invalid(format!(
                "{weights:?}: a share of {smallest:e} is too small to schedule (at least 2^-18)"
            )));
        }
        // Largest remainders: each member's positions per block.
        let exact: Vec<f64> = shares.iter().map(|s| s * block as f64).collect();
        let mut counts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
        let mut rest = block - counts.iter().sum::<u64>();
        let mut order: Vec<usize> = (0..counts.len()).collect();
        order.sort_by(|&a, &b| {
            let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
            rb.total_cmp(&ra).then(a.cmp(&b))
        });
        for &s in order.iter().cycle().take(counts.len() * 2) {
            if rest == 0 {
                break;
            }
            if shares[s] > 0.0 {
                counts[s] += 1;
                rest -= 1;
            }
        }
        // Stride scheduling: member s's j-th position at time (j + 1/2) / counts[s].
        let mut events: Vec<(f64, u32, u32)> = Vec::with_capacity(block as usize);
        for (s, &c) in counts.iter().enumerate() {
            for j in 0..c {
                events.push(((j as f64 + 0.5) / c as f64, s as u32, j as u32));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut offsets = vec![Vec::new(); counts.len()];
        let at = events
            .iter()
            .enumerate()
            .map(|(off, &(_, s, j))| {
                offsets[s as usize].push(off as u32);
                (s, j)
            })
            .collect();
        Ok(Schedule {
            block,
            counts,
            at,
            offsets,
        })
    }

    /// The member position `p` draws from, and which of its draws that is (from 0).
    pub fn at(&self, p: u64) -> (usize, u64) {
        let (s, j) = self.at[(p % self.block) as usize];
        let s = s as usize;
        (s, p / self.block * self.counts[s] + u64::from(j))
    }

    /// The position of member `s`'s draw `k` (from 0). `s` must have weight.
    pub fn position(&self, s: usize, k: u64) -> u64 {
        let c = self.counts[s];
        k / c * self.block + u64::from(self.offsets[s][(k % c) as usize])
    }

    /// The draws of member `s` among the first `len` positions.
    pub fn draws(&self, s: usize, len: u64) -> u64 {
        let c = self.counts[s];
        if c == 0 {
            return 0;
        }
        let (blocks, rest) = (len / self.block, len % self.block);
        blocks * c + self.offsets[s].partition_point(|&o| u64::from(o) < rest) as u64
    }

    /// The schedule's block: every block of this many positions holds each member's share.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Each member's positions per block.
    pub fn block_counts(&self) -> &[u64] {
        &self.counts
    }

    /// The number of members.
    pub fn members(&self) -> usize {
        self.counts.len()
    }

    /// The positions of an epoch over members of `lens` samples ending by `stop`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a count of lengths that is not the members', or an
    /// empty member with weight.
    pub fn epoch_len(&self, lens: &[u64], stop: Stop) -> Result<u64, DataError> {
        let invalid = |name, reason: String| DataError::InvalidArgument { name, reason };
        if lens.len() != self.counts.len() {
            return Err(invalid(
                "members",
                format!("{} lengths for {} members", lens.len(), self.counts.len()),
            ));
        }
        let drawn: Vec<usize> = (0..lens.len()).filter(|&s| self.counts[s] > 0).collect();
        if let Some(&s) = drawn.iter().find(|&&s| lens[s] == 0) {
            return Err(invalid(
                "members",
                format!("member {s} is empty but has weight"),
            ));
        }
        Ok(match stop {
            // The position of the first draw past a member's last sample.
            Stop::FirstExhausted => drawn
                .iter()
                .map(|&s| self.position(s, lens[s]))
                .min()
                .unwrap_or(0),
            // One past every member's last sample's position.
            Stop::AllExhausted => drawn
                .iter()
                .map(|&s| self.position(s, lens[s] - 1) + 1)
                .max()
                .unwrap_or(0),
            Stop::Samples(n) => n,
        })
    }
}

/// A random order of `0..n` computed one index at a time (a cycle-walking Feistel network on
/// the smallest even number of bits that holds `n`): no table, so a pass over a member of any
/// size costs nothing to set up.
#[derive(Debug, Clone, Copy)]
struct Permutation {
    n: u64,
    half: u32,
    keys: [u64; 4],
}

impl Permutation {
    fn new(n: u64, seed: u64) -> Permutation {
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half = bits.div_ceil(2);
        let mut k = seed;
        let keys = [0u64; 4].map(|_| {
            k = mix(k);
            k
        });
        Permutation { n, half, keys }
    }

    fn at(&self, i: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let mut x = i;
        loop {
            let (mut l, mut r) = (x >> self.half, x & mask);
            for key in self.keys {
                let f = mix(r ^ key) & mask;
                (l, r) = (r, l ^ f);
            }
            x = (l << self.half) | r;
            if x < self.n {
                return x;
            }
        }
    }
}

/// Map-style datasets drawn in chosen proportions; see the [module docs](self).
///
/// For members of different types use `Mixture<Box<dyn Dataset<Item = T>>>`. Clones share the
/// members and the epoch.
#[derive(Debug, Clone)]
pub struct Mixture<D> {
    members: Arc<[D]>,
    lens: Vec<u64>,
    schedule: Arc<Schedule>,
    len: usize,
    seed: u64,
    shuffle: bool,
    epoch: Arc<AtomicU64>,
}

impl<D: Dataset> Mixture<D> {
    /// `members` drawn in proportion to `weights` until `stop`; members' samples in a
    /// random order per epoch and pass (seed 0).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for no members, a count of weights that differs, a
    /// negative, infinite or all-zero weight, a share too small to schedule, or an empty
    /// member with weight; [`DataError::Overflow`] for an epoch past `usize`.
    pub fn new(members: Vec<D>, weights: &[f64], stop: Stop) -> Result<Mixture<D>, DataError> {
        let invalid = |name, reason: String| DataError::InvalidArgument { name, reason };
        if members.is_empty() {
            return Err(invalid("members", "a mixture needs a member".into()));
        }
        if weights.len() != members.len() {
            return Err(invalid(
                "weights",
                format!("{} weights for {} members", weights.len(), members.len()),
            ));
        }
        let schedule = Schedule::new(weights)?;
        let lens: Vec<u64> = members.iter().map(|m| m.len() as u64).collect();
        let len = schedule.epoch_len(&lens, stop)?;
        let len = usize::try_from(len).map_err(|_| DataError::Overflow("mixture length"))?;
        let mixture = Mixture {
            members: members.into(),
            lens,
            schedule: Arc::new(schedule),
            len,
            seed: 0,
            shuffle: true,
            epoch: Arc::new(AtomicU64::new(0)),
        };
        tracing::info!(target: "longshore::data", positions = len, ?stop,
            draws = ?mixture.draws(), unused = ?mixture.unused(),
            repeated = ?mixture.repeated(), block = mixture.schedule.block, "mixture");
        Ok(mixture)
    }

    /// The seed of the members' orders.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Mixture<D> {
        self.seed = seed;
        self
    }

    /// Whether each pass over a member takes its samples in a random order of
    /// `(seed, epoch, member, pass)` (the default), or in index order. With
    /// [`Stop::FirstExhausted`] a random order is what lets every epoch use other samples of
    /// the members it does not exhaust.
    #[must_use]
    pub fn shuffle_members(mut self, shuffle: bool) -> Mixture<D> {
        self.shuffle = shuffle;
        self
    }

    /// Sets the epoch of the members' orders for samples read outside a loader (shared by
    /// clones); inside a `DataLoader` the loader's epoch applies.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The members.
    pub fn members(&self) -> &[D] {
        &self.members
    }

    /// The schedule's block: every block of this many positions holds each member's share.
    pub fn block(&self) -> u64 {
        self.schedule.block
    }

    /// Each member's positions per block.
    pub fn block_counts(&self) -> &[u64] {
        &self.schedule.counts
    }

    /// Each member's draws in an epoch (the same every epoch).
    pub fn draws(&self) -> Vec<u64> {
        (0..self.lens.len())
            .map(|s| self.schedule.draws(s, self.len as u64))
            .collect()
    }

    /// Each member's samples not drawn in an epoch ([`Stop::FirstExhausted`], or a
    /// [`Stop::Samples`] shorter than a member).
    pub fn unused(&self) -> Vec<u64> {
        self.draws()
            .iter()
            .zip(&self.lens)
            .map(|(&d, &n)| n.saturating_sub(d))
            .collect()
    }

    /// Each member's draws past its size in an epoch (samples drawn again).
    pub fn repeated(&self) -> Vec<u64> {
        self.draws()
            .iter()
            .zip(&self.lens)
            .map(|(&d, &n)| d.saturating_sub(n))
            .collect()
    }

    /// Which member each position reads from, as a value the loader keeps
    /// ([`MemberOf::member`]; the same in every epoch): what
    /// `DataLoaderBuilder::count_sources` takes to count the delivered samples by member.
    pub fn member_of(&self) -> MemberOf {
        MemberOf {
            schedule: self.schedule.clone(),
            len: self.len,
            members: self.members.len(),
        }
    }

    /// The member and the member's index that position `position` reads in `epoch`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] past the epoch's end.
    pub fn source(&self, position: usize, epoch: u64) -> Result<(usize, usize), DataError> {
        if position >= self.len {
            return Err(DataError::oob(position, self.len, "mixture"));
        }
        let (s, k) = self.schedule.at(position as u64);
        let n = self.lens[s];
        let (pass, j) = (k / n, k % n);
        let index = if self.shuffle {
            let key = self.seed ^ mix(epoch ^ mix(s as u64 ^ mix(pass.wrapping_add(0x006D_6978))));
            Permutation::new(n, key).at(j)
        } else {
            j
        };
        Ok((s, index as usize))
    }

    fn locate(&self, position: usize) -> Result<(usize, usize), DataError> {
        let epoch = worker::epoch().unwrap_or_else(|| self.epoch.load(Ordering::Relaxed));
        self.source(position, epoch)
    }
}

/// Which member of a [`Mixture`] each position reads from ([`Mixture::member_of`]).
#[derive(Debug, Clone)]
pub struct MemberOf {
    schedule: Arc<Schedule>,
    len: usize,
    members: usize,
}

impl MemberOf {
    /// The member position `position` reads from (in every epoch), `None` past the end.
    pub fn member(&self, position: usize) -> Option<usize> {
        (position < self.len).then(|| self.schedule.at(position as u64).0)
    }

    /// The number of members.
    pub fn members(&self) -> usize {
        self.members
    }
}

impl<D: Dataset> Dataset for Mixture<D> {
    type Item = D::Item;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<D::Item, DataError> {
        let (s, i) = self.locate(index)?;
        self.members[s].get(i)
    }
}

impl<D: DirectDataset> DirectDataset for Mixture<D> {
    /// The fields of the first member; writing a sample of a member whose fields differ is
    /// refused.
    fn fields(&self) -> &[FieldSpec] {
        self.members[0].fields()
    }

    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let (s, i) = self.locate(index)?;
        if self.members[s].fields() != self.fields() {
            return Err(DataError::ShapeMismatch(format!(
                "member {s} of the mixture has fields {:?}, member 0 has {:?}",
                self.members[s].fields(),
                self.fields()
            )));
        }
        self.members[s].get_field_into(i, field, out)
    }

    fn field_bytes(&self, index: usize, field: usize) -> Result<Option<&[u8]>, DataError> {
        let (s, i) = self.locate(index)?;
        if self.members[s].fields() != self.fields() {
            return Ok(None);
        }
        self.members[s].field_bytes(i, field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections() {
        for n in [1u64, 2, 3, 5, 17, 1000, 4097] {
            for seed in 0..4 {
                let p = Permutation::new(n, seed);
                let mut seen: Vec<u64> = (0..n).map(|i| p.at(i)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n} seed {seed}");
            }
        }
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        assert!((0..1000).filter(|&i| a.at(i) != b.at(i)).count() > 900);
    }
}
