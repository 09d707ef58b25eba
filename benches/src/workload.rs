//! The loader workloads, as `.npy` files the Rust benchmark and the PyTorch baseline both read:
//!
//! * `images_u8.npy`: `u8 [N, 3, 224, 224]`;
//! * `tabular_x.npy`: `f32 [N, 64]` and `tabular_y.npy`: `i64 [N]` labels in `0..1000`.
//!
//! Content is random (a fixed-seed SplitMix64 stream). Files are written in chunks after
//! [`encode_header`], with a progress bar, and reused
//! when a file of the right dtype and row shape with at least `N` rows is already there.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use longshore::data::formats::npy::encode_header;
use longshore::data::{DType, NpyArray};

/// Image file name.
pub const IMAGES: &str = "images_u8.npy";
/// Tabular features file name.
pub const TABULAR_X: &str = "tabular_x.npy";
/// Tabular labels file name.
pub const TABULAR_Y: &str = "tabular_y.npy";
/// Image shape of one sample.
pub const IMAGE_SHAPE: [usize; 3] = [3, 224, 224];
/// Features per tabular sample.
pub const TABULAR_FEATURES: usize = 64;

/// The benchmark content's generator: a fixed-seed SplitMix64 stream.
pub use longshore::data::seed::SplitMix64;

/// Whether `path` holds an array of `dtype` with rows of `row` and at least `rows` rows.
fn usable(path: &Path, dtype: DType, row: &[usize], rows: usize) -> bool {
    match NpyArray::open(path) {
        Ok(a) => {
            a.dtype() == dtype
                && a.shape().len() == row.len() + 1
                && &a.shape()[1..] == row
                && a.shape()[0] >= rows
        }
        Err(_) => false,
    }
}

/// Writes a `.npy` of `dtype` and `shape` whose data bytes come from `fill(chunk)` in chunks,
/// with a progress bar; the file is written under a temporary name and renamed when complete.
fn write_chunked(
    path: &Path,
    dtype: DType,
    shape: &[usize],
    mut fill: impl FnMut(&mut [u8]),
) -> Result<()> {
    anyhow::ensure!(
        cfg!(target_endian = "little"),
        "workload generation assumes a little-endian host"
    );
    let total: usize = shape.iter().product::<usize>() * dtype.size();
    let tmp = path.with_extension("npy.partial");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&encode_header(dtype, shape))?;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "  {msg:>16} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .context("progress template")?
        .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    // Chunks are a multiple of every element size we write.
    let mut chunk = vec![0u8; 8 << 20];
    let mut left = total;
    while left > 0 {
        let n = left.min(chunk.len());
        fill(&mut chunk[..n]);
        w.write_all(&chunk[..n])
            .with_context(|| format!("writing {}", tmp.display()))?;
        bar.inc(n as u64);
        left -= n;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_data()?;
    bar.finish_and_clear();
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// What [`ensure`] found or made.
#[derive(Debug, Clone)]
pub struct Workloads {
    /// The image file.
    pub images: PathBuf,
    /// The tabular features.
    pub tabular_x: PathBuf,
    /// The tabular labels.
    pub tabular_y: PathBuf,
    /// Files generated in this call (others were reused).
    pub generated: Vec<PathBuf>,
}

/// Makes sure `dir` holds `images` image rows and `tabular` tabular rows, generating what is
/// missing. The two tabular files are always regenerated together so their lengths match.
pub fn ensure(dir: &Path, images: usize, tabular: usize) -> Result<Workloads> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let w = Workloads {
        images: dir.join(IMAGES),
        tabular_x: dir.join(TABULAR_X),
        tabular_y: dir.join(TABULAR_Y),
        generated: Vec::new(),
    };
    let mut generated = Vec::new();
    if !usable(&w.images, DType::U8, &IMAGE_SHAPE, images) {
        let mut rng = SplitMix64::new(0x1234);
        let shape = [images, IMAGE_SHAPE[0], IMAGE_SHAPE[1], IMAGE_SHAPE[2]];
        write_chunked(&w.images, DType::U8, &shape, |c| rng.fill_bytes(c))?;
        generated.push(w.images.clone());
    }
    let x_ok = usable(&w.tabular_x, DType::F32, &[TABULAR_FEATURES], tabular);
    let y_ok = usable(&w.tabular_y, DType::I64, &[], tabular);
    let same_len = match (NpyArray::open(&w.tabular_x), NpyArray::open(&w.tabular_y)) {
        (Ok(x), Ok(y)) => x.shape()[0] == y.shape()[0],
        _ => false,
    };
    if !(x_ok && y_ok && same_len) {
        let mut rng = SplitMix64::new(0x5678);
        write_chunked(
            &w.tabular_x,
            DType::F32,
            &[tabular, TABULAR_FEATURES],
            |c| {
                for v in c.chunks_exact_mut(4) {
                    let x = (rng.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
                    v.copy_from_slice(&x.to_le_bytes());
                }
            },
        )?;
        write_chunked(&w.tabular_y, DType::I64, &[tabular], |c| {
            for v in c.chunks_exact_mut(8) {
                v.copy_from_slice(&((rng.next_u64() % 1000) as i64).to_le_bytes());
            }
        })?;
        generated.push(w.tabular_x.clone());
        generated.push(w.tabular_y.clone());
    }
    Ok(Workloads { generated, ..w })
}
