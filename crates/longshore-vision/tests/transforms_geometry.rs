//! Geometry and rounding of the transforms against values printed by torchvision 0.29
//! (`_compute_resized_output_size`, `center_crop`), flips, outputs, and the random sources.

use longshore_data::rng::epoch_rng;
use longshore_data::{DataError, Dataset, ImageLayout};
use longshore_vision::synth::{FolderSpec, write_folder};
use longshore_vision::transforms::{
    CenterCrop, CropBox, RandomHorizontalFlip, RandomResizedCrop, Resize, round_half_even,
};
use longshore_vision::{Compose, ImageFolder, Output, RandomSource, RgbImage, Step, apply_steps};
use proptest::prelude::*;

#[test]
fn resize_output_sizes_are_torchvisions() {
    // (h, w) -> torchvision's [h, w] for Resize(256) and Resize(256, max_size=300).
    let cases = [
        ((375, 500), (256, 341), (225, 300)),
        ((500, 375), (341, 256), (300, 225)),
        ((333, 500), (256, 384), (200, 300)),
        ((256, 256), (256, 256), (256, 256)),
        ((299, 301), (256, 257), (256, 257)),
        ((480, 640), (256, 341), (225, 300)),
    ];
    let r = Resize::new(256).unwrap();
    let capped = Resize::new(256).unwrap().max_size(300).unwrap();
    for ((h, w), plain, max) in cases {
        let (ow, oh) = r.output_size(w, h);
        assert_eq!((oh, ow), plain, "{h}x{w}");
        let (ow, oh) = capped.output_size(w, h);
        assert_eq!((oh, ow), max, "{h}x{w} max_size");
    }
    assert!(Resize::new(256).unwrap().max_size(256).is_err());
    assert_eq!(Resize::exact(10, 20).unwrap().output_size(999, 3), (20, 10));
}

#[test]
fn center_crop_rounds_halves_to_even_like_python() {
    // (w, h, crop) -> torchvision's (top, left).
    for (w, h, c, top, left) in [
        (5, 4, 2, 1, 2),
        (6, 4, 3, 0, 2),
        (7, 7, 4, 2, 2),
        (3, 3, 2, 0, 0),
        (9, 8, 2, 3, 4),
    ] {
        let b = CenterCrop::new(c).unwrap().get_params(w, h);
        assert_eq!((b.top, b.left), (top, left), "{w}x{h} crop {c}");
    }
    assert_eq!(round_half_even(2.5), 2.0);
    assert_eq!(round_half_even(3.5), 4.0);
    // Larger than the image: padded (crop - size) // 2 before.
    let b = CenterCrop::with_size(7, 4).unwrap().get_params(2, 2);
    assert_eq!(
        b,
        CropBox {
            top: -2,
            left: -1,
            height: 7,
            width: 4
        }
    );
}

fn gradient(w: usize, h: usize) -> RgbImage {
    let data = (0..h)
        .flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, (x + y) as u8]))
        .collect();
    RgbImage::from_vec(w, h, data).unwrap()
}

#[test]
fn flips_mirror_rows_and_compose_with_later_crops() {
    let img = gradient(5, 3);
    let always: Step = RandomHorizontalFlip::new(1.0, ImageLayout::Hwc)
        .unwrap()
        .into();
    let flipped = apply_steps(&[always], &img, &mut epoch_rng(0, 0)).unwrap();
    assert_eq!(flipped.pixel(0, 1), img.pixel(4, 1));
    assert_eq!(flipped.pixel(4, 2), img.pixel(0, 2));
    // Flip then an off-centre crop (5 - 2 = 3, round(1.5) = 2): the crop sees the flipped image.
    let crop: Step = CenterCrop::with_size(3, 2).unwrap().into();
    let out = apply_steps(&[always, crop], &img, &mut epoch_rng(0, 0)).unwrap();
    assert_eq!(out.pixel(0, 0), flipped.pixel(2, 0));
    assert_eq!(out.pixel(1, 0), flipped.pixel(3, 0));
    let never: Step = RandomHorizontalFlip::new(0.0, ImageLayout::Hwc)
        .unwrap()
        .into();
    assert_eq!(
        apply_steps(&[never], &img, &mut epoch_rng(0, 0)).unwrap(),
        img
    );
    assert!(RandomHorizontalFlip::new(1.5, ImageLayout::Hwc).is_err());
}

#[test]
fn outputs_are_the_same_pixels_in_three_layouts() {
    let img = gradient(6, 4);
    let crop: Step = CenterCrop::with_size(4, 6).unwrap().into();
    let f = Compose::new([crop], Output::to_tensor()).unwrap();
    let chw = Compose::new([crop], Output::U8Chw).unwrap();
    let hwc = Compose::new([crop], Output::U8Hwc).unwrap();
    let mut rng = epoch_rng(0, 0);
    let tf = f.apply(&img, &mut rng).unwrap();
    let tc = chw.apply(&img, &mut rng).unwrap();
    let th = hwc.apply(&img, &mut rng).unwrap();
    assert_eq!(tc.shape(), &[3, 4, 6]);
    assert_eq!(th.shape(), &[4, 6, 3]);
    assert_eq!(th.bytes(), img.as_bytes());
    let floats: &[f32] = tf.as_slice().unwrap();
    for c in 0..3 {
        for y in 0..4 {
            for x in 0..6 {
                let v = img.pixel(x, y)[c];
                assert_eq!(tc.bytes()[c * 24 + y * 6 + x], v);
                assert!((floats[c * 24 + y * 6 + x] - f32::from(v) / 255.0).abs() < 1e-6);
            }
        }
    }
    let n = Compose::new([crop], Output::imagenet()).unwrap();
    let tn = n.apply(&img, &mut rng).unwrap();
    let x: &[f32] = tn.as_slice().unwrap();
    let expect = (f32::from(img.pixel(1, 2)[1]) / 255.0 - 0.456) / 0.224;
    assert!((x[24 + 2 * 6 + 1] - expect).abs() < 1e-5);
}

