//! Loader -> device through the prefetcher: data verified after the round trip, leases back
//! in the pool once copies complete. Runs on the Cpu device everywhere and on CUDA when a
//! driver is present (required with LONGSHORE_REQUIRE_CUDA=1).

mod common;

use common::{Probe, ids};
use longshore_host::MemoryKind;
use longshore_loader::DataLoader;
use longshore_transfer::Device;

fn cuda_or_skip(test: &str) -> Option<Device> {
    longshore_testing::cuda_or_skip(test, Device::cuda(0))
}

fn run_on(device: &Device, pin: bool, workers: usize) {
    let mut p = Probe::new(1000);
    p.jitter_us = 50;
    let loader = DataLoader::builder(p)
        .batch_size(64)
        .shuffle(true)
        .seed(5)
        .num_workers(workers)
        .pin_memory(pin)
        .build()
        .unwrap();
    let expected: Vec<Vec<usize>> = {
        let l = DataLoader::builder(Probe::new(1000))
            .batch_size(64)
            .shuffle(true)
            .seed(5)
            .build()
            .unwrap();
        l.iter().map(|b| ids(&b.unwrap())).collect()
    };
    let compute = device.new_stream().unwrap();
    for epoch in 0..2 {
        loader.set_epoch(0);
        let mut got = Vec::new();
        for item in loader.to_device(device, 3).unwrap() {
            let batch = item.unwrap().wait_on(&compute).unwrap();
            assert_eq!(batch.shape(0).unwrap()[1], 1);
            assert_eq!(batch.shape(1).unwrap()[1], 3);
            assert_eq!(batch.buffer(0).unwrap().device().id(), device.id());
            let host = batch.to_host(&compute).unwrap();
            got.push(ids_of(&host));
        }
        assert_eq!(
            got, expected,
            "epoch {epoch}: device data differs from the host batches"
        );
        compute.synchronize().unwrap();
        // A batch's lease is released once its copy's event has completed, by the transfer
        // engine's reaper thread (a dropped `Pending` never blocks): back within a bounded
        // time after the copies, not necessarily by the time the compute stream is done.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut s = loader.pool().stats();
        while s.bytes_in_use != 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            s = loader.pool().stats();
        }
        assert_eq!(s.bytes_in_use, 0, "a lease outlived its copy by 5 s: {s:?}");
    }
    let s = loader.pool().stats();
    if pin && device.id() != Device::cpu().id() {
        assert_eq!(loader.pool().kind(), MemoryKind::PageLocked);
    }
    assert!(s.hits > 0);
}

fn ids_of(batch: &longshore_data::Batch<longshore_host::HostBuffer>) -> Vec<usize> {
    let ids = batch.tensor::<u32>(0).unwrap();
    let feats = batch.tensor::<f32>(1).unwrap();
    for (k, &i) in ids.iter().enumerate() {
        assert!(feats[3 * k..3 * k + 3].iter().all(|&v| v == i as f32 * 0.5));
    }
    ids.iter().map(|&i| i as usize).collect()
}

#[test]
fn loader_to_cpu_device_delivers_every_batch_intact() {
    run_on(&Device::cpu(), false, 0);
    run_on(&Device::cpu(), true, 3);
}

#[test]
fn loader_to_cuda_delivers_every_batch_intact() {
    let Some(dev) = cuda_or_skip("loader_to_cuda_delivers_every_batch_intact") else {
        return;
    };
    run_on(&dev, true, 4);
    run_on(&dev, false, 2);
}
