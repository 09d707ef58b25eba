//! CUDA: page-locked and registered buffers are known to the driver, copy correctly to the
//! device and back, and pool reuse is deferred while a copy is in flight.
//!
//! Skips with a printed reason when no driver is present; fails instead when
//! `LONGSHORE_REQUIRE_CUDA=1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use longshore_host::{Fence, HostBuffer, MemoryKind, PinnedPool, PoolConfig};
use rand::{RngCore, SeedableRng};

fn cuda_or_skip(test: &str) -> bool {
    let probe = longshore_host::driver_unavailable_reason().map_or(Ok(()), Err);
    longshore_testing::cuda_or_skip(test, probe).is_some()
}

/// A CUDA event as a pool fence (longshore-transfer provides the real one).
#[derive(Debug)]
struct EventFence(CudaEvent);

impl Fence for EventFence {
    fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
    fn wait(&self) {
        self.0.synchronize().unwrap();
    }
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Copies `src` to the device and back into a poisoned buffer of the same kind.
fn round_trip(stream: &Arc<CudaStream>, src: &HostBuffer, dst: &mut HostBuffer) {
    let n = src.len();
    // SAFETY: the uninitialised device memory is fully written by the copy before it is read.
    let mut dev = unsafe { stream.alloc::<u8>(n) }.unwrap();
    // SAFETY: src and dst outlive the synchronize below; no other access happens meanwhile.
    unsafe {
        cudarc::driver::result::memcpy_htod_async(
            dev_ptr(&mut dev, stream),
            src.as_bytes(),
            stream.cu_stream(),
        )
        .unwrap();
        cudarc::driver::result::memcpy_dtoh_async(
            dst.as_bytes_mut(),
            dev_ptr(&mut dev, stream),
            stream.cu_stream(),
        )
        .unwrap();
    }
    stream.synchronize().unwrap();
}

fn dev_ptr(
    dev: &mut cudarc::driver::CudaSlice<u8>,
    stream: &Arc<CudaStream>,
) -> cudarc::driver::sys::CUdeviceptr {
    use cudarc::driver::DevicePtrMut;
    let (p, _guard) = dev.device_ptr_mut(stream);
    p
}

#[test]
fn page_locked_and_registered_buffers_are_driver_registered_and_round_trip() {
    if !cuda_or_skip("page_locked_and_registered_buffers_are_driver_registered_and_round_trip") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for kind in [MemoryKind::PageLocked, MemoryKind::Registered] {
        for (i, len) in [1usize, 4095, 4096, (1 << 20) + 7, 64 << 20]
            .into_iter()
            .enumerate()
        {
            let data = random_bytes(len, i as u64 + 1);
            let src = HostBuffer::from_slice(kind, &data).unwrap();
            assert_eq!(src.kind(), kind);
            assert!(
                longshore_host::is_driver_host_memory(src.as_ptr()).unwrap(),
                "{kind} {len}: unknown to the driver"
            );
            let mut dst = HostBuffer::alloc(kind, len).unwrap();
            dst.as_bytes_mut().fill(0xEE); // poison
            round_trip(&stream, &src, &mut dst);
            assert!(
                dst.as_bytes() == &data[..],
                "{kind} round trip of {len} bytes corrupted data"
            );
        }
    }
    let pageable = HostBuffer::pageable(1 << 20).unwrap();
    assert!(
        !longshore_host::is_driver_host_memory(pageable.as_ptr()).unwrap(),
        "pageable memory reported as pinned"
    );
}

#[test]
fn pool_blocks_are_page_locked_and_reuse_waits_for_in_flight_copies() {
    if !cuda_or_skip("pool_blocks_are_page_locked_and_reuse_waits_for_in_flight_copies") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let pool =
        PinnedPool::new(PoolConfig::for_kind(MemoryKind::PageLocked).budget(1 << 30)).unwrap();
    let len = 8 << 20;
    let mut lease = pool.alloc(len).unwrap();
    assert_eq!(lease.kind(), MemoryKind::PageLocked);
    assert!(longshore_host::is_driver_host_memory(lease.as_ptr()).unwrap());
    let data = random_bytes(len, 99);
    lease.as_bytes_mut().copy_from_slice(&data);
    let first_addr = lease.as_ptr();

    // Hold the stream on a host callback for a bounded time so the copy is still pending when
    // the lease is dropped and the next block is requested. (It must not wait for this thread:
    // cuMemHostAlloc/cuMemHostRegister may synchronise with running streams, which deadlocked
    // an earlier version of this test that released the callback only after the allocation.)
    static SLEPT: AtomicBool = AtomicBool::new(false);
    unsafe extern "C" fn hold_the_stream(_: *mut std::ffi::c_void) {
        std::thread::sleep(Duration::from_millis(500));
        SLEPT.store(true, Ordering::Release);
    }
    // SAFETY: the uninitialised device memory is fully written by the copy before it is read.
    let mut dev = unsafe { stream.alloc::<u8>(len) }.unwrap();
    // SAFETY: the callback only reads a static; the lease stays alive (in the pool's pending
    // list) until the event recorded after the copy completes.
    unsafe {
        cudarc::driver::result::stream::launch_host_function(
            stream.cu_stream(),
            hold_the_stream,
            std::ptr::null_mut(),
        )
        .unwrap();
        cudarc::driver::result::memcpy_htod_async(
            dev_ptr(&mut dev, &stream),
            lease.as_bytes(),
            stream.cu_stream(),
        )
        .unwrap();
    }
    let event = stream.record_event(None).unwrap();
    lease.record_fence(Arc::new(EventFence(event)));
    drop(lease);
    assert_eq!(pool.stats().blocks_pending, 1);

    let copy_was_pending = !SLEPT.load(Ordering::Acquire);
    let other = pool.alloc(len).unwrap();
    assert_ne!(
        other.as_ptr(),
        first_addr,
        "a block was handed out while its copy was in flight"
    );
    assert_eq!(pool.stats().misses, 2);
    drop(other);

    assert!(
        copy_was_pending,
        "the host callback finished before the test could observe the pending copy"
    );
    stream.synchronize().unwrap();
    pool.collect();
    assert_eq!(pool.stats().blocks_pending, 0);
    // Both blocks are cached now; the copy landed intact.
    let back: Vec<u8> = stream.clone_dtoh(&dev).unwrap();
    assert!(
        back == data,
        "device data differs from what the pinned block held"
    );
    let s = pool.stats();
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.bytes_cached, 2 * len);
}

#[test]
fn large_pool_blocks_use_the_registration_fast_path() {
    if !cuda_or_skip("large_pool_blocks_use_the_registration_fast_path") {
        return;
    }
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::PageLocked)
            .budget(1 << 30)
            .register_above(Some(16 << 20)),
    )
    .unwrap();
    let small = pool.alloc(1 << 20).unwrap();
    let large = pool.alloc(32 << 20).unwrap();
    assert_eq!(small.kind(), MemoryKind::PageLocked);
    assert_eq!(large.kind(), MemoryKind::Registered);
    assert!(longshore_host::is_driver_host_memory(large.as_ptr()).unwrap());
    assert_eq!(pool.stats().allocations, 2);
}
