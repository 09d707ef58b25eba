//! The seams for crates above transfer, on the Cpu device: `Stream::enqueue_work` (ordering
//! across streams and buffer lifetime), `Stream::local`, `DeviceBuffer::device_ptr` /
//! `cpu_memory`, and `Stream::as_raw` / `from_raw`, which have no meaning on Cpu and say so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use longshore_transfer::{Device, DeviceId, Event, TransferError};

/// A job that blocks its stream until `gate` is set, to hold work back deterministically.
fn hold(stream: &longshore_transfer::Stream, gate: Arc<AtomicBool>) {
    stream
        .launch_host_fn(move || {
            while !gate.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .unwrap();
}

#[test]
fn work_on_another_stream_waits_for_the_buffers_last_write() {
    let dev = Device::cpu();
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let mut buf = copy.alloc(4).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    hold(&copy, gate.clone());
    copy.upload_slice(
        &[1, 2, 3, 4],
        &mut buf,
        0,
        longshore_transfer::UploadMode::Direct,
    )
    .unwrap();
    // The work reads the buffer on `compute`: it must see the upload, held back on `copy`.
    let mem = buf.cpu_memory().unwrap();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let ev = compute
        .enqueue_work(&[&buf], &[], || {
            compute.launch_host_fn(move || seen_tx.send(mem.lock().to_vec()).unwrap())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(!ev.is_complete(), "the work ran before the write it reads");
    gate.store(true, Ordering::Release);
    ev.synchronize().unwrap();
    assert_eq!(seen_rx.recv().unwrap(), vec![1, 2, 3, 4]);
    // A read is not a write: the buffer's ready event is still the upload's.
    assert_eq!(buf.ready_event().unwrap().stream_id(), copy.id());
}

#[test]
fn a_later_copy_waits_for_work_that_writes_the_buffer() {
    let dev = Device::cpu();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let buf = a.to_device(&[0u8; 8]).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    hold(&a, gate.clone());
    let mem = buf.cpu_memory().unwrap();
    let ev = a
        .enqueue_work(&[], &[&buf], || {
            a.launch_host_fn(move || mem.lock().fill(9))
        })
        .unwrap();
    assert_eq!(buf.ready_event().unwrap().stream_id(), ev.stream_id());
    // A download on stream `b` must see the work's write although `a` is held back.
    let pending = b
        .download(&buf, longshore_host::HostBuffer::pageable(8).unwrap())
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !pending.is_ready(),
        "the copy ran before the work it must follow"
    );
    gate.store(true, Ordering::Release);
    assert_eq!(pending.wait().unwrap().as_bytes(), &[9u8; 8]);
}

#[test]
fn a_buffer_dropped_under_queued_work_stays_alive_for_it() {
    let dev = Device::cpu();
    let s = dev.new_stream().unwrap();
    let buf = s.to_device(&[5u8; 64]).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    hold(&s, gate.clone());
    let mem = buf.cpu_memory().unwrap();
    let sum = Arc::new(AtomicUsize::new(0));
    let out = sum.clone();
    let ev = s
        .enqueue_work(&[&buf], &[], || {
            s.launch_host_fn(move || {
                let total: usize = mem.lock().iter().map(|&b| b as usize).sum();
                out.store(total, Ordering::Release);
            })
        })
        .unwrap();
    drop(buf);
    gate.store(true, Ordering::Release);
    ev.synchronize().unwrap();
    assert_eq!(sum.load(Ordering::Acquire), 5 * 64);
}

#[test]
fn a_failed_enqueue_is_returned_and_the_buffer_stays_usable() {
    let s = Device::cpu().new_stream().unwrap();
    let buf = s.to_device(&[1u32, 2]).unwrap();
    let e = s
        .enqueue_work(&[], &[&buf], || Err(TransferError::Invalid("boom".into())))
        .unwrap_err();
    assert!(e.to_string().contains("boom"), "{e}");
    assert_eq!(s.read_to_vec::<u32>(&buf).unwrap(), vec![1, 2]);
}

#[test]
fn enqueue_runs_on_the_calling_thread_before_the_call_returns() {
    let s = Device::cpu().new_stream().unwrap();
    let buf = s.alloc(16).unwrap();
    assert_eq!(buf.device().id(), DeviceId::Cpu);
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    s.enqueue_work(&[&buf], &[], || {
        r.store(true, Ordering::Release);
        Ok(())
    })
    .unwrap();
    assert!(ran.load(Ordering::Acquire), "enqueue did not run");
}

#[test]
fn device_ptr_is_stable_and_distinct_per_buffer_and_cpu_memory_matches_len() {
    let s = Device::cpu().new_stream().unwrap();
    let a = s.alloc(100).unwrap();
    let b = s.alloc(100).unwrap();
    assert_ne!(a.device_ptr(), 0);
    assert_eq!(a.device_ptr(), a.device_ptr());
    assert_ne!(a.device_ptr(), b.device_ptr());
    assert_eq!(a.cuda_device_ptr(), None);
    let m = a.cpu_memory().unwrap();
    assert_eq!((m.len(), m.is_empty()), (100, false));
    assert_eq!(m.addr(), a.cpu_memory().unwrap().addr());
    assert_ne!(m.addr(), b.cpu_memory().unwrap().addr());
    assert_eq!(m.lock().as_ptr() as u64, a.device_ptr());
}

#[test]
fn stream_local_state_is_shared_by_clones_and_dropped_with_the_stream() {
    struct Probe(Arc<AtomicUsize>);
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let s = Device::cpu().new_stream().unwrap();
    let inits = AtomicUsize::new(0);
    let a = s
        .local(|| {
            inits.fetch_add(1, Ordering::SeqCst);
            Ok(Probe(drops.clone()))
        })
        .unwrap();
    let b = s
        .clone()
        .local(|| {
            inits.fetch_add(1, Ordering::SeqCst);
            Ok(Probe(drops.clone()))
        })
        .unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(inits.load(Ordering::SeqCst), 1);
    // Another type gets its own slot; a failing init stores nothing.
    assert!(
        s.local::<u32>(|| Err(TransferError::Invalid("no".into())))
            .is_err()
    );
    assert_eq!(*s.local(|| Ok(7u32)).unwrap(), 7);
    // Another stream has its own state.
    let other = Device::cpu().new_stream().unwrap();
    assert!(!Arc::ptr_eq(
        &a,
        &other
            .local(|| Ok(Probe(Arc::new(AtomicUsize::new(0)))))
            .unwrap()
    ));
    drop((a, b));
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the stream still holds it");
    drop(s);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn cpu_streams_have_no_native_handle() {
    let s = Device::cpu().new_stream().unwrap();
    match s.as_raw() {
        Err(TransferError::Unsupported { op, device, .. }) => {
            assert_eq!((op, device), ("Stream::as_raw", DeviceId::Cpu));
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // SAFETY: on the Cpu device `from_raw` never dereferences the handle; it fails at once.
    let adopted =
        unsafe { longshore_transfer::Stream::from_raw(&Device::cpu(), std::ptr::null_mut()) };
    let e = adopted.unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::Unsupported {
                op: "Stream::from_raw",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("not supported on cpu"), "{e}");
}

#[test]
fn the_returned_event_covers_the_work() {
    let s = Device::cpu().new_stream().unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let ev: Event = s
        .enqueue_work(&[], &[], || {
            s.launch_host_fn(move || {
                while !g.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .unwrap();
    assert!(!ev.wait_timeout(Duration::from_millis(20)));
    gate.store(true, Ordering::Release);
    assert!(ev.wait_timeout(Duration::from_secs(10)));
}
