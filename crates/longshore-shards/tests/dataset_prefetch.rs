//! A reader keeps ahead of its stream: the shards of the next shuffle block are fetched while
//! the block before is read, all of them (not only the first), also when the cache is full of
//! the last epoch's shards; so with a consumer slower than a download, the only reads that
//! wait for one are each epoch's first (`EpochCacheStats::misses`), and no shard is
//! downloaded twice in an epoch.

mod support;

use std::sync::Arc;
use std::time::Duration;

use longshore_data::{IterableDataset, WorkerInfo};
use longshore_shards::cache::CacheConfig;
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::store::{FaultyStore, ShardStore};
use support::data::{largest_shard, pattern, write_shards};

const SHARDS: usize = 12;
/// More than half a reader's least look-ahead (256 samples): a block of two shards is longer
/// than it.
const PER_SHARD: u64 = 200;

#[test]
fn the_next_blocks_shards_are_fetched_while_the_block_before_is_read() {
    let src = tempfile::tempdir().unwrap();
    write_shards(src.path(), &[PER_SHARD; SHARDS]);
    let largest = largest_shard(src.path(), SHARDS);
    let cache = tempfile::tempdir().unwrap();
    // Each GET 20 ms late; the reader below takes 0.5 ms a sample, 200 ms a block.
    let store = ShardStore::builder()
        .wrap_stores(|_, inner| {
            let slow = FaultyStore::with_plan(inner, []);
            slow.set_latency(Duration::from_millis(20));
            Arc::new(slow)
        })
        .build();
    // Blocks of two shards; a budget of 5 holds the block read and the next one, and from
    // epoch 1 on starts full of the last epoch's shards.
    let ds = ShardedDataset::webdataset([pattern(&src.path().display().to_string(), SHARDS)])
        .store(store)
        .seed(5)
        .shuffle_block(2 * PER_SHARD)
        .rank(0)
        .world_size(1)
        .cache_config(CacheConfig::new(cache.path(), 5 * largest))
        .build()
        .unwrap();
    for epoch in 0..3 {
        let mut seen: Vec<u64> = Vec::new();
        for s in ds.iter(WorkerInfo::single(0).with_epoch(epoch)) {
            seen.push(s.unwrap().id.global);
            std::thread::sleep(Duration::from_micros(500));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..SHARDS as u64 * PER_SHARD).collect::<Vec<_>>());
        let st = ds
            .cache()
            .epoch_stats()
            .into_iter()
            .find(|e| e.epoch == epoch)
            .expect("epoch counted");
        eprintln!("epoch {epoch}: {st:?}");
        // The first block's two shards at most (one here, the other fetched ahead of it).
        // Before the reader looked past the shards it reads, each next block's second shard
        // was asked for only as it was first read: 7 misses in epoch 0.
        assert!(st.misses <= 2, "epoch {epoch}: {st:?}");
        assert!(st.miss_wait > Duration::ZERO || st.misses == 0, "{st:?}");
        assert!(st.downloads <= SHARDS as u64, "epoch {epoch}: {st:?}");
        assert_eq!(st.redownloads, 0, "epoch {epoch}: {st:?}");
    }
}
