//! [`CpuSet`]: a set of CPU (or NUMA node) numbers, read and written in the kernel's list
//! format (`0-7,16-23`), as sysfs shows `local_cpulist` and `/proc/<pid>/status` shows
//! `Cpus_allowed_list`.

use std::fmt;
use std::str::FromStr;

/// The largest CPU number a list may name (the kernel's `NR_CPUS` is at most 8192; a larger
/// number is a parse error rather than a huge allocation).
pub(crate) const MAX_CPU: usize = 1 << 16;

/// A set of CPU numbers (also used for NUMA node numbers), kept as a bit mask of the layout
/// the kernel's `sched_setaffinity` takes.
///
/// Parsed from and printed in the kernel's list format:
///
/// ```
/// use longshore_host::CpuSet;
///
/// let set: CpuSet = "0-3,8,10-11\n".parse()?;
/// assert_eq!(set.len(), 7);
/// assert!(set.contains(8) && !set.contains(9));
/// assert_eq!(set.to_string(), "0-3,8,10-11");
/// assert_eq!("".parse::<CpuSet>()?, CpuSet::new()); // an empty list is an empty set
/// # Ok::<(), longshore_host::CpuListError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// Bit `i % 64` of word `i / 64` is CPU `i`; no trailing zero words.
    words: Vec<u64>,
}

/// A CPU list that could not be parsed: the offending text and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {text:?}: {reason} (at {item:?})")]
#[non_exhaustive]
pub struct CpuListError {
    /// The whole list as given.
    pub text: String,
    /// The comma-separated item that is wrong.
    pub item: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: usize) {
        let w = cpu / 64;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (cpu % 64);
    }

    /// Removes `cpu`.
    pub fn remove(&mut self, cpu: usize) {
        if let Some(word) = self.words.get_mut(cpu / 64) {
            *word &= !(1 << (cpu % 64));
        }
        self.trim();
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / 64)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The CPUs, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i * 64 + b)
        })
    }

    /// The CPUs in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let mut words: Vec<u64> = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        while words.last() == Some(&0) {
            words.pop();
        }
        CpuSet { words }
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.intersection(other) == *self
    }

    /// The mask as 64-bit words (CPU `i` is bit `i % 64` of word `i / 64`): the layout of the
    /// kernel's `cpu_set_t` on 64-bit Linux.
    pub fn as_words(&self) -> &[u64] {
        &self.words
    }

    /// The set whose mask is `words` (see [`as_words`](CpuSet::as_words)).
    pub fn from_words(words: &[u64]) -> Self {
        let mut s = CpuSet {
            words: words.to_vec(),
        };
        s.trim();
        s
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut s = CpuSet::new();
        for c in iter {
            s.insert(c);
        }
        s
    }
}

fn number(text: &str, item: &str, s: &str) -> Result<usize, CpuListError> {
    let err = |reason| CpuListError {
        text: text.to_owned(),
        item: item.to_owned(),
        reason,
    };
    if s.is_empty() {
        return Err(err("missing a number"));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("not a decimal number"));
    }
    match s.parse::<usize>() {
        Ok(n) if n <= MAX_CPU => Ok(n),
        _ => Err(err("cpu number too large")),
    }
}

impl FromStr for CpuSet {
    type Err = CpuListError;

    /// Parses the kernel's list format: comma-separated CPU numbers and inclusive ranges
    /// (`0-7,16-23`), surrounding whitespace (sysfs's trailing newline) ignored; an empty list
    /// is the empty set. Items may overlap and come in any order.
    fn from_str(text: &str) -> Result<Self, CpuListError> {
        let mut set = CpuSet::new();
        let body = text.trim();
        if body.is_empty() {
            return Ok(set);
        }
        for item in body.split(',') {
            let item = item.trim();
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (number(text, item, a)?, number(text, item, b)?),
                None => {
                    let n = number(text, item, item)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(CpuListError {
                    text: text.to_owned(),
                    item: item.to_owned(),
                    reason: "range ends before it starts",
                });
            }
            for c in lo..=hi {
                set.insert(c);
            }
        }
        Ok(set)
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's list format: increasing, consecutive CPUs as ranges (`0-3,8,10-11`); the
    /// empty set prints as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.iter().peekable();
        let mut first = true;
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi = it.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_sysfs_forms() {
        let s: CpuSet = "0-7,16-23\n".parse().unwrap();
        assert_eq!(s.len(), 16);
        assert_eq!(s.to_string(), "0-7,16-23");
        let s: CpuSet = "5".parse().unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![5]);
        let s: CpuSet = "3,1-2,2".parse().unwrap();
        assert_eq!(s.to_string(), "1-3");
        let s: CpuSet = "64-65,127,128".parse().unwrap();
        assert_eq!(s.to_string(), "64-65,127-128");
        assert_eq!(s.as_words().len(), 3);
    }

    #[test]
    fn errors_name_the_text_and_item() {
        for (text, item, reason) in [
            ("0-3,x", "x", "not a decimal number"),
            ("4-2", "4-2", "range ends before it starts"),
            ("1,,2", "", "missing a number"),
            ("0-", "0-", "missing a number"),
            ("-1", "-1", "missing a number"),
            ("99999999", "99999999", "cpu number too large"),
            ("0-1-2", "0-1-2", "not a decimal number"),
        ] {
            let e = text.parse::<CpuSet>().unwrap_err();
            assert_eq!(
                (e.text.as_str(), e.item.as_str(), e.reason),
                (text, item, reason)
            );
            assert!(e.to_string().contains(&format!("{text:?}")), "{e}");
        }
    }

    #[test]
    fn set_operations() {
        let a: CpuSet = "0-9".parse().unwrap();
        let b: CpuSet = "5-200".parse().unwrap();
        assert_eq!(a.intersection(&b).to_string(), "5-9");
        assert!(a.intersection(&b).is_subset(&a));
        assert!(!a.is_subset(&b));
        let mut c = b.clone();
        for i in 10..=200 {
            c.remove(i);
        }
        assert_eq!(c.to_string(), "5-9");
        assert_eq!(c.as_words().len(), 1);
        let d: CpuSet = "100".parse().unwrap();
        assert!(a.intersection(&d).is_empty());
        assert_eq!(CpuSet::from_words(&[0b101, 0, 0]).to_string(), "0,2");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(cpus in proptest::collection::btree_set(0usize..600, 0..80)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let text = set.to_string();
            let back: CpuSet = text.parse().unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.iter().collect::<Vec<_>>(), cpus.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(back.len(), cpus.len());
            // Canonical: no item overlaps or touches the next.
            prop_assert!(!text.contains(",,"));
        }

        #[test]
        fn parse_of_any_ranges_is_their_union(ranges in proptest::collection::vec((0usize..300, 0usize..20), 0..12)) {
            let text = ranges.iter().map(|(lo, n)| if *n == 0 { lo.to_string() } else { format!("{}-{}", lo, lo + n) }).collect::<Vec<_>>().join(",");
            let set: CpuSet = text.parse().unwrap();
            for c in 0..340 {
                let want = ranges.iter().any(|(lo, n)| c >= *lo && c <= lo + n);
                prop_assert_eq!(set.contains(c), want, "cpu {} in {}", c, text);
            }
        }
    }
}
