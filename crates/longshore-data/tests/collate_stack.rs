//! StackCollate, PadCollate and DirectCollate write typed batches into caller storage.

use longshore_data::{
    AlignedBuf, Batch, Collate, DType, DataError, DatasetCollate, DirectCollate, FetchCollate,
    NpyDataset, PadCollate, RecordDataset, RecordLayout, StackCollate, TENSOR_ALIGN, Tensor, Zip,
    write_npy,
};

#[test]
fn stacks_tuples_into_aligned_typed_tensors() {
    let samples: Vec<([f32; 5], i64)> = (0..7).map(|i| ([i as f32; 5], i as i64 * 10)).collect();
    let c = StackCollate::new().with_names(["x", "y"]);
    let layout = c.layout(&samples).unwrap();
    assert_eq!(layout.tensors().len(), 2);
    assert_eq!(layout.tensors()[0].shape, vec![7, 5]);
    assert_eq!(layout.tensors()[1].shape, vec![7]);
    assert_eq!(layout.tensors()[1].offset % TENSOR_ALIGN, 0);
    assert_eq!(layout.tensors()[1].offset, 256); // 140 bytes of x, rounded up
    assert_eq!(layout.total_bytes(), 256 + 56);
    // Storage larger than needed, as a pool bucket would be; dirty to prove gaps are cleared.
    let mut buf = AlignedBuf::zeroed(4096);
    buf.fill(0xAB);
    let batch: Batch<AlignedBuf> = c.collate_into(&samples, layout, buf).unwrap();
    let x: &[f32] = batch.tensor(0).unwrap();
    assert_eq!(&x[5..10], &[1.0; 5]);
    assert_eq!(
        batch.tensor_by_name::<i64>("y").unwrap(),
        &[0, 10, 20, 30, 40, 50, 60]
    );
    assert!(batch.bytes()[140..256].iter().all(|&b| b == 0));
    assert_eq!(batch.bytes().len(), 312);
    let err = batch.tensor::<f64>(0).unwrap_err();
    assert!(matches!(
        err,
        DataError::DTypeMismatch {
            actual: DType::F32,
            requested: DType::F64,
            ..
        }
    ));
    assert!(err.to_string().contains("'x'"), "{err}");
    assert!(matches!(
        batch.tensor::<f32>(2),
        Err(DataError::IndexOutOfRange { .. })
    ));
    // Reassemble from parts (what a transfer does after copying the bytes).
    let (layout, storage) = batch.into_parts();
    let again = Batch::from_parts(layout, storage).unwrap();
    assert_eq!(again.tensor::<i64>(1).unwrap()[6], 60);
}

#[test]
fn image_like_samples_and_vec_storage() {
    let samples: Vec<(Tensor, i64)> = (0..3)
        .map(|i| {
            (
                Tensor::from_slice::<u8>(&[3, 4, 4], &[i as u8; 48]).unwrap(),
                i,
            )
        })
        .collect();
    let c = StackCollate::new();
    let layout = c.layout(&samples).unwrap();
    let buf = vec![0u8; layout.total_bytes()];
    let batch = c.collate_into(&samples, layout, buf).unwrap();
    assert_eq!(batch.shape(0).unwrap(), &[3, 3, 4, 4]);
    assert_eq!(batch.tensor::<u8>(0).unwrap()[48..96], [1u8; 48]);
}

#[test]
fn collate_errors() {
    let c = StackCollate::new();
    let empty: Vec<(f32,)> = vec![];
    assert!(matches!(
        c.layout(&empty),
        Err(DataError::Empty { what: "batch" })
    ));
    let ragged = vec![(vec![1.0f32, 2.0],), (vec![1.0f32],)];
    let err = c.layout(&ragged).unwrap_err();
    assert!(
        err.to_string().contains("sample 1") && err.to_string().contains("PadCollate"),
        "{err}"
    );
    let mixed = vec![Tensor::scalar(1.0f32), Tensor::scalar(1i64)];
    assert!(matches!(c.layout(&mixed), Err(DataError::ShapeMismatch(_))));
    let ok = vec![([1.0f32; 4],); 4];
    let layout = c.layout(&ok).unwrap();
    let err = c.collate_into(&ok, layout, vec![0u8; 10]).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::BufferTooSmall {
                needed: 64,
                got: 10,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn pad_collate_pads_and_reports_lengths_and_mask() {
    let samples = vec![(vec![1i64, 2, 3], 7.0f32), (vec![4i64], 8.0), (vec![], 9.0)];
    let c = PadCollate::new(-1.0).with_names(["tokens", "score"]);
    let batch = c.collate(&samples).unwrap();
    assert_eq!(batch.len(), 4);
    assert_eq!(batch.shape(0).unwrap(), &[3, 3]);
    assert_eq!(
        batch.tensor::<i64>(0).unwrap(),
        &[1, 2, 3, 4, -1, -1, -1, -1, -1]
    );
    assert_eq!(batch.tensor::<f32>(1).unwrap(), &[7.0, 8.0, 9.0]);
    assert_eq!(
        batch.tensor_by_name::<i64>("tokens.lengths").unwrap(),
        &[3, 1, 0]
    );
    let mask_i = batch.layout().position("tokens.mask").unwrap();
    assert_eq!(batch.spec(mask_i).unwrap().dtype, DType::Bool);
    assert_eq!(
        batch.tensor_bytes(mask_i).unwrap(),
        &[1, 1, 1, 1, 0, 0, 0, 0, 0]
    );
}

#[test]
fn pad_collate_multidim_rows() {
    // Sequences of 2-vectors: only the first dimension may vary.
    let a = Tensor::from_slice::<f32>(&[2, 2], &[1., 2., 3., 4.]).unwrap();
    let b = Tensor::from_slice::<f32>(&[1, 2], &[5., 6.]).unwrap();
    let batch = PadCollate::new(0.0).collate(&[a.clone(), b]).unwrap();
    assert_eq!(batch.shape(0).unwrap(), &[2, 2, 2]);
    assert_eq!(
        batch.tensor::<f32>(0).unwrap(),
        &[1., 2., 3., 4., 5., 6., 0., 0.]
    );
    let c = Tensor::from_slice::<f32>(&[1, 3], &[5., 6., 7.]).unwrap();
    assert!(PadCollate::new(0.0).collate(&[a, c]).is_err());
}

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
fn lone_scalars_and_arrays_are_samples() {
    let labels: Vec<i64> = vec![3, 1, 4];
    let b = StackCollate::new().collate(&labels).unwrap();
    assert_eq!(b.tensor::<i64>(0).unwrap(), &[3, 1, 4]);
    let rows = vec![[1u16, 2], [3, 4]];
    let b = StackCollate::new().collate(&rows).unwrap();
    assert_eq!(b.shape(0).unwrap(), &[2, 2]);
    assert_eq!(b.tensor::<u16>(0).unwrap(), &[1, 2, 3, 4]);
}

#[test]
fn pad_collate_refuses_a_layout_from_other_samples() {
    // Layout computed for short sequences of 2-vectors, then longer 1-vectors given:
    // same byte count, more rows than the layout's max length.
    let short = vec![Tensor::from_slice::<f32>(&[1, 2], &[1., 2.]).unwrap()];
    let long = vec![Tensor::from_slice::<f32>(&[2, 1], &[1., 2.]).unwrap()];
    let c = PadCollate::new(0.0);
    let layout = c.layout(&short).unwrap();
    let err = c
        .collate_into(&long, layout, AlignedBuf::zeroed(4096))
        .unwrap_err();
    assert!(matches!(err, DataError::ShapeMismatch(_)), "{err}");
}
