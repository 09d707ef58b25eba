//! `ShardedDataset` over local shard files, through the loader: every sample once, equal
//! ranks with marked padding, counts from the writer's index or from a scan, epochs, resume,
//! MDS, and errors that name the shard, member and offset through `on_sample_error`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use longshore_data::{IterableDataset, WorkerInfo};
use longshore_loader::SampleErrorPolicy;
use longshore_shards::dataset::{CountSource, DatasetSpec, ShardedDataset, ShardedDatasetBuilder};
use longshore_shards::mds::{MdsWriter, Value};
use longshore_shards::order::{EpochPlan, ResumeState, sample_seed};
use support::data::{Seen, pattern, run_rank, write_shards};

const COUNTS: [u64; 7] = [9, 4, 0, 13, 7, 1, 11]; // 45 samples

fn builder(dir: &Path, n: usize) -> ShardedDatasetBuilder {
    ShardedDataset::webdataset([pattern(&dir.display().to_string(), n)])
        .cache_dir(dir.join("cache"))
        .batch_size(4)
        .seed(11)
        .shuffle_block(10)
}

fn flat(batches: Vec<Result<Vec<Seen>, String>>) -> Vec<Seen> {
    batches.into_iter().flat_map(|b| b.unwrap()).collect()
}

#[test]
fn every_sample_once_through_a_loader_with_workers() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let ds = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    assert_eq!(ds.len(), 45);
    assert!(
        ds.spec()
            .counted_by
            .iter()
            .all(|c| matches!(c, CountSource::WidsIndex(u) if u.ends_with("shard-index.json")))
    );
    for workers in [1, 3] {
        let batches = run_rank(&ds, workers, None, SampleErrorPolicy::FailBatch);
        assert_eq!(batches.len() as u64, ds.num_batches().unwrap());
        let seen = flat(batches);
        let mut ids: Vec<u64> = seen.iter().map(|s| s.global).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..45).collect::<Vec<_>>(), "{workers} workers");
        for s in &seen {
            assert_eq!(s.val, s.global, "the sample read is the one planned");
            assert_eq!(s.seed, sample_seed(11, 0, s.global));
            assert!(!s.pad);
        }
        // The loader's order is the plan's.
        let plan = ds.plan().unwrap();
        let planned: Vec<u64> = plan
            .rank(0)
            .unwrap()
            .batches()
            .flatten()
            .map(|s| s.sample.global)
            .collect();
        let got: Vec<u64> = seen.iter().map(|s| s.global).collect();
        assert_eq!(got, planned, "{workers} workers");
    }
}

#[test]
fn ranks_get_equal_counts_and_padding_is_marked() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    for drop_last in [false, true] {
        let mut all: Vec<Seen> = Vec::new();
        let mut per_rank = Vec::new();
        for rank in 0..4 {
            let ds = builder(dir.path(), COUNTS.len())
                .rank(rank)
                .world_size(4)
                .drop_last(drop_last)
                .build()
                .unwrap();
            let seen = flat(run_rank(&ds, 2, None, SampleErrorPolicy::FailBatch));
            per_rank.push(seen.len());
            all.extend(seen);
        }
        assert!(per_rank.iter().all(|&n| n == per_rank[0]), "{per_rank:?}");
        let real: Vec<u64> = {
            let mut v: Vec<u64> = all.iter().filter(|s| !s.pad).map(|s| s.global).collect();
            v.sort_unstable();
            v
        };
        let pads = all.iter().filter(|s| s.pad).count();
        if drop_last {
            // 45 samples over 4 ranks of batches of 4: 2 batches each, 13 dropped.
            assert_eq!((per_rank[0], pads, real.len()), (8, 0, 32));
            assert!(real.windows(2).all(|w| w[0] < w[1]), "no sample twice");
        } else {
            // ceil(45 / 4) = 12 each: 3 padding repeats.
            assert_eq!((per_rank[0], pads), (12, 3));
            assert_eq!(real, (0..45).collect::<Vec<_>>());
        }
    }
}

#[test]
fn counts_come_from_a_scan_without_an_index() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    std::fs::remove_file(dir.path().join("shard-index.json")).unwrap();
    let ds = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    assert_eq!(ds.spec().counts, COUNTS);
    assert!(ds.spec().counted_by.iter().all(|c| *c == CountSource::Scan));
    let seen = flat(run_rank(&ds, 2, None, SampleErrorPolicy::FailBatch));
    assert_eq!(seen.len(), 45);
}

