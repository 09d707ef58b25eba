//! [`ShardStoreBuilder`]: what a [`ShardStore`]'s clients are built with, and building them
//! (one object_store client per bucket or container, configured from the environment, then
//! the builder's options, then its typed setters).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::ObjectStore;

use super::http::BoundedConnector;
use super::timeouts::{POOL_IDLE, config_value, parse_duration};
use super::{Client, Clients, Inner, RetryPolicy, ShardStore, Timeouts};
use crate::ShardError;
use crate::url::{ShardUrl, StoreLocation};

type Wrapper = dyn Fn(&StoreLocation, Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> + Send + Sync;

/// Builds a [`ShardStore`]; everything not set here comes from the environment.
#[derive(Default, Clone)]
pub struct ShardStoreBuilder {
    s3_endpoint: Option<String>,
    s3_region: Option<String>,
    s3_credentials: Option<(String, String)>,
    allow_http: Option<bool>,
    client_retry: Option<object_store::RetryConfig>,
    /// object_store configuration keys, by backend prefix (`aws_`, `google_`, `azure_`), and
    /// this crate's own ([`OWN_KEYS`]).
    options: Vec<(String, String)>,
    pub(super) retry: RetryPolicy,
    pub(super) timeouts: Timeouts,
    /// Whether [`retry`](Self::retry) / [`timeouts`](Self::timeouts) were called: typed
    /// setters win over the `timeout` option.
    retry_set: bool,
    timeouts_set: bool,
    pub(super) stores: HashMap<StoreLocation, Arc<dyn ObjectStore>>,
    pub(super) wrap: Option<Arc<Wrapper>>,
}

impl std::fmt::Debug for ShardStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStoreBuilder")
            .field("s3_endpoint", &self.s3_endpoint)
            .field("s3_region", &self.s3_region)
            .field(
                "s3_credentials",
                &self.s3_credentials.as_ref().map(|_| ".."),
            )
            .field("allow_http", &self.allow_http)
            // Values may be secrets: keys only.
            .field(
                "options",
                &self.options.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("retry", &self.retry)
            .field("timeouts", &self.timeouts)
            .field("stores", &self.stores.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ShardStoreBuilder {
    /// The endpoint of an S3-compatible store (`http://127.0.0.1:9000`), overriding
    /// `AWS_ENDPOINT_URL`. Requests to it are path-style.
    pub fn s3_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.s3_endpoint = Some(endpoint.into());
        self
    }

    /// The S3 region, overriding `AWS_REGION` / `AWS_DEFAULT_REGION`.
    pub fn s3_region(mut self, region: impl Into<String>) -> Self {
        self.s3_region = Some(region.into());
        self
    }

    /// Static S3 credentials, overriding the environment's credential chain.
    pub fn s3_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.s3_credentials = Some((access_key_id.into(), secret_access_key.into()));
        self
    }

    /// Whether plain `http://` endpoints are allowed (by default: only loopback S3 endpoints
    /// and `http://` shard URLs, which ask for it).
    pub fn allow_http(mut self, allow: bool) -> Self {
        self.allow_http = Some(allow);
        self
    }

    /// object_store's own per-request retries for the cloud and HTTP clients. Off by default
    /// (`max_retries: 0`): each operation is retried by the store's [`RetryPolicy`], which
    /// does not retry 4xx answers other than 408 and 429 and honours `Retry-After`; turning
    /// these on as well multiplies the attempts (object_store ignores `Retry-After`).
    pub fn client_retry(mut self, retry: object_store::RetryConfig) -> Self {
        self.client_retry = Some(retry);
        self
    }

    /// Sets an object_store configuration key of one backend, over what the environment says:
    /// `aws_…` keys for S3 (`aws_endpoint`, `aws_session_token`, …), `google_…` for GCS
    /// (`google_service_account_key`: a service account's JSON, which may also name a
    /// `gcs_base_url` and `disable_oauth` for an emulator), `azure_…` for Azure
    /// (`azure_storage_account_name`, `azure_storage_account_key`, `azure_storage_endpoint`,
    /// `azure_storage_use_emulator`, `azure_allow_http`, …), as object_store's
    /// `AmazonS3ConfigKey`, `GoogleConfigKey` and `AzureConfigKey` spell them. A key of none
    /// of these, or one its backend does not know, is a [`ShardError::StoreConfig`] when the
    /// backend's client is built. The typed setters above win over these.
    ///
    /// One key of this crate's, for every backend:
    ///
    /// - `timeout`: the longest wait for a server, as seconds (`"10"`, `"2.5"`) or with a unit
    ///   (`"500ms"`, `"10s"`, `"1m"`): the first-byte timeout and the stall timeout become
    ///   this, the connect timeout at most this (see the [module docs](crate::store#timeouts)).
    ///   [`timeouts`](Self::timeouts) and [`retry`](Self::retry) win over it; a value that is
    ///   not a duration is a [`ShardError::StoreConfig`] naming it.
    ///
    /// ```
    /// use longshore_shards::store::ShardStore;
    /// let store = ShardStore::builder()
    ///     .option("azure_storage_account_name", "devstoreaccount1")
    ///     .option("azure_storage_endpoint", "http://127.0.0.1:10000/devstoreaccount1")
    ///     .option("azure_allow_http", "true")
    ///     .build();
    /// # let _ = store;
    /// ```
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let (key, value) = (key.into(), value.into());
        if key == TIMEOUT_KEY
            && let Ok(d) = parse_duration(&value)
        {
            if !self.timeouts_set {
                self.timeouts.first_byte = d;
                self.timeouts.connect = self.timeouts.connect.min(d);
            }
            if !self.retry_set {
                self.retry.stall_timeout = d;
            }
        }
        self.options.push((key, value));
        self
    }

    /// The retry policy of operations (see the [module docs](crate::store#retries)).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self.retry_set = true;
        self
    }

    /// How long requests wait for a server and operations go on retrying (see the
    /// [module docs](crate::store#timeouts)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use longshore_shards::store::{ShardStore, Timeouts};
    /// let store = ShardStore::builder()
    ///     .timeouts(Timeouts {
    ///         first_byte: Duration::from_secs(10),
    ///         ..Timeouts::default()
    ///     })
    ///     .build();
    /// assert_eq!(store.timeouts().connect, Duration::from_secs(5));
    /// ```
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self.timeouts_set = true;
        self
    }

    /// Uses `store` for every URL at `location`, instead of building a client.
    pub fn with_store(mut self, location: StoreLocation, store: Arc<dyn ObjectStore>) -> Self {
        self.stores.insert(location, store);
        self
    }

    /// Wraps every client when it is built (for instance in a `FaultyStore`, feature `testing`).
    pub fn wrap_stores(
        mut self,
        wrap: impl Fn(&StoreLocation, Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.wrap = Some(Arc::new(wrap));
        self
    }

    /// The store. Clients are built lazily, on a location's first use.
    pub fn build(self) -> ShardStore {
        ShardStore {
            inner: Arc::new(Inner {
                clients: Mutex::new(Clients {
                    pid: std::process::id(),
                    map: self.own_stores(),
                }),
                config: self,
            }),
        }
    }
}

