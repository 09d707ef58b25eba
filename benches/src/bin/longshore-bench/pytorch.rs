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
            "--max-batches-images",
            "10",
            "--max-batches-tabular",
            "30",
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
    let on = if v["cuda"].as_bool() == Some(true) {
        "to cuda"
    } else {
        "on the CPU"
    };
    let mut best: BTreeMap<String, (f64, i64, bool)> = BTreeMap::new();
    let mut rows = Vec::new();
    for r in v["results"].as_array().cloned().unwrap_or_default() {
        let (Some(w), Some(nw), Some(pin), Some(sps)) = (
            r["workload"].as_str(),
            r["num_workers"].as_i64(),
            r["pin_memory"].as_bool(),
            r["samples_per_s"].as_f64(),
        ) else {
            continue;
        };
        ctx.results.push(
            "pytorch",
            format!("{w} workers={nw} pin={pin}"),
            sps,
            "samples/s",
            json!({"workload": w, "num_workers": nw, "pin_memory": pin, "torch": version}),
        );
        rows.push(vec![
            w.to_owned(),
            nw.to_string(),
            pin.to_string(),
            format!("{sps:.0}"),
        ]);
        let b = best.entry(w.to_owned()).or_insert((0.0, nw, pin));
        if sps > b.0 {
            *b = (sps, nw, pin);
        }
    }
    print_table(
        &format!("pytorch {version} DataLoader ({on})"),
        &["workload", "workers", "pin", "samples/s"],
        &rows,
    );
    let mut ratio_rows = Vec::new();
    for (w, (sps, nw, pin)) in &best {
        let target = if w == "images" { 10.0 } else { 30.0 };
        match ctx.best.get(w.as_str()).copied() {
            Some(ours) if *sps > 0.0 => {
                let ratio = ours.samples_per_s / sps;
                ctx.results.push(
                    "pytorch",
                    format!("{w} longshore/pytorch (best vs best)"),
                    ratio,
                    "x",
                    json!({"workload": w, "what": "ratio", "target": target, "pytorch_workers": nw, "pytorch_pin": pin,
                           "longshore_workers": ours.num_workers, "longshore_pin": ours.pin_memory}),
                );
                ratio_rows.push(vec![
                    w.clone(),
                    format!("{:.0} (w={}, pin={})", ours.samples_per_s, ours.num_workers, ours.pin_memory),
                    format!("{sps:.0} (w={nw}, pin={pin})"),
                    format!("{ratio:.1}x"),
                    format!(">= {target:.0}x"),
                ]);
            }
            _ => ctx.results.note("pytorch", format!("no ratio for {w}: run the loader section in the same run (or PyTorch measured 0)")),
        }
    }
    if !ratio_rows.is_empty() {
        print_table(
            "longshore vs PyTorch, best vs best",
            &["workload", "longshore", "pytorch", "ratio", "target"],
            &ratio_rows,
        );
    }
    Ok(())
}
