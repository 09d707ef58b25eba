//! Writing tar shards: one in-memory or file shard ([`SampleWriter`]), a directory of shards
//! of a target size with their index ([`ShardWriter`]), and packers for an ImageFolder tree
//! and `.npy` arrays.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use longshore_data::formats::npy::encode_npy;
use longshore_data::rng::{epoch_rng, shuffle};
use longshore_data::{Dataset, NpyDataset, Tensor};

use super::{ShardEntry, ShardIndex, split_name};
use crate::ShardError;

/// Counts the bytes written through it.
#[derive(Debug)]
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes samples into one tar, deterministically: every member is a regular file with mode
/// `0644`, owner and group 0 and no names, and mtime 0, so the same samples give the same
/// bytes.
pub struct SampleWriter<W: Write> {
    name: String,
    builder: tar::Builder<Counting<W>>,
    samples: u64,
    last_key: Option<String>,
}

impl<W: Write> std::fmt::Debug for SampleWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleWriter")
            .field("name", &self.name)
            .field("samples", &self.samples)
            .field("bytes", &self.bytes())
            .finish_non_exhaustive()
    }
}

impl<W: Write> SampleWriter<W> {
    /// A shard written to `out`; `name` names it in errors.
    pub fn new(name: impl Into<String>, out: W) -> SampleWriter<W> {
        SampleWriter {
            name: name.into(),
            builder: tar::Builder::new(Counting {
                inner: out,
                written: 0,
            }),
            samples: 0,
            last_key: None,
        }
    }

    fn error(&self, reason: String) -> ShardError {
        ShardError::Write {
            shard: self.name.clone(),
            reason,
        }
    }

    /// Appends a sample: member `{key}.{ext}` for each field, in the order given.
    ///
    /// # Errors
    /// [`ShardError::Write`] when the key or an extension would not read back as this sample
    /// (a key whose file name holds a `.`, an extension with a `/` or upper case, the same
    /// extension twice, the previous sample's key), or writing fails.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<(), ShardError> {
        if fields.is_empty() {
            return Err(self.error(format!("sample {key:?} has no field")));
        }
        if self.last_key.as_deref() == Some(key) {
            return Err(self.error(format!(
                "sample {key:?} follows a sample with the same key; they would read as one"
            )));
        }
        for (i, (ext, _)) in fields.iter().enumerate() {
            let name = format!("{key}.{ext}");
            if ext.is_empty() || ext.contains('/') || *ext != ext.to_lowercase() {
                return Err(self.error(format!(
                    "extension {ext:?} of sample {key:?} must be non-empty lower case without '/'"
                )));
            }
            if split_name(&name) != Some((key, ext)) || super::is_meta(&name) {
                return Err(self.error(format!(
                    "member {name:?} would not read back as field {ext:?} of sample {key:?}"
                )));
            }
            if fields[..i].iter().any(|(e, _)| e == ext) {
                return Err(self.error(format!("sample {key:?} has field .{ext} twice")));
            }
        }
        for (ext, data) in fields {
            let name = format!("{key}.{ext}");
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_size(data.len() as u64);
            self.builder
                .append_data(&mut header, &name, *data)
                .map_err(|e| self.error(format!("cannot write member {name:?}: {e}")))?;
        }
        self.samples += 1;
        self.last_key = Some(key.to_owned());
        Ok(())
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Bytes written so far (the end-of-archive blocks [`SampleWriter::finish`] adds, 1024
    /// bytes, not included).
    pub fn bytes(&self) -> u64 {
        self.builder.get_ref().written
    }

    /// Writes the end-of-archive blocks and returns the output.
    ///
    /// # Errors
    /// [`ShardError::Write`] when writing fails.
    pub fn finish(self) -> Result<W, ShardError> {
        let name = self.name.clone();
        self.builder
            .into_inner()
            .map(|c| c.inner)
            .map_err(|e| ShardError::Write {
                shard: name,
                reason: format!("cannot finish the tar: {e}"),
            })
    }
}

/// The tar bytes a sample's members take: a header per member, a GNU long-name entry when the
/// name exceeds 100 bytes, data padded to 512 bytes.
fn sample_tar_bytes(key: &str, fields: &[(&str, &[u8])]) -> u64 {
    let pad = |n: u64| n.div_ceil(512) * 512;
    fields
        .iter()
        .map(|(ext, data)| {
            let name = key.len() as u64 + 1 + ext.len() as u64;
            let long = if name >= 100 { 512 + pad(name + 1) } else { 0 };
            long + 512 + pad(data.len() as u64)
        })
        .sum()
}

/// Packs samples into `{prefix}000000.tar`, `{prefix}000001.tar`, ... in a directory, each
/// closed before it would exceed the target size (a shard holds at least one sample), and
/// writes their wids index, `{prefix}index.json`.
#[derive(Debug)]
pub struct ShardWriter {
    dir: PathBuf,
    prefix: String,
    target_bytes: u64,
    current: Option<(PathBuf, SampleWriter<BufWriter<File>>)>,
    index: ShardIndex,
    last_key: Option<String>,
}

impl ShardWriter {
    /// Writes shards of at most `target_bytes` (unless one sample is larger) into `dir`,
    /// created if missing, named `shard-000000.tar`, ...
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when `dir` cannot be created.
    pub fn new(dir: impl AsRef<Path>, target_bytes: u64) -> Result<ShardWriter, ShardError> {
        let dir = dir.as_ref().to_owned();
        std::fs::create_dir_all(&dir).map_err(|source| ShardError::ShardFile {
            path: dir.clone(),
            source,
        })?;
        Ok(ShardWriter {
            dir,
            prefix: "shard-".into(),
            target_bytes,
            current: None,
            index: ShardIndex::default(),
            last_key: None,
        })
    }

