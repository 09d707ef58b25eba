//! Token files for language models cut into fixed-length training sequences:
//! [`TokenSequences`].
//!
//! A token file is a flat array of token ids, as nanoGPT's `prepare.py` writes `train.bin`
//! (`np.uint16`, little-endian; `u32` for vocabularies past 65,535) and as most tokenizer
//! pipelines dump them. The files, in the order given, are one stream of tokens; sequence `k`
//! is the `seq_len` tokens from `k * seq_len` (plus the next `seq_len` as `targets`, shifted
//! by one, when targets are on: nanoGPT's `x, y`). A sequence is a pure function of its index,
//! so the dataset is map-style: the loader's samplers shuffle it, `DistributedSampler` gives
//! every rank the same number of sequences, and a checkpoint resumes exactly, on any number
//! of workers or ranks, like any map-style dataset. Documents cut at a sequence's end carry
//! over to the next sequence of the stream (their positions continue there).
//!
//! With a document separator ([`TokenSequencesBuilder::documents`], e.g. GPT-2's
//! `<|endoftext|>` = 50256), each sequence also gets `position_ids` (a token's position in its
//! document, counted from the document's first token even when that lies in an earlier
//! sequence) and `document_ids` (0 for the sequence's first document, then 1, 2, ...): what a
//! model needs to keep attention inside documents when several are packed into one sequence.
//! A document ends after each separator token and at the end of each file.
//!
//! The tokens after the last whole sequence are not read; [`TokenSequences::dropped_tokens`]
//! says how many (and opening logs it), as torch's `drop_last` does for samples.
//!
//! ```
//! use longshore_data::formats::tokens::TokenSequences;
//! use longshore_data::{DType, Dataset, DirectDataset};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("train.bin");
//! // 10 tokens as nanoGPT writes them: u16, little-endian.
//! let tokens: Vec<u8> = (0u16..10).flat_map(|t| t.to_le_bytes()).collect();
//! std::fs::write(&path, tokens)?;
//! let seqs = TokenSequences::builder([&path]).seq_len(4).build()?;
//! assert_eq!(seqs.len(), 2); // (10 - 1) / 4: each sequence needs one more token for its targets
//! assert_eq!(seqs.field_names(), ["input_ids", "targets"]);
//! let s = seqs.get(1)?;
//! assert_eq!(s[0].as_slice::<i64>()?, [4, 5, 6, 7]);
//! assert_eq!(s[1].as_slice::<i64>()?, [5, 6, 7, 8]);
//! assert_eq!(seqs.dropped_tokens(), 1);
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod writer;

pub use writer::TokenWriter;

use memmap2::Mmap;

use super::{AccessPattern, advise, open_map};
use crate::DataError;
use crate::dataset::{Dataset, DirectDataset};
use crate::dtype::DType;
use crate::field::{DirectPlan, FieldSpec};
use crate::shape::Shape;
use crate::tensor::Tensor;

const TARGET: &str = "longshore::data";

/// One memory-mapped token file.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    mmap: Mmap,
    /// Tokens in the file.
    tokens: u64,
}

/// Builds a [`TokenSequences`]; see [`TokenSequences::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct TokenSequencesBuilder {
    paths: Vec<PathBuf>,
    seq_len: usize,
    token: DType,
    output: DType,
    targets: bool,
    separator: Option<u32>,
}

impl TokenSequencesBuilder {
    /// Tokens per sequence (default 1,024; GPT-2's block size).
    pub fn seq_len(mut self, seq_len: usize) -> Self {
        self.seq_len = seq_len;
        self
    }

    /// How the files store a token: [`DType::U16`] (the default, nanoGPT's) or [`DType::U32`],
    /// little-endian.
    pub fn token_dtype(mut self, dtype: DType) -> Self {
        self.token = dtype;
        self
    }

    /// The dtype of the tensors written: [`DType::I64`] (the default, what `nn.Embedding` and
    /// `cross_entropy` take) or [`DType::I32`] (half the bytes to pin and copy; widen on the
    /// device).
    pub fn output_dtype(mut self, dtype: DType) -> Self {
        self.output = dtype;
        self
    }

