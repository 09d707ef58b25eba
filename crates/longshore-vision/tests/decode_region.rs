//! A pipeline that starts with a crop decodes only the crop's region of a JPEG
//! (`Compose::decode_into` through libjpeg-turbo): its output must be, bit for bit, the
//! pipeline applied to the whole decoded image, with the generator left in the same state,
//! for every subsampling, progressive files, flips before the crop, crops that pad and
//! pipelines that read every pixel.

use std::path::Path;

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use longshore_data::ImageLayout;
use longshore_data::rng::{Rng, epoch_rng};
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::transforms::{
    CenterCrop, CropBox, Interpolation, RandomHorizontalFlip, RandomResizedCrop, Resize,
};
use longshore_vision::{Compose, Output, Step};
use proptest::prelude::*;
use rand_chacha::rand_core::RngCore;

fn jpeg(w: usize, h: usize, sampling: SamplingFactor, progressive: bool, seed: u64) -> Vec<u8> {
    let mut rng = epoch_rng(seed, 0);
    let px: Vec<u8> = (0..w * h * 3)
        .map(|i| {
            let smooth = ((i / 3) % w * 2 + (i / 3) / w * 3 + (i % 3) * 70) % 200;
            (smooth as u64 + longshore_data::rng::below(&mut rng, 56)) as u8
        })
        .collect();
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 85);
    e.set_sampling_factor(sampling);
    e.set_progressive(progressive);
    e.encode(&px, w as u16, h as u16, ColorType::Rgb).unwrap();
    out
}

fn flip() -> impl Strategy<Value = Step> {
    (0.0f64..=1.0).prop_map(|p| Step::from(RandomHorizontalFlip::new(p, ImageLayout::Hwc).unwrap()))
}

/// A leading crop (random resized, fixed resized, centre: inside or padding), maybe after
/// flips; or a pipeline that reads every pixel (a resize first).
fn pipeline() -> impl Strategy<Value = Vec<Step>> {
    let first = prop_oneof![
        4 => (4usize..40, 0.01f64..1.0).prop_map(|(s, lo)| {
            Step::from(RandomResizedCrop::new(s).unwrap().scale(lo, 1.0).unwrap())
        }),
        1 => (0i64..90, 0i64..90, 1usize..120, 1usize..120).prop_map(|(top, left, h, w)| {
            Step::ResizedCrop {
                crop: CropBox { top, left, height: h, width: w },
                height: 12,
                width: 10,
                interpolation: Interpolation::Bilinear,
            }
        }),
        1 => (1usize..130).prop_map(|s| Step::from(CenterCrop::new(s).unwrap())),
        1 => (4usize..60).prop_map(|s| Step::from(Resize::new(s).unwrap())),
    ];
    (
        proptest::collection::vec(flip(), 0..3),
        first,
        proptest::option::of(flip()),
        2usize..30,
    )
        .prop_map(|(mut steps, first, after, c)| {
            steps.push(first);
            steps.extend(after);
            steps.push(CenterCrop::new(c).unwrap().into());
            steps
        })
}

