//! `SharedAllocator`: each buffer is a memory file another process (here: another mapping)
//! sees byte for byte; a pool over it leases blocks that name their file, with ids that stay
//! unique when descriptors are reused; pinned shared memory needs a driver (skips without).

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use longshore_host::{MemoryKind, PinnedPool, PoolConfig, RawAllocator, SharedAllocator};

fn reopen(fd: i32) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{fd}"))
        .expect("a memory file reopens through /proc")
}

#[test]
fn another_mapping_sees_what_the_buffer_holds_and_writes_back() {
    let mut buf = SharedAllocator::new(false).allocate(10_000).unwrap();
    assert_eq!(buf.kind(), MemoryKind::Pageable);
    assert!(buf.as_bytes().iter().all(|&b| b == 0), "zeroed");
    for (i, b) in buf.as_bytes_mut().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let (fd, _) = buf.shared_fd().unwrap();
    let mut file = reopen(fd.as_raw_fd());
    let mut seen = vec![0u8; 10_000];
    file.read_exact(&mut seen).unwrap();
    assert_eq!(seen, buf.as_bytes());
    // A write through the other handle lands in the buffer's pages.
    file.seek(SeekFrom::Start(4096)).unwrap();
    file.write_all(b"worker").unwrap();
    assert_eq!(&buf.as_bytes()[4096..4102], b"worker");
}

#[test]
fn pool_blocks_name_their_file_and_ids_stay_unique() {
    let pool = PinnedPool::with_allocator(
        Arc::new(SharedAllocator::new(false)),
        PoolConfig::for_kind(MemoryKind::Pageable).budget(1 << 24),
    )
    .unwrap();
    let a = pool.alloc(100_000).unwrap();
    let (_, id_a) = a.shared_fd().unwrap();
    drop(a);
    // The cached block comes back: the same file.
    let b = pool.alloc(100_000).unwrap();
    assert_eq!(b.shared_fd().unwrap().1, id_a);
    let c = pool.alloc(100_000).unwrap();
    assert_ne!(c.shared_fd().unwrap().1, id_a);
    // Ids are never reused, descriptors may be.
    let mut ids = std::collections::HashSet::new();
    for _ in 0..20 {
        let buf = SharedAllocator::new(false).allocate(4096).unwrap();
        assert!(ids.insert(buf.shared_fd().unwrap().1));
    }
}

#[test]
fn other_allocators_have_no_file() {
    let buf = longshore_host::HostBuffer::pageable(4096).unwrap();
    assert!(buf.shared_fd().is_none());
}

#[test]
fn pinned_shared_memory_is_registered_with_the_driver() {
    let probe = longshore_host::driver_unavailable_reason().map_or(Ok(()), Err);
    let test = "pinned_shared_memory_is_registered_with_the_driver";
    if longshore_testing::cuda_or_skip(test, probe).is_none() {
        return;
    }
    let buf = SharedAllocator::new(true).allocate(1 << 20).unwrap();
    assert_eq!(buf.kind(), MemoryKind::Registered);
    assert!(longshore_host::is_driver_host_memory(buf.as_ptr()).unwrap());
    assert!(buf.shared_fd().is_some());
}
