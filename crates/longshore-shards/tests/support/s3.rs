//! An S3-compatible server on 127.0.0.1 for tests: `s3s-fs` serving a temporary directory,
//! with SigV4 signature checking on (fixed test credentials), reached by object_store's
//! `AmazonS3` through an endpoint override, path-style, over plain HTTP.
//!
//! ```ignore
//! let server = support::s3::start();
//! let store = server.store_builder().build();
//! server.put("train/shard-0.tar", b"...");
//! store.head(&server.url("train/shard-0.tar"))?;
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use longshore_shards::store::{ShardStore, ShardStoreBuilder, block_on};
use longshore_shards::url::ShardUrl;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The access key id the server accepts.
pub const ACCESS_KEY: &str = "longshore-test-key";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "longshore-test-secret-0123456789";
/// The region the client signs for.
pub const REGION: &str = "us-east-1";

/// A running server; dropping it stops the server and deletes its directory.
pub struct S3Server {
    signed: bool,
    endpoint: String,
    bucket: String,
    root: tempfile::TempDir,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Starts a server on 127.0.0.1 (a free port) with one empty bucket, `shards`, that checks
/// signatures.
pub fn start() -> S3Server {
    start_with(true)
}

/// A server that also serves anonymous requests (so a plain HTTP client can `GET` and
/// `HEAD` `http://127.0.0.1:PORT/shards/key`), or only signed ones.
pub fn start_with(check_signatures: bool) -> S3Server {
    let root = tempfile::tempdir().expect("temp dir");
    let bucket = "shards".to_owned();
    std::fs::create_dir(root.path().join(&bucket)).expect("bucket dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("s3-test-server")
        .enable_all()
        .build()
        .expect("server runtime");
    let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs over the temp dir");
    let service = {
        let mut b = s3s::service::S3ServiceBuilder::new(fs);
        if check_signatures {
            b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        }
        b.build()
    };
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    runtime.spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    S3Server {
        signed: check_signatures,
        endpoint: format!("http://{addr}"),
        bucket,
        root,
        runtime: Some(runtime),
    }
}

impl S3Server {
    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The directory that holds the bucket's objects.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(&self.bucket)
    }

    /// `http://127.0.0.1:PORT/BUCKET/key`, for an anonymous server's plain HTTP reads.
    pub fn http_url(&self, key: &str) -> String {
        format!("{}/{}/{key}", self.endpoint, self.bucket)
    }

    /// `s3://BUCKET/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// A store builder that reaches this server: endpoint override (plain HTTP allowed as it
    /// is loopback), the test credentials, the test region.
    pub fn store_builder(&self) -> ShardStoreBuilder {
        ShardStore::builder()
            .s3_endpoint(&self.endpoint)
            .s3_credentials(ACCESS_KEY, SECRET_KEY)
            .s3_region(REGION)
    }

    /// A signed client for the bucket (uploads in tests go through it).
    pub fn client(&self) -> Arc<dyn ObjectStore> {
        let url = ShardUrl::parse(&self.url("x")).expect("url");
        self.store_builder().build().client(&url).expect("client").0
    }

    /// Uploads `bytes` as `key`, through the S3 API (on an anonymous server, which refuses
    /// signed requests, it writes the file into the bucket's directory).
    pub fn put(&self, key: &str, bytes: &[u8]) {
        if !self.signed {
            let path = self.bucket_dir().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
            return;
        }
        let client = self.client();
        let path = object_store::path::Path::parse(key).expect("key");
        block_on(client.put(&path, PutPayload::from(bytes.to_vec())))
            .expect("runtime")
            .expect("put");
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