    /// Names the shards `{prefix}000000.tar`, ... instead of `shard-000000.tar`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> ShardWriter {
        self.prefix = prefix.into();
        self
    }

    /// Appends a sample (see [`SampleWriter::write`]), starting a new shard first when this
    /// one would exceed the target size.
    ///
    /// # Errors
    /// As [`SampleWriter::write`], or [`ShardError::ShardFile`] when a shard file cannot be
    /// created or written.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<(), ShardError> {
        if self.last_key.as_deref() == Some(key) {
            return Err(ShardError::Write {
                shard: self.prefix.clone(),
                reason: format!("sample {key:?} repeats the previous sample's key"),
            });
        }
        let size = sample_tar_bytes(key, fields);
        if let Some((_, w)) = &self.current
            && w.samples() > 0
            && w.bytes() + size + 1024 > self.target_bytes
        {
            self.close()?;
        }
        if self.current.is_none() {
            let name = format!("{}{:06}.tar", self.prefix, self.index.shardlist.len());
            let path = self.dir.join(&name);
            let file = File::create(&path).map_err(|source| ShardError::ShardFile {
                path: path.clone(),
                source,
            })?;
            self.current = Some((path, SampleWriter::new(name, BufWriter::new(file))));
        }
        if let Some((_, w)) = self.current.as_mut() {
            w.write(key, fields)?;
        }
        self.last_key = Some(key.to_owned());
        Ok(())
    }

    fn close(&mut self) -> Result<(), ShardError> {
        let Some((path, w)) = self.current.take() else {
            return Ok(());
        };
        let io = |source| ShardError::ShardFile {
            path: path.clone(),
            source,
        };
        let samples = w.samples();
        let file = w.finish()?.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        let filesize = file.metadata().map_err(io)?.len();
        let url = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        tracing::debug!(target: "longshore::shards", shard = %url, samples, bytes = filesize, "wrote shard");
        self.index.shardlist.push(ShardEntry {
            url,
            nsamples: samples,
            filesize: Some(filesize),
        });
        Ok(())
    }

    /// Closes the last shard, writes `{prefix}index.json` and returns the index (URLs relative
    /// to the directory).
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when a file cannot be written.
    pub fn finish(mut self) -> Result<ShardIndex, ShardError> {
        self.close()?;
        self.index
            .write(self.dir.join(format!("{}index.json", self.prefix)))?;
        Ok(self.index)
    }
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, ShardError> {
    let io = |source| ShardError::ShardFile {
        path: dir.to_owned(),
        source,
    };
    let mut out = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    out.sort();
    Ok(out)
}

