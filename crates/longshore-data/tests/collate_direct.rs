//! DirectCollate (dataset writes samples straight into the batch) agrees with
//! fetching items and stacking them, for .npy pairs, record files and concatenations.

use longshore_data::{
    AlignedBuf, ConcatDataset, DType, DatasetCollate, DirectCollate, FetchCollate, NpyDataset,
    RecordDataset, RecordLayout, StackCollate, Zip, write_npy,
};

#[test]
fn direct_collate_matches_fetch_collate_for_npy_and_records() {
    let dir = tempfile::tempdir().unwrap();
    let xp = dir.path().join("x.npy");
    let yp = dir.path().join("y.npy");
    let x: Vec<f32> = (0..100 * 8).map(|i| i as f32 * 0.5).collect();
    let y: Vec<i64> = (0..100).map(|i| 1000 - i).collect();
    write_npy(&xp, &[100, 8], &x).unwrap();
    write_npy(&yp, &[100], &y).unwrap();
    let ds = Zip::direct(
        NpyDataset::open(&xp).unwrap(),
        NpyDataset::open(&yp).unwrap(),
    )
    .unwrap();
    let indices = [5, 99, 0, 42];

    let direct = DirectCollate::new();
    let staged = direct.stage(&ds, &indices).unwrap();
    let need = staged.layout().total_bytes();
    let a = direct.write(&ds, staged, AlignedBuf::zeroed(need)).unwrap();

    let fetch = FetchCollate(StackCollate::new());
    let staged = fetch.stage(&ds, &indices).unwrap();
    let b = fetch.write(&ds, staged, AlignedBuf::zeroed(need)).unwrap();
    assert_eq!(a.layout(), b.layout());
    assert_eq!(a.bytes(), b.bytes());
    assert_eq!(a.tensor::<i64>(1).unwrap(), &[995, 901, 1000, 958]);
    assert_eq!(&a.tensor::<f32>(0).unwrap()[8..16], &x[99 * 8..100 * 8]);

    let err = direct.stage(&ds, &[3, 100]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index 100 out of range for dataset of length 100"
    );

    // The same data as a record file: f32[8] then i64, packed.
    let rp = dir.path().join("r.bin");
    let mut bytes = Vec::new();
    for i in 0..100 {
        bytes.extend_from_slice(bytemuck::cast_slice(&x[i * 8..(i + 1) * 8]));
        bytes.extend_from_slice(&y[i].to_le_bytes());
    }
    std::fs::write(&rp, &bytes).unwrap();
    let layout = RecordLayout::packed(&[("x", DType::F32, &[8]), ("y", DType::I64, &[])]).unwrap();
    let rec = RecordDataset::open(&rp, layout).unwrap();
    let staged = direct.stage(&rec, &indices).unwrap();
    let c = direct
        .write(&rec, staged, AlignedBuf::zeroed(need))
        .unwrap();
    assert_eq!(c.bytes(), a.bytes());
    let staged = FetchCollate(StackCollate::new())
        .stage(&rec, &indices)
        .unwrap();
    let d = FetchCollate(StackCollate::new())
        .write(&rec, staged, vec![0u8; need])
        .unwrap();
    assert_eq!(d.bytes(), a.bytes());
}

#[test]
fn direct_collate_over_concatenated_npy_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.npy");
    let b = dir.path().join("b.npy");
    let c = dir.path().join("c.npy");
    write_npy(&a, &[2, 3], &[0u8, 1, 2, 3, 4, 5]).unwrap();
    write_npy(&b, &[1, 3], &[6u8, 7, 8]).unwrap();
    write_npy(&c, &[1, 2], &[9u8, 9]).unwrap();
    let cat = ConcatDataset::new(vec![
        NpyDataset::open(&a).unwrap(),
        NpyDataset::open(&b).unwrap(),
    ])
    .unwrap();
    let direct = DirectCollate::new();
    let staged = direct.stage(&cat, &[2, 0]).unwrap();
    let batch = direct.write(&cat, staged, vec![0u8; 6]).unwrap();
    assert_eq!(batch.tensor::<u8>(0).unwrap(), &[6, 7, 8, 0, 1, 2]);
    let bad = ConcatDataset::new(vec![
        NpyDataset::open(&a).unwrap(),
        NpyDataset::open(&c).unwrap(),
    ])
    .unwrap();
    let staged = direct.stage(&bad, &[2]).unwrap();
    let err = direct.write(&bad, staged, vec![0u8; 3]).unwrap_err();
    assert!(
        err.to_string().contains("dataset 1 of the concatenation"),
        "{err}"
    );
}
