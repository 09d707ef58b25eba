//! Shared code of longshore's examples (`examples/examples/`): where generated data lives,
//! which device to use, progress bars, and the training loop of the `train` example (here so
//! `tests/train_loss_falls.rs` can run it).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use longshore::transfer::Device;
use longshore_ops as ops;
use rand::Rng;

pub mod dist;
pub mod train;

/// The README, whose example is compiled and run as a doctest.
#[doc = include_str!("../../README.md")]
pub mod readme {}

/// The user guide: its contents page (`docs/guide.md`) and one module per topic page
/// (`docs/guide/*.md`), whose examples are compiled and run as doctests.
#[doc = include_str!("../../docs/guide.md")]
pub mod guide {
    /// `docs/guide/migrating-from-pytorch.md`.
    #[doc = include_str!("../../docs/guide/migrating-from-pytorch.md")]
    pub mod migrating_from_pytorch {}
    /// `docs/guide/python-datasets.md`.
    #[doc = include_str!("../../docs/guide/python-datasets.md")]
    pub mod python_datasets {}
    /// `docs/guide/pinned-memory.md`.
    #[doc = include_str!("../../docs/guide/pinned-memory.md")]
    pub mod pinned_memory {}
    /// `docs/guide/tuning.md`.
    #[doc = include_str!("../../docs/guide/tuning.md")]
    pub mod tuning {}
    /// `docs/guide/device-stages.md`.
    #[doc = include_str!("../../docs/guide/device-stages.md")]
    pub mod device_stages {}
    /// `docs/guide/randomness-and-resume.md`.
    #[doc = include_str!("../../docs/guide/randomness-and-resume.md")]
    pub mod randomness_and_resume {}
    /// `docs/guide/several-gpus.md`.
    #[doc = include_str!("../../docs/guide/several-gpus.md")]
    pub mod several_gpus {}
    /// `docs/guide/object-storage.md`.
    #[doc = include_str!("../../docs/guide/object-storage.md")]
    pub mod object_storage {}
    /// `docs/guide/images.md`.
    #[doc = include_str!("../../docs/guide/images.md")]
    pub mod images {}
    /// `docs/guide/interop.md`.
    #[doc = include_str!("../../docs/guide/interop.md")]
    pub mod interop {}
    /// `docs/guide/errors.md`.
    #[doc = include_str!("../../docs/guide/errors.md")]
    pub mod errors {}
}

/// The architecture notes (`docs/architecture.md`).
#[doc = include_str!("../../docs/architecture.md")]
pub mod architecture {}

/// Which device an example runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// CUDA device 0 when it and the ops libraries work, else the Cpu device.
    Auto,
    /// The Cpu backend (host memory, streams on threads).
    Cpu,
    /// CUDA device 0; an error if it is not usable.
    Cuda,
}

/// Opens the device for `choice`. With `Auto`, a GPU that cannot be used is reported in the
/// returned note and the Cpu device is used instead.
pub fn pick_device(choice: DeviceChoice) -> Result<(Device, Option<String>)> {
    let cuda = || -> Result<Device> {
        let d = Device::cuda(0)?;
        ops::available(&d)?;
        Ok(d)
    };
    match choice {
        DeviceChoice::Cpu => Ok((Device::cpu(), None)),
        DeviceChoice::Cuda => Ok((cuda().context("--device cuda")?, None)),
        DeviceChoice::Auto => match cuda() {
            Ok(d) => Ok((d, None)),
            Err(e) => Ok((
                Device::cpu(),
                Some(format!("no usable GPU ({e:#}); using the cpu device")),
            )),
        },
    }
}

/// Where examples keep generated data: `--data-dir` if given, else
/// `$CARGO_TARGET_DIR/longshore-examples`, else `target/longshore-examples` of this workspace
/// (or of the current directory when the workspace is not there).
pub fn data_root(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("longshore-examples");
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    if workspace.join("Cargo.toml").is_file() {
        return workspace.join("target").join("longshore-examples");
    }
    PathBuf::from("target").join("longshore-examples")
}

/// Writes `path` through a temporary file and a rename, so an interrupted run never leaves a
/// truncated file that a later run would reuse.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = path
        .parent()
        .context("a data file needs a parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Unique per process and thread: the ranks of a distributed run may generate the same
    // (identical) file at once, and the last rename wins.
    let tmp = path.with_extension(format!(
        "tmp-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    write(&tmp)?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// Whether `path` is a `.npy` file with exactly this shape (a reusable earlier download).
pub fn npy_has_shape(path: &Path, shape: &[usize]) -> bool {
    longshore::data::NpyArray::open(path).is_ok_and(|a| a.shape() == shape)
}

/// A standard normal sample (Box-Muller).
pub fn gaussian(rng: &mut impl Rng) -> f32 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// A progress bar over `total` items (hidden when `show` is false, e.g. in tests).
pub fn progress(total: u64, unit: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    let template = format!(
        "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}) {{msg}}"
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Fails with a readable message when a batch tensor is not what the example expects.
pub fn expect_tensor(
    what: &str,
    dtype: longshore::data::DType,
    want: longshore::data::DType,
    shape: &[usize],
    inner: &[usize],
) -> Result<()> {
    if dtype != want || shape.get(1..) != Some(inner) {
        bail!("{what}: expected {want} with per-sample shape {inner:?}, got {dtype} {shape:?}");
    }
    Ok(())
}
