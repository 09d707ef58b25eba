//! Offline bounds over a reference string of shard reads: the downloads Belady's rule makes
//! ([`belady_downloads`]) and the working set ([`working_set_bytes`]), against which the online
//! cache is measured, and the peak of overlapping intervals the schedule's working set is.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The downloads Belady's rule makes over the reference string `refs` (shard indices in the
/// order they are read; repeats of the shard just read are one read) with a cache of
/// `budget` bytes, `sizes[s]` the bytes of shard `s`: at each miss the cached shards whose next
/// read is furthest ahead (never again first) are evicted until the shard fits. With shards of
/// one size this is the fewest downloads any cache of that budget can make (Belady's MIN); with
/// sizes that differ it is the same rule, a close bound. A pure function: the bound the online
/// cache is measured against.
///
/// ```
/// use longshore_shards::cache::belady_downloads;
/// let refs = [0, 1, 2, 0, 1, 2, 0];
/// assert_eq!(belady_downloads(refs, &[1, 1, 1], 3), 3); // each once
/// assert_eq!(belady_downloads(refs, &[1, 1, 1], 2), 5); // LRU would make 7
/// ```
pub fn belady_downloads<I: IntoIterator<Item = usize>>(refs: I, sizes: &[u64], budget: u64) -> u64 {
    let refs = collapse(refs);
    let mut next = vec![u64::MAX; refs.len()];
    let mut later: HashMap<usize, usize> = HashMap::new();
    for (i, &s) in refs.iter().enumerate().rev() {
        if let Some(&j) = later.get(&s) {
            next[i] = j as u64;
        }
        later.insert(s, i);
    }
    let mut resident: HashMap<usize, u64> = HashMap::new();
    let mut by_next: BTreeSet<(u64, usize)> = BTreeSet::new();
    let (mut used, mut downloads) = (0u64, 0u64);
    for (i, &s) in refs.iter().enumerate() {
        if let Some(at) = resident.get_mut(&s) {
            by_next.remove(&(*at, s));
            *at = next[i];
            by_next.insert((next[i], s));
            continue;
        }
        downloads += 1;
        let size = sizes[s];
        while used + size > budget {
            let Some(&(at, victim)) = by_next.iter().next_back() else {
                break;
            };
            by_next.remove(&(at, victim));
            resident.remove(&victim);
            used -= sizes[victim];
        }
        if used + size <= budget {
            resident.insert(s, next[i]);
            by_next.insert((next[i], s));
            used += size;
        }
    }
    downloads
}

/// The working set of the reference string `refs`: the most bytes of shards live at once, a
/// shard being live from its first read to its last. A cache of at least this many bytes
/// downloads each shard once under Belady's rule; with fewer, some shard is downloaded again.
///
/// ```
/// use longshore_shards::cache::working_set_bytes;
/// assert_eq!(working_set_bytes([0, 1, 0, 2, 2, 1], &[10, 20, 30]), 50); // 1 and 2 at once
/// ```
pub fn working_set_bytes<I: IntoIterator<Item = usize>>(refs: I, sizes: &[u64]) -> u64 {
    let mut spans: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (i, s) in refs.into_iter().enumerate() {
        let i = i as u64;
        spans.entry(s).and_modify(|e| e.1 = i).or_insert((i, i));
    }
    peak(
        spans.into_iter().map(|(s, (a, b))| (a, b, sizes[s])),
        0,
        u64::MAX,
    )
}

/// Repeats of the shard just read collapse into one read.
fn collapse<I: IntoIterator<Item = usize>>(refs: I) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for s in refs {
        if out.last() != Some(&s) {
            out.push(s);
        }
    }
    out
}

/// The most bytes of the intervals `[first, last]` (with their bytes) that overlap at any
/// tick of `from..until`.
pub(super) fn peak(
    intervals: impl IntoIterator<Item = (u64, u64, u64)>,
    from: u64,
    until: u64,
) -> u64 {
    let mut events: Vec<(u64, i128)> = Vec::new();
    for (a, b, bytes) in intervals {
        if b < from || a >= until {
            continue;
        }
        events.push((a.max(from), i128::from(bytes)));
        events.push((b.saturating_add(1), -i128::from(bytes)));
    }
    // At one tick, intervals that end leave before those that start come in.
    events.sort_by_key(|&(t, d)| (t, d > 0));
    let (mut live, mut best) = (0i128, 0i128);
    for (t, d) in events {
        live += d;
        if t < until {
            best = best.max(live);
        }
    }
    u64::try_from(best).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn belady_beats_lru_and_meets_the_working_set() {
        let refs = [0usize, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];
        let sizes = [1u64; 4];
        assert_eq!(belady_downloads(refs, &sizes, 4), 4);
        assert_eq!(working_set_bytes(refs, &sizes), 4);
        // LRU with 3 of 4 in a cycle misses every read (12); MIN keeps two of three.
        assert_eq!(belady_downloads(refs, &sizes, 3), 6);
        assert_eq!(belady_downloads([0, 0, 0, 1, 1, 0], &sizes, 1), 3);
    }

    #[test]
    fn peak_counts_overlaps_within_a_range() {
        let iv = [(0, 4, 10), (2, 8, 20), (5, 9, 30)];
        assert_eq!(peak(iv, 0, u64::MAX), 50);
        assert_eq!(peak(iv, 0, 5), 30);
        assert_eq!(peak(iv, 9, 20), 30);
    }
}
