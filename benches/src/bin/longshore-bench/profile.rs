//! `--profile DIR`: a sampling profile of each steady-state loader run's timed window
//! (pprof-rs: SIGPROF at 997 Hz on every thread of the process), written as a flame graph
//! `<case>.svg` and a text summary `<case>.txt`. The summary groups the samples by thread
//! (the consumer, the workers together, the CUDA event watcher, the rest) and lists, per group,
//! the functions that hold the most samples by themselves (self) and with their callees
//! (inclusive): what the consumer thread spends its time on is what bounds a loader whose
//! workers are idle. `perf` is not installed on the GPU hosts; this needs nothing but the
//! binary (not stripped of its symbol table).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use pprof::ProfilerGuard;

/// Sampling rate (a prime, so it does not beat with periodic work).
const HZ: i32 = 997;
/// Functions listed per thread group and kind.
const TOP: usize = 25;

/// A running profile; [`Profile::finish`] writes it.
pub(crate) struct Profile {
    guard: ProfilerGuard<'static>,
    prefix: PathBuf,
}

impl Profile {
    /// Starts sampling every thread of the process; the result goes to `prefix.{svg,txt}`.
    pub(crate) fn start(prefix: PathBuf) -> Result<Profile> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .context("starting the sampling profiler")?;
        Ok(Profile { guard, prefix })
    }

    /// Stops sampling and writes the flame graph and the summary.
    pub(crate) fn finish(self) -> Result<()> {
        let report = self
            .guard
            .report()
            .build()
            .context("building the profile report")?;
        if let Some(dir) = self.prefix.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let svg = self.prefix.with_extension("svg");
        let file =
            std::fs::File::create(&svg).with_context(|| format!("creating {}", svg.display()))?;
        report
            .flamegraph(file)
            .with_context(|| format!("writing {}", svg.display()))?;
        let mut samples = Vec::new();
        for (frames, count) in &report.data {
            let stack: Vec<String> = frames
                .frames
                .iter()
                .flat_map(|f| f.iter().map(|s| s.name()))
                .collect();
            samples.push((frames.thread_name.clone(), stack, *count as u64));
        }
        let txt = self.prefix.with_extension("txt");
        std::fs::write(&txt, summarize(&samples))
            .with_context(|| format!("writing {}", txt.display()))
    }
}

/// The group a thread's samples count in.
fn group(thread: &str) -> &'static str {
    if thread.starts_with("longshore-work") {
        "workers"
    } else if thread.starts_with("longshore-cuda") {
        "cuda event watcher"
    } else if thread.starts_with("longshore-bench") || thread == "main" {
        "consumer (main thread)"
    } else {
        "other threads"
    }
}

/// Shortens a demangled symbol: no hash suffix, no generic arguments.
fn short(name: &str) -> String {
    let name = name.rsplit_once("::h").map_or(name, |(head, tail)| {
        if tail.len() == 16 && tail.chars().all(|c| c.is_ascii_hexdigit()) {
            head
        } else {
            name
        }
    });
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' => {
                if depth == 0 && !out.is_empty() && !out.ends_with("::") {
                    out.push_str("<..>");
                }
                depth += 1;
            }
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if out.is_empty() || out.starts_with("::") {
        name.to_owned()
    } else {
        out
    }
}

/// One thread group's samples: total, by function itself, by function with its callees.
type Group = (u64, HashMap<String, u64>, HashMap<String, u64>);

/// Text summary of `(thread, stack leaf-first, samples)`.
pub(crate) fn summarize(samples: &[(String, Vec<String>, u64)]) -> String {
    let total: u64 = samples.iter().map(|s| s.2).sum();
    let mut groups: HashMap<&'static str, Group> = HashMap::new();
    let mut threads: HashMap<&'static str, std::collections::BTreeSet<&str>> = HashMap::new();
    for (thread, stack, n) in samples {
        let g = group(thread);
        threads.entry(g).or_default().insert(thread.as_str());
        let e = groups.entry(g).or_default();
        e.0 += n;
        let leaf = stack
            .first()
            .map_or_else(|| "(no symbol)".to_owned(), |s| short(s));
        *e.1.entry(leaf).or_default() += n;
        let mut seen = std::collections::HashSet::new();
        for f in stack {
            let f = short(f);
            if seen.insert(f.clone()) {
                *e.2.entry(f).or_default() += n;
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{total} samples at {HZ} Hz ({:.2} s of CPU time)",
        total as f64 / f64::from(HZ)
    );
    let mut order: Vec<_> = groups.iter().collect();
    order.sort_by_key(|g| std::cmp::Reverse(g.1.0));
    for (name, (n, selfs, incl)) in order {
        let _ = writeln!(
            out,
            "\n== {name}: {n} samples ({:.1}%), {} thread(s)",
            100.0 * *n as f64 / total.max(1) as f64,
            threads.get(name).map_or(0, |t| t.len())
        );
        for (title, map) in [("self", selfs), ("inclusive", incl)] {
            let mut v: Vec<_> = map.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let _ = writeln!(out, "  -- {title}");
            for (f, c) in v.into_iter().take(TOP) {
                let _ = writeln!(
                    out,
                    "  {:6.1}%  {f}",
                    100.0 * *c as f64 / (*n).max(1) as f64
                );
            }
        }
    }
    out
}

/// `dir/<case>` with the case made file-name safe.
pub(crate) fn prefix(dir: &Path, case: &str) -> PathBuf {
    let name: String = case
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_drops_hashes_and_generics() {
        assert_eq!(
            short("longshore_loader::iter::LoaderIter<F>::fill::h0123456789abcdef"),
            "longshore_loader::iter::LoaderIter<..>::fill"
        );
        assert_eq!(
            short("<T as core::any::Any>::type_id"),
            "<T as core::any::Any>::type_id"
        );
        assert_eq!(short("memcpy"), "memcpy");
    }

    #[test]
    fn summary_groups_threads_and_counts_inclusive_once() {
        let s = vec![
            (
                "longshore-bench".to_owned(),
                vec!["a".to_owned(), "b".to_owned(), "a".to_owned()],
                3,
            ),
            ("longshore-worker-0".to_owned(), vec!["w".to_owned()], 1),
            ("longshore-worker-1".to_owned(), vec!["w".to_owned()], 1),
        ];
        let t = summarize(&s);
        assert!(t.starts_with("5 samples"), "{t}");
        assert!(
            t.contains("== consumer (main thread): 3 samples (60.0%), 1 thread(s)"),
            "{t}"
        );
        assert!(
            t.contains("== workers: 2 samples (40.0%), 2 thread(s)"),
            "{t}"
        );
        // `a` appears twice in one stack but counts once inclusively.
        assert!(t.contains(" 100.0%  a"), "{t}");
    }
}
