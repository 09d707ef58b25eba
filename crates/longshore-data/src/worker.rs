//! Which worker a piece of code runs on, and that worker's seeded random generator.
//!
//! The loader runs workers as threads. On entering a worker thread it calls
//! [`enter`] with that worker's [`WorkerInfo`]; from then on [`current`] returns it
//! (PyTorch's `get_worker_info()`) and [`with_rng`] hands out the worker's generator,
//! seeded from `WorkerInfo::seed`, which random transforms draw from.

use std::cell::RefCell;

use rand_chacha::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::rng::Rng;

/// Identity of a loader worker, handed to iterable datasets so they can shard themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// This worker's index, `0..num_workers`.
    pub id: usize,
    /// How many workers the loader runs.
    pub num_workers: usize,
    /// This worker's seed (PyTorch: `base_seed + id`).
    pub seed: u64,
    /// The loader epoch this worker's stream is opened for (0 outside a loader): an
    /// [`IterableDataset`](crate::IterableDataset) selects the stream of this epoch with it,
    /// rather than with state set on the dataset, which a next epoch started ahead would
    /// change under a stream still being read.
    #[serde(default)]
    pub epoch: u64,
}

impl WorkerInfo {
    /// Describes worker `id` of `num_workers`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] when `num_workers == 0` or `id >= num_workers`.
    pub fn new(id: usize, num_workers: usize, seed: u64) -> Result<WorkerInfo, DataError> {
        if num_workers == 0 {
            return Err(DataError::arg("num_workers", "must be at least 1"));
        }
        if id >= num_workers {
            return Err(DataError::arg(
                "id",
                format!("worker id {id} must be less than num_workers {num_workers}"),
            ));
        }
        Ok(WorkerInfo {
            id,
            num_workers,
            seed,
            epoch: 0,
        })
    }

    /// The only worker of a single-threaded load (`id 0` of `1`).
    pub fn single(seed: u64) -> WorkerInfo {
        WorkerInfo {
            id: 0,
            num_workers: 1,
            seed,
            epoch: 0,
        }
    }

    /// The same worker, opening its stream for the loader's epoch `epoch`.
    #[must_use]
    pub fn with_epoch(mut self, epoch: u64) -> WorkerInfo {
        self.epoch = epoch;
        self
    }

    /// The indices of `0..len` this worker owns when items are dealt round-robin:
    /// `id, id + num_workers, ...`.
    pub fn shard(&self, len: usize) -> impl Iterator<Item = usize> + Send + use<> {
        (self.id.min(len)..len).step_by(self.num_workers.max(1))
    }
}

struct Context {
    info: WorkerInfo,
    rng: Rng,
}

thread_local! {
    static EPOCH: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    static LOADER_SEED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
    static FALLBACK_RNG: RefCell<Option<Rng>> = const { RefCell::new(None) };
}

/// Restores the previous worker context of this thread when dropped.
#[derive(Debug)]
#[must_use = "the worker context ends when the guard is dropped"]
pub struct WorkerGuard {
    previous: Option<(WorkerInfo, Rng)>,
}

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        let previous = self
            .previous
            .take()
            .map(|(info, rng)| Context { info, rng });
        // `try_with` fails only during thread teardown, when there is nothing to restore.
        let _ = CONTEXT.try_with(|c| *c.borrow_mut() = previous);
    }
}

/// Marks this thread as worker `info` until the guard is dropped, and seeds its
/// generator from `info.seed`.
pub fn enter(info: WorkerInfo) -> WorkerGuard {
    tracing::trace!(target: "longshore::data", worker_id = info.id, worker_seed = info.seed, "enter worker");
    let new = Context {
        info,
        rng: Rng::seed_from_u64(info.seed),
    };
    let previous = CONTEXT.with(|c| c.borrow_mut().replace(new));
    WorkerGuard {
        previous: previous.map(|c| (c.info, c.rng)),
    }
}

/// Restores the previous loader epoch of this thread when dropped (see [`enter_epoch`]).
#[derive(Debug)]
#[must_use = "the epoch ends when the guard is dropped"]
pub struct EpochGuard {
    previous: Option<u64>,
}

impl Drop for EpochGuard {
    fn drop(&mut self) {
        let _ = EPOCH.try_with(|e| e.set(self.previous));
    }
}

/// Marks the samples this thread loads until the guard is dropped as samples of the loader's
/// epoch `epoch`. The loader does it around every batch (on its workers and on the consuming
/// thread alike), so a dataset whose samples depend on the epoch reads it with [`epoch`]
/// instead of state set on the dataset between epochs, which the workers of a loader that
/// starts the next epoch's batches early (or keeps persistent workers, as in PyTorch) may not
/// see in time.
pub fn enter_epoch(epoch: u64) -> EpochGuard {
    EpochGuard {
        previous: EPOCH.with(|e| e.replace(Some(epoch))),
    }
}

/// The loader epoch the sample being loaded on this thread belongs to, if a loader is loading
/// it (see [`enter_epoch`]).
pub fn epoch() -> Option<u64> {
    EPOCH.with(std::cell::Cell::get)
}

/// Restores the previous loader seed of this thread when dropped (see [`enter_seed`]).
#[derive(Debug)]
#[must_use = "the seed is unset when the guard is dropped"]
pub struct SeedGuard {
    previous: Option<u64>,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        let _ = LOADER_SEED.try_with(|s| s.set(self.previous));
    }
}

/// Marks this thread as loading for a loader whose seed is `seed` until the guard is dropped.
/// The loader does it on its workers and on the thread that loads without workers, so that a
/// sample's random transforms can draw from a generator of its own, a pure function of
/// (loader seed, epoch, sample) ([`loader_seed`], [`epoch`]): the same draws whichever worker
/// loads it, in an epoch run whole or resumed.
pub fn enter_seed(seed: u64) -> SeedGuard {
    SeedGuard {
        previous: LOADER_SEED.with(|s| s.replace(Some(seed))),
    }
}

/// The seed of the loader loading on this thread, if one is (see [`enter_seed`]).
pub fn loader_seed() -> Option<u64> {
    LOADER_SEED.with(std::cell::Cell::get)
}

/// The text of a caught panic's payload (`std::panic::catch_unwind`'s error): the message
/// of `panic!("...")` with or without arguments, or a placeholder for other payloads. The
/// loader's workers, decoders and the Python binding report panics with it.
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The worker this thread is running as, if any (PyTorch's `get_worker_info()`).
pub fn current() -> Option<WorkerInfo> {
    CONTEXT.with(|c| c.borrow().as_ref().map(|c| c.info))
}

/// Runs `f` with this worker's generator. Outside a worker, a per-thread generator
/// seeded with 0 is used, so single-threaded runs are reproducible too.
///
/// The generator is taken out of the thread's context while `f` runs, so a nested
/// call (a transform that reads another transformed dataset) does not panic: it
/// draws from the per-thread fallback generator instead.
pub fn with_rng<R>(f: impl FnOnce(&mut Rng) -> R) -> R {
    if let Some(mut ctx) = CONTEXT.with(|c| c.borrow_mut().take()) {
        let out = f(&mut ctx.rng);
        CONTEXT.with(|c| *c.borrow_mut() = Some(ctx));
        return out;
    }
    let mut rng = FALLBACK_RNG
        .with(|r| r.borrow_mut().take())
        .unwrap_or_else(|| Rng::seed_from_u64(0));
    let out = f(&mut rng);
    FALLBACK_RNG.with(|r| *r.borrow_mut() = Some(rng));
    out
}
