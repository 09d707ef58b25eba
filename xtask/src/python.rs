//! The `python` section of `cargo xtask bench`: runs `xtask/python/python_bench.py` (the
//! longshore Python package against PyTorch's DataLoader on the same files, steady state) with
//! the interpreter in `LONGSHORE_PYTHON` (default `python3`), after the Rust sections so that
//! it can compare with their `results.json`. Writes `python.json` and `python.md` beside it.
//! Skipped with a note when the interpreter cannot import `longshore` (install the wheel that
//! `bash python/ci/wheel.sh` builds, or run `cargo xtask gpu-python`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// Runs the section; `Ok(false)` when it was skipped.
pub(crate) fn run(root: &Path, out: &Path, data_dir: Option<&Path>, quick: bool) -> Result<bool> {
    let py = std::env::var("LONGSHORE_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&py)
        .args(["-c", "import longshore, numpy"])
        .current_dir(out.parent().unwrap_or(out))
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "python section skipped: {py} cannot import longshore and numpy ({})",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            return Ok(false);
        }
        Err(e) => {
            eprintln!("python section skipped: cannot run {py}: {e}");
            return Ok(false);
        }
    }
    std::fs::create_dir_all(out)?;
    // The script runs in `out`: every path it gets is absolute.
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (root, out) = (abs(root), abs(out));
    let out = out.as_path();
    let script = root.join("xtask/python/python_bench.py");
    let mut cmd = Command::new(&py);
    cmd.arg(&script)
        .arg("--out")
        .arg(out.join("python.json"))
        .arg("--data-dir")
        .arg(data_dir.map_or_else(|| out.join("data"), abs));
    let results = out.join("results.json");
    if results.exists() {
        cmd.arg("--rust-results").arg(&results);
    }
    if quick {
        cmd.arg("--quick");
    }
    // Run outside the repository so `import longshore` finds the installed package, not the
    // source folder `python/longshore`.
    cmd.current_dir(out);
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    anyhow::ensure!(status.success(), "python_bench.py failed: {status}");
    Ok(true)
}
