//! Renders `results.json` (written by `longshore-bench`) into `report.md` and SVG plots.
//!
//! The schema mirrors `longshore_benches::results`; it is repeated here so that xtask, a
//! debug build, does not compile longshore.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
struct Results {
    machine: Machine,
    #[serde(default)]
    sections: Vec<String>,
    figures: Vec<Figure>,
    #[serde(default)]
    notes: Vec<Note>,
}

#[derive(Debug, Deserialize)]
struct Machine {
    cpu: String,
    cores: usize,
    ram_bytes: u64,
    gpu: Option<String>,
    cuda_available: bool,
    cuda_reason: Option<String>,
    #[serde(default)]
    os: String,
    date_utc: String,
    quick: bool,
    #[serde(default)]
    longshore_version: String,
}

#[derive(Debug, Deserialize)]
struct Figure {
    section: String,
    case: String,
    value: f64,
    unit: String,
    #[serde(default)]
    params: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct Note {
    section: String,
    text: String,
}

impl Figure {
    fn s(&self, k: &str) -> Option<&str> {
        self.params.get(k).and_then(Value::as_str)
    }
    fn u(&self, k: &str) -> Option<u64> {
        self.params.get(k).and_then(Value::as_u64)
    }
    fn b(&self, k: &str) -> Option<bool> {
        self.params.get(k).and_then(Value::as_bool)
    }
}

fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn fmt_value(v: f64, unit: &str) -> String {
    match unit {
        "fraction" => format!("{:.2}%", 100.0 * v),
        "x" => format!("{v:.2}x"),
        "ns" if v >= 1e6 => format!("{:.2} ms", v / 1e6),
        "ns" if v >= 1e3 => format!("{:.2} us", v / 1e3),
        "ns" => format!("{v:.0} ns"),
        "samples/s" => format!("{v:.0} samples/s"),
        _ => format!("{v:.2} {unit}"),
    }
}

fn by_section<'a>(r: &'a Results, s: &'a str) -> impl Iterator<Item = &'a Figure> + 'a {
    r.figures.iter().filter(move |f| f.section == s)
}

fn table(md: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "|{}", " --- |".repeat(header.len()));
    for r in rows {
        let _ = writeln!(md, "| {} |", r.join(" | "));
    }
    md.push('\n');
}

/// Reads `results` and writes `report.md` and the plots into `out`; returns the files written.
pub(crate) fn render(results: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(results)
        .with_context(|| format!("reading {}", results.display()))?;
    let r: Results =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", results.display()))?;
    std::fs::create_dir_all(out)?;
    let mut written = Vec::new();
    let mut md = String::new();
    let m = &r.machine;
    let _ = writeln!(
        md,
        "# longshore benchmark report{}\n",
        if m.quick { " (--quick)" } else { "" }
    );
    table(
        &mut md,
        &["machine", ""],
        &[
            vec!["date (UTC)".into(), m.date_utc.clone()],
            vec!["CPU".into(), format!("{} ({} cores)", m.cpu, m.cores)],
            vec![
                "RAM".into(),
                format!("{:.1} GiB", m.ram_bytes as f64 / (1u64 << 30) as f64),
            ],
            vec!["GPU".into(), m.gpu.clone().unwrap_or_else(|| "none".into())],
            vec![
                "CUDA driver".into(),
                if m.cuda_available {
                    "available".into()
                } else {
                    format!("unavailable: {}", m.cuda_reason.clone().unwrap_or_default())
                },
            ],
            vec!["OS".into(), m.os.clone()],
            vec!["longshore".into(), m.longshore_version.clone()],
            vec!["quick".into(), m.quick.to_string()],
        ],
    );

    for section in &r.sections {
        let _ = writeln!(md, "## {section}\n");
        match section.as_str() {
            "bandwidth" => {
                // (dir, kind, bytes) -> (longshore, bare, ratio)
                let mut rows: BTreeMap<(String, String, u64), [Option<f64>; 3]> = BTreeMap::new();
                for f in by_section(&r, "bandwidth") {
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
                let fmt = |v: Option<f64>, unit: &str| {
                    v.map_or_else(|| "-".into(), |v| fmt_value(v, unit))
                };
                let rows: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|((d, k, b), v)| {
                        vec![
                            d,
                            k,
                            size_label(b),
                            fmt(v[0], "GB/s"),
                            fmt(v[1], "GB/s"),
                            fmt(v[2], "x"),
                        ]
                    })
                    .collect();
                table(
                    &mut md,
                    &["dir", "kind", "size", "longshore", "bare", "ratio"],
                    &rows,
                );
                for dir in ["H2D", "D2H"] {
                    let name = format!("bandwidth_{}.svg", dir.to_lowercase());
                    if plot_bandwidth(&r, dir, &out.join(&name))? {
                        let _ = writeln!(md, "![{dir} bandwidth]({name})\n");
                        written.push(out.join(name));
                    }
                }
            }
            "loader" => {
                let mut rows: BTreeMap<(String, u64, bool), [Option<f64>; 2]> = BTreeMap::new();
                let mut best = Vec::new();
                for f in by_section(&r, "loader") {
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
                        Some("wait") => {
                            rows.entry((w.into(), nw, pin)).or_default()[1] = Some(f.value)
                        }
                        _ => rows.entry((w.into(), nw, pin)).or_default()[0] = Some(f.value),
                    }
                }
                let rows: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|((w, nw, pin), v)| {
                        vec![
                            w,
                            nw.to_string(),
                            pin.to_string(),
                            v[0].map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                            v[1].map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v)),
                        ]
                    })
                    .collect();
                table(
                    &mut md,
                    &[
                        "workload",
                        "num_workers",
                        "pin_memory",
                        "samples/s",
                        "consumer waited",
                    ],
                    &rows,
                );
                if !best.is_empty() {
                    md.push_str("Tuner pick (best of the sweep):\n\n");
                    table(
                        &mut md,
                        &["workload", "num_workers", "pin_memory", "throughput"],
                        &best,
                    );
                }
                for w in ["images", "tabular"] {
                    let name = format!("loader_{w}.svg");
                    if plot_loader(&r, w, &out.join(&name))? {
                        let _ = writeln!(md, "![loader {w}]({name})\n");
                        written.push(out.join(name));
                    }
                }
            }
            s => {
                let rows: Vec<Vec<String>> = by_section(&r, s)
                    .map(|f| vec![f.case.clone(), fmt_value(f.value, &f.unit)])
                    .collect();
                if !rows.is_empty() {
                    table(&mut md, &["case", "value"], &rows);
                }
            }
        }
        for n in r.notes.iter().filter(|n| &n.section == section) {
            let _ = writeln!(md, "- note: {}", n.text);
        }
        md.push('\n');
    }
    let path = out.join("report.md");
    std::fs::write(&path, md.trim_end().to_owned() + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    written.insert(0, path);
    Ok(written)
}

