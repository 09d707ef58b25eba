//! Bad input: every broken file is a `DataError` naming the file and the reason (or decodes
//! as PIL decodes it), never a panic or a hang.

use longshore_data::{DataError, Dataset, rng::epoch_rng};
use longshore_vision::decode::{DecodeError, DecodeOptions, decode_rgb, probe};
use longshore_vision::synth::{FolderSpec, image_jpeg};
use longshore_vision::{Compose, ImageFolder, RgbImage};
use proptest::prelude::*;

mod png_support;

fn jpeg() -> Vec<u8> {
    image_jpeg(&FolderSpec::tiny(), 0, 0)
}

fn encode_jpeg(w: u16, h: u16, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

#[test]
fn a_truncated_jpeg_is_an_error() {
    let full = jpeg();
    for cut in [full.len() / 2, full.len() - 200, 20] {
        let err = decode_rgb(&full[..cut], &DecodeOptions::default()).unwrap_err();
        println!("cut at {cut}: {err}");
        assert!(matches!(err, DecodeError::Jpeg(_)), "{err:?}");
    }
}

#[test]
fn text_zero_bytes_and_other_formats_are_named() {
    let opts = DecodeOptions::default();
    assert_eq!(decode_rgb(b"", &opts), Err(DecodeError::Empty));
    let err = decode_rgb(b"just some text\n", &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a JPEG or PNG file (starts with 6a 75 73 74 20 73 6f 6d)"
    );
    assert_eq!(
        decode_rgb(b"GIF89a....", &opts),
        Err(DecodeError::Unsupported("gif"))
    );
    assert_eq!(
        decode_rgb(b"BM......", &opts),
        Err(DecodeError::Unsupported("bmp"))
    );
}

#[test]
fn one_pixel_images_decode_and_go_through_the_pipelines() {
    let j = decode_rgb(
        &encode_jpeg(1, 1, &[200, 100, 50]),
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!((j.width(), j.height()), (1, 1));
    let p = decode_rgb(
        &png_support::png_rgb(1, 1, &[200, 100, 50]),
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(p.as_bytes(), &[200, 100, 50]);
    for pipeline in [Compose::imagenet_train(), Compose::imagenet_val()] {
        let t = pipeline.apply(&p, &mut epoch_rng(1, 0)).unwrap();
        assert_eq!(t.shape(), &[3, 224, 224]);
        let v: &[f32] = t.as_slice().unwrap();
        let red = (200.0 / 255.0 - 0.485) / 0.229;
        // Upscaling one pixel gives that pixel everywhere (or zero padding for the val crop).
        assert!(
            v.iter()
                .take(224 * 224)
                .all(|x| (x - red).abs() < 1e-4 || (x + 0.485 / 0.229).abs() < 1e-4)
        );
    }
}

#[test]
fn images_over_the_pixel_limit_are_refused_from_the_header() {
    let big = encode_jpeg(300, 200, &vec![90u8; 300 * 200 * 3]);
    let opts = DecodeOptions::default().max_pixels(Some(300 * 200 - 1));
    let err = decode_rgb(&big, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::TooManyPixels {
                width: 300,
                height: 200,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(decode_rgb(&big, &opts.max_pixels(Some(300 * 200))).is_ok());
    // A header claiming 60000x60000 (3.6 G pixels) over 1 KB of data: refused by the default
    // limit (PIL's) before anything is allocated.
    let mut bomb = encode_jpeg(8, 8, &[7u8; 8 * 8 * 3]);
    let sof = bomb.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    bomb[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]);
    assert_eq!(probe(&bomb).unwrap().pixels(), 3_600_000_000);
    let err = decode_rgb(&bomb, &DecodeOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("exceeds the limit of 89478485 pixels"),
        "{err}"
    );
}

fn folder_with(files: &[(&str, &[u8])]) -> (tempfile::TempDir, ImageFolder) {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        let path = dir.path().join("class_a").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let folder = ImageFolder::new(dir.path()).unwrap();
    (dir, folder)
}

#[test]
fn dataset_errors_name_the_file_and_the_reason() {
    let good = jpeg();
    let truncated = &good[..good.len() / 2];
    let (dir, folder) = folder_with(&[
        ("a_good.jpg", &good),
        ("b_truncated.jpg", truncated),
        ("c_text.jpg", b"<html>not found</html>"),
        ("d_empty.jpg", b""),
        ("e_gone.jpg", &good),
    ]);
    std::fs::remove_file(dir.path().join("class_a/e_gone.jpg")).unwrap();
    let train = folder.with_transform(Compose::imagenet_train());
    assert!(train.get(0).is_ok());
    let expect = |i: usize, file: &str, reason: &str| {
        let err = train.get(i).unwrap_err();
        let msg = err.to_string();
        println!("{msg}");
        let path = match &err {
            DataError::InvalidFile { path, .. } | DataError::Io { path, .. } => path.clone(),
            other => panic!("unexpected error {other:?}"),
        };
        assert_eq!(path, dir.path().join("class_a").join(file));
        assert!(msg.contains(reason), "{msg:?} lacks {reason:?}");
    };
    expect(1, "b_truncated.jpg", "invalid jpeg");
    expect(2, "c_text.jpg", "not a JPEG or PNG file");
    expect(3, "d_empty.jpg", "empty file");
    expect(4, "e_gone.jpg", "i/o error");
}

#[test]
fn rgb_image_rejects_inconsistent_buffers() {
    assert!(RgbImage::from_vec(2, 2, vec![0; 11]).is_err());
    assert!(RgbImage::from_vec(2, 2, vec![0; 12]).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Corrupted JPEGs (random bytes overwritten, or cut) decode or fail; they never panic,
    /// and when they decode the pipeline runs on them.
    #[test]
    fn corrupted_jpegs_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = jpeg();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let len = cut.index(bytes.len() + 1);
        let bytes = &bytes[..len.max(1)];
        if let Ok(img) = decode_rgb(bytes, &DecodeOptions::default()) {
            let t = Compose::imagenet_val().apply(&img, &mut epoch_rng(0, 0)).unwrap();
            prop_assert_eq!(t.shape(), &[3, 224, 224]);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut with_magic = vec![0xFF, 0xD8, 0xFF];
        with_magic.extend_from_slice(&bytes);
        let _ = decode_rgb(&with_magic, &DecodeOptions::default());
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend_from_slice(&bytes);
        let _ = decode_rgb(&png, &DecodeOptions::default());
    }
}
