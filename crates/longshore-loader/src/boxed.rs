//! [`BoxedFetch`]: any dataset kind behind one type, so that loaders of different datasets
//! share one type ([`BoxedLoader`](crate::BoxedLoader)), built by the builders'
//! `build_boxed`.
//!
//! The worker-side interface ([`sealed::Sealed`](crate::fetch::sealed::Sealed)) has a generic
//! per-worker state; it is erased here behind an object-safe pair of traits, one virtual call
//! per batch.

use std::fmt;
use std::time::Duration;

use longshore_data::WorkerInfo;

use crate::engine::{Outcome, Task};
use crate::fetch::sealed::{EpochSeam, Sealed};

/// The object-safe side of a [`Sealed`] fetch.
trait ErasedFetch<T>: Send + Sync + 'static {
    fn indexed(&self) -> bool;
    fn dataset_len(&self) -> usize;
    fn output_samples(&self, out: &T) -> usize;
    fn output_bytes(&self, out: &T) -> usize;
    fn output_pinned_wait(&self, out: &T) -> Duration;
    fn stream_batching(&self) -> Option<(usize, bool)>;
    fn seam(&self) -> Option<&dyn EpochSeam>;
    fn worker<'a>(&'a self, info: WorkerInfo) -> Box<dyn ErasedWorker<T> + 'a>;
    fn describe(&self) -> &'static str;
}

/// One worker's state for an epoch, with the fetch it belongs to.
trait ErasedWorker<T> {
    fn fetch(&mut self, task: &Task, cancelled: &dyn Fn() -> bool) -> (Outcome<T>, u64);
}

struct Bound<'a, F: Sealed> {
    fetch: &'a F,
    state: F::Worker<'a>,
}

impl<F: Sealed> ErasedWorker<F::Out> for Bound<'_, F> {
    fn fetch(&mut self, task: &Task, cancelled: &dyn Fn() -> bool) -> (Outcome<F::Out>, u64) {
        self.fetch.fetch(&mut self.state, task, cancelled)
    }
}

impl<F: Sealed> ErasedFetch<F::Out> for F {
    fn indexed(&self) -> bool {
        Sealed::indexed(self)
    }
    fn dataset_len(&self) -> usize {
        Sealed::dataset_len(self)
    }
    fn output_samples(&self, out: &F::Out) -> usize {
        Sealed::output_samples(self, out)
    }
    fn output_bytes(&self, out: &F::Out) -> usize {
        Sealed::output_bytes(self, out)
    }
    fn output_pinned_wait(&self, out: &F::Out) -> Duration {
        Sealed::output_pinned_wait(self, out)
    }
    fn stream_batching(&self) -> Option<(usize, bool)> {
        Sealed::stream_batching(self)
    }
    fn seam(&self) -> Option<&dyn EpochSeam> {
        Sealed::seam(self)
    }
    fn worker<'a>(&'a self, info: WorkerInfo) -> Box<dyn ErasedWorker<F::Out> + 'a> {
        Box::new(Bound {
            fetch: self,
            state: Sealed::worker(self, info),
        })
    }
    fn describe(&self) -> &'static str {
        std::any::type_name::<F>()
    }
}

/// One worker's state of a [`BoxedFetch`] for an epoch.
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub struct BoxedWorker<'a, T>(Box<dyn ErasedWorker<T> + 'a>);

/// The worker side of any loader whose batches are `T`, its dataset's type erased: what a
/// [`BoxedLoader`](crate::BoxedLoader) fetches with.
pub struct BoxedFetch<T> {
    inner: Box<dyn ErasedFetch<T>>,
}

impl<T: Send + 'static> BoxedFetch<T> {
    pub(crate) fn new<F: Sealed<Out = T>>(fetch: F) -> Self {
        Self {
            inner: Box::new(fetch),
        }
    }
}

impl<T: 'static> fmt::Debug for BoxedFetch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxedFetch")
            .field(&self.inner.describe())
            .finish()
    }
}

impl<T: Send + 'static> Sealed for BoxedFetch<T> {
    type Out = T;
    type Worker<'a> = BoxedWorker<'a, T>;

    fn indexed(&self) -> bool {
        self.inner.indexed()
    }
    fn dataset_len(&self) -> usize {
        self.inner.dataset_len()
    }
    fn output_samples(&self, out: &T) -> usize {
        self.inner.output_samples(out)
    }
    fn output_bytes(&self, out: &T) -> usize {
        self.inner.output_bytes(out)
    }
    fn output_pinned_wait(&self, out: &T) -> Duration {
        self.inner.output_pinned_wait(out)
    }
    fn stream_batching(&self) -> Option<(usize, bool)> {
        self.inner.stream_batching()
    }
    fn seam(&self) -> Option<&dyn EpochSeam> {
        self.inner.seam()
    }
    fn worker<'a>(&'a self, info: WorkerInfo) -> Self::Worker<'a> {
        BoxedWorker(self.inner.worker(info))
    }
    fn fetch(
        &self,
        worker: &mut Self::Worker<'_>,
        task: &Task,
        cancelled: &dyn Fn() -> bool,
    ) -> (Outcome<T>, u64) {
        worker.0.fetch(task, cancelled)
    }
}
