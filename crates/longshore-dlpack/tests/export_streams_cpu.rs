//! Stream ordering on the Cpu backend: a consumer's stream waits for a device batch's copy
//! (the host does not), and a released tensor's memory goes back only after the work the
//! consumer had enqueued on its stream.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{batch, f32s, i64s, pool};
use longshore_dlpack::ffi::DLDeviceType;
use longshore_dlpack::{ExportOptions, export_device, export_host, hand_all_to};
use longshore_transfer::{Device, upload_new};

/// Polls `f` until it holds or two seconds pass.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

#[test]
fn release_waits_for_the_consumer_stream() {
    let pool = pool(false);
    let consumer = Device::cpu().new_stream().unwrap();
    let mut tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
    for t in &mut tensors {
        t.hand_to(&consumer).unwrap();
    }
    // The consumer's stream is busy with work that reads the batch (a GPU copy, say).
    let (go, gate) = mpsc::channel::<()>();
    consumer
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let raws: Vec<_> = tensors.into_iter().map(|t| t.into_raw()).collect();
    for r in raws {
        // SAFETY: a live export, deleted once.
        unsafe { ((*r).deleter.unwrap())(r) };
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        pool.stats().bytes_in_use > 0,
        "the lease went back while the consumer's stream could still read it"
    );
    go.send(()).unwrap();
    consumer.synchronize().unwrap();
    assert!(eventually(|| pool.stats().bytes_in_use == 0));
    assert_eq!(pool.stats().blocks_cached, 1);
}

#[test]
fn consumer_stream_waits_for_the_copy_without_blocking_the_host() {
    let device = Device::cpu();
    let (copy, consumer) = (device.new_stream().unwrap(), device.new_stream().unwrap());
    let pool = pool(false);
    let host = batch(&pool, 7, 3);
    let (layout, lease) = host.into_parts();
    // Hold the copy stream back, then enqueue the upload behind it.
    let (go, gate) = mpsc::channel::<()>();
    copy.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let storage = upload_new(&copy, lease).unwrap();
    let ready = copy.record().unwrap();
    assert!(!ready.is_complete());
    let t0 = Instant::now();
    let mut tensors = export_device(
        &layout,
        storage,
        Some(ready.clone()),
        &ExportOptions::default(),
    )
    .unwrap();
    assert_eq!(tensors[0].device().device_type, DLDeviceType::CPU);
    assert!(tensors[0].ready_event().is_some());
    for t in &mut tensors {
        t.hand_to(&consumer).unwrap();
    }
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "hand_to blocked the host"
    );
    // The consumer reads the features through the raw pointer, as a kernel would.
    let x = &tensors[0];
    let (ptr, len) = (x.data_ptr() as usize, x.byte_len());
    let (tx, seen) = mpsc::channel::<Vec<u8>>();
    consumer
        .launch_host_fn(move || {
            // SAFETY: the tensor is alive until after `seen` is received below, and the consumer
            // stream runs this only after the copy (it waits on `ready`).
            let bytes = unsafe { common::read_raw(ptr as *const std::ffi::c_void, len) };
            let _ = tx.send(bytes);
        })
        .unwrap();
    assert!(
        seen.recv_timeout(Duration::from_millis(50)).is_err(),
        "the consumer ran before the copy"
    );
    go.send(()).unwrap();
    let bytes = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    let want: Vec<u8> = (7..10)
        .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
        .flat_map(f32::to_ne_bytes)
        .collect();
    assert_eq!(bytes, want);
    assert_eq!(i64s(&tensors[1]), vec![7, 8, 9]);
    drop(tensors);
    consumer.synchronize().unwrap();
    // The lease went back once its copy completed, whatever the tensors did.
    assert!(eventually(|| pool.stats().bytes_in_use == 0));
}

#[test]
fn protocol_stream_on_the_cpu_device_waits_on_the_host() {
    let device = Device::cpu();
    let copy = device.new_stream().unwrap();
    let pool = pool(false);
    let (layout, lease) = batch(&pool, 1, 2).into_parts();
    let storage = upload_new(&copy, lease).unwrap();
    let ready = copy.record().unwrap();
    let mut tensors = export_device(
        &layout,
        storage,
        Some(ready.clone()),
        &ExportOptions::default(),
    )
    .unwrap();
    tensors[0].prepare_for_stream(None).unwrap();
    assert!(ready.is_complete());
    assert_eq!(
        f32s(&tensors[0]),
        vec![10., 11., 12., 13., 14., 20., 21., 22., 23., 24.]
    );
}

