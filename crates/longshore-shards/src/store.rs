//! The object stores behind shard URLs, through the [`object_store`] crate: S3 and
//! S3-compatible stores, GCS, Azure, HTTP and local files.
//!
//! - [`ShardStore`] resolves URLs to (client, path) pairs, one client per bucket, and offers
//!   [`resolve`](ShardStore::resolve) (a job's shard list, listed once and handed to workers as
//!   a serialisable [`ShardList`]), [`list`](ShardStore::list), [`head`](ShardStore::head),
//!   [`get_range`](ShardStore::get_range) and [`download`](ShardStore::download), a whole-object
//!   download that resumes a cut body from the byte already received.
//! - [`Timeouts`] and [`RetryPolicy`]: how long requests wait for a server, and how failed
//!   operations are retried (see [Timeouts](#timeouts) and [Retries](#retries) below).
//! - [`block_on`] and [`runtime`]: the process's tokio runtime, created lazily and rebuilt after
//!   a `fork`, so the loader's synchronous worker threads can call the async stores.
//! - `FaultyStore` (feature `testing`): an [`ObjectStore`] wrapper that injects server errors,
//!   throttling, timeouts and cut bodies, for tests and benchmarks.
//!
//! # Credentials and endpoints
//!
//! Clients are built with object_store's `from_env` builders, which read the variables the
//! cloud SDKs read (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`, …;
//! `GOOGLE_APPLICATION_CREDENTIALS`, …; `AZURE_STORAGE_ACCOUNT_NAME`, …). An S3-compatible
//! store is reached with `AWS_ENDPOINT_URL` or [`ShardStoreBuilder::s3_endpoint`]; requests are
//! then path-style, and plain `http://` is allowed by itself for a loopback endpoint
//! (`127.0.0.0/8`, `localhost`, `[::1]`), elsewhere only with
//! [`ShardStoreBuilder::allow_http`] or `AWS_ALLOW_HTTP=true`.
//!
//! # Timeouts
//!
//! Every request of the HTTP-based stores (S3, GCS, Azure, HTTP) is bounded ([`Timeouts`],
//! and the [`RetryPolicy`]'s `stall_timeout`):
//!
//! | wait | default | what it bounds |
//! | --- | --- | --- |
//! | `connect` | 5 s | opening a connection (TCP and TLS) |
//! | `first_byte` | 30 s | from sending a request to its response's status line |
//! | `stall_timeout` | 30 s | a response body that delivers no byte (a download resumes, a range read is retried) |
//! | `retry_timeout` | 60 s | retrying: no retry starts later than this after an operation's first request (a download's last new byte) |
//!
//! There is no limit on a whole request: a large body that keeps coming is never cut. A
//! listing's body, which object_store reads itself, is bounded by a read timeout of 1.5 times
//! the longer of `first_byte` and `stall_timeout`. Idle pooled connections close after 15 s,
//! before servers close them under a request. So, with the defaults, an endpoint that accepts
//! connections and never answers fails an operation after two 30 s attempts (about 60 s); one
//! where nothing listens fails within about 2 s (five attempts with backoff).
//!
//! One option sets the waits from configuration (and from Python's `storage_options`):
//! `timeout`, given to [`ShardStoreBuilder::option`] beside object_store's keys, as seconds
//! (`"10"`, `"2.5"`) or with a unit (`"500ms"`, `"10s"`, `"1m"`). It sets `first_byte` and
//! `stall_timeout` to its value and caps `connect` at it; [`ShardStoreBuilder::timeouts`] and
//! [`ShardStoreBuilder::retry`] win over it. object_store's own client keys (`aws_timeout`,
//! `aws_connect_timeout`, …) still apply over these where given.
//!
//! ```
//! use longshore_shards::store::ShardStore;
//! let store = ShardStore::builder().option("timeout", "10s").build();
//! assert_eq!(store.timeouts().first_byte, std::time::Duration::from_secs(10));
//! assert_eq!(store.retry_policy().stall_timeout, std::time::Duration::from_secs(10));
//! ```
//!
//! # Retries
//!
//! Each operation (a listing, a `HEAD`, a range read, a download) is retried by the store's
//! [`RetryPolicy`], in one place: object_store's own per-request retries are off unless
//! [`ShardStoreBuilder::client_retry`] turns them on. Retried: answers 408, 429 and 5xx,
//! connections refused, reset or timed out, bodies cut or stalled. Not retried: any other 4xx
//! answer (403 and 404 among them: asked once), and errors this module does not know to be
//! passing. The wait before retry *n* is `initial_backoff` doubled *n*-1 times, capped at
//! `max_backoff`, with jitter (half to all of it); where the server sent `Retry-After`
//! (seconds or an HTTP date), at least that, and an operation whose server asks for a wait
//! past its `retry_timeout` fails at once. An operation stops after `max_attempts` attempts
//! (for a download: in a row without a new byte) or once `retry_timeout` has passed. A
//! download whose body is cut or stalls resumes with a range request from the byte already
//! written, checking the object's `ETag` did not change. Errors that last become
//! [`ShardError::Fetch`], naming the operation, the URL, the endpoint and the attempts; its
//! source is object_store's error.
//!
//! # Async, sync threads and fork
//!
//! object_store is async (tokio); the loader's workers are synchronous threads. Each operation
//! has an `_async` form and a blocking form that runs it on the process's store runtime
//! ([`runtime`]) through [`block_on`]. That runtime is created on first use, in the process
//! that uses it, and records the creating process id: a worker process forked after its parent
//! built the runtime (whose threads do not survive `fork`) builds its own instead of
//! deadlocking on the parent's. Clients are likewise per process: a store used in a forked
//! child builds its own (the inherited ones' pooled connections belong to the parent's
//! runtime). Create stores and caches before forking if you like; do the I/O after. The
//! blocking forms refuse to run inside an async runtime ([`ShardError::Runtime`]): await the
//! `_async` forms there.
//!
//! ```
//! use longshore_shards::store::ShardStore;
//! # let dir = tempfile::tempdir().unwrap();
//! # for i in 0..3 { std::fs::write(dir.path().join(format!("shard-{i:02}.tar")), vec![7u8; 10 + i]).unwrap(); }
//! # let root = dir.path().display();
//! let store = ShardStore::from_env();
//! // Once per job; the list is then handed to every worker.
//! let shards = store.resolve(&[format!("{root}/shard-{{00..02}}.tar")])?;
//! assert_eq!(shards.len(), 3);
//! let head = store.get_range(&shards.shards[2].url, 0..4)?;
//! assert_eq!(&head[..], &[7, 7, 7, 7]);
//! # Ok::<(), longshore_shards::ShardError>(())
//! ```

