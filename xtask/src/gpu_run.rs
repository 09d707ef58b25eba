//! The xtask subcommands run on the GPU machine from the bundle `cargo xtask gpu-pack` built
//! (`.gpu/bin/xtask ...`, from the repository root; no Rust toolchain there):
//!
//! * `gpu-verify`: every bundled test with CUDA required (`.gpu/run.sh`), then
//!   compute-sanitizer (memcheck with leak check, racecheck, synccheck) over the test binaries
//!   that reach the driver, within a time budget (`sanitizer.log`, `sanitizer-logs.tgz`);
//! * `gpu-bench`: the full `xtask bench` with the bundled `longshore-bench`, the staging sweep,
//!   then the criterion benches in what is left of a time budget.
//!
//! Logs and results go to `--out` (default `$OUT`, the device tool's folder, else `gpu-out`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

/// The test binaries that reach the driver (compute-sanitizer refuses a program that makes no
/// CUDA call, and the others run on the Cpu device only).
const SANITIZED: &[&str] = &[
    "cuda_roundtrip",
    "cuda_device_lifetime",
    "cuda_host",
    "buffer_kinds",
    "cuda_async_mismatch",
    "device_errors",
    "ops_cuda_vs_cpu",
    "device_delivery",
    "reliability_budget",
    "cuda_stream_seams",
    "export_cuda",
    "collective_cuda",
];

/// `--out`, else `$OUT`, else `gpu-out`; created.
pub(crate) fn out_dir(out: Option<PathBuf>) -> Result<PathBuf> {
    let out = out
        .or_else(|| std::env::var_os("OUT").map(PathBuf::from))
        .unwrap_or_else(|| "gpu-out".into());
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    Ok(out)
}

/// Runs a shell line, returns its output (empty when it fails: machine facts are best effort).
fn sh(line: &str) -> String {
    Command::new("bash")
        .args(["-c", line])
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s
        })
        .unwrap_or_default()
}

/// Writes the machine's facts (date, GPUs, driver, cores) to `file` and prints them.
fn machine(file: &Path) -> Result<()> {
    let facts = sh("date -u; uname -r; \
         nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; \
         command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1");
    print!("{facts}");
    std::fs::write(file, facts)?;
    Ok(())
}

/// Runs `cmd` with its stdout and stderr into `log`, under `timeout SECS` when given.
fn run_logged(mut cmd: Command, log: &Path) -> Result<bool> {
    let f = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdout(f.try_clone()?).stderr(f);
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    Ok(status.success())
}

/// Prints the lines of `log` that `keep` accepts, the last `n` of them.
fn print_lines(log: &Path, n: usize, keep: impl Fn(&str) -> bool) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| keep(l)).collect();
    for l in &lines[lines.len().saturating_sub(n)..] {
        println!("{l}");
    }
}

/// `gpu-verify`: the bundled tests with CUDA required, then compute-sanitizer within
/// `sanitizer_secs` over [`SANITIZED`] and `extra` (more test names). Fails when a test fails.
pub(crate) fn verify(out: &Path, sanitizer_secs: u64, extra: &[String]) -> Result<()> {
    machine(&out.join("machine.txt"))?;
    println!("== tests (LONGSHORE_REQUIRE_CUDA=1)");
    let log = out.join("tests.log");
    let mut tests = Command::new("bash");
    tests.arg(".gpu/run.sh");
    let passed = run_logged(tests, &log)?;
    print_lines(&log, 20, |l| {
        l.starts_with("FAILED") || l.starts_with("gpu-bundle:") || l.contains("panicked")
    });

    println!("== compute-sanitizer ({sanitizer_secs} s)");
    let logs = out.join("sanitizer");
    std::fs::create_dir_all(&logs)?;
    let mut summary = String::new();
    let start = Instant::now();
    let names = SANITIZED
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str));
    for name in names {
        let Some(bin) = test_binary(name)? else {
            continue;
        };
        for tool in ["memcheck", "racecheck", "synccheck"] {
            let left = sanitizer_secs.saturating_sub(start.elapsed().as_secs());
            if left <= 5 {
                let line = format!("{name} {tool}: not run (sanitizer time budget spent)");
                println!("{line}");
                summary.push_str(&line);
                summary.push('\n');
                continue;
            }
            let mut cmd = Command::new("timeout");
            cmd.arg(left.to_string())
                .args(["compute-sanitizer", "--error-exitcode", "99"])
                .args(["--target-processes", "all", "--print-limit", "50"])
                .args(["--tool", tool]);
            if tool == "memcheck" {
                cmd.args(["--leak-check", "full"]);
            }
            // device_errors provokes driver errors on purpose; libnccl probes kernels built
            // for other GPUs (cudaErrorNoKernelImageForDevice inside ncclCommInitRank).
            let api = match name {
                "device_errors" | "collective_cuda" => "no",
                _ => "explicit",
            };
            cmd.args(["--report-api-errors", api])
                .arg(&bin)
                .arg("--test-threads=1")
                .env("LONGSHORE_REQUIRE_CUDA", "1");
            let tool_log = logs.join(format!("{name}-{tool}.log"));
            let ok = run_logged(cmd, &tool_log)?;
            let text = std::fs::read_to_string(&tool_log).unwrap_or_default();
            let sums: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.contains("ERROR SUMMARY")
                        || l.contains("RACECHECK SUMMARY")
                        || l.contains("LEAK SUMMARY")
                })
                .collect();
            let result = text.lines().rfind(|l| l.starts_with("test result"));
            let line = format!(
                "{name} {tool}: {}; {}; {}",
                if ok { "exit 0" } else { "FAILED" },
                sums.join(" "),
                result.unwrap_or("")
            );
            println!("{line}");
            summary.push_str(&line);
            summary.push('\n');
        }
    }
    std::fs::write(out.join("sanitizer.log"), summary)?;
    // One archive: the device tool returns few files.
    let status = Command::new("tar")
        .arg("-czf")
        .arg(out.join("sanitizer-logs.tgz"))
        .arg("-C")
        .arg(&logs)
        .arg(".")
        .status()
        .context("starting tar")?;
    if status.success() {
        std::fs::remove_dir_all(&logs)?;
    }
    anyhow::ensure!(passed, "a bundled test failed: see {}", log.display());
    Ok(())
}

