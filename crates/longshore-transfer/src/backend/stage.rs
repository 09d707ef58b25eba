//! What every backend's staged upload shares: the plan of one upload (pieces, threads, blocks)
//! and the first error of its threads. The staging loops themselves are in `crate::staging`
//! (on the caller's stream) and `cuda::staging` (one stream per thread).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use longshore_host::PinnedPool;

use crate::error::{Result, TransferError};

/// One staged upload, as its stager cut it.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// The stager's pool of blocks.
    pub(crate) pool: &'a PinnedPool,
    /// Bytes per block (every lease is this one size class).
    pub(crate) block_bytes: usize,
    /// Bytes per piece (the last one may be shorter).
    pub(crate) piece: usize,
    /// Number of pieces.
    pub(crate) pieces: usize,
    /// Threads this upload uses, the caller's included.
    pub(crate) threads: usize,
    /// The stager's thread count (lanes must cover it).
    pub(crate) threads_max: usize,
    /// Pieces each thread may have in flight.
    pub(crate) depth: usize,
    /// The stager's threads besides the caller's.
    pub(crate) workers: Option<&'a rayon::ThreadPool>,
    /// The caller's stream, for messages.
    pub(crate) stream_id: u64,
}

impl Plan<'_> {
    /// The byte range of piece `i` in the source.
    pub(crate) fn range(&self, i: usize, len: usize) -> std::ops::Range<usize> {
        let start = i * self.piece;
        start..(start + self.piece).min(len)
    }

    /// Runs `work(t)` for every thread `t` of the upload, `t = 0` on the caller's thread, and
    /// returns when all have.
    pub(crate) fn run(&self, work: impl Fn(usize) + Sync) {
        match self.workers {
            Some(workers) if self.threads > 1 => workers.in_place_scope(|s| {
                for t in 1..self.threads {
                    let work = &work;
                    s.spawn(move |_| work(t));
                }
                work(0);
            }),
            _ => work(0),
        }
    }
}

/// The first error of the threads of one upload; once one is recorded the others stop.
#[derive(Debug, Default)]
pub(crate) struct FirstError {
    stop: AtomicBool,
    first: Mutex<Option<TransferError>>,
}

impl FirstError {
    pub(crate) fn record(&self, e: TransferError) {
        self.stop.store(true, Ordering::Relaxed);
        self.first
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(crate) fn into_result(self) -> Result<()> {
        match self.first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
