//! Shards of any fields with the image decoded on the GPU (feature `shards`): CLIP-style
//! samples (`.jpg` + `.txt` + `.cls` + `.json`). On any machine: the workers' host batches
//! (`EncodedFields` collated by `FieldsCollate`) hold every sample of the epoch once, its JPEG as
//! stored in its shard with the crop the CPU pipeline draws, and each other field as the CPU
//! path's `RecordCollate` writes it; the refusals. On a GPU (skipped, saying why, without a
//! driver; a failure with LONGSHORE_REQUIRE_CUDA=1): the device batches equal the CPU path's
//! batches field by field (pixels within nvJPEG's decoding differences), and a sample the
//! device stage drops under `Skip` is dropped from every field.

use std::collections::BTreeMap;
use std::path::Path;

use longshore_data::rng::epoch_rng;
use longshore_data::{Batch, DataError, IterableDataset, Storage, WorkerInfo};
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy};
use longshore_nvjpeg::{EncodedFields, EncodedSample, NvjpegInfo, Payload, PlannedSample, entries};
use longshore_shards::dataset::ShardedDataset;
use longshore_shards::webdataset::ShardWriter;
use longshore_transfer::Device;
use longshore_vision::decode::decode_rgb;
use longshore_vision::shards::fields::{FieldKind, FieldRecords, ShardField};
use longshore_vision::synth::{FolderSpec, image_jpeg};
use longshore_vision::{Compose, DecodeOptions, Output};

mod shards_support;

const SAMPLES: usize = 22;

/// One sample's fields: a photo-like JPEG, a caption naming its number (non-ASCII too), its
/// number as the class and a JSON object.
fn sample(i: usize) -> (Vec<u8>, String, i64, String) {
    let spec = FolderSpec {
        classes: 3,
        per_class: SAMPLES,
        mean_area: 40_000.0,
        quality: 90,
        seed: 9,
    };
    let caption = format!("caption {i}: {}", "é".repeat(i % 4));
    let json = format!("{{\"n\": {i}, \"tags\": [\"a\", \"b{i}\"]}}");
    (image_jpeg(&spec, i % 3, i), caption, i as i64, json)
}

/// The samples in tar shards of about 100 KB (`truncated`: sample 7's JPEG cut in half, its
/// header intact), and the dataset over them.
fn shards(dir: &Path, truncated: bool) -> ShardedDataset {
    let out = dir.join("shards");
    let mut writer = ShardWriter::new(&out, 100_000).unwrap();
    for i in 0..SAMPLES {
        let (mut jpg, txt, cls, json) = sample(i);
        if truncated && i == 7 {
            jpg.truncate(jpg.len() / 2);
        }
        let cls = cls.to_string();
        writer
            .write(
                &format!("s{i:03}"),
                &[
                    ("jpg", &jpg),
                    ("txt", txt.as_bytes()),
                    ("cls", cls.as_bytes()),
                    ("json", json.as_bytes()),
                ],
            )
            .unwrap();
    }
    let index = writer.finish().unwrap();
    shards_support::dataset_over(&out, &index, 4, 6, dir)
}

/// The fields, the image in the middle: the device batch keeps their order.
fn fields() -> Vec<ShardField> {
    vec![
        ShardField::new("txt", FieldKind::Text),
        ShardField::new("jpg", FieldKind::Image),
        ShardField::new("cls", FieldKind::Int),
        ShardField::new("json", FieldKind::Json),
    ]
}

fn records(ds: &ShardedDataset, compose: &Compose) -> FieldRecords {
    FieldRecords::new(
        ds.clone(),
        fields(),
        Some(compose.clone()),
        DecodeOptions::default(),
    )
}

/// Sample `k` of a variable-length field's bytes and offsets.
fn item<'a>(bytes: &'a [u8], offsets: &[i64], k: usize) -> &'a str {
    std::str::from_utf8(&bytes[offsets[k] as usize..offsets[k + 1] as usize]).unwrap()
}

/// Each sample of a record batch with the other fields at tensors 3.. (`txt`, its offsets,
/// `cls`, `json`, its offsets): `(cls, caption, json)`.
fn others<S: Storage>(batch: &Batch<S>, first: usize) -> Vec<(i64, String, String)> {
    let (txt, txt_off) = (
        batch.tensor_bytes(first).unwrap(),
        batch.tensor::<i64>(first + 1).unwrap(),
    );
    let cls = batch.tensor::<i64>(first + 2).unwrap();
    let (json, json_off) = (
        batch.tensor_bytes(first + 3).unwrap(),
        batch.tensor::<i64>(first + 4).unwrap(),
    );
    (0..batch.batch_size())
        .map(|k| {
            (
                cls[k],
                item(txt, txt_off, k).to_owned(),
                item(json, json_off, k).to_owned(),
            )
        })
        .collect()
}

