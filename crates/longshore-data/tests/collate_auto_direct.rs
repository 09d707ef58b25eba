//! The obvious code is the fast code: the default collation (`FetchCollate` of a
//! `StackCollate`) of `NpyDataset::open(..).transform(Normalize::..)` writes batches through
//! the dataset's direct plan, and they are byte for byte the batches of the fused
//! `DirectCollate::new().with_transform(0, Normalize)` and of fetching and stacking the items.

use longshore_data::{
    AlignedBuf, Batch, DType, DataError, Dataset, DatasetCollate, DatasetExt, DirectCollate,
    FetchCollate, ImageLayout, Normalize, NpyDataset, RandomHorizontalFlip, StackCollate, Subset,
    TransformExt, write_npy,
};
use proptest::prelude::*;

/// `n` u8 images of `shape` (one sample) in a fresh `.npy` file.
fn images(dir: &tempfile::TempDir, n: usize, shape: [usize; 3], salt: usize) -> NpyDataset {
    let per: usize = shape.iter().product();
    let pixels: Vec<u8> = (0..n * per).map(|i| (i * 37 + salt) as u8).collect();
    let path = dir.path().join(format!("images-{salt}.npy"));
    write_npy(&path, &[n, shape[0], shape[1], shape[2]], &pixels).unwrap();
    NpyDataset::open(&path).unwrap()
}

fn run<D: Dataset, C: DatasetCollate<D>>(
    collate: &C,
    ds: &D,
    indices: &[usize],
) -> Result<Batch<AlignedBuf>, DataError> {
    let staged = collate.stage(ds, indices)?;
    let buf = AlignedBuf::zeroed(collate.staged_layout(&staged).total_bytes());
    collate.write(ds, staged, buf)
}

/// The batch of the items themselves: `get` each index, stack them.
fn by_items<D: Dataset<Item = longshore_data::Tensor>>(
    ds: &D,
    indices: &[usize],
) -> Batch<AlignedBuf> {
    // `map` keeps no direct plan: the items are fetched and stacked.
    let items = ds_items(ds);
    let collate = FetchCollate(StackCollate::new().with_names(["image"]));
    let staged = collate.stage(&items, indices).unwrap();
    assert!(!staged.is_direct());
    let buf = AlignedBuf::zeroed(staged.layout().total_bytes());
    collate.write(&items, staged, buf).unwrap()
}

fn ds_items<D: Dataset<Item = longshore_data::Tensor>>(
    ds: &D,
) -> impl Dataset<Item = longshore_data::Tensor> + '_ {
    longshore_data::DatasetExt::map(ds, |t| t)
}

fn same(a: &Batch<AlignedBuf>, b: &Batch<AlignedBuf>) {
    assert_eq!(a.layout(), b.layout());
    let n = a.layout().total_bytes();
    assert_eq!(&a.storage()[..n], &b.storage()[..n], "batch bytes differ");
}

#[test]
fn transformed_npy_images_take_the_fused_route_with_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, shape) in [
        (ImageLayout::Chw, [3, 5, 7]),
        (ImageLayout::Hwc, [5, 7, 3]),
        // Large enough for the kernel's streaming stores (3 x 224 x 224 floats > 256 KiB).
        (ImageLayout::Chw, [3, 224, 224]),
    ] {
        let norm = Normalize::new(&[0.5, 0.4, 0.3], &[0.2, 0.25, 0.3], layout).unwrap();
        let natural = images(&dir, 6, shape, shape[1]).transform(norm.clone());
        let indices = [4, 0, 5, 2];

        let default = FetchCollate(StackCollate::new().with_names(["image"]));
        let staged = default.stage(&natural, &indices).unwrap();
        assert!(
            staged.is_direct(),
            "the default collate takes the direct plan"
        );
        let buf = AlignedBuf::zeroed(staged.layout().total_bytes());
        let auto = default.write(&natural, staged, buf).unwrap();

        let raw = images(&dir, 6, shape, shape[1]);
        let fused = DirectCollate::new()
            .with_names(["image"])
            .with_transform(0, norm.clone());
        let fused = run(&fused, &raw, &indices).unwrap();

        same(&auto, &fused);
        same(&auto, &by_items(&natural, &indices));
        assert_eq!(
            auto.shape(0).unwrap(),
            &[4, 3, shape_hw(layout, shape).0, shape_hw(layout, shape).1]
        );
        assert_eq!(auto.layout().tensors()[0].dtype, DType::F32);
        assert_eq!(auto.layout().tensors()[0].name.as_deref(), Some("image"));
    }
}

