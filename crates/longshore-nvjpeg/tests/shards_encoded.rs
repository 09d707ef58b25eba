//! Image shards decoded on the GPU (feature `shards`). On any machine: the workers' host
//! batches (`EncodedShards` collated by `EncodedCollate`) hold every sample of the epoch once,
//! its JPEG as stored in its shard, its label, and the crop the CPU pipeline draws for it. On
//! a GPU (skipped, saying why, without a driver; a failure with LONGSHORE_REQUIRE_CUDA=1):
//! nvJPEG's device batches match `ImageShards`' CPU pixels sample by sample, in the train and
//! the val pipeline.

use std::collections::BTreeMap;
use std::path::Path;

use longshore_data::rng::epoch_rng;
use longshore_data::{IterableDataset, Tensor, WorkerInfo};
use longshore_loader::DataLoader;
use longshore_nvjpeg::{EncodedCollate, EncodedShards, Payload, entries};
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::pack_image_folder;
use longshore_transfer::Device;
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::shards::ImageShards;
use longshore_vision::synth::{FolderSpec, write_folder};
use longshore_vision::{Compose, Output};

mod shards_support;

const IMAGES: usize = 24;

/// 24 photo-like JPEGs (3 classes) packed into shards of about 150 KB; the dataset over them.
fn shards(dir: &Path) -> ShardedDataset {
    let folder = dir.join("folder");
    let spec = FolderSpec {
        classes: 3,
        per_class: IMAGES / 3,
        mean_area: 60_000.0,
        quality: 90,
        seed: 5,
    };
    write_folder(&folder, &spec).unwrap();
    let out = dir.join("shards");
    let index = pack_image_folder(&folder, &out, 150_000, Some(1)).unwrap();
    shards_support::dataset_over(&out, &index, 3, 8, dir)
}

/// Every sample of epoch `epoch` by global id: its image bytes, label and the CPU pipeline's
/// output.
fn reference(images: &ImageShards, epoch: u64) -> BTreeMap<usize, (Vec<u8>, i64, Tensor)> {
    let mut out = BTreeMap::new();
    for s in images
        .dataset()
        .iter(WorkerInfo::single(0).with_epoch(epoch))
    {
        let s = s.unwrap();
        let (tensor, label) = images.decode(&s).unwrap();
        let bytes = s.sample.image().unwrap().1.to_vec();
        out.insert(s.id.global as usize, (bytes, label, tensor));
    }
    out
}

#[test]
fn host_batches_carry_each_sample_once_with_its_bytes_label_and_crop() {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path());
    let compose = Compose::train(48, Output::imagenet());
    let images = ImageShards::new(ds.clone(), compose.clone());
    let want = reference(&images, 1);
    assert_eq!(want.len(), IMAGES);
    let encoded = EncodedShards::new(images).unwrap();
    let loader = DataLoader::iterable(encoded.clone())
        .collate(EncodedCollate)
        .batch_size(5)
        .num_workers(2)
        .build()
        .unwrap();
    loader.set_epoch(1);
    let (mut seen, mut as_jpeg) = (Vec::new(), 0);
    for batch in loader.iter() {
        let batch = batch.unwrap();
        let (rows, bytes) = entries(&batch).unwrap();
        for e in rows {
            let (jpeg, label, _) = &want[&e.index];
            assert_eq!(e.label, *label);
            let stored = &bytes[e.offset..e.offset + e.len];
            match e.payload {
                // A JPEG for the engines travels as stored in its shard ...
                Payload::Jpeg => {
                    assert_eq!(stored, jpeg.as_slice());
                    as_jpeg += 1;
                }
                // ... one they do not take (progressive, ...) as the worker's RGB pixels.
                _ => {
                    let rgb = decode_rgb(jpeg, &DecodeOptions::default()).unwrap();
                    assert_eq!(stored, rgb.into_vec().as_slice());
                }
            }
            seen.push(e.index);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..IMAGES).collect::<Vec<_>>());
    assert!(
        as_jpeg > IMAGES / 2,
        "{as_jpeg} of {IMAGES} left for the engines"
    );
    // The crop of each sample is the one its seed draws, whichever worker read it: the same
    // item from a one-worker iteration.
    for s in ds.iter(WorkerInfo::single(0)) {
        let s = s.unwrap();
        let item = encoded.encode(&s).unwrap();
        let mut rng = epoch_rng(s.seed, 0);
        let again = longshore_nvjpeg::PlannedSample::new(
            item.index,
            item.sample.clone(),
            &compose,
            &mut rng,
        )
        .unwrap();
        assert_eq!(item, again);
    }
}

