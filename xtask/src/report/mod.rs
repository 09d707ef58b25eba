//! Renders `results.json` (written by `longshore-bench`) into `report.md` and SVG plots.
//!
//! The schema mirrors `longshore_benches::results`; it is repeated here so that xtask, a
//! debug build, does not compile longshore. Each section of the report has a renderer in
//! [`SECTIONS`] (one line per section, the renderer in [`sections`] or its own module); a
//! section without one is rendered as a plain table of its figures.

mod plot;
mod sections;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
pub(crate) struct Results {
    pub(crate) machine: Machine,
    #[serde(default)]
    pub(crate) sections: Vec<String>,
    pub(crate) figures: Vec<Figure>,
    #[serde(default)]
    pub(crate) notes: Vec<Note>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) ram_bytes: u64,
    pub(crate) gpu: Option<String>,
    pub(crate) cuda_available: bool,
    pub(crate) cuda_reason: Option<String>,
    #[serde(default)]
    pub(crate) os: String,
    pub(crate) date_utc: String,
    pub(crate) quick: bool,
    #[serde(default)]
    pub(crate) longshore_version: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Figure {
    pub(crate) section: String,
    pub(crate) case: String,
    pub(crate) value: f64,
    pub(crate) unit: String,
    #[serde(default)]
    pub(crate) params: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Note {
    pub(crate) section: String,
    pub(crate) text: String,
}

impl Figure {
    pub(crate) fn s(&self, k: &str) -> Option<&str> {
        self.params.get(k).and_then(Value::as_str)
    }
    pub(crate) fn u(&self, k: &str) -> Option<u64> {
        self.params.get(k).and_then(Value::as_u64)
    }
    pub(crate) fn b(&self, k: &str) -> Option<bool> {
        self.params.get(k).and_then(Value::as_bool)
    }
}

pub(crate) fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

pub(crate) fn fmt_value(v: f64, unit: &str) -> String {
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

pub(crate) fn by_section<'a>(r: &'a Results, s: &'a str) -> impl Iterator<Item = &'a Figure> + 'a {
    r.figures.iter().filter(move |f| f.section == s)
}

pub(crate) fn table(md: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "|{}", " --- |".repeat(header.len()));
    for r in rows {
        let _ = writeln!(md, "| {} |", r.join(" | "));
    }
    md.push('\n');
}

/// One page being rendered: the results, where files go, the markdown so far and the files
/// written.
pub(crate) struct Page<'a> {
    pub(crate) r: &'a Results,
    pub(crate) out: &'a Path,
    pub(crate) md: String,
    pub(crate) written: Vec<PathBuf>,
}

impl Page<'_> {
    /// Writes a plot with `draw(path) -> Ok(true)` and links it from the page.
    pub(crate) fn plot(
        &mut self,
        name: &str,
        alt: &str,
        draw: impl FnOnce(&Path) -> Result<bool>,
    ) -> Result<()> {
        let path = self.out.join(name);
        if draw(&path)? {
            let _ = writeln!(self.md, "![{alt}]({name})\n");
            self.written.push(path);
        }
        Ok(())
    }
}

/// Renders one section's figures into the page.
pub(crate) type Renderer = fn(&mut Page<'_>) -> Result<()>;

/// The renderer of each section that has one (others get a plain table).
pub(crate) const SECTIONS: &[(&str, Renderer)] = &[
    ("bandwidth", sections::bandwidth),
    ("limits", sections::limits),
    ("loader", sections::loader),
    ("scaling", sections::scaling),
    ("pytorch", sections::pytorch),
    ("roofline", sections::roofline),
];

/// How the loader figures are measured, written at the top of every report.
const METHOD: &str = "Loader figures are steady state: each configuration is built with \
persistent workers, one warm-up epoch is consumed untimed, then whole epochs are timed (at \
least 2 epochs, 1 s and 10 x num_workers x prefetch_factor batches). A timed window starts \
and ends with an empty pipeline, so no pre-filled queue is timed, and every epoch pays its \
own pipeline fill as training does. PyTorch is measured the same way (whole epochs, warm-up \
epoch with persistent workers) over workers x pin_memory x prefetch_factor x \
persistent_workers, and every ratio is against its best configuration.";

/// Reads `results` and writes `report.md` and the plots into `out`; returns the files written.
pub(crate) fn render(results: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(results)
        .with_context(|| format!("reading {}", results.display()))?;
    let r: Results =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", results.display()))?;
    std::fs::create_dir_all(out)?;
    let mut page = Page {
        r: &r,
        out,
        md: String::new(),
        written: Vec::new(),
    };
    let m = &r.machine;
    let _ = writeln!(
        page.md,
        "# longshore benchmark report{}\n",
        if m.quick { " (--quick)" } else { "" }
    );
    table(
        &mut page.md,
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
    let _ = writeln!(page.md, "Method: {METHOD}\n");
    for section in &r.sections {
        let _ = writeln!(page.md, "## {section}\n");
        match SECTIONS.iter().find(|(name, _)| name == section) {
            Some((_, render)) => render(&mut page)?,
            None => {
                let rows: Vec<Vec<String>> = by_section(&r, section)
                    .map(|f| vec![f.case.clone(), fmt_value(f.value, &f.unit)])
                    .collect();
                if !rows.is_empty() {
                    table(&mut page.md, &["case", "value"], &rows);
                }
            }
        }
        for n in r.notes.iter().filter(|n| &n.section == section) {
            let _ = writeln!(page.md, "- note: {}", n.text);
        }
        page.md.push('\n');
    }
    let path = out.join("report.md");
    std::fs::write(&path, page.md.trim_end().to_owned() + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let mut written = page.written;
    written.insert(0, path);
    Ok(written)
}
