//! Shared by the test files: batches collated into pool leases, and reading exported tensors.

#![allow(dead_code, unreachable_pub)]

use longshore_data::{Batch, Collate, StackCollate};
use longshore_dlpack::DlpackTensor;
use longshore_host::{MemoryKind, PinnedPool, PoolBuffer, PoolConfig};

/// A pageable pool (page-locked where `pinned` and a driver is present).
pub fn pool(pinned: bool) -> PinnedPool {
    let kind = if pinned {
        MemoryKind::PageLocked
    } else {
        MemoryKind::Pageable
    };
    PinnedPool::new(PoolConfig::for_kind(kind)).expect("pool")
}

/// Samples `first..first + n` of ([f32; 5] features, i64 label), feature values `10 * i + j`.
pub fn samples(first: usize, n: usize) -> Vec<([f32; 5], i64)> {
    (first..first + n)
        .map(|i| {
            let mut x = [0f32; 5];
            for (j, v) in x.iter_mut().enumerate() {
                *v = (10 * i + j) as f32;
            }
            (x, i as i64)
        })
        .collect()
}

/// The samples collated into a lease of `pool`.
pub fn batch(pool: &PinnedPool, first: usize, n: usize) -> Batch<PoolBuffer> {
    let s = samples(first, n);
    let collate = StackCollate::new().with_names(["x", "y"]);
    let layout = collate.layout(&s).expect("layout");
    let lease = pool.alloc(layout.total_bytes()).expect("lease");
    collate.collate_into(&s, layout, lease).expect("collate")
}

/// The f32 elements of a host tensor.
pub fn f32s(t: &DlpackTensor) -> Vec<f32> {
    let b = t.host_bytes().expect("ready").expect("host memory");
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// The i64 elements of a host tensor.
pub fn i64s(t: &DlpackTensor) -> Vec<i64> {
    let b = t.host_bytes().expect("ready").expect("host memory");
    b.chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Reads `len` bytes at a consumer's pointer, as a consumer would.
///
/// # Safety
/// The pointer is a live host tensor's data of at least `len` bytes.
pub unsafe fn read_raw(ptr: *const std::ffi::c_void, len: usize) -> Vec<u8> {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec()
}
