//! MosaicML MDS shards (Streaming's `MDSWriter` / `MDSReader` format): the dataset's
//! `index.json`, random access to a shard's samples by byte range, decoding of the column
//! encodings, and a writer whose files are byte-identical to Streaming's.
//!
//! # The format (Streaming 0.13, `streaming/base/format/mds`)
//!
//! `index.json` is `{"shards": [...], "version": 2}`; each shard entry holds `column_names`
//! (sorted), `column_encodings`, `column_sizes` (the fixed byte size of an encoding, or
//! `null`), `compression`, `format: "mds"`, `hashes`, `raw_data: {basename, bytes, hashes}`,
//! `samples`, `size_limit`, `version: 2` and `zip_data`.
//!
//! A shard file (`shard.00000.mds`) is:
//!
//! ```text
//! [num_samples u32] [num_samples + 1 offsets u32] [config JSON] [sample 0] [sample 1] ...
//! ```
//!
//! all little-endian. Offsets are absolute byte positions in the file: sample `i` is
//! `offsets[i]..offsets[i + 1]`, and `offsets[num_samples]` is the file's size. The config JSON
//! between the offsets and the first sample is the writer's configuration
//! (`json.dumps(config, sort_keys=True)`). A sample is the byte sizes (u32) of its
//! variable-size columns, in column order, then every column's bytes in column order.
//!
//! Only uncompressed shards are read: a shard with a `compression` is refused with
//! [`ShardError::MdsCompression`] naming the shard and codec (Streaming's zstd, gz, bz2,
//! brotli and snappy would each need a decoder crate). Hashes are not verified.
//!
//! [`sample_range`] gives sample `i`'s byte range from the shard's first `4 * (i + 3)`
//! bytes, so a store's range reads fetch one sample; [`MdsShard`] checks a whole shard
//! against its index entry and reads samples from a byte slice.
//!
//! ```
//! use longshore_shards::mds::{MdsShard, MdsWriter, Value};
//!
//! # fn main() -> Result<(), longshore_shards::ShardError> {
//! let dir = tempfile::tempdir().unwrap();
//! let mut w = MdsWriter::new(dir.path(), &[("label", "int"), ("text", "str")], Some(1 << 26))?;
//! w.write(&[("text", Value::Str("hi".into())), ("label", Value::Int(3))])?;
//! let index = w.finish()?;
//!
//! let info = &index.shards[0];
//! let bytes = std::fs::read(dir.path().join(&info.raw_data.basename)).unwrap();
//! let shard = MdsShard::new(info, &bytes)?;
//! let sample = shard.sample(0)?;
//! assert_eq!(sample.get("label")?, Value::Int(3));
//! assert_eq!(sample.get("text")?, Value::Str("hi".into()));
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ShardError;

pub(crate) mod codec;
mod encoding;
mod pyjson;
mod shard;
mod writer;

pub use encoding::{Encoding, Value};
pub use shard::{MdsSample, MdsShard, header_len, sample_count, sample_range};
pub use writer::MdsWriter;

/// A dataset's `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsIndex {
    /// The shards, in order.
    pub shards: Vec<MdsShardInfo>,
    /// Always 2.
    pub version: u32,
}

/// One shard of an [`MdsIndex`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsShardInfo {
    /// Column encodings, as named by Streaming (`int`, `jpeg`, `ndarray:uint8:32,32,3`, ...).
    pub column_encodings: Vec<String>,
    /// Column names, sorted.
    pub column_names: Vec<String>,
    /// Each column's fixed size in bytes, or `None` when variable.
    pub column_sizes: Vec<Option<u64>>,
    /// The codec of `zip_data` (`zstd`, `zstd:7`, `gz`, ...), if compressed.
    pub compression: Option<String>,
    /// Always `"mds"`.
    pub format: String,
    /// Hash algorithms of the files' `hashes`.
    pub hashes: Vec<String>,
    /// The uncompressed shard file.
    pub raw_data: FileInfo,
    /// Samples in the shard.
    pub samples: u64,
    /// The writer's shard size limit, if any.
    pub size_limit: Option<u64>,
    /// Always 2.
    pub version: u32,
    /// The compressed shard file, if compressed.
    pub zip_data: Option<FileInfo>,
}

