//! `cargo xtask`: project automation for longshore.
//!
//! * `cargo xtask bench [--quick] [--only S,...] [--json] [--out DIR] [--data-dir DIR]
//!   [--bench-bin PATH]`: builds and runs the release `longshore-bench` binary (or runs a
//!   prebuilt one), then renders `results.json` into `report.md` and SVG plots.
//! * `cargo xtask bench --criterion [--quick] [--only FILTER]`: the criterion benches
//!   (`cargo bench -p longshore-benches`).
//! * `cargo xtask report --results FILE --out DIR`: only renders (after a run elsewhere).
//! * `cargo xtask modules [DIR...]`: every crate's module graph (and the Python binding's)
//!   checked for cycles (see modules.rs; its test runs the check in `cargo test`).
//! * `cargo xtask gpu-pack [CARGO TEST ARGS]`: release test binaries, examples, benches and
//!   xtask, stripped, into `.gpu/` with `.gpu/run.sh`, compressed into `gpu-pack/gpu.tar.xz`
//!   for a GPU machine without a Rust toolchain (see gpu.rs).
//! * `cargo xtask gpu-python`: the Python wheel (manylinux2014), pytest, the pytest suite and
//!   the Python bench scripts into `gpu-python/` with `gpu-python/run.sh` (see gpu_python.rs).
//! * `cargo xtask shard --input DIR|--npy NAME=PATH... --out DIR [--format wds|mds]
//!   [--shard-size 64MiB] [--synthetic N]`: packs an ImageFolder or `.npy` arrays into
//!   WebDataset or MDS shards with their index (see shard.rs).
//! * `cargo xtask s3-serve --dir DIR [--port P] [--bucket B] [--latency-ms MS]`: serves a
//!   directory as an S3 bucket on 127.0.0.1 until killed, anonymous reads allowed (see
//!   s3_serve.rs); also `.gpu/bin/xtask s3-serve` from the `gpu-pack` bundle.
//! * On that GPU machine, from the bundle: `.gpu/bin/xtask gpu-verify [--sanitizer-secs S]`
//!   (the tests with CUDA required, then compute-sanitizer) and `.gpu/bin/xtask gpu-bench
//!   [--only S,...] [--budget-secs S]` (the full bench, the staging sweep, the criterion
//!   benches); see gpu_run.rs.
//!
//! `cargo xtask` is a debug build, so this crate only drives: every measurement happens in the
//! release binary.
#![forbid(unsafe_code)]

