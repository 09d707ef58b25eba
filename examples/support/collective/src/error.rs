//! Errors of the collectives.

use longshore_transfer::TransferError;

/// Everything that can go wrong when setting up a communicator or running a collective.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A collective operation (e.g. an all-reduce) or the set-up of a communicator failed: a
    /// rank left or timed out, ranks disagreed on sizes, the rendezvous failed, or NCCL
    /// reported an error.
    #[error("{op} on rank {rank} of {world_size}: {reason}")]
    Rank {
        /// The operation, e.g. `all_reduce_sum` or `nccl rendezvous`.
        op: &'static str,
        /// This process's (or thread's) rank.
        rank: usize,
        /// The number of ranks.
        world_size: usize,
        /// What went wrong, naming the ranks involved.
        reason: String,
    },
    /// Checking the arguments or using the device failed in longshore-transfer's terms: an
    /// invalid argument, a region out of bounds, a stream or buffer of another device, NCCL
    /// not loadable (`LibraryUnavailable`), a CUDA driver call.
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

/// Result alias of this crate.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;
