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
    /// A WebDataset sample that breaks the format's rules: a field twice, a field that is
    /// required but missing, a field that does not decode as asked.
    #[error("webdataset shard {shard:?}, sample {key:?} (at byte {offset}): {reason}")]
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
}