fn shape_hw(layout: ImageLayout, s: [usize; 3]) -> (usize, usize) {
    match layout {
        ImageLayout::Chw => (s[1], s[2]),
        ImageLayout::Hwc => (s[0], s[1]),
    }
}

#[test]
fn subsets_and_pointers_keep_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let ds = std::sync::Arc::new(
        images(&dir, 10, [3, 4, 4], 1).transform(Normalize::imagenet(ImageLayout::Chw)),
    );
    let parts = longshore_data::random_split(ds.clone(), &[6, 4], 9).unwrap();
    let nested = Subset::new(parts[0].clone(), vec![5, 1, 3]).unwrap();
    let default = FetchCollate(StackCollate::new());
    for (sub, indices) in [(&parts[0], vec![0, 5, 2]), (&parts[1], vec![3, 1])] {
        assert!(default.stage(sub, &indices).unwrap().is_direct());
        let auto = run(&default, sub, &indices).unwrap();
        let want: Vec<usize> = indices.iter().map(|&i| sub.indices()[i]).collect();
        let direct = run(&default, &*ds, &want).unwrap();
        same(&auto, &direct);
    }
    // A subset of a subset: the index maps compose, outermost first.
    let auto = run(&default, &nested, &[0, 2]).unwrap();
    let want = [parts[0].indices()[5], parts[0].indices()[3]];
    same(&auto, &run(&default, &*ds, &want).unwrap());
    // Out of range is refused with the dataset's length, on both routes.
    assert!(matches!(
        run(&default, &nested, &[3]),
        Err(DataError::IndexOutOfRange {
            index: 3,
            len: 3,
            ..
        })
    ));
}

#[test]
fn transforms_that_do_not_fuse_keep_the_items_route() {
    let dir = tempfile::tempdir().unwrap();
    let default = FetchCollate(StackCollate::new());
    // A random flip draws per sample: it cannot be a field transform.
    let flipped = images(&dir, 4, [3, 4, 4], 2).transform(
        RandomHorizontalFlip::new(0.5, ImageLayout::Chw)
            .unwrap()
            .then(Normalize::imagenet(ImageLayout::Chw)),
    );
    assert!(flipped.direct_plan().is_none());
    assert!(!default.stage(&flipped, &[0, 1]).unwrap().is_direct());
    // Two normalisations in a row: the plan holds one transform per field.
    let twice = images(&dir, 4, [3, 4, 4], 3).transform(
        Normalize::imagenet(ImageLayout::Chw).then(Normalize::imagenet(ImageLayout::Chw)),
    );
    assert!(twice.direct_plan().is_none());
    // A field Normalize does not accept (f32 rows): the items route reports the error.
    let path = dir.path().join("f32.npy");
    write_npy(&path, &[2, 3, 2, 2], &[0.5f32; 24]).unwrap();
    let floats = NpyDataset::open(&path)
        .unwrap()
        .transform(Normalize::imagenet(ImageLayout::Chw));
    assert!(floats.direct_plan().is_none());
    assert!(matches!(
        run(&default, &floats, &[0]),
        Err(DataError::DTypeMismatch { .. })
    ));
    // A plain `.npy` dataset has a plan of its own (no transform).
    let plain = images(&dir, 4, [3, 4, 4], 4);
    assert!(default.stage(&plain, &[1]).unwrap().is_direct());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn fused_equals_items_for_any_image_and_batch(
        hwc in any::<bool>(),
        channels in 1usize..=4,
        h in 1usize..20,
        w in 1usize..40,
        picks in proptest::collection::vec(0usize..7, 1..6),
        seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (layout, shape) = if hwc {
            (ImageLayout::Hwc, [h, w, channels])
        } else {
            (ImageLayout::Chw, [channels, h, w])
        };
        let mean: Vec<f32> = (0..channels).map(|c| ((seed >> (c * 8)) & 0xff) as f32 / 255.0).collect();
        let std: Vec<f32> = (0..channels).map(|c| 0.1 + ((seed >> (c * 8 + 4)) & 0xf) as f32 / 16.0).collect();
        let norm = Normalize::new(&mean, &std, layout).unwrap();
        let ds = images(&dir, 7, shape, (seed % 251) as usize).transform(norm);
        let default = FetchCollate(StackCollate::new().with_names(["image"]));
        let staged = default.stage(&ds, &picks).unwrap();
        prop_assert!(staged.is_direct());
        let buf = AlignedBuf::zeroed(staged.layout().total_bytes());
        let auto = default.write(&ds, staged, buf).unwrap();
        same(&auto, &by_items(&ds, &picks));
    }
}
