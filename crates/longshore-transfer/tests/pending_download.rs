//! Device -> host results are reachable only once their copy has completed.

use std::sync::mpsc;
use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::Device;

#[test]
fn pending_is_not_ready_until_the_copy_ran() {
    let stream = Device::cpu().new_stream().unwrap();
    let data: Vec<u32> = (0..1024).collect();
    let on_device = stream.to_device(&data).unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let mut out = HostBuffer::pageable(4096).unwrap();
    out.as_mut_slice::<u32>().unwrap().fill(0xDEAD_BEEF);
    let pending = stream.download(&on_device, out).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let pending = pending
        .try_take()
        .expect_err("the copy cannot have run: its stream is blocked");
    assert!(!pending.is_ready());
    release.send(()).unwrap();
    let out = pending.wait().unwrap();
    assert_eq!(out.as_slice::<u32>().unwrap(), &data[..]);
}

#[test]
fn download_at_offset_into_a_pool_lease() {
    let stream = Device::cpu().new_stream().unwrap();
    let on_device = stream.to_device(&(0..=255u8).collect::<Vec<_>>()).unwrap();
    let pool =
        longshore_host::PinnedPool::new(longshore_host::PoolConfig::for_kind(MemoryKind::Pageable))
            .unwrap();
    let lease = pool.alloc(16).unwrap();
    let lease = stream
        .download_at(&on_device, 100, lease)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(lease.as_bytes(), &(100..116u8).collect::<Vec<_>>()[..]);
}

#[test]
fn dropping_a_pending_download_is_safe_while_the_copy_is_in_flight() {
    let stream = Device::cpu().new_stream().unwrap();
    let on_device = stream.to_device(&[7u8; 1 << 16]).unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let pending = stream
        .download(&on_device, HostBuffer::pageable(1 << 16).unwrap())
        .unwrap();
    let ev = pending.event().clone();
    drop(pending); // must neither block nor free the buffer under the copy
    assert!(!ev.is_complete());
    release.send(()).unwrap();
    ev.synchronize().unwrap();
}