#[test]
fn host_batches_carry_the_image_encoded_and_every_other_field() {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path(), false);
    let compose = Compose::train(48, Output::imagenet());
    let encoded = EncodedFields::new(records(&ds, &compose)).unwrap();
    // The reference: each sample's seed by global id, from a one-worker pass.
    let seeds: BTreeMap<usize, u64> = ds
        .iter(WorkerInfo::single(0).with_epoch(1))
        .map(|s| {
            let s = s.unwrap();
            (s.id.global as usize, s.seed)
        })
        .collect();
    assert_eq!(seeds.len(), SAMPLES);
    let collate = encoded.collate();
    let loader = DataLoader::iterable(encoded)
        .collate(collate)
        .batch_size(5)
        .num_workers(2)
        .build()
        .unwrap();
    loader.set_epoch(1);
    let mut seen = Vec::new();
    for batch in loader.iter() {
        let batch = batch.unwrap();
        let names: Vec<&str> = batch
            .layout()
            .tensors()
            .iter()
            .map(|t| t.name.as_deref().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "bytes",
                "meta",
                "label",
                "txt",
                "txt.offsets",
                "cls",
                "json",
                "json.offsets"
            ]
        );
        let (rows, bytes) = entries(&batch).unwrap();
        let rest = others(&batch, 3);
        assert_eq!(rows.len(), rest.len());
        for (e, (cls, txt, json)) in rows.iter().zip(rest) {
            // Every field of a row is the same sample's: its number is in each.
            let i = cls as usize;
            let (jpg, want_txt, _, want_json) = sample(i);
            assert_eq!((txt, json), (want_txt, want_json));
            let stored = &bytes[e.offset..e.offset + e.len];
            match e.payload {
                // A JPEG for the engines travels as stored in its shard ...
                Payload::Jpeg => assert!(stored == jpg.as_slice(), "sample {i}"),
                // ... one they do not take (progressive, ...) as the worker's RGB pixels.
                _ => {
                    let rgb = decode_rgb(&jpg, &DecodeOptions::default()).unwrap();
                    assert!(stored == rgb.into_vec().as_slice(), "sample {i}");
                }
            }
            // The crop is the one the sample's seed draws, as the CPU path draws it.
            let image =
                EncodedSample::from_bytes("x".into(), 0, jpg, &DecodeOptions::default(), false)
                    .unwrap();
            let mut rng = epoch_rng(seeds[&e.index], 0);
            let again = PlannedSample::new(e.index, image, &compose, &mut rng).unwrap();
            assert_eq!(e.plan, again.plan, "sample {i}");
            seen.push(i);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..SAMPLES).collect::<Vec<_>>());
}

#[test]
fn one_image_field_and_a_pipeline_the_device_runs_are_required() {
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path(), false);
    let make = |fields: Vec<ShardField>, compose: Option<Compose>| {
        EncodedFields::new(FieldRecords::new(
            ds.clone(),
            fields,
            compose,
            DecodeOptions::default(),
        ))
    };
    let val = Some(Compose::val(40, 32, Output::U8Chw));
    let text = ShardField::new("txt", FieldKind::Text);
    let err = make(vec![text.clone()], val.clone()).unwrap_err();
    assert!(err.to_string().contains("one image field"), "{err}");
    let two = vec![
        ShardField::new("jpg", FieldKind::Image),
        ShardField::new("png", FieldKind::Image),
    ];
    let err = make(two, val.clone()).unwrap_err();
    assert!(err.to_string().contains("have 2"), "{err}");
    let image = ShardField::new("jpg", FieldKind::Image);
    let err = make(vec![image.clone(), text.clone()], None).unwrap_err();
    assert!(err.to_string().contains("needs a pipeline"), "{err}");
    let twice = shards_support::resizing_twice();
    let err = make(vec![image.clone(), text.clone()], Some(twice)).unwrap_err();
    assert!(err.to_string().contains("2 resizing steps"), "{err}");
    assert!(make(vec![image, text], val).is_ok());
}

fn gpu() -> Option<Device> {
    longshore_testing::cuda_or_skip("CUDA test", Device::cuda(0))
}

