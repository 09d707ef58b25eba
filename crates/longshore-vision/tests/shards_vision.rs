//! `ImageShards`: an ImageFolder packed into WebDataset shards trains like the folder — the
//! same `(image, label)` samples through the loader, the same pixels as longshore-vision's
//! ImageFolder for a deterministic pipeline, the same random crops whatever the number of
//! workers, and undecodable images named by shard and key.

use std::collections::BTreeMap;
use std::path::Path;

use longshore_data::{Dataset, IterableDataset, StackCollate, WorkerInfo};
use longshore_loader::DataLoader;
use longshore_shards::dataset::ShardedDataset;
use longshore_vision::shards::ImageShards;
use longshore_vision::{Compose, ImageFolder, Output};

mod shards_support;

/// A tiny folder (4 classes x 3 images) packed in torchvision's order into several shards.
fn packed(root: &Path) -> (ImageFolder, ShardedDataset) {
    let (folder, n) = shards_support::pack_tiny_folder(root);
    let ds = shards_support::open_shards(root, n, 3);
    (ImageFolder::new(&folder).unwrap(), ds)
}

#[test]
fn a_loader_batches_images_and_labels_like_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, ds) = packed(dir.path());
    let train = ImageShards::new(ds, Compose::train(32, Output::imagenet()));
    let loader = DataLoader::iterable(train.clone())
        .batch_size(4)
        .num_workers(2)
        .collate(StackCollate::new())
        .build()
        .unwrap();
    let mut labels = Vec::new();
    for batch in loader.iter() {
        let b = batch.unwrap();
        assert_eq!(b.shape(0).unwrap(), &[4, 3, 32, 32]);
        assert!(b.tensor::<f32>(0).unwrap().iter().all(|v| v.is_finite()));
        labels.extend_from_slice(b.tensor::<i64>(1).unwrap());
    }
    labels.sort_unstable();
    let mut want: Vec<i64> = folder.targets().iter().map(|&t| t as i64).collect();
    want.sort_unstable();
    assert_eq!(labels, want);
}

#[test]
fn a_fixed_pipeline_gives_the_folders_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, ds) = packed(dir.path());
    let val = Compose::val(36, 32, Output::imagenet());
    let from_folder = folder.with_transform(val.clone());
    let shards = ImageShards::new(ds.clone(), val);
    let mut n = 0;
    for s in ds.iter(WorkerInfo::single(0)) {
        let s = s.unwrap();
        let (image, label) = shards.decode(&s).unwrap();
        let (want, want_label) = from_folder.get(s.id.global as usize).unwrap();
        assert_eq!(label, want_label);
        assert_eq!(image.bytes(), want.bytes(), "sample {}", s.id.global);
        n += 1;
    }
    assert_eq!(n, 12);
}

#[test]
fn random_crops_follow_the_sample_not_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ds) = packed(dir.path());
    let train = ImageShards::new(ds.clone(), Compose::train(24, Output::imagenet()));
    let crops = |workers: usize, epoch: u64| -> BTreeMap<u64, Vec<u8>> {
        (0..workers)
            .flat_map(|w| ds.iter(WorkerInfo::new(w, workers, 99).unwrap().with_epoch(epoch)))
            .map(|s| {
                let s = s.unwrap();
                (s.id.global, train.decode(&s).unwrap().0.bytes().to_vec())
            })
            .collect()
    };
    let one = crops(1, 0);
    assert_eq!(one.len(), 12);
    assert_eq!(one, crops(3, 0));
    assert_ne!(one, crops(1, 1), "another epoch draws other crops");
}

#[test]
fn an_undecodable_image_is_named_by_shard_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bad");
    let mut w = longshore_shards::webdataset::ShardWriter::new(&out, 1 << 20).unwrap();
    w.write(
        "cat/0001",
        &[("jpg", b"\xff\xd8 not a jpeg"), ("cls", b"1")],
    )
    .unwrap();
    w.finish().unwrap();
    let ds = ShardedDataset::webdataset([format!("{}/shard-000000.tar", out.display())])
        .cache_dir(dir.path().join("cache"))
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    let shards = ImageShards::new(ds, Compose::train(16, Output::imagenet()));
    let err = shards
        .iter(WorkerInfo::single(0))
        .next()
        .unwrap()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("shard-000000.tar#cat/0001.jpg"), "{text}");
}
