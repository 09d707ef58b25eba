//! Range reads below the working set: with a cache budget smaller than the shuffle window's
//! working set, a sample whose shard is not on disk and sparse in the reader's stream (a wide
//! shuffle's) is read by one range `GET` of its bytes (the shard's layout known from an
//! earlier scan, an MDS header read by range) instead of downloading its whole shard again,
//! while the dense shards of shuffle blocks that fit the readers' shares are still downloaded
//! whole; every sample still arrives exactly once with its own
//! bytes, the reads are counted per epoch, and a range read that fails is an error naming the
//! shard or, under `Skip`, a counted skip that leaves the rank its planned batches.

#[path = "support/schedule.rs"]
mod schedule;
mod support;

use std::path::Path;

use longshore_loader::SampleErrorPolicy;
use longshore_shards::cache::{CacheConfig, EpochCacheStats};
use longshore_shards::dataset::{OnSampleError, ShardedDataset, ShardedDatasetBuilder};
use longshore_shards::mds::{MdsWriter, Value};
use support::data::{Read, largest_shard, pattern, planned, run_rank, write_shards};

const SHARDS: usize = 20;
const PER_SHARD: u64 = 100;

/// A whole-epoch shuffle over `src`'s tar shards with a budget of `budget_shards` times the
/// largest shard.
fn tars(src: &Path, cache: &Path, budget_shards: u64) -> ShardedDatasetBuilder {
    let largest = largest_shard(src, SHARDS);
    ShardedDataset::webdataset([pattern(&src.display().to_string(), SHARDS)])
        .seed(4)
        .shuffle_block(u64::MAX)
        .rank(0)
        .world_size(1)
        .cache_config(CacheConfig::new(cache, largest * budget_shards))
}

/// Reads epoch `epoch` with `workers` workers; asserts every sample arrived once with its own
/// `val`; returns the epoch's cache stats.
fn exactly_once(ds: &ShardedDataset, epoch: u64, workers: usize) -> EpochCacheStats {
    let read = Read::new(schedule::BATCH, workers).epoch(epoch);
    let mut seen: Vec<u64> = run_rank(ds, read, None)
        .into_iter()
        .flat_map(|b| b.unwrap())
        .map(|s| {
            assert_eq!(s.val, s.global, "sample {} has another's bytes", s.global);
            s.global
        })
        .collect();
    seen.sort_unstable();
    let total = ds.spec().counts.iter().sum::<u64>();
    assert_eq!(seen, (0..total).collect::<Vec<_>>(), "epoch {epoch}");
    *ds.cache()
        .epoch_stats()
        .iter()
        .find(|e| e.epoch == epoch)
        .expect("epoch counted")
}

#[test]
fn a_wide_shuffle_below_the_working_set_reads_samples_by_range_not_whole_shards() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[PER_SHARD; SHARDS]);
    for workers in [1, 2] {
        let cache = tempfile::tempdir().unwrap();
        let ds = tars(src.path(), cache.path(), 3).build().unwrap();
        let sizes = schedule::sizes(&ds);
        for epoch in 0..3 {
            let st = exactly_once(&ds, epoch, workers);
            eprintln!("{workers} workers, epoch {epoch}: {st:?}");
            // Each shard is downloaded once to learn its layout (epoch 0; a prefetched shard
            // evicted before a reader scanned it, once more); after that, reads of shards not
            // on disk are range reads. Whole-shard downloads per read made ~1,450 downloads
            // an epoch here (Belady's bound ~1,300).
            assert!(st.downloads as f64 <= SHARDS as f64 * 1.1, "{st:?}");
            assert!(st.range_reads > 0, "{st:?}");
            if epoch > 0 {
                assert!(st.downloads <= SHARDS as u64, "{st:?}");
                assert_eq!(st.redownloads, 0, "{st:?}");
                // Most of the 2,000 reads find their shard evicted (3 of 20 fit).
                assert!(st.range_reads >= 1000, "{st:?}");
            }
            // A range read is one sample's tar members: far below a shard.
            let smallest = *sizes.iter().min().unwrap();
            assert!(
                st.range_bytes < st.range_reads * smallest / 10
                    && st.range_bytes >= st.range_reads * 1024,
                "{st:?}"
            );
        }
        let budget = 3 * *sizes.iter().max().unwrap();
        assert!(support::cache_disk_bytes(cache.path()) <= budget);
    }
}

/// Blocks of 2.5 shards (3 whole shards a block) under a budget one shard below the working
/// set: each worker's block fits its share of the budget, so the blocks' shards are dense and
/// downloaded whole (about once an epoch), not read sample by sample.
#[test]
fn dense_shards_below_the_working_set_are_downloaded_whole() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[PER_SHARD; SHARDS]);
    let probe = tempfile::tempdir().unwrap();
    let ds = tars(src.path(), probe.path(), SHARDS as u64)
        .shuffle_block(250)
        .build()
        .unwrap();
    let sizes = schedule::sizes(&ds);
    let refs = schedule::node_refs(&ds, 1, &[0], 2);
    let ws = longshore_shards::cache::working_set_bytes(refs.iter().copied(), &sizes);
    let largest = *sizes.iter().max().unwrap();
    drop(ds);
    let ws_shards = ws / largest;
    assert!(ws_shards >= 6, "working set of {ws_shards} shards");
    let cache = tempfile::tempdir().unwrap();
    let ds = tars(src.path(), cache.path(), ws_shards - 1)
        .shuffle_block(250)
        .build()
        .unwrap();
    for epoch in 0..3 {
        let st = exactly_once(&ds, epoch, 2);
        eprintln!("epoch {epoch}: {st:?}");
        // The cold epoch 0 downloads a few shards twice, as Belady's rule does.
        let most = if epoch == 0 { 1.25 } else { 1.1 };
        assert!(st.downloads as f64 <= SHARDS as f64 * most, "{st:?}");
        // Range reads: the first reads of a block's shards while their downloads run (at
        // most an eighth of a dense shard's reads) and the reads that find no room for their
        // shard; ranging every read of a shard not on disk made ~1,200-1,400 of the 2,000.
        assert!(st.range_reads <= 500, "{st:?}");
    }
}

