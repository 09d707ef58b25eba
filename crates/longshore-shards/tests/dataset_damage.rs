//! Damaged shards are an error or a counted skip, never a smaller dataset, and under
//! `OnSampleError::Skip` every rank still yields exactly its planned number of batches:
//! truncated shards with and without an index, a broken tar header, over ranks x workers x
//! `drop_last` x a budget below the working set (range reads; a property test with random
//! damage).

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use longshore_loader::SampleErrorPolicy;
use longshore_shards::ShardError;
use longshore_shards::cache::CacheConfig;
use longshore_shards::dataset::{OnSampleError, ShardedDataset, ShardedDatasetBuilder};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::data::{Read, Seen, pattern, planned, run_rank, spans, truncate, write_shards};

const COUNTS: [u64; 6] = [9, 4, 13, 7, 1, 11]; // 45 samples

fn builder(dir: &Path, n: usize) -> ShardedDatasetBuilder {
    ShardedDataset::webdataset([pattern(&dir.display().to_string(), n)])
        .cache_dir(dir.join("cache"))
        .seed(5)
        .shuffle_block(8)
}

/// Breaks the checksum of sample `sample`'s first header in shard `i` (its size unchanged).
fn break_header(dir: &Path, i: usize, sample: usize) {
    let path = dir.join(format!("shard-{i:06}.tar"));
    let at = spans(dir, i)[sample].offset as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at + 148..at + 156].copy_from_slice(b"0000000\0");
    std::fs::write(&path, &bytes).unwrap();
}

fn samples(batches: &[Result<Vec<Seen>, String>]) -> Vec<Seen> {
    batches
        .iter()
        .flat_map(|b| b.as_ref().unwrap().iter().copied())
        .collect()
}

#[test]
fn a_truncated_shard_with_an_index_keeps_its_count_and_every_rank_its_batches() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    truncate(dir.path(), 2, 6); // shard 2: 13 samples, cut in sample 6
    // Raise (the default): refused at build, naming the shard and where it ends.
    let err = builder(dir.path(), COUNTS.len()).build().unwrap_err();
    let ShardError::Damaged { shard, offset, .. } = &err else {
        panic!("{err}");
    };
    assert!(shard.ends_with("shard-000002.tar"), "{err}");
    assert!(
        *offset > 0 && err.to_string().contains("its index"),
        "{err}"
    );
    assert!(err.to_string().contains("on_sample_error"), "{err}");
    // Skip: the index's count stands; every rank yields its planned batches.
    for drop_last in [false, true] {
        let mut all = Vec::new();
        let mut failed = 0;
        for rank in 0..3 {
            let ds = builder(dir.path(), COUNTS.len())
                .rank(rank)
                .world_size(3)
                .on_sample_error(OnSampleError::Skip)
                .build()
                .unwrap();
            assert_eq!(ds.len(), 45, "damage never shrinks the dataset");
            let read = Read::new(4, 2)
                .drop_last(drop_last)
                .policy(SampleErrorPolicy::Skip);
            let planned = planned(&ds, read);
            let batches = run_rank(&ds, read, None);
            assert_eq!(batches.len(), planned, "rank {rank}, drop_last {drop_last}");
            let stats = ds.stats();
            assert_eq!(stats.padded, stats.failed(), "{stats:?}");
            assert_eq!(stats.unpadded, 0);
            failed += stats.failed();
            all.extend(samples(&batches));
        }
        let real: Vec<u64> = all.iter().filter(|s| !s.pad).map(|s| s.global).collect();
        let distinct: BTreeSet<u64> = real.iter().copied().collect();
        assert_eq!(
            real.len(),
            distinct.len(),
            "no sample twice outside padding"
        );
        // Shard 2 holds globals 13..26: from sample 6 on they are lost (5 before the cut may
        // also be distrusted), counted in the stats; every other sample arrives.
        if !drop_last {
            assert!(failed >= 7, "{failed}");
            let lost: Vec<u64> = (0..45).filter(|g| !distinct.contains(g)).collect();
            assert!(lost.iter().all(|g| (13 + 5..26).contains(g)), "{lost:?}");
            assert_eq!(lost.len() as u64, failed);
        }
    }
}

#[test]
fn a_truncated_shard_without_an_index_is_an_error_or_a_counted_skip() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    std::fs::remove_file(dir.path().join("shard-index.json")).unwrap();
    truncate(dir.path(), 2, 6);
    let err = builder(dir.path(), COUNTS.len()).build().unwrap_err();
    let ShardError::Damaged { shard, member, .. } = &err else {
        panic!("{err}");
    };
    assert!(shard.ends_with("shard-000002.tar"), "{err}");
    assert!(member.is_some(), "{err}");
    assert!(err.to_string().contains("whole samples before it"), "{err}");
    let ds = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .on_sample_error(OnSampleError::Skip)
        .build()
        .unwrap();
    // Only the whole samples before the cut are known: a counted, logged skip.
    assert_eq!(ds.spec().damaged.len(), 1);
    assert_eq!(ds.spec().damaged[0].shard, 2);
    assert_eq!(ds.stats().damaged_shards, 1);
    assert_eq!(ds.stats().damaged, vec![2]);
    let read = Read::new(4, 2).policy(SampleErrorPolicy::Skip);
    let planned = planned(&ds, read);
    let batches = run_rank(&ds, read, None);
    assert_eq!(batches.len(), planned);
    assert_eq!(samples(&batches).len() as u64, ds.len());
}