impl ShardStoreBuilder {
    /// The stores given with [`with_store`](Self::with_store), as clients (whose endpoints are
    /// not known here).
    pub(super) fn own_stores(&self) -> HashMap<StoreLocation, Client> {
        self.stores
            .iter()
            .map(|(location, store)| {
                let client = Client {
                    store: Arc::clone(store),
                    endpoint: None,
                };
                (location.clone(), client)
            })
            .collect()
    }
}

/// The key prefixes of [`ShardStoreBuilder::option`]: S3, GCS, Azure.
const BACKEND_PREFIXES: [&str; 3] = ["aws_", "google_", "azure_"];

/// The store's own option: the longest wait for a server.
const TIMEOUT_KEY: &str = "timeout";

impl ShardStoreBuilder {
    /// The options of the backend whose keys start with `prefix`; a key of no backend is an
    /// error, and so is a value of the store's own keys that cannot be read.
    fn options_for(&self, prefix: &str) -> Result<Vec<(&str, &str)>, object_store::Error> {
        for (key, value) in &self.options {
            if key == TIMEOUT_KEY {
                parse_duration(value).map_err(|reason| object_store::Error::Generic {
                    store: "longshore-shards",
                    source: format!("option `{TIMEOUT_KEY}` = {value:?}: {reason}").into(),
                })?;
            } else if !BACKEND_PREFIXES.iter().any(|p| key.starts_with(p)) {
                return Err(object_store::Error::UnknownConfigurationKey {
                    store: "longshore-shards",
                    key: format!(
                        "{key} (keys start with aws_, google_ or azure_, or are `{TIMEOUT_KEY}`)"
                    ),
                });
            }
        }
        Ok(self
            .options
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect())
    }
}

