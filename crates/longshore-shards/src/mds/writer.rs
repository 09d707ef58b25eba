//! Writing MDS shards byte-identical to Streaming's `MDSWriter` (no compression, no hashes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::codec::encode;
use super::{Encoding, FileInfo, MdsIndex, MdsShardInfo, Value, pyjson};
use crate::ShardError;

/// Writes an MDS dataset (`shard.00000.mds`, ..., `index.json`) as Streaming's `MDSWriter`
/// does with `compression=None, hashes=None`: the same shard boundaries for the same
/// `size_limit`, the same bytes.
///
/// Like Streaming, a shard is flushed before a sample that would take it past `size_limit`
/// (counting 4 + 4 + the config's bytes per shard and 4 more per sample), even when that
/// leaves an empty shard (a first sample larger than the limit).
#[derive(Debug)]
pub struct MdsWriter {
    dir: PathBuf,
    names: Vec<String>,
    encodings: Vec<Encoding>,
    encoding_names: Vec<String>,
    sizes: Vec<Option<u64>>,
    size_limit: Option<u64>,
    config: Vec<u8>,
    samples: Vec<Vec<u8>>,
    shard_size: u64,
    shards: Vec<MdsShardInfo>,
}

impl MdsWriter {
    /// A writer of `columns` (name, Streaming encoding name) into `dir` (created if missing),
    /// starting a new shard before one would exceed `size_limit` bytes (Streaming's default
    /// is `Some(1 << 26)`; `None` or `Some(0)` writes one shard).
    ///
    /// # Errors
    /// [`ShardError::Write`] for an unknown encoding, a repeated column or a limit of 2^32 or
    /// more; [`ShardError::ShardFile`] when `dir` cannot be created.
    pub fn new(
        dir: impl AsRef<Path>,
        columns: &[(&str, &str)],
        size_limit: Option<u64>,
    ) -> Result<MdsWriter, ShardError> {
        let dir = dir.as_ref().to_owned();
        let fail = |reason: String| ShardError::Write {
            shard: dir.display().to_string(),
            reason,
        };
        let size_limit = size_limit.filter(|&l| l > 0);
        if size_limit.is_some_and(|l| l >= 1 << 32) {
            return Err(fail(
                "size_limit must be less than 2^32 (offsets are u32)".into(),
            ));
        }
        let sorted: BTreeMap<&str, &str> = columns.iter().copied().collect();
        if sorted.len() != columns.len() {
            return Err(fail("a column is named twice".into()));
        }
        let mut encodings = Vec::new();
        for (name, enc) in &sorted {
            match Encoding::parse(enc) {
                Some(Encoding::Other(_)) | None => {
                    return Err(fail(format!("column {name:?}: unknown encoding {enc:?}")));
                }
                Some(e) => encodings.push(e),
            }
        }
        let names: Vec<String> = sorted.keys().map(|s| (*s).to_owned()).collect();
        let encoding_names: Vec<String> = sorted.values().map(|s| (*s).to_owned()).collect();
        let sizes: Vec<Option<u64>> = encodings.iter().map(Encoding::fixed_size).collect();
        let config = pyjson::dumps(
            &json!({
                "version": 2,
                "format": "mds",
                "compression": null,
                "hashes": [],
                "size_limit": size_limit,
                "column_names": names,
                "column_encodings": encoding_names,
                "column_sizes": sizes,
            }),
            true,
        )
        .into_bytes();
        std::fs::create_dir_all(&dir).map_err(|source| ShardError::ShardFile {
            path: dir.clone(),
            source,
        })?;
        Ok(MdsWriter {
            shard_size: 8 + config.len() as u64,
            dir,
            names,
            encodings,
            encoding_names,
            sizes,
            size_limit,
            config,
            samples: Vec::new(),
            shards: Vec::new(),
        })
    }

