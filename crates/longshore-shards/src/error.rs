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
}
