//! The worker side of device decoding, without a GPU: what EncodedCollate writes (file bytes,
//! PNGs as pixels, plans drawn with the CPU pipeline's draws), the loader's on_sample_error
//! for files whose header does not parse, where libnvjpeg is looked for and what the error
//! says when it is missing, and that the decoder refuses the Cpu device.

mod nvjpeg_support;

use longshore_data::DataError;
use longshore_loader::{DataLoader, LoaderError, SampleErrorPolicy};
use longshore_nvjpeg::plan::plan;
use longshore_nvjpeg::{EncodedCollate, EncodedImages, NVJPEG, NvjpegDecoder, Payload, entries};
use longshore_transfer::Device;
use longshore_transfer::cuda_libs::{self, Candidate, SearchEnv};
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::{Compose, ImageFolder, RandomSource, sample_rng};
use nvjpeg_support::write_mixed;

fn files(root: &std::path::Path, seed: u64) -> EncodedImages {
    EncodedImages::new(
        ImageFolder::new(root)
            .unwrap()
            .with_transform(Compose::imagenet_train())
            .random_source(RandomSource::PerSample { seed }),
    )
    .unwrap()
}

#[test]
fn batches_hold_the_files_the_pixels_of_pngs_and_the_cpu_pipelines_boxes() {
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = files(dir.path(), 5);
    // The dataset's own epoch applies outside a loader only: inside one, the loader's.
    data.images().set_epoch(7);
    let samples = data.folder().samples().to_vec();
    let loader = DataLoader::builder(data.clone())
        .batch_size(5)
        .num_workers(2)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    loader.set_epoch(2);
    let mut seen = 0;
    for batch in loader.iter() {
        let batch = batch.unwrap();
        let (rows, bytes) = entries(&batch).unwrap();
        let labels: &[i64] = batch.tensor_by_name("label").unwrap();
        for (row, label) in rows.iter().zip(labels) {
            let (path, class) = &samples[row.index];
            assert_eq!((*label, row.label), (*class as i64, *class as i64));
            let file = std::fs::read(path).unwrap();
            let got = &bytes[row.offset..row.offset + row.len];
            let image = decode_rgb(&file, &DecodeOptions::default()).unwrap();
            assert_eq!((row.width, row.height), (image.width(), image.height()));
            if path.extension().unwrap() == "png" || is_progressive(&file) {
                assert_eq!(row.payload, Payload::Rgb);
                assert_eq!(got, image.as_bytes());
            } else {
                assert_eq!(row.payload, Payload::Jpeg);
                assert_eq!(got, &file[..]);
            }
            // The plan is the CPU pipeline's, drawn from the same per-sample stream.
            let want = plan(
                Compose::imagenet_train().steps(),
                row.width,
                row.height,
                (224, 224),
                &mut sample_rng(5, 2, row.index),
            )
            .unwrap();
            assert_eq!(row.plan, want);
            seen += 1;
        }
    }
    assert_eq!(seen, samples.len());
}

/// With persistent workers the loader starts each next epoch's first batches while the
/// current one drains: their per-sample crops must still be the next epoch's, the same as
/// the CPU pipeline draws for `(seed, epoch, index)`, whatever the dataset's own epoch says.
#[test]
fn batches_started_early_draw_their_own_epochs_boxes() {
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = files(dir.path(), 11);
    let n = data.folder().samples().len();
    let loader = DataLoader::builder(data.clone())
        .batch_size(2)
        .num_workers(3)
        .persistent_workers(true)
        .prefetch_next_epoch(true)
        .shuffle(true)
        .collate(EncodedCollate)
        .build()
        .unwrap();
    for epoch in 0..4u64 {
        let mut seen = 0;
        for batch in loader.iter() {
            let batch = batch.unwrap();
            let (rows, _) = entries(&batch).unwrap();
            for row in rows {
                let want = plan(
                    Compose::imagenet_train().steps(),
                    row.width,
                    row.height,
                    (224, 224),
                    &mut sample_rng(11, epoch, row.index),
                )
                .unwrap();
                assert_eq!(row.plan, want, "epoch {epoch}, sample {}", row.index);
                seen += 1;
            }
        }
        assert_eq!(seen, n);
    }
    let stats = loader.stats();
    assert!(
        stats.speculative_batches > 0,
        "the test must cover batches started before their epoch's iterator"
    );
}

/// Whether a JPEG's frame header is progressive (SOF2), found independently of the crate's
/// marker walk: the first SOFn marker before the first scan.
fn is_progressive(file: &[u8]) -> bool {
    let sos = file
        .windows(2)
        .position(|w| w == [0xFF, 0xDA])
        .unwrap_or(file.len());
    file[..sos].windows(2).any(|w| w == [0xFF, 0xC2])
}

