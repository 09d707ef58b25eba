//! Event queries, host waits, completion callbacks and the `Fence` implementation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use longshore_host::Fence;
use longshore_transfer::{Device, Event};

#[test]
fn event_completes_once_the_work_before_it_has_run() {
    let stream = Device::cpu().new_stream().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv();
        })
        .unwrap();
    let ev = stream.record().unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let f = fired.clone();
    ev.on_complete(move || {
        f.fetch_add(1, Ordering::SeqCst);
    });
    assert!(!ev.is_complete());
    assert!(!ev.wait_timeout(Duration::from_millis(20)));
    assert!(!Fence::is_complete(&ev));
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    release.send(()).unwrap();
    assert!(ev.wait_timeout(Duration::from_secs(5)));
    Fence::wait(&ev);
    assert!(ev.is_complete() && ev.clone().is_complete());
    // The callback runs on the stream's thread right after the event is marked complete.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fired.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    // A callback registered after completion runs at once.
    let f = fired.clone();
    ev.on_complete(move || {
        f.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    assert_eq!(ev.device(), longshore_transfer::DeviceId::Cpu);
    assert_eq!(ev.stream_id(), stream.id());
}

#[test]
fn completed_event_and_fence_handle() {
    let ev = Event::completed();
    assert!(ev.is_complete());
    let fence = ev.to_fence();
    assert!(fence.is_complete());
    assert!(fence.wait_timeout(Duration::ZERO));
}

#[test]
fn later_events_complete_after_earlier_ones() {
    let stream = Device::cpu().new_stream().unwrap();
    let events: Vec<Event> = (0..50)
        .map(|_| {
            stream
                .launch_host_fn(|| std::thread::sleep(Duration::from_micros(200)))
                .unwrap();
            stream.record().unwrap()
        })
        .collect();
    events.last().unwrap().synchronize().unwrap();
    assert!(events.iter().all(Event::is_complete));
    // While the stream runs, completion is monotone in record order.
    let events: Vec<Event> = (0..20)
        .map(|_| {
            stream
                .launch_host_fn(|| std::thread::sleep(Duration::from_micros(500)))
                .unwrap();
            stream.record().unwrap()
        })
        .collect();
    for _ in 0..20 {
        let done: Vec<bool> = events.iter().map(Event::is_complete).collect();
        assert!(
            done.windows(2).all(|w| w[0] || !w[1]),
            "a later event completed before an earlier one: {done:?}"
        );
        std::thread::sleep(Duration::from_micros(300));
    }
}
