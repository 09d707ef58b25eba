//! `ShardedDataset` over local shard files, through the loader: every sample once, equal
//! ranks with marked padding, counts from the writer's index or from a scan, epochs, resume,
//! MDS, and errors that name the shard, member and offset through `on_sample_error`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use longshore_data::{EpochLayout, IterableDataset, WorkerInfo};
use longshore_loader::LoaderState;
use longshore_loader::SampleErrorPolicy;
use longshore_shards::dataset::{CountSource, DatasetSpec, ShardedDataset, ShardedDatasetBuilder};
use longshore_shards::mds::{MdsWriter, Value};
use longshore_shards::order::sample_seed;
use support::data::{
    Read, Seen, pattern, planned, rank_loader, run_rank, take_batches, write_shards,
};

const COUNTS: [u64; 7] = [9, 4, 0, 13, 7, 1, 11]; // 45 samples

fn builder(dir: &Path, n: usize) -> ShardedDatasetBuilder {
    ShardedDataset::webdataset([pattern(&dir.display().to_string(), n)])
        .cache_dir(dir.join("cache"))
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
        let read = Read::new(4, workers);
        let batches = run_rank(&ds, read, None);
        assert_eq!(batches.len(), planned(&ds, read));
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
        let plan = ds.plan(0).unwrap();
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
                .build()
                .unwrap();
            let seen = flat(run_rank(&ds, Read::new(4, 2).drop_last(drop_last), None));
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
    let seen = flat(run_rank(&ds, Read::new(4, 2), None));
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
        .seed(11)
        .shuffle_block(10)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let order = |ds: &ShardedDataset, epoch| -> Vec<(u64, u64)> {
        ds.iter(WorkerInfo::single(0).with_epoch(epoch))
            .map(|s| {
                let s = s.unwrap();
                (s.id.global, s.seed)
            })
            .collect()
    };
    assert_eq!(order(&a, 0), order(&b, 0));
    let e0 = order(&a, 0);
    let e1 = order(&a, 1);
    assert_ne!(e0, e1, "another epoch, another order and other seeds");
    assert!(e1.iter().all(|&(g, s)| s == sample_seed(11, 1, g)));
}

#[test]
fn resume_on_the_same_and_other_layouts() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let make = |rank, world| {
        builder(dir.path(), COUNTS.len())
            .rank(rank)
            .world_size(world)
            .build()
            .unwrap()
    };
    for (world2, workers2) in [(2, 3), (3, 1), (1, 2)] {
        // Two ranks' loaders of 3 workers deliver 2 batches each, then the job resumes
        // elsewhere from the loaders' checkpoint.
        let mut delivered: Vec<Seen> = Vec::new();
        let mut state: Option<LoaderState> = None;
        for rank in 0..2 {
            let ds = make(rank, 2);
            let loader = rank_loader(&ds, Read::new(4, 3).epoch(2));
            delivered.extend(flat(take_batches(&loader, Some(2))));
            let s = loader.state_dict().unwrap();
            assert_eq!((s.epoch, s.done_prefix), (2, 2));
            assert!(s.stream.as_ref().unwrap().position.is_some());
            assert!(
                state.as_ref().is_none_or(|t| *t == s),
                "every rank's state is the same: {state:?} vs {s:?}"
            );
            state = Some(s);
        }
        let state: LoaderState =
            serde_json::from_str(&serde_json::to_string(&state.unwrap()).unwrap()).unwrap();
        let (mut pads, mut padding) = (0, 0);
        for rank in 0..world2 {
            let ds = make(rank, world2);
            let loader = rank_loader(&ds, Read::new(4, workers2));
            loader.load_state_dict(&state).unwrap();
            let rest = flat(take_batches(&loader, None));
            pads += rest.iter().filter(|s| s.pad).count() as u64;
            delivered.extend(rest);
            // The resumed epoch's samples keep their epoch's seeds.
            assert!(
                delivered
                    .iter()
                    .all(|s| s.seed == sample_seed(11, 2, s.global))
            );
            padding = ds.plan(2).unwrap().padding();
        }
        assert_eq!(pads, padding);
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
        // set_epoch to another epoch drops the restored position.
        let ds = make(0, world2);
        let loader = rank_loader(&ds, Read::new(4, workers2));
        loader.load_state_dict(&state).unwrap();
        loader.set_epoch(3);
        assert_eq!(
            loader.len(),
            Some(ds.plan(3).unwrap().batches_per_rank() as usize)
        );
        assert_eq!(loader.state_dict().unwrap().done_prefix, 0);
    }
}

