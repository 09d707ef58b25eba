//! Events and pending copies are futures that tokio can await without blocking its threads.

use std::sync::mpsc;
use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::Device;

#[tokio::test(flavor = "current_thread")]
async fn await_pending_download_and_upload_on_a_single_threaded_runtime() {
    let stream = Device::cpu().new_stream().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let mut dst = stream.alloc(4096).unwrap();
    let up = stream
        .upload(
            HostBuffer::from_slice(MemoryKind::Pageable, &[9u8; 4096]).unwrap(),
            &mut dst,
        )
        .unwrap();
    let down = stream
        .download(&dst, HostBuffer::pageable(4096).unwrap())
        .unwrap();
    let ev = stream.record().unwrap();
    // The runtime has one thread: if awaiting blocked it, this timer could never fire.
    let timer = tokio::time::sleep(Duration::from_millis(30));
    tokio::select! {
        _ = ev.completion() => panic!("completed while the stream is blocked"),
        _ = timer => {}
    }
    release.send(()).unwrap();
    let src = up.await.unwrap();
    let out = down.await.unwrap();
    (&ev).await.unwrap();
    assert_eq!(src.as_bytes(), out.as_bytes());
    assert!(out.iter().all(|&b| b == 9));
}

#[tokio::test(flavor = "current_thread")]
async fn many_concurrent_awaits_all_wake() {
    let dev = Device::cpu();
    let mut tasks = Vec::new();
    for i in 0..32u8 {
        let stream = dev.new_stream().unwrap();
        tasks.push(tokio::spawn(async move {
            stream
                .launch_host_fn(|| std::thread::sleep(Duration::from_millis(2)))
                .unwrap();
            let on_device = stream.to_device(&[i; 100]).unwrap();
            let out = stream
                .download(&on_device, HostBuffer::pageable(100).unwrap())
                .unwrap()
                .await
                .unwrap();
            assert!(out.iter().all(|&b| b == i));
            stream.record().unwrap().await.unwrap();
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a future was never woken")
            .unwrap();
    }
}
