//! Prefetcher with a compute stream, tokio awaits and device-mismatch errors on a GPU.
//! Skips without a driver unless LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::gpu;
use longshore_host::{HostBuffer, MemoryKind, PinnedPool, PoolConfig};
use longshore_transfer::{Device, HostStorage, Prefetcher, TransferError};

#[test]
fn prefetcher_feeds_a_compute_stream_and_recycles_leases() {
    let Some(dev) = gpu() else { return };
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::PageLocked)).unwrap();
    let p = pool.clone();
    let batches = (0..64u32).map(move |i| {
        let mut lease = p.alloc(4 << 20).unwrap();
        lease
            .as_mut_slice::<u32>()
            .unwrap()
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = i ^ j as u32);
        HostStorage {
            storage: lease,
            meta: i,
        }
    });
    let mut seen = 0u32;
    for item in Prefetcher::new(batches, copy, 4).unwrap() {
        let batch = item.unwrap().wait_on(&compute).unwrap();
        assert_eq!(batch.meta, seen);
        let mut out = HostBuffer::page_locked(4 << 20).unwrap();
        out.as_bytes_mut().fill(0x5A);
        let out = compute
            .download(&batch.storage, out)
            .unwrap()
            .wait()
            .unwrap();
        let ok = out
            .as_slice::<u32>()
            .unwrap()
            .iter()
            .enumerate()
            .all(|(j, &x)| x == seen ^ j as u32);
        assert!(ok, "batch {seen} arrived corrupted");
        seen += 1;
    }
    assert_eq!(seen, 64);
    let stats = pool.stats();
    assert!(
        stats.hits > 0,
        "leases never came back to the pool: {stats:?}"
    );
    assert!(
        stats.blocks_in_use + stats.blocks_cached + stats.blocks_pending <= 8,
        "{stats:?}"
    );
}

#[test]
fn awaits_on_a_tokio_runtime() {
    let Some(dev) = gpu() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = dev.new_stream().unwrap();
        let mut dst = stream.alloc(64 << 20).unwrap();
        let data: Vec<u8> = (0..64 << 20).map(|i: usize| (i * 31 % 251) as u8).collect();
        let src = HostBuffer::from_slice(MemoryKind::PageLocked, &data).unwrap();
        let up = stream.upload(src, &mut dst).unwrap();
        let down = stream
            .download(&dst, HostBuffer::page_locked(64 << 20).unwrap())
            .unwrap();
        let ticker = tokio::spawn(async {
            // Runs while the copies are awaited: the runtime thread is not blocked.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        });
        let out = down.await.unwrap();
        up.await.unwrap();
        stream.record().unwrap().await.unwrap();
        ticker.await.unwrap();
        assert!(out.as_bytes() == &data[..]);
    });
}

#[test]
fn mixing_cpu_and_cuda_objects_is_an_error() {
    let Some(gpu_dev) = gpu() else { return };
    let cpu = Device::cpu().new_stream().unwrap();
    let cuda = gpu_dev.new_stream().unwrap();
    let mut on_gpu = cuda.alloc(16).unwrap();
    let mut on_cpu = cpu.alloc(16).unwrap();

    let e = cpu
        .upload(HostBuffer::pageable(16).unwrap(), &mut on_gpu)
        .unwrap_err();
    assert!(matches!(e, TransferError::DeviceMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("cuda:0") && e.to_string().contains("cpu"),
        "{e}"
    );
    let e = cuda
        .download(&on_cpu, HostBuffer::pageable(16).unwrap())
        .unwrap_err();
    assert!(matches!(e, TransferError::DeviceMismatch { .. }), "{e}");
    assert!(matches!(
        cuda.memset(&mut on_cpu, 0),
        Err(TransferError::DeviceMismatch { .. })
    ));
    assert!(matches!(
        cuda.copy(&on_cpu, 0, &mut on_gpu, 0, 16),
        Err(TransferError::DeviceMismatch { .. })
    ));
    // A CUDA stream cannot wait on a Cpu event; a Cpu stream can wait on a CUDA event.
    assert!(matches!(
        cuda.wait_event(&cpu.record().unwrap()),
        Err(TransferError::DeviceMismatch { .. })
    ));
    cpu.wait_event(&cuda.record().unwrap()).unwrap();
    cpu.synchronize().unwrap();
    // The buffers are still intact and usable on their own devices.
    cuda.memset(&mut on_gpu, 7).unwrap();
    assert_eq!(cuda.read_to_vec::<u8>(&on_gpu).unwrap(), vec![7u8; 16]);
    assert!(matches!(
        Device::cuda(100_000),
        Err(TransferError::NoSuchDevice {
            ordinal: 100_000,
            ..
        })
    ));
}
