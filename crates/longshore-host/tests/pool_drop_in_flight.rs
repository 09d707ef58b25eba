//! Dropping a pool (its last handle and its last lease) while a copy from a released block is
//! still in flight must not free that block under the copy: the drop waits for the block's
//! fences, as `HostBuffer`'s own drop does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use longshore_host::{CpuFence, Fence, MemoryKind, PinnedPool, PoolConfig};

#[test]
fn dropping_the_pool_waits_for_the_fences_of_pending_blocks() {
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap();
    let fence = CpuFence::new();
    let mut lease = pool.alloc(1 << 20).unwrap();
    lease.as_bytes_mut().fill(7);
    lease.record_fence(fence.clone());
    drop(lease); // pending: its "copy" has not completed
    assert_eq!(pool.stats().blocks_pending, 1);

    let signalled = Arc::new(AtomicBool::new(false));
    let signaller = {
        let (fence, signalled) = (fence.clone(), signalled.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            signalled.store(true, Ordering::SeqCst);
            fence.signal();
        })
    };
    drop(pool);
    assert!(
        signalled.load(Ordering::SeqCst) && fence.is_complete(),
        "the pool freed a block whose fence had not completed"
    );
    signaller.join().unwrap();
}