#[test]
fn a_broken_header_with_an_index_is_made_up_for_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    break_header(dir.path(), 2, 3);
    for workers in [1, 3] {
        let mut counts = Vec::new();
        for rank in 0..2 {
            let ds = builder(dir.path(), COUNTS.len())
                .rank(rank)
                .world_size(2)
                .on_sample_error(OnSampleError::Skip)
                .build()
                .unwrap();
            let read = Read::new(3, workers).policy(SampleErrorPolicy::Skip);
            let planned = planned(&ds, read);
            let batches = run_rank(&ds, read, None);
            assert_eq!(batches.len(), planned, "rank {rank}, {workers} workers");
            counts.push(samples(&batches).len());
            let s = ds.stats();
            assert_eq!(s.padded, s.failed(), "{s:?}");
            assert_eq!(
                s.failed_by_reason.keys().collect::<Vec<_>>(),
                if s.failed() > 0 {
                    vec!["damaged shard"]
                } else {
                    vec![]
                }
            );
        }
        assert_eq!(counts[0], counts[1], "{counts:?}");
    }
}

#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate { shard: usize, at: usize },
    Header { shard: usize, at: usize },
}

#[test]
fn every_rank_yields_its_planned_batches_whatever_is_damaged() {
    let strategy = (
        prop::collection::vec(1u64..9, 2..6),
        prop::collection::vec((0u8..3, any::<usize>(), any::<usize>()), 0..3),
        any::<bool>(),
        1usize..4,
        1usize..4,
        1usize..5,
        any::<bool>(),
        any::<bool>(),
    );
    // Range reads seen over the cases with a budget of one shard (some must be).
    let ranged = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &strategy,
            |(counts, damages, with_index, world, workers, batch_size, drop_last, tight)| {
                let dir = tempfile::tempdir().unwrap();
                write_shards(dir.path(), &counts);
                let mut applied = Vec::new();
                for (kind, s, a) in damages {
                    let shard = s % counts.len();
                    let at = a % counts[shard] as usize;
                    if applied.iter().any(|d| matches!(d, Damage::Truncate { shard: t, .. } | Damage::Header { shard: t, .. } if *t == shard)) {
                        continue;
                    }
                    let d = match kind {
                        0 => Damage::None,
                        1 => Damage::Truncate { shard, at },
                        _ => Damage::Header { shard, at },
                    };
                    match d {
                        Damage::Truncate { shard, at } => truncate(dir.path(), shard, at),
                        Damage::Header { shard, at } => break_header(dir.path(), shard, at),
                        Damage::None => {}
                    }
                    applied.push(d);
                }
                if !with_index {
                    std::fs::remove_file(dir.path().join("shard-index.json")).unwrap();
                }
                let mut per_rank = Vec::new();
                let mut real = Vec::new();
                let mut gave_up = false;
                // A budget of one shard: below the working set, reads of shards not on disk
                // are range reads (of a damaged shard's layout too).
                let largest = (0..counts.len())
                    .map(|i| std::fs::metadata(dir.path().join(format!("shard-{i:06}.tar"))).unwrap().len())
                    .max()
                    .unwrap();
                for rank in 0..world {
                    let mut b = builder(dir.path(), counts.len());
                    if tight {
                        b = b.cache_config(CacheConfig::new(dir.path().join("cache"), largest));
                    }
                    let ds = b
                        .rank(rank)
                        .world_size(world)
                        .on_sample_error(OnSampleError::Skip)
                        .build()
                        .unwrap();
                    let read = Read::new(batch_size, workers)
                        .drop_last(drop_last)
                        .policy(SampleErrorPolicy::Skip);
                    let planned = planned(&ds, read);
                    let batches = run_rank(&ds, read, None);
                    let stats = ds.stats();
                    ranged.set(ranged.get() + stats.cache.iter().map(|e| e.range_reads).sum::<u64>());
                    let errors: Vec<&String> =
                        batches.iter().filter_map(|b| b.as_ref().err()).collect();
                    if !errors.is_empty() {
                        // Only when no sample at all can be read in place of a failed one
                        // (checked below): an error, never a short rank.
                        for e in &errors {
                            prop_assert!(e.contains("cannot be made up for"), "{}", e);
                        }
                        prop_assert!(stats.unpadded > 0, "{:?}", &stats);
                        gave_up = true;
                        continue;
                    }
                    prop_assert_eq!(
                        batches.len(),
                        planned,
                        "rank {} of {}, {} workers, budget of one shard {}, damage {:?}, {:?}",
                        rank,
                        world,
                        workers,
                        tight,
                        &applied,
                        &stats
                    );
                    prop_assert_eq!(stats.unpadded, 0);
                    prop_assert_eq!(stats.padded, stats.failed());
                    let got = samples(&batches);
                    per_rank.push(got.len());
                    real.extend(got.iter().filter(|s| !s.pad).map(|s| s.global));
                }
                if gave_up {
                    // Fewer than 64 samples in these datasets: every one was tried.
                    prop_assert!(real.is_empty(), "a rank gave up while {:?} read", &real);
                    return Ok(());
                }
                prop_assert!(per_rank.iter().all(|&n| n == per_rank[0]), "{:?}", per_rank);
                let distinct: BTreeSet<u64> = real.iter().copied().collect();
                prop_assert_eq!(real.len(), distinct.len(), "a sample twice outside padding");
                Ok(())
            },
        )
        .unwrap();
    assert!(ranged.get() > 0, "no case read by range");
}

