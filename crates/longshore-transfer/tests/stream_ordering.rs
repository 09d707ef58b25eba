//! Work on one `Cpu` stream runs in the order it was enqueued, asynchronously to the host.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::{Device, UploadMode};

#[test]
fn host_functions_and_copies_run_in_enqueue_order() {
    let stream = Device::cpu().new_stream().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut buf = stream.alloc(8).unwrap();
    for i in 0..100u8 {
        let l = log.clone();
        stream
            .launch_host_fn(move || l.lock().unwrap().push(i))
            .unwrap();
        // Each upload overwrites the buffer: the last one must win.
        drop(
            stream
                .upload(
                    HostBuffer::from_slice(MemoryKind::Pageable, &[i; 8]).unwrap(),
                    &mut buf,
                )
                .unwrap(),
        );
    }
    stream.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<u8>>());
    assert_eq!(stream.read_to_vec::<u8>(&buf).unwrap(), vec![99u8; 8]);
}

#[test]
fn enqueue_returns_before_the_work_runs() {
    let stream = Device::cpu().new_stream().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let mut buf = stream.alloc(4096).unwrap();
    // The stream is blocked: the copy is only enqueued, and the host is not blocked.
    let upload = stream
        .upload(
            HostBuffer::from_slice(MemoryKind::Pageable, &[3u8; 4096]).unwrap(),
            &mut buf,
        )
        .unwrap();
    let after = stream.record().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!upload.is_ready());
    assert!(!after.is_complete());
    release.send(()).unwrap();
    after.synchronize().unwrap();
    assert!(upload.is_ready());
    assert_eq!(stream.read_to_vec::<u8>(&buf).unwrap(), vec![3u8; 4096]);
}

#[test]
fn memset_copy_and_offsets_keep_order() {
    let stream = Device::cpu().new_stream().unwrap();
    let mut a = stream.alloc_zeroed(16).unwrap();
    let mut b = stream.alloc(16).unwrap();
    stream.memset(&mut b, 0xEE).unwrap();
    stream
        .upload_slice(&[1, 2, 3, 4], &mut a, 4, UploadMode::Direct)
        .unwrap();
    stream.copy(&a, 0, &mut b, 8, 8).unwrap();
    stream.memset(&mut a, 9).unwrap();
    assert_eq!(stream.read_to_vec::<u8>(&a).unwrap(), vec![9u8; 16]);
    assert_eq!(
        stream.read_to_vec::<u8>(&b).unwrap(),
        vec![
            0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0, 0, 0, 0, 1, 2, 3, 4
        ]
    );
}

#[test]
fn out_of_bounds_and_zero_size_are_errors() {
    let stream = Device::cpu().new_stream().unwrap();
    assert!(matches!(
        stream.alloc(0),
        Err(longshore_transfer::TransferError::ZeroSize { .. })
    ));
    let mut buf = stream.alloc(8).unwrap();
    let err = stream
        .upload_slice(&[0u8; 8], &mut buf, 1, UploadMode::Auto)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("8 bytes at offset 1 do not fit a 8-byte device buffer"),
        "{err}"
    );
    let err = stream
        .download_at(&buf, 4, HostBuffer::pageable(8).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, longshore_transfer::TransferError::OutOfBounds { .. }),
        "{err}"
    );
    assert!(buf.len_of::<u32>().is_ok());
    assert!(stream.alloc(6).unwrap().len_of::<u32>().is_err());
}
