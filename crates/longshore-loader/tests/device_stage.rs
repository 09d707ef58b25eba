//! The device stage seam on the Cpu backend: any stage, on one lane or several, delivers every
//! batch once in the loader's order; `state_dict` counts what the training loop received
//! (not what the stage took ahead), so a resume after k batches yields exactly the rest; the
//! stage and its lanes are kept across epochs; a stage's skip, error and panic each land in
//! their batch's place.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Probe;
use longshore_data::Batch;
use longshore_host::PoolBuffer;
use longshore_loader::{
    DataLoader, DeviceBatch, DeviceStage, LoaderError, StackLoader, StageContext, Upload,
};
use longshore_transfer::{Device, Stream, upload_new};
use proptest::prelude::*;

/// Uploads each batch, then holds the stream for a while (a kernel that takes time), and
/// sleeps on the host for a seq-dependent while (uneven lanes); drops, fails or panics on
/// chosen batches.
struct Delaying {
    device: Device,
    stream: Stream,
    device_delay: Duration,
    host_jitter_us: u64,
    drop: Arc<HashSet<u64>>,
    fail: Arc<HashSet<u64>>,
    panic: Arc<HashSet<u64>>,
    /// Lanes made by `lane()`, over the stage's life.
    made: Arc<AtomicUsize>,
    /// Epochs each lane was prepared for.
    prepared: Vec<u64>,
    seen: Arc<Mutex<Vec<u64>>>,
}

impl Delaying {
    fn new(device_delay: Duration, host_jitter_us: u64) -> Delaying {
        let device = Device::cpu();
        Delaying {
            stream: device.new_stream().unwrap(),
            device,
            device_delay,
            host_jitter_us,
            drop: Arc::default(),
            fail: Arc::default(),
            panic: Arc::default(),
            made: Arc::default(),
            prepared: Vec::new(),
            seen: Arc::default(),
        }
    }
}

impl DeviceStage for Delaying {
    fn device(&self) -> &Device {
        &self.device
    }

    fn prepare(&mut self, context: &StageContext) -> Result<(), LoaderError> {
        self.prepared.push(context.epoch);
        Ok(())
    }

    fn run(
        &mut self,
        seq: u64,
        batch: Batch<PoolBuffer>,
    ) -> Result<Option<DeviceBatch>, LoaderError> {
        self.seen.lock().unwrap().push(seq);
        if self.host_jitter_us > 0 {
            let h = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            std::thread::sleep(Duration::from_micros(h % self.host_jitter_us));
        }
        if self.panic.contains(&seq) {
            panic!("the stage panics on batch {seq}");
        }
        if self.fail.contains(&seq) {
            return Err(LoaderError::State(format!("the stage refuses batch {seq}")));
        }
        if self.drop.contains(&seq) {
            return Ok(None);
        }
        let (layout, host) = batch.into_parts();
        let storage = upload_new(&self.stream, host)?;
        let delay = self.device_delay;
        self.stream
            .launch_host_fn(move || std::thread::sleep(delay))?;
        Ok(Some(DeviceBatch::new(
            layout,
            storage,
            self.stream.record()?,
        )))
    }

    fn lane(&self) -> Option<Result<Self, LoaderError>> {
        self.made.fetch_add(1, Ordering::SeqCst);
        let mut lane = Delaying::new(self.device_delay, self.host_jitter_us);
        lane.drop = self.drop.clone();
        lane.fail = self.fail.clone();
        lane.panic = self.panic.clone();
        lane.made = self.made.clone();
        lane.seen = self.seen.clone();
        Some(Ok(lane))
    }
}

fn loader(len: usize, batch_size: usize, workers: usize, shuffle: bool) -> StackLoader<Probe> {
    DataLoader::builder(Probe::new(len))
        .batch_size(batch_size)
        .num_workers(workers)
        .shuffle(shuffle)
        .seed(5)
        .build()
        .unwrap()
}

/// The sample ids of a device batch (tensor 0, u32), read back after its work.
fn ids(batch: DeviceBatch, stream: &Stream) -> Vec<u32> {
    let host = batch.wait_on(stream).unwrap().to_host(stream).unwrap();
    host.tensor::<u32>(0).unwrap().to_vec()
}

