//! `longshore::vision` through the loader: an ImageFolder decoded and transformed straight
//! into batches by worker threads, bad files handled by `on_sample_error`, and per-sample
//! crops that a resumed epoch draws again.
#![cfg(feature = "vision")]

use longshore::data::{DataError, DirectCollate};
use longshore::loader::{LoaderError, SampleErrorPolicy};
use longshore::prelude::*;
use longshore::vision::synth::{FolderSpec, write_folder};
use longshore::vision::{Compose, ImageFolder, Output, RandomSource};

fn folder() -> (tempfile::TempDir, ImageFolder) {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &FolderSpec::tiny()).unwrap();
    let folder = ImageFolder::new(dir.path()).unwrap();
    (dir, folder)
}

#[test]
fn train_and_val_pipelines_fill_batches_from_workers() {
    let (_dir, folder) = folder();
    for (pipeline, workers) in [(Compose::imagenet_train(), 2), (Compose::imagenet_val(), 0)] {
        let loader = DataLoader::builder(folder.clone().with_transform(pipeline))
            .collate(DirectCollate::new().with_names(["image", "label"]))
            .batch_size(5)
            .num_workers(workers)
            .pin_memory(true)
            .seed(1)
            .build()
            .unwrap();
        let mut labels = Vec::new();
        for batch in loader.iter() {
            let batch = batch.unwrap();
            let n = batch.batch_size();
            assert_eq!(batch.shape(0).unwrap(), &[n, 3, 224, 224]);
            let images: &[f32] = batch.tensor_by_name("image").unwrap();
            assert!(images.iter().all(|x| x.is_finite() && x.abs() < 3.0));
            labels.extend_from_slice(batch.tensor_by_name::<i64>("label").unwrap());
        }
        assert_eq!(labels, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    }
}

#[test]
fn bad_files_are_named_or_skipped_by_the_sample_error_policy() {
    let (dir, _) = folder();
    let bad = dir.path().join("n0001").join("zz_truncated.jpg");
    let good = std::fs::read(dir.path().join("n0001").join("n0001_00000.JPEG")).unwrap();
    std::fs::write(&bad, &good[..good.len() / 3]).unwrap();
    let folder = ImageFolder::new(dir.path()).unwrap();
    let bad_index = folder
        .samples()
        .iter()
        .position(|(p, _)| *p == bad)
        .unwrap();
    let val = folder.with_transform(Compose::val(40, 32, Output::U8Chw));

    let failing = DataLoader::builder(val.clone())
        .collate(DirectCollate::new())
        .batch_size(13)
        .num_workers(1)
        .build()
        .unwrap();
    let err = failing.iter().next().unwrap().unwrap_err();
    match &err {
        LoaderError::Sample {
            index,
            source: DataError::InvalidFile { path, reason },
            ..
        } => {
            assert_eq!(*index, bad_index);
            assert_eq!(path, &bad);
            assert!(reason.contains("invalid jpeg"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }

    let skipping = DataLoader::builder(val)
        .collate(DirectCollate::new())
        .batch_size(13)
        .num_workers(1)
        .on_sample_error(SampleErrorPolicy::Skip)
        .build()
        .unwrap();
    let batches: Vec<_> = skipping.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].shape(0).unwrap(), &[12, 3, 32, 32]);
    assert_eq!(skipping.stats().skipped_samples, 1);
}

#[test]
fn per_sample_crops_do_not_depend_on_the_number_of_workers() {
    let (_dir, folder) = folder();
    let train = folder
        .with_transform(Compose::train(24, Output::U8Chw))
        .random_source(RandomSource::PerSample { seed: 3 });
    let epoch_bytes = |workers: usize| {
        let loader = DataLoader::builder(train.clone())
            .collate(DirectCollate::new())
            .batch_size(4)
            .num_workers(workers)
            .seed(11)
            .build()
            .unwrap();
        loader
            .iter()
            .map(|b| b.unwrap().bytes().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(epoch_bytes(0), epoch_bytes(3));
}

/// The default: each sample draws from its own generator keyed by the loader's seed, so a
/// resumed epoch yields the uninterrupted epoch's batches bit for bit (crops and flips
/// included), on another number of workers too; another loader seed draws other crops.
#[test]
fn a_resumed_epoch_yields_the_same_pixels_by_default() {
    let (_dir, folder) = folder();
    let train = folder.with_transform(Compose::train(24, Output::U8Chw));
    let loader = |workers: usize, seed: u64| {
        DataLoader::builder(train.clone())
            .collate(DirectCollate::new())
            .batch_size(2)
            .shuffle(true)
            .num_workers(workers)
            .seed(seed)
            .build()
            .unwrap()
    };
    let bytes = |b: Batch<_>| b.bytes().to_vec();
    let whole: Vec<Vec<u8>> = loader(2, 3).iter().map(|b| bytes(b.unwrap())).collect();
    assert!(whole.len() >= 4, "{}", whole.len());
    for (workers, k) in [(2, 1), (3, 2), (0, 3)] {
        let first = loader(2, 3);
        let mut it = first.iter();
        for _ in 0..k {
            it.next().unwrap().unwrap();
        }
        let state = first.state_dict().unwrap();
        drop(it);
        let resumed = loader(workers, 3);
        resumed.load_state_dict(&state).unwrap();
        let rest: Vec<Vec<u8>> = resumed.iter().map(|b| bytes(b.unwrap())).collect();
        assert_eq!(
            rest,
            whole[k..].to_vec(),
            "{workers} workers, resumed after {k}"
        );
    }
    let other: Vec<Vec<u8>> = loader(2, 4).iter().map(|b| bytes(b.unwrap())).collect();
    assert_ne!(other, whole);
}
