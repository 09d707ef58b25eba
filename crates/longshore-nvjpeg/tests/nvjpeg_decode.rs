//! Device decoding on a GPU: nvJPEG's pixels against the CPU decoder, the train and val
//! pipelines against the CPU Compose, the hardware and the default backends, a batch mixing a
//! PNG and broken JPEGs under both sample-error policies, u8 outputs, and no leaked pinned
//! memory. Skips without a driver unless LONGSHORE_REQUIRE_CUDA=1. Each check prints what it
//! measured (run with `--nocapture`).

mod nvjpeg_support;

use std::path::Path;

use longshore_data::{DataError, Dataset, Tensor};
use longshore_loader::{DataLoader, DeviceBatch, LoaderError, SampleErrorPolicy};
use longshore_nvjpeg::{
    Backend, DecodedBy, EncodedCollate, EncodedImages, NvjpegDecoder, NvjpegStats, Payload,
};
use longshore_transfer::{Device, Stream};
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::transforms::{CenterCrop, Normalize};
use longshore_vision::{Compose, ImageFolder, Output, RandomSource};
use nvjpeg_support::{Decoded, gpu, host_batch, write_mixed};

const SEED: u64 = 42;

fn encoded(root: &Path, compose: Compose) -> EncodedImages {
    EncodedImages::new(
        ImageFolder::new(root)
            .unwrap()
            .with_transform(compose)
            .random_source(RandomSource::PerSample { seed: SEED }),
    )
    .unwrap()
}

/// Decodes one host batch of `indices` with `decoder`, waits, and returns it.
fn decode_once(
    decoder: &mut NvjpegDecoder,
    data: &EncodedImages,
    indices: &[usize],
) -> DeviceBatch {
    let batch = host_batch(data, indices);
    decoder
        .decode(0, batch)
        .unwrap()
        .expect("a batch")
        .wait()
        .unwrap()
}

/// Max and mean absolute difference.
fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len());
    let (mut max, mut sum) = (0u8, 0u64);
    for (x, y) in a.iter().zip(b) {
        max = max.max(x.abs_diff(*y));
        sum += u64::from(x.abs_diff(*y));
    }
    (max, sum as f64 / a.len().max(1) as f64)
}

fn decoders(dev: &Device, data: &EncodedImages) -> Vec<(&'static str, NvjpegDecoder)> {
    let mut out = vec![(
        "default",
        NvjpegDecoder::with_backend(dev, data, Backend::Default).unwrap(),
    )];
    match NvjpegDecoder::with_backend(dev, data, Backend::Hardware) {
        Ok(d) => out.push(("hardware", d)),
        Err(e) => eprintln!("no hardware backend on this GPU: {e}"),
    }
    out
}