/// The epoch's batches on the host, without a device.
fn host_epoch(l: &StackLoader<Probe>) -> Vec<Vec<u32>> {
    l.iter()
        .map(|b| b.unwrap().tensor::<u32>(0).unwrap().to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any lanes and depth: every batch once, in the loader's order, as the host epoch.
    #[test]
    fn every_batch_once_in_order(
        len in 1usize..120,
        batch_size in 1usize..9,
        workers in 0usize..3,
        lanes in 1usize..4,
        depth in 1usize..4,
        jitter in 0u64..300,
    ) {
        let expect = host_epoch(&loader(len, batch_size, 0, true));
        let l = loader(len, batch_size, workers, true);
        let on_device = l
            .with_stage(Delaying::new(Duration::from_micros(100), jitter))
            .lanes(lanes)
            .depth(depth);
        let compute = Device::cpu().new_stream().unwrap();
        let got: Vec<Vec<u32>> = on_device
            .iter()
            .unwrap()
            .map(|b| ids(b.unwrap(), &compute))
            .collect();
        prop_assert_eq!(got, expect);
        let stats = on_device.stats();
        prop_assert_eq!(stats.samples, len as u64);
        prop_assert_eq!(l.stats().pool.bytes_in_use, 0);
    }

    /// A checkpoint taken after k batches, with the stage holding more batches than that,
    /// restores exactly the batches the training loop had not received.
    #[test]
    fn resume_after_k_batches_yields_exactly_the_rest(
        len in 1usize..120,
        batch_size in 1usize..9,
        workers in 0usize..3,
        lanes in 1usize..4,
        depth in 1usize..4,
        k_frac in 0.0f64..1.0,
    ) {
        let full = host_epoch(&loader(len, batch_size, 0, true));
        let k = ((full.len() as f64) * k_frac) as usize;
        let compute = Device::cpu().new_stream().unwrap();
        let l = loader(len, batch_size, workers, true);
        let on_device = l
            .with_stage(Delaying::new(Duration::from_micros(300), 100))
            .lanes(lanes)
            .depth(depth);
        let mut it = on_device.iter().unwrap();
        let mut got: Vec<Vec<u32>> = Vec::new();
        for _ in 0..k {
            got.push(ids(it.next().unwrap().unwrap(), &compute));
        }
        let state = l.state_dict().unwrap();
        drop(it);
        let resumed = loader(len, batch_size, workers, true);
        resumed.load_state_dict(&state).unwrap();
        let rest: Vec<Vec<u32>> = resumed
            .with_stage(Delaying::new(Duration::ZERO, 0))
            .lanes(lanes)
            .iter()
            .unwrap()
            .map(|b| ids(b.unwrap(), &compute))
            .collect();
        got.extend(rest);
        prop_assert_eq!(got, full);
    }
}

#[test]
fn the_stage_and_its_lanes_are_kept_across_epochs() {
    let l = loader(64, 4, 2, true);
    let stage = Delaying::new(Duration::ZERO, 0);
    let made = stage.made.clone();
    let on_device = l.with_stage(stage).lanes(3).depth(2);
    for _ in 0..3 {
        assert_eq!(
            on_device
                .iter()
                .unwrap()
                .map(|b| b.unwrap().batch_size())
                .sum::<usize>(),
            64
        );
    }
    // Two lanes made once, for the first epoch; each lane prepared once per epoch.
    assert_eq!(made.load(Ordering::SeqCst), 2);
    let prepared =
        on_device.lanes_kept(|lanes| lanes.iter().map(|s| s.prepared.clone()).collect::<Vec<_>>());
    assert_eq!(prepared, Some(vec![vec![0, 1, 2]; 3]));
    assert_eq!(on_device.stats().batches, 48);
}

#[test]
fn a_second_epoch_while_one_runs_is_an_error_and_the_first_goes_on() {
    let l = DataLoader::builder(Probe::new(16))
        .batch_size(4)
        .num_workers(1)
        .shutdown_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let on_device = l.with_stage(Upload::new(&Device::cpu()).unwrap());
    let mut first = on_device.iter().unwrap();
    assert!(first.next().unwrap().is_ok());
    let err = on_device.iter().unwrap_err();
    assert!(err.to_string().contains("still running"), "{err}");
    assert_eq!(first.count(), 3);
    // Dropped: the stage is back.
    assert_eq!(on_device.iter().unwrap().count(), 4);
}

/// An epoch dropped on another thread (a binding's epoch thread after a `break`) gives the
/// stage back; the next epoch, started meanwhile, waits for it instead of failing.
#[test]
fn the_next_epoch_waits_for_an_epoch_ending_on_another_thread() {
    let l = loader(64, 4, 2, false);
    let on_device = Arc::new(
        l.with_stage(Delaying::new(Duration::from_micros(200), 100))
            .lanes(2),
    );
    let mut first = on_device.iter().unwrap();
    assert!(first.next().unwrap().is_ok());
    let ender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
    });
    let second: usize = on_device
        .iter()
        .unwrap()
        .map(|b| b.unwrap().batch_size())
        .sum();
    ender.join().unwrap();
    assert_eq!(second, 64);
}

