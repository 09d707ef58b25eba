//! `az://` URLs through object_store's Azure client against Azurite (Microsoft's Azure Storage
//! emulator, from the npm registry), started by the test on the loopback address: the client
//! configured with [`ShardStoreBuilder::option`] (account, key, endpoint), patterns resolved
//! by one listing, range reads, downloads, and a sharded dataset read end to end.
//!
//! Azurite is looked for in `LONGSHORE_AZURITE_DIR` (default `target/azurite` of the
//! workspace; `.ci/run` installs it there with `npm install azurite @azure/storage-blob`).
//! Without it the tests print why and pass, unless `LONGSHORE_REQUIRE_AZURITE=1` (as in CI),
//! which makes its absence a failure.

mod support;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use longshore_shards::dataset::ShardedDataset;
use longshore_shards::store::{ShardStore, ShardStoreBuilder, block_on};
use longshore_shards::url::ShardUrl;
use object_store::{ObjectStoreExt, PutPayload};
use support::data::write_shards;
use support::{check_resolve_read_download, shard_bytes};

/// Azurite's well-known development account and key (public, in Microsoft's docs).
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

struct Azurite {
    child: Child,
    endpoint: String,
    dir: PathBuf,
    _data: tempfile::TempDir,
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Azurite's blob service on a free loopback port, or `None` (printing why) when it is
/// not installed and not required.
fn azurite() -> Option<Azurite> {
    let dir = std::env::var_os("LONGSHORE_AZURITE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/azurite"));
    let bin = dir.join("node_modules/.bin/azurite-blob");
    if !bin.exists() {
        let why = format!(
            "Azurite is not installed at {} (npm install --prefix {} azurite @azure/storage-blob)",
            bin.display(),
            dir.display()
        );
        assert!(
            std::env::var("LONGSHORE_REQUIRE_AZURITE").as_deref() != Ok("1"),
            "LONGSHORE_REQUIRE_AZURITE=1: {why}"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = tempfile::tempdir().unwrap();
    let child = Command::new(&bin)
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
        .arg("--location")
        .arg(data.path())
        .args([
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let server = Azurite {
        child,
        endpoint: format!("http://127.0.0.1:{port}/{ACCOUNT}"),
        dir,
        _data: data,
    };
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Azurite did not listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(server)
}

impl Azurite {
    /// Creates a container with Azure's own SDK (object_store does not create containers).
    fn create_container(&self, name: &str) {
        let script = "const { BlobServiceClient } = require('@azure/storage-blob');\n\
            const [conn, name] = process.argv.slice(1);\n\
            BlobServiceClient.fromConnectionString(conn).getContainerClient(name).create()\n\
              .then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });";
        let conn = format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={};",
            self.endpoint
        );
        let status = Command::new("node")
            .args(["-e", script, &conn, name])
            .env("NODE_PATH", self.dir.join("node_modules"))
            .status()
            .expect("node");
        assert!(status.success(), "creating container {name}: {status}");
    }

    fn store(&self) -> ShardStoreBuilder {
        ShardStore::builder()
            .option("azure_storage_account_name", ACCOUNT)
            .option("azure_storage_account_key", KEY)
            .option("azure_storage_endpoint", &self.endpoint)
            .option("azure_allow_http", "true")
    }

    fn put(&self, url: &str, bytes: &[u8]) {
        let store = self.store().build();
        let (client, path) = store.client(&ShardUrl::parse(url).unwrap()).unwrap();
        block_on(client.put(&path, PutPayload::from(bytes.to_vec())))
            .unwrap()
            .unwrap();
    }
}

#[test]
fn az_urls_resolve_with_one_listing_read_ranges_and_download() {
    let Some(server) = azurite() else { return };
    server.create_container("shards");
    let shards: Vec<Vec<u8>> = (0..3).map(|i| shard_bytes(i, 8000 + i as usize)).collect();
    for (i, b) in shards.iter().enumerate() {
        server.put(&format!("az://shards/a/shard-{i}.tar"), b);
    }
    let (store, _) =
        check_resolve_read_download(server.store(), "az://shards/a/shard-{0..2}.tar", &shards);

    // A missing object is an error naming its URL.
    let err = store
        .resolve(&["az://shards/a/shard-9.tar".to_owned()])
        .unwrap_err();
    assert!(err.to_string().contains("shard-9.tar"), "{err}");
}

#[test]
fn a_sharded_dataset_reads_az_shards() {
    let Some(server) = azurite() else { return };
    server.create_container("data");
    let local = tempfile::tempdir().unwrap();
    let counts = [6u64, 3, 8];
    write_shards(local.path(), &counts);
    for i in 0..counts.len() {
        let name = format!("shard-{i:06}.tar");
        server.put(
            &format!("az://data/wds/{name}"),
            &std::fs::read(local.path().join(&name)).unwrap(),
        );
    }
    let ds = ShardedDataset::webdataset(["az://data/wds/shard-{000000..000002}.tar"])
        .store(server.store().build())
        .seed(5)
        .rank(0)
        .world_size(1)
        .cache_dir(local.path().join("cache"))
        .build()
        .unwrap();
    assert_eq!(
        support::data::read_epoch_sorted(&ds),
        (0..17).collect::<Vec<_>>()
    );
}
