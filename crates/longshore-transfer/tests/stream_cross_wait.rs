//! A stream waiting on another stream's event blocks its own worker, never the host.

use std::sync::mpsc;
use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::Device;

#[test]
fn waiting_stream_is_held_back_until_the_event() {
    let dev = Device::cpu();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let (release, gate) = mpsc::channel::<()>();
    a.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let mut buf = a.alloc(1024).unwrap();
    drop(
        a.upload(
            HostBuffer::from_slice(MemoryKind::Pageable, &[5u8; 1024]).unwrap(),
            &mut buf,
        )
        .unwrap(),
    );
    let on_a = a.record().unwrap();

    // B waits on A, then runs a marker: enqueuing both must not block the host.
    let t = std::time::Instant::now();
    b.wait_event(&on_a).unwrap();
    let marker = b.record().unwrap();
    assert!(t.elapsed() < Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !marker.is_complete(),
        "B ran past its wait while A was blocked"
    );

    release.send(()).unwrap();
    marker.synchronize().unwrap();
    assert!(on_a.is_complete());
}

#[test]
fn reads_on_another_stream_follow_the_write_without_an_explicit_wait() {
    let dev = Device::cpu();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let (release, gate) = mpsc::channel::<()>();
    a.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let mut buf = a.alloc(64).unwrap();
    drop(
        a.upload(
            HostBuffer::from_slice(MemoryKind::Pageable, &[42u8; 64]).unwrap(),
            &mut buf,
        )
        .unwrap(),
    );
    // The buffer remembers its last write (on A): a download on B waits for it.
    let pending = b.download(&buf, HostBuffer::pageable(64).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!pending.is_ready());
    release.send(()).unwrap();
    assert_eq!(pending.wait().unwrap().as_bytes(), &[42u8; 64]);
}

#[test]
fn a_write_on_another_stream_waits_for_pending_reads() {
    let dev = Device::cpu();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let mut buf = a.to_device(&[1u8; 32]).unwrap();
    let (release, gate) = mpsc::channel::<()>();
    a.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let read = a.download(&buf, HostBuffer::pageable(32).unwrap()).unwrap();
    // B overwrites the buffer: it must wait for A's pending read, or the read sees 2s.
    drop(
        b.upload(
            HostBuffer::from_slice(MemoryKind::Pageable, &[2u8; 32]).unwrap(),
            &mut buf,
        )
        .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(10));
    release.send(()).unwrap();
    assert_eq!(read.wait().unwrap().as_bytes(), &[1u8; 32]);
    assert_eq!(b.read_to_vec::<u8>(&buf).unwrap(), vec![2u8; 32]);
}
