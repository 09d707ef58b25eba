//! `DeferredShards` + `DecodeCollate`: images decoded straight into the batch give the batches
//! `ImageShards` + `StackCollate` give, byte for byte, with any number of workers; an image
//! whose header reads but whose data does not decode fails while the batch is written, and the
//! loader still names that one sample (or skips it and fills its place from the stream)
//! through `Collate::check_item`.

use std::path::Path;

use longshore_data::IterableDataset;
use longshore_data::{Collate, StackCollate, WorkerInfo};
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy};
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::ShardWriter;
use longshore_vision::shards::ImageShards;
use longshore_vision::synth::{FolderSpec, write_folder};
use longshore_vision::{Compose, Output};

mod shards_support;

/// A tiny folder (4 classes x 3 images) packed into several shards.
fn packed(root: &Path) -> ShardedDataset {
    let (_, n) = shards_support::pack_tiny_folder(root);
    shards_support::open_shards(root, n, 5)
}

/// Each batch's tensor shapes and bytes.
type Batches = Vec<(Vec<Vec<usize>>, Vec<u8>)>;

fn collect<
    F: longshore_loader::Fetch<Output = longshore_data::Batch<S>>,
    S: longshore_data::Storage,
>(
    loader: &DataLoader<F>,
) -> Batches {
    loader
        .iter()
        .map(|b| {
            let b = b.unwrap();
            let shapes = (0..b.len()).map(|i| b.shape(i).unwrap().to_vec()).collect();
            (shapes, b.bytes().to_vec())
        })
        .collect()
}

#[test]
fn decoding_into_the_batch_gives_the_stacked_batches() {
    let dir = tempfile::tempdir().unwrap();
    let ds = packed(dir.path());
    for (compose, dtype_bytes) in [
        (Compose::train(24, Output::imagenet()), 4),
        (Compose::val(30, 24, Output::U8Chw), 1),
    ] {
        let images = ImageShards::new(ds.clone(), compose);
        for workers in [0, 1, 3] {
            for epoch in 0..2 {
                let stacked = DataLoader::iterable(images.clone())
                    .collate(StackCollate::new())
                    .batch_size(5)
                    .num_workers(workers)
                    .build()
                    .unwrap();
                stacked.set_epoch(epoch);
                let deferred = images.clone().deferred();
                let collate = deferred.collate();
                let direct = DataLoader::iterable(deferred)
                    .collate(collate)
                    .batch_size(5)
                    .num_workers(workers)
                    .build()
                    .unwrap();
                direct.set_epoch(epoch);
                let (want, got) = (collect(&stacked), collect(&direct));
                assert_eq!(want.len(), 3, "12 images in batches of 5");
                assert_eq!(got[0].0, vec![vec![5, 3, 24, 24], vec![5]]);
                assert_eq!(got[2].0, vec![vec![2, 3, 24, 24], vec![2]]);
                assert_eq!(got[0].1.len() % 8, 0);
                assert!(got[0].1.len() >= 5 * 3 * 24 * 24 * dtype_bytes + 5 * 8);
                assert!(
                    want == got,
                    "{workers} workers, epoch {epoch}: batches differ"
                );
            }
        }
    }
}

#[test]
fn names_and_layout_match_stack_collate_with_names() {
    let dir = tempfile::tempdir().unwrap();
    let ds = packed(dir.path());
    let images = ImageShards::new(ds, Compose::train(16, Output::imagenet()));
    let deferred = images.clone().deferred();
    let items: Vec<_> = deferred
        .iter(WorkerInfo::single(0))
        .take(4)
        .map(Result::unwrap)
        .collect();
    let tensors: Vec<_> = images
        .iter(WorkerInfo::single(0))
        .take(4)
        .map(Result::unwrap)
        .collect();
    let named = deferred.collate().with_names("image", "label");
    let layout = named.layout(&items).unwrap();
    let want = StackCollate::new()
        .with_names(["image", "label"])
        .layout(&tensors)
        .unwrap();
    assert_eq!(layout, want);
    assert_eq!(layout.position("label"), Some(1));
    let batch = named.collate(&items).unwrap();
    let stacked = StackCollate::new().collate(&tensors).unwrap();
    assert_eq!(batch.bytes(), stacked.bytes());
    assert!(
        items
            .iter()
            .all(|i| i.path().to_string_lossy().contains(".tar#"))
    );
    // An empty batch and a wrong buffer are errors, not panics.
    assert!(named.layout(&[]).is_err());
    let small = vec![0u8; 10];
    assert!(named.collate_into(&items, layout, small).is_err());
}