mod gpu;
mod gpu_python;
mod gpu_run;
mod jpeg;
mod modules;
mod python;
mod report;
mod s3_serve;
mod shard;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "longshore project automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Measure longshore on this machine: results.json, report.md and plots under --out.
    Bench {
        /// Small sizes and few repetitions, to prove every section runs (CI).
        #[arg(long)]
        quick: bool,
        /// Only these sections (bandwidth,pool,limits,loader,scaling,overlap,pytorch,roofline,
        /// jpeg,python; `longshore-bench --list` names its own); with --criterion, a criterion
        /// filter.
        #[arg(long)]
        only: Option<String>,
        /// Print results.json on stdout (the tables go to stderr).
        #[arg(long)]
        json: bool,
        /// Output folder (default: `target/longshore-bench` in the workspace).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where the loader workloads are generated and reused (default: `<out>/data`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Run this prebuilt `longshore-bench` binary instead of building it with cargo.
        #[arg(long)]
        bench_bin: Option<PathBuf>,
        /// Run the criterion benches instead (`cargo bench -p longshore-benches`).
        #[arg(long)]
        criterion: bool,
    },
    /// Check every crate's module graph (and the Python binding's) for cycles: imports point
    /// down, never around a loop (see modules.rs).
    Modules {
        /// Source folders to check (default: `crates/*/src` and `python/src`).
        dirs: Vec<PathBuf>,
    },
    /// Render a results.json into report.md and SVG plots.
    Report {
        /// The results.json to render.
        #[arg(long)]
        results: PathBuf,
        /// Output folder (default: the folder of --results).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Build the release test binaries, examples, benches and xtask into `.gpu/` (with
    /// `.gpu/run.sh`) and compress them into `gpu-pack/gpu.tar.xz`, for a GPU machine
    /// without a Rust toolchain.
    GpuPack {
        /// Arguments for `cargo test --release --no-run` (default: `--workspace`), e.g.
        /// `-p longshore-transfer -p longshore-loader` for a smaller bundle.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_args: Vec<String>,
    },
    /// Build the Python wheel (manylinux2014, with zig), pytest, the pytest suite and the
    /// Python bench scripts into `gpu-python/` with `gpu-python/run.sh`, for a GPU machine
    /// with Python, torch and numpy but no registry. Needs PyPI here.
    GpuPython,
    /// Pack an ImageFolder (class subfolders of JPEGs) or `.npy` arrays into WebDataset tar
    /// shards (or MDS shards) of a target size, with their index.
    Shard(shard::Args),
    /// Serve a directory as an S3-compatible bucket on 127.0.0.1 until killed (test
    /// credentials; anonymous reads allowed), printing the endpoint and the env to export.
    S3Serve(s3_serve::Args),
    /// On the GPU machine, from the `gpu-pack` bundle: every bundled test with CUDA required,
    /// then compute-sanitizer over the tests that reach the driver.
    GpuVerify {
        /// Seconds for all compute-sanitizer runs together (0: none).
        #[arg(long, default_value_t = 300)]
        sanitizer_secs: u64,
        /// More test binaries to sanitise, by name (e.g. `nvjpeg_decode`).
        #[arg(long, value_delimiter = ',')]
        sanitize_extra: Vec<String>,
        /// Logs folder (default: `$OUT`, else `gpu-out`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// On the GPU machine, from the `gpu-pack` bundle: `xtask bench` with the bundled
    /// `longshore-bench`, the staging sweep, then the criterion benches within the budget.
    GpuBench {
        /// Only these bench sections (as `bench --only`).
        #[arg(long)]
        only: Option<String>,
        /// Seconds from the start after which no criterion bench starts.
        #[arg(long, default_value_t = 540)]
        budget_secs: u64,
        /// Results folder (default: `$OUT`, else `gpu-out`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// The workspace root when run through cargo, else the current folder (a prebuilt xtask is
/// run from the repository root).
fn root() -> PathBuf {
    match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            dir.parent().map(Path::to_path_buf).unwrap_or(dir)
        }
        None => PathBuf::from("."),
    }
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Bench {
            quick,
            only,
            criterion: true,
            ..
        } => criterion(quick, only),
        Cmd::Bench {
            quick,
            only,
            json,
            out,
            data_dir,
            bench_bin,
            criterion: false,
        } => {
            let root = root();
            // The binary runs in the workspace root: make the caller's relative paths absolute.
            let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
            let out = out
                .map(abs)
                .unwrap_or_else(|| root.join("target/longshore-bench"));
            let (data_dir, bench_bin) = (data_dir.map(abs), bench_bin.map(abs));
            // The `python` section is a script run after the binaries (see python.rs).
            let python_section = only
                .as_deref()
                .is_none_or(|l| l.split(',').any(|s| s == "python"));
            let only = only.map(|l| {
                l.split(',')
                    .filter(|s| *s != "python")
                    .collect::<Vec<_>>()
                    .join(",")
            });
            // The `jpeg` section is its own binary (jpeg-bench); the others are longshore-bench's.
            let (jpeg, only) = jpeg::split_only(only);
            if only.as_deref() != Some("") {
                longshore_bench(&root, &out, quick, &only, &data_dir, &bench_bin, json)?;
            }
            if jpeg {
                jpeg::run(&root, &out, quick, &data_dir, &bench_bin)?;
            }
            if python_section {
                python::run(&root, &out, data_dir.as_deref(), quick)?;
            }
            Ok(())
        }
        Cmd::Modules { dirs } => modules::run(&root(), &dirs),
        Cmd::Shard(args) => shard::run(args),
        Cmd::S3Serve(args) => s3_serve::run(args),
        Cmd::GpuPack { cargo_args } => gpu::pack(&root(), &cargo_args),
        Cmd::GpuPython => gpu_python::build(&root()),
        Cmd::GpuVerify {
            sanitizer_secs,
            sanitize_extra,
            out,
        } => gpu_run::verify(&gpu_run::out_dir(out)?, sanitizer_secs, &sanitize_extra),
        Cmd::GpuBench {
            only,
            budget_secs,
            out,
        } => gpu_run::bench(&gpu_run::out_dir(out)?, only.as_deref(), budget_secs),
        Cmd::Report { results, out } => {
            let out = out.unwrap_or_else(|| {
                results
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| ".".into())
            });
            for p in report::render(&results, &out)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
    }
}

/// Runs longshore-bench (built here, or prebuilt) and renders its results.json.
fn longshore_bench(
    root: &Path,
    out: &Path,
    quick: bool,
    only: &Option<String>,
    data_dir: &Option<PathBuf>,
    bench_bin: &Option<PathBuf>,
    json: bool,
) -> Result<()> {
    let mut cmd = match &bench_bin {
        Some(bin) => Command::new(bin),
        None => {
            let mut c = Command::new(cargo());
            c.args([
                "run",
                "--release",
                "-p",
                "longshore-benches",
                "--bin",
                "longshore-bench",
                "--",
            ]);
            c
        }
    };
    cmd.current_dir(root).arg("--out").arg(out);
    if quick {
        cmd.arg("--quick");
    }
    if let Some(only) = &only {
        cmd.args(["--only", only]);
    }
    if let Some(dir) = &data_dir {
        cmd.arg("--data-dir").arg(dir);
    }
    if json {
        cmd.stdout(std::io::stderr());
    }
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    anyhow::ensure!(status.success(), "longshore-bench failed: {status}");
    let results = out.join("results.json");
    let written = report::render(&results, out)?;
    for p in &written {
        eprintln!("wrote {}", p.display());
    }
    if json {
        print!("{}", std::fs::read_to_string(&results)?);
    }
    Ok(())
}

/// `cargo bench -p longshore-benches`, quick with short measurement times.
fn criterion(quick: bool, only: Option<String>) -> Result<()> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root())
        .args(["bench", "-p", "longshore-benches"]);
    if quick {
        cmd.env("LONGSHORE_BENCH_QUICK", "1");
    }
    cmd.arg("--");
    if let Some(filter) = only {
        cmd.arg(filter);
    }
    if quick {
        cmd.args(["--warm-up-time", "0.2", "--measurement-time", "0.5"]);
    }
    let status = cmd.status()?;
    anyhow::ensure!(status.success(), "cargo bench failed: {status}");
    Ok(())
}