mod builder;
mod download;
#[cfg(feature = "testing")]
mod fault;
mod http;
mod range;
mod retry;
mod runtime;
mod timeouts;

pub use builder::ShardStoreBuilder;
pub use download::DownloadReport;
#[cfg(feature = "testing")]
pub use fault::{Fault, FaultRates, FaultStats, FaultyStore, InjectedFault};
pub use retry::RetryPolicy;
pub use runtime::{block_on, runtime};
pub use timeouts::Timeouts;

/// The object_store crate this module is built on (its [`ObjectStore`] trait, paths and
/// clients), re-exported so users name the same version.
pub use object_store;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::ShardError;
use crate::url::{ShardUrl, StoreLocation, expand_patterns};
use retry::Retries;

const TARGET: &str = "longshore::shards";

/// `HEAD` requests in flight at once while resolving shards that are not listed.
const HEAD_CONCURRENCY: usize = 16;

// ---------------------------------------------------------------------------------------------
// Shard lists.

/// One shard object: its URL, size and (when the store gives one) entity tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardInfo {
    /// The shard's URL, as expanded from the user's pattern.
    pub url: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entity tag as the listing or `HEAD` reported it, if any.
    pub etag: Option<String>,
}

impl ShardInfo {
    /// The shard's file name (the URL's last path segment).
    pub fn name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or(&self.url)
    }
}

/// A job's resolved shard list, in the order the patterns name the shards.
///
/// Resolve it once per job ([`ShardStore::resolve`]) and hand it to every rank and worker
/// (it is `Serialize`/`Deserialize`; [`to_json`](Self::to_json) is one way), so that no worker
/// lists the bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardList {
    /// The shards.
    pub shards: Vec<ShardInfo>,
}

