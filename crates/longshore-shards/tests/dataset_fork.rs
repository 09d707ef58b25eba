//! Building a `ShardedDataset` leaves no async runtime, I/O thread or connection behind (so a
//! loader may fork or spawn its workers after it); the store runtime starts lazily, in the
//! first worker that reads. One test per binary: it watches the process's threads.

mod support;

use longshore_data::{IterableDataset, WorkerInfo};
use longshore_shards::dataset::ShardedDataset;

/// The names of this process's threads (Linux: `/proc/self/task/*/comm`).
fn thread_names() -> Option<Vec<String>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(Result::ok)
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|n| n.trim().to_owned())
            .collect(),
    )
}

#[test]
fn building_starts_no_runtime_and_the_first_read_does() {
    let Some(before) = thread_names() else {
        eprintln!("skipped: no /proc/self/task on this system");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    support::data::write_shards(dir.path(), &[5, 6, 7]);
    // Without the index: building downloads (copies) and scans every shard, through the
    // store and its runtime.
    std::fs::remove_file(dir.path().join("shard-index.json")).unwrap();
    let ds =
        ShardedDataset::webdataset([support::data::pattern(&dir.path().display().to_string(), 3)])
            .cache_dir(dir.path().join("cache"))
            .rank(0)
            .world_size(1)
            .build()
            .unwrap();
    let after_build = thread_names().unwrap();
    assert_eq!(
        after_build.len(),
        before.len(),
        "build left threads behind: {after_build:?} (before: {before:?})"
    );
    assert!(!after_build.iter().any(|n| n.starts_with("longshore")));

    // A worker's first read starts the store runtime (and the cache's prefetch threads).
    let n = ds.iter(WorkerInfo::single(0)).map(Result::unwrap).count();
    assert_eq!(n, 18);
    let after_read = thread_names().unwrap();
    assert!(
        after_read.iter().any(|n| n.starts_with("longshore-shard")),
        "{after_read:?}"
    );
}