/// The same damage served by a real S3 server (s3s-fs on 127.0.0.1, signatures checked),
/// with and without an index: the error names the `s3://` shard, and a counted skip keeps
/// every rank's batches over 2 ranks x 2 workers.
#[test]
fn damage_read_through_an_s3_server_is_named_or_counted() {
    for with_index in [true, false] {
        let server = support::s3::start();
        let dir = tempfile::tempdir().unwrap();
        write_shards(dir.path(), &COUNTS);
        truncate(dir.path(), 2, 6);
        break_header(dir.path(), 4, 0);
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.starts_with('.') || (!with_index && name == "shard-index.json") {
                continue;
            }
            server.put(&format!("d/{name}"), &std::fs::read(&path).unwrap());
        }
        let s3 = |cache: &str| {
            ShardedDataset::webdataset([pattern(&server.url("d"), COUNTS.len())])
                .store(server.store_builder().build())
                .cache_dir(dir.path().join(cache))
                .seed(5)
                .shuffle_block(8)
        };
        let err = s3("c-raise").build().unwrap_err();
        let ShardError::Damaged { shard, .. } = &err else {
            panic!("index {with_index}: {err}");
        };
        assert!(
            shard.starts_with("s3://") && shard.ends_with("shard-000002.tar"),
            "index {with_index}: {err}"
        );
        let mut per_rank = Vec::new();
        let mut real = BTreeSet::new();
        let mut failed = 0;
        for rank in 0..2 {
            let ds = s3(&format!("c-{rank}"))
                .rank(rank)
                .world_size(2)
                .on_sample_error(OnSampleError::Skip)
                .build()
                .unwrap();
            let read = Read::new(4, 2).policy(SampleErrorPolicy::Skip);
            let planned = planned(&ds, read);
            let batches = run_rank(&ds, read, None);
            assert_eq!(batches.len(), planned, "index {with_index}, rank {rank}");
            let stats = ds.stats();
            assert_eq!(stats.padded, stats.failed(), "{stats:?}");
            failed += stats.failed() + stats.damaged_shards;
            let got = samples(&batches);
            per_rank.push(got.len());
            for s in got.iter().filter(|s| !s.pad) {
                assert!(real.insert(s.global), "sample {} twice", s.global);
            }
        }
        assert_eq!(per_rank[0], per_rank[1], "index {with_index}: {per_rank:?}");
        // Every sample before the damage arrives; what does not is counted.
        assert!(failed > 0, "index {with_index}");
        assert!((0..13).all(|g| real.contains(&g)), "index {with_index}");
    }
}

/// Every sample damaged (the case the property test found: 2 shards, both cut at their first
/// sample): no sample can pad the rank, so it yields an error under `Skip`, never fewer
/// batches than planned without a word.
#[test]
fn a_rank_with_nothing_readable_fails_instead_of_coming_up_short() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &[1, 3]);
    truncate(dir.path(), 0, 0);
    truncate(dir.path(), 1, 0);
    for workers in [1, 2] {
        let ds = builder(dir.path(), 2)
            .rank(0)
            .world_size(1)
            .on_sample_error(OnSampleError::Skip)
            .build()
            .unwrap();
        let batches = run_rank(
            &ds,
            Read::new(1, workers).policy(SampleErrorPolicy::Skip),
            None,
        );
        let errors: Vec<&String> = batches.iter().filter_map(|b| b.as_ref().err()).collect();
        assert!(!errors.is_empty(), "{workers} workers: {batches:?}");
        assert!(
            errors[0].contains("cannot be made up for") && errors[0].contains("rank 0"),
            "{}",
            errors[0]
        );
        assert!(batches.iter().all(|b| b.is_err()), "{batches:?}");
        assert_eq!(ds.stats().unpadded, 4, "{:?}", ds.stats());
    }
}
