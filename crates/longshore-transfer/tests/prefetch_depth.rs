//! The prefetcher keeps `depth` batches in flight, in order, and hands them to a compute stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind, PinnedPool, PoolConfig};
use longshore_transfer::{Device, HostStorage, Prefetcher};

fn batch(i: usize) -> HostBuffer {
    HostBuffer::from_slice(MemoryKind::Pageable, &[i as u32; 256]).unwrap()
}

#[test]
fn keeps_depth_batches_in_flight_in_order() {
    let dev = Device::cpu();
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let source = (0..10).map(move |i| {
        p.fetch_add(1, Ordering::SeqCst);
        batch(i)
    });
    let mut pf = Prefetcher::new(source, copy, 3).unwrap();
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        0,
        "nothing is pulled before the first next()"
    );
    for i in 0..10usize {
        let item = pf.next().unwrap().unwrap();
        // After handing out batch i, batches i+1..=i+3 are in flight (fewer near the end).
        let expect_pulled = (i + 1 + 3).min(10);
        assert_eq!(pulled.load(Ordering::SeqCst), expect_pulled, "at batch {i}");
        assert_eq!(pf.in_flight(), expect_pulled - i - 1);
        let on_device = item.wait_on(&compute).unwrap();
        assert_eq!(
            compute.read_to_vec::<u32>(&on_device).unwrap(),
            vec![i as u32; 256]
        );
    }
    assert!(pf.next().is_none());
    assert_eq!(pf.pulled(), 10);
}

#[test]
fn compute_stream_waits_for_the_copy_device_side() {
    let dev = Device::cpu();
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let (release, gate) = mpsc::channel::<()>();
    copy.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let mut pf = Prefetcher::new((0..2).map(batch), copy, 1).unwrap();
    let first = pf.next().unwrap().unwrap();
    let ready = first.ready.clone();
    // Handing the batch to the compute stream must not block the host...
    let on_device = first.wait_on(&compute).unwrap();
    let marker = compute.record().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // ...but the compute stream is held back until the copy ran.
    assert!(!ready.is_complete());
    assert!(!marker.is_complete());
    release.send(()).unwrap();
    marker.synchronize().unwrap();
    assert_eq!(
        compute.read_to_vec::<u32>(&on_device).unwrap(),
        vec![0u32; 256]
    );
}

#[test]
fn pool_leases_and_metadata_flow_through_and_errors_pass_in_order() {
    let pool = PinnedPool::new(PoolConfig::for_kind(MemoryKind::Pageable)).unwrap();
    let dev = Device::cpu();
    let copy = dev.new_stream().unwrap();
    let p = pool.clone();
    let source = (0..6u32).map(move |i| {
        if i == 3 {
            return Err(format!("sample {i} is corrupt"));
        }
        let mut lease = p.alloc(64).unwrap();
        lease.as_mut_slice::<u32>().unwrap().fill(i);
        Ok(HostStorage {
            storage: lease,
            meta: (i, "label"),
        })
    });
    let out: Vec<_> = Prefetcher::new(source, copy.clone(), 2)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(out.len(), 6);
    for (i, item) in out.into_iter().enumerate() {
        match item.wait().unwrap() {
            Ok(b) => {
                assert_eq!(b.meta, (i as u32, "label"));
                assert_eq!(
                    copy.read_to_vec::<u32>(&b.storage).unwrap(),
                    vec![i as u32; 16]
                );
            }
            Err(e) => assert_eq!((i, e.as_str()), (3, "sample 3 is corrupt")),
        }
    }
    assert_eq!(
        Prefetcher::new(std::iter::empty::<HostBuffer>(), copy.clone(), 0)
            .unwrap_err()
            .to_string(),
        "invalid argument: a prefetcher needs a depth of at least 1"
    );
}

/// A source counting how many batches were pulled, on a copy stream held shut by a host
/// function until `release` is sent: no copy completes before that.
fn gated(
    n: usize,
) -> (
    Prefetcher<impl Iterator<Item = HostBuffer>>,
    Arc<AtomicUsize>,
    mpsc::Sender<()>,
    Device,
) {
    let dev = Device::cpu();
    let copy = dev.new_stream().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    copy.launch_host_fn(move || {
        let _ = gate.recv();
    })
    .unwrap();
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let source = (0..n).map(move |i| {
        p.fetch_add(1, Ordering::SeqCst);
        batch(i)
    });
    (
        Prefetcher::new(source, copy, 2).unwrap(),
        pulled,
        release,
        dev,
    )
}

#[test]
fn a_consumer_faster_than_the_link_is_held_to_max_copies() {
    let (pf, pulled, release, dev) = gated(12);
    assert_eq!(pf.copy_limit(), 8, "default: four times the depth");
    let handed = Arc::new(AtomicUsize::new(0));
    let h = handed.clone();
    // The consumer takes batches as fast as it can and never waits for their copies.
    let consumer = std::thread::spawn(move || {
        let mut pf = pf;
        let mut out = Vec::new();
        for item in pf.by_ref() {
            out.push(item.unwrap());
            h.fetch_add(1, Ordering::SeqCst);
        }
        (out, pf.throttled())
    });
    // No copy can complete: the consumer reaches the bound (however slow this machine is)...
    let start = std::time::Instant::now();
    while handed.load(Ordering::SeqCst) < 6 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // ...and stays there: 8 batches pulled (6 handed out, 2 queued), blocked on the oldest
    // copy instead of pulling the whole source.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pulled.load(Ordering::SeqCst), 8);
    assert_eq!(handed.load(Ordering::SeqCst), 6);
    release.send(()).unwrap();
    let (out, throttled) = consumer.join().unwrap();
    assert!(
        throttled >= 1,
        "the consumer waited for the link at least once"
    );
    let compute = dev.new_stream().unwrap();
    for (i, p) in out.into_iter().enumerate() {
        let b = p.wait_on(&compute).unwrap();
        assert_eq!(compute.read_to_vec::<u32>(&b).unwrap(), vec![i as u32; 256]);
    }
    assert_eq!(pulled.load(Ordering::SeqCst), 12);
}

#[test]
fn without_a_copy_limit_the_consumer_runs_ahead_of_the_link() {
    let (pf, pulled, release, _dev) = gated(12);
    let mut pf = pf.max_copies(usize::MAX);
    // Nothing completes, yet every batch can be taken: the copies queue on the stream.
    let out: Vec<_> = pf.by_ref().map(Result::unwrap).collect();
    assert_eq!((out.len(), pulled.load(Ordering::SeqCst)), (12, 12));
    assert_eq!(pf.throttled(), 0);
    assert!(!out[0].ready.is_complete());
    release.send(()).unwrap();
    out[11].ready.synchronize().unwrap();
    // A bound below depth + 1 is raised to it.
    let (pf, _, release, _dev) = gated(1);
    assert_eq!(pf.max_copies(0).copy_limit(), 3);
    release.send(()).unwrap();
}
