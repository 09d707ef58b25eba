//! The object stores behind shard URLs, through the [`object_store`] crate: S3 and
//! S3-compatible stores, GCS, Azure, HTTP and local files.
//!
//! - [`ShardStore`] resolves URLs to (client, path) pairs, one client per bucket, and offers
//!   [`resolve`](ShardStore::resolve) (a job's shard list, listed once and handed to workers as
//!   a serialisable [`ShardList`]), [`list`](ShardStore::list), [`head`](ShardStore::head),
//!   [`get_range`](ShardStore::get_range) and [`download`](ShardStore::download), a whole-object
//!   download that resumes a cut body from the byte already received.
//! - [`block_on`] and [`runtime`]: the process's tokio runtime, created lazily and rebuilt after
//!   a `fork`, so the loader's synchronous worker threads can call the async stores.
//! - [`FaultyStore`]: an [`ObjectStore`] wrapper that injects server errors, throttling,
//!   timeouts and cut bodies, for tests and benchmarks.
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
//! # Retries
//!
//! object_store retries each request (5xx, 429, connection errors) with backoff. On top of it,
//! each operation here is retried by a [`RetryPolicy`] for errors that are not permanent (not
//! found, denied, invalid), and a download whose body is cut (or stalls) resumes with a range
//! request from the byte already written, checking the object's `ETag` did not change. Errors
//! that last become [`ShardError::Fetch`], naming the URL, the shard and the attempts.
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
mod fault;
mod range;
mod runtime;

pub use builder::ShardStoreBuilder;
pub use download::DownloadReport;
pub use fault::{Fault, FaultRates, FaultStats, FaultyStore, InjectedFault};
pub use runtime::{block_on, runtime};

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
// Retries.

/// How operations are retried on top of object_store's own request retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts an operation gets before its error is returned (at least 1). For a download,
    /// the attempts in a row that received no new byte.
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles per retry.
    pub initial_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// A response body that delivers no byte for this long is treated as cut and resumed.
    pub stall_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based), with jitter in `[1/2, 1]` of it.
    fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max_backoff);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        exp.mul_f64(0.5 + f64::from(nanos % 1000) / 2000.0)
    }
}

/// Whether an object_store error may go away when the request is repeated.
fn is_transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::NotFound { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    )
}

fn fetch_error(
    op: &'static str,
    url: &ShardUrl,
    attempts: u32,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ShardError {
    ShardError::Fetch {
        op,
        url: url.as_str().to_owned(),
        shard: url.file_name().to_owned(),
        attempts,
        source: source.into(),
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
    map: HashMap<StoreLocation, Arc<dyn ObjectStore>>,
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

    /// The client and object path for a URL. All URLs at one location share one client.
    ///
    /// # Errors
    ///
    /// [`ShardError::StoreConfig`] if the client cannot be built, [`ShardError::Url`] if the
    /// path is not a valid object path.
    pub fn client(&self, url: &ShardUrl) -> Result<(Arc<dyn ObjectStore>, ObjectPath), ShardError> {
        let path = object_path(url)?;
        let mut clients = self.inner.clients.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if clients.pid != pid {
            // Forked: the inherited clients' connections belong to the parent's runtime, whose
            // threads are not here. Leak them (dropping could wait on those threads) and build
            // new ones in this process.
            tracing::debug!(target: TARGET, inherited_pid = clients.pid, pid, "store clients inherited through fork; rebuilding");
            let stale = std::mem::replace(&mut clients.map, self.inner.config.stores.clone());
            std::mem::forget(stale);
            clients.pid = pid;
        }
        let clients = &mut clients.map;
        if let Some(c) = clients.get(url.location()) {
            return Ok((Arc::clone(c), path));
        }
        let mut client = self.build_client(url)?;
        if let Some(wrap) = &self.inner.config.wrap {
            client = wrap(url.location(), client);
        }
        tracing::debug!(target: TARGET, store = %url.location(), "store client built");
        clients.insert(url.location().clone(), Arc::clone(&client));
        Ok((client, path))
    }

    /// Runs `f` with retries for transient errors, as the [`RetryPolicy`] says.
    async fn retrying<T, F, Fut>(
        &self,
        op: &'static str,
        url: &ShardUrl,
        mut f: F,
    ) -> Result<T, ShardError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, object_store::Error>>,
    {
        let policy = self.retry_policy();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match f().await {
                Ok(v) => return Ok(v),
                Err(e) if is_transient(&e) && attempt < policy.max_attempts.max(1) => {
                    tracing::debug!(target: TARGET, op, url = %url, attempt, error = %e, "retrying");
                    tokio::time::sleep(policy.backoff(attempt)).await;
                }
                Err(e) => return Err(fetch_error(op, url, attempt, e)),
            }
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
        let (store, _) = self.client(any)?;
        let dir_path = match dir.path().trim_end_matches('/') {
            "" if dir.location() != &StoreLocation::Local => None,
            _ => Some(object_path(&dir)?),
        };
        tracing::debug!(target: TARGET, prefix = %dir_url, "listing");
        let result = self
            .retrying("list", &dir, || {
                store.list_with_delimiter(dir_path.as_ref())
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
        let (store, path) = self.client(&u)?;
        let meta = self.retrying("head", &u, || store.head(&path)).await?;
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
    use super::*;

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

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        assert!(p.backoff(1) <= Duration::from_millis(100));
        assert!(p.backoff(1) >= Duration::from_millis(50));
        assert!(p.backoff(30) <= p.max_backoff);
    }
}