    /// Whether each sequence comes with its `targets`, the same tokens shifted by one (the
    /// default: nanoGPT's `y`). Off: `input_ids` alone, for models that shift inside
    /// (Hugging Face's `labels = input_ids`), and each sequence needs one token less.
    pub fn targets(mut self, targets: bool) -> Self {
        self.targets = targets;
        self
    }

    /// Documents end after each `separator` token (and at each file's end): sequences get
    /// `position_ids` and `document_ids`; see the [module docs](self). Opening scans the
    /// files once for the separator (in parallel, at memory speed).
    pub fn documents(mut self, separator: u32) -> Self {
        self.separator = Some(separator);
        self
    }

    /// Maps the files and checks them.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] for no files, a zero `seq_len`, a token dtype other
    /// than u16/u32, an output dtype other than i64/i32, or a separator the token dtype cannot
    /// hold; [`DataError::Io`] naming a file that cannot be opened or mapped;
    /// [`DataError::InvalidFile`] naming a file whose length is not a whole number of tokens.
    pub fn build(self) -> Result<TokenSequences, DataError> {
        let invalid = |name, reason: String| DataError::InvalidArgument { name, reason };
        if self.paths.is_empty() {
            return Err(invalid("paths", "no token files".into()));
        }
        if self.seq_len == 0 {
            return Err(invalid("seq_len", "must be at least 1".into()));
        }
        let width = match self.token {
            DType::U16 => 2,
            DType::U32 => 4,
            other => {
                return Err(invalid(
                    "token_dtype",
                    format!("{other}: token files hold u16 or u32 tokens"),
                ));
            }
        };
        if !matches!(self.output, DType::I64 | DType::I32) {
            return Err(invalid(
                "output_dtype",
                format!("{}: sequences are written as i64 or i32", self.output),
            ));
        }
        if let Some(sep) = self.separator
            && width == 2
            && sep > u32::from(u16::MAX)
        {
            return Err(invalid(
                "separator",
                format!("{sep} does not fit the files' u16 tokens"),
            ));
        }
        let mut files = Vec::with_capacity(self.paths.len());
        let mut starts = Vec::with_capacity(self.paths.len() + 1);
        let mut total = 0u64;
        for path in &self.paths {
            let mmap = open_map(path)?;
            if mmap.len() % width != 0 {
                return Err(DataError::InvalidFile {
                    path: path.clone(),
                    reason: format!(
                        "{} bytes is not a whole number of {}-byte tokens (the last token \
                         would start at byte {})",
                        mmap.len(),
                        width,
                        mmap.len() - mmap.len() % width
                    ),
                });
            }
            advise(&mmap, AccessPattern::Random, path)?;
            let tokens = (mmap.len() / width) as u64;
            starts.push(total);
            total += tokens;
            files.push(TokenFile {
                path: path.clone(),
                mmap,
                tokens,
            });
        }
        starts.push(total);
        let need = self.seq_len as u64 + u64::from(self.targets);
        let len = if total >= need {
            (total - u64::from(self.targets)) / self.seq_len as u64
        } else {
            0
        };
        let len = usize::try_from(len).map_err(|_| DataError::Overflow("sequence count"))?;
        let dropped = total - len as u64 * self.seq_len as u64 - u64::from(self.targets && len > 0);
        let documents = self
            .separator
            .map(|sep| scan_documents(&files, &starts, width, sep));
        let shape = Shape::new(&[self.seq_len])?;
        let count = 1 + usize::from(self.targets) + 2 * usize::from(documents.is_some());
        let fields = vec![
            FieldSpec {
                dtype: self.output,
                shape,
            };
            count
        ];
        let mut names = vec!["input_ids"];
        if self.targets {
            names.push("targets");
        }
        if documents.is_some() {
            names.extend(["position_ids", "document_ids"]);
        }
        tracing::info!(target: TARGET, files = files.len(), tokens = total, sequences = len,
            seq_len = self.seq_len, dropped_tokens = dropped,
            documents = documents.as_ref().map(|d| d.len()),
            "opened token files ({dropped} tokens after the last whole sequence are not read)");
        Ok(TokenSequences {
            files: files.into(),
            starts: starts.into(),
            seq_len: self.seq_len,
            width,
            output: self.output,
            documents: documents.map(Arc::from),
            fields,
            names,
            len,
            dropped,
        })
    }
}

