//! Issue 26 item 7 through the loader: `DataLoader::builder(npy.transform(Normalize))` with the
//! default collate yields, batch for batch, the bytes of the fused
//! `.collate(DirectCollate::new().with_transform(0, Normalize))`, and a failing sample is still
//! named (the default policy fails the batch naming the sample).

use longshore_data::{
    DataError, DatasetCollate, DatasetExt, DirectCollate, FetchCollate, ImageLayout, Normalize,
    NpyDataset, StackCollate, write_npy,
};
use longshore_loader::{DataLoader, LoaderError};

#[test]
fn the_natural_transform_path_yields_the_fused_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("images.npy");
    let (n, c, h, w) = (37, 3, 9, 11);
    let pixels: Vec<u8> = (0..n * c * h * w).map(|i| (i * 13 % 256) as u8).collect();
    write_npy(&path, &[n, c, h, w], &pixels).unwrap();
    let norm = Normalize::imagenet(ImageLayout::Chw);

    let natural_ds = NpyDataset::open(&path).unwrap().transform(norm.clone());
    let staged = FetchCollate(StackCollate::new())
        .stage(&natural_ds, &[0, 1])
        .unwrap();
    assert!(staged.is_direct(), "the default collate takes the plan");

    let natural = DataLoader::builder(natural_ds)
        .batch_size(8)
        .shuffle(true)
        .seed(11)
        .num_workers(2)
        .build()
        .unwrap();
    let fused = DataLoader::builder(NpyDataset::open(&path).unwrap())
        .collate(DirectCollate::new().with_transform(0, norm))
        .batch_size(8)
        .shuffle(true)
        .seed(11)
        .num_workers(2)
        .build()
        .unwrap();
    for epoch in 0..2 {
        natural.set_epoch(epoch);
        fused.set_epoch(epoch);
        let a: Vec<_> = natural.iter().map(Result::unwrap).collect();
        let b: Vec<_> = fused.iter().map(Result::unwrap).collect();
        assert_eq!(a.len(), 5);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.shape(0).unwrap(), y.shape(0).unwrap());
            assert_eq!(x.tensor_bytes(0).unwrap(), y.tensor_bytes(0).unwrap());
        }
    }
}

#[test]
fn a_sample_the_transform_refuses_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("images.npy");
    write_npy(&path, &[4, 3, 2, 2], &[9u8; 48]).unwrap();
    // Wrong channel count for the transform: every sample fails, on either route.
    let ds = NpyDataset::open(&path)
        .unwrap()
        .transform(Normalize::new(&[0.5], &[0.5], ImageLayout::Chw).unwrap());
    let loader = DataLoader::builder(ds).batch_size(2).build().unwrap();
    let first = loader.iter().next().unwrap();
    assert!(
        matches!(
            &first,
            Err(LoaderError::Sample {
                index: 0,
                source: DataError::ShapeMismatch(_),
                ..
            })
        ),
        "{first:?}"
    );
}
