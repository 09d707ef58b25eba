//! `cargo xtask gpu-python`: builds what a GPU machine needs to test and benchmark the Python
//! package, into `gpu-python/` (git-ignored; about 3 MiB, carried with the working tree):
//!
//! * `gpu-python/wheels/`: the longshore wheel (abi3, manylinux2014: glibc >= 2.17, so it
//!   installs whatever glibc the GPU machine has) and pytest with its pure-Python dependencies;
//! * `gpu-python/baseline-wheels/`: the baselines of `bench/shards_bench.py` that the machine
//!   lacks, for CPython 3.12 on manylinux x86_64 ([`BASELINE_WHEELS`]: webdataset,
//!   mosaicml-streaming, boto3; about 21 MiB, 16 of them botocore's service models);
//! * `gpu-python/tests/`: the pytest suite;
//! * `gpu-python/bench/`: `xtask/python/*.py` (the package's bench, the per-batch probes);
//! * `gpu-python/run.sh`: what to run there (`bash gpu-python/run.sh [--no-bench | --shards]`).
//!
//! The GPU machine has Python 3.12, torch, torchvision, numpy, Pillow, pyarrow (and pyyaml,
//! requests, urllib3, python-dateutil, xxhash, tqdm, transformers) but no registry: everything
//! else travels.
//! The wheel is CI's: `python/ci/wheel.sh` builds it (maturin, ziglang for the manylinux2014
//! link, from PyPI into `target/python-ci/venv`), and pytest is downloaded with that venv's pip.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// The baselines of `shards_bench.py` and what they import that the GPU machine lacks, pinned
/// (a set `pip install webdataset mosaicml-streaming boto3` resolved together), downloaded
/// with `--no-deps`. Left out on purpose: mosaicml-streaming's clients for Azure, GCS, OCI and
/// SFTP (azure-*, google-cloud-storage, oci, paramiko and their own dependencies, tens of MiB),
/// which it imports only for those URLs, and what the machine has (numpy, pyyaml, torch,
/// torchvision, transformers, matplotlib, xxhash, tqdm, python-dateutil, urllib3). Checked by
/// installing exactly these with `--no-deps` beside torch and running the bench's webdataset
/// and Streaming rows.
pub(crate) const BASELINE_WHEELS: &[&str] = &[
    // webdataset (numpy, pyyaml: there).
    "webdataset==1.0.2",
    "braceexpand==0.1.7",
    // boto3 (python-dateutil, urllib3: there).
    "boto3==1.44.8",
    "botocore==1.44.8",
    "s3transfer==0.19.3",
    "jmespath==1.1.0",
    // mosaicml-streaming and the modules `import streaming` loads: its compression codecs
    // (brotli, snappy through cramjam, zstd: 1.5.7 has no CPython 3.12 wheel) and catalogue.
    "mosaicml-streaming==0.13.0",
    "catalogue==2.0.10",
    "Brotli==1.2.1",
    "python-snappy==0.7.3",
    "cramjam==2.14.0",
    "zstd==1.5.6.1",
];

/// The runner written into `gpu-python/run.sh`.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# On the GPU machine (Python 3.12 + torch + numpy, no registry), from the project root:
#   bash gpu-python/run.sh [--no-bench | --shards]
# Installs the wheel and pytest from gpu-python/wheels (and the shards bench's baselines from
# gpu-python/baseline-wheels) into a private folder on PYTHONPATH, beside the system's torch
# and numpy, runs the pytest suite with CUDA required, then the python benchmark and the
# per-batch cost of the torch handoff (RUST_TABULAR_SPS=<the Rust loader's tabular samples/s>
# adds the ratio to it). --shards runs only bench/shards_bench.py instead (sharded datasets
# from a local S3 server: needs the gpu-pack bundle's .gpu/bin/xtask, or XTASK=path).
# Written by `cargo xtask gpu-python`.
# Logs and results go to $OUT (the device tool's folder) or ./gpu-out.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-gpu-out}; mkdir -p "$out"; out="$(cd "$out" && pwd)"
# Not a venv: torch may live in the user site-packages, which a venv hides even with
# --system-site-packages. The wheels go to a private folder on PYTHONPATH instead.
site="${TMPDIR:-/tmp}/longshore-gpu-site"
python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" \
    "$here"/wheels/*.whl $(ls "$here"/baseline-wheels/*.whl 2>/dev/null)
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
py=python3
if [ "${1:-}" = "--shards" ]; then
    "$py" "$here/bench/shards_bench.py" --xtask "${XTASK:-$here/../.gpu/bin/xtask}" \
        --data-dir "${SHARDS_DATA_DIR:-/tmp/longshore-shards-bench}" --out "$out/shards.json" \
        2>&1 | tee "$out/shards-bench.log"
    exit "${PIPESTATUS[0]}"