fn sampling() -> impl Strategy<Value = SamplingFactor> {
    prop_oneof![
        Just(SamplingFactor::R_4_4_4),
        Just(SamplingFactor::R_4_2_2),
        Just(SamplingFactor::R_4_2_0),
        Just(SamplingFactor::R_4_4_0),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn decoding_the_crop_alone_changes_no_pixel(
        steps in pipeline(),
        w in 1usize..120,
        h in 1usize..120,
        sampling in sampling(),
        progressive in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let compose = Compose::new(steps, Output::U8Hwc).unwrap();
        let bytes = jpeg(w, h, sampling, progressive, seed);
        let options = DecodeOptions::default();
        let mut a: Rng = epoch_rng(seed, 3);
        let mut region = vec![0u8; compose.output_bytes()];
        let region_ok = compose.decode_into(Path::new("x.jpg"), &bytes, &options, &mut a, &mut region);

        let whole = decode_rgb(&bytes, &options).unwrap();
        prop_assert_eq!((whole.width(), whole.height()), (w, h));
        let mut b: Rng = epoch_rng(seed, 3);
        let mut applied = vec![0u8; compose.output_bytes()];
        let applied_ok = compose.apply_into(&whole, &mut b, &mut applied);
        prop_assert_eq!(region_ok.is_ok(), applied_ok.is_ok(), "{:?} vs {:?}", region_ok, applied_ok);
        prop_assert!(region == applied, "pixels differ ({}x{}, {:?})", w, h, sampling);
        prop_assert_eq!(a.next_u64(), b.next_u64(), "the generator was left in another state");
    }
}

/// The CPU train pipeline on a photo-sized JPEG: the crop's region is all that is decoded,
/// and the tensor equals the whole decode's.
#[test]
fn imagenet_train_on_a_photo_sized_jpeg() {
    let bytes = jpeg(500, 375, SamplingFactor::R_4_2_0, false, 11);
    let compose = Compose::imagenet_train();
    let options = DecodeOptions::default();
    let whole = decode_rgb(&bytes, &options).unwrap();
    for seed in 0..20 {
        let (mut a, mut b) = (epoch_rng(seed, 0), epoch_rng(seed, 0));
        let mut x = vec![0u8; compose.output_bytes()];
        let mut y = vec![0u8; compose.output_bytes()];
        compose
            .decode_into(Path::new("p.jpg"), &bytes, &options, &mut a, &mut x)
            .unwrap();
        compose.apply_into(&whole, &mut b, &mut y).unwrap();
        assert!(x == y, "seed {seed}: the region's tensor differs");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// The val pipeline (a resize whose result is cropped inside, computed as one resize of the
    /// crop's source box) reads that box and its filter's reach alone: the same bytes as on the
    /// whole decoded image, for both antialiasing filters and shrinking of every ratio.
    #[test]
    fn a_resize_then_crop_reads_its_source_box_alone(
        w in 16usize..200,
        h in 16usize..200,
        size in 4usize..120,
        crop_frac in 0.1f64..1.0,
        bicubic in any::<bool>(),
        sampling in sampling(),
        seed in any::<u64>(),
    ) {
        let interpolation = if bicubic { Interpolation::Bicubic } else { Interpolation::Bilinear };
        let resize = Resize::new(size).unwrap().interpolation(interpolation);
        let crop = CenterCrop::new(((size as f64 * crop_frac) as usize).max(1)).unwrap();
        let compose = Compose::new([resize.into(), crop.into()], Output::U8Hwc).unwrap();
        let bytes = jpeg(w, h, sampling, false, seed);
        let options = DecodeOptions::default();
        let mut region = vec![0u8; compose.output_bytes()];
        compose.decode_into(Path::new("v.jpg"), &bytes, &options, &mut epoch_rng(0, 0), &mut region).unwrap();
        let whole = decode_rgb(&bytes, &options).unwrap();
        let mut applied = vec![0u8; compose.output_bytes()];
        compose.apply_into(&whole, &mut epoch_rng(0, 0), &mut applied).unwrap();
        prop_assert!(region == applied, "pixels differ ({}x{} -> {}, crop {:?})", w, h, size, crop);
    }
}

/// The ImageNet val pipeline on photo-sized JPEGs of several shapes: the same tensors.
#[test]
fn imagenet_val_on_photo_sized_jpegs() {
    let compose = Compose::imagenet_val();
    let options = DecodeOptions::default();
    for (i, (w, h)) in [(500, 375), (375, 500), (640, 480), (333, 500), (1024, 683)]
        .into_iter()
        .enumerate()
    {
        let bytes = jpeg(w, h, SamplingFactor::R_4_2_0, i % 2 == 1, i as u64);
        let whole = decode_rgb(&bytes, &options).unwrap();
        let mut x = vec![0u8; compose.output_bytes()];
        let mut y = vec![0u8; compose.output_bytes()];
        compose
            .decode_into(
                Path::new("v.jpg"),
                &bytes,
                &options,
                &mut epoch_rng(0, 0),
                &mut x,
            )
            .unwrap();
        compose
            .apply_into(&whole, &mut epoch_rng(0, 0), &mut y)
            .unwrap();
        assert!(x == y, "{w}x{h}: the region's tensor differs");
    }
}
