//! The `jpeg` section of `cargo xtask bench`: runs the `jpeg-bench` binary (ImageNet-like JPEG
//! folder through longshore's CPU pipelines and through torchvision's), which writes
//! `jpeg.json` and `jpeg.md` next to `results.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// Splits `jpeg` out of a `--only` list: whether to run it, and the remaining sections
/// (`Some("")` when `jpeg` was the only one; `None` means all sections).
pub(crate) fn split_only(only: Option<String>) -> (bool, Option<String>) {
    match only {
        None => (true, None),
        Some(list) => {
            let rest: Vec<&str> = list.split(',').filter(|s| s.trim() != "jpeg").collect();
            let jpeg = rest.len() != list.split(',').count();
            (jpeg, Some(rest.join(",")))
        }
    }
}

/// Runs jpeg-bench: built with cargo, or the `jpeg-bench` next to a prebuilt `--bench-bin`.
pub(crate) fn run(
    root: &Path,
    out: &Path,
    quick: bool,
    data_dir: &Option<PathBuf>,
    bench_bin: &Option<PathBuf>,
) -> Result<()> {
    let prebuilt = bench_bin
        .as_ref()
        .and_then(|b| b.parent())
        .map(|dir| dir.join("jpeg-bench"))
        .filter(|p| p.is_file());
    let mut cmd = match prebuilt {
        Some(bin) => Command::new(bin),
        None => {
            let mut c = Command::new(crate::cargo());
            c.args([
                "run",
                "--release",
                "-p",
                "longshore-benches",
                "--bin",
                "jpeg-bench",
                "--",
            ]);
            c
        }
    };
    // The ranks table (one loader per GPU, issue 18): 1 and 2 ranks (2 where the machine has
    // two GPUs, or Cpu devices without a driver).
    // Both decoders (nvJPEG is skipped, and says so, without a GPU); nvJPEG also with a share
    // of the JPEGs decoded by the workers beside the GPU's engines (`EncodedImages::cpu_share`).
    cmd.current_dir(root)
        .arg("--out")
        .arg(out)
        .args(["--ranks", "1,2", "--decode", "both"]);
    if quick {
        cmd.arg("--quick");
    } else {
        cmd.args(["--cpu-share", "0,0.1,0.2,0.3"]);
    }
    if let Some(dir) = data_dir {
        cmd.arg("--data-dir").arg(dir);
    }
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    anyhow::ensure!(status.success(), "jpeg-bench failed: {status}");
    eprintln!("wrote {}", out.join("jpeg.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_only;

    #[test]
    fn jpeg_is_split_out_of_the_section_list() {
        assert_eq!(split_only(None), (true, None));
        assert_eq!(split_only(Some("jpeg".into())), (true, Some(String::new())));
        assert_eq!(
            split_only(Some("pool,jpeg,loader".into())),
            (true, Some("pool,loader".into()))
        );
        assert_eq!(
            split_only(Some("pool".into())),
            (false, Some("pool".into()))
        );
    }
}
