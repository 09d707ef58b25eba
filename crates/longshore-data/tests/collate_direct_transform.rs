//! DirectCollate's per-field transform hook: a fused u8 -> normalised f32 image path gives
//! exactly what normalising each fetched row gives, whether the dataset lends its bytes
//! (native-order .npy) or only writes them out (a big-endian record file), into aligned
//! or unaligned storage; bad transforms are refused at staging.

use longshore_data::{
    AlignedBuf, ByteOrder, DType, DataError, Dataset, DatasetCollate, DirectCollate, DirectDataset,
    ImageLayout, Normalize, NpyDataset, RecordDataset, RecordLayout, Tensor, Transform, Zip,
    rng::epoch_rng, write_npy,
};

const N: usize = 6;
const C: usize = 3;
const H: usize = 5;
const W: usize = 7;

fn pixels() -> Vec<u8> {
    (0..N * C * H * W).map(|i| (i * 37 % 256) as u8).collect()
}

/// What normalising fetched rows one by one (the Transform path) gives, for `indices`.
fn reference(norm: &Normalize, layout: ImageLayout, indices: &[usize]) -> Vec<f32> {
    let px = pixels();
    let row = C * H * W;
    let shape = match layout {
        ImageLayout::Chw => [C, H, W],
        ImageLayout::Hwc => [H, W, C],
    };
    let mut out = Vec::new();
    for &i in indices {
        let t = Tensor::from_slice::<u8>(&shape, &px[i * row..(i + 1) * row]).unwrap();
        let n = norm.apply(t, &mut epoch_rng(0, 0)).unwrap();
        out.extend_from_slice(n.as_slice::<f32>().unwrap());
    }
    out
}

#[test]
fn fused_normalize_matches_the_transform_path_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let indices = [4, 0, 5, 2];
    for layout in [ImageLayout::Chw, ImageLayout::Hwc] {
        let path = dir.path().join(format!("{layout:?}.npy"));
        let shape = match layout {
            ImageLayout::Chw => [N, C, H, W],
            ImageLayout::Hwc => [N, H, W, C],
        };
        write_npy(&path, &shape, &pixels()).unwrap();
        let labels = dir.path().join("labels.npy");
        write_npy(&labels, &[N], &(0..N as i64).collect::<Vec<_>>()).unwrap();
        let ds = Zip::direct(
            NpyDataset::open(&path).unwrap(),
            NpyDataset::open(&labels).unwrap(),
        )
        .unwrap();
        assert!(ds.field_bytes(0, 0).unwrap().is_some(), "npy rows are lent");

        let norm = Normalize::new(&[0.5, 0.4, 0.3], &[0.2, 0.25, 0.3], layout).unwrap();
        let collate = DirectCollate::new()
            .with_names(["image", "label"])
            .with_transform(0, norm.clone());
        let staged = collate.stage(&ds, &indices).unwrap();
        let spec = &staged.layout().tensors()[0];
        assert_eq!(
            (spec.dtype, spec.shape.as_slice()),
            (DType::F32, &[4, C, H, W][..])
        );
        let need = staged.layout().total_bytes();
        let batch = collate
            .write(&ds, staged, AlignedBuf::zeroed(need))
            .unwrap();
        assert_eq!(
            batch.tensor_by_name::<f32>("image").unwrap(),
            reference(&norm, layout, &indices).as_slice()
        );
        assert_eq!(batch.tensor_by_name::<i64>("label").unwrap(), &[4, 0, 5, 2]);
    }
}

/// Storage whose base address is one byte past an aligned one, so f32 slots cannot be cast.
struct Unaligned(Vec<u8>);

impl std::ops::Deref for Unaligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[1..]
    }
}

impl std::ops::DerefMut for Unaligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0[1..]
    }
}

#[test]
fn a_dataset_that_cannot_lend_its_bytes_and_unaligned_storage_give_the_same_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.bin");
    // Each record: a u8 CHW image then a big-endian i32 label.
    let row = C * H * W;
    let px = pixels();
    let mut file = Vec::new();
    for i in 0..N {
        file.extend_from_slice(&px[i * row..(i + 1) * row]);
        file.extend_from_slice(&(i as i32 * 10).to_be_bytes());
    }
    std::fs::write(&path, &file).unwrap();
    let layout =
        RecordLayout::packed(&[("image", DType::U8, &[C, H, W]), ("label", DType::I32, &[])])
            .unwrap()
            .byte_order(ByteOrder::Big);
    let ds = RecordDataset::open(&path, layout).unwrap();
    assert_eq!(ds.len(), N);
    assert!(
        ds.field_bytes(0, 0).unwrap().is_none(),
        "big-endian records are not lent"
    );

    let norm = Normalize::imagenet(ImageLayout::Chw);
    let collate = DirectCollate::new().with_transform(0, norm.clone());
    let indices = [1, 3, 5];
    let expected = reference(&norm, ImageLayout::Chw, &indices);

    let staged = collate.stage(&ds, &indices).unwrap();
    let need = staged.layout().total_bytes();
    let aligned = collate
        .write(&ds, staged.clone(), AlignedBuf::zeroed(need))
        .unwrap();
    assert_eq!(aligned.tensor::<f32>(0).unwrap(), expected.as_slice());
    assert_eq!(aligned.tensor::<i32>(1).unwrap(), &[10, 30, 50]);

    let unaligned = collate
        .write(&ds, staged, Unaligned(vec![0; need + 1]))
        .unwrap();
    assert!(
        unaligned.tensor::<f32>(0).is_err(),
        "the storage is really unaligned"
    );
    assert_eq!(unaligned.bytes(), aligned.bytes());
}

#[test]
fn bad_transforms_are_refused_when_staging() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.npy");
    write_npy(&path, &[2, 3, 2, 2], &[0f32; 24]).unwrap();
    let ds = NpyDataset::open(&path).unwrap();

    let norm = DirectCollate::new().with_transform(0, Normalize::imagenet(ImageLayout::Chw));
    let err = norm.stage(&ds, &[0]).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::DTypeMismatch {
                actual: DType::F32,
                ..
            }
        ),
        "{err}"
    );

    let missing = DirectCollate::new().with_transform(1, Normalize::imagenet(ImageLayout::Chw));
    let err = missing.stage(&ds, &[0]).unwrap_err();
    assert!(err.to_string().contains("field 1"), "{err}");

    // The last transform set for a field wins: a 3-channel one, then a 1-channel one.
    let upath = dir.path().join("u.npy");
    write_npy(&upath, &[2, 3, 2, 2], &[7u8; 24]).unwrap();
    let u8s = NpyDataset::open(&upath).unwrap();
    let three = DirectCollate::new().with_transform(0, Normalize::imagenet(ImageLayout::Chw));
    assert!(three.stage(&u8s, &[0, 1]).is_ok());
    let one = Normalize::new(&[0.0], &[1.0], ImageLayout::Chw).unwrap();
    let err = three.with_transform(0, one).stage(&u8s, &[0]).unwrap_err();
    assert!(
        matches!(&err, DataError::ShapeMismatch(m) if m.contains("Normalize has 1")),
        "{err}"
    );
}
