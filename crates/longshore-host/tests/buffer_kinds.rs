//! HostBuffer: kinds, alignment, typed views and bad input.

use longshore_host::{CpuFence, HostBuffer, HostError, MemoryKind, sys};

#[test]
fn pageable_buffers_are_zeroed_page_aligned_and_rounded() {
    for len in [1usize, 7, 4095, 4096, 4097, 1 << 20, (1 << 20) + 3] {
        let buf = HostBuffer::pageable(len).unwrap();
        assert_eq!(buf.kind(), MemoryKind::Pageable);
        assert_eq!(buf.len(), len);
        assert_eq!(buf.as_ptr() as usize % sys::page_size(), 0, "len {len}");
        assert!(buf.capacity() >= len && buf.capacity().is_multiple_of(sys::page_size()));
        assert!(
            buf.as_bytes().iter().all(|&b| b == 0),
            "len {len} not zeroed"
        );
    }
}

#[test]
fn custom_alignment_is_honoured_and_checked() {
    let buf = HostBuffer::pageable_aligned(100, 1 << 16).unwrap();
    assert_eq!(buf.as_ptr() as usize % (1 << 16), 0);
    let err = HostBuffer::pageable_aligned(100, 3).unwrap_err();
    assert!(
        matches!(err, HostError::InvalidLayout { align: 3, .. }),
        "{err}"
    );
}

#[test]
fn zero_and_absurd_sizes_are_errors_not_panics() {
    let err = HostBuffer::pageable(0).unwrap_err();
    assert!(matches!(
        err,
        HostError::ZeroSize {
            kind: MemoryKind::Pageable
        }
    ));
    assert!(err.to_string().contains("zero-byte pageable"));
    for len in [usize::MAX, usize::MAX / 2, isize::MAX as usize] {
        let err = HostBuffer::pageable(len).unwrap_err();
        assert!(
            matches!(
                err,
                HostError::InvalidLayout { .. } | HostError::OutOfMemory { .. }
            ),
            "{err}"
        );
    }
    for kind in [
        MemoryKind::Locked,
        MemoryKind::PageLocked,
        MemoryKind::Registered,
    ] {
        assert!(HostBuffer::alloc(kind, 0).is_err());
        assert!(HostBuffer::alloc(kind, usize::MAX).is_err());
    }
}

#[test]
fn typed_views_check_length_and_alignment() {
    let mut buf = HostBuffer::pageable(4096).unwrap();
    {
        let f = buf.as_mut_slice::<f32>().unwrap();
        assert_eq!(f.len(), 1024);
        for (i, v) in f.iter_mut().enumerate() {
            *v = i as f32;
        }
    }
    assert_eq!(buf.as_slice::<f32>().unwrap()[1023], 1023.0);
    assert_eq!(buf.as_slice::<u64>().unwrap().len(), 512);

    buf.set_len(4095).unwrap();
    let err = buf.as_slice::<f32>().unwrap_err();
    assert!(err.to_string().contains("not a multiple"), "{err}");
    assert!(err.to_string().contains("f32"), "{err}");
    assert!(buf.set_len(buf.capacity() + 1).is_err());
}

#[test]
fn from_slice_copies_data() {
    let data: Vec<i64> = (0..1000).map(|i| i * 3 - 7).collect();
    let buf = HostBuffer::from_slice(MemoryKind::Pageable, &data).unwrap();
    assert_eq!(buf.len(), 8000);
    assert_eq!(buf.as_slice::<i64>().unwrap(), &data[..]);
}

#[test]
fn drop_waits_for_recorded_fences() {
    let mut buf = HostBuffer::pageable(4096).unwrap();
    let fence = CpuFence::new();
    buf.record_fence(fence.clone());
    assert!(!buf.is_idle());
    let signalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = signalled.clone();
    let f2 = fence.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        s2.store(true, std::sync::atomic::Ordering::SeqCst);
        f2.signal();
    });
    drop(buf);
    assert!(
        signalled.load(std::sync::atomic::Ordering::SeqCst),
        "drop returned before the fence completed"
    );
    t.join().unwrap();
}

#[test]
fn locked_buffers_are_locked_or_report_the_limit() {
    match HostBuffer::locked(1 << 16) {
        Ok(buf) => {
            assert_eq!(buf.kind(), MemoryKind::Locked);
            assert!(buf.kind().is_page_locked() && !buf.kind().is_dma_capable());
        }
        Err(HostError::MlockRefused { limit, .. }) => assert!(!limit.is_empty()),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn cuda_kinds_without_a_driver_say_why() {
    if longshore_host::driver_available() {
        eprintln!("skipping: a CUDA driver is present; the no-driver error path is not reachable");
        return;
    }
    for kind in [MemoryKind::PageLocked, MemoryKind::Registered] {
        let err = HostBuffer::alloc(kind, 4096).unwrap_err();
        assert!(matches!(err, HostError::CudaUnavailable { .. }), "{err}");
        assert!(err.to_string().contains("CUDA is not available"), "{err}");
    }
    assert!(longshore_host::driver_unavailable_reason().is_some());
}