#[test]
fn decoded_pixels_match_the_cpu_decoder_on_both_backends() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let folder = ImageFolder::new(dir.path()).unwrap();
    let jpegs: Vec<_> = folder
        .samples()
        .iter()
        .filter(|(p, _)| p.extension().unwrap() == "jpg")
        .cloned()
        .collect();
    let first = encoded(dir.path(), Compose::imagenet_val());
    let names: Vec<&str> = decoders(&dev, &first).into_iter().map(|(n, _)| n).collect();
    for name in names {
        let (mut worst_max, mut worst_mean) = (0u8, 0f64);
        let mut hardware = 0;
        for (path, label) in &jpegs {
            let file = std::fs::read(path).unwrap();
            let cpu = decode_rgb(&file, &DecodeOptions::default()).unwrap();
            // An identity pipeline of the image's own size: the kernel copies the pixels.
            let crop = CenterCrop::with_size(cpu.height(), cpu.width()).unwrap();
            let compose = Compose::new([crop.into()], Output::U8Hwc).unwrap();
            let one = EncodedImages::new(
                ImageFolder::from_samples([(path.clone(), *label)]).with_transform(compose),
            )
            .unwrap();
            // The decoder's pipeline is fixed at construction: one per image.
            let mut d = NvjpegDecoder::with_backend(
                &dev,
                &one,
                if name == "hardware" {
                    Backend::Hardware
                } else {
                    Backend::Default
                },
            )
            .unwrap();
            let b = decode_once(&mut d, &one, &[0]);
            // The engines take baseline JPEGs; a progressive one goes to the default backend.
            let by = b.decoded_by()[0];
            match name {
                "hardware" => assert!(
                    matches!(by, DecodedBy::Hardware | DecodedBy::Default),
                    "{}: {by:?}",
                    path.display()
                ),
                _ => assert_eq!(by, DecodedBy::Default, "{}", path.display()),
            }
            hardware += usize::from(by == DecodedBy::Hardware);
            let got: Vec<u8> = b.read_images(d.stream()).unwrap();
            let (max, mean) = diff(&got, cpu.as_bytes());
            worst_max = worst_max.max(max);
            worst_mean = worst_mean.max(mean);
        }
        eprintln!(
            "{name} backend vs zune-jpeg: worst max abs diff {worst_max}, worst mean {worst_mean:.3}, {hardware} of {} by the engines",
            jpegs.len()
        );
        if name == "hardware" {
            assert!(hardware > 0, "no image went to the hardware engines");
        }
        assert!(
            worst_mean < 1.5,
            "{name}: mean abs diff {worst_mean} (max {worst_max})"
        );
    }
}

/// The CPU pipeline's output for `index` with the same seed and epoch.
fn cpu_tensor(root: &Path, compose: &Compose, index: usize) -> Tensor {
    let cpu = ImageFolder::new(root)
        .unwrap()
        .with_transform(compose.clone())
        .random_source(RandomSource::PerSample { seed: SEED });
    cpu.get(index).unwrap().0
}

/// Max and mean difference of normalised outputs, in 8-bit levels.
fn compare_normalised(got: &[f32], want: &[f32], plane: usize, n: Normalize) -> (f32, f32) {
    let (mut max, mut sum) = (0f32, 0f32);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let d = (a - b).abs() * 255.0 * n.std()[i / plane % 3];
        max = max.max(d);
        sum += d;
    }
    (max, sum / got.len() as f32)
}

fn check_pipeline(dev: &Device, compose: Compose, what: &str, max_mean: f32) {
    check_pipeline_share(dev, compose, what, max_mean, 0.0);
}

/// [`check_pipeline`] with `share` of the hardware JPEGs decoded by the workers; returns how
/// many images each decoder's stats count as decoded by the workers, and how many the
/// workers' routing sends as pixels.
fn check_pipeline_share(
    dev: &Device,
    compose: Compose,
    what: &str,
    max_mean: f32,
    share: f64,
) -> (Vec<u64>, u64) {
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), compose.clone()).cpu_share(share);
    let as_pixels = (0..data.folder().samples().len())
        .filter(|&i| data.read(i).unwrap().payload == Payload::Rgb)
        .count() as u64;
    let mut by_workers = Vec::new();
    for (name, decoder) in decoders(dev, &data) {
        let loader = DataLoader::builder(data.clone())
            .batch_size(5)
            .num_workers(2)
            .pin_memory(true)
            .collate(EncodedCollate)
            .build()
            .unwrap();
        let stream: Stream = decoder.stream().clone();
        let (mut worst_max, mut worst_mean, mut n) = (0f32, 0f32, 0);
        let on_gpu = loader.with_stage(decoder).depth(2);
        for batch in on_gpu.iter().unwrap() {
            let batch = batch.unwrap().wait().unwrap();
            let (h, w) = compose.output_size();
            assert_eq!(batch.shape(0).unwrap(), [batch.batch_size(), 3, h, w]);
            let got: Vec<f32> = batch.read_images(&stream).unwrap();
            let per = 3 * h * w;
            for (k, &index) in batch.indices().iter().enumerate() {
                let want = cpu_tensor(dir.path(), &compose, index);
                let want: &[f32] = want.as_slice().unwrap();
                let Output::Normalized(norm) = compose.output() else {
                    unreachable!()
                };
                let (max, mean) =
                    compare_normalised(&got[k * per..(k + 1) * per], want, h * w, norm.clone());
                worst_max = worst_max.max(max);
                worst_mean = worst_mean.max(mean);
                n += 1;
            }
            let labels: Vec<i64> = stream.read_to_vec(batch.buffer(1).unwrap()).unwrap();
            assert_eq!(labels, batch.host_labels());
        }
        assert_eq!(n, data.folder().samples().len());
        let stats = on_gpu.stage(|d| d.stats()).unwrap();
        eprintln!(
            "{what} ({name}, cpu share {share}): vs the CPU Compose, worst max {worst_max:.2} levels, worst mean {worst_mean:.3}, {} decoded by the workers",
            stats.worker
        );
        assert!(
            worst_mean < max_mean,
            "{what} ({name}): mean {worst_mean} levels (max {worst_max})"
        );
        by_workers.push(stats.worker);
    }
    (by_workers, as_pixels)
}

