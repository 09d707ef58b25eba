//! `build_boxed`: loaders of different datasets share one type, [`BoxedLoader`], and a boxed
//! loader yields exactly what the typed one yields (order, shuffling, workers, iterable
//! sharding), resumes exactly and feeds the device pipeline. [`DeviceWindow`] bounds the
//! device work still running and waits on the oldest first.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use longshore_data::{Batch, ItemIter, IterableDataset, VecDataset, WorkerInfo};
use longshore_host::PoolBuffer;
use longshore_loader::{BoxedLoader, DataLoader, DeviceWindow, LoaderError};
use longshore_transfer::Device;
use proptest::prelude::*;

fn rows(n: usize) -> Vec<([u32; 2], i64)> {
    (0..n)
        .map(|i| ([i as u32, 7 * i as u32], i as i64))
        .collect()
}

/// Each batch's bytes, in order, for one epoch.
fn epoch<I: Iterator<Item = Result<Batch<PoolBuffer>, LoaderError>>>(it: I) -> Vec<Vec<u8>> {
    it.map(|b| b.unwrap().bytes().to_vec()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Same options, same seed: the boxed loader's epochs are the typed loader's, byte for byte.
    #[test]
    fn a_boxed_loader_yields_what_the_typed_one_yields(
        n in 1usize..80,
        batch in 1usize..9,
        workers in 0usize..4,
        shuffle in any::<bool>(),
        drop_last in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let make = || {
            DataLoader::builder(VecDataset::new(rows(n)))
                .batch_size(batch)
                .num_workers(workers)
                .shuffle(shuffle)
                .drop_last(drop_last)
                .seed(seed)
                .pin_memory(false)
        };
        let typed = make().build().unwrap();
        let boxed: BoxedLoader = make().build_boxed().unwrap();
        prop_assert_eq!(typed.len(), boxed.len());
        for _ in 0..2 {
            prop_assert_eq!(epoch(typed.iter()), epoch(boxed.iter()));
        }
    }
}

/// Items `0..n`, each worker taking every `num_workers`-th one (torch's sharding idiom).
struct Counting(u32);

impl IterableDataset for Counting {
    type Item = ([u32; 1],);
    fn iter(&self, info: WorkerInfo) -> ItemIter<'_, Self::Item> {
        let (id, k) = (info.id as u32, info.num_workers.max(1) as u32);
        Box::new((0..self.0).filter(move |i| i % k == id).map(|i| Ok(([i],))))
    }
}

#[test]
fn a_boxed_iterable_loader_yields_what_the_typed_one_yields() {
    for workers in [0, 1, 3] {
        let make = || {
            DataLoader::iterable(Counting(50))
                .batch_size(4)
                .num_workers(workers)
                .pin_memory(false)
        };
        let typed = make().build().unwrap();
        let boxed = make().build_boxed().unwrap();
        let a = epoch(typed.iter());
        assert!(!a.is_empty());
        assert_eq!(a, epoch(boxed.iter()), "{workers} workers");
    }
}

#[test]
fn loaders_of_different_datasets_share_one_type_and_resume_exactly() {
    let floats = || {
        DataLoader::builder(VecDataset::new(vec![([1.5f32; 3], 1i64); 40]))
            .batch_size(4)
            .shuffle(true)
            .seed(3)
            .num_workers(2)
            .pin_memory(false)
            .build_boxed()
            .unwrap()
    };
    let ints = || {
        DataLoader::builder(VecDataset::new(rows(30)))
            .batch_size(5)
            .shuffle(true)
            .seed(4)
            .num_workers(2)
            .pin_memory(false)
            .build_boxed()
            .unwrap()
    };
    let makers: [&dyn Fn() -> BoxedLoader; 2] = [&floats, &ints];
    let loaders: Vec<BoxedLoader> = makers.iter().map(|m| m()).collect();
    for (l, make) in loaders.iter().zip(makers) {
        let whole = epoch(l.iter());
        // The same epoch 0 again: stop after 3 batches, save, and restore into a fresh loader:
        // it yields exactly the rest.
        let probe = make();
        let mut it = probe.iter();
        let head = epoch((&mut it).take(3));
        let state = probe.state_dict().unwrap();
        drop(it);
        let fresh = make();
        fresh.load_state_dict(&state).unwrap();
        let rest = epoch(fresh.iter());
        assert_eq!(whole, [head, rest].concat());
    }
}

#[test]
fn a_boxed_loader_feeds_the_device_pipeline() {
    let make = || {
        DataLoader::builder(VecDataset::new(rows(33)))
            .batch_size(4)
            .num_workers(2)
            .pin_memory(false)
    };
    let host = epoch(make().build().unwrap().iter());
    let boxed = make().build_boxed().unwrap();
    let device = Device::cpu();
    let stream = device.new_stream().unwrap();
    for _ in 0..2 {
        let on_device: Vec<Vec<u8>> = boxed
            .to_device(&device, 2)
            .unwrap()
            .map(|b| b.unwrap().to_host(&stream).unwrap().bytes().to_vec())
            .collect();
        assert_eq!(on_device, host);
    }
}

#[test]
fn the_device_window_waits_on_the_oldest_running_batch_first() {
    let device = Device::cpu();
    let stream = device.new_stream().unwrap();
    // Three batches whose device work is held by gates, released in order by the test.
    let mut gates = Vec::new();
    let mut events = Vec::new();
    for _ in 0..3 {
        let (tx, rx) = mpsc::channel::<()>();
        stream
            .launch_host_fn(move || {
                let _ = rx.recv_timeout(Duration::from_secs(5));
            })
            .unwrap();
        events.push(stream.record().unwrap());
        gates.push(tx);
    }
    let mut window = DeviceWindow::new(3);
    assert_eq!(window.max(), 3);
    for e in &events {
        window.record(e.clone());
    }
    assert_eq!(window.outstanding(), 3);
    // One batch not yet handed out beside three outstanding: two must complete. The window
    // waits on the oldest first; the test's wait releases exactly the batch it is given.
    let mut calls = 0;
    let mut gates = gates.into_iter();
    window
        .make_room(1, |e| {
            // Call k waits on batch k: releasing gate k completes it, and only it.
            let k = calls;
            calls += 1;
            gates.next().unwrap().send(()).unwrap();
            e.synchronize()?;
            assert!(events[k].is_complete());
            assert!(
                !events[k + 1].is_complete(),
                "waited on batch {k}, not the oldest"
            );
            Ok(())
        })
        .unwrap();
    assert_eq!(calls, 2);
    assert_eq!(window.outstanding(), 1);
    assert_eq!(window.throttled().0, 2);
    // Room now: nothing waits.
    window.make_room(1, |_| panic!("no wait expected")).unwrap();
    for g in gates {
        g.send(()).unwrap();
    }
    stream.synchronize().unwrap();
    // Completed work is dropped without a wait.
    window
        .make_room(2, |_| panic!("completed work needs no wait"))
        .unwrap();
    assert_eq!(window.outstanding(), 0);
}

#[test]
fn an_unbounded_window_keeps_nothing() {
    let stream = Device::cpu().new_stream().unwrap();
    let mut window = DeviceWindow::new(usize::MAX);
    for _ in 0..100 {
        window.record(stream.record().unwrap());
    }
    assert_eq!(window.outstanding(), 0);
    assert_eq!(DeviceWindow::for_depth(2, 1).max(), 8);
    assert_eq!(DeviceWindow::new(0).max(), 1);
}