#[test]
fn the_spec_travels_as_json_and_epochs_reshuffle() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let a = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let spec = DatasetSpec::from_json(&a.spec().to_json()).unwrap();
    assert_eq!(&spec, a.spec());
    let b = ShardedDataset::from_spec(spec)
        .cache_dir(dir.path().join("cache"))
        .batch_size(4)
        .seed(11)
        .shuffle_block(10)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let order = |ds: &ShardedDataset| -> Vec<(u64, u64)> {
        ds.iter(WorkerInfo::single(0))
            .map(|s| {
                let s = s.unwrap();
                (s.id.global, s.seed)
            })
            .collect()
    };
    assert_eq!(order(&a), order(&b));
    let e0 = order(&a);
    a.set_epoch(1);
    let e1 = order(&a);
    assert_ne!(e0, e1, "another epoch, another order and other seeds");
    assert!(e1.iter().all(|&(g, s)| s == sample_seed(11, 1, g)));
}

#[test]
fn resume_on_the_same_and_other_layouts() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let make = |rank, world, workers| {
        builder(dir.path(), COUNTS.len())
            .rank(rank)
            .world_size(world)
            .num_workers(workers)
            .build()
            .unwrap()
    };
    for (world2, workers2) in [(2, 3), (3, 1), (1, 2)] {
        // Two ranks of 3 workers take 2 batches each, then the job resumes elsewhere.
        let mut delivered: Vec<Seen> = Vec::new();
        let mut state: Option<ResumeState> = None;
        for rank in 0..2 {
            let ds = make(rank, 2, 3);
            ds.set_epoch(2);
            delivered.extend(flat(run_rank(
                &ds,
                3,
                Some(2),
                SampleErrorPolicy::FailBatch,
            )));
            let s = ds.state_dict(2).unwrap();
            assert!(
                state.as_ref().is_none_or(|t| *t == s),
                "every rank's state is the same"
            );
            state = Some(s);
        }
        let state: ResumeState =
            serde_json::from_str(&serde_json::to_string(&state.unwrap()).unwrap()).unwrap();
        let mut pads = 0;
        for rank in 0..world2 {
            let ds = make(rank, world2, workers2);
            ds.load_state_dict(&state).unwrap();
            assert_eq!(ds.epoch(), 2);
            let rest = flat(run_rank(&ds, workers2, None, SampleErrorPolicy::FailBatch));
            pads += rest.iter().filter(|s| s.pad).count() as u64;
            delivered.extend(rest);
            // The resumed epoch's samples keep their epoch's seeds.
            assert!(
                delivered
                    .iter()
                    .all(|s| s.seed == sample_seed(11, 2, s.global))
            );
        }
        let mut real: Vec<u64> = delivered
            .iter()
            .filter(|s| !s.pad)
            .map(|s| s.global)
            .collect();
        real.sort_unstable();
        assert_eq!(
            real,
            (0..45).collect::<Vec<_>>(),
            "to {world2} ranks x {workers2}"
        );
        let ds = make(0, world2, workers2);
        ds.load_state_dict(&state).unwrap();
        assert_eq!(pads, ds.plan().unwrap().padding());
        // set_epoch to another epoch drops the resume.
        ds.set_epoch(3);
        assert_eq!(
            ds.num_batches().unwrap(),
            EpochPlan::new(
                ds.plan().unwrap().order().clone(),
                ds.plan().unwrap().layout()
            )
            .batches_per_rank()
        );
    }
}

#[test]
fn a_damaged_shard_names_the_shard_the_member_and_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    // Shard 3 (13 samples, 2 members each): break the checksum of sample 5's first header.
    let path = dir.path().join("shard-000003.tar");
    let mut bytes = std::fs::read(&path).unwrap();
    let spans = longshore_shards::webdataset::ShardReader::new("x", bytes.as_slice())
        .scan()
        .unwrap();
    let at = spans[5].offset as usize;
    bytes[at + 148..at + 156].copy_from_slice(b"0000000\0");
    std::fs::write(&path, &bytes).unwrap();
    let ds = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    // Skip: every other sample arrives. Of shard 3, samples 5.. lie after the damage, and
    // sample 4, whose last member might continue past it, is not trusted either.
    let seen = flat(run_rank(&ds, 2, None, SampleErrorPolicy::Skip));
    let first = COUNTS[..3].iter().sum::<u64>();
    let mut ids: Vec<u64> = seen.iter().map(|s| s.global).collect();
    ids.sort_unstable();
    let want: Vec<u64> = (0..45)
        .filter(|g| !(first + 4..first + 13).contains(g))
        .collect();
    assert_eq!(ids, want);
    // FailBatch: the error names the shard and the byte offset of the damage.
    let batches = run_rank(&ds, 1, None, SampleErrorPolicy::FailBatch);
    let errors: Vec<&String> = batches.iter().filter_map(|b| b.as_ref().err()).collect();
    assert!(!errors.is_empty());
    let e = errors[0];
    assert!(e.contains("shard-000003.tar"), "{e}");
    // The reader stops after the damaged 512-byte header.
    let offset: usize = e
        .rsplit("at byte ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert!((at..=at + 512).contains(&offset), "{e}");
    assert!(e.contains("checksum"), "{e}");
    assert!(e.contains("reading sample"), "{e}");
}