#[test]
fn dropped_and_failed_batches_land_in_place_and_count_as_delivered() {
    for lanes in [1, 3] {
        let l = loader(40, 4, 2, false);
        let mut stage = Delaying::new(Duration::from_micros(50), 50);
        stage.drop = Arc::new([2u64, 5].into());
        stage.fail = Arc::new([7u64].into());
        let on_device = l.with_stage(stage).lanes(lanes).depth(2);
        let compute = Device::cpu().new_stream().unwrap();
        let mut out = Vec::new();
        let mut state_after_8 = None;
        for b in on_device.iter().unwrap() {
            match b {
                Ok(b) => {
                    let batch = ids(b, &compute)[0] / 4;
                    out.push(Ok(batch));
                    if batch == 8 {
                        state_after_8 = Some(l.state_dict().unwrap());
                    }
                }
                Err(e) => out.push(Err(e.to_string())),
            }
        }
        let expect: Vec<Result<u32, String>> = (0..10u32)
            .filter(|b| ![2, 5].contains(b))
            .map(|b| {
                if b == 7 {
                    Err("cannot restore loader state: the stage refuses batch 7".into())
                } else {
                    Ok(b)
                }
            })
            .collect();
        assert_eq!(out, expect, "lanes {lanes}");
        // The dropped batches' samples are counted as the stage's drops; the failed one's are
        // not delivered and not dropped (an error was handed out).
        let stats = on_device.stats();
        assert_eq!((stats.dropped, stats.samples), (8, 28), "lanes {lanes}");
        // Batches 0..=8 counted, the dropped and the failed ones included; 9 was taken by the
        // stage (depth 2) but not received, so it does not count.
        let state = state_after_8.unwrap();
        assert_eq!(
            (state.done_prefix, state.done_extra.len()),
            (9, 0),
            "lanes {lanes}"
        );
    }
}

#[test]
fn a_lane_panic_is_an_error_in_its_batch_place_and_the_lane_is_made_again() {
    let l = loader(40, 4, 1, false);
    let mut stage = Delaying::new(Duration::ZERO, 0);
    stage.panic = Arc::new([4u64].into());
    let made = stage.made.clone();
    let on_device = l.with_stage(stage).lanes(2).depth(1);
    let results: Vec<Result<usize, LoaderError>> = on_device
        .iter()
        .unwrap()
        .map(|b| b.map(|b| b.batch_size()))
        .collect();
    assert!(results[..4].iter().all(|r| r.is_ok()));
    match &results[4] {
        Err(LoaderError::WorkerPanicked {
            worker,
            batch,
            message,
        }) => {
            assert_eq!((*worker, *batch), (0, 4));
            assert!(message.contains("the stage panics on batch 4"), "{message}");
        }
        other => panic!("expected the lane's panic, got {other:?}"),
    }
    // Lane 0 is gone: the next epoch runs on the one left and a new one.
    assert_eq!(on_device.lanes_kept(|l| l.len()), Some(1));
    let mut stage_ok = on_device.iter().unwrap();
    assert!(stage_ok.next().is_some());
    drop(stage_ok);
    assert_eq!(made.load(Ordering::SeqCst), 2);
}

#[test]
fn the_tuner_drives_any_stage() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let report = longshore_loader::Tuner::new()
        .workers([0, 2])
        .pin_memory([false])
        .batches(6)
        .run_stage(
            |w, pin| {
                DataLoader::builder(Probe::new(256))
                    .batch_size(8)
                    .num_workers(w)
                    .pin_memory(pin)
                    .build()
            },
            || {
                let mut stage = Delaying::new(Duration::from_micros(50), 0);
                stage.seen = seen.clone();
                Ok(stage)
            },
        )
        .unwrap();
    assert_eq!(report.trials.len(), 2);
    assert!(
        report
            .trials
            .iter()
            .all(|t| t.samples_per_second > 0.0 && t.batches >= 6)
    );
    // Every batch the trials counted went through the stage.
    let through: usize = seen.lock().unwrap().len();
    let counted: usize = report.trials.iter().map(|t| t.batches).sum();
    assert!(
        through >= counted,
        "{through} batches through the stage, {counted} counted"
    );
}