/// JPEGs the hardware engines do not take (progressive) are decoded by the worker and travel
/// as pixels, like PNGs; baseline JPEGs travel as files; grayscale baseline ones too.
#[test]
fn progressive_jpegs_are_decoded_by_the_worker() {
    use jpeg_encoder::{ColorType, Encoder};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    std::fs::create_dir_all(&root).unwrap();
    let (w, h) = (67u16, 41u16);
    let rgb: Vec<u8> = (0..usize::from(w) * usize::from(h) * 3)
        .map(|i| ((i * 13) % 241) as u8)
        .collect();
    let encode = |progressive: bool, color: ColorType, px: &[u8]| {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out, 90);
        e.set_progressive(progressive);
        e.encode(px, w, h, color).unwrap();
        out
    };
    let grey: Vec<u8> = rgb.iter().step_by(3).copied().collect();
    let files = [
        ("a_baseline.jpg", encode(false, ColorType::Rgb, &rgb)),
        ("b_progressive.jpg", encode(true, ColorType::Rgb, &rgb)),
        ("c_grey.jpg", encode(false, ColorType::Luma, &grey)),
        (
            "d_grey_progressive.jpg",
            encode(true, ColorType::Luma, &grey),
        ),
    ];
    for (name, bytes) in &files {
        std::fs::write(root.join(name), bytes).unwrap();
    }
    let data = files_of(dir.path());
    for (i, (name, file)) in files.iter().enumerate() {
        let s = data.read(i).unwrap();
        assert!(s.path.ends_with(name), "{:?}", s.path);
        assert_eq!((s.width, s.height), (usize::from(w), usize::from(h)));
        if name.contains("progressive") {
            assert!(is_progressive(file));
            assert_eq!(s.payload, Payload::Rgb, "{name}");
            let image = decode_rgb(file, &DecodeOptions::default()).unwrap();
            assert_eq!(s.bytes, image.as_bytes(), "{name}");
        } else {
            assert_eq!(s.payload, Payload::Jpeg, "{name}");
            assert_eq!(&s.bytes, file, "{name}");
        }
    }
}

/// The CPU share: the chosen JPEGs travel as the CPU decoder's pixels, the rest as files; the
/// choice is a fixed function of the index (the same on every read and every clone), nested
/// (a larger share adds files), and near the share on many files; PNGs are pixels anyway.
#[test]
fn a_cpu_share_of_jpegs_is_decoded_by_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let spec = longshore_vision::synth::FolderSpec {
        classes: 4,
        per_class: 50,
        mean_area: 1_500.0,
        quality: 80,
        seed: 3,
    };
    longshore_vision::synth::write_folder(dir.path(), &spec).unwrap();
    let data = files_of(dir.path());
    let n = data.folder().samples().len();
    assert_eq!(n, 200);
    // None: a progressive JPEG (the synthetic folder has 5%), which the workers decode anyway.
    let chosen = |d: &EncodedImages| -> Vec<Option<bool>> {
        (0..n)
            .map(|i| {
                let s = d.read(i).unwrap();
                let file = std::fs::read(&s.path).unwrap();
                let progressive = is_progressive(&file);
                match s.payload {
                    Payload::Rgb => {
                        assert!(!s.hardware);
                        let image = decode_rgb(&file, &DecodeOptions::default()).unwrap();
                        assert_eq!(s.bytes, image.as_bytes(), "sample {i}");
                        (!progressive).then_some(true)
                    }
                    Payload::Jpeg => {
                        assert!(!progressive && s.hardware, "sample {i}: a baseline JPEG");
                        assert_eq!(s.bytes, file, "sample {i}");
                        Some(false)
                    }
                    other => panic!("sample {i}: unexpected payload {other:?}"),
                }
            })
            .collect()
    };
    let none = chosen(&data);
    assert!(none.iter().all(|c| *c != Some(true)), "share 0 by default");
    assert_eq!(data.current_cpu_share(), 0.0);
    let m = none.iter().filter(|c| c.is_some()).count();
    assert!(m > 150, "{m} baseline JPEGs");
    let quarter = chosen(&data.clone().cpu_share(0.25));
    let half_data = data.clone().cpu_share(0.5);
    let half = chosen(&half_data);
    let count = |v: &[Option<bool>]| v.iter().filter(|c| **c == Some(true)).count();
    // Binomial(m, p): within 4 standard deviations.
    for (v, p) in [(&quarter, 0.25), (&half, 0.5)] {
        let (mean, sd) = (m as f64 * p, (m as f64 * p * (1.0 - p)).sqrt());
        let c = count(v) as f64;
        assert!((c - mean).abs() <= 4.0 * sd, "share {p}: {c} of {m}");
    }
    assert!(
        quarter
            .iter()
            .zip(&half)
            .all(|(q, h)| *q != Some(true) || *h == Some(true)),
        "nested"
    );
    assert_eq!(chosen(&half_data), half, "the same files each read");
    // Clones share the setting: a loader's workers see a change.
    let clone = half_data.clone();
    half_data.set_cpu_share(1.0);
    assert_eq!(clone.current_cpu_share(), 1.0);
    assert_eq!(count(&chosen(&clone)), m);
    clone.set_cpu_share(f64::NAN);
    assert_eq!(half_data.current_cpu_share(), 0.0);
    clone.set_cpu_share(7.0);
    assert_eq!(half_data.current_cpu_share(), 1.0);
    clone.set_cpu_share(-1.0);
    assert_eq!(count(&chosen(&half_data)), 0);
}

