//! StackCollate writes typed, aligned batches into caller storage.

use longshore_data::{
    AlignedBuf, Batch, Collate, DType, DataError, StackCollate, TENSOR_ALIGN, Tensor,
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
fn lone_scalars_and_arrays_are_samples() {
    let labels: Vec<i64> = vec![3, 1, 4];
    let b = StackCollate::new().collate(&labels).unwrap();
    assert_eq!(b.tensor::<i64>(0).unwrap(), &[3, 1, 4]);
    let rows = vec![[1u16, 2], [3, 4]];
    let b = StackCollate::new().collate(&rows).unwrap();
    assert_eq!(b.shape(0).unwrap(), &[2, 2]);
    assert_eq!(b.tensor::<u16>(0).unwrap(), &[1, 2, 3, 4]);
}
