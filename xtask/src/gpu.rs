//! `cargo xtask gpu-pack`: builds, here, everything a GPU machine without a Rust toolchain
//! runs, and packs it small enough to travel with the working tree.
//!
//! * `.gpu/tests/`: the release test binaries (`cargo test --release --no-run`, the whole
//!   workspace unless cargo test arguments are given), stripped;
//! * `.gpu/bin/`: the release examples and binaries (`xtask` itself included), stripped, the
//!   criterion benches as `<name>-bench`, and `longshore-bench` with its symbol table kept
//!   (its sampling profiler, `--profile`, names functions from it);
//! * `.gpu/run.sh`: runs every test binary with `LONGSHORE_REQUIRE_CUDA=1` and ends with
//!   `gpu-bundle: N passed, N failed`;
//! * `gpu-pack/gpu.tar.xz`: `.gpu/` compressed (both are git-ignored, so pass `gpu-pack` as a
//!   carried path to the GPU machine).
//!
//! On the GPU machine: `tar -xJf gpu-pack/gpu.tar.xz && bash .gpu/run.sh`, then
//! `.gpu/bin/xtask gpu-verify` / `gpu-bench` (see `gpu_run.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::cargo;

/// What travels to the GPU machine must fit this (the device tool's limit on carried paths).
const LIMIT_MIB: u64 = 64;

/// The runner written into `.gpu/run.sh`.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs every bundled test binary with CUDA required (CUDA tests fail instead of skipping);
# arguments go to each binary (a test-name filter). Ends with one line:
# "gpu-bundle: N passed, N failed". Written by `cargo xtask gpu-pack`.
cd "$(dirname "$0")"
export LONGSHORE_REQUIRE_CUDA=1 RUST_BACKTRACE=1
pass=0; fail=0
for t in tests/*; do
  echo "=== $t"
  if "$t" "$@" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $t"; fi
done
echo "gpu-bundle: $pass passed, $fail failed"
[ "$fail" = 0 ]
"#;

/// Builds `.gpu/` and `gpu-pack/gpu.tar.xz` under `root`; `test_args` go to
/// `cargo test --release --no-run` (default `--workspace`).
pub(crate) fn pack(root: &Path, test_args: &[String]) -> Result<()> {
    let gpu = root.join(".gpu");
    if gpu.exists() {
        std::fs::remove_dir_all(&gpu).with_context(|| format!("removing {}", gpu.display()))?;
    }
    let (tests, bin) = (gpu.join("tests"), gpu.join("bin"));
    std::fs::create_dir_all(&tests)?;
    std::fs::create_dir_all(&bin)?;

    let mut args: Vec<String> = ["test", "--release", "--no-run"].map(String::from).to_vec();
    if test_args.is_empty() {
        args.push("--workspace".into());
    } else {
        args.extend(test_args.iter().cloned());
    }
    eprintln!(
        "gpu-pack: building the test binaries (release): {}",
        args[3..].join(" ")
    );
    for a in artifacts(root, &args)? {
        if !a.test {
            continue;
        }
        // A proc-macro crate's own test binary links libstd dynamically (proc macros build
        // with prefer-dynamic) and the GPU machine has no toolchain; it has no CUDA path
        // either (CI runs it).
        if a.name == "longshore_derive" {
            continue;
        }
        let hash = a
            .exe
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(|f| f.rsplit_once('-'))
            .map_or("0", |(_, h)| h);
        copy_stripped(&a.exe, &tests.join(format!("{}-{hash}", a.name)), true)?;
    }

    eprintln!("gpu-pack: building the examples and binaries (release)");
    let build = ["build", "--release", "--workspace", "--examples", "--bins"];
    for a in artifacts(root, &build.map(String::from))? {
        if a.test {
            continue;
        }
        let file = a.exe.file_name().context("an executable without a name")?;
        // The sampling profiler of `longshore-bench --profile` names functions from the
        // symbol table: strip debug info only.
        let full = a.name != "longshore-bench";
        copy_stripped(&a.exe, &bin.join(file), full)?;
    }

    eprintln!("gpu-pack: building the criterion benches (release)");
    let bench = ["bench", "-p", "longshore-benches", "--no-run"];
    for a in artifacts(root, &bench.map(String::from))? {
        if a.kind == "bench" {
            copy_stripped(&a.exe, &bin.join(format!("{}-bench", a.name)), true)?;
        }
    }

    let run = gpu.join("run.sh");
    std::fs::write(&run, RUN_SH)?;
    set_executable(&run)?;

    let count = |d: &Path| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    eprintln!(
        "gpu-pack: {} test binaries, {} programs, {} MiB in .gpu/",
        count(&tests),
        count(&bin),
        dir_bytes(&gpu)? >> 20
    );
    let archive = root.join("gpu-pack/gpu.tar.xz");
    std::fs::create_dir_all(archive.parent().expect("a file in a folder"))?;
    let status = Command::new("tar")
        .current_dir(root)
        .env("XZ_OPT", "-9 -T0")
        .args(["-cJf", "gpu-pack/gpu.tar.xz", ".gpu"])
        .status()
        .context("starting tar")?;
    anyhow::ensure!(status.success(), "tar failed: {status}");
    let size = std::fs::metadata(&archive)?.len();
    println!(
        "gpu-pack: {} ({:.1} MiB); on the GPU machine: tar -xJf gpu-pack/gpu.tar.xz && bash .gpu/run.sh",
        archive.display(),
        size as f64 / (1 << 20) as f64
    );
    anyhow::ensure!(
        size < LIMIT_MIB << 20,
        "gpu-pack: {} is over {LIMIT_MIB} MiB: bundle fewer packages (cargo xtask gpu-pack -p NAME ...)",
        archive.display()
    );
    Ok(())
}

/// One executable cargo built.
struct Artifact {
    /// The target's name (`longshore-bench`, `cuda_roundtrip`, ...).
    name: String,
    /// The target's first kind (`lib`, `bin`, `test`, `bench`, `example`).
    kind: String,
    /// Built with the test harness.
    test: bool,
    exe: PathBuf,
}

/// Runs `cargo ARGS --message-format=json` in `root` and returns the executables it built,
/// one per target (the last message wins).
fn artifacts(root: &Path, args: &[String]) -> Result<Vec<Artifact>> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args(args)
        .arg("--message-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    anyhow::ensure!(out.status.success(), "{cmd:?} failed: {}", out.status);
    let mut found = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if m["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = m["executable"].as_str() else {
            continue;
        };
        let name = m["target"]["name"].as_str().unwrap_or_default().to_string();
        let kind = m["target"]["kind"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let test = m["profile"]["test"].as_bool().unwrap_or(false);
        found.insert(
            exe.to_string(),
            Artifact {
                name,
                kind,
                test,
                exe: PathBuf::from(exe),
            },
        );
    }
    Ok(found.into_values().collect())
}

/// Copies `from` to `to` through `strip` (all symbols, or debug info only).
fn copy_stripped(from: &Path, to: &Path, all: bool) -> Result<()> {
    let mut strip = Command::new("strip");
    if !all {
        strip.arg("--strip-debug");
    }
    let status = strip
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .context("starting strip")?;
    anyhow::ensure!(
        status.success(),
        "strip {} failed: {status}",
        from.display()
    );
    Ok(())
}

/// Marks `path` executable (a runner script).
#[cfg(unix)]
pub(crate) fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn set_executable(_: &Path) -> Result<()> {
    Ok(())
}

/// The bytes of every file under `dir`.
pub(crate) fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let meta = e.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&e.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
