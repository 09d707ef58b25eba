//! `cargo xtask shard`: packs an ImageFolder tree (class subfolders of images) or `.npy` arrays
//! into WebDataset tar shards with their wids index (`shard-index.json`), or into MDS shards
//! (MosaicML Streaming's format) with their `index.json`, through longshore-shards' writers.
//!
//! * ImageFolder: torchvision's classes (sorted subfolder names, numbered from 0) and files
//!   (`.jpg`/`.jpeg`, and `.png` for WebDataset), shuffled with `--seed` unless
//!   `--no-shuffle` (a sorted tree packed as is leaves each shard with one or two classes).
//!   Sample `i` is key `000000000`-style `i`, fields `jpg` (the file's bytes) and `cls` (the
//!   class number as text); in MDS, columns `jpg` (encoding `jpeg`, the file's bytes) and `cls`
//!   (`int`), the same names so that a pipeline reads either format alike.
//!   `--synthetic N` first generates an ImageNet-like folder of about N JPEGs there
//!   (longshore-vision's `synth`; reused when the same folder is already there).
//! * `.npy` arrays (`--npy x=images.npy --npy y=labels.npy`): row `i` of each is sample `i`,
//!   field `x.npy` holding that row as a `.npy` file (MDS: column `x`, encoding `ndarray`, or
//!   the dtype's scalar encoding, `int64` say, for a 1-D array's scalar rows).
//!
//! Shards are closed before they would pass `--shard-size` (default 64 MiB). Same input,
//! same seed: the same bytes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use longshore_data::formats::npy::encode_npy;
use longshore_data::rng::{epoch_rng, shuffle};
use longshore_data::{DType, Dataset, NpyDataset, Tensor};
use longshore_shards::mds::{MdsWriter, Value};
use longshore_shards::webdataset::ShardWriter;
use longshore_vision::synth::{FolderSpec, write_folder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// WebDataset tar shards (`shard-000000.tar`, ...) and their wids index,
    /// `shard-index.json`.
    Wds,
    /// MosaicML Streaming MDS shards (`shard.00000.mds`, ...) and their `index.json`.
    Mds,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The ImageFolder to pack (class subfolders of images); with --synthetic, where the
    /// synthetic folder is generated first.
    #[arg(long, required_unless_present = "npy", conflicts_with = "npy")]
    input: Option<PathBuf>,
    /// Pack `.npy` arrays instead, NAME=PATH, repeated: row i of each becomes field NAME.npy
    /// (MDS: column NAME) of sample i.
    #[arg(long, value_parser = parse_npy_arg)]
    npy: Vec<(String, PathBuf)>,
    /// Where the shards and their index go (created; earlier shards of the same format there
    /// are removed first).
    #[arg(long)]
    out: PathBuf,
    /// Shard format.
    #[arg(long, value_enum, default_value_t = Format::Wds)]
    format: Format,
    /// Target shard size: bytes, or with a unit (64MiB, 512KiB, 1GiB, 100MB).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    shard_size: u64,
    /// Seed of the packing order's shuffle (ImageFolder).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep torchvision's order (class, then file name) instead of shuffling.
    #[arg(long)]
    no_shuffle: bool,
    /// First generate an ImageNet-like synthetic folder of N JPEGs (rounded up to a
    /// multiple of its class count, 100 classes from N = 100) at --input.
    #[arg(long, requires = "input")]
    synthetic: Option<usize>,
}

/// `64MiB`, `512 KiB`, `1GiB`, `100MB`, `4096`: a byte count.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("{text:?}: a size is a number and an optional unit (64MiB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => {
            return Err(format!(
                "{text:?}: unknown unit {u:?} (B, KiB, MiB, GiB, kB, MB, GB)"
            ));
        }
    };
    let bytes = (num * scale as f64).round();
    if !(1.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("{text:?}: a shard size is at least one byte"));
    }
    Ok(bytes as u64)
}

fn parse_npy_arg(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(path)))
        }
        _ => Err(format!("{text:?}: expected NAME=PATH (x=images.npy)")),
    }
}

/// What was written.
struct Written {
    shards: usize,
    samples: u64,
    bytes: u64,
}

/// Runs `cargo xtask shard`.
pub(crate) fn run(args: Args) -> Result<()> {
    if let (Some(input), Some(n)) = (&args.input, args.synthetic) {
        synthesize(input, n)?;
    }
    let t = Instant::now();
    clear_outputs(&args.out, args.format)?;
    let written = match &args.input {
        Some(input) => pack_folder(input, &args)?,
        None => pack_arrays(&args)?,
    };
    println!(
        "wrote {} {} shards, {} samples, {} bytes ({:.1} MiB, {:.1} MiB a shard) to {} in {:.1} s; index: {}",
        written.shards,
        match args.format {
            Format::Wds => "WebDataset",
            Format::Mds => "MDS",
        },
        written.samples,
        written.bytes,
        mib(written.bytes),
        mib(written.bytes) / written.shards.max(1) as f64,
        args.out.display(),
        t.elapsed().as_secs_f64(),
        args.out.join(index_name(args.format)).display(),
    );
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// The index file each format's writer leaves beside its shards.
fn index_name(format: Format) -> &'static str {
    match format {
        Format::Wds => "shard-index.json",
        Format::Mds => "index.json",
    }
}

