//! The renderers of [`super::SECTIONS`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::plot;
use super::{Page, by_section, fmt_value, size_label, table};

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| fmt_value(v, unit))
}

/// Longshore against the bare copy per (dir, kind, size), and a plot per direction.
pub(crate) fn bandwidth(p: &mut Page<'_>) -> Result<()> {
    // (dir, kind, bytes) -> (longshore, bare, ratio)
    let mut rows: BTreeMap<(String, String, u64), [Option<f64>; 3]> = BTreeMap::new();
    for f in by_section(p.r, "bandwidth") {
        let (Some(dir), Some(kind), Some(bytes), Some(path)) =
            (f.s("dir"), f.s("kind"), f.u("bytes"), f.s("path"))
        else {
            continue;
        };
        let slot = rows.entry((dir.into(), kind.into(), bytes)).or_default();
        match path {
            "longshore" => slot[0] = Some(f.value),
            "bare" => slot[1] = Some(f.value),
            _ => slot[2] = Some(f.value),
        }
    }
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|((d, k, b), v)| {
            vec![
                d,
                k,
                size_label(b),
                opt(v[0], "GB/s"),
                opt(v[1], "GB/s"),
                opt(v[2], "x"),
            ]
        })
        .collect();
    table(
        &mut p.md,
        &["dir", "kind", "size", "longshore", "bare", "ratio"],
        &rows,
    );
    let r = p.r;
    for dir in ["H2D", "D2H"] {
        p.plot(
            &format!("bandwidth_{}.svg", dir.to_lowercase()),
            &format!("{dir} bandwidth"),
            |path| plot::plot_bandwidth(r, dir, path),
        )?;
    }
    Ok(())
}

/// The measured limits, one row each.
pub(crate) fn limits(p: &mut Page<'_>) -> Result<()> {
    let rows: Vec<Vec<String>> = by_section(p.r, "limits")
        .map(|f| vec![f.case.clone(), fmt_value(f.value, &f.unit)])
        .collect();
    table(&mut p.md, &["limit (measured in this run)", "value"], &rows);
    Ok(())
}

/// The num_workers x pin_memory sweep, the tuner pick, and a plot per workload.
pub(crate) fn loader(p: &mut Page<'_>) -> Result<()> {
    let mut rows: BTreeMap<(String, u64, bool), [Option<f64>; 2]> = BTreeMap::new();
    let mut windows: BTreeMap<(String, u64, bool), String> = BTreeMap::new();
    let mut best = Vec::new();
    for f in by_section(p.r, "loader") {
        let (Some(w), Some(nw), Some(pin)) =
            (f.s("workload"), f.u("num_workers"), f.b("pin_memory"))
        else {
            continue;
        };
        match f.s("what") {
            Some("best") => best.push(vec![
                w.to_owned(),
                nw.to_string(),
                pin.to_string(),
                fmt_value(f.value, &f.unit),
            ]),
            Some("wait") => rows.entry((w.into(), nw, pin)).or_default()[1] = Some(f.value),
            _ => {
                rows.entry((w.into(), nw, pin)).or_default()[0] = Some(f.value);
                if let (Some(e), Some(b)) = (f.u("epochs"), f.u("batches")) {
                    windows.insert((w.into(), nw, pin), format!("{e} / {b}"));
                }
            }
        }
    }
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(key, v)| {
            let window = windows.get(&key).cloned().unwrap_or_else(|| "-".into());
            let (w, nw, pin) = key;
            vec![
                w,
                nw.to_string(),
                pin.to_string(),
                v[0].map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                window,
                v[1].map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v)),
            ]
        })
        .collect();
    table(
        &mut p.md,
        &[
            "workload",
            "num_workers",
            "pin_memory",
            "samples/s",
            "timed epochs / batches",
            "consumer waited",
        ],
        &rows,
    );
    if !best.is_empty() {
        p.md.push_str("Tuner pick (best of the sweep):\n\n");
        table(
            &mut p.md,
            &["workload", "num_workers", "pin_memory", "throughput"],
            &best,
        );
    }
    let r = p.r;
    for w in ["images", "images-u8", "tabular"] {
        p.plot(&format!("loader_{w}.svg"), &format!("loader {w}"), |path| {
            plot::plot_loader(r, w, path)
        })?;
    }
    Ok(())
}

