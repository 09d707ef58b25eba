//! The `Fence` of a CUDA event, as the pinned pool's reaper uses it: a wait with a timeout
//! returns false while the work before the event runs and true once it has completed, woken by
//! the event watcher (the same rule on the Cpu backend). Skips without a driver unless
//! LONGSHORE_REQUIRE_CUDA=1.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::gpu;
use longshore_host::SharedFence;
use longshore_transfer::Device;

fn check(device: &Device) {
    let stream = device.new_stream().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    // The stream is held by a host function until the test releases it.
    stream
        .launch_host_fn(move || {
            let _ = gate.recv_timeout(Duration::from_secs(20));
        })
        .unwrap();
    let fence: SharedFence = stream.record().unwrap().to_fence();
    assert!(!fence.is_complete());
    assert!(
        !fence.wait_timeout(Duration::from_millis(30)),
        "{device:?}: completed early"
    );
    // Several waiters at once, as several pending blocks' fences.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let f = fence.clone();
            std::thread::spawn(move || f.wait_timeout(Duration::from_secs(10)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    release.send(()).unwrap();
    for w in waiters {
        assert!(
            w.join().unwrap(),
            "{device:?}: a waiter timed out after the release"
        );
    }
    assert!(fence.is_complete());
    // Complete already: at once.
    assert!(fence.wait_timeout(Duration::ZERO));
}

#[test]
fn a_fence_wait_with_a_timeout_is_woken_by_the_completion_on_cpu() {
    check(&Device::cpu());
}

#[test]
fn a_fence_wait_with_a_timeout_is_woken_by_the_completion_on_cuda() {
    let Some(dev) = gpu() else { return };
    check(&dev);
}