#[test]
fn a_missing_required_field_is_an_error_item() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS[..2]);
    let ds = builder(dir.path(), 2)
        .rank(0)
        .world_size(1)
        .require(["val", "jpg"])
        .build()
        .unwrap();
    let items: Vec<_> = ds.iter(WorkerInfo::single(0)).collect();
    assert_eq!(items.len(), 13);
    let e = support::data::chain(items[0].as_ref().unwrap_err());
    assert!(e.contains("missing required field \"jpg\""), "{e}");
    assert!(e.contains("shard-00000"), "{e}");
}

#[test]
fn a_loader_with_other_workers_than_built_for_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS[..2]);
    let ds = builder(dir.path(), 2)
        .rank(0)
        .world_size(1)
        .num_workers(3)
        .build()
        .unwrap();
    let batches = run_rank(&ds, 2, None, SampleErrorPolicy::FailBatch);
    assert!(!batches.is_empty());
    for b in batches {
        let e = b.unwrap_err();
        assert!(
            e.contains("the loader runs 2 workers, the dataset was built for 3"),
            "{e}"
        );
    }
}

#[test]
fn mds_samples_by_column() {
    let dir = tempfile::tempdir().unwrap();
    let mut w =
        MdsWriter::new(dir.path(), &[("label", "int"), ("text", "str")], Some(300)).unwrap();
    for i in 0..30i64 {
        w.write(&[
            ("label", Value::Int(i)),
            ("text", Value::Str(format!("t{i}"))),
        ])
        .unwrap();
    }
    let index = w.finish().unwrap();
    assert!(index.shards.len() > 2, "several shards");
    let root = dir.path().display().to_string();
    let mut seen = BTreeMap::new();
    for rank in 0..2 {
        let ds = ShardedDataset::mds([root.clone()])
            .cache_dir(dir.path().join("cache"))
            .rank(rank)
            .world_size(2)
            .batch_size(3)
            .build()
            .unwrap();
        assert!(
            ds.spec()
                .counted_by
                .iter()
                .all(|c| matches!(c, CountSource::MdsIndex(_)))
        );
        for worker in 0..2 {
            for s in ds.iter(WorkerInfo::new(worker, 2, 0).unwrap()) {
                let s = s.unwrap();
                let Value::Int(label) = s.value("label").unwrap() else {
                    panic!("an int column");
                };
                assert_eq!(s.value("text").unwrap(), Value::Str(format!("t{label}")));
                assert_eq!(s.get("label").unwrap(), label.to_le_bytes());
                assert!(seen.insert(label, s.id.global).is_none());
            }
        }
    }
    assert_eq!(seen.len(), 30);
    assert!(seen.iter().all(|(l, g)| *l as u64 == *g));
}

#[test]
fn decode_with_errors_name_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS[..2]);
    let ds = builder(dir.path(), 2)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let labels = ds
        .clone()
        .decode_with(|s| Ok((s.sample.int("val")?, u8::from(s.pad))));
    let mut vals: Vec<i64> = labels
        .iter(WorkerInfo::single(0))
        .map(|r| r.unwrap().0)
        .collect();
    vals.sort_unstable();
    assert_eq!(vals, (0..13).collect::<Vec<i64>>());
    let broken = ds.decode_with(|s| Ok(s.sample.int("bin")?));
    let e = broken
        .iter(WorkerInfo::single(0))
        .next()
        .unwrap()
        .unwrap_err();
    let e = support::data::chain(&e);
    assert!(e.starts_with("decoding sample "), "{e}");
    assert!(e.contains("shard-00000") && e.contains("is not"), "{e}");
}

#[test]
fn a_loader_without_workers_reads_the_rank_once() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let ds = builder(dir.path(), COUNTS.len())
        .rank(1)
        .world_size(2)
        .build()
        .unwrap();
    let seen = flat(run_rank(&ds, 0, None, SampleErrorPolicy::FailBatch));
    let planned: Vec<u64> = ds
        .plan()
        .unwrap()
        .rank(1)
        .unwrap()
        .batches()
        .flatten()
        .map(|s| s.sample.global)
        .collect();
    assert_eq!(seen.iter().map(|s| s.global).collect::<Vec<_>>(), planned);
}
