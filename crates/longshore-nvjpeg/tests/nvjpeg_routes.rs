//! The workers' routes on a GPU: trusting them changes no pixel and no route against nvJPEG's
//! own per-image checks, a batch where a worker's route is wrong (a progressive JPEG marked
//! for the hardware engines) falls back image by image with no image lost, the ceiling runs
//! every stage, and the device stage's phases add up to its wall time. Skips without a driver
//! unless LONGSHORE_REQUIRE_CUDA=1.

mod nvjpeg_support;

use std::path::Path;

use jpeg_encoder::{ColorType, Encoder};
use longshore_data::Batch;
use longshore_host::HostBuffer;
use longshore_loader::{DataLoader, DeviceBatch};
#[cfg(feature = "ceiling")]
use longshore_nvjpeg::CeilingStage;
use longshore_nvjpeg::{
    DecodedBy, EncodedCollate, EncodedImages, META, META_FIELDS, NvjpegDecoder, Payload, entries,
};
use longshore_vision::{Compose, ImageFolder};
use nvjpeg_support::{Decoded, gpu, write_mixed};

/// The mixed folder plus `b/p_progressive.jpg` and `b/q_cmyk.jpg`.
fn folder(root: &Path) -> (EncodedImages, Vec<u8>) {
    write_mixed(root, false);
    let (w, h) = (61u16, 47u16);
    let px = |c: usize| -> Vec<u8> {
        (0..usize::from(w) * usize::from(h) * c)
            .map(|i| ((i * 31 + (i / 61) * 7) % 253) as u8)
            .collect()
    };
    let mut progressive = Vec::new();
    let mut e = Encoder::new(&mut progressive, 90);
    e.set_progressive(true);
    e.encode(&px(3), w, h, ColorType::Rgb).unwrap();
    std::fs::write(root.join("b/p_progressive.jpg"), &progressive).unwrap();
    let mut cmyk = Vec::new();
    Encoder::new(&mut cmyk, 90)
        .encode(&px(4), w, h, ColorType::Cmyk)
        .unwrap();
    std::fs::write(root.join("b/q_cmyk.jpg"), &cmyk).unwrap();
    let data = EncodedImages::new(
        ImageFolder::new(root)
            .unwrap()
            .with_transform(Compose::imagenet_val()),
    )
    .unwrap();
    (data, progressive)
}

fn host_batch(data: &EncodedImages) -> Batch<HostBuffer> {
    let indices: Vec<usize> = (0..data.folder().samples().len()).collect();
    nvjpeg_support::host_batch(data, &indices)
}

/// The host batch with the progressive file's pixels replaced by the file itself, marked as a
/// JPEG the hardware engines take: a wrong worker route.
fn wrongly_routed(data: &EncodedImages, progressive: &[u8]) -> (Batch<HostBuffer>, usize) {
    let mut batch = host_batch(data);
    let (rows, _) = entries(&batch).unwrap();
    let k = rows
        .iter()
        .position(|e| {
            data.folder().samples()[e.index]
                .0
                .ends_with("p_progressive.jpg")
        })
        .unwrap();
    let e = rows[k];
    assert_eq!(e.payload, Payload::Rgb);
    assert!(
        progressive.len() <= e.len,
        "the file fits in its pixels' place"
    );
    let bytes: &mut [u8] = batch.tensor_mut(0).unwrap();
    bytes[e.offset..e.offset + progressive.len()].copy_from_slice(progressive);
    let meta = batch.layout().position(META).unwrap();
    let meta: &mut [i64] = batch.tensor_mut(meta).unwrap();
    let row = &mut meta[k * META_FIELDS..(k + 1) * META_FIELDS];
    row[2] = 0; // payload: jpeg
    row[4] = progressive.len() as i64;
    row[7] = 1; // hardware
    (batch, k)
}

fn run(decoder: &mut NvjpegDecoder, batch: Batch<HostBuffer>) -> (DeviceBatch, Vec<f32>) {
    let b = decoder.decode(0, batch).unwrap().unwrap().wait().unwrap();
    let px = b.read_images(decoder.stream()).unwrap();
    (b, px)
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn trusting_the_workers_routes_changes_no_pixel_and_no_route() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = folder(dir.path());
    let mut trusting = NvjpegDecoder::new(&dev, &data).unwrap();
    let mut checking = NvjpegDecoder::new(&dev, &data).unwrap().verify_routes(true);
    let (a, pa) = run(&mut trusting, host_batch(&data));
    let (b, pb) = run(&mut checking, host_batch(&data));
    println!(
        "trusting {:?}\nchecking {:?}",
        trusting.stats(),
        checking.stats()
    );
    assert_eq!(a.indices(), b.indices());
    assert_eq!(
        a.decoded_by(),
        b.decoded_by(),
        "nvJPEG's checks disagree with the walk"
    );
    assert_eq!(worst(&pa, &pb), 0.0);
    if trusting.uses_hardware() {
        assert!(a.decoded_by().contains(&DecodedBy::Hardware));
        // Only the CMYK file is left for nvJPEG's checks when the workers are trusted.
        assert!(trusting.stats().checked < checking.stats().checked);
    }
}