#[test]
fn a_checkpoint_of_another_dataset_is_refused_naming_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS);
    let ds = builder(dir.path(), COUNTS.len())
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let loader = rank_loader(&ds, Read::new(4, 2).epoch(1));
    assert_eq!(take_batches(&loader, Some(3)).len(), 3);
    let state = loader.state_dict().unwrap();
    // Another seed: the order differs.
    let reseeded = builder(dir.path(), COUNTS.len())
        .seed(12)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let other = rank_loader(&reseeded, Read::new(4, 2));
    let e = other.load_state_dict(&state).unwrap_err().to_string();
    assert!(e.contains("cannot resume") && e.contains("seed: 11"), "{e}");
    // Other shards.
    let fewer = builder(dir.path(), 3)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let e = rank_loader(&fewer, Read::new(4, 2))
        .load_state_dict(&state)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shards"), "{e}");
    // drop_last is the loader's and part of the order: another one is refused.
    let e = rank_loader(&ds, Read::new(4, 2).drop_last(true))
        .load_state_dict(&state)
        .unwrap_err()
        .to_string();
    assert!(e.contains("drop_last: false"), "{e}");
    // A refused state changed nothing: the loader runs its own epoch 0.
    assert_eq!(other.state_dict().unwrap().epoch, 0);
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
    let seen = flat(run_rank(
        &ds,
        Read::new(4, 2).policy(SampleErrorPolicy::Skip),
        None,
    ));
    let first = COUNTS[..3].iter().sum::<u64>();
    let mut ids: Vec<u64> = seen.iter().map(|s| s.global).collect();
    ids.sort_unstable();
    let want: Vec<u64> = (0..45)
        .filter(|g| !(first + 4..first + 13).contains(g))
        .collect();
    assert_eq!(ids, want);
    // FailBatch: the error names the shard and the byte offset of the damage.
    let batches = run_rank(&ds, Read::new(4, 1), None);
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
fn an_epoch_is_split_by_the_layout_a_loader_begins_it_with() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), &COUNTS[..2]);
    let ds = builder(dir.path(), 2)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    // 13 samples over 3 workers in batches of 4: 4 batches (2, 1, 1).
    let layout = EpochLayout::new(0, 0, 4, false, 3);
    assert_eq!(ds.begin_epoch(&layout, None).unwrap(), Some(4));
    let stream = |id, workers| -> Vec<u64> {
        ds.iter(WorkerInfo::new(id, workers, 0).unwrap())
            .map(|s| s.unwrap().id.global)
            .collect()
    };
    let lens: Vec<usize> = (0..3).map(|w| stream(w, 3).len()).collect();
    assert_eq!(lens, [8, 4, 1]);
    // drop_last drops the short batch.
    let dropping = EpochLayout::new(1, 0, 4, true, 3);
    assert_eq!(ds.begin_epoch(&dropping, None).unwrap(), Some(3));
    // A read of another worker count outside a loader reads the epoch whole.
    let mut all: Vec<u64> = (0..2).flat_map(|w| stream(w, 2)).collect();
    all.sort_unstable();
    assert_eq!(all, (0..13).collect::<Vec<_>>());
    // A position is the dataset's: another kind of state is refused, naming it.
    let bad = longshore_data::StreamPosition::new(&[1, 2, 3]).unwrap();
    let e = ds.begin_epoch(&layout, Some(&bad)).unwrap_err().to_string();
    assert!(e.contains("cannot resume the dataset's stream"), "{e}");
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
    let seen = flat(run_rank(&ds, Read::new(4, 0), None));
    let planned: Vec<u64> = ds
        .plan(0)
        .unwrap()
        .rank(1)
        .unwrap()
        .batches()
        .flatten()
        .map(|s| s.sample.global)
        .collect();
    assert_eq!(seen.iter().map(|s| s.global).collect::<Vec<_>>(), planned);
}
