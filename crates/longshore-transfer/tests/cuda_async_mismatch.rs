//! Tokio awaits and device-mismatch errors on a GPU.
//! Skips without a driver unless LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::gpu;
use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::{Device, TransferError};

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
