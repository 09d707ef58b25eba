//! WebDataset tar shards: a streaming reader that groups a tar's members into samples, a
//! header-only scan that counts and locates samples, and a writer that packs samples into
//! shards of a target size with a `wids` shard index.
//!
//! # The format
//!
//! A shard is a tar whose members are grouped into samples by name, as `webdataset` does
//! (`tariterators.py`):
//!
//! - A member's *key* is its path up to the first `.` of its file name, its *extension* the
//!   rest, lowercased: `train/n01440764_10026.JPEG` is field `jpeg` of sample
//!   `train/n01440764_10026`; `a/b.seg.png` is field `seg.png` of sample `a/b`. (A file
//!   name starting with `.` belongs to its folder's key, as webdataset's regular expression
//!   gives.) Members whose name has no such split are skipped.
//! - Consecutive members with the same key form one sample; a sample keeps its `__key__`
//!   ([`Sample::key`]) and `__url__` (the shard name, [`Sample::url`]). The same extension
//!   twice in one sample is an error, as in webdataset.
//! - Only regular files count: directories, links and other entry types are skipped, and so
//!   are members whose first path component looks like `__name__` (webdataset's metadata).
//!   GNU long names and pax headers are read by the `tar` crate.
//!
//! Fields are bytes; [`Sample`] decodes them on request: text (`.txt`), integers (`.cls`,
//! `.idx`), JSON (`.json`), `.npy` arrays (through longshore-data's `.npy` parser) and
//! images by extension (`.jpg`, `.jpeg`, `.png`, `.webp`: bytes, for a decoder).
//!
//! Every error names the shard (the name or URL given to the reader), the member or sample key
//! and the byte offset in the tar; malformed input gives an error, never a panic.
//!
//! ```
//! use longshore_shards::webdataset::{SampleWriter, ShardReader};
//!
//! # fn main() -> Result<(), longshore_shards::ShardError> {
//! let mut w = SampleWriter::new("mem.tar", Vec::new());
//! w.write("cat/0001", &[("jpg", b"\xff\xd8...".as_slice()), ("cls", b"3")])?;
//! w.write("dog/0002", &[("jpg", b"\xff\xd8...".as_slice()), ("cls", b"5")])?;
//! let tar = w.finish()?;
//!
//! let mut reader = ShardReader::new("mem.tar", tar.as_slice());
//! let samples = reader.samples()?.collect::<Result<Vec<_>, _>>()?;
//! assert_eq!(samples[1].key, "dog/0002");
//! assert_eq!(samples[1].int("cls")?, 5);
//! assert_eq!(ShardReader::new("mem.tar", tar.as_slice()).scan()?.len(), 2);
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ShardError;

mod reader;
mod sample;
mod writer;

pub use reader::{SampleSpan, Samples, ShardReader};
pub use sample::{IMAGE_EXTENSIONS, Sample};
pub use writer::{SampleWriter, ShardWriter, pack_image_folder, pack_npy};

/// Splits a member name into (key, extension) by webdataset's rule
/// (`^((?:.*/|)[^.]+)[.]([^/]*)$`); the extension is not yet lowercased. `None` when the name
/// does not split.
pub(crate) fn split_name(name: &str) -> Option<(&str, &str)> {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    let dot = base + name[base..].find('.')?;
    if dot == base {
        // The file name starts with '.': the key is the folder path, whose last component
        // (with its '/') must hold no '.'.
        let dir = &name[..base];
        let last = dir[..dir.len().saturating_sub(1)]
            .rfind('/')
            .map_or(0, |i| i + 1);
        if dir.is_empty() || dir[last..].contains('.') {
            return None;
        }
    }
    Some((&name[..dot], &name[dot + 1..]))
}

/// Whether webdataset skips a member as metadata: its first path component is `__*__`.
fn is_meta(name: &str) -> bool {
    let first = name.split('/').next().unwrap_or("");
    first.len() >= 4 && first.starts_with("__") && first.ends_with("__")
}

/// The `__kind__` of a wids shard index.
pub const WIDS_KIND: &str = "wids-shard-index-v1";

/// A shard index in wids's JSON format (`wids-shard-index-v1`): the shards' URLs and sample
/// counts, what [`crate::order::EpochOrder`] needs, without opening a shard.
///
/// ```json
/// {"__kind__": "wids-shard-index-v1", "wids_version": 1,
///  "shardlist": [{"url": "shard-000000.tar", "nsamples": 1000, "filesize": 10240}]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    /// Always [`WIDS_KIND`].
    #[serde(rename = "__kind__")]
    pub kind: String,
    /// Always 1.
    pub wids_version: u32,
    /// The dataset's name, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The shards, in order.
    pub shardlist: Vec<ShardEntry>,
}

/// One shard of a [`ShardIndex`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// The shard's URL, or path relative to the index file.
    pub url: String,
    /// Samples in the shard.
    pub nsamples: u64,
    /// The shard's size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesize: Option<u64>,
}

impl Default for ShardIndex {
    fn default() -> ShardIndex {
        ShardIndex {
            kind: WIDS_KIND.into(),
            wids_version: 1,
            name: None,
            shardlist: Vec::new(),
        }
    }
}

impl ShardIndex {
    /// Samples per shard, in order (the input of [`crate::order::EpochOrder::new`]).
    pub fn counts(&self) -> Vec<u64> {
        self.shardlist.iter().map(|s| s.nsamples).collect()
    }

    /// Parses an index from JSON text; `source` names it in errors.
    ///
    /// # Errors
    /// [`ShardError::Tar`] (without a member) when the text is not a wids index.
    pub fn from_json(source: &str, text: &str) -> Result<ShardIndex, ShardError> {
        let bad = |reason: String, offset: u64| ShardError::Tar {
            shard: source.to_owned(),
            member: None,
            offset,
            reason,
        };
        let index: ShardIndex = serde_json::from_str(text).map_err(|e| {
            let offset = crate::error::json_error_offset(text, &e);
            bad(format!("not a wids shard index: {e}"), offset)
        })?;
        if index.kind != WIDS_KIND {
            return Err(bad(
                format!("__kind__ is {:?}, expected {WIDS_KIND:?}", index.kind),
                0,
            ));
        }
        Ok(index)
    }

    /// The index as JSON text (pretty-printed, as wids's tools write it).
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads an index file.
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when it cannot be read, else as [`ShardIndex::from_json`].
    pub fn read(path: impl AsRef<Path>) -> Result<ShardIndex, ShardError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ShardError::ShardFile {
            path: path.to_owned(),
            source,
        })?;
        ShardIndex::from_json(&path.display().to_string(), &text)
    }

    /// Writes the index to `path`.
    ///
    /// # Errors
    /// [`ShardError::ShardFile`].
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ShardError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json() + "\n").map_err(|source| ShardError::ShardFile {
            path: path.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_like_webdataset() {
        assert_eq!(split_name("a/b/c.jpg"), Some(("a/b/c", "jpg")));
        assert_eq!(split_name("x.seg.PNG"), Some(("x", "seg.PNG")));
        assert_eq!(split_name("dir.v2/img.txt"), Some(("dir.v2/img", "txt")));
        assert_eq!(split_name("a/.hidden.jpg"), Some(("a/", "hidden.jpg")));
        assert_eq!(split_name("a.b/.hidden"), None);
        assert_eq!(split_name(".hidden"), None);
        assert_eq!(split_name("noext"), None);
        assert_eq!(split_name("k."), Some(("k", "")));
        assert!(is_meta("__index__") && is_meta("__meta__/x.json") && !is_meta("__a.jpg"));
    }
}