#[test]
fn a_pipeline_the_device_cannot_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path());
    assert!(
        EncodedShards::new(ImageShards::new(
            ds.clone(),
            Compose::val(40, 32, Output::U8Chw)
        ))
        .is_ok()
    );
    // Two resizing steps: the device kernel resamples once.
    let twice = shards_support::resizing_twice();
    let err = EncodedShards::new(ImageShards::new(ds, twice)).unwrap_err();
    assert!(err.to_string().contains("2 resizing steps"), "{err}");
}

fn gpu() -> Option<Device> {
    longshore_testing::cuda_or_skip("CUDA test", Device::cuda(0))
}

fn check_on_gpu(dev: &Device, compose: Compose, what: &str, max_mean: f32) {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path());
    let images = ImageShards::new(ds.clone(), compose.clone());
    let want = reference(&images, 2);
    let encoded = EncodedShards::new(images).unwrap();
    let decoder = encoded.decoder(dev).unwrap();
    let stream = decoder.stream().clone();
    let loader = DataLoader::iterable(encoded)
        .collate(EncodedCollate)
        .batch_size(6)
        .num_workers(2)
        .pin_memory(true)
        .build()
        .unwrap()
        .with_stage(decoder)
        .depth(2);
    loader.loader().set_epoch(2);
    let Output::Normalized(norm) = compose.output() else {
        unreachable!("normalised pipelines")
    };
    let (h, w) = compose.output_size();
    let per = 3 * h * w;
    let (mut worst_mean, mut worst_max, mut seen) = (0f32, 0f32, Vec::new());
    for batch in loader.iter().unwrap() {
        let batch = batch.unwrap().wait().unwrap();
        assert_eq!(batch.shape(0).unwrap(), [batch.batch_size(), 3, h, w]);
        let info: &longshore_nvjpeg::NvjpegInfo = batch.extension().unwrap();
        let host = batch.to_host(&stream).unwrap();
        let got: &[f32] = host.tensor::<f32>(0).unwrap();
        let labels: &[i64] = host.tensor::<i64>(1).unwrap();
        for (k, &index) in info.indices().iter().enumerate() {
            let (_, label, cpu) = &want[&index];
            assert_eq!(labels[k], *label);
            let cpu: &[f32] = cpu.as_slice().unwrap();
            let (mut max, mut sum) = (0f32, 0f32);
            for (i, (a, b)) in got[k * per..(k + 1) * per].iter().zip(cpu).enumerate() {
                let d = (a - b).abs() * 255.0 * norm.std()[i / (h * w) % 3];
                max = max.max(d);
                sum += d;
            }
            worst_mean = worst_mean.max(sum / per as f32);
            worst_max = worst_max.max(max);
            seen.push(index);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..IMAGES).collect::<Vec<_>>());
    eprintln!(
        "{what}: nvJPEG vs ImageShards on the CPU, worst mean {worst_mean:.3} levels, worst max {worst_max:.1}"
    );
    assert!(
        worst_mean < max_mean,
        "{what}: mean {worst_mean} levels (max {worst_max})"
    );
}

#[test]
fn nvjpeg_batches_match_the_cpu_pipeline_sample_by_sample() {
    let Some(dev) = gpu() else { return };
    // A wrong box or flip would be tens of levels off on average.
    check_on_gpu(&dev, Compose::train(64, Output::imagenet()), "train", 2.0);
    check_on_gpu(&dev, Compose::val(72, 64, Output::imagenet()), "val", 1.5);
}
