//! One WebDataset sample and the decoding of its fields.

use std::collections::BTreeMap;

use longshore_data::Tensor;
use longshore_data::dtype::swap_bytes_in_place;
use longshore_data::formats::npy::parse_header;

use crate::ShardError;

/// The image extensions [`Sample::image`] looks for, in order.
pub const IMAGE_EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];

/// A sample: the members of a shard that share a key, by (lowercased) extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The key (webdataset's `__key__`).
    pub key: String,
    /// The shard's name or URL (webdataset's `__url__`).
    pub url: String,
    /// Byte offset in the tar where the sample's first member (its headers) begins.
    pub offset: u64,
    /// The fields' bytes by extension (`jpg`, `cls`, `seg.png`, ...).
    pub fields: BTreeMap<String, Vec<u8>>,
}

impl Sample {
    fn error(&self, reason: String) -> ShardError {
        ShardError::Sample {
            shard: self.url.clone(),
            key: self.key.clone(),
            offset: self.offset,
            reason,
        }
    }

    /// Field `ext`'s bytes, if present.
    pub fn get(&self, ext: &str) -> Option<&[u8]> {
        self.fields.get(ext).map(Vec::as_slice)
    }

    /// Field `ext`'s bytes, required.
    ///
    /// # Errors
    /// [`ShardError::Sample`] naming the missing field and the fields present.
    pub fn field(&self, ext: &str) -> Result<&[u8], ShardError> {
        self.get(ext).ok_or_else(|| {
            let have: Vec<&str> = self.fields.keys().map(String::as_str).collect();
            self.error(format!(
                "missing required field .{ext} (fields: {})",
                have.join(", ")
            ))
        })
    }

    /// Checks that every extension of `required` is present.
    ///
    /// # Errors
    /// As [`Sample::field`], for the first missing one.
    pub fn require(&self, required: &[&str]) -> Result<(), ShardError> {
        required
            .iter()
            .try_for_each(|ext| self.field(ext).map(drop))
    }

    /// Field `ext` as UTF-8 text (`.txt`).
    ///
    /// # Errors
    /// [`ShardError::Sample`] when missing or not UTF-8.
    pub fn text(&self, ext: &str) -> Result<&str, ShardError> {
        std::str::from_utf8(self.field(ext)?)
            .map_err(|e| self.error(format!("field .{ext} is not UTF-8 text: {e}")))
    }

    /// Field `ext` as a decimal integer, surrounding whitespace ignored (`.cls`, `.idx`).
    ///
    /// # Errors
    /// [`ShardError::Sample`] when missing or not an integer.
    pub fn int(&self, ext: &str) -> Result<i64, ShardError> {
        let text = self.text(ext)?.trim();
        text.parse()
            .map_err(|_| self.error(format!("field .{ext} = {text:?} is not an integer")))
    }

    /// Field `ext` parsed as JSON (`.json`).
    ///
    /// # Errors
    /// [`ShardError::Sample`] when missing or not JSON.
    pub fn json(&self, ext: &str) -> Result<serde_json::Value, ShardError> {
        serde_json::from_slice(self.field(ext)?)
            .map_err(|e| self.error(format!("field .{ext} is not JSON: {e}")))
    }

    /// Field `ext` (`npy`, `x.npy`, ...) as an array, through longshore-data's `.npy` parser
    /// (native byte order).
    ///
    /// # Errors
    /// [`ShardError::Sample`] when missing, or its header is invalid or promises more data
    /// than the member holds.
    pub fn npy(&self, ext: &str) -> Result<Tensor, ShardError> {
        let bytes = self.field(ext)?;
        let header = parse_header(bytes)
            .map_err(|e| self.error(format!("field .{ext} is not a valid .npy: {e}")))?;
        let len = header
            .data_len()
            .map_err(|e| self.error(format!("field .{ext}: {e}")))?;
        let data = bytes
            .get(header.data_offset..)
            .and_then(|d| d.get(..len))
            .ok_or_else(|| {
                self.error(format!(
                    "field .{ext}: the .npy header promises {len} data bytes after byte {}, the \
                     member holds {}",
                    header.data_offset,
                    bytes.len()
                ))
            })?;
        let mut tensor = Tensor::from_bytes(header.dtype, &header.shape, data)
            .map_err(|e| self.error(format!("field .{ext}: {e}")))?;
        if !header.byte_order.is_native() {
            swap_bytes_in_place(tensor.bytes_mut(), header.dtype.size());
        }
        Ok(tensor)
    }

    /// The first image field present ([`IMAGE_EXTENSIONS`]): its extension and encoded bytes.
    pub fn image(&self) -> Option<(&'static str, &[u8])> {
        IMAGE_EXTENSIONS
            .iter()
            .find_map(|&ext| self.get(ext).map(|b| (ext, b)))
    }
}
