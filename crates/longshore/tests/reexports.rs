//! The paths the docs tell users to write resolve through the facade.

use longshore::prelude::*;

#[test]
fn documented_paths_resolve() {
    let _: fn(usize) -> longshore::host::Result<longshore::host::HostBuffer> =
        longshore::host::HostBuffer::pageable;
    let _ = longshore::host::PoolConfig::for_kind(longshore::host::MemoryKind::Pageable);
    let _: fn() -> longshore::transfer::Device = longshore::transfer::Device::cpu;
    let _ = longshore::data::SequentialSampler::new(3);
    let _: Option<longshore::loader::SampleErrorPolicy> = None;
    let _: Option<longshore::loader::DeviceBatch> = None;
    let _: Option<LoaderState> = None;
    let _: Option<LoaderStats> = None;
    let _: Option<Box<dyn Sampler>> = None;
    let _ = Device::cpu();
    let _ = MemoryKind::PageLocked;
    let _ = BudgetPolicy::FallbackPageable;
    let _ = (
        StackCollate::new(),
        PadCollate::new(0.0),
        DirectCollate::new(),
    );
    let _: Option<DataError> = None;
    let _: Option<LoaderWarning> = None;
    let _: Option<LoaderConfig> = None;
    let _: Option<longshore::loader::MapFetch<VecDataset<(u8,)>, StackCollate>> = None;
}

type Ragged = VecDataset<(Vec<f32>, i64)>;
type Rows = VecDataset<([f32; 2], i64)>;

/// A loader returned from a function, its type named through the prelude's aliases.
fn padded(rows: Vec<(Vec<f32>, i64)>) -> Result<MapLoader<Ragged, PadCollate>, LoaderError> {
    DataLoader::builder(VecDataset::new(rows))
        .batch_size(2)
        .collate(PadCollate::new(0.0))
        .build()
}

fn stacked(n: i64) -> Result<StackLoader<Rows>, LoaderError> {
    DataLoader::builder(VecDataset::new((0..n).map(|i| ([0.0; 2], i)).collect())).build()
}

#[test]
fn loader_aliases_name_the_built_types() {
    let l = padded(vec![(vec![1.0], 0), (vec![1.0, 2.0, 3.0], 1)]).unwrap();
    let b = l.iter().next().unwrap().unwrap();
    assert_eq!(b.shape(0).unwrap(), &[2, 3]);
    assert_eq!(stacked(3).unwrap().len(), Some(3));
    let _ = longshore::dlpack::ExportOptions::default();
    let _: Option<longshore::dlpack::DlpackTensor> = None;
}

#[test]
fn prelude_builds_a_loader_and_delivers_to_the_cpu_device() {
    let data: Vec<([f32; 2], i64)> = (0..10).map(|i| ([i as f32; 2], i)).collect();
    let loader = DataLoader::builder(VecDataset::new(data))
        .batch_size(5)
        .build()
        .unwrap();
    let dev = Device::cpu();
    let compute = dev.new_stream().unwrap();
    let mut labels = Vec::new();
    for b in loader.to_device(&dev, 2).unwrap() {
        let b = b.unwrap().wait_on(&compute).unwrap();
        labels.extend_from_slice(b.to_host(&compute).unwrap().tensor::<i64>(1).unwrap());
    }
    assert_eq!(labels, (0..10).collect::<Vec<i64>>());
}

#[cfg(feature = "shards")]
#[test]
fn shards_paths_resolve() {
    use longshore::data::IterableExt;
    use longshore::shards::dataset::{DatasetSpec, ShardSample, ShardedDataset};
    use longshore::shards::order::{ResumeState, sample_seed};
    use longshore::shards::store::ShardStore;
    use longshore::shards::webdataset::ShardWriter;

    let dir = tempfile::tempdir().unwrap();
    let mut w = ShardWriter::new(dir.path(), 1 << 20).unwrap();
    for i in 0..6u8 {
        w.write(&format!("k{i}"), &[("cls", &[b'0' + i])]).unwrap();
    }
    w.finish().unwrap();
    let ds: ShardedDataset =
        ShardedDataset::webdataset([format!("{}/shard-000000.tar", dir.path().display())])
            .store(ShardStore::from_env())
            .rank(0)
            .world_size(1)
            .cache_dir(dir.path().join("cache"))
            .build()
            .unwrap();
    let _: Option<DatasetSpec> = Some(ds.spec().clone());
    let loader = DataLoader::iterable(
        ds.clone()
            .map(|s: ShardSample| (s.sample.int("cls").unwrap(), sample_seed(0, 0, s.id.global))),
    )
    .batch_size(2)
    .num_workers(2)
    .build()
    .unwrap();
    let mut labels: Vec<i64> = Vec::new();
    for b in loader.iter() {
        labels.extend_from_slice(b.unwrap().tensor::<i64>(0).unwrap());
    }
    labels.sort_unstable();
    assert_eq!(labels, (0..6).collect::<Vec<i64>>());
    // A checkpoint mid-epoch carries the dataset's position: a ResumeState.
    assert_eq!(loader.iter().take(1).count(), 1);
    let state = loader.state_dict().unwrap();
    let position = state.stream.unwrap().position.unwrap();
    let _: ResumeState = position.decode().unwrap();
    #[cfg(feature = "vision")]
    {
        let _: Option<longshore::vision::shards::ImageShards> = None;
        let _: Option<longshore::vision::shards::DeferredShards> = None;
        let _: Option<longshore::vision::shards::DeferredImage> = None;
        let _: Option<longshore::vision::shards::DecodeCollate> = None;
    }
    #[cfg(feature = "nvjpeg")]
    {
        let _: Option<longshore::nvjpeg::EncodedShards> = None;
    }
}
