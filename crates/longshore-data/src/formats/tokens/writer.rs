//! [`TokenWriter`]: token documents written into one flat token file, the format
//! [`TokenSequences`](super::TokenSequences) reads (what nanoGPT's `prepare.py` writes).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::DataError;
use crate::dtype::DType;

/// Writes token documents, one after the other, into a flat file of `u16` or `u32` tokens
/// (little-endian), each document followed by the separator token when one is given (GPT-2's
/// `<|endoftext|>`, 50256): the file [`TokenSequences`](super::TokenSequences) cuts into
/// training sequences, with `position_ids` and `document_ids` when it is told the separator.
/// Tokenized datasets stored as documents (a Parquet list column, an MDS `ndarray` column, a
/// `.npy` per WebDataset sample) become such a file once, the way nanoGPT's `prepare.py` and
/// LitData's `optimize` prepare theirs.
///
/// A token the dtype cannot hold is refused, naming the document and the token's place in
/// it; nothing is cut or wrapped. The file is written to `<path>.partial` and renamed on
/// [`finish`](TokenWriter::finish), so a failed or interrupted conversion leaves no file a
/// loader could take for a whole one.
///
/// ```
/// use longshore_data::formats::tokens::{TokenSequences, TokenWriter};
/// use longshore_data::{DType, Dataset};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let path = dir.path().join("train.bin");
/// let mut w = TokenWriter::create(&path, DType::U16)?.separator(0);
/// w.write_document([5u64, 6, 7])?;
/// w.write_document([8u64, 9])?;
/// assert_eq!(w.finish()?, (7, 2)); // 5 tokens and 2 separators, 2 documents
/// let seqs = TokenSequences::builder([&path]).seq_len(3).documents(0).build()?;
/// assert_eq!(seqs.len(), 2); // (7 - 1) / 3
/// assert_eq!(seqs.get(0)?[0].as_slice::<i64>()?, [5, 6, 7]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TokenWriter {
    path: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
    dtype: DType,
    separator: Option<u64>,
    tokens: u64,
    documents: u64,
    /// Renamed into place: the drop leaves it.
    done: bool,
}

impl Drop for TokenWriter {
    /// An unfinished file (an error, an interrupted conversion) is removed.
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

impl TokenWriter {
    /// A writer of `dtype` tokens ([`DType::U16`] or [`DType::U32`]) into `path`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for another dtype; [`DataError::Io`] when the file
    /// cannot be created.
    pub fn create(path: impl AsRef<Path>, dtype: DType) -> Result<TokenWriter, DataError> {
        if !matches!(dtype, DType::U16 | DType::U32) {
            return Err(DataError::InvalidArgument {
                name: "dtype",
                reason: format!("token files hold u16 or u32 tokens, not {dtype}"),
            });
        }
        let path = path.as_ref().to_owned();
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|source| DataError::Io {
            path: partial.clone(),
            source,
        })?;
        Ok(TokenWriter {
            path,
            partial,
            out: BufWriter::with_capacity(1 << 20, file),
            dtype,
            separator: None,
            tokens: 0,
            documents: 0,
            done: false,
        })
    }

    /// Writes `separator` after each document.
    #[must_use]
    pub fn separator(mut self, separator: u32) -> TokenWriter {
        self.separator = Some(u64::from(separator));
        self
    }

    fn max(&self) -> u64 {
        if self.dtype == DType::U16 {
            u64::from(u16::MAX)
        } else {
            u64::from(u32::MAX)
        }
    }

    fn put(&mut self, token: u64) -> Result<(), DataError> {
        let r = if self.dtype == DType::U16 {
            self.out.write_all(&(token as u16).to_le_bytes())
        } else {
            self.out.write_all(&(token as u32).to_le_bytes())
        };
        r.map_err(|source| DataError::Io {
            path: self.partial.clone(),
            source,
        })?;
        self.tokens += 1;
        Ok(())
    }

    /// Appends one document's tokens (then the separator, if any).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] naming the document and the place of a token the dtype
    /// cannot hold (the document is then partly written: drop the writer); [`DataError::Io`].
    pub fn write_document(
        &mut self,
        tokens: impl IntoIterator<Item = u64>,
    ) -> Result<(), DataError> {
        let max = self.max();
        for (k, t) in tokens.into_iter().enumerate() {
            if t > max {
                return Err(DataError::InvalidArgument {
                    name: "tokens",
                    reason: format!(
                        "document {} holds token {t} at {k}, past the {} token file's {max}",
                        self.documents, self.dtype
                    ),
                });
            }
            self.put(t)?;
        }
        if let Some(s) = self.separator {
            self.put(s)?;
        }
        self.documents += 1;
        Ok(())
    }

