//! The crate's errors.

/// An error reading a sharded dataset. Every variant names where it happened: the URL, the
/// shard, the member or sample and the byte offset, as far as they are known.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// A URL or URL pattern that cannot be understood.
    #[error("invalid shard url {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Options of the global sample order, or of its split over ranks and workers, that
    /// cannot be used (a world size of 0, a rank out of range, ...).
    #[error("invalid sample order option `{option}`: {reason}")]
    Order {
        /// The option (`world_size`, `rank`, `num_workers`, `batch_size`, ...).
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A resume state that does not belong to this dataset and seed, or whose position lies
    /// beyond its epoch.
    #[error("cannot resume the sample order of epoch {epoch}: {reason}")]
    Resume {
        /// The epoch the state was taken in.
        epoch: u64,
        /// What does not match.
        reason: String,
    },
    /// A tar shard that cannot be read: truncated, a corrupt header, a member that ends early.
    #[error("webdataset shard {shard:?}: {reason} (member {member:?}, at byte {offset})")]
    Tar {
        /// The shard's name or URL, as given to the reader.
        shard: String,
        /// The member (file name in the tar) being read, when known.
        member: Option<String>,
        /// Byte offset in the tar: the member's header when a member is known, else the point
        /// where reading stopped.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A shard found damaged when the dataset was resolved (see
    /// [`DatasetSpec::damaged`](crate::dataset::DatasetSpec::damaged)), refused by a dataset
    /// that raises on samples it cannot read.
    #[error("damaged shard {shard:?}: {reason} (member {member:?}, at byte {offset})")]
    Damaged {
        /// The shard's URL.
        shard: String,
        /// The tar member at fault, when known.
        member: Option<String>,
        /// Byte offset in the shard where the damage starts.
        offset: u64,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A sample that breaks its format's rules: a field twice (WebDataset), a field that is
    /// required but missing, a field that does not decode as asked (any format; for a Parquet
    /// row the offset is the row's number).
    #[error("shard {shard:?}, sample {key:?} (at byte {offset}): {reason}")]
    Sample {
        /// The shard's name or URL.
        shard: String,
        /// The sample's `__key__`.
        key: String,
        /// Byte offset in the tar of the sample's first member header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An MDS dataset (its `index.json`) or shard that is malformed or disagrees with its index.
    #[error("mds shard {shard:?}{}: {reason} (at byte {offset})", sample.map(|s| format!(", sample {s}")).unwrap_or_default())]
    Mds {
        /// The shard's basename (or `index.json`).
        shard: String,
        /// The sample within the shard, when one is concerned.
        sample: Option<u64>,
        /// Byte offset in the shard (or in `index.json`) where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A Parquet shard that cannot be read (not Parquet, a codec this build lacks, damaged
    /// pages), or a row of it.
    #[error("parquet shard {shard:?}{}: {reason}", row.map(|r| format!(", row {r}")).unwrap_or_default())]
    Parquet {
        /// The shard's URL.
        shard: String,
        /// The row (the sample's index in the shard), when one is concerned.
        row: Option<u64>,
        /// What is wrong.
        reason: String,
    },
    /// An MDS shard compressed with a codec this reader does not decode.
    #[error(
        "mds shard {shard:?} is compressed with {codec:?}, which is not supported (only uncompressed shards are)"
    )]
    MdsCompression {
        /// The shard's compressed basename (or raw basename if none is given).
        shard: String,
        /// The codec named in `index.json` (`zstd`, `zstd:7`, `gz`, ...).
        codec: String,
    },
    /// Reading or writing a shard file failed.
    #[error("i/o error on shard file {path:?}: {source}")]
    ShardFile {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing shards failed for a reason other than I/O (a sample the format cannot hold).
    #[error("cannot write shard {shard:?}: {reason}")]
    Write {
        /// The shard being written (its file name).
        shard: String,
        /// What is wrong.
        reason: String,
    },
    /// A brace pattern that cannot be expanded.
    #[error("invalid shard url pattern {pattern:?} at byte {position}: {reason}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// The byte offset in the pattern where the problem starts.
        position: usize,
        /// What is wrong there.
        reason: String,
    },
    /// A client for a store could not be built (bad configuration or credentials settings).
    #[error("cannot open the store for {url}: {source}")]
    StoreConfig {
        /// A URL in that store.
        url: String,
        /// object_store's error.
        #[source]
        source: object_store::Error,
    },
    /// A request failed for good: a permanent error (not found, denied, a 4xx answer other
    /// than 408 and 429), or transient errors that went on through every attempt or past the
    /// retry time budget (the store's `Timeouts::retry_timeout`).
    #[error(
        "{op} of {url}{} failed after {attempts} attempt(s): {source}",
        endpoint.as_ref().map(|e| format!(" (endpoint {e})")).unwrap_or_default()
    )]
    Fetch {
        /// What was being done: `get` (a range read), `head`, `list`, `download`.
        op: &'static str,
        /// The object's URL (for a listing, the prefix's).
        url: String,
        /// The shard's name (its file name; for a listing, the prefix).
        shard: String,
        /// The endpoint the requests went to (`https://s3.us-east-1.amazonaws.com`,
        /// `http://127.0.0.1:9000`), when the store built the client itself.
        endpoint: Option<String>,
        /// How many requests were made.
        attempts: u32,
        /// The last error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A listing did not contain a shard that the pattern names.
    #[error("shard {url} does not exist (not in the listing of {prefix})")]
    MissingShard {
        /// The shard's URL.
        url: String,
        /// The prefix that was listed.
        prefix: String,
    },
    /// A download ended with another size than the object's.
    #[error("download of {url} ended with {actual} bytes, but the object has {expected}")]
    SizeMismatch {
        /// The object's URL.
        url: String,
        /// The object's size.
        expected: u64,
        /// The bytes received.
        actual: u64,
    },
    /// A local file operation failed.
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        /// What was being done (`create`, `rename`, `lock`, …).
        op: &'static str,
        /// The local path.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime behind the stores could not be used.
    #[error("shard store runtime: {reason}")]
    Runtime {
        /// Why.
        reason: String,
    },
    /// A cache budget smaller than a shard it must hold.
    #[error(
        "shard cache budget of {budget} bytes is smaller than shard {url} of {shard_size} bytes"
    )]
    BudgetTooSmall {
        /// The cache's byte budget.
        budget: u64,
        /// The largest shard.
        url: String,
        /// Its size in bytes.
        shard_size: u64,
    },
    /// The cache stayed full of shards in use for longer than the wait limit.
    #[error(
        "shard cache has no room for {url} ({needed} bytes) after waiting {waited:?}: \
         budget {budget} bytes, {leased} bytes held by readers, {reserved} bytes downloading"
    )]
    CacheFull {
        /// The shard that did not fit.
        url: String,
        /// Its size.
        needed: u64,
        /// The cache's budget.
        budget: u64,
        /// Bytes of shards leased by readers (not evictable).
        leased: u64,
        /// Bytes reserved by downloads in progress.
        reserved: u64,
        /// How long the request waited.
        waited: std::time::Duration,
    },
    /// A serialised value (a shard list, the cache's index) that cannot be read.
    #[error("cannot read the {what} from json: {source}")]
    Json {
        /// What was being read.
        what: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
}

/// The byte offset in `text` of a JSON error `e` (serde_json reports a line and a column), for
/// errors that name where an index file is malformed.
pub(crate) fn json_error_offset(text: &str, e: &serde_json::Error) -> u64 {
    let line_start: usize = text
        .split_inclusive('\n')
        .take(e.line().saturating_sub(1))
        .map(str::len)
        .sum();
    (line_start + e.column().saturating_sub(1)) as u64
}