    fn fail(&self, reason: String) -> ShardError {
        ShardError::Write {
            shard: format!("shard.{:05}.mds", self.shards.len()),
            reason,
        }
    }

    /// Appends a sample: a value for every column, by name (other names are ignored, as in
    /// Streaming).
    ///
    /// # Errors
    /// [`ShardError::Write`] when a column is missing or its value does not fit its
    /// encoding; [`ShardError::ShardFile`] when a shard cannot be written.
    pub fn write(&mut self, sample: &[(&str, Value)]) -> Result<(), ShardError> {
        let mut head = Vec::new();
        let mut body = Vec::new();
        for ((name, encoding), size) in self.names.iter().zip(&self.encodings).zip(&self.sizes) {
            let value = sample
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .ok_or_else(|| self.fail(format!("the sample has no column {name:?}")))?;
            let datum =
                encode(encoding, value).map_err(|e| self.fail(format!("column {name:?}: {e}")))?;
            match size {
                None => head.extend_from_slice(&(datum.len() as u32).to_le_bytes()),
                Some(s) if *s != datum.len() as u64 => {
                    return Err(self.fail(format!(
                        "column {name:?}: {} bytes for an encoding of {s}",
                        datum.len()
                    )));
                }
                Some(_) => {}
            }
            body.extend_from_slice(&datum);
        }
        head.extend_from_slice(&body);
        let sample_size = head.len() as u64 + 4;
        if self
            .size_limit
            .is_some_and(|limit| limit < self.shard_size + sample_size)
        {
            self.flush()?;
        }
        self.samples.push(head);
        self.shard_size += sample_size;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ShardError> {
        let n = self.samples.len() as u64;
        let start = 4 + 4 * (n + 1) + self.config.len() as u64;
        let total = start + self.samples.iter().map(|s| s.len() as u64).sum::<u64>();
        if total > u64::from(u32::MAX) {
            return Err(self.fail(format!("{total} bytes do not fit u32 offsets")));
        }
        let mut data = Vec::with_capacity(total as usize);
        data.extend_from_slice(&(n as u32).to_le_bytes());
        let mut offset = start;
        data.extend_from_slice(&(offset as u32).to_le_bytes());
        for s in &self.samples {
            offset += s.len() as u64;
            data.extend_from_slice(&(offset as u32).to_le_bytes());
        }
        data.extend_from_slice(&self.config);
        for s in &self.samples {
            data.extend_from_slice(s);
        }
        let basename = format!("shard.{:05}.mds", self.shards.len());
        let path = self.dir.join(&basename);
        std::fs::write(&path, &data).map_err(|source| ShardError::ShardFile { path, source })?;
        tracing::debug!(target: "longshore::shards", shard = %basename, samples = n, bytes = data.len(), "wrote mds shard");
        self.shards.push(MdsShardInfo {
            column_encodings: self.encoding_names.clone(),
            column_names: self.names.clone(),
            column_sizes: self.sizes.clone(),
            compression: None,
            format: "mds".into(),
            hashes: Vec::new(),
            raw_data: FileInfo {
                basename,
                bytes: data.len() as u64,
                hashes: BTreeMap::new(),
            },
            samples: n,
            size_limit: self.size_limit,
            version: 2,
            zip_data: None,
        });
        self.samples.clear();
        self.shard_size = 8 + self.config.len() as u64;
        Ok(())
    }

    /// Flushes the last shard (if it holds samples) and writes `index.json`.
    ///
    /// # Errors
    /// [`ShardError::ShardFile`] when a file cannot be written.
    pub fn finish(mut self) -> Result<MdsIndex, ShardError> {
        if !self.samples.is_empty() {
            self.flush()?;
        }
        let index = MdsIndex {
            shards: std::mem::take(&mut self.shards),
            version: 2,
        };
        let path = self.dir.join("index.json");
        std::fs::write(&path, index.to_json())
            .map_err(|source| ShardError::ShardFile { path, source })?;
        Ok(index)
    }
}
