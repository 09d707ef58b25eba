//! Datasets, samplers and batches cross threads as the loader needs: datasets shared
//! through `Arc`, samplers boxed, batches sent to the consumer.

use std::sync::Arc;

use longshore_data::{
    AlignedBuf, Batch, BatchSampling, Dataset, DatasetCollate, DirectCollate, NpyDataset,
    NpyShards, RecordDataset, Sampler, WorkerInfo, worker, write_npy,
};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

#[test]
fn thread_bounds() {
    assert_send_sync::<NpyDataset>();
    assert_send_sync::<NpyShards>();
    assert_send_sync::<RecordDataset>();
    assert_send_sync::<Box<dyn Sampler>>();
    assert_send_sync::<Box<dyn BatchSampling>>();
    assert_send::<Batch<AlignedBuf>>();
    assert_send::<Batch<Vec<u8>>>();
}

#[test]
fn workers_share_a_mapped_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.npy");
    let data: Vec<u32> = (0..4000).collect();
    write_npy(&p, &[1000, 4], &data).unwrap();
    let ds = Arc::new(NpyDataset::open(&p).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|id| {
            let ds = Arc::clone(&ds);
            std::thread::spawn(move || {
                let _w = worker::enter(WorkerInfo::new(id, 4, 0).unwrap());
                let info = worker::current().unwrap();
                let indices: Vec<usize> = info.shard(ds.len()).collect();
                let collate = DirectCollate::new();
                let mut sum = 0u64;
                for chunk in indices.chunks(64) {
                    let staged = collate.stage(&*ds, chunk).unwrap();
                    let need = staged.layout().total_bytes();
                    let batch = collate
                        .write(&*ds, staged, AlignedBuf::zeroed(need))
                        .unwrap();
                    sum += batch
                        .tensor::<u32>(0)
                        .unwrap()
                        .iter()
                        .map(|&v| u64::from(v))
                        .sum::<u64>();
                }
                sum
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, (0..4000u64).sum::<u64>());
}