#[test]
fn a_wrong_worker_route_falls_back_image_by_image() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (data, progressive) = folder(dir.path());
    let n = data.folder().samples().len();
    let mut trusting = NvjpegDecoder::new(&dev, &data).unwrap();
    let mut checking = NvjpegDecoder::new(&dev, &data).unwrap().verify_routes(true);
    let (batch, k) = wrongly_routed(&data, &progressive);
    let (a, pa) = run(&mut trusting, batch);
    let (b, pb) = run(&mut checking, wrongly_routed(&data, &progressive).0);
    println!(
        "trusting {:?} {:?}\nchecking {:?}",
        trusting.stats(),
        a.decoded_by(),
        checking.stats()
    );
    assert_eq!(a.batch_size(), n, "no image lost");
    assert_eq!(b.batch_size(), n);
    assert_ne!(a.decoded_by()[k], DecodedBy::Worker);
    let w = worst(&pa, &pb);
    println!("worst difference to the checked path: {w}");
    // Both decoded every image with nvJPEG (or the CPU where nvJPEG refused): a level or two
    // of IDCT difference at most where the backends differ (1 level = 0.017 normalised).
    assert!(w < 0.1, "fallback changed pixels by {w}");
    if trusting.uses_hardware() {
        assert!(
            trusting.stats().hardware_batch_failures >= 1
                || a.decoded_by()[k] == DecodedBy::Hardware
        );
    }
}

#[cfg(feature = "ceiling")]
#[test]
fn the_ceiling_runs_every_stage() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = folder(dir.path());
    let batch = host_batch(&data);
    let (rows, _) = entries(&batch).unwrap();
    let jpegs = rows.iter().filter(|e| e.payload == Payload::Jpeg).count() as u64;
    let hardware = rows.iter().filter(|e| e.hardware).count() as u64;
    let mut decoder = NvjpegDecoder::new(&dev, &data).unwrap();
    for stage in CeilingStage::ALL {
        let r = decoder.ceiling(&batch, stage, 3);
        println!("{stage:?}: {r:?}");
        match stage {
            CeilingStage::Walk => assert_eq!(r.unwrap().images, 3 * jpegs),
            CeilingStage::Decode | CeilingStage::DecodeChecked if decoder.uses_hardware() => {
                let r = r.unwrap();
                assert!(
                    r.images > 0 && r.images <= 3 * hardware && r.seconds > 0.0,
                    "{r:?}"
                );
            }
            CeilingStage::Decode | CeilingStage::DecodeChecked => assert!(r.is_err()),
            // nvJPEG's GPU_HYBRID backend takes the JPEGs the workers route to the engines,
            // engines or not.
            CeilingStage::DecodeCuda => {
                let r = r.unwrap();
                assert!(
                    r.images > 0 && r.images <= 3 * hardware && r.seconds > 0.0,
                    "{r:?}"
                );
            }
            _ => assert_eq!(r.unwrap().images, 3 * rows.len() as u64),
        }
    }
    // The batch is still whole and decodes as usual afterwards.
    let b = decoder.decode(1, batch).unwrap().unwrap().wait().unwrap();
    assert_eq!(b.batch_size(), rows.len());
}

#[test]
fn the_device_stage_counts_and_times_every_batch() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = folder(dir.path());
    let loader = DataLoader::builder(data.clone())
        .batch_size(4)
        .num_workers(2)
        .pin_memory(true)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    let decoder = NvjpegDecoder::new(&dev, &data).unwrap();
    let on_gpu = loader.with_stage(decoder).depth(2);
    let mut images = 0;
    for b in on_gpu.iter().unwrap() {
        let b = b.unwrap().wait().unwrap();
        images += b.batch_size();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let s = on_gpu.stage(|d| d.stats()).unwrap();
    let d = on_gpu.stats();
    println!("{s:#?}\n{d:#?}");
    assert_eq!(images, data.folder().samples().len());
    assert_eq!(s.images() as usize, images);
    assert_eq!(s.batches as usize, images.div_ceil(4));
    assert_eq!(
        (d.batches as usize, d.samples as usize),
        (images.div_ceil(4), images)
    );
    // The consumer slept 2 ms per batch after the first.
    assert!(d.consumer_time.as_millis() as usize >= 2 * (images.div_ceil(4) - 1));
    // The decoder's phases are its share of the stage's time, which fits in the wall time.
    assert!(s.busy_time() <= d.stage_time, "{s:?} {d:?}");
    assert!(d.stage_time + d.source_wait <= d.wall_time, "{d:?}");
}