/// samples/s against num_workers per workload, the knee, and one plot of every workload
/// (each as a fraction of its best).
pub(crate) fn scaling(p: &mut Page<'_>) -> Result<()> {
    let mut rows = Vec::new();
    let mut knees = Vec::new();
    for f in by_section(p.r, "scaling") {
        let Some(w) = f.s("workload") else { continue };
        if f.s("what") == Some("knee") {
            knees.push(vec![
                w.to_owned(),
                f.u("best_workers").map_or("-".into(), |n| n.to_string()),
                f.u("worst_workers").map_or("-".into(), |n| n.to_string()),
                fmt_value(f.value, "fraction"),
                if f.value <= 0.05 { "yes" } else { "NO" }.to_owned(),
            ]);
        } else if let Some(nw) = f.u("num_workers") {
            rows.push(vec![
                w.to_owned(),
                nw.to_string(),
                format!("{:.0}", f.value),
            ]);
        }
    }
    table(&mut p.md, &["workload", "num_workers", "samples/s"], &rows);
    if !knees.is_empty() {
        p.md.push_str("Past the knee (target: never more than 5% below the best):\n\n");
        table(
            &mut p.md,
            &[
                "workload",
                "best at",
                "worst past it at",
                "below the best",
                "<= 5%",
            ],
            &knees,
        );
    }
    let r = p.r;
    p.plot("scaling.svg", "scaling", |path| plot::plot_scaling(r, path))
}

/// PyTorch's grid: the best screened configurations, the finals, and the ratios.
pub(crate) fn pytorch(p: &mut Page<'_>) -> Result<()> {
    let mut screened: BTreeMap<String, Vec<(f64, String)>> = BTreeMap::new();
    let mut finals = Vec::new();
    let mut ratios = Vec::new();
    for f in by_section(p.r, "pytorch") {
        let Some(w) = f.s("workload") else { continue };
        if f.s("what") == Some("ratio") {
            let num = |k: &str| f.params.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
            ratios.push(vec![
                w.to_owned(),
                format!("{:.0}", num("longshore_samples_per_s")),
                format!("{:.0}", num("pytorch_samples_per_s")),
                format!("{:.1}x", f.value),
                format!(">= {:.0}x", num("target")),
            ]);
            continue;
        }
        let config = f
            .case
            .split_once(' ')
            .map(|(_, rest)| rest)
            .unwrap_or(&f.case)
            .to_owned();
        match f.s("stage") {
            Some("screen") => screened
                .entry(w.to_owned())
                .or_default()
                .push((f.value, config)),
            _ => finals.push(vec![config, format!("{:.0}", f.value)]),
        }
    }
    if !finals.is_empty() {
        p.md.push_str("Finals (whole-file epochs; the best is PyTorch's best):\n\n");
        table(&mut p.md, &["configuration", "samples/s"], &finals);
    }
    for (w, mut v) in screened {
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        let n = v.len();
        let rows: Vec<Vec<String>> = v
            .into_iter()
            .take(8)
            .map(|(s, c)| vec![c, format!("{s:.0}")])
            .collect();
        let _ = writeln!(p.md, "Screening, {w}: the 8 best of {n} configurations:\n");
        table(&mut p.md, &["configuration", "samples/s"], &rows);
    }
    if !ratios.is_empty() {
        p.md.push_str("longshore's best against PyTorch's best, same run, same method:\n\n");
        table(
            &mut p.md,
            &["workload", "longshore", "pytorch", "ratio", "target"],
            &ratios,
        );
    }
    Ok(())
}

/// The roofline table and a bar plot of the fractions.
pub(crate) fn roofline(p: &mut Page<'_>) -> Result<()> {
    let mut rows = Vec::new();
    for f in by_section(p.r, "roofline") {
        let num = |k: &str| f.params.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        rows.push(vec![
            f.s("workload").unwrap_or("-").to_owned(),
            format!("{:.0}", num("samples_per_s")),
            f.s("limit").unwrap_or("-").to_owned(),
            format!("{:.0}", num("limit_samples_per_s")),
            fmt_value(f.value, "fraction"),
            if f.b("bound") == Some(true) {
                "**bound**"
            } else {
                ""
            }
            .to_owned(),
        ]);
    }
    table(
        &mut p.md,
        &[
            "workload",
            "best samples/s",
            "limit",
            "limit (samples/s)",
            "fraction of limit",
            "",
        ],
        &rows,
    );
    let r = p.r;
    p.plot("roofline.svg", "roofline", |path| {
        plot::plot_roofline(r, path)
    })
}