/// A shard file's name, size and hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// File name, relative to the dataset directory.
    pub basename: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Hex digests by algorithm.
    pub hashes: BTreeMap<String, String>,
}

fn index_error(reason: String, offset: u64) -> ShardError {
    ShardError::Mds {
        shard: "index.json".into(),
        sample: None,
        offset,
        reason,
    }
}

impl MdsIndex {
    /// Parses and checks `index.json` text: versions, formats, and that every shard's column
    /// lists agree in length.
    ///
    /// # Errors
    /// [`ShardError::Mds`] naming `index.json` (and the byte offset of a JSON error) or the
    /// shard at fault.
    pub fn from_json(text: &str) -> Result<MdsIndex, ShardError> {
        let index: MdsIndex = serde_json::from_str(text).map_err(|e| {
            let offset = crate::error::json_error_offset(text, &e);
            index_error(format!("not an MDS index: {e}"), offset)
        })?;
        if index.version != 2 {
            return Err(index_error(
                format!("version {}, expected 2", index.version),
                0,
            ));
        }
        for info in &index.shards {
            info.columns()?;
        }
        Ok(index)
    }

    /// Reads `index.json` from a dataset directory (or the file itself).
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when unreadable, else as [`MdsIndex::from_json`].
    pub fn read(path: impl AsRef<Path>) -> Result<MdsIndex, ShardError> {
        let mut path = path.as_ref().to_owned();
        if path.is_dir() {
            path.push("index.json");
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|source| ShardError::ShardFile { path, source })?;
        MdsIndex::from_json(&text)
    }

    /// Samples per shard, in order (the input of [`crate::order::EpochOrder::new`]).
    pub fn counts(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.samples).collect()
    }

    /// The index as Streaming writes it (`json.dump(obj, sort_keys=True)`).
    pub fn to_json(&self) -> String {
        serde_json::to_value(self)
            .map(|v| pyjson::dumps(&v, true))
            .unwrap_or_default()
    }
}

/// A shard's columns, checked: what a sample's bytes are parsed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    names: Vec<String>,
    encodings: Vec<Encoding>,
    sizes: Vec<Option<u64>>,
}

impl Columns {
    /// Column names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Column encodings.
    pub fn encodings(&self) -> &[Encoding] {
        &self.encodings
    }

    /// The index of column `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Fixed sizes (`None` for variable-size columns, which a sample prefixes with a u32).
    pub fn sizes(&self) -> &[Option<u64>] {
        &self.sizes
    }
}

impl MdsShardInfo {
    fn error(&self, reason: String) -> ShardError {
        ShardError::Mds {
            shard: self.raw_data.basename.clone(),
            sample: None,
            offset: 0,
            reason,
        }
    }

    /// The shard's columns, checked: format and version, lists of equal length.
    ///
    /// # Errors
    /// [`ShardError::Mds`] naming the shard and the column.
    pub fn columns(&self) -> Result<Columns, ShardError> {
        if self.format != "mds" || self.version != 2 {
            return Err(self.error(format!(
                "format {:?} version {}, expected \"mds\" version 2",
                self.format, self.version
            )));
        }
        let n = self.column_names.len();
        if self.column_encodings.len() != n || self.column_sizes.len() != n {
            return Err(self.error(format!(
                "{n} column names, {} encodings, {} sizes",
                self.column_encodings.len(),
                self.column_sizes.len()
            )));
        }
        // Samples are laid out by `column_sizes`, as Streaming's reader does; an encoding this
        // reader does not know (a user-registered one) or a size that disagrees with the
        // encoding leaves the column readable as bytes, and decoding it an error.
        let encodings = self
            .column_encodings
            .iter()
            .map(|e| Encoding::parse(e).unwrap_or_else(|| Encoding::Other(e.clone())))
            .collect();
        Ok(Columns {
            names: self.column_names.clone(),
            encodings,
            sizes: self
                .column_sizes
                .iter()
                .map(|s| s.filter(|&s| s > 0))
                .collect(),
        })
    }
}
