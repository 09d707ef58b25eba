//! The device path's geometry and arithmetic, checked on the CPU: a plan drawn with a seed
//! gives the CPU pipeline's boxes and flips (same draws), and `render_reference` (what the
//! kernel computes) matches the CPU `Compose` pixel for pixel within the stated tolerance.

use longshore_data::rng::epoch_rng;
use longshore_nvjpeg::plan::{check_steps, plan, render_reference};
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::synth::{FolderSpec, image_jpeg};
use longshore_vision::transforms::{
    CenterCrop, CropBox, Interpolation, RandomHorizontalFlip, RandomResizedCrop, Resize,
};
use longshore_vision::{Compose, Output, RgbImage, Step, apply_steps};
use proptest::prelude::*;

fn photo(area: f64, index: usize) -> RgbImage {
    let spec = FolderSpec {
        mean_area: area,
        ..FolderSpec::tiny()
    };
    decode_rgb(
        &image_jpeg(&spec, index % 4, index),
        &DecodeOptions::default(),
    )
    .unwrap()
}

/// Max and mean absolute difference of two u8 images.
fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len());
    let mut max = 0u8;
    let mut sum = 0u64;
    for (x, y) in a.iter().zip(b) {
        let d = x.abs_diff(*y);
        max = max.max(d);
        sum += u64::from(d);
    }
    (max, sum as f64 / a.len() as f64)
}

/// Runs `steps` both ways with the same seed and compares.
fn compare(steps: &[Step], image: &RgbImage, seed: u64) -> (u8, f64) {
    let cpu = apply_steps(steps, image, &mut epoch_rng(seed, 0)).unwrap();
    let p = plan(
        steps,
        image.width(),
        image.height(),
        (cpu.height(), cpu.width()),
        &mut epoch_rng(seed, 0),
    )
    .unwrap();
    let dev = render_reference(
        &p,
        image.as_bytes(),
        image.width(),
        cpu.width(),
        cpu.height(),
    );
    diff(cpu.as_bytes(), &dev)
}

fn train(size: usize) -> Vec<Step> {
    vec![
        RandomResizedCrop::new(size).unwrap().into(),
        RandomHorizontalFlip::default().into(),
    ]
}

fn val(resize: usize, crop: usize) -> Vec<Step> {
    vec![
        Resize::new(resize).unwrap().into(),
        CenterCrop::new(crop).unwrap().into(),
    ]
}

#[test]
fn the_train_pipeline_matches_the_cpu_within_one_level() {
    let mut worst = (0u8, 0f64);
    for (i, area) in [40_000.0, 140_000.0, 9_000.0].into_iter().enumerate() {
        let image = photo(area, i);
        for seed in 0..12 {
            let (max, mean) = compare(&train(64), &image, seed);
            worst = (worst.0.max(max), worst.1.max(mean));
        }
    }
    eprintln!("train: max {} mean {:.4}", worst.0, worst.1);
    assert!(worst.0 <= 1 && worst.1 < 0.02, "{worst:?}");
}

#[test]
fn the_val_pipeline_matches_the_cpu_within_one_level() {
    let image = photo(60_000.0, 1);
    let (max, mean) = compare(&val(72, 64), &image, 0);
    eprintln!("val: max {max} mean {mean:.4}");
    assert!(max <= 1 && mean < 0.02, "{max} {mean}");
    // ImageNet's sizes on a larger image.
    let image = photo(180_000.0, 2);
    let (max, mean) = compare(&val(256, 224), &image, 0);
    assert!(max <= 1 && mean < 0.02, "{max} {mean}");
}

#[test]
fn the_same_seed_draws_the_same_boxes_and_flips() {
    // A flip is visible in the pixels; a different box would be far off. Check the plan's
    // box against the CPU's own get_params directly too.
    let rrc = RandomResizedCrop::new(32).unwrap();
    for seed in 0..50 {
        let mut a = epoch_rng(seed, 3);
        let b = rrc.get_params(300, 200, &mut a);
        let flip = RandomHorizontalFlip::default().draw(&mut a);
        let p = plan(&train(32), 300, 200, (32, 32), &mut epoch_rng(seed, 3)).unwrap();
        assert_eq!(
            (p.box_x, p.box_y, p.box_w as usize, p.box_h as usize, p.flip),
            (b.left, b.top, b.width, b.height, flip)
        );
    }
}