/// The global offset of every document's first token: 0, each file's start, and the token
/// after each separator (not past the stream's end), sorted.
fn scan_documents(files: &[TokenFile], starts: &[u64], width: usize, sep: u32) -> Vec<u64> {
    let per_file: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .iter()
            .zip(starts)
            .map(|(f, &start)| {
                scope.spawn(move || {
                    let mut docs = vec![start];
                    let end = start + f.tokens;
                    let mut push = |i: usize| {
                        let next = start + i as u64 + 1;
                        if next < end {
                            docs.push(next);
                        }
                    };
                    if width == 2 {
                        let sep = sep as u16;
                        for (i, t) in f.mmap.chunks_exact(2).enumerate() {
                            if u16::from_le_bytes([t[0], t[1]]) == sep {
                                push(i);
                            }
                        }
                    } else {
                        for (i, t) in f.mmap.chunks_exact(4).enumerate() {
                            if u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == sep {
                                push(i);
                            }
                        }
                    }
                    docs
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut docs: Vec<u64> = per_file.into_iter().flatten().collect();
    // Empty files start where the next one does.
    docs.dedup();
    docs
}

/// Token files as fixed-length training sequences: a map-style [`DirectDataset`] whose
/// samples are `input_ids` (and `targets`, `position_ids`, `document_ids`: see
/// [`field_names`](TokenSequences::field_names)), each `[seq_len]`, written straight into the
/// loader's batch; see the [module docs](self).
///
/// Clones share the maps.
#[derive(Debug, Clone)]
pub struct TokenSequences {
    files: Arc<[TokenFile]>,
    /// Global offset of each file's first token, then the total.
    starts: Arc<[u64]>,
    seq_len: usize,
    width: usize,
    output: DType,
    documents: Option<Arc<[u64]>>,
    fields: Vec<FieldSpec>,
    names: Vec<&'static str>,
    len: usize,
    dropped: u64,
}

impl TokenSequences {
    /// Sequences of the token files at `paths` (one stream, in this order): set the length,
    /// dtypes, targets and documents, then [`build`](TokenSequencesBuilder::build).
    pub fn builder<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> TokenSequencesBuilder {
        TokenSequencesBuilder {
            paths: paths
                .into_iter()
                .map(|p| p.as_ref().to_path_buf())
                .collect(),
            seq_len: 1024,
            token: DType::U16,
            output: DType::I64,
            targets: true,
            separator: None,
        }
    }

    /// The names of the fields, in order: `input_ids`, then `targets` (if on), then
    /// `position_ids` and `document_ids` (with documents).
    pub fn field_names(&self) -> &[&'static str] {
        &self.names
    }

    /// Tokens per sequence.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Tokens in all files.
    pub fn total_tokens(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    /// Tokens after the last whole sequence, never read.
    pub fn dropped_tokens(&self) -> u64 {
        self.dropped
    }

    /// Documents in the stream (with a separator).
    pub fn documents(&self) -> Option<usize> {
        self.documents.as_ref().map(|d| d.len())
    }

    /// Copies the `out.len() / size` tokens from global offset `from` into `out`, converted.
    fn copy_tokens(&self, mut from: u64, out: &mut [u8]) -> Result<(), DataError> {
        let size = self.output.size();
        let n = out.len() / size;
        let mut file = self
            .starts
            .partition_point(|&s| s <= from)
            .saturating_sub(1);
        let mut written = 0usize;
        while written < n {
            let f = self
                .files
                .get(file)
                .ok_or_else(|| DataError::Other(format!("token {from} is past the stream")))?;
            let local = from - self.starts[file];
            let take = ((f.tokens - local) as usize).min(n - written);
            let src = &f.mmap[local as usize * self.width..(local as usize + take) * self.width];
            let dst = &mut out[written * size..(written + take) * size];
            match (self.width, self.output) {
                (2, DType::I64) => {
                    convert::<2, 8>(src, dst, |t| i64::from(u16_le(t)).to_ne_bytes())
                }
                (2, _) => convert::<2, 4>(src, dst, |t| i32::from(u16_le(t)).to_ne_bytes()),
                (_, DType::I64) => {
                    convert::<4, 8>(src, dst, |t| i64::from(u32_le(t)).to_ne_bytes())
                }
                (_, _) => {
                    let mut bad = None;
                    convert::<4, 4>(src, dst, |t| {
                        let v = u32_le(t);
                        i32::try_from(v)
                            .unwrap_or_else(|_| {
                                bad.get_or_insert(v);
                                0
                            })
                            .to_ne_bytes()
                    });
                    if let Some(v) = bad {
                        return Err(DataError::InvalidFile {
                            path: f.path.clone(),
                            reason: format!(
                                "token {v} (near token {local} of the file) does not fit the \
                                 i32 output; use i64"
                            ),
                        });
                    }
                }
            }
            written += take;
            from += take as u64;
            file += 1;
        }
        Ok(())
    }

    /// Writes position and document ids of the `seq_len` tokens from `from`.
    fn write_documents(
        &self,
        from: u64,
        mut positions: Option<&mut [u8]>,
        mut ids: Option<&mut [u8]>,
    ) -> Result<(), DataError> {
        let Some(docs) = &self.documents else {
            return Ok(());
        };
        let size = self.output.size();
        let mut d = docs.partition_point(|&s| s <= from).saturating_sub(1);
        let first = d;
        for i in 0..self.seq_len {
            let t = from + i as u64;
            while docs.get(d + 1).is_some_and(|&s| s <= t) {
                d += 1;
            }
            let (pos, id) = (t - docs[d], (d - first) as u64);
            let slot = i * size..(i + 1) * size;
            if let Some(p) = positions.as_deref_mut() {
                write_int(&mut p[slot.clone()], pos, self.output, "position")?;
            }
            if let Some(x) = ids.as_deref_mut() {
                write_int(&mut x[slot], id, self.output, "document id")?;
            }
        }
        Ok(())
    }
}

fn u16_le(t: &[u8]) -> u16 {
    u16::from_le_bytes([t[0], t[1]])
}

fn u32_le(t: &[u8]) -> u32 {
    u32::from_le_bytes([t[0], t[1], t[2], t[3]])
}

fn convert<const W: usize, const S: usize>(
    src: &[u8],
    dst: &mut [u8],
    mut f: impl FnMut(&[u8]) -> [u8; S],
) {
    for (s, d) in src.chunks_exact(W).zip(dst.chunks_exact_mut(S)) {
        d.copy_from_slice(&f(s));
    }
}

fn write_int(out: &mut [u8], v: u64, dtype: DType, what: &str) -> Result<(), DataError> {
    let too_big = || {
        DataError::Other(format!(
            "a {what} of {v} does not fit the {dtype} output (a document longer than the \
             output's range); use i64"
        ))
    };
    if dtype == DType::I64 {
        out.copy_from_slice(&i64::try_from(v).map_err(|_| too_big())?.to_ne_bytes());
    } else {
        out.copy_from_slice(&i32::try_from(v).map_err(|_| too_big())?.to_ne_bytes());
    }
    Ok(())
}

impl Dataset for TokenSequences {
    type Item = Vec<Tensor>;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let mut out = Vec::with_capacity(self.fields.len());
        for (f, spec) in self.fields.iter().enumerate() {
            let mut t = Tensor::zeros(spec.dtype, spec.shape.dims())?;
            self.get_field_into(index, f, t.bytes_mut())?;
            out.push(t);
        }
        Ok(out)
    }

    /// Every field written straight into its batch slot.
    fn direct_plan(&self) -> Option<DirectPlan<'_>> {
        Some(DirectPlan::new(self))
    }
}

impl DirectDataset for TokenSequences {
    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn get_field_into(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        if index >= self.len {
            return Err(DataError::IndexOutOfRange {
                index,
                len: self.len,
                what: "token sequences",
            });
        }
        let spec = self.fields.get(field).ok_or(DataError::IndexOutOfRange {
            index: field,
            len: self.fields.len(),
            what: "fields",
        })?;
        let needed = spec.nbytes()?;
        if out.len() != needed {
            return Err(DataError::BufferTooSmall {
                what: "token sequence slot",
                needed,
                got: out.len(),
            });
        }
        let from = index as u64 * self.seq_len as u64;
        match self.names[field] {
            "input_ids" => self.copy_tokens(from, out),
            "targets" => self.copy_tokens(from + 1, out),
            "position_ids" => self.write_documents(from, Some(out), None),
            _ => self.write_documents(from, None, Some(out)),
        }
    }
}