    /// Appends one document given as a 1-D array of integers: `bytes` holding elements of
    /// `dtype` in native byte order (a `.npy`'s data, an MDS `ndarray`, a Parquet list).
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for a dtype that is not an integer, a negative token or
    /// one the file's dtype cannot hold (naming the document); [`DataError::Io`].
    pub fn write_array(&mut self, dtype: DType, bytes: &[u8]) -> Result<(), DataError> {
        use DType::{I8, I16, I32, I64, U8, U16, U32, U64};
        if !matches!(dtype, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64) {
            return Err(DataError::InvalidArgument {
                name: "tokens",
                reason: format!(
                    "document {} is an array of {dtype}, not of integers",
                    self.documents
                ),
            });
        }
        let size = dtype.size();
        let mut values = Vec::with_capacity(bytes.len() / size);
        for (k, c) in bytes.chunks_exact(size).enumerate() {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            let v: i128 = match dtype {
                U8 => i128::from(b[0]),
                I8 => i128::from(b[0] as i8),
                U16 => i128::from(u16::from_ne_bytes([b[0], b[1]])),
                I16 => i128::from(i16::from_ne_bytes([b[0], b[1]])),
                U32 => i128::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                I32 => i128::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                U64 => i128::from(u64::from_ne_bytes(b)),
                _ => i128::from(i64::from_ne_bytes(b)),
            };
            let Ok(v) = u64::try_from(v) else {
                return Err(DataError::InvalidArgument {
                    name: "tokens",
                    reason: format!("document {} holds token {v} at {k}", self.documents),
                });
            };
            values.push(v);
        }
        self.write_document(values)
    }

    /// Tokens written so far (separators included).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Flushes the file and puts it in place: `(tokens, documents)` written.
    ///
    /// # Errors
    /// [`DataError::Io`] when the file cannot be flushed, synced or renamed.
    pub fn finish(mut self) -> Result<(u64, u64), DataError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DataError::Io { path, source }
        };
        self.out.flush().map_err(io(&self.partial))?;
        self.out.get_ref().sync_all().map_err(io(&self.partial))?;
        std::fs::rename(&self.partial, &self.path).map_err(io(&self.path))?;
        self.done = true;
        tracing::info!(target: "longshore::data", path = %self.path.display(), tokens = self.tokens,
            documents = self.documents, dtype = %self.dtype, "token file written");
        Ok((self.tokens, self.documents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;
    use crate::formats::tokens::TokenSequences;

    fn ne<T: Copy, const N: usize>(v: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| to(x)).collect()
    }

    #[test]
    fn documents_round_trip_through_token_sequences() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let mut w = TokenWriter::create(&path, DType::U32)
            .unwrap()
            .separator(99);
        w.write_array(DType::I64, &ne(&[1i64, 2, 3], i64::to_ne_bytes))
            .unwrap();
        w.write_array(DType::U16, &ne(&[70_000u32 as u16, 4], u16::to_ne_bytes))
            .unwrap();
        w.write_array(DType::I32, &ne(&[100_000i32], i32::to_ne_bytes))
            .unwrap();
        assert!(!path.exists(), "not in place before finish");
        assert_eq!(w.finish().unwrap(), (9, 3));
        let raw = std::fs::read(&path).unwrap();
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            tokens,
            [1, 2, 3, 99, 70_000u32 as u16 as u32, 4, 99, 100_000, 99]
        );
        let seqs = TokenSequences::builder([&path])
            .token_dtype(DType::U32)
            .seq_len(4)
            .targets(false)
            .documents(99)
            .build()
            .unwrap();
        assert_eq!(seqs.len(), 2);
        let s = seqs.get(1).unwrap();
        assert_eq!(s[0].as_slice::<i64>().unwrap(), [4464, 4, 99, 100_000]);
        // The second document started in the first sequence: its positions continue.
        assert_eq!(s[1].as_slice::<i64>().unwrap(), [0, 1, 2, 0]);
    }

    #[test]
    fn tokens_that_do_not_fit_are_refused_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let mut w = TokenWriter::create(&path, DType::U16).unwrap();
        w.write_document([1, 2]).unwrap();
        let e = w.write_document([3, 65_536]).unwrap_err().to_string();
        assert!(e.contains("document 1") && e.contains("65536 at 1"), "{e}");
        let e = w
            .write_array(DType::I8, &[5u8, (-3i8) as u8])
            .unwrap_err()
            .to_string();
        assert!(e.contains("token -3 at 1"), "{e}");
        let e = w
            .write_array(DType::F32, &1f32.to_ne_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not of integers"), "{e}");
        drop(w);
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the partial file is gone"
        );
        let e = TokenWriter::create(&path, DType::I64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("u16 or u32"), "{e}");
    }
}
