//! [`FaultyStore`]: an [`ObjectStore`] around another that injects faults into read requests,
//! for tests and benchmarks of the retry and resume paths.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use longshore_data::seed::SplitMix64;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// A fault injected into one read request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The request fails as with HTTP 500 Internal Server Error.
    InternalError,
    /// The request fails as with HTTP 503 Service Unavailable.
    Unavailable,
    /// The request fails as with HTTP 429 / S3 `SlowDown` (503 with that code).
    SlowDown,
    /// The request times out.
    Timeout,
    /// The response starts, but its body ends with a connection reset after `after` bytes.
    /// (A request without a body, `HEAD` or a listing, that draws it from a plan passes.)
    CutBody {
        /// Bytes delivered before the reset.
        after: u64,
    },
    /// The response starts, but its body stops after `after` bytes and never ends.
    StallBody {
        /// Bytes delivered before the stall.
        after: u64,
    },
}

impl Fault {
    fn status(self) -> Option<u16> {
        match self {
            Self::InternalError => Some(500),
            Self::Unavailable => Some(503),
            Self::SlowDown => Some(429),
            _ => None,
        }
    }
}

/// The error a [`FaultyStore`] returns for an injected fault (as the source of an
/// `object_store::Error::Generic`, like the HTTP clients' errors).
#[derive(Debug, Clone, thiserror::Error)]
#[error("injected fault {fault:?} on {request} (status {status:?})")]
pub struct InjectedFault {
    /// The fault.
    pub fault: Fault,
    /// The request it hit (`get path`, `head path`, `list prefix`).
    pub request: String,
    /// The HTTP status it stands for, if any.
    pub status: Option<u16>,
}

/// For a seeded schedule: the chance of each fault per read request. Chances add up; the
/// rest of the requests pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultRates {
    /// 500 or 503 (half each).
    pub server_error: f64,
    /// 429 SlowDown.
    pub slow_down: f64,
    /// A timeout.
    pub timeout: f64,
    /// A body cut at a uniformly drawn byte (requests with a body only).
    pub cut_body: f64,
    /// A body that stalls (never ends) at a uniformly drawn byte (requests with a body only):
    /// the reader's stall timeout must notice it.
    pub stall_body: f64,
}

/// Counts of the requests a [`FaultyStore`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// `GET`s with a body (whole objects and ranges).
    pub gets: u64,
    /// `HEAD`s.
    pub heads: u64,
    /// Listings.
    pub lists: u64,
    /// Listings that failed by an injected fault (`lists - failed_lists` listings were
    /// answered).
    pub failed_lists: u64,
    /// Faults injected.
    pub injected: u64,
    /// The most `GET` bodies in flight at once (from request to the body's end or drop).
    pub max_in_flight_gets: u64,
}

#[derive(Debug)]
enum Schedule {
    Plan(VecDeque<Option<Fault>>),
    Always(Fault),
    Seeded { rng: SplitMix64, rates: FaultRates },
}

/// An [`ObjectStore`] that passes every request to `inner`, injecting faults into read
/// requests (`GET`, `HEAD`, listings) by an explicit plan, always, or by a seeded random
/// schedule. Writes pass untouched. For tests and benchmarks; it adds a mutex per read.
///
/// ```
/// use std::sync::Arc;
/// use longshore_shards::store::{Fault, FaultyStore};
/// let store = FaultyStore::with_plan(
///     Arc::new(object_store::memory::InMemory::new()),
///     [Some(Fault::Unavailable), None, Some(Fault::CutBody { after: 10 })],
/// );
/// assert_eq!(store.stats().injected, 0);
/// ```
#[derive(Debug)]
pub struct FaultyStore {
    inner: std::sync::Arc<dyn ObjectStore>,
    schedule: Mutex<Schedule>,
    gets: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    failed_lists: AtomicU64,
    injected: AtomicU64,
    latency_us: AtomicU64,
    in_flight: std::sync::Arc<(AtomicU64, AtomicU64)>,
}

