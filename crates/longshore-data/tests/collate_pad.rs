//! PadCollate: variable-length fields padded, with lengths and masks.

use longshore_data::{AlignedBuf, Collate, DType, DataError, PadCollate, Tensor};

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