/// With a CPU share the workers decode that share of the hardware JPEGs (as pixels), the
/// device stage crops, resizes and normalises them with the rest, and the batch still matches
/// the CPU Compose; share 1 leaves the engines only what the workers cannot route.
#[test]
fn a_cpu_share_decodes_jpegs_in_the_workers_beside_the_engines() {
    let Some(dev) = gpu() else { return };
    let compose = Compose::train(64, Output::imagenet());
    // write_mixed: 12 JPEGs and one PNG; at share 0 the workers decode the PNG and any
    // progressive JPEG only.
    let mut base = 0;
    for share in [0.0, 0.5, 1.0] {
        let (counts, as_pixels) = check_pipeline_share(&dev, compose.clone(), "train", 2.0, share);
        for count in counts {
            assert_eq!(count, as_pixels, "share {share}: decoded by the workers");
        }
        if share == 0.0 {
            base = as_pixels;
            assert!((1..13).contains(&base), "share 0: {base} of 13 as pixels");
        } else if share == 0.5 {
            assert!(
                as_pixels > base && as_pixels < 13,
                "share 0.5: {as_pixels} of 13 as pixels (share 0: {base})"
            );
        } else {
            assert_eq!(as_pixels, 13, "share 1: every image");
        }
    }
}

#[test]
fn the_val_pipeline_matches_the_cpu_compose() {
    let Some(dev) = gpu() else { return };
    check_pipeline(&dev, Compose::val(96, 80, Output::imagenet()), "val", 1.5);
}

#[test]
fn the_train_pipeline_draws_the_same_boxes_and_matches_the_cpu_compose() {
    let Some(dev) = gpu() else { return };
    // A wrong box or flip would be tens of levels off on average.
    check_pipeline(&dev, Compose::train(64, Output::imagenet()), "train", 2.0);
}

#[test]
fn u8_outputs_match_the_cpu_compose() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    for output in [Output::U8Chw, Output::U8Hwc] {
        let compose = Compose::val(72, 64, output.clone());
        let data = encoded(dir.path(), compose.clone());
        let mut d = NvjpegDecoder::new(&dev, &data).unwrap();
        let indices: Vec<usize> = (0..data.folder().samples().len()).collect();
        let b = decode_once(&mut d, &data, &indices);
        assert_eq!(b.dtype(0).unwrap(), longshore_data::DType::U8);
        let got: Vec<u8> = b.read_images(d.stream()).unwrap();
        let per = 3 * 64 * 64;
        let mut worst = 0f64;
        for (k, &i) in b.indices().iter().enumerate() {
            let want = cpu_tensor(dir.path(), &compose, i);
            let (_, mean) = diff(&got[k * per..(k + 1) * per], want.as_slice::<u8>().unwrap());
            worst = worst.max(mean);
        }
        eprintln!("{output:?}: worst mean {worst:.3}");
        assert!(worst < 1.5, "{output:?}: {worst}");
    }
}

