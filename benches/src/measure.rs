//! Medians and timers.

use std::time::{Duration, Instant};

/// The median of `xs` (the mean of the middle two for an even count); `NaN` when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs `f` once and returns how long it took, with its result.
pub fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t0 = Instant::now();
    let out = f();
    (t0.elapsed(), out)
}

/// Bytes per second as GB/s (10^9 bytes).
pub fn gbps(bytes: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

/// A size as `1 KiB`, `16 MiB`, `1 GiB`.
pub fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 30 && bytes & ((1 << 30) - 1) == 0 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// A compact human-readable duration from nanoseconds (`850 ns`, `12.3 us`, `108 ms`).
pub fn ns_label(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Prints a table with a title and aligned columns (first column left-aligned, the others
/// right-aligned).
pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            let pad = w - c.chars().count();
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        s
    };
    println!("\n== {title}");
    println!("{}", line(header.iter().map(|h| (*h).to_owned()).collect()));
    println!(
        "{}",
        "-".repeat(width.iter().sum::<usize>() + 2 * cols.saturating_sub(1))
    );
    for r in rows {
        println!("{}", line(r.clone()));
    }
}
