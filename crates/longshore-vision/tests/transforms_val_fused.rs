//! `Resize` followed by `CenterCrop` is computed as one resize of the source box under the
//! crop (no intermediate image): its pixels must be those of resizing the whole image and
//! then cropping, as torchvision does, for every interpolation.

use longshore_data::rng::epoch_rng;
use longshore_vision::transforms::{CenterCrop, Interpolation, Resize};
use longshore_vision::{Compose, Output, RgbImage, Step, apply_steps};
use proptest::prelude::*;

/// A smooth gradient with texture, so that resampling errors would show.
fn image(w: usize, h: usize, seed: u32) -> RgbImage {
    let mut data = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let v = (x as u32 * (3 + c) + y as u32 * (5 + seed % 7))
                    .wrapping_add((x as u32 ^ y as u32).wrapping_mul(2_654_435_761 + seed) >> 27)
                    .wrapping_add(seed * (c + 1));
                data.push((v % 256) as u8);
            }
        }
    }
    RgbImage::from_vec(w, h, data).unwrap()
}

/// Resize, then crop, in two separate pipelines (nothing to fuse).
fn unfused(img: &RgbImage, resize: Resize, crop: CenterCrop) -> RgbImage {
    let mut rng = epoch_rng(0, 0);
    let resized = apply_steps(&[Step::Resize(resize)], img, &mut rng).unwrap();
    apply_steps(&[Step::CenterCrop(crop)], &resized, &mut rng).unwrap()
}

fn fused(img: &RgbImage, resize: Resize, crop: CenterCrop) -> Vec<u8> {
    let compose = Compose::new([resize.into(), crop.into()], Output::U8Hwc).unwrap();
    let mut rng = epoch_rng(0, 0);
    let mut out = vec![0u8; compose.output_bytes()];
    compose.apply_into(img, &mut rng, &mut out).unwrap();
    out
}

/// The largest absolute difference between two pixel buffers.
fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn interpolation(i: u8) -> Interpolation {
    match i % 3 {
        0 => Interpolation::Bilinear,
        1 => Interpolation::Bicubic,
        _ => Interpolation::Nearest,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96)
    ))]

    #[test]
    fn resize_then_center_crop_equals_cropping_the_resized_image(
        w in 8usize..160,
        h in 8usize..160,
        size in 4usize..96,
        crop_frac in 0.2f64..1.3,
        interp in 0u8..3,
        seed in 0u32..1000,
    ) {
        let img = image(w, h, seed);
        let resize = Resize::new(size).unwrap().interpolation(interpolation(interp));
        let crop = ((size as f64 * crop_frac) as usize).max(1);
        let crop = CenterCrop::new(crop).unwrap();
        let expected = unfused(&img, resize, crop);
        let got = fused(&img, resize, crop);
        prop_assert_eq!(got.len(), expected.as_bytes().len());
        let max = max_diff(&got, expected.as_bytes());
        // The same filter weights up to float rounding: at most one level apart.
        prop_assert!(max <= 1, "max difference {} ({}x{} -> {:?})", max, w, h, resize);
    }
}

#[test]
fn imagenet_val_matches_resize_then_crop_on_an_imagenet_sized_image() {
    let img = image(500, 375, 3);
    let (resize, crop) = (Resize::new(256).unwrap(), CenterCrop::new(224).unwrap());
    let expected = unfused(&img, resize, crop);
    let got = fused(&img, resize, crop);
    let diffs: Vec<u8> = got
        .iter()
        .zip(expected.as_bytes())
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
    assert!(
        diffs.iter().all(|&d| d <= 1),
        "a pixel differs by more than 1"
    );
    assert!(mean < 0.01, "mean difference {mean}");
}

/// Regressions found by the property above: a crop reaching the resized image's edge (the
/// source box overshot the image by a rounding error, and the resizer refused it), and an
/// upscale (2 levels off when fused; upscaling now takes the unfused path).
#[test]
fn edge_reaching_crops_and_upscales_equal_the_unfused_pipeline() {
    for (w, h, size, crop) in [(55, 54, 21, 21), (50, 75, 60, 33), (301, 97, 64, 64)] {
        let img = image(w, h, 3);
        let resize = Resize::new(size).unwrap();
        let crop = CenterCrop::new(crop).unwrap();
        let expected = unfused(&img, resize, crop);
        let got = fused(&img, resize, crop);
        assert_eq!(got.len(), expected.as_bytes().len());
        let max = max_diff(&got, expected.as_bytes());
        assert!(max <= 1, "{w}x{h} -> {size}, crop: max difference {max}");
    }
}
