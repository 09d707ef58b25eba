//! Reading an MDS shard from bytes: its header, sample byte ranges, and samples.

use std::ops::Range;

use super::codec::decode;
use super::{Columns, MdsShardInfo, Value};
use crate::ShardError;

fn error(shard: &str, sample: Option<u64>, offset: u64, reason: String) -> ShardError {
    ShardError::Mds {
        shard: shard.to_owned(),
        sample,
        offset,
        reason,
    }
}

fn u32_at(shard: &str, bytes: &[u8], at: u64, what: &str) -> Result<u32, ShardError> {
    usize::try_from(at)
        .ok()
        .and_then(|a| bytes.get(a..a.checked_add(4)?))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| {
            error(
                shard,
                None,
                at,
                format!(
                    "{what} needs bytes {at}..{}, only {} given",
                    at + 4,
                    bytes.len()
                ),
            )
        })
}

/// Bytes of a shard's header for `samples` samples: the count and the offsets (the config
/// JSON that follows is not included).
pub fn header_len(samples: u64) -> u64 {
    4 + 4 * (samples + 1)
}

/// The number of samples of a shard, from its first 4 bytes; `shard` names it in errors.
///
/// # Errors
/// [`ShardError::Mds`] when fewer than 4 bytes are given.
pub fn sample_count(shard: &str, head: &[u8]) -> Result<u64, ShardError> {
    u32_at(shard, head, 0, "the sample count").map(u64::from)
}

/// The byte range of sample `sample` in its shard, from the shard's first bytes (at least
/// `4 * (sample + 3)` of them: the count and offsets `sample`, `sample + 1`), for a range
/// read of that sample alone.
///
/// # Errors
/// [`ShardError::Mds`] naming the shard, sample and offset when the sample is past the
/// count, the bytes are too few, or the offsets are out of order or point into the header.
pub fn sample_range(shard: &str, head: &[u8], sample: u64) -> Result<Range<u64>, ShardError> {
    let count = sample_count(shard, head)?;
    if sample >= count {
        return Err(error(
            shard,
            Some(sample),
            0,
            format!("the shard holds {count} samples"),
        ));
    }
    let at = 4 + 4 * sample;
    let begin = u64::from(u32_at(shard, head, at, "the sample's offsets")?);
    let end = u64::from(u32_at(shard, head, at + 4, "the sample's offsets")?);
    if begin > end || begin < header_len(count) {
        return Err(error(
            shard,
            Some(sample),
            at,
            format!(
                "offsets {begin}..{end} are reversed or point into the {}-byte header",
                header_len(count)
            ),
        ));
    }
    Ok(begin..end)
}

/// A whole uncompressed shard in memory (a file read or mapped, a cached download), checked
/// against its index entry.
#[derive(Debug)]
pub struct MdsShard<'a> {
    name: String,
    columns: Columns,
    bytes: &'a [u8],
    samples: u64,
}

impl<'a> MdsShard<'a> {
    /// Checks `bytes` against `info`: no compression, the size, the sample count, and every
    /// offset in order and inside the file.
    ///
    /// # Errors
    /// [`ShardError::MdsCompression`] for a compressed shard; [`ShardError::Mds`] naming the
    /// shard, the sample and the offset that disagree.
    pub fn new(info: &MdsShardInfo, bytes: &'a [u8]) -> Result<MdsShard<'a>, ShardError> {
        let name = info.raw_data.basename.clone();
        if let Some(codec) = &info.compression {
            return Err(ShardError::MdsCompression {
                shard: info
                    .zip_data
                    .as_ref()
                    .map_or_else(|| name.clone(), |z| z.basename.clone()),
                codec: codec.clone(),
            });
        }
        let columns = info.columns()?;
        let len = bytes.len() as u64;
        if len != info.raw_data.bytes {
            return Err(error(
                &name,
                None,
                len.min(info.raw_data.bytes),
                format!(
                    "the file holds {len} bytes, the index says {}",
                    info.raw_data.bytes
                ),
            ));
        }
        let samples = sample_count(&name, bytes)?;
        if samples != info.samples {
            return Err(error(
                &name,
                None,
                0,
                format!(
                    "the file holds {samples} samples, the index says {}",
                    info.samples
                ),
            ));
        }
        let mut prev = header_len(samples);
        for i in 0..=samples {
            let at = 4 + 4 * i;
            let offset = u64::from(u32_at(&name, bytes, at, "the offsets")?);
            if offset < prev || offset > len {
                return Err(error(
                    &name,
                    Some(i),
                    at,
                    format!(
                        "offset {offset} is before the previous ({prev}) or past the file's \
                         {len} bytes"
                    ),
                ));
            }
            prev = offset;
        }
        if prev != len {
            return Err(error(
                &name,
                None,
                4 + 4 * samples,
                format!("the last offset is {prev}, the file ends at {len}"),
            ));
        }
        Ok(MdsShard {
            name,
            columns,
            bytes,
            samples,
        })
    }

    /// The shard's basename.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples in the shard.
    pub fn len(&self) -> u64 {
        self.samples
    }

    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// The shard's columns.
    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    /// The writer's configuration stored between the offsets and the first sample.
    ///
    /// # Errors
    /// [`ShardError::Mds`] when it is not JSON.
    pub fn config(&self) -> Result<serde_json::Value, ShardError> {
        let start = header_len(self.samples) as usize;
        let end = u32_at(&self.name, self.bytes, 4, "the offsets")? as usize;
        serde_json::from_slice(&self.bytes[start..end]).map_err(|e| {
            error(
                &self.name,
                None,
                start as u64,
                format!("the config is not JSON: {e}"),
            )
        })
    }

    /// Sample `index`, borrowing the shard's bytes.
    ///
    /// # Errors
    /// [`ShardError::Mds`] when `index` is out of range or the sample's column sizes do not
    /// add up to its bytes.
    pub fn sample(&self, index: u64) -> Result<MdsSample<'_>, ShardError> {
        let range = sample_range(&self.name, self.bytes, index)?;
        let data = &self.bytes[range.start as usize..range.end as usize];
        MdsSample::parse(&self.name, &self.columns, index, range.start, data)
    }
}