/// Counts a `GET` in flight until dropped (with its body).
struct InFlight(std::sync::Arc<(AtomicU64, AtomicU64)>);

impl InFlight {
    fn enter(counters: &std::sync::Arc<(AtomicU64, AtomicU64)>) -> Self {
        let now = counters.0.fetch_add(1, Ordering::SeqCst) + 1;
        counters.1.fetch_max(now, Ordering::SeqCst);
        Self(std::sync::Arc::clone(counters))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultyStore {
    fn new(inner: std::sync::Arc<dyn ObjectStore>, schedule: Schedule) -> Self {
        Self {
            inner,
            schedule: Mutex::new(schedule),
            gets: AtomicU64::new(0),
            heads: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            failed_lists: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            in_flight: std::sync::Arc::default(),
        }
    }

    /// Delays every `GET` (not `HEAD`s or listings) by `latency` before passing it on, as a
    /// far store would.
    pub fn set_latency(&self, latency: std::time::Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.store(us, Ordering::Relaxed);
    }

    /// Each read request takes the next entry of `plan` (`None`: no fault); once the plan
    /// is used up, requests pass. [`push`](Self::push) adds entries.
    pub fn with_plan(
        inner: std::sync::Arc<dyn ObjectStore>,
        plan: impl IntoIterator<Item = Option<Fault>>,
    ) -> Self {
        Self::new(inner, Schedule::Plan(plan.into_iter().collect()))
    }

    /// Every read request gets `fault`.
    pub fn always(inner: std::sync::Arc<dyn ObjectStore>, fault: Fault) -> Self {
        Self::new(inner, Schedule::Always(fault))
    }

    /// Faults drawn per read request at `rates`, from a generator seeded with `seed` (the
    /// same seed and request order give the same faults).
    pub fn seeded(inner: std::sync::Arc<dyn ObjectStore>, seed: u64, rates: FaultRates) -> Self {
        Self::new(
            inner,
            Schedule::Seeded {
                rng: SplitMix64::new(seed),
                rates,
            },
        )
    }

    /// Appends entries to the plan (replacing an `always` or seeded schedule by the plan).
    pub fn push(&self, plan: impl IntoIterator<Item = Option<Fault>>) {
        let mut s = self.schedule.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *s {
            Schedule::Plan(q) => q.extend(plan),
            other => *other = Schedule::Plan(plan.into_iter().collect()),
        }
    }

    /// Requests seen and faults injected so far.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            gets: self.gets.load(Ordering::Relaxed),
            heads: self.heads.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            failed_lists: self.failed_lists.load(Ordering::Relaxed),
            injected: self.injected.load(Ordering::Relaxed),
            max_in_flight_gets: self.in_flight.1.load(Ordering::SeqCst),
        }
    }

    /// The fault for the next read request, if any, and the cut position of a seeded
    /// cut as millionths of the body.
    fn next_fault(&self, has_body: bool) -> Option<(Fault, Option<u64>)> {
        let mut s = self.schedule.lock().unwrap_or_else(|p| p.into_inner());
        let drawn = match &mut *s {
            Schedule::Plan(q) => q.pop_front().flatten().map(|f| (f, None)),
            Schedule::Always(f) => Some((*f, None)),
            Schedule::Seeded { rng, rates } => {
                let u = unit(rng.next_u64());
                let r = *rates;
                let edges = [
                    r.server_error,
                    r.server_error + r.slow_down,
                    r.server_error + r.slow_down + r.timeout,
                    r.server_error + r.slow_down + r.timeout + r.cut_body,
                    r.server_error + r.slow_down + r.timeout + r.cut_body + r.stall_body,
                ];
                if u < edges[0] {
                    let f = if rng.next_u64() & 1 == 0 {
                        Fault::InternalError
                    } else {
                        Fault::Unavailable
                    };
                    Some((f, None))
                } else if u < edges[1] {
                    Some((Fault::SlowDown, None))
                } else if u < edges[2] {
                    Some((Fault::Timeout, None))
                } else if u < edges[3] {
                    let at = rng.next_u64() % 1_000_000;
                    Some((Fault::CutBody { after: 0 }, Some(at)))
                } else if u < edges[4] {
                    let at = rng.next_u64() % 1_000_000;
                    Some((Fault::StallBody { after: 0 }, Some(at)))
                } else {
                    None
                }
            }
        };
        let body_fault = |f: &Fault| matches!(f, Fault::CutBody { .. } | Fault::StallBody { .. });
        let drawn = drawn.filter(|(f, _)| has_body || !body_fault(f));
        if drawn.is_some() {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        drawn
    }

    fn error(fault: Fault, request: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "FaultyStore",
            source: Box::new(InjectedFault {
                fault,
                request,
                status: fault.status(),
            }),
        }
    }
}

fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A body that delivers `after` bytes of `body` and then fails (or, if `stall`, hangs).
fn cut(
    body: BoxStream<'static, object_store::Result<Bytes>>,
    after: u64,
    stall: bool,
    request: String,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    futures_util::stream::unfold((body, after, false), move |(mut body, left, done)| {
        let request = request.clone();
        async move {
            if done {
                return None;
            }
            if left == 0 {
                if stall {
                    futures_util::future::pending::<()>().await;
                }
                let f = Fault::CutBody { after };
                return Some((Err(FaultyStore::error(f, request)), (body, 0, true)));
            }
            match body.next().await {
                Some(Ok(mut chunk)) => {
                    if chunk.len() as u64 > left {
                        chunk.truncate(left as usize);
                    }
                    let left = left - chunk.len() as u64;
                    Some((Ok(chunk), (body, left, false)))
                }
                // The end, or an error of its own: passed through.
                other => other.map(|item| (item, (body, left, true))),
            }
        }
    })
    .boxed()
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let counter = if head { &self.heads } else { &self.gets };
        counter.fetch_add(1, Ordering::Relaxed);
        let request = format!("{} {location}", if head { "head" } else { "get" });
        if head {
            return match self.next_fault(false) {
                None => self.inner.get_opts(location, options).await,
                Some((f, _)) => Err(Self::error(f, request)),
            };
        }
        let in_flight = InFlight::enter(&self.in_flight);
        let latency = self.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(std::time::Duration::from_micros(latency)).await;
        }
        let (after, millionths, stall) = match self.next_fault(true) {
            None => (u64::MAX, None, false),
            Some((Fault::CutBody { after }, m)) => (after, m, false),
            Some((Fault::StallBody { after }, m)) => (after, m, true),
            Some((f, _)) => return Err(Self::error(f, request)),
        };
        let result = self.inner.get_opts(location, options).await?;
        let len = result.range.end - result.range.start;
        let after = millionths.map_or(after, |m| len * m / 1_000_000);
        let (meta, range) = (result.meta.clone(), result.range.clone());
        let (attributes, extensions) = (result.attributes.clone(), result.extensions.clone());
        let body = cut(result.into_stream(), after, stall, request)
            .map(move |chunk| {
                let _counted = &in_flight;
                chunk
            })
            .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        object_store::coalesce_ranges(
            ranges,
            |r| async move {
                let res = self
                    .get_opts(location, GetOptions::new().with_range(Some(r)))
                    .await?;
                res.bytes().await
            },
            object_store::OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        match self.next_fault(false) {
            None => self.inner.list(prefix),
            Some((f, _)) => {
                self.failed_lists.fetch_add(1, Ordering::Relaxed);
                let e = Self::error(f, format!("list {prefix:?}"));
                futures_util::stream::once(async move { Err(e) }).boxed()
            }
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        match self.next_fault(false) {
            None => self.inner.list_with_delimiter(prefix).await,
            Some((f, _)) => {
                self.failed_lists.fetch_add(1, Ordering::Relaxed);
                Err(Self::error(f, format!("list {prefix:?}")))
            }
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
