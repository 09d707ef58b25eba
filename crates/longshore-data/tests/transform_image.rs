//! Image transforms: normalisation against a scalar reference, crops, flips, and
//! per-worker seeded randomness.

use longshore_data::transform::TransformExt;
use longshore_data::{
    DType, Dataset, DatasetExt, First, ImageLayout, Normalize, RandomCrop, RandomHorizontalFlip,
    Tensor, Transform, VecDataset, WorkerInfo, rng::epoch_rng, worker,
};

fn image_hwc(h: usize, w: usize) -> Tensor {
    let data: Vec<u8> = (0..h * w * 3).map(|i| (i * 37 % 256) as u8).collect();
    Tensor::from_slice::<u8>(&[h, w, 3], &data).unwrap()
}

#[test]
fn normalize_matches_the_formula_in_both_layouts() {
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    let (h, w) = (7, 9);
    let hwc = image_hwc(h, w);
    let out = Normalize::new(&mean, &std, ImageLayout::Hwc)
        .unwrap()
        .apply(hwc.clone(), &mut epoch_rng(0, 0))
        .unwrap();
    assert_eq!(out.shape(), &[3, h, w]);
    let o = out.as_slice::<f32>().unwrap();
    let src = hwc.as_slice::<u8>().unwrap();
    let mut chw = vec![0u8; src.len()];
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                let v = src[(y * w + x) * 3 + c];
                chw[(c * h + y) * w + x] = v;
                let expect = (f32::from(v) / 255.0 - mean[c]) / std[c];
                let got = o[(c * h + y) * w + x];
                assert!(
                    (got - expect).abs() < 1e-5,
                    "c{c} y{y} x{x}: {got} vs {expect}"
                );
            }
        }
    }
    // The CHW path gives the same floats.
    let chw = Tensor::from_slice::<u8>(&[3, h, w], &chw).unwrap();
    let out2 = Normalize::imagenet(ImageLayout::Chw)
        .apply(chw, &mut epoch_rng(0, 0))
        .unwrap();
    for (a, b) in out2.as_slice::<f32>().unwrap().iter().zip(o) {
        assert!((a - b).abs() < 1e-5);
    }
    // Bad inputs.
    assert!(Normalize::new(&mean, &[0.2, 0.0, 0.2], ImageLayout::Chw).is_err());
    assert!(Normalize::new(&mean, &std[..2], ImageLayout::Chw).is_err());
    let f = Tensor::zeros(DType::F32, &[3, 2, 2]).unwrap();
    assert!(
        Normalize::imagenet(ImageLayout::Chw)
            .apply(f, &mut epoch_rng(0, 0))
            .is_err()
    );
}

#[test]
fn crop_and_flip_move_the_right_pixels() {
    let img = image_hwc(6, 8);
    let crop = RandomCrop::new(3, 4, ImageLayout::Hwc).unwrap();
    let c = crop.crop_at(&img, 2, 3).unwrap();
    assert_eq!(c.shape(), &[3, 4, 3]);
    let src = img.as_slice::<u8>().unwrap();
    let got = c.as_slice::<u8>().unwrap();
    for y in 0..3 {
        for x in 0..4 {
            for ch in 0..3 {
                assert_eq!(
                    got[(y * 4 + x) * 3 + ch],
                    src[((y + 2) * 8 + x + 3) * 3 + ch]
                );
            }
        }
    }
    assert!(crop.crop_at(&img, 4, 0).is_err());
    assert!(
        RandomCrop::new(7, 1, ImageLayout::Hwc)
            .unwrap()
            .apply(img.clone(), &mut epoch_rng(0, 0))
            .is_err()
    );

    let flip = RandomHorizontalFlip::new(1.0, ImageLayout::Hwc).unwrap();
    let f = flip.apply(img.clone(), &mut epoch_rng(0, 0)).unwrap();
    let fs = f.as_slice::<u8>().unwrap();
    for y in 0..6 {
        for x in 0..8 {
            for ch in 0..3 {
                assert_eq!(fs[(y * 8 + x) * 3 + ch], src[(y * 8 + 7 - x) * 3 + ch]);
            }
        }
    }
    // CHW flip of an f32 image, odd width.
    let t = Tensor::from_slice::<f32>(&[1, 1, 3], &[1., 2., 3.]).unwrap();
    let f = RandomHorizontalFlip::new(1.0, ImageLayout::Chw)
        .unwrap()
        .apply(t, &mut epoch_rng(0, 0))
        .unwrap();
    assert_eq!(f.as_slice::<f32>().unwrap(), &[3., 2., 1.]);
    assert!(RandomHorizontalFlip::new(1.5, ImageLayout::Chw).is_err());
    let never = RandomHorizontalFlip::new(0.0, ImageLayout::Hwc).unwrap();
    assert_eq!(never.apply(img.clone(), &mut epoch_rng(0, 0)).unwrap(), img);
}

#[test]
fn random_transforms_use_the_worker_seed() {
    let pipeline = RandomCrop::new(4, 4, ImageLayout::Hwc)
        .unwrap()
        .then(RandomHorizontalFlip::new(0.5, ImageLayout::Hwc).unwrap())
        .then(Normalize::imagenet(ImageLayout::Hwc));
    let ds = VecDataset::new(vec![(image_hwc(16, 16), 3i64); 8]).transform(First(pipeline));
    let run = |seed: u64| -> Vec<Vec<f32>> {
        let _guard = worker::enter(WorkerInfo::new(1, 2, seed).unwrap());
        assert_eq!(worker::current().map(|w| w.id), Some(1));
        (0..8)
            .map(|i| {
                let (img, label) = ds.get(i).unwrap();
                assert_eq!(label, 3);
                assert_eq!(img.shape(), &[3, 4, 4]);
                img.as_slice::<f32>().unwrap().to_vec()
            })
            .collect()
    };
    let a = run(5);
    assert_eq!(a, run(5), "same worker seed, same augmentations");
    assert_ne!(a, run(6), "another seed, other augmentations");
    assert!(a.iter().any(|x| *x != a[0]), "crops differ between samples");
    assert_eq!(worker::current(), None, "guard restores the context");
}