/// One sample's columns, borrowed from the bytes it was parsed from.
#[derive(Debug, Clone)]
pub struct MdsSample<'a> {
    shard: &'a str,
    columns: &'a Columns,
    index: u64,
    offset: u64,
    raw: Vec<&'a [u8]>,
    starts: Vec<usize>,
}

impl<'a> MdsSample<'a> {
    /// Parses a sample's bytes (`offset` is where they start in the shard, for errors): the
    /// u32 sizes of the variable-size columns, then every column's bytes, which must end
    /// exactly at the end of `data`.
    ///
    /// # Errors
    /// [`ShardError::Mds`] naming the shard, sample and offset where the bytes run out or are
    /// left over.
    pub fn parse(
        shard: &'a str,
        columns: &'a Columns,
        index: u64,
        offset: u64,
        data: &'a [u8],
    ) -> Result<MdsSample<'a>, ShardError> {
        let fail =
            |at: usize, reason: String| error(shard, Some(index), offset + at as u64, reason);
        let mut at = 0usize;
        let mut sizes = Vec::with_capacity(columns.sizes.len());
        for (name, size) in columns.names.iter().zip(&columns.sizes) {
            let size = match size {
                Some(s) => *s as usize,
                None => {
                    let b = data.get(at..at + 4).ok_or_else(|| {
                        fail(
                            at,
                            format!("the sample ends in the size of column {name:?}"),
                        )
                    })?;
                    at += 4;
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                }
            };
            sizes.push(size);
        }
        let mut raw = Vec::with_capacity(sizes.len());
        let mut starts = Vec::with_capacity(sizes.len());
        for (name, size) in columns.names.iter().zip(sizes) {
            let end = at
                .checked_add(size)
                .filter(|&e| e <= data.len())
                .ok_or_else(|| {
                    fail(
                        at,
                        format!(
                            "column {name:?} of {size} bytes ends past the sample's {} bytes",
                            data.len()
                        ),
                    )
                })?;
            raw.push(&data[at..end]);
            starts.push(at);
            at = end;
        }
        if at != data.len() {
            return Err(fail(
                at,
                format!("{} bytes left over after the columns", data.len() - at),
            ));
        }
        Ok(MdsSample {
            shard,
            columns,
            index,
            offset,
            raw,
            starts,
        })
    }

    /// The sample's index in its shard.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Column `name`'s encoded bytes.
    pub fn raw(&self, name: &str) -> Option<&'a [u8]> {
        self.columns.position(name).map(|i| self.raw[i])
    }

    /// Every column's encoded bytes, in column order.
    pub fn raw_columns(&self) -> &[&'a [u8]] {
        &self.raw
    }

    /// Column `name`, decoded.
    ///
    /// # Errors
    /// [`ShardError::Mds`] naming the shard, sample, column and offset when there is no such
    /// column or its bytes do not decode.
    pub fn get(&self, name: &str) -> Result<Value, ShardError> {
        let fail = |offset, reason| error(self.shard, Some(self.index), offset, reason);
        let i = self
            .columns
            .position(name)
            .ok_or_else(|| fail(self.offset, format!("no column {name:?}")))?;
        let data = self.raw[i];
        let at = self.offset + self.starts[i] as u64;
        decode(&self.columns.encodings[i], data).map_err(|e| {
            fail(
                at,
                format!(
                    "column {name:?} ({}): {e}",
                    self.columns.encodings[i].name()
                ),
            )
        })
    }

    /// Every column decoded, by name.
    ///
    /// # Errors
    /// As [`MdsSample::get`].
    pub fn decode_all(&self) -> Result<Vec<(String, Value)>, ShardError> {
        self.columns
            .names
            .iter()
            .map(|n| Ok((n.clone(), self.get(n)?)))
            .collect()
    }
}
