//! `gs://` URLs through object_store's GCS client, against the in-process server speaking the
//! XML API that GCS shares with S3 (path-style `GET`/`HEAD` with ranges, `list-type=2`
//! listings): the client configured with [`ShardStoreBuilder::option`] (a service account key
//! naming the server as `gcs_base_url`, OAuth off, as for a GCS emulator), patterns resolved by
//! one listing, range reads, and a sharded dataset read end to end. No GCS emulator speaks
//! that API and installs from the registries CI reaches: this exercises longshore's GCS
//! plumbing, not Google's service.

mod support;

use longshore_shards::dataset::ShardedDataset;
use longshore_shards::store::{ShardStore, ShardStoreBuilder};
use support::data::write_shards;
use support::{check_resolve_read_download, shard_bytes};

/// A store whose GCS client reaches `endpoint` without OAuth.
fn gcs(endpoint: &str) -> ShardStoreBuilder {
    let key = serde_json::json!({
        "gcs_base_url": endpoint,
        "disable_oauth": true,
        "client_email": "",
        "private_key": "",
        "private_key_id": "",
    });
    ShardStore::builder().option("google_service_account_key", key.to_string())
}

#[test]
fn gs_urls_resolve_with_one_listing_and_read_ranges() {
    let server = support::s3::start_with(false);
    let shards: Vec<Vec<u8>> = (0..3).map(|i| shard_bytes(i, 7000 + i as usize)).collect();
    for (i, b) in shards.iter().enumerate() {
        server.put(&format!("g/shard-{i}.tar"), b);
    }
    let pattern = format!("gs://{}/g/shard-{{0..2}}.tar", server.bucket());
    let (_, list) = check_resolve_read_download(gcs(server.endpoint()), &pattern, &shards);
    assert!(
        list.shards.iter().all(|s| s.url.starts_with("gs://")),
        "{:?}",
        list.shards
    );
}

#[test]
fn a_sharded_dataset_reads_gs_shards() {
    let server = support::s3::start_with(false);
    let local = tempfile::tempdir().unwrap();
    let counts = [5u64, 7, 4];
    write_shards(local.path(), &counts);
    for i in 0..counts.len() {
        let name = format!("shard-{i:06}.tar");
        server.put(
            &format!("gds/{name}"),
            &std::fs::read(local.path().join(&name)).unwrap(),
        );
    }
    let ds = ShardedDataset::webdataset([format!(
        "gs://{}/gds/shard-{{000000..000002}}.tar",
        server.bucket()
    )])
    .store(gcs(server.endpoint()).build())
    .seed(3)
    .rank(0)
    .world_size(1)
    .cache_dir(local.path().join("cache"))
    .build()
    .unwrap();
    assert_eq!(
        support::data::read_epoch_sorted(&ds),
        (0..16).collect::<Vec<_>>()
    );
}

#[test]
fn a_key_of_no_backend_is_refused_naming_it() {
    let store = ShardStore::builder()
        .option("endpoint", "http://127.0.0.1:1")
        .build();
    let err = store.resolve(&["gs://b/x.tar".to_owned()]).unwrap_err();
    assert!(err.to_string().contains("gs://b/x.tar"), "{err}");
    let chain = support::data::chain(&err);
    assert!(chain.contains("endpoint"), "{chain}");
}