fn position(data: &EncodedImages, name: &str) -> usize {
    data.folder()
        .samples()
        .iter()
        .position(|(p, _)| p.ends_with(name))
        .unwrap()
}

#[test]
fn a_png_is_decoded_by_the_worker_and_broken_jpegs_follow_on_sample_error() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), true);
    let compose = Compose::val(48, 40, Output::imagenet());
    let data = encoded(dir.path(), compose.clone());
    let (png, truncated, garbled) = (
        position(&data, "x_image.png"),
        position(&data, "y_truncated.jpg"),
        position(&data, "z_garbled.jpg"),
    );
    // Skip: the header-less file is dropped by the worker, the truncated one by the device
    // stage; the PNG arrives decoded.
    let loader = DataLoader::builder(data.clone())
        .batch_size(64)
        .pin_memory(true)
        .on_sample_error(SampleErrorPolicy::Skip)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
    let stream = decoder.stream().clone();
    let on_gpu = loader.with_stage(decoder).depth(1);
    let mut it = on_gpu.iter().unwrap();
    let batch = it.next().unwrap().unwrap().wait().unwrap();
    let idx = batch.indices().to_vec();
    assert!(!idx.contains(&truncated), "{idx:?}");
    let k = idx
        .iter()
        .position(|&i| i == png)
        .expect("the png is in the batch");
    assert_eq!(batch.decoded_by()[k], DecodedBy::Worker);
    let got: Vec<f32> = batch.read_images(&stream).unwrap();
    let per = 3 * 40 * 40;
    let want = cpu_tensor(dir.path(), &compose, png);
    let (max, _) = compare_normalised(
        &got[k * per..(k + 1) * per],
        want.as_slice().unwrap(),
        1600,
        Normalize::imagenet(longshore_data::ImageLayout::Hwc),
    );
    assert!(
        max <= 1.01,
        "png through the device stage: max {max} levels"
    );
    match idx.iter().position(|&i| i == garbled) {
        Some(g) => eprintln!(
            "the garbled JPEG decoded without an error ({:?})",
            batch.decoded_by()[g]
        ),
        None => eprintln!("the garbled JPEG was refused and skipped"),
    }
    assert!(
        it.stage().unwrap().stats().skipped >= 1,
        "{:?}",
        it.stage().unwrap().stats()
    );
    drop(it);

    // FailBatch in the device stage: the truncated JPEG is a sample error naming it.
    let decoder = NvjpegDecoder::new(&dev, &data)
        .unwrap()
        .on_sample_error(SampleErrorPolicy::FailBatch);
    let on_gpu = loader.with_stage(decoder).depth(1);
    let mut it = on_gpu.iter().unwrap();
    match it.next().unwrap() {
        Err(LoaderError::Sample { index, source, .. }) => {
            assert_eq!(index, truncated);
            let DataError::InvalidFile { path, reason } = &source else {
                panic!("{source:?}")
            };
            assert!(path.ends_with("y_truncated.jpg"), "{path:?}: {reason}");
        }
        Err(e) => panic!("expected the truncated file's error, got {e}"),
        Ok(_) => panic!("expected the truncated file's error, got a batch"),
    }
}

#[test]
fn every_pinned_lease_goes_back_to_the_pool() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), Compose::imagenet_train());
    let loader = DataLoader::builder(data.clone())
        .batch_size(4)
        .num_workers(2)
        .pin_memory(true)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
    let on_gpu = loader.with_stage(decoder).depth(2);
    for epoch in 0..2 {
        data.images().set_epoch(epoch);
        let mut n = 0;
        for b in on_gpu.iter().unwrap() {
            n += b.unwrap().wait().unwrap().batch_size();
        }
        assert_eq!(n, data.folder().samples().len());
    }
    // Each lease goes back once its batch's work is done: the decoder's stream, drained.
    on_gpu.stage(|d| d.stream().synchronize().unwrap()).unwrap();
    let stats = loader.pool().stats();
    assert_eq!(stats.bytes_in_use, 0, "{stats:?}");
}