#[test]
fn crops_flips_and_padding_around_the_resize_match() {
    let image = photo(20_000.0, 3);
    let cases: Vec<Vec<Step>> = vec![
        // A flip before the crop box is drawn: the box is mirrored.
        vec![
            RandomHorizontalFlip::new(1.0, longshore_data::ImageLayout::Hwc)
                .unwrap()
                .into(),
            RandomResizedCrop::new(40).unwrap().into(),
        ],
        // Crop before the resize, flip after.
        vec![
            CenterCrop::new(100).unwrap().into(),
            Resize::new(50).unwrap().into(),
            RandomHorizontalFlip::new(1.0, longshore_data::ImageLayout::Hwc)
                .unwrap()
                .into(),
            CenterCrop::new(40).unwrap().into(),
        ],
        // A CenterCrop larger than the image pads with zeros; a second one crops the pad.
        vec![
            Resize::new(30).unwrap().into(),
            CenterCrop::with_size(50, 70).unwrap().into(),
            RandomHorizontalFlip::new(1.0, longshore_data::ImageLayout::Hwc)
                .unwrap()
                .into(),
            CenterCrop::with_size(44, 66).unwrap().into(),
        ],
        // No resize at all: an exact crop.
        vec![CenterCrop::new(33).unwrap().into()],
        // Resize that does nothing (the short side is already that size).
        vec![
            Resize::new(image.width().min(image.height()))
                .unwrap()
                .into(),
            CenterCrop::new(20).unwrap().into(),
        ],
        // Upscaling.
        vec![
            CenterCrop::new(20).unwrap().into(),
            Resize::exact(50, 61).unwrap().into(),
        ],
        // A fixed box.
        vec![Step::ResizedCrop {
            crop: CropBox {
                top: 10,
                left: 5,
                height: 60,
                width: 90,
            },
            height: 24,
            width: 36,
            interpolation: Interpolation::Bilinear,
        }],
    ];
    for (i, steps) in cases.iter().enumerate() {
        for seed in 0..3 {
            let (max, mean) = compare(steps, &image, seed);
            assert!(max <= 1 && mean < 0.05, "case {i}: max {max} mean {mean}");
        }
    }
}

#[test]
fn pipelines_the_device_cannot_run_are_refused_up_front() {
    let bicubic = RandomResizedCrop::new(8)
        .unwrap()
        .interpolation(Interpolation::Bicubic);
    let e = check_steps(&[bicubic.into()]).unwrap_err().to_string();
    assert!(e.contains("Bicubic"), "{e}");
    let two = [
        Resize::new(10).unwrap().into(),
        RandomResizedCrop::new(8).unwrap().into(),
    ];
    let e = check_steps(&two).unwrap_err().to_string();
    assert!(e.contains("2 resizing steps"), "{e}");
    assert!(check_steps(Compose::imagenet_train().steps()).is_ok());
    assert!(check_steps(Compose::imagenet_val().steps()).is_ok());
    // Padding before the resize is refused per image, naming it.
    let pad_then_resize = [
        CenterCrop::new(50).unwrap().into(),
        Resize::new(20).unwrap().into(),
    ];
    let e = plan(&pad_then_resize, 30, 30, (20, 20), &mut epoch_rng(0, 0)).unwrap_err();
    assert!(e.to_string().contains("padding before Resize"), "{e}");
}

#[test]
fn normalised_output_is_the_u8_output_normalised() {
    // The kernel normalises the u8 value it computed, as the CPU's fused ToTensor+Normalize.
    let image = photo(20_000.0, 0);
    let c = Compose::val(40, 32, Output::U8Chw);
    let n = c.clone().with_output(Output::Normalized(
        longshore_vision::transforms::Normalize::imagenet(longshore_data::ImageLayout::Hwc),
    ));
    let u8s = c.apply(&image, &mut epoch_rng(0, 0)).unwrap();
    let f32s = n.apply(&image, &mut epoch_rng(0, 0)).unwrap();
    let (u8s, f32s): (&[u8], &[f32]) = (u8s.as_slice().unwrap(), f32s.as_slice().unwrap());
    let m = [0.485f32, 0.456, 0.406];
    let s = [0.229f32, 0.224, 0.225];
    for (i, (u, f)) in u8s.iter().zip(f32s).enumerate() {
        let ch = i / (32 * 32);
        let want = (f32::from(*u) / 255.0 - m[ch]) / s[ch];
        assert!((want - f).abs() < 1e-4, "{i}: {want} vs {f}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_size_and_seed_gives_the_cpu_pixels(
        w in 8usize..160,
        h in 8usize..160,
        out in 4usize..48,
        seed in 0u64..1000,
    ) {
        let image = photo(20_000.0, (w + h) % 7);
        // Crop the photo to w x h (top-left), so sizes vary freely.
        let (w, h) = (w.min(image.width()), h.min(image.height()));
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            px.extend_from_slice(&image.as_bytes()[y * image.width() * 3..][..w * 3]);
        }
        let image = RgbImage::from_vec(w, h, px).unwrap();
        for steps in [train(out), val(out + 3, out)] {
            let (max, mean) = compare(&steps, &image, seed);
            // The CPU val pipeline resizes only the crop's source box (a fused Resize +
            // CenterCrop, within 1 level of resizing then cropping: transforms_val_fused),
            // which is within 1 level of this reference: 2 at most, still rare. Tiny upscaled
            // crops (16x16 -> 21) differ by 1 on up to ~12% of values: the mean bound is 0.25,
            // half the pixel criterion (mean < 0.5).
            prop_assert!(max <= 2 && mean < 0.25, "{w}x{h} -> {out}: max {max} mean {mean}");
        }
    }
}