#[test]
fn hand_all_to_orders_every_tensor_of_every_export_and_defers_the_release() {
    let device = Device::cpu();
    let consumer = device.new_stream().unwrap();
    let pool = pool(false);
    // Two exports with their own copies (as nvJPEG batches export images and labels apart),
    // each on its own copy stream held back by its own gate, so the two events complete
    // apart and a consumer that waited for only one of them would run too early.
    let mut gates = Vec::new();
    let mut tensors = Vec::new();
    for first in [3, 30] {
        let copy = device.new_stream().unwrap();
        let (go, gate) = mpsc::channel::<()>();
        copy.launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
        gates.push(go);
        let (layout, lease) = batch(&pool, first, 2).into_parts();
        let storage = upload_new(&copy, lease).unwrap();
        let ready = copy.record().unwrap();
        tensors.extend(
            export_device(&layout, storage, Some(ready), &ExportOptions::default()).unwrap(),
        );
    }
    assert_eq!(tensors.len(), 4);
    let t0 = Instant::now();
    hand_all_to(&mut tensors, &consumer).unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "hand_all_to blocked the host"
    );
    // The consumer reads every tensor through its raw pointer, as kernels would.
    let views: Vec<(usize, usize)> = tensors
        .iter()
        .map(|t| (t.data_ptr() as usize, t.byte_len()))
        .collect();
    let (tx, seen) = mpsc::channel::<Vec<Vec<u8>>>();
    consumer
        .launch_host_fn(move || {
            let bytes = views
                .iter()
                // SAFETY: the tensors are alive until after `seen` is received below, and the
                // consumer stream runs this only after both copies (it waits on both events).
                .map(|&(p, n)| unsafe { common::read_raw(p as *const std::ffi::c_void, n) })
                .collect();
            let _ = tx.send(bytes);
        })
        .unwrap();
    assert!(
        seen.recv_timeout(Duration::from_millis(50)).is_err(),
        "the consumer ran before the copies"
    );
    // One export's copy done, the other's not: the consumer still waits (for each distinct
    // event, not only the first).
    gates[0].send(()).unwrap();
    assert!(
        seen.recv_timeout(Duration::from_millis(100)).is_err(),
        "the consumer ran before the second export's copy"
    );
    gates[1].send(()).unwrap();
    let bytes = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    let f = |first: usize| -> Vec<u8> {
        (first..first + 2)
            .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
            .flat_map(f32::to_ne_bytes)
            .collect()
    };
    let l = |first: i64| -> Vec<u8> { (first..first + 2).flat_map(i64::to_ne_bytes).collect() };
    assert_eq!(bytes, vec![f(3), l(3), f(30), l(30)]);
    drop(tensors);
    consumer.synchronize().unwrap();
    // The uploads' leases went back once their copies completed.
    assert!(eventually(|| pool.stats().bytes_in_use == 0));
    // A host batch: its lease goes back only once the consumer passed the point of release.
    let mut tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
    hand_all_to(&mut tensors, &consumer).unwrap();
    let (go, gate) = mpsc::channel::<()>();
    consumer
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let in_use = pool.stats().bytes_in_use;
    assert!(in_use > 0);
    drop(tensors);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        pool.stats().bytes_in_use,
        in_use,
        "the lease went back while the consumer's stream could still read it"
    );
    go.send(()).unwrap();
    consumer.synchronize().unwrap();
    assert!(eventually(|| pool.stats().bytes_in_use == 0));
}

/// The tensors of one batch released on two different consumer streams, in either order: the
/// memory goes back only once both streams have run what they had enqueued before the
/// release of their tensor (the last release records on every stream noted, not only on its
/// own).
#[test]
fn a_batch_on_two_consumer_streams_waits_for_both() {
    for first_released in [0usize, 1] {
        let pool = pool(false);
        let streams = [
            Device::cpu().new_stream().unwrap(),
            Device::cpu().new_stream().unwrap(),
        ];
        let mut tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
        assert_eq!(tensors.len(), 2);
        let mut gates = Vec::new();
        for (t, s) in tensors.iter_mut().zip(&streams) {
            t.hand_to(s).unwrap();
            let (go, gate) = mpsc::channel::<()>();
            s.launch_host_fn(move || {
                let _ = gate.recv();
            })
            .unwrap();
            gates.push(go);
        }
        let raws: Vec<_> = tensors.into_iter().map(|t| t.into_raw()).collect();
        for i in [first_released, 1 - first_released] {
            // SAFETY: a live export, deleted once.
            unsafe { ((*raws[i]).deleter.unwrap())(raws[i]) };
        }
        // Let the stream of the tensor released first finish: the other one still reads.
        gates[first_released].send(()).unwrap();
        streams[first_released].synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            pool.stats().bytes_in_use > 0,
            "released first on stream {first_released}: the lease went back while the other stream could still read it"
        );
        let other = 1 - first_released;
        gates[other].send(()).unwrap();
        streams[other].synchronize().unwrap();
        assert!(eventually(|| pool.stats().bytes_in_use == 0));
        // And the other way: the stream of the tensor released last finishes first.
        let mut tensors = export_host(batch(&pool, 0, 4), &ExportOptions::default()).unwrap();
        let mut gates = Vec::new();
        for (t, s) in tensors.iter_mut().zip(&streams) {
            t.hand_to(s).unwrap();
            let (go, gate) = mpsc::channel::<()>();
            s.launch_host_fn(move || {
                let _ = gate.recv();
            })
            .unwrap();
            gates.push(go);
        }
        let raws: Vec<_> = tensors.into_iter().map(|t| t.into_raw()).collect();
        for i in [first_released, other] {
            // SAFETY: a live export, deleted once.
            unsafe { ((*raws[i]).deleter.unwrap())(raws[i]) };
        }
        gates[other].send(()).unwrap();
        streams[other].synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            pool.stats().bytes_in_use > 0,
            "the lease went back while the stream of the tensor released first could still read it"
        );
        gates[first_released].send(()).unwrap();
        streams[first_released].synchronize().unwrap();
        assert!(eventually(|| pool.stats().bytes_in_use == 0));
    }
}
