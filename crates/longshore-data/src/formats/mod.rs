//! File formats read through read-only memory maps: `.npy` arrays and shards of them
//! ([`npy`]), files of fixed-size records ([`records`]), and flat token files cut into
//! training sequences ([`tokens`]).
//!
//! Lengths are checked against the header or record layout when a file is opened, so
//! every later read is in bounds.
//!
//! **Files must not be modified or truncated while mapped.** Another process
//! shrinking a mapped file makes reads of the lost pages fault (`SIGBUS`); this is
//! the caveat every memory map carries and cannot be checked for. The one `unsafe`
//! call behind it lives in a private module of this one, the only place in the
//! crate where unsafe code is allowed.

use std::path::Path;

use memmap2::Mmap;

use crate::DataError;

// The only module of the crate allowed unsafe code: the `memmap2` call that maps a file.
#[allow(unsafe_code)]
mod mmap;
pub mod npy;
pub mod records;
pub mod tokens;

pub(crate) use mmap::open_map;
pub use npy::{NpyArray, NpyDataset, NpyHeader, NpyShards, write_npy};
pub use records::{RecordDataset, RecordField, RecordLayout};
pub use tokens::{TokenSequences, TokenSequencesBuilder, TokenWriter};

/// How a mapped file will be read: passed to the kernel as an `madvise` hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AccessPattern {
    /// No particular pattern.
    Normal,
    /// Front to back (sequential sampler): aggressive read-ahead.
    Sequential,
    /// Random order (shuffled sampler): no read-ahead.
    Random,
    /// Will be needed soon: start reading it in now.
    WillNeed,
}

pub(crate) fn advise(mmap: &Mmap, pattern: AccessPattern, path: &Path) -> Result<(), DataError> {
    #[cfg(unix)]
    {
        use memmap2::Advice;
        let advice = match pattern {
            AccessPattern::Normal => Advice::Normal,
            AccessPattern::Sequential => Advice::Sequential,
            AccessPattern::Random => Advice::Random,
            AccessPattern::WillNeed => Advice::WillNeed,
        };
        if mmap.is_empty() {
            return Ok(());
        }
        mmap.advise(advice).map_err(|source| DataError::Io {
            path: path.to_owned(),
            source,
        })?;
        tracing::debug!(target: "longshore::data", path = %path.display(), ?pattern, "madvise");
    }
    #[cfg(not(unix))]
    {
        let _ = (mmap, pattern, path);
    }
    Ok(())
}
