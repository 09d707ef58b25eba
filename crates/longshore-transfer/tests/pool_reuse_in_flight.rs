//! A pool block uploaded from is not reused until its copy has completed.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use longshore_host::{BudgetPolicy, MemoryKind, PinnedPool, PoolConfig};
use longshore_transfer::{Device, DeviceBuffer, Stream};

/// A pool (64 MiB budget), a Cpu stream blocked until the returned sender sends (so copies
/// stay queued on purpose), and a destination of `dst_len` bytes on it.
fn gated_stream(dst_len: usize) -> (PinnedPool, Stream, DeviceBuffer, mpsc::Sender<()>) {
    let pool = PinnedPool::new(
        PoolConfig::for_kind(MemoryKind::Pageable)
            .budget(64 << 20)
            .policy(BudgetPolicy::Error),
    )
    .unwrap();
    let stream = Device::cpu().new_stream().unwrap();
    let dst = stream.alloc(dst_len).unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    (pool, stream, dst, release)
}

#[test]
fn lease_goes_back_to_the_pool_only_after_its_copy() {
    let (pool, stream, mut dst, release) = gated_stream(1 << 20);
    let mut lease = pool.alloc(1 << 20).unwrap();
    lease.as_bytes_mut().fill(0xAB);
    let first_ptr = lease.as_ptr();
    let upload = stream.upload(lease, &mut dst).unwrap();
    let ev = upload.event().clone();
    drop(upload); // the lease is released while the copy is still queued

    std::thread::sleep(Duration::from_millis(10));
    let mut other = pool.alloc(1 << 20).unwrap();
    assert_ne!(
        other.as_ptr(),
        first_ptr,
        "the pool handed out a block an in-flight copy still reads"
    );
    other.as_bytes_mut().fill(0xCD); // writing the other block cannot disturb the copy
    drop(other);

    release.send(()).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(stream.read_to_vec::<u8>(&dst).unwrap(), vec![0xAB; 1 << 20]);

    // Once the copy is done the first block comes back (the drop is deferred to a helper
    // thread). The free lists are LIFO and hold at most three blocks of this size, so taking
    // three at once reaches every cached block.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut reused = false;
    while Instant::now() < deadline && !reused {
        let taken: Vec<_> = (0..3).map(|_| pool.alloc(1 << 20).unwrap()).collect();
        reused = taken.iter().any(|b| b.as_ptr() == first_ptr);
        drop(taken);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(reused, "the block never came back to the pool");
}

#[test]
fn host_buffer_source_is_returned_after_the_copy() {
    let (_pool, stream, mut dst, release) = gated_stream(4096);
    let src = longshore_host::HostBuffer::from_slice(MemoryKind::Pageable, &[1u8; 4096]).unwrap();
    let upload = stream.upload(src, &mut dst).unwrap();
    let upload = upload
        .try_take()
        .expect_err("the source must not come back while the copy is queued");
    release.send(()).unwrap();
    let mut src = upload.wait().unwrap();
    assert!(src.is_idle());
    src.as_bytes_mut().fill(2); // free to refill now: the device copy keeps the old bytes
    assert_eq!(stream.read_to_vec::<u8>(&dst).unwrap(), vec![1u8; 4096]);
}

/// `Pending::release` (what `upload_new` and so `to_device` use) gives a pool lease back at
/// once, into the pool's pending list, not through the event watcher: the block is counted as
/// pending (and against the budget) and handed out again only after its copy.
#[test]
fn released_lease_waits_in_the_pools_pending_list() {
    let (pool, stream, mut dst, release) = gated_stream(1 << 20);
    let mut lease = pool.alloc(1 << 20).unwrap();
    lease.as_bytes_mut().fill(0x5A);
    let first_ptr = lease.as_ptr();
    let upload = stream.upload(lease, &mut dst).unwrap();
    let ev = upload.event().clone();
    upload.release();

    // Released synchronously: no longer in use, pending on the copy's fence.
    let s = pool.stats();
    assert_eq!(s.bytes_in_use, 0, "{s:?}");
    assert_eq!(s.blocks_pending, 1, "{s:?}");
    assert!(s.bytes_pending >= 1 << 20, "{s:?}");
    assert!(s.bytes_held >= 1 << 20, "the budget still counts it: {s:?}");
    let other = pool.alloc(1 << 20).unwrap();
    assert_ne!(other.as_ptr(), first_ptr, "reused under an in-flight copy");
    drop(other);

    release.send(()).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(stream.read_to_vec::<u8>(&dst).unwrap(), vec![0x5A; 1 << 20]);
    let taken: Vec<_> = (0..3).map(|_| pool.alloc(1 << 20).unwrap()).collect();
    assert!(
        taken.iter().any(|b| b.as_ptr() == first_ptr),
        "the block comes back once its copy is done"
    );
    drop(taken);
    assert_eq!(pool.stats().blocks_pending, 0);
}

/// A source whose drop would block (a `HostBuffer`) is not dropped by `release`: it waits for
/// the copy off the caller's thread, as dropping the `Pending` does.
#[test]
fn release_of_a_host_buffer_does_not_block() {
    let (_pool, stream, mut dst, release) = gated_stream(4096);
    let src = longshore_host::HostBuffer::from_slice(MemoryKind::Pageable, &[7u8; 4096]).unwrap();
    let t0 = Instant::now();
    stream.upload(src, &mut dst).unwrap().release();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "release blocked on a queued copy"
    );
    release.send(()).unwrap();
    assert_eq!(stream.read_to_vec::<u8>(&dst).unwrap(), vec![7u8; 4096]);
}