/// `.gpu/tests/<name>-<hash>`, if bundled.
fn test_binary(name: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{name}-");
    for e in std::fs::read_dir(".gpu/tests").context("reading .gpu/tests (run gpu-pack)")? {
        let path = e?.path();
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if file.strip_prefix(&prefix).is_some_and(|h| !h.contains('-')) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// `gpu-bench`: `xtask bench` (only the sections in `only`, if given) with the bundled
/// `longshore-bench`, the staging sweep, then the criterion benches while `budget_secs`
/// (counted from the start) allows.
pub(crate) fn bench(out: &Path, only: Option<&str>, budget_secs: u64) -> Result<()> {
    let start = Instant::now();
    machine(&out.join("bench-machine.txt"))?;
    println!("== xtask bench");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["bench", "--bench-bin", ".gpu/bin/longshore-bench", "--out"])
        .arg(out.join("bench"));
    if let Some(only) = only {
        cmd.args(["--only", only]);
    }
    let log = out.join("xtask.log");
    let bench_ok = run_logged(cmd, &log)?;
    println!(
        "xtask bench: {} after {} s",
        if bench_ok { "ok" } else { "FAILED" },
        start.elapsed().as_secs()
    );
    // The terminal tables, without progress bars.
    print_lines(&log, 220, |l| {
        !l.trim().is_empty() && !l.contains('█') && !l.contains('░') && !l.contains("eta")
    });

    let sweep = Path::new(".gpu/bin/staging-sweep");
    if sweep.exists() {
        println!("== staging sweep");
        let log = out.join("staging-sweep.txt");
        run_logged(Command::new(sweep), &log)?;
        print_lines(&log, 40, |_| true);
    }

    // name, seconds it needs at least, criterion arguments
    let benches: [(&str, u64, &[&str]); 3] = [
        (
            "normalize",
            40,
            &["--warm-up-time", "0.3", "--measurement-time", "1"],
        ),
        (
            "transfer",
            150,
            &["--warm-up-time", "0.5", "--measurement-time", "1.5"],
        ),
        (
            "pool",
            60,
            &["--warm-up-time", "0.3", "--measurement-time", "1"],
        ),
    ];
    for (name, need, args) in benches {
        let exe = PathBuf::from(format!(".gpu/bin/{name}-bench"));
        let left = budget_secs.saturating_sub(start.elapsed().as_secs());
        if !exe.exists() || left < need {
            println!("criterion {name}: not run ({left} s left)");
            continue;
        }
        println!("== criterion: {name} ({left} s left)");
        let mut cmd = Command::new("timeout");
        cmd.arg(left.to_string())
            .arg(&exe)
            .arg("--bench")
            .args(args)
            .stdin(Stdio::null());
        let log = out.join(format!("criterion-{name}.txt"));
        run_logged(cmd, &log)?;
        print_lines(&log, 80, |l| {
            l.contains("time:") || l.contains("thrpt:") || l.starts_with(name)
        });
    }
    anyhow::ensure!(bench_ok, "xtask bench failed: see {}", log.display());
    Ok(())
}
