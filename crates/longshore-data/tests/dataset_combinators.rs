//! Map, Subset, ConcatDataset, Zip, random_split and iterable datasets.

use std::collections::HashSet;
use std::sync::Arc;

use longshore_data::{
    ConcatDataset, DataError, Dataset, DatasetExt, FromFn, IterableDataset, IterableExt, Sharded,
    Subset, VecDataset, WorkerInfo, random_split, random_split_fractions,
};

fn numbers(n: usize) -> VecDataset<u32> {
    VecDataset::new((0..n as u32).collect())
}

#[test]
fn map_subset_concat() {
    let d = numbers(10).map(|x| x * 2);
    assert_eq!(d.get(3).unwrap(), 6);
    let s = Subset::new(d, vec![9, 0, 4]).unwrap();
    assert_eq!(
        (0..3).map(|i| s.get(i).unwrap()).collect::<Vec<_>>(),
        vec![18, 0, 8]
    );
    assert!(matches!(
        s.get(3),
        Err(DataError::IndexOutOfRange {
            index: 3,
            len: 3,
            ..
        })
    ));
    assert!(matches!(
        Subset::new(numbers(3), vec![0, 3]),
        Err(DataError::IndexOutOfRange { index: 3, .. })
    ));

    let c = ConcatDataset::new(vec![numbers(2), numbers(0), numbers(3)]).unwrap();
    assert_eq!(c.len(), 5);
    assert_eq!(
        (0..5).map(|i| c.get(i).unwrap()).collect::<Vec<_>>(),
        vec![0, 1, 0, 1, 2]
    );
    assert!(c.get(5).is_err());
    assert!(matches!(
        ConcatDataset::<VecDataset<u32>>::new(vec![]),
        Err(DataError::Empty { .. })
    ));

    // Heterogeneous datasets through trait objects.
    let boxed: Vec<Box<dyn Dataset<Item = u32>>> =
        vec![Box::new(numbers(1)), Box::new(numbers(2).map(|x| x + 100))];
    let c = ConcatDataset::new(boxed).unwrap();
    assert_eq!(c.get(2).unwrap(), 101);
}

#[test]
fn try_map_and_zip() {
    let d = numbers(4).try_map(|x| {
        if x == 2 {
            Err(DataError::Other(format!("bad sample {x}")))
        } else {
            Ok(x)
        }
    });
    assert_eq!(d.get(1).unwrap(), 1);
    assert_eq!(d.get(2).unwrap_err().to_string(), "bad sample 2");
    let z = numbers(3).zip(numbers(3).map(|x| x as f32 / 2.0)).unwrap();
    assert_eq!(z.get(1).unwrap(), (1, 0.5));
    assert!(numbers(3).zip(numbers(4)).is_err());
}

#[test]
fn random_split_is_a_seeded_partition() {
    let d = Arc::new(numbers(103));
    let parts = random_split_fractions(Arc::clone(&d), &[0.8, 0.1, 0.1], 7).unwrap();
    let lens: Vec<usize> = parts.iter().map(Dataset::len).collect();
    assert_eq!(lens, vec![83, 10, 10]); // floor 82, 10, 10 + remainder 1 to the first
    let mut seen = HashSet::new();
    for p in &parts {
        for i in 0..p.len() {
            assert!(seen.insert(p.get(i).unwrap()));
        }
    }
    assert_eq!(seen.len(), 103);
    let again = random_split(Arc::clone(&d), &[83, 10, 10], 7).unwrap();
    assert_eq!(again[1].indices(), parts[1].indices());
    let other = random_split(Arc::clone(&d), &[83, 10, 10], 8).unwrap();
    assert_ne!(other[0].indices(), parts[0].indices());
    let err = random_split(d, &[50, 50], 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not equal the dataset length 103"),
        "{err}"
    );
}

#[test]
fn iterable_sharding_and_chain() {
    let stream = Sharded::new(numbers(10));
    let mut all = Vec::new();
    for id in 0..3 {
        let w = WorkerInfo::new(id, 3, 100 + id as u64).unwrap();
        let items: Vec<u32> = stream.iter(w).map(Result::unwrap).collect();
        assert_eq!(items, (id as u32..10).step_by(3).collect::<Vec<_>>());
        all.extend(items);
    }
    all.sort_unstable();
    assert_eq!(all, (0..10).collect::<Vec<_>>());

    let source =
        FromFn::new(|w: WorkerInfo| (0..3).map(move |i| Ok::<_, DataError>(i * 10 + w.id as u32)));
    let chained = source.chain(Sharded::new(numbers(2))).map(|x| x + 1);
    let items: Vec<u32> = chained
        .iter(WorkerInfo::single(0))
        .map(Result::unwrap)
        .collect();
    assert_eq!(items, vec![1, 11, 21, 1, 2]);

    assert!(WorkerInfo::new(3, 3, 0).is_err());
    assert!(WorkerInfo::new(0, 0, 0).is_err());
    // More workers than items: the extra workers get nothing.
    let w = WorkerInfo::new(7, 8, 0).unwrap();
    assert_eq!(Sharded::new(numbers(3)).iter(w).count(), 0);
}
