//! `pytorch`: PyTorch's DataLoader on the same files, when `torch` imports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::Ctx;
use crate::drive::ensure_data;

fn pytorch_script(ctx: &Ctx) -> Option<PathBuf> {
    if let Some(p) = &ctx.args.pytorch_script {
        return Some(p.clone());
    }
    let rel = Path::new("xtask/pytorch/dataloader_bench.py");
    let from_manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    [rel.to_path_buf(), from_manifest]
        .into_iter()
        .find(|p| p.is_file())
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let py = ctx.args.python.clone();
    let probe = Command::new(&py)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output();
    let version = match probe {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("import failed");
            ctx.results.note(
                "pytorch",
                format!(
                    "skipped: `{py} -c \"import torch\"` failed: {}",
                    last.trim()
                ),
            );
            return Ok(());
        }
        Err(e) => {
            ctx.results
                .note("pytorch", format!("skipped: cannot run {py}: {e}"));
            return Ok(());
        }
    };
    let Some(script) = pytorch_script(ctx) else {
        ctx.results.note(
            "pytorch",
            "skipped: xtask/pytorch/dataloader_bench.py not found (pass --pytorch-script)",
        );
        return Ok(());
    };
    ensure_data(ctx)?;
    let mut cmd = Command::new(&py);
    cmd.arg(&script).arg("--dir").arg(&ctx.data_dir);
    if ctx.quick {
        cmd.args([
            "--workers",
            "0,2",
            "--prefetch",
            "2",
            "--persistent",
            "1",
            "--screen-samples-images",
            "512",
            "--screen-samples-tabular",
            "16384",
            "--final-top",
            "1",
            "--final-epochs",
            "1",
        ]);
    }
    println!("  running PyTorch {version}: {cmd:?}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        ctx.results.note(
            "pytorch",
            format!("the baseline script failed: {}", out.status),
        );
        return Ok(());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("no JSON line from the PyTorch script")?;
    let v: serde_json::Value =
        serde_json::from_str(line).context("parsing the PyTorch script's JSON")?;
    record(ctx, &v, &version);
    Ok(())
}

/// One PyTorch configuration as the script reports it.
#[derive(Debug, Clone)]
struct Config {
    workload: String,
    stage: String,
    num_workers: i64,
    pin_memory: bool,
    prefetch_factor: Option<i64>,
    persistent_workers: bool,
    samples_per_s: f64,
}

impl Config {
    fn parse(r: &serde_json::Value) -> Option<Config> {
        Some(Config {
            workload: r["workload"].as_str()?.to_owned(),
            stage: r["stage"].as_str().unwrap_or("final").to_owned(),
            num_workers: r["num_workers"].as_i64()?,
            pin_memory: r["pin_memory"].as_bool()?,
            prefetch_factor: r["prefetch_factor"].as_i64(),
            persistent_workers: r["persistent_workers"].as_bool().unwrap_or(false),
            samples_per_s: r["samples_per_s"].as_f64()?,
        })
    }

    fn label(&self) -> String {
        format!(
            "workers={} pin={} prefetch={} persistent={}",
            self.num_workers,
            self.pin_memory,
            self.prefetch_factor
                .map_or_else(|| "-".to_owned(), |p| p.to_string()),
            self.persistent_workers
        )
    }
}

/// Records the script's figures, prints the best configurations and the ratios against the
/// loader sweep's best (every ratio is against PyTorch's best final configuration).
fn record(ctx: &mut Ctx, v: &serde_json::Value, version: &str) {
    let on = if v["cuda"].as_bool() == Some(true) {
        "to cuda"
    } else {
        "on the CPU"
    };
    for n in v["notes"].as_array().into_iter().flatten() {
        if let Some(t) = n.as_str() {
            ctx.results.note("pytorch", t);
        }
    }
    ctx.results.note(
        "pytorch",
        "method: every configuration of the grid screened on whole epochs of a random subset (persistent workers: after a warm-up epoch), then the 3 best again on whole-file epochs after a warm-up epoch; the best final is PyTorch's best",
    );
    let configs: Vec<Config> = v["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Config::parse)
        .collect();
    let mut best: BTreeMap<String, Config> = BTreeMap::new();
    for c in &configs {
        ctx.results.push(
            "pytorch",
            format!("{} {} {}", c.workload, c.stage, c.label()),
            c.samples_per_s,
            "samples/s",
            json!({"workload": c.workload, "stage": c.stage, "num_workers": c.num_workers,
                   "pin_memory": c.pin_memory, "prefetch_factor": c.prefetch_factor,
                   "persistent_workers": c.persistent_workers, "torch": version}),
        );
        if c.stage == "final"
            && best
                .get(&c.workload)
                .is_none_or(|b| c.samples_per_s > b.samples_per_s)
        {
            best.insert(c.workload.clone(), c.clone());
        }
    }
    let mut rows = Vec::new();
    for w in best.keys() {
        let mut screened: Vec<&Config> = configs
            .iter()
            .filter(|c| &c.workload == w && c.stage == "screen")
            .collect();
        screened.sort_by(|a, b| b.samples_per_s.total_cmp(&a.samples_per_s));
        for c in screened.iter().take(5).chain(
            configs
                .iter()
                .filter(|c| &c.workload == w && c.stage == "final")
                .collect::<Vec<_>>()
                .iter(),
        ) {
            rows.push(vec![
                c.workload.clone(),
                c.stage.clone(),
                c.label(),
                format!("{:.0}", c.samples_per_s),
            ]);
        }
    }
    print_table(
        &format!(
            "pytorch {version} DataLoader ({on}): 5 best screened of {} and the finals",
            configs.iter().filter(|c| c.stage == "screen").count()
        ),
        &["workload", "stage", "configuration", "samples/s"],
        &rows,
    );
    let mut ratio_rows = Vec::new();
    for (w, b) in &best {
        let target = if w == "images" { 10.0 } else { 30.0 };
        match ctx.best.get(w.as_str()).copied() {
            Some(ours) if b.samples_per_s > 0.0 => {
                let ratio = ours.samples_per_s / b.samples_per_s;
                ctx.results.push(
                    "pytorch",
                    format!("{w} longshore/pytorch (best vs best)"),
                    ratio,
                    "x",
                    json!({"workload": w, "what": "ratio", "target": target,
                           "pytorch_workers": b.num_workers, "pytorch_pin": b.pin_memory,
                           "pytorch_prefetch": b.prefetch_factor, "pytorch_persistent": b.persistent_workers,
                           "pytorch_samples_per_s": b.samples_per_s,
                           "longshore_workers": ours.num_workers, "longshore_pin": ours.pin_memory,
                           "longshore_samples_per_s": ours.samples_per_s}),
                );
                ratio_rows.push(vec![
                    w.clone(),
                    format!(
                        "{:.0} (w={}, pin={})",
                        ours.samples_per_s, ours.num_workers, ours.pin_memory
                    ),
                    format!("{:.0} ({})", b.samples_per_s, b.label()),
                    format!("{ratio:.1}x"),
                    format!(">= {target:.0}x"),
                ]);
            }
            _ => ctx.results.note(
                "pytorch",
                format!("no ratio for {w}: run the loader section in the same run (or PyTorch measured 0)"),
            ),
        }
    }
    if !ratio_rows.is_empty() {
        print_table(
            "longshore vs PyTorch, best vs best (steady state, both)",
            &["workload", "longshore", "pytorch", "ratio", "target"],
            &ratio_rows,
        );
    }
}
