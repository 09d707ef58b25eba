//! `#[derive(Sample)]` from a crate that depends only on the `longshore` facade (this one):
//! the derive finds the facade's path, and the struct is a dataset item a loader batches.

use longshore::prelude::*;

#[derive(Debug, Clone, Sample)]
struct Row {
    features: [f32; 4],
    #[sample(skip)]
    _note: &'static str,
    label: i64,
}

#[test]
fn a_loader_batches_a_derived_struct_through_the_facade() {
    let rows: Vec<Row> = (0..12)
        .map(|i| Row {
            features: [i as f32; 4],
            _note: "kept out of the batch",
            label: i,
        })
        .collect();
    let loader = DataLoader::builder(VecDataset::new(rows))
        .batch_size(4)
        .build()
        .unwrap();
    let mut labels = Vec::new();
    for batch in &loader {
        let batch = batch.unwrap();
        assert_eq!(
            batch.len(),
            2,
            "two tensor fields, the skipped one left out"
        );
        assert_eq!(batch.shape(0).unwrap(), &[4, 4]);
        let features: &[f32] = batch.tensor(0).unwrap();
        let l: &[i64] = batch.tensor(1).unwrap();
        assert_eq!(features[4], l[1] as f32);
        labels.extend_from_slice(l);
    }
    assert_eq!(labels, (0..12).collect::<Vec<i64>>());
}