fi
"$py" -c "import longshore, torch; print('longshore', longshore.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), longshore.cuda_status())" | tee "$out/python-versions.txt"
cd "$out"
LONGSHORE_REQUIRE_CUDA=1 "$py" -m pytest -q -p no:cacheprovider -rxs "$here/tests" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
if [ "${1:-}" != "--no-bench" ]; then
    # The Rust sections' results.json, if xtask bench ran first, for the Python/Rust ratio.
    rust=""
    for r in "$here/../gpu-out/bench/results.json" "$here/../gpu-out/results.json" "$out/results.json" "$here/../target/longshore-bench/results.json"; do
        [ -f "$r" ] && rust="--rust-results $r" && break
    done
    "$py" "$here/bench/python_bench.py" --data-dir "${DATA_DIR:-/tmp/longshore-bench-data}" \
        --out "$out/python.json" $rust 2>&1 | tee "$out/python-bench.log"
    "$py" "$here/bench/torch_per_batch.py" --out "$out/torch-per-batch.json" \
        ${RUST_TABULAR_SPS:+--rust-sps "$RUST_TABULAR_SPS"} 2>&1 | tee "$out/torch-per-batch.log"
    "$py" "$here/bench/torch_per_batch.py" --pinned --workers 4 --out "$out/torch-per-batch-pinned.json" \
        2>&1 | tee "$out/torch-per-batch-pinned.log"
fi
exit $rc
"#;

/// Builds `gpu-python/` under `root`.
pub(crate) fn build(root: &Path) -> Result<()> {
    let out = root.join("gpu-python");
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    let wheels = out.join("wheels");
    // The wheel exactly as CI builds it; the script makes the venv on first use.
    run(Command::new("bash")
        .arg(root.join("python/ci/wheel.sh"))
        .arg(&wheels))?;
    let py = root.join("target/python-ci/venv/bin/python");
    // pytest for CPython 3.12 on any platform (pure Python wheels only).
    run(Command::new(&py)
        .args(["-m", "pip", "download", "--quiet", "--dest"])
        .arg(&wheels)
        .args(["--only-binary=:all:", "--python-version", "3.12"])
        .args(["--implementation", "cp", "--platform", "any", "pytest"]))?;

    // The shards bench's baselines, for the GPU machine's CPython 3.12 (pure-Python wheels or
    // manylinux x86_64 ones).
    let baseline = out.join("baseline-wheels");
    run(Command::new(&py)
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
        .arg(&baseline)
        .args(["--only-binary=:all:", "--python-version", "3.12"])
        .args(["--implementation", "cp"])
        .args(["--platform", "manylinux2014_x86_64"])
        .args(["--platform", "manylinux_2_17_x86_64"])
        .args(["--platform", "manylinux_2_28_x86_64"])
        .args(["--platform", "any"])
        .args(BASELINE_WHEELS))?;
    let got = std::fs::read_dir(&baseline)?.count();
    anyhow::ensure!(
        got == BASELINE_WHEELS.len(),
        "{}: {got} wheels for the {} pinned packages",
        baseline.display(),
        BASELINE_WHEELS.len()
    );

    copy_tree(&root.join("python/tests"), &out.join("tests"))?;
    let bench = out.join("bench");
    std::fs::create_dir_all(&bench)?;
    for e in std::fs::read_dir(root.join("xtask/python"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "py") {
            std::fs::copy(&p, bench.join(p.file_name().expect("a file")))?;
        }
    }
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, RUN_SH)?;
    crate::gpu::set_executable(&run_sh)?;
    let mut listed: Vec<String> = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    listed.sort();
    println!(
        "gpu-python: {} ({} KiB, of which baseline-wheels/ {} KiB): {}; on the GPU machine: bash gpu-python/run.sh",
        out.display(),
        crate::gpu::dir_bytes(&out)? >> 10,
        crate::gpu::dir_bytes(&baseline)? >> 10,
        listed.join(", ")
    );
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    anyhow::ensure!(status.success(), "{cmd:?} failed: {status}");
    Ok(())
}

/// Copies the files under `from` to `to`, leaving out `__pycache__`.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let name = e.file_name();
        if name == "__pycache__" {
            continue;
        }
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &to.join(&name))?;
        } else {
            std::fs::copy(e.path(), to.join(&name))?;
        }
    }
    Ok(())
}
