//! The error type of `longshore-data`.

use std::path::PathBuf;

use crate::dtype::DType;

/// Everything that can go wrong while reading, sampling or collating data.
///
/// Messages are lowercase and carry the context a user needs: the file, byte
/// offset, sample index or argument at fault. A variant that wraps a cause returns
/// it from [`std::error::Error::source`] and does not repeat it in its own message,
/// so a report that walks the chain (`anyhow`'s `{:#}`) prints each cause once.
///
/// User code (a custom dataset or transform) returns its own failures with `?` on a
/// `std::io::Error` ([`DataError::UnnamedIo`]), with [`DataError::custom`] to keep any
/// other error as the cause, or as a plain [`DataError::Other`] message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// An I/O operation on a file failed.
    #[error("i/o error on {path}")]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A `.npy` header could not be parsed or describes something unsupported.
    #[error("invalid .npy file {path}")]
    Npy {
        /// The file whose header is at fault.
        path: PathBuf,
        /// What is wrong with the header.
        #[source]
        source: NpyError,
    },
    /// A file is shorter than its header or layout says it must be.
    #[error("truncated file {path}: expected at least {expected} bytes, found {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header or layout requires.
        expected: u64,
        /// Bytes actually present.
        actual: u64,
    },
    /// A file's size is not consistent with its record layout.
    #[error("invalid file {path}: {reason}")]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// An index was outside a dataset or sampler.
    #[error("index {index} out of range for {what} of length {len}")]
    IndexOutOfRange {
        /// The requested index.
        index: usize,
        /// The length of the indexed collection.
        len: usize,
        /// What was indexed (`"dataset"`, `"subset"`, `"batch"`...).
        what: &'static str,
    },
    /// A dataset or batch that must hold at least one element is empty.
    #[error("{what} is empty")]
    Empty {
        /// What was empty.
        what: &'static str,
    },
    /// An argument is outside its valid range.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The argument's name, as in the API.
        name: &'static str,
        /// Why the value was refused.
        reason: String,
    },
    /// A tensor was read as a type that does not match its dtype.
    #[error("dtype mismatch for {what}: stored as {actual}, requested {requested}")]
    DTypeMismatch {
        /// What was read (tensor name or position).
        what: String,
        /// The stored dtype.
        actual: DType,
        /// The dtype of the requested Rust type.
        requested: DType,
    },
    /// Samples of one batch, or shards of one dataset, disagree in shape or dtype.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(String),
    /// A byte slice is not aligned for the element type it is read as.
    #[error("misaligned data for {what}: address is not a multiple of {align} bytes")]
    Misaligned {
        /// What was read.
        what: String,
        /// The alignment required.
        align: usize,
    },
    /// An output buffer is smaller than the bytes to be written into it.
    #[error("buffer too small for {what}: need {needed} bytes, got {got}")]
    BufferTooSmall {
        /// What was to be written.
        what: &'static str,
        /// Bytes required.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// Sampler state from a checkpoint does not fit this sampler.
    #[error("cannot restore sampler state: {0}")]
    StateMismatch(String),
    /// A stream position (an [`IterableDataset`](crate::IterableDataset)'s resume point, in a
    /// loader's checkpoint) does not fit this dataset, epoch or layout: the message names
    /// what differs.
    #[error("cannot resume the dataset's stream: {0}")]
    StreamPosition(String),
    /// An I/O error with no file to name, such as one returned with `?` by user code.
    #[error("i/o error")]
    UnnamedIo(#[from] std::io::Error),
    /// An error raised by user code (a transform or a custom dataset), with its cause;
    /// built by [`DataError::custom`].
    #[error("{context}")]
    Custom {
        /// What was being done (`"decoding sample 12"`).
        context: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// An error raised by user code (a transform or a custom dataset), as a message
    /// only; use [`DataError::custom`] to keep a cause.
    #[error("{0}")]
    Other(String),
    /// A failure that no skip can absorb: the dataset cannot yield what it promised (an
    /// iterable dataset with no readable sample left to pad a rank's stream with). The loader
    /// fails the batch under every sample-error policy of `longshore-loader`,
    /// `Skip` included; built by [`DataError::unskippable`].
    #[error("{context}")]
    Unskippable {
        /// What cannot be done (`"rank 0 worker 1 cannot pad its stream"`).
        context: String,
        /// The last underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl DataError {
    /// An error of user code that keeps `source` as its cause: `context` says what was
    /// being done, and `source()` returns `source`.
    ///
    /// ```
    /// use std::error::Error as _;
    /// use longshore_data::DataError;
    ///
    /// let parse = "x".parse::<i32>().unwrap_err();
    /// let err = DataError::custom("reading the label of sample 3", parse);
    /// assert_eq!(err.to_string(), "reading the label of sample 3");
    /// assert_eq!(err.source().unwrap().to_string(), "invalid digit found in string");
    /// ```
    pub fn custom(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        DataError::Custom {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A failure no skip absorbs ([`DataError::Unskippable`]).
    ///
    /// ```
    /// use longshore_data::DataError;
    ///
    /// let err = DataError::unskippable("no readable sample left to pad with", "every read failed");
    /// assert!(err.is_unskippable());
    /// assert!(!DataError::Other("one bad sample".into()).is_unskippable());
    /// ```
    pub fn unskippable(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        DataError::Unskippable {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Whether this failure must fail its batch under every sample-error policy.
    pub fn is_unskippable(&self) -> bool {
        matches!(self, DataError::Unskippable { .. })
    }

    /// Builds an [`DataError::InvalidArgument`].
    pub(crate) fn arg(name: &'static str, reason: impl Into<String>) -> Self {
        DataError::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }

    /// Builds an [`DataError::IndexOutOfRange`].
    pub(crate) fn oob(index: usize, len: usize, what: &'static str) -> Self {
        DataError::IndexOutOfRange { index, len, what }
    }
}

/// Why a `.npy` header was refused. Offsets are byte offsets in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The file does not start with `\x93NUMPY`.
    #[error("bad magic string at offset 0 (not a .npy file)")]
    BadMagic,
    /// The preamble or header ends before its declared length.
    #[error("header truncated: need {needed} bytes, file has {actual}")]
    Truncated {
        /// Bytes required to read the header.
        needed: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The format version is not 1.0, 2.0 or 3.0.
    #[error("unsupported format version {major}.{minor}")]
    UnsupportedVersion {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The header text is not valid (ASCII for 1.0/2.0, UTF-8 for 3.0).
    #[error("header text at offset {offset} is not valid {encoding}")]
    BadEncoding {
        /// Offset of the header text.
        offset: usize,
        /// The encoding the version requires.
        encoding: &'static str,
    },
    /// The header dictionary could not be parsed.
    #[error("header syntax error at offset {offset}: {reason}")]
    Syntax {
        /// Byte offset in the file.
        offset: usize,
        /// What was expected.
        reason: String,
    },
    /// A required key (`descr`, `fortran_order`, `shape`) is absent.
    #[error("header lacks the key '{0}'")]
    MissingKey(&'static str),
    /// The dtype descriptor is not one this crate reads.
    #[error("unsupported dtype descriptor '{0}' (supported: bool, u1-u8, i1-i8, f2, f4, f8)")]
    UnsupportedDType(String),
    /// The array is stored in Fortran (column-major) order.
    #[error("fortran_order arrays are not supported (shape {0:?}); save with np.ascontiguousarray")]
    FortranOrder(Vec<usize>),
    /// The number of bytes the shape implies overflows.
    #[error("shape {0:?} is too large")]
    ShapeOverflow(Vec<usize>),
}