/// The device stage on 3 lane threads yields the batches of the single-threaded stage: same
/// order, labels and indices, the same pixels (per-sample randomness, one decoder library),
/// counts summed into the decoder; every lease back; a lane answers errors in place.
#[test]
fn lanes_yield_what_one_thread_yields() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), Compose::imagenet_train());
    let loader = DataLoader::builder(data.clone())
        .batch_size(3)
        .num_workers(2)
        .pin_memory(true)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    let mut runs = Vec::new();
    for lanes in [1, 3] {
        // The same epoch both times: its per-sample crops follow the loader's epoch.
        loader.set_epoch(0);
        let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
        let stream: Stream = decoder.stream().clone();
        let on_gpu = loader.with_stage(decoder).lanes(lanes).depth(2);
        let mut out = Vec::new();
        for b in on_gpu.iter().unwrap() {
            let b = b.unwrap().wait().unwrap();
            let px: Vec<f32> = b.read_images(&stream).unwrap();
            out.push((b.indices().to_vec(), b.host_labels().to_vec(), px));
        }
        let stats = on_gpu
            .lanes_kept(|l| l.iter().map(|d| d.stats()).sum::<NvjpegStats>())
            .unwrap();
        assert_eq!(
            stats.images() as usize,
            data.folder().samples().len(),
            "{stats:?}"
        );
        runs.push(out);
    }
    assert_eq!(runs[0].len(), runs[1].len());
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1));
        let worst = max_diff(&a.2, &b.2);
        assert!(worst < 1e-4, "lanes changed pixels by {worst}");
    }
    assert_eq!(loader.pool().stats().bytes_in_use, 0);
}

/// The lanes of an epoch are kept in the decoder and reused by the next epoch (their nvJPEG
/// states are not made again), which then yields what the first did; counts add up.
#[test]
fn lanes_are_kept_across_epochs() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), Compose::imagenet_val());
    let n = data.folder().samples().len();
    let loader = DataLoader::builder(data.clone())
        .batch_size(4)
        .num_workers(2)
        .pin_memory(true)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
    let stream: Stream = decoder.stream().clone();
    let on_gpu = loader.with_stage(decoder).lanes(2).depth(2);
    let mut epochs = Vec::new();
    for epoch in 1..=2u64 {
        let mut out = Vec::new();
        for b in on_gpu.iter().unwrap() {
            let b = b.unwrap().wait().unwrap();
            let px: Vec<f32> = b.read_images(&stream).unwrap();
            out.push((b.indices().to_vec(), px));
        }
        assert_eq!(on_gpu.lanes_kept(|l| l.len()), Some(2), "epoch {epoch}");
        let s = on_gpu
            .lanes_kept(|l| l.iter().map(|d| d.stats()).sum::<NvjpegStats>())
            .unwrap();
        assert_eq!(s.images() as usize, epoch as usize * n, "{s:?}");
        epochs.push(out);
    }
    assert_eq!(epochs[0].len(), epochs[1].len());
    for (a, b) in epochs[0].iter().zip(&epochs[1]) {
        assert_eq!(a.0, b.0);
        let worst = max_diff(&a.1, &b.1);
        assert!(worst < 1e-4, "reused lanes changed pixels by {worst}");
    }
    assert_eq!(loader.pool().stats().bytes_in_use, 0);
}