#[test]
fn pipelines_need_a_fixed_output_size() {
    let err = Compose::new([Resize::new(10).unwrap().into()], Output::U8Hwc).unwrap_err();
    assert!(matches!(
        err,
        DataError::InvalidArgument { name: "steps", .. }
    ));
    assert_eq!(Compose::imagenet_train().output_size(), (224, 224));
    assert_eq!(Compose::imagenet_val().output_bytes(), 3 * 224 * 224 * 4);
    assert!(RandomResizedCrop::new(0).is_err());
    assert!(RandomResizedCrop::new(8).unwrap().scale(0.5, 0.1).is_err());
    assert!(RandomResizedCrop::new(8).unwrap().ratio(0.0, 1.0).is_err());
}

#[test]
fn per_sample_streams_draw_the_same_crops_whatever_the_order() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &FolderSpec::tiny()).unwrap();
    let train = ImageFolder::new(dir.path())
        .unwrap()
        .with_transform(Compose::train(32, Output::U8Chw))
        .random_source(RandomSource::PerSample { seed: 9 });
    let forward: Vec<_> = (0..train.len()).map(|i| train.get(i).unwrap().0).collect();
    let backward: Vec<_> = (0..train.len())
        .rev()
        .map(|i| train.get(i).unwrap().0)
        .collect();
    for (i, t) in forward.iter().enumerate() {
        assert_eq!(
            t.bytes(),
            backward[train.len() - 1 - i].bytes(),
            "sample {i}"
        );
    }
    train.set_epoch(1);
    let next_epoch: Vec<_> = (0..train.len()).map(|i| train.get(i).unwrap().0).collect();
    let same = forward
        .iter()
        .zip(&next_epoch)
        .filter(|(a, b)| a.bytes() == b.bytes())
        .count();
    assert!(
        same < train.len() / 2,
        "a new epoch draws new crops ({same} equal)"
    );
}

#[test]
fn worker_streams_are_reproducible_from_the_worker_seed() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &FolderSpec::tiny()).unwrap();
    let train = ImageFolder::new(dir.path())
        .unwrap()
        .with_transform(Compose::train(16, Output::U8Hwc))
        .random_source(RandomSource::Worker);
    let run = |seed| {
        let info = longshore_data::WorkerInfo::new(0, 1, seed).unwrap();
        let _guard = longshore_data::worker::enter(info);
        (0..train.len())
            .map(|i| train.get(i).unwrap().0.bytes().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn sample_streams_follow_the_loader_seed_not_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &FolderSpec::tiny()).unwrap();
    // The default: each sample's own stream, keyed by the loader's seed.
    let train = ImageFolder::new(dir.path())
        .unwrap()
        .with_transform(Compose::train(16, Output::U8Hwc));
    let run = |loader_seed, worker_seed, id, workers| {
        let info = longshore_data::WorkerInfo::new(id, workers, worker_seed).unwrap();
        let _guard = longshore_data::worker::enter(info);
        let _seed = longshore_data::worker::enter_seed(loader_seed);
        (0..train.len())
            .map(|i| train.get(i).unwrap().0.bytes().to_vec())
            .collect::<Vec<_>>()
    };
    // Whichever worker (and its seed) loads a sample, it draws the same crop.
    assert_eq!(run(5, 1, 0, 1), run(5, 99, 2, 3));
    assert_ne!(run(5, 1, 0, 1), run(6, 1, 0, 1));
}

proptest! {
    /// Every box lies inside the image and every pipeline writes its declared size.
    #[test]
    fn random_resized_crop_boxes_fit(w in 1usize..600, h in 1usize..600, seed in any::<u64>(),
                                     smin in 0.01f64..1.0, rmin in 0.2f64..1.0) {
        let rrc = RandomResizedCrop::new(7).unwrap().scale(smin, 1.0).unwrap().ratio(rmin, 1.0 / rmin).unwrap();
        let mut rng = epoch_rng(seed, 0);
        for _ in 0..8 {
            let b = rrc.get_params(w, h, &mut rng);
            prop_assert!(b.top >= 0 && b.left >= 0 && b.width >= 1 && b.height >= 1);
            prop_assert!(b.top as usize + b.height <= h && b.left as usize + b.width <= w, "{:?}", b);
        }
    }

    #[test]
    fn pipelines_write_their_size(w in 1usize..80, h in 1usize..80, seed in any::<u64>()) {
        let img = gradient(w, h);
        let mut rng = epoch_rng(seed, 0);
        for p in [Compose::train(9, Output::U8Chw), Compose::val(11, 9, Output::U8Chw)] {
            let t = p.apply(&img, &mut rng).unwrap();
            prop_assert_eq!(t.shape(), &[3, 9, 9]);
        }
    }
}
