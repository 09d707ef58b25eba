//! On a GPU: device batches export as `kDLCUDA`, the protocol's stream argument orders the
//! consumer's stream, pinned batches export as `kDLCUDAHost`. Skips without a driver (prints
//! why); fails instead with LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::{batch, f32s, i64s};
use longshore_dlpack::ffi::{DLDevice, DLDeviceType};
use longshore_dlpack::{DlpackError, ExportOptions, PinnedLabel, export_device, export_host};
use longshore_host::{MemoryKind, PinnedPool, PoolConfig};
use longshore_transfer::{Device, upload_new};

fn gpu() -> Option<Device> {
    longshore_testing::cuda_or_skip("CUDA test", Device::cuda(0))
}

fn pinned_pool() -> PinnedPool {
    PinnedPool::new(PoolConfig::for_kind(MemoryKind::PageLocked)).unwrap()
}

fn read_device(ptr: *mut std::ffi::c_void, len: usize) -> Vec<u8> {
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut out = vec![0u8; len];
    // SAFETY: `ptr..ptr+len` is a live exported device tensor of cuda:0; the synchronous copy
    // runs on the legacy default stream, which the export was ordered before.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, ptr as u64) }.unwrap();
    out
}

#[test]
fn device_batch_exports_as_kdlcuda_ordered_on_the_legacy_stream() {
    let Some(dev) = gpu() else { return };
    let copy = dev.new_stream().unwrap();
    let pool = pinned_pool();
    let (layout, lease) = batch(&pool, 2, 3).into_parts();
    let storage = upload_new(&copy, lease).unwrap();
    let ready = copy.record().unwrap();
    let mut tensors =
        export_device(&layout, storage, Some(ready), &ExportOptions::default()).unwrap();
    assert_eq!(
        tensors[0].device(),
        DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: 0
        }
    );
    assert!(tensors[0].host_bytes().unwrap().is_none());
    // `stream=None` is the legacy default stream for CUDA; 0 is refused.
    assert!(matches!(
        tensors[0].prepare_for_stream(Some(0)),
        Err(DlpackError::Unsupported { .. })
    ));
    tensors[0].prepare_for_stream(None).unwrap();
    tensors[1].prepare_for_stream(Some(1)).unwrap();
    let x = read_device(tensors[0].data_ptr(), tensors[0].byte_len());
    let want: Vec<u8> = (2..5)
        .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
        .flat_map(f32::to_ne_bytes)
        .collect();
    assert_eq!(x, want);
    let y = read_device(tensors[1].data_ptr(), tensors[1].byte_len());
    assert_eq!(y, [2i64, 3, 4].map(i64::to_ne_bytes).concat());
    drop(tensors);
    dev.new_stream().unwrap().synchronize().unwrap();
}

#[test]
fn hand_to_our_stream_then_release() {
    let Some(dev) = gpu() else { return };
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let pool = pinned_pool();
    for round in 0..20 {
        let (layout, lease) = batch(&pool, round, 64).into_parts();
        let storage = upload_new(&copy, lease).unwrap();
        let ready = copy.record().unwrap();
        let mut tensors =
            export_device(&layout, storage, Some(ready), &ExportOptions::default()).unwrap();
        for t in &mut tensors {
            t.hand_to(&compute).unwrap();
        }
        // Released at once: the frees are ordered after `compute`'s work.
        drop(tensors);
    }
    compute.synchronize().unwrap();
    copy.synchronize().unwrap();
    // Every lease went back once its copy completed.
    let t0 = std::time::Instant::now();
    while pool.stats().bytes_in_use > 0 && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn pinned_host_batch_is_kdlcudahost() {
    if gpu().is_none() {
        return;
    }
    let pool = pinned_pool();
    let mut tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
    assert_eq!(tensors[0].device().device_type, DLDeviceType::CUDA_HOST);
    assert_eq!(i64s(&tensors[1]), vec![0, 1, 2, 3]);
    // A consumer that only imports kDLCPU may ask for it: the CPU reads pinned memory in place.
    let cpu = DLDevice {
        device_type: DLDeviceType::CPU,
        device_id: 0,
    };
    tensors[0].request(Some(cpu), None).unwrap();
    assert_eq!(tensors[0].device(), cpu);
    assert_eq!(f32s(&tensors[0]).len(), 20);
    let opts = ExportOptions::default().pinned(PinnedLabel::Cpu);
    let t = export_host(batch(&pool, 0, 1), &opts).unwrap();
    assert_eq!(t[0].device(), cpu);
}