fn files_of(root: &std::path::Path) -> EncodedImages {
    files(root, 1)
}

#[test]
fn a_file_whose_header_does_not_parse_is_a_sample_error_or_skipped() {
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), true);
    let data = files(dir.path(), 0);
    let bad = data
        .folder()
        .samples()
        .iter()
        .position(|(p, _)| p.ends_with("w_badheader.jpg"))
        .unwrap();
    let build = |policy| {
        DataLoader::builder(data.clone())
            .batch_size(32)
            .collate(EncodedCollate)
            .on_sample_error(policy)
            .build()
            .unwrap()
    };
    let mut it = build(SampleErrorPolicy::FailBatch).iter();
    match it.next().unwrap() {
        Err(LoaderError::Sample { index, source, .. }) => {
            assert_eq!(index, bad);
            let DataError::InvalidFile { path, .. } = &source else {
                panic!("{source:?}")
            };
            assert!(path.ends_with("w_badheader.jpg"));
        }
        other => panic!("expected a sample error, got {other:?}"),
    }
    let batch = build(SampleErrorPolicy::Skip)
        .iter()
        .next()
        .unwrap()
        .unwrap();
    let (rows, _) = entries(&batch).unwrap();
    assert_eq!(rows.len(), data.folder().samples().len() - 1);
    assert!(rows.iter().all(|r| r.index != bad));
}

#[test]
fn libnvjpeg_is_looked_for_where_pip_and_the_toolkit_put_it() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("venv/lib/python3.12/site-packages/nvidia")).unwrap();
    let env = SearchEnv::with_vars(
        tmp.path(),
        &[("VIRTUAL_ENV", "/venv"), ("CUDA_HOME", "/opt/cuda")],
    );
    let c = cuda_libs::search_order_in(&NVJPEG, &env);
    let files: Vec<String> = c.iter().map(|c| c.file.display().to_string()).collect();
    assert_eq!(
        &files[..4],
        [
            "libnvjpeg.so.13",
            "libnvjpeg.so.12",
            "libnvjpeg.so.11",
            "libnvjpeg.so"
        ]
    );
    for want in [
        "/opt/cuda/lib64/libnvjpeg.so.12",
        "/venv/lib/python3.12/site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12",
        "/usr/local/cuda/lib64/libnvjpeg.so.12",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in {files:#?}");
    }
}

#[test]
fn a_missing_libnvjpeg_names_every_place_searched() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nvidia/nvjpeg/lib");
    let candidates = vec![
        Candidate {
            file: "libnvjpeg-longshore-absent.so.12".into(),
            origin: "the system search path (LD_LIBRARY_PATH, ldconfig cache)".into(),
        },
        Candidate {
            file: missing.join("libnvjpeg.so.12"),
            origin: "the nvidia-* pip packages of VIRTUAL_ENV (/venv)".into(),
        },
    ];
    let e = cuda_libs::load_from(&NVJPEG, &candidates).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("nvJPEG could not be loaded; searched, in order:"),
        "{text}"
    );
    assert!(
        text.contains("libnvjpeg-longshore-absent.so.12 ("),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}/ (no libnvjpeg.so.12)", missing.display())),
        "{text}"
    );
}

#[test]
fn the_decoder_needs_a_cuda_device_and_the_cpu_pipeline_remains() {
    let dir = tempfile::tempdir().unwrap();
    write_mixed(dir.path(), false);
    let data = files(dir.path(), 0);
    let e = NvjpegDecoder::new(&Device::cpu(), &data).unwrap_err();
    assert!(e.to_string().contains("cuda device"), "{e}");
    // The same folder decodes on the CPU path.
    let cpu = data
        .folder()
        .clone()
        .with_transform(Compose::imagenet_train());
    assert!(longshore_data::Dataset::get(&cpu, 0).is_ok());
}