/// Shards of 9 images of which the one keyed `bad` is a JPEG cut in half: its header reads, its
/// data does not decode.
fn with_a_broken_image(root: &Path) -> ShardedDataset {
    let folder = root.join("folder");
    write_folder(&folder, &FolderSpec::tiny()).unwrap();
    let mut files: Vec<_> = walk(&folder)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "JPEG"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    let out = root.join("broken");
    let mut w = ShardWriter::new(&out, 1 << 20).unwrap();
    for (i, f) in files.iter().take(9).enumerate() {
        let bytes = std::fs::read(f).unwrap();
        let label = (i % 4).to_string();
        if i == 4 {
            let half = &bytes[..bytes.len() / 2];
            w.write("bad", &[("jpg", half), ("cls", label.as_bytes())])
                .unwrap();
        } else {
            w.write(
                &format!("img{i}"),
                &[("jpg", &bytes), ("cls", label.as_bytes())],
            )
            .unwrap();
        }
    }
    w.finish().unwrap();
    ShardedDataset::webdataset([format!("{}/shard-000000.tar", out.display())])
        .cache_dir(root.join("cache"))
        .shuffle(false)
        .rank(0)
        .world_size(1)
        .build()
        .unwrap()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_broken_image_in_a_batch_is_named_or_skipped_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ds = with_a_broken_image(dir.path());
    let deferred = ImageShards::new(ds, Compose::train(16, Output::imagenet())).deferred();
    // The header passes in the worker: the failure comes from the collation.
    let items: Vec<_> = deferred.iter(WorkerInfo::single(0)).collect();
    assert_eq!(items.len(), 9);
    for i in &items {
        if let Err(e) = i {
            panic!(
                "{e:#}: {:?}",
                std::error::Error::source(e).map(ToString::to_string)
            );
        }
    }
    let collate = deferred.collate();
    let bad = items
        .iter()
        .flatten()
        .position(|i| i.path().to_string_lossy().ends_with("#bad.jpg"))
        .expect("the broken sample");
    let err = collate
        .check_item(items[bad].as_ref().unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("#bad.jpg"), "{err}");

    // Fail the batch: the loader names the sample (its place in the stream) and its file.
    let fail = DataLoader::iterable(deferred.clone())
        .collate(collate.clone())
        .batch_size(4)
        .num_workers(1)
        .build()
        .unwrap();
    let results: Vec<_> = fail.iter().collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("the broken image fails its batch");
    match err {
        LoaderError::Sample { index, source, .. } => {
            assert_eq!(*index, bad);
            assert!(source.to_string().contains("#bad.jpg"), "{source}");
        }
        other => panic!("expected the sample named, got {other}"),
    }

    // Skip it: every other image is delivered once, batches refilled from the stream.
    for drop_last in [false, true] {
        let skip = DataLoader::iterable(deferred.clone())
            .collate(collate.clone())
            .batch_size(4)
            .drop_last(drop_last)
            .num_workers(2)
            .on_sample_error(SampleErrorPolicy::Skip)
            .build()
            .unwrap();
        let mut sizes = Vec::new();
        let mut labels = Vec::new();
        for b in skip.iter() {
            let b = b.unwrap();
            sizes.push(b.batch_size());
            labels.extend_from_slice(b.tensor::<i64>(1).unwrap());
        }
        assert_eq!(skip.stats().skipped_samples, 1);
        let total: usize = sizes.iter().sum();
        if drop_last {
            assert!(sizes.iter().all(|&s| s == 4), "{sizes:?}");
            assert!(total >= 4, "{sizes:?}");
        } else {
            assert_eq!(total, 8, "{sizes:?}");
            labels.sort_unstable();
            let mut want: Vec<i64> = (0..9).filter(|&i| i != 4).map(|i| i % 4).collect();
            want.sort_unstable();
            assert_eq!(labels, want);
        }
    }
}
