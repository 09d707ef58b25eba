//! Crash safety of the shard cache: a partial download is never read as a shard (a leftover
//! temporary file is deleted, a failed download leaves nothing), a download whose process is
//! killed mid-body is cleaned up by the next opener, and complete shards are reused after a
//! restart, even with the index lost or corrupt.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use longshore_shards::ShardError;
use longshore_shards::cache::{CacheConfig, ShardCache};
use longshore_shards::store::{Fault, FaultyStore, RetryPolicy, ShardStore};
use support::{faulty, local_list, write_local_shards};

fn open(dir: &Path, store: ShardStore, list: &longshore_shards::store::ShardList) -> ShardCache {
    ShardCache::open(CacheConfig::new(dir, 1 << 20), store, list).unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn complete_shards_are_reused_after_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[1000, 2000, 3000]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 3);
    let dir = tempfile::tempdir().unwrap();
    {
        let cache = open(dir.path(), store.clone(), &list);
        for s in &list.shards {
            cache.get(s).unwrap();
        }
        assert_eq!(cache.stats().downloads, 3);
    }
    // A restarted job; then one whose index was lost; then one whose index is garbage.
    for damage in [None, Some(""), Some("{not json")] {
        match damage {
            Some("") => std::fs::remove_file(dir.path().join("index.json")).unwrap(),
            Some(text) => std::fs::write(dir.path().join("index.json"), text).unwrap(),
            None => {}
        }
        let cache = open(dir.path(), store.clone(), &list);
        for (i, s) in list.shards.iter().enumerate() {
            assert_eq!(
                cache.get(s).unwrap().read_all().unwrap(),
                bytes[i],
                "{damage:?}"
            );
        }
        let st = cache.stats();
        assert_eq!((st.hits, st.downloads), (3, 0), "{damage:?}: {st:?}");
    }
}

#[test]
fn a_leftover_temp_file_is_never_read_and_is_deleted() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[5000]);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 1);
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), store.clone(), &list));
    // What a crashed writer leaves: a partial temp file, unlocked.
    let leftover = dir
        .path()
        .join("tmp")
        .join("00000000deadbeef-shard-0000.bin.4242.0.part");
    std::fs::write(leftover, &bytes[0][..1234]).unwrap();
    let cache = open(dir.path(), store, &list);
    assert!(files(&dir.path().join("tmp")).is_empty(), "deleted on open");
    let s = cache.get(&list.shards[0]).unwrap();
    assert_eq!(s.read_all().unwrap(), bytes[0]);
    assert_eq!(cache.stats().downloads, 1);
}

#[test]
fn a_failed_download_leaves_nothing_behind() {
    let src = tempfile::tempdir().unwrap();
    write_local_shards(src.path(), &[4000]);
    let list = local_list(&ShardStore::from_env(), src.path(), 1);
    let retry = RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let (store, _slot) = faulty(ShardStore::builder().retry(retry), |inner| {
        FaultyStore::always(inner, Fault::CutBody { after: 0 })
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), store, &list);
    let err = cache.get(&list.shards[0]).unwrap_err();
    assert!(
        matches!(err, ShardError::Fetch { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(files(&dir.path().join("tmp")).is_empty());
    assert!(files(&dir.path().join("data")).is_empty());
    let u = cache.usage().unwrap();
    assert_eq!((u.complete_bytes, u.reserved_bytes), (0, 0));
}

/// Run by the test below in a child process: starts a download that stalls mid-body.
#[test]
fn child_stalls_mid_download() {
    let (Ok(cache_dir), Ok(src)) = (
        std::env::var("LONGSHORE_TEST_CACHE"),
        std::env::var("LONGSHORE_TEST_SRC"),
    ) else {
        return; // not a child
    };
    let retry = RetryPolicy {
        stall_timeout: Duration::from_secs(600),
        ..RetryPolicy::default()
    };
    let (store, _slot) = faulty(ShardStore::builder().retry(retry), |inner| {
        FaultyStore::always(inner, Fault::StallBody { after: 3000 })
    });
    let list = local_list(&ShardStore::from_env(), Path::new(&src), 1);
    let cache = open(Path::new(&cache_dir), store, &list);
    let _ = cache.get(&list.shards[0]);
    unreachable!("the parent kills this process mid-download");
}

#[test]
fn a_download_killed_mid_body_is_cleaned_up_and_redone() {
    let src = tempfile::tempdir().unwrap();
    let bytes = write_local_shards(src.path(), &[100_000]);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_stalls_mid_download",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LONGSHORE_TEST_CACHE", dir.path())
        .env("LONGSHORE_TEST_SRC", src.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let tmp = dir.path().join("tmp");
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the child never started its download"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended by itself"
        );
        if support::dir_bytes(&tmp) >= 3000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // The partial file is there, its writer gone; a new opener cleans up and downloads anew.
    assert_eq!(files(&tmp).len(), 1);
    let store = ShardStore::from_env();
    let list = local_list(&store, src.path(), 1);
    let cache = open(dir.path(), store, &list);
    assert!(
        files(&tmp).is_empty(),
        "the dead download's temp file is deleted"
    );
    assert_eq!(
        cache.usage().unwrap().reserved_bytes,
        0,
        "its reservation is returned"
    );
    assert_eq!(
        cache.get(&list.shards[0]).unwrap().read_all().unwrap(),
        bytes[0]
    );
    assert_eq!(cache.stats().downloads, 1);
}
