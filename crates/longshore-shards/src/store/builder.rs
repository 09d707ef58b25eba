//! [`ShardStoreBuilder`]: what a [`ShardStore`]'s clients are built with, and building them
//! (one object_store client per bucket or container, configured from the environment, then
//! the builder's options, then its typed setters).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::ObjectStore;

use super::{Clients, Inner, RetryPolicy, ShardStore};
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
    /// object_store configuration keys, by backend prefix (`aws_`, `google_`, `azure_`).
    options: Vec<(String, String)>,
    pub(super) retry: RetryPolicy,
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

    /// object_store's own per-request retry configuration for the cloud clients.
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
        self.options.push((key.into(), value.into()));
        self
    }

    /// The retry policy of operations (see the [module docs](crate::store)).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Uses `store` for every URL at `location`, instead of building a client.
    pub fn with_store(mut self, location: StoreLocation, store: Arc<dyn ObjectStore>) -> Self {
        self.stores.insert(location, store);
        self
    }

    /// Wraps every client when it is built (for instance in a [`FaultyStore`](super::FaultyStore)).
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
                    map: self.stores.clone(),
                }),
                config: self,
            }),
        }
    }
}

/// The key prefixes of [`ShardStoreBuilder::option`]: S3, GCS, Azure.
const BACKEND_PREFIXES: [&str; 3] = ["aws_", "google_", "azure_"];

impl ShardStoreBuilder {
    /// The options of the backend whose keys start with `prefix`; a key of no backend is an
    /// error.
    fn options_for(&self, prefix: &str) -> Result<Vec<(&str, &str)>, object_store::Error> {
        if let Some((key, _)) = self
            .options
            .iter()
            .find(|(k, _)| !BACKEND_PREFIXES.iter().any(|p| k.starts_with(p)))
        {
            return Err(object_store::Error::UnknownConfigurationKey {
                store: "longshore-shards",
                key: format!("{key} (keys start with aws_, google_ or azure_)"),
            });
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
    pub(super) fn build_client(&self, url: &ShardUrl) -> Result<Arc<dyn ObjectStore>, ShardError> {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        let c = &self.inner.config;
        let err = |source| ShardError::StoreConfig {
            url: url.as_str().to_owned(),
            source,
        };
        let store: Arc<dyn ObjectStore> = match url.location() {
            StoreLocation::S3 { bucket } => {
                let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
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
                match (c.allow_http, endpoint) {
                    (Some(allow), _) => b = b.with_allow_http(allow),
                    (None, Some(e)) if is_loopback_http(&e) => b = b.with_allow_http(true),
                    _ => {}
                }
                if let Some(r) = &c.client_retry {
                    b = b.with_retry(r.clone());
                }
                Arc::new(b.build().map_err(err)?)
            }
            StoreLocation::Gcs { bucket } => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket);
                for (key, value) in c.options_for(BACKEND_PREFIXES[1]).map_err(err)? {
                    b = b.with_config(key.parse().map_err(err)?, value);
                }
                if let Some(r) = &c.client_retry {
                    b = b.with_retry(r.clone());
                }
                Arc::new(b.build().map_err(err)?)
            }
            StoreLocation::Azure { account, container } => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(container);
                for (key, value) in c.options_for(BACKEND_PREFIXES[2]).map_err(err)? {
                    b = b.with_config(key.parse().map_err(err)?, value);
                }
                if let Some(a) = account {
                    b = b.with_account(a);
                }
                if let Some(r) = &c.client_retry {
                    b = b.with_retry(r.clone());
                }
                Arc::new(b.build().map_err(err)?)
            }
            StoreLocation::Http { base } => {
                let options = object_store::ClientOptions::new()
                    .with_allow_http(c.allow_http.unwrap_or(base.starts_with("http://")));
                let mut b = object_store::http::HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(options);
                if let Some(r) = &c.client_retry {
                    b = b.with_retry(r.clone());
                }
                Arc::new(b.build().map_err(err)?)
            }
            StoreLocation::Local => Arc::new(object_store::local::LocalFileSystem::new()),
        };
        Ok(store)
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