impl ShardStore {
    /// A client for `url`'s location, and the endpoint its requests go to (for errors).
    pub(super) fn build_client(&self, url: &ShardUrl) -> Result<Client, ShardError> {
        use object_store::ClientConfigKey as K;
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
        use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
        let c = &self.inner.config;
        let err = |source| ShardError::StoreConfig {
            url: url.as_str().to_owned(),
            source,
        };
        // Every key checked (all start with ""), whichever backend this is.
        c.options_for("").map_err(err)?;
        // The bounds of every request (see the module docs), before the user's options, which
        // may set object_store's own keys over them (`aws_timeout`, …).
        let t = c.timeouts;
        let client_keys = [
            (K::ConnectTimeout, config_value(t.connect)),
            // No whole-request timeout (object_store's default is 30 s, which cuts any body
            // that takes longer): the first byte and each stall are bounded instead.
            (K::Timeout, config_value(Duration::from_secs(86_400))),
            (K::PoolIdleTimeout, config_value(POOL_IDLE)),
            // A backstop for the bodies object_store reads itself (listings): a read that
            // waits half as long again as the first-byte and stall timeouts, so that those
            // fire first where they apply.
            (
                K::ReadTimeout,
                config_value(t.first_byte.max(c.retry.stall_timeout) * 3 / 2),
            ),
        ];
        let connector = BoundedConnector {
            first_byte: t.first_byte,
        };
        let retry = c.client_retry.clone().unwrap_or(object_store::RetryConfig {
            max_retries: 0,
            retry_timeout: t.retry_timeout,
            ..object_store::RetryConfig::default()
        });
        let (store, endpoint): (Arc<dyn ObjectStore>, Option<String>) = match url.location() {
            StoreLocation::S3 { bucket } => {
                let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
                for (key, value) in &client_keys {
                    b = b.with_config(AmazonS3ConfigKey::Client(*key), value);
                }
                for (key, value) in c.options_for(BACKEND_PREFIXES[0]).map_err(err)? {
                    b = b.with_config(key.parse().map_err(err)?, value);
                }
                if let Some(e) = &c.s3_endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(r) = &c.s3_region {
                    b = b.with_region(r);
                }
                if let Some((key, secret)) = &c.s3_credentials {
                    b = b.with_access_key_id(key).with_secret_access_key(secret);
                }
                let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
                match (c.allow_http, &endpoint) {
                    (Some(allow), _) => b = b.with_allow_http(allow),
                    (None, Some(e)) if is_loopback_http(e) => b = b.with_allow_http(true),
                    _ => {}
                }
                let endpoint = endpoint.unwrap_or_else(|| {
                    let region = b.get_config_value(&AmazonS3ConfigKey::Region);
                    let region = region.as_deref().unwrap_or("us-east-1");
                    format!("https://s3.{region}.amazonaws.com")
                });
                let b = b.with_retry(retry).with_http_connector(connector);
                (Arc::new(b.build().map_err(err)?), Some(endpoint))
            }
            StoreLocation::Gcs { bucket } => {
                let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
                for (key, value) in &client_keys {
                    b = b.with_config(GoogleConfigKey::Client(*key), value);
                }
                for (key, value) in c.options_for(BACKEND_PREFIXES[1]).map_err(err)? {
                    b = b.with_config(key.parse().map_err(err)?, value);
                }
                let endpoint = b.get_config_value(&GoogleConfigKey::BaseUrl).or_else(|| {
                    // An emulator's address, in the service account key object_store reads.
                    let key = b.get_config_value(&GoogleConfigKey::ServiceAccountKey)?;
                    let key: serde_json::Value = serde_json::from_str(&key).ok()?;
                    Some(key.get("gcs_base_url")?.as_str()?.to_owned())
                });
                let endpoint =
                    endpoint.unwrap_or_else(|| "https://storage.googleapis.com".to_owned());
                let b = b.with_retry(retry).with_http_connector(connector);
                (Arc::new(b.build().map_err(err)?), Some(endpoint))
            }
            StoreLocation::Azure { account, container } => {
                let mut b = MicrosoftAzureBuilder::from_env().with_container_name(container);
                for (key, value) in &client_keys {
                    b = b.with_config(AzureConfigKey::Client(*key), value);
                }
                for (key, value) in c.options_for(BACKEND_PREFIXES[2]).map_err(err)? {
                    b = b.with_config(key.parse().map_err(err)?, value);
                }
                if let Some(a) = account {
                    b = b.with_account(a);
                }
                let endpoint = b.get_config_value(&AzureConfigKey::Endpoint).or_else(|| {
                    let account = b.get_config_value(&AzureConfigKey::AccountName)?;
                    Some(format!("https://{account}.blob.core.windows.net"))
                });
                let b = b.with_retry(retry).with_http_connector(connector);
                (Arc::new(b.build().map_err(err)?), endpoint)
            }
            StoreLocation::Http { base } => {
                let mut b = object_store::http::HttpBuilder::new()
                    .with_url(base)
                    .with_config(
                        K::AllowHttp,
                        c.allow_http
                            .unwrap_or(base.starts_with("http://"))
                            .to_string(),
                    );
                for (key, value) in client_keys {
                    b = b.with_config(key, value);
                }
                let b = b.with_retry(retry).with_http_connector(connector);
                (Arc::new(b.build().map_err(err)?), Some(base.clone()))
            }
            StoreLocation::Local => (Arc::new(object_store::local::LocalFileSystem::new()), None),
        };
        Ok(Client { store, endpoint })
    }
}

/// Whether an endpoint is `http://` on a loopback host.
pub(super) fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
