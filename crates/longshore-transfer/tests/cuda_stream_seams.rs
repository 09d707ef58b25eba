//! The seams for crates above transfer on a GPU: `Stream::as_raw` / `from_raw` with
//! transfer's own stream and with a stream made outside longshore, and `enqueue_work` driving
//! a raw driver call on `as_raw`'s `CUstream` over `device_ptr`. Skips without a driver unless
//! LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::gpu;
use cudarc::driver::{CudaContext, result};
use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::Stream;

#[test]
fn a_stream_adopted_from_as_raw_is_the_same_queue_and_does_not_destroy_it() {
    let Some(dev) = gpu() else { return };
    let owner = dev.new_stream().unwrap();
    let raw = owner.as_raw().unwrap();
    assert!(!raw.is_null());
    // SAFETY: `raw` is the CUstream of `owner`, alive until the end of this test.
    let adopted = unsafe { Stream::from_raw(&dev, raw) }.unwrap();
    assert_eq!(adopted.as_raw().unwrap(), raw);
    assert_ne!(adopted.id(), owner.id());
    let mut buf = adopted.alloc(1 << 20).unwrap();
    let src = HostBuffer::from_slice(MemoryKind::PageLocked, &vec![3u8; 1 << 20]).unwrap();
    drop(adopted.upload(src, &mut buf).unwrap());
    drop(adopted);
    // The native stream is still alive: the owner reads back what the adopted stream wrote.
    assert!(
        owner
            .read_to_vec::<u8>(&buf)
            .unwrap()
            .iter()
            .all(|&b| b == 3)
    );
}

#[test]
fn a_stream_made_outside_longshore_orders_longshore_copies() {
    let Some(dev) = gpu() else { return };
    let ctx = CudaContext::new(0).unwrap();
    let foreign = ctx.new_stream().unwrap();
    // SAFETY: `foreign` is a stream of the primary context of GPU 0, kept alive (below) until
    // every buffer allocated on the adopted stream has been dropped.
    let s = unsafe { Stream::from_raw(&dev, foreign.cu_stream().cast()) }.unwrap();
    let n = 4 << 20;
    let mut buf = s.alloc(n).unwrap();
    let src = HostBuffer::from_slice(MemoryKind::PageLocked, &vec![0x5au8; n]).unwrap();
    drop(s.upload(src, &mut buf).unwrap());
    // Work the owner enqueues on its own stream after the copy sees the copy's bytes.
    let mut out = vec![0u8; n];
    // SAFETY: `buf` holds n bytes on this device; we synchronise before `out` is read.
    unsafe { result::memcpy_dtoh_async(&mut out, buf.device_ptr(), foreign.cu_stream()) }.unwrap();
    foreign.synchronize().unwrap();
    assert!(out.iter().all(|&b| b == 0x5a));
    drop(buf);
    s.synchronize().unwrap();
    drop(s);
    drop(foreign);
}

#[test]
fn enqueue_work_runs_a_raw_driver_call_ordered_and_tracked() {
    let Some(dev) = gpu() else { return };
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let n = 8 << 20;
    let mut buf = copy.alloc(n).unwrap();
    let src = HostBuffer::from_slice(MemoryKind::PageLocked, &vec![1u8; n]).unwrap();
    drop(copy.upload(src, &mut buf).unwrap());
    let ptr = buf.device_ptr();
    assert_eq!(buf.cuda_device_ptr(), Some(ptr));
    assert!(buf.cpu_memory().is_none());
    // Our own "kernel": a fill of the second half on `compute`, through the raw stream.
    let ev = compute
        .enqueue_work(&[], &[&buf], || {
            let raw = compute.as_raw()?;
            // SAFETY: the second half of `buf` is device memory of this context (bound by
            // enqueue_work); `raw` is `compute`'s live CUstream.
            unsafe { result::memset_d8_async(ptr + (n / 2) as u64, 7, n / 2, raw.cast()) }
                .map_err(|e| longshore_transfer::TransferError::Invalid(format!("{e:?}")))
        })
        .unwrap();
    assert_eq!(buf.ready_event().unwrap().stream_id(), ev.stream_id());
    // A download on `copy` orders itself after the fill: half ones, half sevens.
    let back = copy.read_to_vec::<u8>(&buf).unwrap();
    assert!(back[..n / 2].iter().all(|&b| b == 1));
    assert!(back[n / 2..].iter().all(|&b| b == 7));
    // Dropping the buffer with the work's event as its last use frees it after that event.
    drop(buf);
    compute.synchronize().unwrap();
}

#[test]
fn a_high_priority_stream_has_the_contexts_greatest_priority_and_runs_work() {
    let Some(dev) = gpu() else { return };
    use longshore_transfer::StreamPriority;
    let high = dev.new_stream_with_priority(StreamPriority::High).unwrap();
    let normal = dev
        .new_stream_with_priority(StreamPriority::Normal)
        .unwrap();
    // The context is current on this thread after making the streams.
    let (least, greatest) = result::stream::get_priority_range().unwrap();
    let priority = |s: &Stream| {
        let mut p = 1234;
        // SAFETY: the raw handle is a live stream of this context (`s` outlives the call).
        unsafe {
            cudarc::driver::sys::cuStreamGetPriority(s.as_raw().unwrap().cast(), &mut p)
                .result()
                .unwrap()
        };
        p
    };
    assert_eq!(priority(&high), greatest, "range ({least}, {greatest})");
    assert_eq!(priority(&normal), 0);
    assert!(
        greatest < least,
        "an H100/H200 has stream priorities: ({least}, {greatest})"
    );
    // Work on it completes and is ordered as on any stream.
    let n = 1 << 20;
    let mut buf = high.alloc(n).unwrap();
    let src = HostBuffer::from_slice(MemoryKind::PageLocked, &vec![7u8; n]).unwrap();
    drop(high.upload(src, &mut buf).unwrap());
    assert!(
        high.read_to_vec::<u8>(&buf)
            .unwrap()
            .iter()
            .all(|&b| b == 7)
    );
    // On the Cpu device the priority is accepted and changes nothing.
    let cpu = longshore_transfer::Device::cpu();
    let s = cpu.new_stream_with_priority(StreamPriority::High).unwrap();
    let mut b = s.alloc(16).unwrap();
    s.memset(&mut b, 9).unwrap();
    assert_eq!(s.read_to_vec::<u8>(&b).unwrap(), vec![9u8; 16]);
}