/// A checkpoint after k batches, with the stage holding more than that, restores exactly the
/// batches the training loop had not received, with the same crops (per-sample randomness),
/// on one lane and on two.
#[test]
fn resume_after_k_batches_yields_the_rest_with_the_same_crops() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), Compose::imagenet_train());
    let build = || {
        DataLoader::builder(data.clone())
            .batch_size(2)
            .num_workers(2)
            .shuffle(true)
            .seed(11)
            .pin_memory(true)
            .collate(EncodedCollate)
            .build()
            .unwrap()
    };
    let read = |b: DeviceBatch, stream: &Stream| {
        let b = b.wait().unwrap();
        (b.indices().to_vec(), b.read_images::<f32>(stream).unwrap())
    };
    for (lanes, depth) in [(1, 2), (2, 1)] {
        let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
        let stream: Stream = decoder.stream().clone();
        let full_loader = build();
        let full: Vec<_> = full_loader
            .with_stage(decoder)
            .lanes(lanes)
            .depth(2)
            .iter()
            .unwrap()
            .map(|b| read(b.unwrap(), &stream))
            .collect();
        let k = 2;
        assert!(
            full.len() > k + 2 * lanes,
            "the stage must hold batches past k"
        );
        let first = build();
        let on_gpu = first
            .with_stage(NvjpegDecoder::new(&dev, &data).unwrap())
            .lanes(lanes)
            .depth(depth);
        let mut it = on_gpu.iter().unwrap();
        let mut got: Vec<_> = (0..k)
            .map(|_| read(it.next().unwrap().unwrap(), &stream))
            .collect();
        let state = first.state_dict().unwrap();
        drop(it);
        let resumed = build();
        resumed.load_state_dict(&state).unwrap();
        let rest = resumed
            .with_stage(NvjpegDecoder::new(&dev, &data).unwrap())
            .lanes(lanes);
        got.extend(rest.iter().unwrap().map(|b| read(b.unwrap(), &stream)));
        assert_eq!(got.len(), full.len(), "lanes {lanes}");
        for (a, b) in got.iter().zip(&full) {
            assert_eq!(a.0, b.0, "lanes {lanes}");
            let worst = max_diff(&a.1, &b.1);
            assert!(
                worst < 1e-4,
                "lanes {lanes}: the resumed crops differ by {worst}"
            );
        }
    }
}

/// The largest absolute difference between two images' values.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn the_decoders_stream_has_the_greatest_priority_and_a_normal_one_decodes_the_same() {
    let Some(dev) = gpu() else { return };
    use longshore_transfer::StreamPriority;
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = encoded(dir.path(), Compose::imagenet_val());
    let indices: Vec<usize> = (0..data.len()).collect();
    let priority = |s: &Stream| {
        let mut p = 1234;
        // SAFETY: the raw handle is a live stream of the device's context, `s` outlives the call.
        unsafe {
            cudarc::driver::sys::cuStreamGetPriority(s.as_raw().unwrap().cast(), &mut p)
                .result()
                .unwrap()
        };
        p
    };
    let mut high = NvjpegDecoder::new(&dev, &data).unwrap();
    let (least, greatest) = cudarc::driver::result::stream::get_priority_range().unwrap();
    assert!(greatest < least, "({least}, {greatest})");
    assert_eq!(priority(high.stream()), greatest);
    assert_eq!(
        priority(high.lane().unwrap().stream()),
        greatest,
        "a lane inherits it"
    );
    let a = decode_once(&mut high, &data, &indices);
    let mut normal = NvjpegDecoder::new(&dev, &data)
        .unwrap()
        .stream_priority(StreamPriority::Normal)
        .unwrap();
    assert_eq!(priority(normal.stream()), 0);
    assert_eq!(priority(normal.lane().unwrap().stream()), 0);
    let b = decode_once(&mut normal, &data, &indices);
    let read = |d: &DeviceBatch| -> Vec<u8> {
        let s = dev.new_stream().unwrap();
        s.read_to_vec::<u8>(d.buffer(0).unwrap()).unwrap()
    };
    assert_eq!(read(&a), read(&b), "the same pixels on either stream");
}