/// Packs an ImageFolder tree (`root/<class>/<image>`, torchvision's layout: classes are the
/// sorted subfolder names, numbered from 0) into shards in `out`: each `.jpg`/`.jpeg` image
/// becomes a sample with fields `jpg` (the file's bytes) and `cls` (the class number as
/// text), each `.png` one with `png` and `cls`; other files are skipped. Keys are the
/// sample's number, `000000000`, `000000001`, ...
///
/// Files are taken in torchvision's order (class, then file name), or shuffled with `seed`
/// first: packing a sorted tree leaves each shard with one or two classes, which a shuffle
/// of shards and blocks cannot fully undo.
///
/// # Errors
/// [`ShardError::ShardFile`] when a file cannot be read or written.
pub fn pack_image_folder(
    root: impl AsRef<Path>,
    out: impl AsRef<Path>,
    target_bytes: u64,
    seed: Option<u64>,
) -> Result<ShardIndex, ShardError> {
    let mut files = Vec::new();
    let classes = list_dir(root.as_ref())?
        .into_iter()
        .filter(|p| p.is_dir())
        .collect::<Vec<_>>();
    for (class, dir) in classes.iter().enumerate() {
        for file in list_dir(dir)? {
            let ext = file.extension().map(|e| e.to_string_lossy().to_lowercase());
            let field = match ext.as_deref() {
                Some("jpg" | "jpeg") => "jpg",
                Some("png") => "png",
                _ => continue,
            };
            files.push((file, field, class));
        }
    }
    if let Some(seed) = seed {
        shuffle(&mut files, &mut epoch_rng(seed, 0));
    }
    let mut writer = ShardWriter::new(out, target_bytes)?;
    for (i, (path, field, class)) in files.iter().enumerate() {
        let bytes = std::fs::read(path).map_err(|source| ShardError::ShardFile {
            path: path.clone(),
            source,
        })?;
        let cls = class.to_string();
        writer.write(
            &format!("{i:09}"),
            &[(field, bytes.as_slice()), ("cls", cls.as_bytes())],
        )?;
    }
    writer.finish()
}

/// Packs the rows of `.npy` files into shards in `out`: row `i` of every file becomes sample
/// `i` (key `000000000`, ...), field `{name}.npy` holding that row as a `.npy` file, for each
/// `(name, path)` given (`[("x", "images.npy"), ("y", "labels.npy")]` gives `x.npy` and
/// `y.npy`).
///
/// # Errors
/// [`ShardError::Write`] when a file is not a readable `.npy` or the files' row counts
/// differ, [`ShardError::ShardFile`] when writing fails.
pub fn pack_npy(
    arrays: &[(&str, &Path)],
    out: impl AsRef<Path>,
    target_bytes: u64,
) -> Result<ShardIndex, ShardError> {
    let fail = |path: &Path, reason: String| ShardError::Write {
        shard: path.display().to_string(),
        reason,
    };
    let datasets = arrays
        .iter()
        .map(|(name, path)| {
            NpyDataset::open(path)
                .map(|d| (format!("{name}.npy"), d))
                .map_err(|e| fail(path, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows = datasets.first().map_or(0, |(_, d)| d.len());
    if let Some(((_, path), _)) = arrays
        .iter()
        .zip(&datasets)
        .find(|(_, (_, d))| d.len() != rows)
    {
        return Err(fail(
            path,
            format!("row count differs from the first file's {rows}"),
        ));
    }
    let mut writer = ShardWriter::new(out, target_bytes)?;
    for i in 0..rows {
        let mut members = Vec::with_capacity(datasets.len());
        for ((field, d), (_, path)) in datasets.iter().zip(arrays) {
            let row: Tensor = d.get(i).map_err(|e| fail(path, e.to_string()))?;
            let npy = encode_npy(row.dtype(), row.shape(), row.bytes())
                .map_err(|e| fail(path, e.to_string()))?;
            members.push((field.as_str(), npy));
        }
        let fields: Vec<(&str, &[u8])> = members.iter().map(|(f, b)| (*f, b.as_slice())).collect();
        writer.write(&format!("{i:09}"), &fields)?;
    }
    writer.finish()
}