const COLORS: [RGBColor; 6] = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

type Series = Vec<(String, Vec<(f64, f64)>)>;

fn draw(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &Series,
    x_fmt: &dyn Fn(&f64) -> String,
) -> Result<()> {
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for (_, pts) in series {
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = (x1 - x0) * 0.05;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..(y1 * 1.1).max(1e-9))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(x_fmt)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// GB/s against log2(size) per memory kind (longshore's path), one plot per direction.
fn plot_bandwidth(r: &Results, dir: &str, path: &Path) -> Result<bool> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for f in r.figures.iter().filter(|f| {
        f.section == "bandwidth" && f.s("dir") == Some(dir) && f.s("path") == Some("longshore")
    }) {
        let (Some(kind), Some(bytes)) = (f.s("kind"), f.u("bytes")) else {
            continue;
        };
        series
            .entry(kind.to_owned())
            .or_default()
            .push(((bytes as f64).log2(), f.value));
    }
    if series.is_empty() {
        return Ok(false);
    }
    let mut series: Series = series.into_iter().collect();
    for (_, pts) in &mut series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let fmt = |x: &f64| size_label(2f64.powf(x.round()) as u64);
    draw(
        path,
        &format!(
            "{dir} bandwidth by memory kind ({})",
            r.machine.gpu.as_deref().unwrap_or("Cpu backend")
        ),
        "transfer size",
        "GB/s",
        &series,
        &fmt,
    )?;
    Ok(true)
}

/// samples/s against num_workers per pin_memory setting for one workload.
fn plot_loader(r: &Results, workload: &str, path: &Path) -> Result<bool> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for f in r.figures.iter().filter(|f| {
        f.section == "loader" && f.s("workload") == Some(workload) && f.s("what").is_none()
    }) {
        let (Some(nw), Some(pin)) = (f.u("num_workers"), f.b("pin_memory")) else {
            continue;
        };
        series
            .entry(format!("pin_memory={pin}"))
            .or_default()
            .push((nw as f64, f.value));
    }
    if series.is_empty() {
        return Ok(false);
    }
    let mut series: Series = series.into_iter().collect();
    for (_, pts) in &mut series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let fmt = |x: &f64| format!("{x:.0}");
    draw(
        path,
        &format!("loader throughput, {workload}"),
        "num_workers",
        "samples/s",
        &series,
        &fmt,
    )?;
    Ok(true)
}
