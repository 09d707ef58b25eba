//! `ShardStore` over plain HTTP (object_store's HTTP client against the in-process server
//! serving anonymous `GET`s): patterns resolve with `HEAD`s (HTTP cannot list), range reads,
//! and downloads resumed after cut bodies.

mod support;

use longshore_shards::store::{Fault, FaultyStore, ShardStore};
use support::{faulty, shard_bytes};

#[test]
fn http_shards_resolve_read_and_download() {
    let server = support::s3::start_with(false);
    let shards: Vec<Vec<u8>> = (0..3).map(|i| shard_bytes(i, 9000 + i as usize)).collect();
    for (i, b) in shards.iter().enumerate() {
        server.put(&format!("web/shard-{i}.tar"), b);
    }
    let (store, slot) = faulty(ShardStore::builder(), |inner| {
        FaultyStore::with_plan(inner, [])
    });
    let list = store
        .resolve(&[server.http_url("web/shard-{0..2}.tar")])
        .unwrap();
    assert_eq!(
        list.shards.iter().map(|s| s.size).collect::<Vec<_>>(),
        [9000, 9001, 9002]
    );
    let st = slot.stats();
    assert_eq!((st.heads, st.lists), (3, 0), "{st:?}");

    let url = &list.shards[1].url;
    assert_eq!(
        &store.get_range(url, 100..200).unwrap()[..],
        &shards[1][100..200]
    );

    slot.get().push([
        Some(Fault::CutBody { after: 4000 }),
        Some(Fault::Unavailable),
        Some(Fault::CutBody { after: 100 }),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("s");
    let report = store.download(&list.shards[2], &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), shards[2]);
    assert_eq!(report.resumes, 3, "{report:?}");
}
