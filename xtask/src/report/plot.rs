//! SVG plots (plotters): line series against an x axis, and bars of fractions.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::{Results, size_label};

const COLORS: [RGBColor; 6] = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

pub(super) type Series = Vec<(String, Vec<(f64, f64)>)>;

pub(super) fn draw(
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
pub(super) fn plot_bandwidth(r: &Results, dir: &str, path: &Path) -> Result<bool> {
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
pub(super) fn plot_loader(r: &Results, workload: &str, path: &Path) -> Result<bool> {
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

/// samples/s as a fraction of each workload's best against num_workers, one series per
/// workload.
pub(super) fn plot_scaling(r: &Results, path: &Path) -> Result<bool> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for f in r
        .figures
        .iter()
        .filter(|f| f.section == "scaling" && f.s("what").is_none())
    {
        let (Some(w), Some(nw)) = (f.s("workload"), f.u("num_workers")) else {
            continue;
        };
        series
            .entry(w.to_owned())
            .or_default()
            .push((nw as f64, f.value));
    }
    if series.is_empty() {
        return Ok(false);
    }
    let mut series: Series = series
        .into_iter()
        .map(|(w, mut pts)| {
            let best = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            for p in &mut pts {
                p.1 /= best;
            }
            (format!("{w} (1.0 = {best:.0} samples/s)"), pts)
        })
        .collect();
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let fmt = |x: &f64| format!("{x:.0}");
    draw(
        path,
        &format!(
            "scaling: throughput against num_workers ({} cores)",
            r.machine.cores
        ),
        "num_workers",
        "fraction of the best",
        &series,
        &fmt,
    )?;
    Ok(true)
}

/// One bar per (workload, limit): the best rate as a fraction of that limit; the bound in red.
pub(super) fn plot_roofline(r: &Results, path: &Path) -> Result<bool> {
    let bars: Vec<(String, f64, bool)> = r
        .figures
        .iter()
        .filter(|f| f.section == "roofline")
        .map(|f| {
            (
                format!(
                    "{}: {}",
                    f.s("workload").unwrap_or("?"),
                    f.s("limit").unwrap_or("?")
                ),
                f.value,
                f.b("bound") == Some(true),
            )
        })
        .collect();
    if bars.is_empty() {
        return Ok(false);
    }
    let top = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.1;
    let n = bars.len();
    let root = SVGBackend::new(path, (900, 120 + 40 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "roofline: best steady-state rate as a fraction of each limit",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..top, 0f64..n as f64)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc("fraction of the limit (1.0 = at the limit; red: the limit that bounds)")
        .y_labels(0)
        .disable_y_mesh()
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v, bound))| {
            let y = (n - 1 - i) as f64;
            let color = if *bound { RED } else { BLUE };
            Rectangle::new([(0.0, y + 0.15), (*v, y + 0.65)], color.mix(0.7).filled())
        }))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (label, v, _))| {
            let y = (n - 1 - i) as f64;
            Text::new(
                format!("{label}: {:.0}%", 100.0 * v),
                (top * 0.01, y + 0.95),
                ("sans-serif", 13),
            )
        }))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .draw_series(LineSeries::new(
            vec![(1.0, 0.0), (1.0, n as f64)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(true)
}
