//! `ShardStore` over local files (plain paths, relative paths and `file://` URLs): resolving
//! patterns and prefixes, range reads and downloads, as over object storage.

mod support;

use longshore_shards::ShardError;
use longshore_shards::store::ShardStore;
use support::write_local_shards;

#[test]
fn local_paths_and_file_urls_resolve_and_read() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[10, 20, 30, 40]);
    let store = ShardStore::from_env();
    let dir = src.path().display().to_string();

    let plain = store
        .resolve(&[format!("{dir}/shard-{{0000..0003}}.bin")])
        .unwrap();
    let url = store
        .resolve(&[format!("file://{dir}/shard-{{0000..0003}}.bin")])
        .unwrap();
    let sizes: Vec<u64> = plain.shards.iter().map(|s| s.size).collect();
    assert_eq!(sizes, [10, 20, 30, 40]);
    assert_eq!(url.shards.iter().map(|s| s.size).collect::<Vec<_>>(), sizes);
    assert!(url.shards[0].url.starts_with("file://"));

    let listed = store.list(&format!("{dir}/")).unwrap();
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[3].name(), "shard-0003.bin");

    assert_eq!(
        &store.get_range(&plain.shards[2].url, 5..25).unwrap()[..],
        &bytes[2][5..25]
    );
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy");
    store.download(&url.shards[3], &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes[3]);
}

#[test]
fn relative_paths_resolve_against_the_working_directory() {
    let src = tempfile::tempdir_in(".").unwrap();
    write_local_shards(src.path(), &[7, 8]);
    let rel = src
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let store = ShardStore::from_env();
    for pattern in [
        format!("{rel}/shard-0000.bin"),
        format!("./{rel}/shard-0000.bin"),
        format!("{rel}/../{rel}/shard-0000.bin"),
    ] {
        let list = store.resolve(&[&pattern]).unwrap();
        assert_eq!(list.shards[0].size, 7, "{pattern}");
    }
    let list = store
        .resolve(&[format!("./{rel}/shard-{{0000..0001}}.bin")])
        .unwrap();
    assert_eq!(
        list.shards.iter().map(|s| s.size).collect::<Vec<_>>(),
        [7, 8]
    );

    // Bare file names, in the working directory itself (one listing of it).
    let files: Vec<_> = (0..2)
        .map(|i| {
            let f = tempfile::Builder::new()
                .prefix("longshore-bare-")
                .tempfile_in(".")
                .unwrap();
            std::fs::write(f.path(), vec![0u8; 3 + i]).unwrap();
            f
        })
        .collect();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.path().file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let list = store.resolve(&names).unwrap();
    assert_eq!(
        list.shards.iter().map(|s| s.size).collect::<Vec<_>>(),
        [3, 4]
    );
}

#[test]
fn a_missing_local_shard_is_named() {
    let src = tempfile::tempdir().unwrap();
    write_local_shards(src.path(), &[1, 2]);
    let store = ShardStore::from_env();
    let err = store
        .resolve(&[format!("{}/shard-{{0000..0002}}.bin", src.path().display())])
        .unwrap_err();
    assert!(
        matches!(&err, ShardError::MissingShard { url, .. } if url.ends_with("shard-0002.bin")),
        "{err:?}"
    );
    let err = store
        .head(&format!("{}/nope.bin", src.path().display()))
        .unwrap_err();
    assert!(err.to_string().contains("nope.bin"), "{err}");
}
