//! `.collate(c)` takes what PyTorch's `collate_fn` does: a collate of the items on a
//! map-style dataset (no `FetchCollate` wrapper), a dataset-level collate, or an iterable
//! dataset's item collate.

use longshore_data::{
    Collate, DataError, Dataset, DatasetCollate, DirectCollate, FetchCollate, IterableDataset,
    PadCollate, StackCollate, VecDataset, WorkerInfo,
};
use longshore_loader::{DataLoader, DataLoaderBuilder, LoaderError, MapLoader, StackLoader};

fn ragged() -> VecDataset<(Vec<i64>, f32)> {
    VecDataset::new(vec![
        (vec![1, 2, 3], 0.5),
        (vec![4], 1.5),
        (vec![5, 6], 2.5),
        (vec![], 3.5),
    ])
}

#[test]
fn pad_collate_on_a_map_style_dataset_pads_each_batch() {
    let loader: MapLoader<_, PadCollate> = DataLoader::builder(ragged())
        .batch_size(2)
        .num_workers(2)
        .collate(PadCollate::new(-1.0).with_names(["tokens", "score"]))
        .build()
        .unwrap();
    let batches: Vec<_> = loader.iter().map(Result::unwrap).collect();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].shape(0).unwrap(), &[2, 3]);
    assert_eq!(batches[0].tensor::<i64>(0).unwrap(), &[1, 2, 3, 4, -1, -1]);
    assert_eq!(
        batches[0].tensor_by_name::<i64>("tokens.lengths").unwrap(),
        &[3, 1]
    );
    assert_eq!(batches[1].shape(0).unwrap(), &[2, 2]);
    assert_eq!(batches[1].tensor::<i64>(0).unwrap(), &[5, 6, -1, -1]);
    assert_eq!(batches[1].tensor::<f32>(1).unwrap(), &[2.5, 3.5]);
}

#[test]
fn the_wrapped_and_the_plain_forms_build_the_same_loader() {
    let rows = || VecDataset::new((0..10u32).map(|i| ([i, i + 1],)).collect::<Vec<_>>());
    let plain: StackLoader<_> = DataLoader::builder(rows())
        .batch_size(4)
        .collate(StackCollate::new())
        .build()
        .unwrap();
    let wrapped: StackLoader<_> = DataLoader::builder(rows())
        .batch_size(4)
        .collate(FetchCollate(StackCollate::new()))
        .build()
        .unwrap();
    let a: Vec<Vec<u32>> = plain
        .iter()
        .map(|b| b.unwrap().tensor::<u32>(0).unwrap().to_vec())
        .collect();
    let b: Vec<Vec<u32>> = wrapped
        .iter()
        .map(|b| b.unwrap().tensor::<u32>(0).unwrap().to_vec())
        .collect();
    assert_eq!(a, b);
    assert_eq!(a[2], [8, 9, 9, 10]);
}

/// A dataset-level collate written by a user: counts the indices of its batch.
struct CountIndices;

impl<D: Dataset + ?Sized> DatasetCollate<D> for CountIndices {
    type Staged = (usize, longshore_data::BatchLayout);
    fn stage(&self, _: &D, indices: &[usize]) -> Result<Self::Staged, DataError> {
        let rows: Vec<(u64,)> = indices.iter().map(|&i| (i as u64,)).collect();
        Ok((indices.len(), StackCollate::new().layout(&rows)?))
    }
    fn staged_layout<'a>(&self, staged: &'a Self::Staged) -> &'a longshore_data::BatchLayout {
        &staged.1
    }
    fn write<S: longshore_data::Storage>(
        &self,
        _: &D,
        staged: Self::Staged,
        storage: S,
    ) -> Result<longshore_data::Batch<S>, DataError> {
        let rows: Vec<(u64,)> = (0..staged.0).map(|_| (staged.0 as u64,)).collect();
        StackCollate::new().collate_into(&rows, staged.1, storage)
    }
}

/// Generic code names the dataset-level form explicitly.
fn with_dataset_collate<D: Dataset + 'static, C: DatasetCollate<D> + 'static, X>(
    b: DataLoaderBuilder<D, X>,
    c: C,
) -> Result<DataLoader<longshore_loader::MapFetch<D, C>>, LoaderError> {
    b.dataset_collate(c).build()
}

#[test]
fn dataset_level_collates_go_through_collate_and_dataset_collate() {
    let ds = || VecDataset::new(vec![([0u8; 2],); 5]);
    let a = DataLoader::builder(ds())
        .batch_size(2)
        .collate(CountIndices)
        .build()
        .unwrap();
    let counts: Vec<u64> = a
        .iter()
        .map(|b| b.unwrap().tensor::<u64>(0).unwrap()[0])
        .collect();
    assert_eq!(counts, [2, 2, 1]);
    let b = with_dataset_collate(DataLoader::builder(ds()).batch_size(5), CountIndices).unwrap();
    assert_eq!(
        b.iter().next().unwrap().unwrap().tensor::<u64>(0).unwrap(),
        &[5; 5]
    );
    // DirectCollate is a dataset-level collate too (of a DirectDataset); the type checks.
    let _ = |d: longshore_data::NpyDataset| {
        DataLoader::builder(d).collate(DirectCollate::new()).build()
    };
}

struct Lines(usize);

impl IterableDataset for Lines {
    type Item = (Vec<u16>,);
    fn iter(&self, w: WorkerInfo) -> longshore_data::ItemIter<'_, Self::Item> {
        Box::new(
            (0..self.0)
                .filter(move |i| i % w.num_workers == w.id)
                .map(|i| Ok((vec![i as u16; i % 3 + 1],))),
        )
    }
}

#[test]
fn pad_collate_on_an_iterable_dataset() {
    let loader = DataLoader::iterable(Lines(6))
        .batch_size(3)
        .collate(PadCollate::new(0.0))
        .build()
        .unwrap();
    let b = loader.iter().next().unwrap().unwrap();
    assert_eq!(b.shape(0).unwrap(), &[3, 3]);
    assert_eq!(b.tensor::<u16>(0).unwrap(), &[0, 0, 0, 1, 1, 0, 2, 2, 2]);
}
