//! [`ShardSample`]: what a [`ShardedDataset`](super::ShardedDataset) yields.

use std::sync::Arc;

use longshore_data::DataError;

use crate::ShardError;
use crate::mds::{Columns, Value};
use crate::order::SampleId;
use crate::webdataset::Sample;

/// One sample of a sharded dataset, as a worker reads it: its fields' bytes, where it comes
/// from, and what a transform needs to be reproducible.
///
/// - WebDataset: [`sample`](Self::sample) is the tar's sample (key, shard URL, byte offset,
///   fields by extension); its methods decode fields (`int("cls")`, `text("txt")`,
///   `json("json")`, `npy("npy")`, `image()`).
/// - MDS: the key is the sample's index in its shard, the fields are the columns' encoded
///   bytes by column name, and [`value`](Self::value) decodes a column with its encoding.
#[derive(Debug, Clone)]
pub struct ShardSample {
    /// The sample: key, shard URL, byte offset in the shard, fields' bytes.
    pub sample: Sample,
    /// Its shard, its index there, and its global id.
    pub id: SampleId,
    /// Its position in the epoch's order.
    pub position: u64,
    /// The epoch it was read in.
    pub epoch: u64,
    /// The seed its random transforms should draw from:
    /// [`sample_seed`](crate::order::sample_seed)`(seed, epoch, global id)`, the same on every
    /// rank, worker and resume.
    pub seed: u64,
    /// `true` for a padding repeat (a sample read a second time in this epoch so that every
    /// rank gets the same count; see [`EpochPlan`](crate::order::EpochPlan)). Leave these out
    /// of evaluation metrics.
    pub pad: bool,
    pub(super) columns: Option<Arc<Columns>>,
}

impl ShardSample {
    /// The sample's key.
    pub fn key(&self) -> &str {
        &self.sample.key
    }

    /// The URL of the shard it was read from.
    pub fn url(&self) -> &str {
        &self.sample.url
    }

    /// Field `name`'s bytes, if present (a WebDataset extension such as `jpg`, or an MDS
    /// column name).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.sample.get(name)
    }

    /// Field `name`'s bytes, required.
    ///
    /// # Errors
    /// [`ShardError::Sample`] naming the shard, the key, the offset and the fields present.
    pub fn field(&self, name: &str) -> Result<&[u8], ShardError> {
        self.sample.field(name)
    }

    /// Field `name` as an integer (a class label): an MDS column decoded with its encoding
    /// (`int*`/`uint*`, `str_int`, or a float or text holding a whole number), a WebDataset
    /// field as decimal text (`.cls`).
    ///
    /// # Errors
    /// [`ShardError::Mds`] or [`ShardError::Sample`] naming the shard, the sample and the
    /// field when it is missing or not an integer.
    pub fn int(&self, name: &str) -> Result<i64, ShardError> {
        if self.columns.is_none() {
            return self.sample.int(name);
        }
        let fail = |reason: String| ShardError::Mds {
            shard: self.sample.url.clone(),
            sample: Some(self.id.index),
            offset: self.sample.offset,
            reason: format!("column {name:?}: {reason}"),
        };
        match self.value(name)? {
            Value::Int(i) => Ok(i),
            Value::UInt(u) => i64::try_from(u).map_err(|_| fail(format!("{u} is out of range"))),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
            Value::Str(t) => t
                .trim()
                .parse()
                .map_err(|_| fail(format!("{t:?} is not an integer"))),
            other => Err(fail(format!("{} is not an integer", other.kind()))),
        }
    }

    /// The image field: field `name`, or without one the first of
    /// [`IMAGE_EXTENSIONS`](crate::webdataset::IMAGE_EXTENSIONS) present; its name and encoded
    /// bytes.
    pub fn image<'a>(&'a self, name: Option<&'a str>) -> Option<(&'a str, &'a [u8])> {
        match name {
            Some(n) => self.sample.get(n).map(|b| (n, b)),
            None => self.sample.image(),
        }
    }

    /// MDS column `name`, decoded with its encoding (see [`crate::mds::Value`]).
    ///
    /// # Errors
    /// [`ShardError::Mds`] naming the shard, the sample and the column when the sample is not
    /// from an MDS shard, has no such column, or its bytes do not decode.
    pub fn value(&self, name: &str) -> Result<Value, ShardError> {
        let fail = |reason: String| ShardError::Mds {
            shard: self.sample.url.clone(),
            sample: Some(self.id.index),
            offset: self.sample.offset,
            reason,
        };
        let columns = self
            .columns
            .as_ref()
            .ok_or_else(|| fail(format!("not an MDS sample (column {name:?} asked for)")))?;
        let i = columns
            .position(name)
            .ok_or_else(|| fail(format!("no column {name:?}")))?;
        let bytes = self.sample.field(name)?;
        let encoding = &columns.encodings()[i];
        crate::mds::codec::decode(encoding, bytes)
            .map_err(|e| fail(format!("column {name:?} ({}): {e}", encoding.name())))
    }
}

/// A [`ShardError`] as the loader's [`DataError`]: [`DataError::Custom`] whose cause is the
/// shard error, so the loader's `on_sample_error` policy applies to it and its message (shard,
/// member, offset) is in the error's chain.
impl From<ShardError> for DataError {
    fn from(e: ShardError) -> DataError {
        DataError::custom("reading a sharded dataset", e)
    }
}