impl ShardList {
    /// The number of shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether there are no shards.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The sum of the shards' sizes.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.size).sum()
    }

    /// The largest shard, if any.
    pub fn largest(&self) -> Option<&ShardInfo> {
        self.shards.iter().max_by_key(|s| s.size)
    }

    /// The list as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a shard list always serialises")
    }

    /// A list from [`to_json`](Self::to_json)'s output.
    ///
    /// # Errors
    ///
    /// [`ShardError::Json`] if the text is not such a list.
    pub fn from_json(json: &str) -> Result<Self, ShardError> {
        serde_json::from_str(json).map_err(|source| ShardError::Json {
            what: "shard list",
            source,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// The error of an operation that failed for good after `elapsed`, naming the URL, the
/// endpoint and the attempts; `source` stays the store's own error (callers downcast it).
fn fetch_error(
    op: &'static str,
    url: &ShardUrl,
    endpoint: Option<&str>,
    attempts: u32,
    elapsed: Duration,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ShardError {
    let source = source.into();
    tracing::debug!(
        target: TARGET,
        op,
        url = %url,
        endpoint = endpoint.unwrap_or(""),
        attempts,
        elapsed_ms = elapsed.as_millis() as u64,
        error = %source,
        "giving up"
    );
    let shard = match url.file_name() {
        "" => url.path().to_owned(), // a listing's prefix
        name => name.to_owned(),
    };
    ShardError::Fetch {
        op,
        url: url.as_str().to_owned(),
        shard,
        endpoint: endpoint.map(str::to_owned),
        attempts,
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// The store.

struct Inner {
    config: ShardStoreBuilder,
    clients: Mutex<Clients>,
}

/// The clients built so far, and the process that built them.
struct Clients {
    pid: u32,
    map: HashMap<StoreLocation, Client>,
}

/// One location's client, and the endpoint its requests go to when it is known.
#[derive(Clone)]
struct Client {
    store: Arc<dyn ObjectStore>,
    endpoint: Option<String>,
}

/// Object stores for shard URLs, one client per bucket, shared by clones of this handle.
///
/// Every operation has a blocking form for synchronous threads (through [`block_on`]) and an
/// `_async` form.
#[derive(Clone)]
pub struct ShardStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ShardStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ShardStore {
    /// A builder, to set endpoints, credentials or retries.
    pub fn builder() -> ShardStoreBuilder {
        ShardStoreBuilder::default()
    }

    /// A store configured from the environment alone.
    pub fn from_env() -> Self {
        Self::builder().build()
    }

    /// A store with this one's configuration and none of the clients it built (the stores
    /// given with [`ShardStoreBuilder::with_store`] are shared): for I/O on a short-lived
    /// runtime, since a client's pooled connections belong to the runtime they were opened
    /// on and die with it.
    pub fn unshared(&self) -> ShardStore {
        self.inner.config.clone().build()
    }

    /// The retry policy in force.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.config.retry
    }

    /// The timeouts in force (the builder's, or as the `timeout` option set them).
    pub fn timeouts(&self) -> Timeouts {
        self.inner.config.timeouts
    }

    /// A new retry state for one operation.
    fn retries(&self) -> Retries {
        Retries::new(self.retry_policy(), self.timeouts().retry_timeout)
    }

    /// The client and object path for a URL. All URLs at one location share one client.
    ///
    /// # Errors
    ///
    /// [`ShardError::StoreConfig`] if the client cannot be built, [`ShardError::Url`] if the
    /// path is not a valid object path.
    pub fn client(&self, url: &ShardUrl) -> Result<(Arc<dyn ObjectStore>, ObjectPath), ShardError> {
        let (client, path) = self.located(url)?;
        Ok((client.store, path))
    }

    /// [`client`](Self::client), with the client's endpoint.
    fn located(&self, url: &ShardUrl) -> Result<(Client, ObjectPath), ShardError> {
        let path = object_path(url)?;
        let mut clients = self.inner.clients.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if clients.pid != pid {
            // Forked: the inherited clients' connections belong to the parent's runtime, whose
            // threads are not here. Leak them (dropping could wait on those threads) and build
            // new ones in this process.
            tracing::debug!(target: TARGET, inherited_pid = clients.pid, pid, "store clients inherited through fork; rebuilding");
            let stale = std::mem::replace(&mut clients.map, self.inner.config.own_stores());
            std::mem::forget(stale);
            clients.pid = pid;
        }
        let clients = &mut clients.map;
        if let Some(c) = clients.get(url.location()) {
            return Ok((c.clone(), path));
        }
        let mut client = self.build_client(url)?;
        if let Some(wrap) = &self.inner.config.wrap {
            client.store = wrap(url.location(), client.store);
        }
        tracing::debug!(
            target: TARGET,
            store = %url.location(),
            endpoint = client.endpoint.as_deref().unwrap_or(""),
            "store client built"
        );
        clients.insert(url.location().clone(), client.clone());
        Ok((client, path))
    }

    /// Runs `f` until it succeeds, retrying the failures that may pass as the [`RetryPolicy`]
    /// and the [`Timeouts`] say; the last failure becomes [`ShardError::Fetch`].
    async fn retrying<T, F, Fut>(
        &self,
        op: &'static str,
        url: &ShardUrl,
        endpoint: Option<&str>,
        mut f: F,
    ) -> Result<T, ShardError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, object_store::Error>>,
    {
        let retries = self.retries();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let e = match f().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let Some(wait) = retries.wait(attempt, &e) else {
                let elapsed = retries.elapsed();
                return Err(fetch_error(op, url, endpoint, attempt, elapsed, e));
            };
            tracing::debug!(
                target: TARGET,
                op,
                url = %url,
                endpoint = endpoint.unwrap_or(""),
                attempt,
                wait_ms = wait.as_millis() as u64,
                error = %e,
                "retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Expands the patterns and resolves them to shards with sizes, in the patterns' order.
    ///
    /// URLs in one directory are resolved with one listing of it (a single `HEAD` for a lone
    /// URL, and `HEAD`s over HTTP, which cannot list); a URL ending in `/` stands for every
    /// object directly under it, sorted by name. Call this once per job and hand the list to
    /// the workers.
    ///
    /// # Errors
    ///
    /// Pattern and URL errors, [`ShardError::MissingShard`] for a shard the listing lacks, and
    /// [`ShardError::Fetch`] for failed requests.
    pub async fn resolve_async<S: AsRef<str>>(
        &self,
        patterns: &[S],
    ) -> Result<ShardList, ShardError> {
        let urls = expand_patterns(patterns)?
            .iter()
            .map(|u| ShardUrl::parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        // Group single-object URLs by directory, to list each directory once.
        let mut groups: BTreeMap<(StoreLocation, String), Vec<usize>> = BTreeMap::new();
        for (i, u) in urls.iter().enumerate() {
            if !u.is_prefix() {
                let dir = u.path().rsplit_once('/').map_or("", |(d, _)| d);
                groups
                    .entry((u.location().clone(), dir.to_owned()))
                    .or_default()
                    .push(i);
            }
        }
        let mut found: Vec<Vec<ShardInfo>> = vec![Vec::new(); urls.len()];
        let mut heads = Vec::new();
        for ((location, _), members) in groups {
            let http = matches!(location, StoreLocation::Http { .. });
            if members.len() == 1 || http {
                heads.extend(members);
                continue;
            }
            let first = &urls[members[0]];
            let prefix = match first.as_str().rsplit_once('/') {
                Some((dir, _)) => format!("{dir}/"),
                None => "./".to_owned(), // a bare local file name
            };
            let listing = self.list_metas(first, &prefix).await?;
            let by_path: HashMap<&ObjectPath, &ObjectMeta> =
                listing.iter().map(|m| (&m.location, m)).collect();
            for i in members {
                let path = object_path(&urls[i])?;
                let meta = by_path.get(&path).ok_or_else(|| ShardError::MissingShard {
                    url: urls[i].as_str().to_owned(),
                    prefix: prefix.clone(),
                })?;
                found[i] = vec![info(urls[i].as_str().to_owned(), meta)];
            }
        }
        // The HEADs, a few at a time.
        let urls_ref = &urls;
        let mut results = futures_util::stream::iter(heads)
            .map(|i| async move { (i, self.head_async(urls_ref[i].as_str()).await) })
            .buffer_unordered(HEAD_CONCURRENCY);
        while let Some((i, head)) = results.next().await {
            found[i] = vec![head?];
        }
        drop(results);
        for (i, u) in urls.iter().enumerate() {
            if u.is_prefix() {
                found[i] = self.list_async(u.as_str()).await?;
            }
        }
        let shards: Vec<ShardInfo> = found.into_iter().flatten().collect();
        tracing::info!(
            target: TARGET,
            shards = shards.len(),
            bytes = shards.iter().map(|s| s.size).sum::<u64>(),
            "shard list resolved"
        );
        Ok(ShardList { shards })
    }

    /// [`resolve_async`](Self::resolve_async), blocking.
    ///
    /// # Errors
    ///
    /// As [`resolve_async`](Self::resolve_async), and [`block_on`]'s.
    pub fn resolve<S: AsRef<str>>(&self, patterns: &[S]) -> Result<ShardList, ShardError> {
        block_on(self.resolve_async(patterns))?
    }

    /// Lists the objects directly under a prefix URL (one listing, paginated by the store),
    /// sorted by name.
    ///
    /// # Errors
    ///
    /// URL errors and [`ShardError::Fetch`].
    pub async fn list_async(&self, prefix: &str) -> Result<Vec<ShardInfo>, ShardError> {
        let url = ShardUrl::parse(prefix)?;
        let base = if url.is_prefix() || url.as_str().ends_with('/') {
            url.as_str().to_owned()
        } else {
            format!("{}/", url.as_str())
        };
        let mut metas = self.list_metas(&url, &base).await?;
        metas.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(metas
            .iter()
            .map(|m| info(format!("{base}{}", m.location.filename().unwrap_or("")), m))
            .collect())
    }

    /// [`list_async`](Self::list_async), blocking.
    ///
    /// # Errors
    ///
    /// As [`list_async`](Self::list_async), and [`block_on`]'s.
    pub fn list(&self, prefix: &str) -> Result<Vec<ShardInfo>, ShardError> {
        block_on(self.list_async(prefix))?
    }

    /// One listing of the directory `dir_url` (which ends in `/` or is empty for a bucket's
    /// root), in the store of `any`.
    async fn list_metas(
        &self,
        any: &ShardUrl,
        dir_url: &str,
    ) -> Result<Vec<ObjectMeta>, ShardError> {
        let dir = ShardUrl::parse(if dir_url.is_empty() {
            any.as_str()
        } else {
            dir_url
        })?;
        let (client, _) = self.located(any)?;
        let dir_path = match dir.path().trim_end_matches('/') {
            "" if dir.location() != &StoreLocation::Local => None,
            _ => Some(object_path(&dir)?),
        };
        tracing::debug!(target: TARGET, prefix = %dir_url, "listing");
        let endpoint = client.endpoint.as_deref();
        let result = self
            .retrying("list", &dir, endpoint, || {
                client.store.list_with_delimiter(dir_path.as_ref())
            })
            .await?;
        Ok(result.objects)
    }

    /// The size and entity tag of one object (a `HEAD` request).
    ///
    /// # Errors
    ///
    /// URL errors and [`ShardError::Fetch`].
    pub async fn head_async(&self, url: &str) -> Result<ShardInfo, ShardError> {
        let u = ShardUrl::parse(url)?;
        let (client, path) = self.located(&u)?;
        let endpoint = client.endpoint.as_deref();
        let meta = self
            .retrying("head", &u, endpoint, || client.store.head(&path))
            .await?;
        Ok(info(url.to_owned(), &meta))
    }

    /// [`head_async`](Self::head_async), blocking.
    ///
    /// # Errors
    ///
    /// As [`head_async`](Self::head_async), and [`block_on`]'s.
    pub fn head(&self, url: &str) -> Result<ShardInfo, ShardError> {
        block_on(self.head_async(url))?
    }
}

fn info(url: String, meta: &ObjectMeta) -> ShardInfo {
    ShardInfo {
        url,
        size: meta.size,
        etag: meta.e_tag.clone(),
    }
}

/// The object_store path of a URL: the key, or for a local file its absolute path.
fn object_path(url: &ShardUrl) -> Result<ObjectPath, ShardError> {
    let err = |reason: String| ShardError::Url {
        url: url.as_str().to_owned(),
        reason,
    };
    if url.location() == &StoreLocation::Local {
        let p = std::path::Path::new(url.path());
        let abs = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| err(format!("cannot resolve a relative path: {e}")))?
                .join(p)
        };
        // Without `.` segments, and `..` resolved (object paths have neither).
        let mut abs: std::path::PathBuf = abs.components().collect();
        if abs
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            abs = std::fs::canonicalize(&abs)
                .map_err(|e| err(format!("cannot resolve '..': {e}")))?;
        }
        return ObjectPath::from_absolute_path(&abs).map_err(|e| err(e.to_string()));
    }
    Ok(ObjectPath::parse(url.path()).unwrap_or_else(|_| ObjectPath::from(url.path())))
}

#[cfg(test)]
mod tests {
    use super::builder::is_loopback_http;

    #[test]
    fn loopback_endpoints() {
        for e in [
            "http://127.0.0.1:9000",
            "http://localhost",
            "http://[::1]:80/x",
        ] {
            assert!(is_loopback_http(e), "{e}");
        }
        for e in [
            "https://127.0.0.1",
            "http://10.0.0.1:9000",
            "http://example.com",
        ] {
            assert!(!is_loopback_http(e), "{e}");
        }
    }
}
