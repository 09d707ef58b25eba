//! A CUDA device's default stager lives as long as some handle to the device does, and no
//! longer: its page-locked chunks and threads are released with the last handle, and a
//! later `Device::cuda` opens the device again. Skips without a driver unless
//! LONGSHORE_REQUIRE_CUDA=1.

mod common;

use common::gpu;
use std::sync::Arc;

use longshore_host::HostBuffer;
use longshore_transfer::{Device, UploadMode};

fn staged_round_trip(dev: &Device, seed: u8) {
    let stream = dev.new_stream().unwrap();
    let data: Vec<u8> = (0..(9 << 20) + 5)
        .map(|i: usize| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let mut dst = stream.alloc(data.len()).unwrap();
    stream
        .upload_slice(&data, &mut dst, 0, UploadMode::Staged)
        .unwrap();
    let out = HostBuffer::page_locked(data.len()).unwrap();
    let out = stream.download(&dst, out).unwrap().wait().unwrap();
    assert!(
        out.as_bytes() == &data[..],
        "staged round trip {seed} differs"
    );
}

#[test]
fn the_default_stager_is_released_with_the_last_device_handle() {
    let Some(dev) = gpu() else { return };
    let again = Device::cuda(0).unwrap();
    staged_round_trip(&dev, 1);
    let stager = dev.stager().unwrap();
    assert!(
        Arc::ptr_eq(&stager, &again.stager().unwrap()),
        "two live handles share one default stager"
    );
    assert!(stager.pool().stats().bytes_held > 0);
    let weak = Arc::downgrade(&stager);
    drop(stager);
    drop(again);
    assert!(weak.upgrade().is_some(), "a live handle keeps the stager");
    drop(dev);
    assert!(
        weak.upgrade().is_none(),
        "the stager (and its page-locked chunks) outlived every handle to its device"
    );
    // The device opens again, with a new stager, and works.
    let dev = Device::cuda(0).unwrap();
    staged_round_trip(&dev, 2);
}