/// Removes the shards and index a previous run of this format left in `out`, so that a
/// smaller dataset leaves no stale shard behind.
fn clear_outputs(out: &Path, format: Format) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    for e in entries {
        let path = e?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ours = name == index_name(format)
            || match format {
                Format::Wds => name.starts_with("shard-") && name.ends_with(".tar"),
                Format::Mds => name.starts_with("shard.") && name.ends_with(".mds"),
            };
        if ours && path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Generates (or reuses) the ImageNet-like folder of about `n` images at `root`.
fn synthesize(root: &Path, n: usize) -> Result<()> {
    anyhow::ensure!(n > 0, "--synthetic needs at least one image");
    let classes = n.min(100);
    let spec = FolderSpec {
        classes,
        per_class: n.div_ceil(classes),
        ..FolderSpec::imagenet_like()
    };
    let bar = ProgressBar::new_spinner().with_message(format!(
        "generating {} synthetic JPEGs ({classes} classes) in {}",
        spec.len(),
        root.display()
    ));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let t = Instant::now();
    let made =
        write_folder(root, &spec).with_context(|| format!("generating {}", root.display()))?;
    bar.finish_and_clear();
    eprintln!(
        "{} {} images ({:.1} MiB) in {}{}",
        if made.reused { "reused" } else { "generated" },
        made.images,
        mib(made.bytes),
        root.display(),
        if made.reused {
            String::new()
        } else {
            format!(" in {:.1} s", t.elapsed().as_secs_f64())
        }
    );
    Ok(())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    Ok(out)
}

/// One image to pack: its file, field name, class number.
type Image = (PathBuf, &'static str, usize);

/// torchvision's ImageFolder listing: sorted class folders, sorted files within.
fn list_images(root: &Path, format: Format) -> Result<(Vec<Image>, usize)> {
    let classes: Vec<PathBuf> = sorted_entries(root)?
        .into_iter()
        .filter(|p| p.is_dir())
        .collect();
    let mut files = Vec::new();
    for (class, dir) in classes.iter().enumerate() {
        for file in sorted_entries(dir)? {
            let ext = file.extension().map(|e| e.to_string_lossy().to_lowercase());
            let field = match ext.as_deref() {
                Some("jpg" | "jpeg") => "jpg",
                Some("png") if format == Format::Wds => "png",
                Some("png") => anyhow::bail!(
                    "{}: MDS shards here hold JPEGs only (one `jpeg` column)",
                    file.display()
                ),
                _ => continue,
            };
            files.push((file, field, class));
        }
    }
    Ok((files, classes.len()))
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} {prefix} ({per_sec}, {eta} left) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(what.to_owned());
    bar
}

/// The writer of either format.
enum Sink {
    Wds(ShardWriter),
    Mds(MdsWriter),
}

fn pack_folder(root: &Path, args: &Args) -> Result<Written> {
    let (mut files, classes) = list_images(root, args.format)?;
    anyhow::ensure!(
        !files.is_empty(),
        "{}: no images in class subfolders (root/<class>/<image>.jpg)",
        root.display()
    );
    if !args.no_shuffle {
        shuffle(&mut files, &mut epoch_rng(args.seed, 0));
    }
    eprintln!(
        "packing {} images of {classes} classes from {} into {} ({} bytes a shard at most)",
        files.len(),
        root.display(),
        args.out.display(),
        args.shard_size
    );
    let mut sink = match args.format {
        Format::Wds => Sink::Wds(ShardWriter::new(&args.out, args.shard_size)?),
        Format::Mds => Sink::Mds(MdsWriter::new(
            &args.out,
            &[("jpg", "jpeg"), ("cls", "int")],
            Some(args.shard_size),
        )?),
    };
    let bar = progress(files.len() as u64, "images");
    let mut read = 0u64;
    for (i, (path, field, class)) in files.iter().enumerate() {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        read += bytes.len() as u64;
        match &mut sink {
            Sink::Wds(w) => {
                let cls = class.to_string();
                w.write(
                    &format!("{i:09}"),
                    &[(field, bytes.as_slice()), ("cls", cls.as_bytes())],
                )?;
            }
            Sink::Mds(w) => w.write(&[
                ("jpg", Value::Image(bytes)),
                ("cls", Value::Int(*class as i64)),
            ])?,
        }
        if i % 64 == 0 {
            bar.set_message(format!("{:.0} MiB", mib(read)));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    finish(sink)
}

fn pack_arrays(args: &Args) -> Result<Written> {
    let arrays = args
        .npy
        .iter()
        .map(|(name, path)| {
            NpyDataset::open(path)
                .map(|d| (name.as_str(), path, d))
                .with_context(|| format!("opening {}", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = arrays.first().map_or(0, |(_, _, d)| d.len());
    for (_, path, d) in &arrays {
        anyhow::ensure!(
            d.len() == rows,
            "{} has {} rows, the first array {rows}",
            path.display(),
            d.len()
        );
    }
    let mut sink = match args.format {
        Format::Wds => Sink::Wds(ShardWriter::new(&args.out, args.shard_size)?),
        Format::Mds => {
            let mut columns = Vec::with_capacity(arrays.len());
            for (name, path, d) in &arrays {
                let encoding = match d.get(0) {
                    Ok(row) if row.shape().is_empty() => scalar_encoding(row.dtype())
                        .with_context(|| {
                            format!("{}: no MDS encoding for {:?}", path.display(), row.dtype())
                        })?,
                    Ok(_) => "ndarray",
                    Err(e) => anyhow::bail!("{} row 0: {e}", path.display()),
                };
                columns.push((*name, encoding));
            }
            Sink::Mds(MdsWriter::new(&args.out, &columns, Some(args.shard_size))?)
        }
    };
    let bar = progress(rows as u64, "rows");
    for i in 0..rows {
        let mut row = Vec::with_capacity(arrays.len());
        for (name, path, d) in &arrays {
            let t: Tensor = d
                .get(i)
                .with_context(|| format!("{} row {i}", path.display()))?;
            row.push((*name, t));
        }
        match &mut sink {
            Sink::Wds(w) => {
                let fields = row
                    .iter()
                    .map(|(name, t)| {
                        encode_npy(t.dtype(), t.shape(), t.bytes())
                            .map(|npy| (format!("{name}.npy"), npy))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<(&str, &[u8])> = fields
                    .iter()
                    .map(|(f, b)| (f.as_str(), b.as_slice()))
                    .collect();
                w.write(&format!("{i:09}"), &refs)?;
            }
            Sink::Mds(w) => {
                let values = row
                    .into_iter()
                    .map(|(n, t)| {
                        let v = if t.shape().is_empty() {
                            scalar_value(&t)
                                .with_context(|| format!("column {n}: {:?}", t.dtype()))?
                        } else {
                            Value::Array(t)
                        };
                        Ok((n, v))
                    })
                    .collect::<Result<Vec<_>>>()?;
                w.write(&values)?;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    finish(sink)
}

/// The MDS encoding of a 1-D array's rows, which are scalars: Streaming's `ndarray` encoding
/// holds arrays of one axis or more, so such a column takes its dtype's scalar encoding.
fn scalar_encoding(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool | DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::U16 => "uint16",
        DType::I16 => "int16",
        DType::U32 => "uint32",
        DType::I32 => "int32",
        DType::U64 => "uint64",
        DType::I64 => "int64",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        _ => return None,
    })
}

/// A scalar row's value, for [`scalar_encoding`]'s column (the row's bytes are native-endian).
fn scalar_value(t: &Tensor) -> Option<Value> {
    fn bytes<const N: usize>(b: &[u8]) -> [u8; N] {
        b[..N].try_into().expect("a scalar of its dtype's size")
    }
    let b = t.bytes();
    Some(match t.dtype() {
        DType::Bool | DType::U8 => Value::UInt(b[0].into()),
        DType::I8 => Value::Int(i8::from_ne_bytes(bytes(b)).into()),
        DType::U16 => Value::UInt(u16::from_ne_bytes(bytes(b)).into()),
        DType::I16 => Value::Int(i16::from_ne_bytes(bytes(b)).into()),
        DType::U32 => Value::UInt(u32::from_ne_bytes(bytes(b)).into()),
        DType::I32 => Value::Int(i32::from_ne_bytes(bytes(b)).into()),
        DType::U64 => Value::UInt(u64::from_ne_bytes(bytes(b))),
        DType::I64 => Value::Int(i64::from_ne_bytes(bytes(b))),
        DType::F16 => Value::Float(half::f16::from_ne_bytes(bytes(b)).to_f64()),
        DType::F32 => Value::Float(f32::from_ne_bytes(bytes(b)).into()),
        DType::F64 => Value::Float(f64::from_ne_bytes(bytes(b))),
        _ => return None,
    })
}

fn finish(sink: Sink) -> Result<Written> {
    Ok(match sink {
        Sink::Wds(w) => {
            let index = w.finish()?;
            Written {
                shards: index.shardlist.len(),
                samples: index.shardlist.iter().map(|s| s.nsamples).sum(),
                bytes: index.shardlist.iter().filter_map(|s| s.filesize).sum(),
            }
        }
        Sink::Mds(w) => {
            let index = w.finish()?;
            Written {
                shards: index.shards.len(),
                samples: index.shards.iter().map(|s| s.samples).sum(),
                bytes: index.shards.iter().map(|s| s.raw_data.bytes).sum(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }
}