#[test]
fn range_reads_off_downloads_every_shard_read_not_on_disk() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[PER_SHARD; SHARDS]);
    let cache = tempfile::tempdir().unwrap();
    let ds = tars(src.path(), cache.path(), 3)
        .range_reads(false)
        .build()
        .unwrap();
    for epoch in 0..2 {
        let st = exactly_once(&ds, epoch, 2);
        assert_eq!(st.range_reads, 0, "{st:?}");
        // Belady's count for this order is ~1,300: every miss a download.
        assert!(st.downloads > 10 * SHARDS as u64, "{st:?}");
    }
}

#[test]
fn a_budget_that_holds_the_working_set_never_reads_by_range() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[PER_SHARD; SHARDS]);
    let cache = tempfile::tempdir().unwrap();
    let ds = tars(src.path(), cache.path(), SHARDS as u64)
        .build()
        .unwrap();
    for epoch in 0..2 {
        let st = exactly_once(&ds, epoch, 2);
        assert_eq!(st.range_reads, 0, "{st:?}");
        assert!(st.downloads <= SHARDS as u64, "{st:?}");
    }
}

#[test]
fn mds_shards_below_the_working_set_read_their_headers_and_samples_by_range() {
    let src = tempfile::tempdir().unwrap();
    let mut w = MdsWriter::new(
        src.path(),
        &[("val", "str"), ("bin", "bytes")],
        Some(40_000),
    )
    .unwrap();
    for g in 0..2_000u64 {
        let bin = vec![(g % 251) as u8; 1 + (g % 700) as usize];
        w.write(&[
            ("val", Value::Str(g.to_string())),
            ("bin", Value::Bytes(bin)),
        ])
        .unwrap();
    }
    let index = w.finish().unwrap();
    let shards = index.shards.len();
    assert!(shards >= 10, "{shards} shards");
    let largest = index.shards.iter().map(|s| s.raw_data.bytes).max().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let ds = ShardedDataset::mds([src.path().display().to_string()])
        .seed(4)
        .shuffle_block(u64::MAX)
        .rank(0)
        .world_size(1)
        .cache_config(CacheConfig::new(cache.path(), 3 * largest))
        .build()
        .unwrap();
    for epoch in 0..2 {
        let st = exactly_once(&ds, epoch, 2);
        eprintln!("epoch {epoch}: {st:?}");
        // An MDS shard's header is one range read: no shard needs a download to be read by
        // range, so epoch 1 downloads none again.
        assert!(st.range_reads >= 1000, "{st:?}");
        assert!(st.downloads <= shards as u64, "{st:?}");
        if epoch > 0 {
            assert_eq!(st.redownloads, 0, "{st:?}");
        }
    }
}

/// The shards gone from the store after epoch 0: the reads of shards not on disk fail. Under
/// `FailBatch` the error names the shard; under `Skip` the rank still yields its planned
/// batches, the failed reads counted (and made up for).
#[test]
fn a_range_read_that_fails_is_named_or_counted() {
    for skip in [false, true] {
        let src = tempfile::tempdir().unwrap();
        write_shards(src.path(), &[PER_SHARD; SHARDS]);
        let cache = tempfile::tempdir().unwrap();
        let mut b = tars(src.path(), cache.path(), 3);
        if skip {
            b = b.on_sample_error(OnSampleError::Skip);
        }
        let ds = b.build().unwrap();
        exactly_once(&ds, 0, 2);
        for i in 0..SHARDS {
            std::fs::remove_file(src.path().join(format!("shard-{i:06}.tar"))).unwrap();
        }
        let policy = if skip {
            SampleErrorPolicy::Skip
        } else {
            SampleErrorPolicy::FailBatch
        };
        let read = Read::new(schedule::BATCH, 2).epoch(1).policy(policy);
        let batches = run_rank(&ds, read, None);
        let errors: Vec<&String> = batches.iter().filter_map(|b| b.as_ref().err()).collect();
        if skip {
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(batches.len(), planned(&ds, read));
            let stats = ds.stats();
            let unreachable = stats.failed_by_reason.get("unreachable shard").copied();
            assert!(unreachable.unwrap_or(0) > 0, "{stats:?}");
            assert_eq!(stats.padded, stats.failed(), "{stats:?}");
        } else {
            assert!(!errors.is_empty());
            for e in errors {
                assert!(e.contains("shard-0000"), "the error names no shard: {e}");
                assert!(e.contains("index "), "the error names no sample: {e}");
            }
        }
    }
}
