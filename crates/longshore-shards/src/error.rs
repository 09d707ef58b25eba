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
    /// A request failed for good: a permanent error (not found, denied), or transient errors
    /// that went on through every attempt.
    #[error("{op} of shard {shard} ({url}) failed after {attempts} attempt(s): {source}")]
    Fetch {
        /// What was being done: `get`, `head`, `list`, `download`.
        op: &'static str,
        /// The object's URL.
        url: String,
        /// The shard's name (its file name).
        shard: String,
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