#[test]
fn device_batches_equal_the_cpu_batches_field_by_field() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path(), false);
    let compose = Compose::train(56, Output::imagenet());
    let Output::Normalized(norm) = compose.output() else {
        unreachable!("a normalised pipeline")
    };
    // The CPU path: the same records decoded by the workers.
    let cpu_records = records(&ds, &compose);
    let cpu_collate = cpu_records.collate();
    let cpu = DataLoader::iterable(cpu_records)
        .collate(cpu_collate)
        .batch_size(6)
        .num_workers(2)
        .build()
        .unwrap();
    cpu.set_epoch(3);
    let cpu: Vec<_> = cpu.iter().map(|b| b.unwrap()).collect();
    let encoded = EncodedFields::new(records(&ds, &compose)).unwrap();
    let decoder = encoded.decoder(&dev).unwrap();
    let stream = decoder.stream().clone();
    let collate = encoded.collate();
    let loader = DataLoader::iterable(encoded)
        .collate(collate)
        .batch_size(6)
        .num_workers(2)
        .pin_memory(true)
        .build()
        .unwrap()
        .with_stage(decoder)
        .depth(2);
    loader.loader().set_epoch(3);
    let per = 3 * 56 * 56;
    let (mut batches, mut worst_mean) = (0, 0f32);
    for (batch, want) in loader.iter().unwrap().zip(&cpu) {
        let batch = batch.unwrap().wait().unwrap();
        let names: Vec<&str> = (0..batch.len()).map(|i| batch.name(i).unwrap()).collect();
        assert_eq!(
            names,
            ["txt", "txt.offsets", "jpg", "cls", "json", "json.offsets"]
        );
        for i in 0..batch.len() {
            assert_eq!(batch.shape(i).unwrap(), want.shape(i).unwrap(), "{i}");
            assert_eq!(batch.dtype(i).unwrap(), want.layout().tensors()[i].dtype);
        }
        let host = batch.to_host(&stream).unwrap();
        // The other fields: the CPU batch's bytes exactly, on the device and on the host.
        for i in [0, 1, 3, 4, 5] {
            assert_eq!(host.tensor_bytes(i).unwrap(), want.tensor_bytes(i).unwrap());
        }
        let info: &NvjpegInfo = batch.extension().unwrap();
        let vars = info.variable_fields();
        assert_eq!(vars.len(), 2);
        assert_eq!(vars[0].0, want.tensor_bytes(0).unwrap());
        assert_eq!(vars[0].1, want.tensor::<i64>(1).unwrap());
        assert_eq!(vars[1].0, want.tensor_bytes(4).unwrap());
        // The images: nvJPEG's decoding within a level or two of the CPU's, same crops.
        let (got, cpu_px) = (
            host.tensor::<f32>(2).unwrap(),
            want.tensor::<f32>(2).unwrap(),
        );
        for k in 0..batch.batch_size() {
            let sum: f32 = got[k * per..(k + 1) * per]
                .iter()
                .zip(&cpu_px[k * per..(k + 1) * per])
                .enumerate()
                .map(|(j, (a, b))| (a - b).abs() * 255.0 * norm.std()[j / (56 * 56) % 3])
                .sum();
            worst_mean = worst_mean.max(sum / per as f32);
        }
        batches += 1;
    }
    assert_eq!(batches, cpu.len());
    eprintln!(
        "nvJPEG fields vs the CPU path: {batches} batches, worst mean {worst_mean:.3} levels"
    );
    assert!(worst_mean < 2.0, "mean {worst_mean} levels");
}

#[test]
fn a_sample_the_device_stage_drops_leaves_every_field() {
    let Some(dev) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ds = shards(dir.path(), true);
    let compose = Compose::val(40, 32, Output::imagenet());
    let build = |policy| {
        let encoded = EncodedFields::new(records(&ds, &compose)).unwrap();
        let decoder = encoded.decoder(&dev).unwrap();
        let collate = encoded.collate();
        DataLoader::iterable(encoded)
            .collate(collate)
            .batch_size(SAMPLES)
            .pin_memory(true)
            .on_sample_error(policy)
            .build()
            .unwrap()
            .with_stage(decoder)
            .depth(1)
    };
    let loader = build(SampleErrorPolicy::Skip);
    let stream = dev.new_stream().unwrap();
    let mut it = loader.iter().unwrap();
    let batch = it.next().unwrap().unwrap().wait().unwrap();
    assert_eq!(batch.batch_size(), SAMPLES - 1);
    let host = batch.to_host(&stream).unwrap();
    let cls = host.tensor::<i64>(3).unwrap().to_vec();
    assert!(!cls.contains(&7), "{cls:?}");
    let info: &NvjpegInfo = batch.extension().unwrap();
    let (txt, offsets) = &info.variable_fields()[0];
    assert_eq!(offsets.len(), SAMPLES);
    for (k, &c) in cls.iter().enumerate() {
        // Each row's caption, on the host and on the device, is its own sample's.
        let want = sample(c as usize).1;
        assert_eq!(item(txt, offsets, k), want);
        let (dt, doff) = (
            host.tensor_bytes(0).unwrap(),
            host.tensor::<i64>(1).unwrap(),
        );
        assert_eq!(item(dt, doff, k), want);
        let json = item(
            host.tensor_bytes(4).unwrap(),
            host.tensor::<i64>(5).unwrap(),
            k,
        );
        assert!(json.starts_with(&format!("{{\"n\": {c},")), "{json}");
    }
    assert_eq!(it.stage().unwrap().stats().skipped, 1);
    drop(it);
    // The loader counts what the stage left out of its batch, whatever the stage.
    assert_eq!(loader.stats().dropped, 1);
    // Raise: the truncated JPEG is an error naming its shard.
    let loader = build(SampleErrorPolicy::FailBatch);
    match loader.iter().unwrap().next().unwrap() {
        Err(LoaderError::Sample { source, .. }) => {
            let DataError::InvalidFile { path, .. } = &source else {
                panic!("{source:?}")
            };
            let path = path.display().to_string();
            assert!(
                path.contains("shard-") && path.contains("#sample "),
                "{path}"
            );
        }
        Err(e) => panic!("expected the truncated JPEG's error, got {e}"),
        Ok(_) => panic!("expected the truncated JPEG's error, got a batch"),
    }
}
